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
//! | `SNAPSHOT_WAIT_SECS` | worker, sweeper | no | seconds a start waits for the snapshot it restores to leave `pending`, counted from the snapshot, before it is a failed start (default 14,400 = 4 h; ≥ 1; issue 23) |
//! | `SNAPSHOT_RECHECK_SECS` | worker, sweeper | no | seconds between two looks at a pending snapshot a start waits for (default 30; ≥ 1) |
//! | `CLOSE_WORKSPACE` | worker, sweeper | no | what a close does with the workspace: `delete` or `retain:<days ≥ 1>` (default `retain:7`) |
//! | `ECS_INFRASTRUCTURE_ROLE_ARN` | worker, sweeper | no | ARN of the ECS infrastructure role for EBS volumes: set, every task gets a workspace volume that is snapshotted after it stops (issue 14; unset: no workspace is kept, `none`) |
//! | `WORKSPACE_VOLUME_GIB` | worker, sweeper | with `ECS_INFRASTRUCTURE_ROLE_ARN` | size of each workspace volume, GiB, within its type's range: `gp2`/`gp3` 1–16,384, `io1`/`io2` 4–16,384, `st1`/`sc1` 125–16,384 |
//! | `WORKSPACE_VOLUME_TYPE` | worker, sweeper | no | EBS volume type of the workspace volume: `gp3` (default), `gp2`, `io1`, `io2`, `st1`, `sc1` (`standard` is not supported on Fargate) |
//! | `WORKSPACE_VOLUME_IOPS` | worker, sweeper | with `io1`/`io2` | provisioned IOPS: `gp3` 3,000–16,000 (default 3,000), `io1` 100–64,000, `io2` 100–256,000, at most 500 per GiB (`io1`: 50); refused for `gp2`, `st1`, `sc1` |
//! | `WORKSPACE_VOLUME_THROUGHPUT` | worker, sweeper | no | provisioned throughput, MiB/s, `gp3` only: 125–1,000 (default 125), at most IOPS / 4 |
//! | `AGENTS_API_BASE_URL` | worker | no | Agents API root (default `https://api.openai.com/v1`) |
//! | `OPENAI_API_KEY_SECRET_ARN` | worker | yes (worker) | Secrets Manager ARN (or name) of the OpenAI API key; the sweeper reads no session and is given none (issue 24) |
//! | `OPERATOR_KEY_SECRET_ARN` | worker | no | Secrets Manager ARN (or name) of the operator key (at least 32 bytes): verifies the proof a forced `close`, `resolve` or `timeout_reported` job for a session no record names carries; unset, every such job is refused (README.md, "Security") |
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
//! | `HISTORY_RETENTION_DAYS` | worker, sweeper | no | days audit entries and receipts are kept (DynamoDB TTL `expires_at`; default 30; ≥ 1); never less than `CLOSE_WORKSPACE`'s retention, so a closed record's terminal receipts outlive its retained workspace (issue 22) |
//! | `AWS_ENDPOINT_URL` | all | no | one endpoint for every AWS service: tests only (moto) |
//!
//! An empty or blank value counts as unset. Every failure is one [`SettingsError`] naming
//! the variable; no message ever repeats a value (a secret pasted into the wrong variable
//! must not reach the logs).

use sandbox_agents_api::DEFAULT_BASE_URL;
use sandbox_controller::ControllerConfig;
use sandbox_core::ids::DeploymentId;
use sandbox_core::observed::Policy;
use sandbox_core::observed::{MetadataRuleError, ProvisionOn, parse_metadata_rule};

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
    /// EBS workspaces: set when `ECS_INFRASTRUCTURE_ROLE_ARN` is (issue 14).
    pub workspace: Option<WorkspaceVolumeSettings>,
    /// `EXECUTOR_MODE` (issue 26): which container of the task holds the executor key.
    pub executor_mode: ExecutorMode,
    /// The warm pool's table (issue 27, docs/WARM_POOL.md): set when `POOL_SIZE` > 0.
    pub pool: Option<PoolTableSettings>,
}

/// Where the warm pool keeps its members on AWS (issue 27, docs/WARM_POOL.md "The pool
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

/// `EXECUTOR_MODE`: how the executor task is split (issue 26; the task definition in
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
                "EXECUTOR_MODE=single: the executor container holds CODEX_API_KEY; agent code can read it (issue 26 fallback)",
            ),
        }
    }
}

