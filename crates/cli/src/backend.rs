//! The two backends the operator commands run against, behind one trait: the registry,
//! the compute provider and the two queues of a deployment.
//!
//! - `local`: a data directory of `sandboxctl serve` (or `demo --data-dir`): `sandbox.db`
//!   (registry and executor table) and `queues.db` (events, timers and sweep queues).
//! - `aws`: the deployment's DynamoDB table, ECS cluster and SQS queues, named by the same
//!   environment variables the worker and the sweeper read (`sandbox_aws::settings`:
//!   `TABLE_NAME`, `ECS_CLUSTER`, `EVENTS_QUEUE_URL`, `TIMERS_QUEUE_URL`, `SWEEP_QUEUE_URL`, `DEPLOYMENT_ID`,
//!   ...), with the default AWS credential chain (`AWS_ENDPOINT_URL` for moto). The
//!   dead-letter queues are found through each queue's redrive policy.
//!
//! Without `--backend`: `aws` when `TABLE_NAME` is set and `--data-dir` is not given,
//! else `local`. The `aws` backend is compiled only with the crate's `aws` feature
//! (`cargo build -p sandboxctl --features aws`); without it such a command fails with
//! [`aws_backend_not_built`] and changes nothing.
//!
//! Every command goes through these ports or enqueues a job; none writes the registry.

use anyhow::{Context as _, bail};
use sandbox_agents_api::{AgentsClient, ClientConfig};
#[cfg(feature = "aws")]
use sandbox_aws::settings::ControllerSettings;
#[cfg(feature = "aws")]
use sandbox_aws::sqs_dead_letters;
#[cfg(feature = "aws")]
use sandbox_aws::{DynamoRegistry, EcsCompute, SqsQueue, SqsQueueOptions};
use sandbox_controller::ControllerConfig;
use sandbox_controller::job::Job;
use sandbox_controller::ports::{AuditEntry, Compute, PortError, Queue, Registry};
use sandbox_core::ids::{DeploymentId, EffectKey};
use sandbox_core::operator_proof::OperatorKey;
use sandbox_local::SqliteRegistry;
use sandbox_local::embedded::{EVENTS_QUEUE, SWEEP_QUEUE, TIMERS_QUEUE};
use sandbox_local::process_compute::{
    ExecutorCommand, KeySource, ProcessCompute, ProcessComputeConfig,
};
use sandbox_local::sqlite_queue::{QueueOptions, SqliteQueue};
use std::future::Future;
use std::path::PathBuf;

/// `--backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// A local data directory (SQLite, child processes).
    Local,
    /// DynamoDB, ECS and SQS, from the Lambdas' environment variables.
    Aws,
}

/// The backend arguments every operator command takes.
#[derive(Clone, Debug, clap::Args)]
pub struct BackendArgs {
    /// Which backend (default: `aws` when `TABLE_NAME` is set and `--data-dir` is not
    /// given, else `local`).
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,
    /// Local data directory (default `.sandbox-lifecycle`).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Local deployment id (as `serve --deployment`; default `local`). The AWS backend
    /// reads `DEPLOYMENT_ID`.
    #[arg(long, default_value = "local")]
    pub deployment: String,
    /// Print one JSON document (schema: `crates/cli/sandboxctl.schema.json`).
    #[arg(long)]
    pub json: bool,
}

impl BackendArgs {
    /// The backend these arguments select.
    pub fn kind(&self) -> BackendKind {
        match self.backend {
            Some(kind) => kind,
            None if self.data_dir.is_none() && std::env::var_os("TABLE_NAME").is_some() => {
                BackendKind::Aws
            }
            None => BackendKind::Local,
        }
    }
}

/// Which of the controller's queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueKind {
    /// The events queue (FIFO): webhook jobs, operator closes.
    Events,
    /// The timers queue (standard): lease rechecks, hand-offs.
    Timers,
    /// The sweep queue (standard): a fanned-out sweep's jobs, operator sweeps.
    Sweep,
}

impl QueueKind {
    /// All three, events first.
    pub const ALL: [QueueKind; 3] = [QueueKind::Events, QueueKind::Timers, QueueKind::Sweep];

    /// `events` / `timers` / `sweep`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Events => "events",
            Self::Timers => "timers",
            Self::Sweep => "sweep",
        }
    }
}

