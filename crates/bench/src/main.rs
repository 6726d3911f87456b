//! `sandbox-bench`: the steps of `make bench` (see mk/bench.mk) and the seed corpus of
//! `make fuzz`.
use anyhow::Context as _;
use clap::{Parser, Subcommand};
use sandbox_bench::time_to_executor::{self, ExecutorKind, StartPath};
use sandbox_bench::{
    cold_start, deliveries, fargate_time, pool_refill, recheck_delay, report, scale, throughput,
    transitions,
};
use std::path::PathBuf;

#[derive(Parser)]
#[command(about = "Benchmarks of sandbox-lifecycle")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Writes signed 1 KiB deliveries (timestamp: now) for criterion and the Python SDK.
    Deliveries {
        /// Output file (JSON).
        #[arg(long)]
        out: PathBuf,
        /// How many deliveries.
        #[arg(long, default_value_t = 1000)]
        count: usize,
    },
    /// Cold start of the webhook bootstrap against local Runtime API and AWS stubs.
    ColdStart {
        /// The bootstrap (the `webhook` binary).
        #[arg(long)]
        bootstrap: PathBuf,
        /// Timed runs (after one warm-up).
        #[arg(long, default_value_t = 25)]
        runs: usize,
        /// Output file (JSON); the child's output goes to `<out>.log`.
        #[arg(long)]
        out: PathBuf,
    },
    /// Worker throughput on the embedded backend with duplicate deliveries.
    Throughput {
        /// Environments (one original connection request each).
        #[arg(long, default_value_t = 2100)]
        environments: usize,
        /// Share of all deliveries that are duplicates.
        #[arg(long, default_value_t = 0.3)]
        duplicate_share: f64,
        /// Concurrent worker loops.
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// Directory to create the SQLite database under (default: the temp dir).
        #[arg(long)]
        storage: Option<PathBuf>,
        /// Output file (JSON).
        #[arg(long)]
        out: PathBuf,
    },
    /// Remote calls per transition, counted through sandbox-testkit's counting ports.
    Transitions {
        /// Output file (JSON).
        #[arg(long)]
        out: PathBuf,
    },
    /// ECS calls per job and per sweep, and the sweep's wall time, at N environments on
    /// the twins.
    Scale {
        /// Output file (JSON).
        #[arg(long)]
        out: PathBuf,
        /// Deployment sizes, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
        sizes: Vec<usize>,
        /// Days of simulated history per size, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "0,30")]
        history_days: Vec<u64>,
    },
    /// The warm pool refill's remote calls after N members were claimed, on the twins.
    PoolRefill {
        /// Output file (JSON).
        #[arg(long)]
        out: PathBuf,
        /// Members claimed, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
        claimed: Vec<usize>,
    },
    /// The delay of due lease rechecks while a sweep of N environments is in flight, with
    /// the sweep queue and with the sweep's jobs on the timers queue, on the twins.
    RecheckDelay {
        /// Output file (JSON).
        #[arg(long)]
        out: PathBuf,
        /// Deployment sizes, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "10000")]
        environments: Vec<usize>,
    },
    /// Simulated Fargate time to executor, warm (a claimed pool member) and cold, on the
    /// twins with Fargate's timings.
    FargateTime {
        /// Output file (JSON).
        #[arg(long)]
        out: PathBuf,
        /// Sessions per path.
        #[arg(long, default_value_t = 1000)]
        sessions: usize,
        /// Seed of the draws.
        #[arg(long, default_value_t = 35)]
        seed: u64,
    },
    /// Connection request → environment `connected` in local mode, warm and
    /// cold, per executor (the real pinned codex when installed, and the stand-in), with
    /// the controller's own share.
    TimeToExecutor {
        /// Sessions per row (executor × path).
        #[arg(long, default_value_t = 100)]
        sessions: usize,
        /// The stand-in binary (default: `sim-executor` next to this binary).
        #[arg(long)]
        sim_executor: Option<PathBuf>,
        /// The pinned codex.
        #[arg(long, default_value = "infra/executor/node_modules/.bin/codex")]
        codex: PathBuf,
        /// Executors, comma-separated: codex, stand-in.
        #[arg(long, value_delimiter = ',', default_value = "codex,stand-in")]
        executors: Vec<String>,
        /// Paths, comma-separated: warm, cold.
        #[arg(long, value_delimiter = ',', default_value = "warm,cold")]
        paths: Vec<String>,
        /// Warm pool size of the warm rows (`serve`'s split-mode default).
        #[arg(long, default_value_t = 2)]
        pool_size: u32,
        /// Worker loops (`serve`'s default).
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// Directory for the rows' data directories (default: the temp dir).
        #[arg(long)]
        storage: Option<PathBuf>,
        /// Output file (JSON).
        #[arg(long)]
        out: PathBuf,
    },
    /// Prints the table and writes `bench.json` from the step outputs in `dir`.
    Report {
        /// The bench directory.
        #[arg(long)]
        dir: PathBuf,
        /// Criterion's output directory (`CRITERION_HOME`).
        #[arg(long)]
        criterion: PathBuf,
    },
    /// Writes the fuzz seed corpus: every `events/webhooks` fixture as a signed delivery
    /// in the input format of `fuzz/fuzz_targets/webhook_entry.rs`.
    FuzzSeeds {
        /// The `events/webhooks` directory.
        #[arg(long)]
        events: PathBuf,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
    },
}

