//! The compute port: starts, reads and stops executors, and the warm pool's members.

use super::{Fence, PortError, Workspaces};
use sandbox_core::compute::ComputeInstance;
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, EnvironmentId, InstanceId};
use serde::{Deserialize, Serialize};
use std::future::Future;

/// What a start produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Started {
    /// The provider accepted it: the instance (possibly still provisioning).
    Instance(ComputeInstance),
    /// The provider answered without an instance (capacity, quota, bad definition —
    /// including failures returned with a success status). Retrying later may work.
    Failed {
        /// The provider's reason, as reported (never a secret).
        reason: String,
    },
}

/// An idle member of the warm pool (docs/WARM_POOL.md): a pre-started executor that
/// serves no environment yet (its listening executor up, no forwarder or a forwarder
/// waiting for its assignment), single-use: once claimed it is an ordinary instance of one
/// environment, stopped at release like any other, never returned to the pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolMember {
    /// Provider id (the instance id it keeps once claimed).
    pub instance_id: InstanceId,
    /// When it was started, Unix seconds (its age is measured from this).
    pub created_at: u64,
}

/// The stop reason of a member recycled for its age (ECS `StopTask` `reason`).
pub const RECYCLE_REASON: &str = "pool_max_age";

/// `created_after` of a claim that may only replay: no member is created after
/// `u64::MAX`, so [`Compute::claim_pool_member`] returns the member its token already
/// claimed, if any, and claims nothing new (after an unclean predecessor).
pub const REPLAY_ONLY: u64 = u64::MAX;

/// No deadline: for callers that hold no effect-key lock (tests, operator tools).
pub const NO_DEADLINE: u64 = u64::MAX;

/// Refuses an effect whose deadline passed: `Err` (transient, nothing sent) when
/// `now > not_after` (both Unix seconds). Adapters call it immediately before sending a
/// start or stop, so a worker paused past its lock's lease (a stopped process, a laptop
/// that slept) cannot act on a decision the next holder may have replaced: the window
/// shrinks from "any pause" to the request's own transit time (DynamoDB fences the
/// registry; ECS has no fencing token, so the deadline is the next best thing).
///
/// # Errors
/// A transient [`PortError`] naming `dependency` and `operation`.
pub fn check_deadline(
    dependency: &'static str,
    operation: &'static str,
    now: u64,
    not_after: u64,
) -> Result<(), PortError> {
    if now > not_after {
        return Err(PortError::transient(
            dependency,
            operation,
            format!(
                "not sent: the effect's deadline passed {} s ago (the effect-key lock may be lost)",
                now - not_after
            ),
        ));
    }
    Ok(())
}

