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
//! | `start_failures` | count | | a start answered without an instance, or a started compute that stopped before it ran (ECS `TaskFailedToStart`; row 28) |
//! | `executor_never_connected` | count | | a generation that ran and stopped without its environment ever being seen `connected` (counted in `start_failures` too: a rejected executor key, an image without `codex`, a forwarder that exits; [`sandbox_core::record::StartFailureKind::NeverConnected`]) |
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
//! | `capacity_waits` | count | | a start that found the deployment's executor cap reached and waits (reason `capacity_limit`) |
//! | `executor_slots` | count (one value per sweep) | | executor slots in use (the cap's counter), read by every sweep while the cap is on |
//! | `held_environments` | count (one value per sweep) | | environments with open reconciliation evidence (held for an owner), counted by every sweep in the registry's list (a value, not a gauge: the EMF recorder writes a gauge on every flush, and an invocation that recorded nothing writes nothing) |
//!
//! | `pool_hits` | count | | a start applied by claiming a warm pool member ([`crate::pool`]) |
//! | `pool_misses` | count | | a start with the pool on that found no usable member and started cold |
//! | `pool_size` | count (one value per refill) | | idle, live pool members after a refill |
//!
//! | `start_to_connected_seconds` | seconds | `path` (`warm`: a claimed pool member, `cold`: a started compute) | from the accepted start (`RunTask`, or the claim) to the first observation of its executor connected ([`sandbox_core::record::Record::instance_connected_at`]: an upper bound, read when the connection request is no longer required) |

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
    /// Generations that stopped without ever being seen connected.
    pub const EXECUTOR_NEVER_CONNECTED: &str = "executor_never_connected";
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
    /// Accepted start → executor first seen connected, seconds.
    pub const START_TO_CONNECTED: &str = "start_to_connected_seconds";
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
    /// Cost and safety ceilings that acted, label `reason`:
    /// `lifetime_exceeded`, `lifetime_hard_cap`, `no_work` (executor stops),
    /// `replacement_cap` (a stop or a held start at the cap), `remote_url_not_allowed`
    /// (no compute for the session).
    pub const CEILINGS: &str = "ceilings";
    /// Starts that waited at the executor cap.
    pub const CAPACITY_WAITS: &str = "capacity_waits";
    /// Executor slots in use, one value per sweep.
    pub const EXECUTOR_SLOTS: &str = "executor_slots";
    /// Sweep jobs decided without the lock and without an effect: nothing written, no
    /// audit entry.
    pub const SWEEP_NO_EFFECT: &str = "sweep_no_effect";
    /// Starts applied by claiming a warm pool member.
    pub const POOL_HITS: &str = "pool_hits";
    /// Starts with the pool on that found no usable member.
    pub const POOL_MISSES: &str = "pool_misses";
    /// Idle, live pool members after a refill, one value per refill.
    pub const POOL_SIZE: &str = "pool_size";
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
        (CEILINGS, "cost and safety ceilings that acted, by reason"),
        (
            CAPACITY_WAITS,
            "starts that waited at the deployment's executor cap",
        ),
        (
            SWEEP_NO_EFFECT,
            "sweep jobs with nothing to do, decided without the lock (nothing written)",
        ),
        (POOL_HITS, "starts applied by claiming a warm pool member"),
        (
            POOL_MISSES,
            "starts with the pool on that found no usable member",
        ),
    ] {
        describe_counter!(name, Unit::Count, what);
    }
    describe_histogram!(
        EXECUTOR_SLOTS,
        Unit::Count,
        "executor slots in use, per sweep"
    );
    describe_histogram!(POOL_SIZE, Unit::Count, "idle pool members, per refill");
    describe_histogram!(
        HELD_ENVIRONMENTS,
        Unit::Count,
        "environments with open reconciliation evidence, per sweep"
    );
    for (name, what) in [
        (ENQUEUE_TO_START, "job enqueue to accepted compute start"),
        (
            START_TO_CONNECTED,
            "accepted compute start to executor first seen connected",
        ),
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
    if let Some(reason) = ceiling_of(decision) {
        metrics::counter!(names::CEILINGS, "reason" => reason).increment(1);
    }
    if matches!(
        decision.reason,
        sandbox_core::decision::Reason::CapacityLimit { .. }
    ) {
        metrics::counter!(names::CAPACITY_WAITS).increment(1);
    }
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
            // A compute that stopped before it ran (row 28), or that ran and stopped
            // without ever connecting: the start failed after the provider accepted it.
            Effect::RecordStartFailure(f) => {
                metrics::counter!(names::START_FAILURES).increment(1);
                if f.kind == sandbox_core::record::StartFailureKind::NeverConnected {
                    metrics::counter!(names::EXECUTOR_NEVER_CONNECTED).increment(1);
                }
            }
            _ => {}
        }
    }
}

