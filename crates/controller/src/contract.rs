//! The contract suite every backend adapter passes: the embedded backend
//! (`sandbox-local`: SQLite queue and registry, child processes) now, the AWS adapters (SQS,
//! DynamoDB, ECS on moto) later.
//!
//! Each function drives one adapter through the semantics the controller relies on and
//! panics with a message naming the violated rule. Call them from an async test:
//!
//! ```text
//! #[tokio::test]
//! async fn sqlite_fifo_queue_passes_the_contract() {
//!     let q = SqliteQueue::open(dir.join("q.db"), "events", QueueOptions::fifo()).unwrap();
//!     sandbox_controller::contract::queue_fifo_contract(&q, 5).await;
//! }
//! ```
//!
//! Sharing: every call invents unique names (environment ids, session ids, webhook ids,
//! lock owners, message groups), so registry and compute suites can run concurrently on one
//! backend. A queue suite needs a *dedicated, empty* queue: it receives whatever the queue
//! holds.
//!
//! Time: where the port takes `now` (locks, the delivery ledger) the suite passes explicit
//! values around the system clock, so no test waits for a lease to expire. Visibility
//! timeouts, `retry_after` and `delay_secs` are checked with short real waits (about 1 s
//! each); the queue suites take about 3 s, the registry suite well under 1 s, the compute
//! suite as long as two starts and two stops take on the provider.

use crate::job::Job;
use crate::ports::{
    AuditEntry, Clock, Compute, Fence, Locked, NO_DEADLINE, Outgoing, PoolMember, Queue, Receipt,
    ReceiptKind, Received, Registry, Release, Sent, Slot, SlotRelease, Started, SystemClock, Write,
};
use sandbox_core::compute::{ComputeInstance, ComputeStatus, InstanceRef};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{
    DeploymentId, EffectKey, EnvironmentId, Generation, InstanceId, SessionId, idempotency_token,
};
use sandbox_core::observed::Trigger;
use sandbox_core::record::{Record, RecordStatus, ShutdownLease};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The terminal record: absent before a close; the first `put_terminal` is
/// stored and reads back equal; a second one (a different answer) returns `false` and
/// changes nothing; it is neither a record (`get`, `list`, `find_by_session` do not see
/// it) nor a receipt; terminal records of two keys are independent.
pub async fn registry_terminal_contract<R: Registry>(r: &R) {
    use crate::terminal::TerminalRecord;
    let run = unique();
    let now = SystemClock.now();
    let env = EnvironmentId::new(format!("env_ct_term_{run}"));
    let session = SessionId::new(format!("sess_ct_term_{run}"));
    let key = env.effect_key();
    let record = Record::new(env.clone(), session.clone());
    let receipts = vec![Receipt {
        at: now,
        effect_key: key.clone(),
        kind: ReceiptKind::SessionDeleted {
            session_id: session.clone(),
        },
    }];
    let first = TerminalRecord::assemble(&record, &receipts, "ct", "a key file", now);
    let rule = "terminal-absent-before-close";
    assert_eq!(
        r.terminal(&key).await.unwrap(),
        None,
        "registry contract [{rule}]: no terminal record before a close"
    );
    let rule = "terminal-written-once";
    assert!(
        r.put_terminal(&first).await.unwrap(),
        "registry contract [{rule}]: the first terminal record is written"
    );
    assert_eq!(
        r.terminal(&key).await.unwrap().as_ref(),
        Some(&first),
        "registry contract [{rule}]: the terminal record reads back as written"
    );
    let mut second = first.clone();
    second.closed_at = now + 60;
    second.effect_reconciliation = "abandoned".into();
    assert!(
        !r.put_terminal(&second).await.unwrap(),
        "registry contract [{rule}]: a second terminal record for the key is refused"
    );
    assert_eq!(
        r.terminal(&key).await.unwrap().as_ref(),
        Some(&first),
        "registry contract [{rule}]: a refused second write changes nothing"
    );
    let rule = "terminal-is-its-own-item";
    assert_eq!(
        r.get(&key).await.unwrap(),
        None,
        "registry contract [{rule}]: a terminal record is not a record"
    );
    assert!(
        r.find_by_session(&session).await.unwrap().is_none(),
        "registry contract [{rule}]: a terminal record is not found by session"
    );
    assert!(
        !r.list()
            .await
            .unwrap()
            .iter()
            .any(|x| x.environment_id == env),
        "registry contract [{rule}]: a terminal record is not listed"
    );
    assert!(
        r.receipts(&key).await.unwrap().is_empty(),
        "registry contract [{rule}]: a terminal record is not a receipt"
    );
    let other = EnvironmentId::new(format!("env_ct_term2_{run}"));
    assert_eq!(
        r.terminal(&other.effect_key()).await.unwrap(),
        None,
        "registry contract [{rule}]: terminal records are per effect key"
    );
}

/// How long a positive receive waits for its message, milliseconds (long poll).
const RECEIVE_WAIT_MS: u64 = 4_000;
/// The visibility timeout used where the suite does not test visibility, seconds.
const LONG_VISIBILITY_SECS: u32 = 30;
/// Lower bound accepted for a 1 s hide (visibility, retry, delay), milliseconds: the
/// message must not come back in less than this.
const MIN_HIDDEN_MS: u128 = 700;
/// Bound on waiting for a stopped compute to read back `Stopped`.
const STOP_READ_BACK_TIMEOUT: Duration = Duration::from_secs(30);

/// A short unique token for names: wall-clock nanoseconds, process id and a counter.
fn unique() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:x}{:x}{n:x}",
        nanos & 0xffff_ffff_ffff,
        std::process::id()
    )
}

/// One test message: its job names the run and a label, so equality pins the message.
fn message(run: &str, label: &str, group: &str) -> Outgoing {
    let job = Job {
        handoffs: 0,
        swept: None,
        operator_proof: None,
        trigger: Trigger::Sweep,
        session_id: SessionId::new(format!("sess_ct_{run}_{group}")),
        environment_id: Some(EnvironmentId::new(format!("env_ct_{run}_{group}"))),
        webhook_id: Some(format!("msg_ct_{run}_{label}")),
        enqueued_at: SystemClock.now(),
    };
    Outgoing {
        job,
        dedup_id: format!("msg_ct_{run}_{label}"),
        group: format!("grp_{run}_{group}"),
        delay_secs: 0,
    }
}

fn label_of(r: &Received) -> String {
    r.job.webhook_id.clone().unwrap_or_default()
}

async fn send_ok<Q: Queue>(q: &Q, msg: &Outgoing, rule: &str) {
    let sent = q
        .send(msg.clone())
        .await
        .unwrap_or_else(|e| panic!("queue contract [{rule}]: send failed: {e}"));
    assert_eq!(
        sent,
        Sent::Queued,
        "queue contract [{rule}]: a send with a fresh dedup id must be queued"
    );
}

async fn receive<Q: Queue>(
    q: &Q,
    max: usize,
    visibility: u32,
    wait_ms: u64,
    rule: &str,
) -> Vec<Received> {
    q.receive(max, visibility, wait_ms)
        .await
        .unwrap_or_else(|e| panic!("queue contract [{rule}]: receive failed: {e}"))
}

/// Receives exactly `msg` (waiting for it), with the expected receive count.
async fn receive_exactly<Q: Queue>(
    q: &Q,
    msg: &Outgoing,
    visibility: u32,
    receive_count: u32,
    rule: &str,
) -> Received {
    let got = receive(q, 10, visibility, RECEIVE_WAIT_MS, rule).await;
    let labels: Vec<String> = got.iter().map(label_of).collect();
    assert_eq!(
        got.len(),
        1,
        "queue contract [{rule}]: expected exactly one message ({}), got {labels:?}",
        msg.dedup_id
    );
    let r = got.into_iter().next().unwrap_or_else(|| unreachable!());
    assert_eq!(
        r.job, msg.job,
        "queue contract [{rule}]: received the wrong message (expected {})",
        msg.dedup_id
    );
    assert_eq!(
        r.receive_count, receive_count,
        "queue contract [{rule}]: wrong receive_count for {}",
        msg.dedup_id
    );
    assert!(
        !r.receipt.is_empty() && !r.message_id.is_empty(),
        "queue contract [{rule}]: receipt and message_id must be non-empty"
    );
    r
}

async fn expect_nothing<Q: Queue>(q: &Q, rule: &str) {
    let got = receive(q, 10, LONG_VISIBILITY_SECS, 0, rule).await;
    let labels: Vec<String> = got.iter().map(label_of).collect();
    assert!(
        got.is_empty(),
        "queue contract [{rule}]: expected no deliverable message, got {labels:?}"
    );
}

async fn ack<Q: Queue>(q: &Q, r: &Received, rule: &str) {
    q.ack(&r.receipt)
        .await
        .unwrap_or_else(|e| panic!("queue contract [{rule}]: ack failed: {e}"));
}

async fn retry_after<Q: Queue>(q: &Q, r: &Received, delay: u32, rule: &str) {
    q.retry_after(&r.receipt, delay)
        .await
        .unwrap_or_else(|e| panic!("queue contract [{rule}]: retry_after failed: {e}"));
}

async fn dead_letters<Q: Queue>(q: &Q, rule: &str) -> u64 {
    q.dead_letter_count()
        .await
        .unwrap_or_else(|e| panic!("queue contract [{rule}]: dead_letter_count failed: {e}"))
}

/// send → receive (count 1, same job) → ack → gone.
async fn round_trip<Q: Queue>(q: &Q, run: &str) {
    let rule = "send-receive-ack";
    expect_nothing(q, "the queue under test must start empty").await;
    let m = message(run, "rt", "rt");
    send_ok(q, &m, rule).await;
    let r = receive_exactly(q, &m, LONG_VISIBILITY_SECS, 1, rule).await;
    ack(q, &r, rule).await;
    expect_nothing(q, "an acked message is never delivered again").await;
}

/// A received message is hidden for its visibility timeout, then delivered again with its
/// receive count incremented.
async fn visibility<Q: Queue>(q: &Q, run: &str) {
    let rule = "visibility-timeout";
    let m = message(run, "vis", "vis");
    send_ok(q, &m, rule).await;
    let first = receive_exactly(q, &m, 1, 1, rule).await;
    let hidden_at = Instant::now();
    expect_nothing(
        q,
        "a received message is hidden during its visibility timeout",
    )
    .await;
    let second = receive_exactly(q, &m, LONG_VISIBILITY_SECS, 2, rule).await;
    let hidden_ms = hidden_at.elapsed().as_millis();
    assert!(
        hidden_ms >= MIN_HIDDEN_MS,
        "queue contract [{rule}]: a 1 s visibility timeout re-delivered after {hidden_ms} ms"
    );
    assert_eq!(
        first.message_id, second.message_id,
        "queue contract [{rule}]: a re-delivery keeps its message_id"
    );
    ack(q, &second, rule).await;
    expect_nothing(q, "acked after re-delivery").await;
}

