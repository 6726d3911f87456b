//! The cost and safety ceilings (docs/DEPLOYING.md, "Ceilings"), one test per rule, named after the situation:
//! the maximum executor lifetime, idle without work, the replacement cap and the
//! `remote_url` allowlist. Each asserts the named outcome and the exact side effects.

mod support;

use sandbox_core::compute::ComputeStatus::*;
use sandbox_core::decision::{Effect, Outcome, Reason, StopReason, StopSpec, decide};
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::ids::Generation;
use sandbox_core::observed::{Observed, Trigger};
use sandbox_core::record::ShutdownLease;
use sandbox_core::remote_url::RemoteUrlRefusal;
use sandbox_core::session::{Environment, Session, SessionStatus};
use sandbox_core::turn::TurnStatus;
use support::*;

const HOUR: u64 = 3_600;
const LIFETIME: u64 = 8 * HOUR;

fn stop(id: &str, generation: u64, reason: StopReason) -> Effect {
    Effect::StopCompute(StopSpec {
        target: iref(id, generation),
        reason,
    })
}

/// A running executor `task-1` (generation 1) started `age` seconds before `NOW`, with
/// the session active just now (so only the lifetime can matter).
fn aged(trigger: Trigger, mut s: Session, age: u64) -> Observed {
    s.last_active_at = NOW as i64;
    observe(trigger, s)
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![instance("task-1", 1, Running, Some(NOW - age))])
}

fn waiting_on_function_call() -> Session {
    session(SessionStatus::RequiresAction, vec![function_call_action()])
}

/// A running executor whose session was last active `quiet` seconds ago (started well
/// before that), record without a connection request.
fn quiet_for(trigger: Trigger, mut s: Session, quiet: u64) -> Observed {
    s.last_active_at = (NOW - quiet) as i64;
    let mut r = active_record(1, "task-1");
    r.instance_recorded_at = Some(NOW - quiet - 100);
    observe(trigger, s)
        .with_record(r)
        .with_instances(vec![instance(
            "task-1",
            1,
            Running,
            Some(NOW - quiet - 100),
        )])
}

fn no_work_lease(due_at: u64) -> ShutdownLease {
    ShutdownLease {
        target: iref("task-1", 1),
        requested_at: due_at - 300,
        due_at,
    }
}

// ----------------------------------------------------------------- 1. maximum lifetime

#[test]
fn idle_session_executor_past_max_lifetime_is_stopped_at_once_as_lifetime_exceeded() {
    let d = decide(&aged(Trigger::Sweep, idle(), LIFETIME));
    assert_eq!(d.outcome, Outcome::Stop);
    assert_eq!(d.reason, Reason::LifetimeExceeded { age_secs: LIFETIME });
    assert_eq!(
        d.effects,
        vec![
            stop("task-1", 1, StopReason::LifetimeExceeded),
            Effect::MarkStopped
        ]
    );
}

#[test]
fn idle_session_past_max_lifetime_with_a_pending_idle_lease_is_stopped_without_waiting_for_it() {
    let mut o = aged(Trigger::Sweep, idle(), LIFETIME + 5);
    o.record.as_mut().unwrap().lease = Some(lease("task-1", 1, NOW + 200));
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Stop);
    assert_eq!(
        d.effects,
        vec![
            stop("task-1", 1, StopReason::LifetimeExceeded),
            Effect::DropLease,
            Effect::MarkStopped
        ]
    );
}

#[test]
fn executor_within_max_lifetime_is_untouched() {
    let d = decide(&aged(Trigger::Sweep, idle(), LIFETIME - 1));
    assert!(!d.touches_resources(), "{d:?}");
    assert_ne!(d.outcome, Outcome::Stop);
}

#[test]
fn busy_session_executor_past_max_lifetime_runs_on_until_its_next_idle() {
    for s in [in_progress(), waiting_on_function_call()] {
        let d = decide(&aged(Trigger::Sweep, s.clone(), LIFETIME + 60));
        assert!(!d.touches_resources(), "{:?}: {d:?}", s.status);
    }
    // The turn ends: the idle event stops it at once, no grace.
    let d = decide(&aged(Trigger::Idle, idle(), LIFETIME + 120));
    assert_eq!(d.outcome, Outcome::Stop);
    assert_eq!(
        d.reason,
        Reason::LifetimeExceeded {
            age_secs: LIFETIME + 120
        }
    );
}

