//! Signed, at-least-once webhook delivery with injectable faults.
//!
//! Every emitted event becomes an envelope `{id: "evt_...", object: "event", type,
//! created_at, data}` (shapes as in `events/webhooks/`), serialized once to compact JSON;
//! those exact bytes are what every copy and retry sends. Headers (Standard Webhooks):
//! `webhook-id` (`msg_...`, the same on every copy and retry: the de-duplication key),
//! `webhook-timestamp` (the **real** wall clock in Unix seconds at each attempt, so
//! receivers that allow ±300 s accept it whatever the simulated time), `webhook-signature`
//! (`v1,<base64>` from [`WebhookVerifier::sign`], re-signed per attempt) and
//! `content-type: application/json`.
//!
//! A background task takes deliveries in emission order and makes each one's first attempt
//! in that order. Faults (see [`SimConfig`]): `duplicates` extra copies
//! per delivery (even-numbered ones concurrently with the original, odd-numbered ones
//! 10 ms × n later); `reorder` shuffles windows of up to [`REORDER_WINDOW`] deliveries
//! collected within [`REORDER_COLLECT`] using the seeded generator; `delay_ms` sleeps a
//! random time before each copy's first attempt. A copy answered with non-2xx or a
//! connection error is retried (in its own task, so later deliveries are not held up) after
//! `retry_base_delay × 2^(n-1)` capped at `retry_max_delay`, up to `max_delivery_attempts`
//! attempts.

use crate::clock::real_unix_secs;
use crate::config::SimConfig;
use crate::error::SimError;
use crate::rng::{IdGen, SimRng};
use crate::snapshot::{DeliveryStats, EmittedEvent};
use axum::body::Bytes;
use reqwest::Url;
use sandbox_core::WebhookVerifier;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Largest number of deliveries shuffled together when `reorder` is on.
pub const REORDER_WINDOW: usize = 4;
/// How long the worker collects a reorder window after its first delivery (real time).
pub const REORDER_COLLECT: Duration = Duration::from_millis(30);

#[derive(Clone, Debug)]
struct Delivery {
    webhook_id: String,
    body: Bytes,
}

#[derive(Debug, Default)]
struct Ledger {
    stats: DeliveryStats,
    log: Vec<EmittedEvent>,
    index: HashMap<String, usize>,
}

struct DeliveryShared {
    url: Option<Url>,
    verifier: WebhookVerifier,
    http: reqwest::Client,
    duplicates: u32,
    reorder: bool,
    delay_ms: RangeInclusive<u64>,
    max_attempts: u32,
    retry_base: Duration,
    retry_max: Duration,
    rng: Mutex<SimRng>,
    ledger: Mutex<Ledger>,
    pending: watch::Sender<usize>,
    shutdown: watch::Receiver<bool>,
}