/// `retry_after(d)` hides the message for `d` seconds; `retry_after(0)` shows it at once.
async fn retry<Q: Queue>(q: &Q, run: &str) {
    let rule = "retry-after";
    let m = message(run, "retry", "retry");
    send_ok(q, &m, rule).await;
    let first = receive_exactly(q, &m, LONG_VISIBILITY_SECS, 1, rule).await;
    retry_after(q, &first, 1, rule).await;
    let hidden_at = Instant::now();
    expect_nothing(q, "retry_after(1) hides the message for about 1 s").await;
    let second = receive_exactly(q, &m, LONG_VISIBILITY_SECS, 2, rule).await;
    let hidden_ms = hidden_at.elapsed().as_millis();
    assert!(
        hidden_ms >= MIN_HIDDEN_MS,
        "queue contract [{rule}]: retry_after(1) re-delivered after {hidden_ms} ms"
    );
    retry_after(q, &second, 0, rule).await;
    let started = Instant::now();
    let third = receive_exactly(q, &m, LONG_VISIBILITY_SECS, 3, rule).await;
    assert!(
        started.elapsed() < Duration::from_millis(RECEIVE_WAIT_MS / 2),
        "queue contract [{rule}]: retry_after(0) must make the message visible at once"
    );
    ack(q, &third, rule).await;
    expect_nothing(q, "acked after retries").await;
}

/// A message received `max_receive_count` times goes to the dead-letter queue on the next
/// receive instead of being delivered, and is never delivered again; the message behind it
/// in its group is delivered next.
///
/// On a FIFO queue the message behind it is queued first, in the same group (it must stay
/// blocked until the poison message leaves); on a standard queue (no ordering) it is sent
/// after the poison message's last receive.
async fn dead_letter<Q: Queue>(q: &Q, run: &str, max_receive_count: u32, fifo: bool) {
    let rule = "dead-letter";
    assert!(
        max_receive_count >= 1,
        "max_receive_count must be at least 1"
    );
    let before = dead_letters(q, rule).await;
    let poison = message(run, "poison", "dlq");
    let behind = message(run, "behind", "dlq");
    send_ok(q, &poison, rule).await;
    if fifo {
        send_ok(q, &behind, rule).await;
    }
    for count in 1..=max_receive_count {
        let got = receive(q, 1, LONG_VISIBILITY_SECS, RECEIVE_WAIT_MS, rule).await;
        let r = got.into_iter().find(|r| r.job == poison.job).unwrap_or_else(|| {
            panic!("queue contract [{rule}]: receive {count} of {max_receive_count} did not deliver the oldest message")
        });
        assert_eq!(
            r.receive_count, count,
            "queue contract [{rule}]: receive_count"
        );
        retry_after(q, &r, 0, rule).await;
    }
    if !fifo {
        send_ok(q, &behind, rule).await;
    }
    // The next receive moves the poison message to the DLQ and delivers the next one.
    let r = receive_exactly(q, &behind, LONG_VISIBILITY_SECS, 1, rule).await;
    let after = dead_letters(q, rule).await;
    assert_eq!(
        after,
        before + 1,
        "queue contract [{rule}]: a message received more than max_receive_count ({max_receive_count}) times must land in the DLQ"
    );
    ack(q, &r, rule).await;
    expect_nothing(q, "a dead-lettered message is never delivered again").await;
}

/// How a FIFO queue adapter answers a send dropped as a duplicate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DuplicateSends {
    /// The adapter knows and returns [`Sent::Duplicate`] (the SQLite queue).
    Reported,
    /// The provider answers a de-duplicated send exactly like a stored one, so the adapter
    /// returns [`Sent::Queued`] (SQS FIFO: `SendMessage` succeeds with a message id either
    /// way). Only the drop itself is checked.
    Silent,
}

/// The FIFO queue contract, for an adapter that reports duplicates
/// ([`DuplicateSends::Reported`]); see [`queue_fifo_contract_with`].
pub async fn queue_fifo_contract<Q: Queue>(q: &Q, max_receive_count: u32) {
    queue_fifo_contract_with(q, max_receive_count, DuplicateSends::Reported).await;
}

/// The FIFO queue contract.
///
/// `q` must be a dedicated, empty FIFO queue whose dead-letter redrive triggers after
/// `max_receive_count` (≥ 3) receives (SQS `maxReceiveCount`). Checks: send → receive → ack;
/// a second send with a retained dedup id succeeds and is dropped (never delivered), and
/// with [`DuplicateSends::Reported`] it returns [`Sent::Duplicate`]; messages of
/// one group come in order, and none while another of the group is in flight (one
/// receive may return several of a group, in order, as SQS does), while other groups flow; the visibility timeout hides and re-delivers with
/// `receive_count` + 1; `retry_after` delays re-visibility (0: at once); dead-lettering
/// after `max_receive_count` receives; `delay_secs > 0` is rejected (as SQS FIFO does).
/// Takes about 3 s.
pub async fn queue_fifo_contract_with<Q: Queue>(
    q: &Q,
    max_receive_count: u32,
    duplicates: DuplicateSends,
) {
    assert!(
        max_receive_count >= 3,
        "queue contract: the suite receives one message 3 times; use max_receive_count >= 3"
    );
    let run = unique();
    round_trip(q, &run).await;

    // De-duplication while the first message is retained (queued or in flight).
    let rule = "fifo-dedup";
    let first = message(&run, "dedup", "dedup");
    send_ok(q, &first, rule).await;
    let mut copy = message(&run, "dedup-copy", "dedup");
    copy.dedup_id = first.dedup_id.clone();
    let sent = q
        .send(copy.clone())
        .await
        .unwrap_or_else(|e| panic!("queue contract [{rule}]: send failed: {e}"));
    if duplicates == DuplicateSends::Reported {
        assert_eq!(
            sent,
            Sent::Duplicate,
            "queue contract [{rule}]: a second send with a retained dedup id must be reported as a duplicate"
        );
    }
    let r = receive_exactly(q, &first, LONG_VISIBILITY_SECS, 1, rule).await;
    let sent = q
        .send(copy)
        .await
        .unwrap_or_else(|e| panic!("queue contract [{rule}]: send failed: {e}"));
    if duplicates == DuplicateSends::Reported {
        assert_eq!(
            sent,
            Sent::Duplicate,
            "queue contract [{rule}]: the dedup id stays retained while its message is in flight"
        );
    }
    ack(q, &r, rule).await;
    expect_nothing(
        q,
        "fifo-dedup: a duplicate is dropped, never delivered (also while the first is in flight)",
    )
    .await;

    // Group ordering and the in-flight group lock.
    let rule = "fifo-group-order";
    let g: Vec<Outgoing> = (1..=3)
        .map(|i| message(&run, &format!("g{i}"), "g"))
        .collect();
    for m in &g {
        send_ok(q, m, rule).await;
    }
    let got = receive(q, 1, LONG_VISIBILITY_SECS, RECEIVE_WAIT_MS, rule).await;
    assert_eq!(
        got.iter().map(|r| &r.job).collect::<Vec<_>>(),
        vec![&g[0].job],
        "queue contract [{rule}]: the oldest message of the group comes first"
    );
    let head = got.into_iter().next().unwrap_or_else(|| unreachable!());
    expect_nothing(
        q,
        "fifo-group-lock: no message of a group while another is in flight",
    )
    .await;
    let other = message(&run, "h1", "h");
    send_ok(q, &other, rule).await;
    let h = receive_exactly(
        q,
        &other,
        LONG_VISIBILITY_SECS,
        1,
        "fifo-groups-independent",
    )
    .await;
    ack(q, &h, rule).await;
    ack(q, &head, rule).await;
    // One message per receive: SQS may return several messages of one group in a single
    // batch (in order), the SQLite queue one; both are FIFO.
    for m in &g[1..] {
        let got = receive(q, 1, LONG_VISIBILITY_SECS, RECEIVE_WAIT_MS, rule).await;
        assert_eq!(
            got.iter().map(|r| &r.job).collect::<Vec<_>>(),
            vec![&m.job],
            "queue contract [{rule}]: the group's next message comes next ({})",
            m.dedup_id
        );
        ack(q, &got[0], rule).await;
    }
    expect_nothing(q, "group drained").await;

    visibility(q, &run).await;
    retry(q, &run).await;
    dead_letter(q, &run, max_receive_count, true).await;

    let rule = "fifo-rejects-delay";
    let mut delayed = message(&run, "delayed", "delayed");
    delayed.delay_secs = 1;
    assert!(
        q.send(delayed).await.is_err(),
        "queue contract [{rule}]: a FIFO queue must reject delay_secs > 0 (SQS does)"
    );
    expect_nothing(q, "a rejected send stores nothing").await;
}

/// The standard (delay) queue contract, for the queue that carries shutdown-lease
/// rechecks.
///
/// `q` must be a dedicated, empty standard queue with dead-letter redrive after
/// `max_receive_count` (≥ 3) receives. Checks: send → receive → ack; `delay_secs` hides a message
/// for that long while undelayed ones flow; `delay_secs > 900` is rejected; visibility
/// timeout, `retry_after` and dead-lettering as in the FIFO contract. Takes about 3 s.
pub async fn queue_delay_contract<Q: Queue>(q: &Q, max_receive_count: u32) {
    assert!(
        max_receive_count >= 3,
        "queue contract: the suite receives one message 3 times; use max_receive_count >= 3"
    );
    let run = unique();
    round_trip(q, &run).await;

    let rule = "delay-secs";
    let mut delayed = message(&run, "delayed", "delayed");
    delayed.delay_secs = 1;
    let now = message(&run, "undelayed", "undelayed");
    let sent_at = Instant::now();
    send_ok(q, &delayed, rule).await;
    send_ok(q, &now, rule).await;
    let r = receive_exactly(q, &now, LONG_VISIBILITY_SECS, 1, rule).await;
    ack(q, &r, rule).await;
    expect_nothing(
        q,
        "delay-secs: a delayed message is hidden until its delay passed",
    )
    .await;
    let r = receive_exactly(q, &delayed, LONG_VISIBILITY_SECS, 1, rule).await;
    let hidden_ms = sent_at.elapsed().as_millis();
    assert!(
        hidden_ms >= MIN_HIDDEN_MS,
        "queue contract [{rule}]: delay_secs = 1 delivered after {hidden_ms} ms"
    );
    ack(q, &r, rule).await;

    let rule = "delay-secs-limit";
    let mut too_long = message(&run, "too-long", "too-long");
    too_long.delay_secs = 901;
    assert!(
        q.send(too_long).await.is_err(),
        "queue contract [{rule}]: delay_secs > 900 must be rejected (SQS limit)"
    );
    expect_nothing(q, "a rejected send stores nothing").await;

    visibility(q, &run).await;
    retry(q, &run).await;
    dead_letter(q, &run, max_receive_count, false).await;
}

