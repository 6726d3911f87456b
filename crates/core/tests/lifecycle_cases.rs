//! One test per row of `shared/reference/lifecycle-cases.md`, named after the situation.
//! Each asserts the named outcome and the exact side effects.

mod support;

use sandbox_core::compute::ComputeStatus::{self, *};
use sandbox_core::decision::{Effect, Outcome, Reason, StopReason, StopSpec, decide};
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::event::RequiredActionType;
use sandbox_core::ids::{Generation, SessionId, idempotency_token};
use sandbox_core::observed::{SessionView, Trigger, TurnEvidence, Unavailable};
use sandbox_core::record::{RecordStatus, StartFailure};
use sandbox_core::session::{Environment, SessionStatus};
use sandbox_core::turn::{ItemStatus, TurnStatus};
use support::*;

fn starts(d: &sandbox_core::Decision) -> Vec<&sandbox_core::StartSpec> {
    d.effects
        .iter()
        .filter_map(|e| match e {
            Effect::StartCompute(s) => Some(s),
            _ => None,
        })
        .collect()
}

/// The record's note that the connection requirement was first seen now.
fn noted() -> Effect {
    Effect::NoteConnectionRequest { at: NOW }
}

fn stop(id: &str, generation: u64, reason: StopReason) -> Effect {
    Effect::StopCompute(StopSpec {
        target: iref(id, generation),
        reason,
    })
}

#[test]
fn row01_connection_required_with_no_record_and_no_compute_starts_one_with_unchanged_remote_url() {
    let d = decide(&observe(
        Trigger::ConnectionRequested,
        requires_connection(),
    ));
    assert_eq!(d.outcome, Outcome::Start);
    assert_eq!(d.reason, Reason::ConnectionRequired);
    let s = starts(&d);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].environment_id, env_id());
    assert_eq!(s[0].remote_url, REMOTE_URL);
    assert_eq!(s[0].generation, Generation(1));
    assert_eq!(
        s[0].idempotency_token,
        idempotency_token(&env_id(), Generation(1))
    );
    assert_eq!(s[0].previous, None);
    // The start, then the note the connect deadline counts from (after the start: no
    // record write precedes RunTask).
    assert_eq!(d.effects.len(), 2);
    assert_eq!(d.effects[1], noted());
}

#[test]
fn row02_same_delivery_five_times_yields_exactly_one_start() {
    // The worker serialises deliveries per effect key (lock); each redelivery observes what
    // the previous one did.
    let mut o = observe(Trigger::ConnectionRequested, requires_connection());
    let mut started = 0;
    for _ in 0..5 {
        let d = decide(&o);
        started += starts(&d).len();
        o = apply(&o, &d);
    }
    assert_eq!(started, 1);
}

#[test]
fn row03_function_call_action_is_ignored() {
    let mut s = requires_connection();
    s.required_actions = vec![function_call_action()];
    let d = decide(&observe(
        Trigger::OtherActionRequired {
            action: RequiredActionType::FunctionCall,
        },
        s,
    ));
    assert_eq!(d.outcome, Outcome::Ignore);
    assert_eq!(d.reason, Reason::NotAComputeAction);
    assert!(d.effects.is_empty());
}

#[test]
fn row04_connection_event_but_requirement_resolved_is_ignored() {
    let d = decide(&observe(Trigger::ConnectionRequested, in_progress()));
    assert_eq!(d.outcome, Outcome::Ignore);
    assert_eq!(d.reason, Reason::ActionResolved);
    assert!(d.effects.is_empty());
}

#[test]
fn row05_deleted_session_without_compute_is_ignored_and_record_closed() {
    let o = observe_view(Trigger::ConnectionRequested, SessionView::Deleted);
    let d = decide(&o);
    assert_eq!((d.outcome, d.effects.len()), (Outcome::Ignore, 0));

    let o = o.with_record(record(2, Some("task-2"), RecordStatus::Stopped));
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Ignore);
    assert_eq!(d.reason, Reason::SessionDeleted);
    assert_eq!(d.effects, vec![Effect::MarkClosed]);
}

#[test]
fn row06_deleted_session_with_running_compute_is_released() {
    let o = observe_view(Trigger::Sweep, SessionView::Deleted)
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![running("task-1", 1)]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Release);
    assert_eq!(d.reason, Reason::SessionDeleted);
    assert_eq!(
        d.effects,
        vec![
            stop("task-1", 1, StopReason::SessionDeleted),
            Effect::MarkClosed
        ]
    );
}

