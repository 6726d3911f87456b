//! The end-to-end harness on the AWS adapters over moto: the Agents API simulator
//! delivering signed webhooks to the intake (axum on 127.0.0.1, the same router the
//! Lambda's handler code serves) → the SQS FIFO events queue → worker loops → decide →
//! ECS Fargate tasks, with the registry on DynamoDB and rechecks on the SQS timers queue.
//!
//! **moto runs no containers.** A task it "runs" is only a row with a status, so nothing
//! would ever run `codex exec-server` and connect to the simulator. The **executor
//! bridge** plays that part: every ~100 ms ([`AwsOptions::bridge_every`]) it lists the
//! deployment's live ECS tasks (through [`EcsCompute`], i.e. ListTasks by `startedBy` +
//! DescribeTasks), and for each RUNNING task not yet connected it connects the task's
//! environment to the simulator with the executor key ([`SimClient::connect`], the same
//! endpoint `sim-executor` calls); for each task that is STOPPED or no longer listed after
//! connecting it disconnects that connection. Connection counts in
//! the simulator therefore follow the ECS task states, one connection per task.
//!
//! **ECS as documented.** moto runs behind `tests/moto/server.py` (RunTask `clientToken`
//! honoured for 24 h, ListTasks pages and `desiredStatus` RUNNING by default, DescribeTasks
//! `MISSING`), and every ECS client of the harness sits behind a
//! [`StrictEcs`] interceptor: a request the ECS API reference forbids fails, and every
//! request is recorded ([`AwsResources::ecs_guard`] for the controller's client).
//! [`AwsHarness::shutdown`] fails if the controller ever sent (tried to send) a forbidden
//! request, so every AWS end-to-end test checks the request shapes.
//!
//! Needs `MOTO_ENDPOINT` (run through `tests/moto/run.sh`); [`AwsHarness::start`] panics
//! with a message naming the runner when it is unset. Every harness uses its own queues,
//! table, cluster and deployment id, so tests run in parallel on one moto server.

use crate::{DEPLOYMENT, LifecycleHarness, Options};
use agents_sim::{SimClient, SimConfig, SimHandle, Url};
use anyhow::{Context as _, bail};
use aws_config::SdkConfig;
use aws_sdk_ecs::types::DesiredStatus;
use sandbox_agents_api::{AgentsClient, ClientConfig};
use sandbox_aws::bootstrap::{Queues, create_ecs, create_queues, moto_pin_ecs_tasks};
use sandbox_aws::strict_ecs::StrictEcs;
use sandbox_aws::{
    DynamoRegistry, EcsCompute, PoolConfig, SqsQueue, create_table, load_sdk_config,
};
use sandbox_controller::ports::{Clock, Compute as _, NO_DEADLINE, PortError, SystemClock};
use sandbox_controller::{Controller, ControllerConfig, Intake, router};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::ids::{DeploymentId, EnvironmentId, InstanceId};
use sandbox_core::observed::Policy;
use sandbox_core::webhook::WebhookVerifier;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The controller over the AWS adapters and the simulator's Agents API.
pub type AwsController = Controller<SqsQueue, DynamoRegistry, EcsCompute, AgentsClient>;

/// The executor container's name in the harness's task definition.
pub const CONTAINER: &str = "executor";

/// Knobs of one AWS harness: the ones both harnesses share, and the AWS-only ones.
#[derive(Clone, Debug)]
pub struct AwsOptions {
    /// Deliveries, workers, grace, sweeper, turn length and the simulator's connection
    /// deadline, as for the embedded harness.
    pub common: Options,
    /// Whether the simulator delivers webhooks to the intake (`false`: events are only
    /// recorded; the test enqueues jobs itself).
    pub webhooks: bool,
    /// The controller's connect deadline (row 10), real seconds (default 30).
    pub connect_deadline_secs: u64,
    /// Messages one worker receives per events-queue poll (default 10, the SQS maximum).
    /// A batch is handled in order under one visibility timeout.
    pub receive_batch: usize,
    /// How often the executor bridge lists the ECS tasks (default 100 ms).
    pub bridge_every: Duration,
}

impl Default for AwsOptions {
    fn default() -> Self {
        Self {
            common: Options::default(),
            webhooks: true,
            connect_deadline_secs: 30,
            receive_batch: 10,
            bridge_every: Duration::from_millis(100),
        }
    }
}

