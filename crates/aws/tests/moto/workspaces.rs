//! EBS workspaces (`EcsCompute::with_workspaces`, feature `ec2`) on moto: the shared
//! workspace contract, the exact `RunTask` `volumeConfigurations` shape, retention
//! (pruned snapshots deleted, the latest restores) and the sweeper deleting an orphaned
//! volume and an expired snapshot.
//!
//! Honest about moto: moto's ECS ignores `volumeConfigurations`, so `tests/moto/server.py`
//! does what ECS documents — checks the configuration against the task definition's
//! `configuredAtLaunch` volume, creates the volume in moto's EC2 (from the snapshot when
//! named, with the request's volume tags), keeps it attached (`in-use`) while the task
//! runs and detaches it at StopTask (`deleteOnTermination: false`). moto's
//! `CreateSnapshot` is `completed` at once, where EBS is `pending` for minutes to hours:
//! tests/moto/server.py keeps it `pending` for `SANDBOX_MOTO_SNAPSHOT_PENDING_SECS`
//! (default 2 s), and refuses a `RunTask` restoring a snapshot that is not `completed`.
//! The request the adapter sends is asserted here as sent (`StrictEcs` records it).

use crate::support::{
    CONTAINER, default_network, ecs_fixture, endpoint, pin_ecs_tasks, sdk, strict_ecs, unique,
};
use sandbox_agents_api::{AgentsClient, ClientConfig};
use sandbox_aws::ebs_workspaces::{EbsConfig, WORKSPACE_VOLUME_NAME, ec2_client};
use sandbox_aws::strict_ecs::StrictEcs;
use sandbox_aws::{DynamoRegistry, EcsCompute, EcsConfig};
use sandbox_controller::contract::{NoProbe, workspace_contract};
use sandbox_controller::ports::{
    Clock, Compute, NO_DEADLINE, Started, StoredKind, SystemClock, Workspaces,
};
use sandbox_controller::{Controller, ControllerConfig};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation, SessionId, idempotency_token};
use sandbox_core::record::{Record, RecordStatus};
use sandbox_core::workspace::{SnapshotRef, SnapshotState, WorkspaceDisposition};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

const ROLE: &str = "arn:aws:iam::123456789012:role/sandbox-ecs-infrastructure";
const GIB: i32 = 4;

/// An [`EcsCompute`] with EBS workspaces on a fresh moto cluster, and its interceptor.
async fn ebs_compute() -> (EcsCompute, StrictEcs) {
    pin_ecs_tasks().await;
    let (ecs, _) = strict_ecs().await;
    let cluster = format!("ws-{}", unique());
    let family = format!("executor-{}", unique());
    ecs_fixture(&ecs, &cluster, &family).await;
    let (subnet, security_group) = default_network().await;
    let config = EcsConfig {
        cluster,
        task_definition: family,
        container_name: CONTAINER.to_owned(),
        subnets: vec![subnet],
        security_groups: vec![security_group],
        assign_public_ip: true,
    };
    let ebs = EbsConfig::new(ROLE, GIB);
    let guard = StrictEcs::new();
    let sdk = sdk().await;
    let compute =
        EcsCompute::new(guard.client(&sdk), config).with_workspaces(ec2_client(&sdk), ebs);
    (compute, guard)
}

fn deployment() -> DeploymentId {
    DeploymentId::new(format!("w-{}", unique())).unwrap()
}

fn spec(env: &EnvironmentId, generation: u64, restore: Option<&str>) -> StartSpec {
    StartSpec {
        session_id: SessionId::new(format!("sess_{env}")),
        remote_url: format!("wss://agents.invalid/v1/environments/{env}/connect"),
        workspace_directory: "/workspace".to_owned(),
        generation: Generation(generation),
        idempotency_token: idempotency_token(env, Generation(generation)),
        environment_id: env.clone(),
        previous: None,
        restore: restore.map(|id| SnapshotRef {
            snapshot_id: id.to_owned(),
            generation: Generation(generation - 1),
            taken_at: 0,
            parent: None,
            expires_at: None,
        }),
    }
}

