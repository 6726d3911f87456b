//! ECS calls per worker job and per sweep as the deployment grows: what
//! `make bench` prints as its scale table and what `tests/scale.rs` bounds.
//!
//! A world of N environments is built through the controller itself (each environment's
//! connection request processed, its executor connected, a turn running), on the
//! strict-but-instant compute twin ([`crate::compute::AwsLike::strict`]), whose
//! [`EcsCalls`] count the ECS API calls the AWS adapter would make: a describe is one
//! `DescribeTasks`, `describe_many` of n ids ⌈n/100⌉, a list of L live tasks
//! max(1, ⌈L/100⌉) `ListTasks` pages + ⌈L/100⌉ `DescribeTasks`. Then, on that world:
//!
//! - **start**: a new environment's connection request (nothing recorded);
//! - **reuse/wait**: a second connection request for it right after (its task recorded);
//! - **idle (lease)**: its session goes idle with the executor connected: a shutdown lease;
//! - **lease stop**: the lease is due: stop, read back;
//! - **sweep (no effect)**: one [`Controller::sweep`](sandbox_controller::Controller::sweep)
//!   in place of all N environments, each with a running connected executor and a turn
//!   in progress (nothing to do: a first, unmeasured sweep has recorded the executors'
//!   connection), timed (wall clock, this process);
//! - **sweep fan-out**: the same read, the jobs sent to the timers queue instead, timed.
//!
//! Registry and queue cost: the twin registry counts the items each read
//! examines ([`crate::registry::TwinRegistry::items_read`], as DynamoDB would for the
//! layout of `sandbox_aws::dynamo_registry`), the counting ports count registry writes and
//! queue calls. [`measure_scale_with_history`] first adds `days` of history: per
//! environment and day two audit entries and a receipt (a start and a stop), and one
//! closed environment per ten open ones per day (its record, two audit entries and a
//! receipt), so the table shows whether the sweep's reads grow with history.

use crate::compute::EcsCalls;
use crate::world::World;
use sandbox_controller::Job;
use sandbox_controller::ports::{
    AuditEntry, Clock, Fence, Receipt, ReceiptKind, Registry, Release,
};
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::record::{Record, RecordStatus};
use sandbox_core::session::SessionStatus;
use std::time::Instant;

/// One row of the scale table: N environments.
#[derive(Clone, Debug, PartialEq)]
pub struct ScaleRow {
    /// Environments in the deployment: N − 1 with a running, connected executor and a
    /// turn in progress, and the one the jobs are measured on.
    pub environments: usize,
    /// ECS calls of a start job.
    pub start: EcsCalls,
    /// ECS calls of a second connection request for a just-started environment.
    pub reuse_wait: EcsCalls,
    /// ECS calls of an idle job that schedules a shutdown lease.
    pub idle_lease: EcsCalls,
    /// ECS calls of the lease-due job that stops the task (stop and read-back).
    pub lease_stop: EcsCalls,
    /// ECS calls of one in-place sweep that finds nothing to do.
    pub sweep: EcsCalls,
    /// The sweep's decisions that were not `ignore` (must be 0 for a no-effect sweep).
    pub sweep_not_ignored: usize,
    /// Wall time of that sweep, milliseconds.
    pub sweep_ms: f64,
    /// ECS calls of one fanned-out sweep (the read only; the jobs decide on it later).
    pub fan_out: EcsCalls,
    /// Jobs the fanned-out sweep sent.
    pub fan_out_jobs: usize,
    /// Wall time of the fanned-out sweep (read + sends), milliseconds.
    pub fan_out_ms: f64,
    /// Days of history added before measuring (0: none).
    pub history_days: u64,
    /// Records that are not closed (what the sweep has to read).
    pub open_records: usize,
    /// Registry items the fanned-out sweep read (the sweeper's own read).
    pub fan_out_items_read: u64,
    /// Registry items the in-place no-effect sweep read, its N jobs included.
    pub sweep_items_read: u64,
    /// Registry writes of the in-place no-effect sweep (target 0).
    pub sweep_registry_writes: usize,
    /// Registry items read by each measured job (start, reuse/wait, idle, lease stop).
    pub job_items_read: [u64; 4],
    /// Queue calls of the fanned-out sweep (`send_batch`, 10 jobs each).
    pub fan_out_queue_calls: usize,
}

impl ScaleRow {
    /// The bound for a sweep with no effect: 3 × ⌈N/100⌉ ECS calls.
    pub fn sweep_bound(&self) -> u64 {
        3 * (self.environments as u64).div_ceil(100)
    }
}

