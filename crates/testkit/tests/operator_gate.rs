//! Queue messages are not operator commands (docs/SECURITY.md;
//! `sandbox_controller::operator_gate`): a `close`, `resolve` or `timeout_reported` job for
//! a session no record names, put on the events queue by anything that can write it,
//! changes nothing unless it carries an operator's proof made with the operator key. Run
//! on the twins and on local mode's real SQLite queue and registry.

use sandbox_controller::ports::{Clock as _, Compute, Outgoing, Queue, Registry};
use sandbox_controller::{Controller, ControllerConfig, Job};
use sandbox_core::evidence::{EffectState, Resolution};
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::operator_proof::OperatorKey;
use sandbox_core::session::SessionStatus;
use sandbox_local::SqliteRegistry;
use sandbox_local::sqlite_queue::{QueueOptions, SqliteQueue};
use sandbox_testkit::World;
use sandbox_testkit::clock::SimClock;
use sandbox_testkit::sessions::TwinSessions;
use std::sync::Arc;

fn operator_key() -> OperatorKey {
    OperatorKey::from_text("operator-key-for-the-gate-test-0123456789abcdef").unwrap()
}

fn forged_jobs(session: &SessionId, env: &EnvironmentId, now: u64) -> Vec<Job> {
    let job = |trigger: Trigger, proof: Option<String>| Job {
        handoffs: 0,
        swept: None,
        operator_proof: proof,
        trigger,
        session_id: session.clone(),
        environment_id: Some(env.clone()),
        webhook_id: None,
        enqueued_at: now,
    };
    let wrong_key = OperatorKey::from_text(&"w".repeat(40)).unwrap();
    let resolution = Resolution {
        effect: EffectState::Abandoned,
        by: "mallory".into(),
        at: now,
        note: None,
    };
    vec![
        // No proof at all.
        job(Trigger::Close, None),
        job(
            Trigger::Resolve {
                resolution: resolution.clone(),
            },
            None,
        ),
        job(
            Trigger::TimeoutReported {
                turn_id: None,
                submitted_at: now - 10,
            },
            None,
        ),
        // A proof made with another key.
        job(
            Trigger::Close,
            Some(wrong_key.sign(session, now, &Trigger::Close)),
        ),
        // The operator's proof for another session, replayed.
        job(
            Trigger::Close,
            Some(operator_key().sign(&SessionId::new("sess_other"), now, &Trigger::Close)),
        ),
        // The operator's proof for a `timeout_reported`, moved onto a close.
        job(
            Trigger::Close,
            Some(operator_key().sign(
                session,
                now,
                &Trigger::TimeoutReported {
                    turn_id: None,
                    submitted_at: now - 10,
                },
            )),
        ),
    ]
}

async fn send<Q: Queue>(queue: &Q, job: Job, dedup: &str) {
    queue
        .send(Outgoing {
            group: job.group().to_owned(),
            job,
            dedup_id: dedup.to_owned(),
            delay_secs: 0,
        })
        .await
        .unwrap();
}

/// Sends every forged job, consumes the queue, and checks nothing changed; then sends the
/// operator's signed close and checks that it, and only it, deletes the session.
async fn forged_then_signed<Q, R, C>(
    controller: &Controller<Q, R, C, TwinSessions>,
    events: &Q,
    registry: &R,
    compute: &C,
    sessions: &TwinSessions,
    clock: &SimClock,
) where
    Q: Queue,
    R: Registry,
    C: Compute,
{
    let session = SessionId::new("sess_not_ours");
    let env = EnvironmentId::new("env_not_ours");
    sessions.add(&session, &env, SessionStatus::Idle);
    let now = clock.now();
    for (i, job) in forged_jobs(&session, &env, now).into_iter().enumerate() {
        send(events, job, &format!("forged-{i}")).await;
    }
    let mut consumed = 0;
    while consumed < 6 {
        let n = controller.consume_once(events, 10, 0).await.unwrap();
        assert!(
            n > 0,
            "the forged jobs were not all received ({consumed} of 6)"
        );
        consumed += n;
    }
    assert!(
        sessions.deleted().is_empty(),
        "a forged job deleted a session"
    );
    assert!(sessions.get(&session).is_some());
    assert_eq!(registry.find_by_session(&session).await.unwrap(), None);
    assert_eq!(registry.get(&env.effect_key()).await.unwrap(), None);
    assert!(compute.list(&World::deployment()).await.unwrap().is_empty());
    assert_eq!(
        events.receive(10, 30, 0).await.unwrap().len(),
        0,
        "nothing left or retried"
    );

    // The control: the operator's own signed close (what `sandboxctl close --force` sends)
    // does act, so the refusal above is the gate's and not a dead path.
    let mut signed = forged_jobs(&session, &env, now).remove(0);
    signed.operator_proof = Some(operator_key().sign(&session, now, &Trigger::Close));
    send(events, signed, "signed").await;
    assert_eq!(controller.consume_once(events, 10, 0).await.unwrap(), 1);
    assert_eq!(
        sessions.deleted(),
        vec![session.clone()],
        "the signed close deletes it"
    );
}

fn config() -> ControllerConfig {
    let mut c = World::config("gate");
    c.operator_key = Some(operator_key());
    c
}

#[tokio::test]
async fn a_forged_close_for_an_unrecorded_session_changes_nothing() {
    // The twins.
    let world = World::new();
    let c = Controller::new(
        world.events.clone(),
        world.timers.clone(),
        world.registry.clone(),
        world.compute.clone(),
        world.sessions.clone(),
        Arc::new(world.clock.clone()),
        config(),
    );
    forged_then_signed(
        &c,
        &world.events,
        &world.registry,
        &world.compute,
        &world.sessions,
        &world.clock,
    )
    .await;

    // Local mode's real SQLite queue and registry (the files `serve` opens).
    let dir = tempfile::tempdir().unwrap();
    let clock = SimClock::new();
    let events =
        SqliteQueue::open(dir.path().join("queues.db"), "events", QueueOptions::fifo()).unwrap();
    let timers = SqliteQueue::open(
        dir.path().join("queues.db"),
        "timers",
        QueueOptions::standard(),
    )
    .unwrap();
    let registry = SqliteRegistry::open(dir.path().join("sandbox.db")).unwrap();
    let compute = sandbox_testkit::compute::TwinCompute::new(clock.clone());
    let sessions = TwinSessions::new();
    let c = Controller::new(
        events.clone(),
        timers,
        registry.clone(),
        compute.clone(),
        sessions.clone(),
        Arc::new(clock.clone()),
        config(),
    );
    forged_then_signed(&c, &events, &registry, &compute, &sessions, &clock).await;
}

/// Without an operator key configured, even a well-formed proof is refused: the gate
/// fails closed.
#[tokio::test]
async fn without_an_operator_key_every_unrecorded_operator_job_is_refused() {
    let world = World::new();
    let c = world.controller("gate");
    let session = SessionId::new("sess_not_ours");
    let env = EnvironmentId::new("env_not_ours");
    world.sessions.add(&session, &env, SessionStatus::Idle);
    let mut job = forged_jobs(&session, &env, world.clock.now()).remove(0);
    job.operator_proof = Some(operator_key().sign(&session, job.enqueued_at, &Trigger::Close));
    let p = c.process(&job).await.unwrap();
    assert_eq!(
        p.note,
        Some(sandbox_controller::operator_gate::REFUSED_NOTE)
    );
    assert!(world.sessions.deleted().is_empty());
}
