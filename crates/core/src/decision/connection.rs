//! Connection: a current `environment_connection` requirement ensures exactly one compute
//! (step 9 of [`super::decide`]): start, wait, reuse or replace.
//!
//! Lifecycle rows decided here (`shared/reference/lifecycle-cases.md`):
//! - row 1: connection required, no record, no compute: start one;
//! - row 2: the same requirement delivered many times: one compute (the idempotency
//!   token and the effect-key lock do the rest);
//! - row 9: a compute is provisioning or pending: wait, no second compute;
//! - row 10: running past the connect deadline (counted from the later of its start and
//!   the request it answers), environment read not connected: replace N by N+1 — only on
//!   evidence that it is not connected (row 22), and within the replacement cap
//!   ([`super::ceilings`]);
//! - row 11: the record says running, the provider says gone: start N+1 from the latest
//!   workspace snapshot;
//! - row 16: a pending shutdown lease is cancelled by the new requirement;
//! - a start waits for the snapshot it restores to be `completed`
//!   ([`super::snapshots`]);
//! - row 28: failed starts (`RunTask` failures, or a task that stopped with
//!   `TaskFailedToStart`) are counted and backed off; past the attempt limit nothing
//!   starts until the cooldown ends or an operator resets them;
//! - never connected: a generation that ran and stopped without its environment being
//!   seen `connected` since it started (a rejected executor key, an image without
//!   `codex`, a forwarder that exits) is a failed start too, counted and backed off the
//!   same way; past the limit the environment is held (`executor_never_connects`) until an
//!   owner resolves it — no cooldown resumes it. Only on evidence: the environment's
//!   status must have been read, not `connected`, at the look that finds the generation
//!   stopped (docs/ARCHITECTURE.md principle 5: missing evidence changes nothing). A
//!   generation that did connect and then died is restarted as a gone compute (row 11).

use super::View;
use crate::compute::{ComputeInstance, ComputeStatus, ESSENTIAL_CONTAINER_EXITED, InstanceRef};
use crate::environment::EnvironmentStatus;
use crate::ids::idempotency_token;
use crate::outcome::{Decision, Effect, Outcome, StartSpec, StopReason, StopSpec};
use crate::reason::Reason;
use crate::record::{Record, StartFailure, StartFailureKind};
use crate::session::Session;

