//! `sandboxctl dlq list` and `sandboxctl dlq redrive`: the dead-letter queues of the
//! events, timers and sweep queues.
//!
//! `list` shows each dead-lettered job (trigger, session, environment, hand-offs, receive
//! count, when) and leaves it in place (on SQS a peek is a receive; see
//! `sandbox_aws::sqs_dead_letters`). It exits 1 when a listed queue is not empty.
//! `redrive` sends the jobs back to their queue with the hand-off count reset and removes
//! them from the dead-letter queue; a body that is not a job stays there and is named. A
//! redriven job is a hint like any other: the worker decides from current state.

use crate::backend::{BackendArgs, Ops, QueueKind};
use crate::report::{Verdict, write_json};
use crate::timestamps::stamp_opt;
use sandbox_controller::ports::Registry as _;
use serde_json::json;
use std::io::Write;

/// `sandboxctl dlq ...`.
#[derive(Debug, clap::Subcommand)]
pub enum DlqCommand {
    /// List dead-lettered jobs (left in place).
    List(DlqArgs),
    /// Send dead-lettered jobs back to their queue (hand-off count reset).
    Redrive(DlqArgs),
}

/// Arguments of `dlq list` / `dlq redrive`.
#[derive(Debug, clap::Args)]
pub struct DlqArgs {
    /// Which queue's dead-letter queue (default: both).
    #[arg(long, value_enum)]
    pub queue: Option<QueueKind>,
    /// At most this many messages per queue.
    #[arg(long, default_value_t = 100)]
    pub max: usize,
    /// `redrive`: `--force` also sends back jobs whose session no record names, `--yes`
    /// skips the confirmation (required off a terminal).
    #[command(flatten)]
    pub guard: crate::operator_jobs::GuardArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
}

impl DlqCommand {
    /// The backend arguments.
    pub fn backend(&self) -> &BackendArgs {
        match self {
            Self::List(a) | Self::Redrive(a) => &a.backend,
        }
    }
}

fn queues(args: &DlqArgs) -> Vec<QueueKind> {
    args.queue
        .map_or_else(|| QueueKind::ALL.to_vec(), |q| vec![q])
}

/// Runs `dlq list` or `dlq redrive`.
///
/// # Errors
/// `--max 0` (usage) or a failed queue call (access).
pub async fn run<O: Ops>(
    ops: &O,
    cmd: &DlqCommand,
    out: &mut impl Write,
) -> anyhow::Result<Verdict> {
    let (DlqCommand::List(args) | DlqCommand::Redrive(args)) = cmd;
    anyhow::ensure!(args.max >= 1, "--max must be at least 1");
    let mut problems = vec![];
    let mut body = serde_json::Map::new();
    match cmd {
        DlqCommand::List(_) => {
            for q in queues(args) {
                let letters = ops.dead_letters(q, args.max).await?;
                if !letters.is_empty() {
                    problems.push(format!(
                        "{} message(s) in the {} dead-letter queue",
                        letters.len(),
                        q.name()
                    ));
                }
                if !args.backend.json {
                    writeln!(
                        out,
                        "{} dead-letter queue: {} message(s)",
                        q.name(),
                        letters.len()
                    )?;
                    for d in &letters {
                        let job = d.job.as_ref();
                        writeln!(
                            out,
                            "  {} {} session {} environment {} handoffs {} receives {}{}",
                            d.message_id,
                            job.map_or("(not a job)".into(), |j| serde_json::to_value(&j.trigger)
                                .ok()
                                .and_then(|v| v["kind"].as_str().map(str::to_owned))
                                .unwrap_or_default()),
                            job.map_or("-", |j| j.session_id.as_str()),
                            job.and_then(|j| j.environment_id.as_ref())
                                .map_or("-", |e| e.as_str()),
                            job.map_or(0, |j| j.handoffs),
                            d.receive_count,
                            d.at.map(|t| format!(" since {}", crate::timestamps::utc(t)))
                                .unwrap_or_default(),
                        )?;
                    }
                }
                body.insert(
                    q.name().into(),
                    json!(
                        letters
                            .iter()
                            .map(|d| json!({
                                "message_id": d.message_id,
                                "job": d.job,
                                "receive_count": d.receive_count,
                                "at": stamp_opt(d.at),
                                "reason": d.reason,
                            }))
                            .collect::<Vec<_>>()
                    ),
                );
            }
            if args.backend.json {
                write_json(
                    out,
                    "dlq list",
                    ops.backend(),
                    json!({"queues": body, "problems": problems}),
                )?;
            }
        }
        DlqCommand::Redrive(_) => {
            // A job whose session no record names is refused without --force
            // (it would act on a session this deployment never handled).
            if !args.guard.force {
                let mut unknown = vec![];
                for q in queues(args) {
                    for letter in ops.dead_letters(q, args.max).await? {
                        if let Some(job) = letter.job
                            && ops
                                .registry()
                                .find_by_session(&job.session_id)
                                .await?
                                .is_none()
                        {
                            unknown.push(job.session_id.to_string());
                        }
                    }
                }
                unknown.sort();
                unknown.dedup();
                anyhow::ensure!(
                    unknown.is_empty(),
                    "dlq redrive: no record names session(s) {}; nothing was moved (pass --force to send them back anyway)",
                    unknown.join(", ")
                );
            }
            crate::operator_jobs::confirm_target(ops, &args.backend, &args.guard, "dlq redrive")?;
            for q in queues(args) {
                let (moved, left) = ops.redrive(q, args.max).await?;
                if !left.is_empty() {
                    problems.push(format!(
                        "{} message(s) in the {} dead-letter queue are not jobs and stay there",
                        left.len(),
                        q.name()
                    ));
                }
                if !args.backend.json {
                    writeln!(out, "{}: {moved} job(s) sent back to the queue", q.name())?;
                    for id in &left {
                        writeln!(out, "  left in the dead-letter queue (not a job): {id}")?;
                    }
                }
                body.insert(q.name().into(), json!({"moved": moved, "left": left}));
            }
            if args.backend.json {
                write_json(
                    out,
                    "dlq redrive",
                    ops.backend(),
                    json!({"queues": body, "problems": problems}),
                )?;
            }
        }
    }
    Ok(Verdict::of(&problems))
}
