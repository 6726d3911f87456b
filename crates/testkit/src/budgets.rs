//! Remote calls per transition, counted through [`Counting`](crate::counting::Counting)
//! ports over the twins: what `make bench` prints and what the call-budget tests bound.
//!
//! **Remote call**: one call through a port that leaves the process in production — the
//! Agents API (HTTPS), the registry (DynamoDB) or the compute provider (ECS); see
//! [`REMOTE_PORTS`](crate::counting::REMOTE_PORTS). Queue calls (SQS receive, ack, the
//! timers queue's send) are the transport of the job and are reported separately, never
//! included in the remote count. A call counts once however it ends (success, conflict,
//! error). Reads and writes are classified by [`classify`](crate::counting::classify).
//!
//! Each transition is the handling of one message (`Controller::handle`: process, then
//! ack or retry) or one `Controller::sweep`, in a world where nothing fails and compute
//! transitions are instant. The receive that fetched the message is not counted.

use crate::counting::CallCounts;
use crate::sessions::TwinSessions;
use crate::world::World;
use sandbox_controller::ports::{Clock, Queue, Registry};
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::session::SessionStatus;

/// Target: remote calls of a start.
pub const START_MAX_REMOTE_CALLS: usize = 4;
/// Target: remote reads of a duplicate delivery.
pub const DUPLICATE_MAX_REMOTE_READS: usize = 2;
/// Target: remote writes of a duplicate delivery.
pub const DUPLICATE_MAX_REMOTE_WRITES: usize = 0;

/// The calls one transition made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// Short name: `start`, `duplicate delivery`, `idle (schedule stop)`,
    /// `stop (lease due)`, `sweep of an idle environment`.
    pub name: &'static str,
    /// What was measured, one sentence.
    pub description: &'static str,
    /// The decision's outcome (`start`, `stop`, ...), or the note when nothing was
    /// decided (`duplicate delivery`); for a sweep, the outcomes joined by `,`.
    pub outcome: String,
    /// Every call, queue calls included, in order.
    pub counts: CallCounts,
}

impl Transition {
    /// Remote calls (Agents API + registry + compute).
    pub fn remote(&self) -> usize {
        self.counts.remote_total()
    }
    /// Remote reads.
    pub fn remote_reads(&self) -> usize {
        self.counts.remote_reads()
    }
    /// Remote writes.
    pub fn remote_writes(&self) -> usize {
        self.counts.remote_writes()
    }
    /// Queue calls (not remote calls by the definition above).
    pub fn queue_calls(&self) -> usize {
        self.counts.of_port("queue")
    }
}

async fn handle_next(world: &World, c: &crate::world::TwinController, timers: bool) -> String {
    let queue = if timers { &world.timers } else { &world.events };
    let got = queue
        .receive(1, 60, 0)
        .await
        .unwrap_or_default()
        .into_iter()
        .next();
    let Some(msg) = got else {
        return "no message".to_owned();
    };
    world.calls.clear();
    let q = if timers { &c.timers } else { &c.events };
    match c.handle(q, &msg).await {
        Ok(p) => p
            .outcome()
            .map(|o| o.to_string())
            .or(p.note.map(str::to_owned))
            .unwrap_or_default(),
        Err(e) => format!("error: {e}"),
    }
}

/// Measures the transitions of one environment's life on fresh counting twins:
///
/// 1. `start` — an `environment_connection` webhook job, nothing exists yet;
/// 2. `duplicate delivery` — the same webhook-id delivered again after it was processed
///    (a different queue message: the FIFO de-duplication window did not catch it);
/// 3. `idle (schedule stop)` — the executor connected, the session went idle: a lease;
/// 4. `stop (lease due)` — the lease's recheck fires after the grace: stop, read back,
///    receipt, record;
/// 5. `sweep of an idle environment` — a sweep finding that environment stopped and its
///    session idle (what a settled environment costs on its turn, once per
///    `settled_resweep_secs`), the fixed cost of the sweep (registry and provider
///    listings) included; the job decides on the sweep's read (no provider call).
///
/// Deterministic: the same build gives the same counts.
pub async fn measure_transitions_async() -> Vec<Transition> {
    let world = World::new();
    let c = world.controller("bench");
    let session = SessionId::new("sess_bench");
    let env = EnvironmentId::new("env_bench");
    add_requiring(&world.sessions, &session, &env);
    let mut out = Vec::new();

    let deliver = |trigger: Trigger, webhook: &'static str, dedup: &'static str| {
        let (world, session, env) = (&world, &session, &env);
        async move {
            let _ = world
                .deliver(trigger, session, Some(env), webhook, dedup)
                .await;
        }
    };

    deliver(Trigger::ConnectionRequested, "wh_bench_1", "wh_bench_1").await;
    let outcome = handle_next(&world, &c, false).await;
    out.push(Transition {
        name: "start",
        description: "environment_connection webhook job, no record, no compute",
        outcome,
        counts: world.calls.take(),
    });

    world.sessions.connect(&env, SessionStatus::Idle);
    deliver(
        Trigger::ConnectionRequested,
        "wh_bench_1",
        "wh_bench_1-again",
    )
    .await;
    let outcome = handle_next(&world, &c, false).await;
    out.push(Transition {
        name: "duplicate delivery",
        description: "the same webhook-id again, after it was processed",
        outcome,
        counts: world.calls.take(),
    });

    deliver(Trigger::Idle, "wh_bench_2", "wh_bench_2").await;
    let outcome = handle_next(&world, &c, false).await;
    out.push(Transition {
        name: "idle (schedule stop)",
        description: "idle webhook job, executor connected: shutdown lease",
        outcome,
        counts: world.calls.take(),
    });

    let grace = c.config.policy.shutdown_grace_secs;
    world.clock.advance_secs(grace + 1);
    let outcome = handle_next(&world, &c, true).await;
    out.push(Transition {
        name: "stop (lease due)",
        description: "lease recheck after the grace: stop, read back, receipt, record",
        outcome,
        counts: world.calls.take(),
    });

    world.clock.advance_secs(60);
    // The environment is settled (stopped, nothing pending): a sweep reaches it once per
    // `settled_resweep_secs`; this measures that sweep.
    let mut config = World::config("bench-sweeper");
    config.settled_resweep_secs = 0;
    let sweeper = world.controller_with(config);
    world.calls.clear();
    let outcome = match sweeper.sweep().await {
        Ok(r) => r.outcomes.keys().cloned().collect::<Vec<_>>().join(","),
        Err(e) => format!("error: {e}"),
    };
    out.push(Transition {
        name: "sweep of an idle environment",
        description: "one sweep, one environment: record stopped, session idle",
        outcome,
        counts: world.calls.take(),
    });
    out
}

