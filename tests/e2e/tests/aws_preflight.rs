//! `sandboxctl preflight --backend aws` against moto, end to end: the real binary, the real
//! executor-image checks (infra/executor/entrypoint.sh `preflight` → preflight.mjs, with
//! the pinned `codex`) and a TLS server on 127.0.0.1 (crate::test_tls).
//!
//! **moto runs no containers**, so a bridge plays ECS and the awslogs driver for the
//! preflight tasks (ListTasks by the preflight's `startedBy`): it plays the execution role
//! by reading the task definition's key secret (GetSecretValue); when that fails it stops
//! the task with the reason ECS gives ("ResourceInitializationError: unable to pull secrets
//! or registry auth", Amazon ECS Developer Guide, "Amazon ECS stopped task error
//! messages"); otherwise it runs the RunTask override's command through the entrypoint
//! with the override's variables and the secret's value, puts every output line into the
//! log stream `<prefix>/<container>/<task id>` as the awslogs driver does, and stops the
//! task ("Essential container in task exited"). The network is a VPC of the test's own: the
//! executor subnet's default route goes to a NAT gateway with an Elastic IP, another
//! subnet's to an internet gateway (and tasks get no public IP).
//!
//! Every ECS request of `sandboxctl` passes a recording proxy in front of moto, so the
//! RunTask shape is asserted exactly (the project's strict ECS rules, `StrictEcs`, apply to
//! the worker's client; this is a separate process).

use aws_sdk_ecs::types::{
    Compatibility, ContainerDefinition, LogConfiguration, LogDriver, NetworkMode, Secret,
};
use sandbox_aws::bootstrap::moto_pin_ecs_tasks;
use sandbox_aws::strict_ecs::{
    MAX_CLIENT_TOKEN_CHARS, MAX_STARTED_BY_CHARS, MAX_STOP_REASON_CHARS,
};
use sandbox_e2e::aws_stack::{moto_endpoint, unique};
use sandbox_e2e::ecs_idempotency_proxy::EcsIdempotencyProxy;
use sandbox_e2e::operator_cli::{CtlOutput, sandboxctl};
use sandbox_e2e::pinned_codex;
use sandbox_e2e::test_tls::{TlsServer, certificates, free_port};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const CONTAINER: &str = "forwarder";
const STARTED_BY: &str = "sandboxctl-preflight";
const KEY: &str = "preflight-aws-executor-key-never-shown";

/// What the bridge does with the next preflight task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plays {
    /// Runs it (after reading the key secret); `trust_ca`: the image trusts the test CA.
    Run { trust_ca: bool },
    /// Leaves it running (a task that never stops).
    Hang,
}

/// The moto resources of one test.
struct Stack {
    cluster: String,
    /// Its key secret exists.
    family: String,
    /// Its key secret does not.
    family_no_secret: String,
    log_group: String,
    net: Net,
}

/// The test's VPC: the executor subnets, their security group, the NAT gateway and its
/// Elastic IP, the internet gateway.
struct Net {
    nat_subnet: String,
    igw_subnet: String,
    security_group: String,
    nat_id: String,
    nat_ip: String,
    igw_id: String,
}