/// The moto endpoint: this process's [`crate::private_moto::PrivateMoto`] if one was
/// started, else `MOTO_ENDPOINT`. Panics (never skips) when neither is there.
pub fn moto_endpoint() -> String {
    if let Some(private) = crate::private_moto::OVERRIDE.get() {
        return private.clone();
    }
    match std::env::var("MOTO_ENDPOINT") {
        Ok(v) if !v.is_empty() => v.trim_end_matches('/').to_owned(),
        _ => panic!(
            "MOTO_ENDPOINT is not set: the AWS end-to-end tests need moto. Run them through \
             the runner, which starts moto_server on 127.0.0.1 and sets MOTO_ENDPOINT and \
             test credentials: `tests/moto/run.sh cargo nextest run -p sandbox-e2e -E \
             'test(aws)'` (from the workspace root; install moto first with \
             `.venv/bin/pip install -r tests/moto/requirements.txt`)"
        ),
    }
}

/// A simulator whose clock stands still (time scale 0: no deadline passes on its own) with
/// one self-hosted session that got input, so it requires its environment's connection;
/// plus an Agents API client configuration for the simulator. For tests that drive one
/// controller by hand (no webhooks are delivered).
///
/// # Panics
/// When the simulator cannot start or refuses the session.
pub async fn frozen_sim_with_a_waiting_session() -> (
    SimHandle,
    sandbox_core::session::Session,
    EnvironmentId,
    ClientConfig,
) {
    let sim = agents_sim::spawn(SimConfig::default().with_time_scale(0.0))
        .await
        .unwrap();
    let client = sim.client();
    let session = client
        .create_session(agents_sim::SessionEnvironment::self_hosted())
        .await
        .unwrap();
    client
        .submit_message(session.id.as_str(), "go")
        .await
        .unwrap();
    let env = session.self_hosted().unwrap().id.clone();
    let mut api = ClientConfig::new(agents_sim::DEFAULT_API_KEY);
    api.base_url = sim.base_url();
    (sim, session, env, api)
}

/// A short unique token for resource names: wall-clock nanoseconds, process id, counter.
pub fn unique() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:x}{:x}{n:x}",
        nanos & 0xff_ffff_ffff,
        std::process::id() & 0xffff
    )
}

/// The AWS resources of one harness, created on moto.
#[derive(Clone, Debug)]
pub struct AwsResources {
    /// SDK configuration pointed at moto.
    pub sdk: SdkConfig,
    /// The queues.
    pub queues: Queues,
    /// The registry table.
    pub table: String,
    /// The ECS configuration (cluster, task definition, network).
    pub ecs: sandbox_aws::EcsConfig,
    /// The interceptor on the ECS client of [`AwsResources::compute`] (the controller's):
    /// its recorded requests and refusals, and the lag knob.
    pub ecs_guard: StrictEcs,
    /// The warm pool's table and settings, when the pool is on
    /// ([`AwsResources::with_pool`]).
    pub pool: Option<PoolConfig>,
}

impl AwsResources {
    /// Creates fresh queues, a table and a cluster with a task definition on moto, and
    /// pins moto's ECS task states. Panics without `MOTO_ENDPOINT`.
    ///
    /// # Errors
    /// A [`PortError`] from a bootstrap call.
    pub async fn create() -> Result<Self, PortError> {
        let endpoint = moto_endpoint();
        let sdk = load_sdk_config(Some(&endpoint)).await;
        moto_pin_ecs_tasks(&endpoint).await?;
        let u = unique();
        let queues = create_queues(&aws_sdk_sqs::Client::new(&sdk), &format!("e2e-{u}")).await?;
        let table = format!("e2e-{u}");
        create_table(&aws_sdk_dynamodb::Client::new(&sdk), &table).await?;
        let ecs = create_ecs(
            &StrictEcs::new().client(&sdk),
            &endpoint,
            &format!("e2e-{u}"),
            &format!("executor-{u}"),
            CONTAINER,
        )
        .await?;
        Ok(Self {
            sdk,
            queues,
            table,
            ecs,
            ecs_guard: StrictEcs::new(),
            pool: None,
        })
    }