#[test]
fn row07_failed_session_with_running_compute_is_released() {
    let o = observe(Trigger::Failed, failed())
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![running("task-1", 1)]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Release);
    assert_eq!(
        d.effects,
        vec![
            stop("task-1", 1, StopReason::SessionFailed),
            Effect::MarkStopped
        ]
    );
}

#[test]
fn row08_failed_event_but_session_no_longer_failed_is_ignored() {
    let o = observe(Trigger::Failed, idle())
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![running("task-1", 1)]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Ignore);
    assert_eq!(d.reason, Reason::StaleFailedEvent);
    assert!(d.effects.is_empty());
}

#[test]
fn row09_connection_required_while_compute_provisioning_or_pending_waits() {
    for status in [Provisioning, Pending] {
        let o = observe(Trigger::ConnectionRequested, requires_connection())
            .with_record(active_record(1, "task-1"))
            .with_instances(vec![instance("task-1", 1, status, None)]);
        let d = decide(&o);
        assert_eq!(d.outcome, Outcome::Wait, "{status:?}");
        assert_eq!(d.reason, Reason::ComputeStarting);
        assert_eq!(d.effects, vec![noted()], "no second compute");
        assert!(d.recheck_after_secs.is_some());
    }
}

#[test]
fn row10_running_past_connect_deadline_and_not_connected_is_replaced() {
    let deadline = 180;
    let started = NOW - deadline - 1;
    let mut r = active_record(3, "task-3");
    r.connection_requested_at = Some(started - 2);
    let o = observe(Trigger::ConnectionRequested, requires_connection())
        .with_record(r)
        .with_instances(vec![instance("task-3", 3, Running, Some(started))])
        .with_env_status(EnvironmentStatus::Disconnected);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Replace);
    assert_eq!(d.effects[0], stop("task-3", 3, StopReason::Replaced));
    let s = starts(&d);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].generation, Generation(4));
    assert_eq!(s[0].previous, Some(iref("task-3", 3)));

    // Within the deadline it waits for the executor to connect instead.
    let o = o.at(started + deadline);
    let d = decide(&o);
    assert_eq!(
        (d.outcome, d.reason.clone()),
        (Outcome::Wait, Reason::ExecutorConnecting)
    );
    // And a connected environment is reused whatever the age.
    let o = o
        .at(NOW + 10_000)
        .with_env_status(EnvironmentStatus::Connected);
    assert_eq!(decide(&o).outcome, Outcome::Reuse);
}

#[test]
fn row11_record_says_running_but_task_stopped_starts_next_generation_from_its_snapshot() {
    let o = observe(Trigger::ConnectionRequested, requires_connection())
        .with_record(active_record(2, "task-2"))
        .with_instances(vec![instance("task-2", 2, Stopped, Some(NOW - 900))]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Start);
    assert_eq!(
        d.reason,
        Reason::ComputeGone {
            previous: Generation(2)
        }
    );
    assert!(d.reason.to_string().contains("restored from its snapshot"));
    assert_eq!(d.effects.last(), Some(&noted()));
    let s = starts(&d);
    assert_eq!(s[0].generation, Generation(3));
    assert_eq!(s[0].previous, Some(iref("task-2", 2)));
}

#[test]
fn row12_crash_between_start_and_record_adopts_the_existing_compute() {
    // The record was never written; the provider has the task, found by its tags.
    let o = observe(Trigger::ConnectionRequested, requires_connection())
        .with_instances(vec![instance("task-1", 1, Pending, None)]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Adopt);
    assert_eq!(d.reason, Reason::UnrecordedCompute);
    assert_eq!(
        d.effects,
        vec![Effect::AdoptCompute(iref("task-1", 1)), noted()]
    );
    assert!(starts(&d).is_empty());
    // Redelivered again: nothing more.
    let d2 = decide(&apply(&o, &d));
    assert_eq!((d2.outcome, d2.effects.len()), (Outcome::Wait, 0));
}

