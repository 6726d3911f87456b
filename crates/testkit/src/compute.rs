//! The compute twin: an ECS-like provider in memory. Starts are idempotent by
//! `clientToken` (the spec's idempotency token, per deployment); instances are tagged with
//! deployment, environment, session and generation; status follows the clock (a start is
//! `Provisioning` for [`ComputeTiming::start_secs`], a stop `Stopping` for
//! [`ComputeTiming::stop_secs`]); stopped instances stay listed.
//!
//! Every start and stop is logged ([`ComputeEvent`]) so a test can check what was asked
//! and in which state the provider was.

use crate::clock::SimClock;
use sandbox_controller::ports::{Compute, PortError, Started, check_deadline};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, EnvironmentId, InstanceId};
use std::sync::{Arc, Mutex, MutexGuard};

/// How long transitions take on the twin, seconds (0: at once).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ComputeTiming {
    /// Seconds from `start` to `Running` (`Provisioning` before).
    pub start_secs: u64,
    /// Seconds from `stop` to `Stopped` (`Stopping` before).
    pub stop_secs: u64,
}

/// One start or stop request as the provider saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ComputeEvent {
    /// `start` answered with an instance.
    Started {
        /// The instance (as returned).
        instance: ComputeInstance,
        /// `false` when the token matched an existing instance (idempotent replay).
        created: bool,
        /// Unix milliseconds.
        at_ms: u64,
    },
    /// `stop` was accepted.
    Stopped {
        /// The instance as it was just before the stop (`None`: unknown id).
        before: Option<ComputeInstance>,
        /// The id asked for.
        instance_id: InstanceId,
        /// The reason passed.
        reason: String,
        /// Unix milliseconds.
        at_ms: u64,
    },
}

#[derive(Debug)]
struct Instance {
    id: InstanceId,
    deployment: DeploymentId,
    token: String,
    spec: StartSpec,
    created_ms: u64,
    stop_requested_ms: Option<u64>,
    /// Died on its own (crash, spot reclaim): stopped at once.
    died: bool,
}

#[derive(Debug, Default)]
struct State {
    instances: Vec<Instance>,
    events: Vec<ComputeEvent>,
    next: u64,
}

/// An in-memory compute provider. Clones share the same state.
#[derive(Clone, Debug)]
pub struct TwinCompute {
    clock: SimClock,
    timing: ComputeTiming,
    state: Arc<Mutex<State>>,
}

impl TwinCompute {
    /// A provider whose transitions are instant.
    pub fn new(clock: SimClock) -> Self {
        Self::with_timing(clock, ComputeTiming::default())
    }

