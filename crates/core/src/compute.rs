//! Compute as the provider reports it: one ECS Fargate task or one local child process
//! hosting `codex exec-server` for one environment and generation.

use crate::ids::{EnvironmentId, Generation, InstanceId, SessionId};
use serde::{Deserialize, Serialize};

/// One compute instance, as read back from the provider (ECS DescribeTasks, or the local
/// process table), never as remembered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeInstance {
    /// Provider id (task ARN, local process handle).
    pub instance_id: InstanceId,
    /// The environment it serves (from its tags).
    pub environment_id: EnvironmentId,
    /// The session it was started for (from its tags), if tagged.
    pub session_id: Option<SessionId>,
    /// The executor generation (from its tags).
    pub generation: Generation,
    /// Lifecycle status.
    pub status: ComputeStatus,
    /// When the provider started it, Unix seconds; `None` while provisioning.
    pub started_at: Option<u64>,
    /// Why a stopped instance stopped, as the provider says (ECS `stopCode`, e.g.
    /// [`TASK_FAILED_TO_START`], `EssentialContainerExited`, `UserInitiated`); `None` while
    /// it runs or when the provider gives none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_code: Option<String>,
}

/// ECS `stopCode` of a task that stopped before it ever ran (capacity, image pull, ENI,
/// or `PROVISIONING` for ~30 min; ECS API reference, `Task.stopCode`; containers-roadmap
/// #2381). Such a stop counts as a failed start (lifecycle-cases.md row 28).
pub const TASK_FAILED_TO_START: &str = "TaskFailedToStart";

/// Provider lifecycle status, normalised over ECS `lastStatus` and local processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeStatus {
    /// Accepted, resources being provisioned (ECS `PROVISIONING`).
    Provisioning,
    /// Being started (ECS `PENDING`, `ACTIVATING`).
    Pending,
    /// Running: the executor process exists (it may not be connected yet).
    Running,
    /// On its way down (ECS `DEACTIVATING`, `STOPPING`, `DEPROVISIONING`).
    Stopping,
    /// Gone (ECS `STOPPED`, `DELETED`; a reaped child process).
    Stopped,
}

impl ComputeStatus {
    /// Provisioning, pending or running: counts against "exactly one per environment".
    pub fn is_active(self) -> bool {
        matches!(self, Self::Provisioning | Self::Pending | Self::Running)
    }

    /// Provisioning or pending: a start is in flight.
    pub fn is_starting(self) -> bool {
        matches!(self, Self::Provisioning | Self::Pending)
    }

    /// Anything but stopped: some process may still exist.
    pub fn is_live(self) -> bool {
        !matches!(self, Self::Stopped)
    }

    /// Maps an ECS `lastStatus` string; unknown values count as `Pending` (alive, so a
    /// task in a new state is never mistaken for gone).
    pub fn from_ecs_last_status(s: &str) -> Self {
        match s {
            "PROVISIONING" => Self::Provisioning,
            "PENDING" | "ACTIVATING" => Self::Pending,
            "RUNNING" => Self::Running,
            "DEACTIVATING" | "STOPPING" | "DEPROVISIONING" => Self::Stopping,
            "STOPPED" | "DELETED" => Self::Stopped,
            _ => Self::Pending,
        }
    }
}

/// A reference to one exact compute: the instance and its generation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct InstanceRef {
    /// Provider id.
    pub instance_id: InstanceId,
    /// Executor generation.
    pub generation: Generation,
}

impl ComputeInstance {
    /// Whether the instance stopped without ever running ([`TASK_FAILED_TO_START`]).
    pub fn failed_to_start(&self) -> bool {
        self.status == ComputeStatus::Stopped
            && self.stop_code.as_deref() == Some(TASK_FAILED_TO_START)
    }

    /// This instance's [`InstanceRef`].
    pub fn as_ref(&self) -> InstanceRef {
        InstanceRef {
            instance_id: self.instance_id.clone(),
            generation: self.generation,
        }
    }
}
