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
use crate::ports::{Clock, Compute, Fence, PortError, Queue, Registry, Release};
use sandbox_agents_api::SessionsApi;
use sandbox_core::decision::{Decision, Effect, Outcome};
use sandbox_core::ids::EnvironmentId;
use sandbox_core::observed::{SessionView, Trigger};
use sandbox_core::record::Record;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

mod act;
mod apply;
mod decide;
mod evidence;
mod lock;
mod observe;
mod record;
mod workspace;

use act::{Act, stop_environment};
use lock::{EFFECT_MARGIN_SECS, Held, SlotTaken};
pub(crate) use observe::{Gathered, session_view};
use observe::{LockFree, Prefetched};
use record::audit_entry;

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
}
