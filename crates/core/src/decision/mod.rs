//! The decision: one pure function from an [`Observed`] state to a [`Decision`].
//!
//! This module is the whole lifecycle policy. Every row of
//! `shared/reference/lifecycle-cases.md` is decided here, in the order the checks appear
//! in [`decide`], one concern per file:
//!
//! 1. triggers that are not compute's business are ignored (row 3, unknown events)
//!    — `triggers.rs`;
//! 2. missing evidence changes nothing (row 22), and a timed-out submission is only
//!    reconciled from turn evidence, never retried blind (row 21) — `triggers.rs`;
//! 3. sessions that are not self-hosted are ignored (row 23); the ownership filter gates
//!    new starts only: a session it rejects is ignored unless this deployment already has
//!    a record or a compute for it, which it still releases (row 24) — `triggers.rs`;
//! 4. a recorded compute the provider does not show yet (ECS `MISSING` right after
//!    `RunTask`) counts as starting for `Policy::visibility_window_secs` after it was
//!    recorded, gone afterwards (docs/ARCHITECTURE.md principle 7: absence proves nothing)
//!    — `triggers.rs`;
//! 5. closed records and operator cleanups (row 25, part of 26); an operator reset of the
//!    failed starts and an owner's resolution of held evidence — `closes.rs`;
//! 6. deleted and failed sessions release their compute (rows 5, 6, 7, 8); a session
//!    status this build does not know is uncertain, never idle — `session_end.rs`;
//! 7. more than one active compute is fixed to exactly one (row 13: never stopping a
//!    running one while a turn may run; the connected one when the environment reads
//!    connected, else the newest), and an active compute the record does not name is
//!    adopted (row 12) or, on a sweep with no record at all, released as an orphan
//!    (row 26) — `duplicates.rs`;
//! 8. the cost and safety ceilings: a `remote_url` off the allowlist gets no
//!    compute; past the maximum lifetime, or with no work for the no-work period, the
//!    executor is stopped; in 9 the replacement cap bounds replacements for a missed
//!    connect deadline, and the deployment's executor cap turns a start into a wait
//!    ([`at_capacity`]) — `ceilings.rs`;
//! 9. a current `environment_connection` requirement ensures one compute: start, wait,
//!    reuse or replace — replace only on evidence that the executor is not connected, its
//!    deadline counted from the request it answers — with start-failure backoff, a
//!    `TaskFailedToStart` stop counted as a failed start, and attempts resumed after a
//!    cooldown (rows 1, 2, 9, 10, 11, 16, 28) — `connection.rs`; a start restores only a
//!    `completed` snapshot: it waits while the latest is `pending` (`snapshot_pending`,
//!    up to `Policy::snapshot_wait_secs`), and a snapshot pending too long, in `error` or
//!    gone is a failed start — `snapshots.rs`; with
//!    `Policy::provision_on = created`, a self-hosted session's `agent.session.created`
//!    starts its first executor before any input — `created.rs`;
//! 10. otherwise the trigger's own question: resolved actions (row 4), turns without an
//!     executor (row 19), idle shutdown leases (rows 14, 15, 17, 18, 20), sweeps (row 27)
//!     — `idle.rs`; an open reconciliation holds the compute with the files against the
//!     idle lease, and [`evidence_for`] derives what a decision records for an
//!     owner — `held.rs`.
//!
//! A decision lists its side effects in the order they must be applied; the controller
//! applies them under the effect-key lock and stops at the first that fails, so a later
//! effect (e.g. `MarkClosed`) is only applied once the earlier ones (the stops it depends
//! on) are confirmed. Applying a decision's effects and deciding again on the resulting
//! state yields no further effect (property-tested).
//!
//! The types a decision returns live below this module, in [`crate::outcome`] and
//! [`crate::reason`] (re-exported here), so that they never import the decision.

mod ceilings;
mod closes;
pub mod connect_clock;
mod connection;
mod created;
mod duplicates;
mod held;
mod idle;
mod session_end;
mod snapshots;
mod triggers;

