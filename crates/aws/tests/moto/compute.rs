//! EcsCompute on moto (the compute contracts, the idempotent start by `clientToken`, the
//! exact request shapes, the guard against forbidden requests, the ECS lag right after
//! RunTask, the cluster substring trap) and on a stub (RunTask failures, MISSING, errors).
//!
//! moto runs behind `tests/moto/server.py` (RunTask `clientToken` honoured, ListTasks
//! pages of at most 100 and `desiredStatus` RUNNING by default, DescribeTasks `MISSING`),
//! and every ECS client here behind `sandbox_aws::strict_ecs::StrictEcs`, which refuses
//! what the ECS API reference forbids and records what is sent.

use crate::support::{
    CONTAINER, EcsStub, default_network, ecs_fixture, endpoint, pin_ecs_tasks, sdk, strict_ecs,
    unique,
};
use aws_sdk_ecs::error::SdkError;
use aws_sdk_ecs::types::{
    AssignPublicIp, AwsVpcConfiguration, DesiredStatus, LaunchType, NetworkConfiguration, Tag,
    TaskField,
};
use sandbox_aws::bootstrap::STUB_STATUS;
use sandbox_aws::strict_ecs::{ForbiddenRequest, StrictEcs};
use sandbox_aws::{EcsCompute, EcsConfig};
use sandbox_controller::contract::{compute_contract, compute_idempotency_contract};
use sandbox_controller::ports::{Compute, NO_DEADLINE, Started};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{
    DeploymentId, EnvironmentId, Generation, InstanceId, SessionId, environment_started_by,
    idempotency_token,
};
use serde_json::{Value, json};
use std::time::Duration;

const ACCOUNT: &str = "123456789012";

/// An [`EcsCompute`] on a fresh moto cluster, the interceptor on its client, and a second
/// strict client for the test's own reads (recorded apart from the adapter's).
struct Moto {
    compute: EcsCompute,
    guard: StrictEcs,
    ecs: aws_sdk_ecs::Client,
}

/// A cluster with a task definition on moto, tasks pinned in their status.
async fn moto_compute(cluster: &str) -> Moto {
    pin_ecs_tasks().await;
    let (ecs, _) = strict_ecs().await;
    let family = format!("executor-{}", unique());
    ecs_fixture(&ecs, cluster, &family).await;
    let (subnet, security_group) = default_network().await;
    let config = EcsConfig {
        cluster: cluster.to_owned(),
        task_definition: family,
        container_name: CONTAINER.to_owned(),
        subnets: vec![subnet],
        security_groups: vec![security_group],
        assign_public_ip: true,
    };
    let guard = StrictEcs::new();
    let compute = EcsCompute::new(guard.client(&sdk().await), config);
    Moto {
        compute,
        guard,
        ecs,
    }
}

impl Moto {
    /// Every task ARN in the cluster with `desiredStatus` = `status` (no `startedBy`, so
    /// `desiredStatus` is allowed), every page.
    async fn arns(&self, status: DesiredStatus) -> Vec<String> {
        let pages: Vec<_> = self
            .ecs
            .list_tasks()
            .cluster(&self.compute.config().cluster)
            .desired_status(status)
            .into_paginator()
            .send()
            .collect::<Result<Vec<_>, _>>()
            .await
            .unwrap();
        // moto's cluster filter is a substring match: keep this cluster's tasks only.
        let ours = format!(":task/{}/", self.compute.config().cluster);
        pages
            .iter()
            .flat_map(|p| p.task_arns().iter().cloned())
            .filter(|a| a.contains(&ours))
            .collect()
    }

    /// Every task of the cluster, live and stopped: the ground truth.
    async fn all_arns(&self) -> Vec<String> {
        let mut all = self.arns(DesiredStatus::Running).await;
        all.extend(self.arns(DesiredStatus::Stopped).await);
        all
    }
}

fn deployment() -> DeploymentId {
    DeploymentId::new(format!("d-{}", unique())).unwrap()
}

fn spec(env: &str, generation: u64) -> StartSpec {
    let environment_id = EnvironmentId::new(env);
    StartSpec {
        session_id: SessionId::new(format!("sess_{env}")),
        remote_url: format!("wss://agents.invalid/v1/environments/{env}/connect?t=a%2Fb&x=1"),
        workspace_directory: "/workspace".to_owned(),
        generation: Generation(generation),
        idempotency_token: idempotency_token(&environment_id, Generation(generation)),
        environment_id,
        previous: None,
        restore: None,
    }
}

async fn started(c: &EcsCompute, spec: &StartSpec, d: &DeploymentId) -> ComputeInstance {
    match c.start(spec, d, NO_DEADLINE).await.unwrap() {
        Started::Instance(i) => i,
        Started::Failed { reason } => panic!("start failed: {reason}"),
    }
}

#[tokio::test]
async fn ecs_compute_passes_the_contract() {
    let m = moto_compute(&format!("lc-{}", unique())).await;
    compute_contract(&m.compute, &deployment()).await;
    assert_eq!(m.guard.rejected(), vec![], "no forbidden request");
}