/// One dead-lettered message, whatever the backend.
#[derive(Clone, Debug)]
pub struct DeadLetterView {
    /// Provider message id.
    pub message_id: String,
    /// The job, when the body decodes as one.
    pub job: Option<Job>,
    /// Receives so far.
    pub receive_count: u32,
    /// When it reached the dead-letter queue (local) or was sent there (SQS), Unix seconds.
    pub at: Option<u64>,
    /// Why, when the backend knows (local: `max receive count exceeded`, ...).
    pub reason: Option<String>,
}

/// The ports of one deployment, plus the reads only an operator needs.
pub trait Ops {
    /// The queue adapter.
    type Q: Queue + Clone;
    /// The registry adapter.
    type R: Registry + Clone;
    /// The compute adapter.
    type C: Compute + Clone;
    /// `local` or `aws`.
    fn backend(&self) -> &'static str;
    /// Where the registry lives, for the operator to check before a destructive command:
    /// `table NAME` (AWS) or `data directory PATH` (local).
    fn store(&self) -> String;
    /// The registry.
    fn registry(&self) -> &Self::R;
    /// The compute provider.
    fn compute(&self) -> &Self::C;
    /// A queue.
    fn queue(&self, which: QueueKind) -> &Self::Q;
    /// The controller settings (deployment id, policy, filter).
    fn config(&self) -> &ControllerConfig;
    /// The audit entries of `key`, oldest first.
    fn audit_entries(
        &self,
        key: &EffectKey,
    ) -> impl Future<Output = Result<Vec<AuditEntry>, PortError>>;
    /// Up to `max` dead-lettered messages of `which`, left in place.
    fn dead_letters(
        &self,
        which: QueueKind,
        max: usize,
    ) -> impl Future<Output = Result<Vec<DeadLetterView>, PortError>>;
    /// Moves up to `max` dead-lettered jobs of `which` back to it (hand-off count reset).
    /// Returns how many moved and the ids left behind (bodies that are not jobs).
    fn redrive(
        &self,
        which: QueueKind,
        max: usize,
    ) -> impl Future<Output = Result<(usize, Vec<String>), PortError>>;
    /// The Agents API client (for `sweep --dry-run`, which reads the sessions).
    fn sessions(&self) -> impl Future<Output = anyhow::Result<AgentsClient>>;
    /// The operator key that signs a forced job for a session no record names
    /// (`sandbox_core::operator_proof`): `<data-dir>/operator.key` (created when missing)
    /// or the secret `OPERATOR_KEY_SECRET_ARN` names.
    fn operator_key(&self) -> impl Future<Output = anyhow::Result<OperatorKey>>;
    /// `sandboxctl migrate` ([`crate::migrate_cmd`]): puts the open records written before
    /// the sweep's open-records index into it (`dry_run`: counts only).
    fn migrate(&self, dry_run: bool) -> impl Future<Output = Result<Migration, PortError>>;
}

/// A local data directory.
pub struct LocalOps {
    data_dir: PathBuf,
    registry: SqliteRegistry,
    compute: ProcessCompute,
    events: SqliteQueue,
    timers: SqliteQueue,
    sweep: SqliteQueue,
    config: ControllerConfig,
}

impl LocalOps {
    /// Opens the data directory (it must hold `sandbox.db`).
    ///
    /// # Errors
    /// No database, or one that cannot be opened.
    pub fn open(args: &BackendArgs) -> anyhow::Result<Self> {
        let dir = args
            .data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(".sandbox-lifecycle"));
        let db = dir.join("sandbox.db");
        if !db.is_file() {
            bail!(
                "no local data directory at {} (no sandbox.db); pass --data-dir, or --backend aws",
                dir.display()
            );
        }
        let deployment = DeploymentId::new(args.deployment.clone())
            .map_err(|_| anyhow::anyhow!("--deployment: 1 to 36 characters of [A-Za-z0-9_-]"))?;
        let registry = SqliteRegistry::open(&db).context("opening the registry")?;
        // Read and stop only: this tool never starts an executor, so the command and key
        // source are placeholders.
        let compute = ProcessCompute::open(ProcessComputeConfig::new(
            ExecutorCommand::codex_exec_server(),
            dir.join("workspaces"),
            KeySource::EnvVar("CODEX_API_KEY".into()),
            &db,
        ))
        .context("opening the executor table")?;
        let queues = dir.join("queues.db");
        let events = SqliteQueue::open(&queues, EVENTS_QUEUE, QueueOptions::fifo())
            .context("opening the events queue")?;
        let timers = SqliteQueue::open(&queues, TIMERS_QUEUE, QueueOptions::standard())
            .context("opening the timers queue")?;
        let sweep = SqliteQueue::open(&queues, SWEEP_QUEUE, QueueOptions::standard())
            .context("opening the sweep queue")?;
        // Decide with the settings the stack last ran with (`serve` flags), not defaults.
        let mut config = ControllerConfig::new(deployment);
        if let Some(settings) =
            sandbox_local::settings_file::read(&dir).map_err(anyhow::Error::msg)?
        {
            config.policy = settings.policy;
            config.filter = settings.filter;
        }
        Ok(Self {
            data_dir: dir,
            registry,
            compute,
            events,
            timers,
            sweep,
            config,
        })
    }
}

