//! One deterministic simulated schedule: N workers, the sweeper and an operator close,
//! interleaved at every port call by a seeded [`Scheduler`] over [`Interleaved`] twins,
//! with crashes at every side-effect boundary, lost and duplicated webhook deliveries,
//! executors dying on their own, and simulated time.
//!
//! A schedule has two phases. **Chaos** (`chaos_steps` steps): each step, chosen from the
//! seed, polls one actor (one port call), spawns a worker step (events, timers or sweep queue),
//! a sweep or an operator close, changes the world (a session requires a connection, the
//! executor connects, the turn ends, the session fails or is deleted, the executor dies),
//! crashes a running actor (drops its future at its current yield: right after its last
//! port call — after lock, after compute start, after record, before ack ...), or
//! advances the clock (sometimes past the lock lease and the visibility timeout).
//! **Settle**: no more crashes or world changes; workers drain both queues and the
//! sweeper runs every 300 simulated seconds, for `settle_secs`.
//!
//! The compute twin behaves like Amazon ECS ([`SimConfig::aws`], [`AwsLike::ecs`] by
//! default): a new task is `MISSING` and unlisted for up to 5 s, stopped tasks are
//! forgotten an hour after they stopped, some starts stay `PROVISIONING` and end
//! `TaskFailedToStart`, `clientToken` replays for 24 h. Sweeps run in place
//! ([`Controller::sweep`]) or fanned out to the sweep queue
//! ([`Controller::sweep_fan_out`]), chosen from the seed, so the sweep's jobs are
//! interleaved and crashed like any other.
//!
//! Checked after every step (every poll, clock advance, world change and crash), against
//! the twin's ground truth: never two active (provisioning, pending, running) computes for
//! one environment. Checked at every stop: every stop
//! targets exactly what a decision could have named (a lease's stop hits the lease's
//! instance and generation; a replacement never stops a generation newer than the
//! record's; an orphan stop only without a record; a release only for a deleted, failed
//! or closing session). Checked after the settle: no live compute without a record that
//! names it; nothing lost (a session that still requires a connection has exactly one
//! active compute; deleted, failed, closed and idle sessions have none).
//!
//! Snapshots take time ([`SimConfig::snapshots`]: `pending` for minutes by
//! default). Checked after every step: no start restored from a snapshot that is not
//! `completed` (the twin refuses it, [`ComputeEvent::RestoreRefused`]), and no working
//! copy with snapshots was deleted before one of them was `completed` and named by its
//! environment's record ([`ComputeEvent::VolumeDeleted`]; a discard, and a closed or
//! missing record, delete on purpose).
//!
//! **The warm pool** (docs/WARM_POOL.md): [`SimConfig::pool_percent`] of the
//! schedules, chosen from the seed by a generator of their own (the other schedules are
//! exactly those of their seed before the pool), run with the pool on — 1 to 3 members,
//! a maximum age of 2 to 10 simulated minutes so that members age out during the
//! schedule, half of them with the executor cap on (`policy.max_executors`: the
//! environments plus 0 to 2). A refill actor ([`Controller::refill_pool`]) is spawned
//! among the worker steps, interleaved at every port call and crashed like any other
//! (its deadline is the worker's: on AWS the refill is a worker job); in the settle it
//! runs with every sweep, and once more at the end. Its host's clock runs up to 2 s ahead
//! of the workers' ([`SimConfig::refill_clock_ahead_ms`]), so it recycles members at
//! their maximum age that a worker may still claim. The twin's members take 30–60 s to
//! run ([`PoolTiming`]; a claim of one still provisioning is allowed), some recycles stop
//! short of their `StopTask` (the member runs on, recycled, until a refill reconciles
//! it), and the world kills idle members as well as claimed ones (a claimed member is an
//! ordinary compute of its environment, replaced like any).
//!
//! Checked after every step, against the twin's ground truth
//! ([`TwinCompute::pool_members`]): a member is claimed by at most one environment, ever,
//! and never returns to the pool; a recycled member is never claimed and a claimed one
//! never recycled (every `pool_max_age` stop hits an unclaimed member its recycle's
//! guard took); with the cap on, the idle members stay within the cap minus the slots in
//! use when the refill that started the newest of them read the counter (slots in use
//! plus idle members may exceed the cap until the next refill trims them:
//! [`SimConfig::cap_slack`]). Checked after the settle: at most the pool's size in idle
//! members, none past its maximum age, no recycled member still running, slots in use plus
//! idle members within the cap; claimed members
//! fall under "no live compute without a record that names it" (they are instances of
//! their environment), idle ones do not (they belong to the pool).
//!
//! **Executors that never connect**: [`SimConfig::broken_percent`] of the environments,
//! chosen from the seed by a generator of their own, have executors that exit as soon as
//! they run (a rejected executor key, an image without `codex`): the world never connects
//! them, and the twin reports them `STOPPED`, `EssentialContainerExited`, with the exit.
//! Other environments' executors still die after connecting (the world's kills). Checked
//! at every start: such an environment gets at most [`broken_start_bound`] starts in any
//! hour (each stop without connecting is a failed start; past the limit it is held).

use crate::clock::SimClock;
use crate::compute::{
    AwsLike, ComputeEvent, ComputeTiming, MemberState, PoolTiming, SnapshotTiming, TwinCompute,
};
use crate::interleave::{Interleaved, Scheduler};
use crate::queue::TwinQueue;
use crate::registry::TwinRegistry;
use crate::rng::SimRng;
use crate::sessions::TwinSessions;
use crate::world::{MAX_RECEIVE_COUNT, World};
use sandbox_controller::Controller;
use sandbox_controller::config::PoolSettings;
use sandbox_controller::pool::RECYCLE_REASON;
use sandbox_controller::ports::{Clock, Outgoing, Queue};
use sandbox_core::compute::ComputeStatus;
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::record::RecordStatus;
use sandbox_core::session::SessionStatus;
use std::future::poll_fn;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

/// A controller over the interleaved twins.
pub type SimController = Controller<
    Interleaved<TwinQueue>,
    Interleaved<TwinRegistry>,
    Interleaved<TwinCompute>,
    Interleaved<TwinSessions>,
>;