/// On the clientToken-honouring moto (`tests/moto/server.py`), as on ECS.
#[tokio::test]
async fn ecs_compute_passes_the_idempotency_contract() {
    let m = moto_compute(&format!("lc-{}", unique())).await;
    compute_idempotency_contract(&m.compute, &deployment()).await;
    assert_eq!(m.guard.rejected(), vec![], "no forbidden request");
}

/// A worker's RunTask reached ECS but its answer was lost (timeout, crash before the
/// record): the next holder starts the same spec again, with the same `clientToken`, and
/// ECS answers with the task the first call started ("If you use the same client token
/// with the same parameters, the same task is returned for 24 hours", ECS API reference,
/// RunTask `clientToken`). Two RunTask requests, identical to the byte; one task.
#[tokio::test]
async fn a_run_task_whose_answer_was_lost_is_replayed_by_client_token_and_yields_one_task() {
    let cluster = format!("lc-{}", unique());
    let m = moto_compute(&cluster).await;
    let d = deployment();
    let s = spec(&format!("env_{}", unique()), 1);
    let first = started(&m.compute, &s, &d).await;
    // A restarted worker: a new handle and a new client, nothing remembered.
    let guard = StrictEcs::new();
    let restarted = EcsCompute::new(guard.client(&sdk().await), m.compute.config().clone());
    let again = started(&restarted, &s, &d).await;
    assert_eq!(again.instance_id, first.instance_id);
    assert_eq!(again.status, ComputeStatus::Running);
    let runs: Vec<Value> = m
        .guard
        .calls_of("RunTask")
        .into_iter()
        .chain(guard.calls_of("RunTask"))
        .collect();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0], runs[1], "the replay is the same request");
    assert_eq!(runs[0]["clientToken"], s.idempotency_token.as_str());
    assert_eq!(
        guard.calls_of("ListTasks"),
        Vec::<Value>::new(),
        "no list before RunTask"
    );
    assert_eq!(
        m.all_arns().await,
        vec![first.instance_id.as_str().to_owned()]
    );
    m.compute
        .stop(&first.instance_id, "test", NO_DEADLINE)
        .await
        .unwrap();
}

/// The same `clientToken` with different parameters is a `ConflictException` naming the
/// task the token started (ECS API reference, RunTask errors and "Ensuring idempotency"),
/// and starts nothing: `start` adopts that task.
#[tokio::test]
async fn the_same_client_token_with_other_parameters_is_a_conflict_naming_the_first_task() {
    let cluster = format!("lc-{}", unique());
    let m = moto_compute(&cluster).await;
    let d = deployment();
    let s = spec(&format!("env_{}", unique()), 1);
    let first = started(&m.compute, &s, &d).await;
    let mut other = s.clone();
    other.remote_url.push_str("&changed=1");
    let adopted = started(&m.compute, &other, &d).await;
    assert_eq!(
        adopted.instance_id, first.instance_id,
        "the ConflictException's resourceIds name the task: adopted"
    );
    assert_eq!(adopted.environment_id, s.environment_id);
    assert_eq!(adopted.generation, s.generation);
    assert_eq!(
        m.all_arns().await,
        vec![first.instance_id.as_str().to_owned()]
    );
    m.compute
        .stop(&first.instance_id, "test", NO_DEADLINE)
        .await
        .unwrap();
}

/// The exact RunTask request `start` sends (read from the interceptor, as serialized), and
/// what moto echoes back: FARGATE, `startedBy`, the `clientToken`, the tags, the
/// environment overrides (REMOTE_URL unchanged, ENVIRONMENT_ID, and no key); the stop
/// reason truncated to the ECS limit.
#[tokio::test]
async fn run_task_sends_exactly_the_documented_request_with_tags_overrides_and_no_key() {
    let cluster = format!("lc-{}", unique());
    let m = moto_compute(&cluster).await;
    let d = deployment();
    let s = spec(&format!("env_{}", unique()), 7);
    let i = started(&m.compute, &s, &d).await;
    let config = m.compute.config();
    assert_eq!(
        m.guard
            .requests()
            .iter()
            .map(|r| r.operation.as_str())
            .collect::<Vec<_>>(),
        vec!["RunTask"],
        "start is one RunTask, nothing else"
    );
    assert_eq!(
        m.guard.calls_of("RunTask")[0],
        json!({
            "cluster": cluster,
            "taskDefinition": config.task_definition,
            "launchType": "FARGATE",
            "count": 1,
            "startedBy": environment_started_by(&d, &s.environment_id),
            "clientToken": s.idempotency_token,
            "networkConfiguration": {"awsvpcConfiguration": {
                "subnets": config.subnets,
                "securityGroups": config.security_groups,
                "assignPublicIp": "ENABLED"
            }},
            "overrides": {"containerOverrides": [{
                "name": CONTAINER,
                "environment": [
                    {"name": "REMOTE_URL", "value": s.remote_url},
                    {"name": "ENVIRONMENT_ID", "value": s.environment_id.as_str()}
                ]
            }]},
            "tags": [
                {"key": "sandbox:deployment", "value": d.as_str()},
                {"key": "sandbox:environment", "value": s.environment_id.as_str()},
                {"key": "sandbox:session", "value": s.session_id.as_str()},
                {"key": "sandbox:generation", "value": "7"}
            ],
            "propagateTags": "TASK_DEFINITION",
            "enableECSManagedTags": true
        })
    );
    let out = m
        .ecs
        .describe_tasks()
        .cluster(&cluster)
        .tasks(i.instance_id.as_str())
        .include(TaskField::Tags)
        .send()
        .await
        .unwrap();
    let task = &out.tasks()[0];
    assert_eq!(
        task.started_by(),
        Some(environment_started_by(&d, &s.environment_id).as_str())
    );
    assert_eq!(task.launch_type().map(|l| l.as_str()), Some("FARGATE"));
    let overrides = task.overrides().unwrap().container_overrides();
    let env: Vec<(&str, &str)> = overrides[0]
        .environment()
        .iter()
        .map(|kv| (kv.name().unwrap(), kv.value().unwrap()))
        .collect();
    assert_eq!(
        env,
        vec![
            ("REMOTE_URL", s.remote_url.as_str()),
            ("ENVIRONMENT_ID", s.environment_id.as_str())
        ]
    );
    assert!(!out_json_mentions_key(&m.guard));
    m.compute
        .stop(&i.instance_id, &"r".repeat(300), NO_DEADLINE)
        .await
        .unwrap();
    assert_eq!(
        m.guard.calls_of("StopTask"),
        vec![
            json!({"cluster": cluster, "task": i.instance_id.as_str(), "reason": "r".repeat(255)})
        ],
        "the stop reason is truncated to the ECS limit of 255 characters"
    );
    let stopped = m
        .ecs
        .describe_tasks()
        .cluster(&cluster)
        .tasks(i.instance_id.as_str())
        .send()
        .await
        .unwrap();
    assert_eq!(stopped.tasks()[0].stopped_reason().map(str::len), Some(255));
}

