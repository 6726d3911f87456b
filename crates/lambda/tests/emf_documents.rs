//! Each function's metrics, flushed as CloudWatch embedded metric format documents, are
//! valid against the EMF JSON schema (`fixtures/emf.schema.json`, from the specification)
//! and name every dimension and metric as a member of the document (target members), with
//! no id among the dimensions.
//!
//! One test: the EMF recorder is process-global, so the three functions run in turn.

#[allow(dead_code)]
mod doubles;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use doubles::{
    FIXTURE_NOW, FakeSessions, FixedClock, MemoryCompute, MemoryQueue, MemoryRegistry,
    crate_fixture, workspace_event,
};
use lambda_http::request::LambdaRequest;
use sandbox_controller::{Controller, ControllerConfig, Intake, Job};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation, InstanceId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::session::Session;
use sandbox_core::webhook::WebhookVerifier;
use sandbox_lambda::{emf, sweeper_handler, webhook_handler, worker_handler};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

const SECRET: &str = "whsec_d0jBWkxw8kwXPSTcgFkLyF4RsJ2W0Xo2SjxObaPtVAc=";
const TIMERS_URL: &str =
    "https://sqs.us-east-1.amazonaws.com/123456789012/sandbox-lifecycle-timers";
const SESSION: &str = "sess_0e25c6de04de5b894495116a";

type TestController = Controller<MemoryQueue, MemoryRegistry, MemoryCompute, FakeSessions>;

fn controller() -> TestController {
    let sessions = FakeSessions::default();
    let session: Session = serde_json::from_str(&workspace_event(
        "sessions/self_hosted.requires_action.environment_connection.json",
    ))
    .unwrap();
    sessions
        .sessions
        .lock()
        .unwrap()
        .insert(session.id.clone(), session);
    let mut config = ControllerConfig::new(DeploymentId::new("test").unwrap());
    config.stop_readback_interval = Duration::from_millis(1);
    Controller::new(
        MemoryQueue::default(),
        MemoryQueue::default(),
        MemoryRegistry::default(),
        MemoryCompute::default(),
        sessions,
        Arc::new(FixedClock(FIXTURE_NOW)),
        config,
    )
}

/// The flushed documents, each checked against the schema and the target-member rule.
fn flushed_documents() -> Vec<Value> {
    let schema: Value = serde_json::from_str(&crate_fixture("emf.schema.json")).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let mut out = Vec::new();
    emf::flush_to(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let docs: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON document per line"))
        .collect();
    for doc in &docs {
        let errors: Vec<String> = validator.iter_errors(doc).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{errors:?} in {doc}");
        for directive in doc["_aws"]["CloudWatchMetrics"].as_array().unwrap() {
            assert_eq!(directive["Namespace"], "SandboxLifecycle");
            for set in directive["Dimensions"].as_array().unwrap() {
                for key in set.as_array().unwrap() {
                    let key = key.as_str().unwrap();
                    assert!(doc.get(key).is_some(), "dimension {key} is a member: {doc}");
                    assert!(
                        ["deployment", "outcome", "reason"].contains(&key),
                        "only bounded dimensions, never an id: {key}"
                    );
                }
            }
            for metric in directive["Metrics"].as_array().unwrap() {
                let name = metric["Name"].as_str().unwrap();
                assert!(doc.get(name).is_some(), "metric {name} is a member: {doc}");
            }
        }
    }
    docs
}

/// The value of `metric` in the document whose dimensions include `dims`.
fn value<'a>(docs: &'a [Value], metric: &str, dims: &[(&str, &str)]) -> Option<&'a Value> {
    docs.iter()
        .filter(|d| dims.iter().all(|(k, v)| d[*k] == *v))
        .find_map(|d| d.get(metric))
}