/// The shape of the schedules.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Steps of the chaos phase.
    pub chaos_steps: usize,
    /// Simulated seconds of the settle phase.
    pub settle_secs: u64,
    /// Percent chance that a webhook delivery is lost.
    pub lose_percent: u64,
    /// Percent chance that a delivery is duplicated (same webhook-id; same or another
    /// queue dedup id).
    pub duplicate_percent: u64,
    /// Relative weight of "crash a running actor" among the step choices.
    pub crash_weight: u64,
    /// The ECS behaviours of the compute twin ([`AwsLike`]); its `seed` is replaced by one
    /// derived from the schedule's seed. Default: [`AwsLike::ecs`] (visibility lag up to
    /// 5 s, stopped tasks forgotten after an hour, 5 % of starts stuck `PROVISIONING` for
    /// up to 30 min then `TaskFailedToStart`, the 24-hour `clientToken` window).
    pub aws: AwsLike,
    /// Percent of sweeps run as [`Controller::sweep_fan_out`] (jobs to the sweep queue,
    /// decided by the workers) rather than [`Controller::sweep`] (in place).
    pub fan_out_percent: u64,
    /// The Lambda timeouts: a worker step dies
    /// [`Deadlines::worker_secs`] after it began and a sweep [`Deadlines::sweeper_secs`]
    /// after, at that instant, like a crash (Lambda ends an invocation at its timeout
    /// wherever it stands). `None`: actors never time out. Default: the templates' 150 s
    /// and 300 s (infra/sam/template.yaml).
    pub deadlines: Option<Deadlines>,
    /// How workspace snapshots take time. Default: `pending` for 120 s, never
    /// `error`.
    pub snapshots: SnapshotTiming,
    /// Percent of schedules run with the warm pool on (see the module doc).
    /// Default: 30.
    pub pool_percent: u64,
    /// How pool members behave on the twin in those schedules (during the chaos; the
    /// settle sends every recycle's stop). Default: 30–60 s to `RUNNING`, as a Fargate
    /// task; 10 % of recycles stop short of their `StopTask`.
    pub pool_timing: PoolTiming,
    /// With the cap on, how far slots in use plus idle members may exceed the cap after
    /// any step; `None`: not checked (the overshoot is measured,
    /// [`PoolReport::max_over_cap`]). Idle members hold no slot, so a start that takes a
    /// slot without taking a member adds one until the next refill: a miss while the
    /// refill is still starting members, members past their age, or a replay-only start
    /// after a crashed worker (rule 4). The overshoot reaches the pool's size: `Some(1)`
    /// fails on seed 17218092366221545609 (cap 2) and `Some(2)` on seed
    /// 9587870824524365567 (cap 3). The next refill recycles the excess
    /// (`sandbox_controller::pool::plan_refill`, found by these seeds). What always holds,
    /// and is checked: the idle members never exceed the cap minus the slots in use when
    /// the refill that started the newest of them read the counter.
    pub cap_slack: Option<u64>,
    /// How far ahead of the workers' clock the refill's may run, milliseconds (each pool
    /// schedule draws its own in `0..=` this; [`crate::clock::SkewedClock`]): at a
    /// member's maximum age the refill recycles it while a worker may still claim it, the
    /// race the recycle's guard is for. Default: 2,000.
    pub refill_clock_ahead_ms: u64,
    /// Percent of environments whose executors never connect: each exits as soon as it
    /// runs (a rejected executor key, an image without `codex`, a forwarder that exits),
    /// chosen from the seed by a generator of its own (the other environments are those
    /// of their seed before). Default: 20. Checked after every step: such an environment
    /// gets at most [`broken_start_bound`] starts in any hour.
    pub broken_percent: u64,
}

/// The most starts an environment whose executors never connect may get in any hour:
/// `max_start_attempts` (each stop without connecting is a failed start; past the limit
/// the environment is held with `executor_never_connects` until an owner resolves it),
/// plus `max_replacements` (an executor still running at its connect deadline is replaced,
/// not counted as a failed start), plus one attempt resumed after the cooldown of a
/// `TaskFailedToStart` cap (docs/ARCHITECTURE.md; crates/core/src/decision/connection.rs).
pub fn broken_start_bound(p: &sandbox_core::observed::Policy) -> usize {
    p.max_start_attempts as usize + p.max_replacements as usize + 1
}

/// How long an invocation may run in the simulation, simulated seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// The worker function's timeout (the templates: 150 s).
    pub worker_secs: u64,
    /// The sweeper function's timeout (the templates: 300 s).
    pub sweeper_secs: u64,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            worker_secs: 150,
            sweeper_secs: 300,
        }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            chaos_steps: 250,
            settle_secs: 2_400,
            lose_percent: 15,
            duplicate_percent: 25,
            crash_weight: 4,
            aws: AwsLike::ecs(0),
            fan_out_percent: 50,
            deadlines: Some(Deadlines::default()),
            snapshots: SnapshotTiming {
                pending_secs: 120,
                error_per_mille: 0,
            },
            pool_percent: 30,
            pool_timing: PoolTiming {
                start_secs_min: 30,
                start_secs_max: 60,
                recycle_stop_fail_per_mille: 100,
            },
            cap_slack: None,
            refill_clock_ahead_ms: 2_000,
            broken_percent: 20,
        }
    }
}

/// What one schedule did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScheduleReport {
    /// The seed.
    pub seed: u64,
    /// Environments (one session each).
    pub environments: usize,
    /// Worker controllers.
    pub workers: usize,
    /// Actors crashed.
    pub crashes: usize,
    /// Deliveries lost.
    pub lost: usize,
    /// Deliveries duplicated.
    pub duplicated: usize,
    /// Computes created.
    pub starts: usize,
    /// Stop requests.
    pub stops: usize,
    /// Messages dead-lettered during the chaos (redriven at the settle, as an operator
    /// would after the DLQ alarm).
    pub dead_letters: usize,
    /// Simulated seconds elapsed.
    pub sim_secs: u64,
    /// Messages still queued (both queues) at the end: pending rechecks.
    pub queued_at_end: usize,
    /// Scheduler polls (port calls) in the whole schedule.
    pub polls: u64,
    /// Sweeps run fanned out (jobs through the sweep queue).
    pub fan_out_sweeps: usize,
    /// Actors killed at their invocation's deadline ([`SimConfig::deadlines`]).
    pub deadline_kills: usize,
    /// Workspace volumes deleted (each checked).
    pub volumes_deleted: usize,
    /// What the ECS-like compute twin did: reads answered `MISSING` because the task was
    /// new or forgotten, token replays, starts that ended `TaskFailedToStart`.
    pub ecs: crate::compute::EcsAnswers,
    /// What the warm pool did (all zero when it was off).
    pub pool: PoolReport,
    /// Environments whose executors never connect.
    pub broken_environments: usize,
    /// Computes started for them (each checked against [`broken_start_bound`]).
    pub broken_starts: usize,
    /// The most starts one of them got within an hour.
    pub broken_max_in_hour: usize,
}

/// What the warm pool did in a schedule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolReport {
    /// The pool was on.
    pub on: bool,
    /// The executor cap was on too.
    pub capped: bool,
    /// Refills spawned.
    pub refills: usize,
    /// Members started.
    pub started: usize,
    /// Members claimed (each by one environment).
    pub claims: usize,
    /// Members a recycle's guard took.
    pub recycles: usize,
    /// Idle members killed by the world.
    pub idle_killed: usize,
    /// Claimed members killed by the world.
    pub claimed_killed: usize,
    /// With the cap on: the largest (slots in use + idle members) − cap after a step.
    pub max_over_cap: u64,
}

