//! The table: reads what each step wrote into the bench directory, prints one table and
//! writes `bench.json` beside it. A missing input becomes a row that says so (the table is
//! still printed), and every ratio is computed here, from the same run's numbers.

use crate::cold_start::ColdStart;
use crate::fargate_time::FargatePath;
use crate::pool_refill::RefillCalls;
use crate::recheck_delay::RecheckDelayRow;
use crate::scale::Scaled;
use crate::throughput::Throughput;
use crate::time_to_executor::{StartPath, TimeToExecutor};
use crate::transitions::Counted;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

/// One row of the table.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// What was measured.
    pub measurement: String,
    /// The result, formatted.
    pub result: String,
    /// The number behind it, in `unit`.
    pub value: Option<f64>,
    /// Unit of `value`.
    pub unit: String,
    /// The target, formatted (empty when there is none).
    pub target: String,
    /// `met`, `MISSED`, `info` or `TODO`.
    pub verdict: String,
}

/// The whole report (`bench.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// Logical CPUs available and the CPU model.
    pub machine: Value,
    /// The rows, in table order.
    pub rows: Vec<Row>,
    /// The inputs as read.
    pub raw: Value,
}

fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Criterion's median estimate, nanoseconds, of `group/name` under `criterion_dir`.
fn criterion_median_ns(criterion_dir: &Path, group: &str, name: &str) -> Option<f64> {
    let v = read_json(
        &criterion_dir
            .join(group)
            .join(name)
            .join("new")
            .join("estimates.json"),
    )?;
    v["median"]["point_estimate"].as_f64()
}

fn verdict(met: bool) -> String {
    if met { "met" } else { "MISSED" }.to_owned()
}

fn row(measurement: &str, result: String, value: Option<f64>, unit: &str) -> Row {
    Row {
        measurement: measurement.to_owned(),
        result,
        value,
        unit: unit.to_owned(),
        target: String::new(),
        verdict: "info".to_owned(),
    }
}

fn missing(measurement: &str, what: &str) -> Row {
    Row {
        measurement: measurement.to_owned(),
        result: format!("not measured ({what} missing)"),
        value: None,
        unit: String::new(),
        target: String::new(),
        verdict: "MISSED".to_owned(),
    }
}

/// A figure that is information, not a goal (docs/PERFORMANCE.md, "Reading the verdicts:
/// goals and information"): it names the old target it is compared with, and its verdict
/// is `info`, never `MISSED`.
fn information(mut r: Row, former_target: &str) -> Row {
    r.target = format!("information (was {former_target})");
    r.verdict = "info".to_owned();
    r
}

fn with_target(mut r: Row, target: &str, met: bool) -> Row {
    r.target = target.to_owned();
    r.verdict = verdict(met);
    r
}

pub use crate::machine::machine;

