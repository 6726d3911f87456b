//! A local stop ends every descendant of the executor (docs/SECURITY.md;
//! `sandbox_local::supervise`): the executor runs under `sandboxctl supervise --`, a child
//! subreaper, so agent code that leaves the executor's process group (`setsid` after a
//! double fork: its parent exits, it is orphaned) is still the supervisor's descendant and
//! is killed with it. The control: the same executor without the supervisor leaves the
//! escaped process running after the stop (this test then ends it itself).

use sandbox_controller::ports::{Compute, NO_DEADLINE, Started};
use sandbox_core::compute::ComputeStatus;
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation, SessionId, idempotency_token};
use sandbox_local::{
    ExecutorCommand, ExecutorKey, KeySource, ProcessCompute, ProcessComputeConfig,
};
use std::path::Path;
use std::time::{Duration, Instant};

fn spec(env: &str) -> StartSpec {
    let environment_id = EnvironmentId::new(env);
    StartSpec {
        session_id: SessionId::new(format!("sess_{env}")),
        remote_url: format!("wss://agents.example/v1/{env}/connect"),
        workspace_directory: "/workspace".to_owned(),
        generation: Generation(1),
        idempotency_token: idempotency_token(&environment_id, Generation(1)),
        environment_id,
        previous: None,
        restore: None,
    }
}

/// `(state, session id)` of `pid` from `/proc/<pid>/stat`, `None` when it is gone.
fn state_and_session(pid: i32) -> Option<(String, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // state, ppid, pgrp, session
    Some((f[0].to_owned(), f[3].parse().ok()?))
}

fn alive(pid: i32) -> bool {
    state_and_session(pid).is_some_and(|(s, _)| s != "Z" && s != "X")
}

async fn read_pid(path: &Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && let Ok(pid) = s.trim().parse()
        {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "{} never written",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts an executor whose agent code escapes its process group (a double fork into a
/// new session), stops it, and returns whether the escaped process outlived the stop.
async fn escaped_survives_a_stop(supervised: bool) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let escaped = dir.path().join("escaped.pid");
    // The subshell starts `setsid sh` and exits at once: the escaped process is orphaned
    // (reparented to the nearest subreaper, else init) in a session of its own.
    let script = format!(
        "(setsid sh -c 'echo $$ > {}; exec sleep 300' &); exec sleep 300",
        escaped.display()
    );
    let mut cfg = ProcessComputeConfig::new(
        ExecutorCommand::new("sh", ["-c", script.as_str()]),
        dir.path().join("workspaces"),
        KeySource::Value(ExecutorKey::new("sk-supervise-test")),
        dir.path().join("state.db"),
    );
    cfg.stop_grace = Duration::from_secs(2);
    cfg.kill_on_drop = true;
    if supervised {
        cfg.supervisor = Some(ExecutorCommand::new(
            env!("CARGO_BIN_EXE_sandboxctl"),
            ["supervise", "--"],
        ));
    }
    let c = ProcessCompute::open(cfg).unwrap();
    let deployment = DeploymentId::new("local-test").unwrap();
    let inst = match c
        .start(&spec("env_sup"), &deployment, NO_DEADLINE)
        .await
        .unwrap()
    {
        Started::Instance(i) => i,
        Started::Failed { reason } => panic!("start failed: {reason}"),
    };
    let pid = read_pid(&escaped).await;
    let recorded = c
        .info(&inst.instance_id)
        .await
        .unwrap()
        .expect("a recorded pid")
        .pid;
    let (_, session) = state_and_session(pid).expect("the escaped process runs");
    assert_ne!(
        session,
        i32::try_from(recorded).unwrap(),
        "the escaped process left the executor's session and group"
    );
    c.stop(&inst.instance_id, "test", NO_DEADLINE)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let i = c.describe(&inst.instance_id).await.unwrap().unwrap();
        if i.status == ComputeStatus::Stopped {
            break;
        }
        assert!(Instant::now() < deadline, "not stopped: {:?}", i.status);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The supervisor kills the rest as the program exits: give it a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let survived = alive(pid);
    if survived {
        // The control's leftover: this test started it, this test ends it.
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    survived
}

#[tokio::test]
async fn a_stopped_local_executor_leaves_no_descendant() {
    assert!(
        !escaped_survives_a_stop(true).await,
        "under the supervisor, a process that left the group must end with the stop"
    );
    // The control: without the supervisor the same escape outlives the stop.
    assert!(
        escaped_survives_a_stop(false).await,
        "without the supervisor the escaped process should have survived (is this test still measuring anything?)"
    );
}
