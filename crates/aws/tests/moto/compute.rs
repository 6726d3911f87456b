//! EcsCompute on moto (the compute contracts, adoption by tags, the cluster substring
//! trap, the RunTask request) and on a stub (RunTask failures, not-yet-visible tasks).

use crate::support::{
    CONTAINER, EcsStub, default_network, ecs_fixture, endpoint, pin_ecs_tasks, sdk, unique,
};
use aws_sdk_ecs::types::TaskField;
use sandbox_aws::{EcsCompute, EcsConfig};
use sandbox_controller::contract::{compute_contract, compute_idempotency_contract};
use sandbox_controller::ports::{Compute, NO_DEADLINE, Started};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{
    DeploymentId, EnvironmentId, Generation, InstanceId, SessionId, idempotency_token,
};
use serde_json::{Value, json};

const ACCOUNT: &str = "123456789012";

/// A cluster with a task definition on moto, tasks pinned in their status.
async fn moto_compute(cluster: &str) -> (EcsCompute, aws_sdk_ecs::Client) {
    pin_ecs_tasks().await;
    let ecs = aws_sdk_ecs::Client::new(&sdk().await);
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
    (EcsCompute::new(ecs.clone(), config), ecs)
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
    let (c, _) = moto_compute(&format!("lc-{}", unique())).await;
    compute_contract(&c, &deployment()).await;
}

/// moto ignores `clientToken`; adoption by tags makes a repeated start idempotent anyway.
#[tokio::test]
async fn ecs_compute_passes_the_idempotency_contract() {
    let (c, _) = moto_compute(&format!("lc-{}", unique())).await;
    compute_idempotency_contract(&c, &deployment()).await;
}

/// A second start of the same environment and generation adopts the running task: one
/// RunTask, one task.
#[tokio::test]
async fn a_repeated_start_adopts_the_task_by_tags() {
    let cluster = format!("lc-{}", unique());
    let (c, ecs) = moto_compute(&cluster).await;
    let d = deployment();
    let s = spec(&format!("env_{}", unique()), 1);
    let first = started(&c, &s, &d).await;
    // A new handle (a restarted worker) remembers nothing and still adopts.
    let restarted = EcsCompute::new(ecs.clone(), c.config().clone());
    let again = started(&restarted, &s, &d).await;
    assert_eq!(again.instance_id, first.instance_id);
    assert_eq!(again.status, ComputeStatus::Running);
    let arns = ecs
        .list_tasks()
        .cluster(&cluster)
        .started_by(d.as_str())
        .send()
        .await
        .unwrap();
    assert_eq!(arns.task_arns().len(), 1, "{:?}", arns.task_arns());
    c.stop(&first.instance_id, "test", NO_DEADLINE)
        .await
        .unwrap();
}

/// What RunTask was asked for, read back from moto: FARGATE, startedBy, tags, the
/// environment overrides (REMOTE_URL unchanged, ENVIRONMENT_ID, and no key).
#[tokio::test]
async fn run_task_carries_tags_overrides_and_no_key() {
    let cluster = format!("lc-{}", unique());
    let (c, ecs) = moto_compute(&cluster).await;
    let d = deployment();
    let s = spec(&format!("env_{}", unique()), 7);
    let i = started(&c, &s, &d).await;
    let out = ecs
        .describe_tasks()
        .cluster(&cluster)
        .tasks(i.instance_id.as_str())
        .include(TaskField::Tags)
        .send()
        .await
        .unwrap();
    let task = &out.tasks()[0];
    assert_eq!(task.started_by(), Some(d.as_str()));
    assert_eq!(task.launch_type().map(|l| l.as_str()), Some("FARGATE"));
    let mut tags: Vec<(String, String)> = task
        .tags()
        .iter()
        .filter(|t| t.key().is_some_and(|k| k.starts_with("sandbox:")))
        .map(|t| (t.key().unwrap().to_owned(), t.value().unwrap().to_owned()))
        .collect();
    tags.sort();
    assert_eq!(
        tags,
        vec![
            ("sandbox:deployment".to_owned(), d.as_str().to_owned()),
            (
                "sandbox:environment".to_owned(),
                s.environment_id.as_str().to_owned()
            ),
            ("sandbox:generation".to_owned(), "7".to_owned()),
            (
                "sandbox:session".to_owned(),
                s.session_id.as_str().to_owned()
            ),
        ]
    );
    let overrides = task.overrides().unwrap().container_overrides();
    assert_eq!(overrides.len(), 1);
    assert_eq!(overrides[0].name(), Some(CONTAINER));
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
    c.stop(&i.instance_id, &"r".repeat(300), NO_DEADLINE)
        .await
        .unwrap();
    let stopped = ecs
        .describe_tasks()
        .cluster(&cluster)
        .tasks(i.instance_id.as_str())
        .send()
        .await
        .unwrap();
    assert_eq!(
        stopped.tasks()[0].stopped_reason().map(str::len),
        Some(255),
        "the stop reason is truncated to the ECS limit"
    );
}

