//! The credential-free executor in local mode.
//!
//! `serve`'s embedded stack with the split executor: the executor child (the stand-in's
//! `--listen`, or the real pinned `codex exec-server --listen`) holds no key; the forwarder
//! child alone does. The simulator plays the harness and runs each turn's command on the
//! executor over its own protocol, so the command output below comes from a process the
//! executor started.

use agents_sim::DEFAULT_EXECUTOR_KEY;
use sandbox_core::compute::ComputeInstance;
use sandbox_core::session::SessionStatus;
use sandbox_e2e::{Harness, LifecycleHarness, Options, pinned_codex, stand_in_split};
use sandbox_local::process_compute::ExecutorCommand;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The turn command: where it runs (its parent's command line), and every way it could
/// find the key in its own reach (its environment, its parent's environment).
const PROBE: &str = "echo parent=$(tr '\\0' ' ' < /proc/$PPID/cmdline); \
    echo own-env-vars=$(env | wc -l); \
    cat /proc/$PPID/environ | tr '\\0' '\\n' | grep -c CODEX_API_KEY || true; \
    env; echo probe-done";

/// The real pinned codex as listener and forwarder, as `serve` runs them.
fn codex_split() -> (ExecutorCommand, ExecutorCommand) {
    let codex = pinned_codex().unwrap().display().to_string();
    (
        ExecutorCommand::listen(codex.clone()),
        ExecutorCommand::forward(codex),
    )
}

fn opts(split: (ExecutorCommand, ExecutorCommand)) -> Options {
    Options {
        split_executor: Some(split),
        turn_command: Some(PROBE.to_owned()),
        // Starting the real codex on a loaded 2-core machine can take seconds.
        sim_connect_deadline_secs: 3600.0,
        ..Options::default()
    }
}

/// Submits input, waits until the turn completed, returns the live instance and the
/// turn's `command_execution` item.
async fn run_one_turn(h: &Harness) -> (ComputeInstance, Value) {
    let (s, env) = h.session_with_input().await.unwrap();
    let sid = s.id.as_str().to_owned();
    h.client()
        .wait_for_status(&sid, SessionStatus::Idle, Duration::from_secs(60))
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
    let command = items["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "command_execution")
        .cloned()
        .unwrap_or_else(|| panic!("the turn ran no command: {items}"));
    let live = h.live(&env).await.unwrap();
    (
        live.into_iter().next().expect("the executor is live"),
        command,
    )
}

fn read(path: impl AsRef<Path>) -> Vec<u8> {
    std::fs::read(path).unwrap_or_default()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// The processes of process group `pgid` (the executor, its forwarder and their children).
fn group_members(pgid: u32) -> Vec<u32> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = String::from_utf8_lossy(&read(format!("/proc/{pid}/stat"))).into_owned();
        // Fields after the `(comm)`: state ppid pgrp ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r.to_owned()) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(2).and_then(|g| g.parse::<u32>().ok()) == Some(pgid) {
            out.push(pid);
        }
    }
    out
}

/// Every regular file under `dir` (the executor's workspace and `HOME`).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t) if t.is_file() => found.push(p),
                _ => {}
            }
        }
    }
    found
}

