//! [`EcsCompute`]: the controller's [`Compute`] port on Amazon ECS Fargate, one task per
//! environment and generation.
//!
//! - **start**: first looks for a task of this deployment tagged with the spec's
//!   environment and generation (adoption by tags: a worker that crashed after `RunTask`
//!   left one) and returns it — a live one if any, else the most recently started stopped
//!   one — without starting anything. Otherwise `RunTask` with launch type `FARGATE`,
//!   count 1, the configured cluster, task definition, awsvpc subnets, security groups and
//!   public-IP setting, `startedBy` = the deployment id (≤ 36 characters), `clientToken` =
//!   the spec's idempotency token (≤ 64 characters; AWS returns the same task for a
//!   repeated token, moto ignores it), container overrides for the configured container
//!   with the environment variables `REMOTE_URL` (the session's `remote_url`, unchanged)
//!   and `ENVIRONMENT_ID` only — the executor key `CODEX_API_KEY` comes from the task
//!   definition's `secrets` (Secrets Manager), never from this process —, the tags
//!   `sandbox:deployment`, `sandbox:environment`, `sandbox:session`, `sandbox:generation`,
//!   `propagateTags` = `TASK_DEFINITION` and `enableECSManagedTags`. A `200` answer with
//!   `failures` and no task (capacity, ENI limits, a bad task definition) is
//!   [`Started::Failed`] with the failures as the reason (logged at `warn`).
//! - **describe**: `DescribeTasks` with `include = [TAGS]`, keeping only the task whose
//!   ARN is exactly the id (moto matches task ids as substrings) in the configured
//!   cluster. A `MISSING` failure or no task is `None` — except for a task this handle
//!   started less than [`RECENT_START_WINDOW`] ago: ECS reads are eventually consistent, so
//!   the read is retried with backoff (100, 200, 400, 800 ms) and, if the task is still not
//!   visible, a transient [`PortError`] is returned. A just-started task is never reported
//!   gone.
//! - **list**: `ListTasks` with `cluster` and `startedBy` as the only filters, once with
//!   `desiredStatus` `RUNNING` and once `STOPPED` (ECS lists recently stopped tasks for
//!   about an hour), every page; then `DescribeTasks` in chunks of 100 with tags. A task is
//!   kept only if its cluster ARN is exactly the configured cluster (moto's `ListTasks`
//!   cluster filter is a substring match) and its `sandbox:deployment` tag is the
//!   deployment; tasks without environment or generation tags are skipped (logged).
//!   Status comes from `lastStatus` ([`ComputeStatus::from_ecs_last_status`]), `started_at`
//!   from `startedAt`, else `createdAt` (Unix seconds).
//! - **stop**: `StopTask` with the reason truncated to 255 characters (the ECS limit).
//!
//! Errors: throttling, 5xx, timeouts and connection failures are transient
//! [`PortError`]s; validation errors (`ClientException`, `InvalidParameterException`, an
//! unknown cluster) are permanent. Sources: the Amazon ECS API Reference (RunTask,
//! DescribeTasks, ListTasks, StopTask) and the AWS tagging rules (keys ≤ 128, values ≤ 256
//! characters of letters, digits, spaces and `+ - = . _ : / @`).

use crate::sdk_error::port_error;
use aws_sdk_ecs::Client;
use aws_sdk_ecs::types::{
    AssignPublicIp, AwsVpcConfiguration, ContainerOverride, DesiredStatus, KeyValuePair,
    LaunchType, NetworkConfiguration, PropagateTags, Tag, Task, TaskField, TaskOverride,
};
use sandbox_controller::ports::{Clock, Compute, PortError, Started, SystemClock, check_deadline};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation, InstanceId, SessionId};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DEP: &str = "compute";

/// Tag: the deployment id (also `startedBy`).
pub const TAG_DEPLOYMENT: &str = "sandbox:deployment";
/// Tag: the environment id.
pub const TAG_ENVIRONMENT: &str = "sandbox:environment";
/// Tag: the session id.
pub const TAG_SESSION: &str = "sandbox:session";
/// Tag: the executor generation (decimal).
pub const TAG_GENERATION: &str = "sandbox:generation";
/// Container environment variable: the session's `remote_url`, unchanged.
pub const ENV_REMOTE_URL: &str = "REMOTE_URL";
/// Container environment variable: the environment id.
pub const ENV_ENVIRONMENT_ID: &str = "ENVIRONMENT_ID";

