//! Shared test support: the moto endpoint, SDK clients, unique names, moto's control API,
//! ECS fixtures and a tiny ECS JSON-protocol stub.

use aws_config::SdkConfig;
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use sandbox_aws::load_sdk_config;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The moto endpoint from `MOTO_ENDPOINT`. Panics (never skips) when it is unset.
pub fn endpoint() -> String {
    match std::env::var("MOTO_ENDPOINT") {
        Ok(v) if !v.is_empty() => v.trim_end_matches('/').to_owned(),
        _ => panic!(
            "MOTO_ENDPOINT is not set: these tests need moto. Run them through the runner, \
             which starts moto_server on 127.0.0.1 and sets MOTO_ENDPOINT and test \
             credentials: `tests/moto/run.sh cargo nextest run -p sandbox-aws` (from the \
             workspace root; install moto first with `.venv/bin/pip install -r \
             tests/moto/requirements.txt`)"
        ),
    }
}

/// The SDK configuration pointed at moto.
pub async fn sdk() -> SdkConfig {
    load_sdk_config(Some(&endpoint())).await
}

/// A short unique token for names: wall-clock nanoseconds, process id, a counter.
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

/// Now, Unix seconds.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Pins moto's ECS tasks in their status (moto otherwise advances a task one status step
/// per DescribeTasks call). Global to the moto server and idempotent.
pub async fn pin_ecs_tasks() {
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/moto-api/state-manager/set-transition",
            endpoint()
        ))
        .json(&serde_json::json!({
            "model_name": "ecs::task",
            "transition": {"progression": "manual", "times": 1_000_000}
        }))
        .send()
        .await
        .expect("moto set-transition request");
    assert!(
        resp.status().is_success(),
        "moto set-transition: {}",
        resp.status()
    );
}

/// One EC2 query-protocol call to moto; the XML answer.
async fn ec2(query: &str) -> String {
    reqwest::Client::new()
        .post(format!("{}/", endpoint()))
        .header(
            "Authorization",
            "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/ec2/aws4_request, \
             SignedHeaders=host, Signature=0",
        )
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("Version=2016-11-15&{query}"))
        .send()
        .await
        .expect("ec2 request")
        .text()
        .await
        .expect("ec2 answer")
}

/// The text of the first `<tag>` element in `xml`.
fn first(xml: &str, tag: &str) -> String {
    let open = format!("<{tag}>");
    let start = xml
        .find(&open)
        .unwrap_or_else(|| panic!("no <{tag}> in EC2 answer: {xml}"))
        + open.len();
    let end = xml[start..].find('<').expect("element end") + start;
    xml[start..end].to_owned()
}

/// A subnet of moto's default VPC and that VPC's default security group. moto's RunTask
/// crashes on a subnet whose VPC lacks DNS hostnames (the default VPC has them) and on an
/// awsvpc configuration without `securityGroups` (AWS would use the VPC's default group).
pub async fn default_network() -> (String, String) {
    let subnets =
        ec2("Action=DescribeSubnets&Filter.1.Name=default-for-az&Filter.1.Value.1=true").await;
    let (subnet, vpc) = (first(&subnets, "subnetId"), first(&subnets, "vpcId"));
    let groups = ec2(&format!(
        "Action=DescribeSecurityGroups&Filter.1.Name=group-name&Filter.1.Value.1=default\
         &Filter.2.Name=vpc-id&Filter.2.Value.1={vpc}"
    ))
    .await;
    (subnet, first(&groups, "groupId"))
}

/// The executor container's name in the test task definitions.
pub const CONTAINER: &str = "executor";

/// Creates cluster `cluster` and registers a FARGATE/awsvpc task definition `family`
/// shaped like production (container-level `memory`, which moto needs; the key from a
/// Secrets Manager `secrets` entry). Returns the task definition ARN.
pub async fn ecs_fixture(ecs: &aws_sdk_ecs::Client, cluster: &str, family: &str) -> String {
    use aws_sdk_ecs::types::{Compatibility, ContainerDefinition, NetworkMode, Secret};
    ecs.create_cluster()
        .cluster_name(cluster)
        .send()
        .await
        .expect("CreateCluster");
    let container = ContainerDefinition::builder()
        .name(CONTAINER)
        .image("public.ecr.aws/docker/library/node:22-slim")
        .essential(true)
        .memory(512)
        .command("codex")
        .command("exec-server")
        .secrets(
            Secret::builder()
                .name("CODEX_API_KEY")
                .value_from(
                    "arn:aws:secretsmanager:us-east-1:123456789012:secret:executor-key-AbCdEf",
                )
                .build()
                .expect("secret"),
        )
        .build();
    let out = ecs
        .register_task_definition()
        .family(family)
        .requires_compatibilities(Compatibility::Fargate)
        .network_mode(NetworkMode::Awsvpc)
        .cpu("256")
        .memory("512")
        .container_definitions(container)
        .send()
        .await
        .expect("RegisterTaskDefinition");
    out.task_definition()
        .and_then(|t| t.task_definition_arn())
        .expect("task definition ARN")
        .to_owned()
}

/// One recorded call to the stub: the operation (from `X-Amz-Target`) and the JSON body.
pub type Calls = Arc<Mutex<Vec<(String, Value)>>>;

/// A stub answering the ECS JSON 1.1 protocol on 127.0.0.1: `answer(operation, body,
/// nth call of that operation)` gives the JSON answer (HTTP 200).
pub struct EcsStub {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Every call received, in order.
    pub calls: Calls,
}

impl EcsStub {
    /// Starts the stub on an ephemeral port.
    pub async fn start(
        answer: impl Fn(&str, &Value, usize) -> Value + Send + Sync + 'static,
    ) -> Self {
        let calls: Calls = Arc::default();
        let answer = Arc::new(answer);
        let recorded = calls.clone();
        let app = axum::Router::new().route(
            "/",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let recorded = recorded.clone();
                let answer = answer.clone();
                async move {
                    let op = headers
                        .get("x-amz-target")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|t| t.rsplit('.').next())
                        .unwrap_or("")
                        .to_owned();
                    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let nth = {
                        let mut calls = recorded.lock().unwrap();
                        let nth = calls.iter().filter(|(o, _)| *o == op).count();
                        calls.push((op.clone(), json.clone()));
                        nth
                    };
                    let reply = answer(&op, &json, nth);
                    (
                        [("content-type", "application/x-amz-json-1.1")],
                        reply.to_string(),
                    )
                        .into_response()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind stub");
        let url = format!("http://{}", listener.local_addr().expect("stub addr"));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { url, calls }
    }

    /// An ECS client pointed at the stub.
    pub async fn client(&self) -> aws_sdk_ecs::Client {
        aws_sdk_ecs::Client::new(&load_sdk_config(Some(&self.url)).await)
    }

    /// The recorded calls of `op`.
    pub fn calls_of(&self, op: &str) -> Vec<Value> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(o, _)| o == op)
            .map(|(_, b)| b.clone())
            .collect()
    }
}
