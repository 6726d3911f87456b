//! The operator's write commands. None writes the registry or calls the provider: each
//! enqueues a job that a worker (the Lambda worker, or `serve`'s worker loops) processes
//! under the effect-key lock like any other, through the same decision.
//!
//! - `close <session> [--wait]`: a `close` job on the events queue (FIFO group = the
//!   session, so it is ordered with the session's webhook jobs). The worker rejects new
//!   work for the session (`cleanup_required`), waits out a start in flight, deletes the
//!   session and stops the compute, each with its receipt (lifecycle row 25). `--wait`
//!   polls the registry until the record is closed (exit 0) or `--timeout-secs` passes
//!   (exit 1, printing what is still unconfirmed). A forced close of a session no record
//!   names carries the operator's proof (`sandbox_core::operator_proof`), signed with the
//!   operator key; the worker refuses such a close without it.
//! - `sweep`: the sweeper function's fan-out — one read of the registry and the provider,
//!   one `sweep` job per environment with that evidence, on the sweep queue (needs no
//!   Agents API key); `sweep --dry-run`: the decisions a sweep would take now, nothing enqueued
//!   (reads the sessions: needs the Agents API key).
//! - `reset-start-failures <environment>`: a `reset_start_failures` job for an environment
//!   whose record holds failed starts; the worker clears them under the lock and then
//!   rechecks (a start follows if the session still needs one).
//! - `resolve <session|environment> --effect observed|compensated|not_needed|abandoned
//!   [--note TEXT] [--wait]`: a `resolve` job; the worker closes the open reconciliation
//!   under the lock (who, when, what), then rechecks: only then may the idle stop of a
//!   held compute proceed.
//! - `report-timeout <session> [--turn ID] [--submitted-at UNIX] [--wait]`: a
//!   `timeout_reported` job (the same message an application can put on the events queue,
//!   `events/jobs/`); the worker records what became of the submission — `still_running`,
//!   `completed` (with tool outcomes), `failed` or `not_found` — and never resubmits.

use crate::backend::{BackendArgs, Ops, QueueKind};
use crate::report::{Verdict, checked_id, write_json};
use crate::timestamps::stamp;
use sandbox_controller::Controller;
use sandbox_controller::NoSessions;
use sandbox_controller::job::Job;
use sandbox_controller::ports::{Clock, Outgoing, Queue as _, Receipt, Registry as _, SystemClock};
use sandbox_core::evidence::{EffectState, Evidence, EvidenceTrigger, Resolution};
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::record::{Record, RecordStatus};
use serde_json::{Value, json};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Guard rails of the commands that delete or move something (`close`, `resolve`, `dlq
/// redrive`).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct GuardArgs {
    /// Act even on a session no record of this deployment names (a typo, or another
    /// deployment's session: without a record this deployment never handled it). For
    /// `close`, also close although the environment holds open reconciliation evidence:
    /// the evidence is first resolved `abandoned` by you (a forced close, named in the
    /// terminal record); without it such a close waits for `sandboxctl resolve`.
    #[arg(long)]
    pub force: bool,
    /// Do not ask for confirmation; required when stdin is not a terminal.
    #[arg(long)]
    pub yes: bool,
}

/// Refuses a destructive command whose backend would be chosen by `TABLE_NAME` alone
/// (docs/SECURITY.md): `--backend` (or `--data-dir`) must say it. Called before any backend is
/// opened.
///
/// # Errors
/// `TABLE_NAME` is set and neither `--backend` nor `--data-dir` is given.
pub fn refuse_inferred_backend(backend: &BackendArgs, what: &str) -> anyhow::Result<()> {
    if backend.backend.is_none()
        && backend.data_dir.is_none()
        && std::env::var_os("TABLE_NAME").is_some()
    {
        anyhow::bail!(
            "{what}: TABLE_NAME is set but --backend is not; a destructive command never takes its backend from the environment alone: pass --backend aws (or --backend local)"
        );
    }
    Ok(())
}

