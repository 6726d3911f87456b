//! What a sweep would decide, without taking a lock or applying anything
//! (`sandboxctl sweep --dry-run`).
//!
//! The same observation as the worker's (session, record, the provider's instances of the
//! environment, and the environment status and latest turn when they matter) and the same
//! [`sandbox_core::decide`]; nothing is written, started, stopped or enqueued. Read without
//! the effect-key lock, an observation may be overtaken by a worker deciding at the same
//! moment: a dry run says what a sweep would do now, not what one will do.

use crate::job::Job;
use crate::ports::{Compute, PortError, Queue, Registry, instances_of};
use crate::worker::Controller;
use sandbox_agents_api::SessionsApi;
use sandbox_core::compute::ComputeInstance;
use sandbox_core::decision::{Decision, decide};
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::{Inventory, Observed, SessionView, Trigger};
use sandbox_core::record::{Record, RecordStatus};
use std::collections::BTreeMap;

/// The environments a sweep examines: every record not settled (closed with nothing left
/// to clean), and every live instance's environment (its session from its tag, else from
/// the record), each with its session.
pub fn sweep_targets(
    records: &[Record],
    instances: &[ComputeInstance],
) -> BTreeMap<EnvironmentId, SessionId> {
    let mut targets = BTreeMap::new();
    for r in records {
        if r.status != RecordStatus::Closed || r.cleanup_required {
            targets.insert(r.environment_id.clone(), r.session_id.clone());
        }
    }
    for i in instances.iter().filter(|i| i.status.is_live()) {
        let session = i.session_id.clone().or_else(|| {
            records
                .iter()
                .find(|r| r.environment_id == i.environment_id)
                .map(|r| r.session_id.clone())
        });
        if let Some(session) = session {
            targets.entry(i.environment_id.clone()).or_insert(session);
        }
    }
    targets
}

/// One environment's decision in a dry run.
#[derive(Clone, Debug, PartialEq)]
pub struct DryRunDecision {
    /// The environment.
    pub environment_id: EnvironmentId,
    /// Its session.
    pub session_id: SessionId,
    /// What a sweep job would decide now.
    pub decision: Decision,
}

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// The decision `job` would get now, observed without the lock and applied nowhere.
    ///
    /// # Errors
    /// A [`PortError`] when the record cannot be read (an unreadable provider or session
    /// is part of the observation: the decision is then `uncertain`, as the worker's).
    pub async fn decide_only(&self, job: &Job, env: &EnvironmentId) -> Result<Decision, PortError> {
        let now = self.clock.now();
        let session = match self.sessions.retrieve_session(&job.session_id).await {
            Ok(s) => SessionView::Found {
                session: Box::new(s),
            },
            Err(e) if e.is_not_found() => SessionView::Deleted,
            Err(e) => SessionView::Unavailable {
                cause: e
                    .unavailable()
                    .unwrap_or(sandbox_core::observed::Unavailable::ServerError),
            },
        };
        let record = self.registry.get(&env.effect_key()).await?;
        let inventory = match instances_of(&self.compute, &self.config.deployment, env).await {
            Ok(instances) => Inventory::Known { instances },
            Err(_) => Inventory::Unavailable,
        };
        let (environment_status, latest_turn) = self.evidence(job, env, &session, &inventory).await;
        Ok(decide(&Observed {
            trigger: job.trigger.clone(),
            environment_id: env.clone(),
            session,
            environment_status,
            record,
            inventory,
            latest_turn,
            filter: self.config.filter.clone(),
            policy: self.config.policy.clone(),
            now,
        }))
    }

    /// What a sweep would decide for every environment it would examine, now.
    ///
    /// # Errors
    /// A [`PortError`] when the registry or the provider inventory cannot be listed (a
    /// sweep would not run either).
    pub async fn sweep_dry_run(&self) -> Result<Vec<DryRunDecision>, PortError> {
        let records = self.registry.list().await?;
        let instances = self.compute.list(&self.config.deployment).await?;
        let now = self.clock.now();
        let mut out = Vec::new();
        for (env, session) in sweep_targets(&records, &instances) {
            let job = Job {
                handoffs: 0,
                trigger: Trigger::Sweep,
                session_id: session.clone(),
                environment_id: Some(env.clone()),
                webhook_id: None,
                enqueued_at: now,
            };
            let decision = self.decide_only(&job, &env).await?;
            out.push(DryRunDecision {
                environment_id: env,
                session_id: session,
                decision,
            });
        }
        Ok(out)
    }
}
