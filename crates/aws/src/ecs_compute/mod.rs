//! [`EcsCompute`]: the controller's [`Compute`] port on Amazon ECS Fargate, one task per
//! environment and generation.
//!
//! Read by id, list to discover (docs/ARCHITECTURE.md principle 7): a task the controller
//! recorded is read by its ARN, never inferred from a list; only the sweep lists.
//!
//! - **start**: `RunTask` with launch type `FARGATE`, count 1, the configured cluster,
//!   task definition, awsvpc subnets, security groups and public-IP setting, `startedBy` =
//!   [`environment_started_by`] (35 characters, per deployment and environment: see
//!   **find**), `clientToken` = the spec's idempotency token
//!   (≤ 64 ASCII characters, deterministic per environment and generation), container
//!   overrides for the configured container with the environment variables `REMOTE_URL`
//!   (the session's `remote_url`, unchanged) and `ENVIRONMENT_ID` only — the executor key
//!   `CODEX_API_KEY` comes from the task definition's `secrets` (Secrets Manager), never
//!   from this process; the configured container is the key holder, the one that
//!   registers: `forwarder` in the split task (the `executor` container, where
//!   the agent's commands run, gets no override, no secret and no environment), `executor`
//!   in the single-container fallback —, the tags `sandbox:deployment`, `sandbox:environment`,
//!   `sandbox:session`, `sandbox:generation`, `propagateTags` = `TASK_DEFINITION` and
//!   `enableECSManagedTags`. No list first: "If you use the same client token with the
//!   same parameters, the same task is returned for 24 hours" (ECS API reference, RunTask
//!   `clientToken`; "Ensuring idempotency"), so a worker that crashed after `RunTask` and
//!   before its record is answered with the task it started when the next holder replays
//!   the start. A `200` answer with `failures` and no task (capacity, ENI limits, a bad
//!   task definition) is [`Started::Failed`] with the failures as the reason (logged at
//!   `warn`).
//! - **describe**: `DescribeTasks` with `include = [TAGS]` on the ARN, keeping only the
//!   task whose ARN is exactly the id (moto matches task ids as substrings) in the
//!   configured cluster. `MISSING` (or no task) is `None`, at once: right after `RunTask`
//!   ECS reads are eventually consistent, so the caller — `decide()`, with the record's
//!   `instance_recorded_at` — tells "not visible yet" from "gone"; nothing here retries,
//!   and no in-process memory of starts is needed (a Lambda's memory does not outlive its
//!   execution environment anyway). A failure other than `MISSING` is a transient error.
//! - **describe_many**: the same, one `DescribeTasks` per 100 ARNs (the API's limit).
//! - **find** (one environment): `ListTasks` with `cluster` and the environment's
//!   `startedBy` only — "When you specify `startedBy` as the filter, it must be the only
//!   filter that you use" (ECS API reference, ListTasks) — so `desiredStatus` is its
//!   default, `RUNNING`; then one `DescribeTasks`. Two calls whatever the deployment's size.
//!   With the warm pool ([`EcsCompute::with_pool`], [`crate::ecs_pool`]) also one `Query`
//!   of the pool table's `by_environment` index (a claimed member keeps the pool's
//!   `startedBy`), and the one `DescribeTasks` reads both sets.
//! - **pool members** in describe, list and find: a task tagged `sandbox:pool`
//!   without `sandbox:environment` (a worker died between the claim and its
//!   `TagResource`) is resolved from its member item (key: its `sandbox:pool-role` tag,
//!   `:`, its task id; one consistent `BatchGetItem` per 100, or the `by_environment`
//!   items `find` already read): claimed → an instance of that environment, session and
//!   generation; idle or recycled → no environment's instance (left out of list and find;
//!   an error for describe, which only reads recorded, hence claimed, ids). Without the
//!   pool such a task is skipped by list and an error for describe, as any untagged task.
//! - **list** (the sweep): `ListTasks` with `cluster`, `family` (the task definition's)
//!   and `desiredStatus` `RUNNING` — `family` combines with `desiredStatus` — : the live
//!   tasks (tasks being stopped and stopped tasks are not listed; the records' tasks are
//!   read by ARN instead). Every page; then `DescribeTasks` in chunks of 100 with tags. A
//!   task is kept only if its cluster ARN is exactly the configured cluster (moto's
//!   `ListTasks` cluster filter is a substring match) and its `sandbox:deployment` tag is
//!   the deployment (another deployment may share the family); tasks without environment
//!   or generation tags are skipped (logged).
//!   Status comes from `lastStatus` ([`ComputeStatus::from_ecs_last_status`]), `started_at`
//!   from `startedAt`, else `createdAt` (Unix seconds), `stop_code` from `stopCode`
//!   (`TaskFailedToStart` for a task that stopped before it ran, e.g. after up to 30
//!   minutes in `PROVISIONING`).
//! - **stop**: `StopTask` with the reason truncated to 255 characters (the ECS limit).
//!
//! Errors: throttling, 5xx, timeouts and connection failures are transient
//! [`PortError`]s; validation errors (`ClientException`, `InvalidParameterException`, an
//! unknown cluster) are permanent — except on `RunTask`, where errors are read by meaning
//! (`EcsCompute::run_task_error`): a 4xx is a failed start ([`Started::Failed`], no task
//! started), `ConflictException` adopts the task its `resourceIds` name, throttling and
//! 5xx are "outcome unknown" (transient). Sources: the Amazon ECS API Reference (RunTask,
//! DescribeTasks, ListTasks, StopTask) and the AWS tagging rules (keys ≤ 128, values ≤ 256
//! characters of letters, digits, spaces and `+ - = . _ : / @`).
//!
//! Files: this one (the provider, its cold starts, reads and stops); `pool.rs` and
//! `pool_upkeep.rs` (the warm pool's ECS calls on [`EcsCompute`]; the protocol, names
//! and settings are in [`crate::ecs_pool`]); `workspaces.rs` (feature `ec2`: the
//! [`Workspaces`](sandbox_controller::ports::Workspaces) port on `crate::ebs_workspaces`).
//! The tags and the task readers shared with the pool and EBS workspaces are in
//! `crate::ecs_task`.

