//! The webhook intake: what reaches the queue and what each bad input answers.
//! The queue here is an in-memory double that can be told to fail; the SQLite and SQS
//! queues are exercised by the end-to-end suites.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use sandbox_controller::doubles::{FixedClock, RecordingQueue};
use sandbox_controller::{Intake, router};
use sandbox_core::observed::Trigger;
use sandbox_core::webhook::WebhookVerifier;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tower::ServiceExt;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const NOW: u64 = 1_800_000_000;

fn app() -> (axum::Router, RecordingQueue) {
    let q = RecordingQueue::default();
    let intake = Intake::new(
        WebhookVerifier::new(SECRET).unwrap(),
        q.clone(),
        Arc::new(FixedClock(NOW)),
    );
    (router(Arc::new(intake)), q)
}

fn event(kind: &str, data: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "id": "evt_1", "object": "event", "type": kind, "created_at": NOW, "data": data
    }))
    .unwrap()
}

fn connection_required() -> Vec<u8> {
    event(
        "agent.session.action_required",
        serde_json::json!({"id": "sess_1", "required_action": {"type": "environment_connection"}}),
    )
}

fn signed(body: &[u8], id: &str) -> Request<Body> {
    let sig = WebhookVerifier::new(SECRET).unwrap().sign(id, NOW, body);
    Request::post("/webhook")
        .header("webhook-id", id)
        .header("webhook-timestamp", NOW.to_string())
        .header("webhook-signature", sig)
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .unwrap()
}

async fn call(app: axum::Router, req: Request<Body>) -> (StatusCode, serde_json::Value) {
    let res = app.oneshot(req).await.unwrap();
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or_default())
}

#[tokio::test]
async fn connection_request_is_queued_with_webhook_id_as_dedup_and_session_as_group() {
    let (app, q) = app();
    let (status, body) = call(app, signed(&connection_required(), "msg_1")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "queued");
    let sent = q.sent.lock().unwrap();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].dedup_id, "msg_1");
    assert_eq!(sent[0].group, "sess_1");
    assert_eq!(sent[0].job.trigger, Trigger::ConnectionRequested);
    assert_eq!(sent[0].job.webhook_id.as_deref(), Some("msg_1"));
}

#[tokio::test]
async fn idle_failed_and_in_progress_of_self_hosted_sessions_are_queued() {
    for (kind, trigger) in [
        ("agent.session.idle", Trigger::Idle),
        ("agent.session.failed", Trigger::Failed),
        ("agent.session.in_progress", Trigger::TurnStarted),
    ] {
        let (app, q) = app();
        let body = event(
            kind,
            serde_json::json!({"id": "sess_1", "environment_type": "self_hosted", "environment_id": "env_1"}),
        );
        let (status, _) = call(app, signed(&body, "msg_2")).await;
        assert_eq!(status, StatusCode::OK);
        let sent = q.sent.lock().unwrap();
        assert_eq!(sent.len(), 1, "{kind}");
        assert_eq!(sent[0].job.trigger, trigger);
        assert_eq!(
            sent[0].job.environment_id.as_ref().unwrap().as_str(),
            "env_1"
        );
    }
}

#[tokio::test]
async fn verified_events_that_do_not_concern_compute_answer_2xx_and_are_dropped() {
    let bodies = [
        event(
            "agent.session.action_required",
            serde_json::json!({"id": "sess_1", "required_action": {"type": "function_call"}}),
        ),
        event(
            "agent.session.idle",
            serde_json::json!({"id": "sess_1", "environment_type": "openai_hosted"}),
        ),
        event(
            "agent.environment.ready",
            serde_json::json!({"id": "env_1"}),
        ),
        event("batch.completed", serde_json::json!({"id": "batch_1"})),
        event(
            "agent.session.teleported",
            serde_json::json!({"whatever": true}),
        ),
    ];
    for body in bodies {
        let (app, q) = app();
        let (status, json) = call(app, signed(&body, "msg_3")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(json["status"], "ignored");
        assert!(q.sent.lock().unwrap().is_empty());
    }
}

#[tokio::test]
async fn bad_signature_answers_401_and_never_reaches_the_queue() {
    let (app, q) = app();
    let mut req = signed(&connection_required(), "msg_4");
    req.headers_mut().insert(
        "webhook-signature",
        "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
            .parse()
            .unwrap(),
    );
    let (status, body) = call(app, req).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("no webhook-signature entry matches")
    );
    assert!(q.sent.lock().unwrap().is_empty());
}

