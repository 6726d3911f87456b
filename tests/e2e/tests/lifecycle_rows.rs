//! The rows of lifecycle-cases.md marked E, end to end, each written once over
//! [`LifecycleHarness`] and run on both backends:
//!
//! - `embedded::rowNN_…`: simulator webhooks (signed, at least once) → intake → SQLite
//!   events queue → workers → decide → child-process executors, and the sweeper;
//! - `aws::rowNN_…`: the same over the AWS adapters on moto: SQS FIFO events queue, ECS
//!   Fargate tasks, the DynamoDB registry, the SQS timers queue. moto runs no containers:
//!   the harness's executor bridge connects RUNNING tasks to the simulator and disconnects
//!   STOPPED ones (see `sandbox_e2e::aws_stack`). Run them with
//!   `tests/moto/run.sh cargo nextest run -p sandbox-e2e -E 'test(aws)'`.
//!
//! Where a row's evidence differs by backend (OS processes, the executor's variables, a
//! stop behind the controller's back), the harness says it.

use sandbox_controller::job::Job;
use sandbox_controller::ports::{Compute as _, NO_DEADLINE, Outgoing, Queue as _, ReceiptKind};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::decision::StartSpec;
use sandbox_core::evidence::{EffectState, EvidenceTrigger, SubmissionOutcome};
use sandbox_core::ids::{EnvironmentId, Generation, SessionId, idempotency_token};
use sandbox_core::record::RecordStatus;
use sandbox_core::session::{Session, SessionStatus};
use sandbox_core::turn::ItemStatus;
use sandbox_e2e::{LifecycleHarness, Options};
use std::time::Duration;

/// Generates one test per row for a backend, in a module named after it.
macro_rules! rows_on {
    ($backend:ident: $harness:ty) => {
        rows_on!(@tests $backend: $harness;
            row01_connection_request_starts_one_executor_with_the_sessions_remote_url_and_records_it,
            row02_five_deliveries_some_concurrent_yield_exactly_one_executor,
            row06_deleted_session_with_running_executor_is_released_by_the_sweeper,
            row07_failed_session_with_running_executor_is_released,
            row14_15_idle_schedules_a_lease_then_the_due_lease_stops_that_generation,
            row16_new_input_during_the_grace_cancels_the_stop_and_keeps_the_executor,
            row25_operator_close_deletes_the_session_and_stops_the_executor_with_two_receipts,
            row26_sweep_releases_an_executor_no_record_owns,
            row27_record_says_running_but_executor_gone_marks_stopped_and_starts_nothing,
            row20_mid_turn_disconnect_is_held_with_its_evidence_until_an_owner_resolves_it,
            row21_timed_out_submissions_are_answered_from_turn_evidence_never_resubmitted,
            ceiling_idle_executor_past_its_max_lifetime_is_stopped_then_new_input_starts_a_fresh_generation,
            ceiling_remote_url_not_on_the_allowlist_starts_no_executor_and_is_reconciled,
            ceiling_session_waiting_on_a_function_call_with_no_work_stops_its_executor_as_no_work,
            ceiling_executors_that_never_connect_are_replaced_up_to_the_cap_then_reconciled,
            ceiling_at_the_executor_cap_a_second_start_waits_until_the_first_executor_stops,
        );
    };
    (@tests $backend:ident: $harness:ty; $($row:ident),+ $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $row() {
                    super::$row::<$harness>().await;
                }
            )+
        }
    };
}

rows_on!(embedded: sandbox_e2e::Harness);
rows_on!(aws: sandbox_e2e::aws_stack::AwsHarness);
// The rows the issue names, with the real pinned `codex exec-server --listen`
// as the executor (fails when the binary is missing).
rows_on!(@tests real_codex: sandbox_e2e::RealCodexHarness;
    row01_connection_request_starts_one_executor_with_the_sessions_remote_url_and_records_it,
    row14_15_idle_schedules_a_lease_then_the_due_lease_stops_that_generation,
    row20_mid_turn_disconnect_is_held_with_its_evidence_until_an_owner_resolves_it,
);

