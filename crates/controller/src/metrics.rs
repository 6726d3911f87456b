//! The controller's metrics: names, units and the few places they are recorded.
//!
//! Recorded through the [`metrics`] facade. Without an installed recorder (local mode,
//! tests, `sandboxctl`) every call is a no-op; the Lambda functions install a CloudWatch
//! embedded metric format (EMF) recorder and flush one EMF document per invocation
//! (`sandbox_lambda::emf`), which CloudWatch Logs turns into metrics in the namespace
//! [`NAMESPACE`].
//!
//! **No id is ever a dimension** (an environment, session or task id per dimension value
//! would make one metric per environment): labels are only the bounded sets below
//! (`outcome`, `reason`). Ids go in the log lines next to them.
//!
//! | metric | unit | labels | recorded |
//! |---|---|---|---|
//! | `decisions` | count | `outcome` (`start`, `adopt`, `divergent`, `reconcile`, `uncertain`, ...) | every decision taken under the lock (worker, sweeper, close) |
//! | `starts` | count | | a compute start the provider accepted |
//! | `start_failures` | count | | a start answered without an instance (row 28) |
//! | `orphans_released` | count | | a compute without a record, stopped (row 26) |
//! | `handoffs` | count | | a job handed off to the timers queue |
//! | `stuck_jobs` | count | | a job past the hand-off cap ([`crate::consume::MAX_HANDOFFS`]) |
//! | `enqueue_to_start_seconds` | seconds | | from the job's enqueue (the webhook's, for a webhook job) to the accepted start |
//! | `executor_lifetime_seconds` | seconds | | from the provider's start of a compute to its confirmed stop |
//! | `idle_to_stop_seconds` | seconds | | from the shutdown lease (the idle) to the confirmed stop: compute paid for while idle |
//! | `sweep_duration_seconds` | seconds | | one sweep, list to last decision |
//! | `environments_swept` | count | | environments one sweep examined |
//! | `sweep_deferred` | count | | environments a sweep left for later |
//! | `webhook_accepted` | count | | a delivery queued |
//! | `webhook_ignored` | count | | a verified delivery that is not compute's business |
//! | `webhook_rejected` | count | `reason` (`too_large`, `headers`, `signature`, `malformed`, `queue_unavailable`) | a delivery answered 4xx/503 |
//! | `held_environments` | count (one value per sweep) | | environments with open reconciliation evidence (issue 15: held for an owner), counted by every sweep in the registry's list (a value, not a gauge: the EMF recorder writes a gauge on every flush, and an invocation that recorded nothing writes nothing) |
//!
//! The time from a start to the executor's first connection is not measured yet: the
//! record does not keep when a connection was first seen.

use crate::job::Job;
use sandbox_core::decision::{Decision, Effect, StopReason};
use sandbox_core::observed::{Inventory, Observed};

/// The CloudWatch namespace of every metric.
pub const NAMESPACE: &str = "SandboxLifecycle";

/// Metric names (the alarms and the dashboard in `infra/` name them too).
pub mod names {
    /// Decisions, label `outcome`.
    pub const DECISIONS: &str = "decisions";
    /// Accepted starts.
    pub const STARTS: &str = "starts";
    /// Failed starts.
    pub const START_FAILURES: &str = "start_failures";
    /// Orphans stopped.
    pub const ORPHANS_RELEASED: &str = "orphans_released";
    /// Hand-offs to the timers queue.
    pub const HANDOFFS: &str = "handoffs";
    /// Jobs past the hand-off cap.
    pub const STUCK_JOBS: &str = "stuck_jobs";
    /// Enqueue → accepted start, seconds.
    pub const ENQUEUE_TO_START: &str = "enqueue_to_start_seconds";
    /// Provider start → confirmed stop, seconds.
    pub const EXECUTOR_LIFETIME: &str = "executor_lifetime_seconds";
    /// Shutdown lease → confirmed stop, seconds.
    pub const IDLE_TO_STOP: &str = "idle_to_stop_seconds";
    /// One sweep, seconds.
    pub const SWEEP_DURATION: &str = "sweep_duration_seconds";
    /// Environments one sweep examined.
    pub const ENVIRONMENTS_SWEPT: &str = "environments_swept";
    /// Environments one sweep deferred.
    pub const SWEEP_DEFERRED: &str = "sweep_deferred";
    /// Deliveries queued.
    pub const WEBHOOK_ACCEPTED: &str = "webhook_accepted";
    /// Verified deliveries dropped as not compute's business.
    pub const WEBHOOK_IGNORED: &str = "webhook_ignored";
    /// Deliveries rejected, label `reason`.
    pub const WEBHOOK_REJECTED: &str = "webhook_rejected";
    /// Environments with open reconciliation evidence (one value per sweep).
    pub const HELD_ENVIRONMENTS: &str = "held_environments";
}

