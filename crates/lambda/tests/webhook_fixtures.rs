//! The Lambda trigger fixtures through lambda_http's request conversion into the
//! controller's router: Function URL and API Gateway HTTP API events (base64 bodies) from
//! `events/lambda/`, and an API Gateway REST API event (text body, stage prefix) from
//! `tests/fixtures/`. Verified at the fixtures' fixed timestamp.

#[allow(dead_code)]
mod doubles;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use doubles::{FIXTURE_NOW, FixedClock, MemoryQueue, crate_fixture, workspace_event};
use http_body_util::BodyExt;
use lambda_http::request::LambdaRequest;
use lambda_http::{Body, Request};
use sandbox_controller::Intake;
use sandbox_core::ids::SessionId;
use sandbox_core::observed::Trigger;
use sandbox_core::webhook::WebhookVerifier;
use sandbox_lambda::webhook_handler::service;
use std::sync::Arc;
use tower::ServiceExt;

/// The fixtures' signing secret (TEST ONLY, events/README.md).
const SECRET: &str = "whsec_d0jBWkxw8kwXPSTcgFkLyF4RsJ2W0Xo2SjxObaPtVAc=";
const WEBHOOK_ID: &str = "msg_O2MN9PnX7Re6gTtNH0lPGi7zL91";

fn to_request(event_json: &str) -> Request {
    let event: LambdaRequest = serde_json::from_str(event_json).expect("a lambda_http event");
    Request::from(event)
}

async fn answer(request: Request, now: u64) -> (u16, serde_json::Value, MemoryQueue) {
    let queue = MemoryQueue::default();
    let intake = Intake::new(
        WebhookVerifier::new(SECRET).unwrap(),
        queue.clone(),
        Arc::new(FixedClock(now)),
    );
    let response = service(Arc::new(intake)).oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or_default(),
        queue,
    )
}

async fn assert_queued_once(event_json: &str) {
    let (status, body, queue) = answer(to_request(event_json), FIXTURE_NOW).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "queued", "{body}");
    let sent = queue.sent.lock().unwrap();
    assert_eq!(sent.len(), 1, "exactly one job");
    assert_eq!(sent[0].dedup_id, WEBHOOK_ID);
    assert_eq!(sent[0].group, "sess_0e25c6de04de5b894495116a");
    assert_eq!(sent[0].job.trigger, Trigger::ConnectionRequested);
    assert_eq!(
        sent[0].job.session_id,
        SessionId::new("sess_0e25c6de04de5b894495116a")
    );
    assert_eq!(sent[0].job.webhook_id.as_deref(), Some(WEBHOOK_ID));
    assert_eq!(sent[0].job.enqueued_at, FIXTURE_NOW);
}

#[tokio::test]
async fn function_url_fixture_is_queued_once_at_its_timestamp() {
    assert_queued_once(&workspace_event("lambda/function_url.action_required.json")).await;
}

#[tokio::test]
async fn api_gateway_http_v2_fixture_is_queued_once_at_its_timestamp() {
    assert_queued_once(&workspace_event(
        "lambda/apigw_http_v2.action_required.json",
    ))
    .await;
}

#[tokio::test]
async fn api_gateway_rest_v1_fixture_on_a_stage_is_queued_once_at_its_timestamp() {
    assert_queued_once(&crate_fixture("apigw_rest_v1.action_required.json")).await;
}

#[tokio::test]
async fn base64_body_reaches_the_handler_as_the_exact_signed_bytes() {
    for name in [
        "lambda/function_url.action_required.json",
        "lambda/apigw_http_v2.action_required.json",
    ] {
        let event_json = workspace_event(name);
        let event: serde_json::Value = serde_json::from_str(&event_json).unwrap();
        let signed = BASE64.decode(event["body"].as_str().unwrap()).unwrap();
        let request = to_request(&event_json);
        assert!(
            matches!(request.body(), Body::Binary(b) if *b == signed),
            "{name}"
        );
    }
    let rest = crate_fixture("apigw_rest_v1.action_required.json");
    let event: serde_json::Value = serde_json::from_str(&rest).unwrap();
    let text = event["body"].as_str().unwrap();
    assert_eq!(to_request(&rest).body().as_ref(), text.as_bytes());
}

/// The fixture with one byte of the delivery changed (`1764399999` → `1764399998`), body
/// re-encoded as the event encodes it; the headers still carry the original signature.
fn tampered(event_json: &str) -> String {
    let mut event: serde_json::Value = serde_json::from_str(event_json).unwrap();
    let base64 = event["isBase64Encoded"].as_bool().unwrap();
    let body = event["body"].as_str().unwrap();
    let raw = if base64 {
        BASE64.decode(body).unwrap()
    } else {
        body.as_bytes().to_vec()
    };
    let changed = String::from_utf8(raw)
        .unwrap()
        .replace("1764399999", "1764399998");
    event["body"] = if base64 {
        BASE64.encode(&changed).into()
    } else {
        changed.into()
    };
    event.to_string()
}

#[tokio::test]
async fn tampered_body_answers_401_and_queues_nothing() {
    for event_json in [
        workspace_event("lambda/function_url.action_required.json"),
        workspace_event("lambda/apigw_http_v2.action_required.json"),
        crate_fixture("apigw_rest_v1.action_required.json"),
    ] {
        let (status, body, queue) = answer(to_request(&tampered(&event_json)), FIXTURE_NOW).await;
        assert_eq!(status, 401, "{body}");
        assert_eq!(body["error"], "no webhook-signature entry matches");
        assert!(queue.sent.lock().unwrap().is_empty());
    }
}

#[tokio::test]
async fn fixture_delivered_ten_minutes_late_answers_401() {
    let event_json = workspace_event("lambda/function_url.action_required.json");
    let (status, body, queue) = answer(to_request(&event_json), FIXTURE_NOW + 600).await;
    assert_eq!(status, 401, "{body}");
    assert!(queue.sent.lock().unwrap().is_empty());
}

#[tokio::test]
async fn get_on_the_function_url_answers_405() {
    let event_json = workspace_event("lambda/function_url.action_required.json")
        .replace(r#""method": "POST""#, r#""method": "GET""#);
    let (status, _, queue) = answer(to_request(&event_json), FIXTURE_NOW).await;
    assert_eq!(status, 405);
    assert!(queue.sent.lock().unwrap().is_empty());
}
