//! The sweep's cost is that of what is live, never of history; a no-effect sweep
//! writes nothing; a fanned-out sweep fits its schedule. Counted on the twins (items each
//! registry read examines, registry writes and queue calls through the counting ports);
//! the moto-backed counterpart of the first test is in `crates/aws/tests/moto/registry.rs`.

use sandbox_controller::Job;
use sandbox_controller::ports::Clock;
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::session::SessionStatus;
use sandbox_testkit::faulty::Fault;
use sandbox_testkit::scale::measure_scale_with_history;
use sandbox_testkit::world::World;

/// The sweeper's registry read (the fan-out's plan) and every job's are the same with
/// and without 30 days of history (audit entries, receipts, closed records), and the
/// sweep reads at most 1.1 × the open records. The in-place sweep (its jobs included)
/// reads the same with history too.
#[tokio::test]
async fn registry_reads_do_not_grow_with_history() {
    let fresh = measure_scale_with_history(150, 0).await;
    let old = measure_scale_with_history(150, 30).await;
    assert_eq!(fresh.open_records, old.open_records, "{fresh:?}\n{old:?}");
    assert_eq!(
        fresh.fan_out_items_read, old.fan_out_items_read,
        "sweep read: {fresh:?}\n{old:?}"
    );
    assert_eq!(fresh.sweep_items_read, old.sweep_items_read);
    assert_eq!(fresh.job_items_read, old.job_items_read, "per job");
    assert!(
        old.fan_out_items_read as f64 <= 1.1 * old.open_records as f64,
        "the sweep reads {} items for {} open records",
        old.fan_out_items_read,
        old.open_records
    );
}

/// A sweep that finds nothing to do writes nothing to the registry: each job decides on
/// a lock-free read and, having no effect, takes no lock and appends no audit entry.
#[tokio::test]
async fn a_no_effect_sweep_writes_nothing() {
    let row = measure_scale_with_history(120, 2).await;
    assert_eq!(row.sweep_not_ignored, 0, "not a no-effect sweep: {row:?}");
    assert_eq!(row.sweep_registry_writes, 0, "{row:?}");
    // And a sweep with an effect still goes through the lock (and audits): a compute
    // nobody records is stopped.
    let world = World::new();
    let c = world.controller("w");
    let (session, env) = (SessionId::new("sess_nx"), EnvironmentId::new("env_nx"));
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
    c.process(&job).await.unwrap();
    world.sessions.remove(&session);
    let audit_before = world.registry.audit_entries().len();
    world.calls.clear();
    let report = c.sweep().await.unwrap();
    let writes = world.calls.take().remote_writes();
    assert!(report.outcomes.keys().any(|o| o != "ignore"), "{report:?}");
    assert!(writes > 0, "an effect is written");
    assert!(world.registry.audit_entries().len() > audit_before);
}

/// A fanned-out sweep sends its jobs 10 per queue call, every delay within the sweep
/// interval (here 25 jobs at 1 job/s into a 10 s interval: spread over the interval, not
/// 25 s), and a job whose entry of a batch failed is deferred while the rest are sent.
#[tokio::test]
async fn sweep_fan_out_fits_the_schedule() {
    let world = World::new();
    let c = world.controller("w");
    const N: usize = 25;
    for i in 0..N {
        let session = SessionId::new(format!("sess_fan_{i}"));
        let env = EnvironmentId::new(format!("env_fan_{i}"));
        world.sessions.add(&session, &env, SessionStatus::Idle);
        world.sessions.require_connection(&session);
        let job = Job {
            handoffs: 0,
            swept: None,
            operator_proof: None,
            trigger: Trigger::ConnectionRequested,
            session_id: session,
            environment_id: Some(env),
            webhook_id: None,
            enqueued_at: world.clock.now(),
        };
        c.process(&job).await.unwrap();
    }
    let mut config = World::config("sweeper");
    config.settled_resweep_secs = 0;
    config.sweep_jobs_per_sec = 1;
    config.sweep_interval_secs = 10;
    let sweeper = world.controller_with(config);
    let already = world.sweep.len();
    let timers_before = world.timers.len();
    let now_ms = world.clock.now_ms();
    world.calls.clear();
    world
        .faults
        .fail("queue", Some("send"), Fault::ServerError, 2);
    let report = sweeper.sweep_fan_out().await.unwrap();
    let calls = world.calls.take();
    assert_eq!(report.environments, N, "{report:?}");
    assert_eq!(report.queue_calls, N.div_ceil(10), "{report:?}");
    assert_eq!(calls.of("queue", "send_batch"), N.div_ceil(10));
    assert_eq!(calls.of("queue", "send"), 0, "no one-by-one sends");
    // The sweeper function holds no Agents API key (aws_wiring::
    // sweeper_controller, NoSessions): its sweep reads no session.
    assert_eq!(calls.of_port("agents_api"), 0, "a sweep reads no session");
    assert_eq!((report.enqueued, report.deferred), (N - 2, 2), "{report:?}");
    assert_eq!(
        world.timers.len(),
        timers_before,
        "sweep jobs go to the sweep queue, never among the rechecks"
    );
    let sent: Vec<u64> = world
        .sweep
        .messages()
        .iter()
        .skip(already)
        .map(|m| m.visible_at_ms.saturating_sub(now_ms))
        .collect();
    assert_eq!(sent.len(), N - 2);
    assert!(
        sent.iter().all(|&d| d < 10_000),
        "every job within the 10 s interval: {sent:?}"
    );
    assert!(
        sent.iter().max() >= Some(&5_000),
        "spread over the interval, not bunched: {sent:?}"
    );
}
