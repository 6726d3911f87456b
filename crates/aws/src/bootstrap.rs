//! Creating the AWS resources the controller runs on, for tests and for bootstrapping a
//! local stack against moto. Production resources come from the SAM/CDK templates; these
//! helpers create the same shapes with SDK calls.
//!
//! - [`create_queues`]: the FIFO events queue and the standard timers queue, each with its
//!   dead-letter queue and a redrive policy (`maxReceiveCount` [`MAX_RECEIVE_COUNT`]);
//! - [`create_ecs`]: a cluster and a FARGATE/awsvpc task definition shaped like production
//!   (container-level `memory`, the executor key from a Secrets Manager `secrets` entry),
//!   on a subnet of moto's default VPC and that VPC's default security group
//!   ([`moto_default_network`]);
//! - [`create_table`](crate::create_table) (in [`crate::dynamo_registry`]): the registry
//!   table;
//! - [`moto_pin_ecs_tasks`]: **moto only** — pins moto's ECS tasks in their status;
//! - [`EcsStub`]: a tiny ECS JSON-protocol stub on 127.0.0.1 for answers moto never gives
//!   (RunTask `failures` with HTTP 200, tasks not yet visible). A test double.
//!
//! moto quirks these helpers design around (shared/reference/moto.md): RunTask crashes
//! (HTTP 500, HTML body) when a container has no container-level `memory`, when the
//! subnet's VPC lacks DNS hostnames (the default VPC has them) and on an awsvpc
//! configuration without security groups; tasks advance one status step per
//! DescribeTasks call unless pinned.

use crate::ecs_compute::EcsConfig;
use crate::sdk_error::port_error;
use crate::sqs_queue::{SqsQueue, SqsQueueOptions};
use crate::strict_ecs::StrictEcs;
use aws_sdk_ecs::types::{Compatibility, ContainerDefinition, NetworkMode, Secret};
use aws_sdk_sqs::types::QueueAttributeName;
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use sandbox_controller::ports::PortError;
use serde_json::Value;
use std::sync::{Arc, Mutex};

const DEP: &str = "bootstrap";

/// Receives before a message moves to its dead-letter queue (both queues).
pub const MAX_RECEIVE_COUNT: u32 = 5;
/// The executor image of the task definitions [`create_ecs`] registers (moto runs no
/// container, so any image name does there).
pub const EXECUTOR_IMAGE: &str = "public.ecr.aws/docker/library/node:22-slim";
/// The Secrets Manager ARN the registered task definition reads `CODEX_API_KEY` from
/// (in moto's account; nothing reads it there, since moto runs no container).
pub const EXECUTOR_KEY_SECRET_ARN: &str =
    "arn:aws:secretsmanager:us-east-1:123456789012:secret:executor-key-AbCdEf";

/// The URLs of the six queues [`create_queues`] creates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queues {
    /// The FIFO events queue (`{prefix}-events.fifo`): webhook jobs.
    pub events_url: String,
    /// Its FIFO dead-letter queue (`{prefix}-events-dlq.fifo`).
    pub events_dlq_url: String,
    /// The standard timers queue (`{prefix}-timers`): delayed rechecks.
    pub timers_url: String,
    /// Its standard dead-letter queue (`{prefix}-timers-dlq`).
    pub timers_dlq_url: String,
    /// The standard sweep queue (`{prefix}-sweep`): a fanned-out sweep's jobs.
    pub sweep_url: String,
    /// Its standard dead-letter queue (`{prefix}-sweep-dlq`).
    pub sweep_dlq_url: String,
}

impl Queues {
    /// The events queue as the controller's queue port (FIFO, with its dead-letter queue).
    pub fn events(&self, client: &aws_sdk_sqs::Client) -> SqsQueue {
        SqsQueue::new(
            client.clone(),
            &self.events_url,
            SqsQueueOptions {
                fifo: true,
                dead_letter_queue_url: Some(self.events_dlq_url.clone()),
            },
        )
    }

    /// The timers queue as the controller's queue port (standard, with its dead-letter
    /// queue).
    pub fn timers(&self, client: &aws_sdk_sqs::Client) -> SqsQueue {
        SqsQueue::new(
            client.clone(),
            &self.timers_url,
            SqsQueueOptions {
                fifo: false,
                dead_letter_queue_url: Some(self.timers_dlq_url.clone()),
            },
        )
    }

    /// The sweep queue as the controller's queue port (standard, with its dead-letter
    /// queue; `Controller::with_sweep_queue`).
    pub fn sweep(&self, client: &aws_sdk_sqs::Client) -> SqsQueue {
        SqsQueue::new(
            client.clone(),
            &self.sweep_url,
            SqsQueueOptions {
                fifo: false,
                dead_letter_queue_url: Some(self.sweep_dlq_url.clone()),
            },
        )
    }
}