impl Ops for LocalOps {
    type Q = SqliteQueue;
    type R = SqliteRegistry;
    type C = ProcessCompute;
    fn backend(&self) -> &'static str {
        "local"
    }
    fn store(&self) -> String {
        format!("data directory {}", self.data_dir.display())
    }
    fn registry(&self) -> &SqliteRegistry {
        &self.registry
    }
    fn compute(&self) -> &ProcessCompute {
        &self.compute
    }
    fn queue(&self, which: QueueKind) -> &SqliteQueue {
        match which {
            QueueKind::Events => &self.events,
            QueueKind::Timers => &self.timers,
            QueueKind::Sweep => &self.sweep,
        }
    }
    fn config(&self) -> &ControllerConfig {
        &self.config
    }
    async fn audit_entries(&self, key: &EffectKey) -> Result<Vec<AuditEntry>, PortError> {
        self.registry.audit_entries(key).await
    }
    async fn dead_letters(
        &self,
        which: QueueKind,
        max: usize,
    ) -> Result<Vec<DeadLetterView>, PortError> {
        Ok(self
            .queue(which)
            .dead_letters()
            .await?
            .into_iter()
            .take(max)
            .map(|d| DeadLetterView {
                message_id: d.message_id,
                job: d.job,
                receive_count: d.receive_count,
                at: u64::try_from(d.dead_at_ms / 1000).ok(),
                reason: Some(d.reason),
            })
            .collect())
    }
    async fn redrive(
        &self,
        which: QueueKind,
        max: usize,
    ) -> Result<(usize, Vec<String>), PortError> {
        let moved = self.queue(which).redrive_dead_letters(max).await?;
        let left = self
            .queue(which)
            .dead_letters()
            .await?
            .into_iter()
            .filter(|d| d.job.is_none())
            .map(|d| d.message_id)
            .collect();
        Ok((moved, left))
    }
    async fn sessions(&self) -> anyhow::Result<AgentsClient> {
        let key = match std::env::var("OPENAI_API_KEY") {
            Ok(v) if !v.trim().is_empty() => v,
            _ => bail!(
                "environment variable OPENAI_API_KEY is not set (sweep --dry-run reads the sessions)"
            ),
        };
        let mut api = ClientConfig::new(key);
        if let Ok(base) = std::env::var("AGENTS_API_BASE_URL")
            && !base.trim().is_empty()
        {
            api.base_url = base;
        }
        AgentsClient::new(api).context("the Agents API client")
    }
    async fn operator_key(&self) -> anyhow::Result<OperatorKey> {
        sandbox_local::operator_key::load_or_create(&self.data_dir).with_context(|| {
            format!(
                "the operator key {}",
                sandbox_local::operator_key::path(&self.data_dir).display()
            )
        })
    }
    /// Nothing to migrate: SQLite's partial index of the open records covers every row,
    /// whenever it was written.
    async fn migrate(&self, _dry_run: bool) -> Result<Migration, PortError> {
        Ok(Migration::default())
    }
}

/// The error of an AWS-backend command in a build without the `aws` feature: what is
/// missing and the one command that builds it.
#[cfg_attr(feature = "aws", allow(dead_code))]
pub fn aws_backend_not_built() -> anyhow::Error {
    anyhow::anyhow!(
        "this sandboxctl was built without the AWS backend (--backend aws, or TABLE_NAME set \
         without --data-dir); build it with `cargo build -p sandboxctl --features aws` \
         (the default build runs the demo, serve and the local backend only)"
    )
}

/// A deployment on AWS.
#[cfg(feature = "aws")]
pub struct AwsOps {
    settings: ControllerSettings,
    sqs: aws_sdk_sqs::Client,
    secrets: aws_sdk_secretsmanager::Client,
    registry: DynamoRegistry,
    compute: EcsCompute,
    events: SqsQueue,
    timers: SqsQueue,
    sweep: SqsQueue,
    events_dlq: Option<String>,
    timers_dlq: Option<String>,
    sweep_dlq: Option<String>,
}

