//! Reconciliation evidence: what the controller saw when it could not settle a question
//! alone, kept on the environment's record for a platform owner.
//!
//! Source: the controller design seed ("reconcile at least four layers: turn, tool,
//! workspace, business effect"; "route `reconcile`, `uncertain` and `divergent` decisions
//! to a platform owner with the evidence"; "an absent response is unknown, not failed").
//!
//! - [`Evidence`] is one open or resolved question: the trigger, the turn, the tool items
//!   that did not complete, the workspace (which compute holds the files), the business
//!   effect's reconciliation state ([`EffectState::Unknown`] until an owner resolves it),
//!   and, for a reported timed-out submission, its [`SubmissionOutcome`].
//! - [`Evidence::holds_files`]: an open question with a tool that did not complete, and no
//!   snapshot of the files, holds the compute: the idle lease does not stop it
//!   ([`crate::decide`]). New input and connection requests proceed as usual.
//! - [`crate::decision::evidence_for`] derives the entry a decision calls for, purely; the
//!   controller appends it to the record with [`append`] (idempotent: the same question is
//!   recorded once).
//! - An owner closes the open questions with [`Resolution`] (`sandboxctl resolve`), applied
//!   by [`crate::decision::Effect::ResolveReconciliation`] under the effect-key lock.

use crate::compute::InstanceRef;
use crate::environment::EnvironmentStatus;
use crate::ids::Generation;
use crate::turn::{ItemStatus, TurnStatus};
use serde::{Deserialize, Serialize};
use std::fmt;

/// At most this many evidence entries are kept on a record: open entries are never
/// dropped; the oldest resolved ones go first. (The record is one DynamoDB item, at most
/// 400 KB.)
pub const MAX_EVIDENCE: usize = 8;

/// At most this many not-completed tool items are kept per entry (one page of items).
pub const MAX_TOOLS: usize = 100;

/// What raised the question.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceTrigger {
    /// The latest turn completed with tool items that did not complete while the executor
    /// was disconnected (lifecycle-cases.md row 20).
    MidTurnDisconnect,
    /// An application reported that an input submission timed out (row 21,
    /// `sandboxctl report-timeout` or the `timeout_reported` job).
    InputTimedOut,
    /// A turn is in progress with no executor at all (row 19).
    TurnWithoutExecutor,
    /// Starts keep failing (row 28).
    StartFailing,
    /// Executors keep stopping before their environment is ever seen `connected`: no
    /// more starts until an owner fixes the executor key or the image and resolves it
    /// ([`crate::record::StartFailureKind::NeverConnected`]).
    ExecutorNeverConnects,
    /// Evidence stayed missing past one retry (row 22).
    Uncertain,
    /// More than one compute, or a record the provider contradicts (rows 11, 13, 27).
    Divergent,
    /// The executor was stopped at the hard lifetime cap while a turn ran (or
    /// with the turn unread): the turn may have been cut short, an owner checks it.
    LifetimeHardCap,
}

impl EvidenceTrigger {
    /// The name used in JSON and text output (`mid_turn_disconnect`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MidTurnDisconnect => "mid_turn_disconnect",
            Self::InputTimedOut => "input_timed_out",
            Self::TurnWithoutExecutor => "turn_without_executor",
            Self::StartFailing => "start_failing",
            Self::ExecutorNeverConnects => "executor_never_connects",
            Self::Uncertain => "uncertain",
            Self::Divergent => "divergent",
            Self::LifetimeHardCap => "lifetime_hard_cap",
        }
    }
}

/// The turn layer: did the harness reach a terminal state?
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnLayer {
    /// Turn id.
    pub id: String,
    /// Turn status as read.
    pub status: TurnStatus,
    /// The turn's `error` (set only on a failed turn), as a compact string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The tool layer: one tool item of the turn that is not `completed`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolLayer {
    /// Item id.
    pub id: String,
    /// Item type, e.g. `command_execution`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its status (`failed`, `incomplete`, `in_progress`, ...).
    pub status: ItemStatus,
}

