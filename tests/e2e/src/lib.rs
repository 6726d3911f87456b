//! The end-to-end harness: the Agents API simulator delivering signed webhooks to the
//! embedded stack (intake → SQLite queue → workers → decide → child-process executors),
//! plus helpers to read the registry, the provider and the OS process table. The
//! lifecycle rows run on it and on the AWS harness ([`aws_stack`]) through
//! [`LifecycleHarness`].
#![forbid(unsafe_code)]
#![deny(clippy::all)]
#![warn(missing_docs)]

pub mod aws_stack;
mod lifecycle_harness;

pub use lifecycle_harness::LifecycleHarness;
pub mod ecs_idempotency_proxy;
pub mod operator_cli;
pub mod private_moto;
pub mod serve_process;
pub mod test_tls;

/// The simulator's `remote_url` scheme and host (`http://127.0.0.1:PORT/...`): the
/// harnesses' `remote_url` allowlist.
pub const SIM_REMOTE_URL_HOST: &str = "http://127.0.0.1";

use agents_sim::{SimClient, SimConfig, SimHandle, Url};
use anyhow::{Context as _, bail};
use sandbox_agents_api::ClientConfig;
use sandbox_controller::ControllerConfig;
use sandbox_controller::ports::{Compute as _, NO_DEADLINE};
use sandbox_core::compute::ComputeInstance;
use sandbox_core::ids::{DeploymentId, EnvironmentId, InstanceId};
use sandbox_core::observed::Policy;
use sandbox_local::embedded::{EmbeddedConfig, EmbeddedStack, LocalController};
use sandbox_local::process_compute::{ExecutorCommand, KeySource};
use sandbox_local::{ProcessCompute, SqliteQueue, SqliteRegistry};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Deployment id used by the harness.
pub const DEPLOYMENT: &str = "e2e";

/// Knobs of one harness on either backend: all of the embedded harness's, and the ones
/// the AWS harness shares ([`aws_stack::AwsOptions::common`]); what a lifecycle row sets
/// ([`LifecycleHarness::start`]).
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
    /// Sweeper period; `None` disables the periodic sweeper (tests sweep themselves).
    pub sweep_every: Option<Duration>,
    /// Simulated turn length, simulated seconds (60 sim s = 1 real s).
    pub turn_secs: f64,
    /// The simulator's input-time connection deadline, simulated seconds (default 300 =
    /// 5 real seconds).
    pub sim_connect_deadline_secs: f64,
    /// Changes the harness policy after the short times are set (the ceiling rows set
    /// their ceilings here); default: none.
    pub ceilings: fn(&mut Policy),
    /// Simulated seconds per real second (default 60). 1.0 keeps the session's
    /// `last_active_at` on the controller's clock (the no-work row).
    pub sim_time_scale: f64,
    /// Executors run but never connect (the replacement cap row): locally a `sleep`
    /// process instead of the stand-in, on AWS the bridge leaves the tasks unconnected.
    pub executors_never_connect: bool,
    /// What a close does with the workspace (`Policy::close_workspace`; default
    /// `retain:7`).
    pub close_workspace: sandbox_core::workspace::CloseWorkspace,
    /// The split mode's executor and forwarder commands (default: none, the
    /// single-process stand-in).
    pub split_executor: Option<(ExecutorCommand, ExecutorCommand)>,
    /// The simulator's turn command (default: its own, simulated unless split).
    pub turn_command: Option<String>,
    /// The warm pool's size (default 0: off; split mode only).
    pub pool_size: u32,
    /// The executor command instead of the stand-in (embedded harness only; e.g. a script
    /// that exits before it connects, as an executor whose key is rejected does).
    pub executor_command: Option<ExecutorCommand>,
    /// The executor's socket admits only its forwarder: every executor and forwarder runs
    /// under `sandboxctl supervise`, the forwarder's behind its relay (split mode only;
    /// `ProcessComputeConfig::relay`). Default: `false`.
    pub relay: bool,
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
            sim_connect_deadline_secs: SimConfig::default().connect_deadline_secs,
            ceilings: |_| {},
            sim_time_scale: 60.0,
            executors_never_connect: false,
            close_workspace: Default::default(),
            split_executor: None,
            relay: false,
            turn_command: None,
            pool_size: 0,
            executor_command: None,
        }
    }
}

