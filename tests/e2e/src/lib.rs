//! The end-to-end harness: the Agents API simulator delivering signed webhooks to the
//! embedded stack (intake → SQLite queue → workers → decide → child-process executors),
//! plus helpers to read the registry, the provider and the OS process table.
#![forbid(unsafe_code)]
#![deny(clippy::all)]
#![warn(missing_docs)]

pub mod aws_stack;
pub mod ecs_idempotency_proxy;
pub mod operator_cli;

use agents_sim::{SimClient, SimConfig, SimHandle, Url};
use anyhow::{Context as _, bail};
use sandbox_agents_api::ClientConfig;
use sandbox_controller::ControllerConfig;
use sandbox_controller::ports::{Compute as _, Registry as _};
use sandbox_core::compute::ComputeInstance;
use sandbox_core::ids::{DeploymentId, EnvironmentId};
use sandbox_core::observed::Policy;
use sandbox_core::record::Record;
use sandbox_local::embedded::{EmbeddedConfig, EmbeddedStack, LocalController};
use sandbox_local::process_compute::{ExecutorCommand, KeySource};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Deployment id used by the harness.
pub const DEPLOYMENT: &str = "e2e";

/// Knobs of one harness.
#[derive(Clone, Debug)]
pub struct Options {
    /// Extra copies of every webhook delivery.
    pub duplicates: u32,
    /// Reorder deliveries.
    pub reorder: bool,
    /// Worker loops.
    pub workers: usize,
    /// Shutdown grace, real seconds.
    pub grace_secs: u64,
    /// Sweeper period; `None` disables the periodic sweeper (tests call `sweep_now`).
    pub sweep_every: Option<Duration>,
    /// Simulated turn length, simulated seconds (60 sim s = 1 real s).
    pub turn_secs: f64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            duplicates: 0,
            reorder: false,
            workers: 2,
            grace_secs: 2,
            sweep_every: None,
            turn_secs: 30.0,
        }
    }
}

/// The simulator and the embedded stack, wired together.
pub struct Harness {
    /// The simulator.
    pub sim: SimHandle,
    /// A client of the simulator.
    pub client: SimClient,
    /// The stack (taken by `restart`/`shutdown`).
    stack: Option<EmbeddedStack>,
    /// Data directory (SQLite, workspaces).
    pub dir: tempfile::TempDir,
    config: EmbeddedConfig,
    webhook_port: u16,
}

/// A binary built next to the test executable (`target/debug/<name>`): the workspace
/// build of the test run builds every member's binaries.
pub fn workspace_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let debug = exe
        .parent()
        .and_then(Path::parent)
        .context("test executable has no target dir")?;
    let path = debug.join(name);
    if !path.is_file() {
        bail!(
            "{} not built (run the tests through `make test` or `cargo build --workspace`)",
            path.display()
        );
    }
    Ok(path)
}

