//! `sandboxctl preflight --backend aws`: the checks of [`super`], run where the
//! executors run — a one-off task of the executor task definition — plus the egress IP
//! the executors use (for an executor key restricted to IP addresses).
//!
//! 1. `DescribeTaskDefinition` of `TASK_DEFINITION`: the container `CONTAINER_NAME` (the key
//!    holder) must log with the `awslogs` driver (`awslogs-group`, `awslogs-stream-prefix`,
//!    optional `awslogs-region`), where the check lines are read back; without it the
//!    command is a configuration error (exit 2) and starts nothing.
//! 2. One `RunTask` as the worker starts executors (crates/aws/src/ecs_compute/: same
//!    `cluster`, `taskDefinition`, `launchType` `FARGATE`, awsvpc `subnets`,
//!    `securityGroups`, `assignPublicIp`), with `startedBy` [`STARTED_BY`] (no environment
//!    tag, so the controller never takes it for an executor), a `clientToken` of this run
//!    (at most 64 characters of 33–126, ECS API reference, RunTask `clientToken`), and one
//!    container override on `CONTAINER_NAME`: `command` `["preflight"]` (the image's
//!    `preflight` role, infra/executor/preflight.mjs) and the variables `PREFLIGHT_HOSTS`
//!    and `PREFLIGHT_TIMEOUT_SECS` (ECS API reference, RunTask `overrides`,
//!    ContainerOverride `command`, `environment`). In the split task the executor
//!    container runs as usual and stops with the task when the essential key holder exits.
//! 3. `DescribeTasks` every `--poll-ms` until `lastStatus` is `STOPPED`, one progress line
//!    on stderr per status; `StopTask` when `--wait-secs` (default 600) runs out. While the
//!    task runs, its `ElasticNetworkInterface` attachment names the ENI
//!    (`networkInterfaceId`, `subnetId`; ECS API reference, Attachment), whose public IP
//!    EC2 `DescribeNetworkInterfaces` gives (`Association.PublicIp`; the ENI is deleted
//!    once the task stopped, so it is read while the task runs).
//! 4. CloudWatch Logs `GetLogEvents` of the stream `<prefix>/<container>/<task id>` ("the
//!    log stream name format is prefix-name/container-name/ecs-task-id", Amazon ECS
//!    Developer Guide, "Using the awslogs log driver"), from the head, every page (the
//!    last page returns the `nextForwardToken` it was given; CloudWatch Logs API reference,
//!    GetLogEvents), until the `done` line of preflight.mjs arrives (log events lag the
//!    task's stop by a few seconds; at most `--wait-secs`/10 more).
//! 5. The egress IP (`egress_ip`): the ENI's public IP when it has one; else the subnet's
//!    default route (`0.0.0.0/0`) from EC2 `DescribeRouteTables` (filter
//!    `association.subnet-id`, else the VPC's main table: `vpc-id` and
//!    `association.main`, with the VPC from `DescribeSubnets`): a NAT gateway's public IPs
//!    (`DescribeNatGateways`, `NatGatewayAddresses[].PublicIp`); an internet gateway
//!    without a public IP on the task fails (no way out); another target says the IP is
//!    decided outside the VPC.
//!
//! A task that never ran its checks fails `task` with its `stoppedReason`; when that reason
//! names secrets (`ResourceInitializationError: unable to pull secrets or registry auth`,
//! Amazon ECS Developer Guide, "Amazon ECS stopped task error messages"), the execution
//! role could not read the executor key secret and `executor_key` fails with it. Every
//! check the task did not report fails as `not checked`.

use super::{Check, DEFAULT_HOSTS, PreflightArgs, host_port};
use anyhow::{Context as _, bail};
use aws_sdk_ecs::config::http::HttpResponse;
use aws_sdk_ecs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ecs::types::{
    AssignPublicIp, AwsVpcConfiguration, ContainerOverride, KeyValuePair, LaunchType,
    NetworkConfiguration, PropagateTags, Task, TaskOverride,
};
use sandbox_aws::settings::{ControllerSettings, EcsSettings};
use serde_json::Value;
use std::time::{Duration, Instant};

