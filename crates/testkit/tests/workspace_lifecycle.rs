//! Workspaces over the twins (issue 14): the worker snapshots after the read-back, keeps
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

/// Generation `g`'s task crashes (behind the controller's back).
async fn crash(world: &World, e: &EnvironmentId) {
    let r = record(world, e).await;
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
    assert_eq!(r.workspaces_deleted, 1, "the orphaned volume");
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
