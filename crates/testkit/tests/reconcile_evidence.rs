//! Reconcile with evidence through the worker over the twins: evidence recorded on the record, held
//! compute, an owner's resolution through the lock path, timed-out submissions answered
//! without resubmitting, turn evidence before stops, and the mapping fields.

use sandbox_controller::job::Job;
use sandbox_controller::ports::{Clock as _, Outgoing, Queue as _};
use sandbox_core::compute::ComputeStatus;
use sandbox_core::decision::Outcome;
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::evidence::{EffectState, EvidenceTrigger, Resolution, SubmissionOutcome};
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::record::{Record, RecordStatus};
use sandbox_core::session::SessionStatus;
use sandbox_core::turn::{Item, Turn};
use sandbox_testkit::world::{TwinController, World};
use serde_json::json;

fn turn(id: &str, status: &str, created_at: i64) -> Turn {
    serde_json::from_value(json!({
        "id": id, "object": "agent.session.turn", "session_id": "sess_ev",
        "status": status, "created_at": created_at, "error": null
    }))
    .unwrap()
}

fn item(id: &str, kind: &str, status: &str) -> Item {
    serde_json::from_value(json!({"id": id, "type": kind, "status": status})).unwrap()
}

struct Env {
    world: World,
    c: TwinController,
    session: SessionId,
    env: EnvironmentId,
}

impl Env {
    /// A session that requires its environment's connection; nothing started yet.
    fn requiring(session: &str, env: &str) -> Self {
        let world = World::new();
        let c = world.controller("w");
        let (session, env) = (SessionId::new(session), EnvironmentId::new(env));
        world.sessions.add(&session, &env, SessionStatus::Idle);
        world.sessions.require_connection(&session);
        Self {
            world,
            c,
            session,
            env,
        }
    }

    /// A session whose executor started and connected, idle.
    async fn running() -> Self {
        let e = Self::requiring("sess_ev", "env_ev");
        e.deliver(Trigger::ConnectionRequested, "wh_1").await;
        e.world.sessions.connect(&e.env, SessionStatus::Idle);
        e
    }

    async fn deliver(&self, trigger: Trigger, webhook: &str) -> Vec<Outcome> {
        self.world
            .deliver(trigger, &self.session, Some(&self.env), webhook, webhook)
            .await
            .unwrap();
        self.drain(false).await
    }

    /// Enqueues an operator or application job (no webhook id) and processes it.
    async fn job(&self, trigger: Trigger) -> Vec<Outcome> {
        let now = self.world.clock.now();
        let job = Job {
            handoffs: 0,
            swept: None,
            operator_proof: None,
            trigger,
            session_id: self.session.clone(),
            environment_id: Some(self.env.clone()),
            webhook_id: None,
            enqueued_at: now,
        };
        self.world
            .events
            .send(Outgoing {
                group: job.group().to_owned(),
                dedup_id: format!("op-{now}-{:?}", job.trigger),
                job,
                delay_secs: 0,
            })
            .await
            .unwrap();
        self.drain(false).await
    }

    /// Processes every visible message of one queue; returns the outcomes.
    async fn drain(&self, timers: bool) -> Vec<Outcome> {
        let mut out = vec![];
        for _ in 0..20 {
            let (q, cq) = if timers {
                (&self.world.timers, &self.c.timers)
            } else {
                (&self.world.events, &self.c.events)
            };
            let Some(msg) = q.receive(1, 60, 0).await.unwrap().into_iter().next() else {
                break;
            };
            let p = self.c.handle(cq, &msg).await.unwrap();
            out.extend(p.outcome());
        }
        out
    }

    /// Lets `secs` pass and processes the rechecks that became due.
    async fn after(&self, secs: u64) -> Vec<Outcome> {
        self.world.clock.advance_secs(secs);
        self.drain(true).await
    }

    fn record(&self) -> Record {
        self.world.registry.record(&self.env.effect_key()).unwrap()
    }

    fn live(&self) -> usize {
        self.world
            .compute
            .instances()
            .iter()
            .filter(|i| i.environment_id == self.env && i.status.is_live())
            .count()
    }
}

fn resolution() -> Resolution {
    Resolution {
        effect: EffectState::Observed,
        by: "alice".into(),
        at: 0,
        note: Some("the deploy ran once".into()),
    }
}

