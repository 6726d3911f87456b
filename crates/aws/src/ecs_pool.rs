//! The warm pool on ECS (docs/WARM_POOL.md "AWS"): the ECS side of the pool
//! methods of [`Compute`](sandbox_controller::ports::Compute) on [`EcsCompute`], turned on
//! with [`EcsCompute::with_pool`]. Every DynamoDB call is in [`crate::pool_table`]; every
//! ECS call of the pool (`RunTask`, `TagResource`, `ListTasks`, `DescribeTasks`,
//! `StopTask`) is a method of [`EcsCompute`] in `ecs_compute/pool.rs` and
//! `ecs_compute/pool_upkeep.rs`; this module holds the pool's names, its settings and what
//! it reads from a task. Without [`EcsCompute::with_pool`] the pool methods behave as the
//! trait's defaults:
//! [`Compute::start_pool_member`](sandbox_controller::ports::Compute::start_pool_member)
//! refuses, the pool lists empty, claims miss, a recycle is a stop, nothing is reconciled.
//!
//! - **Start a member**: first the launch item (`PutItem` `launch#<deployment>#<client
//!   token>`, in the refill's partition `by_pool`), then `RunTask` with the cluster, task
//!   definition, launch type and network of a cold start, `startedBy` = [`pool_started_by`]
//!   (35 characters, per deployment, distinct from every
//!   [`environment_started_by`](sandbox_core::ids::environment_started_by)), that fresh
//!   `clientToken` (ECS API reference, RunTask `clientToken`), a container override on the
//!   configured (forwarder) container with only [`ENV_POOL_TABLE_NAME`] and
//!   [`ENV_POOL_MAX_WAIT_SECS`] (the max age plus [`POOL_WAIT_GRACE_SECS`], seconds) — no
//!   `REMOTE_URL`, no `ENVIRONMENT_ID` —, the tags `sandbox:deployment`, [`TAG_POOL`] =
//!   [`POOL_MEMBER`], [`TAG_POOL_ROLE`] = the task role's unique id, `propagateTags`
//!   `TASK_DEFINITION` and `enableECSManagedTags`; then one `TransactWriteItems` puts the
//!   member item and deletes the launch. A worker killed between the `RunTask` and the
//!   record leaves the launch item: the next reconcile sends the same `RunTask` again (same
//!   `clientToken`, same request: ECS returns the same task for 24 h, "Ensuring
//!   idempotency", ECS API reference) and records it.
//! - **Claim**: the token item (consistent `GetItem`: a replay returns the token's member
//!   and re-tags it if its tags are missing); with
//!   [`REPLAY_ONLY`] nothing else. Otherwise `Query` `by_idle` (`created_at > bound`, oldest
//!   first, at most [`CLAIM_CANDIDATES`]), one `DescribeTasks` of those candidates (only
//!   claimable ones — `lastStatus` `RUNNING`, `desiredStatus` not `STOPPED`, the configured
//!   task definition revision ([`is_current_revision`]) — are tried), up to
//!   [`CLAIM_ATTEMPTS`] `TransactWriteItems` (member idle → assigned + token put, and with
//!   [`EcsCompute::with_claim_fence`] a `ConditionCheck` that the environment's registry
//!   record is still locked by the claiming worker; the
//!   `CancellationReasons` in request order say whether the member was taken — try the
//!   next — or the token exists — replay it), then `TagResource` with exactly
//!   `sandbox:environment`, `sandbox:session` and `sandbox:generation` (the keys the
//!   worker's `TagClaimedMember` statement allows). The tag must succeed before the claim
//!   returns `Ok`: a failure is an `Err` (outcome unknown: the member is claimed, the
//!   caller keeps its lock unclean, and the next holder's replay-only claim re-tags it).
//! - **Recycle**: `UpdateItem` idle → recycled (`#state = :idle`), then `StopTask` with
//!   reason [`RECYCLE_REASON`]; `Ok(false)` when the condition failed (claimed since).
//! - **Reconcile** (from the table, not from ECS): `Query` `by_pool` (every page: the
//!   launches not recorded yet, the idle members, the recycled members whose stop is not
//!   yet seen — never a claimed member, which is its environment's and the sweep's), so its
//!   calls do not grow with the members the pool handed out. A launch is replayed (its
//!   `RunTask` again, then the record) or, older than the maximum age or refused, dropped.
//!   One `DescribeTasks` per 100 members: a recycled member still live is stopped
//!   ([`RECYCLE_REASON`]) and, once its task is seen stopped, leaves the partition; an idle
//!   member whose task is `STOPPED`, or unknown to ECS (`MISSING`) and created more than
//!   [`ORPHAN_AGE_SECS`] ago, drops its item (`DeleteItem`, `#state = :idle`); an idle
//!   member of an older task definition revision is recycled first (guarded idle →
//!   recycled, then `StopTask` [`STALE_REVISION_REASON`]), so no claim hands it out. Then
//!   the backstop, rare and bounded: one `ListTasks` page ([`BACKSTOP_PAGE`]) by the pool's
//!   `startedBy` per reconcile, from a cursor kept in the table, the listing walked a page a
//!   refill; of its tasks those the partition does not name are looked up by member key
//!   (`BatchGetItem`), and only those without an item are described: a live one without a
//!   `sandbox:environment` tag (a task with an environment is only the sweep's), older
//!   than [`ORPHAN_AGE_SECS`] (its `createdAt` against the pool clock), is stopped
//!   ([`ORPHAN_REASON`]). Anything uncertain (a task not visible yet, one being stopped) is
//!   left for the next refill.
//! - **describe, list, find** (in [`crate::ecs_compute`]): a task tagged [`TAG_POOL`]
//!   without `sandbox:environment` is resolved from its member item: assigned → an
//!   instance of that environment, session and generation; idle or recycled → not an
//!   environment's instance.
//!
//! With EBS workspaces configured (feature `ec2`, `EcsCompute::with_workspaces`) the pool
//! is refused: a member starts without the workspace volume and a claim cannot attach one
//! (ECS takes `volumeConfigurations` only at `RunTask`/`StartTask`; ECS API reference,
//! RunTask `volumeConfigurations`), so `start_pool_member` is a permanent error naming why
//! and claims miss (a token's earlier claim is still replayed).
//!
//! Limits respected (ECS API reference): `startedBy` ≤ 36 letters, digits, `-`, `/`, `_`
//! (RunTask); `clientToken` ≤ 64 characters in 33–126 (RunTask); tag values ≤ 256
//! characters of letters, digits, spaces and `+ - = . _ : / @` (TagResource, Tag);
//! `DescribeTasks` ≤ 100 tasks; `StopTask` `reason` ≤ 255 characters. Every time is Unix
//! seconds.
//!
//! [`EcsCompute`]: crate::ecs_compute::EcsCompute
//! [`RECYCLE_REASON`]: sandbox_controller::pool::RECYCLE_REASON
//! [`REPLAY_ONLY`]: sandbox_controller::pool::REPLAY_ONLY
//! [`EcsCompute::with_pool`]: crate::ecs_compute::EcsCompute::with_pool
//! [`EcsCompute::with_claim_fence`]: crate::ecs_compute::EcsCompute::with_claim_fence

