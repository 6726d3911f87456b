//! The warm pool on ECS (issue 27, docs/WARM_POOL.md "AWS"): the ECS side of the pool
//! methods of [`Compute`](sandbox_controller::ports::Compute) on [`EcsCompute`], turned on
//! with [`EcsCompute::with_pool`]. Every DynamoDB call is in [`crate::pool_table`]; every
//! ECS call of the pool is here (`RunTask`, `TagResource`, `ListTasks`, `DescribeTasks`,
//! `StopTask`). Without [`EcsCompute::with_pool`] the pool methods behave as the trait's
//! defaults: [`Compute::start_pool_member`](sandbox_controller::ports::Compute::start_pool_member)
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

use crate::ecs_compute::{
    EcsCompute, TAG_DEPLOYMENT, TAG_ENVIRONMENT, TAG_GENERATION, TAG_SESSION, check_tag_value,
    exit_detail, run_task_failures, started_at, stop_code, tag, tag_value,
};
use crate::pool_table::{
    ClaimWrite, LaunchItem, MemberItem, MemberState, PoolItem, PoolTable, TokenItem, launch_pk,
    member_pk,
};
use crate::sdk_error::port_error;
use aws_sdk_ecs::operation::run_task::RunTaskError;
use aws_sdk_ecs::types::{
    ContainerOverride, KeyValuePair, LaunchType, PropagateTags, Task, TaskOverride,
};
use sandbox_controller::pool::{RECYCLE_REASON, REPLAY_ONLY};
use sandbox_controller::ports::{
    Clock, PoolMember, PortError, Started, SystemClock, check_deadline,
};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::decision::StartSpec;
pub use sandbox_core::ids::pool_started_by;
use sandbox_core::ids::{
    DeploymentId, EnvironmentId, Generation, InstanceId, SessionId, digest_hex32,
};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const DEP: &str = "compute";

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

/// The warm pool's settings for [`EcsCompute::with_pool`].
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
pub(crate) struct PoolClock(Arc<dyn Clock>);

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
    /// ([`EcsCompute::with_claim_fence`]).
    pub(crate) fence_table: Option<Arc<str>>,
}

