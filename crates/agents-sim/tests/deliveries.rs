//! Webhook delivery: signatures, at-least-once retries, duplicates, reordering, timestamps.

mod common;

use agents_sim::{SessionEnvironment, SimConfig, spawn};
use common::{WAIT, sim_with_receiver};
use sandbox_core::event::AgentEvent;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

#[tokio::test]
async fn duplicates_deliver_n_plus_one_copies_with_the_same_webhook_id() {
    let (sim, rx) = sim_with_receiver(0, |c| c.duplicates = 3).await;
    let client = sim.client();
    let session = client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    assert!(sim.wait_deliveries_idle(WAIT).await);

    let got = rx.of_session(session.id.as_str());
    assert_eq!(got.len(), 4, "1 original + 3 duplicates");
    assert!(got.iter().all(|r| r.webhook_id == got[0].webhook_id));
    assert!(
        got.iter().all(|r| r.event.id == got[0].event.id),
        "same event"
    );
    assert!(got.iter().all(|r| r.raw == got[0].raw), "same bytes");
    let stats = sim.delivery_stats();
    assert_eq!((stats.emitted, stats.copies, stats.acknowledged), (1, 4, 4));
    assert_eq!(stats.pending, 0);
    let ev = &sim.state().events[0];
    assert_eq!((ev.attempts, ev.acknowledged), (4, 4));
    assert_eq!(ev.webhook_id, got[0].webhook_id);
    sim.shutdown().await;
}

#[tokio::test]
async fn deliveries_are_retried_with_the_same_webhook_id_until_2xx() {
    let (sim, rx) = sim_with_receiver(3, |_| {}).await;
    let client = sim.client();
    let session = client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    assert!(sim.wait_deliveries_idle(WAIT).await);

    let attempts = rx.attempts();
    let statuses: Vec<u16> = attempts.iter().map(|(_, s)| *s).collect();
    assert_eq!(statuses, [500, 500, 500, 200]);
    assert!(attempts.iter().all(|(id, _)| *id == attempts[0].0));
    assert_eq!(rx.of_session(session.id.as_str()).len(), 1);
    let stats = sim.delivery_stats();
    assert_eq!(
        (
            stats.attempted,
            stats.acknowledged,
            stats.failed_attempts,
            stats.gave_up
        ),
        (4, 1, 3, 0)
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn a_copy_is_abandoned_after_max_delivery_attempts() {
    let (sim, rx) = sim_with_receiver(usize::MAX, |c| c.max_delivery_attempts = 3).await;
    let client = sim.client();
    client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    assert!(sim.wait_deliveries_idle(WAIT).await);
    assert_eq!(rx.attempts().len(), 3);
    let stats = sim.delivery_stats();
    assert_eq!((stats.attempted, stats.gave_up, stats.pending), (3, 1, 0));
    assert!(rx.accepted().is_empty());
    sim.shutdown().await;
}

#[tokio::test]
async fn connection_errors_count_as_failed_attempts() {
    // A port with nothing listening.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cfg = SimConfig {
        max_delivery_attempts: 2,
        retry_base_delay: Duration::from_millis(10),
        ..SimConfig::default().with_webhook(
            format!("http://127.0.0.1:{port}/webhooks").parse().unwrap(),
            common::SECRET,
        )
    };
    let sim = spawn(cfg).await.unwrap();
    sim.sim_state()
        .emit_event("agent.environment.ready", json!({"id": "env_1"}));
    assert!(sim.wait_deliveries_idle(WAIT).await);
    let stats = sim.delivery_stats();
    assert_eq!(
        (stats.attempted, stats.failed_attempts, stats.gave_up),
        (2, 2, 1)
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn reorder_shuffles_windows_but_delivers_every_event_once() {
    let (sim, rx) = sim_with_receiver(0, |c| {
        c.reorder = true;
        c.seed = 42;
    })
    .await;
    let emitted: Vec<String> = (0..16)
        .map(|i| {
            sim.sim_state()
                .emit_event(
                    "agent.environment.ready",
                    json!({"id": format!("env_{i:02}")}),
                )
                .webhook_id
        })
        .collect();
    assert!(sim.wait_deliveries_idle(WAIT).await);
    let arrived: Vec<String> = rx.accepted().into_iter().map(|r| r.webhook_id).collect();
    let mut a = arrived.clone();
    let mut e = emitted.clone();
    a.sort();
    e.sort();
    assert_eq!(a, e, "every event exactly once");
    assert_ne!(arrived, emitted, "some window was shuffled");
    sim.shutdown().await;
}

#[tokio::test]
async fn delays_and_duplicates_together_still_deliver_everything() {
    let (sim, rx) = sim_with_receiver(0, |c| {
        c.duplicates = 2;
        c.delay_ms = 0..=30;
        c.seed = 7;
    })
    .await;
    for i in 0..5 {
        sim.sim_state()
            .emit_event("agent.environment.ready", json!({"id": format!("env_{i}")}));
    }
    assert!(sim.wait_deliveries_idle(WAIT).await);
    let mut per_id: BTreeMap<String, usize> = BTreeMap::new();
    for r in rx.accepted() {
        *per_id.entry(r.webhook_id).or_default() += 1;
    }
    assert_eq!(per_id.len(), 5);
    assert!(per_id.values().all(|n| *n == 3));
    sim.shutdown().await;
}

#[tokio::test]
async fn the_signature_timestamp_is_real_time_while_simulated_time_runs_ahead() {
    let (sim, rx) = sim_with_receiver(0, |c| c.time_scale = 0.0).await;
    sim.advance_clock(86_400.0); // a simulated day later
    let client = sim.client();
    let session = client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let created = rx
        .wait_for(session.id.as_str(), "agent.session.created")
        .await;
    let real = agents_sim::real_unix_secs();
    assert!(
        created.timestamp.abs_diff(real) <= 5,
        "webhook-timestamp is the real clock"
    );
    assert!(
        created.event.created_at >= real as i64 + 86_000,
        "created_at is simulated"
    );
    assert_eq!(session.created_at, created.event.created_at);
    assert_eq!(rx.verify_failures(), 0);

    // Unknown types are delivered too (receivers must accept and ignore them).
    let ev = client
        .emit_webhook("batch.completed", json!({"id": "batch_1"}))
        .await
        .unwrap();
    let got = common::wait_until("unknown event", || {
        rx.accepted()
            .into_iter()
            .find(|r| r.webhook_id == ev.webhook_id)
    })
    .await;
    assert!(matches!(got.kind, AgentEvent::Unknown { ref kind } if kind == "batch.completed"));
    sim.shutdown().await;
}