impl Harness {
    /// Starts the simulator and the stack.
    pub async fn start(opts: Options) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let secret = agents_sim::DEFAULT_WEBHOOK_SECRET.to_owned();
        let mut sim_cfg = SimConfig::default()
            .with_webhook(
                Url::parse(&format!("http://127.0.0.1:{port}/webhook"))?,
                secret.clone(),
            )
            .with_time_scale(60.0)
            .with_turn_secs(opts.turn_secs)
            .with_faults(opts.duplicates, opts.reorder, 0..=20);
        sim_cfg.seed = 42;
        let sim = agents_sim::spawn(sim_cfg).await?;
        let key_file = dir.path().join("executor.key");
        std::fs::write(&key_file, agents_sim::DEFAULT_EXECUTOR_KEY)?;
        let mut controller = ControllerConfig::new(DeploymentId::new(DEPLOYMENT)?);
        controller.policy = Policy {
            connect_deadline_secs: 30,
            shutdown_grace_secs: opts.grace_secs,
            recheck_secs: 1,
            uncertain_retry_secs: 1,
            ..Policy::default()
        };
        controller.stop_readback_interval = Duration::from_millis(50);
        controller.lock_busy_retry_secs = 1;
        let mut api = ClientConfig::new(agents_sim::DEFAULT_API_KEY);
        api.base_url = sim.base_url();
        let mut config = EmbeddedConfig::new(
            dir.path(),
            api,
            secret,
            ExecutorCommand::new(
                workspace_binary("sim-executor")?.display().to_string(),
                ["exec-server"],
            ),
            KeySource::File(key_file),
            controller,
        );
        config.workers = opts.workers;
        config.sweep_interval = opts.sweep_every.unwrap_or(Duration::from_secs(3600));
        config.stop_grace = Duration::from_secs(5);
        let stack = EmbeddedStack::start_on(config.clone(), listener).await?;
        Ok(Self {
            client: sim.client(),
            sim,
            stack: Some(stack),
            dir,
            config,
            webhook_port: port,
        })
    }

    /// The stack.
    pub fn stack(&self) -> &EmbeddedStack {
        self.stack.as_ref().expect("stack running")
    }

    /// The controller.
    pub fn controller(&self) -> &LocalController {
        self.stack().controller()
    }

    /// The embedded configuration (for a restart or a second process).
    pub fn config(&self) -> &EmbeddedConfig {
        &self.config
    }

    /// The webhook port the simulator delivers to.
    pub fn webhook_port(&self) -> u16 {
        self.webhook_port
    }

    /// Stops the stack's loops (executors keep running), as a crashed controller would
    /// leave them.
    pub async fn stop_stack(&mut self) -> anyhow::Result<()> {
        if let Some(s) = self.stack.take() {
            s.shutdown(false).await?;
        }
        Ok(())
    }

    /// Starts the stack again on the same data directory and webhook port.
    pub async fn restart_stack(&mut self) -> anyhow::Result<()> {
        self.stop_stack().await?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.webhook_port)).await?;
        self.stack = Some(EmbeddedStack::start_on(self.config.clone(), listener).await?);
        Ok(())
    }

    /// Polls `check` every 100 ms until it holds or `timeout` passes.
    pub async fn wait_until<F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        check: F,
    ) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<bool>>,
    {
        crate::wait_until(what, timeout, check).await
    }

    /// Every instance the provider reports for this deployment.
    pub async fn instances(&self) -> anyhow::Result<Vec<ComputeInstance>> {
        let c = self.controller();
        Ok(c.compute.list(&c.config.deployment).await?)
    }

    /// Live instances of one environment, per the provider.
    pub async fn live(&self, env: &str) -> anyhow::Result<Vec<ComputeInstance>> {
        Ok(self
            .instances()
            .await?
            .into_iter()
            .filter(|i| i.environment_id.as_str() == env && i.status.is_live())
            .collect())
    }

    /// The record of one environment.
    pub async fn record(&self, env: &str) -> anyhow::Result<Option<Record>> {
        Ok(self
            .controller()
            .registry
            .get(&EnvironmentId::new(env).effect_key())
            .await?)
    }

    /// Whether the simulator sees the environment's executor connected.
    pub async fn connected(&self, env: &str) -> anyhow::Result<bool> {
        Ok(self
            .client
            .state()
            .await?
            .environment(env)
            .is_some_and(|e| e.connected))
    }

    /// Stops everything: the stack (and every executor) and the simulator.
    pub async fn shutdown(mut self) -> anyhow::Result<usize> {
        let stopped = match self.stack.take() {
            Some(s) => s.shutdown(true).await?,
            None => 0,
        };
        self.sim.shutdown().await;
        Ok(stopped)
    }
}

/// OS processes (from `/proc`) whose environment holds `ENVIRONMENT_ID=<env>` and whose
/// command line names `sim-executor`: the executors, counted from the process table.
pub fn os_executors(env: Option<&str>) -> Vec<u32> {
    let mut pids = vec![];
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline).contains("sim-executor") {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Zombies (state Z) have exited.
        if stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        {
            continue;
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let matches = match env {
            None => true,
            Some(env) => environ
                .split(|b| *b == 0)
                .any(|kv| kv == format!("ENVIRONMENT_ID={env}").as_bytes()),
        };
        if matches {
            pids.push(pid);
        }
    }
    pids
}

/// Polls `check` every 100 ms until it holds or `timeout` passes (both harnesses' waits).
///
/// # Errors
/// The check's error, or a timeout naming `what`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
