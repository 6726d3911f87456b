//! Reconcile with evidence (docs/OPERATING.md): one test per rule, named after the situation.
//! Rows 20 and 21 of lifecycle-cases.md held for an owner with the four layers recorded,
//! resolvable, and turn evidence before every stop of an idle session.

mod support;

use sandbox_core::decision::{
    Effect, Outcome, Reason, StopReason, StopSpec, TurnDetail, decide, evidence_for,
};
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::evidence::{
    EffectState, Evidence, EvidenceTrigger, MAX_EVIDENCE, Resolution, SubmissionOutcome, ToolLayer,
    TurnLayer, WorkspaceLayer, append,
};
use sandbox_core::observed::{Trigger, TurnEvidence, Unavailable};
use sandbox_core::record::Record;
use sandbox_core::turn::{ItemStatus, TurnStatus};
use support::*;

fn broken_turn(id: &str) -> TurnEvidence {
    TurnEvidence {
        turn_id: id.into(),
        status: TurnStatus::Completed,
        broken_tools: vec![(
            "item_3".into(),
            "command_execution".into(),
            ItemStatus::Failed,
        )],
    }
}

fn turn(id: &str, status: TurnStatus) -> TurnEvidence {
    TurnEvidence {
        turn_id: id.into(),
        status,
        broken_tools: vec![],
    }
}

/// An open mid-turn-disconnect entry about `turn_9`, its files live in `task-1`.
fn open_evidence() -> Evidence {
    Evidence {
        trigger: EvidenceTrigger::MidTurnDisconnect,
        reason: "turn turn_9 completed with 1 broken tool item(s) after a disconnect".into(),
        turn: Some(TurnLayer {
            id: "turn_9".into(),
            status: TurnStatus::Completed,
            error: None,
        }),
        tools: vec![ToolLayer {
            id: "item_3".into(),
            kind: "command_execution".into(),
            status: ItemStatus::Failed,
        }],
        workspace: WorkspaceLayer {
            generation: sandbox_core::ids::Generation(1),
            live_in: Some(iref("task-1", 1)),
            snapshot: None,
        },
        effect: EffectState::Unknown,
        submission: None,
        observed_at: NOW - 100,
        resolution: None,
    }
}

fn resolution() -> Resolution {
    Resolution {
        effect: EffectState::Observed,
        by: "alice".into(),
        at: NOW,
        note: Some("deploy ran once".into()),
    }
}

fn held_record() -> Record {
    let mut r = active_record(1, "task-1");
    r.evidence = vec![open_evidence()];
    r
}

#[test]
fn mid_turn_disconnect_decision_records_turn_tool_workspace_and_unknown_effect() {
    let o = observe(Trigger::Idle, idle())
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![running("task-1", 1)])
        .with_env_status(EnvironmentStatus::Disconnected)
        .with_turn(broken_turn("turn_9"));
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Reconcile);
    let detail = TurnDetail {
        error: None,
        tools: vec![
            ToolLayer {
                id: "item_3".into(),
                kind: "command_execution".into(),
                status: ItemStatus::Failed,
            },
            ToolLayer {
                id: "item_4".into(),
                kind: "function_call".into(),
                status: ItemStatus::InProgress,
            },
        ],
    };
    let e = evidence_for(&o, &d, Some(&detail), false).expect("reconcile records evidence");
    assert_eq!(e.trigger, EvidenceTrigger::MidTurnDisconnect);
    assert_eq!(e.turn.as_ref().unwrap().id, "turn_9");
    assert_eq!(e.turn.as_ref().unwrap().status, TurnStatus::Completed);
    assert_eq!(
        e.tools, detail.tools,
        "every tool item that is not completed"
    );
    assert_eq!(e.workspace.live_in, Some(iref("task-1", 1)));
    assert_eq!(e.workspace.snapshot, None);
    assert_eq!(
        e.workspace.to_string(),
        "live in task task-1 (generation 1)"
    );
    assert_eq!(e.effect, EffectState::Unknown);
    assert_eq!(e.observed_at, NOW);
    assert!(e.is_open() && e.holds_files());
}