/// The workspace layer: where the files are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceLayer {
    /// The generation current when the evidence was observed (0: none started).
    pub generation: Generation,
    /// The compute that holds the files ("live in task X"), if one runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_in: Option<InstanceRef>,
    /// A snapshot of the files, once workspaces persist: with one, the
    /// files are safe and the compute is not held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

impl fmt::Display for WorkspaceLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.snapshot, &self.live_in) {
            (Some(s), _) => write!(f, "snapshot {s} (generation {})", self.generation),
            (None, Some(i)) => write!(
                f,
                "live in task {} (generation {})",
                i.instance_id, i.generation
            ),
            (None, None) => write!(f, "no live compute (generation {})", self.generation),
        }
    }
}

/// The business-effect layer: does the authoritative system show the intended change once?
/// Only an owner can say; `unknown` until resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectState {
    /// Not reconciled yet.
    Unknown,
    /// The owner saw the intended change applied once.
    Observed,
    /// The owner undid or compensated a partial effect.
    Compensated,
    /// Nothing had to be reconciled.
    NotNeeded,
    /// The owner gave the work up.
    Abandoned,
}

impl EffectState {
    /// The name used in JSON, flags and text (`unknown`, `not_needed`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Observed => "observed",
            Self::Compensated => "compensated",
            Self::NotNeeded => "not_needed",
            Self::Abandoned => "abandoned",
        }
    }

    /// Parses an owner's answer (`observed`, `compensated`, `not_needed`, `abandoned`).
    ///
    /// # Errors
    /// Any other text, `unknown` included (a resolution must say what the owner found),
    /// with a message naming the accepted values.
    pub fn parse_resolution(s: &str) -> Result<Self, String> {
        match s {
            "observed" => Ok(Self::Observed),
            "compensated" => Ok(Self::Compensated),
            "not_needed" => Ok(Self::NotNeeded),
            "abandoned" => Ok(Self::Abandoned),
            other => Err(format!(
                "--effect must be one of observed, compensated, not_needed, abandoned (got {other:?})"
            )),
        }
    }
}

/// What became of a timed-out submission, as the worker read it (row 21). Never a reason
/// to resubmit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubmissionOutcome {
    /// Its turn is queued, in progress or waiting: the original may still run.
    StillRunning,
    /// Its turn completed (the tool layer says whether every tool did).
    Completed,
    /// Its turn failed or was cancelled (the turn's `error` is kept).
    Failed,
    /// No turn matches: the submission never started.
    NotFound,
}

impl SubmissionOutcome {
    /// The outcome a turn's status means (`None`: no matching turn).
    pub fn of(turn: Option<TurnStatus>) -> Self {
        match turn {
            None => Self::NotFound,
            Some(TurnStatus::Completed) => Self::Completed,
            Some(TurnStatus::Failed | TurnStatus::Cancelled) => Self::Failed,
            Some(_) => Self::StillRunning,
        }
    }

    /// The name used in JSON and text (`still_running`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StillRunning => "still_running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::NotFound => "not_found",
        }
    }
}

/// An owner's answer to the open questions of one environment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolution {
    /// What the owner found about the business effect (never `unknown`).
    pub effect: EffectState,
    /// Who resolved it (the operator's user, as `sandboxctl` read it).
    pub by: String,
    /// When the resolution was requested, Unix seconds.
    pub at: u64,
    /// A free-text note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One question held for an owner, with the four layers of evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// What raised it.
    pub trigger: EvidenceTrigger,
    /// The decision's reason, as printed.
    pub reason: String,
    /// The turn layer, when a turn was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<TurnLayer>,
    /// The tool layer: the turn's tool items that are not `completed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolLayer>,
    /// The workspace layer.
    pub workspace: WorkspaceLayer,
    /// The business-effect layer: `unknown` until resolved.
    pub effect: EffectState,
    /// For a reported timed-out submission: what became of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submission: Option<SubmissionOutcome>,
    /// When the controller observed it, Unix seconds.
    pub observed_at: u64,
    /// The owner's resolution, once given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<Resolution>,
}

