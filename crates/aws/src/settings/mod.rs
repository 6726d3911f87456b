//! The deployment's configuration, read from environment variables: once per cold start
//! by the Lambda functions (`sandbox-lambda` re-exports this module as
//! `sandbox_lambda::settings`), and by `sandboxctl --backend aws`, so the operator's tool
//! reads exactly what the worker and the sweeper read.
//!
//! | variable | function | required | meaning |
//! |---|---|---|---|
//! | `EVENTS_QUEUE_URL` | all | yes | URL of the events queue (FIFO, `.fifo`): webhook jobs |
//! | `EVENTS_DLQ_URL` | worker, sweeper | no | URL of the events queue's dead-letter queue (for the dead-letter count) |
//! | `TIMERS_QUEUE_URL` | worker, sweeper | yes | URL of the timers queue (standard, never `.fifo`: it delays messages) |
//! | `SWEEP_QUEUE_URL` | worker, sweeper | yes | URL of the sweep queue (standard, never `.fifo`): a fanned-out sweep's jobs, one per environment, on a queue of their own so rechecks on the timers queue never wait behind them; the worker consumes it with its own, lower, maximum concurrency |
//! | `TABLE_NAME` | worker, sweeper | yes | DynamoDB registry table name |
//! | `ECS_CLUSTER` | worker, sweeper | yes | ECS cluster name or ARN |
//! | `TASK_DEFINITION` | worker, sweeper | yes | executor task definition (`family`, `family:revision` or ARN) |
//! | `CONTAINER_NAME` | worker, sweeper | yes | the container of that task definition that gets `REMOTE_URL` / `ENVIRONMENT_ID` (the key holder: `forwarder` in split mode, `executor` in single-container mode) |
//! | `EXECUTOR_MODE` | worker, sweeper | no | `split` (default: the executor container holds no credential, a forwarder container holds the key) or `single` (fallback for codex without `forward`: the executor container holds the key; logged at start-up) |
//! | `SUBNETS` | worker, sweeper | yes | comma-separated subnet ids (at least one) |
//! | `SECURITY_GROUPS` | worker, sweeper | no | comma-separated security group ids (default: none, the VPC default group) |
//! | `ASSIGN_PUBLIC_IP` | worker, sweeper | no | `true`/`false` (also `ENABLED`/`DISABLED`, `1`/`0`); default `false` |
//! | `DEPLOYMENT_ID` | worker, sweeper (webhook: optional) | yes | this deployment: 1–36 characters of `[A-Za-z0-9_-]`; tags every task; the metrics' `deployment` dimension |
//! | `AGENT_IDS` | worker, sweeper | no | comma-separated `agent.id`s this deployment owns (default: any) |
//! | `WORKSPACE_DIRECTORY` | worker, sweeper | no | required `environment.workspace_directory` (default: any) |
//! | `OWNER_METADATA` | worker, sweeper | no | comma-separated `key=value` pairs a session's `metadata` must all carry to be this deployment's (default: any; at most 16, keys ≤ 64 chars, values ≤ 512; values cannot hold a comma) |
//! | `PROVISION_ON` | all | no | when a session's first executor starts: `connection_request` (default: its first `environment_connection` requirement) or `created` (already on `agent.session.created`; the webhook then keeps that event) |
//! | `SHUTDOWN_GRACE_SECS` | worker, sweeper | no | seconds between an idle session and the stop (default 300) |
//! | `CONNECT_DEADLINE_SECS` | worker, sweeper | no | seconds a started executor has to connect before it is replaced (default 180; ≥ 1) |
//! | `SNAPSHOT_KEEP` | worker, sweeper | no | workspace snapshots kept per environment (default 1; ≥ 1) |
//! | `SNAPSHOT_WAIT_SECS` | worker, sweeper | no | seconds a start waits for the snapshot it restores to leave `pending`, counted from the snapshot, before it is a failed start (default 14,400 = 4 h; ≥ 1) |
//! | `SNAPSHOT_RECHECK_SECS` | worker, sweeper | no | seconds between two looks at a pending snapshot a start waits for (default 30; ≥ 1) |
//! | `CLOSE_WORKSPACE` | worker, sweeper | no | what a close does with the workspace: `delete` or `retain:<days ≥ 1>` (default `retain:7`) |
//! | `ECS_INFRASTRUCTURE_ROLE_ARN` | worker, sweeper | no | ARN of the ECS infrastructure role for EBS volumes: set, every task gets a workspace volume that is snapshotted after it stops (unset: no workspace is kept, `none`) |
//! | `WORKSPACE_VOLUME_GIB` | worker, sweeper | with `ECS_INFRASTRUCTURE_ROLE_ARN` | size of each workspace volume, GiB, within its type's range: `gp2`/`gp3` 1–16,384, `io1`/`io2` 4–16,384, `st1`/`sc1` 125–16,384 |
//! | `WORKSPACE_VOLUME_TYPE` | worker, sweeper | no | EBS volume type of the workspace volume: `gp3` (default), `gp2`, `io1`, `io2`, `st1`, `sc1` (`standard` is not supported on Fargate) |
//! | `WORKSPACE_VOLUME_IOPS` | worker, sweeper | with `io1`/`io2` | provisioned IOPS: `gp3` 3,000–16,000 (default 3,000), `io1` 100–64,000, `io2` 100–256,000, at most 500 per GiB (`io1`: 50); refused for `gp2`, `st1`, `sc1` |
//! | `WORKSPACE_VOLUME_THROUGHPUT` | worker, sweeper | no | provisioned throughput, MiB/s, `gp3` only: 125–1,000 (default 125), at most IOPS / 4 |
//! | `AGENTS_API_BASE_URL` | worker | no | Agents API root (default `https://api.openai.com/v1`) |
//! | `OPENAI_API_KEY_SECRET_ARN` | worker | yes (worker) | Secrets Manager ARN (or name) of the OpenAI API key; the sweeper reads no session and is given none |
//! | `OPERATOR_KEY_SECRET_ARN` | worker | no | Secrets Manager ARN (or name) of the operator key (at least 32 bytes): verifies the proof a forced `close`, `resolve` or `timeout_reported` job for a session no record names carries; unset, every such job is refused (docs/SECURITY.md) |
//! | `WEBHOOK_SECRET_ARN` | webhook | yes | Secrets Manager ARN (or name) of the webhook signing secret (`whsec_...`) |
//! | `WEBHOOK_PREVIOUS_SECRET_ARN` | webhook | no | ARN (or name) of the previous signing secret during a rotation: deliveries signed with either verify |
//! | `WEBHOOK_TOLERANCE_SECS` | webhook | no | accepted `webhook-timestamp` skew, both directions, seconds (default 300; 1 to 900, refused at start-up above) |
//! | `MAX_LIFETIME_SECS` | worker, sweeper | no | maximum executor lifetime, seconds (default 28,800; 0 = off) |
//! | `LIFETIME_HARD_CAP_SECS` | worker, sweeper | no | hard lifetime cap, stops even mid-turn, seconds (default 32,400; 0 = none; not below `MAX_LIFETIME_SECS`) |
//! | `NO_WORK_SECS` | worker, sweeper | no | idle without work: no turn and no connection request for this long stops the executor, seconds (default 3,600; 0 = off) |
//! | `MAX_REPLACEMENTS` | worker, sweeper | no | replacements for a missed connect deadline allowed within the window (default 3; 0 = no cap) |
//! | `REPLACEMENT_WINDOW_SECS` | worker, sweeper | no | the replacement cap's window, seconds (default 3,600; ≥ 1) |
//! | `MAX_EXECUTORS` | worker, sweeper | no | concurrency cap: executors running at once in the deployment; a start beyond it waits (`capacity_limit`) (default 0 = off) |
//! | `REMOTE_URL_ALLOWLIST` | worker, sweeper | no | comma-separated hosts a session's `remote_url` may name (`host`, `*.domain`, `scheme://host`; default `api.openai.com`, `wss` or `https` only) |
//! | `HISTORY_RETENTION_DAYS` | worker, sweeper | no | days audit entries and receipts are kept (DynamoDB TTL `expires_at`; default 30; ≥ 1); never less than `CLOSE_WORKSPACE`'s retention, so a closed record's terminal receipts outlive its retained workspace |
//! | `AWS_ENDPOINT_URL` | all | no | one endpoint for every AWS service: tests only (moto) |
//!
//! An empty or blank value counts as unset. Every failure is one [`SettingsError`] naming
//! the variable; no message ever repeats a value (a secret pasted into the wrong variable
//! must not reach the logs).
//!
//! Files: this one (the settings structs and the webhook's variables); `controller.rs`
//! (the worker's and sweeper's variables, the warm pool, the ceilings); `vars.rs` (the
//! variable reader); `volume.rs` (the workspace volume and its rules).

