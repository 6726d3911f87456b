//! Worker throughput on the embedded backend, with duplicate deliveries.
//!
//! What runs: the controller's worker ([`Controller::handle`]: ledger check, session read,
//! effect-key lock reading the record, start, recheck send, one release writing record,
//! audit and ledger entry, ack) over the SQLite FIFO
//! events queue and the SQLite registry of `sandbox-local` (WAL, `synchronous = NORMAL`,
//! queues and registry in two files as the embedded backend has them, in a temporary
//! directory on disk or tmpfs), reading sessions over HTTP from the Agents API
//! simulator (`agents-sim`, same process, manual clock). Compute is
//! [`MemoryCompute`](crate::doubles::MemoryCompute): spawning one process per environment
//! would measure `fork`/`exec` rather than the worker.
//!
//! What is timed: from the first receive until every message was processed and acked —
//! `environments` connection requests plus duplicates making up `duplicate_share` of all
//! deliveries. A duplicate is a redelivery of the same `webhook-id` that the queue did not
//! de-duplicate (as after the 5-minute FIFO window, or a Lambda retry), so it reaches the
//! worker and must be stopped by the delivery ledger. Enqueueing and creating the sessions
//! are set-up, not timed.
//!
//! Exactly-once, asserted after the run: every environment was started exactly once (the
//! compute's start count), has one record with an instance, and one `start` audit entry;
//! nothing was dead-lettered.

