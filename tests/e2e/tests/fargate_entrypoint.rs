//! The Fargate executor task's two containers, as their task definition starts them: the
//! image's entrypoint (`infra/executor/entrypoint.sh`) in role `executor` (the key-free
//! listener) and role `forwarder` (the key holder), each running the real pinned codex
//! 0.171.0 (infra/executor, `npm ci`) first on `PATH`, against the Agents API simulator,
//! which speaks the real registration, rendezvous and Noise relay
//! (../shared/reference/executor-protocol.md). A turn's command must run in the listener,
//! relayed by the forwarder; nothing here is a stand-in.
//!
//! Two ways to the forwarder's inputs (docs/ARCHITECTURE.md, docs/WARM_POOL.md):
//! - cold: `REMOTE_URL` and `ENVIRONMENT_ID` from the RunTask container overrides;
//! - warm: a pool member without them, which waits for its assignment with
//!   `await-assignment.mjs` (its own pool item in DynamoDB, read with the task role's
//!   session named after the task id, on moto) and then registers with it.
//!
//! The simulator is http on 127.0.0.1, so the entrypoint and the waiter run with
//! `SANDBOX_TEST_ONLY_LOOPBACK_HTTP=1` (no template sets it).

use agents_sim::{SessionEnvironment, SimConfig, SimHandle, spawn};
use anyhow::{Context, bail};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::session::SessionStatus;
use sandbox_e2e::aws_stack::{moto_endpoint, unique};
use sandbox_e2e::{free_port, pinned_codex_on_path};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

const EXECUTOR_KEY: &str = "sk-test-fargate-entrypoint-executor-key";
/// The real codex starting on a loaded 2-core machine, plus the waiter's poll.
const PATIENCE: Duration = Duration::from_secs(60);

/// One container: the entrypoint (`/bin/sh`, PID 1 in ECS) in a process group of its own,
/// ended as a group on drop (codex's node shim and native binary included).
struct Container {
    child: Child,
    pgid: i32,
    /// The container's stderr (its log stream).
    log: PathBuf,
}

impl Container {
    /// `entrypoint.sh ROLE [URL]` with an empty environment but `PATH` (the pinned codex
    /// first), `HOME` and `env`.
    fn start(role: &str, url: &str, env: &[(&str, &str)], bin: &Path, home: &Path) -> Self {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../infra/executor/entrypoint.sh");
        let mut cmd = Command::new("/bin/sh");
        cmd.arg(script)
            .arg(role)
            .arg(url)
            .env_clear()
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env("HOME", home)
            .env("CODEX_HOME", home)
            .env("SANDBOX_TEST_ONLY_LOOPBACK_HTTP", "1")
            .envs(env.iter().copied())
            .current_dir(home)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        let log = home.join(format!("{role}-{}.stderr", unique()));
        cmd.stderr(std::fs::File::create(&log).expect("a log file"));
        let child = cmd.spawn().expect("/bin/sh runs the entrypoint");
        let pgid = child.id().expect("running") as i32;
        Self { child, pgid, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM to the entrypoint alone (what ECS sends PID 1); it passes it on to codex and
    /// exits with codex's status. Returns that status and the container's stderr.
    async fn stop(mut self) -> (Option<i32>, String) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pgid.to_string()])
            .status();
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .ok()
            .and_then(Result::ok);
        (status.and_then(|s| s.code()), self.log())
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.pgid)])
            .stderr(Stdio::null())
            .status();
    }
}

async fn simulator(nonce: &str) -> SimHandle {
    spawn(
        SimConfig::default()
            .with_keys("sk-test-api-key-for-sim", EXECUTOR_KEY)
            .with_time_scale(0.0)
            .with_turn_secs(0.0)
            .with_connect_deadline_secs(3600.0)
            .with_turn_command(format!("echo {nonce} ppid=$PPID")),
    )
    .await
    .expect("the simulator starts")
}

