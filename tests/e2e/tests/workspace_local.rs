//! Workspaces survive replacement, end to end on the embedded backend: real
//! child-process executors, their per-generation directories, tar + zstd archives in the
//! data directory, the simulator's webhooks.
//!
//! - generation 1 writes a file and stops behind the controller's back; the next
//!   connection request starts generation 2 (lifecycle-cases.md row 11), which reads the
//!   file from the archive the controller took before the start;
//! - generation 1 writes a file and is stopped by its idle lease (rows 14, 15); a new
//!   connection request starts generation 2, which reads it;
//! - a session closed with the `delete` disposition leaves no archive and no directory.

use sandbox_controller::ports::ReceiptKind;
use sandbox_core::compute::ComputeInstance;
use sandbox_core::ids::Generation;
use sandbox_core::record::RecordStatus;
use sandbox_core::session::Session;
use sandbox_core::workspace::{CloseWorkspace, WorkspaceDisposition};
use sandbox_e2e::{Harness, LifecycleHarness, Options};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Submits input and waits until an executor of `env` connected; returns it.
async fn connected_executor(h: &Harness, s: &Session, env: &str) -> ComputeInstance {
    h.client()
        .submit_message(s.id.as_str(), "go")
        .await
        .unwrap();
    executor_connected(h, env).await
}

/// Waits until an executor of `env` connected; returns it.
async fn executor_connected(h: &Harness, env: &str) -> ComputeInstance {
    h.wait_until("executor connected", Harness::STEP_TIMEOUT, || async {
        Ok(h.connected(env).await? && !h.live(env).await?.is_empty())
    })
    .await
    .unwrap();
    h.live(env).await.unwrap().remove(0)
}

/// The live working directory of an executor, as the provider recorded it.
async fn workspace_of(h: &Harness, i: &ComputeInstance) -> PathBuf {
    h.controller()
        .compute
        .info(&i.instance_id)
        .await
        .unwrap()
        .expect("the provider knows the executor")
        .workspace
}

fn archives(root: &Path) -> Vec<PathBuf> {
    let mut found = vec![];
    let mut stack = vec![root.join("workspaces/.snapshots")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                found.push(e.path());
            }
        }
    }
    found
}