/// Whether any request the adapter sent names the executor key.
fn out_json_mentions_key(guard: &StrictEcs) -> bool {
    guard
        .requests()
        .iter()
        .any(|r| r.body.to_string().contains("CODEX_API_KEY"))
}

/// Starts `n` tasks of `d` straight through RunTask (`count` ≤ 10 per call, the API's
/// limit), tagged like the adapter's, environment `env_{i}`, generation 1.
async fn run_tasks(m: &Moto, d: &DeploymentId, n: usize) {
    let config = m.compute.config();
    let vpc = AwsVpcConfiguration::builder()
        .set_subnets(Some(config.subnets.clone()))
        .set_security_groups(Some(config.security_groups.clone()))
        .assign_public_ip(AssignPublicIp::Enabled)
        .build()
        .unwrap();
    let mut left = n;
    let mut batch = 0;
    while left > 0 {
        let count = left.min(10);
        let env = format!("env_bulk_{batch}");
        m.ecs
            .run_task()
            .cluster(&config.cluster)
            .task_definition(&config.task_definition)
            .launch_type(LaunchType::Fargate)
            .count(i32::try_from(count).unwrap())
            .started_by(d.as_str())
            .network_configuration(
                NetworkConfiguration::builder()
                    .awsvpc_configuration(vpc.clone())
                    .build(),
            )
            .tags(
                Tag::builder()
                    .key("sandbox:deployment")
                    .value(d.as_str())
                    .build(),
            )
            .tags(Tag::builder().key("sandbox:environment").value(env).build())
            .tags(Tag::builder().key("sandbox:generation").value("1").build())
            .send()
            .await
            .unwrap();
        left -= count;
        batch += 1;
    }
}

/// The sweep's inventory read (`list`) on a deployment of 105 live tasks and 1 stopped
/// one: ListTasks with `cluster`, the task definition's `family` and `desiredStatus`
/// `RUNNING` and nothing else (`family` combines with `desiredStatus`; `startedBy`, which
/// must be the only filter, is per environment: ECS API reference, ListTasks), every page
/// followed by `nextToken` (at most 100 ARNs a page), then DescribeTasks with tags for at
/// most 100 tasks a call (DescribeTasks `tasks`). Exactly those requests, in that order;
/// the 105 live tasks come back, the stopped one does not.
#[tokio::test]
async fn list_asks_by_family_and_running_follows_every_page_and_describes_by_100() {
    let cluster = format!("lc-{}", unique());
    let m = moto_compute(&cluster).await;
    let d = deployment();
    run_tasks(&m, &d, 106).await;
    let live = m.arns(DesiredStatus::Running).await;
    assert_eq!(live.len(), 106);
    m.compute
        .stop(&InstanceId::new(&live[105]), "test", NO_DEADLINE)
        .await
        .unwrap();
    m.guard.clear();

    let listed = m.compute.list(&d).await.unwrap();
    let mut got: Vec<&str> = listed.iter().map(|i| i.instance_id.as_str()).collect();
    got.sort_unstable();
    let mut want: Vec<&str> = live[..105].iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(got, want);
    assert!(listed.iter().all(|i| i.status == ComputeStatus::Running));

    let requests = m.guard.requests();
    let ops: Vec<&str> = requests.iter().map(|r| r.operation.as_str()).collect();
    assert_eq!(
        ops,
        vec!["ListTasks", "ListTasks", "DescribeTasks", "DescribeTasks"]
    );
    let td = m.compute.config().task_definition.clone();
    let family = td.rsplit('/').next().unwrap().split(':').next().unwrap();
    assert_eq!(
        requests[0].body,
        json!({"cluster": cluster, "family": family, "desiredStatus": "RUNNING"}),
        "the first page: cluster, family and RUNNING, nothing else"
    );
    let second = requests[1].body.as_object().unwrap();
    let mut keys: Vec<&str> = second.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        vec!["cluster", "desiredStatus", "family", "nextToken"]
    );
    assert_eq!(second["cluster"], cluster.as_str());
    assert_eq!(second["family"], family);
    let chunks: Vec<usize> = requests[2..]
        .iter()
        .map(|r| {
            assert_eq!(r.body["cluster"], cluster.as_str());
            assert_eq!(r.body["include"], json!(["TAGS"]));
            r.body["tasks"].as_array().unwrap().len()
        })
        .collect();
    assert_eq!(chunks, vec![100, 5]);
    assert_eq!(m.guard.rejected(), vec![]);
    for arn in &live[..105] {
        m.compute
            .stop(&InstanceId::new(arn), "test", NO_DEADLINE)
            .await
            .unwrap();
    }
}

