//! `sandboxctl demo` (what `make run` calls): the whole pipeline on one machine.
//!
//! Starts the Agents API simulator, the embedded stack (webhook endpoint, worker loops,
//! sweeper timer, SQLite queues and registry, child-process executors running the
//! simulator's `sim-executor` stand-in in the credential-free split (docs/SECURITY.md): a
//! listening executor child with no key and a forwarder child that alone holds it; the
//! simulator runs each turn's command in the executor), drives a scripted scenario of real-shaped,
//! signed deliveries (duplicated and reordered by the simulator), prints the timeline
//! (delivery → decision → effect → receipt) and a summary, and exits 0 with no executor
//! process left behind. A real `codex exec-server` cannot register with the simulator;
//! `sandboxctl serve` runs the same stack against the real API.

use agents_sim::{SessionEnvironment, SimClient, SimConfig, SimHandle, Url};
use anyhow::{Context as _, bail};
use sandbox_agents_api::ClientConfig;
use sandbox_controller::ControllerConfig;
use sandbox_controller::ports::{Compute as _, NO_DEADLINE, Receipt, ReceiptKind};
use sandbox_core::decision::{Effect, StartSpec};
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation, SessionId, idempotency_token};
use sandbox_core::observed::Policy;
use sandbox_core::session::SessionStatus;
use sandbox_local::embedded::{EmbeddedConfig, EmbeddedStack, LocalController};
use sandbox_local::process_compute::{ExecutorCommand, KeySource};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The command of every demo turn, run in the listening stand-in executor: it names the
/// process it ran under (its parent, the executor).
const DEMO_TURN_COMMAND: &str =
    "sleep 1; echo \"ran under: $(tr '\\0' ' ' < /proc/$PPID/cmdline)\"";

/// The simulator's `remote_url` scheme and host, allowed in the demo.
const LOOPBACK_REMOTE_URL: &str = "http://127.0.0.1";

/// Arguments of `sandboxctl demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// The executor stand-in; default: `sim-executor` next to this binary.
    #[arg(long)]
    executor: Option<PathBuf>,
    /// Where the SQLite database and workspaces go; default: a fresh temporary directory.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Extra copies of every webhook delivery (same webhook-id).
    #[arg(long, default_value_t = 2)]
    duplicates: u32,
    /// Simulator seed (delivery reordering and delays).
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

const DEPLOYMENT: &str = "demo";
/// Real seconds: short so the demo finishes in well under two minutes.
const GRACE_SECS: u64 = 3;
const SWEEP_EVERY: Duration = Duration::from_secs(2);

struct Demo {
    started: Instant,
    sim: SimHandle,
    client: SimClient,
    stack: EmbeddedStack,
}

/// Runs the demo. Exit code 0 when every check held.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let executor = match args.executor {
        Some(p) => p,
        None => std::env::current_exe()?
            .parent()
            .context("no directory for the current executable")?
            .join("sim-executor"),
    };
    if !executor.is_file() {
        bail!(
            "executor stand-in not found at {} (build it: cargo build -p agents-sim --bin sim-executor)",
            executor.display()
        );
    }
    let tmp = tempfile::tempdir()?;
    let data_dir = args.data_dir.unwrap_or_else(|| tmp.path().to_path_buf());
    println!("{}", executor_line(&executor));
    let demo = Demo::start(&data_dir, executor, args.duplicates, args.seed).await?;
    println!(
        "sandbox-lifecycle demo: simulator {} · webhook {} · data {}",
        demo.sim.base_url(),
        demo.stack.webhook_url(),
        data_dir.display()
    );
    let outcome = demo.scenario().await;
    // Stop the loops first (jobs in flight finish and write their audit entries), then
    // read the registry for the timeline.
    let (controller, left) = demo.finish().await?;
    outcome?;
    print!("{}", report(&controller).await?);
    if left > 0 {
        bail!("{left} executor process(es) were still running at the end and had to be stopped");
    }
    println!("no executor process left behind");
    Ok(())
}