/// The workspace volume of every task (ECS-managed EBS), from `ECS_INFRASTRUCTURE_ROLE_ARN`,
/// `WORKSPACE_VOLUME_GIB` and `WORKSPACE_VOLUME_TYPE`; all or nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkspaceVolumeSettings {
    /// `ECS_INFRASTRUCTURE_ROLE_ARN`: the role ECS uses to create and attach the volume.
    pub infrastructure_role_arn: String,
    /// `WORKSPACE_VOLUME_GIB`, 1–16,384.
    pub size_gib: i32,
    /// `WORKSPACE_VOLUME_TYPE`, default `gp3`.
    pub volume_type: String,
    /// `WORKSPACE_VOLUME_IOPS` (`iops`): required for `io1`/`io2`, optional for `gp3`,
    /// `None` otherwise ([`VolumeTypeRules`]).
    pub iops: Option<i32>,
    /// `WORKSPACE_VOLUME_THROUGHPUT` (`throughput`, MiB/s): `gp3` only.
    pub throughput: Option<i32>,
}

/// The EBS volume types `RunTask` accepts for a managed volume on Fargate (ECS API
/// reference, TaskManagedEBSVolumeConfiguration `volumeType`: "The magnetic volume type
/// is not supported on Fargate", so `standard` is not among them).
pub const WORKSPACE_VOLUME_TYPES: &[&str] = &["gp2", "gp3", "io1", "io2", "st1", "sc1"];

/// What `RunTask` accepts for one volume type (ECS API reference,
/// TaskManagedEBSVolumeConfiguration — <https://docs.aws.amazon.com/AmazonECS/latest/APIReference/API_TaskManagedEBSVolumeConfiguration.html>:
/// `sizeInGiB` "gp2 and gp3: 1-16,384; io1 and io2: 4-16,384; st1 and sc1: 125-16,384";
/// `iops` "gp3: 3,000 - 16,000 IOPS; io1: 100 - 64,000 IOPS; io2: 100 - 256,000 IOPS ...
/// required for io1 and io2 ... not supported for st1, sc1, or standard"; `throughput`
/// "a maximum of 1,000 MiB/s ... only supported for the gp3 volume type". The ratios come
/// from the EBS User Guide, "Amazon EBS volume types": gp3 and io2 at most 500 IOPS per
/// GiB, io1 50; gp3 throughput from 125 MiB/s, at most 0.25 MiB/s per provisioned IOPS.
/// `iops` is refused for gp2 too: CreateVolume (to which it maps 1:1) does not take it.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeTypeRules {
    /// The type (`volumeType`).
    pub name: &'static str,
    /// `sizeInGiB`, inclusive.
    pub size_gib: (i32, i32),
    /// `iops`, inclusive, and the most IOPS per GiB; `None`: the type takes no `iops`.
    pub iops: Option<((i32, i32), i32)>,
    /// Whether `iops` must be given.
    pub iops_required: bool,
    /// `throughput` (MiB/s), inclusive; `None`: the type takes no `throughput`.
    pub throughput: Option<(i32, i32)>,
}

/// [`VolumeTypeRules`] of every type in [`WORKSPACE_VOLUME_TYPES`].
pub const VOLUME_TYPE_RULES: &[VolumeTypeRules] = &[
    VolumeTypeRules {
        name: "gp3",
        size_gib: (1, 16_384),
        iops: Some(((3_000, 16_000), 500)),
        iops_required: false,
        throughput: Some((125, 1_000)),
    },
    VolumeTypeRules {
        name: "gp2",
        size_gib: (1, 16_384),
        iops: None,
        iops_required: false,
        throughput: None,
    },
    VolumeTypeRules {
        name: "io1",
        size_gib: (4, 16_384),
        iops: Some(((100, 64_000), 50)),
        iops_required: true,
        throughput: None,
    },
    VolumeTypeRules {
        name: "io2",
        size_gib: (4, 16_384),
        iops: Some(((100, 256_000), 500)),
        iops_required: true,
        throughput: None,
    },
    VolumeTypeRules {
        name: "st1",
        size_gib: (125, 16_384),
        iops: None,
        iops_required: false,
        throughput: None,
    },
    VolumeTypeRules {
        name: "sc1",
        size_gib: (125, 16_384),
        iops: None,
        iops_required: false,
        throughput: None,
    },
];

