//! lifecycle-cases.md row 28 on the AWS adapters: ECS RunTask answers HTTP 200 with
//! `failures` and no task (capacity, ENI limits, a bad task definition; moto never does,
//! so ECS is the JSON stub from `sandbox_aws::bootstrap`), SQS and DynamoDB on moto, the
//! Agents API from the simulator and a clock the test moves.
//!
//! A failed start is recorded (`start_failure.attempts`), the message comes back after the
//! backoff; before the backoff nothing calls RunTask; after it one more attempt with the
//! backoff doubled; after `max_start_attempts` no more attempts within the cooldown
//! (`Policy::start_failing_cooldown_secs`; outcome `reconcile`), then one attempt per
//! cooldown. The controller never loops creating tasks.
//!
//! Run with `tests/moto/run.sh cargo nextest run -p sandbox-e2e -E 'test(aws)'`.

use sandbox_agents_api::AgentsClient;
use sandbox_aws::EcsCompute;
use sandbox_aws::bootstrap::EcsStub;
use sandbox_controller::ports::{Clock, Registry as _};
use sandbox_controller::{Controller, Disposition, Job};
use sandbox_core::decision::Outcome;
use sandbox_core::ids::DeploymentId;
use sandbox_core::observed::Trigger;
use sandbox_core::record::Record;
use sandbox_e2e::aws_stack::{
    AwsOptions, AwsResources, frozen_sim_with_a_waiting_session, harness_config, unique,
};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A clock the test moves by hand.
struct ManualClock(AtomicU64);

impl ManualClock {
    fn advance(&self, secs: u64) {
        self.0.fetch_add(secs, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

const MAX_ATTEMPTS: u32 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_failed_start_is_recorded_backs_off_doubles_and_gives_up_without_looping() {
    let resources = AwsResources::create().await.unwrap();
    let stub = EcsStub::start(|op, _, _| match op {
        "ListTasks" => json!({"taskArns": []}),
        "DescribeTasks" => json!({"tasks": [], "failures": []}),
        "RunTask" => json!({
            "tasks": [],
            "failures": [{
                "arn": "arn:aws:ecs:us-east-1:123456789012:cluster/lc-stub",
                "reason": "Capacity is unavailable at this time",
                "detail": "RESOURCE:FARGATE"
            }]
        }),
        _ => json!({}),
    })
    .await;
    let compute = EcsCompute::new(stub.client().await, resources.ecs.clone());

    let (sim, session, env, api) = frozen_sim_with_a_waiting_session().await;

    let clock = Arc::new(ManualClock(AtomicU64::new(1_800_000_000)));
    let mut config = harness_config(
        DeploymentId::new(format!("fs-{}", unique())).unwrap(),
        &AwsOptions::default(),
    );
    config.policy.max_start_attempts = MAX_ATTEMPTS;
    let base = config.policy.start_retry_base_secs;
    let cooldown = config.policy.start_failing_cooldown_secs;
    let c = Controller::new(
        resources.events(),
        resources.timers(),
        resources.registry(),
        compute,
        AgentsClient::new(api).unwrap(),
        clock.clone() as Arc<dyn Clock>,
        config,
    );
    let job = Job {
        handoffs: 0,
        swept: None,
        operator_proof: None,
        trigger: Trigger::ConnectionRequested,
        session_id: session.id.clone(),
        environment_id: Some(env.clone()),
        webhook_id: None,
        enqueued_at: clock.now(),
    };
    let runs = || stub.calls_of("RunTask").len();
    let record = || async {
        c.registry
            .get(&env.effect_key())
            .await
            .unwrap()
            .expect("record")
    };
    let attempts = |r: &Record| r.start_failure.as_ref().map(|f| f.attempts);

    // Attempt 1 fails: recorded, the message comes back after the base backoff.
    let p = c.process(&job).await.unwrap();
    assert_eq!(p.outcome(), Some(Outcome::Start), "{p:?}");
    assert_eq!(p.disposition, Disposition::RetryAfter(base as u32), "{p:?}");
    assert!(p.error.as_deref().unwrap().contains("Capacity"), "{p:?}");
    assert_eq!(runs(), 1);
    let r = record().await;
    assert_eq!(attempts(&r), Some(1));
    assert!(r.instance.is_none());
    assert_eq!(
        r.start_failure.as_ref().unwrap().last_failed_at,
        clock.now()
    );

    // Before the backoff: no RunTask, the decision waits.
    clock.advance(base - 1);
    let p = c.process(&job).await.unwrap();
    assert_eq!(p.outcome(), Some(Outcome::Wait), "{p:?}");
    assert_eq!(runs(), 1, "no RunTask before the backoff");
    assert_eq!(attempts(&record().await), Some(1));

    // Past the backoff: one more attempt, the backoff doubles.
    clock.advance(2);
    let p = c.process(&job).await.unwrap();
    assert_eq!(p.outcome(), Some(Outcome::Start), "{p:?}");
    assert_eq!(
        p.disposition,
        Disposition::RetryAfter(2 * base as u32),
        "{p:?}"
    );
    assert_eq!(runs(), 2);
    assert_eq!(attempts(&record().await), Some(2));

    // Within the doubled backoff: nothing.
    clock.advance(2 * base - 1);
    let p = c.process(&job).await.unwrap();
    assert_eq!(p.outcome(), Some(Outcome::Wait), "{p:?}");
    assert_eq!(runs(), 2);

    // Attempt 3 (the last allowed) fails too.
    clock.advance(2);
    let p = c.process(&job).await.unwrap();
    assert_eq!(p.outcome(), Some(Outcome::Start), "{p:?}");
    assert_eq!(
        p.disposition,
        Disposition::RetryAfter(4 * base as u32),
        "{p:?}"
    );
    assert_eq!(runs(), 3);
    assert_eq!(attempts(&record().await), Some(MAX_ATTEMPTS));

    // From now on: no RunTask within the cooldown, however often the environment is looked
    // at (jobs, sweeps).
    for _ in 0..5 {
        clock.advance(cooldown / 10);
        let p = c.process(&job).await.unwrap();
        assert_eq!(p.outcome(), Some(Outcome::Reconcile), "{p:?}");
        assert_eq!(p.disposition, Disposition::Done, "{p:?}");
        c.sweep().await.unwrap();
    }
    assert_eq!(runs(), MAX_ATTEMPTS as usize, "never loops creating tasks");
    assert_eq!(attempts(&record().await), Some(MAX_ATTEMPTS));

    // After the cooldown: one attempt, then the cooldown again (never a task loop).
    clock.advance(cooldown);
    let p = c.process(&job).await.unwrap();
    assert_eq!(p.outcome(), Some(Outcome::Start), "{p:?}");
    assert_eq!(runs(), MAX_ATTEMPTS as usize + 1);
    assert_eq!(attempts(&record().await), Some(MAX_ATTEMPTS + 1));
    for _ in 0..3 {
        clock.advance(cooldown / 10);
        let p = c.process(&job).await.unwrap();
        assert_eq!(p.outcome(), Some(Outcome::Reconcile), "{p:?}");
        c.sweep().await.unwrap();
    }
    assert_eq!(
        runs(),
        MAX_ATTEMPTS as usize + 1,
        "one attempt per cooldown"
    );
    sim.shutdown().await;
}