pub use crate::ecs_task::{TAG_DEPLOYMENT, TAG_ENVIRONMENT, TAG_GENERATION, TAG_SESSION};
use crate::ecs_task::{
    check_tag_value, exit_detail, run_task_failures, started_at, stop_code, tag, tag_value,
    truncate_chars,
};
use crate::sdk_error::{is_transient_code, port_error};
use aws_sdk_ecs::Client;
use aws_sdk_ecs::config::http::HttpResponse;
use aws_sdk_ecs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ecs::operation::run_task::RunTaskError;
use aws_sdk_ecs::types::{
    AssignPublicIp, AwsVpcConfiguration, ContainerOverride, DesiredStatus, KeyValuePair,
    LaunchType, NetworkConfiguration, PropagateTags, Task, TaskField, TaskOverride,
};
use sandbox_controller::ports::{Compute, PoolMember, PortError, Started, check_deadline};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{
    DeploymentId, EnvironmentId, Generation, InstanceId, SessionId, environment_started_by,
};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

mod pool;
mod pool_upkeep;
#[cfg(feature = "ec2")]
mod workspaces;

const DEP: &str = "compute";

/// Container environment variable: the session's `remote_url`, unchanged.
pub const ENV_REMOTE_URL: &str = "REMOTE_URL";
/// Container environment variable: the environment id.
pub const ENV_ENVIRONMENT_ID: &str = "ENVIRONMENT_ID";

/// `DescribeTasks` accepts at most 100 tasks per call (ECS API reference).
pub const DESCRIBE_CHUNK: usize = 100;
/// `StopTask` reason limit, characters.
pub const MAX_STOP_REASON_CHARS: usize = 255;