/// How long after its start a task that DescribeTasks does not show counts as "not
/// visible yet" rather than gone: 60 s.
pub const RECENT_START_WINDOW: Duration = Duration::from_secs(60);
/// Backoff between `DescribeTasks` retries for a recently started task.
const DESCRIBE_BACKOFF: [Duration; 4] = [
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
];
/// `DescribeTasks` accepts at most 100 tasks per call.
const DESCRIBE_CHUNK: usize = 100;
/// `StopTask` reason limit, characters.
pub const MAX_STOP_REASON_CHARS: usize = 255;
/// AWS tag value limit, characters.
const MAX_TAG_VALUE_CHARS: usize = 256;

/// Where and how tasks run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EcsConfig {
    /// Cluster name or ARN.
    pub cluster: String,
    /// Task definition: `family`, `family:revision` or its ARN. Its container named
    /// [`EcsConfig::container_name`] runs `codex exec-server --remote "$REMOTE_URL"
    /// --environment-id "$ENVIRONMENT_ID"` and gets `CODEX_API_KEY` from its `secrets`.
    pub task_definition: String,
    /// The executor container's name in the task definition (the override target).
    pub container_name: String,
    /// awsvpc subnets (ids), at least one.
    pub subnets: Vec<String>,
    /// awsvpc security groups (ids); empty: the VPC's default group.
    pub security_groups: Vec<String>,
    /// Whether the task gets a public IP (`ENABLED`): needed in a public subnet without a
    /// NAT gateway, since the executor connects outbound.
    pub assign_public_ip: bool,
}

/// The compute provider on ECS Fargate. Cheap to clone (clones share the client and the
/// memory of recent starts).
#[derive(Clone, Debug)]
pub struct EcsCompute {
    client: Client,
    config: Arc<EcsConfig>,
    /// Task ARNs this handle started, with when: not-yet-visible is not gone.
    recent: Arc<Mutex<HashMap<String, Instant>>>,
}

fn invalid(operation: &'static str, message: impl Into<String>) -> PortError {
    PortError::permanent(DEP, operation, message)
}

/// Checks a tag value against the AWS tagging rules.
fn check_tag_value(operation: &'static str, key: &str, value: &str) -> Result<(), PortError> {
    let len = value.chars().count();
    let ok_chars = value
        .chars()
        .all(|c| c.is_alphanumeric() || c == ' ' || "+-=._:/@".contains(c));
    if len > MAX_TAG_VALUE_CHARS || !ok_chars {
        return Err(invalid(
            operation,
            format!(
                "tag {key} value must be at most {MAX_TAG_VALUE_CHARS} letters, digits, spaces or + - = . _ : / @ (got {len} characters)"
            ),
        ));
    }
    Ok(())
}

fn tag(key: &str, value: &str) -> Tag {
    Tag::builder().key(key).value(value).build()
}

fn tag_value<'a>(task: &'a Task, key: &str) -> Option<&'a str> {
    task.tags()
        .iter()
        .find(|t| t.key() == Some(key))
        .and_then(|t| t.value())
}