/// Before a destructive command acts: refuses a backend chosen by `TABLE_NAME` alone,
/// prints the backend, deployment and store (table or data directory) to stderr, and
/// asks for confirmation on a terminal (`--yes` skips it; off a terminal it is required).
///
/// # Errors
/// The backend was inferred from the environment, stdin is not a terminal without
/// `--yes`, or the operator did not answer `y`.
pub fn confirm_target<O: Ops>(
    ops: &O,
    backend: &BackendArgs,
    guard: &GuardArgs,
    what: &str,
) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    refuse_inferred_backend(backend, what)?;
    eprintln!(
        "{what}: backend {}, deployment {}, {}",
        ops.backend(),
        ops.config().deployment,
        ops.store()
    );
    if guard.yes {
        return Ok(());
    }
    anyhow::ensure!(
        std::io::stdin().is_terminal(),
        "{what}: stdin is not a terminal; pass --yes to confirm"
    );
    eprint!("{what}: proceed? [y/N] ");
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    anyhow::ensure!(
        matches!(answer.trim(), "y" | "Y" | "yes"),
        "{what}: not confirmed; nothing done"
    );
    Ok(())
}

/// Arguments of `sandboxctl close`.
#[derive(Debug, clap::Args)]
pub struct CloseArgs {
    /// The session to close.
    pub session: String,
    #[command(flatten)]
    pub guard: GuardArgs,
    /// Follow the close until both receipts (or the timeout).
    #[arg(long)]
    pub wait: bool,
    /// With `--wait`: give up after this many seconds (exit 1; the close goes on).
    #[arg(long, default_value_t = 300)]
    pub timeout_secs: u64,
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// Arguments of `sandboxctl sweep`.
#[derive(Debug, clap::Args)]
pub struct SweepArgs {
    /// Print the decisions a sweep would take now; enqueue nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// Arguments of `sandboxctl reset-start-failures`.
#[derive(Debug, clap::Args)]
pub struct ResetArgs {
    /// The environment whose failed starts to clear.
    pub environment: String,
    #[command(flatten)]
    pub backend: BackendArgs,
}

fn job(trigger: Trigger, session: SessionId, env: Option<EnvironmentId>, now: u64) -> Job {
    Job {
        handoffs: 0,
        trigger,
        session_id: session,
        environment_id: env,
        webhook_id: None,
        enqueued_at: now,
        swept: None,
        operator_proof: None,
    }
}

async fn enqueue<O: Ops>(ops: &O, which: QueueKind, job: Job, dedup: String) -> anyhow::Result<()> {
    ops.queue(which)
        .send(Outgoing {
            group: job.group().to_owned(),
            job,
            dedup_id: dedup,
            delay_secs: 0,
        })
        .await?;
    Ok(())
}

fn receipts_json(receipts: &[Receipt]) -> Vec<Value> {
    receipts
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(&r.kind).unwrap_or(Value::Null);
            if let Some(o) = v.as_object_mut() {
                o.insert("at".into(), stamp(r.at));
            }
            v
        })
        .collect()
}