#[test]
fn idle_while_a_mid_turn_reconciliation_is_open_holds_the_compute_without_a_lease() {
    let o = observe(Trigger::Idle, idle())
        .with_record(held_record())
        .with_instances(vec![running("task-1", 1)])
        .with_env_status(EnvironmentStatus::Disconnected)
        .with_turn(broken_turn("turn_9"));
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Reconcile);
    assert_eq!(
        d.reason,
        Reason::HeldForOwner {
            turn_id: Some("turn_9".into())
        }
    );
    assert!(d.effects.is_empty(), "no lease: {:?}", d.effects);
    assert_eq!(
        evidence_for(&o, &d, None, true),
        None,
        "held is not a new question"
    );
}

#[test]
fn due_lease_on_a_held_compute_is_dropped_not_stopped() {
    let l = lease("task-1", 1, NOW - 1);
    let mut r = held_record();
    r.lease = Some(l.clone());
    for trigger in [Trigger::LeaseDue { lease: l.clone() }, Trigger::Sweep] {
        let o = observe(trigger, idle())
            .with_record(r.clone())
            .with_instances(vec![running("task-1", 1)]);
        let d = decide(&o);
        assert_eq!(d.outcome, Outcome::Reconcile, "{d:?}");
        assert_eq!(d.effects, vec![Effect::DropLease]);
        assert!(!d.touches_resources());
    }
}

#[test]
fn held_compute_whose_files_are_snapshotted_is_stopped_as_usual() {
    let l = lease("task-1", 1, NOW - 1);
    let mut r = held_record();
    r.evidence[0].workspace.snapshot = Some("snap-1".into());
    r.lease = Some(l.clone());
    let o = observe(Trigger::LeaseDue { lease: l }, idle())
        .with_record(r)
        .with_instances(vec![running("task-1", 1)]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Stop);
}

#[test]
fn connection_request_on_a_held_environment_proceeds_as_usual() {
    let o = observe(Trigger::ConnectionRequested, requires_connection())
        .with_record(held_record())
        .with_instances(vec![running("task-1", 1)])
        .with_env_status(EnvironmentStatus::Connected);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Reuse);
    let gone = observe(Trigger::ConnectionRequested, requires_connection())
        .with_record(held_record())
        .at(NOW + 10_000);
    assert_eq!(decide(&gone).outcome, Outcome::Start);
}

#[test]
fn resolve_closes_the_open_reconciliation_and_rechecks() {
    let o = observe(
        Trigger::Resolve {
            resolution: resolution(),
        },
        idle(),
    )
    .with_record(held_record())
    .with_instances(vec![running("task-1", 1)]);
    let d = decide(&o);
    assert_eq!(d.reason, Reason::ReconciliationResolved { closed: 1 });
    assert_eq!(d.effects, vec![Effect::ResolveReconciliation(resolution())]);
    assert!(d.recheck_after_secs.is_some());
    let next = apply(&o, &d);
    let r = next.record.as_ref().unwrap();
    assert_eq!(r.evidence[0].effect, EffectState::Observed);
    assert_eq!(r.evidence[0].resolution, Some(resolution()));
    assert!(r.holding_evidence().is_none());
    // Resolving again changes nothing.
    assert_eq!(decide(&next).reason, Reason::Converged);
    assert!(decide(&next).effects.is_empty());
}

#[test]
fn after_resolve_the_next_idle_schedules_the_stop_for_the_same_turn() {
    let mut r = held_record();
    sandbox_core::evidence::resolve(&mut r.evidence, &resolution());
    let o = observe(Trigger::Idle, idle())
        .with_record(r)
        .with_instances(vec![running("task-1", 1)])
        .with_env_status(EnvironmentStatus::Disconnected)
        .with_turn(broken_turn("turn_9"));
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::ScheduleStop, "{d:?}");
    // A new broken turn is a new question.
    let o2 = o.with_turn(broken_turn("turn_10"));
    assert_eq!(decide(&o2).outcome, Outcome::Reconcile);
}