/// Secret and clock of the fuzz target (fuzz/fuzz_targets/webhook_entry.rs).
const FUZZ_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const FUZZ_NOW: u64 = 1_764_400_000;

fn write_json(path: &std::path::Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("writing {}", path.display()))
}

fn runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?)
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

fn fuzz_seeds(events: &std::path::Path, out: &std::path::Path) -> anyhow::Result<usize> {
    let verifier = sandbox_core::webhook::WebhookVerifier::new(FUZZ_SECRET)?;
    std::fs::create_dir_all(out)?;
    let mut paths: Vec<PathBuf> = std::fs::read_dir(events)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    for (n, path) in paths.iter().enumerate() {
        // Compact, as OpenAI sends it.
        let value: serde_json::Value = serde_json::from_slice(&std::fs::read(path)?)?;
        let body = serde_json::to_vec(&value)?;
        let id = format!("msg_fuzzseed{n:04}");
        let sig = verifier.sign(&id, FUZZ_NOW, &body);
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        // flags 0: as signed; flags 1: re-signed by the target (the same, via the other path).
        for flags in [0u8, 1u8] {
            let mut input = vec![flags];
            input.extend_from_slice(
                format!(
                    "content-type:application/json\nwebhook-id:{id}\nwebhook-timestamp:{FUZZ_NOW}\nwebhook-signature:{sig}\n\n"
                )
                .as_bytes(),
            );
            input.extend_from_slice(&body);
            std::fs::write(out.join(format!("{stem}.flags{flags}")), input)?;
        }
    }
    Ok(paths.len() * 2)
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Deliveries { out, count } => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs();
            deliveries::make(count, now).write(&out)?;
        }
        Command::ColdStart {
            bootstrap,
            runs,
            out,
        } => {
            let log = out.with_extension("log");
            let result =
                runtime(threads())?.block_on(cold_start::measure(&bootstrap, runs, &log))?;
            eprintln!(
                "cold start: median {:.2} ms, p90 {:.2} ms, {} bytes, peak RSS {} KiB",
                result.median_ms, result.p90_ms, result.binary_bytes, result.max_peak_rss_kib
            );
            write_json(&out, &result)?;
        }
        Command::Throughput {
            environments,
            duplicate_share,
            workers,
            storage,
            out,
        } => {
            let threads = threads();
            let opts = throughput::Options {
                environments,
                duplicate_share,
                workers,
                threads,
                storage: storage.unwrap_or_else(std::env::temp_dir),
            };
            let result = runtime(threads)?.block_on(throughput::measure(&opts))?;
            eprintln!(
                "throughput: {:.0} events/s over {:.2} s, exactly-once {}",
                result.events_per_sec, result.seconds, result.exactly_once
            );
            write_json(&out, &result)?;
            anyhow::ensure!(result.exactly_once, "exactly-once broken: {result:?}");
        }
        Command::Transitions { out } => write_json(&out, &transitions::measure())?,
        Command::Scale {
            out,
            sizes,
            history_days,
        } => {
            let rows = scale::measure(&sizes, &history_days);
            for r in &rows {
                eprintln!(
                    "scale: N = {}, {} days of history: sweep {} ECS calls in {:.1} ms; registry items read {} (open records {}), per job {}, writes {}; queue calls {}",
                    r.environments,
                    r.history_days,
                    r.sweep.total,
                    r.sweep_ms,
                    r.sweep_items_read,
                    r.open_records,
                    r.job_items_read,
                    r.sweep_registry_writes,
                    r.fan_out_queue_calls
                );
            }
            write_json(&out, &rows)?;
        }
        Command::PoolRefill { out, claimed } => {
            let rows = runtime(1)?.block_on(pool_refill::measure(&claimed));
            for r in &rows {
                eprintln!(
                    "pool refill: {} claimed: {} calls {:?}",
                    r.claimed, r.total, r.calls
                );
            }
            write_json(&out, &rows)?;
        }
        Command::RecheckDelay { out, environments } => {
            let rows = runtime(1)?.block_on(recheck_delay::measure(&environments));
            for r in &rows {
                eprintln!(
                    "recheck delay: N = {}, {}: {} rechecks, p50 {} s, p99 {} s, max {} s ({} sweep jobs)",
                    r.environments,
                    r.arrangement,
                    r.rechecks,
                    r.p50_secs,
                    r.p99_secs,
                    r.max_secs,
                    r.sweep_jobs
                );
            }
            write_json(&out, &rows)?;
        }
        Command::FargateTime {
            out,
            sessions,
            seed,
        } => {
            let rows = runtime(1)?.block_on(fargate_time::measure(sessions, seed));
            for r in &rows {
                eprintln!(
                    "fargate time to executor (simulated): {} x{}: p50 {} ms, p99 {} ms, max {} ms, misses {}",
                    r.path, r.sessions, r.p50_ms, r.p99_ms, r.max_ms, r.misses
                );
            }
            write_json(&out, &rows)?;
        }
        Command::TimeToExecutor {
            sessions,
            sim_executor,
            codex,
            executors,
            paths,
            pool_size,
            workers,
            storage,
            out,
        } => {
            let sim_executor = match sim_executor {
                Some(p) => p,
                None => std::env::current_exe()?
                    .parent()
                    .context("no directory of this binary")?
                    .join("sim-executor"),
            };
            let executors = executors
                .iter()
                .map(|e| match e.as_str() {
                    "codex" => Ok(ExecutorKind::Codex),
                    "stand-in" => Ok(ExecutorKind::StandIn),
                    other => Err(anyhow::anyhow!("--executors: unknown {other}")),
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let paths = paths
                .iter()
                .map(|p| match p.as_str() {
                    "warm" => Ok(StartPath::Warm),
                    "cold" => Ok(StartPath::Cold),
                    other => Err(anyhow::anyhow!("--paths: unknown {other}")),
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let opts = time_to_executor::Options {
                sessions,
                sim_executor,
                codex,
                executors,
                paths,
                pool_size,
                workers,
                storage: storage.unwrap_or_else(std::env::temp_dir),
            };
            let result = runtime(threads())?.block_on(time_to_executor::measure(&opts))?;
            write_json(&out, &result)?;
        }
        Command::Report { dir, criterion } => {
            let report = report::build(&dir, &criterion);
            print!("{}", report::table(&report));
            write_json(&dir.join("bench.json"), &report)?;
            println!("\nwritten: {}", dir.join("bench.json").display());
        }
        Command::FuzzSeeds { events, out } => {
            let n = fuzz_seeds(&events, &out)?;
            eprintln!("{n} seeds in {}", out.display());
        }
    }
    Ok(())
}