#[test]
fn row13_two_computes_for_one_environment_keep_the_newest_and_stop_the_rest() {
    let o = observe(Trigger::Sweep, requires_connection())
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![
            running("task-1", 1),
            instance("task-2", 2, Pending, None),
        ]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Divergent);
    assert_eq!(d.reason, Reason::MultipleComputes { active: 2 });
    assert_eq!(
        d.effects,
        vec![
            stop("task-1", 1, StopReason::Divergent),
            Effect::AdoptCompute(iref("task-2", 2)),
            noted()
        ]
    );
}

#[test]
fn row14_idle_with_nothing_pending_schedules_a_stop_with_grace() {
    let o = observe(Trigger::Idle, idle())
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![running("task-1", 1)]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::ScheduleStop);
    assert_eq!(
        d.effects,
        vec![Effect::PutLease(lease("task-1", 1, NOW + 300))]
    );
    assert!(!d.touches_resources(), "no stop yet");
    assert_eq!(d.recheck_after_secs, Some(300));
}

#[test]
fn row15_lease_due_and_session_still_idle_stops_that_exact_generation() {
    let l = lease("task-1", 1, NOW - 1);
    let mut r = active_record(1, "task-1");
    r.lease = Some(l.clone());
    let o = observe(Trigger::LeaseDue { lease: l }, idle())
        .with_record(r)
        .with_instances(vec![running("task-1", 1)]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Stop);
    assert_eq!(d.reason, Reason::LeaseExpired);
    assert_eq!(
        d.effects,
        vec![
            stop("task-1", 1, StopReason::LeaseExpired),
            Effect::DropLease,
            Effect::MarkStopped
        ]
    );
}

#[test]
fn row16_pending_lease_then_connection_request_or_turn_start_cancels_the_stop() {
    let mut r = active_record(1, "task-1");
    r.lease = Some(lease("task-1", 1, NOW + 200));
    for (trigger, s) in [
        (Trigger::ConnectionRequested, requires_connection()),
        (Trigger::TurnStarted, in_progress()),
    ] {
        let o = observe(trigger.clone(), s)
            .with_record(r.clone())
            .with_instances(vec![running("task-1", 1)]);
        let d = decide(&o);
        assert_eq!(d.outcome, Outcome::CancelStop, "{trigger:?}");
        let mut expected = vec![Effect::DropLease];
        if trigger == Trigger::ConnectionRequested {
            expected.push(noted());
        }
        assert_eq!(d.effects, expected);
    }
}

#[test]
fn row17_lease_due_but_session_busy_again_cancels_the_stop() {
    let l = lease("task-1", 1, NOW - 1);
    let mut r = active_record(1, "task-1");
    r.lease = Some(l.clone());
    let mut fc = session(SessionStatus::RequiresAction, vec![function_call_action()]);
    fc.status = SessionStatus::RequiresAction;
    for s in [in_progress(), fc] {
        let o = observe(Trigger::LeaseDue { lease: l.clone() }, s)
            .with_record(r.clone())
            .with_instances(vec![running("task-1", 1)]);
        let d = decide(&o);
        assert_eq!(d.outcome, Outcome::CancelStop);
        assert_eq!(d.effects, vec![Effect::DropLease]);
    }
}

#[test]
fn row18_lease_for_an_older_generation_never_stops_the_newer_compute() {
    let old = lease("task-1", 1, NOW - 1);
    let mut r = active_record(2, "task-2");
    r.lease = Some(old.clone());
    let o = observe(Trigger::LeaseDue { lease: old }, idle())
        .with_record(r)
        .with_instances(vec![running("task-2", 2)]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::CancelStop);
    assert_eq!(d.reason, Reason::LeaseSuperseded);
    assert_eq!(d.effects, vec![Effect::DropLease]);
}

#[test]
fn row19_turn_in_progress_without_any_compute_is_reconciled_not_guessed() {
    let d = decide(&observe(Trigger::TurnStarted, in_progress()));
    assert_eq!(d.outcome, Outcome::Reconcile);
    assert_eq!(d.reason, Reason::TurnWithoutExecutor);
    assert!(d.effects.is_empty());
}

