//! The stand-in is the real CLI, smaller: one table of `exec-server` command lines runs
//! through the pinned `codex` 0.171.0 (infra/executor, `npm ci`) and through `sim-executor`,
//! and each line must end the same way in both (../shared/reference/executor-protocol.md,
//! "Command lines"): a usage error (exit 2), a refusal once running (exit 1: no key, a
//! remote that does not answer, a `--connect` that is not `ws://`), or a running executor.
//! The table covers the lines the product builds (right order), the 0.169 order codex now
//! refuses, missing and unknown options and bad enumerated values. Every remote is a closed
//! loopback port, so a line that gets past its checks fails its registration at once.

mod common;

use common::pinned_codex;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::Command;

/// How a command line ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// Exit 2: clap's usage error.
    Usage,
    /// Exit 1: accepted by the parser, refused or failed once running.
    Refused,
    /// Still running after [`RUNS_FOR`] (a listener).
    Runs,
}

/// How long a line that is still up counts as running. Refusals and usage errors end
/// within a second even on a busy 2-core machine; a listener never ends by itself.
const RUNS_FOR: Duration = Duration::from_secs(4);

/// A loopback port nothing listens on (the discard port; connection refused).
const DEAD: &str = "http://127.0.0.1:9/v1";
const LISTENER: &str = "ws://127.0.0.1:7070";
const KEY: &str = "sk-test-parity-executor-key";

