//! What a lifecycle row needs of a backend: [`LifecycleHarness`], implemented by the
//! embedded harness ([`crate::Harness`]: SQLite, child processes) and the AWS harness
//! ([`crate::aws_stack::AwsHarness`]: SQS, DynamoDB, ECS on moto). The rows
//! (`tests/lifecycle_rows.rs`) are written once over this trait and run on both; where a
//! row's evidence differs by backend (the OS process table, how an executor is stopped
//! behind the controller's back, what the provider passed to the executor), a method here
//! says it.

use crate::Options;
use agents_sim::{SimClient, SimHandle};
use anyhow::Context as _;
use sandbox_agents_api::AgentsClient;
use sandbox_controller::Controller;
use sandbox_controller::ports::{Compute, Queue, Receipt, Registry};
use sandbox_core::compute::ComputeInstance;
use sandbox_core::ids::{EnvironmentId, InstanceId};
use sandbox_core::record::Record;
use std::time::Duration;

/// A running end-to-end stack on one backend: the simulator, the controller over that
/// backend's adapters, and the backend-specific evidence the rows check.
// `async fn` without a `Send` bound: the rows await these in place, on the test's runtime.
#[allow(async_fn_in_trait)]
pub trait LifecycleHarness: Sized {
    /// The backend's queue adapter.
    type Queue: Queue;
    /// The backend's registry adapter.
    type Registry: Registry;
    /// The backend's compute provider.
    type Compute: Compute;

    /// How long a row waits for one step (a connection, a lease, a release).
    const STEP_TIMEOUT: Duration;
    /// How long a row lets the workers drain the queues once the simulator has delivered
    /// everything.
    const SETTLE: Duration;
    /// Where a turn's command really runs, as its output names its parent
    /// process (the executor's command line); `None` (default) where the simulator
    /// simulates commands (the single-process stand-in, moto).
    const TURN_RUNS_IN: Option<&'static str> = None;

    /// Starts the simulator and the stack with the knobs the rows set.
    ///
    /// # Errors
    /// A setup failure (simulator, listener, backend resources).
    async fn start(opts: Options) -> anyhow::Result<Self>;

    /// The simulator.
    fn sim(&self) -> &SimHandle;

    /// A client of the simulator (API and executor keys).
    fn client(&self) -> &SimClient;

    /// The controller over this backend's adapters.
    fn controller(&self) -> &Controller<Self::Queue, Self::Registry, Self::Compute, AgentsClient>;

    /// The audit entries of one environment's decisions, oldest first (the registry's
    /// audit trail).
    ///
    /// # Errors
    /// The registry's error.
    async fn audit(&self, env: &str) -> anyhow::Result<Vec<sandbox_controller::ports::AuditEntry>>;

    /// Stops one executor outside the controller, as a crash or an operator would: the
    /// controller learns of it only from the provider.
    ///
    /// # Errors
    /// The provider's error.
    async fn stop_behind_the_controllers_back(&self, id: &InstanceId) -> anyhow::Result<()>;

    /// The variables the provider handed to one executor at start, in order: on ECS every
    /// container override of the task (moto echoes RunTask's), locally `REMOTE_URL` and
    /// `ENVIRONMENT_ID` from the executor process's environment.
    ///
    /// # Errors
    /// The provider's error, or no single executor process to read.
    async fn executor_vars(
        &self,
        instance: &ComputeInstance,
    ) -> anyhow::Result<Vec<(String, String)>>;

    /// How many executor processes of `env` the OS process table holds, or `None` where the
    /// backend runs none on this machine (moto runs no containers).
    fn executor_processes(env: &str) -> Option<usize>;

    /// Runs `sandboxctl args...` against this stack, as an operator of this backend does
    /// (locally `--data-dir` and `--deployment`; on AWS `--backend aws` with the worker
    /// function's environment variables).
    async fn sandboxctl(&self, args: &[&str]) -> crate::operator_cli::CtlOutput;

    /// Stops the stack (every live executor of the deployment included) and the simulator.
    /// Returns how many executors were still live and had to be stopped.
    ///
    /// # Errors
    /// The provider's error.
    async fn shutdown(self) -> anyhow::Result<usize>;

    /// Every live instance the provider lists for this deployment (`Compute::list`).
    ///
    /// # Errors
    /// The provider's error.
    async fn instances(&self) -> anyhow::Result<Vec<ComputeInstance>> {
        let c = self.controller();
        Ok(c.compute.list(&c.config.deployment).await?)
    }

    /// Live instances of one environment, per the provider.
    ///
    /// # Errors
    /// The provider's error.
    async fn live(&self, env: &str) -> anyhow::Result<Vec<ComputeInstance>> {
        Ok(self
            .instances()
            .await?
            .into_iter()
            .filter(|i| i.environment_id.as_str() == env && i.status.is_live())
            .collect())
    }

    /// The record of one environment.
    ///
    /// # Errors
    /// The registry's error.
    async fn record(&self, env: &str) -> anyhow::Result<Option<Record>> {
        Ok(self
            .controller()
            .registry
            .get(&EnvironmentId::new(env).effect_key())
            .await?)
    }

    /// The receipts of one environment, oldest first.
    ///
    /// # Errors
    /// The registry's error.
    async fn receipts(&self, env: &str) -> anyhow::Result<Vec<Receipt>> {
        Ok(self
            .controller()
            .registry
            .receipts(&EnvironmentId::new(env).effect_key())
            .await?)
    }

    /// Whether the simulator sees the environment's executor connected.
    ///
    /// # Errors
    /// The simulator client's error.
    async fn connected(&self, env: &str) -> anyhow::Result<bool> {
        Ok(self
            .client()
            .state()
            .await?
            .environment(env)
            .is_some_and(|e| e.connected))
    }

    /// Whether a stop of `env` is done and recorded: the provider shows no live compute
    /// and the record says stopped.
    ///
    /// # Errors
    /// The provider's or the registry's error.
    async fn stopped_and_recorded(&self, env: &str) -> anyhow::Result<bool> {
        Ok(self.live(env).await?.is_empty()
            && self
                .record(env)
                .await?
                .is_some_and(|r| r.status == sandbox_core::record::RecordStatus::Stopped))
    }

    /// Creates a self-hosted session and submits input to it, so it requires its
    /// environment's connection; returns the session and its environment id.
    ///
    /// # Errors
    /// The simulator client's error.
    async fn session_with_input(&self) -> anyhow::Result<(sandbox_core::session::Session, String)> {
        let s = self
            .client()
            .create_session(agents_sim::SessionEnvironment::self_hosted())
            .await?;
        let env = s
            .self_hosted()
            .context("a self-hosted session has an environment")?
            .id
            .as_str()
            .to_owned();
        self.client().submit_message(s.id.as_str(), "go").await?;
        Ok((s, env))
    }

    /// Polls `check` every 100 ms until it holds or `timeout` passes.
    ///
    /// # Errors
    /// The check's error, or a timeout naming `what`.
    async fn wait_until<F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        check: F,
    ) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<bool>>,
    {
        crate::wait_until(what, timeout, check).await
    }
}
