//! Watching a generation until it is seen connected: the environment's status
//! (`GET /agents/environments/{id}`) is read on every look at an environment whose
//! recorded instance was never seen `connected`, while it runs and when it is found
//! stopped. That is what lets the decision tell a generation that never connected (a
//! failed start, [`sandbox_core::record::StartFailureKind::NeverConnected`]) from one that
//! connected and then died (a gone compute, restarted), and what records
//! [`sandbox_core::record::Record::instance_connected_at`] for a generation connected only
//! briefly. A failed read is missing evidence ([`sandbox_core::observed::EnvironmentRead::Unavailable`]),
//! which the decision never counts as "never connected" (docs/ARCHITECTURE.md
//! principle 5).
//!
//! Cost: one status read per look, only until the generation is seen connected (then the
//! record's `instance_connected_at` is set and the watch ends), flat in the deployment.

use sandbox_core::compute::ComputeStatus;
use sandbox_core::observed::Inventory;
use sandbox_core::record::Record;

/// Whether this look must read the environment's status to watch the recorded
/// generation: the record claims a compute never seen connected, and the provider reads
/// that compute running or stopped (a start in flight has nothing to show yet; an
/// unavailable inventory says nothing).
pub(crate) fn watching(record: Option<&Record>, inventory: &Inventory) -> bool {
    let Some(current) = record
        .filter(|r| r.claims_compute() && r.instance_connected_at.is_none())
        .and_then(Record::current)
    else {
        return false;
    };
    let Inventory::Known { instances } = inventory else {
        return false;
    };
    instances.iter().any(|i| {
        i.instance_id == current.instance_id
            && matches!(i.status, ComputeStatus::Running | ComputeStatus::Stopped)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::compute::{ComputeInstance, InstanceRef};
    use sandbox_core::ids::{EnvironmentId, Generation, InstanceId, SessionId};

    fn instance(status: ComputeStatus) -> ComputeInstance {
        ComputeInstance {
            instance_id: InstanceId::new("task-1"),
            environment_id: EnvironmentId::new("env_1"),
            session_id: None,
            generation: Generation(1),
            status,
            started_at: Some(1),
            stop_code: None,
            exit: None,
        }
    }

    fn record() -> Record {
        let mut r = Record::new(EnvironmentId::new("env_1"), SessionId::new("sess_1"));
        r.instance = Some(InstanceRef {
            instance_id: InstanceId::new("task-1"),
            generation: Generation(1),
        });
        r.generation = Generation(1);
        r
    }

    fn known(s: ComputeStatus) -> Inventory {
        Inventory::Known {
            instances: vec![instance(s)],
        }
    }

    #[test]
    fn a_generation_is_watched_until_seen_connected_while_running_and_when_stopped() {
        let r = record();
        assert!(watching(Some(&r), &known(ComputeStatus::Running)));
        assert!(watching(Some(&r), &known(ComputeStatus::Stopped)));
        assert!(!watching(Some(&r), &known(ComputeStatus::Pending)));
        assert!(!watching(Some(&r), &Inventory::Unavailable));
        assert!(!watching(None, &known(ComputeStatus::Running)));
        let mut seen = r.clone();
        seen.instance_connected_at = Some(5);
        assert!(!watching(Some(&seen), &known(ComputeStatus::Running)));
        let mut stopped = r;
        stopped.status = sandbox_core::record::RecordStatus::Stopped;
        assert!(!watching(Some(&stopped), &known(ComputeStatus::Stopped)));
    }
}