/// Checks a workspace volume against [`VOLUME_TYPE_RULES`]: the type is known, the size in
/// its range, `iops` present when required, absent when not taken, in range and within
/// the per-GiB ratio, `throughput` only on gp3, in range and at most IOPS / 4 (gp3's
/// default 3,000 IOPS when none is given).
///
/// # Errors
/// [`SettingsError::Invalid`] naming the variable at fault and the rule it broke (never
/// the value).
pub fn check_workspace_volume(
    volume_type: &str,
    size_gib: i32,
    iops: Option<i32>,
    throughput: Option<i32>,
) -> Result<(), SettingsError> {
    let invalid = |var, reason| Err(SettingsError::Invalid { var, reason });
    let Some(rules) = VOLUME_TYPE_RULES.iter().find(|r| r.name == volume_type) else {
        return invalid(
            "WORKSPACE_VOLUME_TYPE",
            "one of gp3, gp2, io1, io2, st1, sc1 (standard is not supported on Fargate)",
        );
    };
    let (lo, hi) = rules.size_gib;
    if !(lo..=hi).contains(&size_gib) {
        return invalid(
            "WORKSPACE_VOLUME_GIB",
            match rules.name {
                "io1" | "io2" => "whole GiB from 4 to 16384 for io1 and io2",
                "st1" | "sc1" => "whole GiB from 125 to 16384 for st1 and sc1",
                _ => "whole GiB from 1 to 16384",
            },
        );
    }
    match (rules.iops, iops) {
        (None, Some(_)) => {
            return invalid(
                "WORKSPACE_VOLUME_IOPS",
                "only for gp3, io1 and io2 volumes (unset it for gp2, st1, sc1)",
            );
        }
        (Some(_), None) if rules.iops_required => {
            return invalid(
                "WORKSPACE_VOLUME_IOPS",
                "required for io1 and io2 volumes (io1: 100-64000, io2: 100-256000)",
            );
        }
        (Some(((lo, hi), per_gib)), Some(n)) => {
            if !(lo..=hi).contains(&n) {
                return invalid(
                    "WORKSPACE_VOLUME_IOPS",
                    match rules.name {
                        "gp3" => "from 3000 to 16000 for gp3",
                        "io1" => "from 100 to 64000 for io1",
                        _ => "from 100 to 256000 for io2",
                    },
                );
            }
            if i64::from(n) > i64::from(per_gib) * i64::from(size_gib) {
                return invalid(
                    "WORKSPACE_VOLUME_IOPS",
                    if rules.name == "io1" {
                        "at most 50 IOPS per GiB of WORKSPACE_VOLUME_GIB for io1"
                    } else {
                        "at most 500 IOPS per GiB of WORKSPACE_VOLUME_GIB"
                    },
                );
            }
        }
        _ => {}
    }
    match (rules.throughput, throughput) {
        (None, Some(_)) => invalid("WORKSPACE_VOLUME_THROUGHPUT", "only for gp3 volumes"),
        (Some((lo, hi)), Some(t)) if !(lo..=hi).contains(&t) => invalid(
            "WORKSPACE_VOLUME_THROUGHPUT",
            "MiB/s from 125 to 1000 for gp3",
        ),
        (Some(_), Some(t)) if i64::from(t) * 4 > i64::from(iops.unwrap_or(3_000)) => invalid(
            "WORKSPACE_VOLUME_THROUGHPUT",
            "at most WORKSPACE_VOLUME_IOPS / 4 MiB/s (gp3: 0.25 MiB/s per IOPS, 3000 IOPS by default)",
        ),
        _ => Ok(()),
    }
}

