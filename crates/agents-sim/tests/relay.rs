//! The real executor protocol against the simulator (../shared/reference/executor-protocol.md):
//! the pinned `codex exec-server forward` registers with the simulator's
//! `/v1/cloud/environment/{id}/register`, opens the rendezvous WebSocket, answers the
//! simulator's Noise hybrid IK handshake (after `/validate`) and relays a turn's JSON-RPC to a
//! real `codex exec-server --listen`. No stand-in runs here: both halves are the pinned binary
//! (infra/executor, `npm ci`).

mod common;

use agents_sim::{SessionEnvironment, SimConfig, SimHandle, spawn};
use common::{WAIT, pinned_codex, wait_until_async};
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::session::SessionStatus;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

const EXECUTOR_KEY: &str = "sk-test-restricted-executor-key-relay";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A fresh string this run's command echoes: only the listener can have printed it.
fn nonce() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("relay-nonce-{}-{nanos}", std::process::id())
}

async fn sim(nonce: &str) -> SimHandle {
    spawn(
        SimConfig::default()
            .with_keys("sk-test-api-key-for-sim", EXECUTOR_KEY)
            .with_time_scale(0.0)
            .with_turn_secs(0.0)
            .with_connect_deadline_secs(3600.0)
            .with_turn_command(format!("echo {nonce} ppid=$PPID")),
    )
    .await
    .unwrap()
}

/// A scratch `HOME`/`CODEX_HOME`, removed on drop.
struct Home(PathBuf);

impl Home {
    fn new() -> Self {
        let p = std::env::temp_dir().join(format!("agents-sim-relay-{}", nonce()));
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A started codex: `node_modules/.bin/codex` is a Node shim that runs the native binary
/// as its child, so each codex gets its own process group and is ended as a group (on
/// drop too, when an assertion fails).
struct Proc {
    child: Child,
    pgid: u32,
}

impl Proc {
    fn spawn(cmd: &mut Command) -> Self {
        let child = cmd.process_group(0).spawn().unwrap();
        let pgid = child.id().unwrap();
        Self { child, pgid }
    }

    fn kill_group(&self) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.pgid)])
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill_group();
    }
}

fn base(cmd: &mut Command, home: &Path) {
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("CODEX_HOME", home)
        .current_dir(home)
        .stdout(Stdio::null())
        .kill_on_drop(true);
}

fn listener(port: u16, home: &Path) -> Proc {
    let mut cmd = Command::new(pinned_codex());
    cmd.args(["exec-server", "--listen", &format!("ws://127.0.0.1:{port}")]);
    base(&mut cmd, home);
    cmd.stdin(Stdio::null()).stderr(Stdio::null());
    Proc::spawn(&mut cmd)
}

enum KeyVia {
    Env,
    Stdin,
}

async fn forwarder(
    sim: &SimHandle,
    env: &str,
    port: u16,
    key: &str,
    via: KeyVia,
    home: &Path,
) -> Proc {
    let mut cmd = Command::new(pinned_codex());
    cmd.args(["exec-server", "forward", "--remote", &sim.base_url()])
        .args(["--environment-id", env])
        .args(["--connect", &format!("ws://127.0.0.1:{port}")]);
    base(&mut cmd, home);
    cmd.stderr(Stdio::piped());
    match via {
        KeyVia::Env => {
            cmd.env("CODEX_API_KEY", key).stdin(Stdio::null());
        }
        KeyVia::Stdin => {
            cmd.arg("--registration-bearer-stdin").stdin(Stdio::piped());
        }
    }
    let mut proc = Proc::spawn(&mut cmd);
    if let Some(mut stdin) = proc.child.stdin.take() {
        stdin
            .write_all(format!("{key}\n").as_bytes())
            .await
            .unwrap();
        // The pipe stays open while the child runs (without --exit-on-stdin-close its end
        // would not stop it either); it closes when `stdin` is dropped with the task.
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(600)).await;
            drop(stdin);
        });
    }
    proc
}

async fn wait_connected(sim: &SimHandle, env: &str, want: bool) {
    let client = sim.client();
    wait_until_async("environment connection", || {
        let client = client.clone();
        async move {
            let s = client.state().await.ok()?;
            (s.environment(env)?.connected == want).then_some(())
        }
    })
    .await;
}