mod controller;
mod vars;
mod volume;

pub use controller::MAX_POOL_SIZE;
pub use volume::{
    VOLUME_TYPE_RULES, VolumeTypeRules, WORKSPACE_VOLUME_TYPES, WorkspaceVolumeSettings,
    check_workspace_volume,
};

use sandbox_controller::ControllerConfig;
use sandbox_core::observed::ProvisionOn;
use vars::Vars;

/// A variable that is missing or unusable. The message names the variable, never its value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// The variable is unset or blank.
    #[error("environment variable {var} is not set")]
    Missing {
        /// The variable's name.
        var: &'static str,
    },
    /// The variable is set but unusable.
    #[error("environment variable {var} is invalid: {reason}")]
    Invalid {
        /// The variable's name.
        var: &'static str,
        /// What was expected (never the value).
        reason: &'static str,
    },
}

/// Where a secret lives: the variable that named it and its Secrets Manager id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRef {
    /// The environment variable holding the ARN, e.g. `WEBHOOK_SECRET_ARN`.
    pub var: &'static str,
    /// The secret's ARN or name (not the secret).
    pub arn: String,
}

/// Settings of the webhook function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookSettings {
    /// `EVENTS_QUEUE_URL`.
    pub events_queue_url: String,
    /// Whether the events queue is FIFO (its URL ends in `.fifo`).
    pub events_queue_fifo: bool,
    /// `WEBHOOK_SECRET_ARN`.
    pub webhook_secret: SecretRef,
    /// `WEBHOOK_PREVIOUS_SECRET_ARN`: the previous secret during a rotation.
    pub previous_webhook_secret: Option<SecretRef>,
    /// `WEBHOOK_TOLERANCE_SECS` (default 300).
    pub tolerance_secs: u64,
    /// `DEPLOYMENT_ID`, optional here: only the metrics' `deployment` dimension uses it.
    pub deployment_id: Option<String>,
    /// `PROVISION_ON`: with `created`, the intake keeps `agent.session.created` of
    /// self-hosted sessions (default: it drops them).
    pub provision_on: ProvisionOn,
    /// `AWS_ENDPOINT_URL` (tests only).
    pub aws_endpoint_url: Option<String>,
}

