//! [`SqliteQueue`]: a durable queue with SQS semantics on SQLite.
//!
//! Several queues live in one database file, told apart by name (tables `queue_meta`,
//! `queue_messages`, `queue_dedup`, `queue_dead_letters`). A queue is either:
//! - **FIFO** (SQS FIFO): per message group only the oldest message is deliverable, and not
//!   while it is in flight, so a group is processed in order and one message at a time;
//!   a send whose de-duplication id was seen within the retention window (default 300 s,
//!   as SQS) is dropped and reported [`Sent::Duplicate`]; `delay_secs > 0` is rejected;
//! - **standard**: any visible message is deliverable, oldest first (best effort);
//!   `delay_secs` (≤ 900) hides a new message; de-duplication ids are ignored.
//!
//! Both have visibility timeouts (≤ 43,200 s), receive counts and a dead-letter table: a
//! message already received `max_receive_count` times is moved there by the next receive
//! instead of being delivered (SQS redrive). A receipt is valid until the message is
//! received again; acking a stale receipt is a no-op.
//!
//! Every call runs on the blocking pool in one `BEGIN IMMEDIATE` transaction, so several
//! handles, threads or processes can share a queue without double delivery.

use crate::db::{Db, DbError, from_sql_int, now_ms, random_hex};
use rusqlite::{TransactionBehavior, params};
use sandbox_controller::job::Job;
use sandbox_controller::ports::{Outgoing, PortError, Queue, Received, Sent};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

const DEP: &str = "queue";

/// SQS limit on `DelaySeconds`, seconds.
pub const MAX_DELAY_SECS: u32 = 900;
/// SQS limit on a visibility timeout, seconds (12 hours).
pub const MAX_VISIBILITY_SECS: u32 = 43_200;
/// SQS limit on messages per receive.
pub const MAX_RECEIVE_BATCH: usize = 10;
/// SQS limit on a message body, bytes (256 KiB).
pub const MAX_BODY_BYTES: usize = 262_144;
/// SQS limit on a message group id and a de-duplication id, characters.
pub const MAX_ID_CHARS: usize = 128;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS queue_meta (
    queue TEXT PRIMARY KEY,
    fifo INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS queue_messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    group_id TEXT NOT NULL,
    dedup_id TEXT NOT NULL,
    body TEXT NOT NULL,
    sent_at_ms INTEGER NOT NULL,
    visible_at_ms INTEGER NOT NULL,
    receive_count INTEGER NOT NULL DEFAULT 0,
    receipt TEXT
);
CREATE INDEX IF NOT EXISTS queue_messages_visible ON queue_messages (queue, visible_at_ms, id);
CREATE INDEX IF NOT EXISTS queue_messages_group ON queue_messages (queue, group_id, id);
CREATE TABLE IF NOT EXISTS queue_dedup (
    queue TEXT NOT NULL,
    dedup_id TEXT NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (queue, dedup_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS queue_dead_letters (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    message_id TEXT NOT NULL,
    group_id TEXT NOT NULL,
    dedup_id TEXT NOT NULL,
    body TEXT NOT NULL,
    sent_at_ms INTEGER NOT NULL,
    receive_count INTEGER NOT NULL,
    dead_at_ms INTEGER NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS queue_dead_letters_queue ON queue_dead_letters (queue, id);
";

/// The options of one queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueOptions {
    /// FIFO (SQS FIFO semantics) or standard. Default: `true`.
    pub fifo: bool,
    /// A message received this many times is dead-lettered by the next receive (SQS
    /// `maxReceiveCount`; at least 1). Default: 5.
    pub max_receive_count: u32,
    /// How long a FIFO de-duplication id is retained after its send, seconds. Default: 300
    /// (SQS's 5-minute window).
    pub dedup_window_secs: u64,
    /// How often a waiting receive looks again for messages made visible by time or by
    /// another handle, milliseconds (sends through the same handle wake it at once).
    /// Default: 50.
    pub poll_interval_ms: u64,
}

impl Default for QueueOptions {
    fn default() -> Self {
        Self {
            fifo: true,
            max_receive_count: 5,
            dedup_window_secs: 300,
            poll_interval_ms: 50,
        }
    }
}

impl QueueOptions {
    /// A FIFO queue with the defaults (the events queue).
    pub fn fifo() -> Self {
        Self::default()
    }

    /// A standard queue with the defaults (the delayed lease-recheck queue).
    pub fn standard() -> Self {
        Self {
            fifo: false,
            ..Self::default()
        }
    }

    /// The same options with another `max_receive_count`.
    pub fn with_max_receive_count(mut self, n: u32) -> Self {
        self.max_receive_count = n;
        self
    }
}

/// Counts of one queue's messages right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Deliverable now (FIFO: including messages queued behind another of their group).
    pub visible: u64,
    /// Received and hidden by their visibility timeout (or a `retry_after`).
    pub in_flight: u64,
    /// Sent with `delay_secs` and not yet visible.
    pub delayed: u64,
    /// In the dead-letter table.
    pub dead_letters: u64,
}

/// A dead-lettered message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// The message id it had.
    pub message_id: String,
    /// Its group.
    pub group: String,
    /// Its de-duplication id.
    pub dedup_id: String,
    /// The job, or `None` if the stored body could not be decoded.
    pub job: Option<Job>,
    /// How many times it was received.
    pub receive_count: u32,
    /// When it was dead-lettered, Unix milliseconds.
    pub dead_at_ms: i64,
    /// Why (`max receive count exceeded`, `undecodable body`).
    pub reason: String,
}

