//! The concurrency cap per deployment, through the worker and the sweeper
//! over the twins: the slot is taken before a start and only then, a start at the cap
//! waits (reason `capacity_limit`, rechecked through the timers queue, not handed off),
//! slots come back once no compute lives, a lost lock or a registry failure starts
//! nothing, the sweep gives back what a crash left, and a start costs one slot call
//! whatever the size of the deployment.

use sandbox_controller::Job;
use sandbox_controller::ports::{Clock, Fence, Registry, Slot};
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::record::RecordStatus;
use sandbox_core::session::SessionStatus;
use sandbox_testkit::World;
use sandbox_testkit::faulty::Fault;
use sandbox_testkit::world::TwinController;

fn capped(world: &World, name: &str, cap: u32) -> TwinController {
    let mut config = World::config(name);
    config.policy.max_executors = cap;
    world.controller_with(config)
}

fn ids(i: usize) -> (SessionId, EnvironmentId) {
    (
        SessionId::new(format!("sess_cap_{i}")),
        EnvironmentId::new(format!("env_cap_{i}")),
    )
}

/// Session `i` requires a connection to its environment.
fn requiring(world: &World, i: usize) -> (SessionId, EnvironmentId) {
    let (s, e) = ids(i);
    world.sessions.add(&s, &e, SessionStatus::Idle);
    world.sessions.require_connection(&s);
    (s, e)
}

fn job(world: &World, trigger: Trigger, s: &SessionId, e: &EnvironmentId) -> Job {
    Job {
        handoffs: 0,
        swept: None,
        operator_proof: None,
        trigger,
        session_id: s.clone(),
        environment_id: Some(e.clone()),
        webhook_id: None,
        enqueued_at: world.clock.now(),
    }
}

async fn outcome(c: &TwinController, j: &Job) -> (String, String) {
    let p = c.process(j).await.unwrap();
    let d = p.decision.expect("a decision");
    (d.outcome.to_string(), d.reason.to_string())
}

/// Takes a slot for `env` directly, as a worker would under its lock, and (unless
/// `keep_lock`) leaves the lock as a crashed worker would: expired, never released.
async fn hold_slot(world: &World, env: &EnvironmentId, cap: u32) {
    let now = world.clock.now();
    let fence = Fence {
        key: env.effect_key(),
        owner: format!("crashed-{env}"),
    };
    assert!(
        world
            .registry
            .lock(&fence.key, &fence.owner, now + 120, now)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        world.registry.acquire_slot(&fence, now, cap).await.unwrap(),
        Slot::Acquired
    );
}

#[tokio::test]
async fn at_the_cap_a_second_start_waits_on_the_timers_queue_and_starts_once_the_first_stops() {
    let world = World::new();
    let c = capped(&world, "w1", 1);
    let (sa, ea) = requiring(&world, 1);
    let (sb, eb) = requiring(&world, 2);

    assert_eq!(
        outcome(&c, &job(&world, Trigger::ConnectionRequested, &sa, &ea))
            .await
            .0,
        "start"
    );
    assert_eq!(world.registry.slots_in_use(), 1);

    let timers_before = world.timers.len();
    let p = c
        .process(&job(&world, Trigger::ConnectionRequested, &sb, &eb))
        .await
        .unwrap();
    let d = p.decision.clone().unwrap();
    assert_eq!(d.outcome.to_string(), "wait");
    assert!(d.reason.to_string().starts_with("capacity_limit"), "{d:?}");
    assert!(
        world.compute.live_of(&eb).is_empty(),
        "nothing started for B"
    );
    // Done, not handed off: the recheck is a fresh job on the timers queue (it never
    // counts toward the hand-off cap), after the policy's recheck delay.
    assert_eq!(p.disposition, sandbox_controller::Disposition::Done);
    let rechecks: Vec<_> = world.timers.messages()[timers_before..]
        .iter()
        .map(|m| m.msg.clone())
        .collect();
    assert_eq!(rechecks.len(), 1, "{rechecks:?}");
    assert_eq!(rechecks[0].delay_secs, 10);
    assert_eq!(rechecks[0].job.handoffs, 0);
    assert_eq!(rechecks[0].job.environment_id.as_ref(), Some(&eb));
    // The wait noted the connection request: the record exists, names no compute.
    let rb = world.registry.record(&eb.effect_key()).unwrap();
    assert!(rb.connection_requested_at.is_some() && rb.instance.is_none());

    // A connects, goes idle, its lease comes due: stopped, slot back.
    world.sessions.connect(&ea, SessionStatus::Idle);
    assert_eq!(
        outcome(&c, &job(&world, Trigger::Idle, &sa, &ea)).await.0,
        "schedule-stop"
    );
    world
        .clock
        .advance_secs(c.config.policy.shutdown_grace_secs + 1);
    let lease = world
        .registry
        .record(&ea.effect_key())
        .unwrap()
        .lease
        .unwrap();
    assert_eq!(
        outcome(&c, &job(&world, Trigger::LeaseDue { lease }, &sa, &ea))
            .await
            .0,
        "stop"
    );
    assert_eq!(
        world.registry.slots_in_use(),
        0,
        "the stop gave the slot back"
    );

    // B's recheck (a sweep job) now starts B.
    assert_eq!(
        outcome(&c, &rechecks[0].job).await.0,
        "start",
        "the recheck takes the freed slot"
    );
    assert_eq!(world.compute.live_of(&eb).len(), 1);
    assert_eq!(world.registry.slots_in_use(), 1);
}

