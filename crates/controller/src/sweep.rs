//! The sweeper: level-triggered reconciliation of the registry against the provider's
//! inventory and the sessions (DESIGN.md principle 5).
//!
//! Every run re-derives what should exist from scratch: each environment that has an
//! open record or a live compute tagged by this deployment is processed as a
//! [`Trigger::Sweep`] job through the same worker path (same lock, same decision), so
//! orphans, stale records, overdue shutdown leases, failed or deleted sessions with live
//! compute and half-done cleanups all heal (lifecycle-cases.md rows 26, 27).

use crate::job::Job;
use crate::ports::{Compute, PortError, Queue, Registry};
use crate::worker::{Controller, Disposition};
use sandbox_agents_api::SessionsApi;
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::record::RecordStatus;
use std::collections::BTreeMap;

/// What one sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Environments examined.
    pub environments: usize,
    /// Count of decisions per outcome name (`release`, `schedule-stop`, ...).
    pub outcomes: BTreeMap<String, usize>,
    /// Environments left for a later run (busy lock, missing evidence, failed effect).
    pub deferred: usize,
}

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// Runs one sweep.
    ///
    /// # Errors
    /// A [`PortError`] when the registry or the provider inventory cannot be listed: a
    /// sweep never acts on a partial inventory.
    pub async fn sweep(&self) -> Result<SweepReport, PortError> {
        let records = self.registry.list().await?;
        let instances = self.compute.list(&self.config.deployment).await?;
        let mut targets: BTreeMap<EnvironmentId, SessionId> = BTreeMap::new();
        for r in &records {
            let settled = r.status == RecordStatus::Closed && !r.cleanup_required;
            if !settled {
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
            } else {
                tracing::warn!(instance_id = %i.instance_id, "live compute without a session tag");
            }
        }
        let mut report = SweepReport {
            environments: targets.len(),
            ..SweepReport::default()
        };
        let now = self.clock.now();
        for (env, session) in targets {
            let job = Job {
                handoffs: 0,
                trigger: Trigger::Sweep,
                session_id: session,
                environment_id: Some(env.clone()),
                webhook_id: None,
                enqueued_at: now,
            };
            match self.process(&job).await {
                Ok(p) => {
                    if let Some(outcome) = p.outcome() {
                        *report.outcomes.entry(outcome.to_string()).or_default() += 1;
                    }
                    if p.disposition != Disposition::Done {
                        report.deferred += 1;
                    }
                }
                Err(e) => {
                    tracing::warn!(environment_id = %env, error = %e, "sweep deferred");
                    report.deferred += 1;
                }
            }
        }
        Ok(report)
    }
}
