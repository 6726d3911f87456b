//! Builders for observed states and an `apply` model of the controller's effects, shared
//! by the lifecycle-case tests and the property tests.
#![allow(dead_code, missing_docs)]

use sandbox_core::compute::{ComputeInstance, ComputeStatus, InstanceRef};
use sandbox_core::decision::{Decision, Effect};
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::ids::{EnvironmentId, Generation, InstanceId, SessionId};
use sandbox_core::observed::{
    EnvironmentRead, Inventory, Observed, OwnershipFilter, Policy, SessionView, Trigger,
    TurnEvidence,
};
use sandbox_core::record::{Record, RecordStatus, ShutdownLease};
use sandbox_core::session::{
    Agent, Environment, RequiredAction, SelfHostedEnvironment, Session, SessionStatus,
};
use serde_json::Map;

pub const ENV: &str = "env_01";
pub const SESS: &str = "sess_01";
pub const AGENT: &str = "agent_ours";
pub const REMOTE_URL: &str = "wss://agents.example.test/v1/environments/env_01/connect?t=abc";
pub const NOW: u64 = 1_800_000_000;

pub fn env_id() -> EnvironmentId {
    EnvironmentId::new(ENV)
}

pub fn session(status: SessionStatus, required_actions: Vec<RequiredAction>) -> Session {
    Session {
        id: SessionId::new(SESS),
        object: "agent.session".into(),
        agent: Agent {
            id: AGENT.into(),
            extra: Map::new(),
        },
        created_at: (NOW - 3600) as i64,
        last_active_at: (NOW - 10) as i64,
        status,
        required_actions,
        environment: Environment::SelfHosted(SelfHostedEnvironment {
            id: env_id(),
            remote_url: REMOTE_URL.into(),
            workspace_directory: "/workspace".into(),
            capability_directories: vec![],
            extra: Map::new(),
        }),
        metadata: Default::default(),
        error: None,
        extra: Map::new(),
    }
}

pub fn connection_action() -> RequiredAction {
    RequiredAction::EnvironmentConnection {
        environment_id: env_id(),
    }
}

pub fn function_call_action() -> RequiredAction {
    RequiredAction::FunctionCall {
        call_id: "call_1".into(),
        name: "lookup".into(),
        arguments: serde_json::json!({"q": 1}),
        turn_id: "turn_1".into(),
    }
}

pub fn requires_connection() -> Session {
    session(SessionStatus::RequiresAction, vec![connection_action()])
}
pub fn idle() -> Session {
    session(SessionStatus::Idle, vec![])
}
pub fn in_progress() -> Session {
    session(SessionStatus::InProgress, vec![])
}
pub fn failed() -> Session {
    let mut s = session(SessionStatus::Failed, vec![]);
    s.error = Some("model error".into());
    s
}

pub fn instance(
    id: &str,
    generation: u64,
    status: ComputeStatus,
    started_at: Option<u64>,
) -> ComputeInstance {
    ComputeInstance {
        instance_id: InstanceId::new(id),
        environment_id: env_id(),
        session_id: Some(SessionId::new(SESS)),
        generation: Generation(generation),
        status,
        started_at,
        stop_code: None,
        exit: None,
    }
}

pub fn running(id: &str, generation: u64) -> ComputeInstance {
    instance(id, generation, ComputeStatus::Running, Some(NOW - 60))
}

pub fn iref(id: &str, generation: u64) -> InstanceRef {
    InstanceRef {
        instance_id: InstanceId::new(id),
        generation: Generation(generation),
    }
}

pub fn record(generation: u64, instance_id: Option<&str>, status: RecordStatus) -> Record {
    let mut r = Record::new(env_id(), SessionId::new(SESS));
    r.generation = Generation(generation);
    r.instance = instance_id.map(|id| iref(id, generation));
    r.status = status;
    r.version = 3;
    r
}

pub fn active_record(generation: u64, instance_id: &str) -> Record {
    record(generation, Some(instance_id), RecordStatus::Active)
}

pub fn lease(id: &str, generation: u64, due_at: u64) -> ShutdownLease {
    ShutdownLease {
        target: iref(id, generation),
        requested_at: due_at.saturating_sub(300),
        due_at,
    }
}

/// An observation builder: a trigger and a session, nothing recorded, nothing running.
pub fn observe(trigger: Trigger, session: Session) -> Observed {
    Observed {
        trigger,
        environment_id: env_id(),
        session: SessionView::Found {
            session: Box::new(session),
        },
        environment_status: EnvironmentRead::NotRead,
        record: None,
        inventory: Inventory::Known { instances: vec![] },
        latest_turn: None,
        filter: OwnershipFilter::default(),
        policy: test_policy(),
        now: NOW,
        turn_not_found: false,
        // The worker reads the latest turn before every idle stop: the builder
        // observes "read, no turn"; `no_idle_stop_without_a_turn_read` unsets it.
        turns_read: true,
        snapshot: Default::default(),
    }
}

/// The default policy, with the test sessions' `remote_url` host allowed.
pub fn test_policy() -> Policy {
    Policy {
        remote_url_allowlist: vec!["wss://agents.example.test"].into(),
        ..Policy::default()
    }
}

pub fn observe_view(trigger: Trigger, view: SessionView) -> Observed {
    let mut o = observe(trigger, idle());
    o.session = view;
    o
}

pub trait ObservedExt {
    fn with_record(self, r: Record) -> Self;
    fn with_instances(self, i: Vec<ComputeInstance>) -> Self;
    fn with_env_status(self, s: EnvironmentStatus) -> Self;
    fn with_turn(self, t: TurnEvidence) -> Self;
    fn at(self, now: u64) -> Self;
}

