//! Workspaces survive replacement (issue 14): every start that follows a generation names
//! the environment's latest snapshot to restore (lifecycle-cases.md rows 10 and 11, and a
//! start after an idle stop); the first start restores nothing.

mod support;

use sandbox_core::compute::ComputeStatus::*;
use sandbox_core::decision::{Effect, Outcome, StartSpec, decide};
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::ids::Generation;
use sandbox_core::observed::Trigger;
use sandbox_core::record::{Record, RecordStatus};
use sandbox_core::workspace::SnapshotRef;
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

#[test]
fn connection_request_after_an_idle_stop_restores_the_stopped_generations_snapshot() {
    let record = with_chain(
        record(1, Some("task-1"), RecordStatus::Stopped),
        &[snap("snap-1", 1)],
    );
    let o = observe(Trigger::ConnectionRequested, requires_connection())
        .with_record(record)
        .with_instances(vec![instance("task-1", 1, Stopped, Some(NOW - 900))]);
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