#[tokio::test]
async fn missing_headers_answer_400_and_never_reach_the_queue() {
    for header in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        let (app, q) = app();
        let mut req = signed(&connection_required(), "msg_5");
        req.headers_mut().remove(header);
        let (status, body) = call(app, req).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{header}");
        assert!(body["error"].as_str().unwrap().contains(header));
        assert!(q.sent.lock().unwrap().is_empty());
    }
}

#[tokio::test]
async fn malformed_json_with_valid_signature_answers_400() {
    for body in [
        b"{not json".to_vec(),
        b"[]".to_vec(),
        event(
            "agent.session.idle",
            serde_json::json!({"environment_type": "self_hosted"}),
        ),
    ] {
        let (app, q) = app();
        let (status, _) = call(app, signed(&body, "msg_6")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(q.sent.lock().unwrap().is_empty());
    }
}

#[tokio::test]
async fn oversize_body_answers_413() {
    let (app, q) = app();
    let big = vec![b' '; (1 << 20) + 1];
    let (status, _) = call(app, signed(&big, "msg_7")).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(q.sent.lock().unwrap().is_empty());
}

#[tokio::test]
async fn failing_queue_answers_503_so_the_sender_retries() {
    let (app, q) = app();
    q.failing.store(true, Ordering::SeqCst);
    let (status, body) = call(app, signed(&connection_required(), "msg_8")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body["error"].as_str().unwrap().contains("retry"));
}

/// `agent.session.created` of a self-hosted session is dropped by default and
/// kept as `SessionCreated` (with its environment id) only when the deployment provisions
/// on creation; other environment types are dropped either way.
#[tokio::test]
async fn session_created_is_kept_only_when_provisioning_on_created() {
    use sandbox_core::observed::ProvisionOn;
    let created = |environment_type: &str| {
        event(
            "agent.session.created",
            serde_json::json!({
                "id": "sess_1", "environment_type": environment_type, "environment_id": "env_1",
                "connect": {"remote_url": "wss://api.openai.com/v1/agents/environments/env_1/connect"}
            }),
        )
    };
    for (provision_on, environment_type, kept) in [
        (ProvisionOn::ConnectionRequest, "self_hosted", false),
        (ProvisionOn::Created, "self_hosted", true),
        (ProvisionOn::Created, "openai_hosted", false),
    ] {
        let q = RecordingQueue::default();
        let intake = Intake::new(
            WebhookVerifier::new(SECRET).unwrap(),
            q.clone(),
            Arc::new(FixedClock(NOW)),
        )
        .with_provision_on(provision_on);
        let app = router(Arc::new(intake));
        let (status, json) = call(app, signed(&created(environment_type), "msg_c")).await;
        assert_eq!(status, StatusCode::OK);
        let sent = q.sent.lock().unwrap();
        if kept {
            assert_eq!(json["status"], "queued");
            assert_eq!(sent.len(), 1);
            assert_eq!(sent[0].job.trigger, Trigger::SessionCreated);
            assert_eq!(sent[0].group, "sess_1");
            assert_eq!(
                sent[0].job.environment_id.as_ref().unwrap().as_str(),
                "env_1"
            );
        } else {
            assert_eq!(
                json["status"], "ignored",
                "{provision_on:?} {environment_type}"
            );
            assert!(sent.is_empty());
        }
    }
}
