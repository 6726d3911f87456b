//! No secret in any log (part 6): every tracing event at every level is captured
//! while the pipeline runs — webhook intake (accepted, forged, malformed, queue down),
//! worker, sweep, close, failure paths, and the real Agents API client failing against a
//! closed port — with the webhook secret, the API key and the executor key set to
//! distinctive values. None of them may appear, neither verbatim nor base64-encoded;
//! the same holds for the `Debug` output of the configurations and errors.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use sandbox_agents_api::{AgentsClient, ClientConfig, SessionsApi};
use sandbox_controller::ports::Clock;
use sandbox_controller::{Controller, Intake, Job};
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::session::SessionStatus;
use sandbox_core::webhook::WebhookVerifier;
use sandbox_local::{ExecutorKey, KeySource};
use sandbox_testkit::{Fault, World};
use std::sync::{Arc, Mutex};
use std::time::Duration;

static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;
impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const RAW_WEBHOOK_KEY: &str = "SECRETSCAN-webhook-signing-key-81b2c3";
const API_KEY: &str = "sk-secretscan-APIKEY-7f3a9c1e5b2d";
const EXECUTOR_KEY: &str = "sk-secretscan-EXECKEY-2d4f6a8c0e1f";

fn webhook_secret() -> String {
    format!("whsec_{}", STANDARD.encode(RAW_WEBHOOK_KEY))
}

/// Every form a leaked secret could take in a log line.
fn needles() -> Vec<String> {
    let mut out = vec![webhook_secret(), STANDARD.encode(RAW_WEBHOOK_KEY)];
    for s in [RAW_WEBHOOK_KEY, API_KEY, EXECUTOR_KEY] {
        out.push(s.to_owned());
        out.push(STANDARD.encode(s));
        out.push(URL_SAFE_NO_PAD.encode(s));
        // A distinctive inner part catches truncated or quoted forms.
        out.push(s[s.len() - 12..].to_owned());
    }
    out
}

