//! The `sim-executor` binary end to end: a child process that registers with the executor
//! key, keeps the environment connected through its rendezvous socket, and exits 0 on
//! SIGTERM (the socket closing disconnects the environment).

mod common;

use agents_sim::{SessionEnvironment, SimConfig, SimHandle, spawn};
use common::{WAIT, wait_until_async};
use sandbox_core::session::SessionStatus;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

const EXECUTOR_KEY: &str = "sk-test-restricted-executor-key-7d1e";

async fn sim() -> SimHandle {
    spawn(
        SimConfig::default()
            .with_keys("sk-test-api-key-for-sim", EXECUTOR_KEY)
            .with_time_scale(0.0),
    )
    .await
    .unwrap()
}

/// Single mode, as codex: `exec-server --remote URL --environment-id ID`, the key in
/// `CODEX_API_KEY`.
fn executor(remote_url: &str, env_id: &str, key: &str) -> Command {
    let mut cmd = executor_with_key(key);
    cmd.args([
        "exec-server",
        "--remote",
        remote_url,
        "--environment-id",
        env_id,
    ]);
    cmd
}

fn executor_with_key(key: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sim-executor"));
    cmd.env_clear()
        .env("CODEX_API_KEY", key)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn wait_connected(sim: &SimHandle, env_id: &str, want: bool) {
    let client = sim.client();
    wait_until_async("environment connection", || {
        let client = client.clone();
        async move {
            let state = client.state().await.ok()?;
            (state.environment(env_id)?.connected == want).then_some(())
        }
    })
    .await;
}

async fn sigterm(child: &Child) {
    let pid = child.id().expect("running").to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill runs");
    assert!(status.success());
}

async fn output_of(mut child: Child) -> (std::process::ExitStatus, String) {
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("exits in time")
        .unwrap();
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        s.read_to_string(&mut out).await.unwrap();
    }
    if let Some(mut s) = child.stderr.take() {
        s.read_to_string(&mut out).await.unwrap();
    }
    (status, out)
}

#[tokio::test]
async fn sim_executor_connects_and_disconnects_on_sigterm() {
    let sim = sim().await;
    let client = sim.client();
    let session = client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let env = session.self_hosted().unwrap().clone();
    let child = executor(&env.remote_url, env.id.as_str(), EXECUTOR_KEY)
        .spawn()
        .unwrap();
    wait_connected(&sim, env.id.as_str(), true).await;

    // With the executor connected, input runs at once.
    client
        .submit_message(session.id.as_str(), "hello")
        .await
        .unwrap();
    assert_eq!(
        client
            .get_session(session.id.as_str())
            .await
            .unwrap()
            .status,
        SessionStatus::InProgress
    );

    // It stays alive until told to stop.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(sim.state().environment(env.id.as_str()).unwrap().connected);

    sigterm(&child).await;
    let (status, out) = output_of(child).await;
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(out.contains("SIGTERM"), "{out}");
    assert!(!out.contains(EXECUTOR_KEY), "the key is never printed");
    // The simulator sees the rendezvous socket close just after the process ends.
    wait_connected(&sim, env.id.as_str(), false).await;
    let e = sim.state().environment(env.id.as_str()).unwrap().clone();
    assert_eq!((e.connect_count, e.disconnect_count), (1, 1));
    assert_eq!(
        client
            .get_environment(env.id.as_str())
            .await
            .unwrap()
            .status,
        sandbox_core::environment::EnvironmentStatus::Disconnected
    );
    // The running turn lost its executor: the command failed, the turn completed.
    assert_eq!(
        client
            .get_session(session.id.as_str())
            .await
            .unwrap()
            .status,
        SessionStatus::Idle
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn sim_executor_takes_the_codex_flags_and_exits_when_stdin_closes() {
    let sim = sim().await;
    let session = sim
        .client()
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let env = session.self_hosted().unwrap().clone();
    let mut cmd = executor_with_key(EXECUTOR_KEY);
    cmd.args([
        "exec-server",
        "--remote",
        &env.remote_url,
        "--environment-id",
        env.id.as_str(),
        "--name",
        "test-executor",
        "--exit-on-stdin-close",
    ])
    .stdin(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    wait_connected(&sim, env.id.as_str(), true).await;
    drop(child.stdin.take());
    let (status, out) = output_of(child).await;
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(out.contains("stdin closed"), "{out}");
    wait_connected(&sim, env.id.as_str(), false).await;
    sim.shutdown().await;
}

#[tokio::test]
async fn sim_executor_refuses_bad_keys_and_bad_environment() {
    let sim = sim().await;
    let session = sim
        .client()
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let env = session.self_hosted().unwrap().clone();

    // The application's API key is not the executor key: 401, exit 1 (as codex).
    let (status, out) = output_of(
        executor(&env.remote_url, env.id.as_str(), "sk-test-api-key-for-sim")
            .spawn()
            .unwrap(),
    )
    .await;
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        out.contains("environment registry authentication failed (401 Unauthorized)"),
        "{out}"
    );
    assert!(!out.contains("sk-test-api-key-for-sim"));

    // An environment the simulator does not know: 404, exit 1.
    let (status, out) = output_of(
        executor(&env.remote_url, "env_other", EXECUTOR_KEY)
            .spawn()
            .unwrap(),
    )
    .await;
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        out.contains("environment registry request failed (404 Not Found)"),
        "{out}"
    );
    let e = sim.state().environment(env.id.as_str()).unwrap().clone();
    assert_eq!(
        (e.connect_count, e.registrations, e.refused_registrations),
        (0, 0, 1)
    );
    sim.shutdown().await;
}
