//! verify + parse + route of a signed 1 KiB delivery, beside bare HMAC-SHA256 over the
//! same signed bytes (`{id}.{timestamp}.{body}`), and the whole `Intake::accept_delivery`
//! (the same plus the job, a queue send to a null queue and the JSON answer).
//!
//! The deliveries come from `$SANDBOX_BENCH_DELIVERIES` (the file the Python timing reads)
//! when set. Each iteration takes the next delivery of the file, so caches see many bodies.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hmac::{Hmac, KeyInit, Mac};
use sandbox_bench::deliveries::DeliveryFile;
use sandbox_bench::doubles::NullQueue;
use sandbox_controller::doubles::FixedClock;
use sandbox_controller::webhook::{Intake, Route, route};
use sandbox_core::event::AgentEvent;
use sandbox_core::webhook::WebhookVerifier;
use sha2::Sha256;
use std::hint::black_box;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

struct Prepared {
    id: String,
    ts: String,
    sig: String,
    body: Vec<u8>,
    signed_content: Vec<u8>,
}

fn prepared(file: &DeliveryFile) -> Vec<Prepared> {
    let ts = file.timestamp.to_string();
    file.deliveries
        .iter()
        .map(|d| Prepared {
            id: d.webhook_id.clone(),
            ts: ts.clone(),
            sig: d.signature.clone(),
            body: d.body.as_bytes().to_vec(),
            signed_content: format!("{}.{}.{}", d.webhook_id, ts, d.body).into_bytes(),
        })
        .collect()
}

fn verify_parse_route(v: &WebhookVerifier, d: &Prepared, now: u64) -> Route {
    let headers: [(&str, &[u8]); 4] = [
        ("content-type", b"application/json"),
        ("webhook-id", d.id.as_bytes()),
        ("webhook-timestamp", d.ts.as_bytes()),
        ("webhook-signature", d.sig.as_bytes()),
    ];
    v.verify(headers, &d.body, now)
        .expect("bench delivery verifies");
    // The intake's parse: one pass, `data` borrowed as raw JSON.
    let event = AgentEvent::from_body(&d.body).expect("bench delivery parses");
    route(&event)
}

fn bench(c: &mut Criterion) {
    let file = DeliveryFile::from_env_or(1000);
    let now = file.timestamp;
    let deliveries = prepared(&file);
    let verifier = WebhookVerifier::new(&file.secret).expect("bench secret");
    let key = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        file.secret.trim_start_matches("whsec_"),
    )
    .expect("bench secret is base64");
    let keyed = Hmac::<Sha256>::new_from_slice(&key).expect("any key length");
    let queue = NullQueue::default();
    let intake = Intake::new(verifier.clone(), queue.clone(), Arc::new(FixedClock(now)));
    let n = deliveries.len();

    let mut g = c.benchmark_group("webhook_1kib");
    g.throughput(Throughput::Elements(1));

    let mut i = 0;
    g.bench_function("hmac_sha256", |b| {
        b.iter(|| {
            let d = &deliveries[i % n];
            i += 1;
            // The keyed state is precomputed once, as the verifier does.
            let mut mac = keyed.clone();
            mac.update(black_box(&d.signed_content));
            black_box(mac.finalize().into_bytes())
        })
    });

    let mut i = 0;
    g.bench_function("verify_parse_route", |b| {
        b.iter(|| {
            let d = &deliveries[i % n];
            i += 1;
            black_box(verify_parse_route(&verifier, black_box(d), now))
        })
    });

    let mut i = 0;
    let mut cx = Context::from_waker(Waker::noop());
    g.bench_function("accept_delivery", |b| {
        b.iter(|| {
            let d = &deliveries[i % n];
            i += 1;
            let headers: [(&str, &[u8]); 4] = [
                ("content-type", b"application/json"),
                ("webhook-id", d.id.as_bytes()),
                ("webhook-timestamp", d.ts.as_bytes()),
                ("webhook-signature", d.sig.as_bytes()),
            ];
            // The null queue never waits, so one poll completes the future.
            let mut fut = std::pin::pin!(intake.accept_delivery(headers, &d.body));
            match fut.as_mut().poll(&mut cx) {
                Poll::Ready(answer) => {
                    assert_eq!(answer.status, 200);
                    black_box(answer)
                }
                Poll::Pending => panic!("null queue send never waits"),
            }
        })
    });
    g.finish();
    assert!(queue.sent() > 0, "accept_delivery queued the deliveries");
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench
}
criterion_main!(benches);