fn assert_clean(what: &str, text: &str) {
    for n in needles() {
        assert!(
            !text.contains(&n),
            "{what} contains a secret form ({} chars): {}",
            n.len(),
            text.lines()
                .filter(|l| l.contains(&n))
                .take(3)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

fn event_body() -> Vec<u8> {
    let path = format!(
        "{}/../../events/webhooks/agent.session.action_required.environment_connection.json",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[tokio::test]
async fn no_configured_secret_appears_in_any_log_or_debug_output() {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(|| Capture)
        .init();
    let world = World::new();
    let verifier = WebhookVerifier::new(&webhook_secret()).unwrap();
    let mut debug_dump = vec![format!("{verifier:?}")];

    // Intake: a genuine delivery, a forged one, a malformed one, and one while the queue
    // is down.
    let intake = Intake::new(
        WebhookVerifier::new(&webhook_secret()).unwrap(),
        world.controller("intake").events,
        Arc::new(world.clock.clone()),
    );
    let body = event_body();
    let now = world.clock.now();
    let sig = verifier.sign("wh_scan_1", now, &body);
    let headers = |id: &'static str, sig: String| {
        vec![
            ("webhook-id", id.as_bytes().to_vec()),
            ("webhook-timestamp", now.to_string().into_bytes()),
            ("webhook-signature", sig.into_bytes()),
        ]
    };
    let send = |h: Vec<(&'static str, Vec<u8>)>, body: Vec<u8>| {
        let intake = &intake;
        async move {
            let pairs: Vec<(&str, &[u8])> = h.iter().map(|(k, v)| (*k, v.as_slice())).collect();
            intake.accept_delivery(pairs, &body).await
        }
    };
    let ok = send(headers("wh_scan_1", sig.clone()), body.clone()).await;
    assert_eq!(ok.status, 200, "{:?}", ok.body);
    let forged = send(headers("wh_scan_2", "v1,AAAA".to_owned()), body.clone()).await;
    assert_eq!(forged.status, 401);
    let sig3 = verifier.sign("wh_scan_3", now, b"{not json");
    let malformed = send(headers("wh_scan_3", sig3), b"{not json".to_vec()).await;
    assert_eq!(malformed.status, 400);
    world
        .faults
        .fail("queue", Some("send"), Fault::ServerError, 1);
    let sig4 = verifier.sign("wh_scan_4", now, &body);
    let down = send(headers("wh_scan_4", sig4), body.clone()).await;
    assert_eq!(down.status, 503);
    debug_dump.push(format!("{ok:?} {forged:?} {malformed:?} {down:?}"));

    // Worker, sweep and close over the twins, with failures on every port.
    let session = SessionId::new("sess_0e25c6de04de5b894495116a");
    let env = EnvironmentId::new("env_scan");
    world.sessions.add(&session, &env, SessionStatus::Idle);
    world.sessions.require_connection(&session);
    let c = world.controller("scan");
    world.faults.fail(
        "compute",
        Some("start"),
        Fault::FailedStart("capacity".into()),
        1,
    );
    world.faults.fail("agents_api", None, Fault::Timeout, 1);
    world
        .faults
        .fail("registry", Some("put"), Fault::Conflict, 1);
    for _ in 0..6 {
        let _ = c.consume_once(&c.events, 10, 0).await;
        let _ = c.consume_once(&c.timers, 10, 0).await;
        world.clock.advance_secs(200);
    }
    world
        .faults
        .fail("compute", Some("list"), Fault::Throttled, 1);
    debug_dump.push(format!("{:?}", c.sweep().await));
    debug_dump.push(format!("{:?}", c.sweep().await));
    world
        .faults
        .fail("agents_api", Some("delete_session"), Fault::ServerError, 1);
    debug_dump.push(format!(
        "{:?}",
        c.close(&session, 3, Duration::from_millis(1)).await
    ));
    debug_dump.push(format!("{:?}", c.config));

    // The real Agents API client, failing against a closed port, as the worker's port.
    let mut api = ClientConfig::new(API_KEY);
    api.base_url = "http://127.0.0.1:9/v1".to_owned();
    api.connect_timeout = Duration::from_millis(200);
    api.request_timeout = Duration::from_millis(500);
    api.retry.max_attempts = 2;
    api.retry.min_delay = Duration::from_millis(1);
    api.retry.max_delay = Duration::from_millis(2);
    api.retry.jitter = false;
    debug_dump.push(format!("{api:?}"));
    let client = AgentsClient::new(api).unwrap();
    let err = client.retrieve_session(&session).await.unwrap_err();
    debug_dump.push(format!("{err:?} / {err}"));
    tracing::error!(error = ?err, "scan: api error");
    let real = Controller::new(
        world.controller("r").events,
        world.controller("r").timers,
        world.controller("r").registry,
        world.controller("r").compute,
        client,
        Arc::new(world.clock.clone()),
        sandbox_testkit::World::config("real"),
    );
    let job = Job {
        handoffs: 0,
        swept: None,
        operator_proof: None,
        trigger: Trigger::Sweep,
        session_id: session.clone(),
        environment_id: Some(env.clone()),
        webhook_id: None,
        enqueued_at: now,
    };
    debug_dump.push(format!("{:?}", real.process(&job).await));

    // The executor key only travels to the executor; its holders never print it.
    let key = KeySource::Value(ExecutorKey::new(EXECUTOR_KEY));
    debug_dump.push(format!("{key:?}"));
    tracing::info!(?key, "scan: executor key source");

    let logs = String::from_utf8_lossy(&LOGS.lock().unwrap()).into_owned();
    assert!(
        logs.contains("webhook rejected") && logs.contains("decided"),
        "the capture works: {} bytes",
        logs.len()
    );
    assert_clean("tracing output", &logs);
    assert_clean("Debug output", &debug_dump.join("\n"));
}

#[test]
fn the_scan_recognises_each_secret_verbatim_and_base64_encoded() {
    for leak in [
        format!("auth=Bearer {API_KEY}"),
        format!("key={}", STANDARD.encode(EXECUTOR_KEY)),
        format!("secret: {}", webhook_secret()),
        format!("raw={}", STANDARD.encode(RAW_WEBHOOK_KEY)),
    ] {
        assert!(
            needles().iter().any(|n| leak.contains(n.as_str())),
            "not caught: {leak}"
        );
    }
}