/// Runs `program argv` with an empty environment (plus `CODEX_API_KEY` when `key`, and a
/// private `CODEX_HOME` for codex), stdin closed, in its own process group (the codex shim
/// runs the native binary as its child); classifies how it ends and ends what still runs.
async fn outcome(program: &Path, argv: &[String], key: bool, home: &Path) -> (Outcome, String) {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("CODEX_HOME", home)
        .args(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if key {
        cmd.env("CODEX_API_KEY", KEY);
    }
    let mut child = cmd.spawn().expect("spawns");
    let pid = child.id().expect("running") as i32;
    match tokio::time::timeout(RUNS_FOR, child.wait()).await {
        Ok(status) => {
            let status = status.expect("waits");
            let out = child.wait_with_output().await.expect("output");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let outcome = match status.code() {
                Some(2) => Outcome::Usage,
                Some(1) => Outcome::Refused,
                other => panic!("{} {argv:?} exited {other:?}: {text}", program.display()),
            };
            (outcome, text)
        }
        Err(_) => {
            // End the whole group (the shim and the native codex), then reap.
            let killed = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .status()
                .expect("kill runs");
            assert!(killed.success(), "process group {pid} ended");
            let _ = child.wait().await;
            (Outcome::Runs, String::new())
        }
    }
}

fn line(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

#[tokio::test]
async fn the_stand_in_accepts_exactly_what_codex_accepts() {
    use Outcome::*;
    let home = tempfile_dir();
    let token_file = home.join("ws-token");
    std::fs::write(&token_file, "parity-capability-token\n").unwrap();
    let token_file = token_file.display().to_string();
    let forward = ["exec-server", "forward"];
    let right = [
        "--remote",
        DEAD,
        "--environment-id",
        "env_a",
        "--connect",
        LISTENER,
    ];
    let table: Vec<(&str, Vec<String>, bool, Outcome)> = vec![
        (
            "the forwarder as the product builds it",
            line(&[&forward[..], &right[..]].concat()),
            true,
            Refused,
        ),
        (
            "the forwarder, key on stdin (stdin closed: no bearer line)",
            line(&[&forward[..], &right[..], &["--registration-bearer-stdin"]].concat()),
            true,
            Refused,
        ),
        (
            "the forwarder with --opt=value",
            line(&[
                "exec-server",
                "forward",
                &format!("--remote={DEAD}"),
                "--environment-id=env_a",
                &format!("--connect={LISTENER}"),
            ]),
            true,
            Refused,
        ),
        (
            "the forwarder, options in another order",
            line(&[
                "exec-server",
                "forward",
                "--connect",
                LISTENER,
                "--environment-id",
                "env_a",
                "--remote",
                DEAD,
                "--name",
                "parity",
            ]),
            true,
            Refused,
        ),
        (
            "the forwarder without a key",
            line(&[&forward[..], &right[..]].concat()),
            false,
            Refused,
        ),
        (
            "the forwarder, --connect not ws://",
            line(&[
                "exec-server",
                "forward",
                "--remote",
                DEAD,
                "--environment-id",
                "env_a",
                "--connect",
                "http://127.0.0.1:7070",
            ]),
            true,
            Refused,
        ),
        (
            "the forwarder, a remote that is neither https nor loopback http",
            line(&[
                "exec-server",
                "forward",
                "--remote",
                "ftp://127.0.0.1:9/v1",
                "--environment-id",
                "env_a",
                "--connect",
                LISTENER,
            ]),
            true,
            Refused,
        ),
        (
            "the 0.169 order: options before forward",
            line(&[
                "exec-server",
                "--remote",
                DEAD,
                "--environment-id",
                "env_a",
                "forward",
                "--connect",
                LISTENER,
            ]),
            true,
            Usage,
        ),
        (
            "forward without --environment-id",
            line(&[
                "exec-server",
                "forward",
                "--remote",
                DEAD,
                "--connect",
                LISTENER,
            ]),
            true,
            Usage,
        ),
        (
            "forward without --connect",
            line(&[
                "exec-server",
                "forward",
                "--remote",
                DEAD,
                "--environment-id",
                "env_a",
            ]),
            true,
            Usage,
        ),
        (
            "forward with an unknown flag",
            line(&[&forward[..], &right[..], &["--bogus"]].concat()),
            true,
            Usage,
        ),
        (
            "forward does not take --listen",
            line(&[&forward[..], &right[..], &["--listen", "ws://127.0.0.1:0"]].concat()),
            true,
            Usage,
        ),
        (
            "forward with an unknown --remote-transport",
            line(&[&forward[..], &right[..], &["--remote-transport", "bogus"]].concat()),
            true,
            Usage,
        ),
        (
            "a listener option before forward is the parent's",
            line(
                &[
                    &["exec-server", "--listen", "ws://127.0.0.1:0", "forward"][..],
                    &right[2..],
                    &right[..2],
                ]
                .concat(),
            ),
            true,
            Refused,
        ),
        (
            "the listener as the product builds it",
            line(&["exec-server", "--listen", "ws://127.0.0.1:0"]),
            false,
            Runs,
        ),
        (
            "the listener with its capability token",
            line(&[
                "exec-server",
                "--listen",
                "ws://127.0.0.1:0",
                "--ws-auth",
                "capability-token",
                "--ws-token-file",
                &token_file,
            ]),
            false,
            Runs,
        ),
        (
            "exec-server alone listens on an ephemeral port",
            line(&["exec-server"]),
            false,
            Runs,
        ),
        (
            "the listener takes --name",
            line(&[
                "exec-server",
                "--listen",
                "ws://127.0.0.1:0",
                "--name",
                "parity",
            ]),
            false,
            Runs,
        ),
        (
            "--exit-on-stdin-close needs --remote",
            line(&[
                "exec-server",
                "--listen",
                "ws://127.0.0.1:0",
                "--exit-on-stdin-close",
            ]),
            false,
            Usage,
        ),
        (
            "--registration-bearer-stdin needs --remote",
            line(&[
                "exec-server",
                "--listen",
                "ws://127.0.0.1:0",
                "--registration-bearer-stdin",
            ]),
            true,
            Usage,
        ),
        (
            "--environment-id alone does not register",
            line(&["exec-server", "--environment-id", "env_a"]),
            false,
            Runs,
        ),
        (
            "--ws-auth capability-token without a token file",
            line(&[
                "exec-server",
                "--listen",
                "ws://127.0.0.1:0",
                "--ws-auth",
                "capability-token",
            ]),
            false,
            Refused,
        ),
        (
            "--ws-token-file without --ws-auth",
            line(&[
                "exec-server",
                "--listen",
                "ws://127.0.0.1:0",
                "--ws-token-file",
                &token_file,
            ]),
            false,
            Refused,
        ),
        (
            "an unknown --ws-auth",
            line(&[
                "exec-server",
                "--listen",
                "ws://127.0.0.1:0",
                "--ws-auth",
                "bogus",
            ]),
            false,
            Usage,
        ),
        (
            "--listen that is not ws://",
            line(&["exec-server", "--listen", "http://127.0.0.1:0"]),
            false,
            Refused,
        ),
        (
            "single mode (the seed's form)",
            line(&["exec-server", "--remote", DEAD, "--environment-id", "env_a"]),
            true,
            Refused,
        ),
        (
            "single mode without a key",
            line(&["exec-server", "--remote", DEAD, "--environment-id", "env_a"]),
            false,
            Refused,
        ),
        (
            "--remote without --environment-id",
            line(&["exec-server", "--remote", DEAD]),
            true,
            Usage,
        ),
        (
            "--connect belongs to forward",
            line(&[
                "exec-server",
                "--remote",
                DEAD,
                "--environment-id",
                "env_a",
                "--connect",
                LISTENER,
            ]),
            true,
            Usage,
        ),
        (
            "an unknown subcommand",
            line(&["exec-server", "bogus"]),
            true,
            Usage,
        ),
    ];

    let stand_in = PathBuf::from(env!("CARGO_BIN_EXE_sim-executor"));
    let codex = pinned_codex();
    let mut mismatches = Vec::new();
    for (what, argv, key, want) in &table {
        let ((real, real_out), (ours, our_out)) = tokio::join!(
            outcome(&codex, argv, *key, &home),
            outcome(&stand_in, argv, *key, &home)
        );
        if real != *want || ours != *want {
            mismatches.push(format!(
                "{what}: {argv:?} (key: {key}) want {want:?}, codex {real:?}, sim-executor {ours:?}\n  codex: {}\n  sim-executor: {}",
                tail(&real_out),
                tail(&our_out)
            ));
        }
        // The key is never printed by either.
        assert!(!real_out.contains(KEY) && !our_out.contains(KEY), "{what}");
    }
    let _ = std::fs::remove_dir_all(&home);
    assert!(
        mismatches.is_empty(),
        "{} of {} lines differ:\n{}",
        mismatches.len(),
        table.len(),
        mismatches.join("\n")
    );
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s
        .lines()
        .filter(|l| {
            !l.starts_with("WARNING") && !l.trim_start().starts_with(|c: char| c.is_ascii_digit())
        })
        .collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// A private directory for `HOME`/`CODEX_HOME` (not under /tmp: codex refuses to create its
/// helper aliases under a temporary directory and says so on every start).
fn tempfile_dir() -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-parity-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
