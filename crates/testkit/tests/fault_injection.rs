//! Fault injection (part 5): every port fails on demand — throttling, timeouts,
//! 5xx, lost responses, failed starts with HTTP 200, `MISSING` read-backs, conditional-
//! check failures — and the controller loses nothing, never loops tightly (every retry
//! waits, observably, in simulated time), and never starts or stops on missing evidence.

use sandbox_controller::Disposition;
use sandbox_controller::ports::Queue;
use sandbox_core::compute::ComputeStatus;
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::record::RecordStatus;
use sandbox_core::session::SessionStatus;
use sandbox_testkit::compute::ComputeEvent;
use sandbox_testkit::world::TwinController;
use sandbox_testkit::{ComputeTiming, Fault, World};

/// One handled message: when (seconds since the test began), which queue, the outcome or
/// note, and what was decided about the message.
#[derive(Clone, Debug)]
#[allow(dead_code)] // Fields are read through Debug in failure messages.
struct Handled {
    at: u64,
    timers: bool,
    /// The job came from a webhook (the events queue, or handed off to the timers queue).
    webhook: bool,
    what: String,
    retry: Option<u32>,
}

struct Run {
    world: World,
    c: TwinController,
    t0: u64,
    log: Vec<Handled>,
    /// The executor connects as soon as its compute runs (the session goes idle).
    auto_connect: bool,
}

fn s1() -> (SessionId, EnvironmentId) {
    (SessionId::new("sess_f1"), EnvironmentId::new("env_f1"))
}

impl Run {
    fn new(world: World) -> Self {
        let c = world.controller("faults");
        let t0 = world.clock.now_ms() / 1_000;
        Self {
            world,
            c,
            t0,
            log: vec![],
            auto_connect: true,
        }
    }

    /// Faults stop; the dead letters of both queues are redriven (the operator's move
    /// after the DLQ alarm).
    fn recover(&self) {
        self.world.faults.clear();
        self.world.events.redrive();
        self.world.timers.redrive();
    }

    fn connect_running(&self) {
        if !self.auto_connect {
            return;
        }
        for i in self.world.compute.instances() {
            if i.status == ComputeStatus::Running
                && let Some(s) = &i.session_id
                && self
                    .world
                    .sessions
                    .get(s)
                    .is_some_and(|s| s.requires_connection_of(&i.environment_id))
            {
                self.world
                    .sessions
                    .connect(&i.environment_id, SessionStatus::Idle);
            }
        }
    }

    fn now(&self) -> u64 {
        self.world.clock.now_ms() / 1_000 - self.t0
    }

    /// Handles every visible message of both queues, one at a time.
    async fn drain_visible(&mut self) {
        loop {
            let mut any = false;
            for timers in [false, true] {
                let q = if timers {
                    &self.world.timers
                } else {
                    &self.world.events
                };
                let Some(msg) = q.receive(1, 60, 0).await.unwrap().into_iter().next() else {
                    continue;
                };
                any = true;
                let webhook = msg.job.webhook_id.is_some();
                let cq = if timers {
                    &self.c.timers
                } else {
                    &self.c.events
                };
                let result = self.c.handle(cq, &msg).await;
                let (what, retry) = match result {
                    Ok(p) => (
                        p.outcome()
                            .map(|o| o.to_string())
                            .or(p.note.map(str::to_owned))
                            .unwrap_or_default(),
                        match p.disposition {
                            Disposition::Done => None,
                            Disposition::RetryAfter(s) => Some(s),
                        },
                    ),
                    Err(e) => (format!("error: {e}"), Some(0)),
                };
                let at = self.now();
                self.log.push(Handled {
                    at,
                    timers,
                    webhook,
                    what,
                    retry,
                });
            }
            self.connect_running();
            if !any {
                return;
            }
        }
    }

    /// Runs the world for `secs` simulated seconds: drain, jump to the next visible
    /// message (never more than `step` seconds at once), repeat.
    async fn run_for(&mut self, secs: u64) {
        let end = self.world.clock.now_ms() + secs * 1_000;
        while self.world.clock.now_ms() < end {
            self.drain_visible().await;
            let now = self.world.clock.now_ms();
            let next = [
                self.world.events.next_visible_at_ms(),
                self.world.timers.next_visible_at_ms(),
            ]
            .into_iter()
            .flatten()
            .filter(|t| *t > now)
            .min()
            .unwrap_or(end)
            .min(end);
            self.world.clock.advance_to_ms(next.max(now + 1));
        }
        self.drain_visible().await;
    }

