//! The workspaces port: files outlive compute (snapshots and working copies).

use super::PortError;
use sandbox_core::ids::{DeploymentId, EnvironmentId};
use sandbox_core::workspace::{SnapshotState, WorkspaceDisposition};
use serde::{Deserialize, Serialize};
use std::future::Future;

/// What kind of stored workspace a [`StoredWorkspace`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoredKind {
    /// A saved copy (EBS snapshot, local archive).
    Snapshot,
    /// A working copy (EBS volume, local directory).
    Volume,
}

/// One stored workspace of this deployment, as the provider lists it (tagged deployment,
/// environment, generation): what the sweeper reconciles against the records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredWorkspace {
    /// Snapshot or working copy.
    pub kind: StoredKind,
    /// Provider id (`snap-…`, `vol-…`, an archive or directory name).
    pub id: String,
    /// The environment (tag).
    pub environment_id: EnvironmentId,
    /// The generation (tag).
    pub generation: sandbox_core::ids::Generation,
    /// When it was created, Unix seconds.
    pub created_at: u64,
    /// Attached to a running compute (an EBS volume `in-use`, a local directory of a live
    /// executor): never deleted.
    pub in_use: bool,
}

/// Workspace persistence: files outlive compute (docs/ARCHITECTURE.md principle 8; agents-api.md:
/// "reusing the environment ID does not restore files in replacement compute").
///
/// The controller calls [`Workspaces::save_workspace`] only after the compute of that
/// generation was read back stopped (ECS `STOPPED`): nothing writes to the files any more.
/// Restoring is part of [`Compute::start`] ([`StartSpec::restore`]), so the sandbox never
/// holds a credential for it. Every method is idempotent, and deletes of what is already
/// gone succeed. The defaults keep nothing (`none`): a provider without persistence.
pub trait Workspaces: Send + Sync + 'static {
    /// Saves the workspace of `generation` of `environment_id`: requests its snapshot
    /// (EBS `CreateSnapshot`) and returns at once, without waiting for it to complete and
    /// without deleting the working copy (docs/ARCHITECTURE.md principle 8: the record
    /// must name the snapshot before the working copy can go;
    /// [`Workspaces::delete_working_copy`] does that once the snapshot is `completed`).
    /// Returns `Snapshot { id }` (its state may be `pending`: [`Workspaces::snapshot_state`]),
    /// `None` when there is nothing to save (never written or saved already and gone), or
    /// `RetainedLocalDir` when the working copy could not be saved and was left in place. A
    /// second call for a generation already saved returns the same snapshot (one in `error`
    /// does not count: a new one is taken).
    ///
    /// # Errors
    /// A [`PortError`]: nothing was deleted; the caller retries (e.g. through the queue
    /// while ECS still detaches the volume).
    fn save_workspace(
        &self,
        _deployment: &DeploymentId,
        _environment_id: &EnvironmentId,
        _generation: sandbox_core::ids::Generation,
    ) -> impl Future<Output = Result<WorkspaceDisposition, PortError>> + Send {
        async { Ok(WorkspaceDisposition::None) }
    }
    /// The state of snapshot `snapshot_id` of `deployment` (EBS `DescribeSnapshots`; a
    /// local archive is `completed` once it exists). A snapshot the provider does not know
    /// is [`SnapshotState::Gone`]. The default (no persistence): `completed`.
    ///
    /// # Errors
    /// A [`PortError`]: the state is unknown; nothing may start from it.
    fn snapshot_state(
        &self,
        _deployment: &DeploymentId,
        _snapshot_id: &str,
    ) -> impl Future<Output = Result<SnapshotState, PortError>> + Send {
        async { Ok(SnapshotState::Completed) }
    }
    /// Deletes the working copy of `generation` (EBS: its volumes) once `snapshot_id`, the
    /// snapshot the record names for it, is `completed`: `Ok(true)` when deleted or
    /// already gone, `Ok(false)` when kept because the snapshot is not `completed` yet (a
    /// later save of that generation or the sweeper deletes it). The caller calls it only
    /// after the record naming `snapshot_id` was written (docs/ARCHITECTURE.md principle 8:
    /// the only copy of the files is never a snapshot nobody recorded). The default:
    /// `Ok(true)`.
    ///
    /// # Errors
    /// A [`PortError`]: nothing was deleted; retry.
    fn delete_working_copy(
        &self,
        _deployment: &DeploymentId,
        _environment_id: &EnvironmentId,
        _generation: sandbox_core::ids::Generation,
        _snapshot_id: &str,
    ) -> impl Future<Output = Result<bool, PortError>> + Send {
        async { Ok(true) }
    }
    /// Deletes the working copy of `generation` without saving it (a close with
    /// `delete`, an orphan, a divergent duplicate). `Deleted` or `None` (nothing there).
    ///
    /// # Errors
    /// A [`PortError`]: retry.
    fn discard_workspace(
        &self,
        _deployment: &DeploymentId,
        _environment_id: &EnvironmentId,
        _generation: sandbox_core::ids::Generation,
    ) -> impl Future<Output = Result<WorkspaceDisposition, PortError>> + Send {
        async { Ok(WorkspaceDisposition::None) }
    }
    /// Deletes one stored workspace by kind and id (a pruned or expired snapshot, an
    /// orphaned volume); one that is gone already counts as deleted. A working copy that
    /// has snapshots, none of them `completed`, is kept (a transient error): it may be
    /// the only copy of the files (docs/ARCHITECTURE.md principle 8).
    ///
    /// # Errors
    /// A [`PortError`]: retry.
    fn delete_stored(
        &self,
        _deployment: &DeploymentId,
        _kind: StoredKind,
        _id: &str,
    ) -> impl Future<Output = Result<(), PortError>> + Send {
        async { Ok(()) }
    }
    /// Every stored workspace of `deployment` (snapshots and working copies), every page:
    /// the sweeper's inventory. Linear in what is stored.
    ///
    /// # Errors
    /// A [`PortError`]: the sweeper deletes nothing on a partial inventory.
    fn list_stored(
        &self,
        _deployment: &DeploymentId,
    ) -> impl Future<Output = Result<Vec<StoredWorkspace>, PortError>> + Send {
        async { Ok(Vec::new()) }
    }
}