/// An invariant that did not hold, with the schedule's trace (last steps first to last).
#[derive(Clone, Debug)]
pub struct Violation {
    /// The seed that reproduces it.
    pub seed: u64,
    /// What went wrong.
    pub what: String,
    /// The last steps of the schedule, oldest first.
    pub trace: Vec<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {}: {}", self.seed, self.what)?;
        writeln!(
            f,
            "replay: SIM_SEED={} cargo test -p sandbox-testkit --test simulation -- --nocapture",
            self.seed
        )?;
        writeln!(f, "last steps:")?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

struct Env {
    session: SessionId,
    env: EnvironmentId,
    closed_by_operator: bool,
    /// Its executors never connect: each exits as soon as it runs.
    broken: bool,
    /// When each of its computes was created, simulated Unix seconds.
    starts_at: Vec<u64>,
    /// Webhook ids delivered so far (for duplicates).
    delivered: Vec<(Trigger, Option<EnvironmentId>, String)>,
}

struct Sim {
    seed: u64,
    cfg: SimConfig,
    rng: SimRng,
    clock: SimClock,
    start_ms: u64,
    events: TwinQueue,
    timers: TwinQueue,
    /// The sweep queue: a fanned-out sweep's jobs ([`Controller::with_sweep_queue`]).
    sweep: TwinQueue,
    registry: TwinRegistry,
    compute: TwinCompute,
    sessions: TwinSessions,
    workers: Vec<Rc<SimController>>,
    sweeper: Rc<SimController>,
    operator: Rc<SimController>,
    envs: Vec<Env>,
    sched: Scheduler,
    seen_events: usize,
    trace: std::collections::VecDeque<String>,
    report: ScheduleReport,
    next_webhook: u64,
    /// Lost deliveries the sender retries (at-least-once webhooks): due (Unix ms), env,
    /// trigger, environment, webhook id.
    sender_retries: Vec<(u64, usize, Trigger, Option<EnvironmentId>, String)>,
    /// Running actor kind → when its invocation's deadline passes (Unix ms).
    deadlines: std::collections::HashMap<String, u64>,
    /// The warm pool's settings (size 0: off) and the executor cap (0: off).
    pool: PoolSettings,
    cap: u32,
    /// The refill actor's controller.
    refiller: Rc<SimController>,
    /// Pool members seen claimed (a `Started` of a member), by the environment.
    claimed: std::collections::HashMap<sandbox_core::ids::InstanceId, EnvironmentId>,
    /// With the cap on: the largest (slots in use + idle members) − cap seen so far.
    max_over_cap: std::cell::Cell<u64>,
    /// The fewest slots in use seen before any port call of the running refill (it reads
    /// the counter at one of them).
    refill_min_in_use: u64,
    /// That minimum for the latest refill that started a member: its plan kept the idle
    /// members within the cap minus its read, which is at least this.
    cap_floor: u64,
    /// Pool members seen so far.
    members_seen: usize,
}

const TRACE_KEEP: usize = 400;

#[allow(clippy::too_many_arguments)]
fn controller(
    worker_id: &str,
    events: &TwinQueue,
    timers: &TwinQueue,
    sweep: &TwinQueue,
    registry: &TwinRegistry,
    compute: &TwinCompute,
    sessions: &TwinSessions,
    clock: &SimClock,
    pool: PoolSettings,
    cap: u32,
    ahead_ms: u64,
) -> Rc<SimController> {
    let mut config = World::config(worker_id);
    config.pool = pool;
    config.policy.max_executors = cap;
    config.stop_readback_interval = Duration::from_millis(1);
    // Stops are instant here, so a read-back confirms at its first read unless the clock
    // jumped past the hour after which ECS forgets the task (a worker paused mid
    // read-back): then it must fail at once ("not confirmed", retried later), not wait on
    // the machine's clock, which would make the schedule slow and depend on the load.
    config.stop_readback_timeout = Duration::ZERO;
    Rc::new(
        Controller::new(
            Interleaved::new(events.clone()),
            Interleaved::new(timers.clone()),
            Interleaved::new(registry.clone()),
            Interleaved::new(compute.clone()),
            Interleaved::new(sessions.clone()),
            if ahead_ms > 0 {
                Arc::new(crate::clock::SkewedClock {
                    inner: clock.clone(),
                    ahead_ms,
                })
            } else {
                Arc::new(clock.clone())
            },
            config,
        )
        .with_sweep_queue(Interleaved::new(sweep.clone())),
    )
}

impl Sim {
    fn new(seed: u64, cfg: SimConfig) -> Self {
        let mut rng = SimRng::new(seed);
        let clock = SimClock::new();
        let events = TwinQueue::fifo(clock.clone(), MAX_RECEIVE_COUNT);
        let timers = TwinQueue::standard(clock.clone(), MAX_RECEIVE_COUNT);
        let sweep = TwinQueue::standard(clock.clone(), MAX_RECEIVE_COUNT);
        let registry = TwinRegistry::new();
        let aws = AwsLike {
            seed: rng.next_u64(),
            ..cfg.aws
        };
        let compute = TwinCompute::aws_like(clock.clone(), ComputeTiming::default(), aws);
        compute.set_snapshot_timing(cfg.snapshots);
        let sessions = TwinSessions::new();
        let n_envs = 1 + rng.index(3);
        let n_workers = 2 + rng.index(3);
        // The pool, from a generator of its own, so that a schedule without it
        // is the one its seed gave before the pool.
        let mut pool_rng = SimRng::new(seed ^ 0x706f_6f6c_5f73_696d);
        let (pool, cap, refill_ahead_ms) = if pool_rng.chance(cfg.pool_percent) {
            compute.set_pool_timing(cfg.pool_timing);
            let pool = PoolSettings {
                size: 1 + pool_rng.below(3) as u32,
                max_age_secs: *pool_rng.pick(&[120, 300, 600]),
            };
            let cap = if pool_rng.chance(50) {
                n_envs as u32 + pool_rng.below(3) as u32
            } else {
                0
            };
            (pool, cap, pool_rng.below(cfg.refill_clock_ahead_ms + 1))
        } else {
            (PoolSettings::default(), 0, 0)
        };
        let make = |id: &str, ahead_ms: u64| {
            controller(
                id, &events, &timers, &sweep, &registry, &compute, &sessions, &clock, pool, cap,
                ahead_ms,
            )
        };
        let workers = (0..n_workers).map(|i| make(&format!("w{i}"), 0)).collect();
        let sweeper = make("sweeper", 0);
        let operator = make("operator", 0);
        let refiller = make("refill", refill_ahead_ms);
        // Executors that never connect, from a generator of their own (as the pool's).
        let mut broken_rng = SimRng::new(seed ^ 0x6272_6f6b_656e_5f78);
        let envs = (0..n_envs)
            .map(|i| {
                let session = SessionId::new(format!("sess_sim_{i}"));
                let env = EnvironmentId::new(format!("env_sim_{i}"));
                sessions.add(&session, &env, SessionStatus::Idle);
                Env {
                    session,
                    env,
                    closed_by_operator: false,
                    broken: broken_rng.chance(cfg.broken_percent),
                    starts_at: vec![],
                    delivered: vec![],
                }
            })
            .collect::<Vec<Env>>();
        let broken_environments = envs.iter().filter(|e| e.broken).count();
        Self {
            seed,
            cfg,
            rng,
            start_ms: 0,
            clock,
            events,
            timers,
            sweep,
            registry,
            compute,
            sessions,
            workers,
            sweeper,
            operator,
            envs,
            sched: Scheduler::new(),
            seen_events: 0,
            trace: std::collections::VecDeque::new(),
            report: ScheduleReport {
                seed,
                environments: n_envs,
                broken_environments,
                workers: n_workers,
                pool: PoolReport {
                    on: pool.size > 0,
                    capped: cap > 0,
                    ..PoolReport::default()
                },
                ..ScheduleReport::default()
            },
            next_webhook: 0,
            sender_retries: vec![],
            deadlines: std::collections::HashMap::new(),
            pool,
            cap,
            refiller,
            claimed: std::collections::HashMap::new(),
            max_over_cap: std::cell::Cell::new(0),
            refill_min_in_use: 0,
            cap_floor: 0,
            members_seen: 0,
        }
        .started()
    }

    fn started(mut self) -> Self {
        self.start_ms = self.clock.now_ms();
        self
    }

    fn note(&mut self, line: String) {
        if self.trace.len() >= TRACE_KEEP {
            self.trace.pop_front();
        }
        let t = (self.clock.now_ms() - self.start_ms) / 1_000;
        self.trace.push_back(format!("t+{t}s {line}"));
    }