    /// Turns the warm pool on: creates its table on moto; [`AwsResources::compute`] then
    /// starts, claims and lists members there (claims fenced by the registry's lock, as
    /// the worker function's wiring does).
    ///
    /// # Errors
    /// A [`PortError`] from `CreateTable`.
    pub async fn with_pool(mut self) -> Result<Self, PortError> {
        let table = format!("{}-pool", self.table);
        sandbox_aws::pool_table::create_table(&aws_sdk_dynamodb::Client::new(&self.sdk), &table)
            .await?;
        self.pool = Some(PoolConfig {
            table_name: table,
            // Any unique id does on moto (it only prefixes member keys).
            task_role_id: "AROAE2EPOOLROLE".to_owned(),
            max_age_secs: 3_600,
            history_retention_secs: 86_400,
        });
        Ok(self)
    }

    /// The events queue.
    pub fn events(&self) -> SqsQueue {
        self.queues.events(&aws_sdk_sqs::Client::new(&self.sdk))
    }

    /// The timers queue.
    pub fn timers(&self) -> SqsQueue {
        self.queues.timers(&aws_sdk_sqs::Client::new(&self.sdk))
    }

    /// The sweep queue.
    pub fn sweep(&self) -> SqsQueue {
        self.queues.sweep(&aws_sdk_sqs::Client::new(&self.sdk))
    }

    /// The registry.
    pub fn registry(&self) -> DynamoRegistry {
        DynamoRegistry::new(aws_sdk_dynamodb::Client::new(&self.sdk), &self.table)
    }

    /// The compute provider on moto's ECS, its client behind [`AwsResources::ecs_guard`].
    pub fn compute(&self) -> EcsCompute {
        let compute = EcsCompute::new(self.ecs_guard.client(&self.sdk), self.ecs.clone());
        match &self.pool {
            Some(pool) => compute
                .with_pool(aws_sdk_dynamodb::Client::new(&self.sdk), pool.clone())
                .with_claim_fence(&self.table),
            None => compute,
        }
    }

    /// An ECS client for a test's own calls, behind its own [`StrictEcs`] (recorded apart
    /// from the controller's requests).
    pub fn ecs_client(&self) -> aws_sdk_ecs::Client {
        StrictEcs::new().client(&self.sdk)
    }

    /// Every task of the harness's cluster, live and stopped (moto keeps stopped tasks):
    /// the ground truth, unaffected by any lag. `ListTasks` with `cluster` and
    /// `desiredStatus` (no `startedBy`, so the combination is allowed) for `RUNNING` and
    /// `STOPPED`, every page, exact cluster matches only (moto's cluster filter is a
    /// substring match), then `DescribeTasks` per 100 through a separate adapter.
    ///
    /// # Errors
    /// A [`PortError`] when a call fails.
    pub async fn all_tasks(&self) -> Result<Vec<ComputeInstance>, PortError> {
        let client = self.ecs_client();
        let ours = format!(":task/{}/", self.ecs.cluster);
        let mut arns = Vec::new();
        for status in [DesiredStatus::Running, DesiredStatus::Stopped] {
            let mut pages = client
                .list_tasks()
                .cluster(&self.ecs.cluster)
                .desired_status(status)
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                let page =
                    page.map_err(|e| PortError::transient("ecs", "list_tasks", e.to_string()))?;
                arns.extend(
                    page.task_arns()
                        .iter()
                        .filter(|a| a.contains(&ours) && !arns.contains(*a))
                        .cloned()
                        .collect::<Vec<_>>(),
                );
            }
        }
        let ids: Vec<InstanceId> = arns.into_iter().map(InstanceId::new).collect();
        EcsCompute::new(client, self.ecs.clone())
            .describe_many(&ids)
            .await
    }
}

/// The controller settings of the harnesses: short policy times, like the embedded
/// harness.
pub fn harness_config(deployment: DeploymentId, opts: &AwsOptions) -> ControllerConfig {
    let mut controller = ControllerConfig::new(deployment);
    controller.policy = Policy {
        connect_deadline_secs: opts.connect_deadline_secs,
        shutdown_grace_secs: opts.common.grace_secs,
        recheck_secs: 1,
        uncertain_retry_secs: 1,
        remote_url_allowlist: vec![crate::SIM_REMOTE_URL_HOST].into(),
        close_workspace: opts.common.close_workspace,
        ..Policy::default()
    };
    (opts.common.ceilings)(&mut controller.policy);
    controller.stop_readback_interval = Duration::from_millis(50);
    controller.lock_busy_retry_secs = 1;
    controller.visibility_secs = 30;
    controller.pool.size = opts.common.pool_size;
    controller
}

