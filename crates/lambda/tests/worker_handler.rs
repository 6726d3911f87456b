//! The worker against in-memory doubles of the ports and the Agents API: what each job
//! outcome does to the message (visibility change on its own queue) and to the partial
//! batch response.

#[allow(dead_code)]
mod doubles;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use doubles::{
    FIXTURE_NOW, FakeSessions, FixedClock, MemoryCompute, MemoryQueue, MemoryRegistry,
    workspace_event,
};
use sandbox_controller::{Controller, ControllerConfig, Job};
use sandbox_core::ids::{DeploymentId, EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::session::Session;
use sandbox_lambda::worker_handler::{QueueRoutes, WorkerEvent, handle_batch};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

const EVENTS_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:sandbox-lifecycle-jobs.fifo";
const TIMERS_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:sandbox-lifecycle-timers";
const TIMERS_URL: &str =
    "https://sqs.us-east-1.amazonaws.com/123456789012/sandbox-lifecycle-timers";
/// The session of `events/sessions/self_hosted.requires_action.environment_connection.json`.
const SESSION: &str = "sess_0e25c6de04de5b894495116a";
const ENVIRONMENT: &str = "env_8749d36b79c63105ff2ea2e3";

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

fn connection_job(webhook_id: &str) -> String {
    serde_json::to_string(&Job {
        handoffs: 0,
        swept: None,
        operator_proof: None,
        trigger: Trigger::ConnectionRequested,
        session_id: SessionId::new(SESSION),
        environment_id: None,
        webhook_id: Some(webhook_id.into()),
        enqueued_at: FIXTURE_NOW,
    })
    .unwrap()
}

fn sweep_job(session: &str, environment: &str) -> String {
    serde_json::to_string(&Job {
        handoffs: 0,
        swept: None,
        operator_proof: None,
        trigger: Trigger::Sweep,
        session_id: SessionId::new(session),
        environment_id: Some(EnvironmentId::new(environment)),
        webhook_id: None,
        enqueued_at: FIXTURE_NOW,
    })
    .unwrap()
}

/// A record of the events queue (FIFO) or the timers queue, received `receive_count` times.
fn record(id: &str, body: &str, fifo: bool, receive_count: u32) -> SqsMessage {
    let mut r = SqsMessage::default();
    r.message_id = Some(id.into());
    r.receipt_handle = Some(format!("receipt-{id}"));
    r.body = Some(body.into());
    r.event_source = Some("aws:sqs".into());
    r.event_source_arn = Some(if fifo { EVENTS_ARN } else { TIMERS_ARN }.into());
    r.attributes
        .insert("ApproximateReceiveCount".into(), receive_count.to_string());
    if fifo {
        r.attributes.insert("MessageGroupId".into(), SESSION.into());
    }
    r
}

fn batch(records: Vec<SqsMessage>) -> SqsEvent {
    let mut event = SqsEvent::default();
    event.records = records;
    event
}

async fn run(c: &TestController, event: &SqsEvent) -> String {
    let response = handle_batch(c, &QueueRoutes::new(TIMERS_URL), event, None).await;
    serde_json::to_string(&response).unwrap()
}

fn failures(ids: &[&str]) -> String {
    let items: Vec<String> = ids
        .iter()
        .map(|id| format!(r#"{{"itemIdentifier":"{id}"}}"#))
        .collect();
    format!(r#"{{"batchItemFailures":[{}]}}"#, items.join(","))
}

#[tokio::test]
async fn connection_request_starts_one_compute_and_the_message_succeeds() {
    let c = controller();
    let event = batch(vec![record("m1", &connection_job("msg_1"), true, 1)]);
    assert_eq!(run(&c, &event).await, failures(&[]));
    let instances = c.compute.instances.lock().unwrap().clone();
    assert_eq!(instances.len(), 1);
    assert_eq!(instances[0].environment_id.as_str(), ENVIRONMENT);
    assert_eq!(c.registry.records.lock().unwrap().len(), 1, "recorded");
    assert_eq!(*c.registry.ledger.lock().unwrap(), ["msg_1"]);
    assert!(c.events.retries.lock().unwrap().is_empty());
}

#[tokio::test]
async fn redelivered_webhook_job_is_a_success_without_a_second_start() {
    let c = controller();
    let event = batch(vec![
        record("m1", &connection_job("msg_1"), true, 1),
        record("m2", &connection_job("msg_1"), true, 1),
    ]);
    assert_eq!(run(&c, &event).await, failures(&[]));
    assert_eq!(c.compute.instances.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn busy_lock_on_a_timers_record_hands_the_job_off_as_a_new_timers_message() {
    let c = controller();
    c.registry.busy.store(true, Ordering::SeqCst);
    let job = sweep_job(SESSION, ENVIRONMENT);
    let event = batch(vec![record("t1", &job, false, 4)]);
    // Deleted and sent again: a new message starts at receive count 0, so waiting for a
    // lock never moves a job toward the dead-letter queue.
    assert_eq!(run(&c, &event).await, failures(&[]));
    let sent = c.timers.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 1);
    let original: Job = serde_json::from_str(&job).unwrap();
    assert_eq!(
        sent[0].job,
        Job {
            handoffs: 1,
            ..original
        }
    );
    assert_eq!(sent[0].delay_secs, c.config.lock_busy_retry_secs);
    assert!(c.timers.retries.lock().unwrap().is_empty());
}

#[tokio::test]
async fn busy_lock_on_an_events_record_hands_the_job_to_the_timers_queue_and_succeeds() {
    let c = controller();
    c.registry.busy.store(true, Ordering::SeqCst);
    let job = connection_job("msg_1");
    let event = batch(vec![
        record("m1", &job, true, 4),
        record("m2", &connection_job("msg_2"), true, 1),
    ]);
    // Nothing reported: the FIFO message is deleted, so neither it nor m2 burns a
    // receive toward the dead-letter queue; m2 ran (and was handed off too).
    assert_eq!(run(&c, &event).await, failures(&[]));
    let sent = c.timers.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 2);
    let original: Job = serde_json::from_str(&job).unwrap();
    assert_eq!(
        sent[0].job,
        Job {
            handoffs: 1,
            ..original
        }
    );
    assert_eq!(sent[0].delay_secs, c.config.lock_busy_retry_secs);
    assert_eq!(sent[0].group, SESSION);
    assert_eq!(sent[0].dedup_id, "handoff:m1:4");
    assert!(c.events.retries.lock().unwrap().is_empty());
    assert!(c.compute.instances.lock().unwrap().is_empty());
    assert!(
        c.registry.ledger.lock().unwrap().is_empty(),
        "not processed yet"
    );
}

#[tokio::test]
async fn failed_hand_off_retries_the_events_record_on_its_own_queue() {
    let c = controller();
    c.registry.busy.store(true, Ordering::SeqCst);
    c.timers.set_failing(true);
    let event = batch(vec![
        record("m1", &connection_job("msg_1"), true, 1),
        record("m2", &connection_job("msg_2"), true, 1),
    ]);
    assert_eq!(run(&c, &event).await, failures(&["m1", "m2"]));
    // m2 (not attempted after m1's failure) cannot be deferred either: it is made
    // visible again at once.
    assert_eq!(
        *c.events.retries.lock().unwrap(),
        [
            ("receipt-m1".to_owned(), c.config.lock_busy_retry_secs),
            ("receipt-m2".to_owned(), 0)
        ]
    );
}

#[tokio::test]
async fn registry_outage_backs_off_by_receive_count_and_reports_the_message() {
    let c = controller();
    c.registry.down.store(true, Ordering::SeqCst);
    let event = batch(vec![record("m1", &connection_job("msg_1"), true, 3)]);
    assert_eq!(run(&c, &event).await, failures(&["m1"]));
    // 2^3 s, as local mode's queue loop (sandbox_controller::consume::failure_backoff_secs).
    assert_eq!(
        *c.events.retries.lock().unwrap(),
        [("receipt-m1".to_owned(), 8)]
    );
}

#[tokio::test]
async fn undecodable_body_is_reported_failed_without_changing_its_visibility() {
    let c = controller();
    let event = batch(vec![record("t1", r#"{"kind":"webhook"}"#, false, 1)]);
    assert_eq!(run(&c, &event).await, failures(&["t1"]));
    assert!(c.timers.retries.lock().unwrap().is_empty());
    assert_eq!(c.sessions.reads.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn fifo_batch_stops_at_the_first_failure_and_defers_the_rest() {
    let c = controller();
    let m3 = connection_job("msg_3");
    let event = batch(vec![
        record("m1", &connection_job("msg_1"), true, 1),
        record("m2", "not json", true, 1),
        record("m3", &m3, true, 2),
    ]);
    // m3 is not attempted: its job is sent again as a new timers message visible at once
    // (so its receives never count toward the dead-letter queue) and it is not reported.
    assert_eq!(run(&c, &event).await, failures(&["m2"]));
    assert_eq!(
        c.sessions.reads.load(Ordering::SeqCst),
        1,
        "m3 not processed"
    );
    assert_eq!(*c.registry.ledger.lock().unwrap(), ["msg_1"]);
    let sent: Vec<_> = (c.timers.sent.lock().unwrap().iter())
        .filter(|o| o.dedup_id.starts_with("defer:"))
        .cloned()
        .collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    let original: Job = serde_json::from_str(&m3).unwrap();
    assert_eq!(
        sent[0].job,
        Job {
            handoffs: 1,
            ..original
        }
    );
    assert_eq!(sent[0].delay_secs, 0);
    assert_eq!(sent[0].dedup_id, "defer:m3:2");
}

#[tokio::test]
async fn standard_batch_goes_on_after_a_failure_and_reports_only_it() {
    let c = controller();
    let event = batch(vec![
        record("t1", &sweep_job("sess_gone_1", "env_gone_1"), false, 1),
        record("t2", "not json", false, 1),
        record("t3", &sweep_job("sess_gone_3", "env_gone_3"), false, 1),
    ]);
    assert_eq!(run(&c, &event).await, failures(&["t2"]));
    assert_eq!(c.sessions.reads.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn records_past_the_budget_are_deferred_at_once_but_the_first_runs() {
    let c = controller();
    let t2 = sweep_job("sess_gone_2", "env_gone_2");
    let event = batch(vec![
        record("t1", &sweep_job("sess_gone_1", "env_gone_1"), false, 1),
        record("t2", &t2, false, 1),
    ]);
    // Less than the lock lease plus the settle time is left after t1: t2 is deferred.
    let budget = sandbox_lambda::worker_handler::record_budget(&c.config);
    let deadline = SystemTime::now() + budget - Duration::from_secs(1);
    let response = handle_batch(&c, &QueueRoutes::new(TIMERS_URL), &event, Some(deadline)).await;
    assert_eq!(serde_json::to_string(&response).unwrap(), failures(&[]));
    assert_eq!(c.sessions.reads.load(Ordering::SeqCst), 1);
    let sent = c.timers.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].job.session_id.as_str(), "sess_gone_2");
    assert_eq!((sent[0].delay_secs, sent[0].job.handoffs), (0, 1));
    // With the whole budget left, both run.
    let c = controller();
    let deadline = SystemTime::now() + budget + Duration::from_secs(30);
    let response = handle_batch(&c, &QueueRoutes::new(TIMERS_URL), &event, Some(deadline)).await;
    assert_eq!(serde_json::to_string(&response).unwrap(), failures(&[]));
    assert_eq!(c.sessions.reads.load(Ordering::SeqCst), 2);
    assert!(c.timers.sent.lock().unwrap().is_empty());
}

/// A record not attempted whose job reached the hand-off cap, or whose deferral cannot be
/// sent, is made visible again at once on its own queue (visibility 0) and reported.
#[tokio::test]
async fn a_record_not_attempted_past_the_hand_off_cap_is_visible_again_at_once() {
    let c = controller();
    let mut capped: Job = serde_json::from_str(&sweep_job("sess_gone_2", "env_gone_2")).unwrap();
    capped.handoffs = sandbox_controller::consume::MAX_HANDOFFS;
    let event = batch(vec![
        record("t1", &sweep_job("sess_gone_1", "env_gone_1"), false, 1),
        record("t2", &serde_json::to_string(&capped).unwrap(), false, 3),
    ]);
    let deadline = SystemTime::now() + Duration::from_secs(1);
    let response = handle_batch(&c, &QueueRoutes::new(TIMERS_URL), &event, Some(deadline)).await;
    assert_eq!(serde_json::to_string(&response).unwrap(), failures(&["t2"]));
    assert!(c.timers.sent.lock().unwrap().is_empty());
    let retries = c.timers.retries.lock().unwrap().clone();
    assert_eq!(retries.len(), 1, "{retries:?}");
    assert_eq!(retries[0].1, 0, "visible again at once");
}

const SWEEP_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:sandbox-lifecycle-sweep";
const SWEEP_URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/sandbox-lifecycle-sweep";

/// A record of the sweep queue is settled there: routed by its ARN, and when the batch's
/// budget runs out deferred to the sweep queue (never among the timers queue's rechecks);
/// one past the hand-off cap is made visible again on the sweep queue.
#[tokio::test]
async fn sweep_records_are_deferred_and_retried_on_the_sweep_queue() {
    use sandbox_lambda::worker_handler::SourceQueue;
    let routes = QueueRoutes::new(TIMERS_URL).with_sweep(SWEEP_URL);
    let on_sweep = |id: &str, body: &str| {
        let mut r = record(id, body, false, 1);
        r.event_source_arn = Some(SWEEP_ARN.into());
        r
    };
    assert_eq!(routes.source_of(&on_sweep("s", "")), SourceQueue::Sweep);
    assert_eq!(
        routes.source_of(&record("t", "", false, 1)),
        SourceQueue::Timers
    );
    assert_eq!(
        QueueRoutes::new(TIMERS_URL).source_of(&on_sweep("s", "")),
        SourceQueue::Events,
        "without the sweep route a sweep ARN is not the timers queue's"
    );

    let c = controller().with_sweep_queue(MemoryQueue::default());
    let mut capped: Job = serde_json::from_str(&sweep_job("sess_gone_3", "env_gone_3")).unwrap();
    capped.handoffs = sandbox_controller::consume::MAX_HANDOFFS;
    let event = batch(vec![
        on_sweep("s1", &sweep_job("sess_gone_1", "env_gone_1")),
        on_sweep("s2", &sweep_job("sess_gone_2", "env_gone_2")),
        on_sweep("s3", &serde_json::to_string(&capped).unwrap()),
    ]);
    let deadline = SystemTime::now() + Duration::from_secs(1);
    let response = handle_batch(&c, &routes, &event, Some(deadline)).await;
    assert_eq!(serde_json::to_string(&response).unwrap(), failures(&["s3"]));
    assert!(
        c.timers.sent.lock().unwrap().is_empty(),
        "nothing deferred among the rechecks"
    );
    let sent = c.sweep_queue().sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].job.session_id.as_str(), "sess_gone_2");
    assert!(c.timers.retries.lock().unwrap().is_empty());
    let retries = c.sweep_queue().retries.lock().unwrap().clone();
    assert_eq!(retries.len(), 1, "{retries:?}");
    assert_eq!(retries[0].1, 0, "visible again at once on the sweep queue");
}

#[test]
fn records_are_routed_to_their_queue_by_arn() {
    let routes = QueueRoutes::new(TIMERS_URL);
    use sandbox_lambda::worker_handler::SourceQueue;
    assert_eq!(
        routes.source_of(&record("t", "", false, 1)),
        SourceQueue::Timers
    );
    assert_eq!(
        routes.source_of(&record("m", "", true, 1)),
        SourceQueue::Events
    );
}

#[tokio::test]
async fn a_job_handed_off_again_waits_twice_as_long() {
    let c = controller();
    c.registry.busy.store(true, Ordering::SeqCst);
    let mut job: Job = serde_json::from_str(&sweep_job(SESSION, ENVIRONMENT)).unwrap();
    job.handoffs = 3;
    let event = batch(vec![record(
        "t1",
        &serde_json::to_string(&job).unwrap(),
        false,
        1,
    )]);
    assert_eq!(run(&c, &event).await, failures(&[]));
    let sent = c.timers.sent.lock().unwrap().clone();
    assert_eq!(sent[0].job.handoffs, 4);
    assert_eq!(sent[0].delay_secs, c.config.lock_busy_retry_secs * 8);
}

#[tokio::test]
async fn a_job_past_the_hand_off_cap_is_retried_on_its_own_queue_toward_the_dead_letter_queue() {
    let c = controller();
    c.registry.busy.store(true, Ordering::SeqCst);
    let mut job: Job = serde_json::from_str(&sweep_job(SESSION, ENVIRONMENT)).unwrap();
    job.handoffs = sandbox_controller::consume::MAX_HANDOFFS;
    let event = batch(vec![record(
        "t1",
        &serde_json::to_string(&job).unwrap(),
        false,
        2,
    )]);
    assert_eq!(run(&c, &event).await, failures(&["t1"]));
    assert!(
        c.timers.sent.lock().unwrap().is_empty(),
        "no further hand-off"
    );
    assert_eq!(
        *c.timers.retries.lock().unwrap(),
        vec![("receipt-t1".to_owned(), c.config.lock_busy_retry_secs)],
        "its own message comes back after the delay, one receive closer to the DLQ"
    );
}

/// With the warm pool on, a batch that applied a start ends with a refill (the
/// claim's member is replaced); a batch that started nothing does not refill.
#[tokio::test]
async fn a_batch_that_started_an_executor_ends_with_a_pool_refill() {
    let mut c = controller();
    c.config.pool.size = 2;
    let event = batch(vec![record("m1", &connection_job("msg_1"), true, 1)]);
    assert_eq!(run(&c, &event).await, failures(&[]));
    assert_eq!(c.compute.instances.lock().unwrap().len(), 1);
    assert_eq!(
        *c.compute.pool_starts.lock().unwrap(),
        2,
        "refilled to its size"
    );
    // A duplicate delivery starts nothing: no refill.
    let again = batch(vec![record("m2", &connection_job("msg_1"), true, 1)]);
    assert_eq!(run(&c, &again).await, failures(&[]));
    assert_eq!(*c.compute.pool_starts.lock().unwrap(), 2);
    // With the pool off a start never refills.
    let off = controller();
    assert_eq!(run(&off, &event).await, failures(&[]));
    assert_eq!(*off.compute.pool_starts.lock().unwrap(), 0);
}

/// The function's payload is an SQS batch or the pool's schedule; anything else is
/// refused with a message saying what was expected.
#[test]
fn the_worker_tells_an_sqs_batch_from_the_pool_schedule_and_refuses_the_rest() {
    let sqs = WorkerEvent::from_payload(serde_json::json!({"Records": []})).unwrap();
    assert!(matches!(sqs, WorkerEvent::Sqs(e) if e.records.is_empty()));
    assert!(matches!(
        WorkerEvent::from_payload(serde_json::json!({"pool_refill": {}})),
        Ok(WorkerEvent::PoolRefill)
    ));
    let err = WorkerEvent::from_payload(serde_json::json!({"detail-type": "Scheduled Event"}))
        .unwrap_err();
    assert!(err.contains("pool_refill"), "{err}");
    assert!(WorkerEvent::from_payload(serde_json::json!({"Records": 3})).is_err());
}
