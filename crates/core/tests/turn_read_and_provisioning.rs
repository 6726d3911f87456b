//! Decided purely: one turn read before every stop of an idle session (its idle
//! lease, the maximum lifetime, the no-work lease), a hard-cap stop of a busy executor
//! reconciled with evidence, and the opt-in start on `agent.session.created`.

mod support;

use sandbox_core::compute::ComputeStatus::*;
use sandbox_core::decision::{Effect, Outcome, Reason, evidence_for};
use sandbox_core::evidence::EvidenceTrigger;
use sandbox_core::observed::{Observed, ProvisionOn, Trigger, TurnEvidence};
use sandbox_core::record::ShutdownLease;
use sandbox_core::session::{Session, SessionStatus};
use sandbox_core::turn::TurnStatus;
use support::*;

const HOUR: u64 = 3_600;

fn turn(status: TurnStatus) -> TurnEvidence {
    TurnEvidence {
        turn_id: "turn_q".into(),
        status,
        broken_tools: vec![],
    }
}

/// The three idle stops, each about to be decided: (name, observation).
fn due_stops() -> Vec<(&'static str, Observed)> {
    // The idle lease is due.
    let l = lease("task-1", 1, NOW);
    let mut by_lease = observe(Trigger::LeaseDue { lease: l.clone() }, idle())
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![running("task-1", 1)]);
    by_lease.record.as_mut().unwrap().lease = Some(l);
    // Past the maximum lifetime (default 8 h), below the hard cap, session idle.
    let mut s = idle();
    s.last_active_at = NOW as i64;
    let by_lifetime = observe(Trigger::Sweep, s)
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![instance("task-1", 1, Running, Some(NOW - 8 * HOUR))]);
    // The no-work lease is due (a session paused on a function call, quiet for long).
    let nl = ShutdownLease {
        target: iref("task-1", 1),
        requested_at: NOW - 300,
        due_at: NOW,
    };
    let mut s: Session = session(SessionStatus::RequiresAction, vec![function_call_action()]);
    s.last_active_at = (NOW - 2 * HOUR) as i64;
    let mut r = active_record(1, "task-1");
    r.instance_recorded_at = Some(NOW - 2 * HOUR - 100);
    r.no_work_lease = Some(nl.clone());
    let by_no_work = observe(Trigger::NoWorkLeaseDue { lease: nl }, s)
        .with_record(r)
        .with_instances(vec![instance(
            "task-1",
            1,
            Running,
            Some(NOW - 2 * HOUR - 100),
        )]);
    vec![
        ("idle lease", by_lease),
        ("max lifetime", by_lifetime),
        ("no-work lease", by_no_work),
    ]
}

fn stops(d: &sandbox_core::decision::Decision) -> bool {
    d.effects
        .iter()
        .any(|e| matches!(e, Effect::StopCompute(_)))
}

#[test]
fn no_idle_stop_without_a_turn_read() {
    for (name, read) in due_stops() {
        // Read, no turn: the stop goes ahead.
        let d = sandbox_core::decide(&read);
        assert_eq!(d.outcome, Outcome::Stop, "{name}: {d:?}");
        assert!(stops(&d), "{name}");

        // Not read (or the read failed): nothing is stopped; decided again on a read.
        let mut unread = read.clone();
        unread.turns_read = false;
        let d = sandbox_core::decide(&unread);
        assert_eq!(d.outcome, Outcome::Uncertain, "{name}: {d:?}");
        assert_eq!(d.reason, Reason::TurnsNotRead, "{name}");
        assert!(!d.touches_resources(), "{name}: {d:?}");
        assert!(d.recheck_after_secs.is_some(), "{name}");

        // Read, and a turn is queued or running (idle can arrive before queued input
        // starts): the executor stays.
        for status in [TurnStatus::Queued, TurnStatus::InProgress] {
            let d = sandbox_core::decide(&read.clone().with_turn(turn(status)));
            assert!(!stops(&d), "{name}, {status:?} turn: {d:?}");
            assert_ne!(d.outcome, Outcome::Stop, "{name}");
        }
        // A finished turn does not keep it.
        let d = sandbox_core::decide(&read.clone().with_turn(turn(TurnStatus::Completed)));
        assert_eq!(d.outcome, Outcome::Stop, "{name}: {d:?}");
    }
}

#[test]
fn past_the_hard_cap_a_running_or_unread_turn_is_reconciled_with_evidence_never_cut_silently() {
    let hard = 9 * HOUR;
    let mut s = idle();
    s.last_active_at = NOW as i64;
    let base = observe(Trigger::Sweep, s)
        .with_record(active_record(1, "task-1"))
        .with_instances(vec![instance("task-1", 1, Running, Some(NOW - hard))]);
    for (what, o) in [
        (
            "queued turn",
            base.clone().with_turn(turn(TurnStatus::Queued)),
        ),
        ("turn not read", {
            let mut o = base.clone();
            o.turns_read = false;
            o
        }),
        ("busy session", {
            let mut o = base.clone();
            o.session = sandbox_core::observed::SessionView::Found {
                session: Box::new(in_progress()),
            };
            o
        }),
    ] {
        let d = sandbox_core::decide(&o);
        assert_eq!(d.outcome, Outcome::Reconcile, "{what}: {d:?}");
        assert_eq!(d.reason, Reason::LifetimeHardCap { age_secs: hard });
        assert!(stops(&d), "{what}: the cap still stops");
        let e = evidence_for(&o, &d, None, false).expect("evidence for an owner");
        assert_eq!(e.trigger, EvidenceTrigger::LifetimeHardCap, "{what}");
    }
    // Past the cap with nothing running (read): an ordinary lifetime stop, no evidence.
    let d = sandbox_core::decide(&base);
    assert_eq!(d.outcome, Outcome::Stop);
    assert!(evidence_for(&base, &d, None, false).is_none());
}

#[test]
fn session_created_starts_the_first_executor_only_when_provisioning_on_created() {
    let created = |provision_on| {
        let mut o = observe(Trigger::SessionCreated, idle());
        o.policy.provision_on = provision_on;
        o
    };
    let d = sandbox_core::decide(&created(ProvisionOn::Created));
    assert_eq!(d.outcome, Outcome::Start, "{d:?}");
    assert!(sandbox_core::decision::starts_compute(&d));
    // Default: the created event starts nothing (the intake drops it anyway).
    let d = sandbox_core::decide(&created(ProvisionOn::ConnectionRequest));
    assert!(!d.touches_resources(), "{d:?}");
    // Only a first provisioning: a record that ever named a compute starts nothing.
    let d = sandbox_core::decide(&created(ProvisionOn::Created).with_record(record(
        1,
        Some("task-1"),
        sandbox_core::record::RecordStatus::Stopped,
    )));
    assert!(!sandbox_core::decision::starts_compute(&d), "{d:?}");
    // Running already: nothing more.
    let d = sandbox_core::decide(
        &created(ProvisionOn::Created)
            .with_record(active_record(1, "task-1"))
            .with_instances(vec![running("task-1", 1)]),
    );
    assert!(!sandbox_core::decision::starts_compute(&d), "{d:?}");
    // Not owned: nothing.
    let mut o = created(ProvisionOn::Created);
    o.filter.metadata.insert("owner".into(), "team-b".into());
    assert!(!sandbox_core::decide(&o).touches_resources());
    // A failed session: nothing.
    let d = sandbox_core::decide(&{
        let mut o = created(ProvisionOn::Created);
        o.session = sandbox_core::observed::SessionView::Found {
            session: Box::new(failed()),
        };
        o
    });
    assert!(!sandbox_core::decision::starts_compute(&d));
}