fn ids(i: usize) -> (SessionId, EnvironmentId) {
    (
        SessionId::new(format!("sess_scale_{i}")),
        EnvironmentId::new(format!("env_scale_{i}")),
    )
}

fn job(world: &World, trigger: Trigger, session: &SessionId, env: &EnvironmentId) -> Job {
    Job {
        handoffs: 0,
        swept: None,
        operator_proof: None,
        trigger,
        session_id: session.clone(),
        environment_id: Some(env.clone()),
        webhook_id: None,
        enqueued_at: world.clock.now(),
    }
}

/// Measures one row at `n` environments. Deterministic in its counts; the times are this
/// machine's.
///
/// # Panics
/// When a measured job does not decide what it is meant to measure (the table would be
/// about something else).
pub async fn measure_scale(n: usize) -> ScaleRow {
    measure_scale_with_history(n, 0).await
}

/// Adds `days` of history to `world` for `open` environments (module docs), straight to
/// the twin registry (no call counted).
async fn add_history(world: &World, open: usize, days: u64) {
    let r = &world.registry;
    let now = world.clock.now();
    let audit = |env: &EnvironmentId, session: &SessionId, at: u64, outcome: &str| AuditEntry {
        at,
        effect_key: env.effect_key(),
        session_id: session.clone(),
        trigger: serde_json::json!({"kind": "idle"}),
        observed: serde_json::Value::Null,
        outcome: outcome.to_owned(),
        reason: "history".to_owned(),
        applied: vec![],
        error: None,
    };
    let receipt = |env: &EnvironmentId, session: &SessionId, at: u64| Receipt {
        at,
        effect_key: env.effect_key(),
        kind: ReceiptKind::SessionDeleted {
            session_id: session.clone(),
        },
    };
    let mut closed = 0usize;
    for day in 0..days {
        let at = now.saturating_sub((days - day) * 86_400);
        for i in 0..open {
            let (session, env) = ids(i);
            for outcome in ["start", "stop"] {
                r.audit(&audit(&env, &session, at, outcome))
                    .await
                    .unwrap_or_else(|e| panic!("history: {e}"));
            }
            r.receipt(&receipt(&env, &session, at))
                .await
                .unwrap_or_else(|e| panic!("history: {e}"));
        }
        for _ in 0..open.div_ceil(10) {
            let session = SessionId::new(format!("sess_closed_{closed}"));
            let env = EnvironmentId::new(format!("env_closed_{closed}"));
            closed += 1;
            let fence = Fence {
                key: env.effect_key(),
                owner: "history".to_owned(),
            };
            let _ = r.lock(&fence.key, &fence.owner, now + 60, now).await;
            let mut record = Record::new(env.clone(), session.clone());
            record.status = RecordStatus::Closed;
            let release = Release {
                record: Some((&record, None)),
                clean: true,
                ..Release::default()
            };
            let _ = r.release(&fence, now, release).await;
            for outcome in ["start", "close"] {
                r.audit(&audit(&env, &session, at, outcome))
                    .await
                    .unwrap_or_else(|e| panic!("history: {e}"));
            }
            r.receipt(&receipt(&env, &session, at))
                .await
                .unwrap_or_else(|e| panic!("history: {e}"));
        }
    }
}

