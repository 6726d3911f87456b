//! Time to executor, measured in local mode, warm and cold (docs/PERFORMANCE.md).
//!
//! What runs, per row (executor × path), on 127.0.0.1 only: the Agents API simulator
//! (`agents-sim`, served by this process with a stamping layer, see below) delivering
//! signed webhooks to the embedded stack of `sandboxctl serve` (`sandbox-local`'s
//! [`EmbeddedStack`]: the webhook intake, the SQLite queues and registry, the sweeper, the
//! pool's refill loop and child-process executors) in the split mode: a key-free listening
//! executor plus a forwarder spawned at the start (or the claim) with the key. The
//! executor is the real pinned `codex exec-server --listen` (`infra/executor`, `npm ci`)
//! and its forwarder the real `codex exec-server forward --connect` (registration, the
//! rendezvous WebSocket and the Noise hybrid IK handshake with the simulator:
//! ../shared/reference/executor-protocol.md) when codex is installed, else (said loudly)
//! only the simulator's stand-in `sim-executor` as both halves, which speaks the same
//! protocol.
//!
//! The stack's worker loops are replaced by the same loop (`consume_once` on the events
//! queue with a 200 ms wait, then the timers queue, a 50 ms sleep when both were empty;
//! `serve`'s two workers) with each [`Controller::handle`] timed: that is the
//! controller's own share, the worker's whole job of the connection request (ledger, session read,
//! lock, claim or start, record, release, ack).
//!
//! One sample, sessions one after another: a self-hosted session is created (not timed);
//! on the warm path the bench first waits until the pool's oldest idle member (the one a
//! claim takes) is listening (its loopback port in `LISTEN` in `/proc/net/tcp`, read
//! passively). Then **t0**: the bench submits the session's input, upon which the
//! simulator requests the executor connection (`agent.session.action_required`,
//! delivered signed to the webhook). **Connected**: the simulator accepted the
//! forwarder's rendezvous WebSocket (101, after its registration; the environment is
//! `connected` from then; the layer stamps the answer). Per sample: total = connected − t0; controller = the
//! start's job; pickup = job start − t0 (simulator emission and delivery, intake, queue);
//! rest = total − controller. Warm samples must be claims (the record's
//! `instance_from_pool`) and cold ones must not: otherwise the run fails. Each session's
//! turn runs `true` on its executor and the session goes idle; the controller stops the
//! executor after a 1 s grace, in the background of the next samples.
//!
//! After each row every process the stack started is stopped, and the run fails when any
//! process still works in the row's data directory.

use agents_sim::{SessionEnvironment, SimClient, SimConfig, SimState, Url};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use sandbox_agents_api::ClientConfig;
use sandbox_controller::ControllerConfig;
use sandbox_controller::ports::{Compute, Queue, Registry};
use sandbox_core::compute::ComputeStatus;
use sandbox_core::decision::Effect;
use sandbox_core::ids::{DeploymentId, EnvironmentId, InstanceId};
use sandbox_core::observed::{Policy, Trigger};
use sandbox_local::embedded::{EmbeddedConfig, EmbeddedStack, LocalController};
use sandbox_local::process_compute::{ExecutorCommand, KeySource};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The deployment id of the bench's stack.
const DEPLOYMENT: &str = "bench";
/// Longest wait for one sample's `connected` (and for a ready pool member).
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Which executor a row runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExecutorKind {
    /// The real pinned `codex exec-server --listen`.
    Codex,
    /// The simulator's stand-in `sim-executor exec-server --listen`.
    StandIn,
}

/// Warm (pool on, every start a claim) or cold (pool size 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartPath {
    /// Pool on.
    Warm,
    /// Pool off.
    Cold,
}

impl StartPath {
    fn as_str(self) -> &'static str {
        match self {
            Self::Warm => "warm",
            Self::Cold => "cold",
        }
    }
}

