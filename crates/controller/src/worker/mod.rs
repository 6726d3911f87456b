//! The worker: process one job. Observe, decide, act under the effect-key lock, record
//! before release, audit.
//!
//! The job is [`Controller::process`] (the operator gate, [`crate::operator_gate`]), then
//! these steps in this order, each one method in its file:
//! 1. **Identify** (`observe.rs`, `identify`): a webhook job whose `webhook-id` is in the
//!    ledger is a duplicate: done, nothing written (one registry read). Then retrieve the
//!    session (404 = deleted; errors = unavailable evidence) and resolve the environment
//!    (event, session or record); a job whose environment is not its session's is refused.
//! 2. **Read without the lock** (`observe.rs`, `read_without_lock`): a fanned-out sweep job
//!    (carrying the sweep's evidence) first decides on a lock-free, consistent read of its
//!    record; when that decision has no effect — no effect, no recheck, nothing for the
//!    record — the job is done with nothing written (no lock, no audit entry; the
//!    `sweep_no_effect` counter), see [`Controller::no_effect_without_lock`].
//! 3. **Lock** (`lock.rs`, `take_lock`): otherwise, and for every other job, take the lock
//!    on `agents-api:environment:{id}:compute` (a lease with an expiry), which reads the
//!    record in the same call; busy when another worker holds it. Every path after this
//!    ends in one release (step 8).
//! 4. **Observe** (`observe.rs`, `observe`; `evidence.rs`): read the compute the record
//!    names by its id — one `describe` (ECS `DescribeTasks` on the ARN), whatever the size
//!    of the deployment; none when the record names no active compute; none for a sweep
//!    job whose evidence is current ([`crate::job::SweptEvidence`]); after an unclean
//!    predecessor (the lock is `recovered`) also the environment's own live instances
//!    ([`crate::ports::Compute::find`]), so what it started but never recorded is adopted
//!    — and, when they matter, the environment status and the latest turn. The deployment
//!    is never listed per job (docs/ARCHITECTURE.md principle 7).
//! 5. **Decide** (`decide.rs`): call [`sandbox_core::decide`] (again on the snapshot's
//!    state when a start would restore one not read yet); a start first takes an executor
//!    slot (`lock.rs`, `take_slot`), and at the cap becomes a `capacity_limit` wait.
//! 6. **Apply** (`apply.rs`; `act.rs` holds the record being changed, `workspace.rs` the
//!    files): keep the mapping record current, apply the effects in order; every write
//!    under the lock is fenced ([`crate::ports::Fence`]); the record is written before any
//!    further side effect and before the lock is released; a stop is read back before its
//!    receipt; a replayed start presents the same idempotency token (ECS answers `RunTask`
//!    with the same task for 24 h); the executor slot is given back once no compute may
//!    live (`lock.rs`, `give_back_slot`).
//! 7. **Schedule** (`record.rs`, `schedule`): say what to do with the message — done, or
//!    retry the same message later (missing evidence, a failed effect, a lost lock) — and
//!    send the recheck the decision asks for.
//! 8. **Record and release** (`record.rs`, `release`): one atomic release: record, audit
//!    entry, the webhook-id in the ledger, the lock deleted (or left expired when a start's
//!    outcome is unknown, so the next holder reads the inventory).
//!
//! Remote calls of a first start: ledger read, session read, lock (+ record), provider
//! start, release = 5; provider calls of any job: at most 2 on the happy path (a read by
//! id and a start, or a stop and its read-back), independent of the number of
//! environments (`crates/testkit/tests/call_budgets.rs`).

use crate::config::ControllerConfig;
use crate::job::Job;
use crate::ports::{Clock, Compute, PortError, Queue, Registry};
use sandbox_agents_api::SessionsApi;
use sandbox_core::decision::{Decision, Effect, Outcome};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

mod act;
mod apply;
mod decide;
mod evidence;
mod lock;
mod observe;
mod record;
mod workspace;

use act::{Act, session_of, stop_environment};
use lock::{Held, SlotTaken};
pub(crate) use observe::{Gathered, session_view};

/// The value of a step that lets the job go on ([`ControlFlow::Continue`]), or, returned
/// as the job's result, what the step ended it with ([`ControlFlow::Break`]).
macro_rules! proceed {
    ($step:expr) => {
        match $step {
            ControlFlow::Continue(value) => value,
            ControlFlow::Break(done) => return Ok(done),
        }
    };
}