    async fn sweep(&mut self) {
        let _ = self.c.sweep().await;
        self.drain_visible().await;
    }

    fn starts(&self) -> usize {
        self.world
            .compute
            .events()
            .iter()
            .filter(|e| matches!(e, ComputeEvent::Started { created: true, .. }))
            .count()
    }

    fn stops(&self) -> usize {
        self.world
            .compute
            .events()
            .iter()
            .filter(|e| matches!(e, ComputeEvent::Stopped { .. }))
            .count()
    }

    /// Times (seconds) at which the webhook jobs were handled (on either queue).
    fn event_times(&self) -> Vec<u64> {
        self.log
            .iter()
            .filter(|h| h.webhook)
            .map(|h| h.at)
            .collect()
    }

    /// Webhook jobs still held anywhere: queued, in flight or dead-lettered.
    fn webhook_jobs_kept(&self) -> usize {
        let q = |q: &sandbox_testkit::TwinQueue| {
            q.messages()
                .iter()
                .chain(q.dead_letters().iter())
                .filter(|m| m.msg.job.webhook_id.is_some())
                .count()
        };
        q(&self.world.events) + q(&self.world.timers)
    }
}

/// A session that requires a connection, delivered once.
async fn connection_requested(world: &World) {
    let (s, e) = s1();
    world.sessions.add(&s, &e, SessionStatus::Idle);
    world.sessions.require_connection(&s);
    world
        .deliver(Trigger::ConnectionRequested, &s, None, "wh_f1", "wh_f1")
        .await
        .unwrap();
}

/// A session with a running, connected compute, idle, with a lease already due.
async fn idle_with_running_compute() -> Run {
    let world = World::new();
    let (s, e) = s1();
    connection_requested(&world).await;
    let mut run = Run::new(world);
    run.drain_visible().await;
    assert_eq!(run.world.compute.active_of(&e).len(), 1);
    run.world.sessions.connect(&e, SessionStatus::Idle);
    run.world
        .deliver(Trigger::Idle, &s, Some(&e), "wh_f2", "wh_f2")
        .await
        .unwrap();
    run.drain_visible().await;
    assert!(
        run.world
            .registry
            .record(&e.effect_key())
            .unwrap()
            .lease
            .is_some()
    );
    run.log.clear();
    run
}

fn gaps(times: &[u64]) -> Vec<u64> {
    times.windows(2).map(|w| w[1] - w[0]).collect()
}

#[tokio::test]
async fn agents_api_outage_starts_nothing_and_retries_with_observable_backoff() {
    for fault in [Fault::ServerError, Fault::Timeout, Fault::Throttled] {
        let world = World::new();
        world.faults.fail_always("agents_api", None, fault.clone());
        connection_requested(&world).await;
        let mut run = Run::new(world);
        run.run_for(600).await;
        assert_eq!(run.starts(), 0, "{fault:?}: a start on missing evidence");
        let times = run.event_times();
        assert!(times.len() >= 3, "{fault:?}: retried: {:?}", run.log);
        assert!(
            gaps(&times).iter().all(|g| *g >= 15),
            "{fault:?}: retries wait at least uncertain_retry_secs (15 s): {times:?}"
        );
        // Nothing lost: the job is still queued or dead-lettered, never dropped.
        assert_eq!(run.webhook_jobs_kept(), 1, "{fault:?}: the job is kept");

        // The API recovers; dead letters are redriven: the start happens, once, by the
        // time the job's (doubling, ≤ 900 s) hand-off delay has passed.
        run.recover();
        run.run_for(900).await;
        assert_eq!(run.starts(), 1, "{fault:?}: recovered: {:?}", run.log);
    }
}

#[tokio::test]
async fn a_running_compute_is_never_stopped_while_the_session_cannot_be_read() {
    let mut run = idle_with_running_compute().await;
    let (_, e) = s1();
    run.world
        .faults
        .fail_always("agents_api", Some("retrieve_session"), Fault::Timeout);
    run.run_for(1_200).await;
    run.sweep().await;
    assert_eq!(run.stops(), 0, "a stop on missing evidence: {:?}", run.log);
    assert_eq!(run.world.compute.active_of(&e).len(), 1);
    let lease_checks: Vec<u64> = run.log.iter().filter(|h| h.timers).map(|h| h.at).collect();
    assert!(
        gaps(&lease_checks).iter().all(|g| *g >= 15),
        "no tight loop on the lease recheck: {lease_checks:?}"
    );

    run.recover();
    run.run_for(120).await;
    run.sweep().await;
    assert_eq!(
        run.world.compute.live_of(&e).len(),
        0,
        "stopped once the evidence is back"
    );
    assert_eq!(run.stops(), 1);
}

