//! The sweeper: the EventBridge fixture runs one sweep over the doubles and answers the
//! report as JSON; an unreadable inventory fails the invocation.

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
}

fn schedule() -> EventBridgeEvent<serde_json::Value> {
    serde_json::from_str(&workspace_event("lambda/eventbridge.scheduled.json")).unwrap()
}

#[tokio::test]
async fn scheduled_event_with_nothing_to_do_answers_an_empty_report() {
    let answer = handle_schedule(&controller(), &schedule()).await.unwrap();
    assert_eq!(
        answer,
        serde_json::json!({"environments": 0, "outcomes": {}, "deferred": 0, "dead_letters": 0})
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
    });
    let answer = handle_schedule(&c, &schedule()).await.unwrap();
    assert_eq!(answer["environments"], 1, "{answer}");
    assert_eq!(answer["deferred"], 0, "{answer}");
    assert_eq!(
        answer["outcomes"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum::<u64>(),
        1,
        "{answer}"
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