#[test]
fn lease_due_stop_with_a_queued_turn_is_cancelled() {
    let l = lease("task-1", 1, NOW - 1);
    let mut r = active_record(1, "task-1");
    r.lease = Some(l.clone());
    for status in [TurnStatus::Queued, TurnStatus::InProgress] {
        for trigger in [Trigger::LeaseDue { lease: l.clone() }, Trigger::Sweep] {
            let o = observe(trigger, idle())
                .with_record(r.clone())
                .with_instances(vec![running("task-1", 1)])
                .with_turn(turn("turn_5", status));
            let d = decide(&o);
            assert_eq!(d.outcome, Outcome::CancelStop, "{status:?}: {d:?}");
            assert_eq!(d.effects, vec![Effect::DropLease]);
        }
    }
    // With the latest turn completed, the same lease stops.
    let o = observe(Trigger::LeaseDue { lease: l }, idle())
        .with_record(r)
        .with_instances(vec![running("task-1", 1)])
        .with_turn(turn("turn_5", TurnStatus::Completed));
    assert_eq!(
        decide(&o).effects[0],
        Effect::StopCompute(StopSpec {
            target: iref("task-1", 1),
            reason: StopReason::LeaseExpired
        })
    );
}

#[test]
fn reported_timeout_whose_turn_never_started_is_not_found_never_resubmitted() {
    let trigger = Trigger::TimeoutReported {
        turn_id: None,
        submitted_at: NOW - 30,
    };
    let mut o = observe(trigger, idle()).with_record(active_record(1, "task-1"));
    // Not read yet (or the read failed): uncertain, retried.
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Uncertain);
    o.turn_not_found = true;
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Reconcile);
    assert_eq!(d.reason, Reason::SubmissionNotFound);
    assert!(d.effects.is_empty(), "never resubmit");
    let e = evidence_for(&o, &d, None, false).unwrap();
    assert_eq!(e.trigger, EvidenceTrigger::InputTimedOut);
    assert_eq!(e.submission, Some(SubmissionOutcome::NotFound));
    assert!(!e.holds_files());
}

#[test]
fn reported_timeout_outcomes_follow_the_turn_status() {
    for (status, want) in [
        (TurnStatus::Queued, SubmissionOutcome::StillRunning),
        (TurnStatus::InProgress, SubmissionOutcome::StillRunning),
        (TurnStatus::Waiting, SubmissionOutcome::StillRunning),
        (TurnStatus::Completed, SubmissionOutcome::Completed),
        (TurnStatus::Failed, SubmissionOutcome::Failed),
        (TurnStatus::Cancelled, SubmissionOutcome::Failed),
    ] {
        let o = observe(
            Trigger::TimeoutReported {
                turn_id: Some("turn_2".into()),
                submitted_at: NOW - 30,
            },
            idle(),
        )
        .with_record(active_record(1, "task-1"))
        .with_turn(turn("turn_2", status));
        let d = decide(&o);
        assert_eq!(d.outcome, Outcome::Reconcile);
        assert!(d.effects.is_empty(), "never resubmit");
        let e = evidence_for(&o, &d, None, false).unwrap();
        assert_eq!(e.submission, Some(want), "{status:?}");
        assert_eq!(e.turn.unwrap().id, "turn_2");
    }
}

#[test]
fn uncertain_is_recorded_only_when_held_past_one_retry() {
    let o = observe_view(
        Trigger::Sweep,
        sandbox_core::observed::SessionView::Unavailable {
            cause: Unavailable::ServerError,
        },
    )
    .with_record(active_record(1, "task-1"));
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Uncertain);
    assert_eq!(evidence_for(&o, &d, None, false), None);
    let e = evidence_for(&o, &d, None, true).unwrap();
    assert_eq!(e.trigger, EvidenceTrigger::Uncertain);
    assert!(!e.holds_files());
}

#[test]
fn divergent_decisions_are_recorded_for_the_owner() {
    let o = observe(Trigger::Sweep, idle()).with_record(active_record(1, "task-1"));
    let o = o.at(NOW + 10_000);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Divergent, "{d:?}");
    let e = evidence_for(&o, &d, None, false).unwrap();
    assert_eq!(e.trigger, EvidenceTrigger::Divergent);
    assert_eq!(e.reason, d.reason.to_string());
}

#[test]
fn the_same_question_is_recorded_once_and_resolved_entries_make_room() {
    let mut list = vec![];
    assert!(append(&mut list, open_evidence()));
    assert!(!append(&mut list, open_evidence()), "idempotent");
    for i in 0..(MAX_EVIDENCE + 3) {
        let mut e = open_evidence();
        e.turn.as_mut().unwrap().id = format!("turn_{i}");
        e.resolution = Some(resolution());
        append(&mut list, e);
    }
    assert_eq!(list.len(), MAX_EVIDENCE);
    assert!(list[0].is_open(), "an open entry is never dropped");
}