/// moto's ListTasks cluster filter is a substring match (`lc-x` also lists `lc-xx`), and
/// its DescribeTasks looks in every cluster: the adapter keeps exact cluster matches only.
#[tokio::test]
async fn list_and_describe_never_cross_into_a_cluster_whose_name_contains_ours() {
    let u = unique();
    let (x, _) = moto_compute(&format!("lc-{u}-x")).await;
    let (xx, _) = moto_compute(&format!("lc-{u}-xx")).await;
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
    assert_eq!(r["startedBy"], d.as_str());
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
    // Adoption looked first: ListTasks by startedBy for RUNNING and STOPPED, nothing else.
    let lists = stub.calls_of("ListTasks");
    assert_eq!(lists.len(), 2);
    for (l, status) in lists.iter().zip(["RUNNING", "STOPPED"]) {
        assert_eq!(
            l,
            &json!({"cluster": "lc-stub", "startedBy": d.as_str(), "desiredStatus": status})
        );
    }
}

/// A task started a moment ago that DescribeTasks reports MISSING (ECS reads are eventually
/// consistent) is retried, never reported gone; an unknown task is `None` at once.
#[tokio::test]
async fn a_just_started_task_is_never_reported_gone() {
    endpoint();
    let d = deployment();
    let s = spec("env_late", 1);
    let task = stub_task(&s, &d);
    let stub = EcsStub::start(move |op, body, nth| match op {
        "ListTasks" => json!({"taskArns": []}),
        "RunTask" => json!({"tasks": [task.clone()], "failures": []}),
        // The new task is invisible for its first two reads, then visible.
        "DescribeTasks" if body["tasks"][0] == STUB_TASK && nth >= 2 => {
            json!({"tasks": [task.clone()], "failures": []})
        }
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
    let read = c
        .describe(&i.instance_id)
        .await
        .unwrap()
        .expect("visible after retries");
    assert_eq!(read.environment_id, s.environment_id);
    assert_eq!(read.generation, Generation(1));
    assert_eq!(stub.calls_of("DescribeTasks").len(), 3);

    let unknown = InstanceId::new(format!("{STUB_TASK}ff"));
    assert_eq!(c.describe(&unknown).await.unwrap(), None);
    assert_eq!(
        stub.calls_of("DescribeTasks").len(),
        4,
        "no retries for an unknown task"
    );
}

/// A task that stays invisible after the retries is a transient error, not `None`.
#[tokio::test]
async fn a_just_started_task_still_missing_is_a_transient_error() {
    endpoint();
    let d = deployment();
    let s = spec("env_lost", 1);
    let task = stub_task(&s, &d);
    let stub = EcsStub::start(move |op, body, _| match op {
        "ListTasks" => json!({"taskArns": []}),
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
    let err = c.describe(&i.instance_id).await.unwrap_err();
    assert!(err.retryable, "{err}");
    assert!(err.to_string().contains("not visible yet"), "{err}");
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
