//! Why a decision was taken: [`Reason`], the evidence that settled it, with the text the
//! logs, the audit trail and the evidence entries print for it.
//!
//! Plain data like [`crate::outcome`]: it imports only the layers below the decision.

use crate::ids::Generation;
use crate::observed::Unavailable;
use crate::turn::{ItemStatus, TurnStatus};
use serde::{Deserialize, Serialize};
use std::fmt;

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
    /// Executors keep stopping before their environment is ever seen `connected` (a
    /// rejected executor key, an image without `codex`, a forwarder that exits): past
    /// [`crate::observed::Policy::max_start_attempts`] nothing starts until an owner
    /// resolves the `executor_never_connects` evidence (`sandboxctl resolve`) or resets
    /// the failed starts.
    ExecutorNeverConnects {
        /// Generations that stopped without connecting (and failed starts) in a row.
        attempts: u32,
        /// What the last one died of.
        last_exit: String,
    },
    /// A start would restore a snapshot whose state this decision did not read (issue
    /// 23): the worker reads it ([`crate::observed::Observed::snapshot`]) and decides again.
    SnapshotNotRead {
        /// The snapshot the start would restore.
        snapshot_id: String,
    },
    /// The state of the snapshot a start would restore could not be read: nothing starts
    /// on missing evidence (`uncertain`, retried).
    SnapshotStateUnavailable {
        /// The snapshot.
        snapshot_id: String,
    },
    /// The snapshot a start would restore is still `pending` (EBS snapshots take
    /// minutes to hours; a start restores only a `completed` one): the start waits,
    /// rechecking every [`crate::observed::Policy::snapshot_recheck_secs`], up to
    /// [`crate::observed::Policy::snapshot_wait_secs`].
    SnapshotPending {
        /// The snapshot waited for.
        snapshot_id: String,
        /// Seconds since it was taken.
        pending_secs: u64,
    },
    /// The snapshot a start would restore stayed `pending` past
    /// [`crate::observed::Policy::snapshot_wait_secs`]: a failed start (counted, backed
    /// off), never a start from an empty workspace.
    SnapshotPendingTooLong {
        /// The snapshot.
        snapshot_id: String,
        /// Seconds since it was taken.
        pending_secs: u64,
    },
    /// The snapshot a start would restore is in `error` or gone: a failed start (counted,
    /// backed off, then held for an operator), never a start from an empty workspace. The
    /// working copy it was taken from is kept (never deleted before a completed snapshot
    /// of it is recorded).
    SnapshotUnusable {
        /// The snapshot.
        snapshot_id: String,
        /// `error` or `gone`.
        state: crate::workspace::SnapshotState,
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
    /// An open reconciliation holds the compute with the files: the idle lease
    /// does not stop it until an owner resolves it (`sandboxctl resolve`).
    HeldForOwner {
        /// The turn in question, if the evidence names one.
        turn_id: Option<String>,
    },
    /// An idle stop (its lease, the maximum lifetime, the no-work lease) was due
    /// but the session's latest turn was not read for this decision: nothing is stopped,
    /// the stop is decided again on a fresh read (a queued turn may be about to start).
    TurnsNotRead,
    /// A close of an environment with open reconciliation evidence waits for an
    /// owner's `sandboxctl resolve` (or `close --force`) before the session is deleted
    /// (seed 001: reconcile effects, then delete); new work is refused meanwhile.
    CloseAwaitsResolution {
        /// How many entries are open.
        open: usize,
    },
    /// An owner resolved the open reconciliation; an idle stop may proceed.
    ReconciliationResolved {
        /// How many open entries were closed.
        closed: usize,
    },
    /// A timed-out submission has no turn: it never started (row 21). Never resubmit:
    /// the application decides.
    SubmissionNotFound,
    // --- Cost and safety ceilings. ---
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
    /// reached: the start waits for a slot and is looked at again
    /// ([`crate::decision::at_capacity`]).
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
            Self::ExecutorNeverConnects {
                attempts,
                last_exit,
            } => write!(
                f,
                "the executor stopped {attempts} times without connecting (last: {last_exit}); held until an owner resolves it (sandboxctl resolve)"
            ),
            Self::SnapshotNotRead { snapshot_id } => {
                write!(
                    f,
                    "state of snapshot {snapshot_id} not read yet; reading it before the start"
                )
            }
            Self::SnapshotStateUnavailable { snapshot_id } => {
                write!(
                    f,
                    "state of snapshot {snapshot_id} unavailable; nothing starts"
                )
            }
            Self::SnapshotPending {
                snapshot_id,
                pending_secs,
            } => write!(
                f,
                "workspace snapshot {snapshot_id} pending for {pending_secs} s; the start waits for it"
            ),
            Self::SnapshotPendingTooLong {
                snapshot_id,
                pending_secs,
            } => write!(
                f,
                "workspace snapshot {snapshot_id} still pending after {pending_secs} s; start failed (files kept)"
            ),
            Self::SnapshotUnusable { snapshot_id, state } => write!(
                f,
                "workspace snapshot {snapshot_id} is {state}; start failed (the working copy is kept)"
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
            Self::TurnsNotRead => f.write_str(
                "idle stop due, but the latest turn was not read: nothing stopped, read again",
            ),
            Self::CloseAwaitsResolution { open } => write!(
                f,
                "close waits for an owner: {open} open reconciliation(s); resolve them (or close --force) before the session is deleted"
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