use crate::ecs_task::{exit_detail, started_at, stop_code, tag_value};
use crate::pool_table::{PoolTable, member_pk};
use aws_sdk_ecs::types::Task;
use sandbox_controller::ports::{Clock, SystemClock};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
pub use sandbox_core::ids::pool_started_by;
use sandbox_core::ids::{
    DeploymentId, EnvironmentId, Generation, InstanceId, SessionId, digest_hex32,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Tag of every pool task: [`TAG_POOL`] = [`POOL_MEMBER`] (the worker's `TagResource`
/// grant is conditioned on it).
pub const TAG_POOL: &str = "sandbox:pool";
/// The value of [`TAG_POOL`].
pub const POOL_MEMBER: &str = "member";
/// Tag: the executor task role's unique id, the first half of the member's key.
pub const TAG_POOL_ROLE: &str = "sandbox:pool-role";
/// Forwarder environment variable of a member: the pool table's name.
pub const ENV_POOL_TABLE_NAME: &str = "POOL_TABLE_NAME";
/// Forwarder environment variable of a member: how long it waits for its assignment,
/// seconds (then it exits and the task stops).
pub const ENV_POOL_MAX_WAIT_SECS: &str = "POOL_MAX_WAIT_SECS";
/// Seconds a member waits beyond its maximum age ([`ENV_POOL_MAX_WAIT_SECS`] = max age +
/// this), so the refill recycles it first.
pub const POOL_WAIT_GRACE_SECS: u64 = 300;
/// Stop reason of a pool task no member item names.
pub const ORPHAN_REASON: &str = "pool_orphan";
/// Stop reason of an idle member of an older task definition revision (recycled by the
/// reconcile, before any claim can take it).
pub const STALE_REVISION_REASON: &str = "pool_stale_revision";
/// Age, seconds, past which a pool task without its item is an orphan, and an idle item
/// whose task ECS does not know is gone (ECS reads lag `RunTask`: "the result of an API
/// command you run that affects your Amazon ECS resources might not be immediately
/// visible", ECS API reference, RunTask).
pub const ORPHAN_AGE_SECS: u64 = 120;
/// Idle members a claim reads (`Query` `Limit`), oldest first.
pub const CLAIM_CANDIDATES: i32 = 10;
/// Claim transactions a claim tries at most.
pub const CLAIM_ATTEMPTS: usize = 3;
/// `maxResults` of the reconcile's one backstop `ListTasks` page (the ECS maximum, 100;
/// ECS API Reference, ListTasks).
pub const BACKSTOP_PAGE: i32 = 100;

/// The warm pool's settings for
/// [`EcsCompute::with_pool`](crate::ecs_compute::EcsCompute::with_pool).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// The pool table (schema in [`crate::pool_table`]).
    pub table_name: String,
    /// The executor task role's unique id (`AROA…`; `Fn::GetAtt ExecutorTaskRole.RoleId`):
    /// member keys are `<task role id>:<task id>`, the task's own `aws:userid`.
    pub task_role_id: String,
    /// A member's maximum age, seconds: its forwarder waits at most this +
    /// [`POOL_WAIT_GRACE_SECS`], and its idle item expires this + 1 day after its start.
    pub max_age_secs: u64,
    /// How long a claimed member's item is kept after the claim, seconds (the registry's
    /// history retention).
    pub history_retention_secs: u64,
}

/// The pool's clock (the system clock unless a test sets another).
#[derive(Clone)]
pub(crate) struct PoolClock(pub(crate) Arc<dyn Clock>);

impl Default for PoolClock {
    fn default() -> Self {
        Self(Arc::new(SystemClock))
    }
}

impl std::fmt::Debug for PoolClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PoolClock")
    }
}