/// The workspace dispositions of the environment's stop receipts, oldest first.
async fn stop_dispositions(h: &Harness, env: &str) -> Vec<(String, WorkspaceDisposition)> {
    h.receipts(env)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|r| match r.kind {
            ReceiptKind::ComputeStopped {
                reason, workspace, ..
            } => Some((reason, workspace)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_2_reads_the_file_generation_1_wrote_after_it_stopped_behind_the_controllers_back()
 {
    let h = Harness::start(Options {
        grace_secs: 600,
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = h.session_with_input().await.unwrap();
    let first = executor_connected(&h, &env).await;
    assert_eq!(first.generation, Generation(1));
    let dir1 = workspace_of(&h, &first).await;
    std::fs::create_dir_all(dir1.join("src")).unwrap();
    std::fs::write(dir1.join("src/notes.txt"), "written by generation 1").unwrap();

    // Generation 1 goes away behind the controller's back (a crashed task).
    h.stop_behind_the_controllers_back(&first.instance_id)
        .await
        .unwrap();
    h.wait_until("generation 1 gone", Harness::STEP_TIMEOUT, || async {
        Ok(h.live(&env).await?.is_empty())
    })
    .await
    .unwrap();
    // Wait for the turn to end, so the next input asks for a connection again.
    h.wait_until("session not busy", Harness::STEP_TIMEOUT, || async {
        let st = h.client().get_session(s.id.as_str()).await?.status;
        Ok(st != sandbox_core::session::SessionStatus::InProgress)
    })
    .await
    .unwrap();

    let second = connected_executor(&h, &s, &env).await;
    assert_eq!(second.generation, Generation(2));
    let dir2 = workspace_of(&h, &second).await;
    assert_ne!(dir1, dir2, "a fresh directory per generation");
    assert_eq!(
        std::fs::read_to_string(dir2.join("src/notes.txt")).unwrap(),
        "written by generation 1"
    );
    assert!(
        !dir1.exists(),
        "generation 1's directory was archived and removed"
    );
    let record = h.record(&env).await.unwrap().unwrap();
    let latest = record.latest_snapshot().expect("a snapshot reference");
    assert_eq!(latest.generation, Generation(1));
    assert_eq!(
        record.restored_from.as_deref(),
        Some(latest.snapshot_id.as_str())
    );
    assert_eq!(archives(h.dir.path()).len(), 1);
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_idle_stop_a_new_connection_request_restores_the_workspace() {
    let h = Harness::start(Options {
        grace_secs: 2,
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = h.session_with_input().await.unwrap();
    let first = executor_connected(&h, &env).await;
    let dir1 = workspace_of(&h, &first).await;
    std::fs::write(dir1.join("plan.md"), "# the plan").unwrap();

    h.wait_until(
        "the idle lease stopped generation 1",
        Harness::STEP_TIMEOUT,
        || h.stopped_and_recorded(&env),
    )
    .await
    .unwrap();
    let stops = stop_dispositions(&h, &env).await;
    assert_eq!(stops.len(), 1, "{stops:?}");
    assert_eq!(stops[0].0, "lease_expired");
    let WorkspaceDisposition::Snapshot { snapshot_id } = &stops[0].1 else {
        panic!("the lease stop's receipt names the snapshot: {stops:?}");
    };
    assert_eq!(
        h.record(&env)
            .await
            .unwrap()
            .unwrap()
            .latest_snapshot()
            .map(|s| s.snapshot_id.clone()),
        Some(snapshot_id.clone())
    );

    let second = connected_executor(&h, &s, &env).await;
    assert_eq!(second.generation, Generation(2));
    let dir2 = workspace_of(&h, &second).await;
    assert_eq!(
        std::fs::read_to_string(dir2.join("plan.md")).unwrap(),
        "# the plan"
    );
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_closed_with_delete_leaves_no_archive_behind() {
    let h = Harness::start(Options {
        grace_secs: 2,
        close_workspace: CloseWorkspace::Delete,
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = h.session_with_input().await.unwrap();
    let first = executor_connected(&h, &env).await;
    std::fs::write(workspace_of(&h, &first).await.join("a.txt"), "1").unwrap();
    // An idle stop archives generation 1 ...
    h.wait_until(
        "archived by the idle stop",
        Harness::STEP_TIMEOUT,
        || async {
            Ok(!archives(h.dir.path()).is_empty()
                && h.record(&env)
                    .await?
                    .is_some_and(|r| r.status == RecordStatus::Stopped))
        },
    )
    .await
    .unwrap();
    // ... generation 2 runs and writes too ...
    let second = connected_executor(&h, &s, &env).await;
    let dir2 = workspace_of(&h, &second).await;
    std::fs::write(dir2.join("b.txt"), "2").unwrap();
    // ... and the close deletes the files and every archive.
    let report = h
        .controller()
        .close(&s.id, 20, Duration::from_millis(300))
        .await
        .unwrap();
    assert!(report.closed, "{report:?}");
    let closed: Vec<(WorkspaceDisposition, Vec<String>)> = report
        .receipts
        .iter()
        .filter_map(|r| match &r.kind {
            ReceiptKind::WorkspaceClosed {
                workspace,
                snapshots,
                ..
            } => Some((workspace.clone(), snapshots.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(closed, vec![(WorkspaceDisposition::Deleted, vec![])]);
    let stops = stop_dispositions(&h, &env).await;
    assert_eq!(
        stops.last(),
        Some(&("closed".to_owned(), WorkspaceDisposition::Deleted))
    );
    assert!(
        archives(h.dir.path()).is_empty(),
        "{:?}",
        archives(h.dir.path())
    );
    assert!(!dir2.exists());
    assert!(h.record(&env).await.unwrap().unwrap().snapshots.is_empty());
    h.shutdown().await.unwrap();
}
