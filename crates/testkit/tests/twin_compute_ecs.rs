//! The compute twin's ECS behaviours ([`AwsLike`]), one test each, with the ECS
//! documentation each reproduces (digest: /work/shared/reference/aws-semantics.md).
//! The contract suite (`twin_contract.rs`) runs on the strict-but-instant default.

use sandbox_controller::ports::{Compute, NO_DEADLINE, Started};
use sandbox_core::compute::{ComputeInstance, ComputeStatus, TASK_FAILED_TO_START};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::idempotency_token;
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation, InstanceId, SessionId};
use sandbox_testkit::compute::{USER_INITIATED, limits};
use sandbox_testkit::{AwsLike, ComputeTiming, EcsCalls, SimClock, Throttle, TwinCompute};

fn deployment() -> DeploymentId {
    DeploymentId::new("twin-ecs").unwrap()
}

fn spec(n: usize) -> StartSpec {
    let environment_id = EnvironmentId::new(format!("env_ecs_{n}"));
    StartSpec {
        session_id: SessionId::new(format!("sess_ecs_{n}")),
        remote_url: format!("wss://agents.invalid/v1/environments/env_ecs_{n}/connect"),
        workspace_directory: "/workspace".to_owned(),
        generation: Generation(1),
        idempotency_token: idempotency_token(&environment_id, Generation(1)),
        environment_id,
        previous: None,
        restore: None,
    }
}

fn twin(aws: AwsLike) -> (SimClock, TwinCompute) {
    let clock = SimClock::new();
    let c = TwinCompute::aws_like(clock.clone(), ComputeTiming::default(), aws);
    (clock, c)
}

async fn start(c: &TwinCompute, s: &StartSpec) -> ComputeInstance {
    match c.start(s, &deployment(), NO_DEADLINE).await {
        Ok(Started::Instance(i)) => i,
        other => panic!("start: {other:?}"),
    }
}

async fn describe(c: &TwinCompute, id: &InstanceId) -> Option<ComputeInstance> {
    c.describe(id).await.unwrap()
}

async fn listed(c: &TwinCompute, id: &InstanceId) -> bool {
    c.list(&deployment())
        .await
        .unwrap()
        .iter()
        .any(|i| &i.instance_id == id)
}

/// Eventual consistency right after `RunTask`: `DescribeTasks` answers `MISSING` and
/// `ListTasks` omits the task for up to the configured lag, then both show it.
#[tokio::test]
async fn a_new_task_is_missing_and_unlisted_for_up_to_the_lag_then_visible() {
    let (clock, c) = twin(AwsLike {
        max_visibility_lag_ms: 5_000,
        seed: 7,
        ..AwsLike::strict()
    });
    let mut missing_at_first = 0;
    for n in 0..20 {
        let t = start(&c, &spec(n)).await;
        let at = clock.now_ms();
        let mut seen = describe(&c, &t.instance_id).await.is_some();
        missing_at_first += usize::from(!seen);
        while !seen {
            assert!(
                !listed(&c, &t.instance_id).await,
                "listed while MISSING on describe"
            );
            clock.advance(std::time::Duration::from_millis(100));
            seen = describe(&c, &t.instance_id).await.is_some();
        }
        assert!(clock.now_ms() - at <= 5_000, "invisible past the 5 s bound");
        assert!(listed(&c, &t.instance_id).await);
        // The ground truth counts it all along.
        assert_eq!(c.active_of(&t.environment_id).len(), 1);
    }
    assert!(
        missing_at_first >= 10,
        "most starts are MISSING at first ({missing_at_first} of 20)"
    );
}

/// The strict default has no lag: the contract suite reads a task right after starting it.
#[tokio::test]
async fn the_strict_default_shows_a_new_task_at_once() {
    let c = TwinCompute::new(SimClock::new());
    let t = start(&c, &spec(1)).await;
    assert_eq!(
        describe(&c, &t.instance_id).await.map(|i| i.status),
        Some(ComputeStatus::Running)
    );
    assert!(listed(&c, &t.instance_id).await);
}

