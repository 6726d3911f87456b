//! Simulated Fargate time to executor, warm and cold: the real controller on the twins
//! with Fargate's timings, what `tests/fargate_time.rs` bounds and `make bench` prints
//! (`sandbox-bench fargate-time`).
//!
//! Fargate's timings on the compute twin ([`TwinCompute`](crate::compute::TwinCompute)):
//! a task takes 30–60 s from `RunTask` to `RUNNING` (image pull most of it;
//! docs/WARM_POOL.md), drawn per task from the twin's seeded generator, for pool members
//! ([`PoolTiming`]) and cold starts alike ([`TwinCompute::set_cold_start_secs`]).
//!
//! - **Warm** (pool size 1): the refill starts a member; the next connection request comes
//!   60–180 s after the previous claim (seeded, to the millisecond, so the claim falls
//!   anywhere within the member's poll period), so the member is `RUNNING`; the worker
//!   decides (a claim: one transaction). The member's forwarder waits for its assignment by
//!   reading its item once a second from the moment it runs (`await-assignment.mjs`,
//!   `POLL_MS` 1000), so it reads the assignment at its first poll at or after the claim.
//! - **Cold** (no pool): the worker decides a start (`RunTask`); the task runs 30–60 s
//!   later with its assignment in its environment.
//!
//! A session's time to executor is from the worker's decision (simulated time: the twins
//! answer at once, so the worker's own calls count 0 here; `make bench`'s local
//! time-to-executor rows measure them for real) to the moment the executor holds its
//! assignment and starts its registration with the Agents API (its duration, one
//! WebSocket handshake, is not simulated either). A warm request that finds no `RUNNING`
//! member falls back to a cold start and is counted as a miss.

use crate::compute::PoolTiming;
use crate::rng::SimRng;
use crate::world::World;
use sandbox_controller::Job;
use sandbox_controller::config::PoolSettings;
use sandbox_controller::ports::Clock as _;
use sandbox_core::compute::ComputeInstance;
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::session::SessionStatus;
use std::time::Duration;

/// Fargate's `RunTask` → `RUNNING`, seconds: shortest and longest.
pub const FARGATE_START_SECS: (u64, u64) = (30, 60);
/// The member's forwarder reads its item this often, milliseconds
/// (`infra/executor/await-assignment.mjs`).
pub const POLL_MS: u64 = 1_000;

/// Times to executor of one path, simulated milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathTimes {
    /// One per session, in order.
    pub ms: Vec<u64>,
    /// Warm requests that found no `RUNNING` member (a cold start instead).
    pub misses: usize,
}

impl PathTimes {
    /// The `q`-quantile (0..=1), nearest rank; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        let mut d = self.ms.clone();
        d.sort_unstable();
        if d.is_empty() {
            return 0;
        }
        let rank = ((q * d.len() as f64).ceil() as usize).clamp(1, d.len());
        d[rank - 1]
    }
}

/// Both paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FargateTimes {
    /// Claimed pool members.
    pub warm: PathTimes,
    /// Cold starts.
    pub cold: PathTimes,
}

fn job(world: &World, i: usize) -> (Job, SessionId, EnvironmentId) {
    let session = SessionId::new(format!("sess_ft_{i}"));
    let env = EnvironmentId::new(format!("env_ft_{i}"));
    world.sessions.add(&session, &env, SessionStatus::Idle);
    world.sessions.require_connection(&session);
    let job = Job {
        handoffs: 0,
        swept: None,
        operator_proof: None,
        trigger: Trigger::ConnectionRequested,
        session_id: session.clone(),
        environment_id: Some(env.clone()),
        webhook_id: None,
        enqueued_at: world.clock.now(),
    };
    (job, session, env)
}

fn the_instance(world: &World, env: &EnvironmentId) -> ComputeInstance {
    let live = world.compute.live_of(env);
    assert_eq!(live.len(), 1, "one executor for {env}: {live:?}");
    live[0].clone()
}

/// `sessions` sessions on each path (module docs), from `seed`.
///
/// # Panics
/// When a decision is not the start the path expects (the twins do not fail here).
pub async fn measure_fargate_time(sessions: usize, seed: u64) -> FargateTimes {
    let mut rng = SimRng::new(seed);
    let aws = crate::compute::AwsLike {
        seed: rng.next_u64(),
        ..crate::compute::AwsLike::strict()
    };
    let (min, max) = FARGATE_START_SECS;

    let mut warm = PathTimes::default();
    let world = World::aws_like(crate::compute::ComputeTiming::default(), aws);
    world.compute.set_pool_timing(PoolTiming {
        start_secs_min: min,
        start_secs_max: max,
        recycle_stop_fail_per_mille: 0,
    });
    world.compute.set_cold_start_secs(min, max);
    let mut config = World::config("fargate-warm");
    config.pool = PoolSettings {
        size: 1,
        max_age_secs: 3_600,
    };
    let c = world.controller_with(config);
    c.refill_pool().await.expect("the first member");
    for i in 0..sessions {
        world
            .clock
            .advance(Duration::from_millis(60_000 + rng.below(120_001)));
        let (job, _, env) = job(&world, i);
        let decided_ms = world.clock.now_ms();
        let p = c.process(&job).await.expect("the connection request");
        assert_eq!(
            p.outcome().map(|o| o.to_string()).as_deref(),
            Some("start"),
            "{p:?}"
        );
        let id = the_instance(&world, &env).instance_id;
        let running_ms = world.compute.running_at_ms(&id).expect("it runs");
        let from_pool = world
            .compute
            .pool_members()
            .iter()
            .any(|m| m.instance_id == id);
        let ready_ms = if from_pool && running_ms <= decided_ms {
            // The first poll at or after the claim: polls at running + k × POLL_MS.
            running_ms + (decided_ms - running_ms).div_ceil(POLL_MS) * POLL_MS
        } else {
            warm.misses += 1;
            running_ms.max(decided_ms)
        };
        warm.ms.push(ready_ms - decided_ms);
        // The claimed member's replacement, as after every batch that started something.
        c.refill_pool().await.expect("the refill");
    }

    let mut cold = PathTimes::default();
    let aws = crate::compute::AwsLike {
        seed: rng.next_u64(),
        ..crate::compute::AwsLike::strict()
    };
    let world = World::aws_like(crate::compute::ComputeTiming::default(), aws);
    world.compute.set_cold_start_secs(min, max);
    let c = world.controller("fargate-cold");
    for i in 0..sessions {
        world
            .clock
            .advance(Duration::from_millis(60_000 + rng.below(120_001)));
        let (job, _, env) = job(&world, i);
        let decided_ms = world.clock.now_ms();
        let p = c.process(&job).await.expect("the connection request");
        assert_eq!(
            p.outcome().map(|o| o.to_string()).as_deref(),
            Some("start"),
            "{p:?}"
        );
        let id = the_instance(&world, &env).instance_id;
        let running_ms = world.compute.running_at_ms(&id).expect("it runs");
        cold.ms.push(running_ms.saturating_sub(decided_ms));
    }
    FargateTimes { warm, cold }
}
