//! Workspaces on ECS-managed Amazon EBS volumes (feature `ec2`): the
//! [`Workspaces`] port of [`EcsCompute`] when [`EcsCompute::with_workspaces`] configured it.
//!
//! The sandbox never holds an AWS credential for its files: ECS creates, attaches and
//! mounts the volume, and the controller snapshots and deletes it after the task stopped.
//!
//! - **start** (in [`EcsCompute`]'s `RunTask`): `volumeConfigurations` =
//!   `[{name: <the task definition's configuredAtLaunch volume>, managedEBSVolume: {roleArn:
//!   <the ECS infrastructure role>, encrypted: true, volumeType, sizeInGiB, filesystemType:
//!   xfs, snapshotId: <StartSpec.restore>, tagSpecifications: [{resourceType: volume, tags:
//!   deployment, environment, session, generation, propagateTags: NONE}],
//!   terminationPolicy: {deleteOnTermination: false}}}]` — the volume outlives the task so
//!   that it can be snapshotted ([`volume_configuration`]). "For volumes created from a
//!   snapshot, you must specify the same filesystem type that the volume was using when
//!   the snapshot was created" (ECS API reference, TaskManagedEBSVolumeConfiguration,
//!   `filesystemType`), so it is always `xfs` (the documented default) explicitly.
//! - **save** (after the task was read back `STOPPED`): `DescribeVolumes` by the tags
//!   (deployment, environment, generation) — never the stopped task's attachments (ECS
//!   forgets stopped tasks after about an hour). A volume still `in-use` (ECS detaches it
//!   after the stop) fails the save transiently at once, with no in-job wait (the SDK's EC2 waiters poll at a 15 s minimum delay, so a wait costs its whole budget
//!   inside the invocation); the job is retried through the queue: nothing is
//!   snapshotted while anything may still write. An `available` volume gets one
//!   `CreateSnapshot` with `TagSpecifications` (resource type `snapshot`, the same tags)
//!   unless a snapshot of that generation not in `error` already exists (a retried save),
//!   and the save returns at once. "Snapshot creation is asynchronous. The snapshot is
//!   created immediately, but it remains in the pending state until all of data has been
//!   transferred to Amazon S3. This can take several hours" (Amazon EBS User Guide,
//!   "Create Amazon EBS snapshots"). The save never deletes the volume.
//! - **snapshot_state**: `DescribeSnapshots` by id: `pending`/`recovering` →
//!   pending, `completed`, `error`; `InvalidSnapshot.NotFound` or `recoverable` (in the
//!   Recycle Bin) → gone. A `RunTask` `snapshotId` is `CreateVolume`'s `SnapshotId`,
//!   which restores only a completed snapshot: the controller starts from one only then.
//! - **delete_working_copy**: once the record names the snapshot, `DeleteVolume` for the
//!   generation's `available` volumes if the snapshot is `completed`; otherwise nothing
//!   (`false`): the guide promises the point-in-time content, not that the data survives
//!   the source volume's deletion while pending, so the safe order is kept; a later save
//!   or the sweeper deletes it.
//! - **discard**: `DeleteVolume` for the generation's volumes (an attached one fails
//!   transiently, like a save).
//! - **delete_stored**: `DeleteSnapshot` / `DeleteVolume`; `InvalidSnapshot.NotFound` and
//!   `InvalidVolume.NotFound` are success. A volume `in-use`, or with snapshots none of
//!   which is `completed`, is a transient error (the sweeper tries again next time).
//! - **list_stored** (the sweep): `DescribeVolumes` and `DescribeSnapshots`
//!   (`OwnerIds = self`), both filtered by `tag:sandbox:deployment`, every page (SDK
//!   paginators). A volume `creating` or `in-use` is `in_use` (never deleted); one in
//!   `error` holds nothing to save and may be deleted.
//!
//! Errors map like every other adapter ([`crate::sdk_error`]): throttling and 5xx are
//! transient, validation permanent. Sources: Amazon EC2 API Reference (CreateSnapshot,
//! DeleteVolume — "The volume must be in the `available` state (not attached to an
//! instance)" —, DeleteSnapshot, DescribeVolumes, DescribeSnapshots), the Amazon ECS API
//! Reference (RunTask `volumeConfigurations`, TaskManagedEBSVolumeConfiguration) and the
//! Amazon EBS User Guide.
//!
//! moto 5.2.5 (what the tests run on): `CreateSnapshot` is `completed` at once, and ECS
//! `RunTask` ignores `volumeConfigurations`; tests/moto/server.py keeps snapshots
//! `pending` for `SANDBOX_MOTO_SNAPSHOT_PENDING_SECS`, creates the volume the way ECS
//! would (and refuses a request ECS refuses, a pending `snapshotId` included), see there.
//!
//! [`Workspaces`]: sandbox_controller::ports::Workspaces
//! [`EcsCompute`]: crate::ecs_compute::EcsCompute
//! [`EcsCompute::with_workspaces`]: crate::ecs_compute::EcsCompute::with_workspaces