#[tokio::test]
async fn row20_mid_turn_disconnect_is_held_with_evidence_until_resolved_then_stops() {
    let e = Env::running().await;
    assert_eq!(e.live(), 1);
    e.world.sessions.push_turn(
        &e.session,
        turn("turn_9", "completed", 1_764_400_100),
        vec![
            item("msg_1", "agent_message", "completed"),
            item("item_3", "command_execution", "failed"),
            item("item_4", "function_call", "completed"),
        ],
    );
    e.world
        .sessions
        .set_environment_status(&e.env, EnvironmentStatus::Disconnected);
    let out = e.deliver(Trigger::Idle, "wh_idle_1").await;
    assert_eq!(out, vec![Outcome::Reconcile]);
    let r = e.record();
    assert_eq!(r.evidence.len(), 1, "{r:?}");
    let ev = &r.evidence[0];
    assert_eq!(ev.trigger, EvidenceTrigger::MidTurnDisconnect);
    assert_eq!(ev.turn.as_ref().unwrap().id, "turn_9");
    assert_eq!(ev.tools.len(), 1, "only the tool that did not complete");
    assert_eq!(ev.tools[0].id, "item_3");
    assert_eq!(ev.workspace.live_in, r.instance);
    assert_eq!(ev.effect, EffectState::Unknown);
    assert!(r.lease.is_none(), "no lease while held");
    assert_eq!(
        r.connection.map(|c| c.status),
        Some(EnvironmentStatus::Disconnected)
    );
    assert_eq!(r.last_reconciled_event_id.as_deref(), Some("wh_idle_1"));

    // Another idle, and sweeps long after the grace: still held, still running.
    assert_eq!(
        e.deliver(Trigger::Idle, "wh_idle_2").await,
        vec![Outcome::Reconcile]
    );
    e.world.clock.advance_secs(3_600);
    e.c.sweep().await.unwrap();
    e.drain(true).await;
    assert_eq!(e.live(), 1, "the held compute is not stopped");
    assert_eq!(e.record().evidence.len(), 1, "recorded once");

    // The owner resolves it through the lock path; the next idle stop proceeds.
    let out = e
        .job(Trigger::Resolve {
            resolution: resolution(),
        })
        .await;
    assert_eq!(out, vec![Outcome::Ignore]);
    let r = e.record();
    assert_eq!(r.evidence[0].effect, EffectState::Observed);
    assert_eq!(r.evidence[0].resolution.as_ref().unwrap().by, "alice");
    e.after(2).await; // the recheck: a lease
    assert!(e.record().lease.is_some());
    let grace = e.c.config.policy.shutdown_grace_secs;
    let out = e.after(grace + 1).await;
    assert!(out.contains(&Outcome::Stop), "{out:?}");
    assert_eq!(e.live(), 0);
    assert_eq!(e.record().status, RecordStatus::Stopped);
}

#[tokio::test]
async fn lease_due_stop_with_a_queued_turn_is_cancelled() {
    let e = Env::running().await;
    assert_eq!(
        e.deliver(Trigger::Idle, "wh_idle").await,
        vec![Outcome::ScheduleStop]
    );
    // Input arrived, its turn is queued, the session still reads idle (agents-api.md:
    // idle can arrive just before queued input starts).
    e.world
        .sessions
        .push_turn(&e.session, turn("turn_q", "queued", 1_764_400_200), vec![]);
    let grace = e.c.config.policy.shutdown_grace_secs;
    let out = e.after(grace + 1).await;
    assert!(out.contains(&Outcome::CancelStop), "{out:?}");
    assert!(!out.contains(&Outcome::Stop), "{out:?}");
    assert_eq!(e.live(), 1);
    assert!(e.record().lease.is_none());
    let stopped = e
        .world
        .compute
        .instances()
        .iter()
        .any(|i| i.status == ComputeStatus::Stopped);
    assert!(!stopped);
}

#[tokio::test]
async fn row21_reported_timeouts_record_four_outcomes_and_never_resubmit() {
    let e = Env::running().await;
    let t0 = e.world.clock.now();
    e.world.sessions.push_turn(
        &e.session,
        turn("turn_done", "completed", t0 as i64),
        vec![item("item_1", "command_execution", "completed")],
    );
    e.world.sessions.push_turn(
        &e.session,
        turn("turn_run", "in_progress", t0 as i64 + 5),
        vec![item("item_2", "command_execution", "in_progress")],
    );
    e.world.sessions.push_turn(
        &e.session,
        turn("turn_bad", "failed", t0 as i64 + 6),
        vec![],
    );
    let turns_before = 3;
    for (turn_id, submitted_at) in [
        (Some("turn_done"), t0),
        (Some("turn_run"), t0),
        (Some("turn_bad"), t0),
        (None, t0 + 100),
    ] {
        let out = e
            .job(Trigger::TimeoutReported {
                turn_id: turn_id.map(str::to_owned),
                submitted_at,
            })
            .await;
        assert_eq!(out, vec![Outcome::Reconcile], "{turn_id:?}");
    }
    let got: Vec<_> = e
        .record()
        .evidence
        .iter()
        .map(|x| (x.turn.as_ref().map(|t| t.id.clone()), x.submission))
        .collect();
    assert_eq!(
        got,
        vec![
            (Some("turn_done".into()), Some(SubmissionOutcome::Completed)),
            (
                Some("turn_run".into()),
                Some(SubmissionOutcome::StillRunning)
            ),
            (Some("turn_bad".into()), Some(SubmissionOutcome::Failed)),
            (None, Some(SubmissionOutcome::NotFound)),
        ]
    );
    let running = &e.record().evidence[1];
    assert_eq!(running.tools[0].id, "item_2", "the tool still running");
    // Nothing was submitted: the twin holds the same turns.
    let turns = e
        .world
        .sessions
        .get(&e.session)
        .map(|_| e.world.sessions.turn_count(&e.session))
        .unwrap();
    assert_eq!(turns, turns_before);
}