#[tokio::test]
async fn a_replacement_reuses_the_environments_own_slot_and_never_waits() {
    let world = World::new();
    let c = capped(&world, "w1", 1);
    let (s, e) = requiring(&world, 1);
    assert_eq!(
        outcome(&c, &job(&world, Trigger::ConnectionRequested, &s, &e))
            .await
            .0,
        "start"
    );
    // The executor never connects: past the connect deadline it is replaced, at the cap.
    world
        .clock
        .advance_secs(c.config.policy.connect_deadline_secs + 5);
    world.sessions.set_environment_status(
        &e,
        sandbox_core::environment::EnvironmentStatus::Disconnected,
    );
    assert_eq!(
        outcome(&c, &job(&world, Trigger::Sweep, &s, &e)).await.0,
        "replace"
    );
    assert_eq!(world.compute.live_of(&e).len(), 1);
    assert_eq!(world.registry.slots_in_use(), 1);
}

#[tokio::test]
async fn a_failed_start_gives_the_slot_back() {
    let world = World::new();
    let c = capped(&world, "w1", 2);
    let (s, e) = requiring(&world, 1);
    world.faults.fail(
        "compute",
        Some("start"),
        Fault::FailedStart("RESOURCE:CPU".into()),
        1,
    );
    let p = c
        .process(&job(&world, Trigger::ConnectionRequested, &s, &e))
        .await
        .unwrap();
    assert!(p.error.unwrap().starts_with("start failed"));
    assert_eq!(world.registry.slots_in_use(), 0, "no compute, no slot");
}

#[tokio::test]
async fn a_start_whose_outcome_is_unknown_keeps_its_slot() {
    let world = World::new();
    let c = capped(&world, "w1", 2);
    let (s, e) = requiring(&world, 1);
    world
        .faults
        .fail("compute", Some("start"), Fault::LostResponse, 1);
    let p = c
        .process(&job(&world, Trigger::ConnectionRequested, &s, &e))
        .await
        .unwrap();
    assert!(p.error.unwrap().contains("outcome unknown"));
    assert_eq!(
        world.compute.live_of(&e).len(),
        1,
        "the provider started it"
    );
    assert_eq!(
        world.registry.slots_in_use(),
        1,
        "it may run: the slot stays"
    );
}

#[tokio::test]
async fn without_the_slot_checked_nothing_starts() {
    for fault in [Fault::Conflict, Fault::ServerError] {
        let world = World::new();
        let c = capped(&world, "w1", 2);
        let (s, e) = requiring(&world, 1);
        world
            .faults
            .fail("registry", Some("acquire_slot"), fault.clone(), 1);
        let p = c
            .process(&job(&world, Trigger::ConnectionRequested, &s, &e))
            .await
            .unwrap();
        assert!(
            p.error
                .as_deref()
                .unwrap_or("")
                .starts_with("executor slot not taken"),
            "{fault:?}: {p:?}"
        );
        assert!(matches!(
            p.disposition,
            sandbox_controller::Disposition::RetryAfter(_)
        ));
        assert_eq!(world.calls.counts().of("compute", "start"), 0, "{fault:?}");
        assert_eq!(world.registry.slots_in_use(), 0);
    }
}