/// The simulator and the controller on the AWS adapters over moto, wired together, with
/// the executor bridge standing in for the executors moto does not run.
pub struct AwsHarness {
    /// The simulator.
    pub sim: SimHandle,
    /// A client of the simulator (API and executor keys).
    pub client: SimClient,
    /// The AWS resources.
    pub resources: AwsResources,
    controller: Arc<AwsController>,
    webhook_url: String,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl AwsHarness {
    /// Creates the AWS resources on moto, starts the simulator, the webhook intake, the
    /// worker loops, the optional sweeper and the executor bridge.
    ///
    /// # Errors
    /// A bootstrap, simulator or listener failure. Panics without `MOTO_ENDPOINT`.
    pub async fn start(opts: AwsOptions) -> anyhow::Result<Self> {
        crate::init_test_logs();
        let mut resources = AwsResources::create().await?;
        if opts.common.pool_size > 0 {
            resources = resources.with_pool().await?;
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let webhook_url = format!("http://127.0.0.1:{port}/webhook");
        let secret = agents_sim::DEFAULT_WEBHOOK_SECRET.to_owned();
        let mut sim_cfg = SimConfig::default()
            .with_time_scale(opts.common.sim_time_scale)
            .with_turn_secs(opts.common.turn_secs)
            .with_connect_deadline_secs(opts.common.sim_connect_deadline_secs)
            .with_faults(opts.common.duplicates, opts.common.reorder, 0..=20);
        if opts.webhooks {
            sim_cfg = sim_cfg.with_webhook(Url::parse(&webhook_url)?, secret.clone());
        }
        sim_cfg.seed = 42;
        let sim = agents_sim::spawn(sim_cfg).await?;
        let client = sim.client();

        let deployment = DeploymentId::new(format!("{DEPLOYMENT}-{}", unique()))?;
        let config = harness_config(deployment, &opts);
        let mut api = ClientConfig::new(agents_sim::DEFAULT_API_KEY);
        api.base_url = sim.base_url();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let events = resources.events();
        let intake = Arc::new(
            Intake::new(
                WebhookVerifier::new(&secret)?,
                events.clone(),
                clock.clone(),
            )
            .with_provision_on(config.policy.provision_on),
        );
        let controller = Arc::new(
            Controller::new(
                events,
                resources.timers(),
                resources.registry(),
                resources.compute(),
                AgentsClient::new(api)?,
                clock,
                config,
            )
            .with_sweep_queue(resources.sweep()),
        );

        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();
        let mut rx = stopped.clone();
        tasks.push(tokio::spawn(async move {
            let serve = axum::serve(listener, router(intake)).with_graceful_shutdown(async move {
                let _ = rx.wait_for(|s| *s).await;
            });
            let _ = serve.await;
        }));
        for _ in 0..opts.common.workers {
            let c = controller.clone();
            let rx = stopped.clone();
            tasks.push(tokio::spawn(worker_loop(c, opts.receive_batch, rx)));
        }
        if let Some(every) = opts.common.sweep_every {
            let c = controller.clone();
            let rx = stopped.clone();
            tasks.push(tokio::spawn(sweeper_loop(c, every, rx)));
        }
        if opts.common.pool_size > 0 {
            // The worker function's refill schedule, faster.
            tasks.push(tokio::spawn(pool_loop(controller.clone(), stopped.clone())));
        }
        if !opts.common.executors_never_connect {
            tasks.push(tokio::spawn(executor_bridge(
                controller.clone(),
                client.clone(),
                opts.bridge_every,
                stopped,
            )));
        }
        Ok(Self {
            sim,
            client,
            resources,
            controller,
            webhook_url,
            stop,
            tasks,
        })
    }

    /// The webhook URL the simulator delivers to.
    pub fn webhook_url(&self) -> &str {
        &self.webhook_url
    }

    /// Every ECS task one environment ever had in this harness, live and stopped
    /// ([`AwsResources::all_tasks`]).
    ///
    /// # Errors
    /// The provider's error.
    pub async fn tasks_of(&self, env: &str) -> anyhow::Result<Vec<ComputeInstance>> {
        Ok(self
            .resources
            .all_tasks()
            .await?
            .into_iter()
            .filter(|i| i.environment_id.as_str() == env)
            .collect())
    }
}

impl LifecycleHarness for AwsHarness {
    type Queue = SqsQueue;
    type Registry = DynamoRegistry;
    type Compute = EcsCompute;

    const STEP_TIMEOUT: Duration = Duration::from_secs(45);
    const SETTLE: Duration = Duration::from_secs(3);

    async fn start(opts: Options) -> anyhow::Result<Self> {
        AwsHarness::start(AwsOptions {
            common: opts,
            ..AwsOptions::default()
        })
        .await
    }

    async fn sandboxctl(&self, args: &[&str]) -> crate::operator_cli::CtlOutput {
        let secret = aws_sdk_secretsmanager::Client::new(&self.resources.sdk)
            .create_secret()
            .name(format!("ctl-{}", unique()))
            .secret_string(agents_sim::DEFAULT_API_KEY)
            .send()
            .await
            .expect("moto creates the secret");
        let r = &self.resources;
        let env: Vec<(&str, String)> = vec![
            ("AWS_ENDPOINT_URL", moto_endpoint()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("EVENTS_QUEUE_URL", r.queues.events_url.clone()),
            ("TIMERS_QUEUE_URL", r.queues.timers_url.clone()),
            ("SWEEP_QUEUE_URL", r.queues.sweep_url.clone()),
            ("TABLE_NAME", r.table.clone()),
            ("ECS_CLUSTER", r.ecs.cluster.clone()),
            ("TASK_DEFINITION", r.ecs.task_definition.clone()),
            ("CONTAINER_NAME", r.ecs.container_name.clone()),
            ("SUBNETS", r.ecs.subnets.join(",")),
            ("SECURITY_GROUPS", r.ecs.security_groups.join(",")),
            (
                "DEPLOYMENT_ID",
                self.controller.config.deployment.as_str().to_owned(),
            ),
            (
                "OPENAI_API_KEY_SECRET_ARN",
                secret.arn().unwrap_or_default().to_owned(),
            ),
            ("AGENTS_API_BASE_URL", self.sim.base_url()),
        ];
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--backend", "aws"]);
        crate::operator_cli::sandboxctl(&all, &env).await
    }

    fn sim(&self) -> &SimHandle {
        &self.sim
    }

    fn client(&self) -> &SimClient {
        &self.client
    }

    fn controller(&self) -> &AwsController {
        &self.controller
    }

    async fn audit(&self, env: &str) -> anyhow::Result<Vec<sandbox_controller::ports::AuditEntry>> {
        Ok(self
            .controller
            .registry
            .audit_entries(&EnvironmentId::new(env).effect_key())
            .await?)
    }

    /// StopTask outside the controller, with the reason ECS gives an exited container.
    async fn stop_behind_the_controllers_back(&self, id: &InstanceId) -> anyhow::Result<()> {
        aws_sdk_ecs::Client::new(&self.resources.sdk)
            .stop_task()
            .cluster(&self.resources.ecs.cluster)
            .task(id.as_str())
            .reason("essential container exited")
            .send()
            .await?;
        Ok(())
    }

    /// Every container override of the task, as DescribeTasks reports it (moto echoes
    /// RunTask's `overrides`).
    async fn executor_vars(
        &self,
        instance: &ComputeInstance,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let described = aws_sdk_ecs::Client::new(&self.resources.sdk)
            .describe_tasks()
            .cluster(&self.resources.ecs.cluster)
            .tasks(instance.instance_id.as_str())
            .send()
            .await?;
        let task = described
            .tasks()
            .first()
            .with_context(|| format!("DescribeTasks does not know {}", instance.instance_id))?;
        let overrides = task
            .overrides()
            .context("the task has no overrides")?
            .container_overrides();
        let [container] = overrides else {
            bail!("expected one container override, found {overrides:?}");
        };
        Ok(container
            .environment()
            .iter()
            .map(|kv| {
                (
                    kv.name().unwrap_or_default().to_owned(),
                    kv.value().unwrap_or_default().to_owned(),
                )
            })
            .collect())
    }

    /// `None`: moto runs no containers, so there is no process to count.
    fn executor_processes(_env: &str) -> Option<usize> {
        None
    }

    /// Stops the loops, the intake and the bridge (jobs in progress finish), stops every
    /// live task of this deployment on moto and shuts the simulator down. Returns how many
    /// tasks were stopped.
    async fn shutdown(self) -> anyhow::Result<usize> {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        let c = &self.controller;
        let mut stopped = 0;
        for i in c.compute.list(&c.config.deployment).await? {
            if i.status.is_live() {
                c.compute
                    .stop(&i.instance_id, "harness shutdown", NO_DEADLINE)
                    .await?;
                stopped += 1;
            }
        }
        // Idle warm pool members (no environment: `list` leaves them out).
        for m in c.compute.list_pool(&c.config.deployment).await? {
            c.compute
                .stop(&m.instance_id, "harness shutdown", NO_DEADLINE)
                .await?;
            stopped += 1;
        }
        self.sim.shutdown().await;
        let rejected = self.resources.ecs_guard.rejected();
        anyhow::ensure!(
            rejected.is_empty(),
            "the controller tried ECS requests the API reference forbids: {rejected:?}"
        );
        let rejected = self.resources.ecs_guard.rejected();
        anyhow::ensure!(
            rejected.is_empty(),
            "the controller tried ECS requests the API reference forbids: {rejected:?}"
        );
        Ok(stopped)
    }
}

async fn worker_loop(c: Arc<AwsController>, batch: usize, stop: watch::Receiver<bool>) {
    // A job in progress always finishes; the stop flag is checked between batches.
    while !*stop.borrow() {
        // 200 ms rounds up to a 1 s SQS long poll.
        let events = c.consume_once(&c.events, batch, 200).await;
        let timers = c.consume_once(&c.timers, batch, 0).await;
        // `sandboxctl sweep`'s jobs (the sweeper's fan-out) arrive on the sweep queue.
        let sweep = c.consume_once(c.sweep_queue(), batch, 0).await;
        match (events, timers, sweep) {
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                tracing::warn!(error = %e, "receive failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            (Ok(0), Ok(0), Ok(0)) => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => {}
        }
    }
}

/// Refills the warm pool ([`Controller::refill_pool`], under its lease) every 500 ms until
/// the stop: the worker function's `{"pool_refill": {}}` schedule, faster.
async fn pool_loop(c: Arc<AwsController>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = tick.tick() => {}
        }
        if let Err(e) = c.refill_pool().await {
            tracing::warn!(error = %e, "pool not refilled this tick");
        }
    }
}

async fn sweeper_loop(c: Arc<AwsController>, every: Duration, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = tick.tick() => {}
        }
        if let Err(e) = c.sweep().await {
            tracing::warn!(error = %e, "sweep skipped");
        }
    }
}