/// Options of [`measure`].
#[derive(Clone, Debug)]
pub struct Options {
    /// Sessions per row (≥ 200 for docs/PERFORMANCE.md).
    pub sessions: usize,
    /// The stand-in binary (`sim-executor`): both halves of the stand-in rows.
    pub sim_executor: PathBuf,
    /// The pinned codex (`infra/executor/node_modules/.bin/codex`); rows with it are
    /// skipped (loudly, and said so in the output) when it is missing.
    pub codex: PathBuf,
    /// Executors to run, in order.
    pub executors: Vec<ExecutorKind>,
    /// Paths to run, in order.
    pub paths: Vec<StartPath>,
    /// Warm pool size of the warm rows (`serve`'s default in split mode: 2).
    pub pool_size: u32,
    /// Worker loops (`serve`'s default: 2).
    pub workers: usize,
    /// Where the rows' data directories go.
    pub storage: PathBuf,
}

/// p50/p90/p99/max/mean of one quantity, milliseconds (nearest-rank percentiles).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Stats {
    /// Samples.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl Stats {
    /// Nearest-rank percentiles of `values`.
    pub fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return Self::default();
        }
        let rank = |p: f64| {
            let i = ((p / 100.0) * v.len() as f64).ceil() as usize;
            v[i.clamp(1, v.len()) - 1]
        };
        Self {
            n: v.len(),
            p50: rank(50.0),
            p90: rank(90.0),
            p99: rank(99.0),
            max: v[v.len() - 1],
            mean: v.iter().sum::<f64>() / v.len() as f64,
        }
    }
}

/// One session.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sample {
    /// The environment.
    pub environment_id: String,
    /// t0 → the simulator answered the forwarder's connect.
    pub total_ms: f64,
    /// The worker's job of the connection request that started or claimed the executor.
    pub controller_ms: f64,
    /// t0 → that job's start (emission, signed delivery, intake, queue, receive).
    pub pickup_ms: f64,
    /// total − controller.
    pub rest_ms: f64,
    /// t0 → a worker received the job's message (the rest of the pickup: waiting in
    /// the received batch behind earlier messages).
    pub received_ms: f64,
    /// Other jobs the workers were in while this one waited (t0 → its start): kind and
    /// duration, ms.
    pub busy_with: Vec<(String, f64)>,
    /// The simulator saw the connect before the worker finished the job (the warm
    /// forwarder is spawned inside the claim, before record, release and ack).
    pub connected_before_job_end: bool,
    /// The record says the instance is a claimed pool member.
    pub from_pool: bool,
    /// Warm: the claimed member is the one the bench saw as the oldest ready idle member.
    pub expected_member: Option<bool>,
    /// Warm: age at t0 of the member the bench waited for, whole seconds (the pool
    /// records its start in seconds).
    pub member_age_s: Option<u64>,
    /// Executors of earlier sessions still running at t0 (winding down in the
    /// background), pool members not counted.
    pub live_executors_at_t0: usize,
}

/// One row: an executor on one path.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// `codex` or `stand-in`.
    pub executor_kind: ExecutorKind,
    /// Human description of the executor and forwarder.
    pub executor: String,
    /// `warm` or `cold`.
    pub path: StartPath,
    /// Warm pool size (0 on the cold path).
    pub pool_size: u32,
    /// Sessions.
    pub sessions: usize,
    /// End to end.
    pub total_ms: Stats,
    /// The controller's own share (the worker's job).
    pub controller_ms: Stats,
    /// Everything else (total − controller).
    pub rest_ms: Stats,
    /// Webhook emission and delivery, intake, queue wait (part of the rest).
    pub pickup_ms: Stats,
    /// Samples whose record says "from the pool".
    pub pool_hits: usize,
    /// Samples connected before the worker finished the job.
    pub connected_before_job_end: usize,
    /// Turns that completed on the executors (the executor was usable), at the row's end.
    pub turns_completed: usize,
    /// Most executors of earlier sessions still running at a sample's t0.
    pub max_live_executors_at_t0: usize,
    /// Wall time of the row, seconds.
    pub seconds: f64,
    /// Every job the workers ran in the row, by kind: duration in ms.
    pub jobs: Vec<(String, Stats)>,
    /// Every sample.
    pub samples: Vec<Sample>,
}

/// `time_to_executor.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TimeToExecutor {
    /// Logical CPUs and the CPU model.
    pub machine: serde_json::Value,
    /// UTC date of the run (`date -u +%F` equivalent from the system clock).
    pub date: String,
    /// Sessions per row.
    pub sessions: usize,
    /// Worker loops.
    pub workers: usize,
    /// The pinned codex: path, `--version` output, or why it was not used.
    pub codex: String,
    /// Whether the real codex rows ran.
    pub codex_used: bool,
    /// The rows.
    pub rows: Vec<Row>,
}

