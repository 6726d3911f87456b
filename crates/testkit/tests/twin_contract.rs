//! The twins pass the same contract suite as the embedded and AWS adapters, so what the
//! simulation and the fault tests show over them holds for any backend that passes it.

use sandbox_controller::contract::{
    WorkspaceProbe, compute_contract, compute_idempotency_contract, queue_delay_contract,
    queue_fifo_contract, registry_contract, registry_slots_contract, workspace_contract,
};
use sandbox_core::ids::DeploymentId;
use sandbox_core::ids::{EnvironmentId, Generation};
use sandbox_testkit::{ComputeTiming, SimClock, TwinCompute, TwinQueue, TwinRegistry};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_queue_twin_passes_the_contract() {
    // The suite waits for real (1 s visibility): the twin follows the wall clock here.
    queue_fifo_contract(&TwinQueue::fifo(SimClock::wall(), 3), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_queue_twin_passes_the_delay_contract() {
    queue_delay_contract(&TwinQueue::standard(SimClock::wall(), 4), 4).await;
}

#[tokio::test]
async fn registry_twin_passes_the_contract() {
    registry_contract(&TwinRegistry::new()).await;
}

#[tokio::test]
async fn registry_twin_passes_the_slots_contract() {
    registry_slots_contract(&TwinRegistry::new()).await;
}

#[tokio::test]
async fn compute_twin_passes_the_contracts() {
    let deployment = DeploymentId::new("twin-contract").unwrap();
    let c = TwinCompute::new(SimClock::wall());
    compute_contract(&c, &deployment).await;
    compute_idempotency_contract(&c, &deployment).await;
}

#[tokio::test]
async fn compute_twin_with_slow_transitions_passes_the_contracts() {
    // Provisioning and Stopping are observable for 1 s each on the wall clock.
    let deployment = DeploymentId::new("twin-contract-slow").unwrap();
    let timing = ComputeTiming {
        start_secs: 1,
        stop_secs: 1,
    };
    let c = TwinCompute::with_timing(SimClock::wall(), timing);
    compute_contract(&c, &deployment).await;
    compute_idempotency_contract(&c, &deployment).await;
}

/// The twin's volumes, as the agent in the sandbox sees them.
struct TwinFiles(TwinCompute, DeploymentId);

impl WorkspaceProbe for TwinFiles {
    async fn write(&self, env: &EnvironmentId, generation: Generation, path: &str, content: &str) {
        assert!(self.0.write_file(&self.1, env, generation, path, content));
    }
    async fn read(
        &self,
        env: &EnvironmentId,
        generation: Generation,
        path: &str,
    ) -> Option<String> {
        self.0
            .volume(&self.1, env, generation)
            .and_then(|v| v.files.get(path).cloned())
    }
}

#[tokio::test]
async fn compute_twin_passes_the_workspace_contract() {
    let deployment = DeploymentId::new("twin-contract-ws").unwrap();
    let timing = ComputeTiming {
        start_secs: 0,
        stop_secs: 1,
    };
    let c = TwinCompute::with_timing(SimClock::wall(), timing);
    let probe = TwinFiles(c.clone(), deployment.clone());
    workspace_contract(&c, &deployment, Some(&probe)).await;
}
