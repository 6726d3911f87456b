//! The worker on real SQS semantics (moto, through `tests/moto/run.sh`): what becomes of
//! the records of a batch it does not attempt. The registry, compute
//! and Agents API are the in-memory doubles; both queues are `SqsQueue`s on moto with
//! redrive policies, as deployed.

#[allow(dead_code, unused_imports)]
mod doubles;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use doubles::{FIXTURE_NOW, FakeSessions, FixedClock, MemoryCompute, MemoryRegistry};
use sandbox_aws::{SqsQueue, SqsQueueOptions, load_sdk_config};
use sandbox_controller::consume::MAX_HANDOFFS;
use sandbox_controller::ports::{Outgoing, Queue};
use sandbox_controller::{Controller, ControllerConfig, Job};
use sandbox_core::ids::{DeploymentId, EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_lambda::worker_handler::{QueueRoutes, handle_batch};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The deployed visibility timeout (infra/sam/template.yaml): a record left to it would
/// hide for 15 minutes.
const VISIBILITY_SECS: i32 = 900;
/// The deployed `maxReceiveCount`.
const MAX_RECEIVE_COUNT: u32 = 5;

fn endpoint() -> String {
    match std::env::var("MOTO_ENDPOINT") {
        Ok(v) if !v.is_empty() => v.trim_end_matches('/').to_owned(),
        _ => panic!(
            "MOTO_ENDPOINT is not set: run through `tests/moto/run.sh cargo nextest run -p \
             sandbox-lambda`"
        ),
    }
}

fn unique() -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{:x}{:x}",
        nanos & 0xff_ffff_ffff,
        std::process::id() & 0xffff
    )
}

/// A queue with its dead-letter queue (redrive after [`MAX_RECEIVE_COUNT`]): (URL, ARN).
async fn create_queue(sqs: &Client, name: &str, fifo: bool) -> (String, String) {
    let suffix = if fifo { ".fifo" } else { "" };
    let attr = |url: &str| {
        let sqs = sqs.clone();
        let url = url.to_owned();
        async move {
            sqs.get_queue_attributes()
                .queue_url(url)
                .attribute_names(QueueAttributeName::QueueArn)
                .send()
                .await
                .expect("queue attributes")
                .attributes()
                .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
                .expect("queue ARN")
        }
    };
    let mut dlq = sqs.create_queue().queue_name(format!("{name}-dlq{suffix}"));
    if fifo {
        dlq = dlq.attributes(QueueAttributeName::FifoQueue, "true");
    }
    let dlq_url = dlq
        .send()
        .await
        .expect("create DLQ")
        .queue_url()
        .unwrap()
        .to_owned();
    let redrive = serde_json::json!({
        "deadLetterTargetArn": attr(&dlq_url).await,
        "maxReceiveCount": MAX_RECEIVE_COUNT
    })
    .to_string();
    let mut q = sqs
        .create_queue()
        .queue_name(format!("{name}{suffix}"))
        .attributes(QueueAttributeName::RedrivePolicy, redrive)
        .attributes(
            QueueAttributeName::VisibilityTimeout,
            VISIBILITY_SECS.to_string(),
        );
    if fifo {
        q = q
            .attributes(QueueAttributeName::FifoQueue, "true")
            .attributes(QueueAttributeName::ContentBasedDeduplication, "false");
    }
    let url = q
        .send()
        .await
        .expect("create queue")
        .queue_url()
        .unwrap()
        .to_owned();
    let arn = attr(&url).await;
    (url, arn)
}

type MotoController = Controller<SqsQueue, MemoryRegistry, MemoryCompute, FakeSessions>;

struct Stack {
    sqs: Client,
    controller: MotoController,
    events_url: String,
    events_arn: String,
    timers_url: String,
}

async fn stack() -> Stack {
    let sqs = Client::new(&load_sdk_config(Some(&endpoint())).await);
    let u = unique();
    let (events_url, events_arn) = create_queue(&sqs, &format!("jobs{u}"), true).await;
    let (timers_url, _) = create_queue(&sqs, &format!("timers{u}"), false).await;
    let queue = |url: &str, fifo: bool| {
        SqsQueue::new(
            sqs.clone(),
            url.to_owned(),
            SqsQueueOptions {
                fifo,
                dead_letter_queue_url: None,
            },
        )
    };
    let controller = Controller::new(
        queue(&events_url, true),
        queue(&timers_url, false),
        MemoryRegistry::default(),
        MemoryCompute::default(),
        FakeSessions::default(),
        Arc::new(FixedClock(FIXTURE_NOW)),
        ControllerConfig::new(DeploymentId::new("test").unwrap()),
    );
    Stack {
        sqs,
        controller,
        events_url,
        events_arn,
        timers_url,
    }
}