impl Evidence {
    /// Whether the question is still open (no owner resolved it).
    pub fn is_open(&self) -> bool {
        self.resolution.is_none()
    }

    /// Whether this open question holds the compute that has the files: a tool did not
    /// complete (its effect, and the files it touched, are in question) and no snapshot
    /// keeps the files safe. The idle lease does not stop a held compute.
    pub fn holds_files(&self) -> bool {
        self.is_open()
            && self.workspace.snapshot.is_none()
            && self.tools.iter().any(|t| t.status != ItemStatus::Completed)
    }

    /// Whether `other` records the same question (same trigger and turn, same submission
    /// outcome): appended once.
    /// A question without a turn (start failures, missing evidence, a divergence) is one
    /// open question per trigger, whatever its latest reason: a sweep re-deciding it, or
    /// the attempt count growing, writes nothing new.
    fn same_question(&self, other: &Evidence) -> bool {
        self.trigger == other.trigger
            && self.turn.as_ref().map(|t| &t.id) == other.turn.as_ref().map(|t| &t.id)
            && self.submission == other.submission
            && (self.turn.is_some() || self.is_open() || self.reason == other.reason)
    }
}

/// A snapshot of generation `generation`'s files was taken (after its compute was read
/// back stopped): every open entry observed on that generation without a snapshot now
/// names it, so the owner finds the files there, and the entry no longer holds compute
/// ([`Evidence::holds_files`]). Returns whether `list` changed.
pub fn attach_snapshot(list: &mut [Evidence], generation: Generation, snapshot_id: &str) -> bool {
    let mut changed = false;
    for e in list.iter_mut().filter(|e| {
        e.is_open() && e.workspace.generation == generation && e.workspace.snapshot.is_none()
    }) {
        e.workspace.snapshot = Some(snapshot_id.to_owned());
        changed = true;
    }
    changed
}

/// Whether an open entry names `snapshot_id`: the owner still needs it, so retention
/// does not delete it.
pub fn names_snapshot(list: &[Evidence], snapshot_id: &str) -> bool {
    list.iter()
        .any(|e| e.is_open() && e.workspace.snapshot.as_deref() == Some(snapshot_id))
}

/// Appends `entry` to `list` unless the same question is already recorded; keeps at most
/// [`MAX_EVIDENCE`] entries, dropping the oldest resolved entry first, then the oldest open
/// one that holds no files; an entry that holds the files is never dropped. Returns whether
/// `list` changed.
pub fn append(list: &mut Vec<Evidence>, entry: Evidence) -> bool {
    if let Some(known) = list.iter_mut().find(|e| e.same_question(&entry)) {
        // An application asking again about a timed-out submission gets a fresh answer
        // time; other questions are recorded once (a sweep re-deciding writes nothing).
        if entry.trigger == EvidenceTrigger::InputTimedOut && known.observed_at < entry.observed_at
        {
            known.observed_at = entry.observed_at;
            return true;
        }
        return false;
    }
    list.push(entry);
    while list.len() > MAX_EVIDENCE {
        let drop = list
            .iter()
            .position(|e| !e.is_open())
            .or_else(|| list.iter().position(|e| !e.holds_files()));
        match drop {
            Some(i) => {
                list.remove(i);
            }
            None => break,
        }
    }
    true
}

/// Closes every open entry of `list` with `resolution`; returns how many it closed.
pub fn resolve(list: &mut [Evidence], resolution: &Resolution) -> usize {
    let mut n = 0;
    for e in list.iter_mut().filter(|e| e.is_open()) {
        e.effect = resolution.effect;
        e.resolution = Some(resolution.clone());
        n += 1;
    }
    n
}

/// The connection state as last observed (the seed's mapping record): the environment
/// status and since when the controller has read it so.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionObservation {
    /// `agent.environment.status` as read.
    pub status: EnvironmentStatus,
    /// When it was first read with this status, Unix seconds (rewritten only on a change,
    /// so a steady state costs no write).
    pub since: u64,
    /// When the controller last read it, Unix seconds (written with other changes only).
    pub read_at: u64,
}
