//! Observations for timing `decide()`: the situations a worker meets most, built from the
//! `events/` session fixtures.

use sandbox_core::compute::{ComputeInstance, ComputeStatus, InstanceRef};
use sandbox_core::ids::{EnvironmentId, Generation, InstanceId};
use sandbox_core::observed::{Inventory, Observed, OwnershipFilter, Policy, SessionView, Trigger};
use sandbox_core::record::Record;
use sandbox_core::session::Session;

const REQUIRES_CONNECTION: &str = include_str!(
    "../../../events/sessions/self_hosted.requires_action.environment_connection.json"
);
const IDLE: &str = include_str!("../../../events/sessions/self_hosted.idle.json");
const NOW: u64 = 1_764_400_000;

fn session(json: &str) -> Session {
    serde_json::from_str(json).expect("events/ session fixture parses")
}

fn observed(trigger: Trigger, session: Session, running: bool) -> Observed {
    let environment_id: EnvironmentId = session
        .self_hosted()
        .map(|e| e.id.clone())
        .expect("fixture is self_hosted");
    let instance = ComputeInstance {
        instance_id: InstanceId::new("task-1"),
        environment_id: environment_id.clone(),
        session_id: Some(session.id.clone()),
        generation: Generation(1),
        status: ComputeStatus::Running,
        started_at: Some(NOW - 60),
        stop_code: None,
        exit: None,
    };
    let record = running.then(|| {
        let mut r = Record::new(environment_id.clone(), session.id.clone());
        r.generation = Generation(1);
        r.instance = Some(InstanceRef {
            instance_id: instance.instance_id.clone(),
            generation: Generation(1),
        });
        r.version = 2;
        r
    });
    Observed {
        trigger,
        environment_id,
        session: SessionView::Found {
            session: Box::new(session),
        },
        environment_status: sandbox_core::observed::EnvironmentRead::NotRead,
        record,
        inventory: Inventory::Known {
            instances: if running { vec![instance] } else { vec![] },
        },
        latest_turn: None,
        filter: OwnershipFilter::default(),
        policy: Policy::default(),
        now: NOW,
        turn_not_found: false,
        turns_read: true,
        snapshot: Default::default(),
    }
}

/// Named observations: a connection request with nothing running (start), the same with
/// the executor already running (a duplicate or late delivery), and an idle session with
/// a running executor (schedule the stop).
pub fn cases() -> Vec<(&'static str, Observed)> {
    vec![
        (
            "start",
            observed(
                Trigger::ConnectionRequested,
                session(REQUIRES_CONNECTION),
                false,
            ),
        ),
        (
            "already_running",
            observed(
                Trigger::ConnectionRequested,
                session(REQUIRES_CONNECTION),
                true,
            ),
        ),
        (
            "idle_schedule_stop",
            observed(Trigger::Idle, session(IDLE), true),
        ),
    ]
}