/// A durable queue on SQLite with SQS FIFO or standard semantics. Cheap to clone (clones
/// share one connection).
#[derive(Clone, Debug)]
pub struct SqliteQueue {
    db: Db,
    name: Arc<str>,
    options: QueueOptions,
    notify: Arc<Notify>,
}

fn invalid(operation: &'static str, message: impl Into<String>) -> PortError {
    PortError::permanent(DEP, operation, message)
}

fn check_id(operation: &'static str, what: &str, id: &str) -> Result<(), PortError> {
    if id.is_empty() || id.chars().count() > MAX_ID_CHARS {
        return Err(invalid(
            operation,
            format!("{what} must be 1 to {MAX_ID_CHARS} characters"),
        ));
    }
    Ok(())
}

/// The message id of a row (`m<row id>`; row ids are never reused).
fn message_id(row_id: i64) -> String {
    format!("m{row_id}")
}

/// The row id inside a receipt (`<row id>.<receive count>.<random>`).
fn receipt_row(operation: &'static str, receipt: &str) -> Result<i64, PortError> {
    receipt
        .split('.')
        .next()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| invalid(operation, "malformed receipt handle"))
}

fn secs_to_ms(secs: u64) -> i64 {
    i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX)
}

impl SqliteQueue {
    /// Opens (creating if needed) queue `name` in the database file `path`. Blocks briefly
    /// (opening the file, creating tables).
    ///
    /// # Errors
    /// A permanent [`PortError`] when the file cannot be opened, the options are invalid
    /// (`max_receive_count` 0), or a queue of that name exists with the other mode (FIFO
    /// versus standard).
    pub fn open(
        path: impl AsRef<Path>,
        name: &str,
        options: QueueOptions,
    ) -> Result<Self, PortError> {
        if name.is_empty() {
            return Err(invalid("open", "queue name must not be empty"));
        }
        if options.max_receive_count == 0 {
            return Err(invalid("open", "max_receive_count must be at least 1"));
        }
        let db =
            Db::open(path.as_ref(), SCHEMA).map_err(|e| DbError::Sql(e).into_port(DEP, "open"))?;
        {
            let conn = db.lock();
            conn.execute(
                "INSERT INTO queue_meta (queue, fifo) VALUES (?1, ?2) ON CONFLICT (queue) DO NOTHING",
                params![name, options.fifo],
            )
            .map_err(|e| DbError::Sql(e).into_port(DEP, "open"))?;
            let fifo: bool = conn
                .query_row(
                    "SELECT fifo FROM queue_meta WHERE queue = ?1",
                    params![name],
                    |r| r.get(0),
                )
                .map_err(|e| DbError::Sql(e).into_port(DEP, "open"))?;
            if fifo != options.fifo {
                return Err(invalid(
                    "open",
                    format!(
                        "queue {name} exists as a {} queue",
                        if fifo { "FIFO" } else { "standard" }
                    ),
                ));
            }
        }
        Ok(Self {
            db,
            name: Arc::from(name),
            options,
            notify: Arc::new(Notify::new()),
        })
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The queue's options.
    pub fn options(&self) -> &QueueOptions {
        &self.options
    }

    /// Counts of the queue's messages now.
    ///
    /// # Errors
    /// A [`PortError`] when the database fails.
    pub async fn stats(&self) -> Result<QueueStats, PortError> {
        let name = Arc::clone(&self.name);
        self.db
            .call(DEP, "stats", move |conn| {
                let now = now_ms();
                let (visible, in_flight, delayed): (i64, i64, i64) = conn.query_row(
                    "SELECT
                        COALESCE(SUM(visible_at_ms <= ?2), 0),
                        COALESCE(SUM(visible_at_ms > ?2 AND receipt IS NOT NULL), 0),
                        COALESCE(SUM(visible_at_ms > ?2 AND receipt IS NULL), 0)
                     FROM queue_messages WHERE queue = ?1",
                    params![&*name, now],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )?;
                let dead: i64 = conn.query_row(
                    "SELECT COUNT(*) FROM queue_dead_letters WHERE queue = ?1",
                    params![&*name],
                    |r| r.get(0),
                )?;
                Ok(QueueStats {
                    visible: from_sql_int(visible),
                    in_flight: from_sql_int(in_flight),
                    delayed: from_sql_int(delayed),
                    dead_letters: from_sql_int(dead),
                })
            })
            .await
    }

    /// The dead-lettered messages, oldest first.
    ///
    /// # Errors
    /// A [`PortError`] when the database fails.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, PortError> {
        let name = Arc::clone(&self.name);
        self.db
            .call(DEP, "dead_letters", move |conn| {
                let mut stmt = conn.prepare(
                    "SELECT message_id, group_id, dedup_id, body, receive_count, dead_at_ms, reason
                     FROM queue_dead_letters WHERE queue = ?1 ORDER BY id",
                )?;
                let rows = stmt.query_map(params![&*name], |r| {
                    let body: String = r.get(3)?;
                    Ok(DeadLetter {
                        message_id: r.get(0)?,
                        group: r.get(1)?,
                        dedup_id: r.get(2)?,
                        job: serde_json::from_str(&body).ok(),
                        receive_count: r.get(4)?,
                        dead_at_ms: r.get(5)?,
                        reason: r.get(6)?,
                    })
                })?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await
    }

    /// Moves up to `max` dead-lettered messages back onto the queue, oldest first, as new
    /// messages visible at once with their job's hand-off count reset (`sandboxctl dlq
    /// redrive`; the same as the SQS adapter's redrive). A message whose body is not a job
    /// stays in the dead-letter table. One transaction: all of them move, or none.
    /// Returns how many moved.
    ///
    /// # Errors
    /// A [`PortError`] when the database fails.
    pub async fn redrive_dead_letters(&self, max: usize) -> Result<usize, PortError> {
        let name = Arc::clone(&self.name);
        let moved = self
            .db
            .call(DEP, "redrive_dead_letters", move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let rows: Vec<(i64, String, String, String)> = {
                    let mut stmt = tx.prepare(
                        "SELECT id, group_id, dedup_id, body FROM queue_dead_letters
                         WHERE queue = ?1 ORDER BY id",
                    )?;
                    stmt.query_map(params![&*name], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                    })?
                    .collect::<Result<_, _>>()?
                };
                let now = now_ms();
                let mut moved = 0;
                for (id, group, dedup, body) in rows {
                    if moved >= max {
                        break;
                    }
                    let Ok(mut job) = serde_json::from_str::<Job>(&body) else {
                        continue;
                    };
                    job.handoffs = 0;
                    let Ok(body) = serde_json::to_string(&job) else {
                        continue;
                    };
                    tx.execute(
                        "INSERT INTO queue_messages
                           (queue, group_id, dedup_id, body, sent_at_ms, visible_at_ms)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
                        params![&*name, group, format!("redrive:{dedup}"), body, now],
                    )?;
                    tx.execute("DELETE FROM queue_dead_letters WHERE id = ?1", params![id])?;
                    moved += 1;
                }
                tx.commit()?;
                Ok(moved)
            })
            .await?;
        if moved > 0 {
            self.notify.notify_waiters();
        }
        Ok(moved)
    }

