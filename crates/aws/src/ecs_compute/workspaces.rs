//! The [`Workspaces`] port of [`EcsCompute`] with the `ec2` feature: EBS workspaces
//! ([`crate::ebs_workspaces`]) when [`EcsCompute::with_workspaces`] configured them,
//! otherwise the port's defaults (`none`: nothing kept).

use super::EcsCompute;
use sandbox_controller::ports::{PortError, StoredKind, StoredWorkspace, Workspaces};
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation};
use sandbox_core::workspace::{SnapshotState as State, WorkspaceDisposition};

/// EBS workspaces when configured ([`EcsCompute::with_workspaces`]); otherwise the
/// defaults of the port (`none`: nothing kept).
impl Workspaces for EcsCompute {
    async fn save_workspace(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
    ) -> Result<WorkspaceDisposition, PortError> {
        match self.ebs() {
            Some(ebs) => ebs.save(deployment, environment_id, generation).await,
            None => Ok(WorkspaceDisposition::None),
        }
    }

    async fn snapshot_state(
        &self,
        _deployment: &DeploymentId,
        snapshot_id: &str,
    ) -> Result<State, PortError> {
        match self.ebs() {
            Some(ebs) => ebs.state(snapshot_id, "snapshot_state").await,
            None => Ok(State::Gone),
        }
    }

    async fn delete_working_copy(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
        snapshot_id: &str,
    ) -> Result<bool, PortError> {
        match self.ebs() {
            Some(ebs) => {
                ebs.delete_working_copy(deployment, environment_id, generation, snapshot_id)
                    .await
            }
            None => Ok(true),
        }
    }

    async fn discard_workspace(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
    ) -> Result<WorkspaceDisposition, PortError> {
        match self.ebs() {
            Some(ebs) => ebs.discard(deployment, environment_id, generation).await,
            None => Ok(WorkspaceDisposition::None),
        }
    }

    async fn delete_stored(
        &self,
        _deployment: &DeploymentId,
        kind: StoredKind,
        id: &str,
    ) -> Result<(), PortError> {
        match self.ebs() {
            Some(ebs) => ebs.delete(kind, id).await,
            None => Ok(()),
        }
    }

    async fn list_stored(
        &self,
        deployment: &DeploymentId,
    ) -> Result<Vec<StoredWorkspace>, PortError> {
        match self.ebs() {
            Some(ebs) => ebs.list(deployment).await,
            None => Ok(Vec::new()),
        }
    }
}
