//! The dead-letter queues of the events and timers queues, for the operator
//! (`sandboxctl dlq list` and `dlq redrive`).
//!
//! - **Which queue**: [`dead_letter_queue_url`] reads the source queue's `RedrivePolicy`
//!   attribute (`GetQueueAttributes`; its `deadLetterTargetArn`) and resolves the ARN to a
//!   URL with `GetQueueUrl` (queue name and owner account from the ARN), so nothing but the
//!   source queue's URL needs configuring.
//! - **List** ([`peek_dead_letters`]): `ReceiveMessage` (≤ 10 per call) with a short
//!   visibility timeout, every page until a receive returns nothing new, then
//!   `ChangeMessageVisibility` to 0 on each received message so it is visible again at
//!   once ("a visibility timeout of 0 makes the message immediately visible", SQS API
//!   Reference, ChangeMessageVisibility). SQS has no read-only listing: a peek counts as a
//!   receive (`ApproximateReceiveCount` grows; a dead-letter queue has no redrive policy of
//!   its own, so this moves nothing), and a message already hidden by another consumer is
//!   not seen.
//! - **Redrive** ([`redrive_dead_letters`]): per message, `ReceiveMessage` from the DLQ,
//!   `SendMessage` of the job to the source queue with its hand-off count reset, then
//!   `DeleteMessage` from the DLQ. At least once: a crash between the send and the delete
//!   leaves a copy in the DLQ (redriving it again sends a duplicate job, which is harmless:
//!   a job is a hint, and on a FIFO queue the de-duplication id `redrive:{message id}`
//!   drops a repeat within five minutes). SQS's own `StartMessageMoveTask` moves messages
//!   unchanged, so a job dead-lettered past the hand-off cap would come back with its count
//!   and be dead-lettered again at once; it is also not implemented by moto, on which this
//!   is tested. A body that is not a job is left in the DLQ and reported.
//!
//! Sources: Amazon SQS API Reference (GetQueueAttributes `RedrivePolicy`, GetQueueUrl,
//! ReceiveMessage, ChangeMessageVisibility, SendMessage, DeleteMessage), SQS Developer
//! Guide ("Using dead-letter queues").

use crate::sdk_error::port_error;
use crate::sqs_queue::sqs_fifo_id;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use sandbox_controller::job::Job;
use sandbox_controller::ports::PortError;
use std::collections::HashSet;

const DEP: &str = "queue";

/// Seconds a peeked message stays hidden before it is made visible again explicitly.
const PEEK_VISIBILITY_SECS: i32 = 30;
/// Seconds a message being redriven stays hidden (room for the send and the delete).
const REDRIVE_VISIBILITY_SECS: i32 = 60;

/// One dead-lettered message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetterMessage {
    /// SQS `MessageId`.
    pub message_id: String,
    /// The job, when the body decodes as one.
    pub job: Option<Job>,
    /// `ApproximateReceiveCount` (this peek included).
    pub receive_count: u32,
    /// `SentTimestamp` (when the message reached the dead-letter queue: SQS keeps the
    /// original enqueue time only for standard queues), Unix seconds.
    pub sent_at: Option<u64>,
}

/// What a redrive did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedriveReport {
    /// Messages sent back to the source queue and deleted from the DLQ.
    pub moved: usize,
    /// Message ids left in the DLQ because their body is not a job.
    pub skipped: Vec<String>,
}

/// The URL of the dead-letter queue in `queue_url`'s redrive policy, `None` without one.
///
/// # Errors
/// A [`PortError`] when a call fails or the policy names no usable ARN.
pub async fn dead_letter_queue_url(
    client: &Client,
    queue_url: &str,
) -> Result<Option<String>, PortError> {
    let op = "dead_letter_queue_url";
    let out = client
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(QueueAttributeName::RedrivePolicy)
        .send()
        .await
        .map_err(|e| port_error(DEP, op, &e))?;
    let Some(policy) = out
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::RedrivePolicy))
    else {
        return Ok(None);
    };
    let policy: serde_json::Value = serde_json::from_str(policy)
        .map_err(|e| PortError::permanent(DEP, op, format!("RedrivePolicy is not JSON: {e}")))?;
    let arn = policy["deadLetterTargetArn"]
        .as_str()
        .ok_or_else(|| PortError::permanent(DEP, op, "RedrivePolicy has no deadLetterTargetArn"))?;
    // arn:aws:sqs:REGION:ACCOUNT:NAME
    let parts: Vec<&str> = arn.split(':').collect();
    let [_, _, "sqs", _, account, name] = parts.as_slice() else {
        return Err(PortError::permanent(
            DEP,
            op,
            format!("deadLetterTargetArn is not an SQS queue ARN: {arn}"),
        ));
    };
    let url = client
        .get_queue_url()
        .queue_name(*name)
        .queue_owner_aws_account_id(*account)
        .send()
        .await
        .map_err(|e| port_error(DEP, op, &e))?;
    Ok(url.queue_url().map(str::to_owned))
}

