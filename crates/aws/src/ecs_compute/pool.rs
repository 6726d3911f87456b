//! The warm pool's ECS calls on [`EcsCompute`] (the protocol is in [`crate::ecs_pool`]'s
//! docs): turning the pool on, the shared lookups, starting a member, listing, claiming.
//! Recycling, releasing and reconciling are in `pool_upkeep.rs`.

use super::{DEP, EcsCompute};
use crate::ecs_pool::{
    CLAIM_ATTEMPTS, CLAIM_CANDIDATES, ENV_POOL_MAX_WAIT_SECS, ENV_POOL_TABLE_NAME, ORPHAN_AGE_SECS,
    POOL_MEMBER, POOL_WAIT_GRACE_SECS, Pool, PoolClock, PoolConfig, TAG_POOL, TAG_POOL_ROLE,
    fresh_client_token, is_claimable, is_live, is_pool_task, member_instance, member_key_of,
    pool_started_by, task_id,
};
use crate::ecs_task::{
    TAG_DEPLOYMENT, TAG_ENVIRONMENT, TAG_GENERATION, TAG_SESSION, check_tag_value,
    run_task_failures, tag, tag_value,
};
use crate::pool_table::{
    ClaimWrite, LaunchItem, MemberItem, MemberState, PoolTable, TokenItem, launch_pk, member_pk,
};
use crate::sdk_error::port_error;
use aws_sdk_ecs::operation::run_task::RunTaskError;
use aws_sdk_ecs::types::{
    ContainerOverride, KeyValuePair, LaunchType, PropagateTags, Task, TaskOverride,
};
use sandbox_controller::pool::REPLAY_ONLY;
use sandbox_controller::ports::{Clock, PoolMember, PortError, Started, check_deadline};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation, InstanceId, SessionId};
use std::collections::HashMap;
use std::sync::Arc;

impl EcsCompute {
    /// Turns the warm pool on: members are started, claimed, recycled and
    /// reconciled as [`crate::ecs_pool`] says, with their bookkeeping in the pool table
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
    pub(super) async fn describe_pool(
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
    /// (see [`crate::ecs_pool`]).
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

    /// The member's `RunTask` with `client_token` (the request in [`crate::ecs_pool`], the same
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
    pub(super) async fn run_member(
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
    pub(super) async fn record_run(
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
    /// (see [`crate::ecs_pool`]). Without the pool: a miss.
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
}

/// What a member's `RunTask` answered.
pub(super) enum MemberRun {
    /// The task the token started (new, or returned again for the same `clientToken`).
    Task(String),
    /// No task: the answer's `failures` (capacity, ENI limits, ...).
    Refused(String),
}