/// Where and how tasks run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EcsConfig {
    /// Cluster name or ARN.
    pub cluster: String,
    /// Task definition: `family`, `family:revision` or its ARN. Its container named
    /// [`EcsConfig::container_name`] runs `codex exec-server --remote "$REMOTE_URL"
    /// --environment-id "$ENVIRONMENT_ID"` and gets `CODEX_API_KEY` from its `secrets`.
    pub task_definition: String,
    /// The name of the task definition's container that registers with the Agents API
    /// (the override target): `forwarder` in the split task, `executor` in the
    /// single-container fallback (`EXECUTOR_MODE`).
    pub container_name: String,
    /// awsvpc subnets (ids), at least one.
    pub subnets: Vec<String>,
    /// awsvpc security groups (ids); empty: the VPC's default group.
    pub security_groups: Vec<String>,
    /// Whether the task gets a public IP (`ENABLED`): needed in a public subnet without a
    /// NAT gateway, since the executor connects outbound.
    pub assign_public_ip: bool,
}

/// The compute provider on ECS Fargate. Cheap to clone (clones share the client).
#[derive(Clone, Debug)]
pub struct EcsCompute {
    pub(crate) client: Client,
    config: Arc<EcsConfig>,
    /// EBS workspaces (feature `ec2`), when configured.
    #[cfg(feature = "ec2")]
    ebs: Option<Arc<crate::ebs_workspaces::Ebs>>,
    /// The warm pool ([`crate::ecs_pool`]), when configured.
    pub(crate) pool: Option<Arc<crate::ecs_pool::Pool>>,
    /// The clock of every deadline check before a `RunTask` or `StopTask` and of the
    /// pool's bookkeeping (members' `created_at`, ages, expiry); the system clock unless a
    /// test sets another ([`EcsCompute::with_pool_clock`]).
    pub(crate) clock: crate::ecs_pool::PoolClock,
}

fn invalid(operation: &'static str, message: impl Into<String>) -> PortError {
    PortError::permanent(DEP, operation, message)
}

/// The instance a described task is, from its tags; `None` when it lacks them.
fn instance_from_task(task: &Task) -> Option<ComputeInstance> {
    let arn = task.task_arn()?;
    let environment_id = EnvironmentId::new(tag_value(task, TAG_ENVIRONMENT)?);
    let generation = Generation(tag_value(task, TAG_GENERATION)?.parse::<u64>().ok()?);
    let status = ComputeStatus::from_ecs_last_status(task.last_status().unwrap_or(""));
    Some(ComputeInstance {
        instance_id: InstanceId::new(arn),
        environment_id,
        session_id: tag_value(task, TAG_SESSION).map(SessionId::new),
        generation,
        status,
        started_at: started_at(task),
        stop_code: stop_code(task, status),
        exit: exit_detail(task, status),
    })
}

impl EcsCompute {
    /// A provider on `config.cluster`. Makes no call.
    pub fn new(client: Client, config: EcsConfig) -> Self {
        Self {
            client,
            config: Arc::new(config),
            #[cfg(feature = "ec2")]
            ebs: None,
            pool: None,
            clock: crate::ecs_pool::PoolClock::default(),
        }
    }

    /// Keeps workspaces on ECS-managed EBS volumes (feature `ec2`; see
    /// [`crate::ebs_workspaces`]): every `RunTask` then carries a `volumeConfigurations`
    /// entry for the task definition's `configuredAtLaunch` volume
    /// ([`crate::ebs_workspaces::WORKSPACE_VOLUME_NAME`]), created from
    /// `StartSpec.restore` when set, and the [`Workspaces`](sandbox_controller::ports::Workspaces)
    /// port snapshots and deletes volumes through `ec2`. Makes no call.
    #[cfg(feature = "ec2")]
    #[must_use]
    pub fn with_workspaces(
        mut self,
        ec2: aws_sdk_ec2::Client,
        config: crate::ebs_workspaces::EbsConfig,
    ) -> Self {
        self.ebs = Some(Arc::new(crate::ebs_workspaces::Ebs {
            client: ec2,
            config,
        }));
        self
    }

    /// The EBS side, when configured.
    #[cfg(feature = "ec2")]
    pub(crate) fn ebs(&self) -> Option<&crate::ebs_workspaces::Ebs> {
        self.ebs.as_deref()
    }

    /// The configuration.
    pub fn config(&self) -> &EcsConfig {
        &self.config
    }