fn registry_fail(rule: &str, e: impl std::fmt::Display) -> String {
    format!("registry contract [{rule}]: call failed: {e}")
}

/// Takes the lock on `key` for `owner` (panics on a port error), returning what it read.
async fn take<R: Registry>(
    r: &R,
    key: &EffectKey,
    owner: &str,
    until: u64,
    at: u64,
) -> Option<Locked> {
    r.lock(key, owner, until, at)
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail("lock", e)))
}

async fn fenced_put<R: Registry>(
    r: &R,
    fence: &Fence,
    at: u64,
    record: &Record,
    expected: Option<u64>,
    rule: &str,
) -> Write {
    r.put(fence, at, record, expected)
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)))
}

async fn release<R: Registry>(
    r: &R,
    fence: &Fence,
    at: u64,
    release: Release<'_>,
    rule: &str,
) -> bool {
    r.release(fence, at, release)
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)))
}

async fn delivery_seen<R: Registry>(r: &R, webhook_id: &str, at: u64, rule: &str) -> bool {
    r.seen_delivery(webhook_id, at)
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)))
}

fn fence(key: &EffectKey, owner: &str) -> Fence {
    Fence {
        key: key.clone(),
        owner: owner.to_owned(),
    }
}

/// History expires, for an adapter built with the default retention
/// ([`crate::ports::DEFAULT_HISTORY_RETENTION_SECS`]) on the system clock: a receipt whose
/// `at` is older than the retention reads as absent (DynamoDB: `expires_at` = `at` +
/// retention is already past, read as absent before TTL deletes it; SQLite: before the
/// cutoff), one a second inside it and a fresh one are read, oldest first.
pub async fn registry_history_retention_contract<R: Registry>(r: &R) {
    let rule = "history-expires";
    let run = unique();
    let now = SystemClock.now();
    let retention = crate::ports::DEFAULT_HISTORY_RETENTION_SECS;
    let key = EnvironmentId::new(format!("env_ret_{run}")).effect_key();
    let receipt = |at: u64, session: &str| Receipt {
        at,
        effect_key: key.clone(),
        kind: ReceiptKind::SessionDeleted {
            session_id: SessionId::new(session),
        },
    };
    let expired = receipt(now - retention - 60, "sess_ret_expired");
    let kept = receipt(now - retention + 600, "sess_ret_kept");
    let fresh = receipt(now, "sess_ret_fresh");
    for entry in [&expired, &kept, &fresh] {
        r.receipt(entry)
            .await
            .unwrap_or_else(|e| panic!("registry contract [{rule}]: receipt: {e}"));
    }
    assert_eq!(
        r.receipts(&key).await.unwrap(),
        vec![kept, fresh],
        "registry contract [{rule}]: a receipt older than the history retention reads as absent; newer ones are read, oldest first"
    );
}