#[test]
fn active_turn_evidence_counts_as_busy_for_the_lifetime() {
    let o = aged(Trigger::Sweep, idle(), LIFETIME + 60).with_turn(
        sandbox_core::observed::TurnEvidence {
            turn_id: "turn_1".into(),
            status: TurnStatus::InProgress,
            broken_tools: vec![],
        },
    );
    assert!(!decide(&o).touches_resources());
}

#[test]
fn busy_session_executor_past_the_hard_cap_is_stopped_mid_turn_as_lifetime_hard_cap() {
    let hard = LIFETIME + HOUR;
    let d = decide(&aged(Trigger::Sweep, in_progress(), hard));
    // Stopped mid-turn, so reconciled with evidence for an owner, never silent.
    assert_eq!(d.outcome, Outcome::Reconcile);
    assert_eq!(d.reason, Reason::LifetimeHardCap { age_secs: hard });
    assert_eq!(
        d.effects,
        vec![
            stop("task-1", 1, StopReason::LifetimeHardCap),
            Effect::MarkStopped
        ]
    );
    // Without a hard cap it runs on until its next idle.
    let mut o = aged(Trigger::Sweep, in_progress(), hard * 2);
    o.policy.lifetime_hard_cap_secs = 0;
    assert!(!decide(&o).touches_resources());
}

#[test]
fn max_lifetime_zero_never_stops_for_age() {
    let mut o = aged(Trigger::Sweep, idle(), 100 * LIFETIME);
    o.policy.max_lifetime_secs = 0;
    o.policy.no_work_secs = 0;
    let d = decide(&o);
    assert!(
        !matches!(
            d.reason,
            Reason::LifetimeExceeded { .. } | Reason::LifetimeHardCap { .. }
        ),
        "{d:?}"
    );
}

#[test]
fn after_a_lifetime_stop_a_later_connection_request_starts_a_fresh_generation() {
    let o = aged(Trigger::Sweep, idle(), LIFETIME);
    let stopped = apply(&o, &decide(&o));
    let mut next = stopped.clone();
    next.trigger = Trigger::ConnectionRequested;
    next.session = sandbox_core::observed::SessionView::Found {
        session: Box::new(requires_connection()),
    };
    let d = decide(&next);
    assert_eq!(d.outcome, Outcome::Start);
    let started: Vec<_> = d
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::StartCompute(s) => Some(s.generation),
            _ => None,
        })
        .collect();
    assert_eq!(started, vec![Generation(2)]);
}

// ----------------------------------------------------------------- 2. idle without work

#[test]
fn session_waiting_on_a_function_call_with_no_work_for_an_hour_takes_a_no_work_lease() {
    let d = decide(&quiet_for(Trigger::Sweep, waiting_on_function_call(), HOUR));
    assert_eq!(d.outcome, Outcome::ScheduleStop);
    assert_eq!(d.reason, Reason::NoWork { quiet_secs: HOUR });
    assert_eq!(
        d.effects,
        vec![Effect::PutNoWorkLease(no_work_lease(NOW + 300))]
    );
    assert!(!d.touches_resources(), "no stop before the recheck");
    assert_eq!(d.recheck_after_secs, Some(300));
}

#[test]
fn session_with_work_within_the_hour_takes_no_no_work_lease() {
    let d = decide(&quiet_for(
        Trigger::Sweep,
        waiting_on_function_call(),
        HOUR - 1,
    ));
    assert!(d.effects.is_empty(), "{d:?}");
}

#[test]
fn no_work_lease_due_and_still_no_work_stops_the_executor_as_no_work() {
    let l = no_work_lease(NOW);
    let mut o = quiet_for(
        Trigger::NoWorkLeaseDue { lease: l.clone() },
        waiting_on_function_call(),
        HOUR + 300,
    );
    o.record.as_mut().unwrap().no_work_lease = Some(l);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Stop);
    assert_eq!(
        d.reason,
        Reason::NoWorkLeaseExpired {
            quiet_secs: HOUR + 300
        }
    );
    assert_eq!(
        d.effects,
        vec![
            stop("task-1", 1, StopReason::NoWork),
            Effect::DropNoWorkLease,
            Effect::MarkStopped
        ]
    );
}