async fn started(c: &EcsCompute, spec: &StartSpec, d: &DeploymentId) -> ComputeInstance {
    match c.start(spec, d, NO_DEADLINE).await.unwrap() {
        Started::Instance(i) => i,
        Started::Failed { reason } => panic!("start failed: {reason}"),
    }
}

async fn stopped(c: &EcsCompute, i: &ComputeInstance) {
    c.stop(&i.instance_id, "test", NO_DEADLINE).await.unwrap();
    let read = c.describe(&i.instance_id).await.unwrap().unwrap();
    assert_eq!(read.status, ComputeStatus::Stopped);
}

fn snapshot_of(d: WorkspaceDisposition) -> String {
    match d {
        WorkspaceDisposition::Snapshot { snapshot_id } => snapshot_id,
        other => panic!("expected `snapshot <id>`, got {other}"),
    }
}

/// Waits (at most 30 s) until snapshot `id` is `completed` (tests/moto/server.py keeps it
/// `pending` for `SANDBOX_MOTO_SNAPSHOT_PENDING_SECS`), then deletes the generation's
/// working copy as the worker does once the record names it.
async fn completed(c: &EcsCompute, d: &DeploymentId, env: &EnvironmentId, g: Generation, id: &str) {
    let begun = std::time::Instant::now();
    while c.snapshot_state(d, id).await.unwrap() != SnapshotState::Completed {
        assert!(
            begun.elapsed() < Duration::from_secs(30),
            "snapshot {id} never completed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(c.delete_working_copy(d, env, g, id).await.unwrap());
}

/// Snapshots still pending, on EBS (moto keeps snapshots `pending` for a few seconds): a save returns at
/// once with a `pending` snapshot and keeps the volume; while pending, the working copy is
/// neither deleted by `delete_working_copy` nor by `delete_stored`, and a `RunTask`
/// restoring it is refused (no task: a failed start); once `completed`, the volume is
/// deleted and the restore starts.
#[tokio::test]
async fn a_pending_ebs_snapshot_keeps_its_volume_and_is_never_restored() {
    let (compute, _guard) = ebs_compute().await;
    let d = deployment();
    let env = EnvironmentId::new(format!("env_{}", unique()));
    let g1 = started(&compute, &spec(&env, 1, None), &d).await;
    stopped(&compute, &g1).await;
    let begun = std::time::Instant::now();
    let s1 = snapshot_of(
        compute
            .save_workspace(&d, &env, Generation(1))
            .await
            .unwrap(),
    );
    assert!(
        begun.elapsed() < Duration::from_secs(2),
        "a save does not wait for its snapshot: {:?}",
        begun.elapsed()
    );
    assert_eq!(
        compute.snapshot_state(&d, &s1).await.unwrap(),
        SnapshotState::Pending,
        "tests/moto/server.py keeps a new snapshot pending"
    );
    let volume = compute
        .list_stored(&d)
        .await
        .unwrap()
        .into_iter()
        .find(|w| w.kind == StoredKind::Volume && w.environment_id == env)
        .expect("the volume outlives the save");
    assert!(
        !compute
            .delete_working_copy(&d, &env, Generation(1), &s1)
            .await
            .unwrap(),
        "kept while its snapshot is pending"
    );
    assert!(
        compute
            .delete_stored(&d, StoredKind::Volume, &volume.id)
            .await
            .is_err(),
        "the sweeper cannot delete it either"
    );
    let refused = compute
        .start(&spec(&env, 2, Some(&s1)), &d, NO_DEADLINE)
        .await;
    assert!(
        matches!(&refused, Ok(Started::Failed { reason }) if reason.contains(&s1)),
        "{refused:?}"
    );
    // Saved again (a retried save): the same snapshot, nothing new.
    assert_eq!(
        snapshot_of(
            compute
                .save_workspace(&d, &env, Generation(1))
                .await
                .unwrap()
        ),
        s1
    );
    completed(&compute, &d, &env, Generation(1), &s1).await;
    assert!(
        compute
            .list_stored(&d)
            .await
            .unwrap()
            .iter()
            .all(|w| w.kind != StoredKind::Volume || w.environment_id != env),
        "deleted once completed"
    );
    let g2 = started(&compute, &spec(&env, 2, Some(&s1)), &d).await;
    stopped(&compute, &g2).await;
    compute
        .discard_workspace(&d, &env, Generation(2))
        .await
        .unwrap();
    compute
        .delete_stored(&d, StoredKind::Snapshot, &s1)
        .await
        .unwrap();
    assert_eq!(
        compute.snapshot_state(&d, &s1).await.unwrap(),
        SnapshotState::Gone
    );
}

/// The one `volumeConfigurations` entry of a recorded RunTask body.
fn volume_configuration(run: &Value) -> &Value {
    let all = run["volumeConfigurations"]
        .as_array()
        .expect("volumeConfigurations");
    assert_eq!(all.len(), 1, "{run}");
    &all[0]
}

#[tokio::test]
async fn ebs_workspaces_pass_the_workspace_contract_with_the_documented_run_task_shape() {
    let (compute, guard) = ebs_compute().await;
    let d = deployment();
    workspace_contract(&compute, &d, None::<&NoProbe>).await;
    assert_eq!(guard.rejected(), vec![], "no forbidden request");

    let runs = guard.calls_of("RunTask");
    assert_eq!(runs.len(), 2, "generation 1 and generation 2");
    let first = volume_configuration(&runs[0]);
    let generation = runs[0]["tags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["key"] == "sandbox:generation")
        .unwrap()["value"]
        .clone();
    let env = runs[0]["tags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["key"] == "sandbox:environment")
        .unwrap()["value"]
        .clone();
    // ECS API reference, RunTask `volumeConfigurations` / TaskManagedEBSVolumeConfiguration.
    assert_eq!(
        first,
        &json!({
            "name": WORKSPACE_VOLUME_NAME,
            "managedEBSVolume": {
                "roleArn": ROLE,
                "encrypted": true,
                "volumeType": "gp3",
                "sizeInGiB": GIB,
                "filesystemType": "xfs",
                "tagSpecifications": [{
                    "resourceType": "volume",
                    "tags": [
                        {"key": "sandbox:deployment", "value": d.as_str()},
                        {"key": "sandbox:environment", "value": env},
                        {"key": "sandbox:session", "value": runs[0]["tags"].as_array().unwrap().iter().find(|t| t["key"] == "sandbox:session").unwrap()["value"]},
                        {"key": "sandbox:generation", "value": generation},
                    ],
                    "propagateTags": "NONE"
                }],
                "terminationPolicy": {"deleteOnTermination": false}
            }
        }),
        "generation 1: a fresh volume that survives the stop for its snapshot"
    );
    let second = volume_configuration(&runs[1]);
    let restored = second["managedEBSVolume"]["snapshotId"]
        .as_str()
        .expect("generation 2 is created from generation 1's snapshot");
    assert!(restored.starts_with("snap-"), "{second}");
    let mut without = second.clone();
    without["managedEBSVolume"]
        .as_object_mut()
        .unwrap()
        .remove("snapshotId");
    assert_eq!(
        without["managedEBSVolume"]["terminationPolicy"],
        json!({"deleteOnTermination": false})
    );
}

/// Keep the last K: the worker deletes a pruned snapshot with `delete_stored`; the
/// latest still restores, the pruned one is gone (ECS refuses to create a volume from it).
#[tokio::test]
async fn ebs_retention_deletes_the_pruned_snapshot_and_the_latest_restores() {
    let (compute, guard) = ebs_compute().await;
    let d = deployment();
    let env = EnvironmentId::new(format!("env_{}", unique()));

    let g1 = started(&compute, &spec(&env, 1, None), &d).await;
    stopped(&compute, &g1).await;
    let s1 = snapshot_of(
        compute
            .save_workspace(&d, &env, Generation(1))
            .await
            .unwrap(),
    );
    completed(&compute, &d, &env, Generation(1), &s1).await;
    let g2 = started(&compute, &spec(&env, 2, Some(&s1)), &d).await;
    stopped(&compute, &g2).await;
    let s2 = snapshot_of(
        compute
            .save_workspace(&d, &env, Generation(2))
            .await
            .unwrap(),
    );
    assert_ne!(s1, s2);
    completed(&compute, &d, &env, Generation(2), &s2).await;

    // SNAPSHOT_KEEP = 1: generation 1's snapshot is pruned.
    compute
        .delete_stored(&d, StoredKind::Snapshot, &s1)
        .await
        .unwrap();
    let stored = compute.list_stored(&d).await.unwrap();
    let snapshots: Vec<_> = stored
        .iter()
        .filter(|s| s.kind == StoredKind::Snapshot)
        .map(|s| (s.id.clone(), s.generation))
        .collect();
    assert_eq!(snapshots, vec![(s2.clone(), Generation(2))]);
    assert!(
        stored.iter().all(|s| s.kind != StoredKind::Volume),
        "saved volumes are deleted: {stored:?}"
    );

    let g3 = started(&compute, &spec(&env, 3, Some(&s2)), &d).await;
    let runs = guard.calls_of("RunTask");
    assert_eq!(
        volume_configuration(runs.last().unwrap())["managedEBSVolume"]["snapshotId"],
        json!(s2)
    );
    let stored = compute.list_stored(&d).await.unwrap();
    let live: Vec<_> = stored
        .iter()
        .filter(|s| s.kind == StoredKind::Volume)
        .collect();
    assert_eq!(live.len(), 1, "{stored:?}");
    assert!(live[0].in_use, "the running generation's volume is in use");
    assert_eq!(live[0].generation, Generation(3));
    // An attached volume is never deleted, by the sweeper or anyone.
    assert!(
        compute
            .delete_stored(&d, StoredKind::Volume, &live[0].id)
            .await
            .is_err()
    );
    stopped(&compute, &g3).await;
    assert_eq!(
        compute
            .discard_workspace(&d, &env, Generation(3))
            .await
            .unwrap(),
        WorkspaceDisposition::Deleted
    );

    // A start from the pruned snapshot is refused (it no longer exists): RunTask answers
    // InvalidParameterException, no task started, a failed start.
    let refused = compute
        .start(&spec(&env, 4, Some(&s1)), &d, NO_DEADLINE)
        .await;
    assert!(
        matches!(&refused, Ok(Started::Failed { reason }) if reason.contains("InvalidParameterException") && reason.contains(&s1)),
        "{refused:?}"
    );
    compute
        .delete_stored(&d, StoredKind::Snapshot, &s2)
        .await
        .unwrap();
}

/// The sweeper's `sweep_workspaces` on EBS: an orphaned volume (tagged with this
/// deployment, no record) and an expired snapshot (a closed record retained it until a
/// time now past) are deleted; a snapshot a live record keeps, another deployment's
/// volume and an attached volume are not. The records are passed in as the sweep's plan
/// read them; queues and the registry are moto's but unused by this step.
#[tokio::test]
async fn the_sweeper_deletes_an_orphaned_volume_and_an_expired_snapshot_on_ebs() {
    let (compute, _guard) = ebs_compute().await;
    let d = deployment();
    let other = deployment();
    let orphan = EnvironmentId::new(format!("env_orphan_{}", unique()));
    let closed = EnvironmentId::new(format!("env_closed_{}", unique()));
    let kept = EnvironmentId::new(format!("env_kept_{}", unique()));
    let running = EnvironmentId::new(format!("env_running_{}", unique()));
    let elsewhere = EnvironmentId::new(format!("env_elsewhere_{}", unique()));
    let now = SystemClock.now();

    // An orphaned volume: a task of this deployment whose worker never recorded it.
    let o = started(&compute, &spec(&orphan, 1, None), &d).await;
    stopped(&compute, &o).await;
    // Another deployment's stopped volume: not ours to delete.
    let foreign = started(&compute, &spec(&elsewhere, 1, None), &other).await;
    stopped(&compute, &foreign).await;
    // A closed record's snapshot retained until a minute ago.
    let c = started(&compute, &spec(&closed, 1, None), &d).await;
    stopped(&compute, &c).await;
    let expired = snapshot_of(
        compute
            .save_workspace(&d, &closed, Generation(1))
            .await
            .unwrap(),
    );
    // A live record's latest snapshot.
    let k = started(&compute, &spec(&kept, 1, None), &d).await;
    stopped(&compute, &k).await;
    let latest = snapshot_of(
        compute
            .save_workspace(&d, &kept, Generation(1))
            .await
            .unwrap(),
    );
    // A running task's (attached) volume, no record yet.
    let r = started(&compute, &spec(&running, 1, None), &d).await;

    let snap = |id: &str, expires_at: Option<u64>| SnapshotRef {
        snapshot_id: id.to_owned(),
        generation: Generation(1),
        taken_at: now,
        parent: None,
        expires_at,
    };
    let mut closed_record = Record::new(closed.clone(), SessionId::new("sess_closed"));
    closed_record.status = RecordStatus::Closed;
    closed_record.snapshots = vec![snap(&expired, Some(now - 60))];
    let mut kept_record = Record::new(kept.clone(), SessionId::new("sess_kept"));
    kept_record.generation = Generation(1);
    kept_record.snapshots = vec![snap(&latest, None)];

    // The sweep runs later than the visibility window (what a just-taken snapshot or a
    // just-created volume gets before it counts as orphaned).
    let config = ControllerConfig::new(d.clone());
    let later = now + config.policy.visibility_window_secs + 1;
    let sdk = sdk().await;
    let queues = sandbox_aws::bootstrap::create_queues(
        &aws_sdk_sqs::Client::new(&sdk),
        &format!("ws-{}", unique()),
    )
    .await
    .unwrap();
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let mut api = ClientConfig::new("sk-unused".to_owned());
    api.base_url = format!("{}/unused", endpoint());
    // A real (empty) registry table: a stored workspace whose environment the sweep's
    // open records do not name is looked up by id before it counts as orphaned (the sweep reads open records only), and an unreadable record keeps it.
    let ddb = aws_sdk_dynamodb::Client::new(&sdk);
    let table = format!("ws-registry-{}", unique());
    sandbox_aws::create_table(&ddb, &table)
        .await
        .expect("create_table");
    let controller = Controller::new(
        queues.events(&sqs),
        queues.timers(&sqs),
        DynamoRegistry::new(ddb, &table),
        compute.clone(),
        AgentsClient::new(api).unwrap(),
        Arc::new(FixedClock(later)) as Arc<dyn Clock>,
        config,
    );
    // The saves' volumes outlive them until their snapshots completed.
    for id in [&expired, &latest] {
        let begun = std::time::Instant::now();
        while compute.snapshot_state(&d, id).await.unwrap() != SnapshotState::Completed {
            assert!(
                begun.elapsed() < Duration::from_secs(30),
                "{id} never completed"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let deleted = controller
        .sweep_workspaces(&[closed_record, kept_record])
        .await;
    assert_eq!(
        deleted, 4,
        "the orphaned volume, the expired snapshot, and the two saved volumes whose recorded snapshots completed"
    );

    let stored = compute.list_stored(&d).await.unwrap();
    let mut left: Vec<_> = stored
        .iter()
        .map(|s| (s.kind, s.environment_id.clone(), s.in_use))
        .collect();
    left.sort_by(|a, b| a.1.as_str().cmp(b.1.as_str()));
    assert_eq!(
        left,
        vec![
            (StoredKind::Snapshot, kept.clone(), false),
            (StoredKind::Volume, running.clone(), true),
        ],
        "{stored:?}"
    );
    assert!(stored.iter().any(|s| s.id == latest));
    let foreign_left = compute.list_stored(&other).await.unwrap();
    assert_eq!(foreign_left.len(), 1, "another deployment's volume stays");

    stopped(&compute, &r).await;
    compute
        .discard_workspace(&d, &running, Generation(1))
        .await
        .unwrap();
    compute
        .discard_workspace(&other, &elsewhere, Generation(1))
        .await
        .unwrap();
    compute
        .delete_stored(&d, StoredKind::Snapshot, &latest)
        .await
        .unwrap();
}

struct FixedClock(u64);

impl Clock for FixedClock {
    fn now(&self) -> u64 {
        self.0
    }
}

/// Where moto is lenient the twin is strict: a managed volume ECS would refuse is
/// refused — by `StrictEcs` before sending (an empty `roleArn`), and by
/// tests/moto/server.py (a volume name the task definition does not configure at launch),
/// as the ECS API reference documents (TaskManagedEBSVolumeConfiguration, Volume).
#[tokio::test]
async fn a_managed_volume_ecs_would_refuse_is_refused() {
    use aws_sdk_ecs::types::{
        AssignPublicIp, AwsVpcConfiguration, LaunchType, NetworkConfiguration,
        TaskManagedEbsVolumeConfiguration, TaskVolumeConfiguration,
    };
    pin_ecs_tasks().await;
    let (ecs, guard) = strict_ecs().await;
    let cluster = format!("ws-{}", unique());
    let family = format!("executor-{}", unique());
    ecs_fixture(&ecs, &cluster, &family).await;
    // moto's RunTask needs the security groups (a KeyError otherwise).
    let (subnet, security_group) = default_network().await;
    let run = |name: &str, role: &str| {
        ecs.run_task()
            .cluster(&cluster)
            .task_definition(&family)
            .launch_type(LaunchType::Fargate)
            .network_configuration(
                NetworkConfiguration::builder()
                    .awsvpc_configuration(
                        AwsVpcConfiguration::builder()
                            .subnets(&subnet)
                            .security_groups(&security_group)
                            .assign_public_ip(AssignPublicIp::Enabled)
                            .build()
                            .unwrap(),
                    )
                    .build(),
            )
            .volume_configurations(
                TaskVolumeConfiguration::builder()
                    .name(name)
                    .managed_ebs_volume(
                        TaskManagedEbsVolumeConfiguration::builder()
                            .role_arn(role)
                            .size_in_gib(GIB)
                            .build()
                            .unwrap(),
                    )
                    .build()
                    .unwrap(),
            )
    };
    let empty_role = run(WORKSPACE_VOLUME_NAME, "").send().await;
    assert!(empty_role.is_err(), "{empty_role:?}");
    assert_eq!(guard.rejected().len(), 1, "refused before sending");
    assert!(guard.rejected()[0].rule.contains("roleArn"));

    let not_at_launch = run("scratch", ROLE).send().await;
    let err = format!("{:?}", not_at_launch.unwrap_err());
    assert!(err.contains("configuredAtLaunch"), "{err}");
    let accepted = run(WORKSPACE_VOLUME_NAME, ROLE).send().await.unwrap();
    assert_eq!(accepted.tasks().len(), 1);
    ecs.stop_task()
        .cluster(&cluster)
        .task(accepted.tasks()[0].task_arn().unwrap())
        .send()
        .await
        .unwrap();
}