async fn ec2_stack(ec2: &aws_sdk_ec2::Client) -> Net {
    use aws_sdk_ec2::types::DomainType;
    let vpc = ec2
        .create_vpc()
        .cidr_block("10.77.0.0/16")
        .send()
        .await
        .unwrap();
    let vpc = vpc.vpc().unwrap().vpc_id().unwrap().to_owned();
    // As Fargate's awsvpc tasks expect (moto names a task ENI's private DNS name only then).
    ec2.modify_vpc_attribute()
        .vpc_id(&vpc)
        .enable_dns_hostnames(
            aws_sdk_ec2::types::AttributeBooleanValue::builder()
                .value(true)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let subnet = |cidr: &'static str| {
        let vpc = vpc.clone();
        async move {
            ec2.create_subnet()
                .vpc_id(vpc)
                .cidr_block(cidr)
                .send()
                .await
                .unwrap()
                .subnet()
                .unwrap()
                .subnet_id()
                .unwrap()
                .to_owned()
        }
    };
    let nat_subnet = subnet("10.77.1.0/24").await;
    let igw_subnet = subnet("10.77.2.0/24").await;
    let public_subnet = subnet("10.77.3.0/24").await;
    let igw = ec2
        .create_internet_gateway()
        .send()
        .await
        .unwrap()
        .internet_gateway()
        .unwrap()
        .internet_gateway_id()
        .unwrap()
        .to_owned();
    ec2.attach_internet_gateway()
        .internet_gateway_id(&igw)
        .vpc_id(&vpc)
        .send()
        .await
        .unwrap();
    let eip = ec2
        .allocate_address()
        .domain(DomainType::Vpc)
        .send()
        .await
        .unwrap();
    let nat = ec2
        .create_nat_gateway()
        .subnet_id(&public_subnet)
        .allocation_id(eip.allocation_id().unwrap())
        .send()
        .await
        .unwrap();
    let nat_id = nat
        .nat_gateway()
        .unwrap()
        .nat_gateway_id()
        .unwrap()
        .to_owned();
    let table = |target_nat: Option<String>, target_igw: Option<String>, subnet: String| {
        let vpc = vpc.clone();
        async move {
            let rt = ec2
                .create_route_table()
                .vpc_id(vpc)
                .send()
                .await
                .unwrap()
                .route_table()
                .unwrap()
                .route_table_id()
                .unwrap()
                .to_owned();
            ec2.create_route()
                .route_table_id(&rt)
                .destination_cidr_block("0.0.0.0/0")
                .set_nat_gateway_id(target_nat)
                .set_gateway_id(target_igw)
                .send()
                .await
                .unwrap();
            ec2.associate_route_table()
                .route_table_id(&rt)
                .subnet_id(subnet)
                .send()
                .await
                .unwrap();
        }
    };
    table(Some(nat_id.clone()), None, nat_subnet.clone()).await;
    table(None, Some(igw.clone()), igw_subnet.clone()).await;
    let sg = ec2
        .create_security_group()
        .group_name(format!("preflight-{}", unique()))
        .description("preflight test")
        .vpc_id(&vpc)
        .send()
        .await
        .unwrap()
        .group_id()
        .unwrap()
        .to_owned();
    Net {
        nat_subnet,
        igw_subnet,
        security_group: sg,
        nat_id,
        nat_ip: eip.public_ip().unwrap().to_owned(),
        igw_id: igw,
    }
}

async fn register(ecs: &aws_sdk_ecs::Client, family: &str, secret_arn: &str, group: &str) {
    let log = LogConfiguration::builder()
        .log_driver(LogDriver::Awslogs)
        .options("awslogs-group", group)
        .options("awslogs-region", "us-east-1")
        .options("awslogs-stream-prefix", CONTAINER)
        .build()
        .unwrap();
    let container = ContainerDefinition::builder()
        .name(CONTAINER)
        .image("sandbox-executor:test")
        .essential(true)
        .memory(512)
        .command("forwarder")
        .command("ws://127.0.0.1:7070")
        .secrets(
            Secret::builder()
                .name("CODEX_API_KEY")
                .value_from(secret_arn)
                .build()
                .unwrap(),
        )
        .log_configuration(log)
        .build();
    ecs.register_task_definition()
        .family(family)
        .requires_compatibilities(Compatibility::Fargate)
        .network_mode(NetworkMode::Awsvpc)
        .cpu("256")
        .memory("512")
        .container_definitions(container)
        .send()
        .await
        .unwrap();
}