/// The one line that says which executor the demo runs: the program's `--version` (the
/// real codex answers `codex-cli 0.171.0`), or, for the stand-in (which has no
/// `--version`), its name and how to run the real one.
fn executor_line(executor: &std::path::Path) -> String {
    let version = std::process::Command::new(executor)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim().to_owned())
        })
        .filter(|l| !l.is_empty());
    match version {
        Some(v) => format!(
            "executor: {v} ({}), listener and forwarder",
            executor.display()
        ),
        None => format!(
            "executor: the {} stand-in, listener and forwarder (`make run EXECUTOR=codex` runs the pinned codex)",
            executor.file_name().map_or_else(
                || executor.display().to_string(),
                |n| n.to_string_lossy().into_owned()
            )
        ),
    }
}

impl Demo {
    async fn start(
        data_dir: &std::path::Path,
        executor: PathBuf,
        duplicates: u32,
        seed: u64,
    ) -> anyhow::Result<Self> {
        let secret = agents_sim::DEFAULT_WEBHOOK_SECRET.to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let webhook = format!("http://{}/webhook", listener.local_addr()?);
        let mut sim_cfg = SimConfig::default()
            .with_webhook(Url::parse(&webhook)?, secret.clone())
            .with_time_scale(60.0)
            .with_turn_secs(60.0)
            // Split mode: the simulator runs each turn's command in the executor for real;
            // about as long as the simulated minute (one real second) it replaces.
            .with_turn_command(DEMO_TURN_COMMAND)
            .with_faults(duplicates, true, 0..=40);
        sim_cfg.seed = seed;
        let sim = agents_sim::spawn(sim_cfg).await?;
        let key_file = data_dir.join("executor.key");
        sandbox_local::private::create_private_dir(data_dir)?;
        // 0600 before the key is written.
        let _ = std::fs::remove_file(&key_file);
        sandbox_local::private::create_private_file(&key_file)?;
        std::fs::write(&key_file, agents_sim::DEFAULT_EXECUTOR_KEY)?;

        let mut controller = ControllerConfig::new(DeploymentId::new(DEPLOYMENT)?);
        controller.policy = Policy {
            connect_deadline_secs: 20,
            shutdown_grace_secs: GRACE_SECS,
            recheck_secs: 1,
            uncertain_retry_secs: 2,
            // The simulator's remote_url is http://127.0.0.1:PORT/...: local mode applies
            // the same allowlist check, with the loopback host allowed over plain http.
            remote_url_allowlist: vec![LOOPBACK_REMOTE_URL].into(),
            ..Policy::default()
        };
        controller.stop_readback_interval = Duration::from_millis(100);
        // Two warm listening executors; a session's start claims one.
        controller.pool.size = 2;
        let mut api = ClientConfig::new(agents_sim::DEFAULT_API_KEY);
        api.base_url = sim.base_url();
        let mut cfg = EmbeddedConfig::new(
            data_dir,
            api,
            secret,
            ExecutorCommand::listen(executor.display().to_string()),
            KeySource::File(key_file),
            controller,
        );
        // The credential-free split: the listening executor holds no key; the
        // forwarder child alone does (no single-mode fallback warning).
        cfg.forwarder = Some(ExecutorCommand::forward(executor.display().to_string()));
        cfg.supervisor = Some(crate::supervisor_command()?);
        // The executor's socket admits only its forwarder (as `serve` runs it).
        cfg.relay = true;
        cfg.sweep_interval = SWEEP_EVERY;
        cfg.stop_grace = Duration::from_secs(5);
        let stack = EmbeddedStack::start_on(cfg, listener).await?;
        Ok(Self {
            started: Instant::now(),
            client: sim.client(),
            sim,
            stack,
        })
    }

    fn say(&self, what: impl AsRef<str>) {
        println!(
            "[{:>6.1}s] scenario: {}",
            self.started.elapsed().as_secs_f64(),
            what.as_ref()
        );
    }

    async fn wait_status(&self, session: &str, status: SessionStatus) -> anyhow::Result<()> {
        self.client
            .wait_for_status(session, status, Duration::from_secs(30))
            .await
            .with_context(|| format!("session {session} never reached {status:?}"))?;
        Ok(())
    }

    async fn connected(&self, env: &str) -> anyhow::Result<bool> {
        Ok(self
            .client
            .state()
            .await?
            .environment(env)
            .is_some_and(|e| e.connected))
    }