/// The `startedBy` of every preflight task (at most 36 letters, digits, `-`, `/`, `_`:
/// ECS API reference, RunTask `startedBy`).
pub const STARTED_BY: &str = "sandboxctl-preflight";
/// The image's role that runs the checks (infra/executor/entrypoint.sh).
pub const ROLE: &str = "preflight";

/// What the run found besides the checks: the task's ARN, when one started.
pub struct Outcome {
    /// The checks in order: `task`, the container's, `egress_ip`.
    pub checks: Vec<Check>,
    /// The preflight task's ARN.
    pub task_arn: Option<String>,
}

/// Where the key holder's lines go (its `awslogs` options).
#[derive(Debug, PartialEq, Eq)]
struct LogTarget {
    group: String,
    prefix: String,
    region: Option<String>,
}

/// The container's `awslogs` options, or why there are none.
fn log_target(
    td: &aws_sdk_ecs::types::TaskDefinition,
    container: &str,
) -> Result<LogTarget, String> {
    let def = td
        .container_definitions()
        .iter()
        .find(|c| c.name() == Some(container))
        .ok_or_else(|| format!("the task definition has no container {container:?}"))?;
    let log = def
        .log_configuration()
        .filter(|l| l.log_driver().as_str() == "awslogs")
        .ok_or_else(|| {
            format!("container {container:?} does not log with the awslogs driver: the check lines cannot be read")
        })?;
    let opts = log.options();
    let get = |k: &str| {
        opts.and_then(|o| o.get(k))
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    Ok(LogTarget {
        group: get("awslogs-group")
            .ok_or_else(|| format!("container {container:?}: awslogs has no awslogs-group"))?,
        prefix: get("awslogs-stream-prefix").ok_or_else(|| {
            format!("container {container:?}: awslogs has no awslogs-stream-prefix (its stream names would not contain the task id)")
        })?,
        region: get("awslogs-region"),
    })
}

/// A `clientToken` unique to this run: `sandboxctl-preflight-<ns hex>-<pid hex>`, under
/// 64 characters of 33–126.
fn client_token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{STARTED_BY}-{nanos:x}-{:x}", std::process::id())
}

/// The awsvpc configuration the worker gives every executor task.
fn network(ecs: &EcsSettings) -> anyhow::Result<NetworkConfiguration> {
    let vpc = AwsVpcConfiguration::builder()
        .set_subnets(Some(ecs.subnets.clone()))
        .set_security_groups((!ecs.security_groups.is_empty()).then(|| ecs.security_groups.clone()))
        .assign_public_ip(if ecs.assign_public_ip {
            AssignPublicIp::Enabled
        } else {
            AssignPublicIp::Disabled
        })
        .build()
        .context("the awsvpc configuration")?;
    Ok(NetworkConfiguration::builder()
        .awsvpc_configuration(vpc)
        .build())
}

/// The container override that selects the `preflight` role.
fn role_override(container: &str, hosts: &str, timeout_secs: u64) -> TaskOverride {
    let var = |name: &str, value: &str| KeyValuePair::builder().name(name).value(value).build();
    TaskOverride::builder()
        .container_overrides(
            ContainerOverride::builder()
                .name(container)
                .command(ROLE)
                .environment(var("PREFLIGHT_HOSTS", hosts))
                .environment(var("PREFLIGHT_TIMEOUT_SECS", &timeout_secs.to_string()))
                .build(),
        )
        .build()
}