/// The time from `RunTask` to the executor connected. The first job after the
/// connection request is answered (the session's `in_progress`) reads the environment once,
/// records when it first saw this instance connected and the `start_to_connected_seconds`
/// metric; later jobs read nothing more for it, and a new instance starts over.
#[tokio::test]
async fn the_first_job_after_the_connection_request_records_when_the_executor_connected() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);

    let e = Env::requiring("sess_cx", "env_cx");
    assert_eq!(
        e.deliver(Trigger::ConnectionRequested, "wh_cx_1").await,
        vec![Outcome::Start]
    );
    let started = e.record();
    assert!(started.connection_requested_at.is_some() && started.instance_connected_at.is_none());

    e.world.clock.advance_secs(40);
    e.world.sessions.connect(&e.env, SessionStatus::InProgress);
    e.world.calls.clear();
    e.deliver(Trigger::TurnStarted, "wh_cx_2").await;
    let calls = e.world.calls.take();
    assert_eq!(
        calls.of("agents_api", "retrieve_environment"),
        1,
        "{}",
        calls.remote_sequence()
    );
    let r = e.record();
    let connected_at = r.instance_connected_at.expect("connection observed");
    assert_eq!(
        connected_at - started.instance_recorded_at.unwrap(),
        40,
        "{r:?}"
    );
    let seconds: Vec<f64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == "start_to_connected_seconds")
        .flat_map(|(.., v)| match v {
            DebugValue::Histogram(h) => h.into_iter().map(|x| x.into_inner()).collect(),
            _ => vec![],
        })
        .collect();
    assert_eq!(seconds, vec![40.0]);

    // Observed once: the next job neither reads the status for it nor records it again.
    e.world.calls.clear();
    e.deliver(Trigger::TurnStarted, "wh_cx_3").await;
    assert_eq!(
        e.world
            .calls
            .take()
            .of("agents_api", "retrieve_environment"),
        0
    );
    assert_eq!(e.record().instance_connected_at, Some(connected_at));
}

/// A held compute stopped anyway (its maximum lifetime): the snapshot of its files is
/// named in the open evidence, the entry no longer holds compute, and retention keeps
/// that snapshot while the question is open, even past `snapshot_keep`.
#[tokio::test]
async fn a_held_generation_stopped_anyway_names_its_snapshot_and_retention_keeps_it() {
    let e = Env::running().await;
    e.world.sessions.push_turn(
        &e.session,
        turn("turn_9", "completed", 1_764_400_100),
        vec![item("item_3", "command_execution", "failed")],
    );
    e.world
        .sessions
        .set_environment_status(&e.env, EnvironmentStatus::Disconnected);
    assert_eq!(
        e.deliver(Trigger::Idle, "wh_idle_1").await,
        vec![Outcome::Reconcile]
    );
    assert!(e.record().holding_evidence().is_some());

    // Past the maximum lifetime the held compute stops; its files are saved.
    e.world
        .clock
        .advance_secs(e.c.config.policy.max_lifetime_secs + 1);
    e.c.sweep().await.unwrap();
    e.drain(true).await;
    assert_eq!(e.live(), 0);
    let r = e.record();
    let snapshot = r.latest_snapshot().expect("saved").snapshot_id.clone();
    assert_eq!(
        r.evidence[0].workspace.snapshot.as_deref(),
        Some(snapshot.as_str()),
        "{r:?}"
    );
    assert!(r.evidence[0].is_open() && r.holding_evidence().is_none());

    // Generation 2 runs and stops (keep 1): generation 1's snapshot stays for the owner.
    e.world.sessions.require_connection(&e.session);
    e.deliver(Trigger::ConnectionRequested, "wh_2").await;
    e.world.sessions.connect(&e.env, SessionStatus::Idle);
    e.deliver(Trigger::Idle, "wh_idle_2").await;
    e.after(e.c.config.policy.shutdown_grace_secs + 1).await;
    let r = e.record();
    assert_eq!(r.status, RecordStatus::Stopped, "{r:?}");
    let ids: Vec<&str> = r.snapshots.iter().map(|s| s.snapshot_id.as_str()).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(ids[0], snapshot, "the evidence's snapshot is kept");
}

