//! The webhook entry point, headers + body → response, through the controller's axum
//! router over an in-memory queue double. Properties:
//! 1. no panic;
//! 2. no 5xx unless the queue failed (and then only 503);
//! 3. nothing is enqueued unless the delivery carries a valid signature, checked here
//!    independently of `WebhookVerifier` (HMAC-SHA256 over `{id}.{timestamp}.{body}`,
//!    timestamp within 300 s, an exact `v1,<base64>` entry).
//!
//! Input: `[flags][header lines "name:value\n"...]\n\n[body]`. Flags: bit 0 appends a
//! valid signature for the given id/timestamp/body (so the fuzzer reaches parsing and
//! routing), bit 1 makes the queue fail, bit 2 sets `webhook-timestamp` to the clock.
#![no_main]

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Request};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use sandbox_controller::doubles::{FixedClock, RecordingQueue};
use sandbox_controller::{Intake, router};
use sandbox_core::webhook::WebhookVerifier;
use sha2::Sha256;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use tower::ServiceExt;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const NOW: u64 = 1_764_400_000;
const TOLERANCE: u64 = 300;
const MAX_BODY: usize = 2048;

struct Harness {
    rt: tokio::runtime::Runtime,
    app: axum::Router,
    queue: RecordingQueue,
    key: Vec<u8>,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let queue = RecordingQueue::default();
        let intake = Intake::new(
            WebhookVerifier::new(SECRET).unwrap(),
            queue.clone(),
            Arc::new(FixedClock(NOW)),
        )
        .with_max_body_bytes(MAX_BODY);
        Harness {
            rt: tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap(),
            app: router(Arc::new(intake)),
            queue,
            key: BASE64.decode(SECRET.trim_start_matches("whsec_")).unwrap(),
        }
    })
}

fn tag(key: &[u8], id: &[u8], ts: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
    mac.update(id);
    mac.update(b".");
    mac.update(ts);
    mac.update(b".");
    mac.update(body);
    BASE64.encode(mac.finalize().into_bytes())
}

/// The one value of a header that must appear exactly once, trimmed.
fn single<'a>(headers: &'a [(HeaderName, HeaderValue)], name: &str) -> Option<&'a [u8]> {
    let mut values = headers.iter().filter(|(n, _)| n.as_str() == name);
    let first = values.next()?;
    if values.next().is_some() {
        return None;
    }
    Some(first.1.as_bytes().trim_ascii())
}

/// Independent oracle: does this delivery carry a valid signature at NOW?
fn validly_signed(key: &[u8], headers: &[(HeaderName, HeaderValue)], body: &[u8]) -> bool {
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
    let expected = format!("v1,{}", tag(key, id, ts, body));
    sig.split(|b| *b == b' ').any(|e| e == expected.as_bytes())
}

fn split_input(data: &[u8]) -> (u8, &[u8], &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return (0, &[], &[]);
    };
    match rest.windows(2).position(|w| w == b"\n\n") {
        Some(p) => (flags, &rest[..p], &rest[p + 2..]),
        None => (flags, rest, &[]),
    }
}

fuzz_target!(|data: &[u8]| {
    let h = harness();
    let (flags, head, body) = split_input(data);
    let mut headers: Vec<(HeaderName, HeaderValue)> = head
        .split(|b| *b == b'\n')
        .filter_map(|line| {
            let colon = line.iter().position(|b| *b == b':')?;
            let name = HeaderName::from_bytes(&line[..colon]).ok()?;
            let value = HeaderValue::from_bytes(line[colon + 1..].trim_ascii()).ok()?;
            Some((name, value))
        })
        .collect();
    if flags & 4 != 0 {
        headers.retain(|(n, _)| n.as_str() != "webhook-timestamp");
        headers.push((
            HeaderName::from_static("webhook-timestamp"),
            HeaderValue::from(NOW),
        ));
    }
    if flags & 1 != 0 {
        let id = single(&headers, "webhook-id").unwrap_or_default().to_vec();
        let ts = single(&headers, "webhook-timestamp")
            .unwrap_or_default()
            .to_vec();
        let sig = format!("v1,{}", tag(&h.key, &id, &ts, body));
        let existing = single(&headers, "webhook-signature").map(<[u8]>::to_vec);
        headers.retain(|(n, _)| n.as_str() != "webhook-signature");
        let value = match existing {
            Some(mut e) => {
                e.push(b' ');
                e.extend_from_slice(sig.as_bytes());
                e
            }
            None => sig.into_bytes(),
        };
        if let Ok(v) = HeaderValue::from_bytes(&value) {
            headers.push((HeaderName::from_static("webhook-signature"), v));
        }
    }
    let queue_fails = flags & 2 != 0;
    h.queue.failing.store(queue_fails, Ordering::SeqCst);
    h.queue.sent.lock().unwrap().clear();

    let mut req = Request::post("/webhook")
        .body(Body::from(body.to_vec()))
        .unwrap();
    for (n, v) in &headers {
        req.headers_mut().append(n.clone(), v.clone());
    }
    let (status, answer) = h.rt.block_on(async {
        let res = h.app.clone().oneshot(req).await.unwrap();
        let status = res.status().as_u16();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        (status, bytes)
    });

    let sent = h.queue.sent.lock().unwrap().len();
    let valid = validly_signed(&h.key, &headers, body);
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
            "invalid signature answered {status}"
        );
    }
});
