//! Duplicates and adoption: the provider and the record are made to agree on at most one
//! compute before anything else is decided (step 7 of [`super::decide`]).
//!
//! Lifecycle rows decided here (`shared/reference/lifecycle-cases.md`):
//! - row 12: an active compute the record does not name (a worker crashed between
//!   `RunTask` and the record write) is adopted;
//! - row 13: more than one active compute for one environment: divergent, keep one, stop
//!   the rest — never a running one while a turn may run; the connected one when the
//!   environment reads connected, else the newest generation;
//! - row 26, orphan part: on a sweep, a compute tagged by this deployment with no record
//!   and a session that needs nothing is released as an orphan.
//!
//! After a fix the rest of the decision is taken on the state the fix produces
//! (`View::after_adopting` decides again), so applying the whole decision leaves nothing
//! further to do.

use super::{View, decide};
use crate::compute::{ComputeInstance, ComputeStatus, InstanceRef};
use crate::ids::SessionId;
use crate::observed::{Inventory, Trigger};
use crate::outcome::{Decision, Effect, Outcome, StopReason, StopSpec};
use crate::reason::Reason;
use crate::record::{Record, RecordStatus};
use crate::session::{Session, SessionStatus};

impl View<'_> {
    /// Rows 12, 13 and 26: make the provider and the record agree on at most one compute.
    /// The rest of the decision is taken on the state these fixes produce, so that applying
    /// the whole decision leaves nothing further to do.
    pub(super) fn divergent_or_unrecorded(&self, session: &Session) -> Option<Decision> {
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
}
