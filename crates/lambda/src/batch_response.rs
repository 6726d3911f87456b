//! The SQS partial batch response: which messages of a batch Lambda must leave on the queue.
//!
//! Serialized exactly as `{"batchItemFailures":[{"itemIdentifier":"<messageId>"}, ...]}`
//! (`aws_lambda_events::event::sqs::SqsBatchResponse`); an empty list means the whole
//! batch succeeded and Lambda deletes every message. The event source mapping must enable
//! `FunctionResponseTypes: [ReportBatchItemFailures]`, otherwise Lambda ignores this and
//! retries the whole batch on any error.
//!
//! Standard queues: exactly the messages that did not succeed are reported.
//!
//! FIFO queues: order within a message group must hold, so the worker stops at the first
//! message that does not succeed, and that message **and every later message of the
//! batch** are reported (the AWS guidance for FIFO partial batch responses), unless the
//! worker deferred them (their jobs sent again as new messages; worker_handler.rs): a
//! deferred message succeeded as far as its queue is concerned.
//!
//! A record without a `messageId` is reported with an empty identifier, which makes Lambda
//! treat the whole batch as failed: nothing is lost.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};

/// What became of one message of the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemOutcome {
    /// Processed: Lambda deletes it.
    Succeeded,
    /// Processing failed or must be retried: it stays on the queue.
    Failed,
    /// Not attempted (after a FIFO failure, or too close to the function's deadline) and
    /// left on its queue (made visible again at once): it stays on the queue.
    NotAttempted,
    /// Not attempted, its job sent again as a new message (worker_handler.rs `defer`):
    /// Lambda deletes it — also after a FIFO failure, since its job lives on elsewhere.
    Deferred,
}

/// Whether the batch comes from a FIFO queue: its records carry a `MessageGroupId`, or
/// the queue ARN ends in `.fifo`.
pub fn is_fifo_batch(event: &SqsEvent) -> bool {
    event.records.iter().any(is_fifo_record)
}

/// Whether one record comes from a FIFO queue (see [`is_fifo_batch`]).
pub fn is_fifo_record(record: &SqsMessage) -> bool {
    record.attributes.contains_key("MessageGroupId")
        || record
            .event_source_arn
            .as_deref()
            .is_some_and(|arn| arn.ends_with(".fifo"))
}

/// The partial batch response for `outcomes` (message id and outcome, in batch order).
///
/// Standard queues report every message that did not succeed; FIFO queues report the
/// first such message and every message after it, whatever their outcome, except a
/// [`ItemOutcome::Deferred`] one (its job was sent again as a new message).
pub fn partial_batch_response<'a, I>(outcomes: I, fifo: bool) -> SqsBatchResponse
where
    I: IntoIterator<Item = (&'a str, ItemOutcome)>,
{
    let mut response = SqsBatchResponse::default();
    let mut stopped = false;
    for (message_id, outcome) in outcomes {
        let failed = matches!(outcome, ItemOutcome::Failed | ItemOutcome::NotAttempted);
        if failed || (fifo && stopped && outcome != ItemOutcome::Deferred) {
            response.add_failure(message_id);
        }
        stopped |= fifo && failed;
    }
    response
}
