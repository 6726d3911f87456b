//! The operator's recovery drill on the AWS backend (moto), and the operator's write
//! commands there: only `sandboxctl --backend aws`, configured with the worker's own
//! environment variables, is used to look and to act.
//!
//! The drill: a worker (the worker function's cold start, `e2e-aws-worker`) is killed
//! between `RunTask` and the record (`SANDBOX_CRASH_AT=after-compute-start`); the operator
//! sees the task as an orphan; the worker restarts, finds the effect-key lock unclean,
//! reads that environment's own live tasks (ListTasks by its `startedBy`, one call) and
//! adopts the task — still one task, no second RunTask (had it started, it would have
//! replayed the same idempotency token, which ECS answers with the dead worker's task;
//! the workers reach moto through [`EcsIdempotencyProxy`], which counts such replays). The operator finds the task by its ARN, sees it recorded, closes the session and
//! reads two receipts (session deleted; compute stopped, read back) and the terminal record.

use aws_sdk_sqs::Client as SqsClient;
use sandbox_controller::job::Job;
use sandbox_controller::ports::{
    Clock as _, Compute as _, Fence, Outgoing, Queue as _, Registry as _, Release, SystemClock,
};
use sandbox_core::compute::ComputeStatus;
use sandbox_core::ids::{EnvironmentId, InstanceId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::record::{Record, StartFailure};
use sandbox_e2e::aws_stack::{AwsResources, moto_endpoint, unique};
use sandbox_e2e::ecs_idempotency_proxy::EcsIdempotencyProxy;
use sandbox_e2e::operator_cli::{CtlOutput, sandboxctl};
use sandbox_e2e::workspace_binary;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The environment the worker functions get (and so the operator's shell).
fn worker_env(
    r: &AwsResources,
    endpoint: &str,
    deployment: &str,
    secret_arn: &str,
    agents_api: &str,
) -> Vec<(String, String)> {
    [
        ("AWS_ENDPOINT_URL", endpoint.to_owned()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("EVENTS_QUEUE_URL", r.queues.events_url.clone()),
        ("TIMERS_QUEUE_URL", r.queues.timers_url.clone()),
        ("SWEEP_QUEUE_URL", r.queues.sweep_url.clone()),
        ("TABLE_NAME", r.table.clone()),
        ("ECS_CLUSTER", r.ecs.cluster.clone()),
        ("TASK_DEFINITION", r.ecs.task_definition.clone()),
        ("CONTAINER_NAME", r.ecs.container_name.clone()),
        ("SUBNETS", r.ecs.subnets.join(",")),
        ("SECURITY_GROUPS", r.ecs.security_groups.join(",")),
        ("DEPLOYMENT_ID", deployment.into()),
        ("OPENAI_API_KEY_SECRET_ARN", secret_arn.into()),
        ("AGENTS_API_BASE_URL", agents_api.into()),
        // The simulator's remote_url is http://127.0.0.1:PORT/... (the remote URL allowlist).
        ("REMOTE_URL_ALLOWLIST", "http://127.0.0.1".into()),
        // No executor connects in the drill: a connect deadline longer than the drill, so
        // a slow run never replaces the task the drill follows.
        ("CONNECT_DEADLINE_SECS", "3600".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

async fn ctl(args: &[&str], env: &[(String, String)]) -> CtlOutput {
    let mut all = vec!["--backend", "aws"];
    all.splice(0..0, args.iter().copied());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    sandboxctl(&all, &env).await
}

/// Kills the worker processes a failed assertion would leave running.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn worker(env: &[(String, String)], crash: bool) -> Child {
    let mut cmd = Command::new(workspace_binary("e2e-aws-worker").unwrap());
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("E2E_VISIBILITY_SECS", "2")
        // A lease a loaded moto cannot outrun (a job's dozen calls can take seconds
        // each there); the restarted worker takes the dead one's lock over when it ends.
        .env("E2E_LOCK_TTL_SECS", "15")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if crash {
        cmd.env("SANDBOX_CRASH_AT", "after-compute-start");
    }
    cmd.spawn().unwrap()
}

async fn api_key_secret(r: &AwsResources) -> String {
    aws_sdk_secretsmanager::Client::new(&r.sdk)
        .create_secret()
        .name(format!("drill-{}", unique()))
        .secret_string(agents_sim::DEFAULT_API_KEY)
        .send()
        .await
        .unwrap()
        .arn()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_recovery_drill_killed_worker_task_found_adopted_closed_with_two_receipts() {
    let r = AwsResources::create().await.unwrap();
    // The submission waits for its executor; give the simulator's input-time connection
    // deadline a day, so a slow restart (a loaded machine) never turns the session idle
    // before the drill is over.
    let sim =
        agents_sim::spawn(agents_sim::SimConfig::default().with_connect_deadline_secs(86_400.0))
            .await
            .unwrap();
    let client = sim.client();
    let deployment = format!("drill-{}", unique());
    let secret = api_key_secret(&r).await;
    let env = worker_env(&r, &moto_endpoint(), &deployment, &secret, &sim.base_url());
    let proxy = EcsIdempotencyProxy::start(&moto_endpoint()).await.unwrap();
    let workers_env = worker_env(&r, &proxy.url, &deployment, &secret, &sim.base_url());

    // A session that needs its executor, and the job the webhook function enqueues for it.
    let s = client
        .create_session(agents_sim::SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let environment = s.self_hosted().unwrap().id.as_str().to_owned();
    let session = s.id.as_str().to_owned();
    client.submit_message(&session, "go").await.unwrap();
    r.events()
        .send(Outgoing {
            group: session.clone(),
            dedup_id: "msg_drill".into(),
            delay_secs: 0,
            job: Job {
                handoffs: 0,
                trigger: Trigger::ConnectionRequested,
                session_id: SessionId::new(session.as_str()),
                environment_id: Some(EnvironmentId::new(environment.as_str())),
                webhook_id: Some("msg_drill".into()),
                enqueued_at: SystemClock.now(),
                swept: None,
                operator_proof: None,
            },
        })
        .await
        .unwrap();

    // The worker dies between RunTask and the record.
    let mut workers = Workers(vec![worker(&workers_env, true)]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = workers.0[0].try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the crash point never fired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!status.success(), "aborted at the crash point: {status:?}");

    // The operator: a task of this deployment runs with no record — an orphan (exit 1).
    let out = ctl(&["status", "--json"], &env).await;
    assert_eq!(out.code, 1, "{out:?}");
    let doc = out.json();
    assert_eq!(
        doc["environments"],
        serde_json::json!([]),
        "nothing recorded"
    );
    let orphans = doc["orphans"].as_array().unwrap();
    assert_eq!(orphans.len(), 1, "{doc:#}");
    assert_eq!(orphans[0]["environment_id"], environment.as_str());
    assert_eq!(orphans[0]["provider_status"], "running");
    let task = orphans[0]["instance_id"].as_str().unwrap().to_owned();
    assert!(task.starts_with("arn:aws:ecs:"), "{task}");

    // Restart: the job comes back; the operator finds the task by its ARN, recorded.
    workers.0.push(worker(&workers_env, false));
    let deadline = Instant::now() + Duration::from_secs(90);
    let explained = loop {
        let out = ctl(&["explain", "--json", &task], &env).await;
        if out.code == 0 {
            let doc = out.json();
            if doc["record"]["instance"]["instance_id"] == task.as_str() {
                break doc;
            }
        }
        assert!(Instant::now() < deadline, "never adopted: {out:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(explained["resolved_as"], "compute");
    assert_eq!(explained["environment_id"], environment.as_str());
    assert_eq!(
        explained["record"]["generation"], 1,
        "the dead worker's generation"
    );
    let recorded: Vec<&serde_json::Value> = explained["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| ["start", "adopt"].contains(&e["outcome"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(
        recorded.len(),
        1,
        "one decision recorded the task: {explained:#}"
    );
    // The restarted worker found the lock unclean and read the environment's own live
    // tasks (ListTasks by its startedBy): it adopted the dead worker's task without
    // sending RunTask again (a start would have replayed the same clientToken).
    assert_eq!(
        *proxy.replays.lock().unwrap(),
        0,
        "adopted from the environment's live tasks, no RunTask replayed"
    );
    let out = ctl(&["status", "--json"], &env).await;
    assert_eq!(out.code, 0, "{out:?}");
    let doc = out.json();
    assert_eq!(doc["orphans"], serde_json::json!([]));
    assert_eq!(
        doc["environments"][0]["instance"]["instance_id"],
        task.as_str()
    );
    assert_eq!(
        doc["environments"][0]["instance"]["provider_status"],
        "running"
    );
    let live: Vec<_> = r
        .compute()
        .list(&sandbox_core::ids::DeploymentId::new(deployment.as_str()).unwrap())
        .await
        .unwrap()
        .into_iter()
        .filter(|i| i.status.is_live())
        .collect();
    assert_eq!(live.len(), 1, "exactly one task: {live:?}");

    // Close through the worker: two receipts (and the close's workspace receipt: `none`,
    // this harness configures no EBS workspace volume), the terminal record.
    let out = ctl(
        &[
            "close",
            "--yes",
            "--wait",
            "--timeout-secs",
            "90",
            "--json",
            &session,
        ],
        &env,
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    let doc = out.json();
    assert_eq!(doc["result"]["closed"], true);
    let mut kinds: Vec<String> = doc["result"]["receipts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap().to_owned())
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        ["compute_stopped", "session_deleted", "workspace_closed"]
    );
    let doc = ctl(&["explain", "--json", &task], &env).await.json();
    let t = &doc["terminal"];
    assert_eq!(t["session_deleted"]["confirmed"], true);
    assert_eq!(t["compute_stopped"]["instance_id"], task.as_str());
    assert_eq!(t["compute_stopped"]["read_back"], "stopped");
    // The close stored its terminal record; the credential note says what to
    // rotate and where.
    assert_eq!(t["stored"], true);
    assert_eq!(t["executor_revoked"], false);
    assert_eq!(t["executor_credential"]["revoked"], false);
    assert!(
        t["executor_credential"]["rotate"]
            .as_str()
            .unwrap()
            .contains("new restricted environment key"),
        "{t}"
    );
    assert!(
        !t["executor_credential"]["location"]
            .as_str()
            .unwrap()
            .is_empty()
    );
    assert_eq!(t["workspace_disposition"], "none");
    let text = ctl(&["explain", &session], &env).await;
    assert_eq!(text.code, 0, "{text:?}");
    assert!(
        text.stdout.contains("compute stopped:       yes"),
        "{}",
        text.stdout
    );
    let stopped = r
        .compute()
        .describe(&InstanceId::new(task.as_str()))
        .await
        .unwrap();
    assert_eq!(stopped.map(|i| i.status), Some(ComputeStatus::Stopped));
    let out = ctl(&["status", "--json"], &env).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.json()["environments"][0]["status"], "closed");
    drop(workers);
    sim.shutdown().await;
}

/// The seed 002 drill on AWS, whole. A worker dies between `RunTask`
/// and the record; after the restart adopts the task, the operator runs `sweep --dry-run`
/// (decisions printed, nothing enqueued, nothing written) and `sweep` (one job per
/// environment, which the worker decides) on the AWS backend; the application reports
/// that its input submission timed out, the worker answers it from the turn (still
/// waiting: never resubmitted, seed 001: "do not resubmit while the original request is
/// still waiting"), the owner resolves the uncertain outcome, and only then the close
/// deletes the session and stops the task, ending with the stored terminal record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_drill_sweeps_and_resolves_after_restart() {
    let r = AwsResources::create().await.unwrap();
    let sim =
        agents_sim::spawn(agents_sim::SimConfig::default().with_connect_deadline_secs(86_400.0))
            .await
            .unwrap();
    let client = sim.client();
    let deployment = format!("drill-{}", unique());
    let secret = api_key_secret(&r).await;
    let env = worker_env(&r, &moto_endpoint(), &deployment, &secret, &sim.base_url());
    let proxy = EcsIdempotencyProxy::start(&moto_endpoint()).await.unwrap();
    let workers_env = worker_env(&r, &proxy.url, &deployment, &secret, &sim.base_url());

    let s = client
        .create_session(agents_sim::SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let environment = s.self_hosted().unwrap().id.as_str().to_owned();
    let session = s.id.as_str().to_owned();
    let submitted = client
        .submit_message(&session, "go")
        .await
        .unwrap()
        .expect("the simulator names the submission's turn");
    r.events()
        .send(Outgoing {
            group: session.clone(),
            dedup_id: "msg_drill_2".into(),
            delay_secs: 0,
            job: Job {
                handoffs: 0,
                trigger: Trigger::ConnectionRequested,
                session_id: SessionId::new(session.as_str()),
                environment_id: Some(EnvironmentId::new(environment.as_str())),
                webhook_id: Some("msg_drill_2".into()),
                enqueued_at: SystemClock.now(),
                swept: None,
                operator_proof: None,
            },
        })
        .await
        .unwrap();

    // The worker dies between RunTask and the record; a new one adopts the task.
    let mut workers = Workers(vec![worker(&workers_env, true)]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while workers.0[0].try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the crash point never fired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    workers.0.push(worker(&workers_env, false));
    let key = EnvironmentId::new(environment.as_str()).effect_key();
    let deadline = Instant::now() + Duration::from_secs(90);
    let adopted = loop {
        if let Some(rec) = r.registry().get(&key).await.unwrap()
            && rec.instance.is_some()
        {
            break rec;
        }
        assert!(Instant::now() < deadline, "never adopted");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let task = adopted
        .instance
        .as_ref()
        .unwrap()
        .instance_id
        .as_str()
        .to_owned();
    // Let the restarted worker finish with the job (its release) before the sweep reads.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // sweep --dry-run on AWS: the decision for the environment, nothing enqueued, nothing
    // written (the record's version and the audit trail are unchanged).
    let before = r.registry().get(&key).await.unwrap().unwrap();
    let audit_before = ctl(&["explain", "--json", &task], &env).await.json()["timeline"]
        .as_array()
        .unwrap()
        .len();
    let dry = ctl(&["sweep", "--dry-run", "--json"], &env).await;
    assert_eq!(dry.code, 0, "{dry:?}");
    let doc = dry.json();
    assert_eq!(doc["dry_run"], true);
    assert_eq!(doc["enqueued"], 0);
    let mine: Vec<&serde_json::Value> = doc["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["environment_id"] == environment.as_str())
        .collect();
    assert_eq!(mine.len(), 1, "{doc:#}");
    let after = r.registry().get(&key).await.unwrap().unwrap();
    assert_eq!(after.version, before.version, "a dry run writes nothing");
    let audit_after = ctl(&["explain", "--json", &task], &env).await.json()["timeline"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(
        audit_after, audit_before,
        "a dry run decides nothing for real"
    );

    // sweep on AWS: one job for the environment, decided by the worker (an audit entry
    // with the sweep trigger).
    let swept = ctl(&["sweep", "--json"], &env).await;
    assert_eq!(swept.code, 0, "{swept:?}");
    assert!(swept.json()["enqueued"].as_u64().unwrap() >= 1, "{swept:?}");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let doc = ctl(&["explain", "--json", &task], &env).await.json();
        let decided = doc["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "decision" && e["trigger"]["kind"] == "sweep");
        if decided {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sweep job was never decided: {doc:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The application's submission timed out: the worker reads the session and its turn
    // and records the outcome (the original is still waiting for its executor); nothing is
    // resubmitted.
    let out = ctl(
        &[
            "report-timeout",
            &session,
            "--turn",
            &submitted,
            "--wait",
            "--timeout-secs",
            "90",
            "--json",
        ],
        &env,
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    let doc = out.json();
    assert_eq!(doc["outcome"], "still_running", "{doc:#}");
    assert_eq!(doc["evidence"]["turn"]["id"], submitted.as_str());
    let held = r.registry().get(&key).await.unwrap().unwrap();
    assert_eq!(held.open_evidence().count(), 1, "{held:?}");

    // The owner resolves the uncertain outcome (seed 002: "resolve any uncertain input
    // outcome"), then closes: two receipts and the stored terminal record.
    let out = ctl(
        &[
            "resolve",
            "--yes",
            &session,
            "--effect",
            "not_needed",
            "--note",
            "the original submission is still waiting; not resubmitted",
            "--by",
            "drill-owner",
            "--wait",
            "--timeout-secs",
            "90",
            "--json",
        ],
        &env,
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.json()["resolved"], true, "{out:?}");
    let out = ctl(
        &[
            "close",
            "--yes",
            "--wait",
            "--timeout-secs",
            "90",
            "--json",
            &session,
        ],
        &env,
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    let doc = out.json();
    assert_eq!(doc["result"]["closed"], true);
    let mut kinds: Vec<String> = doc["result"]["receipts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap().to_owned())
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        ["compute_stopped", "session_deleted", "workspace_closed"]
    );
    let terminal = r
        .registry()
        .terminal(&key)
        .await
        .unwrap()
        .expect("the close stored its terminal record in DynamoDB");
    assert!(terminal.session_deleted.confirmed);
    assert!(terminal.compute_stopped.confirmed);
    assert_eq!(terminal.effect_reconciliation, "not_needed");
    assert!(!terminal.forced);
    assert!(
        terminal
            .executor_credential
            .location
            .contains("CODEX_API_KEY"),
        "{terminal:?}"
    );
    let doc = ctl(&["explain", "--json", &task], &env).await.json();
    assert_eq!(doc["terminal"]["stored"], true, "{doc:#}");
    assert!(
        client
            .get_session_json(&session)
            .await
            .is_err_and(|e| e.is_not_found()),
        "the session is deleted"
    );
    assert_eq!(
        *proxy.replays.lock().unwrap(),
        0,
        "no RunTask replayed after the restart"
    );
    drop(workers);
    sim.shutdown().await;
}

#[tokio::test]
async fn aws_dead_letters_listed_and_redriven_and_start_failures_reset_through_the_queue() {
    let r = AwsResources::create().await.unwrap();
    let env = worker_env(
        &r,
        &moto_endpoint(),
        &format!("ops-{}", unique()),
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:unused",
        "http://127.0.0.1:9",
    );
    let sqs = SqsClient::new(&r.sdk);
    let stuck = Job {
        handoffs: 10,
        trigger: Trigger::Sweep,
        session_id: SessionId::new("sess_stuck"),
        environment_id: Some(EnvironmentId::new("env_stuck")),
        webhook_id: None,
        enqueued_at: 1,
        swept: None,
        operator_proof: None,
    };
    sqs.send_message()
        .queue_url(&r.queues.events_dlq_url)
        .message_body(serde_json::to_string(&stuck).unwrap())
        .message_group_id("sess_stuck")
        .message_deduplication_id("stuck-1")
        .send()
        .await
        .unwrap();
    sqs.send_message()
        .queue_url(&r.queues.timers_dlq_url)
        .message_body("not a job")
        .send()
        .await
        .unwrap();

    // Listed (twice: a peek leaves them in place), exit 1.
    for _ in 0..2 {
        let out = ctl(&["dlq", "list", "--json"], &env).await;
        assert_eq!(out.code, 1, "{out:?}");
        let doc = out.json();
        assert_eq!(doc["queues"]["events"][0]["job"]["handoffs"], 10);
        assert_eq!(doc["queues"]["timers"][0]["job"], serde_json::Value::Null);
    }
    let out = ctl(&["status", "--json"], &env).await;
    assert_eq!(out.code, 1, "{out:?}");
    assert_eq!(
        out.json()["dead_letters"],
        serde_json::json!({"events": 1, "timers": 1, "sweep": 0})
    );

    // Redriven: the job goes back with its hand-offs reset; the body that is no job stays.
    let out = ctl(&["dlq", "redrive", "--force", "--yes", "--json"], &env).await;
    assert_eq!(out.code, 1, "the timers body stays: {out:?}");
    let doc = out.json();
    assert_eq!(doc["queues"]["events"]["moved"], 1);
    assert_eq!(doc["queues"]["timers"]["moved"], 0);
    assert_eq!(doc["queues"]["timers"]["left"].as_array().unwrap().len(), 1);
    let back = r.events().receive(10, 30, 1000).await.unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(
        back[0].job,
        Job {
            handoffs: 0,
            ..stuck
        }
    );
    r.events().ack(&back[0].receipt).await.unwrap();
    let out = ctl(&["dlq", "list", "--queue", "events", "--json"], &env).await;
    assert_eq!(out.code, 0, "{out:?}");

    // reset-start-failures: a record holding failed starts gets a reset job on the events
    // queue; the registry itself is not written by the tool.
    let registry = r.registry();
    let environment = EnvironmentId::new(format!("env_failing_{}", unique()));
    let key = environment.effect_key();
    let now = SystemClock.now();
    let locked = registry.lock(&key, "test", now + 30, now).await.unwrap();
    assert!(locked.is_some());
    let mut record = Record::new(environment.clone(), SessionId::new("sess_failing"));
    record.start_failure = Some(StartFailure {
        attempts: 5,
        last_failed_at: now,
        kind: Default::default(),
        reason: "RESOURCE:ENI".into(),
    });
    let fence = Fence {
        key: key.clone(),
        owner: "test".into(),
    };
    assert!(
        registry
            .release(
                &fence,
                now,
                Release {
                    record: Some((&record, None)),
                    audit: None,
                    delivery: None,
                    clean: true
                }
            )
            .await
            .unwrap()
    );
    let out = ctl(&["status", "--json"], &env).await;
    assert_eq!(out.code, 1, "at the cap: {out:?}");
    assert_eq!(
        out.json()["environments"][0]["start_failure"]["attempts"],
        5
    );
    let out = ctl(
        &["reset-start-failures", "--json", environment.as_str()],
        &env,
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.json()["enqueued"], true);
    let queued = r.events().receive(10, 30, 1000).await.unwrap();
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].job.trigger, Trigger::ResetStartFailures);
    assert_eq!(queued[0].job.environment_id.as_ref(), Some(&environment));
    let unchanged = registry.get(&key).await.unwrap().unwrap();
    assert_eq!(
        unchanged.start_failure.map(|f| f.attempts),
        Some(5),
        "only the worker clears it"
    );
    let out = ctl(&["reset-start-failures", "env with spaces"], &env).await;
    assert_eq!(out.code, 2, "{out:?}");
    let missing = ctl(&["status"], &env[..4]).await;
    assert_eq!(missing.code, 2, "{missing:?}");
    assert!(missing.stderr.contains("EVENTS_QUEUE_URL"), "{missing:?}");
}