use crate::ecs_task::{TAG_DEPLOYMENT, TAG_ENVIRONMENT, TAG_GENERATION, TAG_SESSION};
use crate::sdk_error::{code, port_error};
use aws_sdk_ec2::types::{
    Filter, ResourceType, Snapshot, SnapshotState, Tag as Ec2Tag, TagSpecification, Volume,
    VolumeState,
};
use aws_sdk_ecs::types::{
    EbsResourceType, EbsTagSpecification, PropagateTags, Tag as EcsTag, TaskFilesystemType,
    TaskManagedEbsVolumeConfiguration, TaskManagedEbsVolumeTerminationPolicy,
    TaskVolumeConfiguration,
};
use sandbox_controller::ports::{PortError, StoredKind, StoredWorkspace};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation};
use sandbox_core::workspace::{SnapshotState as State, WorkspaceDisposition};

const DEP: &str = "workspace";

/// The task definition's volume that is configured at launch and mounted at
/// `/workspace` (SAM and CDK declare it with this name).
pub const WORKSPACE_VOLUME_NAME: &str = "workspace";
/// Default of [`EbsConfig::volume_type`].
pub const DEFAULT_VOLUME_TYPE: &str = "gp3";
/// The EBS volume types ECS accepts for a managed volume (ECS API reference,
/// TaskManagedEBSVolumeConfiguration `volumeType`).
pub const VOLUME_TYPES: &[&str] = &["gp2", "gp3", "io1", "io2", "st1", "sc1", "standard"];
/// Smallest and largest `sizeInGiB` of a gp3 volume, GiB (ECS API reference,
/// TaskManagedEBSVolumeConfiguration `sizeInGiB`: "gp3: 1-16,384").
pub const VOLUME_GIB_RANGE: (i32, i32) = (1, 16_384);

/// How workspaces are kept on EBS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EbsConfig {
    /// ARN of the ECS infrastructure role ECS uses to create, attach and tag the volume
    /// (managed policy `AmazonECSInfrastructureRolePolicyForVolumes`); `roleArn`.
    pub infrastructure_role_arn: String,
    /// Volume size, GiB (`sizeInGiB`); a restore needs at least the snapshot's size, so
    /// it is the same for every generation.
    pub size_gib: i32,
    /// Volume type (`volumeType`), default `gp3`.
    pub volume_type: String,
    /// Provisioned IOPS (`iops`), checked at start-up
    /// (`crate::settings::check_workspace_volume`); `None`: not sent.
    pub iops: Option<i32>,
    /// Provisioned throughput, MiB/s (`throughput`, gp3 only); `None`: not sent.
    pub throughput: Option<i32>,
}

impl EbsConfig {
    /// A configuration with the default type (`gp3`). Nothing in it waits:
    /// a volume still attached fails the save transiently (retried through the queue), a
    /// pending snapshot is waited for by the decision, never inside a job.
    pub fn new(infrastructure_role_arn: impl Into<String>, size_gib: i32) -> Self {
        Self {
            infrastructure_role_arn: infrastructure_role_arn.into(),
            size_gib,
            volume_type: DEFAULT_VOLUME_TYPE.to_owned(),
            iops: None,
            throughput: None,
        }
    }
}

/// The EC2 side of EBS workspaces: the client and the configuration.
#[derive(Clone, Debug)]
pub struct Ebs {
    pub(crate) client: aws_sdk_ec2::Client,
    pub(crate) config: EbsConfig,
}

/// An EC2 client on `sdk` (for
/// [`EcsCompute::with_workspaces`](crate::ecs_compute::EcsCompute::with_workspaces)), so
/// callers need not depend on `aws-sdk-ec2` themselves.
pub fn ec2_client(sdk: &aws_config::SdkConfig) -> aws_sdk_ec2::Client {
    aws_sdk_ec2::Client::new(sdk)
}

