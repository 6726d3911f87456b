//! [`SqsQueue`]: the controller's [`Queue`] port on Amazon SQS (FIFO or standard).
//!
//! - **send**: the body is the [`Job`] as JSON. FIFO queues get `MessageGroupId` = the
//!   message's group (the session id) and `MessageDeduplicationId` = its dedup id (the
//!   webhook id), both passed through [`sqs_fifo_id`] (SQS allows 1 to 128 characters of
//!   `[A-Za-z0-9]` and ASCII punctuation); `delay_secs > 0` is rejected before calling
//!   SQS, as SQS FIFO rejects per-message `DelaySeconds`. Standard queues get
//!   `DelaySeconds` = `delay_secs` (≤ [`MAX_DELAY_SECS`]) and no group or dedup id.
//! - **send_batch**: `SendMessageBatch` of up to 10 entries (Ids `0`..`9`, each with the
//!   attributes `send` gives one message; IAM: `sqs:SendMessage`). SQS answers HTTP 200
//!   with `Successful` and `Failed` entries: a failed entry with `SenderFault` is a
//!   permanent error for that message, any other failed entry is sent once more in a
//!   second batch, then reported transient. A message `send` would refuse (a delay on a
//!   FIFO queue, beyond 900 s) is refused alone; the others are still sent.
//! - **Duplicates**: SQS FIFO answers a de-duplicated send exactly like a stored one (a
//!   success with a message id), so this adapter always reports [`Sent::Queued`]; it never
//!   reports [`Sent::Duplicate`]. The ledger in the registry, not the send result, is what
//!   makes a re-delivered webhook harmless.
//! - **receive**: `ReceiveMessage` with `MaxNumberOfMessages` = `max` (≤ 10),
//!   `VisibilityTimeout` = `visibility_secs` (≤ 43,200), `WaitTimeSeconds` =
//!   `wait_ms` rounded up to whole seconds (≤ 20, the SQS long-poll maximum) and the
//!   system attribute `ApproximateReceiveCount`. A message whose body is not a [`Job`] is
//!   **skipped** (logged with its message id, never its body) and left hidden for the
//!   visibility timeout, so the queue's redrive policy moves it to the dead-letter queue
//!   after `maxReceiveCount` receives; the other messages of the batch are returned. On a
//!   FIFO queue it holds back the rest of its group until then (about `maxReceiveCount` ×
//!   the visibility timeout); a queue without a redrive policy keeps it until the
//!   retention period ends. It is never an error: one bad body must not stop the consumer.
//! - **Batches**: a FIFO receive may return several messages of one group (in order), as
//!   SQS does; the caller handles a batch in order.
//! - **ack** = `DeleteMessage`; **retry_after** = `ChangeMessageVisibility`;
//!   **dead_letter_count** = `ApproximateNumberOfMessages` +
//!   `ApproximateNumberOfMessagesNotVisible` of the configured dead-letter queue (0 when
//!   none is configured). SQS counts are approximate and may lag by about a minute on AWS.
//!
//! The dead-letter redrive itself (`maxReceiveCount`) is queue configuration (SAM/CDK),
//! not something this adapter does. Sources: the Amazon SQS API Reference (SendMessage,
//! ReceiveMessage, ChangeMessageVisibility, GetQueueAttributes) and the SQS Developer Guide
//! (quotas, FIFO de-duplication).

use crate::sdk_error::port_error;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    MessageSystemAttributeName, QueueAttributeName, SendMessageBatchRequestEntry,
};
use sandbox_controller::job::Job;
use sandbox_controller::ports::{Outgoing, PortError, Queue, Received, SEND_BATCH_MAX, Sent};
use sha2::{Digest, Sha256};
use std::sync::Arc;

const DEP: &str = "queue";

/// SQS limit on `DelaySeconds`, seconds.
pub const MAX_DELAY_SECS: u32 = 900;
/// SQS limit on a visibility timeout, seconds (12 hours).
pub const MAX_VISIBILITY_SECS: u32 = 43_200;
/// SQS limit on messages per receive.
pub const MAX_RECEIVE_BATCH: usize = 10;
/// SQS limit on a long poll (`WaitTimeSeconds`), seconds.
pub const MAX_WAIT_SECS: u64 = 20;
/// SQS limit on a `MessageGroupId` / `MessageDeduplicationId`, characters.
pub const MAX_FIFO_ID_CHARS: usize = 128;
/// How many characters of the original id a hashed FIFO id keeps as a readable prefix.
const HASHED_PREFIX_CHARS: usize = 56;