/// Truncates to at most `max` characters.
fn truncate_chars(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn started_at(task: &Task) -> Option<u64> {
    task.started_at()
        .or(task.created_at())
        .and_then(|t| u64::try_from(t.secs()).ok())
}

/// The instance a described task is, from its tags; `None` when it lacks them.
fn instance_from_task(task: &Task) -> Option<ComputeInstance> {
    let arn = task.task_arn()?;
    let environment_id = EnvironmentId::new(tag_value(task, TAG_ENVIRONMENT)?);
    let generation = Generation(tag_value(task, TAG_GENERATION)?.parse::<u64>().ok()?);
    Some(ComputeInstance {
        instance_id: InstanceId::new(arn),
        environment_id,
        session_id: tag_value(task, TAG_SESSION).map(SessionId::new),
        generation,
        status: ComputeStatus::from_ecs_last_status(task.last_status().unwrap_or("")),
        started_at: started_at(task),
    })
}

impl EcsCompute {
    /// A provider on `config.cluster`. Makes no call.
    pub fn new(client: Client, config: EcsConfig) -> Self {
        Self {
            client,
            config: Arc::new(config),
            recent: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EcsConfig {
        &self.config
    }

    /// Whether `cluster_arn` is exactly the configured cluster (by ARN, or by name when a
    /// name is configured).
    fn in_cluster(&self, cluster_arn: Option<&str>) -> bool {
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

    fn remember_start(&self, arn: &str) {
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        recent.retain(|_, at| at.elapsed() < RECENT_START_WINDOW);
        recent.insert(arn.to_owned(), Instant::now());
    }

    /// How long ago this handle started `arn`, if within [`RECENT_START_WINDOW`].
    fn started_recently(&self, arn: &str) -> Option<Duration> {
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        recent.retain(|_, at| at.elapsed() < RECENT_START_WINDOW);
        recent.get(arn).map(Instant::elapsed)
    }

    /// `DescribeTasks` for `arns` (≤ 100) with tags; only tasks whose ARN was asked for
    /// exactly and which run in the configured cluster. The second value: ARNs reported
    /// with a failure other than `MISSING`, with the reason.
    async fn describe_tasks(
        &self,
        arns: &[String],
        op: &'static str,
    ) -> Result<(Vec<Task>, Vec<String>), PortError> {
        let out = self
            .client
            .describe_tasks()
            .cluster(&self.config.cluster)
            .set_tasks(Some(arns.to_vec()))
            .include(TaskField::Tags)
            .send()
            .await
            .map_err(|e| port_error(DEP, op, &e))?;
        let wanted: HashSet<&str> = arns.iter().map(String::as_str).collect();
        let tasks = out
            .tasks()
            .iter()
            .filter(|t| t.task_arn().is_some_and(|a| wanted.contains(a)))
            .filter(|t| self.in_cluster(t.cluster_arn()))
            .cloned()
            .collect();
        let other_failures = out
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
        Ok((tasks, other_failures))
    }

    /// One read of one task: `Some` if visible, `None` if missing.
    async fn describe_once(&self, id: &InstanceId) -> Result<Option<ComputeInstance>, PortError> {
        let op = "describe";
        let (tasks, failures) = self.describe_tasks(&[id.as_str().to_owned()], op).await?;
        if let Some(task) = tasks.first() {
            return instance_from_task(task).map(Some).ok_or_else(|| {
                invalid(
                    op,
                    format!("task {id} carries no {TAG_ENVIRONMENT} / {TAG_GENERATION} tags"),
                )
            });
        }
        if !failures.is_empty() {
            return Err(PortError::transient(DEP, op, failures.join("; ")));
        }
        Ok(None)
    }

    /// Every task ARN of `deployment` with `desiredStatus` = `status`, every page.
    async fn list_arns(
        &self,
        deployment: &DeploymentId,
        status: DesiredStatus,
        into: &mut Vec<String>,
        seen: &mut HashSet<String>,
    ) -> Result<(), PortError> {
        let mut pages = self
            .client
            .list_tasks()
            .cluster(&self.config.cluster)
            .started_by(deployment.as_str())
            .desired_status(status)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| port_error(DEP, "list", &e))?;
            for arn in page.task_arns() {
                if seen.insert(arn.clone()) {
                    into.push(arn.clone());
                }
            }
        }
        Ok(())
    }

    /// The task of `deployment` tagged with the spec's environment and generation, if one
    /// exists: a live one first, else the most recently started stopped one.
    async fn adoptable(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
    ) -> Result<Option<ComputeInstance>, PortError> {
        let mut same: Vec<ComputeInstance> = self
            .list(deployment)
            .await?
            .into_iter()
            .filter(|i| i.environment_id == spec.environment_id && i.generation == spec.generation)
            .collect();
        same.sort_by_key(|i| (i.status.is_live(), i.started_at));
        Ok(same.pop())
    }
}

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
        if self.config.subnets.is_empty() {
            return Err(invalid(
                op,
                "EcsConfig.subnets must name at least one subnet",
            ));
        }
        if let Some(existing) = self.adoptable(spec, deployment).await? {
            tracing::info!(
                task = %existing.instance_id,
                environment_id = %spec.environment_id,
                generation = %spec.generation,
                "adopting the task already started for this environment and generation"
            );
            return Ok(Started::Instance(existing));
        }
        let generation = spec.generation.0.to_string();
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
        check_deadline(DEP, op, SystemClock.now(), not_after)?;
        let out = self
            .client
            .run_task()
            .cluster(&self.config.cluster)
            .task_definition(&self.config.task_definition)
            .launch_type(LaunchType::Fargate)
            .count(1)
            .started_by(deployment.as_str())
            .client_token(&spec.idempotency_token)
            .network_configuration(
                NetworkConfiguration::builder()
                    .awsvpc_configuration(vpc)
                    .build(),
            )
            .overrides(overrides)
            .tags(tag(TAG_DEPLOYMENT, deployment.as_str()))
            .tags(tag(TAG_ENVIRONMENT, spec.environment_id.as_str()))
            .tags(tag(TAG_SESSION, spec.session_id.as_str()))
            .tags(tag(TAG_GENERATION, &generation))
            .propagate_tags(PropagateTags::TaskDefinition)
            .enable_ecs_managed_tags(true)
            .send()
            .await
            .map_err(|e| port_error(DEP, op, &e))?;
        let Some(task) = out.tasks().iter().find(|t| t.task_arn().is_some()) else {
            let reason = if out.failures().is_empty() {
                "RunTask returned no task and no failure".to_owned()
            } else {
                out.failures()
                    .iter()
                    .map(|f| {
                        let mut s = format!(
                            "{}: {}",
                            f.arn().unwrap_or("-"),
                            f.reason().unwrap_or("unknown")
                        );
                        if let Some(detail) = f.detail() {
                            s.push_str(&format!(" ({detail})"));
                        }
                        s
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            tracing::warn!(
                environment_id = %spec.environment_id,
                generation = %spec.generation,
                %reason,
                "RunTask started no task"
            );
            return Ok(Started::Failed { reason });
        };
        let arn = task.task_arn().unwrap_or_default();
        self.remember_start(arn);
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
        }))
    }

    async fn describe(&self, id: &InstanceId) -> Result<Option<ComputeInstance>, PortError> {
        if let Some(found) = self.describe_once(id).await? {
            return Ok(Some(found));
        }
        if self.started_recently(id.as_str()).is_none() {
            return Ok(None);
        }
        for pause in DESCRIBE_BACKOFF {
            tokio::time::sleep(pause).await;
            if let Some(found) = self.describe_once(id).await? {
                return Ok(Some(found));
            }
        }
        let age = self
            .started_recently(id.as_str())
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Err(PortError::transient(
            DEP,
            "describe",
            format!("task {id} started {age} s ago is not visible yet"),
        ))
    }

    async fn list(&self, deployment: &DeploymentId) -> Result<Vec<ComputeInstance>, PortError> {
        let mut arns = Vec::new();
        let mut seen = HashSet::new();
        self.list_arns(deployment, DesiredStatus::Running, &mut arns, &mut seen)
            .await?;
        self.list_arns(deployment, DesiredStatus::Stopped, &mut arns, &mut seen)
            .await?;
        let mut out = Vec::new();
        for chunk in arns.chunks(DESCRIBE_CHUNK) {
            let (tasks, failures) = self.describe_tasks(chunk, "list").await?;
            if !failures.is_empty() {
                return Err(PortError::transient(DEP, "list", failures.join("; ")));
            }
            for task in &tasks {
                if tag_value(task, TAG_DEPLOYMENT) != Some(deployment.as_str()) {
                    continue;
                }
                match instance_from_task(task) {
                    Some(i) => out.push(i),
                    None => tracing::warn!(
                        task = task.task_arn().unwrap_or_default(),
                        "task of this deployment without environment/generation tags; skipped"
                    ),
                }
            }
        }
        Ok(out)
    }

    async fn stop(&self, id: &InstanceId, reason: &str, not_after: u64) -> Result<(), PortError> {
        check_deadline(DEP, "stop", SystemClock.now(), not_after)?;
        self.client
            .stop_task()
            .cluster(&self.config.cluster)
            .task(id.as_str())
            .reason(truncate_chars(reason, MAX_STOP_REASON_CHARS))
            .send()
            .await
            .map_err(|e| port_error(DEP, "stop", &e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate_chars("abc", 2), "ab");
        assert_eq!(truncate_chars("ééé", 2), "éé");
        assert_eq!(truncate_chars("ab", 255), "ab");
        let long = "x".repeat(300);
        assert_eq!(truncate_chars(&long, MAX_STOP_REASON_CHARS).len(), 255);
    }

    #[test]
    fn tag_values_follow_the_aws_rules() {
        assert!(check_tag_value("t", "k", "env_abc-1.2:3/4@x").is_ok());
        assert!(check_tag_value("t", "k", "has space").is_ok());
        assert!(check_tag_value("t", "k", "bad!").is_err());
        assert!(check_tag_value("t", "k", &"a".repeat(257)).is_err());
    }
}
