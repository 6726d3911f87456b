//! Receipts: proof that a resource reached its final state, read back from its owner.
//! Written through [`crate::ports::Registry::receipt`]; a close's terminal record
//! ([`crate::terminal`]) is assembled from them.

use sandbox_core::ids::{EffectKey, InstanceId, SessionId};
use sandbox_core::workspace::WorkspaceDisposition;
use serde::{Deserialize, Serialize};

/// Proof that a resource reached its final state, read back from its owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// Unix seconds.
    pub at: u64,
    /// The effect key.
    pub effect_key: EffectKey,
    /// What was confirmed.
    pub kind: ReceiptKind,
}

/// What a receipt confirms.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReceiptKind {
    /// A compute was read back stopped.
    ComputeStopped {
        /// Instance.
        instance_id: InstanceId,
        /// Generation.
        generation: u64,
        /// Why it was stopped (`lease_expired`, `session_deleted`, ...).
        reason: String,
        /// What happened to its workspace (`snapshot <id>`, `deleted`, ...); `none` in
        /// receipts written before workspaces were kept.
        #[serde(default)]
        workspace: WorkspaceDisposition,
    },
    /// `DELETE /agents/sessions/{id}` answered deleted (or 404: already gone).
    SessionDeleted {
        /// The session.
        session_id: SessionId,
    },
    /// The record was closed and the close's workspace disposition applied
    /// ([`sandbox_core::observed::Policy::close_workspace`]): every snapshot deleted
    /// (`deleted`), or the latest kept until `retained_until` (`snapshot <id>`), or
    /// nothing was ever saved (`none`).
    WorkspaceClosed {
        /// What happened to the files.
        workspace: WorkspaceDisposition,
        /// The snapshots still kept (ids, oldest first).
        snapshots: Vec<String>,
        /// Until when they are kept, Unix seconds (the sweeper deletes them after).
        retained_until: Option<u64>,
    },
}