/// Builds the report from `dir` (the step outputs) and `criterion_dir`.
pub fn build(dir: &Path, criterion_dir: &Path) -> Report {
    let mut rows = Vec::new();
    let hmac = criterion_median_ns(criterion_dir, "webhook_1kib", "hmac_sha256");
    let ours = criterion_median_ns(criterion_dir, "webhook_1kib", "verify_parse_route");
    let accept = criterion_median_ns(criterion_dir, "webhook_1kib", "accept_delivery");
    let python = read_json(&dir.join("python.json"));
    let python_ns = python.as_ref().and_then(|p| p["per_delivery_ns"].as_f64());

    let us = |ns: f64| format!("{:.2} µs", ns / 1e3);
    match hmac {
        Some(h) => rows.push(row(
            "bare HMAC-SHA256 of a signed 1 KiB delivery (criterion median)",
            us(h),
            Some(h),
            "ns",
        )),
        None => rows.push(missing("bare HMAC-SHA256", "criterion estimates")),
    }
    match (ours, hmac) {
        (Some(o), Some(h)) => {
            let r = o / h;
            rows.push(information(
                row(
                    "verify + parse + route, signed 1 KiB delivery (criterion median)",
                    format!("{} = {r:.2}× bare HMAC", us(o)),
                    Some(r),
                    "× HMAC",
                ),
                "≤ 1.5× HMAC",
            ));
        }
        _ => rows.push(missing("verify + parse + route", "criterion estimates")),
    }
    if let Some(a) = accept {
        rows.push(row(
            "Intake::accept_delivery (verify, parse, route, job, queue double, JSON answer)",
            format!(
                "{} = {:.2}× bare HMAC",
                us(a),
                hmac.map_or(f64::NAN, |h| a / h)
            ),
            Some(a),
            "ns",
        ));
    }
    match (python_ns, ours) {
        (Some(p), Some(o)) => {
            let r = p / o;
            rows.push(information(
                row(
                    "official Python SDK webhooks.verify_signature + json.loads, same deliveries",
                    format!("{} → ours is {r:.1}× faster", us(p)),
                    Some(r),
                    "× faster",
                ),
                "≥ 10× faster",
            ));
        }
        _ => rows.push(missing("official Python SDK path", "python.json")),
    }
    for case in ["start", "already_running", "idle_schedule_stop"] {
        match criterion_median_ns(criterion_dir, "decide", case) {
            Some(ns) => rows.push(row(
                &format!("decide() per call: {case}"),
                format!("{ns:.0} ns"),
                Some(ns),
                "ns",
            )),
            None => rows.push(missing(&format!("decide(): {case}"), "criterion estimates")),
        }
    }

    let cold: Option<ColdStart> =
        read_json(&dir.join("cold_start.json")).and_then(|v| serde_json::from_value(v).ok());
    match &cold {
        Some(c) => {
            rows.push(with_target(
                row(
                    &format!(
                        "webhook cold start: exec → first event answered (median of {})",
                        c.runs.len()
                    ),
                    format!("{:.1} ms (p90 {:.1} ms)", c.median_ms, c.p90_ms),
                    Some(c.median_ms),
                    "ms",
                ),
                "≤ 15 ms",
                c.median_ms <= 15.0,
            ));
            let mib = c.binary_bytes as f64 / (1024.0 * 1024.0);
            let stripped = match c.stripped {
                Some(true) => "stripped",
                Some(false) => "NOT stripped",
                None => "strip state unknown",
            };
            rows.push(with_target(
                row(
                    "webhook bootstrap size (profile lambda-bootstrap)",
                    format!("{mib:.2} MiB ({} bytes, {stripped})", c.binary_bytes),
                    Some(mib),
                    "MiB",
                ),
                "≤ 6 MiB",
                c.binary_bytes <= 6 * 1024 * 1024,
            ));
            let rss = c.max_peak_rss_kib as f64 / 1024.0;
            rows.push(with_target(
                row(
                    "webhook peak RSS (VmHWM after the first answer, max of runs)",
                    format!("{rss:.1} MiB"),
                    Some(rss),
                    "MiB",
                ),
                "≤ 20 MiB",
                c.max_peak_rss_kib <= 20 * 1024,
            ));
        }
        None => rows.push(missing("webhook cold start", "cold_start.json")),
    }

    let mut throughputs = Vec::new();
    for file in [
        "throughput_tmpfs.json",
        "throughput.json",
        "throughput_many_workers.json",
    ] {
        let tp: Option<Throughput> =
            read_json(&dir.join(file)).and_then(|v| serde_json::from_value(v).ok());
        match &tp {
            Some(t) => rows.push(with_target(
                row(
                    &format!(
                        "worker throughput, embedded backend, SQLite under {} ({} envs + {} duplicates = {:.0} % dup, {} workers, {} threads)",
                        t.storage,
                        t.environments,
                        t.duplicates,
                        100.0 * t.duplicates as f64 / (t.environments + t.duplicates) as f64,
                        t.workers,
                        t.threads
                    ),
                    format!(
                        "{:.0} events/s; exactly-once {} ({} starts, {} start audits, {} duplicates skipped, {} retries)",
                        t.events_per_sec,
                        if t.exactly_once { "held" } else { "BROKEN" },
                        t.starts,
                        t.start_audits,
                        t.duplicates_skipped,
                        t.retries
                    ),
                    Some(t.events_per_sec),
                    "events/s",
                ),
                "≥ 2,000 events/s, exactly-once",
                t.events_per_sec >= 2000.0 && t.exactly_once,
            )),
            None => rows.push(missing("worker throughput", file)),
        }
        throughputs.push(tp);
    }

    let transitions: Option<Vec<Counted>> =
        read_json(&dir.join("transitions.json")).and_then(|v| serde_json::from_value(v).ok());
    match &transitions {
        Some(list) => {
            for t in list {
                let mut r = row(
                    &format!("remote calls per transition: {}", t.name),
                    format!(
                        "{} remote ({} reads, {} writes; agents_api {}, registry {}, compute {}) + {} queue; outcome {}",
                        t.remote,
                        t.reads,
                        t.writes,
                        t.agents_api,
                        t.registry,
                        t.compute,
                        t.queue,
                        t.outcome
                    ),
                    Some(t.remote as f64),
                    "calls",
                );
                if let (Some(target), Some(met)) = (&t.target, t.met) {
                    r = with_target(r, target, met);
                }
                rows.push(r);
            }
        }
        None => rows.push(missing("remote calls per transition", "transitions.json")),
    }

    let scale: Option<Vec<Scaled>> =
        read_json(&dir.join("scale.json")).and_then(|v| serde_json::from_value(v).ok());
    match &scale {
        Some(list) if !list.is_empty() => rows.extend(scale_rows(list)),
        _ => rows.push(missing("ECS calls per job and per sweep", "scale.json")),
    }

    let refill: Option<Vec<RefillCalls>> =
        read_json(&dir.join("pool_refill.json")).and_then(|v| serde_json::from_value(v).ok());
    match &refill {
        Some(list) if !list.is_empty() => rows.extend(pool_refill_rows(list)),
        _ => rows.push(missing("pool refill calls", "pool_refill.json")),
    }

    let recheck: Option<Vec<RecheckDelayRow>> =
        read_json(&dir.join("recheck_delay.json")).and_then(|v| serde_json::from_value(v).ok());
    match &recheck {
        Some(list) if !list.is_empty() => rows.extend(recheck_delay_rows(list)),
        _ => rows.push(missing(
            "recheck delay with a sweep in flight",
            "recheck_delay.json",
        )),
    }

    let fargate: Option<Vec<FargatePath>> =
        read_json(&dir.join("fargate_time.json")).and_then(|v| serde_json::from_value(v).ok());
    match &fargate {
        Some(list) if !list.is_empty() => rows.extend(fargate_rows(list)),
        _ => rows.push(missing(
            "simulated Fargate time to executor",
            "fargate_time.json",
        )),
    }

    let tte: Option<TimeToExecutor> =
        read_json(&dir.join("time_to_executor.json")).and_then(|v| serde_json::from_value(v).ok());
    match &tte {
        Some(t) => rows.extend(time_to_executor_rows(t)),
        None => rows.push(missing("time to executor", "time_to_executor.json")),
    }

    Report {
        machine: machine(),
        rows,
        raw: serde_json::json!({
            "python": python,
            "cold_start": cold,
            "throughput": throughputs,
            "transitions": transitions,
            "scale": scale,
            "pool_refill": refill,
            "recheck_delay": recheck,
            "fargate_time": fargate,
            "time_to_executor": tte,
            "criterion_median_ns": {
                "hmac_sha256": hmac,
                "verify_parse_route": ours,
                "accept_delivery": accept,
            },
        }),
    }
}

