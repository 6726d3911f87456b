//! The cost and safety ceilings: executor lifetime, no work for too long, the
//! replacement cap, the `remote_url` allowlist and the deployment's executor cap (step 8
//! of [`super::decide`], and the replacement cap inside step 9). Each is checked on every
//! look at the environment (webhook jobs, lease timers, and at least every sweep).
//!
//! Lifecycle rows these bound (`shared/reference/lifecycle-cases.md`):
//! - rows 1 and 11: no compute starts for a `remote_url` off the allowlist, and a live one
//!   for a refused URL stops (`remote_url_not_allowed`);
//! - rows 14 and 15: past the maximum lifetime an idle session's executor stops at once
//!   (past the hard cap even mid-turn); a session that never goes idle but does no work
//!   takes a no-work lease;
//! - row 10: at most `Policy::max_replacements` replacements for a missed connect
//!   deadline within the window;
//! - rows 1, 10, 11: a start beyond the deployment's executor cap waits for a slot
//!   ([`at_capacity`], `capacity_limit`).

use super::View;
use crate::compute::{ComputeInstance, ComputeStatus};
use crate::observed::{Observed, Trigger};
use crate::outcome::{Decision, Effect, Outcome, StopReason, StopSpec};
use crate::reason::Reason;
use crate::record::{Record, ShutdownLease};
use crate::session::{Session, SessionStatus};

impl View<'_> {
    /// The no-work lease, if the record holds one.
    fn no_work_lease(&self) -> Option<&ShutdownLease> {
        self.record.and_then(|r| r.no_work_lease.as_ref())
    }

    pub(super) fn drop_no_work_lease(&self) -> Option<Effect> {
        self.no_work_lease().map(|_| Effect::DropNoWorkLease)
    }

    /// The ceilings that apply before the usual rules, in order: a stale no-work timer;
    /// the `remote_url` allowlist (a live compute for a refused URL stops; with none, a
    /// required connection is refused); the maximum lifetime and the no-work period (when
    /// no connection is required).
    pub(super) fn ceilings(
        &self,
        session: &Session,
        current: Option<&ComputeInstance>,
    ) -> Option<Decision> {
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
        // An open reconciliation holds the compute with the files: no-work is
        // not a reason to throw them away; the lifetime ceiling still applies.
        let held = self.record.and_then(Record::holding_evidence).is_some();
        self.lifetime(session, c)
            .or_else(|| (!held).then(|| self.no_work(session, c)).flatten())
    }

    /// Only an `https` `remote_url` on an allowed host reaches an
    /// executor; anything else is held for an owner, and no compute starts.
    pub(super) fn remote_url_refused(&self, session: &Session) -> Option<Decision> {
        let env = session.self_hosted()?;
        let refusal = self
            .o
            .policy
            .remote_url_allowlist
            .check(&env.remote_url)
            .err()?;
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

    /// Past the maximum lifetime an idle session's executor stops at
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
        let hard = p.lifetime_hard_cap_secs.max(p.max_lifetime_secs);
        let past_hard_cap = p.lifetime_hard_cap_secs > 0 && age_secs >= hard;
        // Past the hard cap the stop goes ahead, but a turn that runs (or that
        // was not read) makes it a reconciliation with evidence, never a silent cut.
        if past_hard_cap && (busy || !self.o.turns_read) {
            return Some(self.ceiling_stop(
                c,
                Outcome::Reconcile,
                Reason::LifetimeHardCap { age_secs },
                StopReason::LifetimeHardCap,
            ));
        }
        if busy {
            return None;
        }
        // An idle session's executor is stopped only on a turn read.
        if !self.o.turns_read {
            return Some(self.turns_not_read());
        }
        Some(self.ceiling_stop(
            c,
            Outcome::Stop,
            Reason::LifetimeExceeded { age_secs },
            StopReason::LifetimeExceeded,
        ))
    }

    /// No turn and no connection request for the no-work period, whatever
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
        // Work is a turn queued or running (the turn read before the stop); a
        // turn paused on a required action (`waiting`) is what no-work is for.
        let turn_working = self.o.latest_turn.as_ref().is_some_and(|t| {
            matches!(
                t.status,
                crate::turn::TurnStatus::Queued | crate::turn::TurnStatus::InProgress
            )
        });
        let working = session.status == SessionStatus::InProgress || turn_working;
        let no_work = !working && quiet_secs >= p.no_work_secs;
        match lease {
            Some(l) if l.target != c.as_ref() => Some(
                Decision::new(Outcome::CancelStop, Reason::LeaseSuperseded)
                    .with([Effect::DropNoWorkLease]),
            ),
            Some(_) if !no_work => Some(
                Decision::new(Outcome::CancelStop, Reason::NewWork).with([Effect::DropNoWorkLease]),
            ),
            // One turn read before the no-work stop (new work cancels it above).
            Some(l) if now >= l.due_at && !self.o.turns_read => Some(self.turns_not_read()),
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
    pub(super) fn record_replacement(&self) -> Effect {
        let mut recent = self.recent_replacements();
        recent.push(self.o.now);
        Effect::RecordReplacements { recent }
    }

    /// The cap's `reconcile`, rechecked when the oldest replacement leaves the window;
    /// `None` while under the cap (or with no cap).
    pub(super) fn replacement_cap_holds(&self) -> Option<Decision> {
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

    /// At the cap, the executor that missed its deadline is stopped and
    /// nothing replaces it until the window frees.
    pub(super) fn replacement_cap_at_replace(&self, c: &ComputeInstance) -> Option<Decision> {
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

// --- Concurrency cap per deployment. ---
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
/// is reached: `wait`, reason `capacity_limit`, no compute started or
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