#[tokio::test]
async fn the_sweep_gives_back_a_slot_a_crashed_worker_left_without_a_record() {
    let world = World::new();
    let (_, e) = ids(9);
    hold_slot(&world, &e, 3).await;
    let mut config = World::config("sweeper");
    config.policy.max_executors = 3;
    let sweeper = world.controller_with(config);
    // Within the lock's lease a start may still be on its way: left alone.
    sweeper.sweep().await.unwrap();
    assert_eq!(world.registry.slots_in_use(), 1);
    world.clock.advance_secs(sweeper.config.lock_ttl_secs + 1);
    sweeper.sweep().await.unwrap();
    assert_eq!(world.registry.slots_in_use(), 0);
    assert!(
        world
            .registry
            .lock_of(&e.effect_key())
            .is_some_and(|l| l.until == 0)
    );
}

#[tokio::test]
async fn the_sweep_gives_back_the_slot_of_a_stopped_environment() {
    let world = World::new();
    let c = capped(&world, "w1", 3);
    let (s, e) = requiring(&world, 1);
    outcome(&c, &job(&world, Trigger::ConnectionRequested, &s, &e)).await;
    world.sessions.connect(&e, SessionStatus::Idle);
    outcome(&c, &job(&world, Trigger::Idle, &s, &e)).await;
    world
        .clock
        .advance_secs(c.config.policy.shutdown_grace_secs + 1);
    let lease = world
        .registry
        .record(&e.effect_key())
        .unwrap()
        .lease
        .unwrap();
    outcome(&c, &job(&world, Trigger::LeaseDue { lease }, &s, &e)).await;
    assert_eq!(
        world.registry.record(&e.effect_key()).unwrap().status,
        RecordStatus::Stopped
    );
    assert_eq!(world.registry.slots_in_use(), 0);
    // A slot taken again behind the controller's back (a crash between an acquire and a
    // start that never happened): the settled record is swept and the slot comes back.
    world.clock.advance_secs(200);
    hold_slot(&world, &e, 3).await;
    world.clock.advance_secs(200);
    let mut config = World::config("sweeper");
    config.policy.max_executors = 3;
    let sweeper = world.controller_with(config);
    sweeper.sweep().await.unwrap();
    assert_eq!(world.registry.slots_in_use(), 0);
}

/// The cost of the cap: one conditional write before a start, whatever the number of
/// environments holding slots (never a scan of the slots).
#[tokio::test]
async fn a_capped_start_costs_one_slot_call_whatever_the_deployment_size() {
    let mut sequences = Vec::new();
    for others in [0usize, 60] {
        let world = World::new();
        for i in 0..others {
            hold_slot(&world, &ids(1000 + i).1, 100).await;
        }
        let c = capped(&world, "w1", 100);
        let (s, e) = requiring(&world, 1);
        world.calls.clear();
        assert_eq!(
            outcome(&c, &job(&world, Trigger::ConnectionRequested, &s, &e))
                .await
                .0,
            "start"
        );
        sequences.push(world.calls.take().remote_sequence());
    }
    assert_eq!(
        sequences[0],
        "agents_api.retrieve_session(R) → registry.lock(W) → registry.acquire_slot(W) → \
         compute.start(W) → registry.release(W)"
    );
    assert_eq!(sequences[0], sequences[1], "flat in the deployment's size");
}

/// `sandboxctl sweep --dry-run` and `explain` show a start at the cap as the worker would
/// take it: a `capacity_limit` wait, nothing taken.
#[tokio::test]
async fn a_dry_run_shows_a_start_at_the_cap_as_a_wait() {
    let world = World::new();
    let c = capped(&world, "w1", 1);
    let (sa, ea) = requiring(&world, 1);
    let (sb, eb) = requiring(&world, 2);
    outcome(&c, &job(&world, Trigger::ConnectionRequested, &sa, &ea)).await;
    let d = c
        .decide_only(&job(&world, Trigger::Sweep, &sb, &eb), &eb)
        .await
        .unwrap();
    assert_eq!(d.outcome.to_string(), "wait");
    assert!(d.reason.to_string().starts_with("capacity_limit"), "{d:?}");
    assert_eq!(world.registry.slots_in_use(), 1, "a dry run takes nothing");
    // Below the cap it shows the start.
    let c2 = capped(&world, "w2", 2);
    let d = c2
        .decide_only(&job(&world, Trigger::Sweep, &sb, &eb), &eb)
        .await
        .unwrap();
    assert_eq!(d.outcome.to_string(), "start");
}
