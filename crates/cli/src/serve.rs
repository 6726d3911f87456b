//! `sandboxctl serve`: the embedded stack (webhook endpoint, workers, sweeper, SQLite,
//! child-process executors) against a real Agents API base URL, until Ctrl-C.
//!
//! Secrets come only from environment variables or files, never flags, and are never
//! printed: the API key (`--api-key-env`, default `OPENAI_API_KEY`), the webhook secret
//! (`--webhook-secret-env`, default `OPENAI_WEBHOOK_SECRET`) and the executor's restricted
//! key (`--executor-key-file` or `--executor-key-env`, default `CODEX_API_KEY`).

use anyhow::{Context as _, bail};
use sandbox_agents_api::ClientConfig;
use sandbox_controller::ControllerConfig;
use sandbox_core::ids::DeploymentId;
use sandbox_core::observed::Policy;
use sandbox_local::embedded::{EmbeddedConfig, EmbeddedStack};
use sandbox_local::process_compute::{ExecutorCommand, KeySource};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Arguments of `sandboxctl serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Agents API base URL.
    #[arg(long, default_value = "https://api.openai.com/v1")]
    agents_api: String,
    /// Environment variable holding the API key.
    #[arg(long, default_value = "OPENAI_API_KEY")]
    api_key_env: String,
    /// File holding the API key instead (mode 0600 or narrower, else refused).
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// Environment variable holding the webhook signing secret (`whsec_...`).
    #[arg(long, default_value = "OPENAI_WEBHOOK_SECRET")]
    webhook_secret_env: String,
    /// File holding the webhook signing secret instead (mode 0600 or narrower).
    #[arg(long)]
    webhook_secret_file: Option<PathBuf>,
    /// File holding the executor's restricted key (takes precedence over the env var;
    /// mode 0600 or narrower, else refused).
    #[arg(long)]
    executor_key_file: Option<PathBuf>,
    /// Environment variable holding the executor's restricted key.
    #[arg(long, default_value = "CODEX_API_KEY")]
    executor_key_env: String,
    /// Executor program; its arguments follow `--` (default: `codex exec-server --remote
    /// $REMOTE_URL --environment-id $ENVIRONMENT_ID`).
    #[arg(long)]
    executor: Option<String>,
    /// Arguments of `--executor`.
    #[arg(last = true)]
    executor_args: Vec<String>,
    /// Without `--executor`: `split` (default) runs `codex exec-server --listen`
    /// with no key and a forwarder child (`codex exec-server ... forward --connect`) that
    /// alone holds it; `single` runs `codex exec-server --remote` holding the key (for
    /// codex versions without `forward`; logged at start-up). A custom `--executor` is
    /// single-process.
    #[arg(long, default_value = "split", value_parser = ["split", "single"])]
    executor_mode: String,
    /// Database and workspaces directory.
    #[arg(long, default_value = ".sandbox-lifecycle")]
    data_dir: PathBuf,
    /// Webhook listen address (loopback by default; put a TLS proxy in front).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Deployment id (tags every executor; 1–36 of [A-Za-z0-9_-]).
    #[arg(long, default_value = "local")]
    deployment: String,
    /// Only handle sessions of these agent ids (repeatable; default: any).
    #[arg(long = "agent-id")]
    agent_ids: Vec<String>,
    /// Only handle sessions with this workspace directory.
    #[arg(long)]
    workspace_directory: Option<String>,
    /// Only handle sessions whose `metadata` carries this `key=value` pair (repeatable:
    /// every pair must match; default: any metadata). The metadata ownership rule
    /// that lets handlers sharing a project split sessions (`OWNER_METADATA` on AWS).
    #[arg(long = "owner-metadata", value_name = "KEY=VALUE")]
    owner_metadata: Vec<String>,
    /// When a session's first executor starts: `connection_request` (its first
    /// `environment_connection` requirement) or `created` (already on
    /// `agent.session.created`; `PROVISION_ON` on AWS).
    #[arg(long, default_value = "connection_request")]
    provision_on: sandbox_core::observed::ProvisionOn,
    /// Grace between an idle session and the stop, seconds.
    #[arg(long, default_value_t = 300)]
    grace_secs: u64,
    /// Workspace snapshots (archives) kept per environment, at least 1.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    snapshot_keep: u32,
    /// What a close does with the workspace: `delete`, or `retain:<days>` (archives kept
    /// that many days, then deleted by the sweep).
    #[arg(long, default_value = "retain:7")]
    close_workspace: sandbox_core::workspace::CloseWorkspace,
    /// Days audit entries and receipts are kept (older ones are pruned by the sweep);
    /// never less than `--close-workspace`'s retention (`HISTORY_RETENTION_DAYS` on AWS).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=36_500))]
    history_retention_days: u64,
    /// Worker loops.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Seconds between sweeps.
    #[arg(long, default_value_t = 30)]
    sweep_secs: u64,
    /// Visibility timeout of received jobs, seconds: a job whose worker died reappears
    /// after this long.
    #[arg(long, default_value_t = 60)]
    visibility_secs: u32,
    /// Effect-key lock lease, seconds: after a crash, the next worker waits at most this
    /// long for the dead worker's lock to expire.
    #[arg(long, default_value_t = 120)]
    lock_ttl_secs: u64,
    /// Stop every executor on exit (default: leave them; a restart adopts them).
    #[arg(long)]
    stop_executors_on_exit: bool,
    /// Environment variable holding the previous webhook signing secret during a rotation
    /// (deliveries signed with either verify). Unset: only the current secret.
    #[arg(long)]
    webhook_previous_secret_env: Option<String>,
    /// Accepted `webhook-timestamp` skew, both directions, seconds (1 to 900: a longer
    /// window lets a captured delivery be replayed for longer).
    #[arg(long, default_value_t = sandbox_core::webhook::DEFAULT_TOLERANCE_SECS,
          value_parser = clap::value_parser!(u64).range(1..=sandbox_core::webhook::MAX_TOLERANCE_SECS))]
    webhook_tolerance_secs: u64,
    /// Maximum executor lifetime, seconds (0 = off): past it an idle session's executor
    /// stops at once, a busy one at its next idle.
    #[arg(long, default_value_t = Policy::default().max_lifetime_secs)]
    max_lifetime_secs: u64,
    /// Hard lifetime cap, seconds (0 = none): past it the executor stops even mid-turn.
    #[arg(long, default_value_t = Policy::default().lifetime_hard_cap_secs)]
    lifetime_hard_cap_secs: u64,
    /// Idle without work, seconds (0 = off): no turn and no connection request for this
    /// long stops the executor, whatever the session's status.
    #[arg(long, default_value_t = Policy::default().no_work_secs)]
    no_work_secs: u64,
    /// Replacements for a missed connect deadline allowed within the window (0 = no cap).
    #[arg(long, default_value_t = Policy::default().max_replacements)]
    max_replacements: u32,
    /// The replacement cap's window, seconds (≥ 1).
    #[arg(long, default_value_t = Policy::default().replacement_window_secs,
          value_parser = clap::value_parser!(u64).range(1..))]
    replacement_window_secs: u64,
    /// Concurrency cap: executors running at once (0 = off). A start beyond it waits
    /// (`capacity_limit`) until a slot frees; the Agents API waits up to 300 s for the
    /// executor's connection.
    #[arg(long, default_value_t = Policy::default().max_executors)]
    max_executors: u32,
    /// Warm pool size, listening executors started ahead of any session and
    /// claimed by a start (0 = off). Split mode only (default there: 2; without a
    /// forwarder: off); members count toward `--max-executors`.
    #[arg(long)]
    pool_size: Option<u32>,
    /// A pool member older than this, seconds, is never claimed and is replaced
    /// (a new executor binary or a rotated key reaches the pool within this).
    #[arg(long, default_value_t = sandbox_controller::config::PoolSettings::default().max_age_secs,
          value_parser = clap::value_parser!(u64).range(1..))]
    pool_max_age_secs: u64,
    /// Hosts a session's `remote_url` may name (repeatable: `host`, `*.domain`, or
    /// `scheme://host` to allow a scheme other than https). Default: api.openai.com.
    #[arg(long = "remote-url-allow")]
    remote_url_allow: Vec<String>,
}