/// The registry contract: fenced conditional record writes, locks that read the record,
/// the atomic release, the delivery ledger, audit and receipts. Safe to run concurrently
/// with other calls on one backend (unique keys).
///
/// Checks: a lock on a fresh key reads no record and is not `recovered`; `put` under the
/// lock with `None` creates once (version 1) and conflicts the second time; a write at
/// the current version succeeds and increments it; stale or future versions conflict and
/// change nothing; `get`, `find_by_session` and `list` return the stored record with its
/// stored version (and `list` no lock-only key); a lock is refused to a second owner while
/// held (also at `now == until`) and taken by another owner once expired (`until < now`),
/// reading the record and saying `recovered`; every write of a former owner or after
/// expiry is refused (fencing); a release writes record, audit and ledger entry and frees
/// the lock all or nothing; an unclean release leaves the lock taken-but-expired, so the
/// next take is `recovered`; a remembered delivery is seen until it expires and then reads
/// as absent; audit entries append; receipts list per key, oldest first.
pub async fn registry_contract<R: Registry>(r: &R) {
    registry_evidence_contract(r).await;
    registry_open_records_contract(r).await;
    registry_terminal_contract(r).await;
    registry_history_retention_contract(r).await;
    let run = unique();
    let now = SystemClock.now();
    let env = EnvironmentId::new(format!("env_ct_{run}"));
    let session = SessionId::new(format!("sess_ct_{run}"));
    let key = env.effect_key();
    let w0 = format!("owner-w-{run}");
    let f0 = fence(&key, &w0);

    // A lock on a fresh key.
    let rule = "lock-reads-record";
    assert_eq!(
        take(r, &key, &w0, now + 600, now).await,
        Some(Locked {
            record: None,
            recovered: false
        }),
        "registry contract [{rule}]: a free lock on a fresh key is taken, reads no record and is not recovered"
    );

    // Conditional create.
    let rule = "put-create-once";
    let mut record = Record::new(env.clone(), session.clone());
    let w = fenced_put(r, &f0, now, &record, None, rule).await;
    assert_eq!(
        w,
        Write::Written(1),
        "registry contract [{rule}]: the first create writes version 1"
    );
    let w = fenced_put(r, &f0, now, &record, None, rule).await;
    assert_eq!(
        w,
        Write::Conflict,
        "registry contract [{rule}]: a second create must conflict"
    );
    let stored = r
        .get(&key)
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)))
        .unwrap_or_else(|| {
            panic!("registry contract [{rule}]: the created record must be readable")
        });
    assert_eq!(
        stored.version, 1,
        "registry contract [{rule}]: get returns the stored version"
    );
    assert_eq!(stored.environment_id, env);
    assert_eq!(stored.session_id, session);

    // Versioned updates.
    let rule = "put-versioned";
    record.generation = Generation(1);
    record.instance = Some(InstanceRef {
        instance_id: InstanceId::new(format!("inst_ct_{run}")),
        generation: Generation(1),
    });
    record.lease = Some(ShutdownLease {
        target: InstanceRef {
            instance_id: InstanceId::new(format!("inst_ct_{run}")),
            generation: Generation(1),
        },
        requested_at: now,
        due_at: now + 300,
    });
    let w = fenced_put(r, &f0, now, &record, Some(1), rule).await;
    assert_eq!(
        w,
        Write::Written(2),
        "registry contract [{rule}]: a write at the current version increments it"
    );
    let mut stale = record.clone();
    stale.status = RecordStatus::Closed;
    for expected in [Some(1), Some(3), None] {
        let w = fenced_put(r, &f0, now, &stale, expected, rule).await;
        assert_eq!(
            w,
            Write::Conflict,
            "registry contract [{rule}]: a write expecting version {expected:?} when 2 is stored must conflict"
        );
    }
    let stored = r
        .get(&key)
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)))
        .unwrap_or_else(|| panic!("registry contract [{rule}]: record vanished"));
    let mut expected_record = record.clone();
    expected_record.version = 2;
    assert_eq!(
        stored, expected_record,
        "registry contract [{rule}]: get returns the last written record with its version; conflicts change nothing"
    );
    let w = fenced_put(r, &f0, now, &stored, Some(2), rule).await;
    assert_eq!(
        w,
        Write::Written(3),
        "registry contract [{rule}]: versions keep incrementing"
    );

    // Fencing of puts.
    let rule = "put-fenced";
    let stranger = fence(&key, &format!("owner-x-{run}"));
    assert_eq!(
        fenced_put(r, &stranger, now, &stale, Some(3), rule).await,
        Write::Conflict,
        "registry contract [{rule}]: a write by an owner that does not hold the lock is refused"
    );
    assert_eq!(
        fenced_put(r, &f0, now + 601, &stale, Some(3), rule).await,
        Write::Conflict,
        "registry contract [{rule}]: a write after the lock expired (until < now) is refused"
    );
    let env_other = EnvironmentId::new(format!("env_ct_{run}_other"));
    assert!(
        r.put(&fence(&env_other.effect_key(), &w0), now, &stale, Some(3))
            .await
            .is_err(),
        "registry contract [{rule}]: a record of another effect key than the fence's is an error"
    );
    assert_eq!(
        r.get(&key)
            .await
            .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)))
            .map(|rec| rec.version),
        Some(3),
        "registry contract [{rule}]: refused writes change nothing"
    );
    assert!(
        release(
            r,
            &f0,
            now,
            Release {
                clean: true,
                ..Release::default()
            },
            rule
        )
        .await,
        "registry contract [{rule}]: the holder releases"
    );

    // Lookups.
    let rule = "find-by-session";
    let found = r
        .find_by_session(&session)
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)))
        .unwrap_or_else(|| {
            panic!("registry contract [{rule}]: the session's record must be found")
        });
    assert_eq!(found.environment_id, env, "registry contract [{rule}]");
    assert_eq!(
        found.version, 3,
        "registry contract [{rule}]: the stored version"
    );
    let nobody = SessionId::new(format!("sess_ct_{run}_nobody"));
    assert_eq!(
        r.find_by_session(&nobody)
            .await
            .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e))),
        None,
        "registry contract [{rule}]: an unknown session has no record"
    );

    let rule = "list";
    let env2 = EnvironmentId::new(format!("env_ct_{run}_2"));
    let session2 = SessionId::new(format!("sess_ct_{run}_2"));
    let f2 = fence(&env2.effect_key(), &w0);
    assert!(take(r, &f2.key, &w0, now + 60, now).await.is_some());
    let created = Record::new(env2.clone(), session2);
    assert!(
        release(
            r,
            &f2,
            now,
            Release {
                record: Some((&created, None)),
                clean: true,
                ..Release::default()
            },
            rule
        )
        .await,
        "registry contract [{rule}]: a release may create the record"
    );
    // A key that was only ever locked has no record.
    let env3 = EnvironmentId::new(format!("env_ct_{run}_3"));
    let f3 = fence(&env3.effect_key(), &w0);
    assert!(take(r, &f3.key, &w0, now + 60, now).await.is_some());
    let all = r
        .list()
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)));
    for (e, v) in [(&env, 3), (&env2, 1)] {
        let listed: Vec<&Record> = all.iter().filter(|rec| &rec.environment_id == e).collect();
        assert_eq!(
            listed.len(),
            1,
            "registry contract [{rule}]: list returns every record once ({e})"
        );
        assert_eq!(
            listed[0].version, v,
            "registry contract [{rule}]: listed with its stored version"
        );
    }
    assert!(
        !all.iter().any(|rec| rec.environment_id == env3),
        "registry contract [{rule}]: a locked key without a record lists nothing"
    );
    assert_eq!(
        r.get(&f3.key)
            .await
            .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e))),
        None,
        "registry contract [{rule}]: a locked key without a record reads as no record"
    );
    assert!(
        release(
            r,
            &f3,
            now,
            Release {
                clean: true,
                ..Release::default()
            },
            rule
        )
        .await
    );

    // Locks, fencing and the atomic release.
    let rule = "lock";
    let (a, b, c) = (
        format!("owner-a-{run}"),
        format!("owner-b-{run}"),
        format!("owner-c-{run}"),
    );
    let (fa, fb, fc) = (fence(&key, &a), fence(&key, &b), fence(&key, &c));
    let taken = take(r, &key, &a, now + 30, now).await.unwrap_or_else(|| {
        panic!("registry contract [{rule}]: a cleanly released lock is taken again")
    });
    assert_eq!(
        (taken.record.map(|rec| rec.version), taken.recovered),
        (Some(3), false),
        "registry contract [{rule}]: the take reads the record; after a clean release it is not recovered"
    );
    assert!(
        take(r, &key, &b, now + 30, now).await.is_none(),
        "registry contract [{rule}]: a held lock is refused to another owner"
    );
    assert!(
        take(r, &key, &b, now + 60, now + 30).await.is_none(),
        "registry contract [{rule}]: a lock is still held at now == until (expired means until < now)"
    );
    let taken = take(r, &key, &b, now + 100, now + 31)
        .await
        .unwrap_or_else(|| {
            panic!("registry contract [{rule}]: an expired lock (until < now) can be taken by another owner")
        });
    assert!(
        taken.recovered,
        "registry contract [{rule}]: taking an expired lock is recovered"
    );
    let rule = "fencing";
    assert_eq!(
        fenced_put(r, &fa, now + 32, &stored, Some(3), rule).await,
        Write::Conflict,
        "registry contract [{rule}]: the former owner's write is refused"
    );
    let wh_a = format!("msg_ct_{run}_a");
    let entry = AuditEntry {
        at: now,
        effect_key: key.clone(),
        session_id: session.clone(),
        trigger: serde_json::json!({"kind": "sweep"}),
        observed: serde_json::json!({"record_version": 3}),
        outcome: "start".to_owned(),
        reason: format!("contract {run}"),
        applied: vec![],
        error: None,
    };
    assert!(
        !release(
            r,
            &fa,
            now + 32,
            Release {
                record: Some((&stored, Some(3))),
                audit: Some(&entry),
                delivery: Some((&wh_a, now + 1000)),
                clean: true,
            },
            rule
        )
        .await,
        "registry contract [{rule}]: the former owner's release is refused"
    );
    assert!(
        !delivery_seen(r, &wh_a, now + 33, rule).await,
        "registry contract [{rule}]: a refused release remembers no delivery"
    );
    assert!(
        take(r, &key, &c, now + 100, now + 40).await.is_none(),
        "registry contract [{rule}]: a former owner's release must not free the current owner's lock"
    );
    assert_eq!(
        fenced_put(r, &fb, now + 40, &stored, Some(3), rule).await,
        Write::Written(4),
        "registry contract [{rule}]: the holder writes"
    );
    let rule = "release";
    let wh_b = format!("msg_ct_{run}_b");
    let mut closing = stored.clone();
    closing.status = RecordStatus::Stopped;
    assert!(
        release(
            r,
            &fb,
            now + 41,
            Release {
                record: Some((&closing, Some(4))),
                audit: Some(&entry),
                delivery: Some((&wh_b, now + 1000)),
                clean: false,
            },
            rule
        )
        .await,
        "registry contract [{rule}]: the holder's release is applied"
    );
    assert!(
        delivery_seen(r, &wh_b, now + 42, rule).await,
        "registry contract [{rule}]: the release remembers the delivery"
    );
    let taken = take(r, &key, &c, now + 100, now + 42)
        .await
        .unwrap_or_else(|| panic!("registry contract [{rule}]: a released lock is free"));
    let read = taken
        .record
        .unwrap_or_else(|| panic!("registry contract [{rule}]: the record is still there"));
    assert_eq!(
        (read.version, read.status, taken.recovered),
        (5, RecordStatus::Stopped, true),
        "registry contract [{rule}]: the release wrote the record; an unclean release leaves the next take recovered"
    );
    let wh_c = format!("msg_ct_{run}_c");
    assert!(
        !release(
            r,
            &fc,
            now + 43,
            Release {
                record: Some((&closing, Some(4))),
                audit: Some(&entry),
                delivery: Some((&wh_c, now + 1000)),
                clean: true,
            },
            rule
        )
        .await,
        "registry contract [{rule}]: a release with a stale record version is refused"
    );
    assert!(
        !delivery_seen(r, &wh_c, now + 43, rule).await,
        "registry contract [{rule}]: all or nothing: a refused release remembers no delivery"
    );
    assert!(
        take(r, &key, &a, now + 100, now + 43).await.is_none(),
        "registry contract [{rule}]: a refused release keeps the lock held"
    );
    assert!(
        release(
            r,
            &fc,
            now + 44,
            Release {
                clean: true,
                ..Release::default()
            },
            rule
        )
        .await,
        "registry contract [{rule}]: a release without writes frees the lock"
    );
    let taken = take(r, &key, &a, now + 100, now + 45).await;
    assert_eq!(
        taken.map(|t| (t.record.map(|rec| rec.version), t.recovered)),
        Some((Some(5), false)),
        "registry contract [{rule}]: after a clean release the lock is free and not recovered"
    );
    assert!(
        release(
            r,
            &fa,
            now + 45,
            Release {
                clean: true,
                ..Release::default()
            },
            rule
        )
        .await
    );
    let rule = "release-unlocked";
    let never = fence(
        &EnvironmentId::new(format!("env_ct_{run}_never")).effect_key(),
        &a,
    );
    assert!(
        !release(
            r,
            &never,
            now,
            Release {
                clean: true,
                ..Release::default()
            },
            rule
        )
        .await,
        "registry contract [{rule}]: releasing a never-locked key is refused and changes nothing"
    );

    // Delivery ledger.
    let rule = "ledger";
    let wh = format!("msg_ct_{run}");
    let seen = |at: u64| {
        let wh = wh.clone();
        async move {
            r.seen_delivery(&wh, at)
                .await
                .unwrap_or_else(|e| panic!("{}", registry_fail("ledger", e)))
        }
    };
    assert!(
        !seen(now).await,
        "registry contract [{rule}]: an unknown delivery is not seen"
    );
    r.remember_delivery(&wh, now + 60)
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)));
    assert!(
        seen(now).await,
        "registry contract [{rule}]: a remembered delivery is seen"
    );
    assert!(
        seen(now + 59).await,
        "registry contract [{rule}]: seen until it expires"
    );
    assert!(
        !seen(now + 61).await,
        "registry contract [{rule}]: an expired entry reads as absent"
    );
    r.remember_delivery(&wh, now + 200)
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)));
    assert!(
        seen(now + 100).await,
        "registry contract [{rule}]: remembering again extends the entry"
    );
    assert!(
        !r.seen_delivery(&format!("{wh}_other"), now)
            .await
            .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e))),
        "registry contract [{rule}]: entries are per webhook id"
    );

    // Audit (append-only; the port has no read-back) and receipts.
    let rule = "audit";
    for (i, outcome) in ["start", "schedule-stop"].iter().enumerate() {
        let entry = AuditEntry {
            at: now + i as u64,
            effect_key: key.clone(),
            session_id: session.clone(),
            trigger: serde_json::json!({"kind": "sweep"}),
            observed: serde_json::json!({"record_version": 3}),
            outcome: (*outcome).to_owned(),
            reason: format!("contract {run}"),
            applied: vec![serde_json::json!({"effect": outcome})],
            error: None,
        };
        r.audit(&entry)
            .await
            .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)));
    }

    let rule = "receipts";
    let receipts = [
        Receipt {
            at: now,
            effect_key: key.clone(),
            kind: ReceiptKind::ComputeStopped {
                instance_id: InstanceId::new(format!("inst_ct_{run}")),
                generation: 1,
                reason: "lease_expired".to_owned(),
                workspace: Default::default(),
            },
        },
        Receipt {
            at: now + 1,
            effect_key: key.clone(),
            kind: ReceiptKind::SessionDeleted {
                session_id: session.clone(),
            },
        },
    ];
    let other = Receipt {
        at: now,
        effect_key: env2.effect_key(),
        kind: ReceiptKind::SessionDeleted {
            session_id: SessionId::new(format!("sess_ct_{run}_2")),
        },
    };
    r.receipt(&receipts[0])
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)));
    r.receipt(&other)
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)));
    r.receipt(&receipts[1])
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)));
    assert_eq!(
        r.receipts(&key)
            .await
            .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e))),
        receipts.to_vec(),
        "registry contract [{rule}]: receipts of one key, oldest first, no other key's"
    );
    assert_eq!(
        r.receipts(&env2.effect_key())
            .await
            .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e))),
        vec![other],
        "registry contract [{rule}]: receipts are per key"
    );
    let unknown = EnvironmentId::new(format!("env_ct_{run}_none")).effect_key();
    assert!(
        r.receipts(&unknown)
            .await
            .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)))
            .is_empty(),
        "registry contract [{rule}]: a key without receipts lists none"
    );
}