/// Registers units and descriptions with the installed recorder (EMF needs the units).
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_histogram};
    use names::*;
    for (name, what) in [
        (DECISIONS, "decisions by outcome"),
        (STARTS, "compute starts accepted by the provider"),
        (
            START_FAILURES,
            "compute starts answered without an instance",
        ),
        (ORPHANS_RELEASED, "computes without a record, stopped"),
        (HANDOFFS, "jobs handed off to the timers queue"),
        (STUCK_JOBS, "jobs past the hand-off cap"),
        (ENVIRONMENTS_SWEPT, "environments examined by a sweep"),
        (SWEEP_DEFERRED, "environments a sweep left for later"),
        (WEBHOOK_ACCEPTED, "webhook deliveries queued"),
        (
            WEBHOOK_IGNORED,
            "verified deliveries that are not compute's business",
        ),
        (WEBHOOK_REJECTED, "webhook deliveries rejected, by reason"),
    ] {
        describe_counter!(name, Unit::Count, what);
    }
    describe_histogram!(
        HELD_ENVIRONMENTS,
        Unit::Count,
        "environments with open reconciliation evidence, per sweep"
    );
    for (name, what) in [
        (ENQUEUE_TO_START, "job enqueue to accepted compute start"),
        (EXECUTOR_LIFETIME, "compute start to confirmed stop"),
        (IDLE_TO_STOP, "shutdown lease to confirmed stop"),
        (SWEEP_DURATION, "one sweep"),
    ] {
        describe_histogram!(name, Unit::Seconds, what);
    }
}

/// Records what one decision did: called once per decision, after its effects were
/// applied (`applied`: the effects that succeeded, in order; `now`: Unix seconds).
pub fn decision_applied(
    job: &Job,
    observed: &Observed,
    decision: &Decision,
    applied: &[Effect],
    now: u64,
) {
    metrics::counter!(names::DECISIONS, "outcome" => decision.outcome.as_str()).increment(1);
    let instances = match &observed.inventory {
        Inventory::Known { instances } => instances.as_slice(),
        Inventory::Unavailable => &[],
    };
    for effect in applied {
        match effect {
            Effect::StartCompute(_) => {
                metrics::counter!(names::STARTS).increment(1);
                metrics::histogram!(names::ENQUEUE_TO_START)
                    .record(now.saturating_sub(job.enqueued_at) as f64);
            }
            Effect::StopCompute(stop) => {
                if stop.reason == StopReason::Orphan {
                    metrics::counter!(names::ORPHANS_RELEASED).increment(1);
                }
                let started = instances
                    .iter()
                    .find(|i| i.instance_id == stop.target.instance_id)
                    .and_then(|i| i.started_at);
                if let Some(started) = started {
                    metrics::histogram!(names::EXECUTOR_LIFETIME)
                        .record(now.saturating_sub(started) as f64);
                }
                let lease = observed.record.as_ref().and_then(|r| r.lease.as_ref());
                if stop.reason == StopReason::LeaseExpired
                    && let Some(lease) = lease.filter(|l| l.target == stop.target)
                {
                    metrics::histogram!(names::IDLE_TO_STOP)
                        .record(now.saturating_sub(lease.requested_at) as f64);
                }
            }
            _ => {}
        }
    }
}

/// A start answered without an instance.
pub fn start_failed() {
    metrics::counter!(names::START_FAILURES).increment(1);
}

/// A job handed off to the timers queue.
pub fn handoff() {
    metrics::counter!(names::HANDOFFS).increment(1);
}

/// A job past the hand-off cap.
pub fn stuck_job() {
    metrics::counter!(names::STUCK_JOBS).increment(1);
}

/// One sweep: how long it took (seconds), how many environments it examined and deferred.
pub fn sweep_done(duration_secs: f64, environments: usize, deferred: usize) {
    metrics::histogram!(names::SWEEP_DURATION).record(duration_secs);
    metrics::counter!(names::ENVIRONMENTS_SWEPT).increment(environments as u64);
    metrics::counter!(names::SWEEP_DEFERRED).increment(deferred as u64);
}

/// A delivery queued.
pub fn webhook_accepted() {
    metrics::counter!(names::WEBHOOK_ACCEPTED).increment(1);
}

/// A verified delivery that is not compute's business.
pub fn webhook_ignored() {
    metrics::counter!(names::WEBHOOK_IGNORED).increment(1);
}

/// A delivery rejected; `reason` is one of the fixed names in the module docs.
pub fn webhook_rejected(reason: &'static str) {
    metrics::counter!(names::WEBHOOK_REJECTED, "reason" => reason).increment(1);
}

/// Environments whose record holds open reconciliation evidence (held for an owner), as
/// one sweep counted them in the registry's list.
pub fn held_environments(count: usize) {
    metrics::histogram!(names::HELD_ENVIRONMENTS).record(count as f64);
}