fn one_line(s: impl std::fmt::Display) -> String {
    s.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// An AWS SDK error in one short line: the service's error code and message
/// (`AccessDeniedException: User ... is not authorized to perform: ecs:RunTask ...`), else
/// the HTTP status of an answer that is not the service's error document, else the SDK's
/// own description (a dispatch failure, a timeout); at most 300 characters.
fn sdk_message<E>(e: &SdkError<E, HttpResponse>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let text = match e {
        SdkError::ServiceError(se) => match (se.err().code(), se.err().message()) {
            (Some(code), Some(message)) => format!("{code}: {message}"),
            (Some(code), None) => code.to_owned(),
            _ => format!(
                "HTTP {} without an AWS error document",
                se.raw().status().as_u16()
            ),
        },
        other => one_line(aws_sdk_ecs::error::DisplayErrorContext(other)),
    };
    text.chars().take(300).collect()
}

fn task_id(arn: &str) -> &str {
    arn.rsplit('/').next().unwrap_or(arn)
}

/// The task's ENI and subnet, from its `ElasticNetworkInterface` attachment.
fn eni_of(task: &Task) -> (Option<String>, Option<String>) {
    let Some(att) = task
        .attachments()
        .iter()
        .find(|a| a.r#type() == Some("ElasticNetworkInterface"))
    else {
        return (None, None);
    };
    let detail = |n: &str| {
        att.details()
            .iter()
            .find(|d| d.name() == Some(n))
            .and_then(|d| d.value())
            .map(str::to_owned)
    };
    (detail("networkInterfaceId"), detail("subnetId"))
}

/// How the wait ended.
enum Waited {
    Stopped(Box<Task>),
    TimedOut,
}

/// What the ENI showed while the task ran.
#[derive(Default)]
struct Network {
    eni: Option<String>,
    subnet: Option<String>,
    public_ip: Option<String>,
}

/// Runs the AWS form; the checks in order.
///
/// # Errors
/// A usage or configuration error (exit 2): settings missing, a malformed `--host`, a
/// local-only flag, no `awslogs` configuration, an unreadable task definition.
pub async fn checks(args: &PreflightArgs) -> anyhow::Result<Outcome> {
    if args.tls_ca_file.is_some() || args.executor_key_file.is_some() {
        bail!(
            "--tls-ca-file and --executor-key-file apply to the local backend only: on AWS the checks run in the executor image, with its CA roots and the task definition's secrets"
        );
    }
    let hosts: Vec<String> = if args.hosts.is_empty() {
        DEFAULT_HOSTS.iter().map(|h| (*h).to_owned()).collect()
    } else {
        args.hosts.clone()
    };
    for h in &hosts {
        host_port(h).map_err(|e| anyhow::anyhow!("--host {e}"))?;
    }
    let settings = ControllerSettings::from_env()?;
    let ecs_settings = &settings.ecs;
    let sdk = sandbox_aws::load_sdk_config(settings.aws_endpoint_url.as_deref()).await;
    let ecs = aws_sdk_ecs::Client::new(&sdk);
    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    let container = ecs_settings.container_name.as_str();
    let td = ecs
        .describe_task_definition()
        .task_definition(&ecs_settings.task_definition)
        .send()
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "DescribeTaskDefinition {}: {}",
                ecs_settings.task_definition,
                sdk_message(&e)
            )
        })?;
    let target = td
        .task_definition()
        .ok_or_else(|| anyhow::anyhow!("DescribeTaskDefinition answered no task definition"))
        .and_then(|t| log_target(t, container).map_err(anyhow::Error::msg))
        .with_context(|| format!("TASK_DEFINITION {}", ecs_settings.task_definition))?;
    let logs = {
        let mut conf = aws_sdk_cloudwatchlogs::config::Builder::from(&sdk);
        if let Some(r) = &target.region {
            conf = conf.region(aws_sdk_cloudwatchlogs::config::Region::new(r.clone()));
        }
        aws_sdk_cloudwatchlogs::Client::from_conf(conf.build())
    };
    let mut expected: Vec<String> = Vec::new();
    for h in &hosts {
        let (host, _) = host_port(h).map_err(anyhow::Error::msg)?;
        expected.push(format!("resolve {host}"));
        expected.push(format!("tls {host}"));
    }
    expected.extend(["executor_key".to_owned(), "executor_version".to_owned()]);

    let wait = Duration::from_secs(args.wait_secs.max(1));
    let poll = Duration::from_millis(args.poll_ms.max(10));
    let run = ecs
        .run_task()
        .cluster(&ecs_settings.cluster)
        .task_definition(&ecs_settings.task_definition)
        .launch_type(LaunchType::Fargate)
        .count(1)
        .started_by(STARTED_BY)
        .client_token(client_token())
        .network_configuration(network(ecs_settings)?)
        .overrides(role_override(
            container,
            &hosts.join(","),
            args.timeout_secs.max(1),
        ))
        .propagate_tags(PropagateTags::TaskDefinition)
        .enable_ecs_managed_tags(true)
        .send()
        .await;
    let started = match run {
        Err(e) => Err(format!("RunTask refused: {}", sdk_message(&e))),
        Ok(out) => match out.tasks().iter().find_map(|t| t.task_arn()) {
            Some(arn) => Ok(arn.to_owned()),
            None => Err(format!(
                "RunTask started no task: {}",
                out.failures()
                    .iter()
                    .map(|f| format!(
                        "{} ({})",
                        f.reason().unwrap_or("no reason"),
                        f.detail().unwrap_or("")
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
        },
    };
    let arn = match started {
        Ok(arn) => arn,
        Err(why) => {
            let mut checks = vec![Check::new("task", Err(why.clone()))];
            checks.extend(
                expected
                    .iter()
                    .map(|n| Check::new(n, Err(format!("not checked: {why}")))),
            );
            let egress = egress_ip(&ec2, ecs_settings, &Network::default()).await;
            checks.push(Check::new("egress_ip", egress));
            return Ok(Outcome {
                checks,
                task_arn: None,
            });
        }
    };
    let id = task_id(&arn).to_owned();
    eprintln!(
        "preflight: started task {id} of {} on cluster {}; waiting up to {} s for it to stop",
        ecs_settings.task_definition,
        ecs_settings.cluster,
        wait.as_secs()
    );
    let (waited, net) = wait_for_stop(&ecs, &ec2, &ecs_settings.cluster, &arn, wait, poll).await?;
    let stream = format!("{}/{container}/{id}", target.prefix);
    // Log events lag the stop a little; a container that never started (no exit code)
    // wrote none, and a task stopped for the time limit gets one read.
    let lag = match &waited {
        Waited::Stopped(task)
            if task
                .containers()
                .iter()
                .any(|c| c.name() == Some(container) && c.exit_code().is_some()) =>
        {
            (wait / 10).max(poll)
        }
        _ => Duration::ZERO,
    };
    let (lines, done, read_error) = read_lines(&logs, &target.group, &stream, lag, poll).await;
    let mut checks = Vec::new();
    let not_run: Option<String>;
    match &waited {
        Waited::TimedOut => {
            let why = format!(
                "task {id} did not stop within {} s; stopped it",
                wait.as_secs()
            );
            not_run = Some("the task did not stop in time (see task)".to_owned());
            checks.push(Check::new("task", Err(why)));
        }
        Waited::Stopped(task) => {
            let reason = task
                .stopped_reason()
                .unwrap_or("no stoppedReason")
                .to_owned();
            let exit = task
                .containers()
                .iter()
                .find(|c| c.name() == Some(container))
                .and_then(|c| c.exit_code());
            let exit_text =
                exit.map_or_else(|| "no exit code".to_owned(), |c| format!("exit code {c}"));
            if lines.is_empty() {
                let read = read_error.map(|e| format!("; {e}")).unwrap_or_default();
                let why = format!(
                    "task {id} reported no checks ({reason}; container {container} {exit_text}){read}"
                );
                not_run = Some("the task reported no checks (see task)".to_owned());
                checks.push(Check::new("task", Err(why)));
            } else if !done {
                not_run = Some("the task stopped before reporting it (see task)".to_owned());
                checks.push(Check::new(
                    "task",
                    Err(format!(
                        "task {id} stopped before its last check line ({reason}; container {container} {exit_text})"
                    )),
                ));
            } else {
                not_run = Some("the task did not report it".to_owned());
                checks.push(Check::new(
                    "task",
                    Ok(format!(
                        "task {id} ran the checks in container {container} and stopped ({reason}; {exit_text})"
                    )),
                ));
            }
        }
    }
    let secrets_reason = match &waited {
        Waited::Stopped(task) if lines.is_empty() => task
            .stopped_reason()
            .filter(|r| r.to_ascii_lowercase().contains("secret"))
            .map(str::to_owned),
        _ => None,
    };
    let reported: Vec<String> = lines.iter().map(|c| c.name.clone()).collect();
    checks.extend(lines);
    for name in expected.iter().filter(|n| !reported.contains(n)) {
        let why = match (&secrets_reason, name.as_str()) {
            (Some(r), "executor_key") => format!(
                "the execution role could not read the executor key secret (the task definition's secrets): {r}"
            ),
            _ => format!(
                "not checked: {}",
                not_run.as_deref().unwrap_or("no line for it")
            ),
        };
        checks.push(Check::new(name, Err(why)));
    }
    checks.push(Check::new(
        "egress_ip",
        egress_ip(&ec2, ecs_settings, &net).await,
    ));
    Ok(Outcome {
        checks,
        task_arn: Some(arn),
    })
}

/// `DescribeTasks` every `poll` until the task is `STOPPED` (`StopTask` at `wait`); reads
/// the ENI's public IP while the task runs.
async fn wait_for_stop(
    ecs: &aws_sdk_ecs::Client,
    ec2: &aws_sdk_ec2::Client,
    cluster: &str,
    arn: &str,
    wait: Duration,
    poll: Duration,
) -> anyhow::Result<(Waited, Network)> {
    let started = Instant::now();
    let mut last = String::new();
    let mut net = Network::default();
    loop {
        let out = ecs
            .describe_tasks()
            .cluster(cluster)
            .tasks(arn)
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("DescribeTasks {arn}: {}", sdk_message(&e)))?;
        if let Some(task) = out.tasks().iter().find(|t| t.task_arn() == Some(arn)) {
            let status = task.last_status().unwrap_or("UNKNOWN").to_owned();
            if status != last {
                eprintln!(
                    "preflight: task {} is {status} after {} s",
                    task_id(arn),
                    started.elapsed().as_secs()
                );
                last.clone_from(&status);
            }
            let (eni, subnet) = eni_of(task);
            if net.eni.is_none() {
                net.eni = eni;
            }
            if net.subnet.is_none() {
                net.subnet = subnet;
            }
            if status == "STOPPED" {
                return Ok((Waited::Stopped(Box::new(task.clone())), net));
            }
            if net.public_ip.is_none()
                && let Some(eni) = &net.eni
            {
                net.public_ip = eni_public_ip(ec2, eni).await;
            }
        }
        if started.elapsed() >= wait {
            let reason = format!(
                "sandboxctl preflight: not stopped within {} s",
                wait.as_secs()
            );
            ecs.stop_task()
                .cluster(cluster)
                .task(arn)
                .reason(reason)
                .send()
                .await
                .map_err(|e| anyhow::anyhow!("StopTask {arn}: {}", sdk_message(&e)))?;
            eprintln!(
                "preflight: task {} did not stop within {} s; stopped it",
                task_id(arn),
                wait.as_secs()
            );
            return Ok((Waited::TimedOut, net));
        }
        tokio::time::sleep(poll).await;
    }
}

/// The ENI's public IP (`Association.PublicIp`), if it has one and still exists.
async fn eni_public_ip(ec2: &aws_sdk_ec2::Client, eni: &str) -> Option<String> {
    let out = ec2
        .describe_network_interfaces()
        .network_interface_ids(eni)
        .send()
        .await
        .ok()?;
    out.network_interfaces()
        .iter()
        .find_map(|n| n.association().and_then(|a| a.public_ip()))
        .map(str::to_owned)
}

/// Every check line in the log stream, whether the `done` line came, and why none could
/// be read. Reads again every `poll` until the `done` line arrives or `lag` passed.
async fn read_lines(
    logs: &aws_sdk_cloudwatchlogs::Client,
    group: &str,
    stream: &str,
    lag: Duration,
    poll: Duration,
) -> (Vec<Check>, bool, Option<String>) {
    let until = Instant::now() + lag;
    loop {
        let (lines, done, error) = match read_stream(logs, group, stream).await {
            Ok(messages) => {
                let (lines, done) = parse_lines(&messages);
                (lines, done, None)
            }
            Err(e) => (Vec::new(), false, Some(e)),
        };
        if done || Instant::now() >= until {
            return (lines, done, error);
        }
        tokio::time::sleep(poll).await;
    }
}

/// Every message of one log stream, oldest first, every page.
async fn read_stream(
    logs: &aws_sdk_cloudwatchlogs::Client,
    group: &str,
    stream: &str,
) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = logs
            .get_log_events()
            .log_group_name(group)
            .log_stream_name(stream)
            .start_from_head(true)
            .set_next_token(token.clone())
            .send()
            .await
            .map_err(|e| format!("GetLogEvents: {}", sdk_message(&e)))?;
        out.extend(
            page.events()
                .iter()
                .filter_map(|e| e.message().map(str::to_owned)),
        );
        let next = page.next_forward_token().map(str::to_owned);
        if next.is_none() || next == token || page.events().is_empty() {
            return Ok(out);
        }
        token = next;
    }
}

