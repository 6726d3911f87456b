//! Controller settings. Every value here is read from the deployment's configuration
//! (env vars in Lambda, flags in `sandboxctl serve`).

use sandbox_core::ids::DeploymentId;
use sandbox_core::observed::{OwnershipFilter, Policy};
use sandbox_core::operator_proof::OperatorKey;
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
    /// How long a sweep job may decide on the sweep's read of the provider instead of
    /// reading again, seconds (default 1,200: longer than the fan-out's spread, at most
    /// 900 s, so a sweep's jobs normally make no provider call). The record version guards
    /// it ([`crate::job::SweptEvidence::is_current`]).
    pub sweep_evidence_max_age_secs: u64,
    /// How fast a fanned-out sweep's jobs become visible, jobs per second (default 20):
    /// each job re-reads its session, so this bounds the sweep's Agents API read rate.
    /// The spread is capped by the timers queue's 900 s delay limit.
    pub sweep_jobs_per_sec: u32,
    /// How often the sweeper runs, seconds (default 300; the schedule's rate).
    pub sweep_interval_secs: u64,
    /// A settled record (stopped or with no compute, no lease, no cleanup, nothing live
    /// for it) is swept once per this many seconds instead of every sweep (default
    /// 3,600; 0 sweeps it every time). Closed records are never swept again unless a live
    /// compute of theirs shows up.
    pub settled_resweep_secs: u64,
    /// Stored workspaces one sweep deletes at most (default 100): the
    /// cleanup runs after the fan-out and what is left waits for the next sweep, so a
    /// backlog of deletions never delays the jobs or outlasts the invocation.
    pub sweep_workspace_deletions_max: usize,
    /// Where the deployment's executor key lives, for the terminal record's
    /// `executor_credential` (what to rotate and where), e.g. the Secrets
    /// Manager secret the task definition injects, or `serve`'s key file.
    pub executor_key_location: String,
    /// The warm pool ([`crate::pool`]). Default: off.
    pub pool: PoolSettings,
    /// The operator key ([`sandbox_core::operator_proof`]): verifies the proof a forced
    /// `close`, `resolve` or `timeout_reported` job for an unrecorded session carries
    /// ([`crate::operator_gate`]). `None` (the default): every such job is refused.
    pub operator_key: Option<OperatorKey>,
}

/// The warm pool's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSettings {
    /// Idle members the refill keeps (`pool_size`). 0 (the default, and AWS's): no pool,
    /// every start is cold and no claim is tried.
    pub size: u32,
    /// A member older than this, seconds, is never claimed and the refill stops and
    /// replaces it (`pool_max_age_secs`: a new image or a rotated key reaches the pool
    /// within this). Default: 3600.
    pub max_age_secs: u64,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            size: 0,
            max_age_secs: 3_600,
        }
    }
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
            sweep_evidence_max_age_secs: 1_200,
            sweep_jobs_per_sec: 20,
            sweep_interval_secs: 300,
            settled_resweep_secs: 3_600,
            sweep_workspace_deletions_max: 100,
            executor_key_location:
                "the deployment's executor key (CODEX_API_KEY of every executor)".into(),
            pool: PoolSettings::default(),
            operator_key: None,
        }
    }
}
