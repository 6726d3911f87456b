//! The metadata ownership rule as a setting (two deployments sharing one
//! simulator split its sessions by `metadata`, seed 001 "multi-handler routing"), and
//! opt-in provisioning on `agent.session.created` (seeds 000, 004: application-managed
//! provisioning).
//!
//! Two handlers registered on one project both receive every event (seed 000: "If multiple
//! provider handlers share a project, route events to the handler that owns the session"):
//! the simulator delivers to one URL, so a small fan-out endpoint here forwards each
//! delivery, byte for byte with its signature headers, to both deployments' webhook
//! endpoints, and answers 2xx only when both did (otherwise the simulator retries).

use agents_sim::{SimConfig, SimHandle, Url};
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use sandbox_agents_api::ClientConfig;
use sandbox_controller::ControllerConfig;
use sandbox_controller::ports::{Compute as _, Registry as _};
use sandbox_core::ids::{DeploymentId, EnvironmentId};
use sandbox_core::observed::{Policy, ProvisionOn};
use sandbox_e2e::{SIM_REMOTE_URL_HOST, os_executors, wait_until, workspace_binary};
use sandbox_local::embedded::{EmbeddedConfig, EmbeddedStack};
use sandbox_local::process_compute::{ExecutorCommand, KeySource};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

const STEP: Duration = Duration::from_secs(30);

/// One deployment of the embedded stack against `sim`, listening on `listener`.
async fn deployment(
    sim: &SimHandle,
    dir: &std::path::Path,
    listener: tokio::net::TcpListener,
    id: &str,
    owner_metadata: &[(&str, &str)],
    provision_on: ProvisionOn,
    grace_secs: u64,
) -> anyhow::Result<EmbeddedStack> {
    let key_file = dir.join("executor.key");
    std::fs::write(&key_file, agents_sim::DEFAULT_EXECUTOR_KEY)?;
    let mut controller = ControllerConfig::new(DeploymentId::new(id)?);
    controller.policy = Policy {
        connect_deadline_secs: 30,
        shutdown_grace_secs: grace_secs,
        recheck_secs: 1,
        uncertain_retry_secs: 1,
        remote_url_allowlist: vec![SIM_REMOTE_URL_HOST.to_owned()].into(),
        provision_on,
        ..Policy::default()
    };
    controller.filter.metadata = owner_metadata
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect::<BTreeMap<_, _>>();
    controller.stop_readback_interval = Duration::from_millis(50);
    controller.lock_busy_retry_secs = 1;
    let mut api = ClientConfig::new(agents_sim::DEFAULT_API_KEY);
    api.base_url = sim.base_url();
    let mut config = EmbeddedConfig::new(
        dir,
        api,
        agents_sim::DEFAULT_WEBHOOK_SECRET,
        ExecutorCommand::new(
            workspace_binary("sim-executor")?.display().to_string(),
            ExecutorCommand::codex_exec_server().args,
        ),
        KeySource::File(key_file),
        controller,
    );
    config.workers = 2;
    config.sweep_interval = Duration::from_secs(3600);
    config.stop_grace = Duration::from_secs(5);
    Ok(EmbeddedStack::start_on(config, listener).await?)
}

/// The fan-out endpoint: every delivery goes to each of `targets`; 200 only when all
/// answered 2xx.
async fn fan_out(targets: Vec<String>) -> anyhow::Result<(u16, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let http = reqwest::Client::new();
    let app = axum::Router::new().route(
        "/webhook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let (http, targets) = (http.clone(), targets.clone());
            async move {
                let mut all_ok = true;
                for target in &targets {
                    let mut req = http.post(target).body(body.clone());
                    for name in [
                        "webhook-id",
                        "webhook-timestamp",
                        "webhook-signature",
                        "content-type",
                    ] {
                        if let Some(v) = headers.get(name) {
                            req = req.header(name, v.as_bytes());
                        }
                    }
                    all_ok &= req.send().await.is_ok_and(|r| r.status().is_success());
                }
                if all_ok {
                    StatusCode::OK
                } else {
                    StatusCode::BAD_GATEWAY
                }
            }
        }),
    );
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((port, task))
}

/// The simulator delivering to `webhook_port`.
async fn sim(webhook_port: u16) -> anyhow::Result<SimHandle> {
    let mut cfg = SimConfig::default()
        .with_webhook(
            Url::parse(&format!("http://127.0.0.1:{webhook_port}/webhook"))?,
            agents_sim::DEFAULT_WEBHOOK_SECRET,
        )
        .with_time_scale(60.0)
        .with_turn_secs(30.0);
    cfg.seed = 42;
    Ok(agents_sim::spawn(cfg).await?)
}

/// A self-hosted session with `metadata`; its environment id.
async fn session_with_metadata(
    sim: &SimHandle,
    metadata: serde_json::Value,
) -> anyhow::Result<(String, String)> {
    let v = sim
        .client()
        .create_session_json(&json!({
            "environment": agents_sim::SessionEnvironment::self_hosted().to_json(),
            "metadata": metadata,
        }))
        .await?;
    let session = v["id"].as_str().unwrap().to_owned();
    let env = v["environment"]["id"].as_str().unwrap().to_owned();
    Ok((session, env))
}