    /// A provider with the given transition times.
    pub fn with_timing(clock: SimClock, timing: ComputeTiming) -> Self {
        Self {
            clock,
            timing,
            state: Arc::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn view(&self, i: &Instance, now_ms: u64) -> ComputeInstance {
        let running_at = i.created_ms + self.timing.start_secs * 1_000;
        let status = match (i.died, i.stop_requested_ms) {
            (true, _) => ComputeStatus::Stopped,
            (false, Some(at)) if now_ms >= at + self.timing.stop_secs * 1_000 => {
                ComputeStatus::Stopped
            }
            (false, Some(_)) => ComputeStatus::Stopping,
            (false, None) if now_ms >= running_at => ComputeStatus::Running,
            (false, None) => ComputeStatus::Provisioning,
        };
        ComputeInstance {
            instance_id: i.id.clone(),
            environment_id: i.spec.environment_id.clone(),
            session_id: Some(i.spec.session_id.clone()),
            generation: i.spec.generation,
            status,
            started_at: (now_ms >= running_at).then_some(running_at / 1_000),
            stop_code: None,
        }
    }

    /// Every instance of every deployment, as the provider reads them now.
    pub fn instances(&self) -> Vec<ComputeInstance> {
        let now = self.clock.now_ms();
        let s = self.state();
        s.instances.iter().map(|i| self.view(i, now)).collect()
    }

    /// The active (provisioning, pending, running) instances of `env`.
    pub fn active_of(&self, env: &EnvironmentId) -> Vec<ComputeInstance> {
        self.instances()
            .into_iter()
            .filter(|i| &i.environment_id == env && i.status.is_active())
            .collect()
    }

    /// The live (not stopped) instances of `env`.
    pub fn live_of(&self, env: &EnvironmentId) -> Vec<ComputeInstance> {
        self.instances()
            .into_iter()
            .filter(|i| &i.environment_id == env && i.status.is_live())
            .collect()
    }

    /// The spec an instance was started with (remote URL, token, ...).
    pub fn spec_of(&self, id: &InstanceId) -> Option<StartSpec> {
        self.state()
            .instances
            .iter()
            .find(|i| &i.id == id)
            .map(|i| i.spec.clone())
    }

    /// Every start and stop so far, in order.
    pub fn events(&self) -> Vec<ComputeEvent> {
        self.state().events.clone()
    }

    /// The events from index `from` on (for incremental checks).
    pub fn events_since(&self, from: usize) -> Vec<ComputeEvent> {
        self.state().events.get(from..).unwrap_or_default().to_vec()
    }

    /// The instance dies on its own (a crashed executor, a reclaimed task): `Stopped` at
    /// once, with no stop request. Returns whether it was live.
    pub fn kill(&self, id: &InstanceId) -> bool {
        let now = self.clock.now_ms();
        let mut s = self.state();
        let Some(pos) = s.instances.iter().position(|i| &i.id == id) else {
            return false;
        };
        let live = self.view(&s.instances[pos], now).status.is_live();
        s.instances[pos].died = true;
        live
    }
}

impl Compute for TwinCompute {
    async fn start(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<Started, PortError> {
        let now = self.clock.now_ms();
        check_deadline("compute", "start", now / 1000, not_after)?;
        let mut s = self.state();
        if let Some(i) = s
            .instances
            .iter()
            .find(|i| &i.deployment == deployment && i.token == spec.idempotency_token)
        {
            let instance = self.view(i, now);
            s.events.push(ComputeEvent::Started {
                instance: instance.clone(),
                created: false,
                at_ms: now,
            });
            return Ok(Started::Instance(instance));
        }
        s.next += 1;
        // Ends in a letter, so no id is a prefix-plus-digit of another.
        let id = InstanceId::new(format!("twin-task-{}-t", s.next));
        let instance = Instance {
            id,
            deployment: deployment.clone(),
            token: spec.idempotency_token.clone(),
            spec: spec.clone(),
            created_ms: now,
            stop_requested_ms: None,
            died: false,
        };
        let view = self.view(&instance, now);
        s.instances.push(instance);
        s.events.push(ComputeEvent::Started {
            instance: view.clone(),
            created: true,
            at_ms: now,
        });
        Ok(Started::Instance(view))
    }

    async fn describe(&self, id: &InstanceId) -> Result<Option<ComputeInstance>, PortError> {
        let now = self.clock.now_ms();
        let s = self.state();
        Ok(s.instances
            .iter()
            .find(|i| &i.id == id)
            .map(|i| self.view(i, now)))
    }

    async fn list(&self, deployment: &DeploymentId) -> Result<Vec<ComputeInstance>, PortError> {
        let now = self.clock.now_ms();
        let s = self.state();
        // Live ones whose stop was not requested, as ECS lists `desiredStatus` RUNNING.
        Ok(s.instances
            .iter()
            .filter(|i| &i.deployment == deployment && i.stop_requested_ms.is_none())
            .map(|i| self.view(i, now))
            .filter(|i| i.status.is_active())
            .collect())
    }

    async fn stop(&self, id: &InstanceId, reason: &str, not_after: u64) -> Result<(), PortError> {
        let now = self.clock.now_ms();
        check_deadline("compute", "stop", now / 1000, not_after)?;
        let mut s = self.state();
        let pos = s.instances.iter().position(|i| &i.id == id);
        let before = pos.map(|p| self.view(&s.instances[p], now));
        if let Some(p) = pos
            && s.instances[p].stop_requested_ms.is_none()
        {
            s.instances[p].stop_requested_ms = Some(now);
        }
        s.events.push(ComputeEvent::Stopped {
            before,
            instance_id: id.clone(),
            reason: reason.to_owned(),
            at_ms: now,
        });
        Ok(())
    }
}
