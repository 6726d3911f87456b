//! The decision: one pure function from an [`Observed`] state to a [`Decision`].
//!
//! This file is the whole lifecycle policy. Every row of
//! `shared/reference/lifecycle-cases.md` is decided here, in the order the checks appear
//! in [`decide`]:
//!
//! 1. triggers that are not compute's business are ignored (rows 3, unknown events);
//! 2. missing evidence changes nothing (row 22), and a timed-out submission is only
//!    reconciled from turn evidence, never retried blind (row 21);
//! 3. sessions that are not self-hosted are ignored (row 23); the ownership filter gates
//!    new starts only: a session it rejects is ignored unless this deployment already has
//!    a record or a compute for it, which it still releases (row 24);
//! 4. a recorded compute the provider does not show yet (ECS `MISSING` right after
//!    `RunTask`) counts as starting for `Policy::visibility_window_secs` after it was
//!    recorded, gone afterwards (DESIGN.md principle 7: absence proves nothing);
//! 5. closed records and operator cleanups (row 25, part of 26); an operator reset of the
//!    failed starts;
//! 6. deleted and failed sessions release their compute (rows 5, 6, 7, 8); a session
//!    status this build does not know is uncertain, never idle;
//! 7. more than one active compute is fixed to exactly one (row 13: never stopping a
//!    running one while a turn may run; the connected one when the environment reads
//!    connected, else the newest), and an active compute the record does not name is
//!    adopted (row 12) or, on a sweep with no record at all, released as an orphan
//!    (row 26);
//!    Then the cost and safety ceilings (issue 13; their own section at the end of this
//!    file): a `remote_url` off the allowlist gets no compute; past the maximum lifetime,
//!    or with no work for the no-work period, the executor is stopped; and in 8 the
//!    replacement cap bounds replacements for a missed connect deadline;
//! 8. a current `environment_connection` requirement ensures one compute: start, wait,
//!    reuse or replace — replace only on evidence that the executor is not connected, its
//!    deadline counted from the request it answers — with start-failure backoff, a
//!    `TaskFailedToStart` stop counted as a failed start, and attempts resumed after a
//!    cooldown (rows 1, 2, 9, 10, 11, 16, 28);
//! 9. otherwise the trigger's own question: resolved actions (row 4), turns without an
//!    executor (row 19), idle shutdown leases (rows 14, 15, 17, 18, 20), sweeps (row 27).
//!
//! A decision lists its side effects in the order they must be applied; the controller
//! applies them under the effect-key lock and stops at the first that fails, so a later
//! effect (e.g. `MarkClosed`) is only applied once the earlier ones (the stops it depends
//! on) are confirmed. Applying a decision's effects and deciding again on the resulting
//! state yields no further effect (property-tested).

use crate::compute::{ComputeInstance, ComputeStatus, InstanceRef};
use crate::environment::EnvironmentStatus;
use crate::ids::{EnvironmentId, Generation, SessionId, idempotency_token};
use crate::observed::{Inventory, Observed, SessionView, Trigger, Unavailable};
use crate::record::{Record, RecordStatus, ShutdownLease, StartFailure};
use crate::session::{Session, SessionStatus};
use crate::turn::{ItemStatus, TurnStatus};
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