#[test]
fn no_work_lease_recheck_before_it_is_due_waits_and_stops_nothing() {
    let l = no_work_lease(NOW + 100);
    let mut o = quiet_for(
        Trigger::NoWorkLeaseDue { lease: l.clone() },
        waiting_on_function_call(),
        HOUR + 200,
    );
    o.record.as_mut().unwrap().no_work_lease = Some(l);
    let d = decide(&o);
    assert_eq!(
        (d.outcome, d.reason.clone()),
        (Outcome::Wait, Reason::LeaseNotDue)
    );
    assert!(d.effects.is_empty());
    assert_eq!(d.recheck_after_secs, Some(100));
}

#[test]
fn new_turn_before_the_no_work_lease_is_due_cancels_it() {
    let l = no_work_lease(NOW);
    // The session was active 10 s ago (a function result arrived, a turn ran).
    let mut o = quiet_for(
        Trigger::NoWorkLeaseDue { lease: l.clone() },
        waiting_on_function_call(),
        10,
    );
    o.record.as_mut().unwrap().no_work_lease = Some(l);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::CancelStop);
    assert_eq!(d.reason, Reason::NewWork);
    assert_eq!(d.effects, vec![Effect::DropNoWorkLease]);
}

#[test]
fn running_turn_is_work_even_when_last_active_at_is_old() {
    let mut o = quiet_for(Trigger::Sweep, in_progress(), 2 * HOUR);
    o.policy.max_lifetime_secs = 0;
    let d = decide(&o);
    assert!(d.effects.is_empty(), "{d:?}");
    // And it cancels a pending no-work lease.
    o.record.as_mut().unwrap().no_work_lease = Some(no_work_lease(NOW + 10));
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::CancelStop);
    assert_eq!(d.effects, vec![Effect::DropNoWorkLease]);
}

#[test]
fn connection_request_during_a_no_work_lease_cancels_it_and_keeps_the_executor() {
    let mut o = quiet_for(
        Trigger::ConnectionRequested,
        requires_connection(),
        HOUR + 5,
    )
    .with_env_status(EnvironmentStatus::Connected);
    o.record.as_mut().unwrap().no_work_lease = Some(no_work_lease(NOW + 10));
    let d = decide(&o);
    assert!(!d.touches_resources(), "{d:?}");
    assert!(d.effects.contains(&Effect::DropNoWorkLease), "{d:?}");
}

#[test]
fn no_work_timer_for_a_lease_no_longer_recorded_is_ignored() {
    let o = quiet_for(
        Trigger::NoWorkLeaseDue {
            lease: no_work_lease(NOW),
        },
        waiting_on_function_call(),
        HOUR + 300,
    );
    let d = decide(&o);
    assert_eq!(
        (d.outcome, d.reason.clone()),
        (Outcome::Ignore, Reason::LeaseNotCurrent)
    );
    assert!(d.effects.is_empty());
}

#[test]
fn no_work_lease_naming_another_generation_is_dropped() {
    let mut o = quiet_for(Trigger::Sweep, waiting_on_function_call(), HOUR);
    o.record.as_mut().unwrap().no_work_lease = Some(ShutdownLease {
        target: iref("task-0", 0),
        requested_at: NOW - 400,
        due_at: NOW - 100,
    });
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::CancelStop);
    assert_eq!(d.reason, Reason::LeaseSuperseded);
    assert_eq!(d.effects, vec![Effect::DropNoWorkLease]);
}

#[test]
fn no_work_zero_takes_no_lease_and_forgets_a_pending_one() {
    let mut o = quiet_for(Trigger::Sweep, waiting_on_function_call(), 10 * HOUR);
    o.policy.no_work_secs = 0;
    o.policy.max_lifetime_secs = 0;
    assert!(decide(&o).effects.is_empty());
    o.record.as_mut().unwrap().no_work_lease = Some(no_work_lease(NOW - 1));
    assert_eq!(decide(&o).effects, vec![Effect::DropNoWorkLease]);
}