    /// Whether `cluster_arn` is exactly the configured cluster (by ARN, or by name when a
    /// name is configured).
    pub(crate) fn in_cluster(&self, cluster_arn: Option<&str>) -> bool {
        let Some(arn) = cluster_arn else {
            return false;
        };
        let configured = self.config.cluster.as_str();
        if configured.starts_with("arn:") {
            arn == configured
        } else {
            arn.rsplit_once('/').map(|(_, name)| name) == Some(configured)
        }
    }

    /// The tasks of `arns` that ECS knows, with tags: one `DescribeTasks` per 100 ARNs (the
    /// API's limit), keeping only tasks whose ARN was asked for exactly (moto matches task
    /// ids as substrings) and which run in the configured cluster. `MISSING` ARNs are left
    /// out; any other failure is a transient error naming the ARNs and reasons.
    pub(crate) async fn described_tasks(
        &self,
        arns: &[String],
        op: &'static str,
    ) -> Result<Vec<Task>, PortError> {
        let mut tasks = Vec::with_capacity(arns.len());
        for chunk in arns.chunks(DESCRIBE_CHUNK) {
            let out = self
                .client
                .describe_tasks()
                .cluster(&self.config.cluster)
                .set_tasks(Some(chunk.to_vec()))
                .include(TaskField::Tags)
                .send()
                .await
                .map_err(|e| port_error(DEP, op, &e))?;
            let failures: Vec<String> = out
                .failures()
                .iter()
                .filter(|f| f.reason() != Some("MISSING"))
                .map(|f| {
                    format!(
                        "{}: {}",
                        f.arn().unwrap_or("?"),
                        f.reason().unwrap_or("unknown")
                    )
                })
                .collect();
            if !failures.is_empty() {
                return Err(PortError::transient(DEP, op, failures.join("; ")));
            }
            let wanted: HashSet<&str> = chunk.iter().map(String::as_str).collect();
            tasks.extend(
                out.tasks()
                    .iter()
                    .filter(|t| t.task_arn().is_some_and(|a| wanted.contains(a)))
                    .filter(|t| self.in_cluster(t.cluster_arn()))
                    .cloned(),
            );
        }
        Ok(tasks)
    }

    /// The tasks of `arns` that ECS knows, one `DescribeTasks` per 100 ARNs; a failure
    /// other than `MISSING` is a transient error.
    async fn read(
        &self,
        arns: &[String],
        op: &'static str,
    ) -> Result<Vec<ComputeInstance>, PortError> {
        let tasks = self.described_tasks(arns, op).await?;
        let mut out = Vec::with_capacity(tasks.len());
        let mut untagged = Vec::new();
        for task in &tasks {
            match instance_from_task(task) {
                Some(i) => out.push(i),
                None if self.pool.is_some() && crate::ecs_pool::is_pool_task(task) => {
                    untagged.push(task);
                }
                None => {
                    return Err(invalid(
                        op,
                        format!(
                            "task {} carries no {TAG_ENVIRONMENT} / {TAG_GENERATION} tags",
                            task.task_arn().unwrap_or_default()
                        ),
                    ));
                }
            }
        }
        if !untagged.is_empty() {
            // Pool members claimed but not tagged yet (a worker died between the claim
            // and TagResource): read from their member items, one BatchGetItem.
            let resolved = self
                .resolve_pool_tasks(&untagged, &HashMap::new(), op)
                .await?;
            for task in untagged {
                let arn = task.task_arn().unwrap_or_default();
                out.push(resolved.get(arn).cloned().ok_or_else(|| {
                    invalid(
                        op,
                        format!(
                            "task {arn} is a warm pool member no environment claimed (idle, recycled or without its item)"
                        ),
                    )
                })?);
            }
        }
        Ok(out)
    }