/// Runs `close`.
///
/// # Errors
/// A malformed session id (usage), a session no record names without `--force`, a
/// refused confirmation ([`confirm_target`]), or a failed send or read (access).
pub async fn close<O: Ops>(
    ops: &O,
    args: &CloseArgs,
    out: &mut impl Write,
) -> anyhow::Result<Verdict> {
    let session = SessionId::new(checked_id("the session id", &args.session)?);
    let record = ops.registry().find_by_session(&session).await?;
    // The ownership filter may accept every session, so a typo or another
    // deployment's id would delete a session this deployment never handled.
    if record.is_none() && !args.guard.force {
        anyhow::bail!(
            "close: no record of deployment {} names session {session}; nothing was enqueued (pass --force to close a session this deployment never handled)",
            ops.config().deployment
        );
    }
    confirm_target(ops, &args.backend, &args.guard, "close")?;
    let now = SystemClock.now();
    let env = record.as_ref().map(|r| r.environment_id.clone());
    // Seed 001 orders "reconcile effects" before the session delete. A close of
    // an environment with open evidence waits for `resolve`; `--force` resolves it first
    // (`abandoned`, recorded as a forced close), in the same message group, so the worker
    // sees the resolution before the close.
    let open = record.as_ref().map_or(0, |r| r.open_evidence().count());
    if open > 0 && args.guard.force {
        let by = std::env::var("USER")
            .ok()
            .and_then(|u| checked_text("USER", &u, 128).ok())
            .unwrap_or_else(|| "unknown".to_owned());
        let resolution = Resolution {
            effect: EffectState::Abandoned,
            by,
            at: now,
            note: Some(format!(
                "{} (sandboxctl close --force): {open} open question(s) abandoned",
                sandbox_controller::terminal::FORCED_CLOSE_NOTE
            )),
        };
        enqueue(
            ops,
            QueueKind::Events,
            job(
                Trigger::Resolve { resolution },
                session.clone(),
                env.clone(),
                now,
            ),
            format!("close-force:{session}:{}", request_nanos()),
        )
        .await?;
    }
    let mut close_job = job(Trigger::Close, session.clone(), env.clone(), now);
    if record.is_none() {
        // A forced close of a session no record names: the worker acts on it only with the
        // operator's proof (sandbox_core::operator_proof; docs/SECURITY.md).
        let key = ops.operator_key().await?;
        close_job.operator_proof = Some(key.sign(&session, now, &Trigger::Close));
    }
    enqueue(
        ops,
        QueueKind::Events,
        close_job,
        format!("close:{session}:{now}"),
    )
    .await?;
    let awaits_resolution = open > 0 && !args.guard.force;
    if awaits_resolution {
        let problem = format!(
            "the close waits for `sandboxctl resolve {session}`: {open} open reconciliation question(s) (or close with --force to abandon them)"
        );
        if args.backend.json {
            write_json(
                out,
                "close",
                ops.backend(),
                json!({
                    "session_id": session, "environment_id": env, "enqueued_at": stamp(now),
                    "waited": false, "result": null, "problems": [problem],
                }),
            )?;
        } else {
            writeln!(out, "close of {session} enqueued")?;
            writeln!(out, "problem: {problem}")?;
        }
        return Ok(Verdict::of(&[problem]));
    }
    if !args.wait {
        if args.backend.json {
            write_json(
                out,
                "close",
                ops.backend(),
                json!({
                    "session_id": session, "environment_id": env, "enqueued_at": stamp(now),
                    "waited": false, "result": null, "problems": [],
                }),
            )?;
        } else {
            writeln!(
                out,
                "close of {session} enqueued; follow it with `sandboxctl explain {session}`"
            )?;
        }
        return Ok(Verdict::Ok);
    }
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let (closed, record) = loop {
        let record = ops.registry().find_by_session(&session).await?;
        let closed = record
            .as_ref()
            .is_some_and(|r| r.status == RecordStatus::Closed && !r.cleanup_required);
        if closed || Instant::now() >= deadline {
            break (closed, record);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let receipts = match &record {
        Some(r) => {
            ops.registry()
                .receipts(&r.environment_id.effect_key())
                .await?
        }
        None => vec![],
    };
    let last_error = match &record {
        Some(r) => ops
            .audit_entries(&r.environment_id.effect_key())
            .await?
            .into_iter()
            .rev()
            .find_map(|e| e.error),
        None => None,
    };
    let mut problems = vec![];
    if !closed {
        problems.push(match &record {
            None => format!("no record for {session} yet: the close job was not processed (is a worker running?)"),
            Some(r) if r.cleanup_required => format!(
                "close not finished: cleanup_required is kept{}",
                last_error.as_ref().map(|e| format!("; last error: {e}")).unwrap_or_default()
            ),
            Some(_) => "the close job was not processed yet (is a worker running?)".to_owned(),
        });
    }
    if args.backend.json {
        write_json(
            out,
            "close",
            ops.backend(),
            json!({
                "session_id": session,
                "environment_id": record.as_ref().map(|r| &r.environment_id),
                "enqueued_at": stamp(now),
                "waited": true,
                "result": {"closed": closed, "receipts": receipts_json(&receipts)},
                "problems": problems,
            }),
        )?;
    } else {
        writeln!(
            out,
            "close of {session}: {}",
            if closed { "closed" } else { "NOT finished" }
        )?;
        for r in receipts_json(&receipts) {
            writeln!(
                out,
                "  receipt {} at {}",
                r["kind"].as_str().unwrap_or("?"),
                r["at"]["utc"].as_str().unwrap_or("")
            )?;
        }
        for p in &problems {
            writeln!(out, "problem: {p}")?;
        }
    }
    Ok(Verdict::of(&problems))
}

/// Runs `sweep` and `sweep --dry-run`.
///
/// # Errors
/// A failed read or send (access); for `--dry-run`, a missing Agents API key.
pub async fn sweep<O: Ops>(
    ops: &O,
    args: &SweepArgs,
    out: &mut impl Write,
) -> anyhow::Result<Verdict> {
    let now = SystemClock.now();
    if args.dry_run {
        let controller = Controller::new(
            ops.queue(QueueKind::Events).clone(),
            ops.queue(QueueKind::Timers).clone(),
            ops.registry().clone(),
            ops.compute().clone(),
            ops.sessions().await?,
            Arc::new(SystemClock) as Arc<dyn Clock>,
            ops.config().clone(),
        );
        let decisions = controller.sweep_dry_run().await?;
        let problems: Vec<String> = decisions
            .iter()
            .filter(|d| ["divergent", "reconcile"].contains(&d.decision.outcome.as_str()))
            .map(|d| {
                format!(
                    "{}: would decide {} ({})",
                    d.environment_id, d.decision.outcome, d.decision.reason
                )
            })
            .collect();
        if args.backend.json {
            write_json(
                out,
                "sweep",
                ops.backend(),
                json!({
                    "dry_run": true,
                    "at": stamp(now),
                    "decisions": decisions.iter().map(|d| json!({
                        "environment_id": d.environment_id,
                        "session_id": d.session_id,
                        "outcome": d.decision.outcome.as_str(),
                        "reason": d.decision.reason.to_string(),
                        "effects": d.decision.effects,
                    })).collect::<Vec<_>>(),
                    "enqueued": 0,
                    "problems": problems,
                }),
            )?;
        } else {
            writeln!(
                out,
                "dry run: {} environment(s); nothing enqueued, nothing changed",
                decisions.len()
            )?;
            for d in &decisions {
                writeln!(
                    out,
                    "  {:<30} {:<14} {} ({} effect(s))",
                    d.environment_id.as_str(),
                    d.decision.outcome.as_str(),
                    d.decision.reason,
                    d.decision.effects.len()
                )?;
            }
            for p in &problems {
                writeln!(out, "problem: {p}")?;
            }
        }
        return Ok(Verdict::of(&problems));
    }
    // The sweeper function's own fan-out: one read, one job per environment with its
    // evidence, on the sweep queue, spread over time.
    let controller = Controller::new(
        ops.queue(QueueKind::Events).clone(),
        ops.queue(QueueKind::Timers).clone(),
        ops.registry().clone(),
        ops.compute().clone(),
        NoSessions,
        Arc::new(SystemClock) as Arc<dyn Clock>,
        ops.config().clone(),
    )
    .with_sweep_queue(ops.queue(QueueKind::Sweep).clone());
    let report = controller.sweep_fan_out().await?;
    let problems: Vec<String> = if report.deferred > 0 {
        vec![format!(
            "{} sweep job(s) could not be enqueued (the next sweep plans them again)",
            report.deferred
        )]
    } else {
        vec![]
    };
    if args.backend.json {
        write_json(
            out,
            "sweep",
            ops.backend(),
            json!({
                "dry_run": false,
                "at": stamp(now),
                "decisions": [],
                "enqueued": report.enqueued,
                "environments_examined": report.environments,
                "settled_skipped": report.settled_skipped,
                "problems": problems,
            }),
        )?;
    } else {
        writeln!(
            out,
            "{} sweep job(s) enqueued on the sweep queue ({} environment(s) examined, {} settled skipped); the worker decides each under its lock",
            report.enqueued, report.environments, report.settled_skipped
        )?;
        for p in &problems {
            writeln!(out, "problem: {p}")?;
        }
    }
    Ok(Verdict::of(&problems))
}

/// Runs `reset-start-failures`.
///
/// # Errors
/// A malformed id or an environment without a record (usage), or a failed read or send.
pub async fn reset_start_failures<O: Ops>(
    ops: &O,
    args: &ResetArgs,
    out: &mut impl Write,
) -> anyhow::Result<Verdict> {
    let env = EnvironmentId::new(checked_id("the environment id", &args.environment)?);
    let Some(record) = ops.registry().get(&env.effect_key()).await? else {
        anyhow::bail!("no record for environment {env}: nothing to reset");
    };
    let now = SystemClock.now();
    let failures = record
        .start_failure
        .as_ref()
        .map(|f| f.attempts)
        .unwrap_or(0);
    if failures > 0 {
        enqueue(
            ops,
            QueueKind::Events,
            job(
                Trigger::ResetStartFailures,
                record.session_id.clone(),
                Some(env.clone()),
                now,
            ),
            format!("reset-start-failures:{env}:{now}"),
        )
        .await?;
    }
    if args.backend.json {
        write_json(
            out,
            "reset-start-failures",
            ops.backend(),
            json!({
                "environment_id": env,
                "session_id": record.session_id,
                "failed_starts": failures,
                "enqueued": failures > 0,
                "problems": [],
            }),
        )?;
    } else if failures > 0 {
        writeln!(
            out,
            "reset of {failures} failed start(s) of {env} enqueued; the worker clears them under the lock, then rechecks"
        )?;
    } else {
        writeln!(out, "{env} has no failed starts: nothing enqueued")?;
    }
    Ok(Verdict::Ok)
}

/// Arguments of `sandboxctl resolve`.
#[derive(Debug, clap::Args)]
pub struct ResolveArgs {
    /// The session or environment whose open reconciliation to close.
    pub id: String,
    /// What the owner found about the business effect: observed, compensated,
    /// not_needed or abandoned.
    #[arg(long)]
    pub effect: String,
    /// A free-text note kept with the resolution (at most 1,000 characters).
    #[arg(long)]
    pub note: Option<String>,
    /// Who resolves it (default: the `USER` environment variable).
    #[arg(long)]
    pub by: Option<String>,
    /// `--yes` (a resolve needs a record: `--force` changes nothing).
    #[command(flatten)]
    pub guard: GuardArgs,
    /// Follow the resolution until the worker recorded it (or the timeout).
    #[arg(long)]
    pub wait: bool,
    /// With `--wait`: give up after this many seconds (exit 1; the job stays queued).
    #[arg(long, default_value_t = 60)]
    pub timeout_secs: u64,
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// Reads the environment's record every 300 ms until `found` answers `Some` (returned)
/// or `timeout_secs` seconds pass (`None`): how `--wait` follows a job the worker takes.
///
/// # Errors
/// A failed registry read.
async fn poll_record<O: Ops, T>(
    ops: &O,
    env: &EnvironmentId,
    timeout_secs: u64,
    mut found: impl FnMut(Option<Record>) -> Option<T>,
) -> anyhow::Result<Option<T>> {
    let deadline = Instant::now() + Duration::from_secs(timeout_secs);
    loop {
        if let Some(t) = found(ops.registry().get(&env.effect_key()).await?) {
            return Ok(Some(t));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The wall clock in nanoseconds: a de-duplication id per request, so two reports (or
/// resolutions) sent within one second are two messages, not one dropped as a duplicate by
/// the FIFO queue's five-minute de-duplication window.
fn request_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// The record of a session or environment id: the session's record, else the
/// environment's.
async fn record_of<O: Ops>(ops: &O, id: &str) -> anyhow::Result<Option<Record>> {
    if let Some(r) = ops.registry().find_by_session(&SessionId::new(id)).await? {
        return Ok(Some(r));
    }
    Ok(ops
        .registry()
        .get(&EnvironmentId::new(id).effect_key())
        .await?)
}

/// Checks a free-text value given on the command line: at most `max` characters, no
/// control character.
fn checked_text(what: &str, s: &str, max: usize) -> anyhow::Result<String> {
    anyhow::ensure!(
        !s.is_empty() && s.chars().count() <= max && !s.chars().any(char::is_control),
        "{what} must be 1 to {max} characters without control characters"
    );
    Ok(s.to_owned())
}

/// Runs `resolve`: enqueues a `resolve` job on the events queue (the session's FIFO group);
/// the worker closes the open reconciliation under the effect-key lock, recording who,
/// when and what, then rechecks (an idle stop follows the usual grace).
///
/// # Errors
/// A malformed id, effect, note or name, an id with no record, or a failed read or send.
pub async fn resolve<O: Ops>(
    ops: &O,
    args: &ResolveArgs,
    out: &mut impl Write,
) -> anyhow::Result<Verdict> {
    let id = checked_id("the session or environment id", &args.id)?;
    let effect = EffectState::parse_resolution(&args.effect).map_err(anyhow::Error::msg)?;
    let note = args
        .note
        .as_deref()
        .map(|n| checked_text("--note", n, 1_000))
        .transpose()?;
    let by = match &args.by {
        Some(b) => checked_text("--by", b, 128)?,
        None => std::env::var("USER")
            .ok()
            .and_then(|u| checked_text("USER", &u, 128).ok())
            .unwrap_or_else(|| "unknown".to_owned()),
    };
    let Some(record) = record_of(ops, id).await? else {
        anyhow::bail!("no record for {id:?} (tried as a session id and an environment id)");
    };
    confirm_target(ops, &args.backend, &args.guard, "resolve")?;
    let env = record.environment_id.clone();
    let open = record.open_evidence().count();
    let now = SystemClock.now();
    if open > 0 {
        let resolution = Resolution {
            effect,
            by: by.clone(),
            at: now,
            note: note.clone(),
        };
        enqueue(
            ops,
            QueueKind::Events,
            job(
                Trigger::Resolve { resolution },
                record.session_id.clone(),
                Some(env.clone()),
                now,
            ),
            format!("resolve:{env}:{}", request_nanos()),
        )
        .await?;
    }
    let mut problems = vec![];
    let mut resolved = None;
    if open > 0 && args.wait {
        resolved = poll_record(ops, &env, args.timeout_secs, |r| {
            r.filter(|r| r.open_evidence().next().is_none())
        })
        .await?;
        if resolved.is_none() {
            problems.push(format!(
                "the resolve job was not processed within {} s (is a worker running?)",
                args.timeout_secs
            ));
        }
    }
    if args.backend.json {
        write_json(
            out,
            "resolve",
            ops.backend(),
            json!({
                "environment_id": env,
                "session_id": record.session_id,
                "open": open,
                "effect": effect.as_str(),
                "by": by,
                "note": note,
                "enqueued": open > 0,
                "waited": args.wait && open > 0,
                "resolved": resolved.is_some(),
                "problems": problems,
            }),
        )?;
    } else if open == 0 {
        writeln!(out, "{env} has no open reconciliation: nothing enqueued")?;
    } else {
        writeln!(
            out,
            "resolve of {open} open reconciliation(s) of {env} as {} by {by} enqueued{}",
            effect.as_str(),
            if resolved.is_some() {
                "; recorded by the worker, the idle stop may proceed"
            } else {
                "; the worker records it under the lock, then rechecks"
            }
        )?;
        for p in &problems {
            writeln!(out, "problem: {p}")?;
        }
    }
    Ok(Verdict::of(&problems))
}

/// Arguments of `sandboxctl report-timeout`.
#[derive(Debug, clap::Args)]
pub struct ReportTimeoutArgs {
    /// The session the input was submitted to.
    pub session: String,
    /// The submission's turn id, if the application knows it.
    #[arg(long)]
    pub turn: Option<String>,
    /// When the input was submitted, Unix seconds (default: 300 s ago, the longest the
    /// API waits for an input-time connection): without `--turn`, the first turn created
    /// at or after this is the submission's.
    #[arg(long)]
    pub submitted_at: Option<u64>,
    /// Follow the report until the worker recorded the outcome (or the timeout).
    #[arg(long)]
    pub wait: bool,
    /// With `--wait`: give up after this many seconds (exit 1; the job stays queued).
    #[arg(long, default_value_t = 60)]
    pub timeout_secs: u64,
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// Runs `report-timeout`: enqueues the `timeout_reported` job an application can also put
/// on the events queue itself (`events/jobs/`); the worker reads the session, its turns and
/// the turn's items and records one of `still_running`, `completed` (with the tool
/// outcomes), `failed`, `not_found` on the environment's record. Nothing is resubmitted.
///
/// # Errors
/// A malformed id, a session with no record, or a failed read or send.
pub async fn report_timeout<O: Ops>(
    ops: &O,
    args: &ReportTimeoutArgs,
    out: &mut impl Write,
) -> anyhow::Result<Verdict> {
    let session = SessionId::new(checked_id("the session id", &args.session)?);
    let turn_id = args
        .turn
        .as_deref()
        .map(|t| checked_id("--turn", t).map(str::to_owned))
        .transpose()?;
    let now = SystemClock.now();
    let submitted_at = args.submitted_at.unwrap_or(now.saturating_sub(300));
    anyhow::ensure!(
        submitted_at <= now + 60,
        "--submitted-at {submitted_at} is in the future"
    );
    let Some(record) = ops.registry().find_by_session(&session).await? else {
        anyhow::bail!("no record for session {session}: this deployment never ran compute for it");
    };
    let env = record.environment_id.clone();
    let already = record.evidence.len();
    enqueue(
        ops,
        QueueKind::Events,
        job(
            Trigger::TimeoutReported {
                turn_id: turn_id.clone(),
                submitted_at,
            },
            session.clone(),
            Some(env.clone()),
            now,
        ),
        format!("timeout:{session}:{}", request_nanos()),
    )
    .await?;
    let mut problems = vec![];
    let mut outcome: Option<Evidence> = None;
    if args.wait {
        outcome = poll_record(ops, &env, args.timeout_secs, |r| {
            r?.evidence.into_iter().rev().find(|e| {
                e.trigger == EvidenceTrigger::InputTimedOut
                    && e.observed_at >= now
                    && (turn_id.is_none()
                        || e.turn.as_ref().map(|t| &t.id) == turn_id.as_ref()
                        || e.turn.is_none())
            })
        })
        .await?;
        // An identical earlier answer is not recorded twice: the same question.
        if outcome.is_none() {
            problems.push(format!(
                "no outcome recorded within {} s (is a worker running? an identical earlier report is not recorded again: {already} entry(ies) on the record)",
                args.timeout_secs
            ));
        }
    }
    if args.backend.json {
        write_json(
            out,
            "report-timeout",
            ops.backend(),
            json!({
                "session_id": session,
                "environment_id": env,
                "turn_id": turn_id,
                "submitted_at": stamp(submitted_at),
                "enqueued_at": stamp(now),
                "waited": args.wait,
                "outcome": outcome.as_ref().and_then(|e| e.submission.map(|s| s.as_str())),
                "evidence": outcome.as_ref().map(crate::evidence_view::entry_json),
                "problems": problems,
            }),
        )?;
    } else {
        match &outcome {
            Some(e) => {
                writeln!(
                    out,
                    "timed-out submission to {session}: {} (nothing resubmitted)",
                    e.submission.map_or("?", |s| s.as_str())
                )?;
                crate::evidence_view::write_text(out, std::slice::from_ref(e))?;
            }
            None => writeln!(
                out,
                "report of the timed-out submission to {session} enqueued; the worker records the outcome on {env}'s record (`sandboxctl explain {session}`)"
            )?,
        }
        for p in &problems {
            writeln!(out, "problem: {p}")?;
        }
    }
    Ok(Verdict::of(&problems))
}