    async fn wait_until<F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: F,
    ) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<bool>>,
    {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if check().await? {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("timed out waiting for {what}")
    }

    async fn live_executors(&self, env: &str) -> anyhow::Result<usize> {
        let c = self.stack.controller();
        Ok(c.compute
            .list(&c.config.deployment)
            .await?
            .into_iter()
            .filter(|i| i.environment_id.as_str() == env && i.status.is_live())
            .count())
    }

    /// The first line of the output of the session's first `command_execution` item.
    async fn first_command_output(&self, session: &str) -> anyhow::Result<String> {
        let turns = self.client.list_turns(session).await?;
        let turn = turns.data.first().context("no turn")?;
        let items = self
            .client
            .get_json(&format!(
                "/agents/sessions/{session}/turns/{}/items?order=asc&limit=100",
                turn.id.as_str()
            ))
            .await?;
        let output = items["data"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|i| i["type"] == "command_execution")
            .and_then(|i| i["output"].as_str())
            .context("the turn ran no command")?;
        Ok(output.lines().next().unwrap_or_default().trim().to_owned())
    }

    async fn scenario(&self) -> anyhow::Result<()> {
        // alpha: connection request (delivered 1 + duplicates times, reordered) → one
        // executor; idle → lease; new input before the lease is due → cancel-stop; idle →
        // the lease expires → stop.
        let alpha = self
            .client
            .create_session(SessionEnvironment::self_hosted())
            .await?;
        let alpha_env = env_of(&alpha)?;
        self.say(format!(
            "alpha {}: input with no executor connected",
            alpha.id
        ));
        self.client
            .submit_message(alpha.id.as_str(), "list the repo")
            .await?;
        self.wait_until(
            "alpha's executor to connect",
            Duration::from_secs(30),
            || self.connected(&alpha_env),
        )
        .await?;
        self.wait_status(alpha.id.as_str(), SessionStatus::Idle)
            .await?;
        self.say("alpha idle: shutdown lease pending; new input arrives within the grace");
        tokio::time::sleep(Duration::from_millis(800)).await;
        self.client
            .submit_message(alpha.id.as_str(), "and run the tests")
            .await?;
        self.wait_status(alpha.id.as_str(), SessionStatus::Idle)
            .await?;
        self.say(format!(
            "alpha's turn command, run in the executor: {}",
            self.first_command_output(alpha.id.as_str()).await?
        ));

        // bravo: runs, then the session fails → release.
        let bravo = self
            .client
            .create_session(SessionEnvironment::self_hosted())
            .await?;
        let bravo_env = env_of(&bravo)?;
        self.say(format!("bravo {}: input, then the session fails", bravo.id));
        self.client
            .submit_message(bravo.id.as_str(), "build it")
            .await?;
        self.wait_until(
            "bravo's executor to connect",
            Duration::from_secs(30),
            || self.connected(&bravo_env),
        )
        .await?;
        self.client
            .fail_session(bravo.id.as_str(), Some("model error"))
            .await?;

        // charlie: deleted mid-turn (no webhook is ever sent for a deletion) → the sweeper
        // finds live compute for a deleted session and releases it.
        let charlie = self
            .client
            .create_session(SessionEnvironment::self_hosted())
            .await?;
        let charlie_env = env_of(&charlie)?;
        self.say(format!(
            "charlie {}: input, then deleted mid-turn (no webhook)",
            charlie.id
        ));
        self.client
            .submit_message(charlie.id.as_str(), "refactor")
            .await?;
        self.wait_until(
            "charlie's executor to connect",
            Duration::from_secs(30),
            || self.connected(&charlie_env),
        )
        .await?;
        self.client
            .delete_session(charlie.id.as_str(), None)
            .await?;

        // delta: an operator closes the session: delete it and stop its executor, two
        // receipts.
        let delta = self
            .client
            .create_session(SessionEnvironment::self_hosted())
            .await?;
        let delta_env = env_of(&delta)?;
        self.say(format!(
            "delta {}: input, then an operator closes the session",
            delta.id
        ));
        self.client
            .submit_message(delta.id.as_str(), "summarise")
            .await?;
        self.wait_until(
            "delta's executor to connect",
            Duration::from_secs(30),
            || self.connected(&delta_env),
        )
        .await?;
        let close = self
            .stack
            .controller()
            .close(
                &SessionId::new(delta.id.as_str()),
                20,
                Duration::from_millis(500),
            )
            .await?;
        if !close.closed {
            bail!("close of delta did not finish: {:?}", close.pending);
        }
        self.say(format!(
            "delta closed with {} receipt(s)",
            close.receipts.len()
        ));

        // echo: an executor tagged by this deployment that no record names, for an idle
        // session, started behind the controller's back (no lock was left unclean, so no
        // worker looks for it) → the sweep releases it as an orphan (lifecycle-cases.md
        // row 26).
        let echo = self
            .client
            .create_session(SessionEnvironment::self_hosted())
            .await?;
        let echo_env = EnvironmentId::new(env_of(&echo)?);
        let remote_url = echo
            .self_hosted()
            .map(|e| e.remote_url.clone())
            .context("echo is not self-hosted")?;
        let c = self.stack.controller();
        c.compute
            .start(
                &StartSpec {
                    environment_id: echo_env.clone(),
                    session_id: echo.id.clone(),
                    remote_url,
                    workspace_directory: "/workspace".into(),
                    generation: Generation(1),
                    idempotency_token: idempotency_token(&echo_env, Generation(1)),
                    previous: None,
                    restore: None,
                },
                &c.config.deployment,
                NO_DEADLINE,
            )
            .await?;
        self.say(format!(
            "echo {}: executor started behind the controller's back (no record names it)",
            echo.id
        ));

        // Everything converges: each environment ends with no live executor.
        let envs = [
            &alpha_env,
            &bravo_env,
            &charlie_env,
            &delta_env,
            echo_env.as_str(),
        ];
        self.wait_until(
            "every executor to be stopped",
            Duration::from_secs(60),
            || async {
                for env in envs {
                    if self.live_executors(env).await? > 0 {
                        return Ok(false);
                    }
                }
                Ok(true)
            },
        )
        .await?;
        self.say("every environment converged: no executor left running");
        Ok(())
    }

    /// Stops the stack (and every executor still running) and the simulator; prints the
    /// simulator's delivery counts. Returns the controller (for the report) and how many
    /// executors had to be stopped at shutdown.
    async fn finish(self) -> anyhow::Result<(Arc<LocalController>, usize)> {
        let stats = self.sim.delivery_stats();
        println!(
            "\nwebhooks: {} events, {} copies sent (duplicates included), {} acknowledged",
            stats.emitted, stats.copies, stats.acknowledged
        );
        let controller = self.stack.controller().clone();
        let left = self.stack.shutdown(true).await?;
        self.sim.shutdown().await;
        Ok((controller, left))
    }
}

