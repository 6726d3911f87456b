//! Turns (`agent.session.turn`) and the status of the items inside them.
//!
//! The controller reads these only as evidence: after a mid-turn disconnect or a submission
//! whose outcome is unknown (lifecycle-cases.md rows 20 and 21). It never resubmits input.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One turn of a session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// Turn id.
    pub id: String,
    /// Always `agent.session.turn`.
    pub object: String,
    /// The session the turn belongs to.
    pub session_id: String,
    /// Turn status.
    pub status: TurnStatus,
    /// Unix seconds.
    pub created_at: i64,
    /// Set only on a failed turn (kept verbatim).
    #[serde(default)]
    pub error: Option<Value>,
    /// Every other field verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `agent.session.turn.status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    /// Waiting to start.
    Queued,
    /// Running.
    InProgress,
    /// Waiting for external input.
    Waiting,
    /// Completed (it may still hold a failed tool item).
    Completed,
    /// Failed.
    Failed,
    /// Cancelled.
    Cancelled,
    /// A status this build does not know yet.
    #[serde(other)]
    Unknown,
}

impl TurnStatus {
    /// Whether the turn may still run (and so still needs its executor).
    pub fn is_active(self) -> bool {
        matches!(self, Self::Queued | Self::InProgress | Self::Waiting)
    }
}

/// One item of a turn (`command_execution`, `function_call_output`, messages, ...).
/// Only `id`, `type` and the optional `status` are read; the rest is kept verbatim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Item {
    /// Item id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Item type, e.g. `command_execution`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Tool items and messages carry a status; some item types (e.g. `agent_message`)
    /// have none. Only tool items' failures are evidence of a broken tool
    /// ([`Item::is_tool`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ItemStatus>,
    /// Every other field verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Item {
    /// Whether the item is a tool item (a command, a function, an MCP or computer-use call,
    /// or their outputs) rather than a message or reasoning: its failure means a tool may
    /// not have had its effect (lifecycle-cases.md row 20).
    pub fn is_tool(&self) -> bool {
        let k = self.kind.as_str();
        k.ends_with("_call") || k.ends_with("_call_output") || k == "command_execution"
    }
}

/// Status of a tool item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    /// Still running.
    InProgress,
    /// Done.
    Completed,
    /// Failed (e.g. the executor went away mid-command).
    Failed,
    /// Cut short.
    Incomplete,
    /// A status this build does not know yet.
    #[serde(other)]
    Unknown,
}

impl ItemStatus {
    /// Failed or incomplete: the tool may not have had its effect.
    pub fn is_broken(self) -> bool {
        matches!(self, Self::Failed | Self::Incomplete)
    }
}

/// A cursor page (`{object: "list", data, first_id?, last_id?, has_more?}`).
///
/// Cursor rules differ by list (official SDK 3.51.0): item lists continue after
/// `last_id`; turn and session lists continue after the `id` of the last entry in `data`
/// (their `last_id` may be absent). Default order is `desc`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Page<T> {
    /// The page's entries.
    pub data: Vec<T>,
    /// Whether another page follows (absent means no).
    #[serde(default)]
    pub has_more: bool,
    /// Id of the last entry (item lists' cursor; may be absent on other lists).
    #[serde(default)]
    pub last_id: Option<String>,
    /// Every other field verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}