fn secret_env(name: &str) -> anyhow::Result<String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => Ok(v),
        _ => bail!("environment variable {name} is not set"),
    }
}

/// A secret from the file `path`: refused unless only its owner may read it
/// (mode `& 0o077 == 0`), so a key file left world-readable is caught at start-up. The
/// error names the file and its mode, never the content.
fn secret_file(path: &Path, what: &str) -> anyhow::Result<String> {
    use std::os::unix::fs::PermissionsExt as _;
    let meta =
        std::fs::metadata(path).with_context(|| format!("{what} file {}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "{what} file {} has mode {mode:o}: others can read it; chmod 600 it",
            path.display()
        );
    }
    let value =
        std::fs::read_to_string(path).with_context(|| format!("{what} file {}", path.display()))?;
    let value = value.trim();
    if value.is_empty() {
        bail!("{what} file {} is empty", path.display());
    }
    Ok(value.to_owned())
}

/// A webhook signing secret from the environment variable `name`, checked on its own so a
/// malformed one is refused naming its variable and the mistake, never the value.
fn webhook_secret_env(name: &str, what: &str) -> anyhow::Result<String> {
    let value = secret_env(name)?;
    sandbox_core::webhook::WebhookVerifier::new(&value)
        .map_err(|e| anyhow::anyhow!("{name} ({what}): {e}"))?;
    Ok(value)
}