/// A start spec with unique environment and session ids for generation 1.
/// The open-records read every adapter must honour: `list_open` returns
/// each record that is not closed once, with its stored version, and never a closed one
/// (closing a record takes it out, reopening puts it back) or a key that was only locked;
/// `list` still returns the closed one. Run by [`registry_contract`].
pub async fn registry_open_records_contract<R: Registry>(r: &R) {
    let rule = "list-open";
    let run = unique();
    let now = SystemClock.now();
    let owner = format!("owner-open-{run}");
    let open_env = EnvironmentId::new(format!("env_open_{run}_a"));
    let closed_env = EnvironmentId::new(format!("env_open_{run}_b"));
    let locked_env = EnvironmentId::new(format!("env_open_{run}_c"));
    let write = |env: &EnvironmentId, status: RecordStatus, expected: Option<u64>| {
        let mut rec = Record::new(env.clone(), SessionId::new(format!("sess_{env}")));
        rec.status = status;
        (rec, expected)
    };
    for (env, status, expected) in [
        (&open_env, RecordStatus::Active, None),
        (&closed_env, RecordStatus::Active, None),
        (&closed_env, RecordStatus::Closed, Some(1)),
    ] {
        let f = fence(&env.effect_key(), &owner);
        assert!(take(r, &f.key, &owner, now + 60, now).await.is_some());
        let (rec, expected) = write(env, status, expected);
        let release = Release {
            record: Some((&rec, expected)),
            clean: true,
            ..Release::default()
        };
        assert!(
            self::release(r, &f, now, release, rule).await,
            "registry contract [{rule}]: the release writes {env}"
        );
    }
    assert!(
        take(r, &locked_env.effect_key(), &owner, now + 60, now)
            .await
            .is_some()
    );
    let listed = |all: &[Record], env: &EnvironmentId| {
        all.iter()
            .filter(|rec| &rec.environment_id == env)
            .map(|rec| rec.version)
            .collect::<Vec<_>>()
    };
    let open = r
        .list_open()
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)));
    assert_eq!(
        listed(&open, &open_env),
        vec![1],
        "registry contract [{rule}]: an open record is listed once, with its version"
    );
    assert!(
        listed(&open, &closed_env).is_empty(),
        "registry contract [{rule}]: a closed record is not listed"
    );
    assert!(
        listed(&open, &locked_env).is_empty(),
        "registry contract [{rule}]: a locked key without a record is not listed"
    );
    assert!(
        open.iter().all(|rec| rec.status != RecordStatus::Closed),
        "registry contract [{rule}]: nothing closed is listed"
    );
    let all = r
        .list()
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)));
    assert_eq!(
        listed(&all, &closed_env),
        vec![2],
        "registry contract [{rule}]: list still returns the closed record"
    );
    // Reopened (a new session on a closed environment's id): listed again.
    let f = fence(&closed_env.effect_key(), &owner);
    assert!(take(r, &f.key, &owner, now + 60, now).await.is_some());
    let (rec, expected) = write(&closed_env, RecordStatus::Stopped, Some(2));
    let release = Release {
        record: Some((&rec, expected)),
        clean: true,
        ..Release::default()
    };
    assert!(self::release(r, &f, now, release, rule).await);
    let open = r
        .list_open()
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)));
    assert_eq!(
        listed(&open, &closed_env),
        vec![3],
        "registry contract [{rule}]: a record written open again is listed again"
    );
}

fn contract_spec(run: &str, suffix: &str) -> StartSpec {
    let environment_id = EnvironmentId::new(format!("env_ct_{run}{suffix}"));
    StartSpec {
        session_id: SessionId::new(format!("sess_ct_{run}{suffix}")),
        remote_url: format!(
            "wss://agents.invalid/v1/environments/env_ct_{run}{suffix}/connect?x=1&y=a%20b"
        ),
        workspace_directory: "/workspace".to_owned(),
        generation: Generation(1),
        idempotency_token: idempotency_token(&environment_id, Generation(1)),
        environment_id,
        previous: None,
        restore: None,
    }
}

/// Another valid deployment id, different from `d`.
fn other_deployment(d: &DeploymentId) -> DeploymentId {
    let base: String = d.as_str().chars().take(33).collect();
    let suffix = if format!("{base}-ct") == d.as_str() {
        "-cu"
    } else {
        "-ct"
    };
    DeploymentId::new(format!("{base}{suffix}"))
        .unwrap_or_else(|e| panic!("compute contract: derived deployment id invalid: {e}"))
}

async fn start_instance<C: Compute>(c: &C, spec: &StartSpec, d: &DeploymentId) -> ComputeInstance {
    let rule = "start";
    match c
        .start(spec, d, NO_DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("compute contract [{rule}]: start failed: {e}"))
    {
        Started::Instance(i) => {
            assert_tags(&i, spec, rule);
            i
        }
        Started::Failed { reason } => {
            panic!("compute contract [{rule}]: the provider refused the start: {reason}")
        }
    }
}

fn assert_tags(i: &ComputeInstance, spec: &StartSpec, rule: &str) {
    assert_eq!(
        i.environment_id, spec.environment_id,
        "compute contract [{rule}]: environment tag"
    );
    assert_eq!(
        i.session_id.as_ref(),
        Some(&spec.session_id),
        "compute contract [{rule}]: session tag"
    );
    assert_eq!(
        i.generation, spec.generation,
        "compute contract [{rule}]: generation tag"
    );
    assert!(
        i.status.is_active(),
        "compute contract [{rule}]: a fresh instance is provisioning, pending or running, got {:?}",
        i.status
    );
}

async fn describe<C: Compute>(c: &C, id: &InstanceId, rule: &str) -> Option<ComputeInstance> {
    c.describe(id)
        .await
        .unwrap_or_else(|e| panic!("compute contract [{rule}]: describe failed: {e}"))
}

async fn list<C: Compute>(c: &C, d: &DeploymentId, rule: &str) -> Vec<ComputeInstance> {
    c.list(d)
        .await
        .unwrap_or_else(|e| panic!("compute contract [{rule}]: list failed: {e}"))
}