#[test]
fn row20_mid_turn_disconnect_with_failed_tool_is_reconciled_never_resubmitted() {
    let turn = TurnEvidence {
        turn_id: "turn_9".into(),
        status: TurnStatus::Completed,
        broken_tools: vec![(
            "item_3".into(),
            "command_execution".into(),
            ItemStatus::Failed,
        )],
    };
    let o = observe(Trigger::Idle, idle())
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![running("task-1", 1)])
        .with_env_status(EnvironmentStatus::Disconnected)
        .with_turn(turn);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Reconcile);
    assert!(
        matches!(d.reason, Reason::MidTurnDisconnect { ref turn_id, ref broken_tools }
        if turn_id == "turn_9" && broken_tools.len() == 1)
    );
    assert!(d.effects.is_empty());
}

#[test]
fn row21_submission_timeout_is_uncertain_until_turn_evidence_is_read() {
    // The one timed-out-input path: the application's report.
    let o = observe(
        Trigger::TimeoutReported {
            turn_id: Some("turn_2".into()),
            submitted_at: 0,
        },
        in_progress(),
    );
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Uncertain);
    assert_eq!(d.reason, Reason::SubmissionOutcomeUnknown);
    assert!(d.effects.is_empty() && d.recheck_after_secs.is_some());
    let d = decide(&o.with_turn(TurnEvidence {
        turn_id: "turn_2".into(),
        status: TurnStatus::InProgress,
        broken_tools: vec![],
    }));
    assert_eq!(d.outcome, Outcome::Reconcile);
    assert!(
        d.effects.is_empty(),
        "never resubmit while the original may run"
    );
}

#[test]
fn row22_agents_api_unreachable_or_5xx_is_uncertain_and_changes_nothing() {
    for cause in [
        Unavailable::Unreachable,
        Unavailable::ServerError,
        Unavailable::Timeout,
        Unavailable::RateLimited,
    ] {
        for trigger in [
            Trigger::ConnectionRequested,
            Trigger::Sweep,
            Trigger::Idle,
            Trigger::Close,
        ] {
            let o = observe_view(trigger, SessionView::Unavailable { cause })
                .with_record(active_record(1, "task-1"))
                .with_instances(vec![running("task-1", 1)]);
            let d = decide(&o);
            assert_eq!(d.outcome, Outcome::Uncertain);
            assert!(d.effects.is_empty());
            assert!(d.recheck_after_secs.is_some());
        }
    }
    // The provider being unreadable is missing evidence too.
    let mut o = observe(Trigger::ConnectionRequested, requires_connection());
    o.inventory = sandbox_core::Inventory::Unavailable;
    let d = decide(&o);
    assert_eq!((d.outcome, d.effects.len()), (Outcome::Uncertain, 0));
}

#[test]
fn row23_openai_hosted_or_no_environment_is_ignored() {
    for env in [
        Environment::None,
        Environment::OpenAiHosted {
            id: env_id(),
            extra: Default::default(),
        },
    ] {
        let mut s = requires_connection();
        s.environment = env;
        let d = decide(&observe(Trigger::ConnectionRequested, s));
        assert_eq!(d.outcome, Outcome::Ignore);
        assert_eq!(d.reason, Reason::NotSelfHosted);
    }
}

#[test]
fn row24_session_of_another_handler_is_ignored() {
    let mut by_agent = observe(Trigger::ConnectionRequested, requires_connection());
    by_agent.filter.agent_ids = vec!["agent_theirs".into()];
    let mut by_dir = observe(Trigger::ConnectionRequested, requires_connection());
    by_dir.filter.workspace_directory = Some("/srv/other".into());
    let mut by_owner = observe(Trigger::ConnectionRequested, requires_connection());
    by_owner
        .filter
        .metadata
        .insert("owner".into(), "team-b".into());
    for o in [by_agent, by_dir, by_owner] {
        let d = decide(&o);
        assert_eq!((d.outcome, d.reason), (Outcome::Ignore, Reason::NotOwned));
    }
    // A matching filter accepts.
    let mut ok = observe(Trigger::ConnectionRequested, requires_connection());
    ok.filter.agent_ids = vec![AGENT.into()];
    ok.filter.workspace_directory = Some("/workspace".into());
    assert_eq!(decide(&ok).outcome, Outcome::Start);
}

#[test]
fn row25_operator_close_deletes_session_and_stops_compute_as_two_effects() {
    let o = observe(Trigger::Close, idle())
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![running("task-1", 1)]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Cleanup);
    assert_eq!(
        d.effects,
        vec![
            Effect::RequireCleanup,
            Effect::DeleteSession {
                session_id: SessionId::new(SESS)
            },
            stop("task-1", 1, StopReason::Closed),
            Effect::MarkClosed
        ]
    );
}