/// preflight.mjs's lines among `messages` (others, such as the entrypoint's stderr, are
/// skipped), and whether its `done` line is there.
fn parse_lines(messages: &[String]) -> (Vec<Check>, bool) {
    let mut checks = Vec::new();
    let mut done = false;
    for m in messages {
        let Ok(v) = serde_json::from_str::<Value>(m.trim()) else {
            continue;
        };
        if v["preflight"] != "v1" {
            continue;
        }
        if v["done"] == true {
            done = true;
        } else if let (Some(name), Some(ok)) = (v["name"].as_str(), v["ok"].as_bool()) {
            let detail = v["detail"].as_str().unwrap_or("").to_owned();
            checks.push(Check::new(name, if ok { Ok(detail) } else { Err(detail) }));
        }
    }
    (checks, done)
}

/// The egress IP of the executor subnet (see the module documentation, step 5).
async fn egress_ip(
    ec2: &aws_sdk_ec2::Client,
    ecs: &EcsSettings,
    net: &Network,
) -> Result<String, String> {
    if let Some(ip) = &net.public_ip {
        return Ok(format!(
            "{ip}, the public IP of the task's network interface {} (ASSIGN_PUBLIC_IP: each task gets its own; a key restricted to IPs needs a NAT gateway's fixed address)",
            net.eni.as_deref().unwrap_or("?")
        ));
    }
    let subnet = net
        .subnet
        .clone()
        .or_else(|| ecs.subnets.first().cloned())
        .ok_or("no subnet (SUBNETS)")?;
    let err = |op: &str, e: String| format!("{op}: {e}");
    let by_subnet = ec2
        .describe_route_tables()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("association.subnet-id")
                .values(&subnet)
                .build(),
        )
        .send()
        .await
        .map_err(|e| err("DescribeRouteTables", sdk_message(&e)))?;
    let mut tables = by_subnet.route_tables().to_vec();
    if tables.is_empty() {
        let subnets = ec2
            .describe_subnets()
            .subnet_ids(&subnet)
            .send()
            .await
            .map_err(|e| err("DescribeSubnets", sdk_message(&e)))?;
        let vpc = subnets
            .subnets()
            .first()
            .and_then(|s| s.vpc_id())
            .ok_or_else(|| format!("DescribeSubnets: no subnet {subnet}"))?
            .to_owned();
        let main = ec2
            .describe_route_tables()
            .filters(
                aws_sdk_ec2::types::Filter::builder()
                    .name("vpc-id")
                    .values(&vpc)
                    .build(),
            )
            .filters(
                aws_sdk_ec2::types::Filter::builder()
                    .name("association.main")
                    .values("true")
                    .build(),
            )
            .send()
            .await
            .map_err(|e| err("DescribeRouteTables", sdk_message(&e)))?;
        tables = main.route_tables().to_vec();
    }
    let route = tables
        .iter()
        .flat_map(|t| t.routes())
        .find(|r| r.destination_cidr_block() == Some("0.0.0.0/0"))
        .ok_or_else(|| {
            format!(
                "{subnet} has no default route (0.0.0.0/0): executors cannot reach the internet"
            )
        })?;
    if let Some(nat) = route.nat_gateway_id() {
        let out = ec2
            .describe_nat_gateways()
            .nat_gateway_ids(nat)
            .send()
            .await
            .map_err(|e| err("DescribeNatGateways", sdk_message(&e)))?;
        let ips: Vec<&str> = out
            .nat_gateways()
            .iter()
            .flat_map(|g| g.nat_gateway_addresses())
            .filter_map(|a| a.public_ip())
            .collect();
        if ips.is_empty() {
            return Err(format!(
                "the default route of {subnet} is NAT gateway {nat}, which has no public IP"
            ));
        }
        return Ok(format!(
            "{} (NAT gateway {nat}, the default route of {subnet})",
            ips.join(", ")
        ));
    }
    if let Some(gw) = route.gateway_id().filter(|g| g.starts_with("igw-")) {
        return if ecs.assign_public_ip {
            Ok(format!(
                "a public IP of each task's own (internet gateway {gw} of {subnet}, ASSIGN_PUBLIC_IP); not fixed: a key restricted to IPs needs a NAT gateway"
            ))
        } else {
            Err(format!(
                "the default route of {subnet} is internet gateway {gw} but tasks get no public IP (ASSIGN_PUBLIC_IP is false): executors cannot reach the internet"
            ))
        };
    }
    let through = [
        ("transit gateway", route.transit_gateway_id()),
        ("network interface", route.network_interface_id()),
        ("instance", route.instance_id()),
        ("VPC peering connection", route.vpc_peering_connection_id()),
        ("gateway", route.gateway_id()),
    ]
    .into_iter()
    .find_map(|(kind, id)| id.map(|id| format!("{kind} {id}")))
    .unwrap_or_else(|| "an unnamed target".to_owned());
    Ok(format!(
        "through {through} (the default route of {subnet}): the public IP is decided outside this VPC"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ecs::types::{ContainerDefinition, LogConfiguration, LogDriver, TaskDefinition};

    fn td(driver: LogDriver, opts: &[(&str, &str)]) -> TaskDefinition {
        let mut log = LogConfiguration::builder().log_driver(driver);
        for (k, v) in opts {
            log = log.options(*k, *v);
        }
        TaskDefinition::builder()
            .container_definitions(
                ContainerDefinition::builder()
                    .name("forwarder")
                    .log_configuration(log.build().unwrap())
                    .build(),
            )
            .build()
    }

    #[test]
    fn the_log_target_is_the_containers_awslogs_options() {
        let t = td(
            LogDriver::Awslogs,
            &[
                ("awslogs-group", "/sandbox/executor"),
                ("awslogs-stream-prefix", "forwarder"),
            ],
        );
        assert_eq!(
            log_target(&t, "forwarder"),
            Ok(LogTarget {
                group: "/sandbox/executor".into(),
                prefix: "forwarder".into(),
                region: None
            })
        );
        assert!(
            log_target(&t, "executor")
                .unwrap_err()
                .contains("no container")
        );
        let no_prefix = td(LogDriver::Awslogs, &[("awslogs-group", "g")]);
        assert!(
            log_target(&no_prefix, "forwarder")
                .unwrap_err()
                .contains("awslogs-stream-prefix")
        );
        let other = td(LogDriver::Splunk, &[]);
        assert!(
            log_target(&other, "forwarder")
                .unwrap_err()
                .contains("awslogs")
        );
    }

    #[test]
    fn only_preflight_lines_are_read_and_the_done_line_ends_them() {
        let messages: Vec<String> = [
            "executor-entrypoint: role preflight: checking",
            r#"{"preflight":"v1","name":"resolve a","ok":true,"detail":"1 address(es): 10.0.0.1"}"#,
            r#"{"other":"json"}"#,
            r#"{"preflight":"v1","name":"executor_key","ok":false,"detail":"the variable CODEX_API_KEY is empty"}"#,
        ]
        .map(str::to_owned)
        .to_vec();
        let (lines, done) = parse_lines(&messages);
        assert!(!done);
        assert_eq!(
            lines,
            vec![
                Check::new("resolve a", Ok("1 address(es): 10.0.0.1".into())),
                Check::new(
                    "executor_key",
                    Err("the variable CODEX_API_KEY is empty".into())
                ),
            ]
        );
        let mut all = messages;
        all.push(r#"{"preflight":"v1","done":true,"failed":1}"#.into());
        assert!(parse_lines(&all).1);
    }

    #[test]
    fn the_client_token_and_started_by_fit_the_ecs_limits() {
        let token = client_token();
        assert!(token.len() <= 64, "{token}");
        assert!(token.bytes().all(|b| (33..=126).contains(&b)), "{token}");
        assert!(STARTED_BY.len() <= 36);
        assert!(
            STARTED_BY
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-/_".contains(&b))
        );
    }
}