    fn violation(&self, what: String) -> Violation {
        Violation {
            seed: self.seed,
            what,
            trace: self.trace.iter().cloned().collect(),
        }
    }
}

impl Sim {
    // ---- deliveries ----------------------------------------------------------------

    async fn deliver(&mut self, e: usize, trigger: Trigger, env: Option<EnvironmentId>) {
        self.next_webhook += 1;
        let webhook_id = format!("wh_sim_{}", self.next_webhook);
        self.envs[e]
            .delivered
            .push((trigger.clone(), env.clone(), webhook_id.clone()));
        self.attempt(e, trigger, env, webhook_id).await;
    }

    /// One delivery attempt by the sender; a lost attempt is retried later (the sender
    /// retries until the intake answers 2xx).
    async fn attempt(
        &mut self,
        e: usize,
        trigger: Trigger,
        env: Option<EnvironmentId>,
        webhook_id: String,
    ) {
        if self.rng.chance(self.cfg.lose_percent) {
            self.report.lost += 1;
            let due = self.clock.now_ms() + 1_000 * (30 + self.rng.below(900));
            self.note(format!("LOST {webhook_id} {trigger:?} for env {e}"));
            self.sender_retries.push((due, e, trigger, env, webhook_id));
            return;
        }
        self.send(e, trigger, env, &webhook_id, &webhook_id).await;
    }

    /// Sender retries that are due (all of them when `all`).
    async fn sender_retry(&mut self, all: bool) {
        let now = self.clock.now_ms();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.sender_retries)
            .into_iter()
            .partition(|r| all || r.0 <= now);
        self.sender_retries = later;
        for (_, e, trigger, env, webhook_id) in due {
            if all {
                self.send(e, trigger, env, &webhook_id, &webhook_id).await;
            } else {
                self.attempt(e, trigger, env, webhook_id).await;
            }
        }
    }

    async fn send(
        &mut self,
        e: usize,
        trigger: Trigger,
        env: Option<EnvironmentId>,
        webhook_id: &str,
        dedup_id: &str,
    ) {
        let session = self.envs[e].session.clone();
        let job = sandbox_controller::Job {
            handoffs: 0,
            swept: None,
            operator_proof: None,
            trigger: trigger.clone(),
            session_id: session,
            environment_id: env,
            webhook_id: Some(webhook_id.to_owned()),
            enqueued_at: self.clock.now(),
        };
        let sent = self
            .events
            .send(Outgoing {
                group: job.group().to_owned(),
                job,
                dedup_id: dedup_id.to_owned(),
                delay_secs: 0,
            })
            .await;
        self.note(format!(
            "deliver {webhook_id} (dedup {dedup_id}) {trigger:?} env {e}: {sent:?}"
        ));
    }

    async fn duplicate(&mut self) {
        let e = self.rng.index(self.envs.len());
        if self.envs[e].delivered.is_empty() {
            return;
        }
        let i = self.rng.index(self.envs[e].delivered.len());
        let (trigger, env, webhook_id) = self.envs[e].delivered[i].clone();
        let dedup = if self.rng.chance(50) {
            webhook_id.clone()
        } else {
            format!("{webhook_id}-redelivery-{}", self.rng.below(1_000))
        };
        self.report.duplicated += 1;
        self.send(e, trigger, env, &webhook_id, &dedup).await;
    }

    // ---- the world -----------------------------------------------------------------

    async fn world_event(&mut self) {
        if self.pool.size > 0 && self.rng.chance(10) {
            self.kill_idle_member();
            return;
        }
        let e = self.rng.index(self.envs.len());
        let (session, env) = (self.envs[e].session.clone(), self.envs[e].env.clone());
        let Some(s) = self.sessions.get(&session) else {
            return;
        };
        match self.rng.below(100) {
            0..=34 => {
                if s.status == SessionStatus::Failed || s.requires_connection_of(&env) {
                    return;
                }
                self.sessions.require_connection(&session);
                self.note(format!("world: env {e} requires a connection"));
                self.deliver(e, Trigger::ConnectionRequested, None).await;
            }
            35..=59 => {
                let running = self
                    .compute
                    .active_of(&env)
                    .iter()
                    .any(|i| i.status == ComputeStatus::Running);
                if !s.requires_connection_of(&env) || !running {
                    return;
                }
                if self.envs[e].broken {
                    // It never connects: it has exited already or exits at the next step.
                    return;
                }
                self.sessions.connect(&env, SessionStatus::InProgress);
                self.note(format!("world: env {e} executor connected, turn runs"));
                self.deliver(e, Trigger::TurnStarted, Some(env)).await;
            }
            60..=79 => {
                if s.status != SessionStatus::InProgress {
                    return;
                }
                self.sessions.set_status(&session, SessionStatus::Idle);
                self.note(format!("world: env {e} turn ended, idle"));
                self.deliver(e, Trigger::Idle, Some(env)).await;
            }
            80..=89 => {
                let live = self.compute.live_of(&env);
                if live.is_empty() {
                    return;
                }
                let victim = live[self.rng.index(live.len())].instance_id.clone();
                if self.claimed.contains_key(&victim) {
                    self.report.pool.claimed_killed += 1;
                }
                self.compute.kill(&victim);
                self.sessions
                    .set_environment_status(&env, EnvironmentStatus::Disconnected);
                self.note(format!("world: env {e} executor {victim} died"));
            }
            90..=93 => {
                self.sessions.set_status(&session, SessionStatus::Failed);
                self.note(format!("world: env {e} session failed"));
                self.deliver(e, Trigger::Failed, Some(env)).await;
            }
            94..=96 => {
                self.sessions.remove(&session);
                self.note(format!("world: env {e} session deleted (no webhook)"));
            }
            _ => {
                if self.envs[e].closed_by_operator || self.sched.has("operator") {
                    return;
                }
                self.envs[e].closed_by_operator = true;
                let op = self.operator.clone();
                self.note(format!("operator: close env {e}"));
                self.sched.spawn(
                    "operator",
                    Box::pin(async move {
                        let _ = op.close(&session, 1, Duration::ZERO).await;
                    }),
                );
            }
        }
    }

    /// An idle member (or a recycled one still running) dies on its own.
    fn kill_idle_member(&mut self) {
        let idle: Vec<_> = self
            .compute
            .pool_members()
            .into_iter()
            .filter(|m| matches!(m.state, MemberState::Idle | MemberState::Recycled))
            .collect();
        if idle.is_empty() {
            return;
        }
        let victim = idle[self.rng.index(idle.len())].instance_id.clone();
        if self.compute.kill(&victim) {
            self.report.pool.idle_killed += 1;
            self.note(format!("world: pool member {victim} died (idle)"));
        }
    }

    // ---- actors ----------------------------------------------------------------------

    /// One worker step on queue `q`: 0 events, 1 timers, 2 sweep.
    fn spawn_worker_step(&mut self, w: usize, q: usize) {
        let kind = format!("w{w}");
        if self.sched.has(&kind) {
            return;
        }
        let c = self.workers[w].clone();
        self.set_deadline(&kind, |d| d.worker_secs);
        self.sched.spawn(
            kind,
            Box::pin(async move {
                let q = match q {
                    0 => &c.events,
                    1 => &c.timers,
                    _ => c.sweep_queue(),
                };
                let _ = c.consume_once(q, 1, 0).await;
            }),
        );
    }