/// ECS settings of the worker and sweeper functions (turned into `sandbox_aws::EcsConfig`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EcsSettings {
    /// `ECS_CLUSTER`.
    pub cluster: String,
    /// `TASK_DEFINITION`.
    pub task_definition: String,
    /// `CONTAINER_NAME`.
    pub container_name: String,
    /// `SUBNETS`, at least one.
    pub subnets: Vec<String>,
    /// `SECURITY_GROUPS`, possibly empty.
    pub security_groups: Vec<String>,
    /// `ASSIGN_PUBLIC_IP`.
    pub assign_public_ip: bool,
    /// EBS workspaces: set when `ECS_INFRASTRUCTURE_ROLE_ARN` is.
    pub workspace: Option<WorkspaceVolumeSettings>,
    /// `EXECUTOR_MODE`: which container of the task holds the executor key.
    pub executor_mode: ExecutorMode,
    /// The warm pool's table (docs/WARM_POOL.md): set when `POOL_SIZE` > 0.
    pub pool: Option<PoolTableSettings>,
}

/// Where the warm pool keeps its members on AWS (docs/WARM_POOL.md "The pool
/// table"): `POOL_TABLE_NAME` and `POOL_TASK_ROLE_ID`, required when `POOL_SIZE` > 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolTableSettings {
    /// `POOL_TABLE_NAME`.
    pub table_name: String,
    /// `POOL_TASK_ROLE_ID`: the executor task role's unique id (`AROA…`,
    /// `Fn::GetAtt ExecutorTaskRole.RoleId`); a member item's key is `<this>:<task id>`,
    /// the task's own `aws:userid`.
    pub task_role_id: String,
    /// `POOL_MAX_AGE_SECS`.
    pub max_age_secs: u64,
    /// How long a claimed member's item is kept (`HISTORY_RETENTION_DAYS`), seconds.
    pub history_retention_secs: u64,
}