/// Why a decision was taken: the evidence that settled it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Reason {
    /// The action type is not `environment_connection` (row 3).
    NotAComputeAction,
    /// The event type does not concern compute.
    UnrelatedEvent,
    /// The session could not be retrieved (row 22).
    SessionUnavailable {
        /// Why.
        cause: Unavailable,
    },
    /// The provider's inventory could not be read.
    InventoryUnavailable,
    /// A submission timed out and no turn evidence was read yet (row 21): retrieve the
    /// session, its turns and their items before anything else; never resubmit.
    SubmissionOutcomeUnknown,
    /// A submission timed out but its turn exists: the original may still run (row 21).
    SubmissionFound {
        /// The turn.
        turn_id: String,
        /// Its status.
        status: TurnStatus,
    },
    /// The environment is `none` or `openai_hosted` (row 23).
    NotSelfHosted,
    /// The ownership filter rejects the session (row 24).
    NotOwned,
    /// The record is closed: nothing starts for this session again.
    SessionClosed,
    /// An operator close is in progress (row 25).
    SessionClosing,
    /// A start is in flight; a close waits it out (row 25).
    StartInFlight,
    /// The session answered 404 (rows 5, 6).
    SessionDeleted,
    /// The session is failed (row 7).
    SessionFailed,
    /// The failed event is stale: the session is no longer failed (row 8).
    StaleFailedEvent,
    /// More than one active compute (row 13).
    MultipleComputes {
        /// How many were active.
        active: usize,
    },
    /// The record does not name the active compute (row 12).
    UnrecordedCompute,
    /// A compute tagged by this deployment has no record (row 26).
    Orphan,
    /// The record says a compute runs; the provider has none (rows 11, 27).
    RecordStale,
    /// The session requires `environment_connection` and nothing serves it (row 1).
    ConnectionRequired,
    /// The connection requirement is resolved already (row 4).
    ActionResolved,
    /// The compute is provisioning or pending (row 9).
    ComputeStarting,
    /// A compute is stopping; start nothing until it is gone.
    ComputeStopping,
    /// The recorded compute is not visible in the provider's reads yet (ECS `MISSING`
    /// right after `RunTask`): wait, never start another.
    ComputeNotVisibleYet {
        /// Seconds since the record began naming it.
        recorded_secs: u64,
    },
    /// The executor runs and is within its connect deadline.
    ExecutorConnecting,
    /// The environment reports `connected`.
    ExecutorConnected,
    /// The environment status could not be read: whether the executor is connected is
    /// missing evidence, so nothing is replaced on it (row 22).
    EnvironmentStatusUnavailable,
    /// More than one active compute while a turn may run, and which one serves it is
    /// unknown: stop nothing until the evidence is read.
    MultipleComputesUnclear {
        /// How many were active.
        active: usize,
    },
    /// The session's status is one this build does not know: not idle, keep the compute.
    UnknownSessionStatus,
    /// An operator reset the failed-start count: attempts resume now.
    StartFailuresReset,
    /// The executor ran past the connect deadline without connecting (row 10).
    ConnectDeadlinePassed {
        /// Seconds since the compute started or the connection was requested, whichever
        /// is later.
        running_secs: u64,
    },
    /// The recorded compute stopped behind the controller's back (row 11). The next
    /// generation starts from the environment's latest workspace snapshot (the gone
    /// generation's own, taken before the start, when its files are still there).
    ComputeGone {
        /// The generation that is gone.
        previous: Generation,
    },
    /// The last start failed; the next attempt waits out its backoff (row 28).
    StartBackoff {
        /// Failed attempts so far.
        attempts: u32,
    },
    /// Starts keep failing; no further attempt until the cooldown ends or an operator
    /// resets them (row 28).
    StartFailing {
        /// Failed attempts so far.
        attempts: u32,
        /// The provider's last reason.
        last_reason: String,
    },
    /// Idle, nothing pending: stop after the grace period (row 14).
    IdleGrace,
    /// A lease is pending already.
    LeaseAlreadyPending,
    /// New work arrived (connection request, turn, required action): keep the compute
    /// (rows 16, 17).
    NewWork,
    /// The timer's lease is no longer the record's lease (cancelled or replaced).
    LeaseNotCurrent,
    /// The lease names an older generation than the current one (row 18).
    LeaseSuperseded,
    /// The lease is not due yet.
    LeaseNotDue,
    /// Due, session idle, nothing active, same generation (row 15).
    LeaseExpired,
    /// A turn runs with no executor at all (row 19): report, do not guess.
    TurnWithoutExecutor,
    /// The latest turn completed with failed or incomplete tool items while the executor
    /// was disconnected (row 20): never resubmit input.
    MidTurnDisconnect {
        /// The turn.
        turn_id: String,
        /// Broken tool items: `(item id, item type, status)`.
        broken_tools: Vec<(String, String, ItemStatus)>,
    },
    /// The idle event is stale: the session is busy again.
    StaleIdleEvent,
    /// Nothing to change.
    Converged,
    /// An open reconciliation holds the compute with the files (issue 15): the idle lease
    /// does not stop it until an owner resolves it (`sandboxctl resolve`).
    HeldForOwner {
        /// The turn in question, if the evidence names one.
        turn_id: Option<String>,
    },
    /// An owner resolved the open reconciliation; an idle stop may proceed.
    ReconciliationResolved {
        /// How many open entries were closed.
        closed: usize,
    },
    /// A timed-out submission has no turn: it never started (row 21). Never resubmit:
    /// the application decides.
    SubmissionNotFound,
    // --- Cost and safety ceilings (issue 13). ---
    /// The executor ran past [`crate::observed::Policy::max_lifetime_secs`] and its session
    /// is idle: stopped at once.
    LifetimeExceeded {
        /// Seconds since the provider started it.
        age_secs: u64,
    },
    /// The executor ran past [`crate::observed::Policy::lifetime_hard_cap_secs`]: stopped
    /// even though its session is busy (a turn may be cut short).
    LifetimeHardCap {
        /// Seconds since the provider started it.
        age_secs: u64,
    },
    /// No turn and no connection request for [`crate::observed::Policy::no_work_secs`]:
    /// a no-work lease is taken (stop after the grace unless work arrives).
    NoWork {
        /// Seconds since the last evidence of work.
        quiet_secs: u64,
    },
    /// The no-work lease is due and still no work arrived: stop.
    NoWorkLeaseExpired {
        /// Seconds since the last evidence of work.
        quiet_secs: u64,
    },
    /// The executor was replaced [`crate::observed::Policy::max_replacements`] times
    /// within the window for missed connect deadlines: nothing new starts until the
    /// window frees; an owner should look at why executors do not connect.
    ReplacementCapReached {
        /// When each replacement in the window happened, Unix seconds, oldest first.
        replacements: Vec<u64>,
        /// The window, seconds.
        window_secs: u64,
    },
    /// The session's `remote_url` is not allowed
    /// ([`crate::observed::Policy::remote_url_allowlist`]): no compute, no executor key
    /// sent anywhere.
    RemoteUrlNotAllowed {
        /// What is wrong (scheme and host only, never the URL).
        refusal: crate::remote_url::RemoteUrlRefusal,
    },
    /// The deployment's executor cap ([`crate::observed::Policy::max_executors`]) is
    /// reached: the start waits for a slot and is looked at again ([`at_capacity`]).
    CapacityLimit {
        /// The cap.
        cap: u32,
        /// Seconds the connection request has waited so far.
        waited_secs: u64,
    },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotAComputeAction => f.write_str("required action is not environment_connection"),
            Self::UnrelatedEvent => f.write_str("event type does not concern compute"),
            Self::SessionUnavailable { cause } => write!(f, "session unavailable ({cause:?})"),
            Self::InventoryUnavailable => f.write_str("compute inventory unavailable"),
            Self::SubmissionOutcomeUnknown => {
                f.write_str("submission outcome unknown: read session, turns and items first")
            }
            Self::SubmissionFound { turn_id, status } => {
                write!(
                    f,
                    "submitted turn {turn_id} exists ({status:?}); never resubmit"
                )
            }
            Self::NotSelfHosted => f.write_str("environment is not self_hosted"),
            Self::NotOwned => f.write_str("session belongs to another handler"),
            Self::SessionClosed => f.write_str("session closed"),
            Self::SessionClosing => f.write_str("operator close in progress"),
            Self::StartInFlight => f.write_str("a start is in flight; waiting it out"),
            Self::SessionDeleted => f.write_str("session deleted"),
            Self::SessionFailed => f.write_str("session failed"),
            Self::StaleFailedEvent => f.write_str("stale failed event: session no longer failed"),
            Self::MultipleComputes { active } => write!(f, "{active} active computes"),
            Self::UnrecordedCompute => f.write_str("active compute not named by the record"),
            Self::Orphan => f.write_str("compute has no record"),
            Self::RecordStale => f.write_str("record names a compute the provider does not run"),
            Self::ConnectionRequired => f.write_str("environment_connection required"),
            Self::ActionResolved => f.write_str("connection requirement already resolved"),
            Self::ComputeStarting => f.write_str("compute is starting"),
            Self::ComputeStopping => f.write_str("compute is stopping"),
            Self::ComputeNotVisibleYet { recorded_secs } => write!(
                f,
                "compute recorded {recorded_secs} s ago is not visible yet; never start another"
            ),
            Self::EnvironmentStatusUnavailable => {
                f.write_str("environment status unavailable; nothing replaced without evidence")
            }
            Self::MultipleComputesUnclear { active } => write!(
                f,
                "{active} active computes while a turn may run; which one serves it is unknown"
            ),
            Self::UnknownSessionStatus => {
                f.write_str("session status unknown to this build; keeping the compute")
            }
            Self::StartFailuresReset => f.write_str("failed starts reset by an operator"),
            Self::ExecutorConnecting => f.write_str("executor running, within connect deadline"),
            Self::ExecutorConnected => f.write_str("executor connected"),
            Self::ConnectDeadlinePassed { running_secs } => {
                write!(f, "executor not connected after {running_secs} s")
            }
            Self::ComputeGone { previous } => write!(
                f,
                "generation {previous} stopped; its workspace is restored from its snapshot"
            ),
            Self::StartBackoff { attempts } => {
                write!(f, "start failed {attempts} time(s); backing off")
            }
            Self::StartFailing {
                attempts,
                last_reason,
            } => write!(
                f,
                "start failed {attempts} times (last: {last_reason}); next attempt after the cooldown or an operator reset"
            ),
            Self::IdleGrace => f.write_str("session idle; stop after the grace period"),
            Self::LeaseAlreadyPending => f.write_str("shutdown lease already pending"),
            Self::NewWork => f.write_str("new work arrived"),
            Self::LeaseNotCurrent => f.write_str("lease no longer current"),
            Self::LeaseSuperseded => f.write_str("lease names an older generation"),
            Self::LeaseNotDue => f.write_str("lease not due yet"),
            Self::LeaseExpired => f.write_str("lease due, session idle, same generation"),
            Self::TurnWithoutExecutor => f.write_str("turn in progress without any executor"),
            Self::MidTurnDisconnect {
                turn_id,
                broken_tools,
            } => write!(
                f,
                "turn {turn_id} completed with {} broken tool item(s) after a disconnect",
                broken_tools.len()
            ),
            Self::StaleIdleEvent => f.write_str("stale idle event: session busy"),
            Self::Converged => f.write_str("nothing to change"),
            Self::HeldForOwner { turn_id } => write!(
                f,
                "held for an owner: open reconciliation{}; resolve it before the idle stop",
                turn_id
                    .as_ref()
                    .map(|t| format!(" of turn {t}"))
                    .unwrap_or_default()
            ),
            Self::ReconciliationResolved { closed } => {
                write!(f, "{closed} open reconciliation(s) resolved by an owner")
            }
            Self::SubmissionNotFound => {
                f.write_str("timed-out submission has no turn: it never started; never resubmit")
            }
            Self::LifetimeExceeded { age_secs } => write!(
                f,
                "executor ran {age_secs} s, past its maximum lifetime; session idle"
            ),
            Self::LifetimeHardCap { age_secs } => write!(
                f,
                "executor ran {age_secs} s, past its hard lifetime cap; stopped mid-turn"
            ),
            Self::NoWork { quiet_secs } => write!(
                f,
                "no turn and no connection request for {quiet_secs} s; stop after the grace"
            ),
            Self::NoWorkLeaseExpired { quiet_secs } => {
                write!(f, "no-work lease due, still no work after {quiet_secs} s")
            }
            Self::ReplacementCapReached {
                replacements,
                window_secs,
            } => write!(
                f,
                "executor replaced {} time(s) within {window_secs} s without connecting; no new start until the window frees",
                replacements.len()
            ),
            Self::RemoteUrlNotAllowed { refusal } => {
                write!(f, "remote_url_not_allowed: {refusal}")
            }
            Self::CapacityLimit { cap, waited_secs } => write!(
                f,
                "capacity_limit: {cap} executor(s) running, the deployment's cap; the start waits for a slot (waited {waited_secs} s)"
            ),
        }
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
    /// ([`idempotency_token`]).
    pub idempotency_token: String,
    /// The generation this start follows, if any. Its files are not in the new compute
    /// unless restored (agents-api.md: reusing an environment id does not restore files).
    pub previous: Option<InstanceRef>,
    /// The workspace snapshot the new generation starts from: the record's latest
    /// ([`Record::latest_snapshot`]) when decided (rows 10, 11, and a start after an idle
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
    fn is_note(&self) -> bool {
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
    fn new(outcome: Outcome, reason: Reason) -> Self {
        Self {
            outcome,
            reason,
            effects: Vec::new(),
            recheck_after_secs: None,
        }
    }
    fn with(mut self, effects: impl IntoIterator<Item = Effect>) -> Self {
        self.effects.extend(effects);
        self
    }
    fn recheck(mut self, secs: u64) -> Self {
        self.recheck_after_secs = Some(secs.max(1));
        self
    }
    fn ignore(reason: Reason) -> Self {
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

/// Decides what to do about one environment's compute, from its observed state alone.
///
/// Pure and total: no I/O, no clock (uses `observed.now`, Unix seconds), never panics.
/// See the module documentation for the order of the checks and the rows they implement.
pub fn decide(o: &Observed) -> Decision {
    match &o.trigger {
        Trigger::OtherActionRequired { .. } => return Decision::ignore(Reason::NotAComputeAction),
        Trigger::OtherEvent { .. } => return Decision::ignore(Reason::UnrelatedEvent),
        _ => {}
    }

    // Uncertain means hands off (DESIGN.md principle 6, row 22).
    if let SessionView::Unavailable { cause } = &o.session {
        return Decision::new(
            Outcome::Uncertain,
            Reason::SessionUnavailable { cause: *cause },
        )
        .recheck(o.policy.uncertain_retry_secs);
    }
    let Inventory::Known { instances } = &o.inventory else {
        return Decision::new(Outcome::Uncertain, Reason::InventoryUnavailable)
            .recheck(o.policy.uncertain_retry_secs);
    };
    if matches!(
        o.trigger,
        Trigger::InputTimedOut | Trigger::TimeoutReported { .. }
    ) {
        return match &o.latest_turn {
            None if o.turn_not_found => {
                Decision::new(Outcome::Reconcile, Reason::SubmissionNotFound)
            }
            None => Decision::new(Outcome::Uncertain, Reason::SubmissionOutcomeUnknown)
                .recheck(o.policy.uncertain_retry_secs),
            Some(t) => Decision::new(
                Outcome::Reconcile,
                Reason::SubmissionFound {
                    turn_id: t.turn_id.clone(),
                    status: t.status,
                },
            ),
        };
    }

    let mine: Vec<&ComputeInstance> = instances
        .iter()
        .filter(|i| i.environment_id == o.environment_id)
        .collect();
    let mut active: Vec<&ComputeInstance> = mine
        .iter()
        .copied()
        .filter(|i| i.status.is_active())
        .collect();
    // The filter gates new starts only: a record or a compute of this deployment stays its
    // responsibility (release on failure, deletion, idle, close) if the filter narrows.
    let mut may_start = true;
    let session = match &o.session {
        SessionView::Found { session } => {
            if session.self_hosted().is_none() {
                return Decision::ignore(Reason::NotSelfHosted);
            }
            if !o.filter.accepts(session) {
                if o.record.is_none() && active.is_empty() {
                    return Decision::ignore(Reason::NotOwned);
                }
                may_start = false;
            }
            Some(session.as_ref())
        }
        _ => None,
    };
    // A recorded compute the provider does not show yet counts as starting (principle 7).
    let unseen = not_visible_yet(o, &mine);
    active.extend(unseen.as_ref());
    let view = View {
        o,
        session,
        record: o.record.as_ref(),
        active,
        unseen: unseen.as_ref().map(|i| &i.instance_id),
        recorded_seen: o.record.as_ref().and_then(Record::current).and_then(|r| {
            mine.iter()
                .copied()
                .find(|i| i.instance_id == r.instance_id)
        }),
        may_start,
        stopping: mine.iter().any(|i| i.status == ComputeStatus::Stopping),
        max_generation: mine
            .iter()
            .map(|i| i.generation)
            .chain(o.record.as_ref().map(|r| r.generation))
            .max()
            .unwrap_or_default(),
    };
    view.decide()
}

/// The compute the record names, as a `Provisioning` stand-in, when the provider does not
/// show it (absent or `MISSING`) and it was recorded less than
/// [`crate::observed::Policy::visibility_window_secs`] ago: ECS reads are eventually
/// consistent right after `RunTask`, so absence then is "not visible yet", never "gone".
fn not_visible_yet(o: &Observed, mine: &[&ComputeInstance]) -> Option<ComputeInstance> {
    let record = o.record.as_ref().filter(|r| r.claims_compute())?;
    let named = record.current()?;
    if mine.iter().any(|i| i.instance_id == named.instance_id) {
        return None;
    }
    let recorded_at = record.instance_recorded_at?;
    (o.now < recorded_at.saturating_add(o.policy.visibility_window_secs)).then(|| ComputeInstance {
        instance_id: named.instance_id.clone(),
        environment_id: o.environment_id.clone(),
        session_id: Some(record.session_id.clone()),
        generation: named.generation,
        status: ComputeStatus::Provisioning,
        started_at: None,
        stop_code: None,
    })
}

/// The observation, pre-digested: this environment's active instances and the like.
struct View<'a> {
    o: &'a Observed,
    /// `None` when deleted.
    session: Option<&'a Session>,
    record: Option<&'a Record>,
    /// Active instances, the not-yet-visible recorded one included.
    active: Vec<&'a ComputeInstance>,
    /// The recorded instance that is not visible yet, if any (it is in `active`).
    unseen: Option<&'a crate::ids::InstanceId>,
    /// The instance the record names, as the provider read it (any status).
    recorded_seen: Option<&'a ComputeInstance>,
    /// `false` when the ownership filter rejects the session: nothing new starts.
    may_start: bool,
    stopping: bool,
    max_generation: Generation,
}

impl View<'_> {
    fn lease(&self) -> Option<&ShutdownLease> {
        self.record.and_then(|r| r.lease.as_ref())
    }

    fn drop_lease(&self) -> Option<Effect> {
        self.lease().map(|_| Effect::DropLease)
    }

    fn stops(&self, reason: StopReason) -> impl Iterator<Item = Effect> + '_ {
        self.active.iter().map(move |i| {
            Effect::StopCompute(StopSpec {
                target: i.as_ref(),
                reason,
            })
        })
    }

    /// A `Wait` while the recorded compute is not visible yet: its stop could be neither
    /// sent nor confirmed, and it must not be forgotten.
    fn awaiting_visibility(&self) -> Option<Decision> {
        self.unseen?;
        let recorded_at = self.record.and_then(|r| r.instance_recorded_at)?;
        Some(
            Decision::new(
                Outcome::Wait,
                Reason::ComputeNotVisibleYet {
                    recorded_secs: self.o.now.saturating_sub(recorded_at),
                },
            )
            .recheck(self.o.policy.recheck_secs),
        )
    }

    fn decide(&self) -> Decision {
        if let Some(d) = self.closed_or_closing() {
            return d;
        }
        if self.o.trigger == Trigger::ResetStartFailures {
            return match self.record.and_then(|r| r.start_failure.as_ref()) {
                Some(_) => Decision::new(Outcome::Ignore, Reason::StartFailuresReset)
                    .with([Effect::ClearStartFailure])
                    .recheck(1),
                None => Decision::ignore(Reason::Converged),
            };
        }
        if let Trigger::Resolve { resolution } = &self.o.trigger {
            return self.resolve(resolution);
        }
        let Some(session) = self.session else {
            return self.deleted();
        };
        if session.status == SessionStatus::Failed {
            return self.failed();
        }
        if self.o.trigger == Trigger::Failed {
            return Decision::ignore(Reason::StaleFailedEvent);
        }
        if session.status == SessionStatus::Unknown {
            return Decision::new(Outcome::Uncertain, Reason::UnknownSessionStatus)
                .recheck(self.o.policy.uncertain_retry_secs);
        }
        if let Some(d) = self.divergent_or_unrecorded(session) {
            return d;
        }
        let current = self.active.first().copied();
        if let Some(d) = self.ceilings(session, current) {
            return d;
        }
        if session.requires_connection_of(&self.o.environment_id)
            && !matches!(self.o.trigger, Trigger::Close)
        {
            return self
                .ensure_compute(session, current)
                .with(self.drop_no_work_lease());
        }
        self.without_connection_need(session, current)
    }

    /// Rows 25 and 26 (closed session): closed records start nothing; an operator close
    /// deletes the session and stops the compute, resuming on every look.
    fn closed_or_closing(&self) -> Option<Decision> {
        let record = self.record;
        if record.is_some_and(|r| r.status == RecordStatus::Closed && !r.cleanup_required) {
            if self.active.is_empty() {
                return Some(Decision::ignore(Reason::SessionClosed));
            }
            return Some(
                Decision::new(Outcome::Release, Reason::SessionClosed)
                    .with(self.stops(StopReason::Closed)),
            );
        }
        let closing = record.is_some_and(|r| r.cleanup_required);
        if !closing && self.o.trigger != Trigger::Close {
            return None;
        }
        let mut effects: Vec<Effect> = Vec::new();
        if !closing {
            effects.push(Effect::RequireCleanup);
        }
        if self.active.iter().any(|i| i.status.is_starting()) {
            return Some(
                Decision::new(Outcome::Wait, Reason::StartInFlight)
                    .with(effects)
                    .recheck(self.o.policy.recheck_secs),
            );
        }
        effects.extend(self.drop_lease());
        if let Some(s) = self.session {
            effects.push(Effect::DeleteSession {
                session_id: s.id.clone(),
            });
        }
        effects.extend(self.stops(StopReason::Closed));
        if self.stopping {
            return Some(
                Decision::new(Outcome::Cleanup, Reason::ComputeStopping)
                    .with(effects)
                    .recheck(self.o.policy.recheck_secs),
            );
        }
        effects.push(Effect::MarkClosed);
        Some(Decision::new(Outcome::Cleanup, Reason::SessionClosing).with(effects))
    }

    /// Rows 5 and 6 (and 26 for a deleted session).
    fn deleted(&self) -> Decision {
        if let Some(d) = self.awaiting_visibility() {
            return d;
        }
        if !self.active.is_empty() {
            return Decision::new(Outcome::Release, Reason::SessionDeleted)
                .with(self.drop_lease())
                .with(self.stops(StopReason::SessionDeleted))
                .with([Effect::MarkClosed]);
        }
        if self.stopping {
            return Decision::new(Outcome::Wait, Reason::ComputeStopping)
                .recheck(self.o.policy.recheck_secs);
        }
        match self.record {
            Some(r) if r.status != RecordStatus::Closed => {
                Decision::ignore(Reason::SessionDeleted).with([Effect::MarkClosed])
            }
            _ => Decision::ignore(Reason::SessionDeleted),
        }
    }

    /// Row 7.
    fn failed(&self) -> Decision {
        if let Some(d) = self.awaiting_visibility() {
            return d;
        }
        if !self.active.is_empty() {
            return Decision::new(Outcome::Release, Reason::SessionFailed)
                .with(self.drop_lease())
                .with(self.stops(StopReason::SessionFailed))
                .with([Effect::MarkStopped]);
        }
        if self.stopping {
            return Decision::new(Outcome::Wait, Reason::ComputeStopping)
                .recheck(self.o.policy.recheck_secs);
        }
        match self.record {
            Some(r) if r.claims_compute() || r.lease.is_some() => {
                Decision::ignore(Reason::SessionFailed).with([Effect::MarkStopped])
            }
            _ => Decision::ignore(Reason::SessionFailed),
        }
    }

    /// Rows 12, 13 and 26: make the provider and the record agree on at most one compute.
    /// The rest of the decision is taken on the state these fixes produce, so that applying
    /// the whole decision leaves nothing further to do.
    fn divergent_or_unrecorded(&self, session: &Session) -> Option<Decision> {
        let recorded = self.record.and_then(Record::current);
        if self.active.len() > 1 {
            if let Some(d) = self.awaiting_visibility() {
                return Some(d);
            }
            let Some(keep) = self.compute_to_keep(session, recorded) else {
                return Some(
                    Decision::new(
                        Outcome::Wait,
                        Reason::MultipleComputesUnclear {
                            active: self.active.len(),
                        },
                    )
                    .recheck(self.o.policy.recheck_secs),
                );
            };
            let mut effects: Vec<Effect> = self
                .active
                .iter()
                .filter(|i| i.instance_id != keep.instance_id)
                .map(|i| {
                    Effect::StopCompute(StopSpec {
                        target: i.as_ref(),
                        reason: StopReason::Divergent,
                    })
                })
                .collect();
            let rest = self.after_adopting(keep, &mut effects);
            return Some(
                Decision::new(
                    Outcome::Divergent,
                    Reason::MultipleComputes {
                        active: self.active.len(),
                    },
                )
                .with(effects)
                .with(rest.effects)
                .recheck(
                    rest.recheck_after_secs
                        .unwrap_or(self.o.policy.recheck_secs),
                ),
            );
        }
        let c = *self.active.first()?;
        // Named and claimed: nothing to fix. A live compute a stopped record still names
        // (read `MISSING` once, say) is adopted again, so the record claims what runs.
        if recorded == Some(&c.as_ref()) && self.record.is_some_and(Record::claims_compute) {
            return None;
        }
        let needs_nothing = session.status == SessionStatus::Idle
            && !session.is_busy()
            && !self.turn_may_run(session);
        if self.record.is_none() && self.o.trigger == Trigger::Sweep && needs_nothing {
            return Some(
                Decision::new(Outcome::Release, Reason::Orphan)
                    .with(self.stops(StopReason::Orphan)),
            );
        }
        let mut effects = Vec::new();
        let rest = self.after_adopting(c, &mut effects);
        let mut d = Decision::new(Outcome::Adopt, Reason::UnrecordedCompute).with(effects);
        if rest.effects.iter().any(|e| !e.is_note()) {
            d.outcome = rest.outcome;
            d.reason = rest.reason;
        }
        d.effects.extend(rest.effects);
        d.recheck_after_secs = rest.recheck_after_secs;
        Some(d)
    }

    /// Whether a turn runs or may run on the connected executor: the session is
    /// `in_progress`, waits on a required action other than this environment's connection
    /// (a paused turn keeps its executor), or the turn evidence shows an active turn
    /// (agents-api.md: idle can arrive just before queued input starts).
    fn turn_may_run(&self, session: &Session) -> bool {
        let paused = session.status == SessionStatus::RequiresAction
            && !session.requires_connection_of(&self.o.environment_id);
        session.status == SessionStatus::InProgress
            || paused
            || self
                .o
                .latest_turn
                .as_ref()
                .is_some_and(|t| t.status.is_active())
    }

    /// Row 13: which of several active computes stays. While a turn may run, an executor
    /// that may serve it (a running one) is never stopped: the only running one stays,
    /// and with two running ones nothing is decided (`None`: the caller holds until the
    /// turn ends). Otherwise, when the environment reads `connected`, the executor that
    /// connected is the one that ran first: the recorded running one, else the
    /// longest-running one. Otherwise the newest generation (a replacement in flight is
    /// newer than what it replaces), the running one on a tie.
    fn compute_to_keep(
        &self,
        session: &Session,
        recorded: Option<&InstanceRef>,
    ) -> Option<&ComputeInstance> {
        let running: Vec<&ComputeInstance> = self
            .active
            .iter()
            .copied()
            .filter(|i| i.status == ComputeStatus::Running)
            .collect();
        if self.turn_may_run(session) {
            match running.as_slice() {
                [] => {}
                [only] => return Some(only),
                _ => return None,
            }
        }
        let first_connected = self
            .o
            .environment_status
            .is_connected()
            .then(|| {
                running
                    .iter()
                    .copied()
                    .find(|i| Some(&i.as_ref()) == recorded)
                    .or_else(|| running.iter().copied().min_by_key(|i| i.started_at))
            })
            .flatten();
        first_connected.or_else(|| {
            self.active
                .iter()
                .copied()
                .max_by_key(|i| (i.generation, i.status == ComputeStatus::Running))
        })
    }

    /// Decides again as if `keep` were the only active compute and the record named it;
    /// pushes the adoption (and a lease drop, if the lease targets another instance).
    fn after_adopting(&self, keep: &ComputeInstance, effects: &mut Vec<Effect>) -> Decision {
        let mut o = self.o.clone();
        let session_id = self
            .session
            .map(|s| s.id.clone())
            .unwrap_or_else(|| SessionId::new(""));
        let record = o
            .record
            .get_or_insert_with(|| Record::new(self.o.environment_id.clone(), session_id));
        if record.current() != Some(&keep.as_ref()) || record.status != RecordStatus::Active {
            effects.push(Effect::AdoptCompute(keep.as_ref()));
            record.generation = record.generation.max(keep.generation);
            record.instance = Some(keep.as_ref());
            record.status = RecordStatus::Active;
            record.start_failure = None;
            record.instance_recorded_at = Some(self.o.now);
        }
        if record
            .lease
            .as_ref()
            .is_some_and(|l| l.target != keep.as_ref())
        {
            effects.push(Effect::DropLease);
            record.lease = None;
        }
        if let Inventory::Known { instances } = &mut o.inventory {
            instances.retain(|i| i.instance_id == keep.instance_id || !i.status.is_active());
        }
        decide(&o)
    }

    /// Rows 1, 9, 10, 11, 16, 28: the session requires `environment_connection` now.
    /// The first observation of the requirement is noted on the record (the connect
    /// deadline counts from it); the note goes last, so a start is not preceded by a write.
    fn ensure_compute(&self, session: &Session, current: Option<&ComputeInstance>) -> Decision {
        let requested_at = self.record.and_then(|r| r.connection_requested_at);
        let note = requested_at
            .is_none()
            .then_some(Effect::NoteConnectionRequest { at: self.o.now });
        self.ensure_compute_since(session, current, requested_at.unwrap_or(self.o.now))
            .with(note)
    }

    fn ensure_compute_since(
        &self,
        session: &Session,
        current: Option<&ComputeInstance>,
        requested_at: u64,
    ) -> Decision {
        let policy = &self.o.policy;
        let now = self.o.now;
        let cancel: Vec<Effect> = self.drop_lease().into_iter().collect();
        let cancelled = !cancel.is_empty();
        // The named outcome when no resource is touched: a cancelled lease is the news.
        let quiet = |outcome: Outcome, reason: Reason| {
            if cancelled {
                Decision::new(Outcome::CancelStop, Reason::NewWork).with(cancel.clone())
            } else {
                Decision::new(outcome, reason)
            }
        };
        let Some(c) = current else {
            if self.stopping {
                return quiet(Outcome::Wait, Reason::ComputeStopping).recheck(policy.recheck_secs);
            }
            if !self.may_start {
                return Decision::ignore(Reason::NotOwned).with(cancel);
            }
            let mut effects = cancel;
            let failure = self.failed_start(&mut effects);
            if let Some(f) = &failure {
                if f.attempts >= policy.max_start_attempts {
                    let resume_at = f
                        .last_failed_at
                        .saturating_add(policy.start_failing_cooldown_secs);
                    if now < resume_at {
                        return Decision::new(
                            Outcome::Reconcile,
                            Reason::StartFailing {
                                attempts: f.attempts,
                                last_reason: f.reason.clone(),
                            },
                        )
                        .with(effects)
                        .recheck(resume_at - now);
                    }
                } else {
                    let retry_at = f
                        .last_failed_at
                        .saturating_add(policy.start_backoff_secs(f.attempts));
                    if now < retry_at {
                        return Decision::new(
                            Outcome::Wait,
                            Reason::StartBackoff {
                                attempts: f.attempts,
                            },
                        )
                        .with(effects)
                        .recheck(retry_at - now);
                    }
                }
            }
            if let Some(d) = self.replacement_cap_holds() {
                return d.with(effects);
            }
            let previous = self
                .record
                .filter(|r| r.claims_compute())
                .and_then(Record::current)
                .cloned();
            let reason = match &previous {
                Some(p) => Reason::ComputeGone {
                    previous: p.generation,
                },
                None => Reason::ConnectionRequired,
            };
            return Decision::new(Outcome::Start, reason)
                .with(effects)
                .with([Effect::StartCompute(self.start_spec(session, previous))])
                .recheck(policy.recheck_secs);
        };
        if c.status.is_starting() {
            let reason = match (self.unseen, self.awaiting_visibility()) {
                (Some(id), Some(d)) if *id == c.instance_id => d.reason,
                _ => Reason::ComputeStarting,
            };
            return quiet(Outcome::Wait, reason).recheck(policy.recheck_secs);
        }
        if self.o.environment_status.is_connected() {
            return quiet(Outcome::Reuse, Reason::ExecutorConnected);
        }
        // The deadline runs from the later of the compute's start and the connection
        // request it answers.
        let since = c.started_at.unwrap_or(now).max(requested_at);
        let running_secs = now.saturating_sub(since);
        if running_secs <= policy.connect_deadline_secs {
            let left = policy.connect_deadline_secs - running_secs + 1;
            return quiet(Outcome::Wait, Reason::ExecutorConnecting).recheck(left);
        }
        // Replace only on evidence that the executor is not connected (row 22).
        if self.o.environment_status.status().is_none() {
            return quiet(Outcome::Uncertain, Reason::EnvironmentStatusUnavailable)
                .recheck(policy.uncertain_retry_secs);
        }
        if !self.may_start {
            return quiet(Outcome::Reuse, Reason::NotOwned);
        }
        if let Some(d) = self.replacement_cap_at_replace(c) {
            return d.with(cancel);
        }
        let stop = Effect::StopCompute(StopSpec {
            target: c.as_ref(),
            reason: StopReason::Replaced,
        });
        // Another compute still on its way down: stop this one now, start once all are gone.
        let start = (!self.stopping)
            .then(|| Effect::StartCompute(self.start_spec(session, Some(c.as_ref()))));
        Decision::new(
            Outcome::Replace,
            Reason::ConnectDeadlinePassed { running_secs },
        )
        .with(cancel)
        .with([stop])
        .with(start)
        .with([self.record_replacement()])
        .recheck(policy.recheck_secs)
    }

    /// The record's failed starts, counting the recorded compute if the provider read it
    /// stopped before it ever ran ([`crate::compute::TASK_FAILED_TO_START`]: a failed start
    /// like a `RunTask` answered with `failures`, row 28); pushes the effect that records it.
    fn failed_start(&self, effects: &mut Vec<Effect>) -> Option<StartFailure> {
        let previous = self.record.and_then(|r| r.start_failure.clone());
        let Some(task) = self
            .recorded_seen
            .filter(|i| i.failed_to_start() && self.record.is_some_and(Record::claims_compute))
        else {
            return previous;
        };
        let failure = StartFailure {
            attempts: previous.map_or(1, |f| f.attempts.saturating_add(1)),
            last_failed_at: self.o.now,
            reason: format!(
                "task {} (generation {}) stopped before it ran: {}",
                task.instance_id,
                task.generation,
                task.stop_code.as_deref().unwrap_or_default()
            ),
        };
        effects.push(Effect::RecordStartFailure(failure.clone()));
        Some(failure)
    }

    fn start_spec(&self, session: &Session, previous: Option<InstanceRef>) -> StartSpec {
        let env = session
            .self_hosted()
            .expect("decide() only ensures compute for self-hosted sessions");
        let generation = self.max_generation.next();
        StartSpec {
            environment_id: self.o.environment_id.clone(),
            session_id: session.id.clone(),
            remote_url: env.remote_url.clone(),
            workspace_directory: env.workspace_directory.clone(),
            generation,
            idempotency_token: idempotency_token(&self.o.environment_id, generation),
            previous,
            restore: self.record.and_then(Record::latest_snapshot).cloned(),
        }
    }

    /// Rows 4, 14, 15, 17, 18, 19, 20, 27: no connection is required right now (a noted
    /// connection request is cleared).
    fn without_connection_need(
        &self,
        session: &Session,
        current: Option<&ComputeInstance>,
    ) -> Decision {
        let clear = self
            .record
            .is_some_and(|r| r.connection_requested_at.is_some())
            .then_some(Effect::ClearConnectionRequest);
        self.no_connection_required(session, current).with(clear)
    }

    fn no_connection_required(
        &self,
        session: &Session,
        current: Option<&ComputeInstance>,
    ) -> Decision {
        // A turn the evidence shows active counts as work even if the session already
        // reads idle (agents-api.md: idle can arrive just before queued input starts).
        let turn_active = self
            .o
            .latest_turn
            .as_ref()
            .is_some_and(|t| t.status.is_active());
        let busy = session.is_busy() || turn_active;
        let lease = self.lease();
        if busy && lease.is_some() {
            return Decision::new(Outcome::CancelStop, Reason::NewWork).with([Effect::DropLease]);
        }
        match &self.o.trigger {
            Trigger::ConnectionRequested => Decision::ignore(Reason::ActionResolved),
            Trigger::TurnStarted => self.turn_started(session, current),
            Trigger::Idle if busy => Decision::ignore(Reason::StaleIdleEvent),
            Trigger::Idle => self.idle(current),
            Trigger::LeaseDue { lease: due } => self.lease_due(due, current),
            Trigger::Sweep => {
                if session.status == SessionStatus::InProgress {
                    return self.turn_started(session, current);
                }
                match lease.filter(|l| Self::targets(l, current)) {
                    Some(l) if self.o.now >= l.due_at => self.lease_due(l, current),
                    Some(_) => Decision::ignore(Reason::LeaseAlreadyPending),
                    None if busy => Decision::ignore(Reason::Converged),
                    None => self.idle(current),
                }
            }
            // Handled before: Close (cleanup), Failed (stale), InputTimedOut, Other*.
            _ => Decision::ignore(Reason::Converged),
        }
    }

    /// Row 19.
    fn turn_started(&self, session: &Session, current: Option<&ComputeInstance>) -> Decision {
        if session.status == SessionStatus::InProgress && current.is_none() && !self.stopping {
            return Decision::new(Outcome::Reconcile, Reason::TurnWithoutExecutor);
        }
        Decision::ignore(Reason::Converged)
    }

    /// Rows 14, 20, 27: the session is idle with nothing required.
    fn idle(&self, current: Option<&ComputeInstance>) -> Decision {
        if let Some(d) = self.held(current) {
            return d;
        }
        let disconnected =
            self.o.environment_status.status() == Some(EnvironmentStatus::Disconnected);
        if let Some(t) = &self.o.latest_turn
            && !self.evidence_names_turn(&t.turn_id)
            && t.status == TurnStatus::Completed
            && !t.broken_tools.is_empty()
            && disconnected
        {
            return Decision::new(
                Outcome::Reconcile,
                Reason::MidTurnDisconnect {
                    turn_id: t.turn_id.clone(),
                    broken_tools: t.broken_tools.clone(),
                },
            );
        }
        // A lease that names another compute than the current one is stale: replace it.
        let stale_lease = self
            .lease()
            .filter(|l| !Self::targets(l, current))
            .map(|_| Effect::DropLease);
        let Some(c) = current else {
            return match self.record {
                Some(r) if r.claims_compute() && !self.stopping => {
                    Decision::new(Outcome::Divergent, Reason::RecordStale)
                        .with(stale_lease)
                        .with([Effect::MarkStopped])
                }
                _ => Decision::ignore(Reason::Converged).with(stale_lease),
            };
        };
        if stale_lease.is_none() && self.lease().is_some() {
            return Decision::ignore(Reason::LeaseAlreadyPending);
        }
        let now = self.o.now;
        let grace = self.o.policy.shutdown_grace_secs;
        Decision::new(Outcome::ScheduleStop, Reason::IdleGrace)
            .with(stale_lease)
            .with([Effect::PutLease(ShutdownLease {
                target: c.as_ref(),
                requested_at: now,
                due_at: now.saturating_add(grace),
            })])
            .recheck(grace)
    }

    /// Whether `lease` names exactly the `current` compute.
    fn targets(lease: &ShutdownLease, current: Option<&ComputeInstance>) -> bool {
        current.is_some_and(|c| lease.target == c.as_ref())
    }

    /// Rows 15, 17, 18.
    fn lease_due(&self, due: &ShutdownLease, current: Option<&ComputeInstance>) -> Decision {
        if self.lease() != Some(due) {
            return Decision::ignore(Reason::LeaseNotCurrent);
        }
        let current_generation = current
            .map(|c| c.generation)
            .into_iter()
            .chain(self.record.and_then(Record::current).map(|r| r.generation))
            .max()
            .unwrap_or_default();
        if current_generation > due.target.generation {
            return Decision::new(Outcome::CancelStop, Reason::LeaseSuperseded)
                .with([Effect::DropLease]);
        }
        if let Some(d) = self.held(current) {
            return d;
        }
        if self
            .o
            .latest_turn
            .as_ref()
            .is_some_and(|t| t.status.is_active())
        {
            return Decision::new(Outcome::CancelStop, Reason::NewWork).with([Effect::DropLease]);
        }
        if self.o.now < due.due_at {
            return Decision::new(Outcome::Wait, Reason::LeaseNotDue)
                .recheck(due.due_at - self.o.now);
        }
        match current {
            Some(c) if c.as_ref() == due.target => {
                Decision::new(Outcome::Stop, Reason::LeaseExpired).with([
                    Effect::StopCompute(StopSpec {
                        target: due.target.clone(),
                        reason: StopReason::LeaseExpired,
                    }),
                    Effect::DropLease,
                    Effect::MarkStopped,
                ])
            }
            Some(_) => Decision::new(Outcome::CancelStop, Reason::LeaseNotCurrent)
                .with([Effect::DropLease]),
            None if self.stopping => Decision::new(Outcome::Wait, Reason::ComputeStopping)
                .recheck(self.o.policy.recheck_secs),
            None => {
                Decision::ignore(Reason::Converged).with([Effect::DropLease, Effect::MarkStopped])
            }
        }
    }
}