/// Creates one queue; `redrive_to` is the ARN of its dead-letter queue. Returns the URL.
async fn create_queue(
    sqs: &aws_sdk_sqs::Client,
    name: &str,
    fifo: bool,
    redrive_to: Option<&str>,
) -> Result<String, PortError> {
    let op = "create_queue";
    let mut req = sqs.create_queue().queue_name(name);
    if fifo {
        req = req.attributes(QueueAttributeName::FifoQueue, "true");
    }
    if let Some(arn) = redrive_to {
        let policy = serde_json::json!({
            "deadLetterTargetArn": arn,
            "maxReceiveCount": MAX_RECEIVE_COUNT.to_string(),
        });
        req = req.attributes(QueueAttributeName::RedrivePolicy, policy.to_string());
    }
    let out = req.send().await.map_err(|e| port_error(DEP, op, &e))?;
    out.queue_url()
        .map(str::to_owned)
        .ok_or_else(|| PortError::permanent(DEP, op, format!("no URL for queue {name}")))
}

async fn queue_arn(sqs: &aws_sdk_sqs::Client, url: &str) -> Result<String, PortError> {
    let op = "queue_arn";
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| port_error(DEP, op, &e))?;
    out.attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn))
        .cloned()
        .ok_or_else(|| PortError::permanent(DEP, op, format!("no QueueArn for {url}")))
}

/// Creates the controller's queues named after `prefix` (letters, digits, `-`, `_`; at
/// most 65 characters so `{prefix}-events-dlq.fifo` fits the 80-character limit):
///
/// - `{prefix}-events-dlq.fifo` (FIFO) and `{prefix}-events.fifo` (FIFO, content-based
///   de-duplication off: the webhook id is the de-duplication id), redriven to it after
///   [`MAX_RECEIVE_COUNT`] receives;
/// - `{prefix}-timers-dlq` (standard) and `{prefix}-timers` (standard: per-message
///   `DelaySeconds` works only there), redriven likewise;
/// - `{prefix}-sweep-dlq` and `{prefix}-sweep` (standard, the sweep's delayed jobs),
///   redriven likewise.
///
/// `CreateQueue` with the same name and attributes is idempotent on SQS.
///
/// # Errors
/// A [`PortError`] when a call fails.
pub async fn create_queues(sqs: &aws_sdk_sqs::Client, prefix: &str) -> Result<Queues, PortError> {
    let events_dlq_url =
        create_queue(sqs, &format!("{prefix}-events-dlq.fifo"), true, None).await?;
    let events_dlq_arn = queue_arn(sqs, &events_dlq_url).await?;
    let events_url = create_queue(
        sqs,
        &format!("{prefix}-events.fifo"),
        true,
        Some(&events_dlq_arn),
    )
    .await?;
    let timers_dlq_url = create_queue(sqs, &format!("{prefix}-timers-dlq"), false, None).await?;
    let timers_dlq_arn = queue_arn(sqs, &timers_dlq_url).await?;
    let timers_url = create_queue(
        sqs,
        &format!("{prefix}-timers"),
        false,
        Some(&timers_dlq_arn),
    )
    .await?;
    let sweep_dlq_url = create_queue(sqs, &format!("{prefix}-sweep-dlq"), false, None).await?;
    let sweep_dlq_arn = queue_arn(sqs, &sweep_dlq_url).await?;
    let sweep_url =
        create_queue(sqs, &format!("{prefix}-sweep"), false, Some(&sweep_dlq_arn)).await?;
    Ok(Queues {
        events_url,
        events_dlq_url,
        timers_url,
        timers_dlq_url,
        sweep_url,
        sweep_dlq_url,
    })
}

/// **moto only**: a subnet of moto's default VPC (the first default-for-AZ subnet by id)
/// and that VPC's `default` security group, via EC2 `DescribeSubnets` and
/// `DescribeSecurityGroups` sent as plain query-protocol requests to `endpoint` (moto does
/// not check signatures; this keeps the large EC2 SDK crate out of the build).
///
/// # Errors
/// A [`PortError`] when a call fails or there is no default VPC.
pub async fn moto_default_network(endpoint: &str) -> Result<(String, String), PortError> {
    let op = "moto_default_network";
    let subnets = ec2_query(
        endpoint,
        "Action=DescribeSubnets&Filter.1.Name=default-for-az&Filter.1.Value.1=true",
    )
    .await?;
    let mut found: Vec<(String, String)> = xml_items(&subnets)
        .filter_map(|item| Some((xml_text(item, "subnetId")?, xml_text(item, "vpcId")?)))
        .collect();
    found.sort();
    let Some((subnet, vpc)) = found.into_iter().next() else {
        return Err(PortError::permanent(
            DEP,
            op,
            "no default-for-az subnet: the account has no default VPC",
        ));
    };
    let groups = ec2_query(
        endpoint,
        &format!(
            "Action=DescribeSecurityGroups&Filter.1.Name=group-name&Filter.1.Value.1=default\
             &Filter.2.Name=vpc-id&Filter.2.Value.1={vpc}"
        ),
    )
    .await?;
    let group = xml_text(&groups, "groupId").ok_or_else(|| {
        PortError::permanent(DEP, op, format!("no default security group in {vpc}"))
    })?;
    Ok((subnet, group))
}