async fn wait_connected(sim: &SimHandle, env: &str, want: bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if sim
            .state()
            .environment(env)
            .is_some_and(|e| e.connected == want)
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("environment {env} not connected={want} within {PATIENCE:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Submits input and returns the turn's `command_execution` item once the session is idle.
async fn run_turn(sim: &SimHandle, session: &str) -> anyhow::Result<Value> {
    let c = sim.client();
    c.submit_message(session, "run it").await?;
    c.wait_for_status(session, SessionStatus::Idle, PATIENCE)
        .await?;
    let turns = c.list_turns(session).await?;
    let turn = turns.data.first().context("a turn")?.id.as_str().to_owned();
    let items = c
        .get_json(&format!(
            "/agents/sessions/{session}/turns/{turn}/items?order=asc&limit=100"
        ))
        .await?;
    items["data"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["type"] == "command_execution")
        .cloned()
        .with_context(|| format!("no command item: {items}"))
}

/// The turn's command ran in the executor container's codex (its parent is the listener
/// on `port`), printed the run's nonce, and that process holds no key in its environment.
fn ran_in_the_listener(item: &Value, nonce: &str, port: u16) -> anyhow::Result<()> {
    let output = item["output"].as_str().unwrap_or_default();
    anyhow::ensure!(
        item["exit_code"] == 0 && output.starts_with(nonce),
        "{item}"
    );
    let ppid: u32 = output
        .split("ppid=")
        .nth(1)
        .and_then(|p| p.trim().parse().ok())
        .with_context(|| format!("no ppid in {output:?}"))?;
    let cmdline = std::fs::read(format!("/proc/{ppid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    anyhow::ensure!(
        cmdline.contains(&format!("exec-server --listen ws://127.0.0.1:{port}")),
        "ran under {cmdline:?}, not the executor container's listener"
    );
    let environ = std::fs::read(format!("/proc/{ppid}/environ")).unwrap_or_default();
    anyhow::ensure!(
        !String::from_utf8_lossy(&environ).contains(EXECUTOR_KEY),
        "the listener's environment holds the executor key"
    );
    Ok(())
}

/// A pool member's identity on moto, as ECS gives it: a task id, the task role's
/// credentials for a session named after it, and the item key `<role id>:<task id>`.
struct PoolMember {
    task_id: String,
    key: String,
    env: Vec<(String, String)>,
}

async fn pool_member(table: &str, metadata_uri: &str, task_id: &str) -> anyhow::Result<PoolMember> {
    let endpoint = moto_endpoint();
    let role_arn = task_role(&endpoint).await?;
    let sdk = sandbox_aws::sdk_config::load_sdk_config(Some(&endpoint)).await;
    let sts = aws_sdk_sts::Client::new(&sdk);
    let assumed = sts
        .assume_role()
        .role_arn(role_arn)
        .role_session_name(task_id)
        .send()
        .await?;
    let creds = assumed.credentials().context("credentials")?;
    // The item key is what the waiter derives: the caller identity's UserId under the
    // task role's session (`<role id>:<session name>`).
    let as_member = aws_sdk_sts::Client::from_conf(
        aws_sdk_sts::config::Builder::from(&sdk)
            .credentials_provider(aws_sdk_sts::config::Credentials::new(
                creds.access_key_id(),
                creds.secret_access_key(),
                Some(creds.session_token().to_owned()),
                None,
                "pool-member",
            ))
            .build(),
    );
    let key = as_member
        .get_caller_identity()
        .send()
        .await?
        .user_id()
        .unwrap_or_default()
        .to_owned();
    anyhow::ensure!(key.ends_with(&format!(":{task_id}")), "{key}");
    let env = vec![
        ("AWS_REGION", "us-east-1".to_owned()),
        ("AWS_ENDPOINT_URL", endpoint.clone()),
        ("AWS_CONFIG_FILE", "/nonexistent/config".to_owned()),
        (
            "AWS_SHARED_CREDENTIALS_FILE",
            "/nonexistent/credentials".to_owned(),
        ),
        ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
        ("AWS_ACCESS_KEY_ID", creds.access_key_id().to_owned()),
        (
            "AWS_SECRET_ACCESS_KEY",
            creds.secret_access_key().to_owned(),
        ),
        ("AWS_SESSION_TOKEN", creds.session_token().to_owned()),
        ("ECS_CONTAINER_METADATA_URI_V4", metadata_uri.to_owned()),
        ("POOL_TABLE_NAME", table.to_owned()),
        ("POOL_MAX_WAIT_SECS", "120".to_owned()),
    ];
    Ok(PoolMember {
        task_id: task_id.to_owned(),
        key,
        env: env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
    })
}

/// The executor task role on moto (IAM `CreateRole`, query protocol; ECS assumes it for
/// the task, ../shared/reference/aws-semantics.md): its role id is the first half of every
/// pool item key. Returns its ARN. moto gives an assumed role that does not exist a new
/// role id on every `GetCallerIdentity`, so the role must exist.
async fn task_role(endpoint: &str) -> anyhow::Result<String> {
    let name = format!("sandbox-executor-task-{}", unique());
    let trust = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ecs-tasks.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#;
    let body = format!(
        "Action=CreateRole&Version=2010-05-08&RoleName={name}&AssumeRolePolicyDocument={}",
        percent_encode(trust)
    );
    let answer = reqwest::Client::new()
        .post(format!("{endpoint}/"))
        .header("content-type", "application/x-www-form-urlencoded")
        // moto routes a request by the service of its credential scope.
        .header(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/iam/aws4_request, SignedHeaders=host, Signature=0",
        )
        .body(body)
        .send()
        .await?;
    let status = answer.status();
    let text = answer.text().await?;
    anyhow::ensure!(status.is_success(), "CreateRole: {status} {text}");
    Ok(format!("arn:aws:iam::123456789012:role/{name}"))
}

/// `application/x-www-form-urlencoded` value encoding (RFC 3986 unreserved kept).
fn percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The ECS task metadata endpoint v4 of one task, on 127.0.0.1: `GET /task` answers its
/// `TaskARN`.
async fn metadata_endpoint(task_id: &str) -> anyhow::Result<String> {
    let arn = format!("arn:aws:ecs:us-east-1:123456789012:task/sandbox-cluster/{task_id}");
    let app = axum::Router::new().route(
        "/task",
        axum::routing::get(move || {
            let arn = arn.clone();
            async move { axum::Json(serde_json::json!({ "TaskARN": arn })) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let uri = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(uri)
}

async fn pool_table(ddb: &aws_sdk_dynamodb::Client, table: &str) -> anyhow::Result<()> {
    ddb.create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()?,
        )
        .send()
        .await?;
    Ok(())
}

async fn put_member(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    key: &str,
    state: &str,
    assignment: Option<(&str, &str)>,
) -> anyhow::Result<()> {
    let mut put = ddb
        .put_item()
        .table_name(table)
        .item("pk", AttributeValue::S(key.to_owned()))
        .item("state", AttributeValue::S(state.to_owned()))
        .item("created_at", AttributeValue::N(now_secs().to_string()));
    if let Some((remote_url, environment_id)) = assignment {
        put = put
            .item("remote_url", AttributeValue::S(remote_url.to_owned()))
            .item(
                "environment_id",
                AttributeValue::S(environment_id.to_owned()),
            );
    }
    put.send().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fargate_entrypoint_roles_relay_a_turn_with_the_real_codex() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let home = scratch.path();
    let bin = pinned_codex_on_path(home)?;
    let nonce = format!("fargate-entrypoint-{}", unique());
    let sim = simulator(&nonce).await;
    let client = sim.client();

    // Cold: the forwarder's inputs are the RunTask container overrides.
    let session = client
        .create_session(SessionEnvironment::self_hosted())
        .await?;
    let env = session.self_hosted().context("self-hosted")?.clone();
    let port = free_port();
    let listen = format!("ws://127.0.0.1:{port}");
    let executor = Container::start("executor", &listen, &[], &bin, home);
    let forwarder = Container::start(
        "forwarder",
        &listen,
        &[
            ("REMOTE_URL", env.remote_url.as_str()),
            ("ENVIRONMENT_ID", env.id.as_str()),
            ("CODEX_API_KEY", EXECUTOR_KEY),
        ],
        &bin,
        home,
    );
    wait_connected(&sim, env.id.as_str(), true)
        .await
        .with_context(|| {
            format!(
                "executor: {}\nforwarder: {}",
                executor.log(),
                forwarder.log()
            )
        })?;
    assert_eq!(
        client.get_environment(env.id.as_str()).await?.status,
        EnvironmentStatus::Connected
    );
    let item = run_turn(&sim, session.id.as_str()).await?;
    ran_in_the_listener(&item, &nonce, port)?;
    let e = sim
        .state()
        .environment(env.id.as_str())
        .context("env")?
        .clone();
    assert_eq!((e.registrations, e.refused_registrations), (1, 0));
    // ECS stops the task: SIGTERM to each container's PID 1, passed on to codex.
    let (status, err) = forwarder.stop().await;
    assert!(
        status.is_some(),
        "the forwarder's entrypoint ended on SIGTERM: {err}"
    );
    assert!(
        !err.contains(EXECUTOR_KEY),
        "the key is never printed: {err}"
    );
    wait_connected(&sim, env.id.as_str(), false).await?;
    let (status, err) = executor.stop().await;
    assert!(status.is_some(), "the executor's entrypoint ended: {err}");

    // Warm: a pool member waits for its assignment, then registers with it.
    let session = client
        .create_session(SessionEnvironment::self_hosted())
        .await?;
    let env = session.self_hosted().context("self-hosted")?.clone();
    let sdk = sandbox_aws::sdk_config::load_sdk_config(Some(&moto_endpoint())).await;
    let ddb = aws_sdk_dynamodb::Client::new(&sdk);
    let table = format!("pool-{}", unique());
    pool_table(&ddb, &table).await?;
    let task_id = format!("{:032x}", rand_u128());
    let metadata = metadata_endpoint(&task_id).await?;
    let member = pool_member(&table, &metadata, &task_id).await?;
    put_member(&ddb, &table, &member.key, "idle", None).await?;
    let port = free_port();
    let listen = format!("ws://127.0.0.1:{port}");
    let executor = Container::start("executor", &listen, &[], &bin, home);
    let mut inputs: Vec<(&str, &str)> = member
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    inputs.push(("CODEX_API_KEY", EXECUTOR_KEY));
    let forwarder = Container::start("forwarder", &listen, &inputs, &bin, home);
    // Idle: it waits and registers nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = sim
        .state()
        .environment(env.id.as_str())
        .map(|e| e.registrations);
    assert_eq!(before, Some(0), "an idle member registers nothing");
    // The claim: the item becomes `assigned` with the session's remote URL and environment.
    put_member(
        &ddb,
        &table,
        &member.key,
        "assigned",
        Some((env.remote_url.as_str(), env.id.as_str())),
    )
    .await?;
    wait_connected(&sim, env.id.as_str(), true)
        .await
        .with_context(|| {
            format!(
                "executor: {}\nforwarder: {}",
                executor.log(),
                forwarder.log()
            )
        })?;
    let item = run_turn(&sim, session.id.as_str()).await?;
    ran_in_the_listener(&item, &nonce, port)?;
    let (status, err) = forwarder.stop().await;
    assert!(
        status.is_some(),
        "the pool forwarder ended on SIGTERM: {err}"
    );
    assert!(
        err.contains(&format!("task {}", member.task_id))
            && err.contains("assigned to environment"),
        "the waiter read its own item: {err}"
    );
    assert!(
        !err.contains(EXECUTOR_KEY),
        "the key is never printed: {err}"
    );
    wait_connected(&sim, env.id.as_str(), false).await?;
    let _ = executor.stop().await;
    sim.shutdown().await;
    Ok(())
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// 128 random bits for a task id (ECS task ids are 32 hex digits).
fn rand_u128() -> u128 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    nanos ^ (u128::from(std::process::id()) << 64)
}
