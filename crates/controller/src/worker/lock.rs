//! The lock a job holds and the executor slot it takes under it.

use super::{Act, Controller, Disposition, Processed};
use crate::crash_point::crash_point;
use crate::job::Job;
use crate::ports::{Compute, Fence, Locked, PortError, Queue, Registry, Slot, SlotRelease};
use sandbox_agents_api::SessionsApi;
use sandbox_core::decision::{Decision, Effect};
use sandbox_core::ids::{EnvironmentId, InstanceId};
use sandbox_core::observed::{Inventory, Observed, Trigger};
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;

/// Seconds before the lock's expiry after which no start or stop is sent (room for the
/// request itself and the release): an eighth of the lock's lease, at most this (15 s of
/// the default 120 s).
pub(super) const EFFECT_MARGIN_SECS: u64 = 15;

/// The lock a job holds: what it read, the fence of every write under it, and when no
/// start or stop may be sent any more (Unix seconds).
pub(super) struct Held {
    pub(super) locked: Locked,
    pub(super) fence: Fence,
    pub(super) not_after: u64,
}

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// Takes the lock on `agents-api:environment:{id}:compute` (step 3 of
    /// [`Controller::process`]): a lease with an expiry, which reads the record in the same
    /// call, with an owner unique to this attempt. [`ControlFlow::Break`]: busy (another
    /// worker holds the lock, or another transaction held the item this moment), the
    /// message retried after `lock_busy_retry_secs`.
    ///
    /// # Errors
    /// A [`PortError`] of the lock other than contention.
    pub(super) async fn take_lock(
        &self,
        env: &EnvironmentId,
        now: u64,
    ) -> Result<ControlFlow<Processed, Held>, PortError> {
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
            // Another transaction held the item this moment: busy, a short hand-off like
            // a held lock, never a failed job.
            Err(e) if e.contended => {
                tracing::info!(effect_key = %key, error = %e, "effect key contended: handed off as busy");
                return Ok(ControlFlow::Break(Processed::skipped(
                    "effect key contended (transaction conflict)",
                    Disposition::RetryAfter(self.config.lock_busy_retry_secs),
                )));
            }
            Err(e) => return Err(e),
        };
        let Some(locked) = locked else {
            return Ok(ControlFlow::Break(Processed::skipped(
                "effect key locked by another worker",
                Disposition::RetryAfter(self.config.lock_busy_retry_secs),
            )));
        };
        crash_point("after-lock");
        // Starts and stops are not sent after this: the lease minus a margin for the
        // request's own transit and the release.
        let ttl = self.config.lock_ttl_secs;
        let not_after = now + ttl - (ttl / 8).min(EFFECT_MARGIN_SECS);
        let held = Held {
            locked,
            fence: Fence { key, owner },
            not_after,
        };
        Ok(ControlFlow::Continue(held))
    }

    /// The concurrency cap per deployment
    /// ([`sandbox_core::observed::Policy::max_executors`]): a decision that starts a compute
    /// first takes an executor slot for the environment with one conditional write
    /// ([`Registry::acquire_slot`]; the environment's own slot is reused, so a replacement
    /// or a restart never waits). At the cap the decision becomes
    /// [`sandbox_core::decision::at_capacity`]'s `wait` (reason `capacity_limit`, looked
    /// at again with backoff through the timers queue, metric `capacity_waits`); when the
    /// slot cannot be checked the start effect fails instead (retried, nothing started).
    pub(super) async fn take_slot(
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
    /// before the release: asked only when the cap is on and this
    /// decision could have ended the environment's compute or its claim to one — it took a
    /// slot, stopped a compute (read back `STOPPED`), marked the record stopped or closed,
    /// had a start fail — or on a sweep (which repairs slots left by crashes). The slot is
    /// kept while a compute may live: one started now, an active one not stopped now, the
    /// record's current compute unless it was read or made `STOPPED`, and any start whose
    /// outcome is unknown. A failed release is logged; the sweep retries it.
    pub(super) async fn give_back_slot(&self, job: &Job, observed: &Observed, act: &mut Act) {
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
}

/// What [`Controller::take_slot`] found before the effects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum SlotTaken {
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
