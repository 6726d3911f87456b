//! When a running compute's connect deadline starts counting
//! ([`crate::observed::Policy::connect_deadline_secs`], lifecycle-cases.md row 10).
//!
//! The deadline gives an executor time to connect once it *could* serve the session. That
//! moment is the latest of:
//! - the compute's start (`ComputeInstance::started_at`, ECS `startedAt`);
//! - the connection request it answers ([`Record::connection_requested_at`]): an executor
//!   that ran for an hour and briefly disconnected gets its full deadline to reconnect;
//! - for a claimed warm pool member, its claim: the time the record began naming it
//!   ([`Record::instance_recorded_at`] with [`Record::instance_from_pool`], written right
//!   after the claim's conditional write). A member's task starts up to its maximum age
//!   before anyone claims it (docs/WARM_POOL.md rule 7: its *lifetime* counts from its
//!   task's start), and its forwarder only learns its assignment at the claim, so counting
//!   the connect deadline from the task's start would give a member claimed as a
//!   replacement, or after a capacity wait, seconds instead of the deadline — and each such
//!   miss burns one of the replacement cap's replacements.
//!
//! Pure: no clock, no I/O.

use crate::compute::ComputeInstance;
use crate::record::Record;

/// Unix seconds from which the connect deadline of `current` runs: the latest of its
/// start (`now` when the provider reports none), `requested_at` (the connection request,
/// Unix seconds) and, when `record` names `current` as a claimed pool member, the claim
/// ([`Record::instance_recorded_at`]). See the module docs.
pub fn connect_clock_start(
    record: Option<&Record>,
    current: &ComputeInstance,
    requested_at: u64,
    now: u64,
) -> u64 {
    let started = current.started_at.unwrap_or(now).max(requested_at);
    let claimed_at = record
        .filter(|r| r.instance_from_pool)
        .filter(|r| {
            r.instance.as_ref().is_some_and(|i| {
                i.instance_id == current.instance_id && i.generation == current.generation
            })
        })
        .and_then(|r| r.instance_recorded_at);
    started.max(claimed_at.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::{ComputeStatus, InstanceRef};
    use crate::ids::{EnvironmentId, Generation, InstanceId, SessionId};

    const NOW: u64 = 1_000_000;

    fn member(started_at: u64) -> ComputeInstance {
        ComputeInstance {
            instance_id: InstanceId::new("task-7"),
            environment_id: EnvironmentId::new("env_1"),
            session_id: Some(SessionId::new("sess_1")),
            generation: Generation(7),
            status: ComputeStatus::Running,
            started_at: Some(started_at),
            stop_code: None,
            exit: None,
        }
    }

    fn record(from_pool: bool, recorded_at: u64) -> Record {
        let mut r = Record::new(EnvironmentId::new("env_1"), SessionId::new("sess_1"));
        r.generation = Generation(7);
        r.instance = Some(InstanceRef {
            instance_id: InstanceId::new("task-7"),
            generation: Generation(7),
        });
        r.instance_recorded_at = Some(recorded_at);
        r.instance_from_pool = from_pool;
        r
    }

    #[test]
    fn a_claimed_member_counts_from_its_claim_not_from_its_task_start() {
        // The member ran 50 min in the pool; the request is 3 min old; claimed 5 s ago.
        let r = record(true, NOW - 5);
        assert_eq!(
            connect_clock_start(Some(&r), &member(NOW - 3_000), NOW - 180, NOW),
            NOW - 5
        );
    }

    #[test]
    fn a_cold_start_and_an_adopted_compute_count_from_start_and_request_only() {
        // Not from the pool: the record's naming time (an adoption, say) does not reset it.
        let r = record(false, NOW - 5);
        assert_eq!(
            connect_clock_start(Some(&r), &member(NOW - 100), NOW - 180, NOW),
            NOW - 100
        );
        assert_eq!(
            connect_clock_start(None, &member(NOW - 100), NOW - 30, NOW),
            NOW - 30
        );
    }

    #[test]
    fn the_claim_time_applies_only_to_the_instance_the_record_names() {
        let r = record(true, NOW - 5);
        let mut other = member(NOW - 3_000);
        other.instance_id = InstanceId::new("task-8");
        assert_eq!(
            connect_clock_start(Some(&r), &other, NOW - 180, NOW),
            NOW - 180
        );
    }
}