impl View<'_> {
    /// Rows 1, 9, 10, 11, 16, 28: the session requires `environment_connection` now.
    /// The first observation of the requirement is noted on the record (the connect
    /// deadline counts from it); the note goes last, so a start is not preceded by a write.
    pub(super) fn ensure_compute(
        &self,
        session: &Session,
        current: Option<&ComputeInstance>,
    ) -> Decision {
        let requested_at = self.record.and_then(|r| r.connection_requested_at);
        let note = requested_at
            .is_none()
            .then_some(Effect::NoteConnectionRequest { at: self.o.now });
        self.ensure_compute_since(session, current, requested_at.unwrap_or(self.o.now))
            .with(note)
    }

    fn ensure_compute_since(
        &self,
        session: &Session,
        current: Option<&ComputeInstance>,
        requested_at: u64,
    ) -> Decision {
        let policy = &self.o.policy;
        let now = self.o.now;
        let cancel: Vec<Effect> = self.drop_lease().into_iter().collect();
        let cancelled = !cancel.is_empty();
        // The named outcome when no resource is touched: a cancelled lease is the news.
        let quiet = |outcome: Outcome, reason: Reason| {
            if cancelled {
                Decision::new(Outcome::CancelStop, Reason::NewWork).with(cancel.clone())
            } else {
                Decision::new(outcome, reason)
            }
        };
        let Some(c) = current else {
            if self.stopping {
                return quiet(Outcome::Wait, Reason::ComputeStopping).recheck(policy.recheck_secs);
            }
            if !self.may_start {
                return Decision::ignore(Reason::NotOwned).with(cancel);
            }
            let mut effects = cancel;
            let failure = self.failed_start(&mut effects);
            if let Some(f) = &failure {
                if f.attempts >= policy.max_start_attempts
                    && f.kind == StartFailureKind::NeverConnected
                {
                    // Held for an owner: no cooldown resumes an executor that cannot
                    // register; `sandboxctl resolve` (or a reset) releases it.
                    return Decision::new(
                        Outcome::Reconcile,
                        Reason::ExecutorNeverConnects {
                            attempts: f.attempts,
                            last_exit: f.reason.clone(),
                        },
                    )
                    .with(effects);
                }
                if f.attempts >= policy.max_start_attempts {
                    let resume_at = f
                        .last_failed_at
                        .saturating_add(policy.start_failing_cooldown_secs);
                    if now < resume_at {
                        return Decision::new(
                            Outcome::Reconcile,
                            Reason::StartFailing {
                                attempts: f.attempts,
                                last_reason: f.reason.clone(),
                            },
                        )
                        .with(effects)
                        .recheck(resume_at - now);
                    }
                } else {
                    let retry_at = f
                        .last_failed_at
                        .saturating_add(policy.start_backoff_secs(f.attempts));
                    if now < retry_at {
                        return Decision::new(
                            Outcome::Wait,
                            Reason::StartBackoff {
                                attempts: f.attempts,
                            },
                        )
                        .with(effects)
                        .recheck(retry_at - now);
                    }
                }
            }
            if let Some(d) = self.replacement_cap_holds() {
                return d.with(effects);
            }
            // Never restore a snapshot that is not `completed` (`snapshots.rs`).
            if let Some(d) = self.snapshot_not_restorable(failure.as_ref(), &effects) {
                return d;
            }
            let previous = self
                .record
                .filter(|r| r.claims_compute())
                .and_then(Record::current)
                .cloned();
            let reason = match &previous {
                Some(p) => Reason::ComputeGone {
                    previous: p.generation,
                },
                None => Reason::ConnectionRequired,
            };
            return Decision::new(Outcome::Start, reason)
                .with(effects)
                .with([Effect::StartCompute(self.start_spec(session, previous))])
                .recheck(policy.recheck_secs);
        };
        if c.status.is_starting() {
            let reason = match (self.unseen, self.awaiting_visibility()) {
                (Some(id), Some(d)) if *id == c.instance_id => d.reason,
                _ => Reason::ComputeStarting,
            };
            return quiet(Outcome::Wait, reason).recheck(policy.recheck_secs);
        }
        if self.o.environment_status.is_connected() {
            return quiet(Outcome::Reuse, Reason::ExecutorConnected);
        }
        // The deadline runs from the latest of the compute's start, the connection request
        // it answers and, for a claimed pool member, its claim (`connect_clock.rs`).
        let since = super::connect_clock::connect_clock_start(self.record, c, requested_at, now);
        let running_secs = now.saturating_sub(since);
        if running_secs <= policy.connect_deadline_secs {
            let left = policy.connect_deadline_secs - running_secs + 1;
            return quiet(Outcome::Wait, Reason::ExecutorConnecting).recheck(left);
        }
        // Replace only on evidence that the executor is not connected (row 22).
        if self.o.environment_status.status().is_none() {
            return quiet(Outcome::Uncertain, Reason::EnvironmentStatusUnavailable)
                .recheck(policy.uncertain_retry_secs);
        }
        if !self.may_start {
            return quiet(Outcome::Reuse, Reason::NotOwned);
        }
        if let Some(d) = self.replacement_cap_at_replace(c) {
            return d.with(cancel);
        }
        let stop = Effect::StopCompute(StopSpec {
            target: c.as_ref(),
            reason: StopReason::Replaced,
        });
        // Another compute still on its way down: stop this one now, start once all are gone.
        let start = (!self.stopping)
            .then(|| Effect::StartCompute(self.start_spec(session, Some(c.as_ref()))));
        Decision::new(
            Outcome::Replace,
            Reason::ConnectDeadlinePassed { running_secs },
        )
        .with(cancel)
        .with([stop])
        .with(start)
        .with([self.record_replacement()])
        .recheck(policy.recheck_secs)
    }

    /// The record's failed starts, counting the recorded compute if the provider read it
    /// stopped before it ever ran ([`crate::compute::TASK_FAILED_TO_START`]: a failed start
    /// like a `RunTask` answered with `failures`, row 28) or stopped without ever being
    /// seen connected ([`View::never_connected`]); pushes the effect that records it, with
    /// what the compute died of ([`crate::compute::ExitDetail`]).
    fn failed_start(&self, effects: &mut Vec<Effect>) -> Option<StartFailure> {
        let previous = self.record.and_then(|r| r.start_failure.clone());
        let Some(task) = self
            .recorded_seen
            .filter(|_| self.record.is_some_and(Record::claims_compute))
        else {
            return previous;
        };
        let (kind, what) = if task.failed_to_start() {
            (StartFailureKind::Start, "stopped before it ran")
        } else if self.never_connected(task) {
            (
                StartFailureKind::NeverConnected,
                "stopped without ever connecting",
            )
        } else {
            return previous;
        };
        let mut died_of: Vec<String> = task.stop_code.iter().cloned().collect();
        died_of.extend(task.exit.as_ref().map(crate::compute::ExitDetail::summary));
        let failure = StartFailure {
            attempts: previous.map_or(1, |f| f.attempts.saturating_add(1)),
            last_failed_at: self.o.now,
            reason: format!(
                "task {} (generation {}) {what}: {}",
                task.instance_id,
                task.generation,
                died_of.join("; ")
            ),
            kind,
        };
        effects.push(Effect::RecordStartFailure(failure.clone()));
        Some(failure)
    }

    /// Whether the recorded generation `task` stopped without its environment ever being
    /// seen `connected` since it started: the provider reads it stopped by itself (no
    /// `stopCode`, or ECS `EssentialContainerExited`; a stop by a user, the scheduler or
    /// a Spot interruption is not the executor's failure), the record never saw it
    /// connected ([`Record::instance_connected_at`]), and the environment's status was
    /// read at this look and is not `connected` (a status that is `connected` when the
    /// generation is found stopped counts as connected; an unread or unavailable status
    /// is missing evidence and never counts).
    pub(super) fn never_connected(&self, task: &ComputeInstance) -> bool {
        let stopped_by_itself = task.status == ComputeStatus::Stopped
            && task
                .stop_code
                .as_deref()
                .is_none_or(|c| c == ESSENTIAL_CONTAINER_EXITED);
        let never_seen = self.record.is_some_and(|r| {
            r.instance_connected_at.is_none() && r.current() == Some(&task.as_ref())
        });
        let read_not_connected = self
            .o
            .environment_status
            .status()
            .is_some_and(|s| s != EnvironmentStatus::Connected);
        stopped_by_itself && never_seen && read_not_connected
    }

    fn start_spec(&self, session: &Session, previous: Option<InstanceRef>) -> StartSpec {
        let env = session
            .self_hosted()
            .expect("decide() only ensures compute for self-hosted sessions");
        let generation = self.max_generation.next();
        StartSpec {
            environment_id: self.o.environment_id.clone(),
            session_id: session.id.clone(),
            remote_url: env.remote_url.clone(),
            workspace_directory: env.workspace_directory.clone(),
            generation,
            idempotency_token: idempotency_token(&self.o.environment_id, generation),
            previous,
            restore: self.record.and_then(Record::latest_snapshot).cloned(),
        }
    }
}
