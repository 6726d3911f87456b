//! An executor generation that runs and stops before its environment is ever seen
//! `connected` is a failed start (`StartFailureKind::NeverConnected`): counted and backed
//! off like `TaskFailedToStart`, held past the cap with `executor_never_connects` evidence
//! until an owner resolves it. One that connected and then died is restarted as a gone
//! compute (lifecycle-cases.md row 11). Missing evidence never counts.

mod support;

use sandbox_core::compute::ComputeStatus::*;
use sandbox_core::compute::{ComputeInstance, ExitDetail, redact_line};
use sandbox_core::decision::{Decision, Effect, Outcome, Reason, decide, evidence_for};
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::evidence::{EffectState, EvidenceTrigger, Resolution};
use sandbox_core::observed::{EnvironmentRead, Inventory, Observed, Trigger};
use sandbox_core::record::StartFailureKind;
use support::*;

fn starts(d: &Decision) -> usize {
    d.effects
        .iter()
        .filter(|e| matches!(e, Effect::StartCompute(_)))
        .count()
}

/// The state after the provider reports every active instance of `o` stopped by itself
/// (the executor exited 1 after a 401), read at `now` with the environment `ready`.
fn executor_exits(o: &Observed, now: u64) -> Observed {
    let mut next = o.clone();
    if let Inventory::Known { instances } = &mut next.inventory {
        for i in instances.iter_mut().filter(|i| i.status.is_live()) {
            i.status = Stopped;
            i.stop_code = Some("EssentialContainerExited".into());
            i.exit = Some(ExitDetail {
                reason: Some("Essential container in task exited".into()),
                exit_code: Some(1),
                output: vec!["registration failed: 401 Unauthorized".into()],
            });
        }
    }
    next.environment_status = EnvironmentRead::Read {
        status: EnvironmentStatus::Ready,
    };
    next.now = now;
    next.trigger = Trigger::Sweep;
    next
}

/// A started instance reads running.
fn runs(o: &Observed) -> Observed {
    let mut next = o.clone();
    if let Inventory::Known { instances } = &mut next.inventory {
        for i in instances.iter_mut().filter(|i| i.status.is_starting()) {
            i.status = Running;
        }
    }
    next
}

/// What the worker does with a decision's evidence: appended to the record.
fn keep_evidence(o: &mut Observed, d: &Decision) {
    if let Some(e) = evidence_for(o, d, None, false)
        && let Some(r) = o.record.as_mut()
    {
        sandbox_core::evidence::append(&mut r.evidence, e);
    }
}

#[test]
fn an_executor_that_never_connects_is_held_after_the_attempt_limit() {
    let policy = test_policy();
    let mut o = observe(Trigger::ConnectionRequested, requires_connection());
    let mut started = 0;
    let mut last = None;
    // Look every 5 s for two hours: each start runs and exits at once.
    for step in 0..(2 * 3_600 / 5) {
        let now = NOW + step * 5;
        o.now = now;
        let d = decide(&o);
        started += starts(&d);
        keep_evidence(&mut o, &d);
        o = apply(&o, &d);
        o = executor_exits(&runs(&o), now + 1);
        last = Some(d);
    }
    assert_eq!(
        started, policy.max_start_attempts as usize,
        "one start per allowed attempt, then held"
    );
    let d = last.unwrap();
    assert_eq!(d.outcome, Outcome::Reconcile);
    let Reason::ExecutorNeverConnects {
        attempts,
        last_exit,
    } = &d.reason
    else {
        panic!("held with the reason: {d:?}");
    };
    assert_eq!(*attempts, policy.max_start_attempts);
    assert!(last_exit.contains("exit code 1"), "{last_exit}");
    assert!(last_exit.contains("401 Unauthorized"), "{last_exit}");
    let r = o.record.clone().unwrap();
    assert_eq!(
        r.start_failure.as_ref().unwrap().kind,
        StartFailureKind::NeverConnected
    );
    let open: Vec<_> = r.open_evidence().map(|e| e.trigger).collect();
    assert_eq!(open, vec![EvidenceTrigger::ExecutorNeverConnects]);

    // The owner fixed the key: resolving releases the hold, and the next look starts.
    o.trigger = Trigger::Resolve {
        resolution: Resolution {
            effect: EffectState::NotNeeded,
            by: "ops".into(),
            at: o.now,
            note: Some("executor key rotated".into()),
        },
    };
    let d = decide(&o);
    assert!(d.effects.contains(&Effect::ClearStartFailure), "{d:?}");
    let mut next = apply(&o, &d);
    next.trigger = Trigger::Sweep;
    let d = decide(&next);
    assert_eq!(d.outcome, Outcome::Start, "{d:?}");
}

