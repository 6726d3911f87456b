//! The concurrency cap per deployment: the pure part of the rule, one
//! test per situation. The worker takes an executor slot with a conditional write just
//! before a start; a start that finds none becomes [`at_capacity`]'s decision.

mod support;

use sandbox_core::compute::ComputeStatus::*;
use sandbox_core::decision::{Effect, Outcome, Reason, at_capacity, decide, starts_compute};
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::observed::{CAPACITY_RETRY_MAX_SECS, Observed, Policy, Trigger};
use sandbox_core::record::RecordStatus;
use support::*;

fn capped(mut o: Observed, cap: u32) -> Observed {
    o.policy.max_executors = cap;
    o
}

#[test]
fn the_cap_is_off_by_default() {
    assert_eq!(Policy::default().max_executors, 0);
    // A serialized policy from before the cap existed reads as "off".
    let mut v = serde_json::to_value(Policy::default()).unwrap();
    v.as_object_mut().unwrap().remove("max_executors");
    let p: Policy = serde_json::from_value(v).unwrap();
    assert_eq!(p.max_executors, 0);
}

#[test]
fn first_connection_request_at_the_cap_waits_with_reason_capacity_limit_and_starts_nothing() {
    let o = capped(
        observe(Trigger::ConnectionRequested, requires_connection()),
        2,
    );
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Start);
    assert!(starts_compute(&d));
    let w = at_capacity(&d, &o);
    assert_eq!(w.outcome, Outcome::Wait);
    assert_eq!(
        w.reason,
        Reason::CapacityLimit {
            cap: 2,
            waited_secs: 0
        }
    );
    // No compute started; the connection request is still noted (the wait counts from it).
    assert_eq!(w.effects, vec![Effect::NoteConnectionRequest { at: NOW }]);
    assert!(!w.touches_resources());
    assert_eq!(w.recheck_after_secs, Some(o.policy.recheck_secs));
}

#[test]
fn a_start_waiting_longer_backs_off_up_to_thirty_seconds() {
    let mut r = record(0, None, RecordStatus::Active);
    r.connection_requested_at = Some(NOW - 60);
    let o = capped(
        observe(Trigger::Sweep, requires_connection()).with_record(r.clone()),
        1,
    );
    let w = at_capacity(&decide(&o), &o);
    assert_eq!(
        w.reason,
        Reason::CapacityLimit {
            cap: 1,
            waited_secs: 60
        }
    );
    assert_eq!(w.recheck_after_secs, Some(15));
    assert!(w.effects.is_empty(), "the request was noted already");
    r.connection_requested_at = Some(NOW - 250);
    let o = o.with_record(r);
    let w = at_capacity(&decide(&o), &o);
    assert_eq!(w.recheck_after_secs, Some(CAPACITY_RETRY_MAX_SECS));
}

#[test]
fn capacity_backoff_starts_at_the_recheck_delay_and_never_exceeds_the_maximum() {
    let p = Policy::default();
    assert_eq!(p.capacity_retry_secs(0), p.recheck_secs);
    assert_eq!(p.capacity_retry_secs(100), 25);
    assert_eq!(p.capacity_retry_secs(10_000), CAPACITY_RETRY_MAX_SECS);
    let zero = Policy {
        recheck_secs: 0,
        ..Policy::default()
    };
    assert_eq!(zero.capacity_retry_secs(0), 1, "never a zero delay");
}

#[test]
fn a_replacement_at_the_cap_leaves_the_unconnected_executor_and_records_no_replacement() {
    // Reached only when the environment holds no slot (a task started before the cap was
    // turned on): normally an environment's replacement reuses its own slot.
    let mut r = active_record(1, "task-1");
    r.connection_requested_at = Some(NOW - 400);
    let o = capped(
        observe(Trigger::Sweep, requires_connection())
            .with_record(r)
            .with_instances(vec![instance("task-1", 1, Running, Some(NOW - 400))])
            .with_env_status(EnvironmentStatus::Disconnected),
        1,
    );
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Replace);
    let w = at_capacity(&d, &o);
    assert_eq!(w.outcome, Outcome::Wait);
    assert!(matches!(w.reason, Reason::CapacityLimit { cap: 1, .. }));
    assert!(w.effects.is_empty(), "{:?}", w.effects);
}

#[test]
fn a_decision_that_starts_nothing_is_unchanged_at_the_cap() {
    let o = capped(
        observe(Trigger::Idle, idle())
            .with_record(active_record(1, "task-1"))
            .with_instances(vec![running("task-1", 1)]),
        1,
    );
    let d = decide(&o);
    assert!(!starts_compute(&d));
    assert_eq!(at_capacity(&d, &o), d);
}

#[test]
fn a_compute_gone_behind_our_back_at_the_cap_waits_for_a_slot_like_a_first_start() {
    let mut r = active_record(1, "task-1");
    r.connection_requested_at = Some(NOW - 20);
    r.instance_recorded_at = Some(NOW - 3_600);
    let o = capped(
        observe(Trigger::ConnectionRequested, requires_connection())
            .with_record(r)
            .with_instances(vec![instance("task-1", 1, Stopped, Some(NOW - 3_600))]),
        3,
    );
    let d = decide(&o);
    assert!(starts_compute(&d), "{d:?}");
    let w = at_capacity(&d, &o);
    assert_eq!(w.outcome, Outcome::Wait);
    assert_eq!(
        w.reason,
        Reason::CapacityLimit {
            cap: 3,
            waited_secs: 20
        }
    );
    assert!(!w.touches_resources());
}

#[test]
fn capacity_limit_reads_as_such_in_the_audit_trail() {
    let r = Reason::CapacityLimit {
        cap: 4,
        waited_secs: 12,
    };
    assert!(r.to_string().starts_with("capacity_limit: 4 executor(s)"));
    assert_eq!(
        serde_json::to_value(&r).unwrap()["reason"],
        serde_json::json!("capacity_limit")
    );
}