/// The options of one queue.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SqsQueueOptions {
    /// Whether the queue is a FIFO queue (its URL ends in `.fifo`).
    pub fifo: bool,
    /// The URL of the queue's dead-letter queue (the target of its redrive policy), for
    /// [`Queue::dead_letter_count`]. `None`: the count is always 0.
    pub dead_letter_queue_url: Option<String>,
}

/// A queue on SQS. Cheap to clone (the SDK client is reference-counted).
#[derive(Clone, Debug)]
pub struct SqsQueue {
    client: Client,
    queue_url: Arc<str>,
    options: Arc<SqsQueueOptions>,
}

/// Whether SQS accepts `c` in a FIFO group or de-duplication id: ASCII letters, digits
/// and punctuation (SQS API Reference, SendMessage `MessageDeduplicationId`).
fn fifo_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c.is_ascii_punctuation()
}

/// The FIFO `MessageGroupId` / `MessageDeduplicationId` SQS is sent for `raw`.
///
/// An id of 1 to 128 allowed characters (ASCII letters, digits, punctuation) is used
/// unchanged. Any other id (longer, empty, or with other characters) is replaced,
/// deterministically, by up to 56 of its allowed characters, `~`, and the 64 lowercase hex
/// digits of SHA-256 of the whole id: at most 121 characters, so the same id always maps to
/// the same SQS id and two different ids practically never collide.
pub fn sqs_fifo_id(raw: &str) -> String {
    let len = raw.chars().count();
    if (1..=MAX_FIFO_ID_CHARS).contains(&len) && raw.chars().all(fifo_id_char) {
        return raw.to_owned();
    }
    let digest = Sha256::digest(raw.as_bytes());
    let mut out: String = raw
        .chars()
        .filter(|c| fifo_id_char(*c))
        .take(HASHED_PREFIX_CHARS)
        .collect();
    out.push('~');
    for byte in digest {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

fn invalid(operation: &'static str, message: impl Into<String>) -> PortError {
    PortError::permanent(DEP, operation, message)
}

fn to_i32(operation: &'static str, what: &str, v: u64) -> Result<i32, PortError> {
    i32::try_from(v).map_err(|_| invalid(operation, format!("{what} {v} is out of range")))
}

impl SqsQueue {
    /// A queue handle on `queue_url` (as returned by `CreateQueue` / `GetQueueUrl`, or
    /// from the stack outputs). Makes no call.
    pub fn new(client: Client, queue_url: impl Into<String>, options: SqsQueueOptions) -> Self {
        let queue_url: String = queue_url.into();
        Self {
            client,
            queue_url: queue_url.into(),
            options: Arc::new(options),
        }
    }

    /// The queue URL.
    pub fn queue_url(&self) -> &str {
        &self.queue_url
    }

    /// The options.
    pub fn options(&self) -> &SqsQueueOptions {
        &self.options
    }

    fn decode(&self, m: &aws_sdk_sqs::types::Message) -> Option<Received> {
        let message_id = m.message_id().unwrap_or_default().to_owned();
        let Some(receipt) = m.receipt_handle().map(str::to_owned) else {
            tracing::warn!(queue = %self.queue_url, %message_id, "received a message without a receipt handle; skipped");
            return None;
        };
        let receive_count = m
            .attributes()
            .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(1)
            .max(1);
        match serde_json::from_str::<Job>(m.body().unwrap_or_default()) {
            Ok(job) => Some(Received {
                receipt,
                message_id,
                job,
                receive_count,
            }),
            Err(e) => {
                // Never log the body: it is untrusted input.
                tracing::warn!(
                    queue = %self.queue_url,
                    %message_id,
                    receive_count,
                    error = %e,
                    "undecodable message body; left hidden for the redrive policy to dead-letter"
                );
                None
            }
        }
    }
}

impl SqsQueue {
    /// The `SendMessageBatch` entry of `msg` with id `id`, or why `send` would refuse it.
    fn batch_entry(
        &self,
        id: usize,
        msg: &Outgoing,
    ) -> Result<SendMessageBatchRequestEntry, PortError> {
        let op = "send_batch";
        let body = serde_json::to_string(&msg.job)
            .map_err(|e| invalid(op, format!("job could not be encoded: {e}")))?;
        let mut entry = SendMessageBatchRequestEntry::builder()
            .id(id.to_string())
            .message_body(body);
        if self.options.fifo {
            if msg.delay_secs > 0 {
                return Err(invalid(
                    op,
                    format!(
                        "delay_secs {} on a FIFO queue: SQS FIFO queues reject per-message DelaySeconds",
                        msg.delay_secs
                    ),
                ));
            }
            entry = entry
                .message_group_id(sqs_fifo_id(&msg.group))
                .message_deduplication_id(sqs_fifo_id(&msg.dedup_id));
        } else {
            if msg.delay_secs > MAX_DELAY_SECS {
                return Err(invalid(
                    op,
                    format!(
                        "delay_secs {} exceeds the SQS maximum of {MAX_DELAY_SECS}",
                        msg.delay_secs
                    ),
                ));
            }
            entry = entry.delay_seconds(to_i32(op, "delay_secs", msg.delay_secs.into())?);
        }
        entry
            .build()
            .map_err(|e| invalid(op, format!("entry could not be built: {e}")))
    }
}

impl Queue for SqsQueue {
    async fn send_batch(&self, msgs: Vec<Outgoing>) -> Vec<Result<Sent, PortError>> {
        let op = "send_batch";
        if msgs.len() > SEND_BATCH_MAX {
            let e = invalid(
                op,
                format!(
                    "{} messages in one batch: SQS allows at most {SEND_BATCH_MAX}",
                    msgs.len()
                ),
            );
            return msgs.iter().map(|_| Err(e.clone())).collect();
        }
        let mut results: Vec<Option<Result<Sent, PortError>>> =
            (0..msgs.len()).map(|_| None).collect();
        let mut pending: Vec<(usize, SendMessageBatchRequestEntry)> = Vec::new();
        for (i, msg) in msgs.iter().enumerate() {
            match self.batch_entry(i, msg) {
                Ok(entry) => pending.push((i, entry)),
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        // A failed entry that is not the sender's fault is sent once more.
        for attempt in 0..2 {
            if pending.is_empty() {
                break;
            }
            let entries: Vec<SendMessageBatchRequestEntry> =
                pending.iter().map(|(_, e)| e.clone()).collect();
            let out = self
                .client
                .send_message_batch()
                .queue_url(self.queue_url.as_ref())
                .set_entries(Some(entries))
                .send()
                .await;
            let out = match out {
                Ok(out) => out,
                Err(e) => {
                    let e = port_error(DEP, op, &e);
                    for (i, _) in &pending {
                        results[*i] = Some(Err(e.clone()));
                    }
                    break;
                }
            };
            for ok in out.successful() {
                if let Ok(i) = ok.id().parse::<usize>()
                    && i < results.len()
                {
                    results[i] = Some(Ok(Sent::Queued));
                }
            }
            let mut again = Vec::new();
            for failed in out.failed() {
                let Ok(i) = failed.id().parse::<usize>() else {
                    continue;
                };
                let text = format!(
                    "entry failed: {} ({})",
                    failed.code(),
                    failed.message().unwrap_or_default()
                );
                if failed.sender_fault() {
                    results[i] = Some(Err(invalid(op, text)));
                } else if attempt == 0
                    && let Some(entry) = pending.iter().find(|(k, _)| *k == i)
                {
                    again.push(entry.clone());
                } else {
                    results[i] = Some(Err(PortError::transient(DEP, op, text)));
                }
            }
            pending = again;
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(PortError::transient(
                        DEP,
                        op,
                        "SendMessageBatch answered neither success nor failure for the entry",
                    ))
                })
            })
            .collect()
    }

    async fn send(&self, msg: Outgoing) -> Result<Sent, PortError> {
        let body = serde_json::to_string(&msg.job)
            .map_err(|e| invalid("send", format!("job could not be encoded: {e}")))?;
        let mut req = self
            .client
            .send_message()
            .queue_url(self.queue_url.as_ref())
            .message_body(body);
        if self.options.fifo {
            if msg.delay_secs > 0 {
                return Err(invalid(
                    "send",
                    format!(
                        "delay_secs {} on a FIFO queue: SQS FIFO queues reject per-message DelaySeconds",
                        msg.delay_secs
                    ),
                ));
            }
            req = req
                .message_group_id(sqs_fifo_id(&msg.group))
                .message_deduplication_id(sqs_fifo_id(&msg.dedup_id));
        } else {
            if msg.delay_secs > MAX_DELAY_SECS {
                return Err(invalid(
                    "send",
                    format!(
                        "delay_secs {} exceeds the SQS maximum of {MAX_DELAY_SECS}",
                        msg.delay_secs
                    ),
                ));
            }
            req = req.delay_seconds(to_i32("send", "delay_secs", msg.delay_secs.into())?);
        }
        req.send().await.map_err(|e| port_error(DEP, "send", &e))?;
        Ok(Sent::Queued)
    }

    async fn receive(
        &self,
        max: usize,
        visibility_secs: u32,
        wait_ms: u64,
    ) -> Result<Vec<Received>, PortError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        if visibility_secs > MAX_VISIBILITY_SECS {
            return Err(invalid(
                "receive",
                format!(
                    "visibility {visibility_secs} s exceeds the SQS maximum of {MAX_VISIBILITY_SECS} s"
                ),
            ));
        }
        let wait_secs = wait_ms.div_ceil(1000).min(MAX_WAIT_SECS);
        let out = self
            .client
            .receive_message()
            .queue_url(self.queue_url.as_ref())
            .max_number_of_messages(to_i32("receive", "max", max.min(MAX_RECEIVE_BATCH) as u64)?)
            .visibility_timeout(to_i32("receive", "visibility", visibility_secs.into())?)
            .wait_time_seconds(to_i32("receive", "wait", wait_secs)?)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .send()
            .await
            .map_err(|e| port_error(DEP, "receive", &e))?;
        Ok(out
            .messages()
            .iter()
            .filter_map(|m| self.decode(m))
            .collect())
    }

    async fn ack(&self, receipt: &str) -> Result<(), PortError> {
        self.client
            .delete_message()
            .queue_url(self.queue_url.as_ref())
            .receipt_handle(receipt)
            .send()
            .await
            .map_err(|e| port_error(DEP, "ack", &e))?;
        Ok(())
    }

    async fn retry_after(&self, receipt: &str, delay_secs: u32) -> Result<(), PortError> {
        if delay_secs > MAX_VISIBILITY_SECS {
            return Err(invalid(
                "retry_after",
                format!(
                    "delay {delay_secs} s exceeds the SQS visibility maximum of {MAX_VISIBILITY_SECS} s"
                ),
            ));
        }
        self.client
            .change_message_visibility()
            .queue_url(self.queue_url.as_ref())
            .receipt_handle(receipt)
            .visibility_timeout(to_i32("retry_after", "delay", delay_secs.into())?)
            .send()
            .await
            .map_err(|e| port_error(DEP, "retry_after", &e))?;
        Ok(())
    }

    async fn dead_letter_count(&self) -> Result<u64, PortError> {
        let Some(dlq) = self.options.dead_letter_queue_url.as_deref() else {
            return Ok(0);
        };
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(dlq)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .map_err(|e| port_error(DEP, "dead_letter_count", &e))?;
        let attrs = out.attributes();
        let read = |name: QueueAttributeName| -> Result<u64, PortError> {
            match attrs.and_then(|a| a.get(&name)) {
                None => Ok(0),
                Some(v) => v.parse::<u64>().map_err(|_| {
                    PortError::transient(
                        DEP,
                        "dead_letter_count",
                        format!("{name} is not a count: {v:?}"),
                    )
                }),
            }
        };
        Ok(read(QueueAttributeName::ApproximateNumberOfMessages)?
            + read(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_valid_ids_pass_unchanged() {
        assert_eq!(sqs_fifo_id("msg_2abc"), "msg_2abc");
        let max = "a".repeat(MAX_FIFO_ID_CHARS);
        assert_eq!(sqs_fifo_id(&max), max);
    }

    #[test]
    fn long_empty_or_odd_ids_are_hashed_deterministically_within_limits() {
        let long = "w".repeat(300);
        let a = sqs_fifo_id(&long);
        assert_eq!(a, sqs_fifo_id(&long));
        assert!(a.chars().count() <= MAX_FIFO_ID_CHARS, "{a}");
        assert!(a.chars().all(fifo_id_char), "{a}");
        assert!(a.starts_with(&"w".repeat(HASHED_PREFIX_CHARS)));
        let mut other = long.clone();
        other.push('x');
        assert_ne!(a, sqs_fifo_id(&other));
        for odd in ["", "has space", "é", &"ü".repeat(200)] {
            let id = sqs_fifo_id(odd);
            assert!(
                (1..=MAX_FIFO_ID_CHARS).contains(&id.chars().count())
                    && id.chars().all(fifo_id_char),
                "{odd:?} -> {id:?}"
            );
        }
        assert_ne!(sqs_fifo_id("has space"), sqs_fifo_id("hasspace"));
    }
}