/// The source of an SDK error, as the guard's [`ForbiddenRequest`].
fn forbidden<E: std::error::Error + 'static, R: std::fmt::Debug>(
    err: SdkError<E, R>,
) -> ForbiddenRequest {
    assert!(
        matches!(err, SdkError::ConstructionFailure(_)),
        "refused before it was built: {err:?}"
    );
    let mut source = std::error::Error::source(&err);
    while let Some(e) = source {
        if let Some(refused) = e.downcast_ref::<ForbiddenRequest>() {
            return refused.clone();
        }
        source = e.source();
    }
    panic!("not the guard's refusal: {err:?}")
}

/// The guard itself: each request shape the ECS API reference forbids fails before it is
/// sent (nothing recorded, the refusal kept), while the allowed neighbours go through.
#[tokio::test]
async fn the_guard_refuses_every_request_shape_the_ecs_api_reference_forbids() {
    let cluster = format!("lc-{}", unique());
    moto_compute(&cluster).await; // the cluster the allowed requests below read
    let guard = StrictEcs::new();
    let ecs_guarded = guard.client(&sdk().await);
    let d = deployment();

    // ListTasks: startedBy with any other filter.
    for (other, request) in [
        (
            "desiredStatus",
            ecs_guarded
                .list_tasks()
                .cluster(&cluster)
                .started_by(d.as_str())
                .desired_status(DesiredStatus::Running),
        ),
        (
            "family",
            ecs_guarded
                .list_tasks()
                .cluster(&cluster)
                .started_by(d.as_str())
                .family("executor"),
        ),
        (
            "serviceName",
            ecs_guarded
                .list_tasks()
                .started_by(d.as_str())
                .service_name("svc"),
        ),
        (
            "containerInstance",
            ecs_guarded
                .list_tasks()
                .started_by(d.as_str())
                .container_instance("ci"),
        ),
        (
            "launchType",
            ecs_guarded
                .list_tasks()
                .started_by(d.as_str())
                .launch_type(LaunchType::Fargate),
        ),
    ] {
        let refused = forbidden(request.send().await.unwrap_err());
        assert_eq!(refused.operation, "ListTasks");
        assert!(refused.rule.contains(other), "{refused}");
        assert!(
            refused
                .to_string()
                .contains("startedBy must be the only filter"),
            "{refused}"
        );
    }
    // DescribeTasks: more than 100 tasks.
    let ids: Vec<String> = (0..101).map(|i| format!("t{i}")).collect();
    let refused = forbidden(
        ecs_guarded
            .describe_tasks()
            .cluster(&cluster)
            .set_tasks(Some(ids.clone()))
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.operation, "DescribeTasks");
    // RunTask: clientToken, startedBy and tag limits.
    let run = || {
        ecs_guarded
            .run_task()
            .cluster(&cluster)
            .task_definition("executor")
            .launch_type(LaunchType::Fargate)
    };
    let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
    for (what, request) in [
        ("clientToken", run().client_token("x".repeat(65))),
        ("clientToken", run().client_token("token-with-é")),
        ("clientToken", run().client_token("has space")),
        ("startedBy", run().started_by("s".repeat(37))),
        ("startedBy", run().started_by("bad:char")),
        (
            "tags",
            run().set_tags(Some((0..51).map(|i| tag(&format!("k{i}"), "v")).collect())),
        ),
        ("tag keys", run().tags(tag(&"k".repeat(129), "v"))),
        ("tag values", run().tags(tag("k", &"v".repeat(257)))),
    ] {
        let refused = forbidden(request.send().await.unwrap_err());
        assert_eq!(refused.operation, "RunTask");
        assert!(refused.rule.contains(what), "{what}: {refused}");
    }
    // StopTask: a reason over 255 characters.
    let refused = forbidden(
        ecs_guarded
            .stop_task()
            .cluster(&cluster)
            .task("t")
            .reason("r".repeat(256))
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.operation, "StopTask");
    assert_eq!(guard.rejected().len(), 15);
    assert_eq!(guard.requests(), vec![], "nothing forbidden was sent");

    // The allowed neighbours pass the guard and reach moto.
    ecs_guarded
        .list_tasks()
        .cluster(&cluster)
        .started_by(d.as_str())
        .send()
        .await
        .unwrap();
    ecs_guarded
        .list_tasks()
        .cluster(&cluster)
        .desired_status(DesiredStatus::Stopped)
        .send()
        .await
        .unwrap();
    let out = ecs_guarded
        .describe_tasks()
        .cluster(&cluster)
        .set_tasks(Some(ids[..100].to_vec()))
        .send()
        .await
        .unwrap();
    assert_eq!(out.failures().len(), 100, "unknown tasks are MISSING");
    assert!(out.failures().iter().all(|f| f.reason() == Some("MISSING")));
    assert_eq!(
        guard
            .requests()
            .iter()
            .map(|r| r.operation.as_str())
            .collect::<Vec<_>>(),
        vec!["ListTasks", "ListTasks", "DescribeTasks"]
    );
    assert_eq!(guard.rejected().len(), 15);
}