/// A fresh `RunTask` `clientToken` for a member: `pool-` and 32 hex digits (37 characters
/// in 33–126), from the deployment, the time, the process and a counter.
fn fresh_client_token(deployment: &DeploymentId) -> String {
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
fn task_id(arn: &str) -> Option<&str> {
    if !arn.contains(":task/") {
        return None;
    }
    arn.rsplit('/').next().filter(|id| !id.is_empty())
}

/// The member key of a pool task: its [`TAG_POOL_ROLE`] tag, `:`, its task id.
fn member_key_of(task: &Task) -> Option<String> {
    Some(member_pk(
        tag_value(task, TAG_POOL_ROLE)?,
        task_id(task.task_arn()?)?,
    ))
}

/// Live: `lastStatus` provisioning, pending or running, and not asked to stop.
fn is_live(task: &Task) -> bool {
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
fn is_claimable(task: &Task, configured: &str) -> bool {
    task.last_status() == Some("RUNNING")
        && task.desired_status() != Some("STOPPED")
        && is_current_revision(configured, task.task_definition_arn())
}

fn created_at(task: &Task) -> Option<u64> {
    task.created_at()
        .or(task.started_at())
        .and_then(|t| u64::try_from(t.secs()).ok())
}

/// A claimed member as its environment's instance.
fn member_instance(
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

impl EcsCompute {
    /// Turns the warm pool on (issue 27): members are started, claimed, recycled and
    /// reconciled as the module docs say, with their bookkeeping in the pool table
    /// `config.table_name` through `ddb`, and `find`/`describe`/`list` resolve claimed
    /// members. Makes no call.
    #[must_use]
    pub fn with_pool(mut self, ddb: aws_sdk_dynamodb::Client, config: PoolConfig) -> Self {
        let table = PoolTable::new(
            ddb,
            &config.table_name,
            config.max_age_secs,
            config.history_retention_secs,
        );
        self.pool = Some(Arc::new(Pool {
            table,
            config,
            fence_table: None,
        }));
        self
    }

    /// Fences every claim made under a lock
    /// ([`Compute::claim_pool_member_fenced`](sandbox_controller::ports::Compute::claim_pool_member_fenced))
    /// with that lock: the claim's `TransactWriteItems` gets a `ConditionCheck` on the
    /// environment's record item in the registry table `registry_table` (`lock_owner` = the
    /// fence's owner, `lock_until` ≥ now), so a worker whose lock expired and passed to
    /// another holder claims nothing. Without the pool: nothing. Makes no call.
    #[must_use]
    pub fn with_claim_fence(mut self, registry_table: &str) -> Self {
        if let Some(pool) = self.pool.take() {
            self.pool = Some(Arc::new(Pool {
                table: pool.table.clone(),
                config: pool.config.clone(),
                fence_table: Some(registry_table.into()),
            }));
        }
        self
    }

    /// The clock of the pool's bookkeeping (members' `created_at`, the orphan age, item
    /// expiry) and of every deadline check before a `RunTask` or `StopTask`; the system
    /// clock by default. For tests (a member "older than 120 s" without sleeping). Makes no
    /// call.
    #[must_use]
    pub fn with_pool_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = PoolClock(clock);
        self
    }

    /// The refill lease `refill#<deployment>` for `holder` from `now` for `lease_secs`
    /// (Unix seconds / seconds): one conditional `UpdateItem`, taken when the lease is
    /// absent, expired (`lease_until < now`) or already `holder`'s. `Ok(false)`: held by
    /// another holder.
    ///
    /// # Errors
    /// A permanent [`PortError`] without the pool ([`EcsCompute::with_pool`]); the
    /// DynamoDB failure otherwise (outcome unknown: the lease may be taken, and expires).
    pub async fn take_refill_lease(
        &self,
        deployment: &DeploymentId,
        holder: &str,
        now: u64,
        lease_secs: u64,
    ) -> Result<bool, PortError> {
        let pool = self.pool_or_refuse("take_refill_lease")?;
        pool.table
            .take_lease(deployment, holder, now, lease_secs)
            .await
    }

    fn pool_or_refuse(&self, op: &'static str) -> Result<&Pool, PortError> {
        self.pool
            .as_deref()
            .ok_or_else(|| PortError::permanent(DEP, op, "this compute provider has no warm pool"))
    }

    /// Whether EBS workspaces are configured (the pool cannot serve them).
    fn workspaces_on(&self) -> bool {
        #[cfg(feature = "ec2")]
        {
            self.ebs().is_some()
        }
        #[cfg(not(feature = "ec2"))]
        {
            false
        }
    }

    /// The tasks of `arns` that ECS knows, by ARN ([`EcsCompute::described_tasks`]).
    async fn describe_pool(
        &self,
        arns: &[String],
        op: &'static str,
    ) -> Result<HashMap<String, Task>, PortError> {
        Ok(self
            .described_tasks(arns, op)
            .await?
            .into_iter()
            .filter_map(|t| Some((t.task_arn()?.to_owned(), t)))
            .collect())
    }

    /// `TagResource` of a claimed member with exactly `sandbox:environment`,
    /// `sandbox:session` and `sandbox:generation`.
    async fn tag_claimed(
        &self,
        arn: &str,
        environment_id: &EnvironmentId,
        session_id: &SessionId,
        generation: Generation,
    ) -> Result<(), PortError> {
        let op = "claim_pool_member";
        self.client
            .tag_resource()
            .resource_arn(arn)
            .tags(tag(TAG_ENVIRONMENT, environment_id.as_str()))
            .tags(tag(TAG_SESSION, session_id.as_str()))
            .tags(tag(TAG_GENERATION, &generation.0.to_string()))
            .send()
            .await
            .map_err(|e| port_error(DEP, op, &e))?;
        tracing::info!(task = %arn, environment_id = %environment_id, generation = %generation,
            "pool member tagged with its assignment");
        Ok(())
    }

    /// Resolves pool tasks without environment tags from their member items: the items in
    /// `known` (by member key), the others read with one consistent `BatchGetItem` per 100
    /// keys. Returns, by task ARN, the instances of the members claimed (`assigned`, the
    /// item naming this very task and deployment); idle, recycled and unknown members are
    /// left out. Without the pool: nothing.
    pub(crate) async fn resolve_pool_tasks(
        &self,
        tasks: &[&Task],
        known: &HashMap<String, MemberItem>,
        op: &'static str,
    ) -> Result<HashMap<String, ComputeInstance>, PortError> {
        let Some(pool) = self.pool.as_deref() else {
            return Ok(HashMap::new());
        };
        let keyed: Vec<(&Task, String)> = tasks
            .iter()
            .filter_map(|t| Some((*t, member_key_of(t)?)))
            .collect();
        let missing: Vec<String> = keyed
            .iter()
            .filter(|(_, k)| !known.contains_key(k))
            .map(|(_, k)| k.clone())
            .collect();
        let fetched = if missing.is_empty() {
            HashMap::new()
        } else {
            pool.table.members(&missing, self.clock.now(), op).await?
        };
        let mut out = HashMap::new();
        for (task, key) in keyed {
            let Some(item) = known.get(&key).or_else(|| fetched.get(&key)) else {
                continue;
            };
            let arn = task.task_arn().unwrap_or_default();
            let Some(a) = item.assignment.as_ref() else {
                continue;
            };
            if item.state != MemberState::Assigned
                || item.task_arn != arn
                || tag_value(task, TAG_DEPLOYMENT) != Some(item.deployment.as_str())
            {
                continue;
            }
            out.insert(
                arn.to_owned(),
                member_instance(task, &a.environment_id, &a.session_id, a.generation),
            );
        }
        Ok(out)
    }

    /// [`Compute::start_pool_member`](sandbox_controller::ports::Compute::start_pool_member)
    /// (see the module docs).
    pub(crate) async fn pool_start_member(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<PoolMember, PortError> {
        let op = "start_pool_member";
        let pool = self.pool_or_refuse(op)?;
        if self.workspaces_on() {
            return Err(PortError::permanent(
                DEP,
                op,
                concat!(
                    "the warm pool cannot serve EBS workspaces: a member starts without the ",
                    "workspace volume and a claim cannot attach one (ECS takes ",
                    "volumeConfigurations only at RunTask); turn the pool or workspaces off"
                ),
            ));
        }
        let role = pool.config.task_role_id.as_str();
        check_tag_value(op, TAG_DEPLOYMENT, deployment.as_str())?;
        check_tag_value(op, TAG_POOL_ROLE, role)?;
        if role.is_empty() {
            return Err(PortError::permanent(
                DEP,
                op,
                "PoolConfig.task_role_id is empty",
            ));
        }
        self.network(op)?;
        let now = self.clock.now();
        check_deadline(DEP, op, now, not_after)?;
        let client_token = fresh_client_token(deployment);
        pool.table
            .put_launch(deployment, &client_token, now)
            .await?;
        let launch = LaunchItem {
            pk: launch_pk(deployment, &client_token),
            client_token,
            created_at: now,
        };
        let run = match self
            .run_member(pool, deployment, &launch.client_token, op)
            .await
        {
            Err(e) if !e.retryable => {
                pool.table.delete_launch(&launch.pk).await?;
                return Err(e);
            }
            other => other?,
        };
        let arn = match run {
            MemberRun::Task(arn) => arn,
            MemberRun::Refused(why) => {
                pool.table.delete_launch(&launch.pk).await?;
                return Err(PortError::transient(
                    DEP,
                    op,
                    format!("RunTask started no pool member: {why}"),
                ));
            }
        };
        if let Err(e) = self.record_run(pool, deployment, &arn, &launch, op).await {
            tracing::warn!(task = %arn, error = %e,
                "pool member started but not recorded: the next reconcile replays its RunTask");
            return Err(e);
        }
        tracing::info!(task = %arn, "pool member started");
        Ok(PoolMember {
            instance_id: InstanceId::new(arn),
            created_at: now,
        })
    }

    /// The member's `RunTask` with `client_token` (the request of the module docs, the same
    /// for a launch and its replay, so ECS answers a replay with the task the token
    /// started: "If you retry a request that completed successfully using the same client
    /// token and the same parameters, the retry succeeds without performing any further
    /// actions", ECS API Reference, "Ensuring idempotency"). A `ConflictException` (the
    /// same token with other parameters, e.g. after a deploy) names the task the token
    /// started in its `resourceIds`: that task.
    ///
    /// # Errors
    /// The call's failure ([`port_error`]: throttling, 5xx and no answer are transient —
    /// outcome unknown —, a refused request permanent).
    async fn run_member(
        &self,
        pool: &Pool,
        deployment: &DeploymentId,
        client_token: &str,
        op: &'static str,
    ) -> Result<MemberRun, PortError> {
        let role = pool.config.task_role_id.as_str();
        let network = self.network(op)?;
        let max_wait = pool
            .config
            .max_age_secs
            .saturating_add(POOL_WAIT_GRACE_SECS)
            .to_string();
        let overrides = TaskOverride::builder()
            .container_overrides(
                ContainerOverride::builder()
                    .name(&self.config().container_name)
                    .environment(
                        KeyValuePair::builder()
                            .name(ENV_POOL_TABLE_NAME)
                            .value(&pool.config.table_name)
                            .build(),
                    )
                    .environment(
                        KeyValuePair::builder()
                            .name(ENV_POOL_MAX_WAIT_SECS)
                            .value(max_wait)
                            .build(),
                    )
                    .build(),
            )
            .build();
        let res = self
            .client
            .run_task()
            .cluster(&self.config().cluster)
            .task_definition(&self.config().task_definition)
            .launch_type(LaunchType::Fargate)
            .count(1)
            .started_by(pool_started_by(deployment))
            .client_token(client_token)
            .network_configuration(network)
            .overrides(overrides)
            .tags(tag(TAG_DEPLOYMENT, deployment.as_str()))
            .tags(tag(TAG_POOL, POOL_MEMBER))
            .tags(tag(TAG_POOL_ROLE, role))
            .propagate_tags(PropagateTags::TaskDefinition)
            .enable_ecs_managed_tags(true)
            .send()
            .await;
        let out = match res {
            Ok(out) => out,
            Err(e) => {
                if let Some(RunTaskError::ConflictException(c)) = e.as_service_error()
                    && let Some(arn) = c.resource_ids().iter().find(|id| id.contains(":task/"))
                {
                    return Ok(MemberRun::Task(arn.clone()));
                }
                return Err(port_error(DEP, op, &e));
            }
        };
        Ok(match out.tasks().iter().find_map(|t| t.task_arn()) {
            Some(arn) => MemberRun::Task(arn.to_owned()),
            None => MemberRun::Refused(run_task_failures(&out)),
        })
    }

    /// Records the task `arn` that `launch` started as an idle member
    /// ([`PoolTable::record_member`]: the member item and the launch's deletion together).
    async fn record_run(
        &self,
        pool: &Pool,
        deployment: &DeploymentId,
        arn: &str,
        launch: &LaunchItem,
        op: &'static str,
    ) -> Result<(), PortError> {
        let id = task_id(arn).ok_or_else(|| {
            PortError::permanent(
                DEP,
                op,
                format!("RunTask answered a task ARN without an id: {arn}"),
            )
        })?;
        pool.table
            .record_member(
                &member_pk(&pool.config.task_role_id, id),
                deployment,
                arn,
                launch,
            )
            .await?;
        Ok(())
    }

    /// [`Compute::list_pool`](sandbox_controller::ports::Compute::list_pool): `Query`
    /// `by_idle` (every page, oldest first), then `DescribeTasks` per 100: the members whose
    /// task is live, plus those ECS does not show yet and that were created at most
    /// [`ORPHAN_AGE_SECS`] ago (ECS reads lag `RunTask`: counted, so the refill does not
    /// start one more). Without the pool: none.
    pub(crate) async fn pool_list(
        &self,
        deployment: &DeploymentId,
    ) -> Result<Vec<PoolMember>, PortError> {
        let op = "list_pool";
        let Some(pool) = self.pool.as_deref() else {
            return Ok(Vec::new());
        };
        let now = self.clock.now();
        let idle = pool.table.idle_members(deployment, 0, now, None).await?;
        if idle.is_empty() {
            return Ok(Vec::new());
        }
        let arns: Vec<String> = idle.iter().map(|m| m.task_arn.clone()).collect();
        let tasks = self.describe_pool(&arns, op).await?;
        Ok(idle
            .into_iter()
            .filter(|m| match tasks.get(&m.task_arn) {
                Some(task) => is_live(task),
                None => m.created_at.saturating_add(ORPHAN_AGE_SECS) >= now,
            })
            .map(|m| PoolMember {
                instance_id: InstanceId::new(m.task_arn),
                created_at: m.created_at,
            })
            .collect())
    }

    /// A replay of `token`'s claim: its member as `spec`'s instance, re-tagged when its
    /// environment tag is missing and it is live; `PROVISIONING` when ECS does not show it
    /// (not visible yet, or long gone: the caller's describe decides).
    async fn pool_replay(&self, token: &TokenItem, spec: &StartSpec) -> Result<Started, PortError> {
        let op = "claim_pool_member";
        if token.environment_id != spec.environment_id || token.generation != spec.generation {
            return Err(PortError::permanent(
                DEP,
                op,
                format!(
                    "idempotency token {} claimed {} for {} generation {}, not for {} generation {}",
                    spec.idempotency_token,
                    token.task_arn,
                    token.environment_id,
                    token.generation,
                    spec.environment_id,
                    spec.generation
                ),
            ));
        }
        let tasks = self
            .describe_pool(std::slice::from_ref(&token.task_arn), op)
            .await?;
        let instance = match tasks.get(&token.task_arn) {
            Some(task) => {
                if tag_value(task, TAG_ENVIRONMENT).is_none() && is_live(task) {
                    self.tag_claimed(
                        &token.task_arn,
                        &token.environment_id,
                        &token.session_id,
                        token.generation,
                    )
                    .await?;
                }
                member_instance(
                    task,
                    &token.environment_id,
                    &token.session_id,
                    token.generation,
                )
            }
            None => ComputeInstance {
                instance_id: InstanceId::new(&token.task_arn),
                environment_id: token.environment_id.clone(),
                session_id: Some(token.session_id.clone()),
                generation: token.generation,
                status: ComputeStatus::Provisioning,
                started_at: None,
                stop_code: None,
                exit: None,
            },
        };
        tracing::info!(task = %token.task_arn, member = %token.member_pk,
            environment_id = %spec.environment_id, "pool claim replayed by its idempotency token");
        Ok(Started::Instance(instance))
    }

    /// [`Compute::claim_pool_member`](sandbox_controller::ports::Compute::claim_pool_member)
    /// (see the module docs). Without the pool: a miss.
    pub(crate) async fn pool_claim(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        created_after: u64,
        not_after: u64,
        fence: Option<&sandbox_controller::ports::Fence>,
    ) -> Result<Option<Started>, PortError> {
        let op = "claim_pool_member";
        let Some(pool) = self.pool.as_deref() else {
            return Ok(None);
        };
        let lock = pool.fence_table.as_deref().zip(fence);
        check_tag_value(op, TAG_ENVIRONMENT, spec.environment_id.as_str())?;
        check_tag_value(op, TAG_SESSION, spec.session_id.as_str())?;
        let now = self.clock.now();
        check_deadline(DEP, op, now, not_after)?;
        if let Some(token) = pool
            .table
            .token(deployment, &spec.idempotency_token, now)
            .await?
        {
            return self.pool_replay(&token, spec).await.map(Some);
        }
        if created_after == REPLAY_ONLY || self.workspaces_on() {
            return Ok(None);
        }
        let candidates = pool
            .table
            .idle_members(deployment, created_after, now, Some(CLAIM_CANDIDATES))
            .await?;
        if candidates.is_empty() {
            return Ok(None);
        }
        let arns: Vec<String> = candidates.iter().map(|m| m.task_arn.clone()).collect();
        let tasks = self.describe_pool(&arns, op).await?;
        let live = candidates.iter().filter_map(|m| {
            let task = tasks.get(&m.task_arn)?;
            (is_claimable(task, &self.config().task_definition)
                && is_pool_task(task)
                && tag_value(task, TAG_DEPLOYMENT) == Some(deployment.as_str()))
            .then_some((m, task))
        });
        for (member, task) in live.take(CLAIM_ATTEMPTS) {
            check_deadline(DEP, op, self.clock.now(), not_after)?;
            match pool
                .table
                .claim(member, deployment, created_after, spec, now, lock)
                .await?
            {
                ClaimWrite::Claimed => {
                    tracing::info!(task = %member.task_arn, member = %member.pk,
                        environment_id = %spec.environment_id, generation = %spec.generation,
                        "pool member claimed");
                    self.tag_claimed(
                        &member.task_arn,
                        &spec.environment_id,
                        &spec.session_id,
                        spec.generation,
                    )
                    .await?;
                    return Ok(Some(Started::Instance(member_instance(
                        task,
                        &spec.environment_id,
                        &spec.session_id,
                        spec.generation,
                    ))));
                }
                ClaimWrite::LockLost => {
                    return Err(PortError::transient(
                        DEP,
                        op,
                        format!(
                            "the lock of {} is no longer this worker's: nothing claimed",
                            spec.environment_id
                        ),
                    ));
                }
                ClaimWrite::MemberTaken | ClaimWrite::Conflict => {
                    tracing::debug!(member = %member.pk, "pool member taken meanwhile: trying the next");
                }
                ClaimWrite::TokenTaken => {
                    let token = pool
                        .table
                        .token(deployment, &spec.idempotency_token, now)
                        .await?
                        .ok_or_else(|| {
                            PortError::transient(
                                DEP,
                                op,
                                "the claim's token item exists but reads as absent",
                            )
                        })?;
                    return self.pool_replay(&token, spec).await.map(Some);
                }
            }
        }
        Ok(None)
    }

    /// [`Compute::recycle_pool_member`](sandbox_controller::ports::Compute::recycle_pool_member):
    /// the member key from the configured task role id and the ARN's task id, the guarded
    /// `UpdateItem`, then `StopTask` ([`RECYCLE_REASON`]). Without the pool: a stop, as the
    /// trait's default.
    pub(crate) async fn pool_recycle(
        &self,
        id: &InstanceId,
        not_after: u64,
    ) -> Result<bool, PortError> {
        let op = "recycle_pool_member";
        let Some(pool) = self.pool.as_deref() else {
            self.stop_task(id.as_str(), RECYCLE_REASON, not_after, op)
                .await?;
            return Ok(true);
        };
        let now = self.clock.now();
        check_deadline(DEP, op, now, not_after)?;
        let task = task_id(id.as_str())
            .ok_or_else(|| PortError::permanent(DEP, op, format!("not a task ARN: {id}")))?;
        if !pool
            .table
            .recycle(&member_pk(&pool.config.task_role_id, task), now)
            .await?
        {
            return Ok(false);
        }
        self.stop_task(id.as_str(), RECYCLE_REASON, not_after, op)
            .await?;
        Ok(true)
    }

    /// After the `StopTask` of `id` by its environment: when `id` is a claimed member of
    /// this pool (its key from the configured task role id and the ARN's task id), its
    /// item gets its expiry ([`PoolTable::release`](crate::pool_table::PoolTable::release),
    /// one conditional `UpdateItem`; a cold task's fails its condition and writes
    /// nothing). Without the pool, or for an id that is not a task ARN: no call.
    ///
    /// # Errors
    /// The `UpdateItem`'s failure (the task is stopped; the stop is retried as a whole).
    pub(crate) async fn pool_release(&self, id: &InstanceId) -> Result<(), PortError> {
        let Some(pool) = self.pool.as_deref() else {
            return Ok(());
        };
        let Some(task) = task_id(id.as_str()) else {
            return Ok(());
        };
        if pool
            .table
            .release(
                &member_pk(&pool.config.task_role_id, task),
                self.clock.now(),
            )
            .await?
        {
            tracing::info!(task = %id, "claimed pool member stopped: its item now expires with the history retention");
        }
        Ok(())
    }

    /// [`Compute::reconcile_pool`](sandbox_controller::ports::Compute::reconcile_pool) (see
    /// the module docs): from the refill's partition of the pool table, then one page of
    /// the [`Self::pool_backstop`]. Its calls do not depend on how many members were
    /// claimed: `Query` `by_pool` (launches, idle and recycled members only),
    /// `DescribeTasks` of its members (≤ 100 each), one backstop page, and a call per item
    /// repaired or ended. Returns how many were repaired (a launch's `RunTask` replayed and
    /// recorded) or ended (a member or an orphan stopped, an item of a task that is gone
    /// deleted). Without the pool: nothing.
    pub(crate) async fn pool_reconcile(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<usize, PortError> {
        let op = "reconcile_pool";
        let Some(pool) = self.pool.as_deref() else {
            return Ok(0);
        };
        let now = self.clock.now();
        check_deadline(DEP, op, now, not_after)?;
        let items = pool.table.pool_items(deployment, now).await?;
        let mut done = 0;
        let mut members = Vec::new();
        for item in items {
            match item {
                PoolItem::Launch(launch) => {
                    done += usize::from(
                        self.replay_launch(pool, deployment, &launch, now, not_after)
                            .await?,
                    );
                }
                PoolItem::Member(member) => members.push(member),
            }
        }
        let arns: Vec<String> = members.iter().map(|m| m.task_arn.clone()).collect();
        let tasks = if arns.is_empty() {
            HashMap::new()
        } else {
            self.describe_pool(&arns, op).await?
        };
        for member in &members {
            let task = tasks.get(&member.task_arn);
            let gone = match task {
                Some(t) => {
                    ComputeStatus::from_ecs_last_status(t.last_status().unwrap_or(""))
                        == ComputeStatus::Stopped
                }
                None => member.created_at.saturating_add(ORPHAN_AGE_SECS) < now,
            };
            let live = task.is_some_and(is_live);
            match member.state {
                MemberState::Recycled if live => {
                    tracing::info!(task = %member.task_arn, "recycled pool member still live: stopped");
                    self.stop_task(&member.task_arn, RECYCLE_REASON, not_after, op)
                        .await?;
                    pool.table.forget_recycled(&member.pk).await?;
                    done += 1;
                }
                // Stopped, being stopped, or long unknown to ECS: its stop is confirmed.
                MemberState::Recycled if gone || task.is_some() => {
                    pool.table.forget_recycled(&member.pk).await?;
                }
                MemberState::Idle if gone => {
                    check_deadline(DEP, op, self.clock.now(), not_after)?;
                    if pool.table.delete_idle(&member.pk).await? {
                        tracing::info!(task = %member.task_arn, member = %member.pk,
                            "idle pool item whose task is gone: deleted");
                        done += 1;
                    }
                }
                MemberState::Idle
                    if live
                        && !is_current_revision(
                            &self.config().task_definition,
                            task.and_then(Task::task_definition_arn),
                        ) =>
                {
                    check_deadline(DEP, op, self.clock.now(), not_after)?;
                    if pool.table.recycle(&member.pk, now).await? {
                        tracing::info!(task = %member.task_arn,
                            task_definition = task.and_then(Task::task_definition_arn),
                            "idle pool member of an older task definition revision: recycled");
                        self.stop_task(&member.task_arn, STALE_REVISION_REASON, not_after, op)
                            .await?;
                        pool.table.forget_recycled(&member.pk).await?;
                        done += 1;
                    }
                }
                // Uncertain (not visible yet, being stopped) or fine: the next refill looks
                // again.
                _ => {}
            }
        }
        let known: HashSet<&str> = members.iter().map(|m| m.task_arn.as_str()).collect();
        done += self
            .pool_backstop(pool, deployment, &known, now, not_after)
            .await?;
        Ok(done)
    }

    /// A launch the reconcile found unrecorded (a worker died or was cut off between its
    /// `PutItem` and the member's record): older than the maximum age, it is dropped (a
    /// member it started would be past its age; such a task, live without an item, is the
    /// backstop's orphan); otherwise its `RunTask` is sent again with the same
    /// `clientToken` — ECS returns the task the token started (24 h), or starts it if the
    /// first never arrived — and recorded. A refused `RunTask` drops the launch. `true`
    /// when a member was recorded.
    async fn replay_launch(
        &self,
        pool: &Pool,
        deployment: &DeploymentId,
        launch: &LaunchItem,
        now: u64,
        not_after: u64,
    ) -> Result<bool, PortError> {
        let op = "reconcile_pool";
        if now.saturating_sub(launch.created_at) > pool.config.max_age_secs {
            tracing::warn!(launch = %launch.pk, "pool launch older than the maximum age, never recorded: dropped");
            pool.table.delete_launch(&launch.pk).await?;
            return Ok(false);
        }
        check_deadline(DEP, op, self.clock.now(), not_after)?;
        match self
            .run_member(pool, deployment, &launch.client_token, op)
            .await
        {
            Ok(MemberRun::Task(arn)) => {
                self.record_run(pool, deployment, &arn, launch, op).await?;
                tracing::info!(task = %arn, launch = %launch.pk,
                    "pool launch replayed by its clientToken and recorded");
                Ok(true)
            }
            Ok(MemberRun::Refused(why)) => {
                tracing::warn!(launch = %launch.pk, why, "pool launch replay started no task: dropped");
                pool.table.delete_launch(&launch.pk).await?;
                Ok(false)
            }
            Err(e) if !e.retryable => {
                tracing::warn!(launch = %launch.pk, error = %e, "pool launch replay refused: dropped");
                pool.table.delete_launch(&launch.pk).await?;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// The backstop for pool tasks no item names (a launch dropped while its task ran, an
    /// item lost): one `ListTasks` page of at most [`BACKSTOP_PAGE`] ARNs by the pool's
    /// `startedBy` per reconcile, from the cursor kept in the pool table (`GetItem`, then
    /// `PutItem` of the page's `nextToken`; an answer refusing the cursor starts over), so
    /// the whole listing — claimed members keep the pool's `startedBy` — is walked one page
    /// a refill, never all at once. Of the page, the tasks not in the refill's partition
    /// (`known`) are looked up by member key (`BatchGetItem`: a claimed member has its
    /// item); only those without an item are described (`DescribeTasks`), and a live one of
    /// this deployment without a `sandbox:environment` tag (a task with an environment is
    /// only the sweep's), keyed with the configured task role and older than
    /// [`ORPHAN_AGE_SECS`] is stopped ([`ORPHAN_REASON`]).
    async fn pool_backstop(
        &self,
        pool: &Pool,
        deployment: &DeploymentId,
        known: &HashSet<&str>,
        now: u64,
        not_after: u64,
    ) -> Result<usize, PortError> {
        let op = "reconcile_pool";
        let started_by = pool_started_by(deployment);
        let cursor = pool.table.backstop_cursor(deployment, now).await?;
        let (arns, next) = match self.list_page(&started_by, cursor.as_deref(), op).await {
            Ok(page) => page,
            Err(e) if cursor.is_some() && !e.retryable => {
                tracing::info!(error = %e, "pool backstop cursor refused: starting over");
                self.list_page(&started_by, None, op).await?
            }
            Err(e) => return Err(e),
        };
        pool.table
            .set_backstop_cursor(deployment, next.as_deref(), now)
            .await?;
        let role = pool.config.task_role_id.as_str();
        let unknown: Vec<(String, &String)> = arns
            .iter()
            .filter(|arn| !known.contains(arn.as_str()))
            .filter_map(|arn| Some((member_pk(role, task_id(arn)?), arn)))
            .collect();
        if unknown.is_empty() {
            return Ok(0);
        }
        let keys: Vec<String> = unknown.iter().map(|(k, _)| k.clone()).collect();
        let items = pool.table.members(&keys, now, op).await?;
        let without: Vec<String> = unknown
            .iter()
            .filter(|(k, arn)| items.get(k).is_none_or(|i| &i.task_arn != *arn))
            .map(|(_, arn)| (*arn).clone())
            .collect();
        if without.is_empty() {
            return Ok(0);
        }
        let tasks = self.describe_pool(&without, op).await?;
        let mut stopped = 0;
        for (arn, task) in &tasks {
            let orphan = is_live(task)
                && is_pool_task(task)
                && tag_value(task, TAG_DEPLOYMENT) == Some(deployment.as_str())
                && tag_value(task, TAG_ENVIRONMENT).is_none()
                && member_key_of(task).is_some_and(|k| keys.contains(&k));
            let Some(created) = created_at(task).filter(|_| orphan) else {
                continue;
            };
            if now.saturating_sub(created) > ORPHAN_AGE_SECS {
                tracing::warn!(task = %arn, age_secs = now.saturating_sub(created),
                    "pool task without its member item: stopped");
                self.stop_task(arn, ORPHAN_REASON, not_after, op).await?;
                stopped += 1;
            }
        }
        Ok(stopped)
    }

    /// One `ListTasks` page: the cluster, `startedBy` (the only filter: "When you specify
    /// `startedBy` as the filter, it must be the only filter that you use", ECS API
    /// Reference, ListTasks; `desiredStatus` is then its default, `RUNNING`), `maxResults`
    /// [`BACKSTOP_PAGE`] and `nextToken` when given. Returns the ARNs and the next token.
    async fn list_page(
        &self,
        started_by: &str,
        next_token: Option<&str>,
        op: &'static str,
    ) -> Result<(Vec<String>, Option<String>), PortError> {
        let out = self
            .client
            .list_tasks()
            .cluster(&self.config().cluster)
            .started_by(started_by)
            .max_results(BACKSTOP_PAGE)
            .set_next_token(next_token.map(str::to_owned))
            .send()
            .await
            .map_err(|e| port_error(DEP, op, &e))?;
        Ok((
            out.task_arns().to_vec(),
            out.next_token().map(str::to_owned),
        ))
    }
}

/// What a member's `RunTask` answered.
enum MemberRun {
    /// The task the token started (new, or returned again for the same `clientToken`).
    Task(String),
    /// No task: the answer's `failures` (capacity, ENI limits, ...).
    Refused(String),
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
