//! The property of the fuzz target `fuzz/fuzz_targets/webhook_entry.rs`, in the normal test
//! suite: for any headers + body reaching the webhook router,
//! 1. no panic;
//! 2. no 5xx unless the queue failed (and then only 503);
//! 3. nothing is enqueued unless the delivery carries a valid signature — checked here
//!    independently of `WebhookVerifier` (HMAC-SHA256 over `{id}.{timestamp}.{body}`, the
//!    timestamp within 300 s, one exact `v1,<base64>` entry).
//!
//! Inputs are signed `events/webhooks` fixtures put through mutations (a flipped body,
//! signature or id byte, a shifted timestamp, dropped, duplicated or re-cased headers,
//! arbitrary bodies and headers), each optionally re-signed so parsing and routing are
//! reached too. `PROPTEST_CASES` changes the number of cases (default 512).

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Request};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use http_body_util::BodyExt;
use proptest::prelude::*;
use sandbox_controller::doubles::{FixedClock, RecordingQueue};
use sandbox_controller::{Intake, router};
use sandbox_core::webhook::WebhookVerifier;
use sha2::Sha256;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tower::ServiceExt;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const NOW: u64 = 1_764_400_000;
const TOLERANCE: u64 = 300;
const MAX_BODY: usize = 2048;

const FIXTURES: [&str; 10] = [
    include_str!("../../../events/webhooks/agent.environment.expired.json"),
    include_str!("../../../events/webhooks/agent.environment.failed.json"),
    include_str!("../../../events/webhooks/agent.environment.ready.json"),
    include_str!("../../../events/webhooks/agent.environment.suspended.json"),
    include_str!(
        "../../../events/webhooks/agent.session.action_required.environment_connection.json"
    ),
    include_str!("../../../events/webhooks/agent.session.action_required.function_call.json"),
    include_str!("../../../events/webhooks/agent.session.created.json"),
    include_str!("../../../events/webhooks/agent.session.failed.json"),
    include_str!("../../../events/webhooks/agent.session.idle.json"),
    include_str!("../../../events/webhooks/agent.session.in_progress.json"),
];

fn key() -> Vec<u8> {
    BASE64.decode(SECRET.trim_start_matches("whsec_")).unwrap()
}

fn tag(id: &[u8], ts: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(&key()).unwrap();
    mac.update(id);
    mac.update(b".");
    mac.update(ts);
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
}

/// The one value of a header that must appear exactly once (names are lowercase in an
/// `http` header map), trimmed.
fn single<'a>(headers: &'a [(HeaderName, HeaderValue)], name: &str) -> Option<&'a [u8]> {
    let mut values = headers.iter().filter(|(n, _)| n.as_str() == name);
    let first = values.next()?;
    if values.next().is_some() {
        return None;
    }
    Some(first.1.as_bytes().trim_ascii())
}

/// The oracle: a valid signature at NOW, computed without `WebhookVerifier`.
fn validly_signed(headers: &[(HeaderName, HeaderValue)], body: &[u8]) -> bool {
    let (Some(id), Some(ts), Some(sig)) = (
        single(headers, "webhook-id"),
        single(headers, "webhook-timestamp"),
        single(headers, "webhook-signature"),
    ) else {
        return false;
    };
    if id.is_empty() || ts.is_empty() || ts.len() > 20 || !ts.iter().all(u8::is_ascii_digit) {
        return false;
    }
    let Ok(t) = std::str::from_utf8(ts).unwrap().parse::<u64>() else {
        return false;
    };
    if t.abs_diff(NOW) > TOLERANCE {
        return false;
    }
    let expected = tag(id, ts, body);
    sig.split(|b| *b == b' ').any(|e| e == expected.as_bytes())
}

#[derive(Clone, Debug)]
enum Mutation {
    None,
    FlipBody { at: usize, xor: u8 },
    FlipSignature { at: usize, xor: u8 },
    FlipId { at: usize, xor: u8 },
    ShiftTimestamp(i64),
    Drop(usize),
    Duplicate(usize),
    UpperCaseNames,
    ReplaceBody(Vec<u8>),
    ExtraHeader(String, Vec<u8>),
    SignatureValue(Vec<u8>),
    TimestampValue(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        Just(Mutation::None),
        (any::<usize>(), 1u8..).prop_map(|(at, xor)| Mutation::FlipBody { at, xor }),
        (any::<usize>(), 1u8..).prop_map(|(at, xor)| Mutation::FlipSignature { at, xor }),
        (any::<usize>(), 1u8..).prop_map(|(at, xor)| Mutation::FlipId { at, xor }),
        prop_oneof![-1000i64..1000, any::<i64>()].prop_map(Mutation::ShiftTimestamp),
        (0usize..3).prop_map(Mutation::Drop),
        (0usize..3).prop_map(Mutation::Duplicate),
        Just(Mutation::UpperCaseNames),
        proptest::collection::vec(any::<u8>(), 0..3000).prop_map(Mutation::ReplaceBody),
        (
            "[a-zA-Z-]{1,20}",
            proptest::collection::vec(any::<u8>(), 0..64)
        )
            .prop_map(|(n, v)| Mutation::ExtraHeader(n, v)),
        proptest::collection::vec(any::<u8>(), 0..96).prop_map(Mutation::SignatureValue),
        proptest::collection::vec(any::<u8>(), 0..24).prop_map(Mutation::TimestampValue),
    ]
}

fn flip(bytes: &mut [u8], at: usize, xor: u8) {
    if !bytes.is_empty() {
        let i = at % bytes.len();
        bytes[i] ^= xor;
    }
}

const NAMES: [&str; 3] = ["webhook-id", "webhook-timestamp", "webhook-signature"];