/// The read of the recorded compute is the evidence: while the provider cannot be read
/// (throttled), a connection request for an environment whose compute died starts and
/// stops nothing; once it can, the dead compute reads back stopped and generation 2 starts.
#[tokio::test]
async fn provider_read_outage_starts_and_stops_nothing() {
    let world = World::new();
    let (s, e) = s1();
    connection_requested(&world).await;
    let mut run = Run::new(world);
    run.auto_connect = false;
    run.drain_visible().await;
    let first = run.world.compute.active_of(&e);
    assert_eq!(first.len(), 1, "{:?}", run.log);
    run.world.compute.kill(&first[0].instance_id);
    for op in ["describe", "describe_many", "list"] {
        run.world
            .faults
            .fail_always("compute", Some(op), Fault::Throttled);
    }
    run.world.sessions.require_connection(&s);
    run.world
        .deliver(Trigger::ConnectionRequested, &s, None, "wh_f9", "wh_f9")
        .await
        .unwrap();
    run.log.clear();
    run.run_for(300).await;
    run.sweep().await;
    assert_eq!(run.starts(), 1, "only the first start: {:?}", run.log);
    assert_eq!(run.stops(), 0);
    assert!(
        run.log.iter().any(|h| h.what == "uncertain"),
        "the decision waits for evidence: {:?}",
        run.log
    );
    assert_eq!(run.webhook_jobs_kept(), 1, "the job is kept");
    run.recover();
    run.auto_connect = true;
    run.run_for(900).await;
    assert_eq!(run.starts(), 2, "{:?}", run.log);
    let record = run.world.registry.record(&e.effect_key()).unwrap();
    assert_eq!(record.instance.map(|i| i.generation.0), Some(2));
}

#[tokio::test]
async fn failed_starts_with_http_200_back_off_and_never_loop() {
    let world = World::new();
    world.faults.fail_always(
        "compute",
        Some("start"),
        Fault::FailedStart("RESOURCE:FARGATE capacity".to_owned()),
    );
    connection_requested(&world).await;
    let mut run = Run::new(world);
    let (_, e) = s1();
    for _ in 0..12 {
        run.run_for(600).await;
        run.world.events.redrive();
        run.world.timers.redrive();
        run.sweep().await;
    }
    let attempts: Vec<u64> = run
        .world
        .faults
        .fired()
        .iter()
        .filter(|f| matches!(f.fault, Fault::FailedStart(_)))
        .map(|_| 0)
        .collect();
    let policy = &run.c.config.policy;
    // max_start_attempts within the backoff, then one more per cooldown (1 h): never a loop.
    let allowed = policy.max_start_attempts as usize
        + (2 * 3_600 / policy.start_failing_cooldown_secs) as usize;
    assert!(
        attempts.len() <= allowed,
        "at most {allowed} attempts in 2 h, got {}: {:?}",
        attempts.len(),
        run.log
    );
    let record = run.world.registry.record(&e.effect_key()).unwrap();
    let failure = record.start_failure.expect("the failure is recorded");
    assert_eq!(failure.attempts as usize, attempts.len());
    assert!(failure.reason.contains("capacity"));
    assert_eq!(
        run.world.compute.instances().len(),
        0,
        "nothing was created"
    );
    // The spacing of the attempts follows the start backoff (15, 30, 60, 120 s, ...).
    let start_times: Vec<u64> = run
        .log
        .iter()
        .filter(|h| h.what.starts_with("start"))
        .map(|h| h.at)
        .collect();
    for (n, gap) in gaps(&start_times).iter().enumerate() {
        let want = policy.start_backoff_secs(n as u32 + 1);
        assert!(
            *gap >= want,
            "attempt {} came {gap} s after the previous, want ≥ {want}: {start_times:?}",
            n + 2
        );
    }
}