/// The split commands with the stand-in on both sides:
/// `sim-executor exec-server --listen $LISTEN_URL` and `sim-executor exec-server forward
/// --remote $REMOTE_URL --environment-id $ENVIRONMENT_ID --connect $LISTEN_URL`.
pub fn stand_in_split() -> anyhow::Result<(ExecutorCommand, ExecutorCommand)> {
    let bin = workspace_binary("sim-executor")?.display().to_string();
    Ok((ExecutorCommand::listen(bin), stand_in_forwarder()?))
}

/// The stand-in forwarder (the real `forward` speaks the Noise rendezvous, which the
/// simulator does not implement).
pub fn stand_in_forwarder() -> anyhow::Result<ExecutorCommand> {
    let bin = workspace_binary("sim-executor")?.display().to_string();
    Ok(ExecutorCommand::forward(bin))
}

/// The pinned `codex` installed by `npm ci` in infra/executor (`make infra-tools`, a
/// prerequisite of `make rust-test`). An error, never a skip, when it is absent.
pub fn pinned_codex() -> anyhow::Result<PathBuf> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../infra/executor/node_modules/.bin/codex");
    if !path.exists() {
        bail!(
            "{} is missing: run `make infra-tools` (cd infra/executor && npm ci)",
            path.display()
        );
    }
    Ok(std::path::absolute(path)?)
}

/// A port of 127.0.0.1 free when asked (the kernel picks it; released at once).
///
/// # Panics
/// When no port can be bound on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// `dir/bin` holding `codex` → the pinned binary ([`pinned_codex`]), as the executor image
/// links it into /usr/local/bin: put it first on `PATH` to run the Fargate entrypoint.
///
/// # Errors
/// The pinned codex is missing, or the directory or link cannot be made.
pub fn pinned_codex_on_path(dir: &Path) -> anyhow::Result<PathBuf> {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    std::os::unix::fs::symlink(pinned_codex()?, bin.join("codex"))?;
    Ok(bin)
}

