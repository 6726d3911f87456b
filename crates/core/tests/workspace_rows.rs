//! Workspaces survive replacement: every start that follows a generation names
//! the environment's latest snapshot to restore (lifecycle-cases.md rows 10 and 11, and a
//! start after an idle stop); the first start restores nothing. A start restores only a
//! `completed` snapshot: it waits while the latest is `pending`, and a snapshot
//! pending too long, in `error` or gone is a failed start.

mod support;

use sandbox_core::compute::ComputeStatus::*;
use sandbox_core::decision::Reason;
use sandbox_core::decision::{Effect, Outcome, StartSpec, decide};
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::ids::Generation;
use sandbox_core::observed::Trigger;
use sandbox_core::record::{Record, RecordStatus};
use sandbox_core::workspace::{SnapshotRead, SnapshotRef, SnapshotState};
use support::*;

fn snap(id: &str, generation: u64) -> SnapshotRef {
    SnapshotRef {
        snapshot_id: id.into(),
        generation: Generation(generation),
        taken_at: NOW - 100,
        parent: None,
        expires_at: None,
    }
}

fn with_chain(mut r: Record, chain: &[SnapshotRef]) -> Record {
    r.snapshots = chain.to_vec();
    r
}

fn the_start(d: &sandbox_core::Decision) -> &StartSpec {
    let starts: Vec<&StartSpec> = d
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::StartCompute(s) => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(starts.len(), 1, "{d:?}");
    starts[0]
}

#[test]
fn first_connection_request_starts_from_an_empty_workspace() {
    let d = decide(&observe(
        Trigger::ConnectionRequested,
        requires_connection(),
    ));
    assert_eq!(d.outcome, Outcome::Start);
    assert_eq!(the_start(&d).restore, None);
}

#[test]
fn row10_replacement_restores_the_latest_snapshot() {
    let mut record = with_chain(
        active_record(3, "task-3"),
        &[snap("snap-a", 1), snap("snap-b", 2)],
    );
    record.connection_requested_at = Some(NOW - 10_000);
    let o = observe(Trigger::ConnectionRequested, requires_connection())
        .with_record(record)
        .with_instances(vec![instance("task-3", 3, Running, Some(NOW - 10_000))])
        .with_env_status(EnvironmentStatus::Disconnected);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Replace);
    let s = the_start(&d);
    assert_eq!(s.generation, Generation(4));
    // The decision names the latest recorded one; the replacement's own stop takes a
    // newer one, which the controller substitutes (crates/controller worker).
    assert_eq!(s.restore, Some(snap("snap-b", 2)));
}

#[test]
fn row11_compute_gone_starts_the_next_generation_with_the_snapshot_to_restore() {
    let record = with_chain(active_record(2, "task-2"), &[snap("snap-1", 1)]);
    let o = observe(Trigger::ConnectionRequested, requires_connection())
        .with_record(record)
        .with_instances(vec![instance("task-2", 2, Stopped, Some(NOW - 900))]);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Start);
    let s = the_start(&d);
    assert_eq!(s.generation, Generation(3));
    assert_eq!(s.restore, Some(snap("snap-1", 1)));
    assert_eq!(s.previous, Some(iref("task-2", 2)));
}

fn read(id: &str, state: SnapshotState) -> SnapshotRead {
    SnapshotRead::Read {
        snapshot_id: id.into(),
        state,
    }
}

/// A connection request after generation 1 stopped idle and was saved in `snap-1`.
fn after_an_idle_stop(snapshot: SnapshotRead) -> sandbox_core::observed::Observed {
    let record = with_chain(
        record(1, Some("task-1"), RecordStatus::Stopped),
        &[snap("snap-1", 1)],
    );
    let mut o = observe(Trigger::ConnectionRequested, requires_connection())
        .with_record(record)
        .with_instances(vec![instance("task-1", 1, Stopped, Some(NOW - 900))]);
    o.snapshot = snapshot;
    o
}

fn starts(d: &sandbox_core::Decision) -> bool {
    d.effects
        .iter()
        .any(|e| matches!(e, Effect::StartCompute(_)))
}

#[test]
fn connection_request_after_an_idle_stop_restores_the_stopped_generations_snapshot() {
    let o = after_an_idle_stop(read("snap-1", SnapshotState::Completed));
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Start);
    let s = the_start(&d);
    assert_eq!(s.generation, Generation(2));
    assert_eq!(s.restore, Some(snap("snap-1", 1)));
}

#[test]
fn closed_record_with_retained_snapshots_starts_nothing() {
    let mut retained = snap("snap-1", 1);
    retained.expires_at = Some(NOW + 86_400);
    let record = with_chain(record(1, Some("task-1"), RecordStatus::Closed), &[retained]);
    let o = observe(Trigger::ConnectionRequested, requires_connection()).with_record(record);
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Ignore);
    assert!(d.effects.is_empty());
}