#[tokio::test]
async fn every_function_flushes_valid_emf_documents_without_ids_as_dimensions() {
    assert!(emf::init("prod-eu"), "the recorder installs once");
    assert!(!emf::init("prod-eu"), "a second init is a no-op");

    // Webhook: one accepted delivery, one rejected for its signature.
    let queue = MemoryQueue::default();
    let intake = Arc::new(Intake::new(
        WebhookVerifier::new(SECRET).unwrap(),
        queue,
        Arc::new(FixedClock(FIXTURE_NOW)),
    ));
    let event = workspace_event("lambda/function_url.action_required.json");
    let request = |json: &str| {
        let e: LambdaRequest = serde_json::from_str(json).unwrap();
        lambda_http::Request::from(e)
    };
    let ok = webhook_handler::service(intake.clone())
        .oneshot(request(&event))
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let stale = webhook_handler::service(Arc::new(Intake::new(
        WebhookVerifier::new(SECRET).unwrap(),
        MemoryQueue::default(),
        Arc::new(FixedClock(FIXTURE_NOW + 3_600)),
    )))
    .oneshot(request(&event))
    .await
    .unwrap();
    assert_eq!(stale.status(), 401);
    let docs = flushed_documents();
    assert_eq!(
        value(&docs, "webhook_accepted", &[("deployment", "prod-eu")]),
        Some(&Value::from(1))
    );
    assert_eq!(
        value(&docs, "webhook_rejected", &[("reason", "signature")]),
        Some(&Value::from(1))
    );
    let raw = serde_json::to_string(&docs).unwrap();
    assert!(
        !raw.contains("msg_") && !raw.contains("sess_"),
        "no ids anywhere: {raw}"
    );

    // Worker: a connection request starts one compute.
    let c = controller();
    let job = Job {
        handoffs: 0,
        trigger: Trigger::ConnectionRequested,
        session_id: SessionId::new(SESSION),
        environment_id: None,
        webhook_id: Some("msg_emf".into()),
        enqueued_at: FIXTURE_NOW - 4,
        swept: None,
        operator_proof: None,
    };
    let mut record = SqsMessage::default();
    record.message_id = Some("m1".into());
    record.receipt_handle = Some("r1".into());
    record.body = Some(serde_json::to_string(&job).unwrap());
    record.event_source_arn =
        Some("arn:aws:sqs:us-east-1:123456789012:sandbox-lifecycle-jobs.fifo".into());
    record
        .attributes
        .insert("MessageGroupId".into(), SESSION.into());
    let mut batch = SqsEvent::default();
    batch.records = vec![record];
    let response = worker_handler::handle_batch(
        &c,
        &worker_handler::QueueRoutes::new(TIMERS_URL),
        &batch,
        None,
    )
    .await;
    assert!(response.batch_item_failures.is_empty());
    let docs = flushed_documents();
    assert_eq!(
        value(&docs, "decisions", &[("outcome", "start")]),
        Some(&Value::from(1))
    );
    assert_eq!(value(&docs, "starts", &[]), Some(&Value::from(1)));
    assert_eq!(
        value(&docs, "enqueue_to_start_seconds", &[]),
        Some(&serde_json::json!([4.0]))
    );

    // Sweeper: an orphan of a deleted session is released.
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
    let schedule: EventBridgeEvent<Value> =
        serde_json::from_str(&workspace_event("lambda/eventbridge.scheduled.json")).unwrap();
    sweeper_handler::handle_schedule(&c, &schedule)
        .await
        .unwrap();
    let docs = flushed_documents();
    assert_eq!(
        value(&docs, "environments_swept", &[]),
        Some(&Value::from(1))
    );
    assert!(value(&docs, "sweep_duration_seconds", &[]).is_some());
    // The sweeper fans out: the worker decides the environment's sweep job.
    let sent = c.timers.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 1, "one sweep job on the timers queue");
    c.process(&sent[0].job).await.unwrap();
    let worker_docs = flushed_documents();
    assert_eq!(
        value(&worker_docs, "decisions", &[("outcome", "release")]),
        Some(&Value::from(1))
    );
    assert_eq!(
        value(&worker_docs, "executor_lifetime_seconds", &[]),
        Some(&serde_json::json!([3600.0]))
    );
    let units: Vec<&Value> = docs
        .iter()
        .flat_map(|d| {
            d["_aws"]["CloudWatchMetrics"][0]["Metrics"]
                .as_array()
                .unwrap()
        })
        .filter(|m| m["Name"] == "sweep_duration_seconds")
        .map(|m| &m["Unit"])
        .collect();
    assert_eq!(units, vec!["Seconds"]);

    // Nothing recorded since: nothing written.
    assert!(flushed_documents().is_empty());
}