/// `E2E_LOG=info` (any `RUST_LOG` filter) shows the controller's logs in a test's output
/// (nextest captures it: add `--no-capture` to see it live). Both harnesses call it at
/// start; the first call in a process wins.
pub fn init_test_logs() {
    if let Ok(filter) = std::env::var("E2E_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
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
/// build of the test run builds every member's binaries. `sandboxctl --backend aws` needs
/// its `aws` feature: `make test` builds the workspace with `--features sandboxctl/aws`.
pub fn workspace_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let debug = exe
        .parent()
        .and_then(Path::parent)
        .context("test executable has no target dir")?;
    let path = debug.join(name);
    if !path.is_file() {
        bail!(
            "{} not built (run the tests through `make test` or `cargo build --workspace --features sandboxctl/aws`)",
            path.display()
        );
    }
    Ok(path)
}

impl Harness {
    /// Starts the simulator and the stack.
    pub async fn start(opts: Options) -> anyhow::Result<Self> {
        init_test_logs();
        let dir = tempfile::tempdir()?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let secret = agents_sim::DEFAULT_WEBHOOK_SECRET.to_owned();
        let mut sim_cfg = SimConfig::default()
            .with_webhook(
                Url::parse(&format!("http://127.0.0.1:{port}/webhook"))?,
                secret.clone(),
            )
            .with_time_scale(opts.sim_time_scale)
            .with_turn_secs(opts.turn_secs)
            .with_connect_deadline_secs(opts.sim_connect_deadline_secs)
            .with_faults(opts.duplicates, opts.reorder, 0..=20);
        if let Some(command) = &opts.turn_command {
            sim_cfg = sim_cfg.with_turn_command(command.clone());
        }
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
            remote_url_allowlist: vec![SIM_REMOTE_URL_HOST].into(),
            close_workspace: opts.close_workspace,
            ..Policy::default()
        };
        (opts.ceilings)(&mut controller.policy);
        controller.stop_readback_interval = Duration::from_millis(50);
        controller.lock_busy_retry_secs = 1;
        controller.pool.size = opts.pool_size;
        let mut api = ClientConfig::new(agents_sim::DEFAULT_API_KEY);
        api.base_url = sim.base_url();
        let mut config = EmbeddedConfig::new(
            dir.path(),
            api,
            secret,
            if opts.executors_never_connect {
                ExecutorCommand::new("sleep", ["86400"])
            } else {
                ExecutorCommand::new(
                    workspace_binary("sim-executor")?.display().to_string(),
                    ExecutorCommand::codex_exec_server().args,
                )
            },
            KeySource::File(key_file),
            controller,
        );
        if let Some(executor) = &opts.executor_command {
            config.executor = executor.clone();
        }
        if let Some((executor, forwarder)) = &opts.split_executor {
            config.executor = executor.clone();
            config.forwarder = Some(forwarder.clone());
        }
        if opts.relay {
            config.supervisor = Some(ExecutorCommand::new(
                workspace_binary("sandboxctl")?.display().to_string(),
                ["supervise", "--"],
            ));
            config.relay = true;
        }
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
}

impl LifecycleHarness for Harness {
    type Queue = SqliteQueue;
    type Registry = SqliteRegistry;
    type Compute = ProcessCompute;

    const STEP_TIMEOUT: Duration = Duration::from_secs(30);
    const SETTLE: Duration = Duration::from_millis(500);

    async fn start(opts: Options) -> anyhow::Result<Self> {
        Harness::start(opts).await
    }

    fn sim(&self) -> &SimHandle {
        &self.sim
    }

    fn client(&self) -> &SimClient {
        &self.client
    }

    fn controller(&self) -> &LocalController {
        self.stack().controller()
    }

    /// Stops the executor process through the provider (SIGTERM to its group), outside
    /// any job.
    async fn audit(&self, env: &str) -> anyhow::Result<Vec<sandbox_controller::ports::AuditEntry>> {
        Ok(self
            .controller()
            .registry
            .audit_entries(&EnvironmentId::new(env).effect_key())
            .await?)
    }

    async fn stop_behind_the_controllers_back(&self, id: &InstanceId) -> anyhow::Result<()> {
        Ok(self
            .controller()
            .compute
            .stop(id, "test", NO_DEADLINE)
            .await?)
    }

    /// `REMOTE_URL` and `ENVIRONMENT_ID` from `/proc/<pid>/environ` of the environment's
    /// one executor process.
    async fn executor_vars(
        &self,
        instance: &ComputeInstance,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let pids = os_executors(Some(instance.environment_id.as_str()));
        let [pid] = pids[..] else {
            bail!(
                "expected one executor process of {}, found {pids:?}",
                instance.environment_id
            );
        };
        let environ = std::fs::read(format!("/proc/{pid}/environ"))?;
        let environ = String::from_utf8_lossy(&environ);
        Ok(["REMOTE_URL", "ENVIRONMENT_ID"]
            .into_iter()
            .filter_map(|name| {
                environ
                    .split('\0')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                    .map(|value| (name.to_owned(), value.to_owned()))
            })
            .collect())
    }

    fn executor_processes(env: &str) -> Option<usize> {
        Some(os_executors(Some(env)).len())
    }

    async fn sandboxctl(&self, args: &[&str]) -> operator_cli::CtlOutput {
        let dir = self.dir.path().to_string_lossy().into_owned();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--data-dir", dir.as_str(), "--deployment", DEPLOYMENT]);
        operator_cli::sandboxctl(&all, &[]).await
    }

    /// Stops the stack (and every executor) and the simulator.
    async fn shutdown(mut self) -> anyhow::Result<usize> {
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
        // The program itself (argv[0]), not a process naming it as an argument: the
        // executor's supervisor (`sandboxctl supervise -- .../sim-executor ...`).
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        if !String::from_utf8_lossy(argv0).contains("sim-executor") {
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

/// The embedded harness with the real pinned codex as both halves of every instance:
/// `codex exec-server --listen` the executor, `codex exec-server forward` the forwarder,
/// which registers with the simulator and relays each turn's Noise stream to the executor
/// (../shared/reference/executor-protocol.md). Fails, never skips, when the binary is
/// missing.
pub struct RealCodexHarness(Harness);

/// The turn command the real-codex harness sets when a row sets none: it prints the
/// process it ran under (its parent: the real codex).
pub const REAL_CODEX_PROBE: &str =
    "echo parent=$(tr '\\0' ' ' < /proc/$PPID/cmdline); echo probe-done";

impl LifecycleHarness for RealCodexHarness {
    type Queue = SqliteQueue;
    type Registry = SqliteRegistry;
    type Compute = ProcessCompute;

    const STEP_TIMEOUT: Duration = Duration::from_secs(60);
    const SETTLE: Duration = Duration::from_millis(500);
    const TURN_RUNS_IN: Option<&'static str> = Some("codex exec-server --listen ws://127.0.0.1:");

    async fn start(mut opts: Options) -> anyhow::Result<Self> {
        let codex = pinned_codex()?.display().to_string();
        opts.split_executor = Some((
            ExecutorCommand::listen(codex.clone()),
            ExecutorCommand::forward(codex),
        ));
        opts.turn_command
            .get_or_insert_with(|| REAL_CODEX_PROBE.to_owned());
        Ok(Self(Harness::start(opts).await?))
    }

    fn sim(&self) -> &SimHandle {
        &self.0.sim
    }

    fn client(&self) -> &SimClient {
        &self.0.client
    }

    fn controller(&self) -> &LocalController {
        self.0.controller()
    }

    async fn audit(&self, env: &str) -> anyhow::Result<Vec<sandbox_controller::ports::AuditEntry>> {
        self.0.audit(env).await
    }

    async fn stop_behind_the_controllers_back(&self, id: &InstanceId) -> anyhow::Result<()> {
        self.0.stop_behind_the_controllers_back(id).await
    }

    /// `REMOTE_URL` and `ENVIRONMENT_ID` as the instance got them: in the split only the
    /// forwarder (the stand-in's `sim-executor ... forward`) holds them.
    /// `REMOTE_URL` and `ENVIRONMENT_ID` as the instance's forwarder (the real codex, the
    /// only process given them) holds them in its environment.
    async fn executor_vars(
        &self,
        instance: &ComputeInstance,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let pid = self
            .0
            .controller()
            .compute
            .forwarder_pid(&instance.instance_id)
            .await?
            .with_context(|| format!("no forwarder for {}", instance.instance_id))?;
        let environ = std::fs::read(format!("/proc/{pid}/environ"))?;
        let environ = String::from_utf8_lossy(&environ);
        Ok(["REMOTE_URL", "ENVIRONMENT_ID"]
            .into_iter()
            .filter_map(|name| {
                environ
                    .split('\0')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                    .map(|value| (name.to_owned(), value.to_owned()))
            })
            .collect())
    }

    /// The listening real-codex executors of `env`: group leaders (an instance's recorded
    /// pid) whose command line is `... exec-server --listen ...` and whose working
    /// directory is one of `env`'s generation workspaces.
    fn executor_processes(env: &str) -> Option<usize> {
        Some(os_listening_executors(env).len())
    }

    async fn sandboxctl(&self, args: &[&str]) -> operator_cli::CtlOutput {
        self.0.sandboxctl(args).await
    }

    async fn shutdown(self) -> anyhow::Result<usize> {
        self.0.shutdown().await
    }
}

/// Live processes that lead their process group, run `exec-server --listen` and work in
/// a generation workspace of `env` (`.../<env>/g<N>`).
pub fn os_listening_executors(env: &str) -> Vec<u32> {
    let mut pids = vec![];
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r.to_owned()) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // state ppid pgrp: zombies have exited; only the group leader is the instance.
        if fields.first() == Some(&"Z") || fields.get(2) != Some(&pid.to_string().as_str()) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !cmdline.contains("exec-server --listen ") {
            continue;
        }
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
        let in_env = cwd
            .parent()
            .and_then(Path::file_name)
            .is_some_and(|n| n == env);
        if in_env {
            pids.push(pid);
        }
    }
    pids
}

/// Live processes whose command line contains `needle` and whose working directory is a
/// generation workspace of `env` (`.../<env>/g<N>`): a turn command running in an
/// executor of `env`.
pub fn os_commands_in(env: &str, needle: &str) -> Vec<u32> {
    let mut pids = vec![];
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline)
            .replace('\0', " ")
            .contains(needle)
        {
            continue;
        }
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
        if cwd
            .parent()
            .and_then(Path::file_name)
            .is_some_and(|n| n == env)
        {
            pids.push(pid);
        }
    }
    pids
}