/// A task a RunTask just started that ECS does not show yet ("The Amazon ECS API follows
/// an eventual consistency model", ECS API reference, RunTask): `describe` answers `None`
/// at once — one DescribeTasks, no retry — and `list` leaves it out; once visible, both
/// see it. Deciding what `None` means is `decide()`'s job (the record's
/// `instance_recorded_at`), not the adapter's.
#[tokio::test]
async fn a_task_not_visible_yet_is_none_at_once_and_unlisted_until_it_shows() {
    let cluster = format!("lc-{}", unique());
    let m = moto_compute(&cluster).await;
    let d = deployment();
    m.guard.hide_new_tasks_for(Duration::from_secs(600));
    let i = started(&m.compute, &spec(&format!("env_{}", unique()), 1), &d).await;
    assert_eq!(m.guard.hidden(), vec![i.instance_id.as_str().to_owned()]);
    m.guard.clear();
    assert_eq!(m.compute.describe(&i.instance_id).await.unwrap(), None);
    assert_eq!(
        m.guard.calls_of("DescribeTasks"),
        vec![json!({"cluster": cluster, "tasks": [i.instance_id.as_str()], "include": ["TAGS"]})],
        "one DescribeTasks, no retry"
    );
    assert_eq!(m.compute.list(&d).await.unwrap(), vec![]);
    assert_eq!(m.all_arns().await, vec![i.instance_id.as_str().to_owned()]);

    m.guard.stop_hiding();
    let seen = m.compute.describe(&i.instance_id).await.unwrap().unwrap();
    assert_eq!(seen.status, ComputeStatus::Running);
    let listed = m.compute.list(&d).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].instance_id, i.instance_id);
    m.compute
        .stop(&i.instance_id, "test", NO_DEADLINE)
        .await
        .unwrap();
}

/// A stopped task is not live: `list` (ListTasks `startedBy` alone, so `desiredStatus`
/// RUNNING) leaves it out, while `describe` by ARN still reads it back `Stopped`.
#[tokio::test]
async fn list_is_live_tasks_only_and_a_stopped_task_is_read_by_its_arn() {
    let cluster = format!("lc-{}", unique());
    let m = moto_compute(&cluster).await;
    let d = deployment();
    let i = started(&m.compute, &spec(&format!("env_{}", unique()), 1), &d).await;
    m.compute
        .stop(&i.instance_id, "test", NO_DEADLINE)
        .await
        .unwrap();
    assert_eq!(m.compute.list(&d).await.unwrap(), vec![]);
    let read = m.compute.describe(&i.instance_id).await.unwrap().unwrap();
    assert_eq!(read.status, ComputeStatus::Stopped);
    assert_eq!(read.generation, Generation(1));
}

/// moto's ListTasks cluster filter is a substring match (`lc-x` also lists `lc-xx`), and
/// its DescribeTasks looks in every cluster: the adapter keeps exact cluster matches only.
#[tokio::test]
async fn list_and_describe_never_cross_into_a_cluster_whose_name_contains_ours() {
    let u = unique();
    let x = moto_compute(&format!("lc-{u}-x")).await.compute;
    let xx = moto_compute(&format!("lc-{u}-xx")).await.compute;
    let d = deployment();
    let in_x = started(&x, &spec(&format!("env_{u}_x"), 1), &d).await;
    let in_xx = started(&xx, &spec(&format!("env_{u}_xx"), 1), &d).await;
    let listed: Vec<InstanceId> = x
        .list(&d)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.instance_id)
        .collect();
    assert_eq!(listed, vec![in_x.instance_id.clone()]);
    let listed: Vec<InstanceId> = xx
        .list(&d)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.instance_id)
        .collect();
    assert_eq!(listed, vec![in_xx.instance_id.clone()]);
    assert_eq!(x.describe(&in_xx.instance_id).await.unwrap(), None);
    x.stop(&in_x.instance_id, "test", NO_DEADLINE)
        .await
        .unwrap();
    xx.stop(&in_xx.instance_id, "test", NO_DEADLINE)
        .await
        .unwrap();
}