#[test]
fn no_work_lease_then_due_recheck_round_trip_stops_exactly_once() {
    let o = quiet_for(Trigger::Sweep, waiting_on_function_call(), HOUR);
    let d = decide(&o);
    let mut next = apply(&o, &d);
    let lease = next.record.as_ref().unwrap().no_work_lease.clone().unwrap();
    next.trigger = Trigger::NoWorkLeaseDue { lease };
    next.now = NOW + 300;
    let d = decide(&next);
    assert_eq!(d.outcome, Outcome::Stop);
    let after = apply(&next, &d);
    let d = decide(&after);
    assert!(!d.touches_resources(), "{d:?}");
}

// ----------------------------------------------------------------- 4. replacement cap

/// An executor `task-N` (generation `n`) past its connect deadline, environment
/// disconnected, with `replacements` recorded.
fn unconnected(n: u64, replacements: Vec<u64>) -> Observed {
    let started = NOW - 181;
    let id = format!("task-{n}");
    let mut r = active_record(n, &id);
    r.connection_requested_at = Some(started - 2);
    r.replacements = replacements;
    observe(Trigger::Sweep, requires_connection())
        .with_record(r)
        .with_instances(vec![instance(&id, n, Running, Some(started))])
        .with_env_status(EnvironmentStatus::Disconnected)
}

#[test]
fn executor_missing_its_connect_deadline_is_replaced_and_the_replacement_recorded() {
    let d = decide(&unconnected(2, vec![NOW - 400]));
    assert_eq!(d.outcome, Outcome::Replace);
    assert!(
        d.effects.contains(&Effect::RecordReplacements {
            recent: vec![NOW - 400, NOW]
        }),
        "{d:?}"
    );
}

#[test]
fn replacements_older_than_the_window_are_forgotten() {
    let d = decide(&unconnected(4, vec![NOW - 7_200, NOW - 3_600, NOW - 100]));
    assert_eq!(d.outcome, Outcome::Replace);
    assert!(d.effects.contains(&Effect::RecordReplacements {
        recent: vec![NOW - 100, NOW]
    }));
}

#[test]
fn replacement_cap_reached_stops_the_unconnected_executor_and_reconciles_with_the_evidence() {
    let recent = vec![NOW - 900, NOW - 600, NOW - 300];
    let d = decide(&unconnected(4, recent.clone()));
    assert_eq!(d.outcome, Outcome::Reconcile);
    assert_eq!(
        d.reason,
        Reason::ReplacementCapReached {
            replacements: recent,
            window_secs: HOUR
        }
    );
    assert_eq!(
        d.effects,
        vec![
            stop("task-4", 4, StopReason::ReplacementCap),
            Effect::MarkStopped
        ]
    );
    // Rechecked when the oldest replacement leaves the window.
    assert_eq!(d.recheck_after_secs, Some(HOUR - 900));
}

#[test]
fn replacement_cap_holds_new_starts_until_the_window_frees() {
    let recent = vec![NOW - 900, NOW - 600, NOW - 300];
    let o = unconnected(4, recent.clone());
    let stopped = apply(&o, &decide(&o));
    let d = decide(&stopped);
    assert_eq!(d.outcome, Outcome::Reconcile, "{d:?}");
    assert!(!d.touches_resources());
    // Once the oldest replacement is out of the window, a start is allowed again.
    let d = decide(&stopped.clone().at(NOW - 900 + HOUR));
    assert_eq!(d.outcome, Outcome::Start, "{d:?}");
}

#[test]
fn replacement_cap_zero_means_no_cap() {
    let mut o = unconnected(9, (1..=8).map(|i| NOW - i * 60).rev().collect());
    o.policy.max_replacements = 0;
    assert_eq!(decide(&o).outcome, Outcome::Replace);
}

// ----------------------------------------------------------------- 5. remote_url allowlist

fn with_remote_url(mut s: Session, url: &str) -> Session {
    if let Environment::SelfHosted(env) = &mut s.environment {
        env.remote_url = url.into();
    }
    s
}