    /// What a `RunTask` that answered with an error means (ECS API reference, RunTask
    /// "Errors" and "Common Errors"; AWS SDKs and Tools reference, "Retry behavior"):
    ///
    /// - no answer (timeout, connection failure), HTTP 5xx or 429, or a throttling /
    ///   internal code ([`crate::sdk_error::is_transient_code`]: `ThrottlingException`,
    ///   `ServerException`, ...) → `Err` (transient): **outcome unknown**, the task may
    ///   have started. The SDK has already retried it (standard retry mode: up to 3
    ///   attempts, exponential backoff with full jitter); the controller then hands the
    ///   job off and the next holder replays the same `clientToken`.
    /// - `ConflictException` ("the same client token with different parameters") with
    ///   `resourceIds` → [`Started::Instance`] of the task those ids name: the start this
    ///   token made earlier is adopted (read by ARN with `DescribeTasks`; when that read
    ///   finds nothing yet — ECS reads lag `RunTask` — or fails, the task is recorded
    ///   `PROVISIONING` from its ARN and the spec, and the next decision reads it by id).
    ///   Without `resourceIds` it is outcome unknown.
    /// - any other error the service answered (HTTP 4xx: `ClientException`,
    ///   `InvalidParameterException`, `AccessDeniedException`, `ClusterNotFoundException`,
    ///   `PlatformUnknownException`, `PlatformTaskDefinitionIncompatibilityException`,
    ///   `UnsupportedFeatureException`, `BlockedException`, ...) means ECS refused the
    ///   request and **no task started** → [`Started::Failed`] with `"<code> (HTTP
    ///   <status>): <message>"` as the reason, like a `200` answer with `failures`: the
    ///   controller counts it in `start_failures` (the failed-start alarm), records the
    ///   failure and backs off ([`sandbox_core::observed::Policy::start_backoff_secs`]).
    ///   A request the SDK could not build is a permanent `Err` (a bug, nothing sent).
    async fn run_task_error(
        &self,
        spec: &StartSpec,
        err: &SdkError<RunTaskError, HttpResponse>,
    ) -> Result<Started, PortError> {
        let op = "start";
        let SdkError::ServiceError(service) = err else {
            return Err(port_error(DEP, op, err));
        };
        let status = service.raw().status().as_u16();
        let code = err.code().unwrap_or("Unknown");
        if status >= 500 || status == 429 || is_transient_code(code) {
            tracing::warn!(environment_id = %spec.environment_id, code, status, "RunTask outcome unknown");
            return Err(port_error(DEP, op, err));
        }
        if let RunTaskError::ConflictException(conflict) = service.err() {
            let Some(arn) = conflict
                .resource_ids()
                .iter()
                .find(|id| id.contains(":task/"))
                .or_else(|| conflict.resource_ids().first())
            else {
                return Err(PortError::transient(
                    DEP,
                    op,
                    format!("ConflictException without resourceIds: {err}"),
                ));
            };
            let seen = self
                .read(std::slice::from_ref(arn), op)
                .await
                .ok()
                .and_then(|found| found.into_iter().next());
            tracing::info!(task = %arn, environment_id = %spec.environment_id, generation = %spec.generation,
                visible = seen.is_some(), "RunTask ConflictException: adopting the task this clientToken started");
            return Ok(Started::Instance(seen.unwrap_or_else(|| ComputeInstance {
                instance_id: InstanceId::new(arn),
                environment_id: spec.environment_id.clone(),
                session_id: Some(spec.session_id.clone()),
                generation: spec.generation,
                status: ComputeStatus::Provisioning,
                started_at: None,
                stop_code: None,
                exit: None,
            })));
        }
        let reason = format!(
            "{code} (HTTP {status}): {}",
            err.message().unwrap_or_default()
        );
        tracing::warn!(environment_id = %spec.environment_id, generation = %spec.generation,
            %reason, "RunTask refused: no task started");
        Ok(Started::Failed { reason })
    }

    /// The awsvpc network configuration of every task (cold or pool member): the
    /// configured subnets (at least one), security groups (none: the VPC's default) and
    /// public-IP setting.
    pub(crate) fn network(&self, op: &'static str) -> Result<NetworkConfiguration, PortError> {
        if self.config.subnets.is_empty() {
            return Err(invalid(
                op,
                "EcsConfig.subnets must name at least one subnet",
            ));
        }
        let vpc = AwsVpcConfiguration::builder()
            .set_subnets(Some(self.config.subnets.clone()))
            .set_security_groups(
                (!self.config.security_groups.is_empty())
                    .then(|| self.config.security_groups.clone()),
            )
            .assign_public_ip(if self.config.assign_public_ip {
                AssignPublicIp::Enabled
            } else {
                AssignPublicIp::Disabled
            })
            .build()
            .map_err(|e| invalid(op, format!("network configuration: {e}")))?;
        Ok(NetworkConfiguration::builder()
            .awsvpc_configuration(vpc)
            .build())
    }