#[test]
fn an_executor_that_connected_and_died_is_restarted_without_a_failed_start() {
    let mut r = active_record(2, "task-2");
    r.instance_connected_at = Some(NOW - 500);
    r.instance_recorded_at = Some(NOW - 600);
    let o = executor_exits(
        &observe(Trigger::ConnectionRequested, requires_connection())
            .with_record(r)
            .with_instances(vec![running("task-2", 2)]),
        NOW,
    );
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Start, "{d:?}");
    assert_eq!(
        d.reason,
        Reason::ComputeGone {
            previous: sandbox_core::ids::Generation(2)
        }
    );
    assert!(
        !d.effects
            .iter()
            .any(|e| matches!(e, Effect::RecordStartFailure(_))),
        "{d:?}"
    );
}

/// The decision on a generation found stopped, never seen connected, with `status`.
fn found_stopped(status: EnvironmentRead, stop_code: &str) -> Decision {
    let r = active_record(2, "task-2");
    let mut task: ComputeInstance = instance("task-2", 2, Stopped, Some(NOW - 60));
    task.stop_code = Some(stop_code.into());
    let mut o = observe(Trigger::Sweep, requires_connection())
        .with_record(r)
        .with_instances(vec![task]);
    o.environment_status = status;
    decide(&o)
}

fn counted(d: &Decision) -> bool {
    d.effects.iter().any(|e| {
        matches!(e, Effect::RecordStartFailure(f) if f.kind == StartFailureKind::NeverConnected)
    })
}

#[test]
fn never_connected_needs_the_status_read_and_not_connected() {
    let ready = EnvironmentRead::Read {
        status: EnvironmentStatus::Ready,
    };
    let d = found_stopped(ready, "EssentialContainerExited");
    assert!(counted(&d), "{d:?}");
    assert_eq!(d.reason, Reason::StartBackoff { attempts: 1 });
    // Missing evidence never counts: not read, or the Agents API down.
    for status in [EnvironmentRead::NotRead, EnvironmentRead::Unavailable] {
        let d = found_stopped(status, "EssentialContainerExited");
        assert!(!counted(&d), "{status:?}: {d:?}");
        assert_eq!(d.outcome, Outcome::Start, "restarted as gone: {d:?}");
    }
    // Connected at the moment it is found stopped: it connected.
    let connected = EnvironmentRead::Read {
        status: EnvironmentStatus::Connected,
    };
    assert!(!counted(&found_stopped(
        connected,
        "EssentialContainerExited"
    )));
    // Stopped by someone else (a user, a Spot interruption): not the executor's failure.
    for code in ["UserInitiated", "SpotInterruption"] {
        assert!(!counted(&found_stopped(ready, code)), "{code}");
    }
}

#[test]
fn the_exit_summary_is_bounded_and_the_redaction_drops_keys() {
    let key = "sk-proj-AbC123dEf456GhI789jKl012";
    let line = redact_line(&format!(
        "error: POST https://api.openai.com/v1/x Authorization: Bearer {key} failed 401 api_key={key}"
    ));
    assert!(!line.contains(key), "{line}");
    assert!(line.contains("401"), "{line}");
    assert!(line.contains("https://api.openai.com/v1/x"), "{line}");
    let long = ExitDetail {
        reason: Some("x".repeat(5_000)),
        exit_code: Some(2),
        output: vec![],
    };
    assert!(long.summary().len() <= 1_024);
}