/// The environments a deployment's provider runs live compute for.
async fn live_envs(stack: &EmbeddedStack) -> anyhow::Result<Vec<String>> {
    let c = stack.controller();
    Ok(c.compute
        .list(&c.config.deployment)
        .await?
        .into_iter()
        .filter(|i| i.status.is_live())
        .map(|i| i.environment_id.as_str().to_owned())
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_deployments_split_sessions_by_metadata() {
    sandbox_e2e::init_test_logs();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (la, lb) = (
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    );
    let targets = [&la, &lb]
        .map(|l| format!("http://{}/webhook", l.local_addr().unwrap()))
        .to_vec();
    let (port, proxy) = fan_out(targets).await.unwrap();
    let sim = sim(port).await.unwrap();
    let a = deployment(
        &sim,
        dir_a.path(),
        la,
        "e2e-team-a",
        &[("owner", "team-a")],
        ProvisionOn::ConnectionRequest,
        2,
    )
    .await
    .unwrap();
    let b = deployment(
        &sim,
        dir_b.path(),
        lb,
        "e2e-team-b",
        &[("owner", "team-b")],
        ProvisionOn::ConnectionRequest,
        2,
    )
    .await
    .unwrap();

    let (sa, env_a) = session_with_metadata(&sim, json!({"owner": "team-a", "x": "1"}))
        .await
        .unwrap();
    let (sb, env_b) = session_with_metadata(&sim, json!({"owner": "team-b"}))
        .await
        .unwrap();
    // Owned by neither: nobody starts anything for it.
    let (sn, env_n) = session_with_metadata(&sim, json!({"owner": "team-c"}))
        .await
        .unwrap();
    for s in [&sa, &sb, &sn] {
        sim.client().submit_message(s, "go").await.unwrap();
    }

    let client = sim.client();
    let connected = |env: String| {
        let client = client.clone();
        async move {
            Ok(client
                .state()
                .await?
                .environment(&env)
                .is_some_and(|e| e.connected))
        }
    };
    wait_until("team-a's executor connected", STEP, || {
        connected(env_a.clone())
    })
    .await
    .unwrap();
    wait_until("team-b's executor connected", STEP, || {
        connected(env_b.clone())
    })
    .await
    .unwrap();
    // Let both deployments drain every delivery (the losers' jobs included).
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Each provider runs exactly its own session's executor.
    assert_eq!(live_envs(&a).await.unwrap(), std::slice::from_ref(&env_a));
    assert_eq!(live_envs(&b).await.unwrap(), std::slice::from_ref(&env_b));
    assert_eq!(os_executors(Some(&env_a)).len(), 1);
    assert_eq!(os_executors(Some(&env_b)).len(), 1);
    assert!(os_executors(Some(&env_n)).is_empty(), "nobody owns team-c");
    assert!(!connected(env_n.clone()).await.unwrap());
    // Each registry holds only its own session's record.
    for (stack, mine, others) in [
        (&a, &env_a, [&env_b, &env_n]),
        (&b, &env_b, [&env_a, &env_n]),
    ] {
        let registry = &stack.controller().registry;
        let own = registry
            .get(&EnvironmentId::new(mine.as_str()).effect_key())
            .await
            .unwrap();
        assert!(own.is_some_and(|r| r.claims_compute()), "{mine}");
        for other in others {
            let theirs = registry
                .get(&EnvironmentId::new(other.as_str()).effect_key())
                .await
                .unwrap();
            assert!(theirs.is_none(), "{other} recorded by the wrong deployment");
        }
    }

    assert_eq!(a.shutdown(true).await.unwrap(), 1);
    assert_eq!(b.shutdown(true).await.unwrap(), 1);
    sim.shutdown().await;
    proxy.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn provisioning_on_created_connects_before_the_first_input() {
    sandbox_e2e::init_test_logs();
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let sim = sim(port).await.unwrap();
    let stack = deployment(
        &sim,
        dir.path(),
        listener,
        "e2e-created",
        &[],
        // The idle rules are unchanged: after the start the idle session's executor
        // takes the usual lease; a long grace keeps it for the input below.
        ProvisionOn::Created,
        600,
    )
    .await
    .unwrap();
    let client = sim.client();

    // A session without input: no connection is required yet.
    let (session, env) = session_with_metadata(&sim, json!({})).await.unwrap();
    let s = client.get_session(&session).await.unwrap();
    assert!(!s.requires_connection_of(&EnvironmentId::new(env.as_str())));

    // The executor starts on `agent.session.created` and connects before any input.
    wait_until("the executor connected before any input", STEP, || {
        let (client, env) = (client.clone(), env.clone());
        async move {
            Ok(client
                .state()
                .await?
                .environment(&env)
                .is_some_and(|e| e.connected))
        }
    })
    .await
    .unwrap();
    assert!(client.list_turns(&session).await.unwrap().data.is_empty());
    assert_eq!(live_envs(&stack).await.unwrap(), std::slice::from_ref(&env));
    let record = stack
        .controller()
        .registry
        .get(&EnvironmentId::new(env.as_str()).effect_key())
        .await
        .unwrap()
        .expect("recorded on creation");
    let first = record
        .current()
        .cloned()
        .expect("the record names the executor");

    // The first input runs on that executor: no connection wait, no second start.
    client.submit_message(&session, "go").await.unwrap();
    wait_until("the first turn completed", STEP, || {
        let (client, session) = (client.clone(), session.clone());
        async move {
            let turns = client.list_turns(&session).await?.data;
            Ok(turns
                .first()
                .is_some_and(|t| t.status == sandbox_core::turn::TurnStatus::Completed))
        }
    })
    .await
    .unwrap();
    let after = stack
        .controller()
        .registry
        .get(&EnvironmentId::new(env.as_str()).effect_key())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        after.current(),
        Some(&first),
        "the same executor served the input"
    );
    assert_eq!(os_executors(Some(&env)).len(), 1);

    assert_eq!(stack.shutdown(true).await.unwrap(), 1);
    sim.shutdown().await;
}
