//! Observe: what a decision reads — the session, the environment it names (`identify`),
//! the record and the provider's inventory — without the lock (a swept job's read,
//! `read_without_lock`) and under it (`observe`). The status and turn evidence is read by
//! `evidence.rs`.

use super::{Act, Controller, Disposition, Processed, SlotTaken, capped_delay};
use crate::job::Job;
use crate::ports::{Compute, Fence, Locked, PortError, Queue, Registry};
use sandbox_agents_api::{ApiError, SessionsApi};
use sandbox_core::decision::{Outcome, TurnDetail, decide};
use sandbox_core::ids::{EnvironmentId, InstanceId};
use sandbox_core::observed::{
    EnvironmentRead, Inventory, Observed, SessionView, Trigger, TurnEvidence,
};
use sandbox_core::record::Record;
use sandbox_core::workspace::SnapshotRead;
use std::ops::ControlFlow;

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

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// Identifies the job's environment before any lock (step 1 of [`Controller::process`]):
    /// a webhook job whose `webhook-id` is in the ledger is a duplicate (one registry read);
    /// then the session (404 = deleted; errors = unavailable evidence) and the environment
    /// (the job's, the session's, or the record's). [`ControlFlow::Break`]: the job ends
    /// here (a duplicate, a job whose environment is not its session's, no environment).
    ///
    /// # Errors
    /// A [`PortError`] of the ledger read, the record lookup or the ledger write.
    pub(super) async fn identify(
        &self,
        job: &Job,
        now: u64,
    ) -> Result<ControlFlow<Processed, (EnvironmentId, SessionView)>, PortError> {
        if let Some(id) = &job.webhook_id
            && self.registry.seen_delivery(id, now).await?
        {
            tracing::debug!(webhook_id = %id, "duplicate delivery");
            return Ok(ControlFlow::Break(Processed::skipped(
                "duplicate delivery",
                Disposition::Done,
            )));
        }
        let session = session_view(self.sessions.retrieve_session(&job.session_id).await);
        // A job names an environment its session does not have (a forged or corrupted
        // job: in local mode anything that can write the queue database can enqueue one):
        // refused, so a job can never point one session's evidence at another
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
            return Ok(ControlFlow::Break(Processed::skipped(
                "job environment does not match its session",
                Disposition::Done,
            )));
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
                    return Ok(ControlFlow::Break(Processed::skipped(
                        "session unavailable, environment unknown",
                        Disposition::RetryAfter(retry),
                    )));
                }
                (_, None) => {
                    self.remember(job, now).await?;
                    return Ok(ControlFlow::Break(Processed::skipped(
                        "no self-hosted environment and no record",
                        Disposition::Done,
                    )));
                }
            },
        };
        Ok(ControlFlow::Continue((env, session)))
    }

    /// A fanned-out sweep job's lock-free read (step 2 of [`Controller::process`],
    /// [`Controller::no_effect_without_lock`]): [`ControlFlow::Break`] when its decision
    /// changes nothing (done, nothing written), else what it read, for reuse under the
    /// lock. Every other job reads nothing here (`None`).
    ///
    /// # Errors
    /// A [`PortError`] when the record cannot be read (the job is retried).
    pub(super) async fn read_without_lock(
        &self,
        job: &Job,
        env: &EnvironmentId,
        session: &SessionView,
        now: u64,
    ) -> Result<ControlFlow<Processed, Option<Prefetched>>, PortError> {
        if job.trigger == Trigger::Sweep && job.swept.is_some() {
            match self.no_effect_without_lock(job, env, session, now).await? {
                LockFree::Done(done) => Ok(ControlFlow::Break(*done)),
                LockFree::Act(read) => Ok(ControlFlow::Continue(Some(read))),
            }
        } else {
            Ok(ControlFlow::Continue(None))
        }
    }

    /// Observes under the lock (step 4 of [`Controller::process`]): the swept job's
    /// lock-free read is reused when the lock read the same record version and no unclean
    /// holder came before (the same evidence, read once); otherwise the inventory
    /// ([`Controller::inventory`]) and the evidence ([`Controller::evidence`]) are read
    /// now. Returns what the decision reads and the evidence gathered.
    pub(super) async fn observe(
        &self,
        job: &Job,
        env: &EnvironmentId,
        session: SessionView,
        locked: &Locked,
        prefetched: Option<Prefetched>,
        now: u64,
    ) -> (Observed, Gathered) {
        // A sweep job's lock-free read is reused when the lock read the same record and
        // no unclean holder came before: the same evidence, read once.
        let reuse = prefetched.filter(|p| {
            !locked.recovered && p.record_version == locked.record.as_ref().map(|r| r.version)
        });
        let (inventory, gathered) = match reuse {
            Some(p) => (p.inventory, p.gathered),
            None => {
                let inventory = self.inventory(job, env, locked, now).await;
                let gathered = self
                    .evidence(job, env, &session, &inventory, locked.record.as_ref(), now)
                    .await;
                (inventory, gathered)
            }
        };
        if locked.recovered {
            tracing::info!(effect_key = %env.effect_key(), "lock recovered from an unclean holder: the environment's live instances were read");
        }
        let observed = self.observed(
            job,
            env,
            session,
            locked.record.clone(),
            inventory,
            &gathered,
            now,
        );
        (observed, gathered)
    }

    /// A fanned-out sweep job's decision on a lock-free, consistent read
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
    pub(super) async fn no_effect_without_lock(
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
    pub(super) fn observed(
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
    /// The latest turn was read ([`Observed::turns_read`]).
    pub(crate) turns_read: bool,
}

/// What [`Controller::no_effect_without_lock`] found.
pub(super) enum LockFree {
    /// Nothing to do: the job is done, nothing written.
    Done(Box<Processed>),
    /// The decision has an effect: take the lock (with what was read).
    Act(Prefetched),
}

/// A sweep job's lock-free read, reused under the lock when the record is unchanged.
pub(super) struct Prefetched {
    /// The version of the record read (`None`: no record).
    pub(super) record_version: Option<u64>,
    /// The inventory it decided on.
    pub(super) inventory: Inventory,
    /// The evidence it gathered.
    pub(super) gathered: Gathered,
}
