//! Session end: a deleted or failed session releases its compute (step 6 of
//! [`super::decide`]).
//!
//! Lifecycle rows decided here (`shared/reference/lifecycle-cases.md`):
//! - row 5: the session answers 404 and no compute runs: ignore, the record marked closed;
//! - row 6: the session is deleted and its compute still runs: release;
//! - row 7: `agent.session.failed` and the session is still failed: release;
//! - row 8: `agent.session.failed` but the session is no longer failed: a stale event;
//! - row 26, deleted part: a compute whose session is deleted is released;
//! - a session status this build does not know is uncertain, never idle.

use super::View;
use crate::observed::Trigger;
use crate::outcome::{Decision, Effect, Outcome, StopReason};
use crate::reason::Reason;
use crate::record::RecordStatus;
use crate::session::{Session, SessionStatus};

impl View<'_> {
    /// Rows 7 and 8, and a status this build does not know, for a session that exists.
    pub(super) fn session_end(&self, session: &Session) -> Option<Decision> {
        if session.status == SessionStatus::Failed {
            return Some(self.failed());
        }
        if self.o.trigger == Trigger::Failed {
            return Some(Decision::ignore(Reason::StaleFailedEvent));
        }
        if session.status == SessionStatus::Unknown {
            return Some(
                Decision::new(Outcome::Uncertain, Reason::UnknownSessionStatus)
                    .recheck(self.o.policy.uncertain_retry_secs),
            );
        }
        None
    }

    /// Rows 5 and 6 (and 26 for a deleted session).
    pub(super) fn deleted(&self) -> Decision {
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
}