#[test]
fn row25_close_waits_out_a_start_in_flight_and_rejects_new_work() {
    let o = observe(Trigger::Close, requires_connection())
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![instance("task-1", 1, Pending, None)]);
    let d = decide(&o);
    assert_eq!(
        (d.outcome, d.reason.clone()),
        (Outcome::Wait, Reason::StartInFlight)
    );
    assert_eq!(d.effects, vec![Effect::RequireCleanup]);
    // Cleanup is now required: a connection request starts nothing.
    let mut closing = o.clone().with_record({
        let mut r = active_record(1, "task-1");
        r.cleanup_required = true;
        r
    });
    closing.trigger = Trigger::ConnectionRequested;
    closing.inventory = sandbox_core::Inventory::Known { instances: vec![] };
    let d = decide(&closing);
    assert!(
        d.effects
            .iter()
            .all(|e| !matches!(e, Effect::StartCompute(_)))
    );
}

#[test]
fn row25_close_with_session_already_deleted_retries_only_the_stop() {
    let mut r = active_record(1, "task-1");
    r.cleanup_required = true;
    let o = observe_view(Trigger::Sweep, SessionView::Deleted)
        .with_record(r)
        .with_instances(vec![running("task-1", 1)]);
    let d = decide(&o);
    assert_eq!(
        d.effects,
        vec![stop("task-1", 1, StopReason::Closed), Effect::MarkClosed]
    );
    // And with the compute already stopped, only the session deletion is retried.
    let mut r = active_record(1, "task-1");
    r.cleanup_required = true;
    let o = observe(Trigger::Sweep, idle())
        .with_record(r)
        .with_instances(vec![instance("task-1", 1, Stopped, Some(NOW - 500))]);
    assert_eq!(
        decide(&o).effects,
        vec![
            Effect::DeleteSession {
                session_id: SessionId::new(SESS)
            },
            Effect::MarkClosed
        ]
    );
}

#[test]
fn row26_sweep_releases_compute_without_record_or_with_closed_or_deleted_session() {
    // No record, session needs nothing.
    let o = observe(Trigger::Sweep, idle()).with_instances(vec![running("task-7", 7)]);
    let d = decide(&o);
    assert_eq!(
        (d.outcome, d.reason.clone()),
        (Outcome::Release, Reason::Orphan)
    );
    assert_eq!(d.effects, vec![stop("task-7", 7, StopReason::Orphan)]);
    // Closed record.
    let o = observe(Trigger::Sweep, idle())
        .with_record(record(7, Some("task-7"), RecordStatus::Closed))
        .with_instances(vec![running("task-7", 7)]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Release);
    assert_eq!(d.effects, vec![stop("task-7", 7, StopReason::Closed)]);
    // Deleted session, no record.
    let o = observe_view(Trigger::Sweep, SessionView::Deleted)
        .with_instances(vec![running("task-7", 7)]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Release);
    assert_eq!(
        d.effects,
        vec![
            stop("task-7", 7, StopReason::SessionDeleted),
            Effect::MarkClosed
        ]
    );
}

#[test]
fn row27_sweep_record_running_but_no_compute_and_nothing_needed_marks_stopped() {
    let o = observe(Trigger::Sweep, idle()).with_record(active_record(4, "task-4"));
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Divergent);
    assert_eq!(d.reason, Reason::RecordStale);
    assert_eq!(d.effects, vec![Effect::MarkStopped]);
    assert!(starts(&d).is_empty());
}