impl ObservedExt for Observed {
    fn with_record(mut self, r: Record) -> Self {
        self.record = Some(r);
        self
    }
    fn with_instances(mut self, i: Vec<ComputeInstance>) -> Self {
        self.inventory = Inventory::Known { instances: i };
        self
    }
    fn with_env_status(mut self, s: EnvironmentStatus) -> Self {
        self.environment_status = EnvironmentRead::Read { status: s };
        self
    }
    fn with_turn(mut self, t: TurnEvidence) -> Self {
        self.latest_turn = Some(t);
        self
    }
    fn at(mut self, now: u64) -> Self {
        self.now = now;
        self
    }
}

/// What the controller and the provider do with each effect, as a model: the state the
/// next decision observes. Starts produce a pending instance; stops read back stopped.
pub fn apply(o: &Observed, d: &Decision) -> Observed {
    let mut next = o.clone();
    let session_id = match &o.session {
        SessionView::Found { session } => session.id.clone(),
        _ => SessionId::new(SESS),
    };
    let mut instances = match &o.inventory {
        Inventory::Known { instances } => instances.clone(),
        Inventory::Unavailable => vec![],
    };
    let fresh = |r: &mut Option<Record>| {
        r.get_or_insert_with(|| Record::new(o.environment_id.clone(), session_id.clone()))
            .version += 1;
    };
    for effect in &d.effects {
        match effect {
            Effect::StartCompute(spec) => {
                instances.push(ComputeInstance {
                    instance_id: InstanceId::new(format!("task-{}", spec.generation)),
                    environment_id: spec.environment_id.clone(),
                    session_id: Some(spec.session_id.clone()),
                    generation: spec.generation,
                    status: ComputeStatus::Pending,
                    started_at: Some(o.now),
                    stop_code: None,
                    exit: None,
                });
                fresh(&mut next.record);
                let r = next.record.as_mut().unwrap();
                r.generation = r.generation.max(spec.generation);
                r.instance = Some(InstanceRef {
                    instance_id: InstanceId::new(format!("task-{}", spec.generation)),
                    generation: spec.generation,
                });
                r.status = RecordStatus::Active;
                r.instance_recorded_at = Some(o.now);
                r.instance_connected_at = None;
            }
            Effect::StopCompute(spec) => {
                for i in instances.iter_mut() {
                    if i.instance_id == spec.target.instance_id {
                        i.status = ComputeStatus::Stopped;
                    }
                }
            }
            Effect::AdoptCompute(r) => {
                fresh(&mut next.record);
                let rec = next.record.as_mut().unwrap();
                rec.generation = rec.generation.max(r.generation);
                rec.instance = Some(r.clone());
                rec.status = RecordStatus::Active;
                rec.instance_recorded_at = Some(o.now);
            }
            Effect::RecordStartFailure(f) => {
                fresh(&mut next.record);
                let rec = next.record.as_mut().unwrap();
                rec.start_failure = Some(f.clone());
                rec.instance = None;
                rec.instance_recorded_at = None;
            }
            Effect::ClearStartFailure => {
                fresh(&mut next.record);
                next.record.as_mut().unwrap().start_failure = None;
            }
            Effect::NoteConnectionRequest { at } => {
                fresh(&mut next.record);
                next.record.as_mut().unwrap().connection_requested_at = Some(*at);
            }
            Effect::ClearConnectionRequest => {
                fresh(&mut next.record);
                next.record.as_mut().unwrap().connection_requested_at = None;
            }
            Effect::PutLease(l) => {
                fresh(&mut next.record);
                next.record.as_mut().unwrap().lease = Some(l.clone());
            }
            Effect::DropLease => {
                if let Some(r) = next.record.as_mut() {
                    r.lease = None;
                }
            }
            Effect::MarkStopped => {
                fresh(&mut next.record);
                let r = next.record.as_mut().unwrap();
                r.status = RecordStatus::Stopped;
                r.lease = None;
                r.connection_requested_at = None;
                r.no_work_lease = None;
            }
            Effect::MarkClosed => {
                fresh(&mut next.record);
                let r = next.record.as_mut().unwrap();
                r.status = RecordStatus::Closed;
                r.cleanup_required = false;
                r.lease = None;
                r.connection_requested_at = None;
                r.no_work_lease = None;
            }
            Effect::RequireCleanup => {
                fresh(&mut next.record);
                next.record.as_mut().unwrap().cleanup_required = true;
            }
            Effect::DeleteSession { .. } => next.session = SessionView::Deleted,
            Effect::ResolveReconciliation(res) => {
                fresh(&mut next.record);
                sandbox_core::evidence::resolve(&mut next.record.as_mut().unwrap().evidence, res);
            }
            Effect::PutNoWorkLease(l) => {
                fresh(&mut next.record);
                next.record.as_mut().unwrap().no_work_lease = Some(l.clone());
            }
            Effect::DropNoWorkLease => {
                if let Some(r) = next.record.as_mut() {
                    r.no_work_lease = None;
                }
            }
            Effect::RecordReplacements { recent } => {
                fresh(&mut next.record);
                next.record.as_mut().unwrap().replacements = recent.clone();
            }
        }
    }
    next.inventory = match &o.inventory {
        Inventory::Known { .. } => Inventory::Known { instances },
        Inventory::Unavailable => Inventory::Unavailable,
    };
    next
}