/// Lists `d` until `done` holds (a list is eventually consistent: ECS may omit a task for
/// seconds after `RunTask`), for at most [`STOP_READ_BACK_TIMEOUT`]; returns the last list.
async fn list_until<C: Compute>(
    c: &C,
    d: &DeploymentId,
    rule: &str,
    done: impl Fn(&[ComputeInstance]) -> bool,
) -> Vec<ComputeInstance> {
    let deadline = Instant::now() + STOP_READ_BACK_TIMEOUT;
    loop {
        let listed = list(c, d, rule).await;
        if done(&listed) || Instant::now() >= deadline {
            return listed;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Stops `id` and polls `describe` until it reads back `Stopped` (bounded).
async fn stop_and_confirm<C: Compute>(c: &C, id: &InstanceId) -> ComputeInstance {
    let rule = "stop";
    c.stop(id, "contract", NO_DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("compute contract [{rule}]: stop failed: {e}"));
    let deadline = Instant::now() + STOP_READ_BACK_TIMEOUT;
    loop {
        let i = describe(c, id, rule).await.unwrap_or_else(|| {
            panic!("compute contract [{rule}]: a stopped instance must still be described")
        });
        if i.status == ComputeStatus::Stopped {
            return i;
        }
        assert!(
            Instant::now() < deadline,
            "compute contract [{rule}]: {id} did not read back Stopped within {STOP_READ_BACK_TIMEOUT:?} (last {:?})",
            i.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The compute contract, for provider adapters (ECS, child processes).
///
/// Starts one instance tagged with `deployment` and one with a derived second deployment
/// id, then checks: `start` returns the instance with its environment, session and
/// generation tags and an active status; `describe` reads it back with the same tags;
/// `describe_many` reads both back by id in one call and leaves an unknown id out;
/// `list(deployment)` finds it (within 30 s: lists are eventually consistent) and never
/// the other deployment's instance (and vice versa); `stop` is accepted and `describe`
/// reads back `Stopped` within 30 s (polling every 100 ms), keeping the tags; a stopped
/// instance is no longer listed as live (`list` is live instances only); `describe` of an
/// unknown id (the started id with a `0` appended) is `None`; a start or stop whose
/// deadline (`not_after`) passed is refused and starts or stops nothing. Both instances are
/// stopped before returning.
pub async fn compute_contract<C: Compute>(c: &C, deployment: &DeploymentId) {
    let run = unique();
    let spec = contract_spec(&run, "");
    let other_spec = contract_spec(&run, "_o");
    let other_deployment = other_deployment(deployment);

    let rule = "deadline";
    let late_spec = contract_spec(&run, "_late");
    assert!(
        c.start(&late_spec, deployment, 0).await.is_err(),
        "compute contract [{rule}]: a start whose deadline passed is refused"
    );

    let inst = start_instance(c, &spec, deployment).await;
    let other = start_instance(c, &other_spec, &other_deployment).await;
    assert!(
        c.stop(&inst.instance_id, "contract", 0).await.is_err(),
        "compute contract [{rule}]: a stop whose deadline passed is refused"
    );
    assert!(
        list(c, deployment, rule)
            .await
            .iter()
            .all(|i| i.environment_id != late_spec.environment_id),
        "compute contract [{rule}]: a refused start started nothing"
    );

    let rule = "describe";
    let read = describe(c, &inst.instance_id, rule)
        .await
        .unwrap_or_else(|| {
            panic!("compute contract [{rule}]: a started instance must be described")
        });
    assert_eq!(
        read.instance_id, inst.instance_id,
        "compute contract [{rule}]: same id"
    );
    assert_tags(&read, &spec, rule);

    let rule = "describe-many";
    let unknown = InstanceId::new(format!("{}0", inst.instance_id));
    let mut read = c
        .describe_many(&[
            inst.instance_id.clone(),
            unknown.clone(),
            other.instance_id.clone(),
        ])
        .await
        .unwrap_or_else(|e| panic!("compute contract [{rule}]: describe_many failed: {e}"));
    read.sort_by(|a, b| a.instance_id.as_str().cmp(b.instance_id.as_str()));
    let mut want = vec![inst.instance_id.clone(), other.instance_id.clone()];
    want.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    assert_eq!(
        read.iter()
            .map(|i| i.instance_id.clone())
            .collect::<Vec<_>>(),
        want,
        "compute contract [{rule}]: both started instances read back by id, the unknown id left out"
    );

    let rule = "list-by-deployment";
    let listed = list_until(c, deployment, rule, |l| {
        l.iter().any(|i| i.instance_id == inst.instance_id)
    })
    .await;
    let mine: Vec<&ComputeInstance> = listed
        .iter()
        .filter(|i| i.instance_id == inst.instance_id)
        .collect();
    assert_eq!(
        mine.len(),
        1,
        "compute contract [{rule}]: list(deployment) finds the instance once"
    );
    assert_tags(mine[0], &spec, rule);
    assert!(
        listed.iter().all(|i| i.instance_id != other.instance_id),
        "compute contract [{rule}]: list(deployment) must not return another deployment's instance"
    );
    let listed_other = list_until(c, &other_deployment, rule, |l| {
        l.iter().any(|i| i.instance_id == other.instance_id)
    })
    .await;
    assert!(
        listed_other
            .iter()
            .any(|i| i.instance_id == other.instance_id)
            && listed_other
                .iter()
                .all(|i| i.instance_id != inst.instance_id),
        "compute contract [{rule}]: each deployment lists only its own instances"
    );

    let rule = "stop";
    let stopped = stop_and_confirm(c, &inst.instance_id).await;
    assert_eq!(
        stopped.environment_id, spec.environment_id,
        "compute contract [{rule}]: tags survive the stop"
    );
    assert_eq!(
        stopped.generation, spec.generation,
        "compute contract [{rule}]: tags survive the stop"
    );
    let live_again = |l: &[ComputeInstance]| {
        l.iter()
            .any(|i| i.instance_id == inst.instance_id && i.status.is_live())
    };
    assert!(
        !live_again(&list_until(c, deployment, rule, |l| !live_again(l)).await),
        "compute contract [{rule}]: a stopped instance is never listed live"
    );
    stop_and_confirm(c, &other.instance_id).await;

    let rule = "describe-unknown";
    assert_eq!(
        describe(c, &unknown, rule).await,
        None,
        "compute contract [{rule}]: an unknown instance id must describe as None"
    );
}

/// The idempotent-start contract: every adapter honours the idempotency token (ECS
/// `clientToken` on AWS; moto ignores it, so the moto suite runs ECS behind a server that
/// honours it, `tests/moto/`).
///
/// Checks: a second start with the same spec and deployment returns the same instance id
/// and `list(deployment)` holds exactly one instance of the environment; a start of the next
/// generation (new token) creates a different instance. Stops everything it started.
pub async fn compute_idempotency_contract<C: Compute>(c: &C, deployment: &DeploymentId) {
    let run = unique();
    let spec = contract_spec(&run, "_i");
    let rule = "idempotent-start";
    let first = start_instance(c, &spec, deployment).await;
    let again = start_instance(c, &spec, deployment).await;
    assert_eq!(
        again.instance_id, first.instance_id,
        "compute contract [{rule}]: a start with the same idempotency token returns the same instance"
    );
    let of_env = |all: Vec<ComputeInstance>| -> Vec<ComputeInstance> {
        all.into_iter()
            .filter(|i| i.environment_id == spec.environment_id)
            .collect()
    };
    let listed = of_env(
        list_until(c, deployment, rule, |l| {
            l.iter().any(|i| i.instance_id == first.instance_id)
        })
        .await,
    );
    assert_eq!(
        listed.len(),
        1,
        "compute contract [{rule}]: exactly one instance exists for the token"
    );

    let mut next = spec.clone();
    next.generation = Generation(2);
    next.idempotency_token = idempotency_token(&spec.environment_id, Generation(2));
    next.previous = Some(first.as_ref());
    let second = start_instance(c, &next, deployment).await;
    assert_ne!(
        second.instance_id, first.instance_id,
        "compute contract [{rule}]: a new token starts a new instance"
    );
    assert_eq!(
        second.generation,
        Generation(2),
        "compute contract [{rule}]: generation tag"
    );
    stop_and_confirm(c, &first.instance_id).await;
    stop_and_confirm(c, &second.instance_id).await;
}

/// Part of [`registry_contract`]: the reconciliation evidence and the mapping
/// fields (connection state, last reconciled event id) are stored and read back exactly,
/// through a fenced `put`, through the atomic `release`, by `get`, `find_by_session` and
/// `list`; a resolution written under the lock replaces the open entry.
pub async fn registry_evidence_contract<R: Registry>(r: &R) {
    use sandbox_core::environment::EnvironmentStatus;
    use sandbox_core::evidence::{
        ConnectionObservation, EffectState, Evidence, EvidenceTrigger, Resolution, ToolLayer,
        TurnLayer, WorkspaceLayer,
    };
    use sandbox_core::turn::{ItemStatus, TurnStatus};
    let rule = "record-keeps-evidence";
    let run = unique();
    let now = SystemClock.now();
    let env = EnvironmentId::new(format!("env_ev_{run}"));
    let session = SessionId::new(format!("sess_ev_{run}"));
    let key = env.effect_key();
    let owner = format!("owner-ev-{run}");
    let f = fence(&key, &owner);
    assert!(take(r, &key, &owner, now + 600, now).await.is_some());
    let task = InstanceRef {
        instance_id: InstanceId::new(format!("inst_ev_{run}")),
        generation: Generation(2),
    };
    let mut record = Record::new(env.clone(), session.clone());
    record.generation = Generation(2);
    record.instance = Some(task.clone());
    record.evidence = vec![Evidence {
        trigger: EvidenceTrigger::MidTurnDisconnect,
        reason: "turn turn_ev completed with 1 broken tool item(s) after a disconnect".into(),
        turn: Some(TurnLayer {
            id: format!("turn_ev_{run}"),
            status: TurnStatus::Completed,
            error: Some("{\"code\":\"x\"}".into()),
        }),
        tools: vec![ToolLayer {
            id: "item_ev".into(),
            kind: "command_execution".into(),
            status: ItemStatus::Incomplete,
        }],
        workspace: WorkspaceLayer {
            generation: Generation(2),
            live_in: Some(task),
            snapshot: None,
        },
        effect: EffectState::Unknown,
        submission: None,
        observed_at: now,
        resolution: None,
    }];
    record.connection = Some(ConnectionObservation {
        status: EnvironmentStatus::Disconnected,
        since: now - 5,
        read_at: now,
    });
    record.last_reconciled_event_id = Some(format!("msg_ev_{run}"));
    assert_eq!(
        fenced_put(r, &f, now, &record, None, rule).await,
        Write::Written(1),
        "registry contract [{rule}]: create"
    );
    let mut expected = record.clone();
    expected.version = 1;
    let got = r
        .get(&key)
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)));
    assert_eq!(
        got.as_ref(),
        Some(&expected),
        "registry contract [{rule}]: get returns the evidence and mapping fields exactly"
    );
    let by_session = r
        .find_by_session(&session)
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)));
    assert_eq!(
        by_session.as_ref(),
        Some(&expected),
        "registry contract [{rule}]: find_by_session"
    );
    let listed = r
        .list()
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)));
    assert!(
        listed.contains(&expected),
        "registry contract [{rule}]: list returns the evidence"
    );
    // A resolution written by the release, atomically with the unlock.
    let mut resolved = expected.clone();
    sandbox_core::evidence::resolve(
        &mut resolved.evidence,
        &Resolution {
            effect: EffectState::Compensated,
            by: "owner".into(),
            at: now,
            note: Some("rolled back".into()),
        },
    );
    assert!(
        release(
            r,
            &f,
            now,
            Release {
                record: Some((&resolved, Some(1))),
                clean: true,
                ..Release::default()
            },
            rule
        )
        .await,
        "registry contract [{rule}]: the release writes the resolution"
    );
    let got = r
        .get(&key)
        .await
        .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)))
        .unwrap_or_else(|| panic!("registry contract [{rule}]: record vanished"));
    assert_eq!(got.version, 2, "registry contract [{rule}]");
    assert_eq!(
        got.evidence, resolved.evidence,
        "registry contract [{rule}]: the resolved evidence reads back"
    );
    assert!(got.holding_evidence().is_none());
}
/// What a workspace contract run can do with the files of a live compute, where the
/// backend lets a test reach them (child processes: the directory; the twin: its volume).
/// ECS on moto runs no containers: it passes `None` and the suite checks the snapshot and
/// volume bookkeeping only (the `RunTask` request shape is asserted by the AWS tests).
pub trait WorkspaceProbe: Sync {
    /// Writes `content` to `path` in the live workspace of (`env`, `generation`).
    fn write(
        &self,
        env: &EnvironmentId,
        generation: Generation,
        path: &str,
        content: &str,
    ) -> impl std::future::Future<Output = ()> + Send;
    /// Reads `path` from the live workspace of (`env`, `generation`).
    fn read(
        &self,
        env: &EnvironmentId,
        generation: Generation,
        path: &str,
    ) -> impl std::future::Future<Output = Option<String>> + Send;
}

/// No probe: for backends whose files a test cannot reach.
pub struct NoProbe;

impl WorkspaceProbe for NoProbe {
    async fn write(&self, _: &EnvironmentId, _: Generation, _: &str, _: &str) {}
    async fn read(&self, _: &EnvironmentId, _: Generation, _: &str) -> Option<String> {
        None
    }
}

fn stored_of<'a>(
    all: &'a [crate::ports::StoredWorkspace],
    env: &EnvironmentId,
    kind: crate::ports::StoredKind,
) -> Vec<&'a crate::ports::StoredWorkspace> {
    all.iter()
        .filter(|s| &s.environment_id == env && s.kind == kind)
        .collect()
}