/// RunTask started the task but its response was lost: the worker leaves the lock
/// unclean, so the retried job reads the environment's live instances (`find`, constant
/// cost) and adopts the task instead of starting a second (a start would replay the same
/// idempotency token anyway: ECS `clientToken`, 24 h). No deployment-wide list.
#[tokio::test]
async fn a_start_whose_response_was_lost_is_adopted_not_repeated() {
    let world = World::new();
    world
        .faults
        .fail("compute", Some("start"), Fault::LostResponse, 1);
    connection_requested(&world).await;
    let mut run = Run::new(world);
    run.auto_connect = false;
    let (_, e) = s1();
    run.run_for(120).await;
    run.sweep().await;
    assert_eq!(
        run.world.compute.instances().len(),
        1,
        "one compute: {:?}",
        run.log
    );
    assert_eq!(run.starts(), 1);
    let record = run.world.registry.record(&e.effect_key()).unwrap();
    let live = run.world.compute.active_of(&e);
    assert_eq!(
        record.instance,
        Some(live[0].as_ref()),
        "the record names it"
    );
}

/// The same lost response, but the executor connected and the session went idle before
/// the retry: nothing asks for a start any more, yet the retried job (unclean lock) reads
/// the environment's live instances and adopts the task, and the idle lease stops it after
/// its grace. One compute at most, and nothing left running unowned.
#[tokio::test]
async fn a_lost_start_that_is_no_longer_needed_is_adopted_then_leased_out() {
    let world = World::new();
    world
        .faults
        .fail("compute", Some("start"), Fault::LostResponse, 1);
    connection_requested(&world).await;
    let mut run = Run::new(world);
    let (_, e) = s1();
    run.run_for(120).await;
    let record = run.world.registry.record(&e.effect_key()).unwrap();
    let live = run.world.compute.live_of(&e);
    assert_eq!(record.instance, Some(live[0].as_ref()), "{:?}", run.log);
    run.world
        .deliver(Trigger::Idle, &s1().0, Some(&e), "wh_f4", "wh_f4")
        .await
        .unwrap();
    run.run_for(400).await;
    assert_eq!(run.world.compute.live_of(&e).len(), 0, "{:?}", run.log);
    assert_eq!(run.starts(), 1);
}

#[tokio::test]
async fn a_conflicting_record_write_after_a_start_is_healed_with_one_compute() {
    let world = World::new();
    world
        .faults
        .fail("registry", Some("put"), Fault::Conflict, 1);
    connection_requested(&world).await;
    let mut run = Run::new(world);
    let (_, e) = s1();
    run.run_for(120).await;
    run.sweep().await;
    assert_eq!(run.world.compute.instances().len(), 1, "{:?}", run.log);
    let record = run.world.registry.record(&e.effect_key()).unwrap();
    assert_eq!(
        record.instance,
        Some(run.world.compute.active_of(&e)[0].as_ref())
    );
}

#[tokio::test]
async fn a_refused_lock_retries_later_not_at_once() {
    let world = World::new();
    world
        .faults
        .fail("registry", Some("lock"), Fault::Conflict, 3);
    connection_requested(&world).await;
    let mut run = Run::new(world);
    run.run_for(60).await;
    let times = run.event_times();
    assert!(times.len() >= 4, "{:?}", run.log);
    assert!(
        gaps(&times).iter().all(|g| *g >= 2),
        "lock_busy_retry_secs: {times:?}"
    );
    assert_eq!(run.starts(), 1);
}

#[tokio::test]
async fn a_registry_outage_backs_off_exponentially_and_loses_nothing() {
    let world = World::new();
    world.faults.fail_always("registry", None, Fault::Throttled);
    connection_requested(&world).await;
    let mut run = Run::new(world);
    run.run_for(120).await;
    let times = run.event_times();
    let g = gaps(&times);
    assert!(g.len() >= 3, "{:?}", run.log);
    assert!(
        g.windows(2).all(|w| w[1] >= w[0]) && g[0] >= 2,
        "growing backoff: {times:?}"
    );
    assert_eq!(run.starts(), 0, "nothing started without a lock");
    assert_eq!(run.webhook_jobs_kept(), 1, "the job is kept");
    run.recover();
    run.run_for(600).await;
    assert_eq!(run.starts(), 1, "{:?}", run.log);
}

#[tokio::test]
async fn a_lost_ack_redelivers_and_the_ledger_makes_it_a_no_op() {
    let world = World::new();
    world
        .faults
        .fail("queue", Some("ack"), Fault::ServerError, 1);
    connection_requested(&world).await;
    let mut run = Run::new(world);
    run.run_for(120).await;
    assert_eq!(run.starts(), 1);
    assert!(
        run.log.iter().any(|h| h.what == "duplicate delivery"),
        "the redelivery was recognised: {:?}",
        run.log
    );
    assert!(run.world.events.is_empty());
}

