//! What a decision returns: the named [`Outcome`], the ordered [`Effect`]s and the specs
//! they carry ([`StartSpec`], [`StopSpec`], [`StopReason`]), wrapped in one [`Decision`]
//! with its [`crate::reason::Reason`].
//!
//! Plain data: nothing here decides. The rules that produce these values live in
//! [`crate::decision`]; this module imports only the layers below it (ids, compute,
//! record, evidence, workspace, reason), so the types the decision returns never import
//! the decision (docs/ARCHITECTURE.md, "Module layers").

use crate::compute::InstanceRef;
use crate::ids::{EnvironmentId, Generation, SessionId};
use crate::reason::Reason;
use crate::record::{ShutdownLease, StartFailure};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The named outcome of a decision (lifecycle-cases.md's vocabulary, plus `adopt` and
/// `cleanup`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Nothing to do (record bookkeeping may still happen).
    Ignore,
    /// Create compute.
    Start,
    /// Record an existing compute the record does not name (row 12).
    Adopt,
    /// Keep the compute that exists.
    Reuse,
    /// A start, stop or connection is in flight: recheck later.
    Wait,
    /// Stop generation N, start N+1.
    Replace,
    /// Take a shutdown lease with a grace period.
    ScheduleStop,
    /// Drop a pending shutdown lease.
    CancelStop,
    /// Stop the leased compute.
    Stop,
    /// Stop because the session is gone, failed or the compute is an orphan.
    Release,
    /// Hold for an owner with the evidence; change nothing.
    Reconcile,
    /// Evidence is missing: retry later, change nothing.
    Uncertain,
    /// More than one compute, or a record that disagrees with the provider: fix, report.
    Divergent,
    /// Operator close: delete the session and stop the compute, two receipts.
    Cleanup,
}

impl Outcome {
    /// The outcome's name as used in logs and the audit trail (`schedule-stop`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ignore => "ignore",
            Self::Start => "start",
            Self::Adopt => "adopt",
            Self::Reuse => "reuse",
            Self::Wait => "wait",
            Self::Replace => "replace",
            Self::ScheduleStop => "schedule-stop",
            Self::CancelStop => "cancel-stop",
            Self::Stop => "stop",
            Self::Release => "release",
            Self::Reconcile => "reconcile",
            Self::Uncertain => "uncertain",
            Self::Divergent => "divergent",
            Self::Cleanup => "cleanup",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything needed to start one compute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartSpec {
    /// The environment the executor connects (`--environment-id`).
    pub environment_id: EnvironmentId,
    /// The owning session (tag).
    pub session_id: SessionId,
    /// Passed unchanged to `--remote` (agents-api.md).
    pub remote_url: String,
    /// The session's workspace directory.
    pub workspace_directory: String,
    /// The generation being started.
    pub generation: Generation,
    /// Deterministic per (environment, generation), ≤ 64 printable ASCII
    /// ([`crate::ids::idempotency_token`]).
    pub idempotency_token: String,
    /// The generation this start follows, if any. Its files are not in the new compute
    /// unless restored (agents-api.md: reusing an environment id does not restore files).
    pub previous: Option<InstanceRef>,
    /// The workspace snapshot the new generation starts from: the record's latest
    /// ([`crate::record::Record::latest_snapshot`]) when decided (rows 10, 11, and a start after an idle
    /// stop). The controller substitutes the snapshot a stop earlier in the same decision
    /// took (a replacement's), or that it takes of a generation that stopped behind its
    /// back, before sending the start. `None`: an empty workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<crate::workspace::SnapshotRef>,
}

/// Why a compute is stopped (recorded with the receipt).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The shutdown lease expired.
    LeaseExpired,
    /// Replaced by a newer generation.
    Replaced,
    /// The session was deleted.
    SessionDeleted,
    /// The session failed.
    SessionFailed,
    /// No record owns it.
    Orphan,
    /// One of several computes for one environment.
    Divergent,
    /// Operator close.
    Closed,
    /// Past the maximum lifetime with the session idle.
    LifetimeExceeded,
    /// Past the hard lifetime cap, session busy.
    LifetimeHardCap,
    /// No turn and no connection request for the no-work period.
    NoWork,
    /// The executor missed its connect deadline with the replacement cap reached.
    ReplacementCap,
    /// The session's `remote_url` is not (or no longer) on the allowlist.
    RemoteUrlNotAllowed,
}

