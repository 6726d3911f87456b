//! In-memory doubles of two ports, for what the benches must not measure: a queue that
//! accepts every send (the criterion intake bench), and a compute that "starts" an
//! executor by writing a row (the throughput bench: spawning processes would measure
//! `fork`/`exec`, not the worker).

use sandbox_controller::ports::{
    Clock, Compute, Outgoing, PortError, Queue, Received, Sent, Started, SystemClock,
    check_deadline,
};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, EnvironmentId, InstanceId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A queue that accepts and counts every send and never delivers anything.
#[derive(Clone, Default)]
pub struct NullQueue {
    sent: Arc<AtomicU64>,
}

impl NullQueue {
    /// Sends accepted so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

impl Queue for NullQueue {
    async fn send(&self, _msg: Outgoing) -> Result<Sent, PortError> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        Ok(Sent::Queued)
    }
    async fn receive(&self, _: usize, _: u32, _: u64) -> Result<Vec<Received>, PortError> {
        Ok(vec![])
    }
    async fn ack(&self, _: &str) -> Result<(), PortError> {
        Ok(())
    }
    async fn retry_after(&self, _: &str, _: u32) -> Result<(), PortError> {
        Ok(())
    }
    async fn dead_letter_count(&self) -> Result<u64, PortError> {
        Ok(0)
    }
}

/// A compute provider in memory: a start adds a running instance at once. Counts starts
/// per environment, so a run can assert that each one was started exactly once.
#[derive(Clone, Default)]
pub struct MemoryCompute {
    instances: Arc<Mutex<Vec<ComputeInstance>>>,
    starts: Arc<Mutex<HashMap<EnvironmentId, u32>>>,
}

impl MemoryCompute {
    /// Starts per environment.
    pub fn starts(&self) -> HashMap<EnvironmentId, u32> {
        self.starts.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

fn poisoned(operation: &'static str) -> PortError {
    PortError::permanent("compute", operation, "memory compute lock poisoned")
}

/// Keeps no workspace (the defaults: `none`).
impl sandbox_controller::ports::Workspaces for MemoryCompute {}

impl Compute for MemoryCompute {
    async fn start(
        &self,
        spec: &StartSpec,
        _: &DeploymentId,
        not_after: u64,
    ) -> Result<Started, PortError> {
        check_deadline("compute", "start", SystemClock.now(), not_after)?;
        let mut instances = self.instances.lock().map_err(|_| poisoned("start"))?;
        let instance = ComputeInstance {
            instance_id: InstanceId::new(format!("mem-{}", instances.len() + 1)),
            environment_id: spec.environment_id.clone(),
            session_id: Some(spec.session_id.clone()),
            generation: spec.generation,
            status: ComputeStatus::Running,
            started_at: Some(0),
            stop_code: None,
            exit: None,
        };
        instances.push(instance.clone());
        *self
            .starts
            .lock()
            .map_err(|_| poisoned("start"))?
            .entry(spec.environment_id.clone())
            .or_default() += 1;
        Ok(Started::Instance(instance))
    }
    async fn describe(&self, id: &InstanceId) -> Result<Option<ComputeInstance>, PortError> {
        let instances = self.instances.lock().map_err(|_| poisoned("describe"))?;
        Ok(instances.iter().find(|i| &i.instance_id == id).cloned())
    }
    async fn list(&self, _: &DeploymentId) -> Result<Vec<ComputeInstance>, PortError> {
        Ok(self.instances.lock().map_err(|_| poisoned("list"))?.clone())
    }
    async fn stop(&self, id: &InstanceId, _: &str, not_after: u64) -> Result<(), PortError> {
        check_deadline("compute", "stop", SystemClock.now(), not_after)?;
        let mut instances = self.instances.lock().map_err(|_| poisoned("stop"))?;
        for i in instances.iter_mut().filter(|i| &i.instance_id == id) {
            i.status = ComputeStatus::Stopped;
        }
        Ok(())
    }
}
