//! The rows of lifecycle-cases.md marked E, end to end on the AWS adapters over moto:
//! simulator webhooks (signed, at least once) → intake → SQS FIFO events queue → workers →
//! decide → ECS Fargate tasks, the DynamoDB registry, the SQS timers queue and the
//! sweeper. moto runs no containers: the harness's executor bridge connects RUNNING tasks
//! to the simulator and disconnects STOPPED ones (see `sandbox_e2e::aws_stack`).
//!
//! Run with `tests/moto/run.sh cargo nextest run -p sandbox-e2e -E 'test(aws)'`.

use sandbox_controller::ports::{Compute as _, NO_DEADLINE, ReceiptKind, Registry as _};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{EnvironmentId, Generation, SessionId, idempotency_token};
use sandbox_core::record::RecordStatus;
use sandbox_core::session::{Session, SessionStatus};
use sandbox_e2e::aws_stack::{AwsHarness, AwsOptions};
use std::time::Duration;

const T: Duration = Duration::from_secs(45);

fn env_of(s: &Session) -> String {
    s.self_hosted().unwrap().id.as_str().to_owned()
}

/// Creates a self-hosted session, submits input and waits for its task to be connected
/// (by the bridge).
async fn running_session(h: &AwsHarness) -> (Session, String) {
    let s = h
        .client
        .create_session(agents_sim::SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let env = env_of(&s);
    h.client.submit_message(s.id.as_str(), "go").await.unwrap();
    h.wait_until("executor connected", T, || h.connected(&env))
        .await
        .unwrap();
    (s, env)
}

/// Sweeps until `check` holds: a sweep defers an environment whose lock a worker holds.
async fn sweep_until<F, Fut>(h: &AwsHarness, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    for _ in 0..60 {
        h.sweep_now().await.unwrap();
        if check().await.unwrap() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("sweeps never achieved: {what}");
}

/// Reasons of the environment's compute-stopped receipts in DynamoDB, oldest first.
async fn stop_reasons(h: &AwsHarness, env: &str) -> Vec<String> {
    h.controller()
        .registry
        .receipts(&EnvironmentId::new(env).effect_key())
        .await
        .unwrap()
        .into_iter()
        .filter_map(|r| match r.kind {
            ReceiptKind::ComputeStopped { reason, .. } => Some(reason),
            ReceiptKind::SessionDeleted { .. } => None,
        })
        .collect()
}

/// Every task one environment ever had (live and stopped), per ECS.
async fn tasks_of(h: &AwsHarness, env: &str) -> Vec<ComputeInstance> {
    h.tasks_of(env).await.unwrap()
}

/// DescribeTasks of one task through the adapter.
async fn ecs_status(h: &AwsHarness, task: &ComputeInstance) -> ComputeStatus {
    h.controller()
        .compute
        .describe(&task.instance_id)
        .await
        .unwrap()
        .expect("DescribeTasks knows the task")
        .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_row01_connection_request_starts_one_task_with_the_sessions_remote_url_and_records_it()
{
    // The task must still be running at shutdown however slow moto is. Simulated seconds
    // run 60× faster, so under `make test` the simulator's 300 s connect deadline (5 real
    // seconds) passed before the executor connected: the input failed, the session went
    // idle and the lease stopped the task. Give the connection and the turn a day.
    let h = AwsHarness::start(AwsOptions {
        turn_secs: 86_400.0,
        sim_connect_deadline_secs: 86_400.0,
        ..AwsOptions::default()
    })
    .await
    .unwrap();
    let (s, env) = running_session(&h).await;
    let live = h.live(&env).await.unwrap();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(ecs_status(&h, &live[0]).await, ComputeStatus::Running);
    let record = h.record(&env).await.unwrap().expect("recorded in DynamoDB");
    assert_eq!(
        record.instance.as_ref().unwrap().instance_id,
        live[0].instance_id
    );
    assert_eq!(record.generation, Generation(1));
    assert_eq!(record.session_id, s.id);
    assert_eq!(record.status, RecordStatus::Active);
    // RunTask carried the session's remote_url unchanged (moto echoes the overrides).
    let ecs = h.resources.ecs_client();
    let described = ecs
        .describe_tasks()
        .cluster(&h.resources.ecs.cluster)
        .tasks(live[0].instance_id.as_str())
        .send()
        .await
        .unwrap();
    let overrides = described.tasks()[0]
        .overrides()
        .unwrap()
        .container_overrides();
    let vars: Vec<(&str, &str)> = overrides[0]
        .environment()
        .iter()
        .map(|kv| (kv.name().unwrap(), kv.value().unwrap()))
        .collect();
    assert_eq!(
        vars,
        vec![
            ("REMOTE_URL", s.self_hosted().unwrap().remote_url.as_str()),
            ("ENVIRONMENT_ID", env.as_str())
        ]
    );
    let state = h.client.state().await.unwrap();
    assert_eq!(state.environment(&env).unwrap().connect_count, 1);
    assert_eq!(h.shutdown().await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_row02_five_deliveries_some_concurrent_yield_exactly_one_task() {
    let h = AwsHarness::start(AwsOptions {
        duplicates: 4,
        reorder: true,
        workers: 4,
        ..AwsOptions::default()
    })
    .await
    .unwrap();
    let (_, env) = running_session(&h).await;
    assert!(h.sim.wait_deliveries_idle(T).await);
    // Let the workers drain the events and timers queues.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let all = tasks_of(&h, &env).await;
    assert_eq!(all.len(), 1, "{all:?}");
    let record = h.record(&env).await.unwrap().unwrap();
    assert_eq!(
        record.instance.as_ref().unwrap().instance_id,
        all[0].instance_id
    );
    assert_eq!(
        h.client
            .state()
            .await
            .unwrap()
            .environment(&env)
            .unwrap()
            .connect_count,
        1
    );
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_row06_deleted_session_with_running_task_is_released_by_the_sweeper() {
    let h = AwsHarness::start(AwsOptions {
        grace_secs: 600,
        ..AwsOptions::default()
    })
    .await
    .unwrap();
    let (s, env) = running_session(&h).await;
    h.wait_until("idle", T, || async {
        Ok(h.client.get_session(s.id.as_str()).await?.status == SessionStatus::Idle)
    })
    .await
    .unwrap();
    let task = h.live(&env).await.unwrap().remove(0);
    h.client.delete_session(s.id.as_str(), None).await.unwrap();
    // The stop is read back before the record is closed (record after the effect), and a
    // background worker may be the one releasing: wait for both.
    sweep_until(&h, "release recorded", || async {
        Ok(h.live(&env).await?.is_empty()
            && h.record(&env)
                .await?
                .is_some_and(|r| r.status == RecordStatus::Closed))
    })
    .await;
    assert_eq!(ecs_status(&h, &task).await, ComputeStatus::Stopped);
    assert_eq!(
        h.record(&env).await.unwrap().unwrap().status,
        RecordStatus::Closed
    );
    assert_eq!(stop_reasons(&h, &env).await, vec!["session_deleted"]);
    assert_eq!(h.shutdown().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_row07_failed_session_with_running_task_is_released() {
    let h = AwsHarness::start(AwsOptions::default()).await.unwrap();
    let (s, env) = running_session(&h).await;
    let task = h.live(&env).await.unwrap().remove(0);
    h.client
        .fail_session(s.id.as_str(), Some("boom"))
        .await
        .unwrap();
    h.wait_until("release recorded", T, || async {
        Ok(h.live(&env).await?.is_empty()
            && h.record(&env)
                .await?
                .is_some_and(|r| r.status == RecordStatus::Stopped))
    })
    .await
    .unwrap();
    assert_eq!(ecs_status(&h, &task).await, ComputeStatus::Stopped);
    assert_eq!(stop_reasons(&h, &env).await, vec!["session_failed"]);
    assert_eq!(h.shutdown().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_row14_15_idle_schedules_a_lease_then_the_due_lease_stops_that_generation() {
    let h = AwsHarness::start(AwsOptions {
        grace_secs: 3,
        ..AwsOptions::default()
    })
    .await
    .unwrap();
    let (_, env) = running_session(&h).await;
    h.wait_until("a lease", T, || async {
        Ok(h.record(&env).await?.and_then(|r| r.lease).is_some())
    })
    .await
    .unwrap();
    let lease = h.record(&env).await.unwrap().unwrap().lease.unwrap();
    assert_eq!(lease.due_at - lease.requested_at, 3);
    assert_eq!(h.live(&env).await.unwrap().len(), 1, "no stop yet");
    h.wait_until("the lease stop recorded", T, || async {
        Ok(h.live(&env).await?.is_empty()
            && h.record(&env)
                .await?
                .is_some_and(|r| r.status == RecordStatus::Stopped))
    })
    .await
    .unwrap();
    let record = h.record(&env).await.unwrap().unwrap();
    assert_eq!(record.status, RecordStatus::Stopped);
    assert_eq!(record.instance.unwrap(), lease.target);
    assert_eq!(stop_reasons(&h, &env).await, vec!["lease_expired"]);
    let all = tasks_of(&h, &env).await;
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(ecs_status(&h, &all[0]).await, ComputeStatus::Stopped);
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_row16_new_input_during_the_grace_cancels_the_stop_and_keeps_the_task() {
    let h = AwsHarness::start(AwsOptions {
        grace_secs: 4,
        turn_secs: 600.0,
        ..AwsOptions::default()
    })
    .await
    .unwrap();
    let (s, env) = running_session(&h).await;
    h.wait_until("a lease", T, || async {
        Ok(h.record(&env).await?.and_then(|r| r.lease).is_some())
    })
    .await
    .unwrap();
    let due = h.record(&env).await.unwrap().unwrap().lease.unwrap().due_at;
    let first = h.live(&env).await.unwrap()[0].instance_id.clone();
    h.client
        .submit_message(s.id.as_str(), "more")
        .await
        .unwrap();
    h.wait_until("the lease dropped", T, || async {
        Ok(h.record(&env).await?.and_then(|r| r.lease).is_none())
    })
    .await
    .unwrap();
    // Past the original due time the same task is still running (the new turn takes 10
    // real seconds, so no new lease can have expired yet).
    while agents_sim::real_unix_secs() <= due + 1 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let live = h.live(&env).await.unwrap();
    assert!(live.iter().any(|i| i.instance_id == first), "{live:?}");
    assert_eq!(tasks_of(&h, &env).await.len(), 1);
    assert!(stop_reasons(&h, &env).await.is_empty());
    assert_eq!(
        h.client
            .state()
            .await
            .unwrap()
            .environment(&env)
            .unwrap()
            .connect_count,
        1
    );
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_row25_operator_close_deletes_the_session_and_stops_the_task_with_two_receipts() {
    let h = AwsHarness::start(AwsOptions::default()).await.unwrap();
    let (s, env) = running_session(&h).await;
    let task = h.live(&env).await.unwrap().remove(0);
    let report = h
        .controller()
        .close(&s.id, 20, Duration::from_millis(300))
        .await
        .unwrap();
    assert!(report.closed, "{report:?}");
    let kinds: Vec<_> = report
        .receipts
        .iter()
        .map(|r| match &r.kind {
            ReceiptKind::ComputeStopped { reason, .. } => format!("stopped:{reason}"),
            ReceiptKind::SessionDeleted { .. } => "deleted".into(),
        })
        .collect();
    assert_eq!(kinds, vec!["deleted", "stopped:closed"]);
    assert!(
        h.client
            .get_session(s.id.as_str())
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert_eq!(ecs_status(&h, &task).await, ComputeStatus::Stopped);
    let record = h.record(&env).await.unwrap().unwrap();
    assert_eq!(record.status, RecordStatus::Closed);
    assert!(!record.cleanup_required);
    // New work for the closed session starts nothing.
    h.sweep_now().await.unwrap();
    assert!(h.live(&env).await.unwrap().is_empty());
    assert_eq!(tasks_of(&h, &env).await.len(), 1);
    assert_eq!(h.shutdown().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_row26_sweep_releases_a_task_no_record_owns() {
    let h = AwsHarness::start(AwsOptions::default()).await.unwrap();
    let s = h
        .client
        .create_session(agents_sim::SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let env = EnvironmentId::new(env_of(&s));
    let c = h.controller();
    let spec = StartSpec {
        environment_id: env.clone(),
        session_id: SessionId::new(s.id.as_str()),
        remote_url: s.self_hosted().unwrap().remote_url.clone(),
        workspace_directory: "/workspace".into(),
        generation: Generation(1),
        idempotency_token: idempotency_token(&env, Generation(1)),
        previous: None,
    };
    c.compute
        .start(&spec, &c.config.deployment, NO_DEADLINE)
        .await
        .unwrap();
    h.wait_until("orphan running", T, || h.connected(env.as_str()))
        .await
        .unwrap();
    assert!(h.record(env.as_str()).await.unwrap().is_none(), "no record");
    let task = h.live(env.as_str()).await.unwrap().remove(0);
    let report = h.sweep_now().await.unwrap();
    assert_eq!(report.outcomes.get("release"), Some(&1), "{report:?}");
    assert!(h.live(env.as_str()).await.unwrap().is_empty());
    assert_eq!(ecs_status(&h, &task).await, ComputeStatus::Stopped);
    assert_eq!(stop_reasons(&h, env.as_str()).await, vec!["orphan"]);
    h.wait_until("bridge disconnected", T, || async {
        Ok(!h.connected(env.as_str()).await?)
    })
    .await
    .unwrap();
    assert_eq!(h.shutdown().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_row27_record_says_running_but_task_stopped_marks_stopped_and_starts_nothing() {
    let h = AwsHarness::start(AwsOptions {
        grace_secs: 600,
        ..AwsOptions::default()
    })
    .await
    .unwrap();
    let (s, env) = running_session(&h).await;
    h.wait_until("idle", T, || async {
        Ok(h.client.get_session(s.id.as_str()).await?.status == SessionStatus::Idle)
    })
    .await
    .unwrap();
    // The task stops behind the controller's back (StopTask outside the controller).
    let id = h.live(&env).await.unwrap()[0].instance_id.clone();
    h.resources
        .ecs_client()
        .stop_task()
        .cluster(&h.resources.ecs.cluster)
        .task(id.as_str())
        .reason("essential container exited")
        .send()
        .await
        .unwrap();
    h.wait_until("gone", T, || async { Ok(h.live(&env).await?.is_empty()) })
        .await
        .unwrap();
    sweep_until(&h, "record stopped", || async {
        Ok(h.record(&env).await?.unwrap().status == RecordStatus::Stopped)
    })
    .await;
    assert!(h.live(&env).await.unwrap().is_empty(), "nothing started");
    assert_eq!(tasks_of(&h, &env).await.len(), 1, "no second task");
    assert_eq!(h.shutdown().await.unwrap(), 0);
}