impl PoolClock {
    pub(crate) fn now(&self) -> u64 {
        self.0.now()
    }
}

/// The pool's table and settings.
#[derive(Debug)]
pub(crate) struct Pool {
    pub(crate) table: PoolTable,
    pub(crate) config: PoolConfig,
    /// The registry table whose record lock fences a claim
    /// ([`EcsCompute::with_claim_fence`](crate::ecs_compute::EcsCompute::with_claim_fence)).
    pub(crate) fence_table: Option<Arc<str>>,
}

/// A fresh `RunTask` `clientToken` for a member: `pool-` and 32 hex digits (37 characters
/// in 33–126), from the deployment, the time, the process and a counter.
pub(crate) fn fresh_client_token(deployment: &DeploymentId) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let hex = digest_hex32(&format!(
        "{}/{nanos}/{}/{}",
        deployment.as_str(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    format!("pool-{hex}")
}

/// Whether `task` was started as a pool member ([`TAG_POOL`] = [`POOL_MEMBER`]).
pub(crate) fn is_pool_task(task: &Task) -> bool {
    tag_value(task, TAG_POOL) == Some(POOL_MEMBER)
}

/// The task id of a task ARN (`arn:aws:ecs:region:account:task/cluster/id`).
pub(crate) fn task_id(arn: &str) -> Option<&str> {
    if !arn.contains(":task/") {
        return None;
    }
    arn.rsplit('/').next().filter(|id| !id.is_empty())
}

/// The member key of a pool task: its [`TAG_POOL_ROLE`] tag, `:`, its task id.
pub(crate) fn member_key_of(task: &Task) -> Option<String> {
    Some(member_pk(
        tag_value(task, TAG_POOL_ROLE)?,
        task_id(task.task_arn()?)?,
    ))
}

/// Live: `lastStatus` provisioning, pending or running, and not asked to stop.
pub(crate) fn is_live(task: &Task) -> bool {
    ComputeStatus::from_ecs_last_status(task.last_status().unwrap_or("")).is_active()
        && task.desired_status() != Some("STOPPED")
}

/// Whether a task runs the configured task definition `configured` (`TASK_DEFINITION`:
/// an ARN with its revision, as `Ref` of an `AWS::ECS::TaskDefinition` gives it, or
/// `family:revision`, or a bare family). ECS reports the task's own `taskDefinitionArn`,
/// `arn:aws:ecs:<region>:<account>:task-definition/<family>:<revision>` (ECS API
/// reference, Task). An ARN must match exactly, `family:revision` the ARN's last part; a
/// bare family matches every revision of it (which revision is current is then not known
/// without `DescribeTaskDefinition`; the templates always configure the ARN).
pub fn is_current_revision(configured: &str, task_definition_arn: Option<&str>) -> bool {
    let Some(arn) = task_definition_arn else {
        return false;
    };
    if configured.starts_with("arn:") {
        return arn == configured;
    }
    let last = arn.rsplit('/').next().unwrap_or(arn);
    if configured.contains(':') {
        return last == configured;
    }
    last.split(':').next() == Some(configured)
}

/// Claimable: `lastStatus` `RUNNING` (a member still `PROVISIONING` or `PENDING` would
/// hand the session a Fargate start after all), not asked to stop, and of the configured
/// task definition revision ([`is_current_revision`]: after a deploy or a key rotation a
/// member of an older revision runs an old image or holds a revoked key).
pub(crate) fn is_claimable(task: &Task, configured: &str) -> bool {
    task.last_status() == Some("RUNNING")
        && task.desired_status() != Some("STOPPED")
        && is_current_revision(configured, task.task_definition_arn())
}

pub(crate) fn created_at(task: &Task) -> Option<u64> {
    task.created_at()
        .or(task.started_at())
        .and_then(|t| u64::try_from(t.secs()).ok())
}

/// A claimed member as its environment's instance.
pub(crate) fn member_instance(
    task: &Task,
    environment_id: &EnvironmentId,
    session_id: &SessionId,
    generation: Generation,
) -> ComputeInstance {
    let status = ComputeStatus::from_ecs_last_status(task.last_status().unwrap_or(""));
    ComputeInstance {
        instance_id: InstanceId::new(task.task_arn().unwrap_or_default()),
        environment_id: environment_id.clone(),
        session_id: Some(session_id.clone()),
        generation,
        status,
        started_at: started_at(task),
        stop_code: stop_code(task, status),
        exit: exit_detail(task, status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ids::environment_started_by;

    #[test]
    fn the_pool_started_by_fits_ecs_and_differs_from_every_environment_s() {
        let d = DeploymentId::new("prod-eu").unwrap();
        let pool = pool_started_by(&d);
        assert_eq!(pool.len(), 35, "{pool}");
        assert!(pool.starts_with("sp-"));
        assert!(pool.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        assert_eq!(pool, pool_started_by(&d), "deterministic");
        assert_ne!(
            pool,
            pool_started_by(&DeploymentId::new("prod-us").unwrap())
        );
        assert_ne!(
            pool,
            environment_started_by(&d, &EnvironmentId::new("env_a"))
        );
    }

    #[test]
    fn client_tokens_are_fresh_and_within_the_run_task_limits() {
        let d = DeploymentId::new("prod").unwrap();
        let a = fresh_client_token(&d);
        let b = fresh_client_token(&d);
        assert_ne!(a, b);
        assert!(
            a.len() <= 64 && a.chars().all(|c| ('!'..='~').contains(&c)),
            "{a}"
        );
    }

    #[test]
    fn task_ids_come_from_task_arns_only() {
        assert_eq!(
            task_id("arn:aws:ecs:us-east-1:123456789012:task/c/0123abcd"),
            Some("0123abcd")
        );
        assert_eq!(
            task_id("arn:aws:ecs:us-east-1:123456789012:cluster/c"),
            None
        );
        assert_eq!(task_id("arn:aws:ecs:us-east-1:123456789012:task/c/"), None);
    }
}