use crate::doubles::MemoryCompute;
use agents_sim::{SessionEnvironment, SimConfig};
use sandbox_agents_api::{AgentsClient, ClientConfig};
use sandbox_controller::ports::{Clock, Outgoing, Queue, Registry, SystemClock};
use sandbox_controller::{Controller, ControllerConfig, Disposition, Job};
use sandbox_core::ids::{DeploymentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_local::{QueueOptions, SqliteQueue, SqliteRegistry};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The throughput measurement (`throughput.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Throughput {
    /// Environments (sessions), each with one original connection request.
    pub environments: usize,
    /// Duplicate deliveries on top (redeliveries of an original's `webhook-id`).
    pub duplicates: usize,
    /// Concurrent worker loops.
    pub workers: usize,
    /// Runtime worker threads.
    pub threads: usize,
    /// The directory the SQLite database was created under, and its file system type.
    pub storage: String,
    /// Seconds from the first receive to the last ack.
    pub seconds: f64,
    /// Deliveries processed per second (originals and duplicates).
    pub events_per_sec: f64,
    /// Duplicates the ledger stopped (processed without a decision).
    pub duplicates_skipped: u64,
    /// Messages made visible again (busy lock, missing evidence, port failure).
    pub retries: u64,
    /// Compute starts in all.
    pub starts: u64,
    /// `start` audit entries.
    pub start_audits: u64,
    /// Every environment started exactly once, with its record and one start audit.
    pub exactly_once: bool,
}

/// Options of [`measure`].
#[derive(Clone, Debug)]
pub struct Options {
    /// Environments.
    pub environments: usize,
    /// Share of all deliveries that are duplicates (0.3 = 30 %).
    pub duplicate_share: f64,
    /// Concurrent worker loops.
    pub workers: usize,
    /// Runtime worker threads (for the report).
    pub threads: usize,
    /// Where the SQLite database's temporary directory goes (a disk, or a tmpfs such as
    /// `/dev/shm`, where `fsync` costs nothing).
    pub storage: std::path::PathBuf,
}

/// Runs the measurement.
///
/// # Errors
/// Set-up failures, a run that does not finish within 120 s, or a broken exactly-once
/// check.
pub async fn measure(opts: &Options) -> anyhow::Result<Throughput> {
    // Manual clock: no connect deadline runs out while the bench runs.
    let sim = agents_sim::spawn(SimConfig::default().with_time_scale(0.0)).await?;
    let client = sim.client();
    let mut sessions: Vec<SessionId> = Vec::with_capacity(opts.environments);
    for _ in 0..opts.environments {
        let s = client
            .create_session(SessionEnvironment::self_hosted())
            .await?;
        client
            .submit_message(s.id.as_str(), "run the tests")
            .await?;
        sessions.push(s.id);
    }

    let dir = tempfile::Builder::new()
        .prefix("sandbox-bench-")
        .tempdir_in(&opts.storage)?;
    // The embedded backend's layout (`sandbox-local`'s `Embedded`).
    let db = dir.path().join("sandbox.db");
    let queues = dir.path().join("queues.db");
    let events = SqliteQueue::open(&queues, "events.fifo", QueueOptions::fifo())?;
    let timers = SqliteQueue::open(&queues, "timers", QueueOptions::standard())?;
    let registry = SqliteRegistry::open(&db)?;
    let compute = MemoryCompute::default();
    let mut api = ClientConfig::new(agents_sim::DEFAULT_API_KEY);
    api.base_url = sim.base_url();
    let sessions_api = AgentsClient::new(api)?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let controller = Arc::new(Controller::new(
        events.clone(),
        timers,
        registry.clone(),
        compute.clone(),
        sessions_api,
        clock.clone(),
        {
            let mut c = ControllerConfig::new(DeploymentId::new("bench")?);
            // The simulator's remote_url is http://127.0.0.1:PORT/...
            c.policy.remote_url_allowlist = vec!["http://127.0.0.1"].into();
            c
        },
    ));

    // Duplicates: every environment whose index falls on the duplicate share gets one
    // redelivery, so duplicates / (originals + duplicates) = duplicate_share.
    let share = opts.duplicate_share.clamp(0.0, 0.9);
    let wanted = ((opts.environments as f64) * share / (1.0 - share)).round() as usize;
    let duplicates = wanted.min(opts.environments);
    let now = clock.now();
    let send = |i: usize, dedup: String| {
        let job = Job {
            handoffs: 0,
            swept: None,
            operator_proof: None,
            trigger: Trigger::ConnectionRequested,
            session_id: sessions[i].clone(),
            environment_id: None,
            webhook_id: Some(format!("msg_bench{i:022}")),
            enqueued_at: now,
        };
        Outgoing {
            group: job.group().to_owned(),
            job,
            dedup_id: dedup,
            delay_secs: 0,
        }
    };
    for i in 0..opts.environments {
        events.send(send(i, format!("msg_bench{i:022}"))).await?;
    }
    for k in 0..duplicates {
        // Spread over the environments.
        let i = k * opts.environments / duplicates.max(1);
        events
            .send(send(i, format!("msg_bench{i:022}-redelivery")))
            .await?;
    }
    let total = (opts.environments + duplicates) as u64;

    let done = Arc::new(AtomicU64::new(0));
    let skipped = Arc::new(AtomicU64::new(0));
    let retries = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(120);
    let mut loops = Vec::new();
    for _ in 0..opts.workers.max(1) {
        let (c, done, skipped, retries) = (
            controller.clone(),
            done.clone(),
            skipped.clone(),
            retries.clone(),
        );
        loops.push(tokio::spawn(async move {
            while done.load(Ordering::SeqCst) < total && Instant::now() < deadline {
                let batch = match c.events.receive(10, c.config.visibility_secs, 0).await {
                    Ok(b) => b,
                    Err(_) => continue,
                };
                if batch.is_empty() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                for msg in &batch {
                    match c.handle(&c.events, msg).await {
                        Ok(p) if p.disposition == Disposition::Done => {
                            if p.note == Some("duplicate delivery") {
                                skipped.fetch_add(1, Ordering::SeqCst);
                            }
                            done.fetch_add(1, Ordering::SeqCst);
                        }
                        _ => {
                            retries.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            }
        }));
    }
    for l in loops {
        l.await?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let processed = done.load(Ordering::SeqCst);
    anyhow::ensure!(
        processed == total,
        "only {processed} of {total} deliveries processed within 120 s"
    );

    let starts = compute.starts();
    let records = registry.list().await?;
    let audits = registry.audit_log().await?;
    let mut start_audits: HashMap<String, u64> = HashMap::new();
    for a in audits.iter().filter(|a| a.outcome == "start") {
        *start_audits.entry(a.effect_key.to_string()).or_default() += 1;
    }
    let exactly_once = starts.len() == opts.environments
        && starts.values().all(|&n| n == 1)
        && records.len() == opts.environments
        && records.iter().all(|r| r.instance.is_some())
        && start_audits.len() == opts.environments
        && start_audits.values().all(|&n| n == 1)
        && events.dead_letter_count().await? == 0;
    sim.shutdown().await;
    Ok(Throughput {
        environments: opts.environments,
        duplicates,
        workers: opts.workers,
        threads: opts.threads,
        storage: format!("{} ({})", opts.storage.display(), fs_type(&opts.storage)),
        seconds,
        events_per_sec: total as f64 / seconds,
        duplicates_skipped: skipped.load(Ordering::SeqCst),
        retries: retries.load(Ordering::SeqCst),
        starts: starts.values().map(|&n| u64::from(n)).sum(),
        start_audits: start_audits.values().sum(),
        exactly_once,
    })
}

/// The file system type of `path` from `/proc/mounts` (longest matching mount point).
fn fs_type(path: &std::path::Path) -> String {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_dev, mount, kind) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(mount)
                .then(|| (mount.len(), kind.to_owned()))
        })
        .max()
        .map_or_else(|| "unknown".to_owned(), |(_, kind)| kind)
}
