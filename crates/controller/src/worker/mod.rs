//! The worker: process one job. Observe, decide, act under the effect-key lock, record
//! before release, audit.
//!
//! Flow of [`Controller::process`]:
//! 1. a webhook job whose `webhook-id` is in the ledger is a duplicate: done, nothing
//!    written (one registry read);
//! 2. retrieve the session (404 = deleted; errors = unavailable evidence) and resolve the
//!    environment (event, session or record);
//! 3. a sweep job first decides on a lock-free, consistent read of its record (issue 22
//!    item 3; fanned-out ones, carrying the sweep's evidence): when that decision has no effect — no effect, no recheck, nothing for the
//!    record — the job is done with nothing written (no lock, no audit entry; the
//!    `sweep_no_effect` counter), see [`Controller::no_effect_without_lock`]; otherwise,
//!    and for every other job, take the lock on `agents-api:environment:{id}:compute` (a
//!    lease with an expiry), which reads the record in the same call, and decide again
//!    under it;
//! 4. read the compute the record names by its id — one `describe` (ECS `DescribeTasks`
//!    on the ARN), whatever the size of the deployment; none when the record names no
//!    active compute; none for a sweep job whose evidence is current
//!    ([`crate::job::SweptEvidence`]); after an unclean predecessor (the lock is
//!    `recovered`) also the environment's own live instances ([`Compute::find`]), so what
//!    it started but never recorded is adopted — and, when they matter, the environment
//!    status and the latest turn; then call [`sandbox_core::decide`]. The deployment is
//!    never listed per job (docs/ARCHITECTURE.md principle 7); a replayed start presents the same
//!    idempotency token (ECS answers `RunTask` with the same task for 24 h);
//! 5. apply the effects in order; every write under the lock is fenced ([`Fence`]); the
//!    record is written before any further side effect and before the lock is released;
//!    a stop is read back before its receipt;
//! 6. schedule a recheck if the decision asks for one, then one atomic release: record,
//!    audit entry, the webhook-id in the ledger, the lock deleted (or left expired when a
//!    start's outcome is unknown, so the next holder reads the inventory);
//! 7. say what to do with the message: done, or retry the same message later (missing
//!    evidence, a failed effect, a lost lock).
//!
//! Remote calls of a first start: ledger read, session read, lock (+ record), provider
//! start, release = 5; provider calls of any job: at most 2 on the happy path (a read by
//! id and a start, or a stop and its read-back), independent of the number of
//! environments (`crates/testkit/tests/call_budgets.rs`).

use crate::config::ControllerConfig;
use crate::crash_point::crash_point;
use crate::job::Job;
use crate::ports::{
    AuditEntry, Clock, Compute, Fence, Locked, Outgoing, PortError, Queue, Receipt, ReceiptKind,
    Registry, Release, Slot, SlotRelease, Started, StoredKind, Write,
};
use sandbox_agents_api::{ApiError, PageParams, SessionsApi};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::decision::{
    Decision, Effect, Outcome, Reason, StopReason, StopSpec, TurnDetail, decide, evidence_for,
};
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::evidence::{ConnectionObservation, ToolLayer};
use sandbox_core::ids::{EnvironmentId, InstanceId, SessionId};
use sandbox_core::observed::{
    EnvironmentRead, Inventory, Observed, SessionView, Trigger, TurnEvidence,
};
use sandbox_core::record::{Record, StartFailure};
use sandbox_core::workspace::{
    self, CloseWorkspace, SnapshotRead, SnapshotRef, SnapshotState, WorkspaceDisposition,
};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The controller over its ports.
pub struct Controller<Q, R, C, S> {
    /// The events queue (FIFO): webhook jobs.
    pub events: Q,
    /// The timers queue (standard, delayed): lease rechecks and other rechecks.
    pub timers: Q,
    /// The registry.
    pub registry: R,
    /// The compute provider.
    pub compute: C,
    /// The Agents API.
    pub sessions: S,
    /// The clock.
    pub clock: Arc<dyn Clock>,
    /// Settings.
    pub config: ControllerConfig,
    nonce: AtomicU64,
}

/// What to do with the message that carried the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Processed: delete the message.
    Done,
    /// Not processed (missing evidence, busy lock, failed effect): make the same message
    /// visible again after this many seconds.
    RetryAfter(u32),
}

/// The result of processing one job.
#[derive(Clone, Debug, PartialEq)]
pub struct Processed {
    /// The decision, when one was taken.
    pub decision: Option<Decision>,
    /// Effects applied, in order.
    pub applied: Vec<Effect>,
    /// The effect that failed, if any.
    pub error: Option<String>,
    /// What to do with the message.
    pub disposition: Disposition,
    /// Why nothing was decided (duplicate, busy lock, no environment).
    pub note: Option<&'static str>,
}

impl Processed {
    pub(crate) fn skipped(note: &'static str, disposition: Disposition) -> Self {
        Self {
            decision: None,
            applied: vec![],
            error: None,
            disposition,
            note: Some(note),
        }
    }

    /// The decision's outcome, if a decision was taken.
    pub fn outcome(&self) -> Option<Outcome> {
        self.decision.as_ref().map(|d| d.outcome)
    }
}

/// The session as an observation: 404 is deleted, any other error missing evidence.
pub(crate) fn session_view(
    result: Result<sandbox_core::session::Session, ApiError>,
) -> SessionView {
    match result {
        Ok(s) => SessionView::Found {
            session: Box::new(s),
        },
        Err(e) if e.is_not_found() => SessionView::Deleted,
        Err(e) => SessionView::Unavailable {
            cause: e
                .unavailable()
                .unwrap_or(sandbox_core::observed::Unavailable::ServerError),
        },
    }
}

/// Seconds before the lock's expiry after which no start or stop is sent (room for the
/// request itself and the release): an eighth of the lock's lease, at most this (15 s of
/// the default 120 s).
const EFFECT_MARGIN_SECS: u64 = 15;

