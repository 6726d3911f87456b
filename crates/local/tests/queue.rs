//! SqliteQueue: the shared queue contracts (FIFO and standard) plus local specifics.

use sandbox_controller::contract::{queue_delay_contract, queue_fifo_contract};
use sandbox_controller::job::Job;
use sandbox_controller::ports::{Outgoing, Queue, Sent};
use sandbox_core::ids::SessionId;
use sandbox_core::observed::Trigger;
use sandbox_local::{QueueOptions, SqliteQueue};
use std::collections::HashSet;
use std::time::{Duration, Instant};

fn msg(label: &str, group: &str) -> Outgoing {
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
        dedup_id: label.to_owned(),
        group: group.to_owned(),
        delay_secs: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_queue_passes_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let options = QueueOptions::fifo().with_max_receive_count(3);
    let q = SqliteQueue::open(dir.path().join("state.db"), "events", options).unwrap();
    queue_fifo_contract(&q, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_queue_passes_the_delay_contract() {
    let dir = tempfile::tempdir().unwrap();
    let options = QueueOptions::standard().with_max_receive_count(4);
    let q = SqliteQueue::open(dir.path().join("state.db"), "timers", options).unwrap();
    queue_delay_contract(&q, 4).await;
}

#[tokio::test]
async fn queues_in_one_file_are_isolated_and_share_it_with_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let events = SqliteQueue::open(&path, "events", QueueOptions::fifo()).unwrap();
    let timers = SqliteQueue::open(&path, "timers", QueueOptions::standard()).unwrap();
    assert_eq!(events.send(msg("a", "g")).await.unwrap(), Sent::Queued);
    assert!(timers.receive(10, 30, 0).await.unwrap().is_empty());
    // The same dedup id in another queue is not a duplicate.
    assert_eq!(timers.send(msg("a", "g")).await.unwrap(), Sent::Queued);
    assert_eq!(events.stats().await.unwrap().visible, 1);
    assert_eq!(timers.stats().await.unwrap().visible, 1);
    let got = events.receive(10, 30, 0).await.unwrap();
    assert_eq!(got.len(), 1);
    let stats = events.stats().await.unwrap();
    assert_eq!((stats.visible, stats.in_flight), (0, 1));
    // Reopening a queue with the other mode is refused.
    let err = SqliteQueue::open(&path, "events", QueueOptions::standard()).unwrap_err();
    assert!(!err.retryable, "{err}");
    assert!(err.to_string().contains("FIFO"), "{err}");
}

#[tokio::test]
async fn messages_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let q = SqliteQueue::open(&path, "events", QueueOptions::fifo()).unwrap();
        q.send(msg("durable", "g")).await.unwrap();
    }
    let q = SqliteQueue::open(&path, "events", QueueOptions::fifo()).unwrap();
    let got = q.receive(1, 30, 0).await.unwrap();
    assert_eq!(got[0].job, msg("durable", "g").job);
    // The dedup id is durable too.
    assert_eq!(q.send(msg("durable", "g")).await.unwrap(), Sent::Duplicate);
}