/// Where the backend runs turn commands for real ([`LifecycleHarness::TURN_RUNS_IN`]):
/// waits for the session's first turn to complete and checks its command ran there.
async fn assert_first_turn_ran_in_the_executor<H: LifecycleHarness>(h: &H, s: &Session) {
    let Some(parent) = H::TURN_RUNS_IN else {
        return;
    };
    let sid = s.id.as_str();
    h.wait_until("the first turn completed", H::STEP_TIMEOUT, || async {
        let turns = h.client().list_turns(sid).await?;
        Ok(turns
            .data
            .first()
            .is_some_and(|t| t.status == sandbox_core::turn::TurnStatus::Completed))
    })
    .await
    .unwrap();
    let turn = h.client().list_turns(sid).await.unwrap().data.remove(0);
    let items = h
        .client()
        .get_json(&format!(
            "/agents/sessions/{sid}/turns/{}/items?order=asc&limit=100",
            turn.id.as_str()
        ))
        .await
        .unwrap();
    let command = items["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "command_execution")
        .cloned()
        .unwrap_or_else(|| panic!("the turn ran no command: {items}"));
    let output = command["output"].as_str().unwrap_or_default();
    assert!(output.contains(parent), "ran in the executor: {command}");
    assert_eq!(command["exit_code"], 0, "{command}");
}

fn env_of(s: &Session) -> String {
    s.self_hosted().unwrap().id.as_str().to_owned()
}

/// Creates a self-hosted session, submits input and waits for its executor to connect.
async fn running_session<H: LifecycleHarness>(h: &H) -> (Session, String) {
    let (s, env) = h.session_with_input().await.unwrap();
    h.wait_until("executor connected", H::STEP_TIMEOUT, || h.connected(&env))
        .await
        .unwrap();
    (s, env)
}

/// Waits until the simulator reports the session idle (its turn finished).
async fn wait_idle<H: LifecycleHarness>(h: &H, s: &Session) {
    h.wait_until("idle", H::STEP_TIMEOUT, || async {
        Ok(h.client().get_session(s.id.as_str()).await?.status == SessionStatus::Idle)
    })
    .await
    .unwrap();
}

/// Sweeps (as the periodic sweeper would) until `check` holds: a sweep defers an
/// environment whose lock a worker holds at that moment.
async fn sweep_until<H, F, Fut>(h: &H, what: &str, mut check: F)
where
    H: LifecycleHarness,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    for _ in 0..60 {
        h.controller().sweep().await.unwrap();
        if check().await.unwrap() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("sweeps never achieved: {what}");
}

/// Reasons of the environment's compute-stopped receipts, oldest first.
async fn stop_reasons<H: LifecycleHarness>(h: &H, env: &str) -> Vec<String> {
    h.receipts(env)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|r| match r.kind {
            ReceiptKind::ComputeStopped { reason, .. } => Some(reason),
            ReceiptKind::SessionDeleted { .. } | ReceiptKind::WorkspaceClosed { .. } => None,
        })
        .collect()
}

/// Every instance of one environment (live and stopped), per the provider: the live ones
/// its list shows, plus every one a receipt or the record names, read by id (a list shows
/// live tasks only, as ECS's does).
async fn instances_of<H: LifecycleHarness>(h: &H, env: &str) -> Vec<ComputeInstance> {
    let mut ids: Vec<sandbox_core::ids::InstanceId> = h
        .receipts(env)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|r| match r.kind {
            ReceiptKind::ComputeStopped { instance_id, .. } => Some(instance_id),
            ReceiptKind::SessionDeleted { .. } | ReceiptKind::WorkspaceClosed { .. } => None,
        })
        .chain(
            h.record(env)
                .await
                .unwrap()
                .and_then(|r| r.instance)
                .map(|i| i.instance_id),
        )
        .collect();
    let mut all = h.live(env).await.unwrap();
    ids.retain(|id| !all.iter().any(|i| &i.instance_id == id));
    ids.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    ids.dedup();
    all.extend(h.controller().compute.describe_many(&ids).await.unwrap());
    all
}

/// The provider's read-back of one instance (DescribeTasks on ECS).
async fn status<H: LifecycleHarness>(h: &H, instance: &ComputeInstance) -> ComputeStatus {
    h.controller()
        .compute
        .describe(&instance.instance_id)
        .await
        .unwrap()
        .expect("the provider knows the instance")
        .status
}

/// Checks the OS process table holds `n` executor processes of `env`, where the backend
/// runs its executors on this machine.
fn assert_executor_processes<H: LifecycleHarness>(env: &str, n: usize) {
    if let Some(found) = H::executor_processes(env) {
        assert_eq!(found, n, "executor processes of {env}");
    }
}

/// The simulator's connection count of one environment.
async fn connect_count<H: LifecycleHarness>(h: &H, env: &str) -> u64 {
    h.client()
        .state()
        .await
        .unwrap()
        .environment(env)
        .unwrap()
        .connect_count
}

async fn row01_connection_request_starts_one_executor_with_the_sessions_remote_url_and_records_it<
    H: LifecycleHarness,