/// One EC2 query-protocol call (API version 2016-11-15) to moto; the XML answer.
async fn ec2_query(endpoint: &str, query: &str) -> Result<String, PortError> {
    let op = "ec2_query";
    let resp = reqwest::Client::new()
        .post(format!("{}/", endpoint.trim_end_matches('/')))
        .header(
            "Authorization",
            "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/ec2/aws4_request, \
             SignedHeaders=host, Signature=0",
        )
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("Version=2016-11-15&{query}"))
        .send()
        .await
        .map_err(|e| PortError::transient(DEP, op, e.to_string()))?;
    let status = resp.status();
    let body = resp
        .text()
        .await
        .map_err(|e| PortError::transient(DEP, op, e.to_string()))?;
    if !status.is_success() {
        return Err(PortError::permanent(DEP, op, format!("HTTP {status}")));
    }
    Ok(body)
}

/// The `<item>` elements of an EC2 XML answer (flat: the answers read here do not nest
/// items inside the fields this module reads).
fn xml_items(xml: &str) -> impl Iterator<Item = &str> {
    xml.split("<item>").skip(1)
}

/// The text of the first `<tag>` element in `xml`, if any.
fn xml_text(xml: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find('<')? + start;
    Some(xml[start..end].to_owned())
}

/// The task definition's workspace volume (`ebs_workspaces::WORKSPACE_VOLUME_NAME`).
const WORKSPACE_VOLUME: &str = "workspace";

/// Registers the FARGATE/awsvpc task definition `family` (256 CPU units, 512 MiB) with one
/// essential container `container` running `codex exec-server` from [`EXECUTOR_IMAGE`],
/// with container-level `memory` (moto's RunTask needs it) and `CODEX_API_KEY` from
/// [`EXECUTOR_KEY_SECRET_ARN`], and the workspace volume as SAM and CDK declare it: a
/// volume named `workspace` with `configuredAtLaunch: true` mounted at `/workspace`
/// (created per task only when the `RunTask` names it in `volumeConfigurations`).
/// Returns the task definition ARN.
///
/// # Errors
/// A [`PortError`] when the call fails.
pub async fn register_task_definition(
    ecs: &aws_sdk_ecs::Client,
    family: &str,
    container: &str,
) -> Result<String, PortError> {
    let op = "register_task_definition";
    let secret = Secret::builder()
        .name("CODEX_API_KEY")
        .value_from(EXECUTOR_KEY_SECRET_ARN)
        .build()
        .map_err(|e| PortError::permanent(DEP, op, format!("secret: {e}")))?;
    let definition = ContainerDefinition::builder()
        .name(container)
        .image(EXECUTOR_IMAGE)
        .essential(true)
        .memory(512)
        .command("codex")
        .command("exec-server")
        .secrets(secret)
        .mount_points(
            aws_sdk_ecs::types::MountPoint::builder()
                .source_volume(WORKSPACE_VOLUME)
                .container_path("/workspace")
                .read_only(false)
                .build(),
        )
        .build();
    let out = ecs
        .register_task_definition()
        .family(family)
        .requires_compatibilities(Compatibility::Fargate)
        .network_mode(NetworkMode::Awsvpc)
        .cpu("256")
        .memory("512")
        .container_definitions(definition)
        .volumes(
            aws_sdk_ecs::types::Volume::builder()
                .name(WORKSPACE_VOLUME)
                .configured_at_launch(true)
                .build(),
        )
        .send()
        .await
        .map_err(|e| port_error(DEP, op, &e))?;
    out.task_definition()
        .and_then(|t| t.task_definition_arn())
        .map(str::to_owned)
        .ok_or_else(|| PortError::permanent(DEP, op, "no task definition ARN in the answer"))
}

