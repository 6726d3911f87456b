//! SqsQueue on moto: the FIFO and delay contracts, FIFO id hashing, duplicates,
//! undecodable bodies.

use crate::support::{sdk, unique};
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::QueueAttributeName;
use sandbox_aws::{SqsQueue, SqsQueueOptions, sqs_fifo_id};
use sandbox_controller::contract::{
    DuplicateSends, queue_delay_contract, queue_fifo_contract_with,
};
use sandbox_controller::job::Job;
use sandbox_controller::ports::{Outgoing, Queue, Sent};
use sandbox_core::ids::SessionId;
use sandbox_core::observed::Trigger;

/// Creates a queue (and its DLQ with a redrive policy after `max_receive_count`
/// receives); returns (queue URL, DLQ URL).
async fn create_with_dlq(sqs: &Client, fifo: bool, max_receive_count: u32) -> (String, String) {
    let u = unique();
    let suffix = if fifo { ".fifo" } else { "" };
    let mut dlq = sqs.create_queue().queue_name(format!("q{u}-dlq{suffix}"));
    if fifo {
        dlq = dlq.attributes(QueueAttributeName::FifoQueue, "true");
    }
    let dlq_url = dlq
        .send()
        .await
        .expect("create DLQ")
        .queue_url()
        .expect("DLQ url")
        .to_owned();
    let dlq_arn = sqs
        .get_queue_attributes()
        .queue_url(&dlq_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("DLQ attributes")
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .expect("DLQ ARN");
    let redrive = serde_json::json!({
        "deadLetterTargetArn": dlq_arn,
        "maxReceiveCount": max_receive_count
    })
    .to_string();
    let mut q = sqs
        .create_queue()
        .queue_name(format!("q{u}{suffix}"))
        .attributes(QueueAttributeName::RedrivePolicy, redrive);
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
        .expect("queue url")
        .to_owned();
    (url, dlq_url)
}

async fn queue(fifo: bool, max_receive_count: u32) -> (SqsQueue, Client) {
    let sqs = Client::new(&sdk().await);
    let (url, dlq_url) = create_with_dlq(&sqs, fifo, max_receive_count).await;
    let q = SqsQueue::new(
        sqs.clone(),
        url,
        SqsQueueOptions {
            fifo,
            dead_letter_queue_url: Some(dlq_url),
        },
    );
    (q, sqs)
}

fn msg(label: &str, dedup: &str, group: &str) -> Outgoing {
    Outgoing {
        job: Job {
            handoffs: 0,
            swept: None,
            operator_proof: None,
            trigger: Trigger::Idle,
            session_id: SessionId::new(format!("sess_{group}")),
            environment_id: None,
            webhook_id: Some(label.to_owned()),
            enqueued_at: 1,
        },
        dedup_id: dedup.to_owned(),
        group: group.to_owned(),
        delay_secs: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_fifo_queue_passes_the_contract() {
    let (q, _) = queue(true, 3).await;
    queue_fifo_contract_with(&q, 3, DuplicateSends::Silent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_standard_queue_passes_the_delay_contract() {
    let (q, _) = queue(false, 3).await;
    queue_delay_contract(&q, 3).await;
}

/// SQS FIFO answers a de-duplicated send like a stored one: the adapter reports
/// `Queued` (it cannot know), and only one message is delivered.
#[tokio::test]
async fn a_deduplicated_fifo_send_reports_queued_and_delivers_once() {
    let (q, _) = queue(true, 3).await;
    let u = unique();
    let first = msg(&format!("a{u}"), &format!("d{u}"), "g");
    let copy = msg(&format!("b{u}"), &format!("d{u}"), "g");
    assert_eq!(q.send(first.clone()).await.unwrap(), Sent::Queued);
    assert_eq!(q.send(copy).await.unwrap(), Sent::Queued);
    let got = q.receive(10, 30, 1000).await.unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].job, first.job);
    q.ack(&got[0].receipt).await.unwrap();
    assert!(q.receive(10, 30, 0).await.unwrap().is_empty());
}

/// Dedup and group ids longer than SQS's 128 characters are hashed deterministically: the
/// same long id still de-duplicates; two long ids sharing their first 128 characters do not.
#[tokio::test]
async fn long_fifo_ids_are_hashed_and_still_deduplicate() {
    let (q, _) = queue(true, 3).await;
    let u = unique();
    let long = format!("msg_{u}_{}", "x".repeat(300));
    let group = format!("sess_{u}_{}", "g".repeat(200));
    let a = msg("a", &format!("{long}A"), &group);
    let a_again = msg("a-again", &format!("{long}A"), &group);
    let b = msg("b", &format!("{long}B"), &group);
    for m in [&a, &a_again, &b] {
        assert_eq!(q.send(m.clone()).await.unwrap(), Sent::Queued);
    }
    let mut labels = Vec::new();
    for _ in 0..2 {
        let got = q.receive(1, 30, 1000).await.unwrap();
        assert_eq!(got.len(), 1, "{got:?}");
        labels.push(got[0].job.webhook_id.clone().unwrap());
        q.ack(&got[0].receipt).await.unwrap();
    }
    assert_eq!(labels, ["a", "b"]);
    assert!(q.receive(10, 30, 0).await.unwrap().is_empty());
    assert!(sqs_fifo_id(&long).len() <= 128);
}

/// A body that is not a job is skipped (never returned, never crashing the receive), stays
/// hidden for its visibility timeout, and the redrive policy dead-letters it.
#[tokio::test]
async fn undecodable_bodies_are_skipped_and_dead_lettered() {
    let (q, sqs) = queue(false, 2).await;
    sqs.send_message()
        .queue_url(q.queue_url())
        .message_body("{not a job")
        .send()
        .await
        .unwrap();
    let good = msg("good", "good", "g");
    q.send(good.clone()).await.unwrap();
    let mut delivered = Vec::new();
    for _ in 0..6 {
        for r in q.receive(10, 0, 200).await.unwrap() {
            delivered.push(r.job.clone());
            q.ack(&r.receipt).await.unwrap();
        }
        if q.dead_letter_count().await.unwrap() == 1 {
            break;
        }
    }
    assert_eq!(delivered, vec![good.job]);
    assert_eq!(q.dead_letter_count().await.unwrap(), 1);
}

#[tokio::test]
async fn a_queue_without_dlq_counts_zero_dead_letters() {
    let (q, sqs) = queue(false, 3).await;
    let plain = SqsQueue::new(sqs, q.queue_url(), SqsQueueOptions::default());
    assert_eq!(plain.dead_letter_count().await.unwrap(), 0);
}

/// `SendMessageBatch` stores up to 10 messages in one call, each with its
/// own `DelaySeconds`; a message `send` would refuse (a delay beyond 900 s) is refused
/// alone and the others are still stored; more than 10 is refused before any call.
#[tokio::test]
async fn a_batch_send_stores_each_message_with_its_delay_and_refuses_only_the_bad_one() {
    let (q, _) = queue(false, 3).await;
    let u = unique();
    let mut batch: Vec<Outgoing> = (0..10)
        .map(|i| {
            let mut m = msg(&format!("b{u}_{i}"), &format!("d{u}_{i}"), "g");
            m.delay_secs = if i < 5 { 0 } else { 600 };
            m
        })
        .collect();
    batch[9].delay_secs = 901;
    let results = q.send_batch(batch).await;
    assert_eq!(results.len(), 10);
    assert!(
        results[..9].iter().all(|r| matches!(r, Ok(Sent::Queued))),
        "{results:?}"
    );
    let refused = results[9].as_ref().unwrap_err();
    assert!(
        !refused.retryable && refused.message.contains("901"),
        "{refused}"
    );
    // The five undelayed ones are visible now; the delayed ones are not.
    let got = q.receive(10, 30, 1000).await.unwrap();
    let mut labels: Vec<String> = got
        .iter()
        .filter_map(|r| r.job.webhook_id.clone())
        .collect();
    labels.sort();
    assert_eq!(
        labels,
        (0..5).map(|i| format!("b{u}_{i}")).collect::<Vec<_>>()
    );
    let eleven: Vec<Outgoing> = (0..11)
        .map(|i| msg(&format!("x{u}_{i}"), &format!("x{u}_{i}"), "g"))
        .collect();
    assert!(q.send_batch(eleven).await.iter().all(|r| r.is_err()));
}
