//! ECS calls per job are flat and per sweep linear in the deployment's size:
//! counted, not timed. See `sandbox_testkit::scale` for the world and the jobs.

use sandbox_testkit::scale::{ScaleRow, measure_scale};

fn jobs(r: &ScaleRow) -> [(&'static str, u64); 4] {
    [
        ("start", r.start.total()),
        ("reuse/wait", r.reuse_wait.total()),
        ("idle (lease)", r.idle_lease.total()),
        ("lease stop", r.lease_stop.total()),
    ]
}

#[tokio::test]
async fn ecs_calls_per_job_are_the_same_at_100_and_1000_environments() {
    let small = measure_scale(100).await;
    let large = measure_scale(1_000).await;
    assert_eq!(jobs(&small), jobs(&large), "{small:?}\n{large:?}");
    // And what they are: one RunTask; one DescribeTasks by id; a stop and its read-back.
    assert_eq!(small.start.run_task, 1);
    assert_eq!(small.start.total(), 1, "{:?}", small.start);
    assert_eq!(small.reuse_wait.describe_tasks, 1);
    assert_eq!(small.reuse_wait.total(), 1, "{:?}", small.reuse_wait);
    assert_eq!(small.lease_stop.stop_task, 1);
    assert!(small.lease_stop.total() <= 3, "{:?}", small.lease_stop);
}

#[tokio::test]
async fn a_sweep_with_nothing_to_do_costs_at_most_3_ecs_calls_per_100_environments() {
    for n in [100, 250, 1_000] {
        let r = measure_scale(n).await;
        assert_eq!(r.sweep_not_ignored, 0, "not a no-effect sweep: {r:?}");
        assert!(
            r.sweep.total() <= r.sweep_bound(),
            "{n} environments: {:?} > {}",
            r.sweep,
            r.sweep_bound()
        );
        assert_eq!(r.sweep.run_task + r.sweep.stop_task, 0);
        // ListTasks pages grow with N: one per 100 live tasks.
        assert_eq!(r.sweep.list_tasks, ((n - 1) as u64).div_ceil(100), "{r:?}");
        assert!(r.fan_out.total() <= r.sweep_bound(), "{r:?}");
        assert_eq!(r.fan_out_jobs, n, "{r:?}");
    }
}
