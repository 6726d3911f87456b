//! The embedded stack: the whole pipeline in one process on 127.0.0.1 — the webhook
//! endpoint (the same handler code as the Lambda), worker loops over the SQLite events
//! timers and sweep queues, the sweeper timer, the SQLite registry and child-process executors.
//!
//! `sandboxctl serve` runs it against an Agents API base URL; `sandboxctl demo` and the
//! end-to-end tests run it against the simulator.

use crate::process_compute::{ExecutorCommand, KeySource, ProcessCompute, ProcessComputeConfig};
use crate::sqlite_queue::{QueueOptions, SqliteQueue};
use crate::sqlite_registry::SqliteRegistry;
use sandbox_agents_api::{AgentsClient, ClientConfig};
use sandbox_controller::ports::{Clock, Compute, PortError, SystemClock};
use sandbox_controller::{Controller, ControllerConfig, Intake, SweepReport, router};
use sandbox_core::webhook::WebhookVerifier;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The controller over the embedded adapters.
pub type LocalController = Controller<SqliteQueue, SqliteRegistry, ProcessCompute, AgentsClient>;

/// Name of the FIFO events queue inside the database.
pub const EVENTS_QUEUE: &str = "events.fifo";
/// Name of the standard timers queue inside the database.
pub const TIMERS_QUEUE: &str = "timers";
/// Name of the standard sweep queue inside the database: a fanned-out sweep's jobs, apart
/// from the timers queue's rechecks ([`Controller::with_sweep_queue`]; AWS:
/// `SWEEP_QUEUE_URL`).
pub const SWEEP_QUEUE: &str = "sweep";

/// Settings of the embedded stack. Its `Debug` redacts the webhook secrets;
/// the API key and an executor key given by value redact themselves.
#[derive(Clone)]
pub struct EmbeddedConfig {
    /// Holds `sandbox.db` (registry, executor table), `queues.db` (events and timers
    /// queues) and `workspaces/`.
    pub data_dir: PathBuf,
    /// The Agents API client (base URL, API key, timeouts, retries).
    pub agents_api: ClientConfig,
    /// The webhook signing secret (`whsec_...`); never logged.
    pub webhook_secret: String,
    /// The executor command (`codex exec-server ...` in production).
    pub executor: ExecutorCommand,
    /// Where the executor key comes from; it only travels in the child's environment.
    pub executor_key: KeySource,
    /// Controller settings (deployment id, policy, ownership filter, ...).
    pub controller: ControllerConfig,
    /// Concurrent worker loops (default 2; 0 runs the intake only).
    pub workers: usize,
    /// Time between sweeps (default 30 s).
    pub sweep_interval: Duration,
    /// Where the webhook endpoint listens (default `127.0.0.1:0`: any free port).
    pub listen: SocketAddr,
    /// SIGTERM-to-SIGKILL grace of executors (default 10 s).
    pub stop_grace: Duration,
    /// Events-queue maximum receive count before dead-lettering (default 5).
    pub max_receive_count: u32,
    /// Previous webhook signing secrets still accepted during a rotation (default none);
    /// never logged.
    pub previous_webhook_secrets: Vec<String>,
    /// Accepted `webhook-timestamp` skew, both directions, seconds (default 300).
    pub webhook_tolerance_secs: u64,
    /// How long audit entries and receipts are kept, seconds (default 30 days):
    /// older ones read as absent and every sweep prunes a bounded batch of them.
    pub history_retention_secs: u64,
    /// The forwarder of the split mode (the only child holding the key; the
    /// executor then listens and holds none); `None` (default): single-process mode.
    pub forwarder: Option<ExecutorCommand>,
    /// The executor's supervisor ([`crate::supervise`], e.g. `sandboxctl supervise --`):
    /// a stop then ends every descendant of the executor. `None` (default): none.
    pub supervisor: Option<ExecutorCommand>,
    /// The executor's socket admits only its forwarder
    /// ([`crate::process_compute::ProcessComputeConfig::relay`]; needs the split mode and
    /// a supervisor). Default: `false`.
    pub relay: bool,
}