fn decode(message: &aws_sdk_sqs::types::Message) -> DeadLetterMessage {
    let attr = |name: MessageSystemAttributeName| {
        message
            .attributes()
            .and_then(|a| a.get(&name))
            .and_then(|v| v.parse::<u64>().ok())
    };
    DeadLetterMessage {
        message_id: message.message_id().unwrap_or_default().to_owned(),
        job: message.body().and_then(|b| serde_json::from_str(b).ok()),
        receive_count: attr(MessageSystemAttributeName::ApproximateReceiveCount)
            .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        sent_at: attr(MessageSystemAttributeName::SentTimestamp).map(|ms| ms / 1000),
    }
}

async fn receive(
    client: &Client,
    dlq_url: &str,
    max: usize,
    visibility: i32,
    op: &'static str,
) -> Result<Vec<aws_sdk_sqs::types::Message>, PortError> {
    let out = client
        .receive_message()
        .queue_url(dlq_url)
        .max_number_of_messages(max.clamp(1, 10) as i32)
        .visibility_timeout(visibility)
        .wait_time_seconds(0)
        .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
        .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
        .send()
        .await
        .map_err(|e| port_error(DEP, op, &e))?;
    Ok(out.messages.unwrap_or_default())
}

/// Up to `max` messages of the dead-letter queue at `dlq_url`, each made visible again
/// after the peek (see the module docs).
///
/// # Errors
/// A [`PortError`] when a receive fails (a failed visibility reset is not an error: the
/// message reappears after 30 s on its own).
pub async fn peek_dead_letters(
    client: &Client,
    dlq_url: &str,
    max: usize,
) -> Result<Vec<DeadLetterMessage>, PortError> {
    let op = "peek_dead_letters";
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut handles = Vec::new();
    while out.len() < max {
        let batch = receive(client, dlq_url, max - out.len(), PEEK_VISIBILITY_SECS, op).await?;
        let mut new = 0;
        for m in &batch {
            if let Some(h) = m.receipt_handle() {
                handles.push(h.to_owned());
            }
            if seen.insert(m.message_id().unwrap_or_default().to_owned()) {
                out.push(decode(m));
                new += 1;
            }
        }
        if new == 0 {
            break;
        }
    }
    for handle in handles {
        if let Err(e) = client
            .change_message_visibility()
            .queue_url(dlq_url)
            .receipt_handle(handle)
            .visibility_timeout(0)
            .send()
            .await
        {
            tracing::warn!(error = %port_error(DEP, op, &e), "peeked message stays hidden for its visibility timeout");
        }
    }
    Ok(out)
}

/// Moves up to `max` jobs from the dead-letter queue at `dlq_url` back to `target_url`
/// (`target_fifo`: a FIFO queue, so each send carries the job's group and the
/// de-duplication id `redrive:{message id}`), each with its hand-off count reset.
///
/// # Errors
/// A [`PortError`] when a receive, send or delete fails; what was moved before stays
/// moved (the report of a failed call is lost, the effect is not).
pub async fn redrive_dead_letters(
    client: &Client,
    dlq_url: &str,
    target_url: &str,
    target_fifo: bool,
    max: usize,
) -> Result<RedriveReport, PortError> {
    let op = "redrive_dead_letters";
    let mut report = RedriveReport::default();
    let mut skipped = HashSet::new();
    while report.moved < max {
        let batch = receive(
            client,
            dlq_url,
            max - report.moved,
            REDRIVE_VISIBILITY_SECS,
            op,
        )
        .await?;
        if batch.is_empty()
            || batch
                .iter()
                .all(|m| skipped.contains(m.message_id().unwrap_or_default()))
        {
            break;
        }
        for m in batch {
            let id = m.message_id().unwrap_or_default().to_owned();
            let Some(mut job) = m.body().and_then(|b| serde_json::from_str::<Job>(b).ok()) else {
                if skipped.insert(id.clone()) {
                    report.skipped.push(id);
                }
                continue;
            };
            job.handoffs = 0;
            let body = serde_json::to_string(&job).map_err(|e| {
                PortError::permanent(DEP, op, format!("job could not be encoded: {e}"))
            })?;
            let mut send = client
                .send_message()
                .queue_url(target_url)
                .message_body(body);
            if target_fifo {
                send = send
                    .message_group_id(sqs_fifo_id(job.group()))
                    .message_deduplication_id(sqs_fifo_id(&format!("redrive:{id}")));
            }
            send.send().await.map_err(|e| port_error(DEP, op, &e))?;
            if let Some(handle) = m.receipt_handle() {
                client
                    .delete_message()
                    .queue_url(dlq_url)
                    .receipt_handle(handle)
                    .send()
                    .await
                    .map_err(|e| port_error(DEP, op, &e))?;
            }
            report.moved += 1;
        }
    }
    Ok(report)
}
