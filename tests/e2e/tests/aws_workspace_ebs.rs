//! Workspaces on the AWS adapters, through the worker: the recorded task of generation 1
//! stops behind the controller's back (lifecycle row 11, recorded compute gone), the next
//! connection request makes the worker snapshot generation 1's EBS volume (after the
//! `STOPPED` read-back), record the snapshot, delete the volume, and start generation 2
//! with `RunTask` `volumeConfigurations[].managedEBSVolume.snapshotId` = that snapshot.
//!
//! SQS, DynamoDB, ECS and EC2 are moto's; ECS-managed volumes are created by
//! tests/moto/server.py as ECS documents it (moto's ECS ignores `volumeConfigurations`);
//! the Agents API is the simulator. No executor runs (moto runs no containers), so the
//! files themselves are not checked here — the embedded E2E (workspace_local.rs) does.
//!
//! Run with `tests/moto/run.sh cargo nextest run -p sandbox-e2e -E 'test(aws)'`.

use sandbox_agents_api::AgentsClient;
use sandbox_aws::ebs_workspaces::{EbsConfig, ec2_client};
use sandbox_controller::ports::{
    Clock, Compute, NO_DEADLINE, Registry as _, StoredKind, SystemClock, Workspaces,
};
use sandbox_controller::{Controller, Job};
use sandbox_core::compute::ComputeStatus;
use sandbox_core::decision::Outcome;
use sandbox_core::ids::DeploymentId;
use sandbox_core::observed::Trigger;
use sandbox_e2e::aws_stack::{
    AwsOptions, AwsResources, frozen_sim_with_a_waiting_session, harness_config, unique,
};
use std::sync::Arc;
use std::time::Duration;

