//! Rotating the webhook signing secret with no downtime (item 6), end to end
//! through `sandboxctl serve` as a child process: during the rotation the stack holds the
//! new secret as current and the old one as previous, and deliveries signed with either
//! verify; one signed with neither is 401 and reaches no queue. A malformed secret (a
//! pasted signature `v1,...`, a trailing newline) stops `serve` at start-up with a message
//! naming the mistake and never the value.

use sandbox_core::webhook::WebhookVerifier;
use sandbox_e2e::os_executors;
use sandbox_e2e::serve_process::{
    Reaper, free_port, interrupt, serve_command, sim_delivering_to, wait_port,
};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The new secret (`whsec_` + base64 of 32 bytes). TEST ONLY.
const NEW_SECRET: &str = "whsec_cm90YXRpb24tdGVzdC1uZXctc2VjcmV0LTMyYnl0ZXM=";
/// A secret the stack does not hold. TEST ONLY.
const OTHER_SECRET: &str = "whsec_bm90LXRoaXMtc3RhY2tzLXNlY3JldC0zMi1ieXRlcyE=";

fn serve(dir: &Path, sim_base: &str, port: u16, secrets: &[(&str, &str)]) -> Command {
    let mut cmd = serve_command(
        dir,
        sim_base,
        port,
        &[
            "--deployment",
            "e2e-rotation",
            "--grace-secs",
            "600",
            "--webhook-previous-secret-env",
            "OLD_WEBHOOK_SECRET",
            "--webhook-tolerance-secs",
            "120",
        ],
    );
    cmd.envs(secrets.iter().copied());
    cmd
}

/// POSTs an `agent.session.in_progress` delivery for `session`, signed with `secret`;
/// returns the HTTP status.
async fn deliver_signed(port: u16, secret: &str, id: &str, session: &str, env: &str) -> u16 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let body = serde_json::json!({
        "id": format!("evt_{id}"), "object": "event", "type": "agent.session.in_progress",
        "created_at": now,
        "data": {"id": session, "environment_type": "self_hosted", "environment_id": env}
    })
    .to_string();
    let signature = WebhookVerifier::new(secret)
        .unwrap()
        .sign(id, now, body.as_bytes());
    reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/webhook"))
        .header("webhook-id", id)
        .header("webhook-timestamp", now.to_string())
        .header("webhook-signature", signature)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_rotation_deliveries_signed_with_the_current_or_the_previous_secret_verify() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // The Agents API still signs with the old secret: the stack's previous one.
    let sim = sim_delivering_to(port).await;
    let client = sim.client();
    let child = serve(
        dir.path(),
        &sim.base_url(),
        port,
        &[
            ("OPENAI_WEBHOOK_SECRET", NEW_SECRET),
            ("OLD_WEBHOOK_SECRET", agents_sim::DEFAULT_WEBHOOK_SECRET),
        ],
    )
    .spawn()
    .unwrap();
    let mut reaper = Reaper {
        pids: vec![child.id()],
        env: None,
    };
    wait_port(port).await;

    // Signed with the previous secret (the simulator's deliveries): the executor starts.
    let s = client
        .create_session(agents_sim::SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let env = s.self_hosted().unwrap().id.as_str().to_owned();
    reaper.env = Some(env.clone());
    client.submit_message(s.id.as_str(), "go").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state = client.state().await.unwrap();
        if state.environment(&env).is_some_and(|e| e.connected) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no executor connected from deliveries signed with the previous secret"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Signed with the current secret: accepted. With neither: 401.
    let session = s.id.as_str();
    assert_eq!(
        deliver_signed(port, NEW_SECRET, "wh_rot_new", session, &env).await,
        200
    );
    assert_eq!(
        deliver_signed(port, OTHER_SECRET, "wh_rot_other", session, &env).await,
        401
    );

    // SIGINT: serve stops its executor and exits 0.
    let status = interrupt(child).await;
    assert!(status.success(), "{status:?}");
    assert!(os_executors(Some(&env)).is_empty());
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_secret_stops_serve_at_start_naming_the_mistake_never_the_value() {
    let pasted_signature = format!("v1,{}", &NEW_SECRET["whsec_".len()..]);
    let with_newline = format!("{NEW_SECRET}\n");
    let cases: [(&[(&str, &str)], &str); 2] = [
        (
            &[
                ("OPENAI_WEBHOOK_SECRET", pasted_signature.as_str()),
                ("OLD_WEBHOOK_SECRET", agents_sim::DEFAULT_WEBHOOK_SECRET),
            ],
            "OPENAI_WEBHOOK_SECRET (webhook secret): webhook secret starts with a signature version prefix (v1,)",
        ),
        (
            &[
                ("OPENAI_WEBHOOK_SECRET", NEW_SECRET),
                ("OLD_WEBHOOK_SECRET", with_newline.as_str()),
            ],
            "OLD_WEBHOOK_SECRET (previous webhook secret): webhook secret contains whitespace",
        ),
    ];
    for (secrets, mistake) in cases {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let out = serve(dir.path(), "http://127.0.0.1:9", port, secrets)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(mistake), "{stderr}");
        let key = &NEW_SECRET["whsec_".len()..];
        assert!(!stderr.contains(key), "the secret leaked: {stderr}");
        assert!(
            !stderr.contains(&agents_sim::DEFAULT_WEBHOOK_SECRET["whsec_".len()..]),
            "{stderr}"
        );
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "nothing listens"
        );
    }
}
