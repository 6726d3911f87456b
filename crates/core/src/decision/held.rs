//! Held for an owner: hold, don't guess. An open reconciliation whose tool did
//! not complete holds the compute with the files against the idle lease, and every
//! `reconcile`, `divergent` (and repeated `uncertain`) decision records its evidence for
//! an owner.
//!
//! Lifecycle rows this serves (`shared/reference/lifecycle-cases.md`):
//! - row 20: the mid-turn disconnect's evidence (turn, tool, workspace, business effect);
//!   while open, the idle lease does not stop the compute that has the files;
//! - row 21: a timed-out submission's answer ([`crate::evidence::SubmissionOutcome`]);
//! - rows 19, 28, 11, 13, 27 and 22 (past one retry): the question held for an owner;
//! - the owner's resolution (`sandboxctl resolve`) is decided in [`super::closes`].
//!
//! [`evidence_for`] is pure; the controller appends its entry to the record with
//! [`crate::evidence::append`].

use super::View;
use crate::compute::ComputeInstance;
use crate::evidence::{
    EffectState, Evidence, EvidenceTrigger, MAX_TOOLS, SubmissionOutcome, ToolLayer, TurnLayer,
    WorkspaceLayer,
};
use crate::observed::Observed;
use crate::outcome::{Decision, Outcome};
use crate::reason::Reason;
use crate::record::Record;
use serde::{Deserialize, Serialize};

impl View<'_> {
    /// Whether the record already holds evidence (open or resolved) about `turn_id`: a
    /// resolved question is not asked again for the same turn.
    pub(super) fn evidence_names_turn(&self, turn_id: &str) -> bool {
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
    pub(super) fn held(&self, current: Option<&ComputeInstance>) -> Option<Decision> {
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
}

/// What the controller read about the turn a decision concerns, beyond
/// [`crate::observed::TurnEvidence`]: the turn's error and every tool item that is not
/// completed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnDetail {
    /// The turn's `error`, compact.
    pub error: Option<String>,
    /// Tool items that are not `completed` (at most [`MAX_TOOLS`]).
    pub tools: Vec<ToolLayer>,
}

/// The evidence entry a decision calls for, if any: every `reconcile` and `divergent`
/// decision, an `uncertain` one only when `retried` (held past one retry), and every
/// answered timed-out submission. Pure; `detail` is what the worker read of the turn.
pub fn evidence_for(
    o: &Observed,
    d: &Decision,
    detail: Option<&TurnDetail>,
    retried: bool,
) -> Option<Evidence> {
    let trigger = match (&d.outcome, &d.reason) {
        (_, Reason::MidTurnDisconnect { .. }) => EvidenceTrigger::MidTurnDisconnect,
        (_, Reason::SubmissionFound { .. } | Reason::SubmissionNotFound) => {
            EvidenceTrigger::InputTimedOut
        }
        (_, Reason::TurnWithoutExecutor) => EvidenceTrigger::TurnWithoutExecutor,
        (_, Reason::StartFailing { .. }) => EvidenceTrigger::StartFailing,
        (_, Reason::ExecutorNeverConnects { .. }) => EvidenceTrigger::ExecutorNeverConnects,
        // Holding is the consequence of evidence already recorded, not a new question.
        (_, Reason::HeldForOwner { .. } | Reason::CloseAwaitsResolution { .. }) => return None,
        // A hard-cap stop with a turn running (or unread) is never silent.
        (Outcome::Reconcile, Reason::LifetimeHardCap { .. }) => EvidenceTrigger::LifetimeHardCap,
        (Outcome::Reconcile, _) => EvidenceTrigger::Divergent,
        (Outcome::Divergent, _) => EvidenceTrigger::Divergent,
        (Outcome::Uncertain, _) if retried => EvidenceTrigger::Uncertain,
        _ => return None,
    };
    let turn_read = o.latest_turn.as_ref().filter(|_| {
        matches!(
            trigger,
            EvidenceTrigger::MidTurnDisconnect
                | EvidenceTrigger::InputTimedOut
                | EvidenceTrigger::LifetimeHardCap
        )
    });
    let turn = turn_read.map(|t| TurnLayer {
        id: t.turn_id.clone(),
        status: t.status,
        error: detail.and_then(|x| x.error.clone()),
    });
    let tools = match (turn_read, detail) {
        (Some(_), Some(x)) => x.tools.iter().take(MAX_TOOLS).cloned().collect(),
        (Some(t), None) => t
            .broken_tools
            .iter()
            .take(MAX_TOOLS)
            .map(|(id, kind, status)| ToolLayer {
                id: id.clone(),
                kind: kind.clone(),
                status: *status,
            })
            .collect(),
        _ => vec![],
    };
    let submission = (trigger == EvidenceTrigger::InputTimedOut)
        .then(|| SubmissionOutcome::of(turn_read.map(|t| t.status)));
    Some(Evidence {
        trigger,
        reason: d.reason.to_string(),
        turn,
        tools,
        workspace: workspace_of(o),
        effect: EffectState::Unknown,
        submission,
        observed_at: o.now,
        resolution: None,
    })
}

/// The workspace layer as observed: the record's generation and the compute it names when
/// the record claims one runs ("live in task X"); the snapshot is named later, when that
/// generation's files are saved ([`crate::evidence::attach_snapshot`]).
fn workspace_of(o: &Observed) -> WorkspaceLayer {
    let record = o.record.as_ref();
    WorkspaceLayer {
        generation: record.map(|r| r.generation).unwrap_or_default(),
        live_in: record
            .filter(|r| r.claims_compute())
            .and_then(Record::current)
            .cloned(),
        snapshot: None,
    }
}
