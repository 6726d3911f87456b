//! How late a due recheck is handled while a sweep of N environments is in flight: the
//! sweep queue against the single-queue arrangement it replaced. What
//! `tests/sweep_queue.rs` asserts and what `make bench` prints (`sandbox-bench
//! recheck-delay`).
//!
//! The world ([`World`], twins, simulated time) holds N environments started through the
//! controller, each with a running executor and a turn in progress. Then:
//!
//! 1. the sweeper fans out one sweep ([`Controller::sweep_fan_out`]: N jobs, their delays
//!    spread over the sweep interval by [`sandbox_controller::sweep::fan_out_delay`]);
//! 2. every [`RECHECK_EVERY_SECS`] seconds of the interval one more environment goes idle
//!    (its `agent.session.idle` processed), which schedules its shutdown lease's recheck
//!    (`lease_due`) on the timers queue, due `shutdown_grace_secs` later;
//! 3. simulated time advances one second at a time; each second every event source
//!    mapping of the worker handles at most its `jobs_per_sec` messages of its own queue
//!    (`MaximumConcurrency` × jobs per invocation-second) through
//!    [`Controller::handle`], the real decision and the twins' SQS semantics. The timers
//!    twin delivers the visible messages oldest first, as a standard queue's best-effort
//!    order does under a backlog (SQS Developer Guide, "Amazon SQS standard queues").
//!
//! A recheck's delay is the simulated time from the moment its message became visible
//! (the lease's due time) to the second a worker handled it. [`Arrangement::SweepQueue`]
//! is the deployed one (the sweep's jobs on a queue and an event source mapping of their
//! own); [`Arrangement::OneQueue`] sends them to the timers queue, where they sit in front
//! of every recheck that falls due while the sweep's backlog lasts.

use crate::queue::TwinQueue;
use crate::world::{Port, TwinController, World};
use sandbox_controller::Job;
use sandbox_controller::ports::{Clock, Queue};
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::session::SessionStatus;
use std::collections::HashMap;

/// Seconds between two environments going idle during the sweep's interval.
pub const RECHECK_EVERY_SECS: u64 = 10;

/// Where a fanned-out sweep's jobs go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrangement {
    /// Their own queue and event source mapping (`SWEEP_QUEUE_URL`): deployed.
    SweepQueue,
    /// The timers queue, among the rechecks: the arrangement before the sweep queue.
    OneQueue,
}

/// The load of one measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecheckLoad {
    /// Environments in the deployment (one sweep job each).
    pub environments: usize,
    /// Messages one queue's event source mapping handles per simulated second.
    pub jobs_per_sec: usize,
    /// The sweep interval, seconds (the fan-out's window).
    pub sweep_interval_secs: u64,
    /// The shutdown lease's grace, seconds (a recheck is due this long after the idle).
    pub grace_secs: u64,
}

impl RecheckLoad {
    /// N environments; 25 jobs/s per queue (`MaximumConcurrency` 5, 200 ms per job: an
    /// Agents API read and a registry read); the default 300 s sweep interval; 60 s grace.
    pub fn at(environments: usize) -> Self {
        Self {
            environments,
            jobs_per_sec: 25,
            sweep_interval_secs: 300,
            grace_secs: 60,
        }
    }
}

/// What one measurement found (simulated seconds).
#[derive(Clone, Debug, PartialEq)]
pub struct RecheckDelay {
    /// The arrangement measured.
    pub arrangement: Arrangement,
    /// The load.
    pub load: RecheckLoad,
    /// Jobs the sweep sent.
    pub sweep_jobs: usize,
    /// Sweep jobs handled by the end (all of them).
    pub sweep_jobs_handled: usize,
    /// Each recheck's delay past its due time, seconds, in due order.
    pub delays_secs: Vec<u64>,
    /// Each recheck's decision, in due order: `stop` when its lease was due; `ignore` when
    /// the environment's sweep job got there first (its job decides under the same lock).
    pub recheck_outcomes: Vec<Option<String>>,
    /// Environments that went idle whose executor still runs at the end (target 0: every
    /// lease ended in a stop).
    pub idled_still_running: usize,
}

impl RecheckDelay {
    /// The `q`-quantile (0..=1) of the delays, nearest rank; 0 without rechecks.
    pub fn quantile(&self, q: f64) -> u64 {
        let mut d = self.delays_secs.clone();
        d.sort_unstable();
        if d.is_empty() {
            return 0;
        }
        let rank = ((q * d.len() as f64).ceil() as usize).clamp(1, d.len());
        d[rank - 1]
    }

    /// The largest delay.
    pub fn max(&self) -> u64 {
        self.delays_secs.iter().copied().max().unwrap_or(0)
    }
}

fn ids(i: usize) -> (SessionId, EnvironmentId) {
    (
        SessionId::new(format!("sess_rd_{i}")),
        EnvironmentId::new(format!("env_rd_{i}")),
    )
}

fn job(world: &World, trigger: Trigger, i: usize) -> Job {
    let (session, env) = ids(i);
    Job {
        handoffs: 0,
        swept: None,
        operator_proof: None,
        trigger,
        session_id: session,
        environment_id: Some(env),
        webhook_id: None,
        enqueued_at: world.clock.now(),
    }
}

/// Handles up to `budget` visible messages of `queue` through `c`, 10 per receive;
/// returns the messages handled and their decisions' outcomes by message id.
async fn drain(
    c: &TwinController,
    queue: &Port<TwinQueue>,
    budget: usize,
    handled: &mut HashMap<String, (u64, Option<String>)>,
    now_ms: u64,
) -> usize {
    let mut done = 0;
    while done < budget {
        let batch = queue
            .receive((budget - done).min(10), c.config.visibility_secs, 0)
            .await
            .unwrap_or_else(|e| panic!("receive: {e}"));
        if batch.is_empty() {
            break;
        }
        for msg in &batch {
            let p = c
                .handle(queue, msg)
                .await
                .unwrap_or_else(|e| panic!("job {}: {e}", msg.message_id));
            handled.insert(
                msg.message_id.clone(),
                (now_ms, p.outcome().map(|o| o.to_string())),
            );
        }
        done += batch.len();
    }
    done
}