    /// The task definition's family: `family`, `family:revision` or
    /// `arn:aws:ecs:region:account:task-definition/family:revision`.
    fn family(&self) -> &str {
        let td = self.config.task_definition.as_str();
        let name = td.rsplit_once("task-definition/").map_or(td, |(_, n)| n);
        name.split(':').next().unwrap_or(name)
    }

    /// `StopTask` of `arn` with `reason` truncated to 255 characters (the ECS limit),
    /// unless `not_after` (Unix seconds) passed: the stop of every task, an environment's
    /// or a pool member.
    pub(crate) async fn stop_task(
        &self,
        arn: &str,
        reason: &str,
        not_after: u64,
        op: &'static str,
    ) -> Result<(), PortError> {
        check_deadline(DEP, op, self.clock.now(), not_after)?;
        self.client
            .stop_task()
            .cluster(&self.config.cluster)
            .task(arn)
            .reason(truncate_chars(reason, MAX_STOP_REASON_CHARS))
            .send()
            .await
            .map_err(|e| port_error(DEP, op, &e))?;
        Ok(())
    }

    /// Every live task ARN a `ListTasks` request finds, every page: by one `startedBy`
    /// alone (an environment's, or the pool's), or by the task family with
    /// `desiredStatus` `RUNNING`.
    pub(crate) async fn list_arns(
        &self,
        started_by: Option<&str>,
        op: &'static str,
    ) -> Result<Vec<String>, PortError> {
        let mut arns = Vec::new();
        let mut seen = HashSet::new();
        let request = self.client.list_tasks().cluster(&self.config.cluster);
        let request = match started_by {
            Some(value) => request.started_by(value),
            None => request
                .family(self.family())
                .desired_status(DesiredStatus::Running),
        };
        let mut pages = request.into_paginator().send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| port_error(DEP, op, &e))?;
            for arn in page.task_arns() {
                if seen.insert(arn.clone()) {
                    arns.push(arn.clone());
                }
            }
        }
        Ok(arns)
    }
    /// The live tasks of `deployment` among `arns`: `DescribeTasks` per 100, kept when
    /// tagged with the deployment and active. A pool member without environment tags is
    /// resolved from its member item (`known`, by member key, else one `BatchGetItem` per
    /// chunk): claimed, it is its environment's instance; idle or recycled, it is no
    /// environment's and left out.
    async fn live_of(
        &self,
        deployment: &DeploymentId,
        arns: &[String],
        known: &HashMap<String, crate::pool_table::MemberItem>,
    ) -> Result<Vec<ComputeInstance>, PortError> {
        let tasks = self.described_tasks(arns, "list").await?;
        let mut out = Vec::with_capacity(tasks.len());
        let mut untagged = Vec::new();
        for task in &tasks {
            if tag_value(task, TAG_DEPLOYMENT) != Some(deployment.as_str()) {
                continue;
            }
            match instance_from_task(task) {
                Some(i) if i.status.is_active() => out.push(i),
                Some(_) => {}
                None if self.pool.is_some() && crate::ecs_pool::is_pool_task(task) => {
                    untagged.push(task);
                }
                None => tracing::warn!(
                    task = task.task_arn().unwrap_or_default(),
                    "task of this deployment without environment/generation tags; skipped"
                ),
            }
        }
        if !untagged.is_empty() {
            let resolved = self.resolve_pool_tasks(&untagged, known, "list").await?;
            out.extend(resolved.into_values().filter(|i| i.status.is_active()));
        }
        Ok(out)
    }
}

/// Without the `ec2` feature ECS keeps no workspace (the defaults keep nothing, `none`);
/// with it, see [`crate::ebs_workspaces`].
#[cfg(not(feature = "ec2"))]
impl sandbox_controller::ports::Workspaces for EcsCompute {}