/// The cost and safety ceilings from the flags into `policy`.
fn ceilings(args: &ServeArgs, policy: &mut Policy) -> anyhow::Result<()> {
    if args.lifetime_hard_cap_secs != 0
        && args.max_lifetime_secs != 0
        && args.lifetime_hard_cap_secs < args.max_lifetime_secs
    {
        bail!("--lifetime-hard-cap-secs must be 0 or at least --max-lifetime-secs");
    }
    policy.max_lifetime_secs = args.max_lifetime_secs;
    policy.lifetime_hard_cap_secs = args.lifetime_hard_cap_secs;
    policy.no_work_secs = args.no_work_secs;
    policy.max_replacements = args.max_replacements;
    policy.replacement_window_secs = args.replacement_window_secs;
    policy.max_executors = args.max_executors;
    if !args.remote_url_allow.is_empty() {
        sandbox_core::remote_url::validate_allowlist(&args.remote_url_allow)
            .map_err(|problem| anyhow::anyhow!("--remote-url-allow: {problem}"))?;
        policy.remote_url_allowlist = args.remote_url_allow.clone().into();
    }
    Ok(())
}

/// The warm pool's size in split mode when `--pool-size` is not given.
pub const DEFAULT_LOCAL_POOL_SIZE: u32 = 2;