#[tokio::test]
async fn the_dedup_window_expires() {
    let dir = tempfile::tempdir().unwrap();
    let options = QueueOptions {
        dedup_window_secs: 1,
        ..QueueOptions::fifo()
    };
    let q = SqliteQueue::open(dir.path().join("state.db"), "events", options).unwrap();
    assert_eq!(q.send(msg("d", "g")).await.unwrap(), Sent::Queued);
    let r = q.receive(1, 30, 0).await.unwrap().remove(0);
    q.ack(&r.receipt).await.unwrap();
    // Still retained after the ack (SQS keeps the id for its window, not its message).
    assert_eq!(q.send(msg("d", "g")).await.unwrap(), Sent::Duplicate);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(q.send(msg("d", "g")).await.unwrap(), Sent::Queued);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_receivers_on_two_handles_never_share_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let a = SqliteQueue::open(&path, "events", QueueOptions::fifo()).unwrap();
    let b = SqliteQueue::open(&path, "events", QueueOptions::fifo()).unwrap();
    for i in 0..40 {
        a.send(msg(&format!("m{i}"), &format!("g{}", i % 8)))
            .await
            .unwrap();
    }
    let consume = |q: SqliteQueue| async move {
        let mut seen = Vec::new();
        loop {
            let got = q.receive(3, 30, 200).await.unwrap();
            if got.is_empty() {
                return seen;
            }
            for r in got {
                seen.push(r.job.webhook_id.clone().unwrap());
                q.ack(&r.receipt).await.unwrap();
            }
        }
    };
    let (x, y) = tokio::join!(tokio::spawn(consume(a)), tokio::spawn(consume(b)));
    let (x, y) = (x.unwrap(), y.unwrap());
    let all: Vec<String> = x.iter().chain(y.iter()).cloned().collect();
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(
        all.len(),
        40,
        "every message delivered exactly once: {all:?}"
    );
    assert_eq!(unique.len(), 40);
    // Per group, each consumer saw its share in send order.
    for seen in [&x, &y] {
        for g in 0..8 {
            let order: Vec<usize> = seen
                .iter()
                .map(|l| l[1..].parse::<usize>().unwrap())
                .filter(|i| i % 8 == g)
                .collect();
            assert!(
                order.windows(2).all(|w| w[0] < w[1]),
                "group {g} out of order: {order:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_receive_wakes_on_send() {
    let dir = tempfile::tempdir().unwrap();
    let q = SqliteQueue::open(dir.path().join("state.db"), "events", QueueOptions::fifo()).unwrap();
    let q2 = q.clone();
    let started = Instant::now();
    let waiter = tokio::spawn(async move { q2.receive(1, 30, 5_000).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(200)).await;
    q.send(msg("late", "g")).await.unwrap();
    let got = waiter.await.unwrap();
    assert_eq!(got.len(), 1);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // A receive with nothing to deliver returns after about its wait.
    let started = Instant::now();
    assert!(q.receive(1, 30, 300).await.unwrap().is_empty());
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
}

#[tokio::test]
async fn dead_letters_keep_the_job_and_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let options = QueueOptions::standard().with_max_receive_count(1);
    let q = SqliteQueue::open(dir.path().join("state.db"), "timers", options).unwrap();
    q.send(msg("poison", "g")).await.unwrap();
    let r = q.receive(1, 30, 0).await.unwrap().remove(0);
    q.retry_after(&r.receipt, 0).await.unwrap();
    assert!(q.receive(1, 30, 0).await.unwrap().is_empty());
    let dead = q.dead_letters().await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].job.as_ref(), Some(&msg("poison", "g").job));
    assert_eq!(dead[0].receive_count, 1);
    assert_eq!(dead[0].reason, "max receive count exceeded");
    assert_eq!(q.stats().await.unwrap().dead_letters, 1);
}

#[tokio::test]
async fn stale_receipts_ack_as_no_ops_and_cannot_retry() {
    let dir = tempfile::tempdir().unwrap();
    let q = SqliteQueue::open(
        dir.path().join("state.db"),
        "timers",
        QueueOptions::standard(),
    )
    .unwrap();
    q.send(msg("m", "g")).await.unwrap();
    let first = q.receive(1, 0, 0).await.unwrap().remove(0);
    let second = q.receive(1, 30, 0).await.unwrap().remove(0);
    assert_eq!(second.receive_count, 2);
    q.ack(&first.receipt).await.unwrap(); // stale: no-op
    assert!(q.retry_after(&first.receipt, 0).await.is_err());
    assert_eq!(
        q.stats().await.unwrap().in_flight,
        1,
        "the stale ack deleted nothing"
    );
    q.ack(&second.receipt).await.unwrap();
    assert_eq!(q.stats().await.unwrap(), Default::default());
    assert!(
        q.ack("garbage").await.is_err(),
        "a malformed receipt is an error"
    );
}

#[tokio::test]
async fn limits_are_enforced_like_sqs() {
    let dir = tempfile::tempdir().unwrap();
    let q = SqliteQueue::open(dir.path().join("state.db"), "events", QueueOptions::fifo()).unwrap();
    assert!(q.receive(0, 30, 0).await.is_err());
    assert!(q.receive(11, 30, 0).await.is_err());
    assert!(q.receive(1, 43_201, 0).await.is_err());
    let mut m = msg("x", "");
    assert!(q.send(m.clone()).await.is_err(), "FIFO needs a group");
    m.group = "g".repeat(129);
    assert!(
        q.send(m).await.is_err(),
        "group ids are at most 128 characters"
    );
    assert!(
        SqliteQueue::open(
            dir.path().join("state.db"),
            "z",
            QueueOptions::fifo().with_max_receive_count(0)
        )
        .is_err()
    );
}
