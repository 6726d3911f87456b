//! The record one decision changes ([`Act`]): its record-only effects, and the mapping
//! kept current before the effects.

use super::{Controller, Held, SlotTaken};
use crate::job::Job;
use crate::ports::{Compute, Fence, Queue, Registry};
use sandbox_agents_api::SessionsApi;
use sandbox_core::compute::ComputeStatus;
use sandbox_core::decision::{Decision, Effect, TurnDetail, evidence_for};
use sandbox_core::evidence::ConnectionObservation;
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::{Inventory, Observed, SessionView};
use sandbox_core::record::Record;

/// The record being changed by one decision, and what was applied.
pub(super) struct Act {
    /// The decision's time, Unix seconds.
    pub(super) now: u64,
    /// The lock every write carries.
    pub(super) fence: Fence,
    /// Starts and stops are not sent after this, Unix seconds.
    pub(super) not_after: u64,
    /// The record as last read or written (its version is the write condition).
    pub(super) record: Option<Record>,
    /// The record with the changes so far.
    pub(super) fresh: Record,
    pub(super) dirty: bool,
    /// `false` once a start's outcome is unknown: the lock is left expired on release.
    pub(super) clean: bool,
    pub(super) applied: Vec<Effect>,
    pub(super) error: Option<String>,
    /// A failure of an independent effect (session delete): keep going, never finalize.
    pub(super) deferred_error: Option<String>,
    /// Retry the message after this many seconds instead of the default.
    pub(super) retry_after: Option<u64>,
    /// The executor slot this decision took or found
    /// ([`sandbox_core::observed::Policy::max_executors`]).
    pub(super) slot: SlotTaken,
    /// The provider answered a start without an instance.
    pub(super) start_failed: bool,
    /// The snapshot state this decision read ([`Observed::snapshot`]): a start whose
    /// restore it does not show `completed` reads the state again first
    /// (docs/ARCHITECTURE.md principle 8).
    pub(super) restorable: sandbox_core::workspace::SnapshotRead,
    /// Whether a start may claim a new warm pool member: not after an unclean predecessor
    /// (the lock was `recovered`), whose start with the same token may have been cold
    /// (docs/WARM_POOL.md, [`crate::pool::REPLAY_ONLY`]).
    pub(super) new_claims: bool,
}

impl Act {
    /// The record a decision under the lock `held` changes, as the lock read it (a new
    /// record for the session when there is none), with the executor slot `slot` the
    /// decision took; `now` is the decision's time, Unix seconds. After an unclean
    /// predecessor (the lock was `recovered`) a start claims no new pool member.
    pub(super) fn new(
        job: &Job,
        held: Held,
        observed: &Observed,
        slot: SlotTaken,
        now: u64,
    ) -> Self {
        let Held {
            locked,
            fence,
            not_after,
        } = held;
        let record = locked.record;
        let session_id = session_of(job, observed);
        Act {
            now,
            fence,
            not_after,
            record: record.clone(),
            fresh: record
                .unwrap_or_else(|| Record::new(observed.environment_id.clone(), session_id)),
            dirty: false,
            clean: true,
            applied: vec![],
            error: None,
            deferred_error: None,
            retry_after: None,
            slot,
            start_failed: false,
            restorable: observed.snapshot.clone(),
            new_claims: !locked.recovered,
        }
    }