/// The simulated Fargate time to executor rows: per path, p50 / p99 / max (target warm:
/// p99 ≤ 2 s and no miss; cold is information).
fn fargate_rows(all: &[FargatePath]) -> Vec<Row> {
    all.iter()
        .map(|r| {
            let measured = row(
                &format!(
                    "time to executor, Fargate simulated, {} ({} sessions)",
                    r.path, r.sessions
                ),
                format!(
                    "p50 {:.1} s, p99 {:.1} s, max {:.1} s{}",
                    r.p50_ms as f64 / 1e3,
                    r.p99_ms as f64 / 1e3,
                    r.max_ms as f64 / 1e3,
                    if r.path == "warm" {
                        format!(", {} misses", r.misses)
                    } else {
                        String::new()
                    }
                ),
                Some(r.p99_ms as f64 / 1e3),
                "s",
            );
            if r.path == "warm" {
                with_target(measured, "p99 ≤ 2 s", r.p99_ms <= 2_000 && r.misses == 0)
            } else {
                measured
            }
        })
        .collect()
}

/// The recheck delay rows: per size and arrangement, the simulated delay of lease
/// rechecks due while a sweep is in flight (target with the sweep queue: 0 s, every
/// recheck handled at its due time; the single-queue control is information).
fn recheck_delay_rows(all: &[RecheckDelayRow]) -> Vec<Row> {
    all.iter()
        .map(|r| {
            let measured = row(
                &format!(
                    "recheck delay, sweep of {} environments in flight ({}; {} jobs/s per queue, simulated)",
                    r.environments, r.arrangement, r.jobs_per_sec
                ),
                format!(
                    "p50 {} s, p99 {} s, max {} s ({} rechecks)",
                    r.p50_secs, r.p99_secs, r.max_secs, r.rechecks
                ),
                Some(r.max_secs as f64),
                "s",
            );
            if r.arrangement == "sweep queue" {
                with_target(measured, "0 s (at its due time)", r.max_secs == 0 && r.rechecks > 0)
            } else {
                measured
            }
        })
        .collect()
}