/// Emits events and owns the delivery worker.
pub(crate) struct Dispatcher {
    tx: mpsc::UnboundedSender<Delivery>,
    shared: Arc<DeliveryShared>,
    ids: IdGen,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Dispatcher {
    /// Builds the dispatcher and spawns its worker on the current Tokio runtime.
    pub(crate) fn new(
        config: &SimConfig,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Self, SimError> {
        let verifier = WebhookVerifier::new(&config.webhook_secret)?;
        let http = reqwest::Client::builder()
            .timeout(config.delivery_timeout)
            .connect_timeout(config.delivery_timeout)
            .no_proxy()
            .user_agent(concat!("agents-sim/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(SimError::Client)?;
        let shared = Arc::new(DeliveryShared {
            url: config.webhook_url.clone(),
            verifier,
            http,
            duplicates: config.duplicates,
            reorder: config.reorder,
            delay_ms: config.delay_ms.clone(),
            max_attempts: config.max_delivery_attempts.max(1),
            retry_base: config.retry_base_delay,
            retry_max: config.retry_max_delay,
            rng: Mutex::new(SimRng::new(config.seed)),
            ledger: Mutex::new(Ledger::default()),
            pending: watch::Sender::new(0),
            shutdown,
        });
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(worker(shared.clone(), rx));
        Ok(Self {
            tx,
            shared,
            ids: IdGen::new(),
        })
    }

    /// Emits one event: logs it and, with a webhook URL, queues `1 + duplicates` copies.
    /// Synchronous (callers hold the state lock, so emission order is state order).
    pub(crate) fn emit(&self, kind: &str, data: Value, created_at: i64) -> EmittedEvent {
        let event_id = self.ids.hex("evt_");
        let webhook_id = self.ids.base62("msg_");
        let envelope = json!({
            "id": event_id,
            "object": "event",
            "type": kind,
            "created_at": created_at,
            "data": data,
        });
        let body = Bytes::from(serde_json::to_vec(&envelope).unwrap_or_default());
        let session_id = if kind.starts_with("agent.session.") {
            data.get("id").and_then(Value::as_str).map(str::to_owned)
        } else {
            None
        };
        let event = EmittedEvent {
            webhook_id: webhook_id.clone(),
            event_id,
            kind: kind.to_owned(),
            created_at,
            session_id,
            data,
            attempts: 0,
            acknowledged: 0,
        };
        {
            let mut ledger = lock(&self.shared.ledger);
            ledger.stats.emitted += 1;
            let idx = ledger.log.len();
            ledger.index.insert(webhook_id.clone(), idx);
            ledger.log.push(event.clone());
            if self.shared.url.is_some() {
                let copies = 1 + self.shared.duplicates as usize;
                ledger.stats.copies += copies as u64;
                self.shared.pending.send_modify(|p| *p += copies);
            }
        }
        tracing::debug!(kind, webhook_id = %webhook_id, "webhook event emitted");
        if self.shared.url.is_some() && self.tx.send(Delivery { webhook_id, body }).is_err() {
            // The worker is gone (shutdown): nothing will deliver these copies.
            let copies = 1 + self.shared.duplicates as usize;
            self.shared
                .pending
                .send_modify(|p| *p = p.saturating_sub(copies));
        }
        event
    }

    /// Counters and the event log.
    pub(crate) fn ledger(&self) -> (DeliveryStats, Vec<EmittedEvent>) {
        let ledger = lock(&self.shared.ledger);
        let mut stats = ledger.stats.clone();
        stats.pending = *self.shared.pending.borrow() as u64;
        (stats, ledger.log.clone())
    }

    /// Waits until no copy is pending (acknowledged or abandoned), at most `timeout`.
    /// Returns whether that happened in time.
    pub(crate) async fn wait_idle(&self, timeout: Duration) -> bool {
        let mut rx = self.shared.pending.subscribe();
        matches!(
            tokio::time::timeout(timeout, rx.wait_for(|p| *p == 0)).await,
            Ok(Ok(_))
        )
    }
}

async fn worker(shared: Arc<DeliveryShared>, mut rx: mpsc::UnboundedReceiver<Delivery>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        let first = tokio::select! {
            d = rx.recv() => match d { Some(d) => d, None => break },
            () = wait_shutdown(&mut shutdown) => break,
        };
        let mut batch = vec![first];
        if shared.reorder {
            let until = tokio::time::Instant::now() + REORDER_COLLECT;
            while batch.len() < REORDER_WINDOW {
                match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some(d)) => batch.push(d),
                    _ => break,
                }
            }
            lock(&shared.rng).shuffle(&mut batch);
        }
        for delivery in batch {
            dispatch(&shared, delivery).await;
        }
    }
}

async fn wait_shutdown(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Sleeps `d` unless the simulator shuts down first; returns `false` on shutdown.
async fn sleep_or_shutdown(shared: &DeliveryShared, d: Duration) -> bool {
    if d.is_zero() {
        return !*shared.shutdown.borrow();
    }
    let mut shutdown = shared.shutdown.clone();
    tokio::select! {
        () = tokio::time::sleep(d) => true,
        () = wait_shutdown(&mut shutdown) => false,
    }
}

impl DeliveryShared {
    fn random_delay(&self) -> Duration {
        let (lo, hi) = (*self.delay_ms.start(), *self.delay_ms.end());
        if hi == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis(lock(&self.rng).range_inclusive(lo, hi))
    }

    fn backoff(&self, attempts_done: u32) -> Duration {
        let exp = attempts_done.saturating_sub(1).min(20);
        self.retry_base
            .saturating_mul(1u32 << exp)
            .min(self.retry_max)
    }

    fn finish(&self, acknowledged: bool) {
        if !acknowledged {
            lock(&self.ledger).stats.gave_up += 1;
        }
        self.pending.send_modify(|p| *p = p.saturating_sub(1));
    }

    /// One HTTP attempt; `true` when answered with 2xx.
    async fn attempt(&self, d: &Delivery) -> bool {
        let Some(url) = &self.url else { return false };
        {
            let mut ledger = lock(&self.ledger);
            ledger.stats.attempted += 1;
            if let Some(&i) = ledger.index.get(&d.webhook_id) {
                ledger.log[i].attempts += 1;
            }
        }
        let ts = real_unix_secs();
        let signature = self.verifier.sign(&d.webhook_id, ts, &d.body);
        let result = self
            .http
            .post(url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", &d.webhook_id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", signature)
            .body(d.body.clone())
            .send()
            .await;
        let ok = match result {
            Ok(resp) if resp.status().is_success() => true,
            Ok(resp) => {
                tracing::debug!(webhook_id = %d.webhook_id, status = resp.status().as_u16(), "webhook attempt refused");
                false
            }
            Err(err) => {
                tracing::debug!(webhook_id = %d.webhook_id, error = %err.without_url(), "webhook attempt failed");
                false
            }
        };
        let mut ledger = lock(&self.ledger);
        if ok {
            ledger.stats.acknowledged += 1;
            if let Some(&i) = ledger.index.get(&d.webhook_id) {
                ledger.log[i].acknowledged += 1;
            }
        } else {
            ledger.stats.failed_attempts += 1;
        }
        ok
    }

    /// Retries a copy that has already made `done` attempts, until acknowledged or out of
    /// attempts; settles its pending count either way.
    async fn retry_from(self: Arc<Self>, d: Delivery, mut done: u32) {
        while done < self.max_attempts {
            if !sleep_or_shutdown(&self, self.backoff(done)).await {
                self.finish(false);
                return;
            }
            done += 1;
            if self.attempt(&d).await {
                self.finish(true);
                return;
            }
        }
        tracing::debug!(webhook_id = %d.webhook_id, attempts = done, "webhook copy abandoned");
        self.finish(false);
    }

    /// A duplicate copy: waits `stagger` plus the random delay, then attempts and retries.
    async fn copy(self: Arc<Self>, d: Delivery, stagger: Duration) {
        let wait = stagger + self.random_delay();
        if !sleep_or_shutdown(&self, wait).await {
            self.finish(false);
            return;
        }
        if self.attempt(&d).await {
            self.finish(true);
        } else {
            self.retry_from(d, 1).await;
        }
    }
}

async fn dispatch(shared: &Arc<DeliveryShared>, d: Delivery) {
    let mut later = Vec::new();
    for n in 0..shared.duplicates {
        if n % 2 == 0 {
            tokio::spawn(shared.clone().copy(d.clone(), Duration::ZERO));
        } else {
            later.push(Duration::from_millis(10 * u64::from(n + 1)));
        }
    }
    let delay = shared.random_delay();
    if !sleep_or_shutdown(shared, delay).await {
        shared.finish(false);
    } else if shared.attempt(&d).await {
        shared.finish(true);
    } else {
        tokio::spawn(shared.clone().retry_from(d.clone(), 1));
    }
    for stagger in later {
        tokio::spawn(shared.clone().copy(d.clone(), stagger));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_url_events_are_logged_but_nothing_is_pending() {
        let (_tx, rx) = watch::channel(false);
        let d = Dispatcher::new(&SimConfig::default(), rx).unwrap();
        let e = d.emit("agent.session.idle", json!({"id": "sess_1"}), 5);
        assert!(e.webhook_id.starts_with("msg_"));
        assert!(e.event_id.starts_with("evt_"));
        assert_eq!(e.session_id.as_deref(), Some("sess_1"));
        let (stats, log) = d.ledger();
        assert_eq!(stats.emitted, 1);
        assert_eq!(stats.pending, 0);
        assert_eq!(log.len(), 1);
        assert!(d.wait_idle(Duration::from_millis(10)).await);
    }

    #[tokio::test]
    async fn backoff_doubles_and_caps() {
        let (_tx, rx) = watch::channel(false);
        let cfg = SimConfig::default();
        let d = Dispatcher::new(&cfg, rx).unwrap();
        let s = &d.shared;
        assert_eq!(s.backoff(1), Duration::from_millis(100));
        assert_eq!(s.backoff(2), Duration::from_millis(200));
        assert_eq!(s.backoff(3), Duration::from_millis(400));
        assert_eq!(s.backoff(30), Duration::from_secs(2));
    }
}