/// Measures one arrangement under `load` (module docs). Deterministic: simulated time and
/// the twins only.
///
/// # Panics
/// When the setup's starts or a job's ports fail (the twins do not, without faults).
pub async fn measure_recheck_delay(load: RecheckLoad, arrangement: Arrangement) -> RecheckDelay {
    let world = World::new();
    let mut config = World::config("recheck-delay");
    config.settled_resweep_secs = 0;
    config.sweep_interval_secs = load.sweep_interval_secs;
    config.policy.shutdown_grace_secs = load.grace_secs;
    let c = match arrangement {
        Arrangement::SweepQueue => world.controller_with(config),
        Arrangement::OneQueue => world.controller_on_one_queue(config),
    };
    for i in 0..load.environments {
        let (session, env) = ids(i);
        world.sessions.add(&session, &env, SessionStatus::Idle);
        world.sessions.require_connection(&session);
        let p = c
            .process(&job(&world, Trigger::ConnectionRequested, i))
            .await
            .unwrap_or_else(|e| panic!("setup start {i}: {e}"));
        assert_eq!(
            p.outcome().map(|o| o.to_string()).as_deref(),
            Some("start"),
            "setup start {i}"
        );
        world.sessions.connect(&env, SessionStatus::InProgress);
    }
    // Every start queued its connect-deadline recheck in the same instant (an artifact of
    // building the world at once): they are handled before the measurement, so the timers
    // queue holds only what the measured interval puts there.
    world
        .clock
        .advance_secs(c.config.policy.connect_deadline_secs + 1);
    let mut setup = HashMap::new();
    while drain(&c, &c.timers, 1_000, &mut setup, 0).await > 0 {}
    assert!(world.timers.is_empty(), "setup rechecks left");
    let fanned = c
        .sweep_fan_out()
        .await
        .unwrap_or_else(|e| panic!("sweep: {e}"));
    let sweep_twin = match arrangement {
        Arrangement::SweepQueue => &world.sweep,
        Arrangement::OneQueue => &world.timers,
    };
    let sweep_ids: Vec<String> = sweep_twin
        .messages()
        .iter()
        .filter(|m| m.msg.job.trigger == Trigger::Sweep)
        .map(|m| m.message_id.clone())
        .collect();
    let start_ms = world.clock.now_ms();
    let idles = usize::try_from(load.sweep_interval_secs / RECHECK_EVERY_SECS)
        .unwrap_or(0)
        .min(load.environments);
    let mut due: Vec<(String, u64)> = Vec::new();
    let mut handled: HashMap<String, (u64, Option<String>)> = HashMap::new();
    let mut next_idle = 0usize;
    // Until every recheck and every sweep job is handled (or a day passes: a bug).
    for _second in 0..86_400u64 {
        let now_ms = world.clock.now_ms();
        while next_idle < idles
            && now_ms >= start_ms + next_idle as u64 * RECHECK_EVERY_SECS * 1_000
        {
            // The environment goes idle with its executor connected: a shutdown lease and
            // its recheck on the timers queue.
            let (session, _) = ids(next_idle);
            world.sessions.set_status(&session, SessionStatus::Idle);
            let before: Vec<String> = world
                .timers
                .messages()
                .iter()
                .map(|m| m.message_id.clone())
                .collect();
            let p = c
                .process(&job(&world, Trigger::Idle, next_idle))
                .await
                .unwrap_or_else(|e| panic!("idle {next_idle}: {e}"));
            assert_eq!(
                p.outcome().map(|o| o.to_string()).as_deref(),
                Some("schedule-stop"),
                "idle {next_idle}: {p:?}"
            );
            for m in world.timers.messages() {
                if !before.contains(&m.message_id)
                    && matches!(m.msg.job.trigger, Trigger::LeaseDue { .. })
                {
                    due.push((m.message_id.clone(), m.visible_at_ms));
                }
            }
            next_idle += 1;
        }
        drain(&c, &c.timers, load.jobs_per_sec, &mut handled, now_ms).await;
        if arrangement == Arrangement::SweepQueue {
            drain(&c, c.sweep_queue(), load.jobs_per_sec, &mut handled, now_ms).await;
        }
        let rechecks_done =
            next_idle == idles && due.iter().all(|(id, _)| handled.contains_key(id));
        let sweep_done = sweep_ids.iter().all(|id| handled.contains_key(id));
        if rechecks_done && sweep_done {
            break;
        }
        world.clock.advance_secs(1);
    }
    let delays_secs = due
        .iter()
        .map(|(id, due_ms)| {
            let (at, _) = handled
                .get(id)
                .unwrap_or_else(|| panic!("recheck {id} never handled"));
            at.saturating_sub(*due_ms).div_ceil(1_000)
        })
        .collect();
    let idled_still_running = (0..idles)
        .filter(|&i| !world.compute.live_of(&ids(i).1).is_empty())
        .count();
    let recheck_outcomes = due
        .iter()
        .map(|(id, _)| handled.get(id).and_then(|(_, o)| o.clone()))
        .collect();
    RecheckDelay {
        arrangement,
        load,
        sweep_jobs: fanned.enqueued,
        sweep_jobs_handled: sweep_ids
            .iter()
            .filter(|id| handled.contains_key(*id))
            .count(),
        delays_secs,
        recheck_outcomes,
        idled_still_running,
    }
}
