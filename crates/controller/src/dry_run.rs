//! What a sweep would decide, without taking a lock or applying anything
//! (`sandboxctl sweep --dry-run`).
//!
//! The sweep's own plan ([`Controller::plan_sweep`]: one read of the registry and the
//! provider, one job per environment with its evidence), then, per job, the worker's own
//! observation (the session, the record, the compute by the job's evidence or by id, and
//! the environment status and latest turn when they matter) and the same
//! [`sandbox_core::decide`]; nothing is written, started, stopped or enqueued. Read
//! without the effect-key lock, an observation may be overtaken by a worker deciding at
//! the same moment: a dry run says what a sweep would do now, not what one will do.
//!
//! With the concurrency cap on ([`sandbox_core::observed::Policy::max_executors`]) a start
//! is shown as the worker would take it: a `capacity_limit` wait when the environment holds
//! no slot and the deployment's slots are all in use ([`Registry::slots`], read once per
//! dry run).

use crate::job::Job;
use crate::ports::{Compute, Locked, PortError, Queue, Registry, Slots};
use crate::worker::Controller;
use sandbox_agents_api::SessionsApi;
use sandbox_core::decision::Decision;
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Observed;

/// One environment's decision in a dry run.
#[derive(Clone, Debug, PartialEq)]
pub struct DryRunDecision {
    /// The environment.
    pub environment_id: EnvironmentId,
    /// Its session.
    pub session_id: SessionId,
    /// What its sweep job would decide now.
    pub decision: Decision,
}

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// The decision `job` (about `env`) would get now, observed without the lock and
    /// applied nowhere.
    ///
    /// # Errors
    /// A [`PortError`] when the record cannot be read (an unreadable provider or session
    /// is part of the observation: the decision is then `uncertain`, as the worker's).
    pub async fn decide_only(&self, job: &Job, env: &EnvironmentId) -> Result<Decision, PortError> {
        self.decide_only_with(job, env, None).await
    }

    /// [`Controller::decide_only`] with the slots already read (`None`: read them when a
    /// start needs them).
    async fn decide_only_with(
        &self,
        job: &Job,
        env: &EnvironmentId,
        slots: Option<&Slots>,
    ) -> Result<Decision, PortError> {
        let now = self.clock.now();
        let session =
            crate::worker::session_view(self.sessions.retrieve_session(&job.session_id).await);
        let locked = Locked {
            record: self.registry.get(&env.effect_key()).await?,
            recovered: false,
        };
        let inventory = self.inventory(job, env, &locked, now).await;
        let gathered = self
            .evidence(job, env, &session, &inventory, locked.record.as_ref(), now)
            .await;
        let mut observed = Observed {
            trigger: job.trigger.clone(),
            environment_id: env.clone(),
            session,
            environment_status: gathered.status,
            record: locked.record,
            inventory,
            latest_turn: gathered.turn,
            filter: self.config.filter.clone(),
            policy: self.config.policy.clone(),
            now,
            turn_not_found: gathered.turn_not_found,
            turns_read: gathered.turns_read,
            snapshot: Default::default(),
        };
        let decision = self.decide_with_snapshot(&mut observed).await;
        let cap = self.config.policy.max_executors;
        if cap == 0 || !sandbox_core::decision::starts_compute(&decision) {
            return Ok(decision);
        }
        let read;
        let slots = match slots {
            Some(s) => s,
            None => {
                read = self.registry.slots().await?;
                &read
            }
        };
        let holds = slots.holders.iter().any(|h| &h.environment_id == env);
        Ok(if !holds && slots.in_use >= u64::from(cap) {
            sandbox_core::decision::at_capacity(&decision, &observed)
        } else {
            decision
        })
    }

    /// What a sweep would decide for every environment it would examine, now.
    ///
    /// # Errors
    /// As [`Controller::plan_sweep`] (a sweep would not run either), or a record read.
    pub async fn sweep_dry_run(&self) -> Result<Vec<DryRunDecision>, PortError> {
        let plan = self.plan_sweep().await?;
        let slots = if self.config.policy.max_executors > 0 {
            Some(self.registry.slots().await?)
        } else {
            None
        };
        let mut out = Vec::with_capacity(plan.jobs.len());
        for job in &plan.jobs {
            let Some(env) = &job.environment_id else {
                continue;
            };
            let decision = self.decide_only_with(job, env, slots.as_ref()).await?;
            out.push(DryRunDecision {
                environment_id: env.clone(),
                session_id: job.session_id.clone(),
                decision,
            });
        }
        Ok(out)
    }
}