#[test]
fn a_start_never_restores_from_a_pending_snapshot() {
    // `snap-1` was taken 100 s ago and is still pending: wait, visibly, and look again.
    let o = after_an_idle_stop(read("snap-1", SnapshotState::Pending));
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Wait, "{d:?}");
    assert_eq!(
        d.reason,
        Reason::SnapshotPending {
            snapshot_id: "snap-1".into(),
            pending_secs: 100
        }
    );
    assert!(!starts(&d), "{d:?}");
    assert_eq!(d.recheck_after_secs, Some(o.policy.snapshot_recheck_secs));
    // Once it completed, the same observation starts from it.
    let done = decide(&after_an_idle_stop(read(
        "snap-1",
        SnapshotState::Completed,
    )));
    assert_eq!(done.outcome, Outcome::Start);
    assert_eq!(the_start(&done).restore, Some(snap("snap-1", 1)));
}

#[test]
fn a_start_first_asks_for_the_snapshot_state_and_never_starts_on_a_failed_read() {
    // Not read (or read for another snapshot): the worker reads it and decides again.
    for not_read in [
        SnapshotRead::NotRead,
        read("snap-0", SnapshotState::Completed),
    ] {
        let d = decide(&after_an_idle_stop(not_read));
        assert_eq!(d.outcome, Outcome::Uncertain);
        assert_eq!(
            d.reason,
            Reason::SnapshotNotRead {
                snapshot_id: "snap-1".into()
            }
        );
        assert!(!starts(&d));
    }
    let d = decide(&after_an_idle_stop(SnapshotRead::Unavailable {
        snapshot_id: "snap-1".into(),
    }));
    assert_eq!(d.outcome, Outcome::Uncertain);
    assert_eq!(
        d.reason,
        Reason::SnapshotStateUnavailable {
            snapshot_id: "snap-1".into()
        }
    );
    assert!(!starts(&d));
}

#[test]
fn a_snapshot_pending_past_the_wait_bound_is_a_failed_start_never_an_empty_workspace() {
    let mut o = after_an_idle_stop(read("snap-1", SnapshotState::Pending));
    o.policy.snapshot_wait_secs = 100;
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Reconcile, "{d:?}");
    assert_eq!(
        d.reason,
        Reason::SnapshotPendingTooLong {
            snapshot_id: "snap-1".into(),
            pending_secs: 100
        }
    );
    assert!(!starts(&d));
    let failure = d
        .effects
        .iter()
        .find_map(|e| match e {
            Effect::RecordStartFailure(f) => Some(f),
            _ => None,
        })
        .expect("counted like a failed start");
    assert_eq!(failure.attempts, 1);
    assert!(failure.reason.contains("snap-1"), "{}", failure.reason);
    assert_eq!(d.recheck_after_secs, Some(o.policy.start_backoff_secs(1)));
    // One second before the bound it still waits, never past it.
    o.policy.snapshot_wait_secs = 130;
    let d = decide(&o);
    assert_eq!(d.outcome, Outcome::Wait);
    assert_eq!(d.recheck_after_secs, Some(30));
    o.policy.snapshot_wait_secs = 101;
    assert_eq!(decide(&o).recheck_after_secs, Some(1));
}

#[test]
fn a_snapshot_in_error_or_gone_is_a_failed_start() {
    for state in [SnapshotState::Error, SnapshotState::Gone] {
        let d = decide(&after_an_idle_stop(read("snap-1", state)));
        assert_eq!(d.outcome, Outcome::Reconcile, "{d:?}");
        assert_eq!(
            d.reason,
            Reason::SnapshotUnusable {
                snapshot_id: "snap-1".into(),
                state
            }
        );
        assert!(!starts(&d));
        assert!(
            d.effects
                .iter()
                .any(|e| matches!(e, Effect::RecordStartFailure(_)))
        );
    }
}

#[test]
fn a_generation_not_saved_yet_is_saved_by_the_worker_before_its_snapshot_is_checked() {
    // Row 11: generation 2 stopped on its own, the latest snapshot is generation 1's. The
    // decision starts; the worker saves generation 2 first and reads the new snapshot's
    // state before it sends the start (crates/controller worker).
    let record = with_chain(active_record(2, "task-2"), &[snap("snap-1", 1)]);
    let o = observe(Trigger::ConnectionRequested, requires_connection())
        .with_record(record)
        .with_instances(vec![instance("task-2", 2, Stopped, Some(NOW - 900))]);
    assert_eq!(o.snapshot, SnapshotRead::NotRead);
    assert_eq!(decide(&o).outcome, Outcome::Start);
}