/// Rendezvous upgrades the simulator accepted, by environment id.
#[derive(Default)]
struct Stamps {
    connected: Mutex<HashMap<String, Instant>>,
    /// Rendezvous path (`/v1/cloud/rendezvous/{token}`) → environment, from the
    /// registration answers.
    rendezvous: Mutex<HashMap<String, String>>,
    notify: tokio::sync::Notify,
}

/// The forwarder registers (`POST /v1/cloud/environment/{id}/register`, whose answer
/// names the rendezvous URL), then opens that WebSocket; the simulator sets the
/// environment `connected` when it accepts the upgrade (101), which is stamped.
async fn stamp(
    axum::extract::State(stamps): axum::extract::State<Arc<Stamps>>,
    req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path().to_owned();
    let registering = (req.method() == axum::http::Method::POST)
        .then(|| {
            path.strip_prefix("/v1/cloud/environment/")?
                .strip_suffix("/register")
                .map(str::to_owned)
        })
        .flatten();
    let response = next.run(req).await;
    if let Some(env) = registering {
        if !response.status().is_success() {
            return response;
        }
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, 1 << 20)
            .await
            .unwrap_or_default();
        let url = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v.get("url")?.as_str().map(str::to_owned));
        if let Some(p) = url.and_then(|u| u.find("/v1/").map(|i| u[i..].to_owned())) {
            stamps
                .rendezvous
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(p, env);
        }
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    }
    if response.status() == axum::http::StatusCode::SWITCHING_PROTOCOLS {
        let env = stamps
            .rendezvous
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&path)
            .cloned();
        if let Some(env) = env {
            let now = Instant::now();
            stamps
                .connected
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(env)
                .or_insert(now);
            stamps.notify.notify_waiters();
        }
    }
    response
}

/// One timed job.
#[derive(Clone, Debug)]
struct JobTiming {
    session_id: String,
    trigger: Trigger,
    /// Trigger and applied effects, e.g. `Sweep: StopCompute, MarkStopped`.
    kind: String,
    received: Instant,
    start: Instant,
    end: Instant,
    started_compute: bool,
}

type Timings = Arc<Mutex<Vec<JobTiming>>>;

