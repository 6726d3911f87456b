//! The rows of lifecycle-cases.md marked E, end to end: simulator webhooks (signed, at
//! least once) → intake → SQLite events queue → workers → decide → child-process
//! executors, and the sweeper.

use sandbox_controller::ports::{Compute as _, NO_DEADLINE, ReceiptKind, Registry as _};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{EnvironmentId, Generation, SessionId, idempotency_token};
use sandbox_core::record::RecordStatus;
use sandbox_core::session::{Session, SessionStatus};
use sandbox_e2e::{Harness, Options, os_executors};
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

fn env_of(s: &Session) -> String {
    s.self_hosted().unwrap().id.as_str().to_owned()
}

/// Creates a self-hosted session, submits input and waits for its executor to connect.
async fn running_session(h: &Harness) -> (Session, String) {
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

/// Waits until the simulator reports the session idle (its turn finished).
async fn wait_idle(h: &Harness, s: &Session) {
    h.wait_until("idle", T, || async {
        Ok(h.client.get_session(s.id.as_str()).await?.status == SessionStatus::Idle)
    })
    .await
    .unwrap();
}

/// Sweeps (as the periodic sweeper would) until `check` holds: a sweep defers an
/// environment whose lock a worker holds at that moment.
async fn sweep_until<F, Fut>(h: &Harness, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    for _ in 0..60 {
        h.stack().sweep_now().await.unwrap();
        if check().await.unwrap() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("sweeps never achieved: {what}");
}

async fn stop_reasons(h: &Harness, env: &str) -> Vec<String> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row01_connection_request_starts_one_executor_with_the_sessions_remote_url_and_records_it()
{
    // A turn longer than the test (simulated seconds run faster than real ones): the
    // executor must still run at the end, however slow the machine.
    let h = Harness::start(Options {
        turn_secs: 86_400.0,
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = running_session(&h).await;
    let live = h.live(&env).await.unwrap();
    assert_eq!(live.len(), 1);
    let record = h.record(&env).await.unwrap().expect("recorded");
    assert_eq!(
        record.instance.as_ref().unwrap().instance_id,
        live[0].instance_id
    );
    assert_eq!(record.generation, Generation(1));
    assert_eq!(record.session_id, s.id);
    // The stand-in connected with the session's remote_url unchanged (it POSTs it).
    let state = h.client.state().await.unwrap();
    assert_eq!(state.environment(&env).unwrap().connect_count, 1);
    assert_eq!(os_executors(Some(&env)).len(), 1);
    h.shutdown().await.unwrap();
    assert!(os_executors(Some(&env)).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row02_five_deliveries_some_concurrent_yield_exactly_one_executor() {
    let h = Harness::start(Options {
        duplicates: 4,
        reorder: true,
        workers: 4,
        ..Options::default()
    })
    .await
    .unwrap();
    let (_, env) = running_session(&h).await;
    assert!(h.sim.wait_deliveries_idle(T).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let all: Vec<_> = h
        .instances()
        .await
        .unwrap()
        .into_iter()
        .filter(|i| i.environment_id.as_str() == env)
        .collect();
    assert_eq!(all.len(), 1, "{all:?}");
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
    assert_eq!(os_executors(Some(&env)).len(), 1);
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row06_deleted_session_with_running_executor_is_released_by_the_sweeper() {
    let h = Harness::start(Options {
        grace_secs: 600,
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = running_session(&h).await;
    wait_idle(&h, &s).await;
    h.client.delete_session(s.id.as_str(), None).await.unwrap();
    // The stop is read back before the record is closed, and a background worker may be
    // the one releasing: wait for both.
    sweep_until(&h, "release recorded", || async {
        Ok(h.live(&env).await?.is_empty()
            && h.record(&env)
                .await?
                .is_some_and(|r| r.status == RecordStatus::Closed))
    })
    .await;
    assert!(os_executors(Some(&env)).is_empty());
    assert_eq!(
        h.record(&env).await.unwrap().unwrap().status,
        RecordStatus::Closed
    );
    assert_eq!(stop_reasons(&h, &env).await, vec!["session_deleted"]);
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row07_failed_session_with_running_executor_is_released() {
    let h = Harness::start(Options::default()).await.unwrap();
    let (s, env) = running_session(&h).await;
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
    assert!(os_executors(Some(&env)).is_empty());
    assert_eq!(stop_reasons(&h, &env).await, vec!["session_failed"]);
    assert_eq!(
        h.record(&env).await.unwrap().unwrap().status,
        RecordStatus::Stopped
    );
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row14_15_idle_schedules_a_lease_then_the_due_lease_stops_that_generation() {
    let h = Harness::start(Options {
        grace_secs: 3,
        ..Options::default()
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
    assert!(os_executors(Some(&env)).is_empty());
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row16_new_input_during_the_grace_cancels_the_stop_and_keeps_the_executor() {
    let h = Harness::start(Options {
        grace_secs: 4,
        turn_secs: 600.0,
        ..Options::default()
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
    // Past the original due time the same executor is still running (the new turn takes
    // 10 real seconds, so no new lease can have expired yet).
    while agents_sim::real_unix_secs() <= due + 1 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let live = h.live(&env).await.unwrap();
    assert!(live.iter().any(|i| i.instance_id == first), "{live:?}");
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
async fn row25_operator_close_deletes_the_session_and_stops_the_executor_with_two_receipts() {
    let h = Harness::start(Options::default()).await.unwrap();
    let (s, env) = running_session(&h).await;
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
    assert!(os_executors(Some(&env)).is_empty());
    // New work for the closed session starts nothing.
    h.stack().sweep_now().await.unwrap();
    assert!(h.live(&env).await.unwrap().is_empty());
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row26_sweep_releases_an_executor_no_record_owns() {
    let h = Harness::start(Options::default()).await.unwrap();
    let s = h
        .client
        .create_session(agents_sim::SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let env = EnvironmentId::new(env_of(&s));
    let c = h.controller();
    c.compute
        .start(
            &StartSpec {
                environment_id: env.clone(),
                session_id: SessionId::new(s.id.as_str()),
                remote_url: s.self_hosted().unwrap().remote_url.clone(),
                workspace_directory: "/workspace".into(),
                generation: Generation(1),
                idempotency_token: idempotency_token(&env, Generation(1)),
                previous: None,
            },
            &c.config.deployment,
            NO_DEADLINE,
        )
        .await
        .unwrap();
    h.wait_until("orphan running", T, || h.connected(env.as_str()))
        .await
        .unwrap();
    let report = h.stack().sweep_now().await.unwrap();
    assert_eq!(report.outcomes.get("release"), Some(&1), "{report:?}");
    assert!(h.live(env.as_str()).await.unwrap().is_empty());
    assert_eq!(stop_reasons(&h, env.as_str()).await, vec!["orphan"]);
    assert!(os_executors(Some(env.as_str())).is_empty());
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row27_record_says_running_but_executor_gone_marks_stopped_and_starts_nothing() {
    let h = Harness::start(Options {
        grace_secs: 600,
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = running_session(&h).await;
    wait_idle(&h, &s).await;
    // The executor dies behind the controller's back.
    let id = h.live(&env).await.unwrap()[0].instance_id.clone();
    h.controller()
        .compute
        .stop(&id, "test", NO_DEADLINE)
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
    h.shutdown().await.unwrap();
}