fn ecs_tag(key: &str, value: &str) -> EcsTag {
    EcsTag::builder().key(key).value(value).build()
}

/// The `volumeConfigurations` entry of a `RunTask` for `spec` (see the module docs).
///
/// # Errors
/// A permanent [`PortError`] if a required field is missing (never with a valid config).
pub fn volume_configuration(
    config: &EbsConfig,
    spec: &StartSpec,
    deployment: &DeploymentId,
) -> Result<TaskVolumeConfiguration, PortError> {
    let op = "start";
    let bad = |e: aws_sdk_ecs::error::BuildError| {
        PortError::permanent("compute", op, format!("volume configuration: {e}"))
    };
    let generation = spec.generation.0.to_string();
    let tags = EbsTagSpecification::builder()
        .resource_type(EbsResourceType::Volume)
        .tags(ecs_tag(TAG_DEPLOYMENT, deployment.as_str()))
        .tags(ecs_tag(TAG_ENVIRONMENT, spec.environment_id.as_str()))
        .tags(ecs_tag(TAG_SESSION, spec.session_id.as_str()))
        .tags(ecs_tag(TAG_GENERATION, &generation))
        .propagate_tags(PropagateTags::None)
        .build()
        .map_err(bad)?;
    let ebs = TaskManagedEbsVolumeConfiguration::builder()
        .role_arn(&config.infrastructure_role_arn)
        .encrypted(true)
        .volume_type(&config.volume_type)
        .size_in_gib(config.size_gib)
        .set_iops(config.iops)
        .set_throughput(config.throughput)
        .filesystem_type(TaskFilesystemType::Xfs)
        .set_snapshot_id(spec.restore.as_ref().map(|r| r.snapshot_id.clone()))
        .tag_specifications(tags)
        .termination_policy(
            TaskManagedEbsVolumeTerminationPolicy::builder()
                .delete_on_termination(false)
                .build()
                .map_err(bad)?,
        )
        .build()
        .map_err(bad)?;
    TaskVolumeConfiguration::builder()
        .name(WORKSPACE_VOLUME_NAME)
        .managed_ebs_volume(ebs)
        .build()
        .map_err(bad)
}

fn filter(name: &str, value: &str) -> Filter {
    Filter::builder().name(name).values(value).build()
}

fn tag_filters(
    deployment: &DeploymentId,
    environment_id: Option<&EnvironmentId>,
    generation: Option<Generation>,
) -> Vec<Filter> {
    let mut out = vec![filter(
        &format!("tag:{TAG_DEPLOYMENT}"),
        deployment.as_str(),
    )];
    if let Some(env) = environment_id {
        out.push(filter(&format!("tag:{TAG_ENVIRONMENT}"), env.as_str()));
    }
    if let Some(g) = generation {
        out.push(filter(&format!("tag:{TAG_GENERATION}"), &g.0.to_string()));
    }
    out
}

fn ec2_tag_value<'a>(tags: &'a [Ec2Tag], key: &str) -> Option<&'a str> {
    tags.iter()
        .find(|t| t.key() == Some(key))
        .and_then(|t| t.value())
}

fn secs(t: Option<&aws_sdk_ec2::primitives::DateTime>) -> u64 {
    t.and_then(|t| u64::try_from(t.secs()).ok()).unwrap_or(0)
}

fn ec2_tag(key: &str, value: &str) -> Ec2Tag {
    Ec2Tag::builder().key(key).value(value).build()
}

/// A snapshot that holds (or will hold) data: not `error`.
fn usable(s: &Snapshot) -> bool {
    !matches!(s.state(), Some(SnapshotState::Error))
}

/// A volume that still exists.
fn present(v: &Volume) -> bool {
    !matches!(
        v.state(),
        Some(VolumeState::Deleting | VolumeState::Deleted)
    )
}

/// A volume that is (or is about to be) attached: `creating` or `in-use`.
fn attached(v: &Volume) -> bool {
    matches!(v.state(), Some(VolumeState::Creating | VolumeState::InUse))
}