fn stub_config() -> EcsConfig {
    EcsConfig {
        cluster: "lc-stub".to_owned(),
        task_definition: "executor:3".to_owned(),
        container_name: CONTAINER.to_owned(),
        subnets: vec!["subnet-1".to_owned(), "subnet-2".to_owned()],
        security_groups: vec!["sg-1".to_owned()],
        assign_public_ip: false,
    }
}

const STUB_TASK: &str = "arn:aws:ecs:us-east-1:123456789012:task/lc-stub/0123456789abcdef";

fn stub_task(s: &StartSpec, d: &DeploymentId) -> Value {
    json!({
        "taskArn": STUB_TASK,
        "clusterArn": format!("arn:aws:ecs:us-east-1:{ACCOUNT}:cluster/lc-stub"),
        "lastStatus": "PROVISIONING",
        "desiredStatus": "RUNNING",
        "createdAt": 1_790_000_000.5,
        "tags": [
            {"key": "sandbox:deployment", "value": d.as_str()},
            {"key": "sandbox:environment", "value": s.environment_id.as_str()},
            {"key": "sandbox:session", "value": s.session_id.as_str()},
            {"key": "sandbox:generation", "value": s.generation.0.to_string()},
        ]
    })
}

/// RunTask answering 200 with `failures` and no task (moto never does) is
/// `Started::Failed` with the reason; the request has the documented shape.
#[tokio::test]
async fn run_task_failures_with_status_200_are_started_failed() {
    endpoint();
    let stub = EcsStub::start(|op, _, _| match op {
        "ListTasks" => json!({"taskArns": []}),
        "RunTask" => json!({
            "tasks": [],
            "failures": [{
                "arn": "arn:aws:ecs:us-east-1:123456789012:cluster/lc-stub",
                "reason": "Capacity is unavailable at this time. Please try again later or in a different availability zone",
                "detail": "RESOURCE:FARGATE"
            }]
        }),
        _ => json!({}),
    })
    .await;
    let c = EcsCompute::new(stub.client().await, stub_config());
    let d = deployment();
    let s = spec("env_stub", 2);
    let Started::Failed { reason } = c.start(&s, &d, NO_DEADLINE).await.unwrap() else {
        panic!("expected Started::Failed");
    };
    assert!(reason.contains("Capacity is unavailable"), "{reason}");
    assert!(reason.contains("RESOURCE:FARGATE"), "{reason}");

    let runs = stub.calls_of("RunTask");
    assert_eq!(runs.len(), 1);
    let r = &runs[0];
    assert_eq!(r["cluster"], "lc-stub");
    assert_eq!(r["taskDefinition"], "executor:3");
    assert_eq!(r["launchType"], "FARGATE");
    assert_eq!(r["count"], 1);
    assert_eq!(
        r["startedBy"],
        environment_started_by(&d, &s.environment_id).as_str()
    );
    assert_eq!(r["clientToken"], s.idempotency_token.as_str());
    assert_eq!(r["propagateTags"], "TASK_DEFINITION");
    assert_eq!(r["enableECSManagedTags"], true);
    assert_eq!(
        r["networkConfiguration"],
        json!({"awsvpcConfiguration": {
            "subnets": ["subnet-1", "subnet-2"],
            "securityGroups": ["sg-1"],
            "assignPublicIp": "DISABLED"
        }})
    );
    assert_eq!(
        r["overrides"],
        json!({"containerOverrides": [{
            "name": CONTAINER,
            "environment": [
                {"name": "REMOTE_URL", "value": s.remote_url},
                {"name": "ENVIRONMENT_ID", "value": "env_stub"}
            ]
        }]})
    );
    assert!(!r.to_string().contains("CODEX_API_KEY"));
    assert_eq!(
        stub.calls.lock().unwrap().len(),
        1,
        "start is one RunTask: no list first (replaying the clientToken finds a lost start)"
    );
}

/// An ECS JSON 1.1 error answer of the stub: `status`, `__type` = `code`.
fn ecs_error(status: u16, code: &str, message: &str) -> Value {
    json!({STUB_STATUS: status, "__type": code, "message": message})
}

/// A `RunTask` 4xx means ECS refused the request and no task started (ECS API reference,
/// RunTask "Errors"): `ClientException`, `InvalidParameterException`,
/// `AccessDeniedException`, `ClusterNotFoundException` and
/// `PlatformTaskDefinitionIncompatibilityException` are each `Started::Failed` naming the
/// code and message (counted in `start_failures` and backed off by the controller), after
/// exactly one request (no SDK retry of a client error), never "outcome unknown".
#[tokio::test]
async fn a_permanent_run_task_error_is_a_failed_start() {
    endpoint();
    for (status, code) in [
        (400, "ClientException"),
        (400, "InvalidParameterException"),
        (400, "AccessDeniedException"),
        (400, "ClusterNotFoundException"),
        (400, "PlatformTaskDefinitionIncompatibilityException"),
    ] {
        let stub = EcsStub::start(move |op, _, _| match op {
            "RunTask" => ecs_error(status, code, "refused by the stub"),
            _ => json!({}),
        })
        .await;
        let c = EcsCompute::new(stub.client().await, stub_config());
        let got = c
            .start(&spec("env_refused", 1), &deployment(), NO_DEADLINE)
            .await
            .unwrap_or_else(|e| panic!("{code}: a failed start, not an error: {e}"));
        let Started::Failed { reason } = got else {
            panic!("{code}: expected Started::Failed, got {got:?}");
        };
        assert!(reason.contains(code), "{reason}");
        assert!(reason.contains("refused by the stub"), "{reason}");
        assert_eq!(stub.calls_of("RunTask").len(), 1, "{code}: not retried");
    }
}

