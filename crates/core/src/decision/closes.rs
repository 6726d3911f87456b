//! Records and closes: what a closed record, an operator's close, an operator's reset of
//! the failed starts and an owner's resolution decide (step 5 of [`super::decide`]).
//!
//! Lifecycle rows decided here (`shared/reference/lifecycle-cases.md`):
//! - row 25: an operator closes a session: reject new work, wait out a start in flight,
//!   delete the session and stop the compute (two receipts), resuming on every look
//!   until both are done;
//! - row 26, closed part: a compute of a closed record is released; a closed record
//!   starts nothing again;
//! - row 28, operator part: `sandboxctl reset-start-failures` forgets the failed starts;
//! - `sandboxctl resolve` closes the open evidence held for an owner;
//! - a close with open evidence waits for that resolution before it deletes
//!   the session (seed 001: reconcile effects, then delete).

use super::View;
use crate::observed::Trigger;
use crate::outcome::{Decision, Effect, Outcome, StopReason};
use crate::reason::Reason;
use crate::record::RecordStatus;

impl View<'_> {
    /// Rows 25 and 26 (closed session): closed records start nothing; an operator close
    /// deletes the session and stops the compute, resuming on every look.
    pub(super) fn closed_or_closing(&self) -> Option<Decision> {
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
        // Seed 001 orders "reconcile mutable effects" before "delete the
        // session". While the record holds open evidence the close refuses new work
        // (`cleanup_required`) and waits for an owner's resolution: nothing is deleted or
        // stopped. The resolution itself is taken here (its recheck resumes the close);
        // `sandboxctl close --force` resolves first, `abandoned`, recorded as forced.
        if let Some(open) = record.map(|r| r.open_evidence().count()).filter(|n| *n > 0) {
            if let Trigger::Resolve { resolution } = &self.o.trigger {
                return Some(self.resolve(resolution).with(effects));
            }
            // A live compute the record does not name (a start whose job died before its
            // release, found by the next holder) is recorded meanwhile, so the close stops
            // it once resolved and nothing runs unrecorded (a soak, seed
            // 8112458876245773263).
            let current = record.and_then(|r| r.current());
            let adopt = (!self.active.iter().any(|i| Some(&i.as_ref()) == current))
                .then(|| self.active.iter().max_by_key(|i| i.generation))
                .flatten()
                .map(|i| Effect::AdoptCompute(i.as_ref()));
            return Some(
                Decision::new(Outcome::Reconcile, Reason::CloseAwaitsResolution { open })
                    .with(effects)
                    .with(adopt),
            );
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

    /// An operator's reset of the failed starts (row 28) or an owner's resolution of the
    /// open evidence, when the trigger is one.
    pub(super) fn operator_request(&self) -> Option<Decision> {
        if self.o.trigger == Trigger::ResetStartFailures {
            return Some(match self.record.and_then(|r| r.start_failure.as_ref()) {
                Some(_) => Decision::new(Outcome::Ignore, Reason::StartFailuresReset)
                    .with([Effect::ClearStartFailure])
                    .recheck(1),
                None => Decision::ignore(Reason::Converged),
            });
        }
        if let Trigger::Resolve { resolution } = &self.o.trigger {
            return Some(self.resolve(resolution));
        }
        None
    }

    /// `sandboxctl resolve`: close the open evidence, then look again (an idle stop
    /// follows the usual grace).
    fn resolve(&self, resolution: &crate::evidence::Resolution) -> Decision {
        let closed = self.record.map_or(0, |r| r.open_evidence().count());
        if closed == 0 {
            return Decision::ignore(Reason::Converged);
        }
        // An executor that never connected was held on its failed starts: the owner fixed
        // the key or the image, so the count is forgotten and the next look starts again.
        let never_connected = self.record.is_some_and(|r| {
            r.open_evidence()
                .any(|e| e.trigger == crate::evidence::EvidenceTrigger::ExecutorNeverConnects)
                && r.start_failure.is_some()
        });
        Decision::new(Outcome::Ignore, Reason::ReconciliationResolved { closed })
            .with([Effect::ResolveReconciliation(resolution.clone())])
            .with(never_connected.then_some(Effect::ClearStartFailure))
            .recheck(1)
    }
}
