//! A sweep job decides on the sweep's read of the provider while that read is current
//! (`SweptEvidence::is_current`). Regression tests for what the ECS-like simulation found.

use sandbox_controller::Job;
use sandbox_controller::ports::Clock;
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::session::SessionStatus;
use sandbox_testkit::{AwsLike, ComputeTiming, World};

/// Found by the ECS-like simulation (seed 3147120051747863208, base 1, schedule 1986, in
/// its version before the hour-long pause was added, which changed what seeds mean;
/// minimized here to the two actors involved): a sweep read the
/// deployment a moment after a worker started and recorded task A; ECS answered A
/// `MISSING` (not visible yet), so A was absent from the sweep's evidence. The sweep's job
/// for that environment ran 389 s later, with the record unchanged and the evidence
/// younger than `sweep_evidence_max_age_secs` (1,200 s), so it decided on it: A recorded
/// more than `visibility_window_secs` (300 s) ago and absent read as "gone", and a second
/// task started while A ran. A recorded instance missing from the evidence must be read
/// again by id.
#[tokio::test]
async fn a_sweep_job_that_read_a_new_task_as_missing_starts_no_second_task_later() {
    let world = World::aws_like(
        ComputeTiming::default(),
        AwsLike {
            max_visibility_lag_ms: 5_000,
            seed: 1,
            ..AwsLike::strict()
        },
    );
    let (session, env) = (SessionId::new("sess_ev_1"), EnvironmentId::new("env_ev_1"));
    world.sessions.add(&session, &env, SessionStatus::Idle);
    world.sessions.require_connection(&session);
    let worker = world.controller("w1");
    let job = |trigger| Job {
        handoffs: 0,
        swept: None,
        operator_proof: None,
        trigger,
        session_id: session.clone(),
        environment_id: Some(env.clone()),
        webhook_id: None,
        enqueued_at: world.clock.now(),
    };
    let p = worker
        .process(&job(Trigger::ConnectionRequested))
        .await
        .unwrap();
    assert_eq!(p.outcome().map(|o| o.to_string()).as_deref(), Some("start"));

    // The executor has not connected yet; its connect deadline is far (so the only way to
    // a second task is reading the first as gone).
    let mut config = World::config("sweeper");
    config.settled_resweep_secs = 0;
    config.policy.connect_deadline_secs = 3_600;
    let sweeper = world.controller_with(config);
    let plan = sweeper.plan_sweep().await.unwrap();
    let swept = plan
        .jobs
        .into_iter()
        .find(|j| j.environment_id.as_ref() == Some(&env))
        .expect("a sweep job for the environment");
    let evidence = swept.swept.as_ref().unwrap();
    assert!(
        evidence.instances.is_empty(),
        "the read must have missed the new task (lag): {evidence:?}"
    );

    world.clock.advance_secs(389);
    let p = sweeper.process(&swept).await.unwrap();
    assert_eq!(
        p.outcome().map(|o| o.to_string()).as_deref(),
        Some("wait"),
        "{p:?}"
    );
    assert_eq!(world.compute.active_of(&env).len(), 1, "{p:?}");
}
