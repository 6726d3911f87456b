//! Apply: the decision's effects in order — starts, stops and session deletes; record-only
//! effects change the [`Act`](super::Act).

use super::{Act, Controller, Gathered, SlotTaken};
use crate::crash_point::crash_point;
use crate::job::Job;
use crate::ports::{Compute, Queue, Receipt, ReceiptKind, Registry, Started};
use sandbox_agents_api::SessionsApi;
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::decision::{Decision, Effect, StopReason, StopSpec};
use sandbox_core::ids::SessionId;
use sandbox_core::observed::Observed;
use sandbox_core::record::StartFailure;
use sandbox_core::workspace::SnapshotState;

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// Applies a decision (step 6 of [`Controller::process`]): the mapping record kept
    /// current ([`Controller::keep_mapping`]), the effects in order
    /// ([`Controller::apply_effects`]), the executor slot given back once the environment
    /// has no compute ([`Controller::give_back_slot`]), and the decision's metrics.
    pub(super) async fn apply(
        &self,
        job: &Job,
        observed: &Observed,
        gathered: &Gathered,
        decision: &Decision,
        act: &mut Act,
    ) {
        self.keep_mapping(job, observed, decision, gathered.detail.as_ref(), act);
        let now = act.now;
        self.apply_effects(decision, act, now).await;
        self.give_back_slot(job, observed, act).await;
        crate::metrics::decision_applied(job, observed, decision, &act.applied, self.clock.now());
    }

    pub(super) async fn apply_effects(&self, decision: &Decision, act: &mut Act, now: u64) {
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
    /// restore is not `completed` yet (docs/ARCHITECTURE.md principle 8), the job retried
    /// after [`sandbox_core::observed::Policy::snapshot_recheck_secs`].
    pub(super) async fn start(
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
        // A start restores only a `completed` snapshot. One this decision did
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
        // A claim of a warm pool member first, when the pool is on (docs/WARM_POOL.md).
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

    pub(super) async fn stop(&self, stop: &StopSpec, act: &mut Act) -> Result<(), String> {
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

    pub(super) async fn delete_session(&self, id: &SessionId, act: &Act) -> Result<(), String> {
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
}
