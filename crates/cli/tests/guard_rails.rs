//! The operator's destructive commands (`close`, `resolve`, `dlq redrive`)
//! refuse a session no record names unless `--force`, say which backend, deployment and
//! store they act on, need `--yes` off a terminal, and never take the backend from
//! `TABLE_NAME` alone.

use std::path::Path;
use std::process::{Command, Output, Stdio};

fn sandboxctl(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandboxctl"));
    cmd.args(args)
        .env_remove("TABLE_NAME")
        .stdin(Stdio::null()) // not a terminal
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("sandboxctl runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// An empty local deployment: a registry with no record, and its queues.
fn empty_data_dir(dir: &Path) {
    sandbox_local::SqliteRegistry::open(dir.join("sandbox.db")).expect("registry");
}

async fn queued_jobs(dir: &Path) -> u64 {
    let db = dir.join("queues.db");
    if !db.exists() {
        return 0;
    }
    let q = sandbox_local::SqliteQueue::open(
        &db,
        sandbox_local::embedded::EVENTS_QUEUE,
        sandbox_local::QueueOptions::fifo(),
    )
    .unwrap();
    let s = q.stats().await.unwrap();
    s.visible + s.in_flight + s.delayed
}

#[tokio::test]
async fn close_refuses_a_session_no_record_names() {
    let dir = tempfile::tempdir().unwrap();
    empty_data_dir(dir.path());
    let data_dir = dir.path().to_str().unwrap();

    // No record names it: refused, nothing enqueued, even with --yes.
    let o = sandboxctl(
        &["close", "sess_typo", "--data-dir", data_dir, "--yes"],
        &[],
    );
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = stderr(&o);
    assert!(
        err.contains("no record of deployment local names session sess_typo"),
        "{err}"
    );
    assert!(err.contains("--force"), "{err}");
    assert_eq!(queued_jobs(dir.path()).await, 0, "nothing enqueued");

    // --force without --yes, stdin not a terminal: refused after naming the target.
    let o = sandboxctl(
        &["close", "sess_typo", "--data-dir", data_dir, "--force"],
        &[],
    );
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = stderr(&o);
    assert!(
        err.contains("close: backend local, deployment local, data directory"),
        "{err}"
    );
    assert!(err.contains("stdin is not a terminal; pass --yes"), "{err}");
    assert_eq!(queued_jobs(dir.path()).await, 0, "nothing enqueued");

    // --force --yes: enqueued, and the target was printed first.
    let o = sandboxctl(
        &[
            "close",
            "sess_typo",
            "--data-dir",
            data_dir,
            "--force",
            "--yes",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(
        stderr(&o).contains("backend local, deployment local"),
        "{o:?}"
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("close of sess_typo enqueued"));
    assert_eq!(queued_jobs(dir.path()).await, 1);

    // resolve: a record is needed whatever the flags.
    let o = sandboxctl(
        &[
            "resolve",
            "sess_typo",
            "--effect",
            "observed",
            "--data-dir",
            data_dir,
            "--yes",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).contains("no record for"), "{o:?}");
}

#[test]
fn destructive_commands_never_take_the_backend_from_table_name_alone() {
    for args in [
        &["close", "sess_1", "--yes", "--force"][..],
        &["resolve", "sess_1", "--effect", "observed", "--yes"][..],
        &["dlq", "redrive", "--yes"][..],
    ] {
        let o = sandboxctl(args, &[("TABLE_NAME", "someone-elses-table")]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {o:?}");
        let err = stderr(&o);
        assert!(
            err.contains("TABLE_NAME is set but --backend is not"),
            "{args:?}: {err}"
        );
    }
}

#[tokio::test]
async fn redrive_refuses_jobs_of_sessions_no_record_names() {
    let dir = tempfile::tempdir().unwrap();
    empty_data_dir(dir.path());
    let data_dir = dir.path().to_str().unwrap();
    // Empty dead-letter queues: nothing unknown, so it proceeds with --yes only.
    let o = sandboxctl(&["dlq", "redrive", "--data-dir", data_dir, "--yes"], &[]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(stderr(&o).contains("dlq redrive: backend local"), "{o:?}");
    let o = sandboxctl(&["dlq", "redrive", "--data-dir", data_dir], &[]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).contains("pass --yes"), "{o:?}");

    // A dead-lettered job of a session no record names: refused without --force.
    let events = sandbox_local::SqliteQueue::open(
        dir.path().join("queues.db"),
        sandbox_local::embedded::EVENTS_QUEUE,
        sandbox_local::QueueOptions::fifo().with_max_receive_count(1),
    )
    .unwrap();
    let job = sandbox_controller::job::Job {
        handoffs: 0,
        trigger: sandbox_core::observed::Trigger::Close,
        session_id: sandbox_core::ids::SessionId::new("sess_foreign"),
        environment_id: None,
        webhook_id: None,
        enqueued_at: 1,
        swept: None,
        operator_proof: None,
    };
    use sandbox_controller::ports::Queue as _;
    events
        .send(sandbox_controller::ports::Outgoing {
            group: "sess_foreign".into(),
            dedup_id: "d1".into(),
            job,
            delay_secs: 0,
        })
        .await
        .unwrap();
    assert_eq!(events.receive(1, 0, 0).await.unwrap().len(), 1);
    assert!(
        events.receive(1, 0, 0).await.unwrap().is_empty(),
        "dead-lettered"
    );
    let o = sandboxctl(&["dlq", "redrive", "--data-dir", data_dir, "--yes"], &[]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(
        stderr(&o).contains("no record names session(s) sess_foreign"),
        "{o:?}"
    );
    assert_eq!(
        events.stats().await.unwrap().dead_letters,
        1,
        "nothing moved"
    );
    let o = sandboxctl(
        &["dlq", "redrive", "--data-dir", data_dir, "--yes", "--force"],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(
        events.stats().await.unwrap().dead_letters,
        0,
        "moved with --force"
    );
}

/// `migrate` names what it acts on and, on the local backend, finds nothing to migrate
/// (SQLite's partial index covers every row): exit 0, nothing written.
#[test]
fn migrate_names_its_target_and_finds_nothing_to_do_locally() {
    let dir = tempfile::tempdir().unwrap();
    empty_data_dir(dir.path());
    let data_dir = dir.path().to_str().unwrap();
    for dry_run in [true, false] {
        let mut args = vec!["migrate", "--data-dir", data_dir];
        if dry_run {
            args.push("--dry-run");
        }
        let o = sandboxctl(&args, &[]);
        assert_eq!(o.status.code(), Some(0), "{o:?}");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains("backend local, deployment local, data directory"),
            "{out}"
        );
        assert!(out.contains("0 open record(s) outside it"), "{out}");
    }
    let o = sandboxctl(&["migrate", "--data-dir", data_dir, "--json"], &[]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["command"], "migrate");
    assert_eq!(doc["open_index"]["open_records_missing"], 0);
    assert_eq!(doc["open_index"]["backfilled"], 0);
}
