//! Executors that run and stop before their environment is ever seen `connected` (a
//! rejected executor key, an image without `codex`, a usage error, a forwarder that
//! exits), end to end on the embedded backend: real child processes, the simulator as the
//! Agents API, `sandboxctl` as an operator runs it.
//!
//! The failing executor is a script that writes what a rejected registration writes and
//! exits 1 — and echoes the executor key it was given, so the tests can check the key
//! never reaches the record, `status` or `explain`. After the owner "fixes the key" (the
//! script is rewritten to run the simulator's executor stand-in), `sandboxctl resolve`
//! releases the hold and the next start connects.

use sandbox_core::evidence::EvidenceTrigger;
use sandbox_core::ids::EnvironmentId;
use sandbox_core::record::{RecordStatus, StartFailureKind};
use sandbox_core::session::SessionStatus;
use sandbox_e2e::operator_cli::sandboxctl;
use sandbox_e2e::{DEPLOYMENT, Harness, LifecycleHarness as _, Options, workspace_binary};
use sandbox_local::process_compute::ExecutorCommand;
use std::path::{Path, PathBuf};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// What the failing executor writes to stderr before it exits 1.
const REJECTED: &str = "registration failed: 401 Unauthorized";

/// Writes the executor script: rejected (echoes the key it holds, then exits 1), or the
/// stand-in that connects.
fn write_script(path: &Path, rejected: bool) {
    let body = if rejected {
        format!(
            "#!/bin/sh\necho \"using executor key $CODEX_API_KEY\" >&2\necho \"{REJECTED}\" >&2\nexit 1\n"
        )
    } else {
        let bin = workspace_binary("sim-executor").unwrap();
        format!(
            "#!/bin/sh\nexec {} exec-server --remote \"$REMOTE_URL\" --environment-id \"$ENVIRONMENT_ID\"\n",
            bin.display()
        )
    };
    std::fs::write(path, body).unwrap();
}

/// A harness whose executor is `script` (rejected at first), with a fast start backoff
/// and three attempts before the hold.
async fn harness(script: &Path) -> Harness {
    write_script(script, true);
    Harness::start(Options {
        // The simulator's own connection wait is a day: the session keeps asking.
        sim_connect_deadline_secs: 86_400.0,
        executor_command: Some(ExecutorCommand::new("sh", [script.display().to_string()])),
        ceilings: three_fast_attempts,
        ..Options::default()
    })
    .await
    .unwrap()
}

/// A fast start backoff and three attempts before the hold; no lifetime ceilings.
fn three_fast_attempts(p: &mut sandbox_core::observed::Policy) {
    p.start_retry_base_secs = 1;
    p.start_retry_max_secs = 2;
    p.max_start_attempts = 3;
    p.no_work_secs = 0;
    p.max_lifetime_secs = 0;
}

fn script_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("executor.sh")
}

/// The key the harness gave its executors.
const KEY: &str = agents_sim::DEFAULT_EXECUTOR_KEY;

async fn held(h: &Harness, env: &str) -> bool {
    h.record(env).await.unwrap().is_some_and(|r| {
        r.open_evidence()
            .any(|e| e.trigger == EvidenceTrigger::ExecutorNeverConnects)
    })
}