#[cfg(feature = "ec2")]
impl WorkspaceVolumeSettings {
    /// The EBS adapter's configuration (default waits).
    pub fn ebs_config(&self) -> crate::EbsConfig {
        let mut config = crate::EbsConfig::new(&self.infrastructure_role_arn, self.size_gib);
        config.volume_type = self.volume_type.clone();
        config.iops = self.iops;
        config.throughput = self.throughput;
        config
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

/// Reads variables through a lookup, so tests never touch the process environment.
struct Vars<F>(F);

impl<F: Fn(&str) -> Option<String>> Vars<F> {
    fn optional(&self, var: &'static str) -> Option<String> {
        (self.0)(var)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }

    fn required(&self, var: &'static str) -> Result<String, SettingsError> {
        self.optional(var).ok_or(SettingsError::Missing { var })
    }

    fn list(&self, var: &'static str) -> Result<Vec<String>, SettingsError> {
        let Some(raw) = self.optional(var) else {
            return Ok(Vec::new());
        };
        let items: Vec<String> = raw.split(',').map(|s| s.trim().to_owned()).collect();
        if items.iter().any(String::is_empty) {
            return Err(SettingsError::Invalid {
                var,
                reason: "a comma-separated list without empty entries",
            });
        }
        Ok(items)
    }

    /// Whole seconds, `default` when unset; `positive` refuses 0.
    fn secs(&self, var: &'static str, default: u64, positive: bool) -> Result<u64, SettingsError> {
        let Some(raw) = self.optional(var) else {
            return Ok(default);
        };
        let reason = if positive {
            "whole seconds of at least 1"
        } else {
            "whole seconds (a non-negative integer)"
        };
        match raw.parse::<u64>() {
            Ok(v) if v > 0 || !positive => Ok(v),
            _ => Err(SettingsError::Invalid { var, reason }),
        }
    }

    fn flag(&self, var: &'static str) -> Result<bool, SettingsError> {
        match self
            .optional(var)
            .map(|v| v.to_ascii_lowercase())
            .as_deref()
        {
            None | Some("false" | "disabled" | "0") => Ok(false),
            Some("true" | "enabled" | "1") => Ok(true),
            Some(_) => Err(SettingsError::Invalid {
                var,
                reason: "true or false",
            }),
        }
    }

    /// `key=value` pairs, comma-separated (issue 25: `OWNER_METADATA`).
    fn metadata_rule(
        &self,
        var: &'static str,
    ) -> Result<std::collections::BTreeMap<String, String>, SettingsError> {
        let items = self.list(var)?;
        parse_metadata_rule(items.iter().map(String::as_str)).map_err(|e| SettingsError::Invalid {
            var,
            reason: match e {
                MetadataRuleError::NotAPair => {
                    "comma-separated key=value pairs with non-empty keys"
                }
                MetadataRuleError::TooLong => {
                    "metadata keys of at most 64 characters and values of at most 512"
                }
                MetadataRuleError::DuplicateKey => "each metadata key once",
                MetadataRuleError::TooMany => "at most 16 metadata pairs",
            },
        })
    }

    /// `PROVISION_ON` (issue 25), default `connection_request`.
    fn provision_on(&self, var: &'static str) -> Result<ProvisionOn, SettingsError> {
        match self.optional(var) {
            None => Ok(ProvisionOn::default()),
            Some(raw) => raw
                .parse()
                .map_err(|reason| SettingsError::Invalid { var, reason }),
        }
    }

    fn queue_url(&self, var: &'static str) -> Result<String, SettingsError> {
        let url = self.required(var)?;
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return Err(SettingsError::Invalid {
                var,
                reason: "an SQS queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME)",
            });
        }
        Ok(url)
    }

    fn secret_ref(&self, var: &'static str) -> Result<SecretRef, SettingsError> {
        let arn = self.required(var)?;
        // A value that looks like the secret itself would be logged as an id later.
        if arn.starts_with("whsec_") || arn.starts_with("sk-") {
            return Err(SettingsError::Invalid {
                var,
                reason: "the secret's ARN or name, not the secret itself",
            });
        }
        Ok(SecretRef { var, arn })
    }
}

/// The worker id of this execution environment: its log stream name is unique among the
/// function's concurrent instances; off Lambda, the process id and start time.
fn worker_id(lookup: &impl Fn(&str) -> Option<String>) -> String {
    let function = lookup("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|| "lambda".into());
    match lookup("AWS_LAMBDA_LOG_STREAM_NAME").filter(|s| !s.is_empty()) {
        Some(stream) => format!("{function}/{stream}"),
        None => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            format!("{function}/{}-{nanos:x}", std::process::id())
        }
    }
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
                // Issue 24: a longer window lets a captured delivery be replayed long past
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

impl ControllerSettings {
    /// The OpenAI API key's secret, for a process that reads sessions.
    ///
    /// # Errors
    /// [`SettingsError::Missing`] naming `OPENAI_API_KEY_SECRET_ARN` when it is unset.
    pub fn api_key_secret(&self) -> Result<&SecretRef, SettingsError> {
        self.api_key_secret.as_ref().ok_or(SettingsError::Missing {
            var: "OPENAI_API_KEY_SECRET_ARN",
        })
    }

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
    /// As [`ControllerSettings::from_env`].
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        let vars = Vars(lookup);
        let events_queue_url = vars.queue_url("EVENTS_QUEUE_URL")?;
        let events_dlq_url = match vars.optional("EVENTS_DLQ_URL") {
            Some(_) => Some(vars.queue_url("EVENTS_DLQ_URL")?),
            None => None,
        };
        let timers_queue_url = vars.queue_url("TIMERS_QUEUE_URL")?;
        if timers_queue_url.ends_with(".fifo") {
            return Err(SettingsError::Invalid {
                var: "TIMERS_QUEUE_URL",
                reason: "a standard queue (FIFO queues reject per-message delays)",
            });
        }
        let sweep_queue_url = vars.queue_url("SWEEP_QUEUE_URL")?;
        if sweep_queue_url.ends_with(".fifo") {
            return Err(SettingsError::Invalid {
                var: "SWEEP_QUEUE_URL",
                reason: "a standard queue (FIFO queues reject per-message delays)",
            });
        }
        if sweep_queue_url == timers_queue_url {
            return Err(SettingsError::Invalid {
                var: "SWEEP_QUEUE_URL",
                reason: "a queue of its own, not the timers queue (rechecks would wait behind a sweep's jobs)",
            });
        }
        let table_name = vars.required("TABLE_NAME")?;
        let subnets = vars.list("SUBNETS")?;
        if subnets.is_empty() {
            return Err(SettingsError::Missing { var: "SUBNETS" });
        }
        let ecs = EcsSettings {
            cluster: vars.required("ECS_CLUSTER")?,
            task_definition: vars.required("TASK_DEFINITION")?,
            container_name: vars.required("CONTAINER_NAME")?,
            subnets,
            security_groups: vars.list("SECURITY_GROUPS")?,
            assign_public_ip: vars.flag("ASSIGN_PUBLIC_IP")?,
            workspace: workspace_volume(&vars)?,
            executor_mode: match vars.optional("EXECUTOR_MODE").as_deref() {
                None | Some("split") => ExecutorMode::Split,
                Some("single") => ExecutorMode::SingleContainer,
                Some(_) => {
                    return Err(SettingsError::Invalid {
                        var: "EXECUTOR_MODE",
                        reason: "split or single",
                    });
                }
            },
            pool: None,
        };
        let deployment = DeploymentId::new(vars.required("DEPLOYMENT_ID")?).map_err(|_| {
            SettingsError::Invalid {
                var: "DEPLOYMENT_ID",
                reason: "1 to 36 characters of [A-Za-z0-9_-]",
            }
        })?;
        let defaults = Policy::default();
        let mut controller = ControllerConfig::new(deployment);
        controller.policy.shutdown_grace_secs =
            vars.secs("SHUTDOWN_GRACE_SECS", defaults.shutdown_grace_secs, false)?;
        controller.policy.connect_deadline_secs = vars.secs(
            "CONNECT_DEADLINE_SECS",
            defaults.connect_deadline_secs,
            true,
        )?;
        ceilings(&vars, &mut controller.policy)?;
        controller.policy.snapshot_wait_secs =
            vars.secs("SNAPSHOT_WAIT_SECS", defaults.snapshot_wait_secs, true)?;
        controller.policy.snapshot_recheck_secs = vars.secs(
            "SNAPSHOT_RECHECK_SECS",
            defaults.snapshot_recheck_secs,
            true,
        )?;
        controller.policy.snapshot_keep = match vars.optional("SNAPSHOT_KEEP") {
            None => defaults.snapshot_keep,
            Some(raw) => {
                raw.parse::<u32>()
                    .ok()
                    .filter(|k| *k >= 1)
                    .ok_or(SettingsError::Invalid {
                        var: "SNAPSHOT_KEEP",
                        reason: "a count of at least 1",
                    })?
            }
        };
        if let Some(raw) = vars.optional("CLOSE_WORKSPACE") {
            controller.policy.close_workspace =
                raw.parse().map_err(|_| SettingsError::Invalid {
                    var: "CLOSE_WORKSPACE",
                    reason: "`delete` or `retain:<days ≥ 1>`",
                })?;
        }
        let history_days = match vars.optional("HISTORY_RETENTION_DAYS") {
            None => DEFAULT_HISTORY_RETENTION_DAYS,
            Some(raw) => raw
                .parse::<u64>()
                .ok()
                .filter(|d| (1..=36_500).contains(d))
                .ok_or(SettingsError::Invalid {
                    var: "HISTORY_RETENTION_DAYS",
                    reason: "whole days, 1 to 36,500",
                })?,
        };
        let history_retention_secs =
            history_retention_secs(history_days, &controller.policy.close_workspace);
        let (pool_settings, pool) =
            warm_pool(&vars, &ecs, &controller.policy, history_retention_secs)?;
        controller.pool = pool_settings;
        let ecs = EcsSettings { pool, ..ecs };
        controller.filter.agent_ids = vars.list("AGENT_IDS")?;
        controller.filter.workspace_directory = vars.optional("WORKSPACE_DIRECTORY");
        // Issue 25 (F3): the metadata ownership rule, beside `AGENT_IDS`.
        controller.filter.metadata = vars.metadata_rule("OWNER_METADATA")?;
        controller.policy.provision_on = vars.provision_on("PROVISION_ON")?;
        controller.executor_key_location = format!(
            "the Secrets Manager secret that task definition {} injects as CODEX_API_KEY \
             (stack parameter ExecutorKeySecretArn)",
            ecs.task_definition
        );
        controller.worker_id = worker_id(&vars.0);
        let agents_api_base_url = vars
            .optional("AGENTS_API_BASE_URL")
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_owned());
        if !(agents_api_base_url.starts_with("https://")
            || agents_api_base_url.starts_with("http://"))
        {
            return Err(SettingsError::Invalid {
                var: "AGENTS_API_BASE_URL",
                reason: "an absolute http:// or https:// URL",
            });
        }
        Ok(Self {
            events_queue_fifo: events_queue_url.ends_with(".fifo"),
            events_queue_url,
            events_dlq_url,
            timers_queue_url,
            sweep_queue_url,
            table_name,
            ecs,
            agents_api_base_url,
            api_key_secret: match vars.optional("OPENAI_API_KEY_SECRET_ARN") {
                Some(_) => Some(vars.secret_ref("OPENAI_API_KEY_SECRET_ARN")?),
                None => None,
            },
            operator_key_secret: match vars.optional("OPERATOR_KEY_SECRET_ARN") {
                Some(_) => Some(vars.secret_ref("OPERATOR_KEY_SECRET_ARN")?),
                None => None,
            },
            controller,
            aws_endpoint_url: vars.optional("AWS_ENDPOINT_URL"),
            history_retention_secs,
        })
    }
}