#[test]
fn row28_failed_start_backs_off_then_retries_and_gives_up_after_max_attempts() {
    let mut r = record(1, None, RecordStatus::Active);
    r.start_failure = Some(StartFailure {
        attempts: 2,
        last_failed_at: NOW - 5,
        kind: Default::default(),
        reason: "RESOURCE:ENI".into(),
    });
    let o = observe(Trigger::ConnectionRequested, requires_connection()).with_record(r.clone());
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Wait);
    assert_eq!(d.reason, Reason::StartBackoff { attempts: 2 });
    // backoff(2) = 30 s; 5 s have passed.
    assert_eq!(d.recheck_after_secs, Some(25));
    assert_eq!(d.effects, vec![noted()], "no start during the backoff");

    let d = decide(&o.clone().at(NOW + 25));
    assert_eq!(d.outcome, Outcome::Start);
    assert_eq!(starts(&d)[0].generation, Generation(2));

    r.start_failure.as_mut().unwrap().attempts = 5;
    let o = o.with_record(r);
    let d = decide(&o.clone().at(NOW + 60));
    assert_eq!(d.outcome, Outcome::Reconcile);
    assert!(matches!(d.reason, Reason::StartFailing { attempts: 5, .. }));
    assert!(!d.touches_resources(), "never loop creating compute");
    // Not forever: the next attempt comes after the cooldown (a visible deferral).
    let cooldown = o.policy.start_failing_cooldown_secs;
    assert_eq!(d.recheck_after_secs, Some(cooldown - 65));
    let d = decide(&o.at(NOW - 5 + cooldown));
    assert_eq!(d.outcome, Outcome::Start);
    assert_eq!(starts(&d).len(), 1);
}

#[test]
fn idle_then_connection_request_cancels_pending_stop_and_keeps_compute() {
    let o = observe(Trigger::Idle, idle())
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![running("task-1", 1)]);
    let d = decide(&o);
    let mut o = apply(&o, &d);
    o.trigger = Trigger::ConnectionRequested;
    o.session = SessionView::Found {
        session: Box::new(requires_connection()),
    };
    o = o.with_env_status(EnvironmentStatus::Connected);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::CancelStop);
    assert_eq!(d.effects, vec![Effect::DropLease, noted()]);
}

#[test]
fn stopping_compute_blocks_a_new_start_until_gone() {
    let status: ComputeStatus = Stopping;
    let o = observe(Trigger::ConnectionRequested, requires_connection())
        .with_record(record(1, Some("task-1"), RecordStatus::Stopped))
        .with_instances(vec![instance("task-1", 1, status, Some(NOW - 100))]);
    let d = decide(&o);
    assert_eq!(
        (d.outcome, d.reason),
        (Outcome::Wait, Reason::ComputeStopping)
    );
}

#[test]
fn unknown_event_types_are_ignored() {
    let d = decide(&observe(
        Trigger::OtherEvent {
            event_type: "agent.session.created".into(),
        },
        requires_connection(),
    ));
    assert_eq!(
        (d.outcome, d.reason),
        (Outcome::Ignore, Reason::UnrelatedEvent)
    );
}

#[test]
fn every_effect_serializes_for_the_audit_trail() {
    let o = observe(Trigger::Close, idle())
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![running("task-1", 1)]);
    let d = decide(&o);
    let json = serde_json::to_value(&d).expect("decision serializes");
    let back: sandbox_core::Decision = serde_json::from_value(json).expect("and parses back");
    assert_eq!(back, d);
}

// ---- ECS as it really is ---------------------------------------------------

#[test]
fn second_connection_request_while_the_recorded_task_is_not_visible_yet_waits_never_starts() {
    // RunTask answered task-1 20 s ago; DescribeTasks says MISSING (ECS is eventually
    // consistent), so the inventory is empty.
    let mut r = active_record(1, "task-1");
    r.instance_recorded_at = Some(NOW - 20);
    r.connection_requested_at = Some(NOW - 21);
    for trigger in [Trigger::ConnectionRequested, Trigger::Sweep] {
        let d = decide(&observe(trigger.clone(), requires_connection()).with_record(r.clone()));
        assert_eq!(d.outcome, Outcome::Wait, "{trigger:?}");
        assert_eq!(d.reason, Reason::ComputeNotVisibleYet { recorded_secs: 20 });
        assert!(starts(&d).is_empty(), "never a second task: {d:?}");
    }
}

#[test]
fn in_progress_event_while_the_recorded_task_is_not_visible_yet_changes_nothing() {
    let mut r = active_record(1, "task-1");
    r.instance_recorded_at = Some(NOW - 2);
    let d = decide(&observe(Trigger::TurnStarted, in_progress()).with_record(r));
    assert!(!d.touches_resources(), "{d:?}");
    assert_ne!(d.outcome, Outcome::Reconcile, "the executor exists: {d:?}");
}