    fn spawn_sweep(&mut self) {
        if self.sched.has("sweeper") {
            return;
        }
        let c = self.sweeper.clone();
        self.set_deadline("sweeper", |d| d.sweeper_secs);
        let fan_out = self.rng.chance(self.cfg.fan_out_percent);
        self.report.fan_out_sweeps += usize::from(fan_out);
        self.note(format!(
            "sweeper: {}",
            if fan_out { "sweep (fan-out)" } else { "sweep" }
        ));
        self.sched.spawn(
            "sweeper",
            Box::pin(async move {
                if fan_out {
                    let _ = c.sweep_fan_out().await;
                } else {
                    let _ = c.sweep().await;
                }
            }),
        );
    }

    /// Spawns the refill unless the pool is off or a refill runs. On AWS it is
    /// a worker job, so it has the worker's deadline.
    fn spawn_refill(&mut self) {
        if self.pool.size == 0 || self.sched.has("refill") {
            return;
        }
        let c = self.refiller.clone();
        self.refill_min_in_use = u64::MAX;
        self.set_deadline("refill", |d| d.worker_secs);
        self.report.pool.refills += 1;
        self.note("refill: pool".to_owned());
        self.sched.spawn(
            "refill",
            Box::pin(async move {
                let _ = c.refill_pool().await;
            }),
        );
    }

    /// Records when the invocation of actor `kind`, beginning now, times out.
    fn set_deadline(&mut self, kind: &str, secs: impl Fn(&Deadlines) -> u64) {
        if let Some(d) = &self.cfg.deadlines {
            let at = self.clock.now_ms() + secs(d) * 1_000;
            self.deadlines.insert(kind.to_owned(), at);
        }
    }

    /// Kills every running actor whose invocation's deadline has passed, before it makes
    /// another port call: Lambda ends the invocation at its timeout, so the job's future
    /// is dropped where it stands, like a crash.
    fn enforce_deadlines(&mut self) {
        if self.deadlines.is_empty() {
            return;
        }
        let now = self.clock.now_ms();
        for i in self.sched.running() {
            let Some(kind) = self.sched.kind(i).map(str::to_owned) else {
                continue;
            };
            if self.deadlines.get(&kind).is_some_and(|at| now > *at)
                && let Some(kind) = self.sched.crash(i)
            {
                self.deadlines.remove(&kind);
                self.report.deadline_kills += 1;
                self.note(format!("DEADLINE {kind} (Lambda timeout)"));
            }
        }
    }

    /// The executors of broken environments exit as soon as they run, without connecting
    /// (the twin reports them `STOPPED`, `EssentialContainerExited`, exit code 1).
    fn broken_executors_exit(&mut self) {
        for e in 0..self.envs.len() {
            if !self.envs[e].broken {
                continue;
            }
            let env = self.envs[e].env.clone();
            for i in self.compute.live_of(&env) {
                if i.status == ComputeStatus::Running && self.compute.kill(&i.instance_id) {
                    self.note(format!(
                        "world: env {e} executor {} exited before connecting",
                        i.instance_id
                    ));
                }
            }
        }
    }

    /// Polls actor `i` once (one port call) and checks the invariants.
    async fn poll_actor(&mut self, i: usize) -> Result<(), Violation> {
        self.enforce_deadlines();
        self.broken_executors_exit();
        if self.sched.kind(i).is_none() {
            // Killed at its deadline just now.
            return self.check_one_active("deadline");
        }
        self.report.polls += 1;
        let kind = self.sched.kind(i).unwrap_or_default().to_owned();
        if kind == "refill" {
            self.refill_min_in_use = self.refill_min_in_use.min(self.registry.slots_in_use());
        }
        let sched = &mut self.sched;
        let done = poll_fn(|cx| Poll::Ready(sched.poll(i, cx.waker()))).await;
        let _ = done;
        self.check_step(&kind)
    }