/// The pool refill rows: per number of members handed out, one refill's remote calls
/// (target: the same calls as at the smallest number, and nothing started: the pool was
/// full).
fn pool_refill_rows(all: &[RefillCalls]) -> Vec<Row> {
    let first = &all[0];
    all.iter()
        .map(|r| {
            let breakdown = r
                .calls
                .iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect::<Vec<_>>()
                .join(", ");
            with_target(
                row(
                    &format!("pool refill calls, {} members claimed", r.claimed),
                    format!("{} ({breakdown})", r.total),
                    Some(r.total as f64),
                    "calls",
                ),
                &format!("flat (as at {} claimed)", first.claimed),
                r.calls == first.calls && r.started == 0,
            )
        })
        .collect()
}

/// The scale rows: per N, the ECS calls of each job (target: the same as at the smallest
/// N) and of a sweep with nothing to do (target: ≤ 3 × ⌈N/100⌉), with its wall time; then
/// the growth from the smallest to the largest N.
fn scale_rows(all: &[Scaled]) -> Vec<Row> {
    // The ECS rows and the growth are about the deployment without history; the registry
    // and queue rows cover every history.
    let fresh: Vec<Scaled> = all
        .iter()
        .filter(|s| s.history_days == 0)
        .cloned()
        .collect();
    let list: &[Scaled] = if fresh.is_empty() { all } else { &fresh };
    let jobs = |s: &Scaled| {
        [
            s.start.total,
            s.reuse_wait.total,
            s.idle_lease.total,
            s.lease_stop.total,
        ]
    };
    let first = &list[0];
    let mut rows = Vec::new();
    for s in list {
        let j = jobs(s);
        let r = row(
            &format!("ECS calls per worker job, N = {}", s.environments),
            format!(
                "start {} / reuse-wait {} / idle (lease) {} / lease stop {} ({} StopTask + {} DescribeTasks)",
                j[0], j[1], j[2], j[3], s.lease_stop.stop_task, s.lease_stop.describe_tasks
            ),
            Some(j.iter().sum::<u64>() as f64),
            "calls",
        );
        rows.push(with_target(
            r,
            &format!("flat (as at N = {})", first.environments),
            j == jobs(first),
        ));
        let r = row(
            &format!("ECS calls per sweep with no effect, N = {}", s.environments),
            format!(
                "{} ({} ListTasks + {} DescribeTasks); in place {:.1} ms, fan-out {:.1} ms ({} calls)",
                s.sweep.total,
                s.sweep.list_tasks,
                s.sweep.describe_tasks,
                s.sweep_ms,
                s.fan_out_ms,
                s.fan_out.total
            ),
            Some(s.sweep.total as f64),
            "calls",
        );
        rows.push(with_target(
            r,
            &format!("≤ 3 × ⌈N/100⌉ = {}", s.sweep_bound),
            s.sweep.total <= s.sweep_bound && s.sweep_not_ignored == 0,
        ));
    }
    if let Some(last) = list.last().filter(|l| l.environments > first.environments) {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        let n = ratio(last.environments as f64, first.environments as f64);
        let job = ratio(
            jobs(last).iter().sum::<u64>() as f64,
            jobs(first).iter().sum::<u64>() as f64,
        );
        let sweep = ratio(last.sweep.total as f64, first.sweep.total as f64);
        let time = ratio(last.sweep_ms, first.sweep_ms);
        rows.push(row(
            &format!(
                "growth N = {} → {} (×{n:.0})",
                first.environments, last.environments
            ),
            format!(
                "per job ×{job:.1}; per sweep ×{sweep:.1} ECS calls; sweep wall time ×{time:.1}"
            ),
            Some(sweep),
            "ratio",
        ));
        rows.push(information(
            row(
                &format!(
                    "sweep wall time growth N = {} → {}",
                    first.environments, last.environments
                ),
                format!(
                    "×{time:.1} ({:.1} ms → {:.1} ms)",
                    first.sweep_ms, last.sweep_ms
                ),
                Some(time),
                "ratio",
            ),
            "≤ ×150 for ×100 environments",
        ));
    }
    rows.extend(registry_rows(all));
    rows
}