#[test]
fn remote_url_on_another_host_is_reconciled_and_starts_nothing() {
    let s = with_remote_url(requires_connection(), "https://evil.test/connect?token=k");
    let d = decide(&observe(Trigger::ConnectionRequested, s));
    assert_eq!(d.outcome, Outcome::Reconcile);
    assert_eq!(
        d.reason,
        Reason::RemoteUrlNotAllowed {
            refusal: RemoteUrlRefusal::HostNotAllowed {
                host: "evil.test".into()
            }
        }
    );
    assert!(d.effects.is_empty());
    assert!(!d.reason.to_string().contains("token"));
}

#[test]
fn remote_url_with_a_scheme_the_allowlist_does_not_name_is_refused() {
    let s = with_remote_url(
        requires_connection(),
        "http://agents.example.test/v1/environments/env_01/connect",
    );
    let d = decide(&observe(Trigger::ConnectionRequested, s));
    assert_eq!(d.outcome, Outcome::Reconcile);
    assert!(matches!(
        d.reason,
        Reason::RemoteUrlNotAllowed {
            refusal: RemoteUrlRefusal::SchemeNotAllowed { .. }
        }
    ));
}

#[test]
fn default_allowlist_lets_an_https_api_openai_com_url_start() {
    let s = with_remote_url(
        requires_connection(),
        "https://api.openai.com/v1/agents/environments/env_01/connect",
    );
    let mut o = observe(Trigger::ConnectionRequested, s);
    o.policy = sandbox_core::observed::Policy::default();
    assert_eq!(decide(&o).outcome, Outcome::Start);
    // And refuses the test host under the default.
    let mut o = observe(Trigger::ConnectionRequested, requires_connection());
    o.policy = sandbox_core::observed::Policy::default();
    assert_eq!(decide(&o).outcome, Outcome::Reconcile);
}

#[test]
fn remote_url_refused_while_a_replacement_is_due_stops_the_executor_and_starts_nothing() {
    let mut o = unconnected(2, vec![]);
    o.session = sandbox_core::observed::SessionView::Found {
        session: Box::new(with_remote_url(requires_connection(), "https://evil.test/")),
    };
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Stop);
    assert!(
        !d.effects
            .iter()
            .any(|e| matches!(e, Effect::StartCompute(_))),
        "{d:?}"
    );
    // Once it is stopped, the connection request is refused: no compute.
    o.inventory = sandbox_core::observed::Inventory::Known { instances: vec![] };
    if let Some(r) = o.record.as_mut() {
        r.status = sandbox_core::record::RecordStatus::Stopped;
    }
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Reconcile);
    assert!(!d.touches_resources());
}

/// The allowlist was narrowed after the executor started: it holds the executor key for a
/// destination no longer allowed, so it stops at the next look, busy or not, and the
/// record is marked stopped (the next connection request is refused, no compute).
#[test]
fn running_executor_whose_remote_url_the_narrowed_allowlist_refuses_is_stopped() {
    for s in [idle(), waiting_on_function_call(), requires_connection()] {
        let s = with_remote_url(s, "https://evil.test/connect");
        let o = aged(Trigger::Sweep, s, HOUR);
        let d = decide(&o);
        assert_eq!(d.outcome, Outcome::Stop, "{d:?}");
        assert!(
            matches!(d.reason, Reason::RemoteUrlNotAllowed { .. }),
            "{d:?}"
        );
        assert_eq!(
            d.effects,
            vec![
                stop("task-1", 1, StopReason::RemoteUrlNotAllowed),
                Effect::MarkStopped
            ]
        );
    }
    // A compute still starting stops too.
    let s = with_remote_url(requires_connection(), "https://evil.test/connect");
    let o = observe(Trigger::ConnectionRequested, s)
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![instance("task-1", 1, Provisioning, None)]);
    assert_eq!(decide(&o).outcome, Outcome::Stop);
}

#[test]
fn idle_session_quiet_past_the_no_work_period_is_left_to_the_idle_lease() {
    let d = decide(&quiet_for(Trigger::Sweep, idle(), 2 * HOUR));
    assert!(
        !d.effects
            .iter()
            .any(|e| matches!(e, Effect::PutNoWorkLease(_))),
        "{d:?}"
    );
    assert_eq!(d.outcome, Outcome::ScheduleStop, "the idle lease: {d:?}");
    assert!(
        d.effects.iter().any(|e| matches!(e, Effect::PutLease(_))),
        "{d:?}"
    );
}