/// The compute provider: ECS Fargate tasks, or local child processes.
///
/// Every instance is tagged with deployment, environment, session and generation.
/// docs/ARCHITECTURE.md principle 7, "read by id, list to discover": the controller reads the
/// instance a record names with [`Compute::describe`] (one call, whatever the size of the
/// deployment); only the sweep lists the deployment ([`Compute::list`]), to discover what
/// nobody recorded. What a worker that crashed after a start left unrecorded is found by
/// the next holder of the lock, which sees the lock `recovered` and reads that one
/// environment's live instances ([`Compute::find`], constant cost), and a replayed start
/// with the same idempotency token returns the same task (ECS `clientToken`, 24 h). Starts and stops carry a deadline, `not_after` (Unix seconds): the
/// adapter sends nothing once it passed (see [`check_deadline`]).
pub trait Compute: Workspaces + Send + Sync + 'static {
    /// Starts the executor for `spec` (environment id, remote URL unchanged, generation,
    /// idempotency token), tagged with `deployment`, unless `not_after` passed.
    ///
    /// Idempotent by `spec.idempotency_token` for at least 24 hours: a start whose token
    /// already started an instance returns that instance (whatever its status now) and
    /// starts nothing (ECS API reference, RunTask `clientToken`, "Ensuring idempotency").
    /// Never lists the deployment.
    fn start(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> impl Future<Output = Result<Started, PortError>> + Send;
    /// Reads one instance back by id: one provider call (ECS `DescribeTasks` on the ARN).
    /// `None`: the provider does not know it (ECS `MISSING`). Right after a start that
    /// means "not visible yet", long after it "gone": the caller decides which
    /// ([`sandbox_core::observed::Policy::visibility_window_secs`]); the adapter neither
    /// retries nor infers.
    fn describe(
        &self,
        id: &InstanceId,
    ) -> impl Future<Output = Result<Option<ComputeInstance>, PortError>> + Send;
    /// Reads several instances back by id, in any order; unknown (`MISSING`) ids are left
    /// out. ECS: one `DescribeTasks` per 100 ids (its limit). The default calls
    /// [`Compute::describe`] once per id.
    fn describe_many(
        &self,
        ids: &[InstanceId],
    ) -> impl Future<Output = Result<Vec<ComputeInstance>, PortError>> + Send {
        async move {
            let mut found = Vec::with_capacity(ids.len());
            for id in ids {
                found.extend(self.describe(id).await?);
            }
            Ok(found)
        }
    }
    /// The live instances `deployment` started for one environment, in a constant number
    /// of provider calls (ECS: `ListTasks` with the environment's `startedBy`,
    /// [`sandbox_core::ids::environment_started_by`], as the only filter, then one
    /// `DescribeTasks`): how a worker that takes over an unclean lock finds a compute its
    /// predecessor started but never recorded, without listing the deployment. Eventually
    /// consistent like every list. The default filters [`Compute::list`] (adapters whose
    /// list is local and cheap).
    fn find(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
    ) -> impl Future<Output = Result<Vec<ComputeInstance>, PortError>> + Send {
        async move {
            Ok(self
                .list(deployment)
                .await?
                .into_iter()
                .filter(|i| &i.environment_id == environment_id)
                .collect())
        }
    }
    /// The live (provisioning, pending, running) instances tagged with `deployment`, every
    /// page: discovery for the sweep, never evidence that an instance is gone. Eventually
    /// consistent: a just-started instance may be missing, and one being stopped may be
    /// left out. ECS: `ListTasks` with the task definition's `family` and `desiredStatus`
    /// `RUNNING` (a combination the API reference allows; `startedBy` is per environment),
    /// every page, then `DescribeTasks` per 100 ARNs, keeping this deployment's tag.
    fn list(
        &self,
        deployment: &DeploymentId,
    ) -> impl Future<Output = Result<Vec<ComputeInstance>, PortError>> + Send;
    /// Asks the provider to stop `id` (SIGTERM, then SIGKILL after a grace; ECS StopTask
    /// with `reason`), unless `not_after` passed. Returns once the request is accepted;
    /// read back with `describe`.
    fn stop(
        &self,
        id: &InstanceId,
        reason: &str,
        not_after: u64,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Starts one warm pool member of `deployment` (see [`PoolMember`]), unless
    /// `not_after` passed. A member is in neither [`Compute::list`] nor [`Compute::find`]
    /// until it is claimed (it names no environment): only in [`Compute::list_pool`].
    /// It is stopped with [`Compute::stop`] like any instance, and a stopped member is
    /// never claimed. The default: a provider without a pool refuses (permanent).
    ///
    /// # Errors
    /// A [`PortError`]: nothing was started, or (transient) the outcome is unknown.
    fn start_pool_member(
        &self,
        _deployment: &DeploymentId,
        _not_after: u64,
    ) -> impl Future<Output = Result<PoolMember, PortError>> + Send {
        async {
            Err(PortError::permanent(
                "compute",
                "start_pool_member",
                "this compute provider has no warm pool",
            ))
        }
    }
    /// The idle, live members of `deployment`'s pool, oldest first (claimed,
    /// stopped or dead members are left out). The default: none.
    fn list_pool(
        &self,
        _deployment: &DeploymentId,
    ) -> impl Future<Output = Result<Vec<PoolMember>, PortError>> + Send {
        async { Ok(Vec::new()) }
    }
    /// Assigns `spec` (environment id, session, `remote_url`, generation,
    /// idempotency token, restore) to one idle, live member of `deployment` created at or
    /// after `created_after` (Unix seconds: older members are past their maximum age and
    /// left for the refill to recycle), unless `not_after` passed.
    ///
    /// The pick and the guard against double assignment are ONE conditional write
    /// (idle → assigned): of two concurrent claims, at most one gets a given member
    /// (twin: under its mutex; SQLite: one `UPDATE ... WHERE state = 'idle'` in an
    /// `IMMEDIATE` transaction; DynamoDB: one `TransactWriteItems` whose member update
    /// is conditioned on `#state = :idle`). Idempotent by `spec.idempotency_token`: a
    /// token that already claimed a member returns that member and claims nothing. A token
    /// that started cold is not necessarily known to the pool (ECS keeps a `RunTask`
    /// `clientToken` to itself), which is why a start after an unclean predecessor claims
    /// nothing new ([`REPLAY_ONLY`]) and replays the cold start instead.
    ///
    /// With `created_after` = [`REPLAY_ONLY`] no member is young enough:
    /// only the token's own earlier claim can be returned (after an unclean predecessor).
    ///
    /// `Ok(None)`: a miss (no usable member; the caller starts cold). `Ok(Some(..))`: the
    /// claimed member as an instance of the environment (tagged like a started one, found
    /// by [`Compute::find`] from then on), or `Failed` when the member was claimed but
    /// could not be assigned (it is stopped: single-use). The default: always a miss.
    ///
    /// # Errors
    /// A [`PortError`]: the outcome is unknown (the member may be assigned), as for a
    /// start.
    fn claim_pool_member(
        &self,
        _spec: &StartSpec,
        _deployment: &DeploymentId,
        _created_after: u64,
        _not_after: u64,
    ) -> impl Future<Output = Result<Option<Started>, PortError>> + Send {
        async { Ok(None) }
    }
    /// [`Compute::claim_pool_member`] made while the caller holds the environment's lock
    /// `fence` (docs/WARM_POOL.md rule 2): a provider whose claim is one transaction
    /// includes the lock as a condition of it (DynamoDB: a `ConditionCheck` on the
    /// environment's registry record, `lock_owner = fence.owner` and unexpired), so a
    /// worker whose lock has passed to another claims nothing — an error, the outcome
    /// known (nothing written). The default (providers whose claim cannot see the
    /// registry, and the test doubles): the unfenced claim.
    fn claim_pool_member_fenced(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        created_after: u64,
        not_after: u64,
        _fence: &Fence,
    ) -> impl Future<Output = Result<Option<Started>, PortError>> + Send {
        self.claim_pool_member(spec, deployment, created_after, not_after)
    }
    /// Stops the idle member `id` for its age, unless it was claimed since the
    /// refill listed it. The guard is one conditional write (idle → recycled: twin under
    /// its mutex, SQLite `UPDATE ... WHERE state = 'idle'`, DynamoDB `UpdateItem` with
    /// `ConditionExpression` `#state = :idle`), then the stop (reason
    /// [`RECYCLE_REASON`]), unless `not_after` passed. A recycled member is
    /// never claimed. `Ok(false)`: it was claimed (it serves an environment now and is left
    /// alone) or is no longer a member. The default stops it (providers without a pool
    /// have no members).
    ///
    /// # Errors
    /// A [`PortError`] of the write or the stop: the member may be recycled and not yet
    /// stopped; the next refill stops it (it is no longer idle, so nobody claims it).
    fn recycle_pool_member(
        &self,
        id: &InstanceId,
        not_after: u64,
    ) -> impl Future<Output = Result<bool, PortError>> + Send {
        async move {
            self.stop(id, RECYCLE_REASON, not_after)
                .await
                .map(|()| true)
        }
    }
    /// Ends what the pool's bookkeeping lost track of in `deployment`, unless
    /// `not_after` passed, and returns how many members it stopped or forgot: a member
    /// started whose bookkeeping was never written (ECS: a pool task no item names, a
    /// worker killed between `RunTask` and `PutItem`) is stopped once it is older than
    /// the provider's visibility window; bookkeeping of a member that is gone (an idle
    /// item whose task stopped, a local member's directory whose executor exited) is
    /// dropped; a member recycled but not yet stopped is stopped. Runs first in every
    /// refill. The default: nothing to reconcile.
    ///
    /// # Errors
    /// A [`PortError`] of a read or a stop; what was done stays done.
    fn reconcile_pool(
        &self,
        _deployment: &DeploymentId,
        _not_after: u64,
    ) -> impl Future<Output = Result<usize, PortError>> + Send {
        async { Ok(0) }
    }
    /// Takes `deployment`'s refill lease for `lease_secs` as `holder` at `now`
    /// (Unix seconds), so that concurrent refills (several Lambda workers) do not overfill
    /// the pool: `Ok(false)` while another holder's lease runs. DynamoDB: one conditional
    /// `UpdateItem` on `refill#<deployment>` (`attribute_not_exists(lease_until) OR
    /// lease_until < :now`). The lease is never released early: it also spaces refills
    /// `lease_secs` apart. The default: always `Ok(true)` (one refill loop per process:
    /// local mode, the twin).
    ///
    /// # Errors
    /// A [`PortError`] of the write: no refill this time.
    fn take_pool_refill_lease(
        &self,
        _deployment: &DeploymentId,
        _holder: &str,
        _now: u64,
        _lease_secs: u64,
    ) -> impl Future<Output = Result<bool, PortError>> + Send {
        async { Ok(true) }
    }
}