/// The largest `POOL_SIZE`: 100, the most tasks one `DescribeTasks` call describes (ECS
/// API reference, DescribeTasks `tasks`: "up to 100"), so listing the idle members is one
/// call, and a refill's `RunTask`s fit its time ([`sandbox_controller::pool::REFILL_MAX_SECS`]).
pub const MAX_POOL_SIZE: u32 = 100;

/// The warm pool (issue 27, docs/WARM_POOL.md): `POOL_SIZE` (default 0: off, at most
/// [`MAX_POOL_SIZE`]) and
/// `POOL_MAX_AGE_SECS` (default 3600, at least 60); with `POOL_SIZE` > 0 also
/// `POOL_TABLE_NAME` and `POOL_TASK_ROLE_ID`. Refused with `POOL_SIZE` > 0: the
/// single-container executor (it holds the key from its start, so a pre-started member
/// would hold it before any assignment), EBS workspaces (a member starts without the
/// environment's volume and `RunTask` cannot attach one later), and a pool as large as the
/// executor cap (`MAX_EXECUTORS`: idle members count toward it).
fn warm_pool<F: Fn(&str) -> Option<String>>(
    vars: &Vars<F>,
    ecs: &EcsSettings,
    policy: &Policy,
    history_retention_secs: u64,
) -> Result<
    (
        sandbox_controller::config::PoolSettings,
        Option<PoolTableSettings>,
    ),
    SettingsError,
