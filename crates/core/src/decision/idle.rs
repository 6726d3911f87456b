//! Idle and leases: no connection is required right now, so the trigger's own question is
//! answered (step 10 of [`super::decide`]).
//!
//! Lifecycle rows decided here (`shared/reference/lifecycle-cases.md`):
//! - row 4: the connection requirement is resolved already: ignore;
//! - row 14: idle, nothing pending: schedule-stop, a shutdown lease with a grace period;
//! - row 15: the lease is due, the session still idle, no turn active, same generation:
//!   stop that exact instance and generation;
//! - row 16 (turn part) and row 17: new work while a lease is pending: cancel-stop;
//! - row 18: the lease names an older generation than the current one: drop it;
//! - row 19: a turn runs with no executor at all: reconcile, report, do not guess;
//! - row 20: the latest turn completed with broken tool items while disconnected:
//!   reconcile with the evidence, never resubmit;
//! - row 27: a sweep finds the record claiming a compute the provider does not run and
//!   the session needs nothing: mark stopped, start nothing.
//!
//! An open reconciliation that holds the files keeps the compute against the idle lease
//! ([`super::held`]).

use super::View;
use crate::compute::ComputeInstance;
use crate::environment::EnvironmentStatus;
use crate::observed::Trigger;
use crate::outcome::{Decision, Effect, Outcome, StopReason, StopSpec};
use crate::reason::Reason;
use crate::record::{Record, ShutdownLease};
use crate::session::{Session, SessionStatus};
use crate::turn::TurnStatus;

impl View<'_> {
    /// Rows 4, 14, 15, 17, 18, 19, 20, 27: no connection is required right now (a noted
    /// connection request is cleared).
    pub(super) fn without_connection_need(
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
            // Handled before: Close (cleanup), Failed (stale), TimeoutReported, Other*.
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
            // One turn read before the stop (a queued turn cancels it, above).
            Some(c) if c.as_ref() == due.target && !self.o.turns_read => self.turns_not_read(),
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