#[test]
fn recorded_task_missing_past_the_visibility_window_is_gone_and_replaced() {
    // ECS forgets stopped tasks after about an hour: MISSING long after the start.
    let mut r = active_record(1, "task-1");
    r.instance_recorded_at = Some(NOW - 301);
    r.connection_requested_at = Some(NOW - 3600);
    let d = decide(&observe(Trigger::ConnectionRequested, requires_connection()).with_record(r));
    assert_eq!(d.outcome, Outcome::Start);
    assert_eq!(
        d.reason,
        Reason::ComputeGone {
            previous: Generation(1)
        }
    );
    assert_eq!(starts(&d)[0].generation, Generation(2));
}

#[test]
fn session_deleted_while_the_recorded_task_is_not_visible_yet_waits_to_stop_it() {
    let mut r = active_record(1, "task-1");
    r.instance_recorded_at = Some(NOW - 5);
    let d = decide(&observe_view(Trigger::Sweep, SessionView::Deleted).with_record(r));
    assert_eq!(d.outcome, Outcome::Wait);
    assert!(matches!(d.reason, Reason::ComputeNotVisibleYet { .. }));
    assert!(d.effects.is_empty(), "never closed while its task may run");
}

#[test]
fn provisioning_for_up_to_thirty_minutes_never_starts_a_second_task() {
    let r = active_record(1, "task-1");
    for age in [60, 900, 1_799] {
        let o = observe(Trigger::Sweep, requires_connection())
            .with_record(r.clone())
            .with_instances(vec![instance("task-1", 1, Provisioning, None)])
            .at(NOW + age);
        let d = decide(&o);
        assert_eq!(
            (d.outcome, d.reason.clone()),
            (Outcome::Wait, Reason::ComputeStarting)
        );
        assert!(starts(&d).is_empty());
    }
}

#[test]
fn task_that_stopped_with_task_failed_to_start_counts_as_a_failed_start() {
    let mut r = active_record(2, "task-2");
    r.start_failure = Some(StartFailure {
        attempts: 1,
        last_failed_at: NOW - 600,
        kind: Default::default(),
        reason: "RESOURCE:ENI".into(),
    });
    let mut task = instance("task-2", 2, Stopped, Some(NOW - 1_800));
    task.stop_code = Some(sandbox_core::compute::TASK_FAILED_TO_START.into());
    let o = observe(Trigger::Sweep, requires_connection())
        .with_record(r)
        .with_instances(vec![task]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Wait);
    assert_eq!(d.reason, Reason::StartBackoff { attempts: 2 });
    let Effect::RecordStartFailure(f) = &d.effects[0] else {
        panic!("expected the failure recorded first: {d:?}");
    };
    assert_eq!((f.attempts, f.last_failed_at), (2, NOW));
    assert!(f.reason.contains("TaskFailedToStart"), "{}", f.reason);
    assert!(starts(&d).is_empty());
    // Counted once: deciding again after applying it adds nothing.
    let again = decide(&apply(&o, &d));
    assert!(again.effects.is_empty(), "{again:?}");
}

#[test]
fn start_failing_resumes_at_once_after_an_operator_reset() {
    let mut r = record(3, None, RecordStatus::Active);
    r.start_failure = Some(StartFailure {
        attempts: 5,
        last_failed_at: NOW - 10,
        kind: Default::default(),
        reason: "RESOURCE:MEMORY".into(),
    });
    r.connection_requested_at = Some(NOW - 900);
    let o = observe(Trigger::ResetStartFailures, requires_connection()).with_record(r);
    let d = decide(&o);
    assert_eq!(d.reason, Reason::StartFailuresReset);
    assert_eq!(d.effects, vec![Effect::ClearStartFailure]);
    assert!(d.recheck_after_secs.is_some(), "the recheck starts it");
    let mut next = apply(&o, &d);
    next.trigger = Trigger::Sweep;
    let d = decide(&next);
    assert_eq!(d.outcome, Outcome::Start);
    assert_eq!(starts(&d)[0].generation, Generation(4));
}