const ROLE: &str = "arn:aws:iam::123456789012:role/sandbox-ecs-infrastructure";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_worker_snapshots_the_stopped_generation_and_restores_it_into_the_next() {
    let resources = AwsResources::create().await.unwrap();
    let ebs = EbsConfig::new(ROLE, 8);
    let compute = resources
        .compute()
        .with_workspaces(ec2_client(&resources.sdk), ebs);

    let (sim, session, env, api) = frozen_sim_with_a_waiting_session().await;
    let deployment = DeploymentId::new(format!("ws-{}", unique())).unwrap();
    let config = harness_config(deployment.clone(), &AwsOptions::default());
    let c = Controller::new(
        resources.events(),
        resources.timers(),
        resources.registry(),
        compute.clone(),
        AgentsClient::new(api).unwrap(),
        Arc::new(SystemClock) as Arc<dyn Clock>,
        config,
    );
    let job = || Job {
        handoffs: 0,
        swept: None,
        operator_proof: None,
        trigger: Trigger::ConnectionRequested,
        session_id: session.id.clone(),
        environment_id: Some(env.clone()),
        webhook_id: None,
        enqueued_at: SystemClock.now(),
    };
    let record = || async {
        c.registry
            .get(&env.effect_key())
            .await
            .unwrap()
            .expect("record")
    };

    // Generation 1 starts with a fresh workspace volume.
    let p = c.process(&job()).await.unwrap();
    assert_eq!(p.outcome(), Some(Outcome::Start), "{p:?}");
    let r1 = record().await;
    let first = r1.instance.clone().expect("generation 1 recorded");
    let runs = resources.ecs_guard.calls_of("RunTask");
    assert_eq!(runs.len(), 1);
    let volume = &runs[0]["volumeConfigurations"][0]["managedEBSVolume"];
    assert!(
        volume["snapshotId"].is_null(),
        "nothing to restore yet: {volume}"
    );
    assert_eq!(volume["terminationPolicy"]["deleteOnTermination"], false);
    let stored = compute.list_stored(&deployment).await.unwrap();
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0].kind, StoredKind::Volume);
    assert!(stored[0].in_use);

    // Generation 1 did work: its environment was seen connected (a generation never seen
    // connected that stops is a failed start, not a crash to save and restart).
    let connection = sim.client().connect(env.as_str()).await.unwrap();
    let seen = Job {
        trigger: Trigger::Sweep,
        ..job()
    };
    let p = c.process(&seen).await.unwrap();
    assert!(record().await.instance_connected_at.is_some(), "{p:?}");
    sim.client()
        .disconnect(env.as_str(), Some(&connection))
        .await
        .unwrap();
    // New input for the disconnected environment: the API asks for a connection again.
    sim.client()
        .submit_message(session.id.as_str(), "again")
        .await
        .unwrap();

    // The task stops behind the controller's back (row 11).
    compute
        .stop(
            &first.instance_id,
            "behind the controller's back",
            NO_DEADLINE,
        )
        .await
        .unwrap();
    assert_eq!(
        compute
            .describe(&first.instance_id)
            .await
            .unwrap()
            .unwrap()
            .status,
        ComputeStatus::Stopped
    );

    // The next connection request: snapshot generation 1; the snapshot is `pending`
    // (tests/moto/server.py), so the start is deferred ...
    let p = c.process(&job()).await.unwrap();
    assert_eq!(p.outcome(), Some(Outcome::Start), "{p:?}");
    assert_eq!(
        resources.ecs_guard.calls_of("RunTask").len(),
        1,
        "nothing restores a pending snapshot"
    );
    let pending = record()
        .await
        .latest_snapshot()
        .expect("generation 1's snapshot is recorded")
        .clone();
    assert_eq!(pending.generation, r1.generation);
    // ... and once it completed, generation 2 starts from it.
    let begun = std::time::Instant::now();
    loop {
        let p = c.process(&job()).await.unwrap();
        if resources.ecs_guard.calls_of("RunTask").len() == 2 {
            assert_eq!(p.outcome(), Some(Outcome::Start), "{p:?}");
            break;
        }
        assert!(
            begun.elapsed() < Duration::from_secs(30),
            "generation 2 never started: {p:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let r2 = record().await;
    assert!(r2.generation > r1.generation, "a new generation");
    let snapshot = r2.latest_snapshot().expect("recorded").clone();
    assert_eq!(snapshot, pending);
    assert!(snapshot.snapshot_id.starts_with("snap-"), "{snapshot:?}");
    assert_eq!(
        r2.restored_from.as_deref(),
        Some(snapshot.snapshot_id.as_str())
    );
    let runs = resources.ecs_guard.calls_of("RunTask");
    assert_eq!(runs.len(), 2);
    assert_eq!(
        runs[1]["volumeConfigurations"][0]["managedEBSVolume"]["snapshotId"],
        snapshot.snapshot_id.as_str(),
        "generation 2's volume is created from generation 1's snapshot"
    );
    let stored = compute.list_stored(&deployment).await.unwrap();
    let volumes: Vec<_> = stored
        .iter()
        .filter(|s| s.kind == StoredKind::Volume)
        .collect();
    // Generation 1's volume is kept until the sweeper (or a later save) deletes it once
    // its recorded snapshot completed; generation 2's is attached.
    assert_eq!(volumes.len(), 2, "{stored:?}");
    assert!(
        volumes
            .iter()
            .any(|v| v.generation == r2.generation && v.in_use)
    );
    assert!(
        compute
            .delete_working_copy(&deployment, &env, r1.generation, &snapshot.snapshot_id)
            .await
            .unwrap(),
        "completed and recorded: deletable"
    );
    assert!(
        stored
            .iter()
            .any(|s| s.kind == StoredKind::Snapshot && s.id == snapshot.snapshot_id)
    );
    assert_eq!(resources.ecs_guard.rejected(), vec![]);

    // Clean up what this test started.
    let second = r2.instance.clone().expect("generation 2 recorded");
    compute
        .stop(&second.instance_id, "test over", NO_DEADLINE)
        .await
        .unwrap();
    compute
        .discard_workspace(&deployment, &env, r2.generation)
        .await
        .unwrap();
    compute
        .delete_stored(&deployment, StoredKind::Snapshot, &snapshot.snapshot_id)
        .await
        .unwrap();
}