/// The secret scan: the key is in neither the environment nor the
/// command line of the executor child or any process it started, nor in any file of its
/// workspace; and (the control, so the scan can fail) it *is* in the forwarder's
/// environment. Returns the executor's command line.
async fn assert_executor_holds_no_key(h: &Harness, instance: &ComputeInstance) -> String {
    let info = h
        .controller()
        .compute
        .info(&instance.instance_id)
        .await
        .unwrap()
        .expect("the provider knows the instance");
    let key = DEFAULT_EXECUTOR_KEY;
    let mut forwarders = 0;
    let mut executor_cmdline = String::new();
    let members = group_members(info.pid);
    assert!(
        members.len() >= 2,
        "executor and forwarder in one group: {members:?}"
    );
    for pid in members {
        let cmdline = read(format!("/proc/{pid}/cmdline"));
        let environ = read(format!("/proc/{pid}/environ"));
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            !contains(&cmdline, key),
            "key on the command line of {pid}: {text}"
        );
        if text.contains(" forward ") {
            // The forwarder read the key from a pipe (`--registration-bearer-stdin`): it is
            // neither in its environment nor on its command line.
            forwarders += 1;
            assert!(
                text.contains("--registration-bearer-stdin"),
                "the forwarder reads the key from stdin: {text}"
            );
            assert!(
                !contains(&environ, key),
                "key in the forwarder's /proc/{pid}/environ ({text})"
            );
            continue;
        }
        assert!(
            !contains(&environ, key),
            "key in /proc/{pid}/environ ({text})"
        );
        for var in [
            "CODEX_API_KEY",
            "REMOTE_URL",
            "ENVIRONMENT_ID",
            "OPENAI_API_KEY",
        ] {
            assert!(
                !contains(&environ, &format!("{var}=")),
                "{var} in the environment of {pid} ({text})"
            );
        }
        if pid == info.pid {
            executor_cmdline = text;
        }
    }
    // The stand-in is one process; the npm `codex` is a Node wrapper that runs the native
    // binary as its child (both show `forward`): every one of them was checked above.
    assert!(forwarders >= 1, "the instance's forwarder was found");
    // The check can fail: a process given the key in its environment shows it there.
    let mut control = std::process::Command::new("sleep")
        .arg("30")
        .env("CODEX_API_KEY", key)
        .spawn()
        .unwrap();
    // Read once it has exec'd (before, /proc shows this test's own environment).
    let environ = format!("/proc/{}/environ", control.id());
    let started = std::time::Instant::now();
    let mut seen = contains(&read(&environ), key);
    while !seen && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
        seen = contains(&read(&environ), key);
    }
    control.kill().unwrap();
    control.wait().unwrap();
    assert!(seen, "control: a key in an environment is seen");
    let files = files_under(&info.workspace);
    for f in &files {
        assert!(!contains(&read(f), key), "key in {}", f.display());
    }
    executor_cmdline
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_in_the_local_executor_environment() {
    sandbox_e2e::init_test_logs();
    // The stand-in on both sides.
    let h = Harness::start(opts(stand_in_split().unwrap()))
        .await
        .unwrap();
    let (instance, command) = run_one_turn(&h).await;
    let cmdline = assert_executor_holds_no_key(&h, &instance).await;
    assert!(cmdline.contains("--listen ws://127.0.0.1:"), "{cmdline}");
    let output = command["output"].as_str().unwrap_or_default();
    assert!(output.contains("probe-done"), "{command}");
    assert!(
        output.contains("sim-executor exec-server --listen"),
        "ran in the stand-in: {output}"
    );
    assert!(
        !output.contains(DEFAULT_EXECUTOR_KEY),
        "the turn saw the key: {output}"
    );
    assert_eq!(command["exit_code"], 0, "{command}");
    h.shutdown().await.unwrap();

    // The real pinned codex, both halves: listener and forwarder.
    let h = Harness::start(opts(codex_split())).await.unwrap();
    let (instance, command) = run_one_turn(&h).await;
    let cmdline = assert_executor_holds_no_key(&h, &instance).await;
    assert!(
        cmdline.contains("exec-server --listen ws://127.0.0.1:"),
        "{cmdline}"
    );
    let output = command["output"].as_str().unwrap_or_default();
    assert!(
        output.contains("codex exec-server --listen"),
        "ran in the real codex: {output}"
    );
    assert!(
        !output.contains(DEFAULT_EXECUTOR_KEY),
        "the turn saw the key: {output}"
    );
    assert_eq!(command["exit_code"], 0, "{command}");
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_codex_executor_runs_a_turn_against_the_simulator() {
    sandbox_e2e::init_test_logs();
    let h = Harness::start(opts(codex_split())).await.unwrap();
    let (instance, command) = run_one_turn(&h).await;
    assert_eq!(command["status"], "completed", "{command}");
    assert_eq!(command["exit_code"], 0, "{command}");
    let output = command["output"].as_str().unwrap_or_default();
    // The command's parent is the real codex binary serving `exec-server --listen`.
    assert!(
        output.contains("codex exec-server --listen ws://127.0.0.1:"),
        "the command did not run in the real codex: {output}"
    );
    assert!(output.contains("probe-done"), "{output}");
    assert!(!output.contains(DEFAULT_EXECUTOR_KEY));
    // The executor keeps serving: a second turn on the same executor runs too.
    let env = instance.environment_id.as_str().to_owned();
    let session = instance.session_id.clone().expect("tagged");
    h.client()
        .submit_message(session.as_str(), "again")
        .await
        .unwrap();
    h.wait_until("second turn completed", Duration::from_secs(60), || async {
        let turns = h.client().list_turns(session.as_str()).await?;
        Ok(turns.data.len() == 2
            && turns.data[1].status == sandbox_core::turn::TurnStatus::Completed)
    })
    .await
    .unwrap();
    assert_eq!(h.live(&env).await.unwrap().len(), 1, "still one executor");
    h.shutdown().await.unwrap();
}