async fn stack(sdk: &aws_config::SdkConfig) -> Stack {
    let ecs = aws_sdk_ecs::Client::new(sdk);
    let ec2 = aws_sdk_ec2::Client::new(sdk);
    let id = unique();
    let cluster = format!("preflight-{id}");
    ecs.create_cluster()
        .cluster_name(&cluster)
        .send()
        .await
        .unwrap();
    let secret = aws_sdk_secretsmanager::Client::new(sdk)
        .create_secret()
        .name(format!("executor-key-{id}"))
        .secret_string(KEY)
        .send()
        .await
        .unwrap();
    let log_group = format!("/sandbox/preflight-{id}");
    aws_sdk_cloudwatchlogs::Client::new(sdk)
        .create_log_group()
        .log_group_name(&log_group)
        .send()
        .await
        .unwrap();
    let family = format!("executor-{id}");
    register(&ecs, &family, secret.arn().unwrap(), &log_group).await;
    let family_no_secret = format!("executor-nosecret-{id}");
    let missing =
        format!("arn:aws:secretsmanager:us-east-1:123456789012:secret:missing-{id}-AbCdEf");
    register(&ecs, &family_no_secret, &missing, &log_group).await;
    Stack {
        cluster,
        family,
        family_no_secret,
        log_group,
        net: ec2_stack(&ec2).await,
    }
}

/// The bridge: plays ECS and the awslogs driver for every preflight task of `cluster`.
fn bridge(
    sdk: aws_config::SdkConfig,
    cluster: String,
    log_group: String,
    ca: PathBuf,
    plays: Arc<Mutex<Plays>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let ecs = aws_sdk_ecs::Client::new(&sdk);
        let secrets = aws_sdk_secretsmanager::Client::new(&sdk);
        let logs = aws_sdk_cloudwatchlogs::Client::new(&sdk);
        let mut seen: HashSet<String> = HashSet::new();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let Ok(listed) = ecs
                .list_tasks()
                .cluster(&cluster)
                .started_by(STARTED_BY)
                .send()
                .await
            else {
                continue;
            };
            for arn in listed.task_arns() {
                if !seen.insert(arn.clone()) {
                    continue;
                }
                let mode = *plays.lock().unwrap();
                if mode == Plays::Hang {
                    continue;
                }
                play(&ecs, &secrets, &logs, &cluster, &log_group, &ca, arn, mode).await;
            }
        }
    })
}

#[allow(clippy::too_many_arguments)]
async fn play(
    ecs: &aws_sdk_ecs::Client,
    secrets: &aws_sdk_secretsmanager::Client,
    logs: &aws_sdk_cloudwatchlogs::Client,
    cluster: &str,
    log_group: &str,
    ca: &Path,
    arn: &str,
    mode: Plays,
) {
    let described = ecs
        .describe_tasks()
        .cluster(cluster)
        .tasks(arn)
        .send()
        .await
        .unwrap();
    let task = &described.tasks()[0];
    let td = ecs
        .describe_task_definition()
        .task_definition(task.task_definition_arn().unwrap())
        .send()
        .await
        .unwrap();
    let def = &td.task_definition().unwrap().container_definitions()[0];
    let secret_arn = def.secrets()[0].value_from();
    let stop = |reason: String| async move {
        ecs.stop_task()
            .cluster(cluster)
            .task(arn)
            .reason(reason)
            .send()
            .await
            .unwrap();
    };
    // The execution role pulls the secrets before any container starts.
    let key = match secrets
        .get_secret_value()
        .secret_id(secret_arn)
        .send()
        .await
    {
        Ok(v) => v.secret_string().unwrap().to_owned(),
        Err(e) => {
            use aws_sdk_secretsmanager::error::ProvideErrorMetadata as _;
            let reason = format!(
                "ResourceInitializationError: unable to pull secrets or registry auth: execution resource retrieval failed: unable to retrieve secret from asm: {}: {}",
                e.code().unwrap_or("?"),
                e.message().unwrap_or("")
            );
            stop(reason.chars().take(MAX_STOP_REASON_CHARS).collect()).await;
            return;
        }
    };
    let ov = task
        .overrides()
        .unwrap()
        .container_overrides()
        .iter()
        .find(|o| o.name() == Some(CONTAINER))
        .unwrap();
    let entrypoint =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../infra/executor/entrypoint.sh");
    let codex_dir = pinned_codex().unwrap().parent().unwrap().to_owned();
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg(std::path::absolute(entrypoint).unwrap())
        .args(ov.command())
        .env_clear()
        .env(
            "PATH",
            format!("{}:{}", codex_dir.display(), std::env::var("PATH").unwrap()),
        )
        .env("HOME", std::env::temp_dir())
        .env("CODEX_API_KEY", &key);
    for kv in ov.environment() {
        cmd.env(kv.name().unwrap(), kv.value().unwrap());
    }
    if let Plays::Run { trust_ca: true } = mode {
        cmd.env("NODE_EXTRA_CA_CERTS", ca);
    }
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let stream = format!(
        "{CONTAINER}/{CONTAINER}/{}",
        arn.rsplit('/').next().unwrap()
    );
    logs.create_log_stream()
        .log_group_name(log_group)
        .log_stream_name(&stream)
        .send()
        .await
        .unwrap();
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let mut put = logs
        .put_log_events()
        .log_group_name(log_group)
        .log_stream_name(&stream);
    for line in text.lines() {
        put = put.log_events(
            aws_sdk_cloudwatchlogs::types::InputLogEvent::builder()
                .timestamp(now)
                .message(line)
                .build()
                .unwrap(),
        );
    }
    put.send().await.unwrap();
    stop("Essential container in task exited".to_owned()).await;
}