/// Per executor and path, connection request → environment `connected` (warm
/// target ≤ 2 s p99) and the controller's own share (warm target ≤ 50 ms p99).
fn time_to_executor_rows(t: &TimeToExecutor) -> Vec<Row> {
    let mut rows = Vec::new();
    if !t.codex_used {
        rows.push(Row {
            measurement: "time to executor with the real pinned codex".to_owned(),
            result: format!("not measured: {}; stand-in rows only", t.codex),
            value: None,
            unit: String::new(),
            target: String::new(),
            verdict: "MISSED".to_owned(),
        });
    }
    for r in &t.rows {
        let warm = r.path == StartPath::Warm;
        let what = format!(
            "{} start, {} (N = {}, pool size {}, {} workers)",
            if warm { "warm" } else { "cold" },
            r.executor,
            r.sessions,
            r.pool_size,
            t.workers
        );
        let total = row(
            &format!("time to executor: connection request → connected, {what}"),
            format!(
                "p50 {:.1} ms, p99 {:.1} ms (max {:.1} ms); pool hits {}/{}",
                r.total_ms.p50, r.total_ms.p99, r.total_ms.max, r.pool_hits, r.sessions
            ),
            Some(r.total_ms.p99),
            "ms",
        );
        rows.push(if warm {
            with_target(
                total,
                "≤ 250 ms p99, every start a claim",
                r.total_ms.p99 <= 250.0 && r.pool_hits == r.sessions,
            )
        } else {
            total
        });
        let share = row(
            &format!("controller's own share (the worker's job of the connection request), {what}"),
            format!(
                "p50 {:.2} ms, p99 {:.2} ms; rest (delivery, queue, executor, forwarder, connect) p50 {:.1} ms, p99 {:.1} ms, of it pickup (delivery + intake + queue wait) p50 {:.1} ms, p99 {:.1} ms",
                r.controller_ms.p50,
                r.controller_ms.p99,
                r.rest_ms.p50,
                r.rest_ms.p99,
                r.pickup_ms.p50,
                r.pickup_ms.p99
            ),
            Some(r.controller_ms.p99),
            "ms",
        );
        rows.push(if warm {
            with_target(share, "≤ 20 ms p99", r.controller_ms.p99 <= 20.0)
        } else {
            share
        });
    }
    rows
}

/// Per N and days of history, the registry items the sweep reads (target ≤ 1.1 ×
/// the open records and the same with and without history), per job (flat), the
/// no-effect sweep's registry writes (0) and the fan-out's queue calls (≤ ⌈N/10⌉).
fn registry_rows(all: &[Scaled]) -> Vec<Row> {
    let mut rows = Vec::new();
    for s in all {
        let without = all
            .iter()
            .find(|o| o.environments == s.environments && o.history_days == 0);
        let same = without.is_none_or(|o| {
            o.sweep_items_read == s.sweep_items_read && o.job_items_read == s.job_items_read
        });
        let bound = (s.open_records as f64 * 1.1).floor() as u64;
        let queue_bound = s.environments.div_ceil(10);
        let r = row(
            &format!(
                "registry and queue per sweep, N = {}, {} days of history",
                s.environments, s.history_days
            ),
            format!(
                "sweep read {} items ({} open records; in place with its jobs {}), per job {}; no-effect sweep writes {}; fan-out queue calls {}",
                s.sweep_items_read,
                s.open_records,
                s.sweep_with_jobs_items_read,
                s.job_items_read,
                s.sweep_registry_writes,
                s.fan_out_queue_calls
            ),
            Some(s.sweep_items_read as f64),
            "items",
        );
        rows.push(with_target(
            r,
            &format!(
                "≤ {bound} items (1.1 × open), same as without history; 0 writes; ≤ {queue_bound} queue calls"
            ),
            s.sweep_items_read <= bound
                && same
                && s.sweep_registry_writes == 0
                && s.fan_out_queue_calls <= queue_bound,
        ));
    }
    rows
}

/// The report as a Markdown table, with the machine on top.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "machine: {} CPUs, {}",
        report.machine["cpus"],
        report.machine["cpu_model"]
            .as_str()
            .unwrap_or("unknown CPU")
    );
    let _ = writeln!(out);
    let _ = writeln!(out, "| measurement | result | target | verdict |");
    let _ = writeln!(out, "|---|---|---|---|");
    for r in &report.rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            r.measurement, r.result, r.target, r.verdict
        );
    }
    out
}
