//! `sandboxctl status`: every environment of the deployment, the live compute nobody
//! records (orphans) and the dead-letter queues, with the problems that make it exit 1.
//!
//! Per environment: session, record status, the instance and its provider status read
//! back now (ECS `lastStatus`, normalised; `missing` when the provider does not know it),
//! generation, lease due, `cleanup_required`, failed starts, compute age, and the last
//! decision (outcome, reason, error) — a deferred job's reason is there: the decision
//! that waited (`wait`, `uncertain`) or failed (`error`).

use crate::backend::{BackendArgs, Ops, QueueKind};
use crate::report::{Verdict, checked_id, write_json};
use crate::timestamps::{stamp, stamp_opt, utc};
use sandbox_controller::ports::{Clock as _, Compute as _, Queue as _, Registry as _, SystemClock};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::record::{Record, RecordStatus, StartFailureKind};
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::io::Write;

/// `--status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusFilter {
    /// Records that name (or last named) a running compute.
    Active,
    /// Records whose compute was stopped.
    Stopped,
    /// Closed records.
    Closed,
}

/// Arguments of `sandboxctl status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Only this session's environment.
    #[arg(long)]
    pub session: Option<String>,
    /// Only records in this status.
    #[arg(long, value_enum)]
    pub status: Option<StatusFilter>,
}

fn status_name(s: RecordStatus) -> &'static str {
    match s {
        RecordStatus::Active => "active",
        RecordStatus::Stopped => "stopped",
        RecordStatus::Closed => "closed",
    }
}

fn compute_status_name(s: ComputeStatus) -> &'static str {
    match s {
        ComputeStatus::Provisioning => "provisioning",
        ComputeStatus::Pending => "pending",
        ComputeStatus::Running => "running",
        ComputeStatus::Stopping => "stopping",
        ComputeStatus::Stopped => "stopped",
    }
}

fn instance_json(i: &ComputeInstance) -> Value {
    json!({
        "instance_id": i.instance_id,
        "environment_id": i.environment_id,
        "session_id": i.session_id,
        "generation": i.generation.0,
        "provider_status": compute_status_name(i.status),
        "started_at": stamp_opt(i.started_at),
    })
}

/// Outcomes that need an owner's look.
const PROBLEM_OUTCOMES: [&str; 2] = ["divergent", "reconcile"];
/// Outcomes that defer the job.
const DEFERRING_OUTCOMES: [&str; 2] = ["wait", "uncertain"];