/// Default of `POOL_MAX_AGE_SECS`: the controller's default (an hour).
pub const DEFAULT_POOL_MAX_AGE_SECS: u64 = 3_600;
/// Least `POOL_MAX_AGE_SECS`: a member younger than a minute may not have reached
/// `RUNNING` yet (Fargate: 30–60 s, aws-semantics.md).
pub const MIN_POOL_MAX_AGE_SECS: u64 = 60;

/// `EXECUTOR_MODE`: how the executor task is split (the task definition in
/// infra/sam/template.yaml and infra/cdk must match, `ExecutorMode` / `executorMode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExecutorMode {
    /// `split` (default): the executor container runs `codex exec-server --listen
    /// ws://127.0.0.1:PORT` with no credential; the forwarder container of the same task
    /// holds `CODEX_API_KEY` and runs `codex exec-server forward --connect` to it.
    #[default]
    Split,
    /// `single`: one container runs `codex exec-server --remote` and holds the key in its
    /// environment, readable by agent code (for codex versions without `forward`).
    SingleContainer,
}

impl ExecutorMode {
    /// The start-up warning of the single-container mode (`None` when split): one line a
    /// function logs at cold start, so a deployment that hands the key to the sandbox says so.
    pub fn start_up_warning(self) -> Option<&'static str> {
        match self {
            Self::Split => None,
            Self::SingleContainer => Some(
                "EXECUTOR_MODE=single: the executor container holds CODEX_API_KEY; agent code can read it (the single-container fallback)",
            ),
        }
    }
}

#[cfg(feature = "ecs")]
impl EcsSettings {
    /// The compute adapter's configuration (the same fields).
    pub fn ecs_config(&self) -> crate::EcsConfig {
        crate::EcsConfig {
            cluster: self.cluster.clone(),
            task_definition: self.task_definition.clone(),
            container_name: self.container_name.clone(),
            subnets: self.subnets.clone(),
            security_groups: self.security_groups.clone(),
            assign_public_ip: self.assign_public_ip,
        }
    }

    /// The compute adapter on `sdk`: ECS, the warm pool's table when `POOL_SIZE` > 0, and
    /// EBS workspaces when configured.
    ///
    /// # Errors
    /// [`SettingsError`] naming `ECS_INFRASTRUCTURE_ROLE_ARN` when workspaces are
    /// configured but this build lacks the `ec2` feature.
    pub fn compute(&self, sdk: &aws_config::SdkConfig) -> Result<crate::EcsCompute, SettingsError> {
        let mut compute = crate::EcsCompute::new(aws_sdk_ecs::Client::new(sdk), self.ecs_config());
        if let Some(pool) = &self.pool {
            compute = compute.with_pool(
                aws_sdk_dynamodb::Client::new(sdk),
                crate::PoolConfig {
                    table_name: pool.table_name.clone(),
                    task_role_id: pool.task_role_id.clone(),
                    max_age_secs: pool.max_age_secs,
                    history_retention_secs: pool.history_retention_secs,
                },
            );
        }
        match &self.workspace {
            None => Ok(compute),
            #[cfg(feature = "ec2")]
            Some(ws) => Ok(compute.with_workspaces(aws_sdk_ec2::Client::new(sdk), ws.ebs_config())),
            #[cfg(not(feature = "ec2"))]
            Some(_) => Err(SettingsError::Invalid {
                var: "ECS_INFRASTRUCTURE_ROLE_ARN",
                reason: "set, but this build has no EBS workspace support (sandbox-aws feature `ec2`)",
            }),
        }
    }
}