#[test]
fn a_resolution_must_say_what_the_owner_found() {
    for ok in ["observed", "compensated", "not_needed", "abandoned"] {
        assert_eq!(EffectState::parse_resolution(ok).unwrap().as_str(), ok);
    }
    let err = EffectState::parse_resolution("unknown").unwrap_err();
    assert!(
        err.contains("observed, compensated, not_needed, abandoned"),
        "{err}"
    );
}

#[test]
fn evidence_round_trips_through_the_record_json_and_old_records_still_parse() {
    let r = held_record();
    let json = serde_json::to_string(&r).unwrap();
    let back: Record = serde_json::from_str(&json).unwrap();
    assert_eq!(back, r);
    let mut old = serde_json::to_value(active_record(1, "task-1")).unwrap();
    let o = old.as_object_mut().unwrap();
    o.remove("evidence");
    o.remove("connection");
    let parsed: Record = serde_json::from_value(old).unwrap();
    assert!(parsed.evidence.is_empty() && parsed.connection.is_none());
}

// ----------------------------------------------- the hold beside the ceilings

/// A held record (`task-1`, started 3 h ago) whose session waits on a function call and
/// was last active 2 h ago: past the no-work period (1 h).
fn held_with_no_work(trigger: Trigger) -> sandbox_core::observed::Observed {
    let mut s = session(
        sandbox_core::session::SessionStatus::RequiresAction,
        vec![function_call_action()],
    );
    s.last_active_at = (NOW - 2 * 3_600) as i64;
    let mut r = held_record();
    r.instance_recorded_at = Some(NOW - 3 * 3_600);
    observe(trigger, s)
        .with_record(r)
        .with_instances(vec![instance(
            "task-1",
            1,
            sandbox_core::compute::ComputeStatus::Running,
            Some(NOW - 3 * 3_600),
        )])
}

#[test]
fn held_compute_of_a_session_with_no_work_takes_no_no_work_lease() {
    let d = decide(&held_with_no_work(Trigger::Sweep));
    assert!(
        !d.effects
            .iter()
            .any(|e| matches!(e, Effect::PutNoWorkLease(_))),
        "{d:?}"
    );
    assert!(!d.touches_resources(), "the files stay: {d:?}");
}

#[test]
fn held_compute_past_its_max_lifetime_is_stopped_all_the_same() {
    let mut o = held_with_no_work(Trigger::Sweep);
    o.session = sandbox_core::observed::SessionView::Found {
        session: Box::new(idle()),
    };
    o.inventory = sandbox_core::observed::Inventory::Known {
        instances: vec![instance(
            "task-1",
            1,
            sandbox_core::compute::ComputeStatus::Running,
            Some(NOW - 9 * 3_600),
        )],
    };
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Stop, "{d:?}");
    assert!(matches!(d.reason, Reason::LifetimeExceeded { .. }), "{d:?}");
}
#[test]
fn open_questions_without_a_turn_are_recorded_once_per_trigger_and_the_list_stays_bounded() {
    let mut list = vec![open_evidence()];
    let mut failing = open_evidence();
    failing.trigger = EvidenceTrigger::StartFailing;
    failing.turn = None;
    failing.tools = vec![];
    for attempts in 5..40 {
        let mut e = failing.clone();
        e.reason = format!("start failed {attempts} times");
        append(&mut list, e);
    }
    assert_eq!(list.len(), 2, "one open start_failing question: {list:?}");
    // Many distinct open questions: bounded, and the entry holding the files stays.
    for i in 0..(3 * MAX_EVIDENCE) {
        let mut e = open_evidence();
        e.trigger = EvidenceTrigger::InputTimedOut;
        e.tools = vec![];
        e.turn.as_mut().unwrap().id = format!("turn_t{i}");
        append(&mut list, e);
    }
    assert_eq!(list.len(), MAX_EVIDENCE);
    assert!(
        list.iter().any(|e| e.holds_files()),
        "the held question is kept"
    );
}