fn ctl_args<'a>(dir: &'a str, cmd: &[&'a str]) -> Vec<&'a str> {
    let mut v = cmd.to_vec();
    v.extend(["--data-dir", dir, "--deployment", DEPLOYMENT]);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_that_never_connects_is_not_restarted_forever() {
    let scripts = tempfile::tempdir().unwrap();
    let script = script_path(&scripts);
    let h = harness(&script).await;
    let (_, env) = h.session_with_input().await.unwrap();
    h.wait_until("held with executor_never_connects", T, || async {
        Ok(held(&h, &env).await)
    })
    .await
    .unwrap();
    // Held: more looks (sweeps, a new input) start nothing.
    for _ in 0..3 {
        h.controller().sweep().await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let audit = h.audit(&env).await.unwrap();
    let starts = audit.iter().filter(|a| a.outcome == "start").count();
    assert_eq!(starts, 3, "exactly the allowed attempts: {audit:?}");
    assert!(h.live(&env).await.unwrap().is_empty());
    let r = h.record(&env).await.unwrap().unwrap();
    let f = r
        .start_failure
        .clone()
        .expect("the failed starts are recorded");
    assert_eq!((f.attempts, f.kind), (3, StartFailureKind::NeverConnected));
    assert!(f.reason.contains(REJECTED), "{}", f.reason);
    assert!(f.reason.contains("exited with status 1"), "{}", f.reason);
    assert!(!f.reason.contains(KEY), "the key never reaches the record");
    assert!(!serde_json::to_string(&r).unwrap().contains(KEY));

    // The operator sees why: status names it, with a non-zero exit code.
    let dir = h.dir.path().to_str().unwrap().to_owned();
    let status = sandboxctl(&ctl_args(&dir, &["status", "--json"]), &[]).await;
    assert_ne!(
        status.code, 0,
        "a held environment is a problem: {status:?}"
    );
    let doc = status.json();
    let problems = doc["environments"][0]["problems"].to_string();
    assert!(problems.contains("executor_never_connects"), "{problems}");
    assert!(problems.contains(REJECTED), "{problems}");
    assert!(!status.stdout.contains(KEY));
    assert_eq!(
        doc["environments"][0]["start_failure"]["kind"],
        "never_connected"
    );

    // The owner fixes the key and resolves: the next start connects.
    write_script(&script, false);
    let resolve = sandboxctl(
        &ctl_args(
            &dir,
            &[
                "resolve",
                &env,
                "--effect",
                "not_needed",
                "--note",
                "key rotated",
                "--yes",
            ],
        ),
        &[],
    )
    .await;
    assert_eq!(resolve.code, 0, "{resolve:?}");
    h.wait_until("connected after the resolution", T, || h.connected(&env))
        .await
        .unwrap();
    h.wait_until("seen connected, failures forgotten", T, || async {
        let r = h.record(&env).await?.unwrap();
        Ok(r.start_failure.is_none() && r.instance_connected_at.is_some())
    })
    .await
    .unwrap();
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_executor_key_is_named_in_explain() {
    let scripts = tempfile::tempdir().unwrap();
    let script = script_path(&scripts);
    let h = harness(&script).await;
    let (s, env) = h.session_with_input().await.unwrap();
    h.wait_until("held with executor_never_connects", T, || async {
        Ok(held(&h, &env).await)
    })
    .await
    .unwrap();
    let dir = h.dir.path().to_str().unwrap().to_owned();
    let text = sandboxctl(&ctl_args(&dir, &["explain", s.id.as_str()]), &[]).await;
    assert!(
        text.stdout.contains("executor_never_connects"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("401 Unauthorized"), "{}", text.stdout);
    assert!(text.stdout.contains("never_connected"), "{}", text.stdout);
    assert!(!text.stdout.contains(KEY), "the key is never shown");
    assert_ne!(text.code, 0, "explain reports the problem: {text:?}");
    let json = sandboxctl(&ctl_args(&dir, &["explain", "--json", &env]), &[]).await;
    let doc = json.json();
    let evidence = doc["reconciliation"].to_string();
    assert!(evidence.contains("executor_never_connects"), "{evidence}");
    assert!(evidence.contains("401 Unauthorized"), "{evidence}");
    assert!(!json.stdout.contains(KEY));
    assert_eq!(
        h.record(&env).await.unwrap().unwrap().status,
        RecordStatus::Active
    );
    let _ = EnvironmentId::new(&env);
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_that_connected_and_died_is_replaced() {
    let h = Harness::start(Options {
        sim_connect_deadline_secs: 86_400.0,
        ceilings: |p| {
            p.max_start_attempts = 1;
            p.no_work_secs = 0;
            p.max_lifetime_secs = 0;
        },
        // The idle lease never stops it during the test: the executor dies by itself.
        grace_secs: 600,
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = h.session_with_input().await.unwrap();
    let session = s.id.as_str().to_owned();
    h.wait_until("seen connected", T, || async {
        Ok(h.record(&env)
            .await?
            .is_some_and(|r| r.instance_connected_at.is_some()))
    })
    .await
    .unwrap();
    // The first turn done: the executor dies between turns, not mid-turn (row 20).
    h.wait_until("the first turn done", T, || async {
        Ok(h.client().get_session(&session).await?.status == SessionStatus::Idle)
    })
    .await
    .unwrap();
    let first = h.record(&env).await.unwrap().unwrap().instance.unwrap();
    // The executor ends by itself (not a stop request through the provider): SIGTERM to
    // its process, which disconnects from the simulator and exits.
    let pid = sandbox_e2e::os_executors(Some(&env))
        .into_iter()
        .next()
        .expect("one executor process");
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    h.wait_until("the death seen by the provider and the API", T, || async {
        Ok(h.live(&env).await?.is_empty() && !h.connected(&env).await?)
    })
    .await
    .unwrap();
    // New input asks for the executor again; the look finds the generation stopped with
    // the environment no longer connected, and restarts it as a gone compute.
    h.client().submit_message(&session, "again").await.unwrap();
    h.wait_until("a new generation connected", T, || async {
        let r = h.record(&env).await?.unwrap();
        Ok(r.instance
            .as_ref()
            .is_some_and(|i| i.generation > first.generation)
            && r.instance_connected_at.is_some())
    })
    .await
    .unwrap();
    let r = h.record(&env).await.unwrap().unwrap();
    // Even with a single allowed attempt, a generation that had connected is no failed
    // start.
    assert!(r.start_failure.is_none(), "{r:?}");
    assert!(
        !r.open_evidence()
            .any(|e| e.trigger == EvidenceTrigger::ExecutorNeverConnects)
    );
    h.shutdown().await.unwrap();
}

/// The real pinned codex, both halves, given a key the Agents API refuses: its forwarder
/// registers, is answered 401 and exits 1 (../shared/reference/executor-protocol.md,
/// "Registration and rendezvous"); no more starts than the policy allows, then the hold,
/// and `explain` names the 401 the forwarder reported (never the key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_forwarder_s_rejected_key_is_named_in_explain() {
    const WRONG_KEY: &str = "sk-wrong-executor-key-0123456789";
    let codex = sandbox_e2e::pinned_codex().unwrap().display().to_string();
    let h = Harness::start(Options {
        sim_connect_deadline_secs: 86_400.0,
        split_executor: Some((
            ExecutorCommand::listen(codex.clone()),
            ExecutorCommand::forward(codex),
        )),
        ceilings: three_fast_attempts,
        ..Options::default()
    })
    .await
    .unwrap();
    // The key file is read at every start: from now on the executors get a wrong key.
    std::fs::write(h.dir.path().join("executor.key"), WRONG_KEY).unwrap();
    let (s, env) = h.session_with_input().await.unwrap();
    h.wait_until("held with executor_never_connects", T, || async {
        Ok(held(&h, &env).await)
    })
    .await
    .unwrap();
    for _ in 0..3 {
        h.controller().sweep().await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let audit = h.audit(&env).await.unwrap();
    let starts = audit.iter().filter(|a| a.outcome == "start").count();
    assert_eq!(starts, 3, "exactly the allowed attempts: {audit:?}");
    assert!(h.live(&env).await.unwrap().is_empty());
    let dir = h.dir.path().to_str().unwrap().to_owned();
    let text = sandboxctl(&ctl_args(&dir, &["explain", s.id.as_str()]), &[]).await;
    assert!(
        text.stdout.contains("executor_never_connects"),
        "{}",
        text.stdout
    );
    // What the real forwarder printed when the registration was refused.
    assert!(
        text.stdout.contains("401 Unauthorized"),
        "the forwarder's 401: {}",
        text.stdout
    );
    assert!(!text.stdout.contains(WRONG_KEY), "the key is never shown");
    assert!(!text.stdout.contains(KEY), "the key is never shown");
    h.shutdown().await.unwrap();
}