/// Settings of the worker and sweeper functions.
#[derive(Clone, Debug)]
pub struct ControllerSettings {
    /// `EVENTS_QUEUE_URL`.
    pub events_queue_url: String,
    /// Whether the events queue is FIFO (its URL ends in `.fifo`).
    pub events_queue_fifo: bool,
    /// `EVENTS_DLQ_URL`.
    pub events_dlq_url: Option<String>,
    /// `TIMERS_QUEUE_URL` (standard queue).
    pub timers_queue_url: String,
    /// `SWEEP_QUEUE_URL` (standard queue, never the timers queue).
    pub sweep_queue_url: String,
    /// `TABLE_NAME`.
    pub table_name: String,
    /// ECS settings.
    pub ecs: EcsSettings,
    /// `AGENTS_API_BASE_URL`, or the default.
    pub agents_api_base_url: String,
    /// `OPENAI_API_KEY_SECRET_ARN`: required by whatever reads a session (the worker,
    /// `sandboxctl close`/`explain`), absent for the sweeper, which reads none
    /// ([`ControllerSettings::api_key_secret`] names the variable when it is missing).
    pub api_key_secret: Option<SecretRef>,
    /// `OPERATOR_KEY_SECRET_ARN`: the operator key's secret
    /// (`sandbox_core::operator_proof`): the worker verifies forced operator jobs with it,
    /// `sandboxctl --backend aws` signs them. Unset: every `close`, `resolve` or
    /// `timeout_reported` job for a session no record names is refused.
    pub operator_key_secret: Option<SecretRef>,
    /// Controller settings: `DEPLOYMENT_ID`, `AGENT_IDS`, `WORKSPACE_DIRECTORY`,
    /// `SHUTDOWN_GRACE_SECS`, `CONNECT_DEADLINE_SECS`, and a worker id unique to this
    /// execution environment (`AWS_LAMBDA_LOG_STREAM_NAME`), so lock owners of concurrent
    /// instances never collide.
    pub controller: ControllerConfig,
    /// `AWS_ENDPOINT_URL` (tests only).
    pub aws_endpoint_url: Option<String>,
    /// `HISTORY_RETENTION_DAYS` in seconds, raised to `CLOSE_WORKSPACE`'s retention.
    pub history_retention_secs: u64,
}

/// Default of `HISTORY_RETENTION_DAYS`.
pub const DEFAULT_HISTORY_RETENTION_DAYS: u64 = 30;

/// Seconds history is kept: `days`, but never less than the workspace retention of a
/// close (`retain:<days>`), so a closed record's terminal receipts outlive its snapshots.
pub fn history_retention_secs(days: u64, close: &sandbox_core::workspace::CloseWorkspace) -> u64 {
    let retain = match close {
        sandbox_core::workspace::CloseWorkspace::Retain { days } => u64::from(*days),
        sandbox_core::workspace::CloseWorkspace::Delete => 0,
    };
    days.max(retain).saturating_mul(86_400)
}

impl WebhookSettings {
    /// Reads the process environment.
    ///
    /// # Errors
    /// [`SettingsError`] naming the first missing or invalid variable.
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads variables through `lookup` (tests).
    ///
    /// # Errors
    /// As [`WebhookSettings::from_env`].
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        let vars = Vars(lookup);
        let events_queue_url = vars.queue_url("EVENTS_QUEUE_URL")?;
        Ok(Self {
            events_queue_fifo: events_queue_url.ends_with(".fifo"),
            events_queue_url,
            webhook_secret: vars.secret_ref("WEBHOOK_SECRET_ARN")?,
            previous_webhook_secret: match vars.optional("WEBHOOK_PREVIOUS_SECRET_ARN") {
                Some(_) => Some(vars.secret_ref("WEBHOOK_PREVIOUS_SECRET_ARN")?),
                None => None,
            },
            tolerance_secs: match vars.secs(
                "WEBHOOK_TOLERANCE_SECS",
                sandbox_core::webhook::DEFAULT_TOLERANCE_SECS,
                true,
            )? {
                // A longer window lets a captured delivery be replayed long past
                // the FIFO queue's 5-minute deduplication.
                t if t > sandbox_core::webhook::MAX_TOLERANCE_SECS => {
                    return Err(SettingsError::Invalid {
                        var: "WEBHOOK_TOLERANCE_SECS",
                        reason: "whole seconds from 1 to 900",
                    });
                }
                t => t,
            },
            deployment_id: vars.optional("DEPLOYMENT_ID"),
            provision_on: vars.provision_on("PROVISION_ON")?,
            aws_endpoint_url: vars.optional("AWS_ENDPOINT_URL"),
        })
    }
}

/// The queue name at the end of a queue URL (`.../123456789012/NAME` → `NAME`), which is
/// also the last part of the queue's ARN (`arn:aws:sqs:REGION:ACCOUNT:NAME`).
pub fn queue_name_of_url(url: &str) -> &str {
    url.trim_end_matches('/').rsplit('/').next().unwrap_or(url)
}