    /// One receive attempt, no waiting.
    async fn try_receive(
        &self,
        max: usize,
        visibility_secs: u32,
    ) -> Result<Vec<Received>, PortError> {
        let name = Arc::clone(&self.name);
        let fifo = self.options.fifo;
        let max_receive_count = i64::from(self.options.max_receive_count);
        self.db
            .call(DEP, "receive", move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let now = now_ms();
                let hidden_until = now.saturating_add(secs_to_ms(u64::from(visibility_secs)));
                let mut out: Vec<Received> = Vec::new();
                loop {
                    let need = max - out.len();
                    if need == 0 {
                        break;
                    }
                    let sql = if fifo {
                        "SELECT id, body, receive_count FROM queue_messages m
                         WHERE queue = ?1 AND visible_at_ms <= ?2
                           AND id = (SELECT MIN(id) FROM queue_messages
                                     WHERE queue = ?1 AND group_id = m.group_id)
                         ORDER BY id LIMIT ?3"
                    } else {
                        "SELECT id, body, receive_count FROM queue_messages
                         WHERE queue = ?1 AND visible_at_ms <= ?2
                         ORDER BY visible_at_ms, id LIMIT ?3"
                    };
                    let candidates: Vec<(i64, String, i64)> = {
                        let mut stmt = tx.prepare_cached(sql)?;
                        let rows = stmt.query_map(
                            params![&*name, now, i64::try_from(need).unwrap_or(i64::MAX)],
                            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                        )?;
                        rows.collect::<Result<_, _>>()?
                    };
                    let mut dead_lettered = false;
                    for (id, body, count) in candidates {
                        if out.iter().any(|r| r.message_id == message_id(id)) {
                            continue; // visibility 0: delivered once per call at most
                        }
                        let job = serde_json::from_str::<Job>(&body);
                        let reason = if count >= max_receive_count {
                            Some("max receive count exceeded")
                        } else if job.is_err() {
                            Some("undecodable body")
                        } else {
                            None
                        };
                        if let Some(reason) = reason {
                            tx.execute(
                                "INSERT INTO queue_dead_letters
                                   (queue, message_id, group_id, dedup_id, body, sent_at_ms,
                                    receive_count, dead_at_ms, reason)
                                 SELECT queue, ?2, group_id, dedup_id, body, sent_at_ms,
                                        receive_count, ?3, ?4
                                 FROM queue_messages WHERE id = ?1",
                                params![id, message_id(id), now, reason],
                            )?;
                            tx.execute("DELETE FROM queue_messages WHERE id = ?1", params![id])?;
                            tracing::warn!(queue = %name, message_id = %message_id(id), receive_count = count, reason, "message dead-lettered");
                            dead_lettered = true;
                            continue;
                        }
                        let Ok(job) = job else { continue };
                        let receive_count = count + 1;
                        let receipt = format!("{id}.{receive_count}.{}", random_hex());
                        tx.execute(
                            "UPDATE queue_messages
                             SET receive_count = ?2, receipt = ?3, visible_at_ms = ?4
                             WHERE id = ?1",
                            params![id, receive_count, receipt, hidden_until],
                        )?;
                        out.push(Received {
                            receipt,
                            message_id: message_id(id),
                            job,
                            receive_count: u32::try_from(receive_count).unwrap_or(u32::MAX),
                        });
                    }
                    // A dead-lettered head may have unblocked its group (or freed a slot):
                    // look again; otherwise the selection is complete.
                    if !dead_lettered {
                        break;
                    }
                }
                tx.commit()?;
                Ok(out)
            })
            .await
    }
}

