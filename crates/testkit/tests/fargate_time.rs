//! Simulated Fargate time to executor (`sandbox_testkit::fargate_time`): a claimed pool
//! member holds its assignment within its forwarder's one-second poll of the claim, where a
//! cold start waits for its task's 30–60 s to `RUNNING`.

use sandbox_testkit::fargate_time::{FARGATE_START_SECS, POLL_MS, measure_fargate_time};

/// 200 sessions per path, Fargate's 30–60 s to `RUNNING` for members and cold tasks alike:
/// every warm request claims a running member (no miss) and its executor holds the
/// assignment within one poll (target: p99 ≤ 2 s); every cold one waits 30–60 s.
#[tokio::test(flavor = "current_thread")]
async fn warm_executors_are_ready_within_two_seconds_on_fargate_timings() {
    let t = measure_fargate_time(200, 35).await;
    assert_eq!(t.warm.ms.len(), 200);
    assert_eq!(t.warm.misses, 0, "every request found a running member");
    assert!(
        t.warm.ms.iter().all(|&ms| ms <= POLL_MS),
        "within one poll of the claim: {:?}",
        t.warm.ms
    );
    assert!(t.warm.quantile(0.99) <= 2_000, "{:?}", t.warm);
    let (min, max) = FARGATE_START_SECS;
    assert!(
        t.cold
            .ms
            .iter()
            .all(|&ms| (min * 1_000..=max * 1_000).contains(&ms)),
        "a cold start waits for its task: {:?}",
        t.cold.ms
    );
    // Seeded: the same seed gives the same times.
    assert_eq!(measure_fargate_time(20, 35).await.warm.ms, t.warm.ms[..20]);
}