/// [`measure_scale`] after `days` of history (module docs).
///
/// # Panics
/// As [`measure_scale`].
pub async fn measure_scale_with_history(n: usize, days: u64) -> ScaleRow {
    let world = World::new();
    let c = world.controller("scale");
    let last = n.saturating_sub(1);
    for i in 0..last {
        let (session, env) = ids(i);
        world.sessions.add(&session, &env, SessionStatus::Idle);
        world.sessions.require_connection(&session);
        let p = c
            .process(&job(&world, Trigger::ConnectionRequested, &session, &env))
            .await;
        assert!(
            matches!(&p, Ok(p) if p.outcome().map(|o| o.to_string()).as_deref() == Some("start")),
            "setup start {i}: {p:?}"
        );
    }
    for i in 0..last {
        world.sessions.connect(&ids(i).1, SessionStatus::InProgress);
    }
    add_history(&world, n, days).await;
    let mut job_items_read = [0u64; 4];
    let run = |trigger: Trigger, i: usize| {
        let (world, c) = (&world, &c);
        async move {
            let (session, env) = ids(i);
            world.compute.take_ecs_calls();
            let read = world.registry.items_read();
            let p = c
                .process(&job(world, trigger, &session, &env))
                .await
                .unwrap_or_else(|e| panic!("job: {e}"));
            (
                p.outcome().map(|o| o.to_string()),
                world.compute.take_ecs_calls(),
                world.registry.items_read() - read,
            )
        }
    };
    let (new_session, new_env) = ids(last);
    world
        .sessions
        .add(&new_session, &new_env, SessionStatus::Idle);
    world.sessions.require_connection(&new_session);
    let (outcome, start, items) = run(Trigger::ConnectionRequested, last).await;
    job_items_read[0] = items;
    assert_eq!(outcome.as_deref(), Some("start"));
    let (outcome, reuse_wait, items) = run(Trigger::ConnectionRequested, last).await;
    job_items_read[1] = items;
    assert_eq!(outcome.as_deref(), Some("wait"), "reuse/wait");
    world.sessions.connect(&new_env, SessionStatus::Idle);
    let (outcome, idle_lease, items) = run(Trigger::Idle, last).await;
    job_items_read[2] = items;
    assert_eq!(outcome.as_deref(), Some("schedule-stop"));
    let lease = world
        .registry
        .record(&new_env.effect_key())
        .and_then(|r| r.lease)
        .unwrap_or_else(|| panic!("no lease recorded"));
    world
        .clock
        .advance_secs(c.config.policy.shutdown_grace_secs + 1);
    let (outcome, lease_stop, items) = run(Trigger::LeaseDue { lease }, last).await;
    job_items_read[3] = items;
    assert_eq!(outcome.as_deref(), Some("stop"));
    // The stopped environment's session stays idle; the others run turns. Every record is
    // swept (no settled skipping), so the sweep decides about all N.
    let mut config = World::config("scale-sweeper");
    config.settled_resweep_secs = 0;
    let sweeper = world.controller_with(config);
    // A first sweep records what the executors' connection looks like now (a change to
    // each record); the measured one is the steady state after it, with nothing to do.
    sweeper
        .sweep()
        .await
        .unwrap_or_else(|e| panic!("first sweep: {e}"));
    world.compute.take_ecs_calls();
    world.calls.clear();
    let open_records = world
        .registry
        .records()
        .iter()
        .filter(|r| r.status != RecordStatus::Closed)
        .count();
    let read = world.registry.items_read();
    let started = Instant::now();
    let report = sweeper
        .sweep()
        .await
        .unwrap_or_else(|e| panic!("sweep: {e}"));
    let sweep_ms = started.elapsed().as_secs_f64() * 1e3;
    let sweep_items_read = world.registry.items_read() - read;
    let sweep = world.compute.take_ecs_calls();
    let sweep_registry_writes = world
        .calls
        .take()
        .calls
        .iter()
        .filter(|c| c.port == "registry" && c.access == crate::counting::Access::Write)
        .count();
    let sweep_not_ignored = report
        .outcomes
        .iter()
        .filter(|(o, _)| o.as_str() != "ignore")
        .map(|(_, k)| k)
        .sum();
    world.calls.clear();
    let read = world.registry.items_read();
    let started = Instant::now();
    let fanned = sweeper
        .sweep_fan_out()
        .await
        .unwrap_or_else(|e| panic!("fan-out sweep: {e}"));
    let fan_out_ms = started.elapsed().as_secs_f64() * 1e3;
    let fan_out_items_read = world.registry.items_read() - read;
    let fan_out = world.compute.take_ecs_calls();
    let fan_out_queue_calls = world.calls.take().of_port("queue");
    ScaleRow {
        environments: n,
        start,
        reuse_wait,
        idle_lease,
        lease_stop,
        sweep,
        sweep_not_ignored,
        sweep_ms,
        fan_out,
        fan_out_jobs: fanned.enqueued,
        fan_out_ms,
        history_days: days,
        open_records,
        fan_out_items_read,
        sweep_items_read,
        sweep_registry_writes,
        job_items_read,
        fan_out_queue_calls,
    }
}

/// [`measure_scale`] on a fresh current-thread Tokio runtime, for each of `sizes`.
///
/// # Panics
/// As [`measure_scale`]; when called inside a Tokio runtime or when none can be built.
pub fn measure_scale_table(sizes: &[usize]) -> Vec<ScaleRow> {
    measure_scale_table_with_history(sizes, &[0])
}

/// [`measure_scale_with_history`] for each of `sizes` and each of `history_days`, on a
/// fresh current-thread Tokio runtime (sizes outer, days inner).
///
/// # Panics
/// As [`measure_scale_table`].
pub fn measure_scale_table_with_history(sizes: &[usize], history_days: &[u64]) -> Vec<ScaleRow> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"));
    sizes
        .iter()
        .flat_map(|&n| history_days.iter().map(move |&d| (n, d)))
        .map(|(n, d)| rt.block_on(measure_scale_with_history(n, d)))
        .collect()
}