/// Throttling and 5xx on `RunTask` are "outcome unknown": a transient error after the
/// SDK's own retries (standard mode, jittered), never a failed start (the task may exist;
/// the next holder replays the `clientToken`). A `ConflictException` without `resourceIds`
/// is outcome unknown too.
#[tokio::test]
async fn throttling_and_server_errors_on_run_task_are_outcome_unknown() {
    endpoint();
    for (status, code) in [
        (400, "ThrottlingException"),
        (500, "ServerException"),
        (503, "ServiceUnavailable"),
        (400, "ConflictException"),
    ] {
        let stub = EcsStub::start(move |op, _, _| match op {
            "RunTask" => ecs_error(status, code, "try later"),
            _ => json!({}),
        })
        .await;
        let c = EcsCompute::new(stub.client().await, stub_config());
        let err = c
            .start(&spec("env_unknown", 1), &deployment(), NO_DEADLINE)
            .await
            .expect_err(code);
        assert!(err.retryable, "{code}: {err}");
        assert!(err.to_string().contains(code), "{code}: {err}");
    }
}

/// A `ConflictException` naming the task (`resourceIds`) is that task, adopted: read by
/// ARN when visible, else recorded `PROVISIONING` from the ARN and the spec.
#[tokio::test]
async fn a_conflict_exception_adopts_the_task_its_resource_ids_name() {
    endpoint();
    let d = deployment();
    let s = spec("env_conflict", 3);
    let task = stub_task(&s, &d);
    let stub = EcsStub::start(move |op, body, nth| match op {
        "RunTask" => json!({
            STUB_STATUS: 400, "__type": "ConflictException",
            "message": "The clientToken is already in use", "resourceIds": [STUB_TASK]
        }),
        "DescribeTasks" if nth == 0 => json!({
            "tasks": [], "failures": [{"arn": body["tasks"][0].clone(), "reason": "MISSING"}]
        }),
        "DescribeTasks" => json!({"tasks": [task.clone()], "failures": []}),
        _ => json!({}),
    })
    .await;
    let c = EcsCompute::new(stub.client().await, stub_config());
    let not_visible = started(&c, &s, &d).await;
    assert_eq!(not_visible.instance_id.as_str(), STUB_TASK);
    assert_eq!(not_visible.status, ComputeStatus::Provisioning);
    assert_eq!(not_visible.generation, s.generation);
    let visible = started(&c, &s, &d).await;
    assert_eq!(visible.instance_id.as_str(), STUB_TASK);
    assert_eq!(visible.started_at, Some(1_790_000_000));
    assert_eq!(stub.calls_of("RunTask").len(), 2);
    assert_eq!(stub.calls_of("DescribeTasks").len(), 2);
}

/// DescribeTasks answering `MISSING` for a task started a moment ago (ECS reads are
/// eventually consistent) is `None` at once: one DescribeTasks, no retry, no memory of the
/// start; `decide()` tells "not visible yet" from "gone" with the record's
/// `instance_recorded_at`.
#[tokio::test]
async fn describe_answers_missing_as_none_at_once_even_right_after_the_start() {
    endpoint();
    let d = deployment();
    let s = spec("env_late", 1);
    let task = stub_task(&s, &d);
    let stub = EcsStub::start(move |op, body, _| match op {
        "RunTask" => json!({"tasks": [task.clone()], "failures": []}),
        "DescribeTasks" => json!({
            "tasks": [],
            "failures": [{"arn": body["tasks"][0].clone(), "reason": "MISSING"}]
        }),
        _ => json!({}),
    })
    .await;
    let c = EcsCompute::new(stub.client().await, stub_config());
    let i = started(&c, &s, &d).await;
    assert_eq!(i.instance_id.as_str(), STUB_TASK);
    assert_eq!(i.status, ComputeStatus::Provisioning);
    assert_eq!(i.started_at, Some(1_790_000_000));
    assert_eq!(c.describe(&i.instance_id).await.unwrap(), None);
    assert_eq!(
        stub.calls_of("DescribeTasks"),
        vec![json!({"cluster": "lc-stub", "tasks": [STUB_TASK], "include": ["TAGS"]})],
        "one DescribeTasks, no retry"
    );
}

/// A DescribeTasks failure other than `MISSING` is missing evidence: a transient error,
/// never `None`.
#[tokio::test]
async fn a_describe_failure_other_than_missing_is_a_transient_error() {
    endpoint();
    let stub = EcsStub::start(move |op, body, _| match op {
        "DescribeTasks" => json!({
            "tasks": [],
            "failures": [{"arn": body["tasks"][0].clone(), "reason": "ACCESS_DENIED"}]
        }),
        _ => json!({}),
    })
    .await;
    let c = EcsCompute::new(stub.client().await, stub_config());
    let err = c.describe(&InstanceId::new(STUB_TASK)).await.unwrap_err();
    assert!(err.retryable, "{err}");
    assert!(err.to_string().contains("ACCESS_DENIED"), "{err}");
}

