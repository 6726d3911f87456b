//! The queue port: the events (FIFO) and timers (standard, delayed) queues.

use super::PortError;
use crate::job::Job;
use std::future::Future;

/// A message to enqueue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The job (the body).
    pub job: Job,
    /// De-duplication id: the webhook-id for webhook jobs. A second send with the same id
    /// while the first is retained is accepted and dropped (SQS FIFO semantics).
    pub dedup_id: String,
    /// Ordering group: the session id. Messages of one group are delivered in order and
    /// one at a time (FIFO queues); standard queues ignore it.
    pub group: String,
    /// Delay before the message becomes visible, seconds (≤ 900; FIFO queues reject > 0).
    pub delay_secs: u32,
}

/// A received message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// Handle for `ack` / `retry_after` (SQS receipt handle; local row handle).
    pub receipt: String,
    /// Provider message id (SQS `MessageId`; the partial batch response's identifier).
    pub message_id: String,
    /// The job.
    pub job: Job,
    /// How many times this message has been received, this time included (≥ 1).
    pub receive_count: u32,
}

/// What happened to a send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// Stored for delivery.
    Queued,
    /// Dropped as a duplicate of a retained message with the same dedup id.
    Duplicate,
}

/// Messages per [`Queue::send_batch`] call at most (SQS `SendMessageBatch`: 10 entries).
pub const SEND_BATCH_MAX: usize = 10;

/// A durable queue with visibility timeouts, receive counts and a dead-letter queue.
pub trait Queue: Send + Sync + 'static {
    /// Stores a message. Returns only once the queue durably accepted it.
    fn send(&self, msg: Outgoing) -> impl Future<Output = Result<Sent, PortError>> + Send;
    /// Stores up to [`SEND_BATCH_MAX`] messages in one call where the queue has one (SQS
    /// `SendMessageBatch`), each with its own delay; one result per message, in order: a
    /// batch can succeed for some messages and fail for others (SQS answers HTTP 200 with
    /// `Failed` entries). The default sends them one by one with [`Queue::send`].
    fn send_batch(
        &self,
        msgs: Vec<Outgoing>,
    ) -> impl Future<Output = Vec<Result<Sent, PortError>>> + Send {
        async move {
            let mut out = Vec::with_capacity(msgs.len());
            for msg in msgs {
                out.push(self.send(msg).await);
            }
            out
        }
    }
    /// Receives up to `max` visible messages (waiting up to `wait_ms` milliseconds for
    /// one), hiding each for `visibility_secs` seconds. Messages received more than the
    /// queue's maximum receive count go to its dead-letter queue instead.
    fn receive(
        &self,
        max: usize,
        visibility_secs: u32,
        wait_ms: u64,
    ) -> impl Future<Output = Result<Vec<Received>, PortError>> + Send;
    /// Deletes a processed message.
    fn ack(&self, receipt: &str) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Makes a message visible again after `delay_secs` seconds (retry with backoff).
    fn retry_after(
        &self,
        receipt: &str,
        delay_secs: u32,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Messages in the dead-letter queue (for `sandboxctl status` and tests).
    fn dead_letter_count(&self) -> impl Future<Output = Result<u64, PortError>> + Send;
}