/// Creates cluster `cluster`, registers the task definition `family` with the executor
/// container `container` ([`register_task_definition`]) and finds moto's default network
/// ([`moto_default_network`], so **moto only**: `endpoint` is the moto server). Returns the [`EcsConfig`] for [`EcsCompute`](crate::EcsCompute)
/// (task definition by family name, public IP enabled).
///
/// # Errors
/// A [`PortError`] when a call fails.
pub async fn create_ecs(
    ecs: &aws_sdk_ecs::Client,
    endpoint: &str,
    cluster: &str,
    family: &str,
    container: &str,
) -> Result<EcsConfig, PortError> {
    ecs.create_cluster()
        .cluster_name(cluster)
        .send()
        .await
        .map_err(|e| port_error(DEP, "create_cluster", &e))?;
    register_task_definition(ecs, family, container).await?;
    let (subnet, security_group) = moto_default_network(endpoint).await?;
    Ok(EcsConfig {
        cluster: cluster.to_owned(),
        task_definition: family.to_owned(),
        container_name: container.to_owned(),
        subnets: vec![subnet],
        security_groups: vec![security_group],
        assign_public_ip: true,
    })
}

/// **moto only**: pins moto's ECS tasks in their status with `POST
/// {endpoint}/moto-api/state-manager/set-transition` (model `ecs::task`, manual
/// progression). Without it moto advances a task one status step per DescribeTasks call
/// (RUNNING → DEACTIVATING → STOPPING → ...), which real ECS never does. Global to the
/// moto server and idempotent. Never call it against AWS (the path does not exist there).
///
/// # Errors
/// A [`PortError`] when moto does not accept the request.
pub async fn moto_pin_ecs_tasks(endpoint: &str) -> Result<(), PortError> {
    let op = "moto_pin_ecs_tasks";
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/moto-api/state-manager/set-transition",
            endpoint.trim_end_matches('/')
        ))
        .json(&serde_json::json!({
            "model_name": "ecs::task",
            "transition": {"progression": "manual", "times": 1_000_000}
        }))
        .send()
        .await
        .map_err(|e| PortError::transient(DEP, op, e.to_string()))?;
    if !resp.status().is_success() {
        return Err(PortError::permanent(
            DEP,
            op,
            format!("moto answered {}", resp.status()),
        ));
    }
    Ok(())
}

/// The key of an [`EcsStub`] answer that sets its HTTP status (see [`EcsStub`]).
pub const STUB_STATUS: &str = "__stub_status";

/// One recorded call to an [`EcsStub`]: the operation (from `X-Amz-Target`) and the JSON
/// body.
pub type StubCalls = Arc<Mutex<Vec<(String, Value)>>>;

/// A test double answering the ECS JSON 1.1 protocol on 127.0.0.1, for answers moto never
/// gives (RunTask `failures` with HTTP 200, a task not yet visible, error answers).
/// `answer(operation, body, nth call of that operation)` gives the JSON answer, HTTP 200
/// unless it holds the key [`STUB_STATUS`]: then that status (removed from the body), e.g.
/// `{"__stub_status": 400, "__type": "ClientException", "message": "..."}` — the ECS JSON
/// 1.1 error shape (`__type` is the error code). The server task lives as long as the
/// tokio runtime.
pub struct EcsStub {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Every call received, in order.
    pub calls: StubCalls,
}

impl EcsStub {
    /// Starts the stub on an ephemeral port.
    ///
    /// # Panics
    /// When no local port can be bound.
    pub async fn start(
        answer: impl Fn(&str, &Value, usize) -> Value + Send + Sync + 'static,
    ) -> Self {
        let calls: StubCalls = Arc::default();
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
                        let mut calls = recorded
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        let nth = calls.iter().filter(|(o, _)| *o == op).count();
                        calls.push((op.clone(), json.clone()));
                        nth
                    };
                    let mut reply = answer(&op, &json, nth);
                    let status = reply
                        .as_object_mut()
                        .and_then(|o| o.remove(STUB_STATUS))
                        .and_then(|s| s.as_u64())
                        .and_then(|s| u16::try_from(s).ok())
                        .and_then(|s| axum::http::StatusCode::from_u16(s).ok())
                        .unwrap_or(axum::http::StatusCode::OK);
                    (
                        status,
                        [("content-type", "application/x-amz-json-1.1")],
                        reply.to_string(),
                    )
                        .into_response()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the ECS stub on 127.0.0.1");
        let url = format!(
            "http://{}",
            listener.local_addr().expect("ECS stub local address")
        );
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { url, calls }
    }

    /// An ECS client pointed at the stub, behind a [`StrictEcs`] guard: a request the ECS
    /// API reference forbids fails before it reaches the stub.
    pub async fn client(&self) -> aws_sdk_ecs::Client {
        StrictEcs::new().client(&crate::load_sdk_config(Some(&self.url)).await)
    }

    /// The recorded calls of `op`.
    pub fn calls_of(&self, op: &str) -> Vec<Value> {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(o, _)| o == op)
            .map(|(_, b)| b.clone())
            .collect()
    }
}