/// `describe_many` asks at most 100 tasks per DescribeTasks (the API's limit), every
/// chunk, and leaves `MISSING` ones out.
#[tokio::test]
async fn describe_many_asks_at_most_100_tasks_per_call_and_leaves_missing_ones_out() {
    endpoint();
    let d = deployment();
    let s = spec("env_many", 1);
    let task = stub_task(&s, &d);
    let stub = EcsStub::start(move |op, body, _| match op {
        "DescribeTasks" => {
            let asked = body["tasks"].as_array().cloned().unwrap_or_default();
            let (known, missing): (Vec<Value>, Vec<Value>) =
                asked.into_iter().partition(|a| a == STUB_TASK);
            json!({
                "tasks": known.iter().map(|_| task.clone()).collect::<Vec<_>>(),
                "failures": missing
                    .into_iter()
                    .map(|a| json!({"arn": a, "reason": "MISSING"}))
                    .collect::<Vec<_>>()
            })
        }
        _ => json!({}),
    })
    .await;
    let c = EcsCompute::new(stub.client().await, stub_config());
    let mut ids: Vec<InstanceId> = (0..250)
        .map(|n| InstanceId::new(format!("{STUB_TASK}{n:03}")))
        .collect();
    ids[170] = InstanceId::new(STUB_TASK);
    let read = c.describe_many(&ids).await.unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].instance_id.as_str(), STUB_TASK);
    let sizes: Vec<usize> = stub
        .calls_of("DescribeTasks")
        .iter()
        .map(|b| b["tasks"].as_array().unwrap().len())
        .collect();
    assert_eq!(sizes, vec![100, 100, 50]);
}

/// ECS throttling is transient, a validation error permanent.
#[tokio::test]
async fn throttling_is_transient_and_validation_permanent() {
    endpoint();
    let throttled = axum_error_stub(400, "ThrottlingException", "Rate exceeded").await;
    let c = EcsCompute::new(throttled.client().await, stub_config());
    let err = c
        .stop(&InstanceId::new(STUB_TASK), "x", NO_DEADLINE)
        .await
        .unwrap_err();
    assert!(err.retryable, "{err}");
    let invalid = axum_error_stub(
        400,
        "InvalidParameterException",
        "The referenced task was not found.",
    )
    .await;
    let c = EcsCompute::new(invalid.client().await, stub_config());
    let err = c
        .stop(&InstanceId::new(STUB_TASK), "x", NO_DEADLINE)
        .await
        .unwrap_err();
    assert!(!err.retryable, "{err}");
    assert!(
        err.to_string().contains("InvalidParameterException"),
        "{err}"
    );
}

/// A stub that answers every call with an ECS JSON error.
async fn axum_error_stub(status: u16, code: &'static str, message: &'static str) -> ErrorStub {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let app = axum::Router::new().route(
        "/",
        axum::routing::post(move || async move {
            (
                StatusCode::from_u16(status).unwrap(),
                [("content-type", "application/x-amz-json-1.1")],
                json!({"__type": code, "message": message}).to_string(),
            )
                .into_response()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    ErrorStub { url }
}

struct ErrorStub {
    url: String,
}

impl ErrorStub {
    async fn client(&self) -> aws_sdk_ecs::Client {
        aws_sdk_ecs::Client::new(&sandbox_aws::load_sdk_config(Some(&self.url)).await)
    }
}

/// One environment's live tasks (`find`, what a worker reads after an unclean lock): one
/// ListTasks with `cluster` and that environment's `startedBy` alone ("it must be the only
/// filter that you use", ECS API reference, ListTasks) and one DescribeTasks, whatever
/// else the deployment runs; another environment's task is not returned.
#[tokio::test]
async fn find_reads_one_environment_by_its_started_by_alone() {
    let cluster = format!("lc-{}", unique());
    let m = moto_compute(&cluster).await;
    let d = deployment();
    let mine = spec(&format!("env_{}", unique()), 1);
    let other = spec(&format!("env_{}", unique()), 1);
    let a = started(&m.compute, &mine, &d).await;
    let b = started(&m.compute, &other, &d).await;
    m.guard.clear();
    let found = m.compute.find(&d, &mine.environment_id).await.unwrap();
    assert_eq!(
        found.iter().map(|i| &i.instance_id).collect::<Vec<_>>(),
        vec![&a.instance_id]
    );
    let requests = m.guard.requests();
    let ops: Vec<&str> = requests.iter().map(|r| r.operation.as_str()).collect();
    assert_eq!(ops, vec!["ListTasks", "DescribeTasks"]);
    assert_eq!(
        requests[0].body,
        json!({"cluster": cluster, "startedBy": environment_started_by(&d, &mine.environment_id)})
    );
    assert_eq!(m.guard.rejected(), vec![]);
    for i in [a, b] {
        m.compute
            .stop(&i.instance_id, "test", NO_DEADLINE)
            .await
            .unwrap();
    }
}