/// The ceiling a decision applies, as the `reason` label of [`names::CEILINGS`].
pub fn ceiling_of(decision: &Decision) -> Option<&'static str> {
    use sandbox_core::decision::Reason;
    match &decision.reason {
        Reason::LifetimeExceeded { .. } => Some("lifetime_exceeded"),
        Reason::LifetimeHardCap { .. } => Some("lifetime_hard_cap"),
        Reason::NoWorkLeaseExpired { .. } => Some("no_work"),
        Reason::ReplacementCapReached { .. } => Some("replacement_cap"),
        Reason::RemoteUrlNotAllowed { .. } => Some("remote_url_not_allowed"),
        _ => None,
    }
}

/// The current instance's executor was seen connected for the first time, `secs` seconds
/// after the record began naming it (the accepted start or claim); `warm`: the instance
/// was a claimed pool member (label `path` = `warm`, else `cold`).
pub fn executor_connected(secs: u64, warm: bool) {
    let path = if warm { "warm" } else { "cold" };
    metrics::histogram!(names::START_TO_CONNECTED, "path" => path).record(secs as f64);
}

/// A start claimed a pool member (`hit`) or found none and started cold.
pub fn pool_claim(hit: bool) {
    let name = if hit {
        names::POOL_HITS
    } else {
        names::POOL_MISSES
    };
    metrics::counter!(name).increment(1);
}

/// The idle, live pool members after a refill.
pub fn pool_size(idle: usize) {
    metrics::histogram!(names::POOL_SIZE).record(idle as f64);
}

/// The executor slots in use, read by a sweep.
pub fn executor_slots(in_use: u64) {
    metrics::histogram!(names::EXECUTOR_SLOTS).record(in_use as f64);
}