/// "Stopped tasks appear in the returned results for at least one hour", then
/// `DescribeTasks` answers `MISSING`; `ListTasks` with `startedBy` alone (desiredStatus
/// `RUNNING`) never lists a task once its stop was requested.
#[tokio::test]
async fn a_stopped_task_is_described_for_an_hour_then_forgotten_and_never_listed() {
    let timing = ComputeTiming {
        start_secs: 0,
        stop_secs: 30,
    };
    let clock = SimClock::new();
    let c = TwinCompute::aws_like(clock.clone(), timing, AwsLike::strict());
    let t = start(&c, &spec(1)).await;
    c.stop(&t.instance_id, "lease_expired", NO_DEADLINE)
        .await
        .unwrap();
    assert!(!listed(&c, &t.instance_id).await, "listed while stopping");
    assert_eq!(
        describe(&c, &t.instance_id).await.map(|i| i.status),
        Some(ComputeStatus::Stopping)
    );
    clock.advance_secs(30);
    let stopped = describe(&c, &t.instance_id).await.unwrap();
    assert_eq!(stopped.status, ComputeStatus::Stopped);
    assert_eq!(stopped.stop_code.as_deref(), Some(USER_INITIATED));
    clock.advance_secs(limits::STOPPED_RETENTION_SECS - 1);
    assert!(describe(&c, &t.instance_id).await.is_some(), "kept an hour");
    clock.advance_secs(1);
    assert_eq!(describe(&c, &t.instance_id).await, None, "forgotten");
    assert!(
        c.describe_many(std::slice::from_ref(&t.instance_id))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(!listed(&c, &t.instance_id).await);
}

/// Fargate keeps a failing task `PROVISIONING` (up to ~30 min), then `STOPPED` with
/// `stopCode` `TaskFailedToStart`; it never ran (`started_at` `None`).
#[tokio::test]
async fn a_failing_start_provisions_then_stops_with_task_failed_to_start() {
    let (clock, c) = twin(AwsLike {
        failed_start_per_mille: 1_000,
        max_failed_start_secs: 600,
        seed: 3,
        ..AwsLike::strict()
    });
    let t = start(&c, &spec(1)).await;
    assert_eq!(t.status, ComputeStatus::Provisioning);
    let mut secs = 0;
    loop {
        let now = describe(&c, &t.instance_id).await.unwrap();
        if now.status == ComputeStatus::Stopped {
            assert!(now.failed_to_start(), "{now:?}");
            assert_eq!(now.stop_code.as_deref(), Some(TASK_FAILED_TO_START));
            assert_eq!(now.started_at, None);
            break;
        }
        assert_eq!(now.status, ComputeStatus::Provisioning, "never runs");
        assert!(
            listed(&c, &t.instance_id).await,
            "listed while provisioning"
        );
        assert!(secs <= 600, "provisioning past the bound");
        clock.advance_secs(10);
        secs += 10;
    }
    assert!(!listed(&c, &t.instance_id).await);
    assert!(c.active_of(&t.environment_id).is_empty());
}

/// Only the configured share of starts fails, deterministically from the seed.
#[tokio::test]
async fn the_share_of_failing_starts_follows_the_setting_and_the_seed() {
    let run = |seed| async move {
        let (clock, c) = twin(AwsLike {
            failed_start_per_mille: 200,
            max_failed_start_secs: 60,
            seed,
            ..AwsLike::strict()
        });
        let mut ids = vec![];
        for n in 0..500 {
            ids.push(start(&c, &spec(n)).await.instance_id);
        }
        clock.advance_secs(61);
        let failed: Vec<bool> = c
            .describe_many(&ids)
            .await
            .unwrap()
            .iter()
            .map(ComputeInstance::failed_to_start)
            .collect();
        failed
    };
    let a = run(11).await;
    assert_eq!(a, run(11).await, "same seed, same failures");
    let n = a.iter().filter(|f| **f).count();
    assert!((60..=140).contains(&n), "{n} of 500 failed at 20 %");
}

/// `clientToken`: the same token returns the original task for 24 hours, then starts a
/// new one; the same token with other parameters is a `ConflictException` naming the task,
/// which is adopted.
#[tokio::test]
async fn a_client_token_replays_for_24_hours_then_starts_a_new_task() {
    let (clock, c) = twin(AwsLike::strict());
    let s = spec(1);
    let first = start(&c, &s).await;
    clock.advance_secs(limits::CLIENT_TOKEN_WINDOW_SECS - 1);
    assert_eq!(start(&c, &s).await.instance_id, first.instance_id);
    let mut other = s.clone();
    other.remote_url.push_str("?other=1");
    assert_eq!(
        start(&c, &other).await.instance_id,
        first.instance_id,
        "a ConflictException names the task: the adapter adopts it"
    );
    assert_eq!(c.answers().conflicts_adopted, 1);
    // What the adapter does not send (workspace, previous generation) cannot conflict.
    let mut unsent = s.clone();
    unsent.previous = Some(first.as_ref());
    unsent.workspace_directory = "/elsewhere".to_owned();
    assert_eq!(start(&c, &unsent).await.instance_id, first.instance_id);
    clock.advance_secs(1);
    let second = start(&c, &s).await;
    assert_ne!(
        second.instance_id, first.instance_id,
        "a new task after 24 h"
    );
    assert_eq!(c.active_of(&s.environment_id).len(), 2);
}

/// Throttling: a token bucket per action (burst, sustained rate) on the simulated clock;
/// an empty bucket answers a transient `ThrottlingException`, other actions unaffected.
#[tokio::test]
async fn requests_above_the_rate_are_throttled_until_the_bucket_refills() {
    let (clock, c) = twin(AwsLike {
        throttle: Some(Throttle {
            burst: 3,
            per_sec: 2,
        }),
        ..AwsLike::strict()
    });
    let t = start(&c, &spec(1)).await;
    for _ in 0..3 {
        c.describe(&t.instance_id).await.unwrap();
    }
    let e = c.describe(&t.instance_id).await.unwrap_err();
    assert!(
        e.retryable && e.message.contains("ThrottlingException"),
        "{e}"
    );
    // RunTask has its own bucket.
    start(&c, &spec(2)).await;
    clock.advance(std::time::Duration::from_millis(500));
    c.describe(&t.instance_id).await.unwrap();
    assert!(
        c.describe(&t.instance_id).await.is_err(),
        "one token per 500 ms"
    );
    clock.advance_secs(10);
    for _ in 0..3 {
        c.describe(&t.instance_id).await.unwrap();
    }
    assert!(
        c.describe(&t.instance_id).await.is_err(),
        "the burst caps the refill"
    );
}

/// Request shapes the ECS API reference forbids are permanent errors, and nothing starts
/// or stops: `clientToken` "Up to 64 ASCII characters", tag values ≤ 256 characters,
/// `StopTask` `reason` "Up to 255 characters".
#[tokio::test]
async fn requests_ecs_forbids_are_rejected() {
    let (_, c) = twin(AwsLike::strict());
    let mut long_token = spec(1);
    long_token.idempotency_token = "t".repeat(65);
    let mut non_ascii = spec(2);
    non_ascii.idempotency_token = "sl-é".to_owned();
    let mut long_tag = spec(3);
    long_tag.environment_id = EnvironmentId::new(format!("env_{}", "x".repeat(253)));
    for bad in [&long_token, &non_ascii, &long_tag] {
        let e = c.start(bad, &deployment(), NO_DEADLINE).await.unwrap_err();
        assert!(
            !e.retryable && e.message.contains("InvalidParameter"),
            "{e}"
        );
    }
    assert!(c.instances().is_empty(), "nothing started");
    let mut max_token = spec(4);
    max_token.idempotency_token = "t".repeat(64);
    let t = start(&c, &max_token).await;
    let e = c
        .stop(&t.instance_id, &"r".repeat(256), NO_DEADLINE)
        .await
        .unwrap_err();
    assert!(!e.retryable, "{e}");
    assert_eq!(
        describe(&c, &t.instance_id).await.unwrap().status,
        ComputeStatus::Running
    );
    c.stop(&t.instance_id, &"r".repeat(255), NO_DEADLINE)
        .await
        .unwrap();
}

/// ECS calls as the adapter makes them: one `DescribeTasks` per describe and per 100 ids,
/// a list of L live tasks = max(1, ⌈L/100⌉) `ListTasks` pages + ⌈L/100⌉ `DescribeTasks`.
#[tokio::test]
async fn ecs_calls_are_counted_per_page_of_100() {
    let (_, c) = twin(AwsLike::strict());
    c.list(&deployment()).await.unwrap();
    assert_eq!(
        c.take_ecs_calls(),
        EcsCalls {
            list_tasks: 1,
            ..EcsCalls::default()
        }
    );
    let mut ids = vec![];
    for n in 0..250 {
        ids.push(start(&c, &spec(n)).await.instance_id);
    }
    c.describe(&ids[0]).await.unwrap();
    c.describe_many(&ids).await.unwrap();
    c.describe_many(&ids[..100]).await.unwrap();
    c.list(&deployment()).await.unwrap();
    c.stop(&ids[0], "orphan", NO_DEADLINE).await.unwrap();
    assert_eq!(
        c.take_ecs_calls(),
        EcsCalls {
            run_task: 250,
            describe_tasks: 1 + 3 + 1 + 3,
            list_tasks: 3,
            stop_task: 1,
        }
    );
    assert_eq!(c.ecs_calls().total(), 0);
}

/// A task whose essential container exits by itself (the executor or its forwarder: a
/// rejected executor key) reads `STOPPED` with `stopCode` `EssentialContainerExited`, its
/// `stoppedReason` and the container's exit code (ECS API reference, `Task.stopCode`,
/// `Task.stoppedReason`, `Container.exitCode`); one stopped on request has no exit detail.
#[tokio::test]
async fn a_task_whose_container_exited_reads_its_stopped_reason_and_exit_code() {
    let timing = ComputeTiming {
        start_secs: 0,
        stop_secs: 0,
    };
    let clock = SimClock::new();
    let c = TwinCompute::aws_like(clock.clone(), timing, AwsLike::strict());
    let t = start(&c, &spec(1)).await;
    assert!(c.kill(&t.instance_id));
    let died = describe(&c, &t.instance_id).await.unwrap();
    assert_eq!(died.status, ComputeStatus::Stopped);
    assert_eq!(
        died.stop_code.as_deref(),
        Some(sandbox_core::compute::ESSENTIAL_CONTAINER_EXITED)
    );
    let exit = died.exit.expect("the exit of a container that exited");
    assert_eq!(
        exit.reason.as_deref(),
        Some("Essential container in task exited")
    );
    assert_eq!(exit.exit_code, Some(1));
    let s = start(&c, &spec(2)).await;
    c.stop(&s.instance_id, "lease_expired", NO_DEADLINE)
        .await
        .unwrap();
    let stopped = describe(&c, &s.instance_id).await.unwrap();
    assert_eq!(stopped.stop_code.as_deref(), Some(USER_INITIATED));
    assert_eq!(stopped.exit, None);
}