/// Headers and body after the mutations; `resign` replaces the signature with a valid one
/// for whatever id, timestamp and body are left.
fn delivery(
    fixture: usize,
    mutations: &[Mutation],
    resign: bool,
) -> (Vec<(HeaderName, HeaderValue)>, Vec<u8>) {
    let value: serde_json::Value = serde_json::from_str(FIXTURES[fixture]).unwrap();
    let mut body = serde_json::to_vec(&value).unwrap();
    let mut id = format!("msg_prop{fixture:04}").into_bytes();
    let mut ts = NOW.to_string().into_bytes();
    let mut sig = tag(&id, &ts, &body).into_bytes();
    let mut drop = [false; 3];
    let mut dup = [false; 3];
    let mut upper = false;
    let mut extra = Vec::new();
    for m in mutations {
        match m {
            Mutation::None => {}
            Mutation::FlipBody { at, xor } => flip(&mut body, *at, *xor),
            Mutation::FlipSignature { at, xor } => flip(&mut sig, *at, *xor),
            Mutation::FlipId { at, xor } => flip(&mut id, *at, *xor),
            Mutation::ShiftTimestamp(d) => {
                ts = NOW.saturating_add_signed(*d).to_string().into_bytes();
            }
            Mutation::Drop(i) => drop[*i] = true,
            Mutation::Duplicate(i) => dup[*i] = true,
            Mutation::UpperCaseNames => upper = true,
            Mutation::ReplaceBody(b) => body = b.clone(),
            Mutation::ExtraHeader(n, v) => extra.push((n.clone(), v.clone())),
            Mutation::SignatureValue(v) => sig = v.clone(),
            Mutation::TimestampValue(v) => ts = v.clone(),
        }
    }
    if resign {
        sig = tag(id.trim_ascii(), ts.trim_ascii(), &body).into_bytes();
    }
    let mut headers = vec![(
        HeaderName::from_static("content-type"),
        HeaderValue::from_static("application/json"),
    )];
    for (i, value) in [id, ts, sig].into_iter().enumerate() {
        let name = if upper {
            NAMES[i].to_ascii_uppercase()
        } else {
            NAMES[i].to_owned()
        };
        // Values an HTTP request cannot carry never reach the router.
        let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(&value),
        ) else {
            continue;
        };
        if drop[i] {
            continue;
        }
        if dup[i] {
            headers.push((n.clone(), v.clone()));
        }
        headers.push((n, v));
    }
    for (n, v) in extra {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(n.as_bytes()),
            HeaderValue::from_bytes(&v),
        ) {
            headers.push((n, v));
        }
    }
    (headers, body)
}

fn check(headers: Vec<(HeaderName, HeaderValue)>, body: Vec<u8>, queue_fails: bool) {
    let queue = RecordingQueue::default();
    queue.failing.store(queue_fails, Ordering::SeqCst);
    let intake = Intake::new(
        WebhookVerifier::new(SECRET).unwrap(),
        queue.clone(),
        Arc::new(FixedClock(NOW)),
    )
    .with_max_body_bytes(MAX_BODY);
    let app = router(Arc::new(intake));
    let mut req = Request::post("/webhook")
        .body(Body::from(body.clone()))
        .unwrap();
    for (n, v) in &headers {
        req.headers_mut().append(n.clone(), v.clone());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (status, answer) = rt.block_on(async {
        let res = app.oneshot(req).await.unwrap();
        let status = res.status().as_u16();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        (status, bytes)
    });
    let sent = queue.sent.lock().unwrap().len();
    let valid = validly_signed(&headers, &body);
    assert!(
        status < 500 || (queue_fails && status == 503),
        "status {status} without a queue failure: {}",
        String::from_utf8_lossy(&answer)
    );
    assert!(sent <= 1, "one delivery enqueued {sent} jobs");
    if sent == 1 {
        assert!(valid, "enqueued a delivery without a valid signature");
        assert_eq!(status, 200);
    }
    if !valid {
        assert!(
            (400..500).contains(&status),
            "invalid delivery answered {status}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_mutated_delivery_is_answered_without_5xx_and_enqueued_only_when_validly_signed(
        fixture in 0..FIXTURES.len(),
        mutations in proptest::collection::vec(mutation(), 0..4),
        resign in any::<bool>(),
        queue_fails in any::<bool>(),
    ) {
        let (headers, body) = delivery(fixture, &mutations, resign);
        check(headers, body, queue_fails);
    }

    #[test]
    fn arbitrary_headers_and_body_are_answered_without_5xx_and_never_enqueued(
        headers in proptest::collection::vec(
            (prop_oneof![
                Just("webhook-id".to_owned()),
                Just("webhook-timestamp".to_owned()),
                Just("webhook-signature".to_owned()),
                "[a-zA-Z-]{1,16}",
            ], proptest::collection::vec(any::<u8>(), 0..64)),
            0..6,
        ),
        body in proptest::collection::vec(any::<u8>(), 0..3000),
        queue_fails in any::<bool>(),
    ) {
        let headers: Vec<(HeaderName, HeaderValue)> = headers
            .into_iter()
            .filter_map(|(n, v)| {
                Some((HeaderName::from_bytes(n.as_bytes()).ok()?, HeaderValue::from_bytes(&v).ok()?))
            })
            .collect();
        check(headers, body, queue_fails);
    }
}

#[test]
fn every_signed_fixture_is_answered_2xx_and_a_failing_queue_only_ever_gives_503() {
    for fixture in 0..FIXTURES.len() {
        for queue_fails in [false, true] {
            let (headers, body) = delivery(fixture, &[], false);
            assert!(validly_signed(&headers, &body), "fixture {fixture} signs");
            check(headers, body, queue_fails);
        }
    }
}