/// A sweep job for a session the Agents API double does not know: processed to `Done`.
fn job(n: usize, handoffs: u32) -> Job {
    Job {
        handoffs,
        swept: None,
        operator_proof: None,
        trigger: Trigger::Sweep,
        session_id: SessionId::new(format!("sess_gone_{n}")),
        environment_id: Some(EnvironmentId::new(format!("env_gone_{n}"))),
        webhook_id: None,
        enqueued_at: FIXTURE_NOW,
    }
}

/// Receives what is visible on `url` now (no wait), as Lambda's SQS event records.
async fn receive(s: &Stack, url: &str, arn: &str) -> Vec<SqsMessage> {
    let out = s
        .sqs
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(10)
        .visibility_timeout(VISIBILITY_SECS)
        .wait_time_seconds(0)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send()
        .await
        .expect("receive");
    out.messages()
        .iter()
        .map(|m| {
            let mut r = SqsMessage::default();
            r.message_id = m.message_id().map(str::to_owned);
            r.receipt_handle = m.receipt_handle().map(str::to_owned);
            r.body = m.body().map(str::to_owned);
            r.event_source = Some("aws:sqs".into());
            r.event_source_arn = Some(arn.to_owned());
            for (k, v) in m.attributes().into_iter().flatten() {
                r.attributes.insert(k.as_str().to_owned(), v.clone());
            }
            r
        })
        .collect()
}

/// What Lambda does with a partial batch response: deletes every record not reported.
async fn settle_like_lambda(s: &Stack, url: &str, records: &[SqsMessage], reported: &[String]) {
    for r in records {
        if !reported.contains(r.message_id.as_ref().unwrap()) {
            s.sqs
                .delete_message()
                .queue_url(url)
                .receipt_handle(r.receipt_handle.clone().unwrap())
                .send()
                .await
                .expect("delete");
        }
    }
}

fn receive_count(r: &SqsMessage) -> u32 {
    r.attributes["ApproximateReceiveCount"].parse().unwrap()
}

fn job_of(r: &SqsMessage) -> Job {
    serde_json::from_str(r.body.as_deref().unwrap()).unwrap()
}

/// A batch whose invocation has less than the record budget left
/// attempts its first record only; every other record is visible again at once — its job
/// as a new timers message (receive count 1: not one step closer to the dead-letter
/// queue) — and nothing waits out the 900 s visibility timeout. A job past the hand-off
/// cap is made visible again at once on its own queue instead (`ChangeMessageVisibility`
/// to 0) and reported.
#[tokio::test]
async fn records_not_attempted_are_visible_again_at_once() {
    let s = stack().await;
    let routes = QueueRoutes::new(&s.timers_url);
    for n in 0..4 {
        let j = job(n, if n == 3 { MAX_HANDOFFS } else { 0 });
        s.controller
            .events
            .send(Outgoing {
                group: "sess_group".to_owned(),
                dedup_id: format!("d{n}"),
                delay_secs: 0,
                job: j,
            })
            .await
            .expect("send");
    }
    let records = receive(&s, &s.events_url, &s.events_arn).await;
    assert_eq!(records.len(), 4, "one FIFO batch of four");
    let event = {
        let mut e = SqsEvent::default();
        e.records = records.clone();
        e
    };
    // Less than the budget (lock lease + settle) is left: only the first record runs.
    let deadline = SystemTime::now() + Duration::from_secs(5);
    let response = handle_batch(&s.controller, &routes, &event, Some(deadline)).await;
    let reported: Vec<String> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect();
    assert_eq!(
        reported,
        vec![records[3].message_id.clone().unwrap()],
        "only the capped record is reported"
    );
    settle_like_lambda(&s, &s.events_url, &records, &reported).await;

    // At once (no wait): the deferred jobs on the timers queue, received for the first time.
    let timers_arn = format!(
        "arn:aws:sqs:us-east-1:123456789012:{}",
        s.timers_url.rsplit('/').next().unwrap()
    );
    let deferred = receive(&s, &s.timers_url, &timers_arn).await;
    let sessions: HashSet<String> = deferred
        .iter()
        .map(|r| job_of(r).session_id.as_str().to_owned())
        .collect();
    assert_eq!(
        sessions,
        HashSet::from(["sess_gone_1".to_owned(), "sess_gone_2".to_owned()])
    );
    for r in &deferred {
        assert_eq!(receive_count(r), 1, "a new message: no receive counted");
        assert_eq!(job_of(r).handoffs, 1);
    }
    // At once: the capped record is visible again on its own queue (its receive counts).
    let again = receive(&s, &s.events_url, &s.events_arn).await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(job_of(&again[0]).session_id.as_str(), "sess_gone_3");
    assert_eq!(receive_count(&again[0]), 2);
    // The deferred jobs run when received: done, deleted, nothing left anywhere.
    let event = {
        let mut e = SqsEvent::default();
        e.records = deferred.clone();
        e
    };
    let response = handle_batch(&s.controller, &routes, &event, None).await;
    assert!(response.batch_item_failures.is_empty());
}
