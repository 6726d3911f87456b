//! [`ControllerSettings`] from the variables of the worker and sweeper functions: the
//! queues, the table, ECS, the warm pool and the cost and safety ceilings.

use super::vars::{Vars, worker_id};
use super::volume::workspace_volume;
use super::{
    ControllerSettings, DEFAULT_HISTORY_RETENTION_DAYS, DEFAULT_POOL_MAX_AGE_SECS, EcsSettings,
    ExecutorMode, MIN_POOL_MAX_AGE_SECS, PoolTableSettings, SecretRef, SettingsError,
    history_retention_secs,
};
use sandbox_agents_api::DEFAULT_BASE_URL;
use sandbox_controller::ControllerConfig;
use sandbox_core::ids::DeploymentId;
use sandbox_core::observed::Policy;

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
        // The metadata ownership rule, beside `AGENT_IDS`.
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

/// The warm pool (docs/WARM_POOL.md): `POOL_SIZE` (default 0: off, at most
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

/// The cost and safety ceilings into `policy`.
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