/// One task the bridge connected: its environment and the simulator's connection id.
struct Bridged {
    env: String,
    connection: Option<String>,
}

/// The executor bridge (see the module docs): moto runs no containers, so this loop
/// connects a RUNNING task's environment to the simulator once, and disconnects it when
/// the task is STOPPED or gone.
async fn executor_bridge(
    c: Arc<AwsController>,
    sim: SimClient,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut bridged: HashMap<String, Bridged> = HashMap::new();
    while !*stop.borrow() {
        match c.compute.list(&c.config.deployment).await {
            Ok(instances) => {
                let mut seen = std::collections::HashSet::new();
                for i in &instances {
                    let arn = i.instance_id.as_str().to_owned();
                    seen.insert(arn.clone());
                    let env = i.environment_id.as_str().to_owned();
                    if i.status == ComputeStatus::Running && !bridged.contains_key(&arn) {
                        // A refusal (e.g. 404 for a deleted session) is final, like the
                        // executor exiting: the task is not retried.
                        let connection = match sim.connect(&env).await {
                            Ok(id) => Some(id),
                            Err(e) => {
                                tracing::info!(task = %arn, %env, error = %e, "bridge: connect refused");
                                None
                            }
                        };
                        bridged.insert(arn, Bridged { env, connection });
                    } else if i.status == ComputeStatus::Stopped {
                        disconnect(&sim, &mut bridged, &arn).await;
                    }
                }
                let gone: Vec<String> = bridged
                    .keys()
                    .filter(|a| !seen.contains(*a))
                    .cloned()
                    .collect();
                for arn in gone {
                    disconnect(&sim, &mut bridged, &arn).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "bridge: list failed"),
        }
        tokio::select! {
            changed = stop.changed() => if changed.is_err() { break },
            _ = tokio::time::sleep(every) => {}
        }
    }
}

async fn disconnect(sim: &SimClient, bridged: &mut HashMap<String, Bridged>, arn: &str) {
    if let Some(b) = bridged.get_mut(arn)
        && let Some(connection) = b.connection.take()
        && let Err(e) = sim.disconnect(&b.env, Some(&connection)).await
    {
        tracing::info!(task = %arn, env = %b.env, error = %e, "bridge: disconnect failed");
    }
}