/// The workspace contract, for provider adapters with workspace persistence.
///
/// Starts generation 1 (`probe` writes a file into it), then checks: a save while the
/// compute is live is refused and deletes nothing; after the stop reads back `Stopped`,
/// `save_workspace` returns `snapshot <id>`, and again the same id (idempotent);
/// `list_stored(deployment)` shows the snapshot with its environment and generation tags
/// and still the working copy of generation 1 unless its snapshot is already `completed`
/// (a local archive is complete when written; an EBS snapshot is `pending`), and
/// nothing of it under another deployment; while the snapshot is `pending`
/// (`snapshot_state`), `delete_working_copy` keeps the working copy and `delete_stored`
/// refuses it; once `completed` (waited for, at most 120 s), `delete_working_copy` deletes
/// it; an unknown snapshot is `gone`; generation 2 started with `restore` = that snapshot reads the
/// file (`probe`); after its stop, `discard_workspace` answers `deleted` and leaves no
/// working copy; `delete_stored` removes the snapshot, twice without error; a save of a
/// generation that has nothing is `none`. Everything started is stopped.
pub async fn workspace_contract<C: Compute, P: WorkspaceProbe>(
    c: &C,
    deployment: &DeploymentId,
    probe: Option<&P>,
) {
    use crate::ports::StoredKind;
    use sandbox_core::workspace::{SnapshotRef, SnapshotState, WorkspaceDisposition};
    let run = unique();
    let spec = contract_spec(&run, "_ws");
    let env = spec.environment_id.clone();
    let g1 = Generation(1);
    let fail = |rule: &str, e: crate::ports::PortError| -> ! {
        panic!("workspace contract [{rule}]: {e}")
    };

    let first = start_instance(c, &spec, deployment).await;
    if let Some(p) = probe {
        p.write(&env, g1, "notes/agent.txt", &run).await;
    }
    let rule_live = "save-only-stopped";
    let live = c.save_workspace(deployment, &env, g1).await;
    assert!(
        live.is_err(),
        "workspace contract [{rule_live}]: a save while generation 1 runs must be refused, got {live:?}"
    );
    stop_and_confirm(c, &first.instance_id).await;

    let rule_snap = "snapshot-after-stop";
    let saved = c
        .save_workspace(deployment, &env, g1)
        .await
        .unwrap_or_else(|e| fail(rule_snap, e));
    let WorkspaceDisposition::Snapshot { snapshot_id } = saved.clone() else {
        panic!("workspace contract [{rule_snap}]: expected `snapshot <id>`, got {saved}");
    };
    let again = c
        .save_workspace(deployment, &env, g1)
        .await
        .unwrap_or_else(|e| fail(rule_snap, e));
    assert_eq!(
        again, saved,
        "workspace contract [{rule_snap}]: a second save returns the same snapshot"
    );
    let rule_list = "list-stored";
    let stored = c
        .list_stored(deployment)
        .await
        .unwrap_or_else(|e| fail(rule_list, e));
    let snaps = stored_of(&stored, &env, StoredKind::Snapshot);
    assert!(
        snaps
            .iter()
            .any(|s| s.id == snapshot_id && s.generation == g1),
        "workspace contract [{rule_list}]: the snapshot is listed with its tags: {stored:?}"
    );
    let volumes = stored_of(&stored, &env, StoredKind::Volume);
    let volume_id = volumes
        .iter()
        .find(|v| v.generation == g1)
        .map(|v| v.id.clone());
    if volume_id.is_none() {
        // Only an adapter whose snapshot is complete when the save returns (a local
        // archive) may have let the working copy go; never one with a pending snapshot.
        assert_eq!(
            c.snapshot_state(deployment, &snapshot_id)
                .await
                .unwrap_or_else(|e| fail(rule_list, e)),
            SnapshotState::Completed,
            "workspace contract [{rule_list}]: generation 1's working copy outlives a save whose snapshot is not completed: {stored:?}"
        );
    }
    let others = c
        .list_stored(&other_deployment(deployment))
        .await
        .unwrap_or_else(|e| fail(rule_list, e));
    assert!(
        others.iter().all(|s| s.id != snapshot_id),
        "workspace contract [{rule_list}]: another deployment does not list this snapshot"
    );

    let rule = "working-copy-after-completed";
    let waited = std::time::Instant::now();
    let mut deleted_early = false;
    loop {
        let state = c
            .snapshot_state(deployment, &snapshot_id)
            .await
            .unwrap_or_else(|e| fail(rule, e));
        match state {
            SnapshotState::Completed => break,
            SnapshotState::Pending => {
                let kept = c
                    .delete_working_copy(deployment, &env, g1, &snapshot_id)
                    .await
                    .unwrap_or_else(|e| fail(rule, e));
                // Read again: it may have completed between the two calls.
                let now = c
                    .snapshot_state(deployment, &snapshot_id)
                    .await
                    .unwrap_or_else(|e| fail(rule, e));
                if now == SnapshotState::Pending {
                    assert!(
                        !kept,
                        "workspace contract [{rule}]: a working copy whose snapshot is pending is kept"
                    );
                    if let Some(volume_id) = &volume_id {
                        let deleted = c
                            .delete_stored(deployment, StoredKind::Volume, volume_id)
                            .await
                            .is_ok();
                        // A delete that went through is wrong only if the snapshot is
                        // still pending after it: it may have completed during the call
                        // (moto keeps it pending 2 s; a loaded run can take that long).
                        let after = c
                            .snapshot_state(deployment, &snapshot_id)
                            .await
                            .unwrap_or_else(|e| fail(rule, e));
                        assert!(
                            !(deleted && after == SnapshotState::Pending),
                            "workspace contract [{rule}]: delete_stored keeps a working copy whose only snapshot is pending"
                        );
                        if deleted {
                            // Completed meanwhile, and its working copy is gone already.
                            deleted_early = true;
                            break;
                        }
                    }
                }
                assert!(
                    waited.elapsed() < std::time::Duration::from_secs(120),
                    "workspace contract [{rule}]: snapshot {snapshot_id} still pending after 120 s"
                );
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            other => panic!("workspace contract [{rule}]: snapshot {snapshot_id} is {other}"),
        }
    }
    assert!(
        deleted_early
            || c.delete_working_copy(deployment, &env, g1, &snapshot_id)
                .await
                .unwrap_or_else(|e| fail(rule, e)),
        "workspace contract [{rule}]: the working copy of a completed snapshot is deleted"
    );
    let stored = c
        .list_stored(deployment)
        .await
        .unwrap_or_else(|e| fail(rule, e));
    assert!(
        stored_of(&stored, &env, StoredKind::Volume)
            .iter()
            .all(|v| v.generation != g1),
        "workspace contract [{rule}]: generation 1's working copy is deleted: {stored:?}"
    );
    assert_eq!(
        c.snapshot_state(deployment, "snap-00000000000000000")
            .await
            .unwrap_or_else(|e| fail(rule, e)),
        SnapshotState::Gone,
        "workspace contract [{rule}]: an unknown snapshot is gone"
    );

    let rule = "restore-latest";
    let mut spec2 = spec.clone();
    spec2.generation = Generation(2);
    spec2.idempotency_token = idempotency_token(&env, Generation(2));
    spec2.previous = Some(first.as_ref());
    spec2.restore = Some(SnapshotRef {
        snapshot_id: snapshot_id.clone(),
        generation: g1,
        taken_at: 0,
        parent: None,
        expires_at: None,
    });
    let second = start_instance(c, &spec2, deployment).await;
    if let Some(p) = probe {
        assert_eq!(
            p.read(&env, Generation(2), "notes/agent.txt")
                .await
                .as_deref(),
            Some(run.as_str()),
            "workspace contract [{rule}]: generation 2 reads the file generation 1 wrote"
        );
    }
    stop_and_confirm(c, &second.instance_id).await;

    let rule = "discard";
    let discarded = c
        .discard_workspace(deployment, &env, Generation(2))
        .await
        .unwrap_or_else(|e| fail(rule, e));
    assert_eq!(
        discarded,
        WorkspaceDisposition::Deleted,
        "workspace contract [{rule}]: the working copy of generation 2 is deleted"
    );
    let stored = c
        .list_stored(deployment)
        .await
        .unwrap_or_else(|e| fail(rule, e));
    assert!(
        stored_of(&stored, &env, StoredKind::Volume).is_empty(),
        "workspace contract [{rule}]: no working copy is left: {stored:?}"
    );
    assert_eq!(
        c.save_workspace(deployment, &env, Generation(2))
            .await
            .unwrap_or_else(|e| fail(rule, e)),
        WorkspaceDisposition::None,
        "workspace contract [{rule}]: nothing to save after a discard"
    );

    let rule = "delete-snapshot";
    for _ in 0..2 {
        c.delete_stored(deployment, StoredKind::Snapshot, &snapshot_id)
            .await
            .unwrap_or_else(|e| fail(rule, e));
    }
    let stored = c
        .list_stored(deployment)
        .await
        .unwrap_or_else(|e| fail(rule, e));
    assert!(
        stored_of(&stored, &env, StoredKind::Snapshot).is_empty(),
        "workspace contract [{rule}]: the deleted snapshot is not listed: {stored:?}"
    );
}

/// The executor cap per deployment: the registry's slots. Needs a
/// registry *of its own* (no slot held and no other user of slots: the counter is
/// deployment-wide); `cap` of 3 is used.
///
/// Checks: a slot is taken under the lock (`Acquired`), a second take by the same
/// environment is `Held` and changes nothing; the counter and the holders agree; at the
/// cap a new environment gets `Full` and nothing changes; a release is `Released` once,
/// then `NotHeld`, and frees a slot for the next environment; an acquire or release with a
/// lost or expired lock is `LockLost` and changes nothing; and 24 environments acquiring
/// concurrently (each under its own lock) end with exactly `cap` holders and a counter of
/// `cap` — never more, whatever the interleaving.
pub async fn registry_slots_contract<R: Registry + Clone>(r: &R) {
    const CAP: u32 = 3;
    let run = unique();
    let now = SystemClock.now();
    let slots = |rule: &'static str| async move {
        r.slots()
            .await
            .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)))
    };
    let start = slots("slots-start").await;
    assert_eq!(
        (start.in_use, start.holders.len()),
        (0, 0),
        "registry slots contract: needs a registry with no slot held"
    );
    let envs: Vec<EnvironmentId> = (0..5)
        .map(|i| EnvironmentId::new(format!("env_slot_{run}_{i}")))
        .collect();
    let mut fences = Vec::new();
    for env in &envs {
        let f = fence(&env.effect_key(), &format!("owner-s-{run}-{env}"));
        assert!(
            take(r, &f.key, &f.owner, now + 600, now).await.is_some(),
            "registry slots contract [slot-lock]: a fresh key's lock is free"
        );
        fences.push(f);
    }
    let acquire = |f: &Fence, at: u64, rule: &'static str| {
        let f = f.clone();
        async move {
            r.acquire_slot(&f, at, CAP)
                .await
                .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)))
        }
    };
    let rule = "slot-acquire";
    assert_eq!(
        acquire(&fences[0], now, rule).await,
        Slot::Acquired,
        "registry slots contract [{rule}]: a free slot is taken"
    );
    let rule = "slot-acquire-idempotent";
    assert_eq!(
        acquire(&fences[0], now, rule).await,
        Slot::Held,
        "registry slots contract [{rule}]: an environment holding a slot takes no second one"
    );
    let s = slots(rule).await;
    assert_eq!(
        s.in_use, 1,
        "registry slots contract [{rule}]: the counter counts the environment once"
    );
    assert_eq!(
        s.holders
            .iter()
            .map(|h| &h.environment_id)
            .collect::<Vec<_>>(),
        vec![&envs[0]],
        "registry slots contract [{rule}]: the holder names the environment"
    );
    assert_eq!(
        s.holders[0].acquired_at, now,
        "registry slots contract [{rule}]: the holder says when"
    );
    assert_eq!(
        acquire(&fences[1], now, "slot-acquire").await,
        Slot::Acquired
    );
    assert_eq!(
        acquire(&fences[2], now, "slot-acquire").await,
        Slot::Acquired
    );
    let rule = "slot-full";
    assert_eq!(
        acquire(&fences[3], now, rule).await,
        Slot::Full,
        "registry slots contract [{rule}]: at the cap no slot is taken"
    );
    let s = slots(rule).await;
    assert_eq!(
        (s.in_use, s.holders.len()),
        (3, 3),
        "registry slots contract [{rule}]: a full acquire changes nothing"
    );
    // Fencing: a stranger, and the owner after its lock expired, change nothing.
    let rule = "slot-fenced";
    let stranger = fence(&fences[3].key, "someone-else");
    assert_eq!(
        acquire(&stranger, now, rule).await,
        Slot::LockLost,
        "registry slots contract [{rule}]: no slot without the lock"
    );
    let released = |f: &Fence, at: u64, rule: &'static str| {
        let f = f.clone();
        async move {
            r.release_slot(&f, at)
                .await
                .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)))
        }
    };
    assert_eq!(
        released(&fence(&fences[0].key, "someone-else"), now, rule).await,
        SlotRelease::LockLost,
        "registry slots contract [{rule}]: no release without the lock"
    );
    assert_eq!(
        released(&fences[0], now + 601, rule).await,
        SlotRelease::LockLost,
        "registry slots contract [{rule}]: no release after the lock expired"
    );
    assert_eq!(
        slots(rule).await.in_use,
        3,
        "registry slots contract [{rule}]: refused calls change nothing"
    );
    // Release frees exactly one slot, once.
    let rule = "slot-release";
    assert_eq!(
        released(&fences[0], now, rule).await,
        SlotRelease::Released,
        "registry slots contract [{rule}]: a held slot is given back"
    );
    assert_eq!(
        released(&fences[0], now, rule).await,
        SlotRelease::NotHeld,
        "registry slots contract [{rule}]: a second release changes nothing"
    );
    assert_eq!(
        released(&fences[4], now, rule).await,
        SlotRelease::NotHeld,
        "registry slots contract [{rule}]: an environment without a slot releases nothing"
    );
    let s = slots(rule).await;
    assert_eq!(
        (s.in_use, s.holders.len()),
        (2, 2),
        "registry slots contract [{rule}]: counter and holders lowered together"
    );
    assert_eq!(
        acquire(&fences[3], now, rule).await,
        Slot::Acquired,
        "registry slots contract [{rule}]: a freed slot is taken by the next environment"
    );
    for f in &fences[1..4] {
        assert_eq!(
            released(f, now, "slot-cleanup").await,
            SlotRelease::Released
        );
    }
    assert_eq!(slots("slot-cleanup").await.in_use, 0);

    // Concurrent acquires: never more than the cap.
    let rule = "slot-concurrent";
    let mut tasks = Vec::new();
    for i in 0..24 {
        let r = r.clone();
        let env = EnvironmentId::new(format!("env_slotc_{run}_{i}"));
        let f = fence(&env.effect_key(), &format!("owner-c-{run}-{i}"));
        tasks.push(async move {
            let locked = r
                .lock(&f.key, &f.owner, now + 600, now)
                .await
                .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)));
            assert!(
                locked.is_some(),
                "registry slots contract [{rule}]: fresh lock"
            );
            let got = r
                .acquire_slot(&f, now, CAP)
                .await
                .unwrap_or_else(|e| panic!("{}", registry_fail(rule, e)));
            (f, got)
        });
    }
    let results = futures_join_all(tasks).await;
    let acquired: Vec<&Fence> = results
        .iter()
        .filter(|(_, s)| *s == Slot::Acquired)
        .map(|(f, _)| f)
        .collect();
    assert_eq!(
        acquired.len(),
        CAP as usize,
        "registry slots contract [{rule}]: exactly the cap's slots were taken by 24 concurrent environments: {:?}",
        results.iter().map(|(_, s)| *s).collect::<Vec<_>>()
    );
    assert!(
        results
            .iter()
            .all(|(_, s)| matches!(s, Slot::Acquired | Slot::Full)),
        "registry slots contract [{rule}]: the others were told the cap is reached"
    );
    let s = slots(rule).await;
    assert_eq!(
        (s.in_use, s.holders.len()),
        (u64::from(CAP), CAP as usize),
        "registry slots contract [{rule}]: the counter equals the holders"
    );
    for f in acquired {
        assert_eq!(
            released(f, now, "slot-cleanup").await,
            SlotRelease::Released
        );
    }
    assert_eq!(slots("slot-cleanup").await.in_use, 0);
}

