//! Many environments, every job delivered twice, many workers, on the AWS adapters over
//! moto: exactly one ECS task per environment, and each DynamoDB record names its task.
//!
//! Webhooks are bypassed for determinism: the test creates the sessions in the simulator,
//! submits input (so each requires `environment_connection`), then sends each
//! connection-requested job TWICE to the SQS FIFO events queue, with different webhook
//! ids, de-duplication ids and message groups, so both copies reach (possibly different)
//! workers concurrently and only the effect-key lock (and, for a start whose answer was
//! lost, the RunTask `clientToken` replay) keep it to one task. Every task ever started is
//! counted, stopped ones included (`AwsResources::all_tasks`).
//!
//! Run with `tests/moto/run.sh cargo nextest run -p sandbox-e2e -E 'test(aws)'`.

use sandbox_controller::Job;
use sandbox_controller::ports::{Outgoing, Queue as _};
use sandbox_core::compute::ComputeStatus;
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_e2e::aws_stack::{AwsHarness, AwsOptions};
use sandbox_e2e::{LifecycleHarness as _, Options};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

const ENVIRONMENTS: usize = 200;
const WORKERS: usize = 32;
const DEADLINE: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_concurrency_200_environments_32_workers_duplicated_jobs_yield_one_task_each() {
    let h = AwsHarness::start(AwsOptions {
        common: Options {
            workers: WORKERS,
            // The simulator waits up to 200 real seconds for a connection, a connected
            // turn lasts 10,000 real seconds and the controller's connect deadline and
            // shutdown grace are longer than the test: no session goes idle, no task is
            // replaced or released while the test counts them.
            sim_connect_deadline_secs: 12_000.0,
            turn_secs: 600_000.0,
            grace_secs: 3_600,
            // The sweeper runs, as in production. A release after RunTask can fail here
            // (moto's DynamoDB TransactWriteItems sometimes answers 500 under 32 workers);
            // the next lock holder then reads the environment's own tasks and adopts the
            // unrecorded one, and the sweep is the backstop.
            sweep_every: Some(Duration::from_secs(20)),
            ..Options::default()
        },
        webhooks: false,
        connect_deadline_secs: 3_600,
        // Batches of 10, as the Lambda event source mapping's default: jobs that meet a
        // busy lock are handed off to the timers queue instead of burning receives
        // toward the events queue's dead-letter queue (sandbox_controller::consume).
        receive_batch: 10,
        // The bridge lists all 200 tasks per tick: once a second keeps it from competing
        // with the workers for moto.
        bridge_every: Duration::from_secs(1),
    })
    .await
    .unwrap();

    let mut envs: Vec<(SessionId, EnvironmentId)> = Vec::with_capacity(ENVIRONMENTS);
    for _ in 0..ENVIRONMENTS {
        let s = h
            .client
            .create_session(agents_sim::SessionEnvironment::self_hosted())
            .await
            .unwrap();
        h.client.submit_message(s.id.as_str(), "go").await.unwrap();
        let env = s.self_hosted().unwrap().id.clone();
        envs.push((s.id.clone(), env));
    }
    let state = h.client.state().await.unwrap();
    for (s, _) in &envs {
        let required = &state.session(s.as_str()).unwrap().required_actions;
        assert!(
            required.iter().any(|a| a == "environment_connection"),
            "{s}: {required:?}"
        );
    }

    let started = Instant::now();
    // 400 sends, 16 at a time (sequential sends would compete with 32 busy workers).
    let mut sends = tokio::task::JoinSet::new();
    for copy in 0..2 {
        for (i, (s, env)) in envs.iter().enumerate() {
            if sends.len() >= 16 {
                sends.join_next().await.unwrap().unwrap();
            }
            let webhook_id = format!("wh-{i}-{copy}");
            let job = Job {
                handoffs: 0,
                swept: None,
                trigger: Trigger::ConnectionRequested,
                session_id: s.clone(),
                environment_id: Some(env.clone()),
                webhook_id: Some(webhook_id.clone()),
                enqueued_at: agents_sim::real_unix_secs(),
            };
            let events = h.controller().events.clone();
            let msg = Outgoing {
                job,
                dedup_id: webhook_id,
                // One group per copy: the two copies are not serialized by FIFO order.
                group: format!("{s}-{copy}"),
                delay_secs: 0,
            };
            sends.spawn(async move { events.send(msg).await.unwrap() });
        }
    }
    while let Some(r) = sends.join_next().await {
        r.unwrap();
    }
    let sent = started.elapsed();

    let wanted: HashSet<&str> = envs.iter().map(|(_, e)| e.as_str()).collect();
    let mut last = (0, 0);
    loop {
        let instances = h.instances().await.unwrap();
        let running = instances
            .iter()
            .filter(|i| i.status == ComputeStatus::Running)
            .count();
        let mut recorded = 0;
        if running == ENVIRONMENTS {
            for (_, env) in &envs {
                if h.record(env.as_str())
                    .await
                    .unwrap()
                    .is_some_and(|r| r.instance.is_some())
                {
                    recorded += 1;
                }
            }
            if recorded == ENVIRONMENTS {
                break;
            }
        }
        if (running, recorded) != last {
            eprintln!(
                "{:>6.1}s: {running} tasks RUNNING, {recorded} records",
                started.elapsed().as_secs_f64()
            );
            last = (running, recorded);
        }
        assert!(
            started.elapsed() < DEADLINE,
            "after {DEADLINE:?}: {running} RUNNING tasks, {recorded} records"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let converged = started.elapsed();
    // Let duplicates and rechecks still in flight settle, then look again.
    h.wait_until("events queue drained", DEADLINE, || async {
        Ok(sqs_visible_and_in_flight(&h).await == 0)
    })
    .await
    .unwrap();
    let drained = started.elapsed();

    eprintln!(
        "aws_concurrency: {ENVIRONMENTS} environments x 2 jobs, {WORKERS} workers: sent in \
         {:.1}s, {ENVIRONMENTS} tasks RUNNING and recorded after {:.1}s, queue drained after \
         {:.1}s (wall time from the first send)",
        sent.as_secs_f64(),
        converged.as_secs_f64(),
        drained.as_secs_f64()
    );
    let instances = h.resources.all_tasks().await.unwrap();
    let mut per_env: HashMap<&str, Vec<_>> = HashMap::new();
    for i in &instances {
        per_env
            .entry(i.environment_id.as_str())
            .or_default()
            .push(i);
    }
    assert_eq!(
        instances.len(),
        ENVIRONMENTS,
        "one task ever per environment"
    );
    assert_eq!(
        per_env.keys().copied().collect::<HashSet<_>>(),
        wanted,
        "tasks exactly for the environments"
    );
    for (_, env) in &envs {
        let tasks = &per_env[env.as_str()];
        assert_eq!(tasks.len(), 1, "{env}: {tasks:?}");
        assert_eq!(tasks[0].status, ComputeStatus::Running, "{env}");
        let record = h.record(env.as_str()).await.unwrap().expect("record");
        assert_eq!(
            record.instance.as_ref().map(|i| &i.instance_id),
            Some(&tasks[0].instance_id),
            "{env}: the record names its task"
        );
    }
    let dead = dead_letters(&h).await;
    assert!(dead.is_empty(), "dead-lettered jobs: {dead:#?}");
    h.shutdown().await.unwrap();
}

/// Messages visible or in flight on the events queue (SQS approximate counts).
async fn sqs_visible_and_in_flight(h: &AwsHarness) -> u64 {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let out = aws_sdk_sqs::Client::new(&h.resources.sdk)
        .get_queue_attributes()
        .queue_url(&h.resources.queues.events_url)
        .attribute_names(A::ApproximateNumberOfMessages)
        .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .unwrap();
    let attrs = out.attributes().unwrap();
    [
        A::ApproximateNumberOfMessages,
        A::ApproximateNumberOfMessagesNotVisible,
    ]
    .iter()
    .map(|a| {
        attrs
            .get(a)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    })
    .sum()
}

/// The bodies and receive counts of the events dead-letter queue's messages.
async fn dead_letters(h: &AwsHarness) -> Vec<String> {
    use aws_sdk_sqs::types::MessageSystemAttributeName as M;
    let out = aws_sdk_sqs::Client::new(&h.resources.sdk)
        .receive_message()
        .queue_url(&h.resources.queues.events_dlq_url)
        .max_number_of_messages(10)
        .message_system_attribute_names(M::ApproximateReceiveCount)
        .send()
        .await
        .unwrap();
    out.messages()
        .iter()
        .map(|m| {
            format!(
                "{} (receives {:?})",
                m.body().unwrap_or_default(),
                m.attributes()
                    .and_then(|a| a.get(&M::ApproximateReceiveCount))
            )
        })
        .collect()
}