/// History rows one sweep tick prunes at most (per table).
const PRUNE_PER_SWEEP: usize = 5_000;
impl std::fmt::Debug for EmbeddedConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedConfig")
            .field("data_dir", &self.data_dir)
            .field("agents_api", &self.agents_api)
            .field("webhook_secret", &"<redacted>")
            .field("executor", &self.executor)
            .field("executor_key", &self.executor_key)
            .field("controller", &self.controller)
            .field("workers", &self.workers)
            .field("sweep_interval", &self.sweep_interval)
            .field("listen", &self.listen)
            .field("stop_grace", &self.stop_grace)
            .field("max_receive_count", &self.max_receive_count)
            .field(
                "previous_webhook_secrets",
                &format_args!("<{} redacted>", self.previous_webhook_secrets.len()),
            )
            .field("webhook_tolerance_secs", &self.webhook_tolerance_secs)
            .field("history_retention_secs", &self.history_retention_secs)
            .field("forwarder", &self.forwarder)
            .field("supervisor", &self.supervisor)
            .field("relay", &self.relay)
            .finish()
    }
}

impl EmbeddedConfig {
    /// Defaults around the required parts.
    ///
    /// The controller's stop read-back starts at [`LOCAL_STOP_READBACK_INTERVAL`] (or what
    /// `controller` asks, if shorter).
    pub fn new(
        data_dir: impl Into<PathBuf>,
        agents_api: ClientConfig,
        webhook_secret: impl Into<String>,
        executor: ExecutorCommand,
        executor_key: KeySource,
        mut controller: ControllerConfig,
    ) -> Self {
        controller.stop_readback_interval = controller
            .stop_readback_interval
            .min(LOCAL_STOP_READBACK_INTERVAL);
        Self {
            data_dir: data_dir.into(),
            agents_api,
            webhook_secret: webhook_secret.into(),
            executor,
            executor_key,
            controller,
            workers: 2,
            sweep_interval: Duration::from_secs(30),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            stop_grace: Duration::from_secs(10),
            max_receive_count: 5,
            previous_webhook_secrets: Vec::new(),
            webhook_tolerance_secs: sandbox_core::webhook::DEFAULT_TOLERANCE_SECS,
            history_retention_secs: crate::sqlite_registry::DEFAULT_HISTORY_RETENTION_SECS,
            forwarder: None,
            supervisor: None,
            relay: false,
        }
    }
}

/// The first pause of a stop's read-back in local mode (it doubles from there). A child
/// executor exits within milliseconds of its SIGTERM, where an ECS task takes its
/// `stopTimeout`: the controller's default first pause (500 ms, for ECS) held a worker half
/// a second per stop, and connection requests queued behind stop jobs waited for it
/// (`make bench` time-to-executor, 2026-12-04: stop jobs held a worker 506 ms p50).
pub const LOCAL_STOP_READBACK_INTERVAL: Duration = Duration::from_millis(25);