async fn environment<O: Ops>(
    ops: &O,
    r: &Record,
    live: &HashMap<String, ComputeInstance>,
    now: u64,
) -> anyhow::Result<(Value, Vec<String>)> {
    let mut problems = vec![];
    let env = r.environment_id.as_str();
    let instance = match &r.instance {
        None => Value::Null,
        Some(named) => {
            let seen = match live.get(named.instance_id.as_str()) {
                Some(i) => Some(i.clone()),
                None => ops.compute().describe(&named.instance_id).await?,
            };
            let provider = seen
                .as_ref()
                .map_or("missing", |i| compute_status_name(i.status));
            if r.status == RecordStatus::Active
                && seen
                    .as_ref()
                    .is_none_or(|i| i.status == ComputeStatus::Stopped)
            {
                problems.push(format!(
                    "{env}: the record names {} as running; the provider says {provider} (the next sweep marks it stopped)",
                    named.instance_id
                ));
            }
            json!({
                "instance_id": named.instance_id,
                "generation": named.generation.0,
                "provider_status": provider,
                "started_at": stamp_opt(seen.as_ref().and_then(|i| i.started_at)),
                // How long the compute has run: only while it runs.
                "age_secs": seen
                    .as_ref()
                    .filter(|i| i.status.is_live())
                    .and_then(|i| i.started_at)
                    .map(|s| now.saturating_sub(s)),
            })
        }
    };
    if r.cleanup_required {
        problems.push(format!("{env}: cleanup required (a close is not finished)"));
    }
    let max = ops.config().policy.max_start_attempts;
    if let Some(f) = r.start_failure.as_ref().filter(|f| f.attempts >= max) {
        problems.push(match f.kind {
            StartFailureKind::NeverConnected => format!(
                "{env}: executor_never_connects: {} executors stopped without connecting (last: {}); held until `sandboxctl resolve {env} --effect not_needed` once the executor key or image is fixed",
                f.attempts, f.reason
            ),
            StartFailureKind::Start => format!(
                "{env}: {} failed starts, no more attempts until `sandboxctl reset-start-failures {env}`",
                f.attempts
            ),
        });
    }
    problems.extend(crate::evidence_view::problem(r));
    let audit = ops.audit_entries(&r.environment_id.effect_key()).await?;
    let last = audit.last().map(|e| {
        let deferred = e.error.is_some() || DEFERRING_OUTCOMES.contains(&e.outcome.as_str());
        if PROBLEM_OUTCOMES.contains(&e.outcome.as_str()) {
            problems.push(format!("{env}: last decision {}: {}", e.outcome, e.reason));
        }
        json!({
            "at": stamp(e.at),
            "trigger": e.trigger.get("kind").cloned().unwrap_or(Value::Null),
            "outcome": e.outcome,
            "reason": e.reason,
            "error": e.error,
            "deferred": deferred,
        })
    });
    let body = json!({
        "environment_id": r.environment_id,
        "session_id": r.session_id,
        "status": status_name(r.status),
        "generation": r.generation.0,
        "instance": instance,
        "lease": r.lease.as_ref().map(|l| json!({
            "generation": l.target.generation.0,
            "requested_at": stamp(l.requested_at),
            "due_at": stamp(l.due_at),
        })),
        "cleanup_required": r.cleanup_required,
        "start_failure": r.start_failure.as_ref().map(|f| json!({
            "attempts": f.attempts,
            "last_failed_at": stamp(f.last_failed_at),
            "reason": f.reason,
            "kind": f.kind.as_str(),
        })),
        "last_decision": last,
        "reconciliation": {
            "open": r.open_evidence().count(),
            "holds_compute": r.holding_evidence().is_some(),
            "latest": r.evidence.last().map(crate::evidence_view::entry_json),
        },
        "connection": crate::evidence_view::connection_json(r),
        "problems": problems,
    });
    Ok((body, problems))
}