async fn preflight(
    proxy: &EcsIdempotencyProxy,
    s: &Stack,
    family: &str,
    subnet: &str,
    args: &[&str],
) -> CtlOutput {
    let env = [
        ("AWS_ENDPOINT_URL", proxy.url.clone()),
        ("AWS_REGION", "us-east-1".to_owned()),
        ("AWS_ACCESS_KEY_ID", "test".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "test".to_owned()),
        // The operator's environment of every `--backend aws` command (the worker's).
        (
            "EVENTS_QUEUE_URL",
            "http://127.0.0.1:9/q/events.fifo".to_owned(),
        ),
        ("TIMERS_QUEUE_URL", "http://127.0.0.1:9/q/timers".to_owned()),
        ("SWEEP_QUEUE_URL", "http://127.0.0.1:9/q/sweep".to_owned()),
        ("TABLE_NAME", "unused-by-preflight".to_owned()),
        ("ECS_CLUSTER", s.cluster.clone()),
        ("TASK_DEFINITION", family.to_owned()),
        ("CONTAINER_NAME", CONTAINER.to_owned()),
        ("SUBNETS", subnet.to_owned()),
        ("SECURITY_GROUPS", s.net.security_group.clone()),
        ("DEPLOYMENT_ID", "preflight".to_owned()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut all = vec!["preflight", "--backend", "aws", "--poll-ms", "200"];
    all.extend(args);
    sandboxctl(&all, &env).await
}

fn check<'a>(doc: &'a Value, name: &str, nth: usize) -> &'a Value {
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == name)
        .nth(nth)
        .unwrap_or_else(|| panic!("no check {name} #{nth}: {doc:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_preflight_names_what_is_missing() {
    let endpoint = moto_endpoint();
    moto_pin_ecs_tasks(&endpoint).await.unwrap();
    let sdk = sandbox_aws::load_sdk_config(Some(&endpoint)).await;
    let s = stack(&sdk).await;
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let port = free_port();
    let _server = TlsServer::start(dir.path(), port);
    let closed = free_port();
    let tls_host = format!("127.0.0.1:{port}");
    let closed_host = format!("127.0.0.1:{closed}");
    let plays = Arc::new(Mutex::new(Plays::Run { trust_ca: true }));
    let bridge = bridge(
        sdk.clone(),
        s.cluster.clone(),
        s.log_group.clone(),
        dir.path().join("ca.pem"),
        plays.clone(),
    );
    let proxy = EcsIdempotencyProxy::start(&endpoint).await.unwrap();

    // 1. Everything reachable from the task: exit 0, one `ok` line per check, the NAT
    // gateway's Elastic IP as the egress IP.
    let good = preflight(
        &proxy,
        &s,
        &s.family,
        &s.net.nat_subnet,
        &["--host", &tls_host],
    )
    .await;
    assert_eq!(good.code, 0, "{good:?}");
    let names: Vec<&str> = good
        .stdout
        .lines()
        .map(|l| l[5..].split(':').next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "task",
            "resolve 127.0.0.1",
            "tls 127.0.0.1",
            "executor_key",
            "executor_version",
            "egress_ip"
        ],
        "{}",
        good.stdout
    );
    assert!(
        good.stdout.lines().all(|l| l.starts_with("ok ")),
        "{}",
        good.stdout
    );
    assert!(
        good.stdout.contains("TLS accepted at 127.0.0.1:"),
        "{}",
        good.stdout
    );
    assert!(
        good.stdout.contains("executor_version: codex-cli 0.171.0"),
        "{}",
        good.stdout
    );
    assert!(
        good.stdout.contains(&format!(
            "egress_ip: {} (NAT gateway {}, the default route of {})",
            s.net.nat_ip, s.net.nat_id, s.net.nat_subnet
        )),
        "{}",
        good.stdout
    );
    assert!(
        good.stderr.contains("preflight: task "),
        "progress on stderr: {}",
        good.stderr
    );
    assert!(!good.stdout.contains(KEY) && !good.stderr.contains(KEY));

    // The RunTask, exactly: the worker's launch settings, the preflight's startedBy and a
    // client token within the ECS limits, and one override selecting the role.
    let requests = proxy.ecs_requests();
    let ops: Vec<&str> = requests.iter().map(|(op, _)| op.as_str()).collect();
    assert_eq!(ops[..2], ["DescribeTaskDefinition", "RunTask"], "{ops:?}");
    assert!(
        ops[2..].iter().all(|op| *op == "DescribeTasks"),
        "only DescribeTasks while waiting; no StopTask for a task that stopped: {ops:?}"
    );
    let run = &requests[1].1;
    let token = run["clientToken"].as_str().unwrap();
    assert!(
        token.len() <= MAX_CLIENT_TOKEN_CHARS && token.bytes().all(|b| (33..=126).contains(&b))
    );
    assert!(STARTED_BY.len() <= MAX_STARTED_BY_CHARS);
    let mut shape = run.clone();
    shape["clientToken"] = json!("<token>");
    assert_eq!(
        shape,
        json!({
            "cluster": s.cluster,
            "taskDefinition": s.family,
            "launchType": "FARGATE",
            "count": 1,
            "startedBy": STARTED_BY,
            "clientToken": "<token>",
            "networkConfiguration": {"awsvpcConfiguration": {
                "subnets": [s.net.nat_subnet],
                "securityGroups": [s.net.security_group],
                "assignPublicIp": "DISABLED"
            }},
            "overrides": {"containerOverrides": [{
                "name": CONTAINER,
                "command": ["preflight"],
                "environment": [
                    {"name": "PREFLIGHT_HOSTS", "value": tls_host},
                    {"name": "PREFLIGHT_TIMEOUT_SECS", "value": "5"}
                ]
            }]},
            "propagateTags": "TASK_DEFINITION",
            "enableECSManagedTags": true
        })
    );

    // 2. What the task cannot reach is named, one entry each (JSON): a certificate the
    // image does not trust, a closed port, a name that does not resolve; exit 1.
    *plays.lock().unwrap() = Plays::Run { trust_ca: false };
    let bad = preflight(
        &proxy,
        &s,
        &s.family,
        &s.net.nat_subnet,
        &[
            "--json",
            "--host",
            &tls_host,
            "--host",
            &closed_host,
            "--host",
            "executor-registration.invalid",
        ],
    )
    .await;
    assert_eq!(bad.code, 1, "{bad:?}");
    let doc = bad.json();
    assert_eq!(doc["backend"], "aws");
    assert!(doc["task"].as_str().unwrap().contains(":task/"), "{doc:#}");
    assert_eq!(check(&doc, "task", 0)["ok"], true, "{doc:#}");
    let untrusted = check(&doc, "tls 127.0.0.1", 0);
    assert_eq!(untrusted["ok"], false);
    assert!(
        untrusted["detail"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("certificate"),
        "{untrusted}"
    );
    assert!(
        check(&doc, "tls 127.0.0.1", 1)["detail"]
            .as_str()
            .unwrap()
            .contains("ECONNREFUSED")
    );
    assert_eq!(
        check(&doc, "resolve executor-registration.invalid", 0)["ok"],
        false
    );
    assert_eq!(check(&doc, "executor_key", 0)["ok"], true);
    assert_eq!(check(&doc, "egress_ip", 0)["ok"], true);
    assert_eq!(
        doc["problems"].as_array().unwrap().len(),
        4,
        "the two TLS failures, the name, its TLS: {doc:#}"
    );

    // 3. The execution role cannot read the key secret: the task never runs its checks;
    // `executor_key` names the reason, the rest are not checked; the subnet's default route
    // is an internet gateway but tasks get no public IP.
    *plays.lock().unwrap() = Plays::Run { trust_ca: true };
    let no_secret = preflight(
        &proxy,
        &s,
        &s.family_no_secret,
        &s.net.igw_subnet,
        &["--json", "--host", &tls_host, "--wait-secs", "20"],
    )
    .await;
    assert_eq!(no_secret.code, 1, "{no_secret:?}");
    let doc = no_secret.json();
    let task = check(&doc, "task", 0);
    assert_eq!(task["ok"], false);
    assert!(
        task["detail"]
            .as_str()
            .unwrap()
            .contains("ResourceInitializationError"),
        "{task}"
    );
    let key = check(&doc, "executor_key", 0);
    assert_eq!(key["ok"], false);
    assert!(
        key["detail"]
            .as_str()
            .unwrap()
            .starts_with("the execution role could not read the executor key secret"),
        "{key}"
    );
    for name in ["resolve 127.0.0.1", "tls 127.0.0.1", "executor_version"] {
        let c = check(&doc, name, 0);
        assert_eq!(c["ok"], false);
        assert!(
            c["detail"].as_str().unwrap().starts_with("not checked: "),
            "{c}"
        );
    }
    let egress = check(&doc, "egress_ip", 0);
    assert_eq!(egress["ok"], false);
    assert!(
        egress["detail"].as_str().unwrap().contains(&format!(
            "internet gateway {} but tasks get no public IP",
            s.net.igw_id
        )),
        "{egress}"
    );

    // 4. A task that never stops is stopped when the wait runs out, and says so.
    *plays.lock().unwrap() = Plays::Hang;
    let before = proxy.ecs_requests().len();
    let hung = preflight(
        &proxy,
        &s,
        &s.family,
        &s.net.nat_subnet,
        &["--host", &tls_host, "--wait-secs", "2"],
    )
    .await;
    assert_eq!(hung.code, 1, "{hung:?}");
    assert!(
        hung.stdout
            .lines()
            .next()
            .unwrap()
            .starts_with("FAIL task: ")
            && hung.stdout.contains("did not stop within 2 s; stopped it"),
        "{}",
        hung.stdout
    );
    let stops: Vec<Value> = proxy.ecs_requests()[before..]
        .iter()
        .filter(|(op, _)| op == "StopTask")
        .map(|(_, body)| body.clone())
        .collect();
    assert_eq!(stops.len(), 1, "{stops:?}");
    let reason = stops[0]["reason"].as_str().unwrap();
    assert!(reason.len() <= MAX_STOP_REASON_CHARS && reason.contains("sandboxctl preflight"));
    let stopped = aws_sdk_ecs::Client::new(&sdk)
        .describe_tasks()
        .cluster(&s.cluster)
        .tasks(stops[0]["task"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(stopped.tasks()[0].last_status(), Some("STOPPED"));
    bridge.abort();
}