impl Queue for SqliteQueue {
    async fn send(&self, msg: Outgoing) -> Result<Sent, PortError> {
        let op = "send";
        if self.options.fifo {
            if msg.delay_secs > 0 {
                return Err(invalid(
                    op,
                    "FIFO queues do not support per-message delay_secs",
                ));
            }
            check_id(op, "message group id", &msg.group)?;
            check_id(op, "de-duplication id", &msg.dedup_id)?;
        } else if msg.delay_secs > MAX_DELAY_SECS {
            return Err(invalid(
                op,
                format!(
                    "delay_secs must be at most {MAX_DELAY_SECS}, got {}",
                    msg.delay_secs
                ),
            ));
        }
        let body = serde_json::to_string(&msg.job)
            .map_err(|e| invalid(op, format!("job could not be encoded: {e}")))?;
        if body.len() > MAX_BODY_BYTES {
            return Err(invalid(
                op,
                format!(
                    "message body is {} bytes, the limit is {MAX_BODY_BYTES}",
                    body.len()
                ),
            ));
        }
        let name = Arc::clone(&self.name);
        let fifo = self.options.fifo;
        let window_ms = secs_to_ms(self.options.dedup_window_secs);
        let sent = self
            .db
            .call(DEP, op, move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let now = now_ms();
                if fifo {
                    tx.execute(
                        "DELETE FROM queue_dedup WHERE queue = ?1 AND expires_at_ms <= ?2",
                        params![&*name, now],
                    )?;
                    let fresh = tx.execute(
                        "INSERT INTO queue_dedup (queue, dedup_id, expires_at_ms) VALUES (?1, ?2, ?3)
                         ON CONFLICT (queue, dedup_id) DO NOTHING",
                        params![&*name, msg.dedup_id, now.saturating_add(window_ms)],
                    )?;
                    if fresh == 0 {
                        tx.commit()?;
                        return Ok(Sent::Duplicate);
                    }
                }
                let visible_at = now.saturating_add(secs_to_ms(u64::from(msg.delay_secs)));
                tx.execute(
                    "INSERT INTO queue_messages
                       (queue, group_id, dedup_id, body, sent_at_ms, visible_at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![&*name, msg.group, msg.dedup_id, body, now, visible_at],
                )?;
                tx.commit()?;
                Ok(Sent::Queued)
            })
            .await?;
        if sent == Sent::Queued {
            self.notify.notify_waiters();
        }
        Ok(sent)
    }

