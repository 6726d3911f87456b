//! The sweeper: the EventBridge fixture runs one fanned-out sweep over the doubles (one
//! job per environment on the sweep queue, with the sweep's read) and answers the report
//! as JSON; an unreadable inventory fails the invocation.

#[allow(dead_code)]
mod doubles;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use doubles::{
    FIXTURE_NOW, FakeSessions, FixedClock, MemoryCompute, MemoryQueue, MemoryRegistry,
    workspace_event,
};
use sandbox_controller::{Controller, ControllerConfig};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation, InstanceId, SessionId};
use sandbox_lambda::sweeper_handler::handle_schedule;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

type TestController = Controller<MemoryQueue, MemoryRegistry, MemoryCompute, FakeSessions>;

fn controller() -> TestController {
    let mut config = ControllerConfig::new(DeploymentId::new("test").unwrap());
    config.stop_readback_interval = Duration::from_millis(1);
    Controller::new(
        MemoryQueue::default(),
        MemoryQueue::default(),
        MemoryRegistry::default(),
        MemoryCompute::default(),
        FakeSessions::default(),
        Arc::new(FixedClock(FIXTURE_NOW)),
        config,
    )
    .with_sweep_queue(MemoryQueue::default())
}

fn schedule() -> EventBridgeEvent<serde_json::Value> {
    serde_json::from_str(&workspace_event("lambda/eventbridge.scheduled.json")).unwrap()
}

#[tokio::test]
async fn scheduled_event_with_nothing_to_do_answers_an_empty_report() {
    let answer = handle_schedule(&controller(), &schedule()).await.unwrap();
    assert_eq!(
        answer,
        serde_json::json!({"environments": 0, "enqueued": 0, "settled_skipped": 0,
            "outcomes": {}, "deferred": 0, "dead_letters": 0})
    );
}

#[tokio::test]
async fn orphan_compute_of_a_deleted_session_is_swept_and_reported() {
    let c = controller();
    c.compute.instances.lock().unwrap().push(ComputeInstance {
        instance_id: InstanceId::new("task-orphan"),
        environment_id: EnvironmentId::new("env_orphan"),
        session_id: Some(SessionId::new("sess_deleted")),
        generation: Generation(1),
        status: ComputeStatus::Running,
        started_at: Some(FIXTURE_NOW - 3_600),
        stop_code: None,
        exit: None,
    });
    let answer = handle_schedule(&c, &schedule()).await.unwrap();
    assert_eq!(answer["environments"], 1, "{answer}");
    assert_eq!(answer["deferred"], 0, "{answer}");
    assert_eq!(
        answer["enqueued"], 1,
        "fanned out to the sweep queue: {answer}"
    );
    assert!(
        c.timers.sent.lock().unwrap().is_empty(),
        "no sweep job among the rechecks"
    );
    // The job carries the sweep's read; a worker decides on it.
    let sent = c.sweep_queue().sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 1);
    let job = &sent[0].job;
    let evidence = job
        .swept
        .as_ref()
        .expect("the sweep's read travels with the job");
    assert_eq!(evidence.instances.len(), 1);
    assert_eq!(evidence.record_version, None);
    let processed = c.process(job).await.unwrap();
    assert_eq!(
        processed.outcome().map(|o| o.to_string()).as_deref(),
        Some("release")
    );
    assert_eq!(
        c.compute.instances.lock().unwrap()[0].status,
        ComputeStatus::Stopped
    );
}

#[tokio::test]
async fn unreadable_registry_fails_the_invocation() {
    let c = controller();
    c.registry.down.store(true, Ordering::SeqCst);
    let err = handle_schedule(&c, &schedule()).await.unwrap_err();
    assert_eq!(err.dependency, "registry");
}