> {
    let size = match vars.optional("POOL_SIZE") {
        None => 0,
        Some(raw) => raw.parse::<u32>().map_err(|_| SettingsError::Invalid {
            var: "POOL_SIZE",
            reason: "a count of idle executors (0 = no warm pool)",
        })?,
    };
    if size > MAX_POOL_SIZE {
        return Err(SettingsError::Invalid {
            var: "POOL_SIZE",
            reason: "at most 100 (the pool's listing and each refill's reconcile describe the idle members in one DescribeTasks call, at most 100 tasks)",
        });
    }
    let max_age_secs = vars.secs("POOL_MAX_AGE_SECS", DEFAULT_POOL_MAX_AGE_SECS, true)?;
    if max_age_secs < MIN_POOL_MAX_AGE_SECS {
        return Err(SettingsError::Invalid {
            var: "POOL_MAX_AGE_SECS",
            reason: "whole seconds of at least 60",
        });
    }
    let settings = sandbox_controller::config::PoolSettings { size, max_age_secs };
    if size == 0 {
        return Ok((settings, None));
    }
    if ecs.executor_mode == ExecutorMode::SingleContainer {
        return Err(SettingsError::Invalid {
            var: "POOL_SIZE",
            reason: "0 with EXECUTOR_MODE=single (a pooled executor would hold the key before any assignment)",
        });
    }
    if ecs.workspace.is_some() {
        return Err(SettingsError::Invalid {
            var: "POOL_SIZE",
            reason: "0 with EBS workspaces (a member starts without the environment's volume)",
        });
    }
    if policy.max_executors > 0 && size >= policy.max_executors {
        return Err(SettingsError::Invalid {
            var: "POOL_SIZE",
            reason: "below MAX_EXECUTORS (idle members count toward the executor cap)",
        });
    }
    // Required only with the pool on (read as optional, then refused by name, as the
    // workspace volume's variables are).
    let task_role_id = vars
        .optional("POOL_TASK_ROLE_ID")
        .ok_or(SettingsError::Missing {
            var: "POOL_TASK_ROLE_ID",
        })?;
    if !(task_role_id.starts_with("AROA")
        && task_role_id.len() <= 128
        && task_role_id.chars().all(|c| c.is_ascii_alphanumeric()))
    {
        return Err(SettingsError::Invalid {
            var: "POOL_TASK_ROLE_ID",
            reason: "the task role's unique id (AROA…, Fn::GetAtt ExecutorTaskRole.RoleId), not its name or ARN",
        });
    }
    let pool = PoolTableSettings {
        table_name: vars
            .optional("POOL_TABLE_NAME")
            .ok_or(SettingsError::Missing {
                var: "POOL_TABLE_NAME",
            })?,
        task_role_id,
        max_age_secs,
        history_retention_secs,
    };
    Ok((settings, Some(pool)))
}

