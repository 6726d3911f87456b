//! The warm pool's refill ([`Controller::refill_pool`]): the controller keeps the pool at
//! its size with [`crate::pool::plan_refill`] under the deployment's refill lease. Above
//! [`crate::pool`] (the pure plan and the claim a start makes) and [`crate::worker`] (the
//! controller it runs on); see [`crate::pool`]'s module docs for the pool as a whole.

use crate::pool::{REFILL_LEASE_SECS, REFILL_MAX_SECS, plan_refill};
use crate::ports::{Compute, PortError, Queue, Registry};
use crate::worker::Controller;
use sandbox_agents_api::SessionsApi;

/// A fresh refill-lease holder: `<worker id>#<start, Unix s>#<counter>`, unique per refill,
/// so a second refill of the same process never re-takes a lease a running refill holds
/// (the lease's own-holder re-take is for a retried request whose answer was lost).
fn refill_holder(worker_id: &str, now: u64) -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{worker_id}#{now}#{n}")
}

/// What [`Controller::refill_pool`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refilled {
    /// Another holder's refill lease was running: nothing was done.
    pub skipped: bool,
    /// What the provider's pool bookkeeping lost track of and was ended
    /// ([`Compute::reconcile_pool`]).
    pub reconciled: usize,
    /// Members stopped for their age.
    pub recycled: usize,
    /// Members started.
    pub started: usize,
    /// Idle, live members afterwards (as listed before, minus the recycled, plus the
    /// started).
    pub idle: usize,
}

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// Keeps the pool at its size: ends what the provider lost track of
    /// ([`Compute::reconcile_pool`]), then applies [`plan_refill`] over
    /// [`Compute::list_pool`] and, with the cap on, [`Registry::slots`] (a recycle that
    /// loses the race to a claim leaves the member to its environment), then records
    /// `pool_size`. Takes no effect-key lock (members belong to no environment) but the
    /// deployment's refill lease ([`Compute::take_pool_refill_lease`], held while the
    /// refill may act and [`REFILL_LEASE_SECS`] after; [`Controller::refill_pool_until`]),
    /// so concurrent workers do not overfill the pool; while
    /// another holder's lease runs it does nothing ([`Refilled::skipped`]). Nothing to do
    /// when the pool is off and empty.
    ///
    /// # Errors
    /// The first [`PortError`] of a read, a stop or a start; what was done before stays
    /// done (the next refill picks up from the provider's listing).
    pub async fn refill_pool(&self) -> Result<Refilled, PortError> {
        self.refill_pool_until(u64::MAX).await
    }

    /// [`Controller::refill_pool`] within `deadline` (Unix seconds; the caller's own, e.g.
    /// the Lambda invocation's deadline less what it needs to answer): the refill acts
    /// until `not_after` = min(start + [`REFILL_MAX_SECS`], `deadline`) — every `RunTask`
    /// and `StopTask` is checked against it, and the whole refill is cut off at it
    /// (`tokio::time::timeout`; a member started and cut off before its bookkeeping is the
    /// next reconcile's). The lease is taken with a holder unique to this refill
    /// ([`refill_holder`]) for `not_after` − start + [`REFILL_LEASE_SECS`], so it outlasts
    /// everything this refill may still do, and is shortened to end + [`REFILL_LEASE_SECS`]
    /// when the refill ends (the same holder's re-take). With no time left nothing is
    /// done ([`Refilled::skipped`]).
    ///
    /// # Errors
    /// As [`Controller::refill_pool`]; a refill cut off at `not_after` is a transient error.
    pub async fn refill_pool_until(&self, deadline: u64) -> Result<Refilled, PortError> {
        let deployment = &self.config.deployment;
        let now = self.clock.now();
        let not_after = now.saturating_add(REFILL_MAX_SECS).min(deadline);
        if not_after <= now {
            tracing::info!(deadline, "no time left for a pool refill: skipped");
            return Ok(Refilled {
                skipped: true,
                ..Refilled::default()
            });
        }
        let holder = refill_holder(&self.config.worker_id, now);
        let lease_secs = (not_after - now).saturating_add(REFILL_LEASE_SECS);
        if !self
            .compute
            .take_pool_refill_lease(deployment, &holder, now, lease_secs)
            .await?
        {
            return Ok(Refilled {
                skipped: true,
                ..Refilled::default()
            });
        }
        let budget = std::time::Duration::from_secs(not_after - now);
        let result = match tokio::time::timeout(budget, self.refill_within(now, not_after)).await {
            Ok(r) => r,
            Err(_) => Err(PortError::transient(
                "pool",
                "refill_pool",
                format!(
                    "the refill was cut off at its deadline ({} s)",
                    not_after - now
                ),
            )),
        };
        let end = self.clock.now();
        if let Err(e) = self
            .compute
            .take_pool_refill_lease(deployment, &holder, end, REFILL_LEASE_SECS)
            .await
        {
            tracing::warn!(error = %e, "the refill lease was not shortened: it expires on its own");
        }
        result
    }

    async fn refill_within(&self, now: u64, not_after: u64) -> Result<Refilled, PortError> {
        let settings = self.config.pool;
        let deployment = &self.config.deployment;
        let reconciled = self.compute.reconcile_pool(deployment, not_after).await?;
        let idle = self.compute.list_pool(deployment).await?;
        if settings.size == 0 && idle.is_empty() {
            return Ok(Refilled {
                reconciled,
                ..Refilled::default()
            });
        }
        let cap = self.config.policy.max_executors;
        let in_use = if cap > 0 {
            self.registry.slots().await?.in_use
        } else {
            0
        };
        let plan = plan_refill(&idle, settings, cap, in_use, now);
        let mut recycled = 0;
        for id in &plan.recycle {
            if self.compute.recycle_pool_member(id, not_after).await? {
                tracing::info!(instance_id = %id, max_age_secs = settings.max_age_secs, "pool member past its age: recycled");
                recycled += 1;
            } else {
                tracing::info!(instance_id = %id, "pool member claimed before its recycle: left to its environment");
            }
        }
        let mut started = 0;
        for _ in 0..plan.start {
            let member = self
                .compute
                .start_pool_member(deployment, not_after)
                .await?;
            tracing::info!(instance_id = %member.instance_id, "pool member started");
            started += 1;
        }
        let idle = idle.len() - plan.recycle.len() + started;
        crate::metrics::pool_size(idle);
        Ok(Refilled {
            skipped: false,
            reconciled,
            recycled,
            started,
            idle,
        })
    }
}