/// Issue 15: hold, don't guess; an owner's resolution.
impl View<'_> {
    /// Whether the record already holds evidence (open or resolved) about `turn_id`: a
    /// resolved question is not asked again for the same turn.
    fn evidence_names_turn(&self, turn_id: &str) -> bool {
        self.record.is_some_and(|r| {
            r.evidence
                .iter()
                .any(|e| e.turn.as_ref().is_some_and(|t| t.id == turn_id))
        })
    }

    /// While an open reconciliation holds the files (a tool did not complete, no
    /// snapshot), the idle lease does not stop the compute that has them: `reconcile`,
    /// and a pending lease is dropped. New input and connection requests are decided
    /// before this and proceed as usual (the API does not replay; the evidence stays).
    fn held(&self, current: Option<&ComputeInstance>) -> Option<Decision> {
        current?;
        let e = self.record.and_then(Record::holding_evidence)?;
        Some(
            Decision::new(
                Outcome::Reconcile,
                Reason::HeldForOwner {
                    turn_id: e.turn.as_ref().map(|t| t.id.clone()),
                },
            )
            .with(self.drop_lease()),
        )
    }

    /// `sandboxctl resolve`: close the open evidence, then look again (an idle stop
    /// follows the usual grace).
    fn resolve(&self, resolution: &crate::evidence::Resolution) -> Decision {
        let closed = self.record.map_or(0, |r| r.open_evidence().count());
        if closed == 0 {
            return Decision::ignore(Reason::Converged);
        }
        Decision::new(Outcome::Ignore, Reason::ReconciliationResolved { closed })
            .with([Effect::ResolveReconciliation(resolution.clone())])
            .recheck(1)
    }
}