/// Why the stack could not start.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// The webhook secret is unusable (names the check, never the secret).
    #[error(transparent)]
    Secret(#[from] sandbox_core::webhook::SecretError),
    /// A local adapter could not open.
    #[error(transparent)]
    Port(#[from] PortError),
    /// The Agents API client configuration is invalid.
    #[error("agents api client: {0}")]
    Client(#[from] sandbox_agents_api::ConfigError),
    /// The data directory or the listener failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// A running embedded stack. Drop does not stop executors: call [`EmbeddedStack::shutdown`].
pub struct EmbeddedStack {
    controller: Arc<LocalController>,
    webhook_addr: SocketAddr,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl EmbeddedStack {
    /// Binds `cfg.listen`, then [`EmbeddedStack::start_on`] it.
    ///
    /// # Errors
    /// As [`EmbeddedStack::start_on`], or the bind failing.
    pub async fn start(cfg: EmbeddedConfig) -> Result<Self, EmbeddedError> {
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(|source| EmbeddedError::Io {
                what: "bind webhook listener",
                source,
            })?;
        Self::start_on(cfg, listener).await
    }

    /// Opens the adapters, serves the webhook endpoint on `listener` and starts the worker
    /// loops and the sweeper timer. (Binding first lets a caller hand the webhook URL to
    /// the Agents API — or the simulator — before the stack starts.)
    ///
    /// # Errors
    /// [`EmbeddedError`] when the secret, a SQLite file, the client or the listener fail.
    pub async fn start_on(
        mut cfg: EmbeddedConfig,
        listener: tokio::net::TcpListener,
    ) -> Result<Self, EmbeddedError> {
        // The terminal record names where the executor key lives.
        cfg.controller.executor_key_location = cfg.executor_key.location();
        let secrets: Vec<&str> = std::iter::once(cfg.webhook_secret.as_str())
            .chain(cfg.previous_webhook_secrets.iter().map(String::as_str))
            .collect();
        let verifier = WebhookVerifier::with_secrets(&secrets)?
            .with_tolerance_secs(cfg.webhook_tolerance_secs);
        crate::private::create_private_dir(&cfg.data_dir).map_err(|source| EmbeddedError::Io {
            what: "create data dir",
            source,
        })?;
        // The operator's tools decide with the stack's settings (`sandboxctl explain`,
        // `sweep --dry-run` on this data directory).
        crate::settings_file::write(&cfg.data_dir, &cfg.controller).map_err(|source| {
            EmbeddedError::Io {
                what: "write controller-settings.json",
                source,
            }
        })?;
        // The worker verifies forced operator jobs with the data directory's operator key
        // (crate::operator_key; docs/SECURITY.md).
        cfg.controller.operator_key = Some(
            crate::operator_key::load_or_create(&cfg.data_dir).map_err(|source| {
                EmbeddedError::Io {
                    what: "read or create operator.key",
                    source,
                }
            })?,
        );
        // Queues and registry in two files, as SQS and DynamoDB are two services: their
        // write transactions never wait for each other's file lock (`make bench`).
        let db = cfg.data_dir.join("sandbox.db");
        let queues = cfg.data_dir.join("queues.db");
        let events = SqliteQueue::open(
            &queues,
            EVENTS_QUEUE,
            QueueOptions::fifo().with_max_receive_count(cfg.max_receive_count),
        )?;
        let timers = SqliteQueue::open(
            &queues,
            TIMERS_QUEUE,
            QueueOptions::standard().with_max_receive_count(cfg.max_receive_count),
        )?;
        let sweep = SqliteQueue::open(
            &queues,
            SWEEP_QUEUE,
            QueueOptions::standard().with_max_receive_count(cfg.max_receive_count),
        )?;
        let registry =
            SqliteRegistry::open(&db)?.with_history_retention(cfg.history_retention_secs);
        let mut compute_cfg = ProcessComputeConfig::new(
            cfg.executor.clone(),
            cfg.data_dir.join("workspaces"),
            cfg.executor_key.clone(),
            &db,
        );
        compute_cfg.stop_grace = cfg.stop_grace;
        compute_cfg.forwarder = cfg.forwarder.clone();
        compute_cfg.supervisor = cfg.supervisor.clone();
        compute_cfg.relay = cfg.relay;
        if compute_cfg.forwarder.is_none() {
            tracing::warn!(
                "executor mode single: the executor child holds the executor key in its environment (the single-container fallback; configure a forwarder to split)"
            );
        }
        let compute = ProcessCompute::open(compute_cfg)?;
        let sessions = AgentsClient::new(cfg.agents_api.clone())?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let intake = Arc::new(
            Intake::new(verifier, events.clone(), clock.clone())
                .with_provision_on(cfg.controller.policy.provision_on),
        );
        let controller = Arc::new(
            Controller::new(
                events,
                timers,
                registry,
                compute,
                sessions,
                clock,
                cfg.controller.clone(),
            )
            .with_sweep_queue(sweep),
        );

        let webhook_addr = listener.local_addr().map_err(|source| EmbeddedError::Io {
            what: "webhook listener address",
            source,
        })?;
        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();
        let mut rx = stopped.clone();
        tasks.push(tokio::spawn(async move {
            let serve = axum::serve(listener, router(intake)).with_graceful_shutdown(async move {
                let _ = rx.wait_for(|s| *s).await;
            });
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "webhook server failed");
            }
        }));
        for n in 0..cfg.workers {
            let c = controller.clone();
            let rx = stopped.clone();
            tasks.push(tokio::spawn(async move { worker_loop(n, c, rx).await }));
        }
        if cfg.controller.pool.size > 0 {
            let c = controller.clone();
            let rx = stopped.clone();
            tasks.push(tokio::spawn(async move { pool_loop(c, rx).await }));
        }
        let c = controller.clone();
        let interval = cfg.sweep_interval;
        tasks.push(tokio::spawn(async move {
            sweeper_loop(c, interval, stopped).await
        }));
        tracing::info!(%webhook_addr, workers = cfg.workers, pool_size = cfg.controller.pool.size, "embedded stack started");
        Ok(Self {
            controller,
            webhook_addr,
            stop,
            tasks,
        })
    }

    /// The webhook endpoint, e.g. `http://127.0.0.1:PORT/webhook`.
    pub fn webhook_url(&self) -> String {
        format!("http://{}/webhook", self.webhook_addr)
    }

    /// The controller (for `close`, `sweep`, inspection).
    pub fn controller(&self) -> &Arc<LocalController> {
        &self.controller
    }

    /// Runs one sweep now.
    ///
    /// # Errors
    /// As [`Controller::sweep`].
    pub async fn sweep_now(&self) -> Result<SweepReport, PortError> {
        self.controller.sweep().await
    }

    /// Stops the loops and the endpoint; with `stop_executors`, also stops every live
    /// executor this stack's database knows (SIGTERM, then SIGKILL after the grace).
    /// Returns how many executors were stopped, idle warm pool members (expected
    /// to run until the end, serving nothing) not counted; they are stopped too.
    ///
    /// # Errors
    /// A [`PortError`] from stopping executors.
    pub async fn shutdown(self, stop_executors: bool) -> Result<usize, PortError> {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        if stop_executors {
            // The refill loop has ended: no member starts between the two reads.
            let compute = &self.controller.compute;
            let idle = compute
                .list_pool(&self.controller.config.deployment)
                .await?
                .len();
            Ok(compute.shutdown_all().await?.saturating_sub(idle))
        } else {
            Ok(0)
        }
    }
}

async fn worker_loop(n: usize, c: Arc<LocalController>, stop: watch::Receiver<bool>) {
    // A job in progress always finishes (its lock, record and receipts stay consistent);
    // the stop flag is checked between batches.
    while !*stop.borrow() {
        let events = c.consume_once(&c.events, 10, 200).await;
        let timers = c.consume_once(&c.timers, 10, 0).await;
        // The sweep queue last and a smaller batch: rechecks and webhooks first (as the
        // AWS event source mappings' lower MaximumConcurrency for it).
        let sweep = c.consume_once(c.sweep_queue(), 5, 0).await;
        match (events, timers, sweep) {
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                tracing::warn!(worker = n, error = %e, "receive failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            (Ok(0), Ok(0), Ok(0)) => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => {}
        }
    }
}

/// How often `serve` refills the warm pool: a claim's member is replaced
/// within this, and a member past its age recycled.
pub const POOL_REFILL_INTERVAL: Duration = Duration::from_millis(500);

/// Keeps the warm pool at its size ([`Controller::refill_pool`]) every
/// [`POOL_REFILL_INTERVAL`] until the stop.
async fn pool_loop(c: Arc<LocalController>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(POOL_REFILL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = tick.tick() => {}
        }
        match c.refill_pool().await {
            Ok(r) if r.started > 0 || r.recycled > 0 => tracing::info!(?r, "pool refilled"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "pool not refilled this tick"),
        }
    }
}

async fn sweeper_loop(c: Arc<LocalController>, every: Duration, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = tick.tick() => {}
        }
        // As the sweeper Lambda: one read, then one job per environment on the sweep
        // queue, decided by the worker loops. A sweep in progress finishes before the stop
        // is honoured.
        match c.sweep_fan_out().await {
            Ok(report) => tracing::info!(?report, "sweep"),
            Err(e) => tracing::warn!(error = %e, "sweep skipped"),
        }
        // History past its retention, a bounded batch per tick (DynamoDB: TTL).
        match c
            .registry
            .prune_history(c.clock.now(), PRUNE_PER_SWEEP)
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(rows = n, "expired history pruned"),
            Err(e) => tracing::warn!(error = %e, "history not pruned this sweep"),
        }
    }
}