async fn command_item(sim: &SimHandle, sid: &str) -> Value {
    let c = sim.client();
    c.wait_for_status(sid, SessionStatus::Idle, Duration::from_secs(60))
        .await
        .unwrap();
    let turns = c.list_turns(sid).await.unwrap();
    let tid = turns.data[0].id.as_str().to_owned();
    let items = c
        .get_json(&format!(
            "/agents/sessions/{sid}/turns/{tid}/items?order=asc&limit=100"
        ))
        .await
        .unwrap();
    items["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "command_execution")
        .cloned()
        .unwrap_or_else(|| panic!("no command item: {items}"))
}

/// Ends the whole group and reaps the shim.
async fn stop(mut proc: Proc) {
    proc.kill_group();
    proc.child.wait().await.unwrap();
}

async fn relays_a_turn(via: KeyVia) {
    let nonce = nonce();
    let sim = sim(&nonce).await;
    let home = Home::new();
    let client = sim.client();
    let session = client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let env = session.self_hosted().unwrap().clone();
    assert_eq!(
        env.remote_url,
        sim.base_url(),
        "the executor's --remote is the API base"
    );
    let port = free_port();
    let listen = listener(port, &home.0);
    let started = Instant::now();
    let fwd = forwarder(&sim, env.id.as_str(), port, EXECUTOR_KEY, via, &home.0).await;
    wait_connected(&sim, env.id.as_str(), true).await;
    let connected_after = started.elapsed();
    let e = sim.state().environment(env.id.as_str()).unwrap().clone();
    assert_eq!(
        (e.registrations, e.refused_registrations, e.connections),
        (1, 0, 1)
    );
    assert_eq!(
        client
            .get_environment(env.id.as_str())
            .await
            .unwrap()
            .status,
        EnvironmentStatus::Connected
    );

    let submitted = Instant::now();
    client
        .submit_message(session.id.as_str(), "run it")
        .await
        .unwrap();
    let item = command_item(&sim, session.id.as_str()).await;
    eprintln!(
        "forwarder start → connected {connected_after:?}; submit → command done {:?}",
        submitted.elapsed()
    );
    let output = item["output"].as_str().unwrap_or_default().to_owned();
    assert_eq!(item["exit_code"], 0, "{item}");
    assert!(output.starts_with(&nonce), "{item}");
    // `$PPID` of the command is the real listener: the forwarder only relays.
    let ppid: u32 = output
        .split("ppid=")
        .nth(1)
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ppid in {output:?}"));
    let cmdline = std::fs::read(format!("/proc/{ppid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(
        cmdline.contains(&format!("exec-server --listen ws://127.0.0.1:{port}")),
        "ran under {cmdline:?}, not the listener ({output})"
    );

    stop(fwd).await;
    wait_connected(&sim, env.id.as_str(), false).await;
    let e = sim.state().environment(env.id.as_str()).unwrap().clone();
    assert_eq!(
        (e.connect_count, e.disconnect_count, e.connections),
        (1, 1, 0)
    );
    assert_eq!(
        client
            .get_environment(env.id.as_str())
            .await
            .unwrap()
            .status,
        EnvironmentStatus::Disconnected
    );
    stop(listen).await;
    sim.shutdown().await;
}

#[tokio::test]
async fn the_real_forwarder_registers_and_relays_a_turn() {
    relays_a_turn(KeyVia::Env).await;
}

#[tokio::test]
async fn the_real_forwarder_takes_its_key_from_stdin() {
    relays_a_turn(KeyVia::Stdin).await;
}

#[tokio::test]
async fn the_real_forwarder_with_a_wrong_key_is_refused_and_says_so() {
    let sim = sim("unused").await;
    let home = Home::new();
    let session = sim
        .client()
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let env = session.self_hosted().unwrap().clone();
    let port = free_port();
    let wrong = "sk-test-api-key-for-sim"; // the API key is not the executor key
    let mut fwd = forwarder(&sim, env.id.as_str(), port, wrong, KeyVia::Env, &home.0).await;
    let status = tokio::time::timeout(WAIT, fwd.child.wait())
        .await
        .expect("exits")
        .unwrap();
    let mut err = String::new();
    fwd.child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .await
        .unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("authentication failed (401 Unauthorized)"),
        "{err}"
    );
    assert!(!err.contains(wrong), "the key is not echoed: {err}");
    let e = sim.state().environment(env.id.as_str()).unwrap().clone();
    assert_eq!(
        (e.registrations, e.refused_registrations, e.connect_count),
        (0, 1, 0)
    );
    assert!(!e.connected);
    sim.shutdown().await;
}
