//! The `agent.environment` object (`GET /agents/environments/{id}`).

use crate::ids::EnvironmentId;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// An agent environment (`object: "agent.environment"`); only `id`, `type` and `status`
/// are read, the rest (`files`, `plugins`, `skills`, ...) is kept verbatim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EnvironmentInfo {
    /// Environment id.
    pub id: EnvironmentId,
    /// Always `agent.environment`.
    pub object: String,
    /// `openai_hosted` or `self_hosted` (kept as a string: forward compatible).
    #[serde(rename = "type")]
    pub kind: String,
    /// Connection status.
    pub status: EnvironmentStatus,
    /// Every other field verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `agent.environment.status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnvironmentStatus {
    /// Being set up.
    Pending,
    /// Available for attachment or use.
    Ready,
    /// An executor is connected.
    Connected,
    /// The executor went away.
    Disconnected,
    /// Stopped, resumable from a checkpoint.
    Suspended,
    /// Can no longer resume.
    Expired,
    /// Setup failed.
    Failed,
    /// A status this build does not know yet.
    #[serde(other)]
    Unknown,
}