>() {
    // The executor must still run at the end, however slow the machine. Simulated seconds
    // run 60× faster, so the simulator's 300 s connect deadline (5 real seconds) could
    // pass before a slow start connects (the input fails, the session goes idle and the
    // lease stops the executor): give the connection and the turn a day.
    // Where turn commands run for real the turn ends with its command and a simulated
    // minute (the first turn is checked to complete there): a day of grace keeps the
    // executor running after it.
    let h = H::start(Options {
        turn_secs: if H::TURN_RUNS_IN.is_some() {
            60.0
        } else {
            86_400.0
        },
        sim_connect_deadline_secs: 86_400.0,
        grace_secs: 86_400,
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = running_session(&h).await;
    let live = h.live(&env).await.unwrap();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(status(&h, &live[0]).await, ComputeStatus::Running);
    let record = h.record(&env).await.unwrap().expect("recorded");
    assert_eq!(
        record.instance.as_ref().unwrap().instance_id,
        live[0].instance_id
    );
    assert_eq!(record.generation, Generation(1));
    assert_eq!(record.session_id, s.id);
    assert_eq!(record.status, RecordStatus::Active);
    // The provider carried the session's remote_url unchanged (and the executor connected
    // with it: the stand-in POSTs it, the bridge connects its environment).
    let vars = h.executor_vars(&live[0]).await.unwrap();
    assert_eq!(
        vars,
        vec![
            (
                "REMOTE_URL".to_owned(),
                s.self_hosted().unwrap().remote_url.clone()
            ),
            ("ENVIRONMENT_ID".to_owned(), env.clone())
        ]
    );
    assert_eq!(connect_count(&h, &env).await, 1);
    // Once the connection request is answered (the turn runs: the session's `in_progress`
    // webhook), the worker reads the status once and records when it first saw this
    // instance connected (the `start_to_connected_seconds` metric).
    h.wait_until("connection observed", H::STEP_TIMEOUT, || async {
        Ok(h.record(&env)
            .await?
            .is_some_and(|r| r.instance_connected_at.is_some()))
    })
    .await
    .unwrap();
    let record = h.record(&env).await.unwrap().unwrap();
    assert!(
        record.instance_connected_at >= record.instance_recorded_at,
        "{record:?}"
    );
    assert_first_turn_ran_in_the_executor(&h, &s).await;
    assert_eq!(h.live(&env).await.unwrap().len(), 1, "still running");
    assert_executor_processes::<H>(&env, 1);
    assert_eq!(h.shutdown().await.unwrap(), 1);
    assert_executor_processes::<H>(&env, 0);
}

async fn row02_five_deliveries_some_concurrent_yield_exactly_one_executor<H: LifecycleHarness>() {
    let h = H::start(Options {
        duplicates: 4,
        reorder: true,
        workers: 4,
        ..Options::default()
    })
    .await
    .unwrap();
    let (_, env) = running_session(&h).await;
    assert!(h.sim().wait_deliveries_idle(H::STEP_TIMEOUT).await);
    // Let the workers drain the events and timers queues.
    tokio::time::sleep(H::SETTLE).await;
    let all = instances_of(&h, &env).await;
    assert_eq!(all.len(), 1, "{all:?}");
    let record = h.record(&env).await.unwrap().unwrap();
    assert_eq!(
        record.instance.as_ref().unwrap().instance_id,
        all[0].instance_id
    );
    assert_eq!(connect_count(&h, &env).await, 1);
    assert_executor_processes::<H>(&env, 1);
    h.shutdown().await.unwrap();
}

async fn row06_deleted_session_with_running_executor_is_released_by_the_sweeper<
    H: LifecycleHarness,
>() {
    let h = H::start(Options {
        grace_secs: 600,
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = running_session(&h).await;
    wait_idle(&h, &s).await;
    let executor = h.live(&env).await.unwrap().remove(0);
    h.client()
        .delete_session(s.id.as_str(), None)
        .await
        .unwrap();
    // The stop is read back before the record is closed (record after the effect), and a
    // background worker may be the one releasing: wait for both.
    sweep_until(&h, "release recorded", || async {
        Ok(h.live(&env).await?.is_empty()
            && h.record(&env)
                .await?
                .is_some_and(|r| r.status == RecordStatus::Closed))
    })
    .await;
    assert_executor_processes::<H>(&env, 0);
    assert_eq!(status(&h, &executor).await, ComputeStatus::Stopped);
    assert_eq!(
        h.record(&env).await.unwrap().unwrap().status,
        RecordStatus::Closed
    );
    assert_eq!(stop_reasons(&h, &env).await, vec!["session_deleted"]);
    assert_eq!(h.shutdown().await.unwrap(), 0);
}

async fn row07_failed_session_with_running_executor_is_released<H: LifecycleHarness>() {
    let h = H::start(Options::default()).await.unwrap();
    let (s, env) = running_session(&h).await;
    let executor = h.live(&env).await.unwrap().remove(0);
    h.client()
        .fail_session(s.id.as_str(), Some("boom"))
        .await
        .unwrap();
    h.wait_until("release recorded", H::STEP_TIMEOUT, || {
        h.stopped_and_recorded(&env)
    })
    .await
    .unwrap();
    assert_executor_processes::<H>(&env, 0);
    assert_eq!(status(&h, &executor).await, ComputeStatus::Stopped);
    assert_eq!(stop_reasons(&h, &env).await, vec!["session_failed"]);
    assert_eq!(
        h.record(&env).await.unwrap().unwrap().status,
        RecordStatus::Stopped
    );
    assert_eq!(h.shutdown().await.unwrap(), 0);
}

async fn row14_15_idle_schedules_a_lease_then_the_due_lease_stops_that_generation<
    H: LifecycleHarness,
>() {
    let h = H::start(Options {
        grace_secs: 3,
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = running_session(&h).await;
    h.wait_until("a lease", H::STEP_TIMEOUT, || async {
        Ok(h.record(&env).await?.and_then(|r| r.lease).is_some())
    })
    .await
    .unwrap();
    let lease = h.record(&env).await.unwrap().unwrap().lease.unwrap();
    assert_eq!(lease.due_at - lease.requested_at, 3);
    assert_first_turn_ran_in_the_executor(&h, &s).await;
    // Before the lease is due the executor runs (on a loaded machine the 3 s may already
    // have passed by this read: then the stop below is all there is to see).
    let live = h.live(&env).await.unwrap().len();
    if agents_sim::real_unix_secs() < lease.due_at {
        assert_eq!(live, 1, "no stop before the lease is due");
    }
    h.wait_until("the lease stop recorded", H::STEP_TIMEOUT, || {
        h.stopped_and_recorded(&env)
    })
    .await
    .unwrap();
    let record = h.record(&env).await.unwrap().unwrap();
    assert_eq!(record.status, RecordStatus::Stopped);
    assert_eq!(record.instance.unwrap(), lease.target);
    assert_eq!(stop_reasons(&h, &env).await, vec!["lease_expired"]);
    assert_executor_processes::<H>(&env, 0);
    let all = instances_of(&h, &env).await;
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(status(&h, &all[0]).await, ComputeStatus::Stopped);
    h.shutdown().await.unwrap();
}

async fn row16_new_input_during_the_grace_cancels_the_stop_and_keeps_the_executor<
    H: LifecycleHarness,
>() {
    let h = H::start(Options {
        grace_secs: 4,
        turn_secs: 600.0,
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = running_session(&h).await;
    h.wait_until("a lease", H::STEP_TIMEOUT, || async {
        Ok(h.record(&env).await?.and_then(|r| r.lease).is_some())
    })
    .await
    .unwrap();
    let due = h.record(&env).await.unwrap().unwrap().lease.unwrap().due_at;
    let first = h.live(&env).await.unwrap()[0].instance_id.clone();
    h.client()
        .submit_message(s.id.as_str(), "more")
        .await
        .unwrap();
    h.wait_until("the lease dropped", H::STEP_TIMEOUT, || async {
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
    assert_eq!(instances_of(&h, &env).await.len(), 1);
    assert!(stop_reasons(&h, &env).await.is_empty());
    assert_eq!(connect_count(&h, &env).await, 1);
    h.shutdown().await.unwrap();
}

async fn row25_operator_close_deletes_the_session_and_stops_the_executor_with_two_receipts<
    H: LifecycleHarness,
>() {
    let h = H::start(Options::default()).await.unwrap();
    let (s, env) = running_session(&h).await;
    let executor = h.live(&env).await.unwrap().remove(0);
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
            ReceiptKind::WorkspaceClosed { .. } => "workspace-closed".into(),
        })
        .collect();
    assert_eq!(kinds, vec!["deleted", "stopped:closed", "workspace-closed"]);
    assert!(
        h.client()
            .get_session(s.id.as_str())
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert_executor_processes::<H>(&env, 0);
    assert_eq!(status(&h, &executor).await, ComputeStatus::Stopped);
    let record = h.record(&env).await.unwrap().unwrap();
    assert_eq!(record.status, RecordStatus::Closed);
    assert!(!record.cleanup_required);
    // New work for the closed session starts nothing.
    h.controller().sweep().await.unwrap();
    assert!(h.live(&env).await.unwrap().is_empty());
    assert_eq!(instances_of(&h, &env).await.len(), 1);
    assert_eq!(h.shutdown().await.unwrap(), 0);
}

async fn row26_sweep_releases_an_executor_no_record_owns<H: LifecycleHarness>() {
    let h = H::start(Options::default()).await.unwrap();
    let s = h
        .client()
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
        restore: None,
    };
    c.compute
        .start(&spec, &c.config.deployment, NO_DEADLINE)
        .await
        .unwrap();
    h.wait_until("orphan running", H::STEP_TIMEOUT, || {
        h.connected(env.as_str())
    })
    .await
    .unwrap();
    assert!(h.record(env.as_str()).await.unwrap().is_none(), "no record");
    let orphan = h.live(env.as_str()).await.unwrap().remove(0);
    let report = c.sweep().await.unwrap();
    assert_eq!(report.outcomes.get("release"), Some(&1), "{report:?}");
    assert!(h.live(env.as_str()).await.unwrap().is_empty());
    assert_eq!(status(&h, &orphan).await, ComputeStatus::Stopped);
    assert_eq!(stop_reasons(&h, env.as_str()).await, vec!["orphan"]);
    assert_executor_processes::<H>(env.as_str(), 0);
    h.wait_until("executor disconnected", H::STEP_TIMEOUT, || async {
        Ok(!h.connected(env.as_str()).await?)
    })
    .await
    .unwrap();
    assert_eq!(h.shutdown().await.unwrap(), 0);
}

async fn row27_record_says_running_but_executor_gone_marks_stopped_and_starts_nothing<
    H: LifecycleHarness,
>() {
    let h = H::start(Options {
        grace_secs: 600,
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = running_session(&h).await;
    wait_idle(&h, &s).await;
    // The executor stops behind the controller's back.
    let id = h.live(&env).await.unwrap()[0].instance_id.clone();
    h.stop_behind_the_controllers_back(&id).await.unwrap();
    h.wait_until("gone", H::STEP_TIMEOUT, || async {
        Ok(h.live(&env).await?.is_empty())
    })
    .await
    .unwrap();
    sweep_until(&h, "record stopped", || async {
        Ok(h.record(&env).await?.unwrap().status == RecordStatus::Stopped)
    })
    .await;
    assert!(h.live(&env).await.unwrap().is_empty(), "nothing started");
    assert_eq!(instances_of(&h, &env).await.len(), 1, "no second executor");
    assert_eq!(h.shutdown().await.unwrap(), 0);
}

/// Row 20: a turn completes with a failed tool after the executor disconnected
/// mid-turn. The environment is held for an owner with the four layers of evidence
/// (visible in `sandboxctl explain --json`); the idle lease does not stop the compute that
/// holds the files; `sandboxctl resolve` closes the question through the worker's lock
/// path; the next idle stop proceeds as usual.
async fn row20_mid_turn_disconnect_is_held_with_its_evidence_until_an_owner_resolves_it<
    H: LifecycleHarness,
>() {
    let grace = 2;
    let h = H::start(Options {
        grace_secs: grace,
        turn_secs: 6_000.0,
        // Where commands run for real: one still running when the connection drops.
        turn_command: Some("sleep 20".to_owned()),
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = running_session(&h).await;
    let sid = s.id.as_str().to_owned();
    h.wait_until("the turn runs", H::STEP_TIMEOUT, || async {
        Ok(h.client().get_session(&sid).await?.status == SessionStatus::InProgress)
    })
    .await
    .unwrap();
    let task = h.live(&env).await.unwrap().remove(0);
    if H::TURN_RUNS_IN.is_some() {
        h.wait_until(
            "the command runs in the executor",
            H::STEP_TIMEOUT,
            || async { Ok(!sandbox_e2e::os_commands_in(&env, "sleep 20").is_empty()) },
        )
        .await
        .unwrap();
    }
    // The executor loses its connection mid-command; its process (its task) lives on.
    h.client().drop_executor(&env).await.unwrap();
    wait_idle(&h, &s).await;
    h.wait_until("evidence recorded", H::STEP_TIMEOUT, || async {
        Ok(h.record(&env)
            .await?
            .is_some_and(|r| r.holding_evidence().is_some()))
    })
    .await
    .unwrap();
    let record = h.record(&env).await.unwrap().unwrap();
    let e = record.holding_evidence().unwrap().clone();
    assert_eq!(e.trigger, EvidenceTrigger::MidTurnDisconnect);
    let turns = h.client().list_turns(&sid).await.unwrap().data;
    assert_eq!(e.turn.as_ref().unwrap().id, turns[0].id);
    assert!(
        e.tools
            .iter()
            .any(|t| t.kind == "command_execution" && t.status == ItemStatus::Failed),
        "{e:?}"
    );
    assert_eq!(
        e.workspace.live_in.as_ref().map(|i| &i.instance_id),
        Some(&task.instance_id)
    );
    assert_eq!(e.effect, EffectState::Unknown);
    assert_eq!(
        record.connection.map(|c| c.status),
        Some(sandbox_core::environment::EnvironmentStatus::Disconnected)
    );
    assert!(record.last_reconciled_event_id.is_some());

    let explain = h.sandboxctl(&["explain", &sid, "--json"]).await;
    assert_eq!(
        explain.code, 1,
        "a held environment is a problem: {explain:?}"
    );
    let doc = explain.json();
    let shown = &doc["reconciliation"][0];
    assert_eq!(shown["trigger"], "mid_turn_disconnect", "{doc:#}");
    assert_eq!(shown["open"], true);
    assert_eq!(shown["holds_compute"], true);
    assert_eq!(shown["effect"], "unknown");
    assert_eq!(shown["turn"]["id"], turns[0].id.as_str());
    assert_eq!(shown["tools"][0]["status"], "failed");
    assert_eq!(
        shown["workspace"]["live_in"]["instance_id"],
        task.instance_id.as_str()
    );
    assert_eq!(doc["connection"]["status"], "disconnected");

    // Well past the grace, sweeps included: no lease, no stop.
    for _ in 0..3 {
        h.controller().sweep().await.unwrap();
        tokio::time::sleep(Duration::from_secs(grace)).await;
    }
    assert_eq!(
        h.live(&env).await.unwrap().len(),
        1,
        "the held compute runs"
    );
    assert!(stop_reasons(&h, &env).await.is_empty());
    let record = h.record(&env).await.unwrap().unwrap();
    assert!(record.lease.is_none());
    assert_eq!(record.evidence.len(), 1, "recorded once");

    let resolved = h
        .sandboxctl(&[
            "resolve",
            "--yes",
            &sid,
            "--effect",
            "observed",
            "--note",
            "the command's effect is in place",
            "--by",
            "e2e-owner",
            "--wait",
            "--timeout-secs",
            "40",
            "--json",
        ])
        .await;
    assert_eq!(resolved.code, 0, "{resolved:?}");
    let doc = resolved.json();
    assert_eq!(doc["resolved"], true, "{doc:#}");
    assert_eq!(doc["open"], 1);
    let record = h.record(&env).await.unwrap().unwrap();
    let r = record.evidence[0].resolution.as_ref().unwrap();
    assert_eq!(
        (r.effect, r.by.as_str()),
        (EffectState::Observed, "e2e-owner")
    );

    // Released: the resolve's recheck takes the lease, the lease stops it as usual.
    h.wait_until("the idle stop after the resolve", H::STEP_TIMEOUT, || {
        h.stopped_and_recorded(&env)
    })
    .await
    .unwrap();
    assert_eq!(stop_reasons(&h, &env).await, vec!["lease_expired"]);
    assert_eq!(status(&h, &task).await, ComputeStatus::Stopped);
    let sim = h.client().state().await.unwrap();
    assert_eq!(sim.session(&sid).unwrap().turns, 1, "no input resubmitted");
    h.shutdown().await.unwrap();
}

/// Row 21: an application reports timed-out submissions; the worker reads the
/// session, turns and items and records what became of each — completed, still running,
/// never started — and never submits anything.
async fn row21_timed_out_submissions_are_answered_from_turn_evidence_never_resubmitted<
    H: LifecycleHarness,
>() {
    let h = H::start(Options {
        grace_secs: 600,
        turn_secs: 600.0,
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = running_session(&h).await;
    let sid = s.id.as_str().to_owned();
    wait_idle(&h, &s).await;
    let done = h.client().list_turns(&sid).await.unwrap().data[0]
        .id
        .clone();
    let report = |turn: String| {
        let h = &h;
        let sid = sid.clone();
        async move {
            h.sandboxctl(&[
                "report-timeout",
                &sid,
                "--turn",
                &turn,
                "--wait",
                "--timeout-secs",
                "40",
                "--json",
            ])
            .await
        }
    };
    let out = report(done.clone()).await;
    assert_eq!(out.code, 0, "{out:?}");
    let doc = out.json();
    assert_eq!(doc["outcome"], "completed", "{doc:#}");
    assert_eq!(doc["evidence"]["turn"]["id"], done.as_str());

    // A second input: its turn runs (10 real seconds).
    h.client().submit_message(&sid, "more").await.unwrap();
    let running = h.client().list_turns(&sid).await.unwrap().data[1]
        .id
        .clone();
    let out = report(running.clone()).await;
    assert_eq!(out.code, 0, "{out:?}");
    let doc = out.json();
    assert_eq!(doc["outcome"], "still_running", "{doc:#}");

    // A submission that never became a turn, reported with the documented events-queue
    // message (events/jobs/timeout_reported.schema.json).
    let sim_now = h.client().state().await.unwrap().now;
    let body = serde_json::json!({
        "trigger": {"kind": "timeout_reported", "submitted_at": sim_now + 3_600},
        "session_id": sid,
        "environment_id": env,
        "enqueued_at": agents_sim::real_unix_secs(),
    });
    let schema: serde_json::Value = serde_json::from_str(include_str!(
        "../../../events/jobs/timeout_reported.schema.json"
    ))
    .unwrap();
    assert!(jsonschema::is_valid(&schema, &body), "{body}");
    let job: Job = serde_json::from_value(body).unwrap();
    h.controller()
        .events
        .send(Outgoing {
            group: sid.clone(),
            dedup_id: format!("timeout-{sid}-never"),
            delay_secs: 0,
            job,
        })
        .await
        .unwrap();
    h.wait_until("not_found recorded", H::STEP_TIMEOUT, || async {
        Ok(h.record(&env).await?.is_some_and(|r| {
            r.evidence
                .iter()
                .any(|e| e.submission == Some(SubmissionOutcome::NotFound))
        }))
    })
    .await
    .unwrap();
    let record = h.record(&env).await.unwrap().unwrap();
    let outcomes: Vec<_> = record
        .evidence
        .iter()
        .filter(|e| e.trigger == EvidenceTrigger::InputTimedOut)
        .map(|e| (e.turn.as_ref().map(|t| t.id.clone()), e.submission.unwrap()))
        .collect();
    assert_eq!(
        outcomes,
        vec![
            (Some(done), SubmissionOutcome::Completed),
            (Some(running), SubmissionOutcome::StillRunning),
            (None, SubmissionOutcome::NotFound),
        ]
    );
    let sim = h.client().state().await.unwrap();
    assert_eq!(sim.session(&sid).unwrap().turns, 2, "no input resubmitted");
    assert_eq!(h.live(&env).await.unwrap().len(), 1);
    h.shutdown().await.unwrap();
}

// ------------------------------------------------------------------ ceilings

async fn ceiling_idle_executor_past_its_max_lifetime_is_stopped_then_new_input_starts_a_fresh_generation<
    H: LifecycleHarness,
>() {
    // A long grace: only the lifetime can stop the executor here.
    let h = H::start(Options {
        grace_secs: 600,
        ceilings: |p| {
            p.max_lifetime_secs = 4;
            p.lifetime_hard_cap_secs = 0;
            p.no_work_secs = 0;
        },
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = running_session(&h).await;
    wait_idle(&h, &s).await;
    let first = h.live(&env).await.unwrap().remove(0);
    sweep_until(&h, "lifetime stop recorded", || {
        h.stopped_and_recorded(&env)
    })
    .await;
    assert_eq!(status(&h, &first).await, ComputeStatus::Stopped);
    assert_eq!(stop_reasons(&h, &env).await, vec!["lifetime_exceeded"]);
    assert_executor_processes::<H>(&env, 0);
    // The API sees the executor gone before the next input (on moto the harness's bridge
    // disconnects a stopped task's environment on its next poll); otherwise the simulator
    // runs the turn on the old connection and requests none.
    h.wait_until("the environment disconnected", H::STEP_TIMEOUT, || async {
        Ok(h.client().get_environment(&env).await?.status
            != sandbox_core::environment::EnvironmentStatus::Connected)
    })
    .await
    .unwrap();
    // New input: the connection request starts generation 2 as usual.
    h.client()
        .submit_message(s.id.as_str(), "again")
        .await
        .unwrap();
    h.wait_until("a fresh generation", H::STEP_TIMEOUT, || async {
        Ok(h.record(&env)
            .await?
            .is_some_and(|r| r.generation == Generation(2)))
    })
    .await
    .unwrap();
    h.shutdown().await.unwrap();
}

async fn ceiling_remote_url_not_on_the_allowlist_starts_no_executor_and_is_reconciled<
    H: LifecycleHarness,
>() {
    // The production default: https://api.openai.com only; the simulator's remote_url is
    // http://127.0.0.1:PORT/...
    let h = H::start(Options {
        ceilings: |p| p.remote_url_allowlist = vec!["api.openai.com"].into(),
        ..Options::default()
    })
    .await
    .unwrap();
    let (_, env) = h.session_with_input().await.unwrap();
    h.wait_until("the refusal audited", H::STEP_TIMEOUT, || async {
        Ok(h.audit(&env)
            .await?
            .iter()
            .any(|a| a.outcome == "reconcile" && a.reason.contains("remote_url_not_allowed")))
    })
    .await
    .unwrap();
    let entry = h
        .audit(&env)
        .await
        .unwrap()
        .into_iter()
        .find(|a| a.outcome == "reconcile")
        .unwrap();
    assert!(entry.reason.contains("127.0.0.1"), "{}", entry.reason);
    assert!(
        !entry.reason.contains("/connect"),
        "the URL is never echoed"
    );
    assert!(h.sim().wait_deliveries_idle(H::STEP_TIMEOUT).await);
    tokio::time::sleep(H::SETTLE).await;
    assert!(h.live(&env).await.unwrap().is_empty());
    assert!(instances_of(&h, &env).await.is_empty(), "no compute at all");
    assert_eq!(connect_count(&h, &env).await, 0);
    assert_executor_processes::<H>(&env, 0);
    h.shutdown().await.unwrap();
}

async fn ceiling_session_waiting_on_a_function_call_with_no_work_stops_its_executor_as_no_work<
    H: LifecycleHarness,
>() {
    // Simulated time at the real rate, so `last_active_at` is on the controller's clock; a
    // 3 s no-work period, a 2 s grace (the no-work lease), no lifetime.
    let h = H::start(Options {
        grace_secs: 3,
        turn_secs: 1.0,
        sim_time_scale: 1.0,
        sim_connect_deadline_secs: 600.0,
        ceilings: |p| {
            p.no_work_secs = 3;
            p.max_lifetime_secs = 0;
        },
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = running_session(&h).await;
    wait_idle(&h, &s).await;
    // The session now waits on a function call: busy (the idle lease, if one was taken,
    // is cancelled), yet there is no work for the executor.
    h.client()
        .require_function_call(s.id.as_str())
        .await
        .unwrap();
    let first = h.live(&env).await.unwrap().remove(0);
    sweep_until(&h, "no-work stop recorded", || h.stopped_and_recorded(&env)).await;
    assert_eq!(status(&h, &first).await, ComputeStatus::Stopped);
    assert_eq!(stop_reasons(&h, &env).await, vec!["no_work"]);
    let audit = h.audit(&env).await.unwrap();
    let outcomes: Vec<&str> = audit.iter().map(|a| a.outcome.as_str()).collect();
    let lease_at = audit
        .iter()
        .position(|a| {
            a.outcome == "schedule-stop" && a.reason.contains("no turn and no connection request")
        })
        .unwrap_or_else(|| panic!("a no-work lease: {outcomes:?}"));
    let stop_at = audit
        .iter()
        .rposition(|a| a.outcome == "stop" && a.reason.contains("no-work lease due"))
        .unwrap_or_else(|| panic!("the no-work stop: {outcomes:?}"));
    assert!(lease_at < stop_at, "{outcomes:?}");
    assert_eq!(
        h.client().get_session(s.id.as_str()).await.unwrap().status,
        SessionStatus::RequiresAction,
        "the session still waits on its function call"
    );
    assert_executor_processes::<H>(&env, 0);
    h.shutdown().await.unwrap();
}

async fn ceiling_executors_that_never_connect_are_replaced_up_to_the_cap_then_reconciled<
    H: LifecycleHarness,
>() {
    // Executors run but never connect; a 2 s connect deadline, at most 2 replacements per
    // hour. The simulator's own connection wait is a day, so the session keeps asking.
    let h = H::start(Options {
        executors_never_connect: true,
        sim_connect_deadline_secs: 86_400.0,
        ceilings: |p| {
            p.connect_deadline_secs = 2;
            p.max_replacements = 2;
            p.replacement_window_secs = 3_600;
            p.no_work_secs = 0;
            p.max_lifetime_secs = 0;
        },
        ..Options::default()
    })
    .await
    .unwrap();
    let (_, env) = h.session_with_input().await.unwrap();
    h.wait_until("the cap reached", Duration::from_secs(90), || async {
        Ok(h.audit(&env)
            .await?
            .iter()
            .any(|a| a.outcome == "reconcile" && a.reason.contains("without connecting")))
    })
    .await
    .unwrap();
    h.wait_until("nothing live", H::STEP_TIMEOUT, || async {
        Ok(h.live(&env).await?.is_empty())
    })
    .await
    .unwrap();
    assert_eq!(
        stop_reasons(&h, &env).await,
        vec!["replaced", "replaced", "replacement_cap"]
    );
    let record = h.record(&env).await.unwrap().unwrap();
    assert_eq!(record.replacements.len(), 2, "{record:?}");
    assert_eq!(record.status, RecordStatus::Stopped);
    assert_eq!(record.generation, Generation(3));
    // Held: the session still asks for a connection, nothing new starts in the window.
    h.controller().sweep().await.unwrap();
    tokio::time::sleep(H::SETTLE).await;
    assert!(h.live(&env).await.unwrap().is_empty());
    assert_eq!(instances_of(&h, &env).await.len(), 3);
    assert_eq!(connect_count(&h, &env).await, 0);
    assert_executor_processes::<H>(&env, 0);
    h.shutdown().await.unwrap();
}

async fn ceiling_at_the_executor_cap_a_second_start_waits_until_the_first_executor_stops<
    H: LifecycleHarness,
>() {
    // A cap of one executor per deployment. The simulator's own connection wait is a day,
    // so session B keeps asking while it waits for the slot A holds.
    let h = H::start(Options {
        sim_connect_deadline_secs: 86_400.0,
        turn_secs: 240.0,
        ceilings: |p| {
            p.max_executors = 1;
            p.no_work_secs = 0;
            p.max_lifetime_secs = 0;
        },
        ..Options::default()
    })
    .await
    .unwrap();
    let (_a, env_a) = running_session(&h).await;
    // A's turn (4 real s) and its grace keep A's executor while B asks.
    let (b, env_b) = h.session_with_input().await.unwrap();
    // Never more than one live executor, sampled until B's executor connects.
    let live_both =
        || async { anyhow::Ok(h.live(&env_a).await?.len() + h.live(&env_b).await?.len()) };
    h.wait_until("B waits at the cap", H::STEP_TIMEOUT, || async {
        assert!(live_both().await? <= 1, "more executors than the cap");
        Ok(h.audit(&env_b)
            .await?
            .iter()
            .any(|a| a.outcome == "wait" && a.reason.starts_with("capacity_limit: 1 executor")))
    })
    .await
    .unwrap();
    assert!(
        h.live(&env_b).await.unwrap().is_empty(),
        "B started beyond the cap"
    );
    assert_eq!(
        h.live(&env_a).await.unwrap().len(),
        1,
        "A keeps its executor"
    );
    // The operator sees the wait: `sandboxctl status` shows B's last decision deferred.
    let doc = h.sandboxctl(&["status", "--json"]).await.json();
    let shown = doc["environments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["environment_id"] == env_b.as_str())
        .unwrap_or_else(|| panic!("B in the status: {doc:#}"))
        .clone();
    let last = &shown["last_decision"];
    assert_eq!(last["outcome"], "wait", "{shown:#}");
    assert!(
        last["reason"]
            .as_str()
            .unwrap()
            .starts_with("capacity_limit"),
        "{shown:#}"
    );
    assert_eq!(last["deferred"], true, "{shown:#}");
    // A goes idle, its lease stops it, the slot frees and B's next look starts B.
    h.wait_until(
        "B connected once A stopped",
        Duration::from_secs(90),
        || async {
            assert!(live_both().await? <= 1, "more executors than the cap");
            h.connected(&env_b).await
        },
    )
    .await
    .unwrap();
    assert!(h.live(&env_a).await.unwrap().is_empty());
    assert_eq!(stop_reasons(&h, &env_a).await, vec!["lease_expired"]);
    let audit_b = h.audit(&env_b).await.unwrap();
    let waited = audit_b
        .iter()
        .position(|a| a.outcome == "wait" && a.reason.starts_with("capacity_limit"))
        .unwrap();
    let started = audit_b
        .iter()
        .position(|a| a.outcome == "start")
        .unwrap_or_else(|| panic!("B started: {audit_b:?}"));
    assert!(waited < started);
    assert!(
        audit_b[waited]
            .applied
            .iter()
            .all(|e| e["effect"] != "start_compute"),
        "a wait at the cap starts nothing"
    );
    // B's turn runs on its executor.
    wait_idle(&h, &b).await;
    assert_executor_processes::<H>(&env_b, 1);
    h.shutdown().await.unwrap();
}
