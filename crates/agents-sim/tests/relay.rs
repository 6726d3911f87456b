//! The real executor protocol against the simulator (../shared/reference/executor-protocol.md):
//! the pinned `codex exec-server forward` registers with the simulator's
//! `/v1/cloud/environment/{id}/register`, opens the rendezvous WebSocket, answers the
//! simulator's Noise hybrid IK handshake (after `/validate`) and relays a turn's JSON-RPC to a
//! real `codex exec-server --listen`. No stand-in runs here.

mod common;

use agents_sim::{SessionEnvironment, SimConfig, SimHandle, spawn};
use common::wait_until_async;
use sandbox_core::session::SessionStatus;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

const EXECUTOR_KEY: &str = "sk-test-restricted-executor-key-relay";
const MARK: &str = "ran-in-the-real-listener";

fn codex() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../infra/executor/node_modules/.bin/codex");
    assert!(p.exists(), "{} missing: run `make infra-tools`", p.display());
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn sim() -> SimHandle {
    spawn(
        SimConfig::default()
            .with_keys("sk-test-api-key-for-sim", EXECUTOR_KEY)
            .with_time_scale(0.0)
            .with_connect_deadline_secs(3600.0)
            .with_turn_command(format!("echo {MARK}-$PPID")),
    )
    .await
    .unwrap()
}

fn listener(port: u16, home: &std::path::Path) -> Child {
    Command::new(codex())
        .args(["exec-server", "--listen", &format!("ws://127.0.0.1:{port}")])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("CODEX_HOME", home)
        .current_dir(home)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

enum KeyVia {
    Env,
    Stdin,
}

async fn forwarder(sim: &SimHandle, env: &str, port: u16, key: &str, via: KeyVia, home: &std::path::Path) -> Child {
    let remote = format!("{}/v1", sim.client().root_url().trim_end_matches('/'));
    let mut cmd = Command::new(codex());
    cmd.args(["exec-server", "forward", "--remote", &remote, "--environment-id", env])
        .args(["--connect", &format!("ws://127.0.0.1:{port}")])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("CODEX_HOME", home)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    match via {
        KeyVia::Env => {
            cmd.env("CODEX_API_KEY", key).stdin(Stdio::null());
        }
        KeyVia::Stdin => {
            cmd.arg("--registration-bearer-stdin").stdin(Stdio::piped());
        }
    }
    let mut child = cmd.spawn().unwrap();
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(format!("{key}\n").as_bytes()).await.unwrap();
        // Keep the pipe open for the child's lifetime (closing it is not a stop signal
        // without --exit-on-stdin-close, but stay close to how the product runs it).
        std::mem::forget(stdin);
    }
    child
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
        .get_json(&format!("/agents/sessions/{sid}/turns/{tid}/items?order=asc&limit=100"))
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

async fn scenario(via: KeyVia) {
    let sim = sim().await;
    let home = std::env::temp_dir().join(format!("relay-{}", std::process::id() ^ free_port() as u32));
    std::fs::create_dir_all(&home).unwrap();
    let client = sim.client();
    let session = client.create_session(SessionEnvironment::self_hosted()).await.unwrap();
    let env = session.self_hosted().unwrap().clone();
    let port = free_port();
    let mut listen = listener(port, &home);
    let started = Instant::now();
    let mut fwd = forwarder(&sim, env.id.as_str(), port, EXECUTOR_KEY, via, &home).await;
    wait_connected(&sim, env.id.as_str(), true).await;
    let connected_after = started.elapsed();
    let submitted = Instant::now();
    client.submit_message(session.id.as_str(), "run it").await.unwrap();
    let item = command_item(&sim, session.id.as_str()).await;
    let round_trip = submitted.elapsed();
    eprintln!("forwarder start → connected {connected_after:?}; submit → command done {round_trip:?}");
    let out = item["aggregated_output"].as_str().or(item["output"].as_str()).unwrap_or_default().to_owned();
    assert!(item.to_string().contains(MARK), "{item}");
    assert_eq!(item["exit_code"], 0, "{item}");
    // `$PPID` of the command is the real listener (the forwarder only relays).
    let ppid: u32 = item.to_string().split(&format!("{MARK}-")).nth(1).unwrap()
        .chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap();
    let cmdline = std::fs::read(format!("/proc/{ppid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(cmdline.contains("--listen"), "ran under {cmdline:?} ({out})");

    fwd.kill().await.unwrap();
    fwd.wait().await.unwrap();
    wait_connected(&sim, env.id.as_str(), false).await;
    let e = sim.state().environment(env.id.as_str()).unwrap().clone();
    assert_eq!((e.connect_count, e.disconnect_count, e.connections), (1, 1, 0));
    listen.kill().await.unwrap();
    listen.wait().await.unwrap();
    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(&home);
}

#[tokio::test]
async fn the_real_forwarder_registers_and_relays_a_turn() {
    scenario(KeyVia::Env).await;
}

#[tokio::test]
async fn the_real_forwarder_takes_its_key_from_stdin() {
    scenario(KeyVia::Stdin).await;
}