/// `serve`'s worker loop (crates/local/src/embedded.rs `worker_loop`), with each job
/// timed.
async fn worker_loop(c: Arc<LocalController>, stop: Arc<AtomicBool>, timings: Timings) {
    while !stop.load(Ordering::SeqCst) {
        let mut received = [0usize; 2];
        for (i, (queue, wait_ms)) in [(&c.events, 200u64), (&c.timers, 0)]
            .into_iter()
            .enumerate()
        {
            let batch = match queue.receive(10, c.config.visibility_secs, wait_ms).await {
                Ok(b) => b,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            received[i] = batch.len();
            let received_at = Instant::now();
            for msg in &batch {
                let start = Instant::now();
                let result = c.handle(queue, msg).await;
                let end = Instant::now();
                let started_compute = result.as_ref().is_ok_and(|p| {
                    p.applied
                        .iter()
                        .any(|e| matches!(e, Effect::StartCompute(_)))
                });
                let kind = format!(
                    "{}: {}",
                    variant(&msg.job.trigger),
                    match &result {
                        Ok(p) if p.applied.is_empty() => p.note.unwrap_or("no effect").to_owned(),
                        Ok(p) => p.applied.iter().map(variant).collect::<Vec<_>>().join(", "),
                        Err(_) => "port error".to_owned(),
                    }
                );
                timings
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(JobTiming {
                        session_id: msg.job.session_id.as_str().to_owned(),
                        trigger: msg.job.trigger.clone(),
                        kind,
                        received: received_at,
                        start,
                        end,
                        started_compute,
                    });
            }
        }
        if received == [0, 0] {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The name of an enum value's variant (its `Debug` up to the first `(`, `{` or space).
fn variant(v: &impl std::fmt::Debug) -> String {
    let d = format!("{v:?}");
    d.split(['(', '{', ' '])
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The codex's `--version`, or why it is unusable.
fn codex_version(codex: &Path) -> Result<String, String> {
    if !codex.exists() {
        return Err(format!(
            "{} is missing (make infra-tools, or cd infra/executor && npm ci)",
            codex.display()
        ));
    }
    let out = std::process::Command::new(codex)
        .arg("--version")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .map_err(|e| format!("{}: {e}", codex.display()))?;
    if !out.status.success() {
        return Err(format!("{} --version failed", codex.display()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Runs every row.
///
/// # Errors
/// Set-up failures, a sample that times out, a warm sample that was not a claim (or a
/// cold one that was), or a process left running.
pub async fn measure(opts: &Options) -> anyhow::Result<TimeToExecutor> {
    anyhow::ensure!(
        opts.sim_executor.is_file(),
        "{} not built (cargo build --release -p agents-sim --bin sim-executor)",
        opts.sim_executor.display()
    );
    let sim_executor = std::path::absolute(&opts.sim_executor)?;
    let codex = std::path::absolute(&opts.codex)?;
    let version = codex_version(&codex);
    let codex_used = version.is_ok() && opts.executors.contains(&ExecutorKind::Codex);
    if opts.executors.contains(&ExecutorKind::Codex) && !codex_used {
        eprintln!(
            "\n*** time-to-executor: THE REAL CODEX IS NOT INSTALLED: {} ***\n*** only the stand-in executor (sim-executor) is measured; rows are labelled by executor ***\n",
            version.as_ref().err().map_or("", String::as_str)
        );
    }
    let mut rows = Vec::new();
    for &kind in &opts.executors {
        if kind == ExecutorKind::Codex && !codex_used {
            continue;
        }
        for &path in &opts.paths {
            // Both halves are the row's executor: the real codex listens *and* forwards
            // (registration, rendezvous and the Noise handshake included), or the stand-in
            // does both.
            let (program, label) = match kind {
                ExecutorKind::Codex => (
                    codex.display().to_string(),
                    format!(
                        "real codex both halves ({}): `exec-server --listen` + `exec-server forward`",
                        version.as_deref().unwrap_or("?")
                    ),
                ),
                ExecutorKind::StandIn => (
                    sim_executor.display().to_string(),
                    "stand-in `sim-executor` both halves: `exec-server --listen` + `exec-server forward`"
                        .to_owned(),
                ),
            };
            let executor = ExecutorCommand::listen(program.clone());
            let forwarder = ExecutorCommand::forward(program);
            eprintln!(
                "time-to-executor: {} sessions, {} path, {label}",
                opts.sessions,
                path.as_str()
            );
            let row = run_row(opts, kind, path, executor, forwarder, label).await?;
            eprintln!(
                "time-to-executor: {} {:?}: total p50 {:.1} ms p99 {:.1} ms; controller p50 {:.2} ms p99 {:.2} ms; rest p50 {:.1} ms p99 {:.1} ms; pool hits {}/{}",
                path.as_str(),
                kind,
                row.total_ms.p50,
                row.total_ms.p99,
                row.controller_ms.p50,
                row.controller_ms.p99,
                row.rest_ms.p50,
                row.rest_ms.p99,
                row.pool_hits,
                row.sessions
            );
            rows.push(row);
        }
    }
    Ok(TimeToExecutor {
        machine: crate::machine::machine(),
        date: utc_date(),
        sessions: opts.sessions,
        workers: opts.workers,
        codex: match &version {
            Ok(v) => format!("{} ({v})", codex.display()),
            Err(e) => format!("NOT USED: {e}"),
        },
        codex_used,
        rows,
    })
}

/// Today's UTC date, `YYYY-MM-DD`.
fn utc_date() -> String {
    i64::try_from(unix_now())
        .ok()
        .and_then(|secs| chrono::DateTime::from_timestamp(secs, 0))
        .map_or_else(String::new, |t| t.format("%Y-%m-%d").to_string())
}

/// The parts of one row's running system.
struct Running {
    sim: SimState,
    sim_stop: tokio::sync::watch::Sender<bool>,
    sim_server: tokio::task::JoinHandle<()>,
    stack: EmbeddedStack,
    workers: Vec<tokio::task::JoinHandle<()>>,
    stop_workers: Arc<AtomicBool>,
}

async fn run_row(
    opts: &Options,
    kind: ExecutorKind,
    path: StartPath,
    executor: ExecutorCommand,
    forwarder: ExecutorCommand,
    label: String,
) -> anyhow::Result<Row> {
    let dir = tempfile::Builder::new()
        .prefix("sandbox-bench-tte-")
        .tempdir_in(&opts.storage)?;
    let pool_size = if path == StartPath::Warm {
        opts.pool_size.max(1)
    } else {
        0
    };
    let stamps = Arc::new(Stamps::default());
    let timings: Timings = Arc::default();

    // The simulator, served here so that its connect answers are stamped.
    let webhook_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let webhook_port = webhook_listener.local_addr()?.port();
    let sim_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let sim_addr = sim_listener.local_addr()?;
    let mut sim_cfg = SimConfig::default()
        .with_webhook(
            Url::parse(&format!("http://127.0.0.1:{webhook_port}/webhook"))?,
            agents_sim::DEFAULT_WEBHOOK_SECRET,
        )
        // 60 real seconds for the connect (the default 300 simulated s = 5 real s).
        .with_connect_deadline_secs(3600.0)
        .with_turn_command("true");
    sim_cfg.seed = 27;
    let sim = SimState::new(sim_cfg.clone(), format!("http://{sim_addr}"))?;
    let app = agents_sim::router(sim.clone())
        .layer(axum::middleware::from_fn_with_state(stamps.clone(), stamp));
    let (sim_stop, mut sim_stopped) = tokio::sync::watch::channel(false);
    let sim_server = tokio::spawn(async move {
        let _ = axum::serve(sim_listener, app)
            .with_graceful_shutdown(async move {
                let _ = sim_stopped.wait_for(|s| *s).await;
            })
            .await;
    });
    let client = SimClient::new(&sim.base_url(), &sim_cfg.api_key, &sim_cfg.executor_key);

    // The stack as `sandboxctl serve --executor-mode split` builds it, on the simulator.
    let key_file = dir.path().join("executor.key");
    std::fs::write(&key_file, agents_sim::DEFAULT_EXECUTOR_KEY)?;
    let mut controller = ControllerConfig::new(DeploymentId::new(DEPLOYMENT)?);
    controller.policy = Policy {
        // `serve --grace-secs 1`: an idle session's executor stops soon, so few wind down
        // while the next samples run.
        shutdown_grace_secs: 1,
        remote_url_allowlist: vec!["http://127.0.0.1"].into(),
        ..Policy::default()
    };
    controller.pool.size = pool_size;
    let mut api = ClientConfig::new(agents_sim::DEFAULT_API_KEY);
    api.base_url = sim.base_url();
    let data_dir = dir.path().join("data");
    let mut cfg = EmbeddedConfig::new(
        &data_dir,
        api,
        agents_sim::DEFAULT_WEBHOOK_SECRET,
        executor,
        KeySource::File(key_file),
        controller,
    );
    cfg.forwarder = Some(forwarder);
    // The bench's own timed loops replace the stack's (same loop).
    cfg.workers = 0;
    cfg.stop_grace = Duration::from_secs(5);
    let stack = match EmbeddedStack::start_on(cfg, webhook_listener).await {
        Ok(s) => s,
        Err(e) => {
            sim.shutdown();
            let _ = sim_stop.send(true);
            let _ = sim_server.await;
            return Err(e.into());
        }
    };
    let stop_workers = Arc::new(AtomicBool::new(false));
    let workers = (0..opts.workers.max(1))
        .map(|_| {
            tokio::spawn(worker_loop(
                stack.controller().clone(),
                stop_workers.clone(),
                timings.clone(),
            ))
        })
        .collect();
    let running = Running {
        sim,
        sim_stop,
        sim_server,
        stack,
        workers,
        stop_workers,
    };

    let started = Instant::now();
    let result = samples(opts, path, &running, &client, &stamps, &timings).await;
    let jobs = {
        let mut by_kind: HashMap<String, Vec<f64>> = HashMap::new();
        for j in timings.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            by_kind
                .entry(j.kind.clone())
                .or_default()
                .push(ms(j.end - j.start));
        }
        let mut jobs: Vec<(String, Stats)> = by_kind
            .into_iter()
            .map(|(k, v)| (k, Stats::of(&v)))
            .collect();
        jobs.sort_by(|a, b| b.1.n.cmp(&a.1.n).then(a.0.cmp(&b.0)));
        jobs
    };
    let seconds = started.elapsed().as_secs_f64();
    let turns_completed = running
        .sim
        .snapshot()
        .sessions
        .iter()
        .filter(|s| s.turns == 1 && s.active_turn.is_none() && s.error.is_none())
        .count();
    let stopped = shut_down(running).await;
    let leftovers = wait_no_process_in(&data_dir, Duration::from_secs(15)).await;
    let samples = result?;
    stopped?;
    anyhow::ensure!(
        leftovers.is_empty(),
        "processes left running in {}: {leftovers:?}",
        data_dir.display()
    );
    let col = |f: fn(&Sample) -> f64| Stats::of(&samples.iter().map(f).collect::<Vec<_>>());
    Ok(Row {
        executor_kind: kind,
        executor: label,
        path,
        pool_size,
        sessions: samples.len(),
        total_ms: col(|s| s.total_ms),
        controller_ms: col(|s| s.controller_ms),
        rest_ms: col(|s| s.rest_ms),
        pickup_ms: col(|s| s.pickup_ms),
        pool_hits: samples.iter().filter(|s| s.from_pool).count(),
        connected_before_job_end: samples
            .iter()
            .filter(|s| s.connected_before_job_end)
            .count(),
        turns_completed,
        max_live_executors_at_t0: samples
            .iter()
            .map(|s| s.live_executors_at_t0)
            .max()
            .unwrap_or(0),
        seconds,
        jobs,
        samples,
    })
}

/// Stops the worker loops, the stack with every executor and pool member, and the
/// simulator (last: stopping forwarders say goodbye to it).
async fn shut_down(r: Running) -> anyhow::Result<()> {
    r.stop_workers.store(true, Ordering::SeqCst);
    for w in r.workers {
        let _ = w.await;
    }
    let stopped = r.stack.shutdown(true).await;
    r.sim.shutdown();
    let _ = r.sim_stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), r.sim_server).await;
    stopped?;
    Ok(())
}

/// The samples of one row.
async fn samples(
    opts: &Options,
    path: StartPath,
    r: &Running,
    client: &SimClient,
    stamps: &Stamps,
    timings: &Timings,
) -> anyhow::Result<Vec<Sample>> {
    let c = r.stack.controller();
    let deployment = c.config.deployment.clone();
    let mut out = Vec::with_capacity(opts.sessions);
    for i in 0..opts.sessions {
        let session = client
            .create_session(SessionEnvironment::self_hosted())
            .await?;
        let env = session
            .self_hosted()
            .map(|e| e.id.as_str().to_owned())
            .ok_or_else(|| anyhow::anyhow!("a self-hosted session without an environment"))?;
        let member = if path == StartPath::Warm {
            Some(ready_member(c).await?)
        } else {
            None
        };
        let live_executors_at_t0 = c
            .compute
            .list(&deployment)
            .await?
            .iter()
            .filter(|i| i.status != ComputeStatus::Stopped)
            .count();

        let t0 = Instant::now();
        client.submit_message(session.id.as_str(), "go").await?;
        let connected = wait_connected(stamps, &env).await?;

        // The warm forwarder may connect before the job recorded the claim: the record
        // is read once the job is done.
        let job = wait_start_job(timings, session.id.as_str()).await?;
        let record = c
            .registry
            .get(&EnvironmentId::new(env.clone()).effect_key())
            .await?
            .ok_or_else(|| anyhow::anyhow!("{env}: started but no record"))?;
        let from_pool = record.instance_from_pool;
        match path {
            StartPath::Warm => anyhow::ensure!(
                from_pool,
                "warm sample {i} ({env}) was NOT a claim (record: {record:?})"
            ),
            StartPath::Cold => anyhow::ensure!(
                !from_pool,
                "cold sample {i} ({env}) came from the pool (record: {record:?})"
            ),
        }
        let instance = record.instance.as_ref().map(|i| i.instance_id.clone());
        let total_ms = ms(connected - t0);
        let controller_ms = ms(job.end - job.start);
        out.push(Sample {
            environment_id: env,
            total_ms,
            controller_ms,
            pickup_ms: signed_ms(t0, job.start),
            rest_ms: total_ms - controller_ms,
            received_ms: signed_ms(t0, job.received),
            busy_with: busy_with(timings, t0, &job),
            connected_before_job_end: connected < job.end,
            from_pool,
            expected_member: member.as_ref().map(|(id, _)| instance.as_ref() == Some(id)),
            member_age_s: member
                .as_ref()
                .map(|(_, born)| unix_now().saturating_sub(*born)),
            live_executors_at_t0,
        });
        if (i + 1) % 25 == 0 {
            eprintln!("  {} / {} sessions", i + 1, opts.sessions);
        }
    }
    Ok(out)
}

/// Jobs (other than `job`) that ran while `job` waited between `t0` and its start.
fn busy_with(timings: &Timings, t0: Instant, job: &JobTiming) -> Vec<(String, f64)> {
    timings
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|j| j.start < job.start && j.end > t0 && j.start != job.start)
        .map(|j| (j.kind.clone(), ms(j.end - j.start)))
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `b − a` in ms, negative when `b` is earlier.
fn signed_ms(a: Instant, b: Instant) -> f64 {
    if b >= a { ms(b - a) } else { -ms(a - b) }
}

async fn wait_connected(stamps: &Stamps, env: &str) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + SAMPLE_TIMEOUT;
    loop {
        let notified = stamps.notify.notified();
        if let Some(t) = stamps
            .connected
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(env)
        {
            return Ok(*t);
        }
        let now = Instant::now();
        anyhow::ensure!(
            now < deadline,
            "{env} not connected within {SAMPLE_TIMEOUT:?}"
        );
        let _ = tokio::time::timeout(deadline - now, notified).await;
    }
}

/// The connection request's job that started (or claimed) the session's executor. The
/// worker may still be releasing when the environment connects: waited for.
async fn wait_start_job(timings: &Timings, session_id: &str) -> anyhow::Result<JobTiming> {
    let deadline = Instant::now() + SAMPLE_TIMEOUT;
    loop {
        let found = timings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|j| {
                j.session_id == session_id
                    && j.started_compute
                    && j.trigger == Trigger::ConnectionRequested
            })
            .cloned();
        if let Some(j) = found {
            return Ok(j);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no connection-request job started an executor for {session_id}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Waits until the pool's oldest idle member (the one a claim takes first) listens.
/// Returns its instance id and start (Unix seconds).
async fn ready_member(c: &LocalController) -> anyhow::Result<(InstanceId, u64)> {
    let deadline = Instant::now() + SAMPLE_TIMEOUT;
    loop {
        let members = c.compute.list_pool(&c.config.deployment).await?;
        if let Some(oldest) = members.first()
            && let Some(info) = c.compute.info(&oldest.instance_id).await?
            && listen_port(info.pid).is_some_and(port_listening)
        {
            return Ok((oldest.instance_id.clone(), oldest.created_at));
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no listening pool member within {SAMPLE_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The port of `--listen ws://127.0.0.1:PORT` on `pid`'s command line.
fn listen_port(pid: u32) -> Option<u16> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let cmdline = String::from_utf8_lossy(&cmdline);
    let mut args = cmdline.split('\0');
    args.find(|a| *a == "--listen")?;
    let url = args.next()?;
    url.strip_prefix("ws://127.0.0.1:")?
        .trim_end_matches('/')
        .parse()
        .ok()
}

/// Whether 127.0.0.1:`port` is in `LISTEN` (state `0A`) in `/proc/net/tcp`: a passive
/// look, no connection made.
fn port_listening(port: u16) -> bool {
    let want = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1) == Some(&want.as_str()) && f.get(3) == Some(&"0A")
        })
}

/// Live processes (not zombies) whose working directory is under `dir`.
fn processes_in(dir: &Path) -> Vec<(u32, String)> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) else {
            continue;
        };
        if !cwd.starts_with(&dir) {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        found.push((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")));
    }
    found
}

async fn wait_no_process_in(dir: &Path, timeout: Duration) -> Vec<(u32, String)> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = processes_in(dir);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Stats::of(&v);
        assert_eq!((s.p50, s.p90, s.p99, s.max), (50.0, 90.0, 99.0, 100.0));
        let s = Stats::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.p50, s.p99), (2.0, 3.0));
        assert_eq!(Stats::of(&[]).n, 0);
    }

    #[test]
    fn listen_port_is_read_from_the_command_line() {
        // Our own command line has no --listen.
        assert_eq!(listen_port(std::process::id()), None);
    }
}