/// Runs the stack until Ctrl-C.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    // Before any secret is read: a same-user process cannot read this one's
    // environment or memory from /proc.
    sandbox_local::private::make_non_dumpable().context("prctl(PR_SET_DUMPABLE, 0)")?;
    let api_key = match &args.api_key_file {
        Some(path) => secret_file(path, "API key")?,
        None => secret_env(&args.api_key_env)?,
    };
    // Settings first: a misconfiguration fails before any secret is read.
    let mut policy = Policy::default();
    ceilings(&args, &mut policy)?;
    policy.provision_on = args.provision_on;
    let owner_metadata =
        sandbox_core::observed::parse_metadata_rule(args.owner_metadata.iter().map(String::as_str))
            .map_err(|e| anyhow::anyhow!("--owner-metadata: {e}"))?;
    let webhook_secret = match &args.webhook_secret_file {
        Some(path) => {
            let value = secret_file(path, "webhook secret")?;
            sandbox_core::webhook::WebhookVerifier::new(&value)
                .map_err(|e| anyhow::anyhow!("{} (webhook secret): {e}", path.display()))?;
            value
        }
        None => webhook_secret_env(&args.webhook_secret_env, "webhook secret")?,
    };
    let previous_webhook_secrets = match &args.webhook_previous_secret_env {
        Some(var) => vec![webhook_secret_env(var, "previous webhook secret")?],
        None => vec![],
    };
    let key = match args.executor_key_file {
        Some(path) => {
            secret_file(&path, "executor key")?;
            KeySource::File(path)
        }
        None => {
            secret_env(&args.executor_key_env)?;
            KeySource::EnvVar(args.executor_key_env)
        }
    };
    let (executor, forwarder) = match args.executor {
        Some(program) => (ExecutorCommand::new(program, args.executor_args), None),
        None if args.executor_mode == "split" => (
            ExecutorCommand::codex_listen(),
            Some(ExecutorCommand::codex_forward()),
        ),
        None => (ExecutorCommand::codex_exec_server(), None),
    };
    let mut controller = ControllerConfig::new(DeploymentId::new(args.deployment.clone())?);
    controller.policy = policy;
    controller.policy.shutdown_grace_secs = args.grace_secs;
    controller.policy.snapshot_keep = args.snapshot_keep;
    controller.policy.close_workspace = args.close_workspace;
    controller.filter.agent_ids = args.agent_ids;
    controller.filter.workspace_directory = args.workspace_directory;
    controller.filter.metadata = owner_metadata;
    controller.visibility_secs = args.visibility_secs.max(1);
    controller.lock_ttl_secs = args.lock_ttl_secs.max(1);
    controller.pool.max_age_secs = args.pool_max_age_secs;
    controller.pool.size = if forwarder.is_some() {
        args.pool_size.unwrap_or(DEFAULT_LOCAL_POOL_SIZE)
    } else {
        if args.pool_size.is_some_and(|n| n > 0) {
            eprintln!(
                "warning: warm pool off: it needs the split mode (the single-mode executor gets its assignment and the key at its start)"
            );
        }
        0
    };
    let mut api = ClientConfig::new(api_key);
    api.base_url = args.agents_api;
    let mut cfg = EmbeddedConfig::new(
        &args.data_dir,
        api,
        webhook_secret,
        executor,
        key,
        controller,
    );
    cfg.listen = args.listen;
    cfg.forwarder = forwarder;
    // Every executor runs under this binary's supervisor: a stop ends all its descendants,
    // also those that left its process group (sandbox_local::supervise).
    cfg.supervisor = Some(crate::supervisor_command()?);
    // In the split mode the executor's socket admits only its forwarder: a capability
    // token on the listener, and the forwarder behind its supervisor's relay
    // (sandbox_local::executor_relay).
    cfg.relay = cfg.forwarder.is_some();
    cfg.previous_webhook_secrets = previous_webhook_secrets;
    cfg.webhook_tolerance_secs = args.webhook_tolerance_secs;
    cfg.workers = args.workers;
    cfg.sweep_interval = Duration::from_secs(args.sweep_secs.max(1));
    let retain_days = match cfg.controller.policy.close_workspace {
        sandbox_core::workspace::CloseWorkspace::Retain { days } => u64::from(days),
        sandbox_core::workspace::CloseWorkspace::Delete => 0,
    };
    cfg.history_retention_secs = args.history_retention_days.max(retain_days) * 86_400;
    let stack = EmbeddedStack::start(cfg)
        .await
        .context("starting the stack")?;
    println!("listening for webhooks on {}", stack.webhook_url());
    tokio::signal::ctrl_c().await?;
    let stopped = stack.shutdown(args.stop_executors_on_exit).await?;
    println!("stopped ({stopped} executor(s) stopped)");
    Ok(())
}
