//! A whole controller world over the twins: clock, both queues, registry, compute and the
//! Agents API, each port wrapped `Counting<Faulty<Twin>>` so a test can count calls
//! ([`World::calls`]) and inject faults ([`World::faults`]) on any of them.

use crate::clock::SimClock;
use crate::compute::{AwsLike, ComputeTiming, TwinCompute};
use crate::counting::{CallLog, Counting};
use crate::faulty::{FaultPlan, Faulty};
use crate::queue::TwinQueue;
use crate::registry::TwinRegistry;
use crate::sessions::TwinSessions;
use sandbox_controller::ports::{Outgoing, PortError, Queue, Sent};
use sandbox_controller::{Controller, ControllerConfig, Job};
use sandbox_core::ids::{DeploymentId, EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use std::sync::Arc;
use std::time::Duration;

/// The `remote_url` allowlist entry of the twin's sessions (scheme and host).
pub const TWIN_REMOTE_URL_HOST: &str = "wss://agents.twin.invalid";

/// The deployment id every twin world uses.
pub const DEPLOYMENT: &str = "twin";
/// Maximum receive count of both twin queues before dead-lettering.
pub const MAX_RECEIVE_COUNT: u32 = 5;

/// A port as the world's controllers see it: counted, then faulty, then the twin.
pub type Port<P> = Counting<Faulty<P>>;

/// A controller over a [`World`]'s decorated twins.
pub type TwinController =
    Controller<Port<TwinQueue>, Port<TwinRegistry>, Port<TwinCompute>, Port<TwinSessions>>;

/// The twins of one world and the shared call log and fault plan.
#[derive(Clone, Debug)]
pub struct World {
    /// Simulated time (manual: it moves only when advanced).
    pub clock: SimClock,
    /// The FIFO events queue.
    pub events: TwinQueue,
    /// The standard timers queue.
    pub timers: TwinQueue,
    /// The standard sweep queue: a fanned-out sweep's jobs
    /// ([`Controller::with_sweep_queue`]).
    pub sweep: TwinQueue,
    /// The registry.
    pub registry: TwinRegistry,
    /// The compute provider.
    pub compute: TwinCompute,
    /// The Agents API.
    pub sessions: TwinSessions,
    /// Every call any controller of this world made, in order.
    pub calls: CallLog,
    /// Faults injected into every port of this world.
    pub faults: FaultPlan,
}

impl Default for World {
    fn default() -> Self {
        Self::new()
    }
}

impl World {
    /// A world at the default start time, with instant compute transitions.
    pub fn new() -> Self {
        Self::with_timing(ComputeTiming::default())
    }

    /// A world whose compute takes the given transition times.
    pub fn with_timing(timing: ComputeTiming) -> Self {
        Self::aws_like(timing, AwsLike::strict())
    }

    /// A world whose compute takes the given transition times and reproduces the given
    /// ECS behaviours ([`AwsLike`]).
    pub fn aws_like(timing: ComputeTiming, aws: AwsLike) -> Self {
        let clock = SimClock::new();
        Self {
            events: TwinQueue::fifo(clock.clone(), MAX_RECEIVE_COUNT),
            timers: TwinQueue::standard(clock.clone(), MAX_RECEIVE_COUNT),
            sweep: TwinQueue::standard(clock.clone(), MAX_RECEIVE_COUNT),
            registry: TwinRegistry::new().with_clock(Arc::new(clock.clone())),
            compute: TwinCompute::aws_like(clock.clone(), timing, aws),
            sessions: TwinSessions::new(),
            calls: CallLog::new(),
            faults: FaultPlan::new(),
            clock,
        }
    }

    /// The deployment id of this world.
    pub fn deployment() -> DeploymentId {
        DeploymentId::new(DEPLOYMENT).unwrap_or_else(|e| unreachable!("valid id: {e}"))
    }

    /// Controller settings for a worker named `worker_id` (defaults otherwise; read-back
    /// polling every 10 ms).
    pub fn config(worker_id: &str) -> ControllerConfig {
        let mut c = ControllerConfig::new(Self::deployment());
        c.worker_id = worker_id.to_owned();
        c.stop_readback_interval = Duration::from_millis(10);
        c.stop_readback_timeout = Duration::from_secs(5);
        // The twin's sessions name `wss://agents.twin.invalid/...` (crate::sessions).
        c.policy.remote_url_allowlist = vec![TWIN_REMOTE_URL_HOST].into();
        c
    }

    fn wrap<P>(&self, twin: P) -> Port<P> {
        Counting::new(Faulty::new(twin, self.faults.clone()), self.calls.clone())
    }

    /// A controller over this world with [`World::config`].
    pub fn controller(&self, worker_id: &str) -> TwinController {
        self.controller_with(Self::config(worker_id))
    }

    /// A controller over this world with `config`; its sweeps fan out to the sweep queue,
    /// as deployed.
    pub fn controller_with(&self, config: ControllerConfig) -> TwinController {
        self.controller_on_one_queue(config)
            .with_sweep_queue(self.wrap(self.sweep.clone()))
    }

    /// A controller over this world with `config` whose sweeps fan out to the timers
    /// queue, among the rechecks (the arrangement before the sweep queue: the control of
    /// [`crate::recheck_delay`]).
    pub fn controller_on_one_queue(&self, config: ControllerConfig) -> TwinController {
        Controller::new(
            self.wrap(self.events.clone()),
            self.wrap(self.timers.clone()),
            self.wrap(self.registry.clone()),
            self.wrap(self.compute.clone()),
            self.wrap(self.sessions.clone()),
            Arc::new(self.clock.clone()),
            config,
        )
    }

    /// Enqueues a webhook job on the events queue, straight to the twin (no call counted,
    /// no fault), as the intake would: dedup id = group-independent `dedup_id`.
    ///
    /// # Errors
    /// The twin queue's refusal (never for a valid job).
    pub async fn deliver(
        &self,
        trigger: Trigger,
        session: &SessionId,
        env: Option<&EnvironmentId>,
        webhook_id: &str,
        dedup_id: &str,
    ) -> Result<Sent, PortError> {
        let job = Job {
            handoffs: 0,
            swept: None,
            operator_proof: None,
            trigger,
            session_id: session.clone(),
            environment_id: env.cloned(),
            webhook_id: Some(webhook_id.to_owned()),
            enqueued_at: sandbox_controller::ports::Clock::now(&self.clock),
        };
        self.events
            .send(Outgoing {
                group: job.group().to_owned(),
                job,
                dedup_id: dedup_id.to_owned(),
                delay_secs: 0,
            })
            .await
    }
}