fn capped_delay(secs: u64) -> u32 {
    secs.clamp(1, 900) as u32
}

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// A controller over its ports.
    pub fn new(
        events: Q,
        timers: Q,
        registry: R,
        compute: C,
        sessions: S,
        clock: Arc<dyn Clock>,
        config: ControllerConfig,
    ) -> Self {
        Self {
            events,
            timers,
            registry,
            compute,
            sessions,
            clock,
            config,
            nonce: AtomicU64::new(0),
        }
    }

    /// Processes one job. See the module docs for the flow.
    ///
    /// # Errors
    /// A [`PortError`] from the registry or queues that leaves the job unprocessed; the
    /// caller retries the message (nothing is lost).
    pub async fn process(&self, job: &Job) -> Result<Processed, PortError> {
        if let Some(refused) = self.refuse_unproven_operator_job(job).await? {
            return Ok(refused);
        }
        self.process_trusted(job).await
    }

    /// [`Controller::process`] without the operator gate
    /// ([`crate::operator_gate`]): for the in-process operator's own jobs
    /// ([`Controller::close`]), never for a queue's.
    ///
    /// # Errors
    /// As [`Controller::process`].
    pub(crate) async fn process_trusted(&self, job: &Job) -> Result<Processed, PortError> {
        let now = self.clock.now();
        if let Some(id) = &job.webhook_id
            && self.registry.seen_delivery(id, now).await?
        {
            tracing::debug!(webhook_id = %id, "duplicate delivery");
            return Ok(Processed::skipped("duplicate delivery", Disposition::Done));
        }
        let session = session_view(self.sessions.retrieve_session(&job.session_id).await);
        // A job names an environment its session does not have (a forged or corrupted
        // job: in local mode anything that can write the queue database can enqueue one;
        // issue 24): refused, so a job can never point one session's evidence at another
        // environment's compute.
        if let (Some(env), SessionView::Found { session }) = (&job.environment_id, &session)
            && let Some(own) = session.self_hosted()
            && own.id != *env
        {
            tracing::warn!(
                session_id = %job.session_id,
                job_environment_id = %env,
                session_environment_id = %own.id,
                "job refused: its environment is not its session's"
            );
            return Ok(Processed::skipped(
                "job environment does not match its session",
                Disposition::Done,
            ));
        }
        let env = match (&job.environment_id, &session) {
            (Some(env), _) => Some(env.clone()),
            (None, SessionView::Found { session }) => session.self_hosted().map(|e| e.id.clone()),
            (None, _) => None,
        };
        let env = match env {
            Some(env) => env,
            None => match (
                &session,
                self.registry.find_by_session(&job.session_id).await?,
            ) {
                (_, Some(record)) => record.environment_id,
                (SessionView::Unavailable { .. }, None) => {
                    let retry = capped_delay(self.config.policy.uncertain_retry_secs);
                    return Ok(Processed::skipped(
                        "session unavailable, environment unknown",
                        Disposition::RetryAfter(retry),
                    ));
                }
                (_, None) => {
                    self.remember(job, now).await?;
                    return Ok(Processed::skipped(
                        "no self-hosted environment and no record",
                        Disposition::Done,
                    ));
                }
            },
        };
        let prefetched = if job.trigger == Trigger::Sweep && job.swept.is_some() {
            match self
                .no_effect_without_lock(job, &env, &session, now)
                .await?
            {
                LockFree::Done(done) => return Ok(*done),
                LockFree::Act(read) => Some(read),
            }
        } else {
            None
        };
        let key = env.effect_key();
        let owner = format!(
            "{}#{}",
            self.config.worker_id,
            self.nonce.fetch_add(1, Ordering::Relaxed)
        );
        let locked = match self
            .registry
            .lock(&key, &owner, now + self.config.lock_ttl_secs, now)
            .await
        {
            Ok(locked) => locked,
            // Another transaction held the item this moment (issue 23 item 4): busy, a
            // short hand-off like a held lock, never a failed job.
            Err(e) if e.contended => {
                tracing::info!(effect_key = %key, error = %e, "effect key contended: handed off as busy");
                return Ok(Processed::skipped(
                    "effect key contended (transaction conflict)",
                    Disposition::RetryAfter(self.config.lock_busy_retry_secs),
                ));
            }
            Err(e) => return Err(e),
        };
        let Some(locked) = locked else {
            return Ok(Processed::skipped(
                "effect key locked by another worker",
                Disposition::RetryAfter(self.config.lock_busy_retry_secs),
            ));
        };
        crash_point("after-lock");
        // Every path of decide_and_act ends in one release; if this future is dropped
        // (crash, timeout) the lock expires on its own and the next holder recovers.
        // Starts and stops are not sent after this: the lease minus a margin for the
        // request's own transit and the release.
        let ttl = self.config.lock_ttl_secs;
        let not_after = now + ttl - (ttl / 8).min(EFFECT_MARGIN_SECS);
        let held = Held {
            locked,
            fence: Fence { key, owner },
            not_after,
        };
        self.decide_and_act(job, env, session, held, prefetched)
            .await
    }

    /// Issue 22 item 3: a fanned-out sweep job's decision on a lock-free, consistent read
    /// of its record ([`Registry::get`]), with the same inventory and evidence rules as
    /// under the lock. [`LockFree::Done`] (nothing written) only when acting on it would
    /// change nothing: no effect, no recheck, not `uncertain`, nothing the record would
    /// keep ([`Controller::keep_mapping`]), and — with the executor cap on — a compute
    /// live, so no slot to give back. Anything else is [`LockFree::Act`]: the caller takes
    /// the lock and decides again on what the lock reads, exactly as before (reusing this
    /// read's evidence when the lock read the same record version and no unclean holder),
    /// so the invariants (one compute per environment, the record written before the
    /// release) are the lock path's. Deciding without the lock is safe because a
    /// no-effect decision acts on nothing: whatever changed since the read is seen by the
    /// next trigger. Rechecks (sweep jobs without the sweep's evidence) take the lock
    /// directly.
    ///
    /// # Errors
    /// A [`PortError`] when the record cannot be read (the job is retried).
    async fn no_effect_without_lock(
        &self,
        job: &Job,
        env: &EnvironmentId,
        session: &SessionView,
        now: u64,
    ) -> Result<LockFree, PortError> {
        let locked = Locked {
            record: self.registry.get(&env.effect_key()).await?,
            recovered: false,
        };
        let inventory = self.inventory(job, env, &locked, now).await;
        let gathered = self
            .evidence(job, env, session, &inventory, locked.record.as_ref(), now)
            .await;
        let observed = self.observed(
            job,
            env,
            session.clone(),
            locked.record.clone(),
            inventory,
            &gathered,
            now,
        );
        let decision = decide(&observed);
        let read = |observed: Observed, gathered: Gathered| {
            LockFree::Act(Prefetched {
                record_version: observed.record.as_ref().map(|r| r.version),
                inventory: observed.inventory,
                gathered,
            })
        };
        if !decision.effects.is_empty()
            || decision.recheck_after_secs.is_some()
            || decision.outcome == Outcome::Uncertain
        {
            return Ok(read(observed, gathered));
        }
        if self.config.policy.max_executors > 0 {
            let live = matches!(&observed.inventory, Inventory::Known { instances }
                if instances.iter().any(|i| i.status.is_live()));
            if !live {
                return Ok(read(observed, gathered));
            }
        }
        let mut probe = Act {
            now,
            fence: Fence {
                key: env.effect_key(),
                owner: String::new(),
            },
            not_after: now,
            record: locked.record.clone(),
            fresh: locked
                .record
                .clone()
                .unwrap_or_else(|| Record::new(env.clone(), job.session_id.clone())),
            dirty: false,
            clean: true,
            applied: vec![],
            error: None,
            deferred_error: None,
            retry_after: None,
            slot: SlotTaken::NotNeeded,
            start_failed: false,
            restorable: observed.snapshot.clone(),
            new_claims: false,
        };
        self.keep_mapping(
            job,
            &observed,
            &decision,
            gathered.detail.as_ref(),
            &mut probe,
        );
        if probe.dirty {
            return Ok(read(observed, gathered));
        }
        tracing::debug!(environment_id = %env, outcome = %decision.outcome, reason = %decision.reason, "sweep job: no effect, decided without the lock");
        crate::metrics::sweep_no_effect();
        Ok(LockFree::Done(Box::new(Processed {
            decision: Some(decision),
            applied: vec![],
            error: None,
            disposition: Disposition::Done,
            note: Some("no effect: decided without the lock, nothing written"),
        })))
    }

    /// What the provider says about `env` for this decision (docs/ARCHITECTURE.md principle 7).
    ///
    /// - A sweep job whose evidence is current: the sweep's read, no call.
    /// - Otherwise the compute the record names as active (and its lease's target, which
    ///   is the same one unless the record is stale), read by its id (one call), plus, for
    ///   a sweep job whose evidence is stale, every instance that evidence saw (one
    ///   `describe_many`: ECS answers up to 100 ids per `DescribeTasks`).
    /// - Nothing to read (no active record, no evidence): known empty, no call.
    /// - The lock was `recovered` (the previous holder crashed or left a start's outcome
    ///   unknown): also the environment's live instances ([`Compute::find`]: ECS lists the
    ///   environment's own `startedBy`), so a task started but never recorded is adopted
    ///   (lifecycle-cases.md row 12), at a constant cost.
    ///
    /// A provider error is [`Inventory::Unavailable`]: the decision changes nothing.
    pub(crate) async fn inventory(
        &self,
        job: &Job,
        env: &EnvironmentId,
        locked: &Locked,
        now: u64,
    ) -> Inventory {
        let record = locked.record.as_ref();
        if let Some(evidence) = &job.swept
            && evidence.is_current(record, now, self.config.sweep_evidence_max_age_secs)
        {
            return Inventory::Known {
                instances: evidence.instances.clone(),
            };
        }
        let mut ids: Vec<InstanceId> = record
            .filter(|r| r.claims_compute())
            .and_then(|r| r.current())
            .into_iter()
            .chain(record.and_then(|r| r.lease.as_ref()).map(|l| &l.target))
            .map(|i| i.instance_id.clone())
            .collect();
        ids.dedup();
        for seen in job.swept.iter().flat_map(|e| &e.instances) {
            if !ids.contains(&seen.instance_id) {
                ids.push(seen.instance_id.clone());
            }
        }
        let read = match ids.as_slice() {
            [] => Ok(vec![]),
            [one] => self
                .compute
                .describe(one)
                .await
                .map(|i| i.into_iter().collect()),
            many => self.compute.describe_many(many).await,
        };
        // An unclean predecessor may have started a compute it never recorded: read this
        // environment's live instances (constant cost, never the deployment's list).
        let read = match read {
            Ok(mut instances) if locked.recovered => self
                .compute
                .find(&self.config.deployment, env)
                .await
                .map(|found| {
                    for i in found {
                        if !instances.iter().any(|k| k.instance_id == i.instance_id) {
                            instances.push(i);
                        }
                    }
                    instances
                }),
            other => other,
        };
        match read {
            Ok(instances) => Inventory::Known { instances },
            Err(e) => {
                tracing::warn!(effect_key = %env.effect_key(), error = %e, "compute read unavailable");
                Inventory::Unavailable
            }
        }
    }

    /// The state a decision reads: the job, the session, the record and the inventory as
    /// read, and the evidence gathered ([`Gathered`]). One constructor for the lock-free read
    /// and the read under the lock, so both decide from the same shape.
    #[allow(clippy::too_many_arguments)]
    fn observed(
        &self,
        job: &Job,
        env: &EnvironmentId,
        session: SessionView,
        record: Option<Record>,
        inventory: Inventory,
        gathered: &Gathered,
        now: u64,
    ) -> Observed {
        Observed {
            trigger: job.trigger.clone(),
            environment_id: env.clone(),
            session,
            environment_status: gathered.status,
            record,
            inventory,
            latest_turn: gathered.turn.clone(),
            filter: self.config.filter.clone(),
            policy: self.config.policy.clone(),
            now,
            turn_not_found: gathered.turn_not_found,
            turns_read: gathered.turns_read,
            snapshot: SnapshotRead::NotRead,
        }
    }

    /// [`decide`], and when the decision needs the state of the snapshot a start would
    /// restore ([`Reason::SnapshotNotRead`], issue 23) the state read through
    /// [`crate::ports::Workspaces::snapshot_state`] (one call) and `decide` again on it.
    /// A failed read is [`SnapshotRead::Unavailable`]: the decision is `uncertain`.
    pub(crate) async fn decide_with_snapshot(&self, observed: &mut Observed) -> Decision {
        let decision = decide(observed);
        let Reason::SnapshotNotRead { snapshot_id } = &decision.reason else {
            return decision;
        };
        observed.snapshot = match self
            .compute
            .snapshot_state(&self.config.deployment, snapshot_id)
            .await
        {
            Ok(state) => SnapshotRead::Read {
                snapshot_id: snapshot_id.clone(),
                state,
            },
            Err(e) => {
                tracing::warn!(%snapshot_id, error = %e, "snapshot state unavailable");
                SnapshotRead::Unavailable {
                    snapshot_id: snapshot_id.clone(),
                }
            }
        };
        decide(observed)
    }

    async fn decide_and_act(
        &self,
        job: &Job,
        env: EnvironmentId,
        session: SessionView,
        held: Held,
        prefetched: Option<Prefetched>,
    ) -> Result<Processed, PortError> {
        let Held {
            locked,
            fence,
            not_after,
        } = held;
        let now = self.clock.now();
        // A sweep job's lock-free read (issue 22) is reused when the lock read the same
        // record and no unclean holder came before: the same evidence, read once.
        let reuse = prefetched.filter(|p| {
            !locked.recovered && p.record_version == locked.record.as_ref().map(|r| r.version)
        });
        let (inventory, gathered) = match reuse {
            Some(p) => (p.inventory, p.gathered),
            None => {
                let inventory = self.inventory(job, &env, &locked, now).await;
                let gathered = self
                    .evidence(job, &env, &session, &inventory, locked.record.as_ref(), now)
                    .await;
                (inventory, gathered)
            }
        };
        if locked.recovered {
            tracing::info!(effect_key = %env.effect_key(), "lock recovered from an unclean holder: the environment's live instances were read");
        }
        let record = locked.record;
        let mut observed = self.observed(
            job,
            &env,
            session,
            record.clone(),
            inventory,
            &gathered,
            now,
        );
        let decision = self.decide_with_snapshot(&mut observed).await;
        // Issue 13 item 3: a start takes an executor slot first (one conditional write);
        // at the cap the start becomes a `capacity_limit` wait.
        let (decision, slot) = self.take_slot(decision, &observed, &fence).await;
        tracing::info!(
            session_id = %job.session_id, environment_id = %env, outcome = %decision.outcome,
            reason = %decision.reason, effects = decision.effects.len(), "decided"
        );
        let session_id = match &observed.session {
            SessionView::Found { session } => session.id.clone(),
            _ => record
                .as_ref()
                .map(|r| r.session_id.clone())
                .unwrap_or_else(|| job.session_id.clone()),
        };
        let mut act = Act {
            now,
            fence,
            not_after,
            record: record.clone(),
            fresh: record.unwrap_or_else(|| Record::new(env.clone(), session_id.clone())),
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
        };
        self.keep_mapping(
            job,
            &observed,
            &decision,
            gathered.detail.as_ref(),
            &mut act,
        );
        self.apply(&decision, &mut act, now).await;
        self.give_back_slot(job, &observed, &mut act).await;
        crate::metrics::decision_applied(job, &observed, &decision, &act.applied, self.clock.now());
        let mut error = act.error.clone().or(act.deferred_error.clone());

        let mut disposition = if let Some(secs) = act.retry_after {
            Disposition::RetryAfter(capped_delay(secs))
        } else if error.is_some() {
            Disposition::RetryAfter(capped_delay(self.config.policy.recheck_secs))
        } else if decision.outcome == Outcome::Uncertain {
            Disposition::RetryAfter(capped_delay(
                decision
                    .recheck_after_secs
                    .unwrap_or(self.config.policy.uncertain_retry_secs),
            ))
        } else {
            Disposition::Done
        };
        // The recheck is sent before the release that remembers the delivery: if the send
        // fails the job is retried (not yet a duplicate) and the recheck sent then.
        let mut send_error = None;
        if disposition == Disposition::Done
            && let Some(secs) = decision.recheck_after_secs
            && let Err(e) = self
                .schedule_recheck(job, &env, &session_id, &decision, now, secs)
                .await
        {
            send_error = Some(e);
        }
        let remember = match (&job.webhook_id, disposition, &send_error) {
            (Some(id), Disposition::Done, None) => {
                Some((id.as_str(), now + self.config.ledger_ttl_secs))
            }
            _ => None,
        };
        let entry = audit_entry(job, &observed, &decision, &act, error.clone());
        let release = Release {
            record: act
                .dirty
                .then(|| (&act.fresh, act.record.as_ref().map(|r| r.version))),
            audit: Some(&entry),
            delivery: remember,
            clean: act.clean,
        };
        let released = self
            .registry
            .release(&act.fence, self.clock.now(), release)
            .await;
        match released {
            Ok(true) => {}
            Ok(false) => {
                // The lock was lost (paused past its lease) or the record changed: nothing
                // of this decision was written. The next holder decides again.
                let lost = "lock lost or record changed before the release: nothing written";
                tracing::warn!(effect_key = %act.fence.key, "{lost}");
                error = Some(lost.into());
                disposition =
                    Disposition::RetryAfter(capped_delay(self.config.policy.recheck_secs));
                let entry = audit_entry(job, &observed, &decision, &act, error.clone());
                if let Err(e) = self.registry.audit(&entry).await {
                    tracing::warn!(error = %e, "audit write failed");
                }
            }
            // The lock expires on its own; the message is retried.
            Err(e) => return Err(e),
        }
        if let Some(e) = send_error {
            return Err(e);
        }
        Ok(Processed {
            decision: Some(decision),
            applied: act.applied,
            error,
            disposition,
            note: None,
        })
    }

    /// Issue 13 item 3, the concurrency cap per deployment
    /// ([`sandbox_core::observed::Policy::max_executors`]): a decision that starts a compute
    /// first takes an executor slot for the environment with one conditional write
    /// ([`Registry::acquire_slot`]; the environment's own slot is reused, so a replacement
    /// or a restart never waits). At the cap the decision becomes
    /// [`sandbox_core::decision::at_capacity`]'s `wait` (reason `capacity_limit`, looked
    /// at again with backoff through the timers queue, metric `capacity_waits`); when the
    /// slot cannot be checked the start effect fails instead (retried, nothing started).
    async fn take_slot(
        &self,
        decision: Decision,
        observed: &Observed,
        fence: &Fence,
    ) -> (Decision, SlotTaken) {
        let cap = self.config.policy.max_executors;
        if cap == 0 || !sandbox_core::decision::starts_compute(&decision) {
            return (decision, SlotTaken::NotNeeded);
        }
        match self
            .registry
            .acquire_slot(fence, self.clock.now(), cap)
            .await
        {
            Ok(Slot::Acquired) => (decision, SlotTaken::Taken(true)),
            Ok(Slot::Held) => (decision, SlotTaken::Taken(false)),
            Ok(Slot::Full) => {
                let waiting = sandbox_core::decision::at_capacity(&decision, observed);
                tracing::info!(
                    environment_id = %observed.environment_id, cap,
                    reason = %waiting.reason,
                    retry_after_secs = waiting.recheck_after_secs.unwrap_or_default(),
                    "executor cap reached: the start waits for a slot"
                );
                (waiting, SlotTaken::Full)
            }
            Ok(Slot::LockLost) => (
                decision,
                SlotTaken::Refused("executor slot not taken: lock lost".into()),
            ),
            Err(e) if e.contended => {
                tracing::info!(environment_id = %observed.environment_id, error = %e, "executor slot contended: busy, nothing started");
                (decision, SlotTaken::Contended)
            }
            Err(e) => {
                tracing::warn!(environment_id = %observed.environment_id, error = %e, "executor slot unavailable: nothing started");
                (
                    decision,
                    SlotTaken::Refused(format!("executor slot not taken: {e}")),
                )
            }
        }
    }

    /// Gives the environment's executor slot back once it has no compute, under the lock
    /// before the release (issue 13 item 3): asked only when the cap is on and this
    /// decision could have ended the environment's compute or its claim to one — it took a
    /// slot, stopped a compute (read back `STOPPED`), marked the record stopped or closed,
    /// had a start fail — or on a sweep (which repairs slots left by crashes). The slot is
    /// kept while a compute may live: one started now, an active one not stopped now, the
    /// record's current compute unless it was read or made `STOPPED`, and any start whose
    /// outcome is unknown. A failed release is logged; the sweep retries it.
    async fn give_back_slot(&self, job: &Job, observed: &Observed, act: &mut Act) {
        if self.config.policy.max_executors == 0 || act.slot == SlotTaken::Full {
            return;
        }
        let touched = act.slot == SlotTaken::Taken(true)
            || act.start_failed
            || job.trigger == Trigger::Sweep
            || act.applied.iter().any(|e| {
                matches!(
                    e,
                    Effect::StopCompute(_)
                        | Effect::MarkStopped
                        | Effect::MarkClosed
                        | Effect::RecordStartFailure(_)
                )
            });
        if !touched || !act.clean {
            return;
        }
        let stopped_now: Vec<&InstanceId> = act
            .applied
            .iter()
            .filter_map(|e| match e {
                Effect::StopCompute(s) => Some(&s.target.instance_id),
                _ => None,
            })
            .collect();
        if act
            .applied
            .iter()
            .any(|e| matches!(e, Effect::StartCompute(_)))
        {
            return;
        }
        let Inventory::Known { instances } = &observed.inventory else {
            return;
        };
        let live = instances
            .iter()
            .any(|i| i.status.is_live() && !stopped_now.contains(&&i.instance_id));
        let recorded_live = act.fresh.claims_compute()
            && act.fresh.current().is_some_and(|c| {
                !stopped_now.contains(&&c.instance_id)
                    && !instances
                        .iter()
                        .any(|i| i.instance_id == c.instance_id && !i.status.is_live())
            });
        if live || recorded_live {
            return;
        }
        match self
            .registry
            .release_slot(&act.fence, self.clock.now())
            .await
        {
            Ok(SlotRelease::Released) => {
                tracing::info!(environment_id = %observed.environment_id, "executor slot given back");
            }
            Ok(SlotRelease::NotHeld) => {}
            Ok(SlotRelease::LockLost) => {
                tracing::warn!(environment_id = %observed.environment_id, "executor slot not given back: lock lost (the sweep retries)");
            }
            Err(e) => {
                tracing::warn!(environment_id = %observed.environment_id, error = %e, "executor slot not given back (the sweep retries)");
            }
        }
    }

    /// The environment status and the turn evidence, fetched only when they can change the
    /// decision: the status when a running compute might be connected (reuse vs replace,
    /// which of several computes to keep) or after idle (mid-turn disconnect evidence, row
    /// 20); the latest turn and its items for row 20 and a timed-out submission (row 21,
    /// the reported submission's turn); the latest turn alone (one turns read, no items)
    /// before every stop of an idle session — a due lease, on its timer or a sweep — so a
    /// queued or running turn cancels the stop (issue 15). A failed status read is
    /// [`EnvironmentRead::Unavailable`]: missing evidence, never "not connected"; a failed
    /// turns read is no evidence (never "no turn").
    pub(crate) async fn evidence(
        &self,
        job: &Job,
        env: &EnvironmentId,
        session: &SessionView,
        inventory: &Inventory,
        record: Option<&Record>,
        now: u64,
    ) -> Gathered {
        let SessionView::Found { session } = session else {
            return Gathered::default();
        };
        let (running, active) = match inventory {
            Inventory::Known { instances } => (
                instances.iter().any(|i| i.status == ComputeStatus::Running),
                instances.iter().filter(|i| i.status.is_active()).count(),
            ),
            Inventory::Unavailable => (false, 0),
        };
        // The connection request this record's instance was started for is no longer
        // required: read the status once to see the executor connected (the
        // `start_to_connected_seconds` metric; one read per instance, flat in the
        // deployment).
        let request_resolved = record.is_some_and(|r| {
            r.connection_requested_at.is_some()
                && r.instance.is_some()
                && r.instance_connected_at.is_none()
        }) && !session.requires_connection_of(env);
        let wants_status = running
            && (session.requires_connection_of(env)
                || job.trigger == Trigger::Idle
                || active > 1
                || request_resolved)
            || crate::connect_watch::watching(record, inventory);
        let status = if wants_status {
            match self.sessions.retrieve_environment(env).await {
                Ok(e) => EnvironmentRead::Read { status: e.status },
                Err(e) => {
                    tracing::warn!(environment_id = %env, error = %e, "environment status unavailable");
                    EnvironmentRead::Unavailable
                }
            }
        } else {
            EnvironmentRead::NotRead
        };
        let mut gathered = Gathered {
            status,
            ..Gathered::default()
        };
        if let Trigger::TimeoutReported {
            turn_id,
            submitted_at,
        } = &job.trigger
        {
            match self
                .submission_turn(&session.id, turn_id.as_deref(), *submitted_at)
                .await
            {
                Some(Some((turn, detail))) => {
                    gathered.turn = Some(turn);
                    gathered.detail = Some(detail);
                }
                Some(None) => gathered.turn_not_found = true,
                None => {}
            }
            return gathered;
        }
        let wants_items = job.trigger == Trigger::Idle
            && status.status() == Some(EnvironmentStatus::Disconnected);
        if wants_items {
            let latest = self.latest_turns(&session.id, 1).await;
            gathered.turns_read = latest.as_ref().is_some_and(Vec::is_empty);
            if let Some(turn) = latest.and_then(|p| p.into_iter().next())
                && let Some((t, detail)) = self.turn_with_items(&session.id, turn).await
            {
                gathered.turn = Some(t);
                gathered.detail = Some(detail);
                gathered.turns_read = true;
            }
        } else if self.may_stop(job, session, inventory, record, now)
            && let Some(turns) = self.latest_turns(&session.id, 1).await
        {
            // The status alone decides whether a stop is cancelled: no items read.
            gathered.turns_read = true;
            gathered.turn = turns.into_iter().next().map(|turn| TurnEvidence {
                turn_id: turn.id,
                status: turn.status,
                broken_tools: vec![],
            });
        }
        gathered
    }

    /// Whether this decision may stop an idle session's compute (issue 25: every such
    /// stop reads the latest turn first): a compute is active, and the idle lease is due
    /// (its timer fired, or a sweep found it due) while the session reads idle, or the
    /// maximum lifetime has passed for an active compute, or the no-work lease is due (its
    /// timer, or any look once due). Then one turns read (the latest turn) precedes the
    /// decision, so a queued or running turn keeps the executor.
    fn may_stop(
        &self,
        job: &Job,
        session: &sandbox_core::session::Session,
        inventory: &Inventory,
        record: Option<&Record>,
        now: u64,
    ) -> bool {
        let Inventory::Known { instances } = inventory else {
            return false;
        };
        let active: Vec<_> = instances.iter().filter(|i| i.status.is_active()).collect();
        if active.is_empty() {
            return false;
        }
        let idle =
            session.status == sandbox_core::session::SessionStatus::Idle && !session.is_busy();
        let lease_due = record
            .and_then(|r| r.lease.as_ref())
            .is_some_and(|l| now >= l.due_at);
        let idle_lease = match &job.trigger {
            Trigger::LeaseDue { lease } => now >= lease.due_at,
            Trigger::Sweep => lease_due,
            _ => false,
        };
        let max = self.config.policy.max_lifetime_secs;
        let lifetime = max > 0
            && active
                .iter()
                .any(|i| i.started_at.is_some_and(|s| now.saturating_sub(s) >= max));
        let no_work = matches!(job.trigger, Trigger::NoWorkLeaseDue { .. })
            || record
                .and_then(|r| r.no_work_lease.as_ref())
                .is_some_and(|l| now >= l.due_at);
        (idle && idle_lease) || lifetime || no_work
    }

    /// The session's latest `limit` turns (one call), newest first; `None` when the read
    /// failed.
    async fn latest_turns(
        &self,
        session: &SessionId,
        limit: u32,
    ) -> Option<Vec<sandbox_core::turn::Turn>> {
        match self
            .sessions
            .list_turns(session, &PageParams::latest(limit))
            .await
        {
            Ok(page) => Some(page.data),
            Err(e) => {
                tracing::warn!(session_id = %session, error = %e, "turns unavailable");
                None
            }
        }
    }

    /// The turn's evidence with its items (one items read, first page of up to 100).
    async fn turn_with_items(
        &self,
        session: &SessionId,
        turn: sandbox_core::turn::Turn,
    ) -> Option<(TurnEvidence, TurnDetail)> {
        let items = self
            .sessions
            .list_turn_items(session, &turn.id, &PageParams::latest(100))
            .await
            .map_err(|e| tracing::warn!(session_id = %session, turn_id = %turn.id, error = %e, "turn items unavailable"))
            .ok()?;
        let tools = items.data.iter().filter(|i| i.is_tool());
        let broken_tools = tools
            .clone()
            .filter_map(|i| {
                let status = i.status?;
                status
                    .is_broken()
                    .then(|| (i.id.clone().unwrap_or_default(), i.kind.clone(), status))
            })
            .collect();
        let detail = TurnDetail {
            error: turn.error.as_ref().map(|e| match e {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            }),
            tools: tools
                .filter_map(|i| {
                    let status = i.status?;
                    (status != sandbox_core::turn::ItemStatus::Completed).then(|| ToolLayer {
                        id: i.id.clone().unwrap_or_default(),
                        kind: i.kind.clone(),
                        status,
                    })
                })
                .collect(),
        };
        Some((
            TurnEvidence {
                turn_id: turn.id,
                status: turn.status,
                broken_tools,
            },
            detail,
        ))
    }

    /// A reported submission's turn (row 21): the turn with `turn_id`, else the first turn
    /// created at or after `submitted_at` (the submission creates the session's next turn),
    /// among the latest 100 turns (one turns read), with its items (one items read).
    /// `Some(None)`: read, no such turn (the submission never started); `None`: a read
    /// failed (missing evidence).
    async fn submission_turn(
        &self,
        session: &SessionId,
        turn_id: Option<&str>,
        submitted_at: u64,
    ) -> Option<Option<(TurnEvidence, TurnDetail)>> {
        let turns = self.latest_turns(session, 100).await?;
        let found = match turn_id {
            Some(id) => turns.into_iter().find(|t| t.id == id),
            None => turns
                .into_iter()
                .filter(|t| t.created_at >= 0 && t.created_at as u64 >= submitted_at)
                .min_by_key(|t| t.created_at),
        };
        match found {
            None => Some(None),
            Some(turn) => self.turn_with_items(session, turn).await.map(Some),
        }
    }

    /// The seed's mapping record, kept current under the lock before the effects: the
    /// evidence a `reconcile`, `divergent` or repeated `uncertain` decision calls for
    /// ([`evidence_for`]), the connection state when it was read and changed, and the
    /// last event this environment was reconciled on. Only an existing, unclosed record
    /// is written: evidence alone never creates one.
    fn keep_mapping(
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

    async fn apply(&self, decision: &Decision, act: &mut Act, now: u64) {
        for effect in &decision.effects {
            let finalizing = matches!(effect, Effect::MarkClosed | Effect::MarkStopped);
            if finalizing && act.deferred_error.is_some() {
                break;
            }
            let result = match effect {
                Effect::StartCompute(spec) => match self.start(spec, act, now).await {
                    // Deferred until the snapshot it restores completes: not applied.
                    Ok(false) => continue,
                    Ok(true) => Ok(()),
                    Err(e) => Err(e),
                },
                Effect::StopCompute(stop) => self.stop(stop, act).await,
                Effect::DeleteSession { session_id: id } => {
                    if let Err(e) = self.delete_session(id, act).await {
                        // Independent of the stop (two resources, two receipts): record
                        // the failure, still try the stop, never mark closed.
                        act.deferred_error = Some(e);
                        continue;
                    }
                    Ok(())
                }
                Effect::MarkClosed => match self.close_workspace(act).await {
                    Ok(()) => match self.write_terminal(act).await {
                        Ok(()) => {
                            act.change(effect);
                            Ok(())
                        }
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                },
                Effect::RecordStartFailure(f)
                    if f.kind == sandbox_core::record::StartFailureKind::NeverConnected =>
                {
                    // The generation ran: its files are saved, as any stopped
                    // generation's, before the record lets go of it (it may have worked
                    // in a connected window no look saw); the next start restores them.
                    let ran = act.fresh.current().map(|i| i.generation);
                    match ran {
                        Some(g) => self
                            .save_workspace(act, g)
                            .await
                            .map(|_| act.change(effect)),
                        None => {
                            act.change(effect);
                            Ok(())
                        }
                    }
                }
                record_only => {
                    act.change(record_only);
                    Ok(())
                }
            };
            match result {
                Ok(()) => act.applied.push(effect.clone()),
                Err(e) => {
                    act.error = Some(e);
                    break;
                }
            }
        }
        // What is still dirty is written by the release, atomically with the unlock.
    }

    /// Applies a start; `Ok(false)`: deferred (nothing sent) because the snapshot it would
    /// restore is not `completed` yet (issue 23), the job retried after
    /// [`sandbox_core::observed::Policy::snapshot_recheck_secs`].
    async fn start(
        &self,
        spec: &sandbox_core::decision::StartSpec,
        act: &mut Act,
        now: u64,
    ) -> Result<bool, String> {
        if let SlotTaken::Refused(why) = &act.slot {
            // The slot could not be checked (registry error, lost lock): never start
            // beyond what the cap allows; the message is retried.
            return Err(why.clone());
        }
        if act.slot == SlotTaken::Contended {
            // Busy, not failed: the same short delay as a held lock.
            act.retry_after = Some(u64::from(self.config.lock_busy_retry_secs));
            return Err("busy: executor slot counter contended, nothing started".into());
        }
        self.save_unsaved_workspace(act, spec.generation).await?;
        self.flush(act).await?;
        // The snapshot to restore: the decision's, or the newer one a stop earlier in this
        // decision (a replacement's) or the save above took.
        let mut spec = spec.clone();
        spec.restore = act.fresh.latest_snapshot().cloned();
        let spec = &spec;
        // Issue 23: a start restores only a `completed` snapshot. One this decision did
        // not read completed (a replacement's stop or the save above just took it) is
        // read now; not completed, nothing starts and the next decision waits for it.
        if let Some(r) = &spec.restore
            && act.restorable.state_of(&r.snapshot_id) != Ok(Some(SnapshotState::Completed))
        {
            let state = self
                .compute
                .snapshot_state(&self.config.deployment, &r.snapshot_id)
                .await
                .map_err(|e| {
                    format!(
                        "snapshot {} state unavailable, nothing started: {e}",
                        r.snapshot_id
                    )
                })?;
            if state != SnapshotState::Completed {
                tracing::info!(
                    environment_id = %spec.environment_id, snapshot_id = %r.snapshot_id, %state,
                    "start deferred: the snapshot it restores is not completed"
                );
                act.retry_after = Some(self.config.policy.snapshot_recheck_secs.max(1));
                return Ok(false);
            }
        }
        // Issue 27: a claim of a warm pool member first, when the pool is on.
        let started = crate::pool::start_or_claim(
            &self.compute,
            spec,
            &self.config.deployment,
            self.config.pool,
            self.clock.now(),
            act.not_after,
            crate::pool::UnderLock {
                fence: &act.fence,
                new_claims: act.new_claims,
            },
        )
        .await;
        let warm = matches!(started, Ok((_, crate::pool::StartPath::Warm)));
        match started.map(|(s, _)| s) {
            Ok(Started::Instance(instance)) => {
                act.fresh.restored_from = spec.restore.as_ref().map(|s| s.snapshot_id.clone());
                tracing::info!(
                    environment_id = %spec.environment_id, instance_id = %instance.instance_id,
                    generation = %spec.generation, "compute started"
                );
                crash_point("after-compute-start");
                act.change(&Effect::AdoptCompute(instance.as_ref()));
                act.fresh.instance_from_pool = warm;
                act.fresh.instance_recorded_at = Some(self.clock.now());
                act.fresh.generation = act.fresh.generation.max(spec.generation);
                // Recorded before anything else (docs/ARCHITECTURE.md principle 3): every later side
                // effect flushes first, and the release writes it with the lock's release.
                Ok(true)
            }
            Ok(Started::Failed { reason }) => {
                tracing::warn!(environment_id = %spec.environment_id, %reason, "compute start failed");
                crate::metrics::start_failed();
                let attempts = act
                    .fresh
                    .start_failure
                    .as_ref()
                    .map_or(1, |f| f.attempts + 1);
                act.fresh.generation = act.fresh.generation.max(spec.generation);
                act.fresh.start_failure = Some(StartFailure {
                    attempts,
                    last_failed_at: now,
                    reason: reason.clone(),
                    kind: sandbox_core::record::StartFailureKind::Start,
                });
                act.dirty = true;
                // Ack and recheck after the backoff: the next decision waits it out.
                act.retry_after = Some(self.config.policy.start_backoff_secs(attempts));
                act.start_failed = true;
                Err(format!("start failed: {reason}"))
            }
            Err(e) => {
                // The provider may have started it: the next holder must read the inventory.
                act.clean = false;
                Err(format!("start outcome unknown: {e}"))
            }
        }
    }

    async fn stop(&self, stop: &StopSpec, act: &mut Act) -> Result<(), String> {
        self.flush(act).await?;
        let reason = serde_json::to_value(stop.reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        // A compute no record names was seen by a list (the sweep's, maybe minutes ago):
        // read it again by id before stopping it (docs/ARCHITECTURE.md principle 7).
        if matches!(stop.reason, StopReason::Orphan | StopReason::Divergent) {
            let now = self
                .compute
                .describe(&stop.target.instance_id)
                .await
                .map_err(|e| format!("re-read before the stop failed: {e}"))?;
            if now.is_none_or(|i| !i.status.is_live()) {
                tracing::info!(instance_id = %stop.target.instance_id, %reason, "already stopped or gone: nothing to stop");
                return Ok(());
            }
        }
        self.compute
            .stop(&stop.target.instance_id, &reason, act.not_after)
            .await
            .map_err(|e| format!("stop failed: {e}"))?;
        // Read back until `STOPPED`, the pause doubling from `stop_readback_interval` (at
        // most 5 s apart: an ECS task takes its stopTimeout, 30 s by default, to stop).
        // `MISSING` confirms nothing (absence proves nothing): the next holder decides on
        // what it reads then, and the stop is retried, never assumed.
        let deadline = tokio::time::Instant::now() + self.config.stop_readback_timeout;
        let mut pause = self.config.stop_readback_interval;
        loop {
            let seen: Option<ComputeInstance> = self
                .compute
                .describe(&stop.target.instance_id)
                .await
                .map_err(|e| format!("stop read-back failed: {e}"))?;
            if seen.is_some_and(|i| i.status == ComputeStatus::Stopped) {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err("stop not confirmed before the read-back deadline".into());
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_secs(5));
        }
        tracing::info!(instance_id = %stop.target.instance_id, generation = %stop.target.generation, %reason, "compute stopped");
        let workspace = self.stopped_workspace(stop, act).await?;
        let receipt = Receipt {
            at: self.clock.now(),
            effect_key: act.fresh.environment_id.effect_key(),
            kind: ReceiptKind::ComputeStopped {
                instance_id: stop.target.instance_id.clone(),
                generation: stop.target.generation.0,
                reason,
                workspace,
            },
        };
        self.registry
            .receipt(&receipt)
            .await
            .map_err(|e| format!("receipt write failed: {e}"))
    }

    /// The workspace of a compute just read back `STOPPED` (docs/ARCHITECTURE.md principle 8):
    /// an orphan's or a divergent duplicate's is discarded (no record keeps it, or the
    /// kept compute's files are the live ones); a closed or deleted session's follows
    /// [`sandbox_core::observed::Policy::close_workspace`]; every other one is snapshotted,
    /// appended to the record's chain and the chain pruned to
    /// [`sandbox_core::observed::Policy::snapshot_keep`].
    async fn stopped_workspace(
        &self,
        stop: &StopSpec,
        act: &mut Act,
    ) -> Result<WorkspaceDisposition, String> {
        let env = stop_environment(act);
        let generation = stop.target.generation;
        let discard = match stop.reason {
            StopReason::Orphan | StopReason::Divergent => true,
            StopReason::Closed | StopReason::SessionDeleted => {
                self.config.policy.close_workspace == CloseWorkspace::Delete
            }
            _ => false,
        };
        if discard {
            return self
                .compute
                .discard_workspace(&self.config.deployment, &env, generation)
                .await
                .map_err(|e| format!("workspace discard failed: {e}"));
        }
        let saved = self.save_workspace(act, generation).await?;
        if let (StopReason::Closed | StopReason::SessionDeleted, CloseWorkspace::Retain { days }) =
            (stop.reason, self.config.policy.close_workspace)
        {
            let until = self.clock.now().saturating_add(u64::from(days) * 86_400);
            for s in &mut act.fresh.snapshots {
                s.expires_at = Some(until);
            }
            act.dirty = true;
        }
        Ok(saved)
    }

    /// Saves generation `generation`'s workspace, appends the snapshot to the record's
    /// chain (its parent: what that generation was restored from) and prunes the chain.
    /// The save returns at once (the snapshot may be `pending`); the working copy is
    /// deleted here only when the written record already names the snapshot and it is
    /// `completed` (issue 23), else by a later save or the sweeper.
    async fn save_workspace(
        &self,
        act: &mut Act,
        generation: sandbox_core::ids::Generation,
    ) -> Result<WorkspaceDisposition, String> {
        let env = stop_environment(act);
        let saved = self
            .compute
            .save_workspace(&self.config.deployment, &env, generation)
            .await
            .map_err(|e| format!("workspace snapshot failed (files kept): {e}"))?;
        let WorkspaceDisposition::Snapshot { snapshot_id } = &saved else {
            return Ok(saved);
        };
        // Issue 23: a working copy is deleted only once the record as written names its
        // snapshot (the version read under the lock or flushed since, never one only in
        // memory) and that snapshot is `completed`. A snapshot just taken is recorded by
        // this job's release; its working copy goes with a later save of the generation
        // or the sweeper, once the snapshot completed.
        let recorded = act
            .record
            .as_ref()
            .is_some_and(|r| r.snapshots.iter().any(|s| &s.snapshot_id == snapshot_id));
        if recorded {
            let completed = match self
                .compute
                .delete_working_copy(&self.config.deployment, &env, generation, snapshot_id)
                .await
            {
                Ok(deleted) => deleted,
                Err(e) => {
                    tracing::warn!(environment_id = %env, %generation, %snapshot_id, error = %e, "working copy not deleted; the sweeper retries");
                    false
                }
            };
            self.prune_snapshots(act, completed).await;
            return Ok(saved);
        }
        if !act
            .fresh
            .snapshots
            .iter()
            .any(|s| &s.snapshot_id == snapshot_id)
        {
            let parent = (act.fresh.current().map(|i| i.generation) == Some(generation))
                .then(|| act.fresh.restored_from.clone())
                .flatten();
            tracing::info!(environment_id = %env, %generation, %snapshot_id, "workspace snapshotted");
            act.fresh.snapshots.push(SnapshotRef {
                snapshot_id: snapshot_id.clone(),
                generation,
                taken_at: self.clock.now(),
                parent,
                expires_at: None,
            });
            // Open reconciliation evidence of this generation now points at its files.
            sandbox_core::evidence::attach_snapshot(
                &mut act.fresh.evidence,
                generation,
                snapshot_id,
            );
            act.dirty = true;
        }
        // Its state is not known yet (on EBS a new snapshot is `pending`): the prune reads
        // it if it would delete anything, and keeps one more while it is not completed.
        self.prune_snapshots(act, false).await;
        Ok(saved)
    }

    /// Deletes the snapshots beyond the last `snapshot_keep`, except those open
    /// reconciliation evidence names, and one more while the latest is not `completed`
    /// (`latest_completed`, else read when the chain is longer than `snapshot_keep`;
    /// [`workspace::prune`]); one whose delete fails stays
    /// in the chain (retried after the next snapshot; the sweeper reports it).
    async fn prune_snapshots(&self, act: &mut Act, mut latest_completed: bool) {
        let keep = usize::try_from(self.config.policy.snapshot_keep.max(1)).unwrap_or(usize::MAX);
        // Only when a prune could delete something: one read of the latest's state.
        if !latest_completed
            && act.fresh.snapshots.len() > keep
            && let Some(latest) = act.fresh.latest_snapshot()
        {
            latest_completed = matches!(
                self.compute
                    .snapshot_state(&self.config.deployment, &latest.snapshot_id)
                    .await,
                Ok(SnapshotState::Completed)
            );
        }
        let prunable = workspace::prune(
            &act.fresh.snapshots,
            self.config.policy.snapshot_keep,
            latest_completed,
        )
        .into_iter()
        // A snapshot open evidence names is kept until an owner resolves it.
        .filter(|s| !sandbox_core::evidence::names_snapshot(&act.fresh.evidence, &s.snapshot_id))
        .collect::<Vec<_>>();
        for old in prunable {
            match self
                .compute
                .delete_stored(
                    &self.config.deployment,
                    StoredKind::Snapshot,
                    &old.snapshot_id,
                )
                .await
            {
                Ok(()) => {
                    tracing::info!(snapshot_id = %old.snapshot_id, "old workspace snapshot deleted (retention)");
                    act.fresh
                        .snapshots
                        .retain(|s| s.snapshot_id != old.snapshot_id);
                    act.dirty = true;
                }
                Err(e) => {
                    tracing::warn!(snapshot_id = %old.snapshot_id, error = %e, "old workspace snapshot not deleted; kept in the chain");
                }
            }
        }
    }

    /// Before a start: the workspace of the generation the record last named, if it was
    /// never saved (it stopped behind the controller's back, lifecycle-cases.md rows 11
    /// and 27), is saved now, so the new generation restores it. `decide()` starts only
    /// when no compute of the environment is active.
    async fn save_unsaved_workspace(
        &self,
        act: &mut Act,
        next: sandbox_core::ids::Generation,
    ) -> Result<(), String> {
        let Some(last) = act.fresh.current().map(|i| i.generation) else {
            return Ok(());
        };
        let saved = act.fresh.latest_snapshot().map(|s| s.generation);
        if last >= next || saved.is_some_and(|g| g >= last) {
            return Ok(());
        }
        self.save_workspace(act, last).await.map(|_| ())
    }

    /// The close's workspace disposition, applied with `MarkClosed`
    /// ([`sandbox_core::observed::Policy::close_workspace`]): `delete` deletes the working
    /// copy and every snapshot; `retain` saves what is unsaved and keeps the snapshots
    /// until the expiry the sweeper enforces. One `WorkspaceClosed` receipt.
    async fn close_workspace(&self, act: &mut Act) -> Result<(), String> {
        let env = act.fresh.environment_id.clone();
        let dep = &self.config.deployment;
        let now = self.clock.now();
        let (workspace, retained_until) = match self.config.policy.close_workspace {
            CloseWorkspace::Delete => {
                if let Some(last) = act.fresh.current().map(|i| i.generation) {
                    self.compute
                        .discard_workspace(dep, &env, last)
                        .await
                        .map_err(|e| format!("workspace discard failed: {e}"))?;
                }
                for s in act.fresh.snapshots.clone() {
                    self.compute
                        .delete_stored(dep, StoredKind::Snapshot, &s.snapshot_id)
                        .await
                        .map_err(|e| format!("snapshot {} delete failed: {e}", s.snapshot_id))?;
                    act.fresh
                        .snapshots
                        .retain(|k| k.snapshot_id != s.snapshot_id);
                    act.dirty = true;
                }
                (WorkspaceDisposition::Deleted, None)
            }
            CloseWorkspace::Retain { days } => {
                if let Some(last) = act.fresh.current().map(|i| i.generation)
                    && act
                        .fresh
                        .latest_snapshot()
                        .is_none_or(|s| s.generation < last)
                {
                    self.save_workspace(act, last).await?;
                }
                let until = now.saturating_add(u64::from(days) * 86_400);
                for s in &mut act.fresh.snapshots {
                    if s.expires_at.is_none() {
                        s.expires_at = Some(until);
                    }
                }
                act.dirty = true;
                let workspace =
                    act.fresh
                        .latest_snapshot()
                        .map_or(WorkspaceDisposition::None, |s| {
                            WorkspaceDisposition::Snapshot {
                                snapshot_id: s.snapshot_id.clone(),
                            }
                        });
                let until = act
                    .fresh
                    .snapshots
                    .iter()
                    .filter_map(|s| s.expires_at)
                    .max();
                (workspace, until)
            }
        };
        let receipt = Receipt {
            at: now,
            effect_key: env.effect_key(),
            kind: ReceiptKind::WorkspaceClosed {
                workspace,
                snapshots: act
                    .fresh
                    .snapshots
                    .iter()
                    .map(|s| s.snapshot_id.clone())
                    .collect(),
                retained_until,
            },
        };
        self.registry
            .receipt(&receipt)
            .await
            .map_err(|e| format!("receipt write failed: {e}"))
    }

    /// The close's terminal record (issue 25), written once as its own item right before
    /// the record is marked closed, from the receipts the close confirmed (the
    /// `workspace_closed` one just written included): every closed record has one, and a
    /// close that resumes after a crash finds it stored and leaves it as it is. A failed
    /// write fails `MarkClosed` (the close is retried), so "closed" never lacks its record.
    async fn write_terminal(&self, act: &Act) -> Result<(), String> {
        let key = act.fresh.environment_id.effect_key();
        let receipts = self
            .registry
            .receipts(&key)
            .await
            .map_err(|e| format!("receipts read failed: {e}"))?;
        let terminal = crate::terminal::TerminalRecord::assemble(
            &act.fresh,
            &receipts,
            self.config.deployment.as_str(),
            &self.config.executor_key_location,
            self.clock.now(),
        );
        match self.registry.put_terminal(&terminal).await {
            Ok(true) => {
                tracing::info!(effect_key = %key, "terminal record written");
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => Err(format!("terminal record write failed: {e}")),
        }
    }

    async fn delete_session(&self, id: &SessionId, act: &Act) -> Result<(), String> {
        let key = format!("close-{id}");
        match self.sessions.delete_session(id, &key).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(format!("session delete outcome unknown: {e}")),
        }
        let receipt = Receipt {
            at: self.clock.now(),
            effect_key: act.fresh.environment_id.effect_key(),
            kind: ReceiptKind::SessionDeleted {
                session_id: id.clone(),
            },
        };
        self.registry
            .receipt(&receipt)
            .await
            .map_err(|e| format!("receipt write failed: {e}"))
    }

    /// Writes the record if changed, conditional on the version read under the lock and on
    /// the lock itself (fenced).
    async fn flush(&self, act: &mut Act) -> Result<(), String> {
        if !act.dirty {
            return Ok(());
        }
        let expected = act.record.as_ref().map(|r| r.version);
        let now = self.clock.now();
        match self
            .registry
            .put(&act.fence, now, &act.fresh, expected)
            .await
        {
            Ok(Write::Written(version)) => {
                act.fresh.version = version;
                act.record = Some(act.fresh.clone());
                act.dirty = false;
                Ok(())
            }
            Ok(Write::Conflict) => {
                Err("lock lost or record changed concurrently (fenced write refused)".into())
            }
            Err(e) => Err(format!("record write failed: {e}")),
        }
    }

    async fn schedule_recheck(
        &self,
        job: &Job,
        env: &EnvironmentId,
        session: &SessionId,
        decision: &Decision,
        now: u64,
        secs: u64,
    ) -> Result<(), PortError> {
        let leased = decision.effects.iter().find_map(|e| match e {
            Effect::PutLease(l) => Some(l.clone()),
            _ => None,
        });
        let no_work_leased = decision.effects.iter().find_map(|e| match e {
            Effect::PutNoWorkLease(l) => Some(l.clone()),
            _ => None,
        });
        let trigger = match (leased, no_work_leased, &job.trigger) {
            (Some(lease), _, _) => Trigger::LeaseDue { lease },
            (None, Some(lease), _) => Trigger::NoWorkLeaseDue { lease },
            (None, None, Trigger::LeaseDue { lease }) => Trigger::LeaseDue {
                lease: lease.clone(),
            },
            (None, None, Trigger::NoWorkLeaseDue { lease }) => Trigger::NoWorkLeaseDue {
                lease: lease.clone(),
            },
            _ => Trigger::Sweep,
        };
        // Standard queues delay at most 900 s; a longer wait re-enqueues when it fires.
        let delay = capped_delay(secs);
        let recheck = Job {
            handoffs: 0,
            swept: None,
            operator_proof: None,
            trigger,
            session_id: session.clone(),
            environment_id: Some(env.clone()),
            webhook_id: None,
            enqueued_at: now,
        };
        let dedup_id = format!("recheck:{}:{}", env.effect_key(), now + u64::from(delay));
        self.timers
            .send(Outgoing {
                group: recheck.group().to_owned(),
                job: recheck,
                dedup_id,
                delay_secs: delay,
            })
            .await
            .map(|_| ())
    }

    async fn remember(&self, job: &Job, now: u64) -> Result<(), PortError> {
        if let Some(id) = &job.webhook_id {
            self.registry
                .remember_delivery(id, now + self.config.ledger_ttl_secs)
                .await?;
        }
        Ok(())
    }
}

/// The audit entry of one decision.
fn audit_entry(
    job: &Job,
    observed: &Observed,
    decision: &Decision,
    act: &Act,
    error: Option<String>,
) -> AuditEntry {
    let session_status = match &observed.session {
        SessionView::Found { session } => json!(session.status),
        SessionView::Deleted => json!("deleted"),
        SessionView::Unavailable { cause } => json!({"unavailable": cause}),
    };
    let instances = match &observed.inventory {
        Inventory::Known { instances } => json!(instances
            .iter()
            .map(|i| json!({"instance_id": i.instance_id, "generation": i.generation, "status": i.status}))
            .collect::<Vec<_>>()),
        Inventory::Unavailable => json!("unavailable"),
    };
    AuditEntry {
        at: observed.now,
        effect_key: observed.environment_id.effect_key(),
        session_id: job.session_id.clone(),
        trigger: json!(job.trigger),
        observed: json!({
            "session": session_status,
            "record": observed.record,
            "instances": instances,
            "environment_status": observed.environment_status,
        }),
        outcome: decision.outcome.to_string(),
        reason: decision.reason.to_string(),
        applied: act.applied.iter().map(|e| json!(e)).collect(),
        error,
    }
}

/// The evidence gathered for one decision beyond the session, the record and the
/// inventory ([`Controller::evidence`]).
#[derive(Clone, Debug, Default)]
pub(crate) struct Gathered {
    /// The environment status, when read.
    pub(crate) status: EnvironmentRead,
    /// The turn in question, when read.
    pub(crate) turn: Option<TurnEvidence>,
    /// What else was read of that turn (its error, its tool items that did not complete).
    pub(crate) detail: Option<TurnDetail>,
    /// A reported submission's turns were read and none matched.
    pub(crate) turn_not_found: bool,
    /// The latest turn was read (issue 25: [`Observed::turns_read`]).
    pub(crate) turns_read: bool,
}

/// What [`Controller::no_effect_without_lock`] found.
enum LockFree {
    /// Nothing to do: the job is done, nothing written.
    Done(Box<Processed>),
    /// The decision has an effect: take the lock (with what was read).
    Act(Prefetched),
}

/// The lock a job holds: what it read, the fence of every write under it, and when no
/// start or stop may be sent any more (Unix seconds).
struct Held {
    locked: Locked,
    fence: Fence,
    not_after: u64,
}

/// A sweep job's lock-free read, reused under the lock when the record is unchanged.
struct Prefetched {
    /// The version of the record read (`None`: no record).
    record_version: Option<u64>,
    /// The inventory it decided on.
    inventory: Inventory,
    /// The evidence it gathered.
    gathered: Gathered,
}

/// The record being changed by one decision, and what was applied.
struct Act {
    /// The decision's time, Unix seconds.
    now: u64,
    /// The lock every write carries.
    fence: Fence,
    /// Starts and stops are not sent after this, Unix seconds.
    not_after: u64,
    /// The record as last read or written (its version is the write condition).
    record: Option<Record>,
    /// The record with the changes so far.
    fresh: Record,
    dirty: bool,
    /// `false` once a start's outcome is unknown: the lock is left expired on release.
    clean: bool,
    applied: Vec<Effect>,
    error: Option<String>,
    /// A failure of an independent effect (session delete): keep going, never finalize.
    deferred_error: Option<String>,
    /// Retry the message after this many seconds instead of the default.
    retry_after: Option<u64>,
    /// The executor slot this decision took or found (issue 13 item 3).
    slot: SlotTaken,
    /// The provider answered a start without an instance.
    start_failed: bool,
    /// The snapshot state this decision read ([`Observed::snapshot`]): a start whose
    /// restore it does not show `completed` reads the state again first (issue 23).
    restorable: sandbox_core::workspace::SnapshotRead,
    /// Whether a start may claim a new warm pool member: not after an unclean predecessor
    /// (the lock was `recovered`), whose start with the same token may have been cold
    /// (issue 27, [`crate::pool::REPLAY_ONLY`]).
    new_claims: bool,
}

/// What [`Controller::take_slot`] found before the effects (issue 13 item 3).
#[derive(Clone, Debug, PartialEq, Eq)]
enum SlotTaken {
    /// No slot needed: the cap is off, or the decision starts nothing.
    NotNeeded,
    /// Taken by this decision (`true`) or held by the environment already (`false`).
    Taken(bool),
    /// At the cap: the decision became a `capacity_limit` wait.
    Full,
    /// Not checked (registry error, lock lost): the start effect fails, nothing starts.
    Refused(String),
    /// Not checked because other workers' transactions held the counter through every
    /// jittered retry ([`PortError::contended`]): nothing starts and the job is retried
    /// after the short busy delay (`lock_busy_retry_secs`), like a held lock.
    Contended,
}

impl Act {
    /// Applies a record-only effect to `fresh`.
    fn change(&mut self, effect: &Effect) {
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

/// The environment whose workspace a stop or save concerns (the record's).
/// When the record began naming its instance, if this observation is the first to see that
/// instance's executor connected: the status reads `connected`, the record has not seen it
/// connected yet, and the instance is the only active compute and running (with two
/// computes, the environment's status does not say which one connected). Unix seconds.
fn first_connected(observed: &Observed, record: &Record) -> Option<u64> {
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

fn stop_environment(act: &Act) -> EnvironmentId {
    act.fresh.environment_id.clone()
}