#[test]
fn environment_status_read_failure_is_missing_evidence_never_a_replacement() {
    let mut r = active_record(3, "task-3");
    r.connection_requested_at = Some(NOW - 1_000);
    let mut o = observe(Trigger::ConnectionRequested, requires_connection())
        .with_record(r)
        .with_instances(vec![instance("task-3", 3, Running, Some(NOW - 1_000))]);
    o.environment_status = sandbox_core::observed::EnvironmentRead::Unavailable;
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Uncertain);
    assert_eq!(d.reason, Reason::EnvironmentStatusUnavailable);
    assert!(!d.touches_resources());
}

#[test]
fn executor_that_ran_an_hour_and_briefly_disconnected_gets_its_full_connect_deadline() {
    // Started an hour ago, connected since; the session now asks for a reconnection.
    let r = active_record(3, "task-3");
    let o = observe(Trigger::ConnectionRequested, requires_connection())
        .with_record(r)
        .with_instances(vec![instance("task-3", 3, Running, Some(NOW - 3_600))])
        .with_env_status(EnvironmentStatus::Disconnected);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Wait);
    assert_eq!(d.reason, Reason::ExecutorConnecting);
    assert_eq!(d.effects, vec![noted()]);
    // The deadline counts from the request: replaced only after it passes.
    let later = apply(&o, &d).at(NOW + 181);
    assert_eq!(decide(&later).outcome, Outcome::Replace);
    let within = apply(&o, &d).at(NOW + 180);
    assert_eq!(decide(&within).outcome, Outcome::Wait);
}

#[test]
fn two_running_computes_while_connected_keep_the_recorded_one_not_the_newest() {
    let o = observe(Trigger::Sweep, idle())
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![
            instance("task-1", 1, Running, Some(NOW - 900)),
            instance("task-2", 2, Running, Some(NOW - 30)),
        ])
        .with_env_status(EnvironmentStatus::Connected);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Divergent);
    assert_eq!(d.effects[0], stop("task-2", 2, StopReason::Divergent));
    assert!(
        !d.effects
            .contains(&stop("task-1", 1, StopReason::Divergent))
    );
}

#[test]
fn two_running_computes_during_an_in_progress_turn_stop_neither_until_it_ends() {
    let o = observe(Trigger::Sweep, in_progress())
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![running("task-1", 1), running("task-2", 2)]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Wait);
    assert_eq!(d.reason, Reason::MultipleComputesUnclear { active: 2 });
    assert!(!d.touches_resources());
    // A provisioning one cannot serve the turn: it goes, the running one stays.
    let o = observe(Trigger::Sweep, in_progress())
        .with_record(active_record(2, "task-2"))
        .with_instances(vec![
            running("task-1", 1),
            instance("task-2", 2, Pending, None),
        ]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Divergent);
    assert_eq!(d.effects[0], stop("task-2", 2, StopReason::Divergent));
    assert_eq!(d.effects[1], Effect::AdoptCompute(iref("task-1", 1)));
}

#[test]
fn unknown_future_session_status_keeps_the_compute_and_is_uncertain() {
    let mut r = active_record(1, "task-1");
    r.lease = Some(lease("task-1", 1, NOW - 1));
    let o = observe(
        Trigger::Sweep,
        sandbox_core::session::Session {
            status: SessionStatus::Unknown,
            ..idle()
        },
    )
    .with_record(r)
    .with_instances(vec![running("task-1", 1)]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Uncertain);
    assert_eq!(d.reason, Reason::UnknownSessionStatus);
    assert!(!d.touches_resources());
}

#[test]
fn narrowed_ownership_filter_still_releases_the_compute_this_deployment_started() {
    // The record and the task are ours; the filter no longer accepts the session's agent.
    let mut s = failed();
    s.agent.id = "agent_other".into();
    let mut o = observe(Trigger::Failed, s)
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![running("task-1", 1)]);
    o.filter.agent_ids = vec![AGENT.into()];
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Release);
    assert_eq!(d.effects[0], stop("task-1", 1, StopReason::SessionFailed));
    // ...but starts nothing new for it.
    let mut s = requires_connection();
    s.agent.id = "agent_other".into();
    let mut o = observe(Trigger::ConnectionRequested, s).with_record(record(
        1,
        None,
        RecordStatus::Stopped,
    ));
    o.filter.agent_ids = vec![AGENT.into()];
    let d = decide(&o);
    assert_eq!(
        (d.outcome, d.reason.clone()),
        (Outcome::Ignore, Reason::NotOwned)
    );
    assert!(starts(&d).is_empty());
}