/// Runs futures concurrently on the current task (no spawn, so any backend works).
async fn futures_join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pinned: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = (0..pinned.len()).map(|_| None).collect();
    std::future::poll_fn(move |cx| {
        let mut pending = false;
        for (i, f) in pinned.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(out.iter_mut().map(|o| o.take().expect("ready")).collect())
        }
    })
    .await
}

async fn claim<C: Compute>(
    c: &C,
    spec: &StartSpec,
    d: &DeploymentId,
    created_after: u64,
    rule: &str,
) -> Option<ComputeInstance> {
    match c
        .claim_pool_member(spec, d, created_after, NO_DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("pool contract [{rule}]: claim failed: {e}"))
    {
        None => None,
        Some(Started::Instance(i)) => Some(i),
        Some(Started::Failed { reason }) => {
            panic!("pool contract [{rule}]: a claimed member could not be assigned: {reason}")
        }
    }
}

async fn pool_member<C: Compute>(c: &C, d: &DeploymentId) -> PoolMember {
    c.start_pool_member(d, NO_DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("pool contract [start]: start_pool_member failed: {e}"))
}

/// The warm pool, for every adapter that has one ([`Compute::start_pool_member`],
/// [`Compute::list_pool`], [`Compute::claim_pool_member`]) in a deployment of its own (no
/// other member in `deployment`): an idle member is listed in the pool and in neither
/// `list` nor `find`; of two concurrent claims exactly one gets it, as an instance tagged
/// like a started one, found by `find` from then on; a claimed member is never claimable
/// again (a replay with the winner's token returns it, another claim misses); a member
/// older than the claim's bound is not claimed, and once recycled it is out of the pool
/// for good; a replay-only claim ([`crate::pool::REPLAY_ONLY`]) returns its token's claim
/// and takes no other member; a recycle never stops a claimed member. Everything it
/// started is stopped before it returns.
pub async fn compute_pool_contract<C: Compute>(c: &C, deployment: &DeploymentId) {
    let run = unique();
    let member = pool_member(c, deployment).await;
    let rule = "an idle member is in the pool only";
    let pool = c.list_pool(deployment).await.expect("list_pool");
    assert_eq!(
        pool.iter().map(|m| &m.instance_id).collect::<Vec<_>>(),
        vec![&member.instance_id],
        "pool contract [{rule}]"
    );
    assert!(
        !list(c, deployment, rule)
            .await
            .iter()
            .any(|i| i.instance_id == member.instance_id),
        "pool contract [{rule}]: an idle member names no environment, so list leaves it out"
    );

    let rule = "a member is claimed by exactly one of two concurrent claims";
    let a = contract_spec(&run, "pa");
    let b = contract_spec(&run, "pb");
    let got = futures_join_all(vec![
        Box::pin(claim(c, &a, deployment, 0, rule))
            as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>,
        Box::pin(claim(c, &b, deployment, 0, rule)),
    ])
    .await;
    let winners: Vec<(usize, &ComputeInstance)> = got
        .iter()
        .enumerate()
        .filter_map(|(n, g)| g.as_ref().map(|i| (n, i)))
        .collect();
    assert_eq!(winners.len(), 1, "pool contract [{rule}]: {got:?}");
    let (n, claimed) = winners[0];
    let (spec, loser) = if n == 0 { (&a, &b) } else { (&b, &a) };
    assert_eq!(
        claimed.instance_id, member.instance_id,
        "pool contract [{rule}]: the claim names the member"
    );
    assert_tags(claimed, spec, rule);
    let found = c
        .find(deployment, &spec.environment_id)
        .await
        .expect("find");
    assert_eq!(
        found.iter().map(|i| &i.instance_id).collect::<Vec<_>>(),
        vec![&member.instance_id],
        "pool contract [{rule}]: the claimed member is found as the environment's compute"
    );
    assert!(
        c.find(deployment, &loser.environment_id)
            .await
            .expect("find")
            .is_empty(),
        "pool contract [{rule}]: the losing claim assigned nothing"
    );

    let rule = "a claimed member is never claimable again";
    assert!(
        c.list_pool(deployment).await.expect("list_pool").is_empty(),
        "pool contract [{rule}]: a claimed member left the pool"
    );
    let replay = claim(c, spec, deployment, 0, rule).await;
    assert_eq!(
        replay.map(|i| i.instance_id),
        Some(member.instance_id.clone()),
        "pool contract [{rule}]: a replay with the winner's token returns its instance"
    );
    let third = contract_spec(&run, "pc");
    assert_eq!(
        claim(c, &third, deployment, 0, rule).await,
        None,
        "pool contract [{rule}]: nothing else to claim"
    );

    let rule = "a member past its maximum age is not claimed and is recycled";
    let old = pool_member(c, deployment).await;
    assert_eq!(
        claim(c, &third, deployment, old.created_at, rule).await,
        None,
        "pool contract [{rule}]: created at the bound, so too old"
    );

    let rule = "after an unclean predecessor a claim only replays its token";
    assert_eq!(
        claim(c, &third, deployment, crate::pool::REPLAY_ONLY, rule).await,
        None,
        "pool contract [{rule}]: an idle member is there, but a replay-only claim takes none"
    );
    assert_eq!(
        claim(c, spec, deployment, crate::pool::REPLAY_ONLY, rule)
            .await
            .map(|i| i.instance_id),
        Some(member.instance_id.clone()),
        "pool contract [{rule}]: the token's own claim is returned"
    );

    let rule = "a recycle never stops a claimed member";
    assert!(
        !c.recycle_pool_member(&member.instance_id, NO_DEADLINE)
            .await
            .expect("recycle_pool_member"),
        "pool contract [{rule}]: the claimed member is not recycled"
    );
    assert!(
        c.describe(&member.instance_id)
            .await
            .expect("describe")
            .is_some_and(|i| i.status.is_active()),
        "pool contract [{rule}]: the claimed member still runs"
    );

    let rule = "a member past its maximum age is not claimed and is recycled";
    assert!(
        c.recycle_pool_member(&old.instance_id, NO_DEADLINE)
            .await
            .expect("recycle_pool_member"),
        "pool contract [{rule}]: an idle member is recycled"
    );
    assert!(
        !c.recycle_pool_member(&old.instance_id, NO_DEADLINE)
            .await
            .expect("recycle_pool_member"),
        "pool contract [{rule}]: a recycled member is not recycled twice"
    );
    assert!(
        !c.list_pool(deployment)
            .await
            .expect("list_pool")
            .iter()
            .any(|m| m.instance_id == old.instance_id),
        "pool contract [{rule}]: a recycled member left the pool"
    );
    assert_eq!(
        claim(c, &third, deployment, 0, rule).await,
        None,
        "pool contract [{rule}]: a recycled member is never claimed"
    );
    stop_and_confirm(c, &member.instance_id).await;
}