/// A close with open evidence waits for `resolve` (nothing deleted, nothing
/// stopped, no terminal record); once resolved it ends by storing the terminal record
/// once, as its own item, with seed 001's fields; a later close leaves it as it was; a
/// close forced past open evidence says so.
#[tokio::test]
async fn close_writes_the_terminal_record_once() {
    use sandbox_controller::ports::Registry as _;
    use std::time::Duration;
    let e = Env::running().await;
    e.world.sessions.push_turn(
        &e.session,
        turn("turn_9", "completed", 1_764_400_100),
        vec![item("item_3", "command_execution", "failed")],
    );
    e.world
        .sessions
        .set_environment_status(&e.env, EnvironmentStatus::Disconnected);
    assert_eq!(
        e.deliver(Trigger::Idle, "wh_idle_t").await,
        vec![Outcome::Reconcile]
    );
    assert_eq!(e.record().open_evidence().count(), 1);
    let key = e.env.effect_key();

    // The close waits: the session is not deleted, the compute keeps running.
    let report =
        e.c.close(&e.session, 3, Duration::from_millis(1))
            .await
            .unwrap();
    assert!(!report.closed, "{report:?}");
    assert!(report.receipts.is_empty(), "{report:?}");
    assert_eq!(e.live(), 1);
    assert!(e.record().cleanup_required, "the close stops new work");
    assert!(e.world.registry.terminal(&key).await.unwrap().is_none());
    assert!(
        e.world.sessions.get(&e.session).is_some(),
        "the session is not deleted while evidence is open"
    );

    // The owner resolves; the close resumes and ends with the terminal record.
    assert_eq!(
        e.job(Trigger::Resolve {
            resolution: resolution()
        })
        .await,
        vec![Outcome::Ignore]
    );
    let report =
        e.c.close(&e.session, 5, Duration::from_millis(1))
            .await
            .unwrap();
    assert!(report.closed, "{report:?}");
    assert_eq!(e.live(), 0);
    let t = e
        .world
        .registry
        .terminal(&key)
        .await
        .unwrap()
        .expect("the close stored its terminal record");
    assert_eq!(t.session_id, e.session);
    assert!(t.session_deleted.confirmed);
    assert!(t.compute_stopped.confirmed);
    assert_eq!(t.compute_stopped.read_back, "stopped");
    assert_eq!(
        t.provider_instance_id,
        e.record().instance.map(|i| i.instance_id)
    );
    assert!(!t.executor_revoked);
    assert!(!t.executor_credential.location.is_empty());
    assert!(
        t.executor_credential
            .rotate
            .contains("new restricted environment key")
    );
    assert_eq!(t.effect_reconciliation, "observed");
    assert!(!t.forced);

    // A second close changes nothing: written once.
    e.world.clock.advance_secs(60);
    let again =
        e.c.close(&e.session, 2, Duration::from_millis(1))
            .await
            .unwrap();
    assert!(again.closed);
    assert_eq!(e.world.registry.terminal(&key).await.unwrap(), Some(t));

    // A forced close (the resolution `sandboxctl close --force` enqueues) is recorded so.
    let f = Env::running().await;
    f.world.sessions.push_turn(
        &f.session,
        turn("turn_f", "completed", 1_764_400_100),
        vec![item("item_f", "command_execution", "failed")],
    );
    f.world
        .sessions
        .set_environment_status(&f.env, EnvironmentStatus::Disconnected);
    f.deliver(Trigger::Idle, "wh_idle_f").await;
    f.job(Trigger::Resolve {
        resolution: Resolution {
            effect: EffectState::Abandoned,
            by: "bob".into(),
            at: 0,
            note: Some(format!(
                "{} (sandboxctl close --force)",
                sandbox_controller::terminal::FORCED_CLOSE_NOTE
            )),
        },
    })
    .await;
    let report =
        f.c.close(&f.session, 5, Duration::from_millis(1))
            .await
            .unwrap();
    assert!(report.closed, "{report:?}");
    let t = f
        .world
        .registry
        .terminal(&f.env.effect_key())
        .await
        .unwrap()
        .unwrap();
    assert!(t.forced);
    assert_eq!(t.forced_by.as_deref(), Some("bob"));
    assert_eq!(t.effect_reconciliation, "abandoned");
}