/// The controller over its ports.
pub struct Controller<Q, R, C, S> {
    /// The events queue (FIFO): webhook jobs.
    pub events: Q,
    /// The timers queue (standard, delayed): lease rechecks and other rechecks.
    pub timers: Q,
    /// The sweep queue (standard, delayed): a fanned-out sweep's jobs
    /// ([`Controller::with_sweep_queue`]); `None`: they share the timers queue.
    pub(crate) sweep: Option<Q>,
    /// The registry.
    pub registry: R,
    /// The compute provider.
    pub compute: C,
    /// The Agents API.
    pub sessions: S,
    /// The clock.
    pub clock: Arc<dyn Clock>,
    /// Settings.
    pub config: ControllerConfig,
    nonce: AtomicU64,
}

/// What to do with the message that carried the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Processed: delete the message.
    Done,
    /// Not processed (missing evidence, busy lock, failed effect): make the same message
    /// visible again after this many seconds.
    RetryAfter(u32),
}

/// The result of processing one job.
#[derive(Clone, Debug, PartialEq)]
pub struct Processed {
    /// The decision, when one was taken.
    pub decision: Option<Decision>,
    /// Effects applied, in order.
    pub applied: Vec<Effect>,
    /// The effect that failed, if any.
    pub error: Option<String>,
    /// What to do with the message.
    pub disposition: Disposition,
    /// Why nothing was decided (duplicate, busy lock, no environment).
    pub note: Option<&'static str>,
}

impl Processed {
    pub(crate) fn skipped(note: &'static str, disposition: Disposition) -> Self {
        Self {
            decision: None,
            applied: vec![],
            error: None,
            disposition,
            note: Some(note),
        }
    }

    /// The decision's outcome, if a decision was taken.
    pub fn outcome(&self) -> Option<Outcome> {
        self.decision.as_ref().map(|d| d.outcome)
    }
}

fn capped_delay(secs: u64) -> u32 {
    secs.clamp(1, 900) as u32
}

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// A controller over its ports.
    pub fn new(
        events: Q,
        timers: Q,
        registry: R,
        compute: C,
        sessions: S,
        clock: Arc<dyn Clock>,
        config: ControllerConfig,
    ) -> Self {
        Self {
            events,
            timers,
            sweep: None,
            registry,
            compute,
            sessions,
            clock,
            config,
            nonce: AtomicU64::new(0),
        }
    }

    /// Processes one job. See the module docs for the flow.
    ///
    /// # Errors
    /// A [`PortError`] from the registry or queues that leaves the job unprocessed; the
    /// caller retries the message (nothing is lost).
    pub async fn process(&self, job: &Job) -> Result<Processed, PortError> {
        if let Some(refused) = self.refuse_unproven_operator_job(job).await? {
            return Ok(refused);
        }
        self.process_trusted(job).await
    }

    /// [`Controller::process`] without the operator gate
    /// ([`crate::operator_gate`]): for the in-process operator's own jobs
    /// ([`Controller::close`]), never for a queue's.
    ///
    /// # Errors
    /// As [`Controller::process`].
    pub(crate) async fn process_trusted(&self, job: &Job) -> Result<Processed, PortError> {
        let now = self.clock.now();
        // 1. Identify the environment, before any lock (observe.rs).
        let (env, session) = proceed!(self.identify(job, now).await?);
        // 2. A swept job's lock-free read: done here when it changes nothing (observe.rs).
        let prefetched = proceed!(self.read_without_lock(job, &env, &session, now).await?);
        // 3. Lock (lock.rs). Every path from here ends in one release (step 8); if this
        //    future is dropped (crash, timeout) the lock expires on its own and the next
        //    holder recovers.
        let held = proceed!(self.take_lock(&env, now).await?);
        let now = self.clock.now();
        // 4. Observe under the lock (observe.rs, evidence.rs).
        let locked = &held.locked;
        let (mut observed, gathered) = self
            .observe(job, &env, session, locked, prefetched, now)
            .await;
        // 5. Decide, taking an executor slot for a start (decide.rs, lock.rs).
        let (decision, slot) = self.decide(job, &mut observed, &held.fence).await;
        // 6. Apply: the mapping kept, the effects in order, the slot given back (act.rs,
        //    apply.rs, workspace.rs, lock.rs).
        let mut act = Act::new(job, held, &observed, slot, now);
        self.apply(job, &observed, &gathered, &decision, &mut act)
            .await;
        // 7. What to do with the message, and the recheck (record.rs).
        let scheduled = self.schedule(job, &observed, &decision, &act, now).await;
        // 8. Record and release, in one atomic write (record.rs).
        self.release(job, &observed, decision, act, scheduled, now)
            .await
    }
}