impl Compute for EcsCompute {
    async fn start(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<Started, PortError> {
        let op = "start";
        check_tag_value(op, TAG_DEPLOYMENT, deployment.as_str())?;
        check_tag_value(op, TAG_ENVIRONMENT, spec.environment_id.as_str())?;
        check_tag_value(op, TAG_SESSION, spec.session_id.as_str())?;
        let network = self.network(op)?;
        let generation = spec.generation.0.to_string();
        let overrides = TaskOverride::builder()
            .container_overrides(
                ContainerOverride::builder()
                    .name(&self.config.container_name)
                    .environment(
                        KeyValuePair::builder()
                            .name(ENV_REMOTE_URL)
                            .value(&spec.remote_url)
                            .build(),
                    )
                    .environment(
                        KeyValuePair::builder()
                            .name(ENV_ENVIRONMENT_ID)
                            .value(spec.environment_id.as_str())
                            .build(),
                    )
                    .build(),
            )
            .build();
        #[cfg(feature = "ec2")]
        let volume = match self.ebs() {
            Some(ebs) => Some(crate::ebs_workspaces::volume_configuration(
                &ebs.config,
                spec,
                deployment,
            )?),
            None => None,
        };
        #[cfg(not(feature = "ec2"))]
        let volume: Option<aws_sdk_ecs::types::TaskVolumeConfiguration> = None;
        check_deadline(DEP, op, self.clock.now(), not_after)?;
        let out = self
            .client
            .run_task()
            .set_volume_configurations(volume.map(|v| vec![v]))
            .cluster(&self.config.cluster)
            .task_definition(&self.config.task_definition)
            .launch_type(LaunchType::Fargate)
            .count(1)
            .started_by(environment_started_by(deployment, &spec.environment_id))
            .client_token(&spec.idempotency_token)
            .network_configuration(network)
            .overrides(overrides)
            .tags(tag(TAG_DEPLOYMENT, deployment.as_str()))
            .tags(tag(TAG_ENVIRONMENT, spec.environment_id.as_str()))
            .tags(tag(TAG_SESSION, spec.session_id.as_str()))
            .tags(tag(TAG_GENERATION, &generation))
            .propagate_tags(PropagateTags::TaskDefinition)
            .enable_ecs_managed_tags(true)
            .send()
            .await;
        let out = match out {
            Ok(out) => out,
            Err(e) => return self.run_task_error(spec, &e).await,
        };
        let Some(task) = out.tasks().iter().find(|t| t.task_arn().is_some()) else {
            let reason = run_task_failures(&out);
            tracing::warn!(
                environment_id = %spec.environment_id,
                generation = %spec.generation,
                %reason,
                "RunTask started no task"
            );
            return Ok(Started::Failed { reason });
        };
        let arn = task.task_arn().unwrap_or_default();
        tracing::info!(
            task = %arn,
            environment_id = %spec.environment_id,
            generation = %spec.generation,
            "RunTask started a task"
        );
        Ok(Started::Instance(ComputeInstance {
            instance_id: InstanceId::new(arn),
            environment_id: spec.environment_id.clone(),
            session_id: Some(spec.session_id.clone()),
            generation: spec.generation,
            status: ComputeStatus::from_ecs_last_status(task.last_status().unwrap_or("")),
            started_at: started_at(task),
            stop_code: None,
            exit: None,
        }))
    }

    async fn describe(&self, id: &InstanceId) -> Result<Option<ComputeInstance>, PortError> {
        let found = self.read(&[id.as_str().to_owned()], "describe").await?;
        Ok(found.into_iter().next())
    }

    async fn describe_many(&self, ids: &[InstanceId]) -> Result<Vec<ComputeInstance>, PortError> {
        let arns: Vec<String> = ids.iter().map(|i| i.as_str().to_owned()).collect();
        self.read(&arns, "describe").await
    }

    async fn find(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
    ) -> Result<Vec<ComputeInstance>, PortError> {
        let started_by = environment_started_by(deployment, environment_id);
        let mut arns = self.list_arns(Some(&started_by), "find").await?;
        // Claimed pool members keep the pool's startedBy: their member items name them.
        let mut known = HashMap::new();
        if let Some(pool) = &self.pool {
            for member in pool
                .table
                .claimed_for(deployment, environment_id, self.clock.now())
                .await?
            {
                if !arns.contains(&member.task_arn) {
                    arns.push(member.task_arn.clone());
                }
                known.insert(member.pk.clone(), member);
            }
        }
        Ok(self
            .live_of(deployment, &arns, &known)
            .await?
            .into_iter()
            .filter(|i| &i.environment_id == environment_id)
            .collect())
    }

    async fn list(&self, deployment: &DeploymentId) -> Result<Vec<ComputeInstance>, PortError> {
        let arns = self.list_arns(None, "list").await?;
        self.live_of(deployment, &arns, &HashMap::new()).await
    }

    async fn stop(&self, id: &InstanceId, reason: &str, not_after: u64) -> Result<(), PortError> {
        self.stop_task(id.as_str(), reason, not_after, "stop")
            .await?;
        self.pool_release(id).await
    }

    /// See [`crate::ecs_pool`] (refused without [`EcsCompute::with_pool`]).
    async fn start_pool_member(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<PoolMember, PortError> {
        self.pool_start_member(deployment, not_after).await
    }

    /// See [`crate::ecs_pool`] (empty without the pool).
    async fn list_pool(&self, deployment: &DeploymentId) -> Result<Vec<PoolMember>, PortError> {
        self.pool_list(deployment).await
    }

    /// See [`crate::ecs_pool`] (a miss without the pool).
    async fn claim_pool_member(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        created_after: u64,
        not_after: u64,
    ) -> Result<Option<Started>, PortError> {
        self.pool_claim(spec, deployment, created_after, not_after, None)
            .await
    }

    /// See [`crate::ecs_pool`]; with [`EcsCompute::with_claim_fence`] the claim's
    /// transaction is conditioned on the environment's lock.
    async fn claim_pool_member_fenced(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        created_after: u64,
        not_after: u64,
        fence: &sandbox_controller::ports::Fence,
    ) -> Result<Option<Started>, PortError> {
        self.pool_claim(spec, deployment, created_after, not_after, Some(fence))
            .await
    }

    /// See [`crate::ecs_pool`] (a stop without the pool, as the default).
    async fn recycle_pool_member(
        &self,
        id: &InstanceId,
        not_after: u64,
    ) -> Result<bool, PortError> {
        self.pool_recycle(id, not_after).await
    }

    /// See [`crate::ecs_pool`] (nothing without the pool).
    async fn reconcile_pool(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<usize, PortError> {
        self.pool_reconcile(deployment, not_after).await
    }

    /// [`EcsCompute::take_refill_lease`] (one conditional `UpdateItem` on
    /// `refill#<deployment>`); without the pool nothing can be overfilled: `Ok(true)`.
    async fn take_pool_refill_lease(
        &self,
        deployment: &DeploymentId,
        holder: &str,
        now: u64,
        lease_secs: u64,
    ) -> Result<bool, PortError> {
        if self.pool.is_none() {
            return Ok(true);
        }
        self.take_refill_lease(deployment, holder, now, lease_secs)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_family_is_read_from_any_task_definition_form() {
        let compute = |td: &str| {
            let conf = aws_sdk_ecs::Config::builder()
                .behavior_version(aws_sdk_ecs::config::BehaviorVersion::latest())
                .build();
            EcsCompute::new(
                Client::from_conf(conf),
                EcsConfig {
                    cluster: "c".into(),
                    task_definition: td.into(),
                    container_name: "executor".into(),
                    subnets: vec!["subnet-1".into()],
                    security_groups: vec![],
                    assign_public_ip: false,
                },
            )
        };
        assert_eq!(compute("executor").family(), "executor");
        assert_eq!(compute("executor:7").family(), "executor");
        assert_eq!(
            compute("arn:aws:ecs:us-east-1:123456789012:task-definition/executor:7").family(),
            "executor"
        );
    }
}