#[cfg(feature = "aws")]
impl AwsOps {
    /// Reads the settings from the environment and builds the clients.
    ///
    /// # Errors
    /// A missing or invalid variable (named, never its value), or an unreadable redrive
    /// policy.
    pub async fn open() -> anyhow::Result<Self> {
        let settings = ControllerSettings::from_env()?;
        let sdk = sandbox_aws::load_sdk_config(settings.aws_endpoint_url.as_deref()).await;
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        let events_dlq = match &settings.events_dlq_url {
            Some(url) => Some(url.clone()),
            None => sqs_dead_letters::dead_letter_queue_url(&sqs, &settings.events_queue_url)
                .await
                .context("reading the events queue's redrive policy")?,
        };
        let timers_dlq = sqs_dead_letters::dead_letter_queue_url(&sqs, &settings.timers_queue_url)
            .await
            .context("reading the timers queue's redrive policy")?;
        let sweep_dlq = sqs_dead_letters::dead_letter_queue_url(&sqs, &settings.sweep_queue_url)
            .await
            .context("reading the sweep queue's redrive policy")?;
        let queue = |url: &str, fifo: bool, dlq: &Option<String>| {
            SqsQueue::new(
                sqs.clone(),
                url,
                SqsQueueOptions {
                    fifo,
                    dead_letter_queue_url: dlq.clone(),
                },
            )
        };
        let events = queue(
            &settings.events_queue_url,
            settings.events_queue_fifo,
            &events_dlq,
        );
        let timers = queue(&settings.timers_queue_url, false, &timers_dlq);
        let sweep = queue(&settings.sweep_queue_url, false, &sweep_dlq);
        let registry =
            DynamoRegistry::new(aws_sdk_dynamodb::Client::new(&sdk), &settings.table_name)
                .with_history_retention(settings.history_retention_secs);
        // ECS, plus EBS workspaces when ECS_INFRASTRUCTURE_ROLE_ARN is set (as the worker).
        let compute = settings.ecs.compute(&sdk)?;
        Ok(Self {
            secrets: aws_sdk_secretsmanager::Client::new(&sdk),
            settings,
            sqs,
            registry,
            compute,
            events,
            timers,
            sweep,
            events_dlq,
            timers_dlq,
            sweep_dlq,
        })
    }

    fn dlq(&self, which: QueueKind) -> Result<&str, PortError> {
        let dlq = match which {
            QueueKind::Events => &self.events_dlq,
            QueueKind::Timers => &self.timers_dlq,
            QueueKind::Sweep => &self.sweep_dlq,
        };
        dlq.as_deref().ok_or_else(|| {
            PortError::permanent(
                "queue",
                "dead_letters",
                format!(
                    "the {} queue has no redrive policy (no dead-letter queue)",
                    which.name()
                ),
            )
        })
    }
}

