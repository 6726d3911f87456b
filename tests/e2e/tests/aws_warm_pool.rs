//! The warm pool on the AWS adapters over moto, end to end (docs/WARM_POOL.md): the refill
//! starts a member (`RunTask` with the pool's `startedBy`, its item written first in the
//! pool table), a self-hosted session's connection request reaches the worker through the
//! webhook and the events queue, and the worker claims that member instead of starting a
//! task: one DynamoDB transaction fenced by the environment's lock, the member item
//! `assigned` with the environment, session and `remote_url` its forwarder reads
//! (`infra/executor/await-assignment.mjs`), the task tagged with the environment. moto runs
//! no container, so the harness's executor bridge connects the claimed task's environment
//! to the simulator as the member's forwarder would.

use aws_sdk_dynamodb::types::AttributeValue;
use sandbox_controller::ports::{Compute as _, Registry as _};
use sandbox_core::ids::EnvironmentId;
use sandbox_core::session::SessionStatus;
use sandbox_e2e::aws_stack::{AwsHarness, AwsOptions};
use sandbox_e2e::{LifecycleHarness as _, Options, wait_until};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_session_executor_comes_from_the_pool() {
    let h = AwsHarness::start(AwsOptions {
        common: Options {
            pool_size: 1,
            ..Options::default()
        },
        ..AwsOptions::default()
    })
    .await
    .unwrap();
    let c = h.controller();
    let d = c.config.deployment.clone();
    wait_until(
        "the refill starts a member",
        Duration::from_secs(30),
        || {
            let d = d.clone();
            async move { Ok(c.compute.list_pool(&d).await?.len() == 1) }
        },
    )
    .await
    .unwrap();
    let member = c.compute.list_pool(&d).await.unwrap()[0].clone();
    let run_tasks_before = h.resources.ecs_guard.calls_of("RunTask").len();

    let (s, env) = h.session_with_input().await.unwrap();
    h.client()
        .wait_for_status(s.id.as_str(), SessionStatus::Idle, Duration::from_secs(60))
        .await
        .unwrap();

    // The environment's task is the member's: the only task it ever had.
    let tasks = h.tasks_of(&env).await.unwrap();
    assert_eq!(
        tasks.iter().map(|t| &t.instance_id).collect::<Vec<_>>(),
        vec![&member.instance_id],
        "the session's executor is the claimed member"
    );
    let record = c
        .registry
        .get(&EnvironmentId::new(env.clone()).effect_key())
        .await
        .unwrap()
        .expect("a record");
    assert!(record.instance_from_pool, "recorded as warm: {record:?}");
    assert_eq!(
        record.instance.as_ref().map(|i| &i.instance_id),
        Some(&member.instance_id)
    );
    // No RunTask for the session: every RunTask since is the refill's (the pool's
    // `startedBy`), replacing the claimed member.
    let runs = h.resources.ecs_guard.calls_of("RunTask");
    let pool_started_by = sandbox_aws::pool_started_by(&d);
    for run in &runs[run_tasks_before..] {
        assert_eq!(
            run["startedBy"], pool_started_by,
            "a RunTask that is not the refill's: {run}"
        );
    }

    // The member item is claimed, with the assignment its forwarder polls for.
    let pool = h.resources.pool.as_ref().expect("the pool is on");
    let task_id = member.instance_id.as_str().rsplit('/').next().unwrap();
    let item = aws_sdk_dynamodb::Client::new(&h.resources.sdk)
        .get_item()
        .table_name(&pool.table_name)
        .key(
            "pk",
            AttributeValue::S(format!("{}:{task_id}", pool.task_role_id)),
        )
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item()
        .cloned()
        .expect("the member's item");
    let text = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
    assert_eq!(text("state").as_deref(), Some("assigned"), "{item:?}");
    assert_eq!(text("environment_id").as_deref(), Some(env.as_str()));
    assert_eq!(text("session_id").as_deref(), Some(s.id.as_str()));
    assert_eq!(
        text("remote_url"),
        s.self_hosted().map(|e| e.remote_url.clone()),
        "the session's remote_url, for the member's forwarder"
    );
    assert!(
        !item.contains_key("idle_deployment"),
        "no longer claimable: {item:?}"
    );

    // The refill replaces the claimed member.
    wait_until("the pool is refilled", Duration::from_secs(30), || {
        let d = d.clone();
        let claimed = member.instance_id.clone();
        async move {
            let p = c.compute.list_pool(&d).await?;
            Ok(p.len() == 1 && p[0].instance_id != claimed)
        }
    })
    .await
    .unwrap();
    h.shutdown().await.unwrap();
}