/// The timeline and summary, from the registry's audit log and receipts.
async fn report(c: &LocalController) -> anyhow::Result<String> {
    let audit = c.registry.audit_log().await?;
    let receipts = c.registry.receipt_log().await?;
    let t0 = audit.first().map_or(0, |e| e.at);
    // Audit entries and receipts, merged by time (stable: a decision before the
    // receipts its effects produced in the same second).
    let mut lines: Vec<(u64, u8, String)> = vec![];
    for e in audit
        .iter()
        .filter(|e| !(e.outcome == "ignore" && e.applied.is_empty()))
    {
        let effects: Vec<String> = e.applied.iter().map(describe_effect).collect();
        lines.push((
            e.at,
            0,
            format!(
                "{:<26} {:<21} → {:<13} {}{}",
                e.session_id.as_str(),
                e.trigger["kind"].as_str().unwrap_or("?"),
                e.outcome,
                e.reason,
                if effects.is_empty() {
                    String::new()
                } else {
                    format!("  [{}]", effects.join(", "))
                }
            ),
        ));
    }
    for r in &receipts {
        lines.push((
            r.at,
            1,
            format!("{:<26} receipt: {}", "", describe_receipt(r)),
        ));
    }
    lines.sort_by_key(|(at, kind, _)| (*at, *kind));
    let mut out = String::from("\ntimeline (delivery → decision → effect → receipt)\n");
    for (at, _, line) in &lines {
        out.push_str(&format!("  +{:>3}s {line}\n", at.saturating_sub(t0)));
    }

    let effects: Vec<Effect> = audit
        .iter()
        .flat_map(|e| e.applied.iter())
        .filter_map(|v| serde_json::from_value(v.clone()).ok())
        .collect();
    let starts = effects
        .iter()
        .filter(|e| matches!(e, Effect::StartCompute(_)))
        .count();
    let stop_reasons: Vec<&str> = receipts
        .iter()
        .filter_map(|r| match &r.kind {
            ReceiptKind::ComputeStopped { reason, .. } => Some(reason.as_str()),
            ReceiptKind::SessionDeleted { .. } | ReceiptKind::WorkspaceClosed { .. } => None,
        })
        .collect();
    let orphans = stop_reasons.iter().filter(|r| **r == "orphan").count();
    let adopted = effects
        .iter()
        .filter(|e| matches!(e, Effect::AdoptCompute(_)))
        .count();
    let mut by_outcome: BTreeMap<&str, usize> = BTreeMap::new();
    for e in &audit {
        *by_outcome.entry(e.outcome.as_str()).or_default() += 1;
    }
    let webhooks = audit
        .iter()
        .filter(|e| e.trigger["kind"] != "sweep")
        .count();
    out.push_str(&format!(
            "\nsummary\n  sessions                 {}\n  decisions                {} ({} from webhooks, the rest from timers and sweeps)\n  outcomes                 {}\n  executors started        {starts}\n  stops read back          {}\n  unrecorded executors     {adopted} adopted, {orphans} released as orphans\n",
            audit
                .iter()
                .map(|e| e.session_id.as_str())
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            audit.len(),
            webhooks,
            by_outcome
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", "),
            stop_reasons.len(),
        ));
    Ok(out)
}

