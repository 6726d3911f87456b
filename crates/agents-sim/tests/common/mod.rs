//! A local webhook receiver (axum on 127.0.0.1) that verifies every delivery with
//! `sandbox_core::WebhookVerifier` and parses it with `sandbox_core::event::WebhookEvent`,
//! plus small helpers.
#![allow(dead_code)]

use agents_sim::{SimConfig, SimHandle, Url, real_unix_secs, spawn};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use sandbox_core::WebhookVerifier;
use sandbox_core::event::{AgentEvent, WebhookEvent};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// TEST ONLY secret: `whsec_` + base64 of 32 bytes.
pub const SECRET: &str = "whsec_dGVzdC1vbmx5LWFnZW50cy1zaW0tcmVjZWl2ZXItMzI=";

/// Generous real-time bound for waits (the test machine is small and busy).
pub const WAIT: Duration = Duration::from_secs(20);

/// One delivery that verified and parsed.
#[derive(Clone, Debug)]
pub struct Received {
    pub webhook_id: String,
    pub timestamp: u64,
    pub event: WebhookEvent,
    pub kind: AgentEvent,
    pub arrived: Instant,
    /// The exact body bytes.
    pub raw: Bytes,
}

#[derive(Default)]
struct Inner {
    accepted: Vec<Received>,
    /// Every attempt: (webhook-id or "", HTTP status answered).
    attempts: Vec<(String, u16)>,
    verify_failures: usize,
}

/// The receiver handle.
#[derive(Clone)]
pub struct Receiver {
    pub url: Url,
    inner: Arc<Mutex<Inner>>,
    fail_first: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct RxState {
    verifier: WebhookVerifier,
    inner: Arc<Mutex<Inner>>,
    fail_first: Arc<AtomicUsize>,
}

async fn receive(State(st): State<RxState>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let verified = st.verifier.verify(
        headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes())),
        &body,
        real_unix_secs(),
    );
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mut inner = st.inner.lock().unwrap();
    let delivery = match verified {
        Ok(d) => d,
        Err(e) => {
            inner.verify_failures += 1;
            let status = e.http_status();
            inner.attempts.push((id, status));
            return StatusCode::from_u16(status).unwrap();
        }
    };
    assert_eq!(
        headers.get("content-type").unwrap(),
        "application/json",
        "content-type"
    );
    if st
        .fail_first
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        inner.attempts.push((id, 500));
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    let event = WebhookEvent::from_slice(&body).expect("envelope parses");
    let kind = event.parse_kind().expect("typed data parses");
    assert_eq!(event.object, "event");
    assert!(event.id.starts_with("evt_"));
    inner.attempts.push((id, 200));
    inner.accepted.push(Received {
        webhook_id: delivery.webhook_id,
        timestamp: delivery.timestamp,
        event,
        kind,
        arrived: Instant::now(),
        raw: body.clone(),
    });
    StatusCode::OK
}

impl Receiver {
    /// Starts a receiver on 127.0.0.1 that answers 500 to the first `fail_first` verified
    /// attempts, then 200.
    pub async fn start(fail_first: usize) -> Self {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let fail_first = Arc::new(AtomicUsize::new(fail_first));
        let st = RxState {
            verifier: WebhookVerifier::new(SECRET).unwrap(),
            inner: inner.clone(),
            fail_first: fail_first.clone(),
        };
        let app = Router::new()
            .route("/webhooks", post(receive))
            .with_state(st);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            url: format!("http://{addr}/webhooks").parse().unwrap(),
            inner,
            fail_first,
        }
    }

    pub fn accepted(&self) -> Vec<Received> {
        self.inner.lock().unwrap().accepted.clone()
    }

    pub fn attempts(&self) -> Vec<(String, u16)> {
        self.inner.lock().unwrap().attempts.clone()
    }

    pub fn verify_failures(&self) -> usize {
        self.inner.lock().unwrap().verify_failures
    }

    /// Accepted deliveries of one session, in arrival order.
    pub fn of_session(&self, session_id: &str) -> Vec<Received> {
        self.accepted()
            .into_iter()
            .filter(|r| r.event.data.get("id").and_then(|v| v.as_str()) == Some(session_id))
            .collect()
    }

    /// Event types accepted for one session, in arrival order.
    pub fn types_of(&self, session_id: &str) -> Vec<String> {
        self.of_session(session_id)
            .into_iter()
            .map(|r| r.event.kind)
            .collect()
    }

    /// Waits until an event of `kind` for `session_id` was accepted.
    pub async fn wait_for(&self, session_id: &str, kind: &str) -> Received {
        wait_until("webhook", || {
            self.of_session(session_id)
                .into_iter()
                .find(|r| r.event.kind == kind)
        })
        .await
    }
}

/// Polls `f` every 10 ms until it returns `Some`, at most [`WAIT`].
pub async fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls an async check every 10 ms until it returns `Some`, at most [`WAIT`].
pub async fn wait_until_async<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A config delivering to `rx` with fast retries.
pub fn config_for(rx: &Receiver) -> SimConfig {
    SimConfig {
        retry_base_delay: Duration::from_millis(20),
        retry_max_delay: Duration::from_millis(200),
        ..SimConfig::default().with_webhook(rx.url.clone(), SECRET)
    }
}

/// Spawns a simulator delivering to a fresh receiver.
pub async fn sim_with_receiver(
    fail_first: usize,
    tweak: impl FnOnce(&mut SimConfig),
) -> (SimHandle, Receiver) {
    let rx = Receiver::start(fail_first).await;
    let mut cfg = config_for(&rx);
    tweak(&mut cfg);
    let sim = spawn(cfg).await.expect("simulator starts");
    (sim, rx)
}

/// The pinned codex (infra/executor, `npm ci`): `node_modules/.bin/codex`.
pub fn pinned_codex() -> std::path::PathBuf {
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../infra/executor/node_modules/.bin/codex");
    assert!(
        p.exists(),
        "{} missing: run `make infra-tools`",
        p.display()
    );
    p
}