/// A start after a crashed lock holder: the same job as the `start` transition, but the
/// effect key's lock was taken by a worker that never released it and has expired. The
/// take is `recovered`, so the worker reads the provider's inventory before it starts.
pub async fn measure_recovered_start() -> Transition {
    let world = World::new();
    let c = world.controller("bench");
    let session = SessionId::new("sess_bench");
    let env = EnvironmentId::new("env_bench");
    add_requiring(&world.sessions, &session, &env);
    let now = world.clock.now();
    let crashed = world
        .registry
        .lock(&env.effect_key(), "crashed-worker", now - 1, now)
        .await;
    assert!(
        matches!(crashed, Ok(Some(_))),
        "the crashed holder's lock is taken"
    );
    let _ = world
        .deliver(
            Trigger::ConnectionRequested,
            &session,
            Some(&env),
            "wh_bench_1",
            "wh_bench_1",
        )
        .await;
    let outcome = handle_next(&world, &c, false).await;
    Transition {
        name: "start after a crashed holder",
        description: "environment_connection webhook job, the lock left expired by a crash",
        outcome,
        counts: world.calls.take(),
    }
}

/// A sweep that finds an idle environment's shutdown lease due (the lease's own timer
/// was lost or is late): the sweep stops the compute, after one turns read (turn evidence before every stop of an idle session). Measured with
/// `settled_resweep_secs = 0`, the sweep's fixed cost (registry and provider listings)
/// included.
pub async fn measure_sweep_stop() -> Transition {
    let world = World::new();
    let c = world.controller("bench");
    let session = SessionId::new("sess_bench");
    let env = EnvironmentId::new("env_bench");
    add_requiring(&world.sessions, &session, &env);
    let deliver = |trigger: Trigger, webhook: &'static str| {
        let (world, session, env) = (&world, &session, &env);
        async move {
            let _ = world
                .deliver(trigger, session, Some(env), webhook, webhook)
                .await;
        }
    };
    deliver(Trigger::ConnectionRequested, "wh_bench_1").await;
    handle_next(&world, &c, false).await;
    world.sessions.connect(&env, SessionStatus::Idle);
    deliver(Trigger::Idle, "wh_bench_2").await;
    handle_next(&world, &c, false).await;
    world
        .clock
        .advance_secs(c.config.policy.shutdown_grace_secs + 1);
    let mut config = World::config("bench-sweeper");
    config.settled_resweep_secs = 0;
    let sweeper = world.controller_with(config);
    world.calls.clear();
    let outcome = match sweeper.sweep().await {
        Ok(r) => r.outcomes.keys().cloned().collect::<Vec<_>>().join(","),
        Err(e) => format!("error: {e}"),
    };
    Transition {
        name: "sweep stop (lease due)",
        description: "one sweep, one environment: its lease is due, session idle: stop",
        outcome,
        counts: world.calls.take(),
    }
}

fn add_requiring(sessions: &TwinSessions, session: &SessionId, env: &EnvironmentId) {
    sessions.add(session, env, SessionStatus::Idle);
    sessions.require_connection(session);
}

/// [`measure_transitions_async`] on a fresh current-thread Tokio runtime.
///
/// # Panics
/// When called from inside a Tokio runtime (use the async version there) or when the
/// runtime cannot be built.
pub fn measure_transitions() -> Vec<Transition> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"))
        .block_on(measure_transitions_async())
}