impl Ebs {
    /// Every volume matching `filters`, every page.
    async fn volumes(
        &self,
        filters: Vec<Filter>,
        op: &'static str,
    ) -> Result<Vec<Volume>, PortError> {
        let mut out = Vec::new();
        let mut pages = self
            .client
            .describe_volumes()
            .set_filters(Some(filters))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| port_error(DEP, op, &e))?;
            out.extend(page.volumes().iter().filter(|v| present(v)).cloned());
        }
        Ok(out)
    }

    /// Every snapshot this account owns matching `filters`, every page.
    async fn snapshots(
        &self,
        filters: Vec<Filter>,
        op: &'static str,
    ) -> Result<Vec<Snapshot>, PortError> {
        let mut out = Vec::new();
        let mut pages = self
            .client
            .describe_snapshots()
            .owner_ids("self")
            .set_filters(Some(filters))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| port_error(DEP, op, &e))?;
            out.extend(page.snapshots().iter().cloned());
        }
        Ok(out)
    }

    /// `Ok` when `volume` is `available`; a transient error naming it otherwise (no
    /// in-job wait: the job is retried through the queue).
    fn require_available(volume: &Volume, op: &'static str) -> Result<(), PortError> {
        if volume.state() == Some(&VolumeState::Available) {
            return Ok(());
        }
        let id = volume.volume_id().unwrap_or_default();
        Err(PortError::transient(
            DEP,
            op,
            format!(
                "volume {id} is still {} (ECS detaches it after the task stopped); nothing saved or deleted, retry",
                volume.state().map_or("unknown", |s| s.as_str())
            ),
        ))
    }

    /// `DeleteVolume`; a volume already gone is success.
    async fn delete_volume(&self, id: &str, op: &'static str) -> Result<(), PortError> {
        match self.client.delete_volume().volume_id(id).send().await {
            Ok(_) => Ok(()),
            Err(e) if code(&e) == Some("InvalidVolume.NotFound") => Ok(()),
            Err(e) if code(&e) == Some("VolumeInUse") || code(&e) == Some("IncorrectState") => Err(
                PortError::transient(DEP, op, format!("volume {id} is attached or busy; retry")),
            ),
            Err(e) => Err(port_error(DEP, op, &e)),
        }
    }

    /// The state of snapshot `id` (module docs, **snapshot_state**).
    pub(crate) async fn state(&self, id: &str, op: &'static str) -> Result<State, PortError> {
        let out = match self
            .client
            .describe_snapshots()
            .owner_ids("self")
            .snapshot_ids(id)
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) if code(&e) == Some("InvalidSnapshot.NotFound") => return Ok(State::Gone),
            Err(e) => return Err(port_error(DEP, op, &e)),
        };
        let Some(snapshot) = out.snapshots().iter().find(|s| s.snapshot_id() == Some(id)) else {
            return Ok(State::Gone);
        };
        Ok(match snapshot.state() {
            Some(SnapshotState::Completed) => State::Completed,
            Some(SnapshotState::Pending | SnapshotState::Recovering) => State::Pending,
            Some(SnapshotState::Error) => State::Error,
            Some(SnapshotState::Recoverable) => State::Gone,
            other => {
                return Err(PortError::transient(
                    DEP,
                    op,
                    format!("snapshot {id} in a state this build does not know: {other:?}"),
                ));
            }
        })
    }

    /// The volumes tagged with this deployment, environment and generation (every page).
    async fn generation_volumes(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
        op: &'static str,
    ) -> Result<Vec<Volume>, PortError> {
        self.volumes(
            tag_filters(deployment, Some(environment_id), Some(generation)),
            op,
        )
        .await
    }

    /// Deletes each of `volumes`, every one of which must be `available` (detached):
    /// a transient error at the first that is not, nothing after it deleted.
    async fn delete_detached(&self, volumes: &[Volume], op: &'static str) -> Result<(), PortError> {
        for v in volumes {
            Self::require_available(v, op)?;
            self.delete_volume(v.volume_id().unwrap_or_default(), op)
                .await?;
        }
        Ok(())
    }

    /// Deletes the `available` volumes of the generation once `snapshot_id` is
    /// `completed` (module docs, **delete_working_copy**).
    pub(crate) async fn delete_working_copy(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
        snapshot_id: &str,
    ) -> Result<bool, PortError> {
        let op = "delete_working_copy";
        let volumes = self
            .generation_volumes(deployment, environment_id, generation, op)
            .await?;
        if volumes.is_empty() {
            return Ok(true);
        }
        if self.state(snapshot_id, op).await? != State::Completed {
            return Ok(false);
        }
        self.delete_detached(&volumes, op).await?;
        Ok(true)
    }

    pub(crate) async fn save(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
    ) -> Result<WorkspaceDisposition, PortError> {
        let op = "save";
        let filters = tag_filters(deployment, Some(environment_id), Some(generation));
        // A volume in `error` holds nothing that can be saved; the sweeper deletes it.
        let mut volumes: Vec<Volume> = self
            .volumes(filters.clone(), op)
            .await?
            .into_iter()
            .filter(|v| v.state() != Some(&VolumeState::Error))
            .collect();
        let mut snapshots: Vec<Snapshot> = self
            .snapshots(filters, op)
            .await?
            .into_iter()
            .filter(usable)
            .collect();
        snapshots.sort_by_key(|s| std::cmp::Reverse(secs(s.start_time())));
        volumes.sort_by_key(|v| std::cmp::Reverse(secs(v.create_time())));
        let Some(volume) = volumes.first() else {
            // Saved and deleted already (a retried save), or never created.
            return Ok(match snapshots.first().and_then(|s| s.snapshot_id()) {
                Some(id) => WorkspaceDisposition::Snapshot {
                    snapshot_id: id.to_owned(),
                },
                None => WorkspaceDisposition::None,
            });
        };
        for v in &volumes {
            Self::require_available(v, op)?;
        }
        let volume_id = volume.volume_id().unwrap_or_default().to_owned();
        let snapshot = match snapshots
            .iter()
            .find(|s| s.volume_id() == Some(volume_id.as_str()))
        {
            Some(existing) => existing.clone(),
            None => {
                let g = generation.0.to_string();
                let out = self
                    .client
                    .create_snapshot()
                    .volume_id(&volume_id)
                    .description(format!(
                        "sandbox-lifecycle workspace of {environment_id} generation {g}"
                    ))
                    .tag_specifications(
                        TagSpecification::builder()
                            .resource_type(ResourceType::Snapshot)
                            .tags(ec2_tag(TAG_DEPLOYMENT, deployment.as_str()))
                            .tags(ec2_tag(TAG_ENVIRONMENT, environment_id.as_str()))
                            .tags(ec2_tag(TAG_GENERATION, &g))
                            .build(),
                    )
                    .send()
                    .await
                    .map_err(|e| port_error(DEP, op, &e))?;
                let id = out.snapshot_id().unwrap_or_default();
                if id.is_empty() {
                    return Err(PortError::transient(
                        DEP,
                        op,
                        format!("CreateSnapshot of {volume_id} returned no snapshot id"),
                    ));
                }
                tracing::info!(snapshot = id, volume = %volume_id, %environment_id, %generation, "workspace snapshot created");
                Snapshot::builder()
                    .snapshot_id(id)
                    .volume_id(&volume_id)
                    .set_state(out.state().cloned())
                    .build()
            }
        };
        // No wait and no delete here; the volume goes once the record names a
        // completed snapshot (`delete_working_copy`, or the sweeper).
        let snapshot_id = snapshot.snapshot_id().unwrap_or_default().to_owned();
        Ok(WorkspaceDisposition::Snapshot { snapshot_id })
    }

    pub(crate) async fn discard(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
    ) -> Result<WorkspaceDisposition, PortError> {
        let op = "discard";
        let volumes = self
            .generation_volumes(deployment, environment_id, generation, op)
            .await?;
        if volumes.is_empty() {
            return Ok(WorkspaceDisposition::None);
        }
        self.delete_detached(&volumes, op).await?;
        Ok(WorkspaceDisposition::Deleted)
    }

    pub(crate) async fn delete(&self, kind: StoredKind, id: &str) -> Result<(), PortError> {
        let op = "delete_stored";
        match kind {
            StoredKind::Snapshot => {
                match self.client.delete_snapshot().snapshot_id(id).send().await {
                    Ok(_) => Ok(()),
                    Err(e) if code(&e) == Some("InvalidSnapshot.NotFound") => Ok(()),
                    Err(e) if code(&e) == Some("InvalidSnapshot.InUse") => Err(
                        PortError::transient(DEP, op, format!("snapshot {id} is in use; retry")),
                    ),
                    Err(e) => Err(port_error(DEP, op, &e)),
                }
            }
            StoredKind::Volume => {
                let found = match self.client.describe_volumes().volume_ids(id).send().await {
                    Ok(out) => out
                        .volumes()
                        .iter()
                        .filter(|v| present(v))
                        .cloned()
                        .collect(),
                    Err(e) if code(&e) == Some("InvalidVolume.NotFound") => Vec::new(),
                    Err(e) => return Err(port_error(DEP, op, &e)),
                };
                let Some(volume) = found.first() else {
                    return Ok(());
                };
                if attached(volume) {
                    return Err(PortError::transient(
                        DEP,
                        op,
                        format!("volume {id} is not available (attached or changing); kept"),
                    ));
                }
                let taken = self.snapshots(vec![filter("volume-id", id)], op).await?;
                if !taken.is_empty()
                    && !taken
                        .iter()
                        .any(|s| s.state() == Some(&SnapshotState::Completed))
                {
                    return Err(PortError::transient(
                        DEP,
                        op,
                        format!(
                            "volume {id} has no completed snapshot yet ({}); kept",
                            taken
                                .iter()
                                .map(|s| s.snapshot_id().unwrap_or_default())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ));
                }
                self.delete_volume(id, op).await
            }
        }
    }

    pub(crate) async fn list(
        &self,
        deployment: &DeploymentId,
    ) -> Result<Vec<StoredWorkspace>, PortError> {
        let op = "list_stored";
        let mut out = Vec::new();
        let parse = |tags: &[Ec2Tag]| -> Option<(EnvironmentId, Generation)> {
            let env = EnvironmentId::new(ec2_tag_value(tags, TAG_ENVIRONMENT)?);
            let g = Generation(ec2_tag_value(tags, TAG_GENERATION)?.parse().ok()?);
            Some((env, g))
        };
        for v in self
            .volumes(tag_filters(deployment, None, None), op)
            .await?
        {
            let id = v.volume_id().unwrap_or_default().to_owned();
            let Some((environment_id, generation)) = parse(v.tags()) else {
                tracing::warn!(volume = %id, "volume of this deployment without environment/generation tags; skipped");
                continue;
            };
            out.push(StoredWorkspace {
                kind: StoredKind::Volume,
                in_use: attached(&v),
                id,
                environment_id,
                generation,
                created_at: secs(v.create_time()),
            });
        }
        for s in self
            .snapshots(tag_filters(deployment, None, None), op)
            .await?
        {
            let id = s.snapshot_id().unwrap_or_default().to_owned();
            let Some((environment_id, generation)) = parse(s.tags()) else {
                tracing::warn!(snapshot = %id, "snapshot of this deployment without environment/generation tags; skipped");
                continue;
            };
            out.push(StoredWorkspace {
                kind: StoredKind::Snapshot,
                id,
                environment_id,
                generation,
                created_at: secs(s.start_time()),
                in_use: false,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ids::SessionId;
    use sandbox_core::workspace::SnapshotRef;

    fn spec(restore: Option<&str>) -> StartSpec {
        StartSpec {
            environment_id: EnvironmentId::new("env_1"),
            session_id: SessionId::new("sess_1"),
            remote_url: "wss://api.openai.com/x".into(),
            workspace_directory: "/workspace".into(),
            generation: Generation(3),
            idempotency_token: "t".into(),
            previous: None,
            restore: restore.map(|id| SnapshotRef {
                snapshot_id: id.into(),
                generation: Generation(2),
                taken_at: 0,
                parent: None,
                expires_at: None,
            }),
        }
    }

    #[test]
    fn the_volume_outlives_the_task_and_restores_the_named_snapshot() {
        let config = EbsConfig::new("arn:aws:iam::123456789012:role/infra", 20);
        let deployment = DeploymentId::new("dep-1").unwrap();
        let v = volume_configuration(&config, &spec(Some("snap-1")), &deployment).unwrap();
        assert_eq!(v.name(), WORKSPACE_VOLUME_NAME);
        let m = v.managed_ebs_volume().unwrap();
        assert_eq!(m.role_arn(), "arn:aws:iam::123456789012:role/infra");
        assert_eq!(m.snapshot_id(), Some("snap-1"));
        assert_eq!(m.size_in_gib(), Some(20));
        assert_eq!(m.volume_type(), Some("gp3"));
        assert_eq!(m.encrypted(), Some(true));
        assert_eq!(m.filesystem_type(), Some(&TaskFilesystemType::Xfs));
        assert!(!m.termination_policy().unwrap().delete_on_termination());
        let tags = m.tag_specifications()[0].tags();
        assert!(
            tags.iter()
                .any(|t| t.key() == Some(TAG_GENERATION) && t.value() == Some("3"))
        );
        let fresh = volume_configuration(&config, &spec(None), &deployment).unwrap();
        assert_eq!(fresh.managed_ebs_volume().unwrap().snapshot_id(), None);
    }
}