/// The workspace volume settings (issue 14): all of `ECS_INFRASTRUCTURE_ROLE_ARN` and
/// `WORKSPACE_VOLUME_GIB` (plus the optional `WORKSPACE_VOLUME_TYPE`), or none of them.
/// A half configuration fails naming the missing variable, so a deployment never runs
/// believing it keeps workspaces when it does not.
fn workspace_volume<F: Fn(&str) -> Option<String>>(
    vars: &Vars<F>,
) -> Result<Option<WorkspaceVolumeSettings>, SettingsError> {
    let role = vars.optional("ECS_INFRASTRUCTURE_ROLE_ARN");
    let gib = vars.optional("WORKSPACE_VOLUME_GIB");
    let volume_type = vars.optional("WORKSPACE_VOLUME_TYPE");
    let performance = vars.optional("WORKSPACE_VOLUME_IOPS").is_some()
        || vars.optional("WORKSPACE_VOLUME_THROUGHPUT").is_some();
    let Some(role) = role else {
        if gib.is_some() || volume_type.is_some() || performance {
            return Err(SettingsError::Missing {
                var: "ECS_INFRASTRUCTURE_ROLE_ARN",
            });
        }
        return Ok(None);
    };
    if !role.starts_with("arn:") || !role.contains(":role/") {
        return Err(SettingsError::Invalid {
            var: "ECS_INFRASTRUCTURE_ROLE_ARN",
            reason: "an IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME)",
        });
    }
    let Some(gib) = gib else {
        return Err(SettingsError::Missing {
            var: "WORKSPACE_VOLUME_GIB",
        });
    };
    let size_gib = gib
        .parse::<i32>()
        .ok()
        .filter(|g| (1..=16_384).contains(g))
        .ok_or(SettingsError::Invalid {
            var: "WORKSPACE_VOLUME_GIB",
            reason: "whole GiB from 1 to 16384",
        })?;
    let volume_type = volume_type.unwrap_or_else(|| "gp3".to_owned());
    let whole = |var: &'static str, reason: &'static str| {
        vars.optional(var)
            .map(|v| {
                v.parse::<i32>()
                    .map_err(|_| SettingsError::Invalid { var, reason })
            })
            .transpose()
    };
    let iops = whole("WORKSPACE_VOLUME_IOPS", "a whole number of IOPS")?;
    let throughput = whole("WORKSPACE_VOLUME_THROUGHPUT", "a whole number of MiB/s")?;
    check_workspace_volume(&volume_type, size_gib, iops, throughput)?;
    Ok(Some(WorkspaceVolumeSettings {
        infrastructure_role_arn: role,
        size_gib,
        volume_type,
        iops,
        throughput,
    }))
}