fn env_of(s: &sandbox_core::session::Session) -> anyhow::Result<String> {
    Ok(s.self_hosted()
        .context("session is not self-hosted")?
        .id
        .as_str()
        .to_owned())
}

fn describe_effect(v: &serde_json::Value) -> String {
    match serde_json::from_value::<Effect>(v.clone()) {
        Ok(Effect::StartCompute(s)) => format!("start g{}", s.generation),
        Ok(Effect::StopCompute(s)) => format!("stop g{} ({:?})", s.target.generation, s.reason),
        Ok(Effect::AdoptCompute(i)) => format!("adopt g{}", i.generation),
        Ok(Effect::PutLease(l)) => format!(
            "lease g{} due +{}s",
            l.target.generation,
            l.due_at - l.requested_at
        ),
        Ok(Effect::DropLease) => "drop lease".into(),
        Ok(Effect::MarkStopped) => "record stopped".into(),
        Ok(Effect::MarkClosed) => "record closed".into(),
        Ok(Effect::RequireCleanup) => "cleanup required".into(),
        Ok(Effect::DeleteSession { .. }) => "delete session".into(),
        Ok(Effect::RecordStartFailure(f)) => format!("failed start #{}", f.attempts),
        Ok(Effect::ClearStartFailure) => "failed starts reset".into(),
        Ok(Effect::NoteConnectionRequest { .. }) => "connection requested".into(),
        Ok(Effect::ClearConnectionRequest) => "connection no longer requested".into(),
        Ok(Effect::ResolveReconciliation(r)) => {
            format!("reconciliation resolved ({})", r.effect.as_str())
        }
        Ok(Effect::PutNoWorkLease(l)) => format!(
            "no-work lease g{} due +{}s",
            l.target.generation,
            l.due_at - l.requested_at
        ),
        Ok(Effect::DropNoWorkLease) => "drop no-work lease".into(),
        Ok(Effect::RecordReplacements { recent }) => {
            format!("{} replacement(s) in the window", recent.len())
        }
        Err(_) => v.to_string(),
    }
}

fn describe_receipt(r: &Receipt) -> String {
    match &r.kind {
        ReceiptKind::ComputeStopped {
            instance_id,
            generation,
            reason,
            workspace,
        } => {
            format!(
                "compute stopped: {instance_id} g{generation} ({reason}); workspace: {workspace}"
            )
        }
        ReceiptKind::SessionDeleted { session_id } => format!("session deleted: {session_id}"),
        ReceiptKind::WorkspaceClosed { workspace, .. } => {
            format!("session closed; workspace: {workspace}")
        }
    }
}