    /// Runs every running actor to completion (no crash), in seeded order.
    async fn run_to_idle(&mut self) -> Result<(), Violation> {
        let mut guard = 0u64;
        while !self.sched.is_idle() {
            guard += 1;
            if guard > 200_000 {
                return Err(
                    self.violation(format!("actors never finish (livelock?): {:?}", self.sched))
                );
            }
            let ready = self.sched.ready();
            if ready.is_empty() {
                // Waiting on a runtime timer (a close's pause): let the runtime run it.
                let mut yielded = false;
                poll_fn(|cx| {
                    if yielded {
                        Poll::Ready(())
                    } else {
                        yielded = true;
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                })
                .await;
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
            let i = ready[self.rng.index(ready.len())];
            self.poll_actor(i).await?;
        }
        Ok(())
    }

    // ---- invariants ------------------------------------------------------------------

    /// No environment has two active (provisioning, pending, running) tasks, by the
    /// twin's ground truth (lagging and not-yet-failed starts included). Checked after
    /// every step: a poll, a clock advance, a world change, a crash.
    fn check_one_active(&self, actor: &str) -> Result<(), Violation> {
        let all = self.compute.instances();
        for (e, env) in self.envs.iter().enumerate() {
            let count = all
                .iter()
                .filter(|i| i.environment_id == env.env && i.status.is_active())
                .count();
            if count > 1 {
                let active: Vec<String> = all
                    .iter()
                    .filter(|i| i.environment_id == env.env && i.status.is_active())
                    .map(|i| format!("{} gen {} {:?}", i.instance_id, i.generation, i.status))
                    .collect();
                return Err(self.violation(format!(
                    "two active computes for env {e}: {active:?} (after a step of {actor})"
                )));
            }
        }
        self.check_pool(actor)
    }

    /// After every step, by the twin's ground truth: single-use (a member is
    /// claimed by at most one environment, ever, and never returns to the pool), a
    /// recycled member is never claimed (nor a claimed one recycled), and with the cap on
    /// the idle members stay within the cap minus the slots in use at the read of the
    /// refill that started the newest of them (and, when [`SimConfig::cap_slack`] is set,
    /// slots in use plus idle members within the cap plus it).
    fn check_pool(&self, actor: &str) -> Result<(), Violation> {
        if self.pool.size == 0 {
            return Ok(());
        }
        // Read in place: this runs after every step.
        let (problem, idle) = self.compute.with_pool_members(|members| {
            let problem = members.iter().find_map(|m| {
                if m.claims.len() > 1 {
                    Some(format!(
                        "pool member {} was claimed {} times, by {:?}: single-use broken",
                        m.instance_id,
                        m.claims.len(),
                        m.claims
                    ))
                } else if !m.claims.is_empty() && m.state != MemberState::Claimed {
                    Some(format!(
                        "pool member {} claimed by {:?} is {:?} in the pool again: a claimed \
                         member never returns to the pool",
                        m.instance_id, m.claims, m.state
                    ))
                } else if !m.claims.is_empty() && m.recycled_ms.is_some() {
                    Some(format!(
                        "pool member {} was both claimed (by {:?}) and recycled (at {:?} ms): a \
                         recycled member is never claimed, a claimed one never recycled",
                        m.instance_id, m.claims, m.recycled_ms
                    ))
                } else {
                    None
                }
            });
            let idle = members
                .iter()
                .filter(|m| m.state == MemberState::Idle)
                .count() as u64;
            (problem, idle)
        });
        if let Some(problem) = problem {
            return Err(self.violation(format!("{problem} (after a step of {actor})")));
        }
        if self.cap > 0 {
            let in_use = self.registry.slots_in_use();
            let over = (in_use + idle).saturating_sub(u64::from(self.cap));
            self.max_over_cap.set(self.max_over_cap.get().max(over));
            let room = u64::from(self.cap).saturating_sub(self.cap_floor);
            if idle > room {
                return Err(self.violation(format!(
                    "{idle} idle pool members exceed the executor cap {} minus the {} slots in \
                     use when the refill that started the newest of them read the counter \
                     (after a step of {actor}; slots in use now {in_use})",
                    self.cap, self.cap_floor
                )));
            }
            if let Some(slack) = self.cfg.cap_slack
                && over > slack
            {
                return Err(self.violation(format!(
                    "slots in use {in_use} + idle pool members {idle} exceed the executor cap \
                     {} by more than {slack} (after a step of {actor}); idle: {:?}",
                    self.cap,
                    self.compute
                        .pool_members()
                        .iter()
                        .filter(|m| m.state == MemberState::Idle)
                        .map(|m| m.instance_id.as_str())
                        .collect::<Vec<_>>()
                )));
            }
        }
        Ok(())
    }

    /// A `pool_max_age` stop hits a member no environment claimed, which its
    /// recycle's guard took (idle → recycled) first.
    fn check_recycle_stop(
        &self,
        actor: &str,
        before: Option<&sandbox_core::compute::ComputeInstance>,
        id: &sandbox_core::ids::InstanceId,
    ) -> Result<(), Violation> {
        if let Some(inst) = before {
            return Err(self.violation(format!(
                "{actor} recycled {id}, which serves env {:?} (gen {}, {:?}): a claimed member \
                 is stopped only as a compute of its environment",
                self.env_index(&inst.environment_id),
                inst.generation,
                inst.status
            )));
        }
        let member = self
            .compute
            .pool_members()
            .into_iter()
            .find(|m| &m.instance_id == id);
        match member {
            Some(m) if m.claims.is_empty() && m.recycled_ms.is_some() => Ok(()),
            other => Err(self.violation(format!(
                "{actor} stopped {id} for its age, which no recycle's guard took: {other:?}"
            ))),
        }
    }

    fn env_index(&self, env: &EnvironmentId) -> Option<usize> {
        self.envs.iter().position(|e| &e.env == env)
    }

    fn check_step(&mut self, actor: &str) -> Result<(), Violation> {
        if self.pool.size > 0 && self.compute.with_pool_members(<[_]>::len) > self.members_seen {
            let members = self.compute.pool_members();
            {
                if actor == "refill" {
                    self.cap_floor = self.refill_min_in_use;
                }
                for m in &members[self.members_seen..] {
                    let line = format!(
                        "{actor}: pool member {} started (running at t+{}s; slots in use {})",
                        m.instance_id,
                        m.running_at_ms.saturating_sub(self.start_ms) / 1_000,
                        self.registry.slots_in_use()
                    );
                    self.note(line);
                }
                self.members_seen = members.len();
            }
        }
        let new = self.compute.events_since(self.seen_events);
        self.seen_events += new.len();
        for event in new {
            match event {
                ComputeEvent::Started {
                    instance, created, ..
                } => {
                    if created {
                        self.report.starts += 1;
                        self.check_broken_starts(actor, &instance.environment_id)?;
                    }
                    if created
                        && self.compute.with_pool_members(|ms| {
                            ms.iter().any(|m| m.instance_id == instance.instance_id)
                        })
                        && let Some(first) = self.claimed.insert(
                            instance.instance_id.clone(),
                            instance.environment_id.clone(),
                        )
                    {
                        return Err(self.violation(format!(
                            "{actor} claimed pool member {} for env {:?}, which env {:?} \
                             claimed before: single-use broken",
                            instance.instance_id,
                            self.env_index(&instance.environment_id),
                            self.env_index(&first)
                        )));
                    }
                    self.note(format!(
                        "{actor}: compute start env {:?} gen {} -> {} (created {created})",
                        self.env_index(&instance.environment_id),
                        instance.generation,
                        instance.instance_id
                    ));
                }
                ComputeEvent::Stopped {
                    before,
                    instance_id,
                    reason,
                    ..
                } => {
                    self.report.stops += 1;
                    self.note(format!("{actor}: compute stop {instance_id} ({reason})"));
                    if reason == RECYCLE_REASON {
                        self.check_recycle_stop(actor, before.as_ref(), &instance_id)?;
                    } else {
                        self.check_stop(actor, before, &instance_id, &reason)?;
                    }
                }
                ComputeEvent::RestoreRefused {
                    snapshot_id, state, ..
                } => {
                    return Err(self.violation(format!(
                        "{actor} started a compute restoring snapshot {snapshot_id}, which is \
                         {state}: a start restored from a non-completed snapshot"
                    )));
                }
                ComputeEvent::VolumeDeleted {
                    environment_id,
                    generation,
                    via,
                    snapshots,
                    ..
                } => {
                    self.report.volumes_deleted += 1;
                    self.note(format!(
                        "{actor}: volume of env {:?} gen {generation} deleted ({via}; snapshots {snapshots:?})",
                        self.env_index(&environment_id)
                    ));
                    self.check_volume_deleted(actor, &environment_id, via, &snapshots)?;
                }
            }
        }
        self.check_one_active(actor)
    }

    /// A working copy with snapshots is deleted (other than by a discard, or
    /// for a closed or missing record) only once one of them is `completed` and the environment's
    /// record names it: the files are never left only in a snapshot nobody recorded or
    /// that may still fail.
    fn check_volume_deleted(
        &self,
        actor: &str,
        env: &EnvironmentId,
        via: &str,
        snapshots: &[(String, sandbox_core::workspace::SnapshotState)],
    ) -> Result<(), Violation> {
        if via == "discard_workspace" || snapshots.is_empty() {
            return Ok(());
        }
        // No record (nothing could ever restore these files: a start without a record
        // restores nothing) or a closed one: deleted on purpose.
        let Some(record) = self
            .registry
            .record(&env.effect_key())
            .filter(|r| r.status != RecordStatus::Closed)
        else {
            return Ok(());
        };
        let safe = snapshots.iter().any(|(id, state)| {
            *state == sandbox_core::workspace::SnapshotState::Completed
                && record.snapshots.iter().any(|s| &s.snapshot_id == id)
        });
        if safe {
            return Ok(());
        }
        Err(self.violation(format!(
            "{actor} deleted a volume of {env} ({via}) before a completed snapshot of it was \
             recorded: snapshots {snapshots:?}, record {record:?}"
        )))
    }

    fn check_stop(
        &self,
        actor: &str,
        before: Option<sandbox_core::compute::ComputeInstance>,
        id: &sandbox_core::ids::InstanceId,
        reason: &str,
    ) -> Result<(), Violation> {
        let Some(inst) = before else {
            return Err(self.violation(format!("{actor} stopped unknown instance {id}")));
        };
        let env = &inst.environment_id;
        let record = self.registry.record(&env.effect_key());
        let session = record
            .as_ref()
            .map(|r| r.session_id.clone())
            .or(inst.session_id.clone());
        let world = session.as_ref().and_then(|s| self.sessions.get(s));
        let ok = match reason {
            "lease_expired" => record
                .as_ref()
                .and_then(|r| r.lease.as_ref())
                .is_some_and(|l| l.target == inst.as_ref()),
            "replaced" => record
                .as_ref()
                .is_some_and(|r| r.generation >= inst.generation),
            "divergent" => self
                .compute
                .active_of(env)
                .iter()
                .any(|o| o.instance_id != inst.instance_id && o.generation >= inst.generation),
            "orphan" => record.is_none(),
            "session_deleted" => world.is_none(),
            // Failed is final; a failed session may be deleted since.
            "session_failed" => world
                .as_ref()
                .is_none_or(|s| s.status == SessionStatus::Failed),
            "closed" => record
                .as_ref()
                .is_some_and(|r| r.cleanup_required || r.status == RecordStatus::Closed),
            // The ceilings, each by its own evidence.
            "replacement_cap" => {
                let policy = &self.sweeper.config.policy;
                let now = self.clock.now();
                record.as_ref().is_some_and(|r| {
                    r.generation >= inst.generation
                        && policy.max_replacements > 0
                        && r.replacements
                            .iter()
                            .filter(|t| now.saturating_sub(**t) < policy.replacement_window_secs)
                            .count()
                            >= policy.max_replacements as usize
                })
            }
            "lifetime_exceeded" | "lifetime_hard_cap" => {
                let policy = &self.sweeper.config.policy;
                let now = self.clock.now();
                policy.max_lifetime_secs > 0
                    && inst
                        .started_at
                        .is_some_and(|t| now.saturating_sub(t) >= policy.max_lifetime_secs)
            }
            "no_work" => record
                .as_ref()
                .and_then(|r| r.no_work_lease.as_ref())
                .is_some_and(|l| l.target == inst.as_ref()),
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(self.violation(format!(
                "{actor} stopped {id} (generation {}, {:?}) with reason {reason}, which no \
                 decision on the current state names (record: {record:?}; session: {:?})",
                inst.generation,
                inst.status,
                world.map(|s| s.status)
            )))
        }
    }

    /// After the settle (which ends with a refill): the pool holds at most its
    /// size in idle members, none past its maximum age (they were recycled), no recycled
    /// member still runs, and with the cap on slots in use plus idle members are within it.
    fn check_final_pool(&self) -> Result<(), Violation> {
        let members = self.compute.pool_members();
        let idle: Vec<_> = members
            .iter()
            .filter(|m| m.state == MemberState::Idle)
            .collect();
        if idle.len() > self.pool.size as usize {
            return Err(self.violation(format!(
                "after the settle the pool holds {} idle members, its size is {}: {:?}",
                idle.len(),
                self.pool.size,
                idle.iter()
                    .map(|m| m.instance_id.as_str())
                    .collect::<Vec<_>>()
            )));
        }
        let bound = self.clock.now().saturating_sub(self.pool.max_age_secs);
        if let Some(old) = idle.iter().find(|m| m.created_ms / 1000 <= bound) {
            return Err(self.violation(format!(
                "after the settle idle pool member {} (created at {} s) is past its maximum \
                 age {} s at {} s: not recycled",
                old.instance_id,
                old.created_ms / 1000,
                self.pool.max_age_secs,
                self.clock.now()
            )));
        }
        if let Some(m) = members.iter().find(|m| m.state == MemberState::Recycled) {
            return Err(self.violation(format!(
                "after the settle recycled pool member {} still runs (recycled at {:?} ms): \
                 no refill's reconcile stopped it",
                m.instance_id, m.recycled_ms
            )));
        }
        // The last refill recycled what a start put above the cap (plan_refill's trim).
        let in_use = self.registry.slots_in_use();
        if self.cap > 0 && in_use + idle.len() as u64 > u64::from(self.cap) {
            return Err(self.violation(format!(
                "after the settle {in_use} slots in use and {} idle pool members exceed the \
                 executor cap {}: the last refill did not recycle the excess",
                idle.len(),
                self.cap
            )));
        }
        Ok(())
    }

    /// A compute of `env` was just created: if its executors never connect, at most
    /// [`broken_start_bound`] starts in the last hour (the policy bounds them: failed
    /// starts, then held).
    fn check_broken_starts(&mut self, actor: &str, env: &EnvironmentId) -> Result<(), Violation> {
        let Some(e) = self.env_index(env) else {
            return Ok(());
        };
        let now = self.clock.now();
        self.envs[e].starts_at.push(now);
        if !self.envs[e].broken {
            return Ok(());
        }
        self.report.broken_starts += 1;
        let bound = broken_start_bound(&self.sweeper.config.policy);
        let in_hour = self.envs[e]
            .starts_at
            .iter()
            .filter(|t| now.saturating_sub(**t) < 3_600)
            .count();
        self.report.broken_max_in_hour = self.report.broken_max_in_hour.max(in_hour);
        if in_hour > bound {
            return Err(self.violation(format!(
                "{actor}: env {e}, whose executors never connect, got {in_hour} starts in an \
                 hour (the policy allows {bound}): record {:?}",
                self.registry.record(&env.effect_key())
            )));
        }
        Ok(())
    }

    fn check_final(&self) -> Result<(), Violation> {
        self.check_final_pool()?;
        // Every live compute of an environment, a claimed pool member included (it is an
        // instance of its environment), must be named by the environment's record. Idle
        // members are no environment's instance: they belong to the pool.
        for (e, env) in self.envs.iter().enumerate() {
            let live = self.compute.live_of(&env.env);
            let record = self.registry.record(&env.env.effect_key());
            for inst in &live {
                let named = record.as_ref().is_some_and(|r| {
                    r.instance.as_ref() == Some(&inst.as_ref()) && r.status == RecordStatus::Active
                });
                if !named {
                    return Err(self.violation(format!(
                        "after the settle, env {e} has live compute {} (gen {}) that no record \
                         names: {record:?}",
                        inst.instance_id, inst.generation
                    )));
                }
            }
            let world = self.sessions.get(&env.session);
            // Row 28: after `max_start_attempts` failed starts (TaskFailedToStart) nothing
            // starts until the cooldown or an operator reset: documented, not lost.
            let policy = &self.sweeper.config.policy;
            let now = self.clock.now();
            // A start that failed late in the settle (a task stuck `PROVISIONING` for up to
            // 30 min, then `TaskFailedToStart`) is still in its backoff at the end: deferred
            // with a recheck queued, not lost.
            let recheck_queued = self
                .events
                .messages()
                .iter()
                .chain(self.timers.messages().iter())
                .chain(self.sweep.messages().iter())
                .any(|m| m.msg.job.session_id == env.session);
            let start_failing = record.as_ref().is_some_and(|r| {
                r.start_failure.as_ref().is_some_and(|f| {
                    f.attempts >= policy.max_start_attempts
                        || (recheck_queued
                            && now < f.last_failed_at + policy.start_backoff_secs(f.attempts))
                })
            });
            // After `max_replacements` executors in the window never connected,
            // nothing starts until the window frees: held for an owner, not lost.
            let replacement_cap = policy.max_replacements > 0
                && record.as_ref().is_some_and(|r| {
                    r.replacements
                        .iter()
                        .filter(|t| now.saturating_sub(**t) < policy.replacement_window_secs)
                        .count()
                        >= policy.max_replacements as usize
                });
            // An operator close that waits for an owner to resolve open evidence rejects
            // new work until then (lifecycle-cases.md row 25): held, not lost.
            // Snapshots that take time make a start wait minutes, so such a
            // close can now come before the start it used to follow.
            let close_held = record
                .as_ref()
                .is_some_and(|r| r.cleanup_required && r.open_evidence().next().is_some());
            // A start waiting for the snapshot it restores (still `pending` at
            // the end, a recheck queued) is deferred, not lost.
            let now_ms = self.clock.now_ms();
            let snapshot_wait = recheck_queued
                && record
                    .as_ref()
                    .and_then(|r| r.latest_snapshot())
                    .is_some_and(|l| {
                        self.compute.snapshots().iter().any(|x| {
                            x.id == l.snapshot_id
                                && x.state_at(now_ms)
                                    == sandbox_core::workspace::SnapshotState::Pending
                        })
                    });
            let expected = match &world {
                _ if start_failing || replacement_cap || close_held || snapshot_wait => None,
                None => Some(0),
                Some(s) if s.status == SessionStatus::Failed => Some(0),
                Some(s) if s.requires_connection_of(&env.env) => Some(1),
                Some(s) if s.status == SessionStatus::Idle => Some(0),
                Some(_) => None,
            };
            if let Some(n) = expected
                && live.len() != n
            {
                return Err(self.violation(format!(
                    "after the settle, env {e} (session {:?}) has {} live computes, expected \
                     {n} (something was lost; a job of the session queued: {recheck_queued}, \
                     now {now}): record {record:?}",
                    world.map(|s| (s.status, s.required_actions.len())),
                    live.len()
                )));
            }
        }
        Ok(())
    }

    // ---- the schedule ----------------------------------------------------------------

    async fn chaos(&mut self) -> Result<(), Violation> {
        for step in 0..self.cfg.chaos_steps {
            if step % 64 == 63 {
                tokio::task::yield_now().await;
            }
            self.sender_retry(false).await;
            let ready = self.sched.ready();
            let roll = self.rng.below(100 + self.cfg.crash_weight);
            match roll {
                0..=44 if !ready.is_empty() => {
                    let i = ready[self.rng.index(ready.len())];
                    self.poll_actor(i).await?;
                }
                0..=59 if self.pool.size > 0 && self.rng.chance(10) => self.spawn_refill(),
                0..=59 => {
                    let w = self.rng.index(self.workers.len());
                    // Events three times in four; else timers or sweep, half each.
                    let q = if self.rng.chance(25) {
                        1 + self.rng.index(2)
                    } else {
                        0
                    };
                    self.spawn_worker_step(w, q);
                }
                60..=62 => self.spawn_sweep(),
                63..=77 => self.world_event().await,
                78..=81 => {
                    if self.rng.chance(self.cfg.duplicate_percent * 2) {
                        self.duplicate().await;
                    }
                }
                82..=95 => {
                    let secs = 1 + self.rng.below(20);
                    self.clock.advance_secs(secs);
                }
                96..=99 => {
                    // Long pauses: past the visibility timeout, the lock lease, a grace,
                    // and past the hour after which ECS forgets a stopped task (nobody
                    // looked meanwhile: a sweeper outage).
                    let secs = *self.rng.pick(&[61, 125, 200, 301, 3_700]);
                    self.note(format!("clock +{secs}s"));
                    self.clock.advance_secs(secs);
                }
                _ => {
                    let running = self.sched.running();
                    if !running.is_empty() {
                        let i = running[self.rng.index(running.len())];
                        if let Some(kind) = self.sched.crash(i) {
                            self.report.crashes += 1;
                            self.note(format!("CRASH {kind}"));
                        }
                    }
                }
            }
            self.check_one_active("chaos step")?;
        }
        Ok(())
    }

    /// Whether a receive on `q` would return a message now.
    fn visible_now(&self, q: &TwinQueue) -> bool {
        q.next_visible_at_ms()
            .is_some_and(|t| t <= self.clock.now_ms())
    }

    async fn settle(&mut self) -> Result<(), Violation> {
        self.note("settle".to_owned());
        // No new chaos: starts from now on run (those made before keep their fate).
        self.compute.set_failed_starts(0);
        if self.pool.size > 0 {
            self.compute.set_pool_timing(PoolTiming {
                recycle_stop_fail_per_mille: 0,
                ..self.cfg.pool_timing
            });
        }
        self.run_to_idle().await?;
        // The sender's last retries get through; an operator redrives the dead letters
        // (an alarm fires on a non-empty DLQ).
        self.sender_retry(true).await;
        self.report.dead_letters =
            self.events.redrive() + self.timers.redrive() + self.sweep.redrive();
        let end = self.clock.now_ms() + self.cfg.settle_secs * 1_000;
        let mut next_sweep = self.clock.now_ms();
        while self.clock.now_ms() < end {
            if self.clock.now_ms() >= next_sweep {
                // Messages in flight at the first redrive may still reach their receive
                // limit (crashed five times in the chaos): the operator redrives again on
                // the next DLQ alarm.
                self.report.dead_letters +=
                    self.events.redrive() + self.timers.redrive() + self.sweep.redrive();
                self.spawn_sweep();
                self.spawn_refill();
                self.run_to_idle().await?;
                next_sweep = self.clock.now_ms() + 300_000;
            }
            // Drain what is visible now, every worker taking turns, until neither queue
            // shows a message. (Counting queue changes instead stopped early when every
            // worker of a round happened to poll the empty queue, and the clock then
            // jumped past the visible messages: soak seed 14407214890783178816.)
            let mut rounds = 0;
            while self.visible_now(&self.events)
                || self.visible_now(&self.timers)
                || self.visible_now(&self.sweep)
            {
                for w in 0..self.workers.len() {
                    let q = self.rng.index(3);
                    self.spawn_worker_step(w, q);
                }
                self.run_to_idle().await?;
                rounds += 1;
                if rounds > 200 {
                    break;
                }
            }
            let now = self.clock.now_ms();
            let next = [
                self.events.next_visible_at_ms(),
                self.timers.next_visible_at_ms(),
                self.sweep.next_visible_at_ms(),
            ]
            .into_iter()
            .flatten()
            .filter(|t| *t > now)
            .min()
            .unwrap_or(next_sweep)
            .min(next_sweep)
            .max(now + 1_000);
            self.clock.advance_to_ms(next);
            self.check_one_active("clock")?;
        }
        self.spawn_sweep();
        self.run_to_idle().await?;
        for _ in 0..3 {
            for q in 0..3 {
                for w in 0..self.workers.len() {
                    self.spawn_worker_step(w, q);
                }
                self.run_to_idle().await?;
            }
        }
        // The last refill recycles what aged since the one before and stops
        // what a recycle left running.
        self.spawn_refill();
        self.run_to_idle().await?;
        Ok(())
    }
}

/// Runs the schedule of `seed`. Call inside a current-thread Tokio runtime with time
/// enabled (the close's pause and the stop read-back use Tokio timers).
///
/// # Errors
/// The first [`Violation`], with the seed and the last steps of the schedule.
pub async fn run_schedule(seed: u64, cfg: &SimConfig) -> Result<ScheduleReport, Violation> {
    let mut sim = Sim::new(seed, cfg.clone());
    sim.chaos().await?;
    sim.settle().await?;
    sim.check_final()?;
    sim.report.sim_secs = (sim.clock.now_ms() - sim.start_ms) / 1_000;
    sim.report.queued_at_end = sim.events.len() + sim.timers.len() + sim.sweep.len();
    sim.report.ecs = sim.compute.answers();
    let members = sim.compute.pool_members();
    sim.report.pool.started = members.len();
    sim.report.pool.claims = members.iter().map(|m| m.claims.len()).sum();
    sim.report.pool.recycles = members.iter().filter(|m| m.recycled_ms.is_some()).count();
    sim.report.pool.max_over_cap = sim.max_over_cap.get();
    Ok(sim.report)
}

/// The seed of schedule `index` in a run based on `base` (SplitMix64 of both), so
/// neighbouring schedules are unrelated.
pub fn schedule_seed(base: u64, index: u64) -> u64 {
    SimRng::new(base ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64()
}