/// The cost and safety ceilings (issue 13) into `policy`.
fn ceilings<F: Fn(&str) -> Option<String>>(
    vars: &Vars<F>,
    policy: &mut Policy,
) -> Result<(), SettingsError> {
    let defaults = Policy::default();
    policy.max_lifetime_secs = vars.secs("MAX_LIFETIME_SECS", defaults.max_lifetime_secs, false)?;
    policy.lifetime_hard_cap_secs = vars.secs(
        "LIFETIME_HARD_CAP_SECS",
        defaults.lifetime_hard_cap_secs,
        false,
    )?;
    if policy.lifetime_hard_cap_secs != 0
        && policy.max_lifetime_secs != 0
        && policy.lifetime_hard_cap_secs < policy.max_lifetime_secs
    {
        return Err(SettingsError::Invalid {
            var: "LIFETIME_HARD_CAP_SECS",
            reason: "0 or at least MAX_LIFETIME_SECS",
        });
    }
    policy.no_work_secs = vars.secs("NO_WORK_SECS", defaults.no_work_secs, false)?;
    let max_replacements = vars.secs(
        "MAX_REPLACEMENTS",
        u64::from(defaults.max_replacements),
        false,
    )?;
    policy.max_replacements =
        u32::try_from(max_replacements).map_err(|_| SettingsError::Invalid {
            var: "MAX_REPLACEMENTS",
            reason: "a count below 4294967296",
        })?;
    policy.replacement_window_secs = vars.secs(
        "REPLACEMENT_WINDOW_SECS",
        defaults.replacement_window_secs,
        true,
    )?;
    policy.max_executors = match vars.optional("MAX_EXECUTORS") {
        None => defaults.max_executors,
        Some(raw) => raw.parse::<u32>().map_err(|_| SettingsError::Invalid {
            var: "MAX_EXECUTORS",
            reason: "a count of executors below 4294967296 (0 = no cap)",
        })?,
    };
    let allowlist = vars.list("REMOTE_URL_ALLOWLIST")?;
    if !allowlist.is_empty() {
        sandbox_core::remote_url::validate_allowlist(&allowlist).map_err(|_| {
            SettingsError::Invalid {
                var: "REMOTE_URL_ALLOWLIST",
                reason: "comma-separated entries, each a host, *.domain or scheme://host",
            }
        })?;
        policy.remote_url_allowlist = allowlist.into();
    }
    Ok(())
}

/// The queue name at the end of a queue URL (`.../123456789012/NAME` → `NAME`), which is
/// also the last part of the queue's ARN (`arn:aws:sqs:REGION:ACCOUNT:NAME`).
pub fn queue_name_of_url(url: &str) -> &str {
    url.trim_end_matches('/').rsplit('/').next().unwrap_or(url)
}