#[cfg(feature = "aws")]
impl Ops for AwsOps {
    type Q = SqsQueue;
    type R = DynamoRegistry;
    type C = EcsCompute;
    fn backend(&self) -> &'static str {
        "aws"
    }
    fn store(&self) -> String {
        format!("table {}", self.settings.table_name)
    }
    fn registry(&self) -> &DynamoRegistry {
        &self.registry
    }
    fn compute(&self) -> &EcsCompute {
        &self.compute
    }
    fn queue(&self, which: QueueKind) -> &SqsQueue {
        match which {
            QueueKind::Events => &self.events,
            QueueKind::Timers => &self.timers,
            QueueKind::Sweep => &self.sweep,
        }
    }
    fn config(&self) -> &ControllerConfig {
        &self.settings.controller
    }
    async fn audit_entries(&self, key: &EffectKey) -> Result<Vec<AuditEntry>, PortError> {
        self.registry.audit_entries(key).await
    }
    async fn dead_letters(
        &self,
        which: QueueKind,
        max: usize,
    ) -> Result<Vec<DeadLetterView>, PortError> {
        let dlq = self.dlq(which)?;
        Ok(sqs_dead_letters::peek_dead_letters(&self.sqs, dlq, max)
            .await?
            .into_iter()
            .map(|m| DeadLetterView {
                message_id: m.message_id,
                job: m.job,
                receive_count: m.receive_count,
                at: m.sent_at,
                reason: None,
            })
            .collect())
    }
    async fn redrive(
        &self,
        which: QueueKind,
        max: usize,
    ) -> Result<(usize, Vec<String>), PortError> {
        let dlq = self.dlq(which)?;
        let (target, fifo) = match which {
            QueueKind::Events => (
                &self.settings.events_queue_url,
                self.settings.events_queue_fifo,
            ),
            QueueKind::Timers => (&self.settings.timers_queue_url, false),
            QueueKind::Sweep => (&self.settings.sweep_queue_url, false),
        };
        let report =
            sqs_dead_letters::redrive_dead_letters(&self.sqs, dlq, target, fifo, max).await?;
        Ok((report.moved, report.skipped))
    }
    async fn sessions(&self) -> anyhow::Result<AgentsClient> {
        let secret = self.settings.api_key_secret()?;
        let key = sandbox_aws::read_secret(&self.secrets, &secret.arn)
            .await
            .with_context(|| {
                format!(
                    "{} ({}): the secret could not be read",
                    secret.var, secret.arn
                )
            })?;
        let api = ClientConfig {
            base_url: self.settings.agents_api_base_url.clone(),
            ..ClientConfig::new(key.expose().trim().to_owned())
        };
        AgentsClient::new(api).context("the Agents API client")
    }
    async fn operator_key(&self) -> anyhow::Result<OperatorKey> {
        let Some(secret) = &self.settings.operator_key_secret else {
            bail!(
                "OPERATOR_KEY_SECRET_ARN is not set: a forced job for a session no record names needs the operator key (the stack's OperatorKeySecret)"
            );
        };
        let text = sandbox_aws::read_secret(&self.secrets, &secret.arn)
            .await
            .with_context(|| {
                format!(
                    "{} ({}): the secret could not be read",
                    secret.var, secret.arn
                )
            })?;
        OperatorKey::from_text(text.expose()).map_err(|e| anyhow::anyhow!("{}: {e}", secret.var))
    }
    async fn migrate(&self, dry_run: bool) -> Result<Migration, PortError> {
        let b = self.registry.backfill_open_index(dry_run).await?;
        Ok(Migration {
            open: b.open,
            closed: b.closed,
            backfilled: b.backfilled,
            changed: b.changed,
        })
    }
}

/// What a migration found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Migration {
    /// Open records that were outside the sweep's index.
    pub open: u64,
    /// Closed records outside it (they belong there: left alone).
    pub closed: u64,
    /// Open records put into the index by this run.
    pub backfilled: u64,
    /// Open records written meanwhile (their own write put them in).
    pub changed: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local_args(dir: &std::path::Path) -> BackendArgs {
        BackendArgs {
            backend: Some(BackendKind::Local),
            data_dir: Some(dir.to_owned()),
            deployment: "local".into(),
            json: false,
        }
    }

    #[test]
    fn without_the_aws_feature_the_error_says_how_to_build_it() {
        let e = aws_backend_not_built().to_string();
        assert!(
            e.contains("`cargo build -p sandboxctl --features aws`"),
            "{e}"
        );
    }

    #[test]
    fn the_local_backend_decides_with_the_settings_the_stack_ran_with() {
        let dir = tempfile::tempdir().unwrap();
        SqliteRegistry::open(dir.path().join("sandbox.db")).unwrap();
        // No stack wrote settings: the defaults.
        let ops = LocalOps::open(&local_args(dir.path())).unwrap();
        assert_eq!(ops.config.policy, sandbox_core::observed::Policy::default());
        // `serve --grace-secs 5 --max-lifetime-secs 600 --remote-url-allow example.test`.
        let mut ran = ControllerConfig::new(DeploymentId::new("local").unwrap());
        ran.policy.shutdown_grace_secs = 5;
        ran.policy.max_lifetime_secs = 600;
        ran.policy.remote_url_allowlist = vec!["example.test"].into();
        sandbox_local::settings_file::write(dir.path(), &ran).unwrap();
        let ops = LocalOps::open(&local_args(dir.path())).unwrap();
        assert_eq!(ops.config.policy, ran.policy);
        // A damaged file is an error naming it, not silently the defaults.
        std::fs::write(sandbox_local::settings_file::path(dir.path()), "{").unwrap();
        let e = LocalOps::open(&local_args(dir.path())).err().unwrap();
        assert!(e.to_string().contains("controller-settings.json"), "{e}");
    }
}
