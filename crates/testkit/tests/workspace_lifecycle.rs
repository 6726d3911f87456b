//! Workspaces over the twins: the worker snapshots after the read-back, keeps
//! the last `snapshot_keep` per environment, restores the latest into the next
//! generation, applies the close disposition, and the sweeper deletes expired snapshots
//! and orphaned volumes.

use sandbox_controller::Job;
use sandbox_controller::ports::{Clock, ReceiptKind, Registry as _};
use sandbox_core::ids::{EnvironmentId, Generation, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::record::Record;
use sandbox_core::session::SessionStatus;
use sandbox_core::workspace::{CloseWorkspace, WorkspaceDisposition};
use sandbox_testkit::World;
use sandbox_testkit::world::TwinController;
use std::time::Duration;

fn job(world: &World, session: &SessionId, env: &EnvironmentId, trigger: Trigger) -> Job {
    Job {
        handoffs: 0,
        swept: None,
        operator_proof: None,
        trigger,
        session_id: session.clone(),
        environment_id: Some(env.clone()),
        webhook_id: None,
        enqueued_at: world.clock.now(),
    }
}

async fn record(world: &World, env: &EnvironmentId) -> Record {
    world
        .registry
        .get(&env.effect_key())
        .await
        .unwrap()
        .unwrap()
}

/// Starts the next generation on a connection request; returns its generation.
async fn start_next(
    world: &World,
    c: &TwinController,
    s: &SessionId,
    e: &EnvironmentId,
) -> Generation {
    world.sessions.require_connection(s);
    let p = c
        .process(&job(world, s, e, Trigger::ConnectionRequested))
        .await
        .unwrap();
    assert_eq!(
        p.outcome().map(|o| o.to_string()).as_deref(),
        Some("start"),
        "{p:?}"
    );
    record(world, e).await.instance.unwrap().generation
}

/// Generation `g`'s task, once seen connected (it did work), crashes behind the
/// controller's back (a generation never seen connected would be a failed start instead).
async fn crash(world: &World, e: &EnvironmentId) {
    let r = record(world, e).await;
    world
        .sessions
        .set_environment_status(e, sandbox_core::environment::EnvironmentStatus::Connected);
    let c = world.controller_with(World::config("seen"));
    c.process(&job(world, &r.session_id, e, Trigger::Sweep))
        .await
        .unwrap();
    assert!(
        record(world, e).await.instance_connected_at.is_some(),
        "the generation was seen connected"
    );
    world.sessions.set_environment_status(
        e,
        sandbox_core::environment::EnvironmentStatus::Disconnected,
    );
    assert!(world.compute.kill(&r.instance.unwrap().instance_id));
    world.clock.advance(Duration::from_secs(1));
}

#[tokio::test]
async fn each_generation_restores_the_last_and_only_the_last_k_snapshots_are_kept() {
    for keep in [1u32, 2] {
        let world = World::new();
        let mut config = World::config("w");
        config.policy.snapshot_keep = keep;
        let c = world.controller_with(config);
        let (s, e) = (SessionId::new("sess_ws"), EnvironmentId::new("env_ws"));
        world.sessions.add(&s, &e, SessionStatus::Idle);
        let dep = World::deployment();
        for n in 1..=4u64 {
            let g = start_next(&world, &c, &s, &e).await;
            assert_eq!(g, Generation(n));
            let volume = world
                .compute
                .volume(&dep, &e, g)
                .expect("a volume per generation");
            for m in 1..n {
                assert_eq!(
                    volume.files.get(&format!("g{m}.txt")).map(String::as_str),
                    Some("x"),
                    "generation {n} restores what generation {m} wrote (keep {keep})"
                );
            }
            assert!(
                world
                    .compute
                    .write_file(&dep, &e, g, &format!("g{n}.txt"), "x")
            );
            crash(&world, &e).await;
        }
        // Generation 4 is gone unsaved; the chain holds generations ≤ 3, at most `keep`.
        let r = record(&world, &e).await;
        let chain: Vec<u64> = r.snapshots.iter().map(|s| s.generation.0).collect();
        let want: Vec<u64> = (4 - u64::from(keep)..4).collect();
        assert_eq!(chain, want, "keep {keep}");
        let ids: Vec<String> = r.snapshots.iter().map(|s| s.snapshot_id.clone()).collect();
        let stored: Vec<String> = world
            .compute
            .snapshots()
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(
            stored, ids,
            "pruned snapshots are deleted from the provider (keep {keep})"
        );
        // The chain links each snapshot to the one its generation was restored from.
        assert!(r.snapshots.iter().all(|s| s.parent.is_some()));
    }
}

#[tokio::test]
async fn a_lease_stop_receipt_names_the_snapshot_and_a_close_with_delete_removes_everything() {
    let world = World::new();
    let mut config = World::config("w");
    config.policy.close_workspace = CloseWorkspace::Delete;
    let c = world.controller_with(config);
    let (s, e) = (SessionId::new("sess_ws2"), EnvironmentId::new("env_ws2"));
    world.sessions.add(&s, &e, SessionStatus::Idle);
    let g = start_next(&world, &c, &s, &e).await;
    world.sessions.connect(&e, SessionStatus::Idle);
    c.process(&job(&world, &s, &e, Trigger::Idle))
        .await
        .unwrap();
    let lease = record(&world, &e).await.lease.expect("a lease");
    world
        .clock
        .advance(Duration::from_secs(lease.due_at - world.clock.now() + 1));
    let p = c
        .process(&job(&world, &s, &e, Trigger::LeaseDue { lease }))
        .await
        .unwrap();
    assert_eq!(p.outcome().map(|o| o.to_string()).as_deref(), Some("stop"));
    let receipts = world.registry.receipts(&e.effect_key()).await.unwrap();
    let snap = world.compute.snapshots().remove(0);
    assert_eq!(snap.generation, g);
    assert!(matches!(
        &receipts.last().unwrap().kind,
        ReceiptKind::ComputeStopped { workspace: WorkspaceDisposition::Snapshot { snapshot_id }, .. }
            if *snapshot_id == snap.id
    ));
    let report = c.close(&s, 5, Duration::from_millis(1)).await.unwrap();
    assert!(report.closed, "{report:?}");
    assert!(matches!(
        &report.receipts.last().unwrap().kind,
        ReceiptKind::WorkspaceClosed { workspace: WorkspaceDisposition::Deleted, snapshots, .. }
            if snapshots.is_empty()
    ));
    assert!(world.compute.snapshots().is_empty());
    assert!(record(&world, &e).await.snapshots.is_empty());
}

#[tokio::test]
async fn the_sweeper_deletes_expired_snapshots_and_orphaned_volumes_only() {
    let world = World::new();
    let mut config = World::config("w");
    config.policy.close_workspace = CloseWorkspace::Retain { days: 1 };
    config.settled_resweep_secs = 0;
    let c = world.controller_with(config);
    let dep = World::deployment();
    // A closed session whose snapshot is retained for a day.
    let (s, e) = (SessionId::new("sess_ws3"), EnvironmentId::new("env_ws3"));
    world.sessions.add(&s, &e, SessionStatus::Idle);
    let g = start_next(&world, &c, &s, &e).await;
    assert!(world.compute.write_file(&dep, &e, g, "keep.txt", "1"));
    let report = c.close(&s, 5, Duration::from_millis(1)).await.unwrap();
    assert!(report.closed, "{report:?}");
    assert!(matches!(
        &report.receipts.last().unwrap().kind,
        ReceiptKind::WorkspaceClosed {
            workspace: WorkspaceDisposition::Snapshot { .. },
            retained_until: Some(_),
            ..
        }
    ));
    assert_eq!(world.compute.snapshots().len(), 1);
    // A stopped session whose last generation was never saved: its volume is kept.
    let (s2, e2) = (SessionId::new("sess_ws4"), EnvironmentId::new("env_ws4"));
    world.sessions.add(&s2, &e2, SessionStatus::Idle);
    let g2 = start_next(&world, &c, &s2, &e2).await;
    crash(&world, &e2).await;
    world.sessions.add(&s2, &e2, SessionStatus::Idle);
    // An orphaned volume: tagged with this deployment, no record.
    let orphan_env = EnvironmentId::new("env_nobody");
    world.compute.leave_volume(&dep, &orphan_env, Generation(7));

    // Within the grace nothing goes; a day later the orphan and the expired one go.
    assert_eq!(c.sweep().await.unwrap().workspaces_deleted, 0);
    world.clock.advance(Duration::from_secs(600));
    let r = c.sweep().await.unwrap();
    // The orphaned volume, and the closed session's working copy: a save never deletes
    // it, the sweeper does once its recorded snapshot is completed.
    assert_eq!(
        r.workspaces_deleted, 2,
        "the orphaned volume and the saved working copy"
    );
    assert!(world.compute.volume(&dep, &e, g).is_none());
    assert!(
        world
            .compute
            .volume(&dep, &orphan_env, Generation(7))
            .is_none()
    );
    assert_eq!(world.compute.snapshots().len(), 1, "retained for a day");
    world.clock.advance(Duration::from_secs(86_400));
    let r = c.sweep().await.unwrap();
    assert_eq!(r.workspaces_deleted, 1, "the expired snapshot");
    assert!(world.compute.snapshots().is_empty());
    assert!(
        world.compute.volume(&dep, &e2, g2).is_some(),
        "an unsaved stopped generation's volume is kept for its next start"
    );
}

/// A world whose snapshots stay `pending` for 120 s.
fn pending_world() -> World {
    let world = World::new();
    world
        .compute
        .set_snapshot_timing(sandbox_testkit::SnapshotTiming {
            pending_secs: 120,
            error_per_mille: 0,
        });
    world
}

fn restores_refused(world: &World) -> usize {
    world
        .compute
        .events()
        .iter()
        .filter(|e| matches!(e, sandbox_testkit::ComputeEvent::RestoreRefused { .. }))
        .count()
}

/// Generation 1 stopped on its own; the next start saves it, and its snapshot
/// is `pending`: nothing starts (the twin would refuse the restore) until it completed,
/// the wait visible as `snapshot_pending`; then generation 2 restores generation 1's files.
#[tokio::test]
async fn a_start_never_restores_from_a_pending_snapshot() {
    let world = pending_world();
    let c = world.controller("w");
    let dep = World::deployment();
    let (s, e) = (SessionId::new("sess_ws5"), EnvironmentId::new("env_ws5"));
    world.sessions.add(&s, &e, SessionStatus::Idle);
    let g1 = start_next(&world, &c, &s, &e).await;
    assert!(world.compute.write_file(&dep, &e, g1, "a.txt", "1"));
    crash(&world, &e).await;
    // The decision starts; the worker saves generation 1 first and defers the start.
    let p = c
        .process(&job(&world, &s, &e, Trigger::ConnectionRequested))
        .await
        .unwrap();
    assert!(world.compute.live_of(&e).is_empty(), "{p:?}");
    let r = record(&world, &e).await;
    let snap = r.latest_snapshot().expect("generation 1 saved").clone();
    assert_eq!(snap.generation, g1);
    // Looked at again within the 120 s: a visible wait.
    world.clock.advance(Duration::from_secs(30));
    let p = c
        .process(&job(&world, &s, &e, Trigger::ConnectionRequested))
        .await
        .unwrap();
    assert_eq!(p.outcome().map(|o| o.to_string()).as_deref(), Some("wait"));
    let reason = format!("{:?}", p.decision.as_ref().map(|d| &d.reason));
    assert!(reason.contains("SnapshotPending"), "{reason}");
    assert!(world.compute.live_of(&e).is_empty());
    // Completed: generation 2 starts from it, with generation 1's files.
    world.clock.advance(Duration::from_secs(100));
    let p = c
        .process(&job(&world, &s, &e, Trigger::ConnectionRequested))
        .await
        .unwrap();
    assert_eq!(
        p.outcome().map(|o| o.to_string()).as_deref(),
        Some("start"),
        "{p:?}"
    );
    let g2 = record(&world, &e).await.instance.unwrap().generation;
    assert_eq!(g2, Generation(2));
    let v = world.compute.volume(&dep, &e, g2).unwrap();
    assert_eq!(v.files.get("a.txt").map(String::as_str), Some("1"));
    assert_eq!(restores_refused(&world), 0);
}

/// The working copy outlives its save; it is deleted only after the record
/// names its snapshot and the snapshot completed (by the sweeper here), and a snapshot
/// newer than the latest an open record names is never swept.
#[tokio::test]
async fn a_snapshot_is_recorded_before_its_volume_is_deleted() {
    let world = pending_world();
    let mut config = World::config("w");
    config.settled_resweep_secs = 0;
    let c = world.controller_with(config);
    let dep = World::deployment();
    let (s, e) = (SessionId::new("sess_ws6"), EnvironmentId::new("env_ws6"));
    world.sessions.add(&s, &e, SessionStatus::Idle);
    let g1 = start_next(&world, &c, &s, &e).await;
    assert!(world.compute.write_file(&dep, &e, g1, "a.txt", "1"));
    crash(&world, &e).await;
    c.process(&job(&world, &s, &e, Trigger::ConnectionRequested))
        .await
        .unwrap();
    let snap = record(&world, &e)
        .await
        .latest_snapshot()
        .expect("recorded")
        .clone();
    assert!(
        world.compute.volume(&dep, &e, g1).is_some(),
        "kept while its snapshot is pending"
    );
    // An unrecorded snapshot of a newer generation (a save whose release failed) is
    // left in place by the sweeper, whatever its age.
    let stray = {
        use sandbox_controller::ports::Workspaces as _;
        world.compute.leave_volume(&dep, &e, Generation(5));
        let saved = world
            .compute
            .save_workspace(&dep, &e, Generation(5))
            .await
            .unwrap();
        let WorkspaceDisposition::Snapshot { snapshot_id } = saved else {
            panic!("{saved:?}")
        };
        snapshot_id
    };
    // Within the 120 s the sweep may not delete the volume (pending snapshot).
    world.clock.advance(Duration::from_secs(60));
    c.sweep().await.unwrap();
    assert!(world.compute.volume(&dep, &e, g1).is_some());
    // Later the snapshot completed and is recorded: the sweep deletes the volume.
    world.clock.advance(Duration::from_secs(600));
    c.sweep().await.unwrap();
    assert!(world.compute.volume(&dep, &e, g1).is_none());
    let deleted: Vec<_> = world
        .compute
        .events()
        .into_iter()
        .filter_map(|ev| match ev {
            sandbox_testkit::ComputeEvent::VolumeDeleted {
                generation,
                snapshots,
                ..
            } if generation == g1 => Some(snapshots),
            _ => None,
        })
        .collect();
    assert_eq!(
        deleted,
        vec![vec![(
            snap.snapshot_id.clone(),
            sandbox_core::workspace::SnapshotState::Completed
        )]],
        "deleted once, after its recorded snapshot completed"
    );
    assert!(
        world.compute.snapshots().iter().any(|x| x.id == stray),
        "a snapshot newer than the latest recorded one is never swept"
    );
    assert!(
        world
            .compute
            .snapshots()
            .iter()
            .any(|x| x.id == snap.snapshot_id)
    );
}
