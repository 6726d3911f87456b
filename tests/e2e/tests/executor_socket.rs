//! The local executor's socket admits only its forwarder (docs/SECURITY.md, "The sandbox holds no credential";
//! `sandbox_local::executor_relay`): with the pinned codex as listener *and* forwarder
//! behind `serve`'s relay, a turn still runs through the forwarder, while a second local
//! client — one that is not the forwarder's process tree — is refused at the executor's
//! port (401: no capability token) and at the relay's (403: not the forwarder's socket).
//! The control: without the relay, the same client is admitted (101) and drives the
//! executor.

use sandbox_core::session::SessionStatus;
use sandbox_e2e::{Harness, LifecycleHarness, Options, pinned_codex};
use sandbox_local::process_compute::ExecutorCommand;
use std::io::{Read, Write};
use std::time::Duration;

/// The pinned codex, both halves, as `serve` runs them.
fn codex_split() -> (ExecutorCommand, ExecutorCommand) {
    let codex = pinned_codex().unwrap().display().to_string();
    (
        ExecutorCommand::listen(codex.clone()),
        ExecutorCommand::forward(codex),
    )
}

fn opts(relay: bool) -> Options {
    Options {
        split_executor: Some(codex_split()),
        turn_command: Some("echo ran-through-the-forwarder".to_owned()),
        // Starting the real codex on a loaded 2-core machine can take seconds.
        sim_connect_deadline_secs: 3600.0,
        relay,
        ..Options::default()
    }
}

/// The status line a raw WebSocket upgrade request to `url` (`ws://127.0.0.1:PORT`) gets,
/// sent from this test process (no forwarder's descendant) with `authorization` if given.
fn upgrade_status(url: &str, authorization: Option<&str>) -> String {
    let addr = url.trim_start_matches("ws://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{auth}\r\n"
    )
    .unwrap();
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The value after `flag` in the command line of `pid` or of one of its descendants whose
/// command line holds `needle`.
fn arg_in_tree(pid: u32, needle: &str, flag: &str) -> Option<String> {
    let mut pids = vec![i32::try_from(pid).unwrap()];
    pids.extend(sandbox_local::supervise::descendants(pids[0]));
    pids.into_iter().find_map(|p| {
        let raw = std::fs::read(format!("/proc/{p}/cmdline")).ok()?;
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if !args.iter().any(|a| a.contains(needle)) {
            return None;
        }
        let at = args.iter().position(|a| a == flag)?;
        args.get(at + 1).cloned()
    })
}

/// Input, one turn through the real forwarder; returns the environment's live executor
/// pid and forwarder pid.
async fn one_turn(h: &Harness) -> (u32, u32) {
    let (s, env) = h.session_with_input().await.unwrap();
    let sid = s.id.as_str().to_owned();
    h.client()
        .wait_for_status(&sid, SessionStatus::Idle, Duration::from_secs(90))
        .await
        .unwrap();
    let turns = h.client().list_turns(&sid).await.unwrap();
    let turn_id = turns.data[0].id.as_str().to_owned();
    let items = h
        .client()
        .get_json(&format!(
            "/agents/sessions/{sid}/turns/{turn_id}/items?order=asc&limit=100"
        ))
        .await
        .unwrap();
    let output = items.to_string();
    assert!(
        output.contains("ran-through-the-forwarder"),
        "the turn's command ran in the executor: {items}"
    );
    let live = h.live(&env).await.unwrap();
    let instance = live.into_iter().next().expect("the executor is live");
    let compute = &h.controller().compute;
    let info = compute
        .info(&instance.instance_id)
        .await
        .unwrap()
        .expect("known");
    let forwarder = compute
        .forwarder_pid(&instance.instance_id)
        .await
        .unwrap()
        .expect("split mode");
    (info.pid, forwarder)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_local_client_cannot_drive_an_executor() {
    sandbox_e2e::init_test_logs();
    let h = Harness::start(opts(true)).await.unwrap();
    let (executor, forwarder) = one_turn(&h).await;
    let listen = arg_in_tree(executor, "exec-server", "--listen").expect("the executor's --listen");
    let relay = arg_in_tree(forwarder, "forward", "--connect").expect("the forwarder's --connect");
    assert_ne!(listen, relay, "the forwarder connects through the relay");
    assert!(
        arg_in_tree(executor, "exec-server", "--ws-auth").as_deref() == Some("capability-token"),
        "the executor wants a capability token"
    );

    // A second client at the executor's own port: no token, a guessed one.
    assert!(upgrade_status(&listen, None).contains(" 401 "), "{listen}");
    assert!(
        upgrade_status(&listen, Some("Bearer 0000")).contains(" 401 "),
        "a guessed token"
    );
    // A second client at the relay: not a socket of the forwarder's process tree.
    assert!(upgrade_status(&relay, None).contains(" 403 "), "{relay}");

    // The forwarder still relays: a second turn on the same executor runs.
    let (again, _) = one_turn(&h).await;
    assert_ne!(again, 0);
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_relay_a_second_local_client_is_admitted() {
    sandbox_e2e::init_test_logs();
    let h = Harness::start(opts(false)).await.unwrap();
    let (executor, _) = one_turn(&h).await;
    let listen = arg_in_tree(executor, "exec-server", "--listen").expect("the executor's --listen");
    // The control: the check above can fail — an unprotected executor takes anyone.
    assert!(
        upgrade_status(&listen, None).contains(" 101 "),
        "an unprotected executor admits a second client"
    );
    h.shutdown().await.unwrap();
}