    /// Applies a record-only effect to `fresh`.
    pub(super) fn change(&mut self, effect: &Effect) {
        let r = &mut self.fresh;
        match effect {
            Effect::AdoptCompute(i) => {
                r.generation = r.generation.max(i.generation);
                if r.instance.as_ref() != Some(i) {
                    r.instance_connected_at = None;
                    r.instance_from_pool = false;
                }
                r.instance = Some(i.clone());
                r.instance_recorded_at = Some(self.now);
                r.status = sandbox_core::record::RecordStatus::Active;
                // The failed starts are forgotten once this instance is seen connected
                // (`keep_mapping`), not on its start: an executor that never connects
                // counts toward the same cap (`StartFailureKind::NeverConnected`).
            }
            Effect::RecordStartFailure(f) => {
                r.start_failure = Some(f.clone());
                r.instance = None;
                r.instance_recorded_at = None;
                r.instance_connected_at = None;
                r.instance_from_pool = false;
            }
            Effect::ClearStartFailure => r.start_failure = None,
            Effect::NoteConnectionRequest { at } => r.connection_requested_at = Some(*at),
            Effect::ClearConnectionRequest => r.connection_requested_at = None,
            Effect::PutLease(l) => r.lease = Some(l.clone()),
            Effect::DropLease => r.lease = None,
            Effect::MarkStopped => {
                r.status = sandbox_core::record::RecordStatus::Stopped;
                r.lease = None;
                r.connection_requested_at = None;
                r.no_work_lease = None;
            }
            Effect::MarkClosed => {
                r.status = sandbox_core::record::RecordStatus::Closed;
                r.cleanup_required = false;
                r.lease = None;
                r.connection_requested_at = None;
                r.no_work_lease = None;
            }
            Effect::PutNoWorkLease(l) => r.no_work_lease = Some(l.clone()),
            Effect::DropNoWorkLease => r.no_work_lease = None,
            Effect::RecordReplacements { recent } => r.replacements = recent.clone(),
            Effect::RequireCleanup => r.cleanup_required = true,
            Effect::ResolveReconciliation(res) => {
                sandbox_core::evidence::resolve(&mut r.evidence, res);
            }
            Effect::StartCompute(_) | Effect::StopCompute(_) | Effect::DeleteSession { .. } => {
                return;
            }
        }
        self.dirty = true;
    }
}

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// The seed's mapping record, kept current under the lock before the effects: the
    /// evidence a `reconcile`, `divergent` or repeated `uncertain` decision calls for
    /// ([`evidence_for`]), the connection state when it was read and changed, and the
    /// last event this environment was reconciled on. Only an existing, unclosed record
    /// is written: evidence alone never creates one.
    pub(super) fn keep_mapping(
        &self,
        job: &Job,
        observed: &Observed,
        decision: &Decision,
        detail: Option<&TurnDetail>,
        act: &mut Act,
    ) {
        let Some(record) = act.record.as_ref() else {
            return;
        };
        if record.status == sandbox_core::record::RecordStatus::Closed {
            return;
        }
        if let Some(e) = evidence_for(observed, decision, detail, job.handoffs > 0) {
            tracing::warn!(
                environment_id = %observed.environment_id, trigger = e.trigger.as_str(),
                turn_id = e.turn.as_ref().map(|t| t.id.as_str()).unwrap_or(""),
                tools = e.tools.len(), workspace = %e.workspace,
                "held for an owner with evidence"
            );
            act.dirty |= sandbox_core::evidence::append(&mut act.fresh.evidence, e);
        }
        if let Some(at) = first_connected(observed, &act.fresh) {
            act.fresh.instance_connected_at = Some(observed.now);
            act.fresh.start_failure = None;
            act.dirty = true;
            crate::metrics::executor_connected(
                observed.now.saturating_sub(at),
                act.fresh.instance_from_pool,
            );
        }
        if let Some(status) = observed.environment_status.status() {
            let changed = act.fresh.connection.is_none_or(|c| c.status != status);
            if changed {
                act.fresh.connection = Some(ConnectionObservation {
                    status,
                    since: observed.now,
                    read_at: observed.now,
                });
                act.dirty = true;
            } else if act.dirty
                && let Some(c) = act.fresh.connection.as_mut()
            {
                c.read_at = observed.now;
            }
        }
        if let Some(id) = &job.webhook_id
            && act.fresh.last_reconciled_event_id.as_deref() != Some(id.as_str())
        {
            act.fresh.last_reconciled_event_id = Some(id.clone());
            act.dirty = true;
        }
    }
}

/// When the record began naming its instance, if this observation is the first to see that
/// instance's executor connected: the status reads `connected`, the record has not seen it
/// connected yet, and the instance is the only active compute and running (with two
/// computes, the environment's status does not say which one connected). Unix seconds.
pub(super) fn first_connected(observed: &Observed, record: &Record) -> Option<u64> {
    if !observed.environment_status.is_connected() || record.instance_connected_at.is_some() {
        return None;
    }
    let current = record.current()?;
    let Inventory::Known { instances } = &observed.inventory else {
        return None;
    };
    let mut active = instances.iter().filter(|i| i.status.is_active());
    match (active.next(), active.next()) {
        (Some(only), None)
            if only.status == ComputeStatus::Running && &only.as_ref() == current =>
        {
            record.instance_recorded_at
        }
        _ => None,
    }
}

/// The environment whose workspace a stop or save concerns (the record's).
pub(super) fn stop_environment(act: &Act) -> EnvironmentId {
    act.fresh.environment_id.clone()
}

/// The session a decision under the lock is about: the session read, else the record's,
/// else the job's.
pub(super) fn session_of(job: &Job, observed: &Observed) -> SessionId {
    match &observed.session {
        SessionView::Found { session } => session.id.clone(),
        _ => observed
            .record
            .as_ref()
            .map(|r| r.session_id.clone())
            .unwrap_or_else(|| job.session_id.clone()),
    }
}
