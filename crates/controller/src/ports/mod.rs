//! The ports: every side effect of the controller goes through one of these traits.
//!
//! Implementations: `sandbox-local` (SQLite, child processes) and `sandbox-aws` (SQS,
//! DynamoDB, ECS). Both pass the shared contract suite in `sandbox_controller::contract`.
//! All times are Unix seconds (`u64`) unless a name says otherwise.
//!
//! One file per port: [`errors`] (the error every port returns), [`clock`], [`queue`],
//! [`registry`], [`compute`] (executors and the warm pool's members) and [`workspaces`];
//! every item is re-exported here, so `crate::ports::X` names it whatever its file. The
//! receipts the registry stores live in [`crate::receipt`] (re-exported here too): the
//! terminal record is assembled from them without depending on the ports.

pub mod clock;
pub mod compute;
pub mod errors;
pub mod queue;
pub mod registry;
pub mod workspaces;

pub use crate::receipt::{Receipt, ReceiptKind};
pub use clock::{Clock, SystemClock};
pub use compute::{
    Compute, NO_DEADLINE, PoolMember, RECYCLE_REASON, REPLAY_ONLY, Started, check_deadline,
};
pub use errors::PortError;
pub use queue::{Outgoing, Queue, Received, SEND_BATCH_MAX, Sent};
pub use registry::{
    AuditEntry, DEFAULT_HISTORY_RETENTION_SECS, Fence, Locked, Registry, Release, Slot, SlotHolder,
    SlotRelease, Slots, StoredRecord, Write,
};
pub use workspaces::{StoredKind, StoredWorkspace, Workspaces};