    async fn receive(
        &self,
        max: usize,
        visibility_secs: u32,
        wait_ms: u64,
    ) -> Result<Vec<Received>, PortError> {
        if !(1..=MAX_RECEIVE_BATCH).contains(&max) {
            return Err(invalid(
                "receive",
                format!("max must be 1 to {MAX_RECEIVE_BATCH}, got {max}"),
            ));
        }
        if visibility_secs > MAX_VISIBILITY_SECS {
            return Err(invalid(
                "receive",
                format!("visibility_secs must be at most {MAX_VISIBILITY_SECS}"),
            ));
        }
        let deadline = Instant::now() + Duration::from_millis(wait_ms);
        let poll = Duration::from_millis(self.options.poll_interval_ms.max(1));
        loop {
            // Register interest before looking, so a send in between is not missed.
            let notified = self.notify.notified();
            let got = self.try_receive(max, visibility_secs).await?;
            let now = Instant::now();
            if !got.is_empty() || now >= deadline {
                return Ok(got);
            }
            let _ = tokio::time::timeout(poll.min(deadline - now), notified).await;
        }
    }

    async fn ack(&self, receipt: &str) -> Result<(), PortError> {
        let id = receipt_row("ack", receipt)?;
        let name = Arc::clone(&self.name);
        let receipt = receipt.to_owned();
        let deleted = self
            .db
            .call(DEP, "ack", move |conn| {
                Ok(conn.execute(
                    "DELETE FROM queue_messages WHERE id = ?1 AND queue = ?2 AND receipt = ?3",
                    params![id, &*name, receipt],
                )?)
            })
            .await?;
        if deleted == 0 {
            tracing::debug!(queue = %self.name, message_id = %message_id(id), "ack of a stale receipt ignored");
        }
        Ok(())
    }

    async fn retry_after(&self, receipt: &str, delay_secs: u32) -> Result<(), PortError> {
        let op = "retry_after";
        if delay_secs > MAX_VISIBILITY_SECS {
            return Err(invalid(
                op,
                format!("delay_secs must be at most {MAX_VISIBILITY_SECS}"),
            ));
        }
        let id = receipt_row(op, receipt)?;
        let name = Arc::clone(&self.name);
        let receipt = receipt.to_owned();
        let changed = self
            .db
            .call(DEP, op, move |conn| {
                let visible_at = now_ms().saturating_add(secs_to_ms(u64::from(delay_secs)));
                Ok(conn.execute(
                    "UPDATE queue_messages SET visible_at_ms = ?4
                     WHERE id = ?1 AND queue = ?2 AND receipt = ?3",
                    params![id, &*name, receipt, visible_at],
                )?)
            })
            .await?;
        if changed == 0 {
            return Err(invalid(
                op,
                format!(
                    "message {} is not in flight under this receipt (acked, or received again)",
                    message_id(id)
                ),
            ));
        }
        self.notify.notify_waiters();
        Ok(())
    }

    async fn dead_letter_count(&self) -> Result<u64, PortError> {
        let name = Arc::clone(&self.name);
        self.db
            .call(DEP, "dead_letter_count", move |conn| {
                let n: i64 = conn.query_row(
                    "SELECT COUNT(*) FROM queue_dead_letters WHERE queue = ?1",
                    params![&*name],
                    |r| r.get(0),
                )?;
                Ok(from_sql_int(n))
            })
            .await
    }
}