pub use crate::outcome::{Decision, Effect, Outcome, StartSpec, StopReason, StopSpec};
pub use crate::reason::Reason;
pub use ceilings::{at_capacity, starts_compute};
pub use held::{TurnDetail, evidence_for};

use crate::compute::ComputeInstance;
use crate::ids::{Generation, InstanceId};
use crate::observed::{Observed, Trigger};
use crate::record::{Record, ShutdownLease};
use crate::session::Session;

/// Decides what to do about one environment's compute, from its observed state alone.
///
/// Pure and total: no I/O, no clock (uses `observed.now`, Unix seconds), never panics.
/// The checks run in the order of the module documentation; the first that settles the
/// question returns.
pub fn decide(o: &Observed) -> Decision {
    // 1, 2: triggers and evidence (rows 3, 21, 22).
    if let Some(d) = triggers::not_about_compute(o) {
        return d;
    }
    let instances = match triggers::evidence_read(o) {
        Ok(instances) => instances,
        Err(d) => return d,
    };
    if let Some(d) = triggers::timed_out_submission(o) {
        return d;
    }
    // 3, 4: whose session it is (rows 23, 24); what runs, the recorded compute not visible
    // yet counted as starting (principle 7).
    let unseen = triggers::not_visible_yet(o, instances);
    let v = match View::of(o, instances, unseen.as_ref()) {
        Ok(v) => v,
        Err(d) => return d,
    };
    // 5: closed records, operator closes, resets and resolutions (rows 25, 26).
    if let Some(d) = v.closed_or_closing().or_else(|| v.operator_request()) {
        return d;
    }
    // 6: the session ended (rows 5, 6, 7, 8) or reads a status this build does not know.
    let Some(session) = v.session else {
        return v.deleted();
    };
    if let Some(d) = v.session_end(session) {
        return d;
    }
    // 7: duplicates and adoption (rows 12, 13, 26).
    if let Some(d) = v.divergent_or_unrecorded(session) {
        return d;
    }
    // 8: the cost and safety ceilings.
    let current = v.active.first().copied();
    if let Some(d) = v.ceilings(session, current) {
        return d;
    }
    // 9: a required connection (rows 1, 2, 9, 10, 11, 16, 28).
    if session.requires_connection_of(&o.environment_id) && !matches!(o.trigger, Trigger::Close) {
        return v
            .ensure_compute(session, current)
            .with(v.drop_no_work_lease());
    }
    // 9, opt-in: the first executor on `agent.session.created` — `created.rs`.
    if let Some(d) = v.provision_on_creation(session, current) {
        return d;
    }
    // 10: idle, leases and the trigger's own question (rows 4, 14, 15, 17-20, 27).
    v.without_connection_need(session, current)
}

/// The observation, pre-digested: this environment's active instances and the like.
/// Built by [`View::of`] (`triggers.rs`); every check group adds its methods to it.
struct View<'a> {
    o: &'a Observed,
    /// `None` when deleted.
    session: Option<&'a Session>,
    record: Option<&'a Record>,
    /// Active instances, the not-yet-visible recorded one included.
    active: Vec<&'a ComputeInstance>,
    /// The recorded instance that is not visible yet, if any (it is in `active`).
    unseen: Option<&'a InstanceId>,
    /// The instance the record names, as the provider read it (any status).
    recorded_seen: Option<&'a ComputeInstance>,
    /// `false` when the ownership filter rejects the session: nothing new starts.
    may_start: bool,
    stopping: bool,
    max_generation: Generation,
}

/// Helpers every check group uses.
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

    /// An idle stop without a turn read is not taken; the stop is decided again
    /// on a fresh read (`uncertain`, retried).
    fn turns_not_read(&self) -> Decision {
        Decision::new(Outcome::Uncertain, Reason::TurnsNotRead)
            .recheck(self.o.policy.uncertain_retry_secs)
    }

    /// Whether the latest turn evidence shows a turn running.
    fn turn_active(&self) -> bool {
        self.o
            .latest_turn
            .as_ref()
            .is_some_and(|t| t.status.is_active())
    }
}