// --- Cost and safety ceilings (issue 13): executor lifetime, idle without work, the
// replacement cap and the `remote_url` allowlist. Each is checked on every look at the
// environment (webhook jobs, lease timers, and at least every sweep).
impl View<'_> {
    /// The no-work lease, if the record holds one.
    fn no_work_lease(&self) -> Option<&ShutdownLease> {
        self.record.and_then(|r| r.no_work_lease.as_ref())
    }

    fn drop_no_work_lease(&self) -> Option<Effect> {
        self.no_work_lease().map(|_| Effect::DropNoWorkLease)
    }

    /// Whether the latest turn evidence shows a turn running.
    fn turn_active(&self) -> bool {
        self.o
            .latest_turn
            .as_ref()
            .is_some_and(|t| t.status.is_active())
    }

    /// The ceilings that apply before the usual rules, in order: a stale no-work timer;
    /// the `remote_url` allowlist (a live compute for a refused URL stops; with none, a
    /// required connection is refused); the maximum lifetime and the no-work period (when
    /// no connection is required).
    fn ceilings(&self, session: &Session, current: Option<&ComputeInstance>) -> Option<Decision> {
        if let Trigger::NoWorkLeaseDue { lease } = &self.o.trigger
            && self.no_work_lease() != Some(lease)
        {
            return Some(Decision::ignore(Reason::LeaseNotCurrent));
        }
        if let Some(refused) = self.remote_url_refused(session) {
            // An executor that already runs for a refused `remote_url` (the allowlist was
            // narrowed since it started) holds the executor key for a destination no
            // longer allowed: it stops, whatever the session's state.
            if let Some(c) = current.filter(|c| c.status.is_active()) {
                return Some(self.ceiling_stop(
                    c,
                    Outcome::Stop,
                    refused.reason,
                    StopReason::RemoteUrlNotAllowed,
                ));
            }
            if session.requires_connection_of(&self.o.environment_id) {
                return Some(refused);
            }
        }
        if session.requires_connection_of(&self.o.environment_id) {
            return None;
        }
        let c = current.filter(|c| c.status == ComputeStatus::Running)?;
        // An open reconciliation holds the compute with the files (issue 15): no-work is
        // not a reason to throw them away; the lifetime ceiling still applies.
        let held = self.record.and_then(Record::holding_evidence).is_some();
        self.lifetime(session, c)
            .or_else(|| (!held).then(|| self.no_work(session, c)).flatten())
    }

    /// Issue 13 item 5: only an `https` `remote_url` on an allowed host reaches an
    /// executor; anything else is held for an owner, and no compute starts.
    fn remote_url_refused(&self, session: &Session) -> Option<Decision> {
        let env = session.self_hosted()?;
        let refusal =
            crate::remote_url::check(&env.remote_url, &self.o.policy.remote_url_allowlist).err()?;
        Some(Decision::new(
            Outcome::Reconcile,
            Reason::RemoteUrlNotAllowed { refusal },
        ))
    }

    /// Stops `c` for a ceiling: the stop, both leases dropped, the record marked stopped.
    fn ceiling_stop(
        &self,
        c: &ComputeInstance,
        outcome: Outcome,
        reason: Reason,
        stop: StopReason,
    ) -> Decision {
        // The stop first: the record keeps its evidence (the leases) until the stop is
        // confirmed, as for a due idle lease.
        Decision::new(outcome, reason)
            .with([Effect::StopCompute(StopSpec {
                target: c.as_ref(),
                reason: stop,
            })])
            .with(self.drop_lease())
            .with(self.drop_no_work_lease())
            .with([Effect::MarkStopped])
    }

    /// Issue 13 item 1: past the maximum lifetime an idle session's executor stops at
    /// once; a busy one at its next idle, or past the hard cap even mid-turn.
    fn lifetime(&self, session: &Session, c: &ComputeInstance) -> Option<Decision> {
        let p = &self.o.policy;
        if p.max_lifetime_secs == 0 {
            return None;
        }
        let age_secs = self.o.now.saturating_sub(c.started_at?);
        if age_secs < p.max_lifetime_secs {
            return None;
        }
        let busy = session.is_busy() || self.turn_active();
        if !busy {
            return Some(self.ceiling_stop(
                c,
                Outcome::Stop,
                Reason::LifetimeExceeded { age_secs },
                StopReason::LifetimeExceeded,
            ));
        }
        let hard = p.lifetime_hard_cap_secs.max(p.max_lifetime_secs);
        (p.lifetime_hard_cap_secs > 0 && age_secs >= hard).then(|| {
            self.ceiling_stop(
                c,
                Outcome::Stop,
                Reason::LifetimeHardCap { age_secs },
                StopReason::LifetimeHardCap,
            )
        })
    }

    /// Issue 13 item 2: no turn and no connection request for the no-work period, whatever
    /// the status, takes a no-work lease; new work cancels it; when due, the stop is
    /// decided again on fresh evidence (the recheck) before it is sent.
    fn no_work(&self, session: &Session, c: &ComputeInstance) -> Option<Decision> {
        let p = &self.o.policy;
        let lease = self.no_work_lease();
        if p.no_work_secs == 0 {
            // Switched off since the lease was taken: forget it.
            return lease.map(|_| {
                Decision::new(Outcome::CancelStop, Reason::Converged)
                    .with([Effect::DropNoWorkLease])
            });
        }
        let record = self.record;
        let last_work = [
            Some(u64::try_from(session.last_active_at).unwrap_or(0)),
            record.and_then(|r| r.connection_requested_at),
            record.and_then(|r| r.instance_recorded_at),
            c.started_at,
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0);
        let now = self.o.now;
        let quiet_secs = now.saturating_sub(last_work);
        let working = session.status == SessionStatus::InProgress || self.turn_active();
        let no_work = !working && quiet_secs >= p.no_work_secs;
        match lease {
            Some(l) if l.target != c.as_ref() => Some(
                Decision::new(Outcome::CancelStop, Reason::LeaseSuperseded)
                    .with([Effect::DropNoWorkLease]),
            ),
            Some(_) if !no_work => Some(
                Decision::new(Outcome::CancelStop, Reason::NewWork).with([Effect::DropNoWorkLease]),
            ),
            Some(l) if now >= l.due_at => Some(self.ceiling_stop(
                c,
                Outcome::Stop,
                Reason::NoWorkLeaseExpired { quiet_secs },
                StopReason::NoWork,
            )),
            Some(l) => matches!(self.o.trigger, Trigger::NoWorkLeaseDue { .. })
                .then(|| Decision::new(Outcome::Wait, Reason::LeaseNotDue).recheck(l.due_at - now)),
            // An idle session is the idle lease's (rows 14, 15: same grace, its own stop
            // reason); the no-work period is for sessions that are never idle.
            None if no_work && session.status != SessionStatus::Idle => {
                let grace = p.shutdown_grace_secs;
                Some(
                    Decision::new(Outcome::ScheduleStop, Reason::NoWork { quiet_secs })
                        .with([Effect::PutNoWorkLease(ShutdownLease {
                            target: c.as_ref(),
                            requested_at: now,
                            due_at: now.saturating_add(grace),
                        })])
                        .recheck(grace),
                )
            }
            None => None,
        }
    }

    /// Replacements of this environment within the window, oldest first.
    fn recent_replacements(&self) -> Vec<u64> {
        let window = self.o.policy.replacement_window_secs;
        self.record
            .map(|r| {
                r.replacements
                    .iter()
                    .copied()
                    .filter(|t| self.o.now.saturating_sub(*t) < window)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The record's replacement list with this replacement added.
    fn record_replacement(&self) -> Effect {
        let mut recent = self.recent_replacements();
        recent.push(self.o.now);
        Effect::RecordReplacements { recent }
    }

    /// The cap's `reconcile`, rechecked when the oldest replacement leaves the window;
    /// `None` while under the cap (or with no cap).
    fn replacement_cap_holds(&self) -> Option<Decision> {
        let p = &self.o.policy;
        let recent = self.recent_replacements();
        if p.max_replacements == 0 || recent.len() < p.max_replacements as usize {
            return None;
        }
        let frees_at = recent[0].saturating_add(p.replacement_window_secs);
        Some(
            Decision::new(
                Outcome::Reconcile,
                Reason::ReplacementCapReached {
                    replacements: recent,
                    window_secs: p.replacement_window_secs,
                },
            )
            .recheck(frees_at.saturating_sub(self.o.now)),
        )
    }

    /// Issue 13 item 4: at the cap, the executor that missed its deadline is stopped and
    /// nothing replaces it until the window frees.
    fn replacement_cap_at_replace(&self, c: &ComputeInstance) -> Option<Decision> {
        let d = self.replacement_cap_holds()?;
        let recheck = d.recheck_after_secs;
        let mut d = d.with([
            Effect::StopCompute(StopSpec {
                target: c.as_ref(),
                reason: StopReason::ReplacementCap,
            }),
            Effect::MarkStopped,
        ]);
        d.recheck_after_secs = recheck;
        Some(d)
    }
}

// --- Concurrency cap per deployment (issue 13 item 3). ---
//
// The cap is enforced where the start happens, not by counting: the worker takes an
// executor slot with one conditional write just before it applies a start
// (`Registry::acquire_slot` in sandbox-controller), and a start that finds no free slot
// becomes the decision below. Kept pure and here so the rule is visible and tested with the
// others (crates/core/tests/capacity.rs).

/// Whether applying `decision` starts a compute (and so needs an executor slot when
/// [`crate::observed::Policy::max_executors`] is set).
pub fn starts_compute(decision: &Decision) -> bool {
    decision
        .effects
        .iter()
        .any(|e| matches!(e, Effect::StartCompute(_)))
}

/// The decision when `decision` would start a compute but the deployment's executor cap
/// is reached (issue 13 item 3): `wait`, reason `capacity_limit`, no compute started or
/// stopped. What else the decision noted is kept — a cancelled shutdown lease, the first
/// observation of the connection request (the wait counts from it), a failed start read
/// back — but not a replacement's stop or its count: an executor that cannot be replaced
/// now is left as it is. Looked at again after [`Policy::capacity_retry_secs`] of the time
/// the connection request has waited.
///
/// A decision that starts nothing is returned unchanged.
///
/// [`Policy::capacity_retry_secs`]: crate::observed::Policy::capacity_retry_secs
pub fn at_capacity(decision: &Decision, o: &Observed) -> Decision {
    if !starts_compute(decision) {
        return decision.clone();
    }
    let requested_at = o
        .record
        .as_ref()
        .and_then(|r| r.connection_requested_at)
        .unwrap_or(o.now);
    let waited_secs = o.now.saturating_sub(requested_at);
    let effects = decision
        .effects
        .iter()
        .filter(|e| {
            !matches!(
                e,
                Effect::StartCompute(_)
                    | Effect::StopCompute(_)
                    | Effect::DeleteSession { .. }
                    | Effect::RecordReplacements { .. }
            )
        })
        .cloned();
    Decision::new(
        Outcome::Wait,
        Reason::CapacityLimit {
            cap: o.policy.max_executors,
            waited_secs,
        },
    )
    .with(effects)
    .recheck(o.policy.capacity_retry_secs(waited_secs))
}