/// One exact compute to stop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopSpec {
    /// The exact instance and generation.
    pub target: InstanceRef,
    /// Why.
    pub reason: StopReason,
}

/// A side effect, applied in order by the controller under the effect-key lock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "effect", rename_all = "snake_case")]
pub enum Effect {
    /// Start a compute; record its instance id and generation before releasing the lock.
    StartCompute(StartSpec),
    /// Stop one exact compute and read back that it stopped.
    StopCompute(StopSpec),
    /// Write an existing compute into the record (generation and instance id).
    AdoptCompute(InstanceRef),
    /// Store a shutdown lease and schedule its recheck at `due_at`.
    PutLease(ShutdownLease),
    /// Remove the pending shutdown lease.
    DropLease,
    /// Record: no compute runs (status `stopped`).
    MarkStopped,
    /// Record: closed for good (status `closed`, `cleanup_required` cleared).
    MarkClosed,
    /// Record: `cleanup_required` (reject new work; resume the close on every look).
    RequireCleanup,
    /// Record: the compute the record named stopped before it ever ran
    /// ([`crate::compute::TASK_FAILED_TO_START`]); store the failure (attempts counted)
    /// and stop naming that compute (row 28).
    RecordStartFailure(StartFailure),
    /// Record: forget the failed starts (an operator reset).
    ClearStartFailure,
    /// Record: the current `environment_connection` requirement was first observed at
    /// `at` (Unix seconds); the connect deadline counts from it.
    NoteConnectionRequest {
        /// Unix seconds.
        at: u64,
    },
    /// Record: no connection is required any more.
    ClearConnectionRequest,
    /// `DELETE /agents/sessions/{id}` (its own receipt, separate from the stop).
    DeleteSession {
        /// The session to delete.
        session_id: SessionId,
    },
    /// Record: close every open evidence entry with the owner's resolution
    /// ([`crate::evidence::resolve`]).
    ResolveReconciliation(crate::evidence::Resolution),
    /// Record: store a no-work lease and schedule its recheck
    /// ([`crate::observed::Trigger::NoWorkLeaseDue`]) at `due_at`.
    PutNoWorkLease(ShutdownLease),
    /// Record: remove the pending no-work lease.
    DropNoWorkLease,
    /// Record: the replacements within the window, oldest first, the one being made
    /// included (replaces the stored list).
    RecordReplacements {
        /// Unix seconds.
        recent: Vec<u64>,
    },
}

impl Effect {
    /// Whether the effect only notes when a connection was requested (bookkeeping that
    /// names no outcome of its own).
    pub(crate) fn is_note(&self) -> bool {
        matches!(
            self,
            Self::NoteConnectionRequest { .. } | Self::ClearConnectionRequest
        )
    }
}

/// A decision: its named outcome, the evidence, the ordered side effects, and when to look
/// again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// The named outcome.
    pub outcome: Outcome,
    /// Why.
    pub reason: Reason,
    /// Side effects, in application order. Empty for `ignore`, `wait`, `reuse`,
    /// `reconcile` and `uncertain` (record bookkeeping aside).
    pub effects: Vec<Effect>,
    /// Look again after this many seconds (a `wait`, a backoff, an unavailable dependency).
    pub recheck_after_secs: Option<u64>,
}

impl Decision {
    pub(crate) fn new(outcome: Outcome, reason: Reason) -> Self {
        Self {
            outcome,
            reason,
            effects: Vec::new(),
            recheck_after_secs: None,
        }
    }
    pub(crate) fn with(mut self, effects: impl IntoIterator<Item = Effect>) -> Self {
        self.effects.extend(effects);
        self
    }
    pub(crate) fn recheck(mut self, secs: u64) -> Self {
        self.recheck_after_secs = Some(secs.max(1));
        self
    }
    pub(crate) fn ignore(reason: Reason) -> Self {
        Self::new(Outcome::Ignore, reason)
    }

    /// Whether any effect starts or stops compute or deletes a session.
    pub fn touches_resources(&self) -> bool {
        self.effects.iter().any(|e| {
            matches!(
                e,
                Effect::StartCompute(_) | Effect::StopCompute(_) | Effect::DeleteSession { .. }
            )
        })
    }
}