#[tokio::test]
async fn missing_on_the_stop_read_back_never_lets_a_second_compute_overlap() {
    // Stops take 30 s on this provider; the first read-back answers MISSING.
    let world = World::with_timing(ComputeTiming {
        start_secs: 0,
        stop_secs: 30,
    });
    let (s, e) = s1();
    connection_requested(&world).await;
    let mut run = Run::new(world);
    run.drain_visible().await;
    run.world.sessions.connect(&e, SessionStatus::Idle);
    run.world
        .deliver(Trigger::Idle, &s, Some(&e), "wh_f2", "wh_f2")
        .await
        .unwrap();
    run.drain_visible().await;
    // The lease's job reads the task by id (answered), stops it, then reads it back.
    run.world
        .faults
        .fail_after("compute", Some("describe"), Fault::Missing, 1, 1);
    run.world.clock.advance_secs(301);
    run.drain_visible().await;
    assert_eq!(run.stops(), 1, "{:?}", run.log);
    // New work right away, while the old compute is still stopping.
    run.world.sessions.require_connection(&s);
    run.world
        .deliver(Trigger::ConnectionRequested, &s, None, "wh_f3", "wh_f3")
        .await
        .unwrap();
    for _ in 0..60 {
        run.drain_visible().await;
        let live = run.world.compute.live_of(&e);
        assert!(live.len() <= 1, "two live computes: {live:?}");
        run.world.clock.advance_secs(1);
    }
    run.run_for(60).await;
    let live = run.world.compute.live_of(&e);
    assert_eq!(live.len(), 1, "{:?}", run.log);
    assert_eq!(live[0].status, ComputeStatus::Running);
}

#[tokio::test]
async fn a_storm_of_random_transient_faults_loses_nothing() {
    for seed in 0..20u64 {
        let world = World::new();
        for port in ["agents_api", "registry", "compute", "queue"] {
            for fault in [Fault::Throttled, Fault::Timeout, Fault::LostResponse] {
                world.faults.fail_randomly(port, None, fault, 4, seed);
            }
        }
        world
            .faults
            .fail_randomly("registry", None, Fault::Conflict, 4, seed);
        world
            .faults
            .fail_randomly("compute", None, Fault::Missing, 10, seed);
        let envs: Vec<(SessionId, EnvironmentId)> = (0..3)
            .map(|i| {
                (
                    SessionId::new(format!("sess_storm_{i}")),
                    EnvironmentId::new(format!("env_storm_{i}")),
                )
            })
            .collect();
        for (i, (s, e)) in envs.iter().enumerate() {
            world.sessions.add(s, e, SessionStatus::Idle);
            world.sessions.require_connection(s);
            let wh = format!("wh_storm_{i}");
            world
                .deliver(Trigger::ConnectionRequested, s, None, &wh, &wh)
                .await
                .unwrap();
        }
        let mut run = Run::new(world);
        run.auto_connect = false;
        // Executors never connect here by design (environment 2 is replaced every connect
        // deadline for the whole run): the replacement cap, tested on its own
        // (crates/core/tests/ceilings.rs, the lifecycle rows), is off.
        run.c.config.policy.max_replacements = 0;
        run.run_for(900).await;
        // Environment 0 connects and goes idle, 1 is deleted, 2 still needs its executor.
        run.world.sessions.connect(&envs[0].1, SessionStatus::Idle);
        run.world
            .deliver(
                Trigger::Idle,
                &envs[0].0,
                Some(&envs[0].1),
                "wh_storm_idle",
                "wh_storm_idle",
            )
            .await
            .unwrap();
        run.world.sessions.remove(&envs[1].0);
        run.run_for(900).await;
        run.recover();
        for _ in 0..4 {
            run.sweep().await;
            run.run_for(400).await;
        }
        let live = |i: usize| run.world.compute.live_of(&envs[i].1).len();
        assert_eq!(
            (live(0), live(1), live(2)),
            (0, 0, 1),
            "seed {seed}: {:?}",
            run.log
        );
        let r2 = run.world.registry.record(&envs[2].1.effect_key()).unwrap();
        assert_eq!(r2.status, RecordStatus::Active);
        assert_eq!(
            r2.instance,
            Some(run.world.compute.active_of(&envs[2].1)[0].as_ref())
        );
        // The deleted session's record, if it got one, is closed.
        let r1 = run.world.registry.record(&envs[1].1.effect_key());
        assert!(
            r1.is_none_or(|r| r.status == RecordStatus::Closed),
            "seed {seed}"
        );
    }
}