/// A sweep job decided without the lock, with no effect.
pub fn sweep_no_effect() {
    metrics::counter!(names::SWEEP_NO_EFFECT).increment(1);
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

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use sandbox_core::compute::{
        ComputeInstance, ComputeStatus, InstanceRef, TASK_FAILED_TO_START,
    };
    use sandbox_core::decision::decide;
    use sandbox_core::ids::{Generation, InstanceId};
    use sandbox_core::observed::{EnvironmentRead, OwnershipFilter, Policy, SessionView, Trigger};
    use sandbox_core::record::Record;
    use sandbox_core::session::Session;

    const NOW: u64 = 1_764_400_000;

    /// Counter totals by name (labels summed) of what `f` recorded.
    fn counters(f: impl FnOnce()) -> std::collections::HashMap<String, u64> {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, f);
        let mut out = std::collections::HashMap::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            if let DebugValue::Counter(n) = value {
                *out.entry(key.key().name().to_owned()).or_default() += n;
            }
        }
        out
    }

    /// The session wants a connection; the record names task-1 (generation 1), which ECS
    /// now reports `STOPPED` with `stopCode` `status`.
    fn recorded_task_stopped(stop_code: &str) -> Observed {
        let session: Session = serde_json::from_str(include_str!(
            "../../../events/sessions/self_hosted.requires_action.environment_connection.json"
        ))
        .expect("events/ fixture parses");
        let environment_id = session.self_hosted().expect("self_hosted").id.clone();
        let instance = ComputeInstance {
            instance_id: InstanceId::new("task-1"),
            environment_id: environment_id.clone(),
            session_id: Some(session.id.clone()),
            generation: Generation(1),
            status: ComputeStatus::Stopped,
            started_at: None,
            stop_code: Some(stop_code.to_owned()),
            exit: None,
        };
        let mut record = Record::new(environment_id.clone(), session.id.clone());
        record.generation = Generation(1);
        record.instance = Some(InstanceRef {
            instance_id: instance.instance_id.clone(),
            generation: Generation(1),
        });
        record.instance_recorded_at = Some(NOW - 600);
        record.version = 2;
        Observed {
            trigger: Trigger::Sweep,
            environment_id,
            session: SessionView::Found {
                session: Box::new(session),
            },
            environment_status: EnvironmentRead::NotRead,
            record: Some(record),
            inventory: Inventory::Known {
                instances: vec![instance],
            },
            latest_turn: None,
            turn_not_found: false,
            turns_read: false,
            snapshot: Default::default(),
            filter: OwnershipFilter::default(),
            policy: Policy::default(),
            now: NOW,
        }
    }

    fn job(o: &Observed) -> Job {
        Job {
            trigger: o.trigger.clone(),
            session_id: o.record.as_ref().expect("recorded").session_id.clone(),
            environment_id: Some(o.environment_id.clone()),
            webhook_id: None,
            enqueued_at: NOW - 5,
            handoffs: 0,
            swept: None,
            operator_proof: None,
        }
    }

    #[test]
    fn a_task_that_stopped_before_it_ran_counts_as_a_failed_start() {
        let o = recorded_task_stopped(TASK_FAILED_TO_START);
        let d = decide(&o);
        let seen = counters(|| decision_applied(&job(&o), &o, &d, &d.effects, NOW));
        assert_eq!(seen.get(names::START_FAILURES), Some(&1), "{d:?}");
    }

    #[test]
    fn a_task_that_ran_and_stopped_unread_is_not_a_failed_start() {
        let o = recorded_task_stopped("EssentialContainerExited");
        let d = decide(&o);
        let seen = counters(|| decision_applied(&job(&o), &o, &d, &d.effects, NOW));
        assert_eq!(seen.get(names::START_FAILURES), None, "{d:?}");
        assert_eq!(
            seen.get(names::STARTS),
            Some(&1),
            "the next generation starts: {d:?}"
        );
    }

    #[test]
    fn a_task_that_stopped_without_ever_connecting_counts_as_never_connected() {
        let mut o = recorded_task_stopped("EssentialContainerExited");
        o.environment_status = EnvironmentRead::Read {
            status: sandbox_core::environment::EnvironmentStatus::Ready,
        };
        let d = decide(&o);
        let seen = counters(|| decision_applied(&job(&o), &o, &d, &d.effects, NOW));
        assert_eq!(seen.get(names::START_FAILURES), Some(&1), "{d:?}");
        assert_eq!(seen.get(names::EXECUTOR_NEVER_CONNECTED), Some(&1), "{d:?}");
        assert_eq!(seen.get(names::STARTS), None, "backed off: {d:?}");
        // Connected at the look that finds it stopped: a gone compute, restarted.
        o.environment_status = EnvironmentRead::Read {
            status: sandbox_core::environment::EnvironmentStatus::Connected,
        };
        let d = decide(&o);
        let seen = counters(|| decision_applied(&job(&o), &o, &d, &d.effects, NOW));
        assert_eq!(seen.get(names::EXECUTOR_NEVER_CONNECTED), None, "{d:?}");
        assert_eq!(seen.get(names::STARTS), Some(&1), "{d:?}");
    }
}
