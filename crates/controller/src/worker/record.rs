//! Record: the fenced record write, the recheck, the terminal record, the delivery
//! ledger and the audit entry.

use super::{Act, Controller, Disposition, Processed, capped_delay, session_of};
use crate::job::Job;
use crate::ports::{AuditEntry, Compute, Outgoing, PortError, Queue, Registry, Release, Write};
use sandbox_agents_api::SessionsApi;
use sandbox_core::decision::{Decision, Effect, Outcome};
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::{Inventory, Observed, SessionView, Trigger};
use serde_json::json;

/// What [`Controller::schedule`] settled before the release.
pub(super) struct Scheduled {
    /// The effect that failed, if any (the independent one's otherwise).
    error: Option<String>,
    /// What to do with the message.
    disposition: Disposition,
    /// The recheck could not be sent: returned after the release, so the job is retried.
    send_error: Option<PortError>,
}

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// What to do with the message, and the recheck the decision asks for (step 7 of
    /// [`Controller::process`]): retry after the effect's own delay, after `recheck_secs`
    /// when an effect failed, after the recheck delay of an `uncertain` decision, else done;
    /// a done job's recheck is sent on the timers queue ([`Controller::schedule_recheck`]).
    pub(super) async fn schedule(
        &self,
        job: &Job,
        observed: &Observed,
        decision: &Decision,
        act: &Act,
        now: u64,
    ) -> Scheduled {
        let error = act.error.clone().or(act.deferred_error.clone());

        let disposition = if let Some(secs) = act.retry_after {
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
                .schedule_recheck(
                    job,
                    &observed.environment_id,
                    &session_of(job, observed),
                    decision,
                    now,
                    secs,
                )
                .await
        {
            send_error = Some(e);
        }
        Scheduled {
            error,
            disposition,
            send_error,
        }
    }

    /// Records and releases (step 8 of [`Controller::process`]): one atomic release — the
    /// record (when changed), the audit entry, the webhook-id in the ledger (a done job
    /// whose recheck was sent), the lock deleted, or left expired when a start's outcome is
    /// unknown so the next holder reads the inventory. A lost lock or a changed record
    /// writes nothing of the decision: the audit entry alone is written and the message
    /// retried.
    ///
    /// # Errors
    /// The release's [`PortError`] (the lock expires on its own), or the recheck's send
    /// error (the job is retried, not yet a duplicate).
    pub(super) async fn release(
        &self,
        job: &Job,
        observed: &Observed,
        decision: Decision,
        act: Act,
        scheduled: Scheduled,
        now: u64,
    ) -> Result<Processed, PortError> {
        let Scheduled {
            mut error,
            mut disposition,
            send_error,
        } = scheduled;
        let remember = match (&job.webhook_id, disposition, &send_error) {
            (Some(id), Disposition::Done, None) => {
                Some((id.as_str(), now + self.config.ledger_ttl_secs))
            }
            _ => None,
        };
        let entry = audit_entry(job, observed, &decision, &act, error.clone());
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
                let entry = audit_entry(job, observed, &decision, &act, error.clone());
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

    /// The close's terminal record ([`crate::terminal`]), written once as its own item
    /// right before the record is marked closed, from the receipts the close confirmed (the
    /// `workspace_closed` one just written included): every closed record has one, and a
    /// close that resumes after a crash finds it stored and leaves it as it is. A failed
    /// write fails `MarkClosed` (the close is retried), so "closed" never lacks its record.
    pub(super) async fn write_terminal(&self, act: &Act) -> Result<(), String> {
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

    /// Writes the record if changed, conditional on the version read under the lock and on
    /// the lock itself (fenced).
    pub(super) async fn flush(&self, act: &mut Act) -> Result<(), String> {
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

    pub(super) async fn schedule_recheck(
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

    pub(super) async fn remember(&self, job: &Job, now: u64) -> Result<(), PortError> {
        if let Some(id) = &job.webhook_id {
            self.registry
                .remember_delivery(id, now + self.config.ledger_ttl_secs)
                .await?;
        }
        Ok(())
    }
}

/// The audit entry of one decision.
pub(super) fn audit_entry(
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
