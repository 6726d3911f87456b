//! Controller settings. Every value here is read from the deployment's configuration
//! (env vars in Lambda, flags in `sandboxctl serve`).

use sandbox_core::ids::DeploymentId;
use sandbox_core::observed::{OwnershipFilter, Policy};
use std::time::Duration;

/// Settings of the worker, sweeper and close paths.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// This deployment: tags every compute, filters the provider inventory.
    pub deployment: DeploymentId,
    /// Timing rules of the decision (connect deadline, grace, backoffs), seconds.
    pub policy: Policy,
    /// Which sessions belong to this deployment (lifecycle-cases.md row 24).
    pub filter: OwnershipFilter,
    /// Identifies this worker in lock owners and logs.
    pub worker_id: String,
    /// Effect-key lock lease, seconds (default 120). Must exceed the longest act step
    /// (a stop read-back included); an expired lock is treated as absent, and every write
    /// made under it is refused (fencing). No start or stop is sent in the lease's last
    /// eighth (at most 15 s): the compute port's `not_after` deadline.
    pub lock_ttl_secs: u64,
    /// How long a processed webhook-id is remembered, seconds (default 86,400).
    pub ledger_ttl_secs: u64,
    /// Visibility timeout for received jobs, seconds (default 60).
    pub visibility_secs: u32,
    /// How long to wait for a stopped compute to read back stopped (default 60 s).
    pub stop_readback_timeout: Duration,
    /// Poll interval of that read-back (default 500 ms).
    pub stop_readback_interval: Duration,
    /// Delay before retrying a job whose effect-key lock is busy, seconds (default 2).
    pub lock_busy_retry_secs: u32,
}

impl ControllerConfig {
    /// Defaults for `deployment`.
    pub fn new(deployment: DeploymentId) -> Self {
        Self {
            deployment,
            policy: Policy::default(),
            filter: OwnershipFilter::default(),
            worker_id: format!("worker-{}", std::process::id()),
            lock_ttl_secs: 120,
            ledger_ttl_secs: 86_400,
            visibility_secs: 60,
            stop_readback_timeout: Duration::from_secs(60),
            stop_readback_interval: Duration::from_millis(500),
            lock_busy_retry_secs: 2,
        }
    }
}