/// Runs `status`.
///
/// # Errors
/// Bad filters (usage) or a failed read (access): exit 2.
pub async fn run<O: Ops>(
    ops: &O,
    args: &StatusArgs,
    out: &mut impl Write,
) -> anyhow::Result<Verdict> {
    if let Some(s) = &args.session {
        checked_id("--session", s)?;
    }
    let now = SystemClock.now();
    let mut records = ops.registry().list().await?;
    records.sort_by(|a, b| a.environment_id.cmp(&b.environment_id));
    let instances = ops.compute().list(&ops.config().deployment).await?;
    let live: HashMap<String, ComputeInstance> = instances
        .iter()
        .map(|i| (i.instance_id.as_str().to_owned(), i.clone()))
        .collect();
    let recorded: BTreeSet<&str> = records.iter().map(|r| r.environment_id.as_str()).collect();
    let wanted = |r: &Record| {
        args.session
            .as_deref()
            .is_none_or(|s| r.session_id.as_str() == s)
            && args.status.is_none_or(|f| {
                status_name(r.status)
                    == match f {
                        StatusFilter::Active => "active",
                        StatusFilter::Stopped => "stopped",
                        StatusFilter::Closed => "closed",
                    }
            })
    };
    let mut problems = vec![];
    let mut envs = vec![];
    for r in records.iter().filter(|r| wanted(r)) {
        let (body, p) = environment(ops, r, &live, now).await?;
        problems.extend(p);
        envs.push(body);
    }
    let orphans: Vec<&ComputeInstance> = instances
        .iter()
        .filter(|i| i.status.is_live() && !recorded.contains(i.environment_id.as_str()))
        .filter(|i| {
            args.session
                .as_deref()
                .is_none_or(|s| i.session_id.as_ref().is_some_and(|x| x.as_str() == s))
        })
        .collect();
    for o in &orphans {
        problems.push(format!(
            "orphan: {} (environment {}) runs with no record (the next sweep releases it)",
            o.instance_id, o.environment_id
        ));
    }
    // The warm pool's idle members and their age (seconds).
    let pool: Vec<serde_json::Value> = ops
        .compute()
        .list_pool(&ops.config().deployment)
        .await?
        .iter()
        .map(|m| {
            json!({
                "instance_id": m.instance_id,
                "created_at": stamp(m.created_at),
                "age_secs": now.saturating_sub(m.created_at),
            })
        })
        .collect();
    let mut dead = serde_json::Map::new();
    for q in QueueKind::ALL {
        let n = ops.queue(q).dead_letter_count().await?;
        if n > 0 {
            problems.push(format!(
                "{n} message(s) in the {} dead-letter queue (`sandboxctl dlq list --queue {}`)",
                q.name(),
                q.name()
            ));
        }
        dead.insert(q.name().into(), json!(n));
    }
    if args.backend.json {
        write_json(
            out,
            "status",
            ops.backend(),
            json!({
                "generated_at": stamp(now),
                "deployment": ops.config().deployment,
                "environments": envs,
                "orphans": orphans.iter().map(|i| instance_json(i)).collect::<Vec<_>>(),
                "pool": pool,
                "dead_letters": dead,
                "problems": problems,
            }),
        )?;
    } else {
        writeln!(
            out,
            "{} backend, deployment {}, {}",
            ops.backend(),
            ops.config().deployment,
            utc(now)
        )?;
        writeln!(
            out,
            "{:<30} {:<30} {:<8} {:>3} {:<14} notes",
            "environment", "session", "record", "gen", "compute"
        )?;
        for e in &envs {
            let mut notes = vec![];
            if let Some(i) = e["instance"].as_object() {
                notes.push(format!("task {}", i["instance_id"].as_str().unwrap_or("")));
                if let Some(age) = i["age_secs"].as_u64() {
                    notes.push(format!("age {age}s"));
                }
            }
            if let Some(l) = e["lease"].as_object() {
                notes.push(format!(
                    "stop due {}",
                    l["due_at"]["utc"].as_str().unwrap_or("")
                ));
            }
            if e["cleanup_required"] == true {
                notes.push("cleanup required".into());
            }
            if let Some(f) = e["start_failure"].as_object() {
                let what = if f["kind"] == "never_connected" {
                    "executor(s) that never connected"
                } else {
                    "failed start(s)"
                };
                notes.push(format!(
                    "{} {what}: {}",
                    f["attempts"],
                    f["reason"].as_str().unwrap_or("")
                ));
            }
            if let Some(n) = e["reconciliation"]["open"].as_u64().filter(|n| *n > 0) {
                notes.push(format!(
                    "{n} open reconciliation(s){}",
                    if e["reconciliation"]["holds_compute"] == true {
                        ", compute held"
                    } else {
                        ""
                    }
                ));
            }
            if let Some(d) = e["last_decision"].as_object() {
                let mut last = format!(
                    "last {} {} ({})",
                    d["at"]["utc"].as_str().unwrap_or(""),
                    d["outcome"].as_str().unwrap_or(""),
                    d["reason"].as_str().unwrap_or("")
                );
                if let Some(err) = d["error"].as_str() {
                    last.push_str(&format!(", error: {err}"));
                }
                if d["deferred"] == true {
                    last.push_str(" [deferred]");
                }
                notes.push(last);
            }
            writeln!(
                out,
                "{:<30} {:<30} {:<8} {:>3} {:<14} {}",
                e["environment_id"].as_str().unwrap_or(""),
                e["session_id"].as_str().unwrap_or(""),
                e["status"].as_str().unwrap_or(""),
                e["generation"],
                e["instance"]["provider_status"].as_str().unwrap_or("-"),
                notes.join("; ")
            )?;
        }
        writeln!(out, "pool: {} idle member(s)", pool.len())?;
        for m in &pool {
            writeln!(
                out,
                "pool member {} age {}s",
                m["instance_id"].as_str().unwrap_or(""),
                m["age_secs"]
            )?;
        }
        for o in &orphans {
            writeln!(
                out,
                "orphan {} environment {} generation {} {}",
                o.instance_id,
                o.environment_id,
                o.generation.0,
                compute_status_name(o.status)
            )?;
        }
        writeln!(
            out,
            "dead letters: events {}, timers {}",
            dead["events"], dead["timers"]
        )?;
        for p in &problems {
            writeln!(out, "problem: {p}")?;
        }
    }
    Ok(Verdict::of(&problems))
}
