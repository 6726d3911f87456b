//! Consuming a queue in-process (local mode): receive, process, then ack or retry.
//! The Lambda worker does the same per SQS batch, reporting failures instead.

use crate::ports::{Compute, PortError, Queue, Received, Registry};
use crate::worker::{Controller, Disposition, Processed};
use sandbox_agents_api::SessionsApi;

/// Retry delay for a job whose processing failed with a port error, seconds:
/// 2^(receive_count) capped at 300 (observable backoff; the queue's maximum receive count
/// moves a job that keeps failing to the dead-letter queue).
pub fn failure_backoff_secs(receive_count: u32) -> u32 {
    2u32.saturating_pow(receive_count.min(16)).min(300)
}

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// Processes one received message from `queue` and acks it or makes it visible again.
    /// Returns the processing result (`Err` when a port failed; the message is retried).
    pub async fn handle(&self, queue: &Q, msg: &Received) -> Result<Processed, PortError> {
        let result = self.process(&msg.job).await;
        crate::crash_point::crash_point("before-ack");
        let settle = match &result {
            Ok(p) => match p.disposition {
                Disposition::Done => queue.ack(&msg.receipt).await,
                Disposition::RetryAfter(secs) => queue.retry_after(&msg.receipt, secs).await,
            },
            Err(e) => {
                tracing::warn!(message_id = %msg.message_id, error = %e, "job failed; will retry");
                queue
                    .retry_after(&msg.receipt, failure_backoff_secs(msg.receive_count))
                    .await
            }
        };
        if let Err(e) = settle {
            // The visibility timeout returns the message on its own.
            tracing::warn!(message_id = %msg.message_id, error = %e, "ack/retry failed");
        }
        result
    }

    /// Receives up to `max` messages from `queue` (waiting up to `wait_ms`) and handles
    /// them one by one. Returns how many were received.
    ///
    /// # Errors
    /// The queue's receive error.
    pub async fn consume_once(
        &self,
        queue: &Q,
        max: usize,
        wait_ms: u64,
    ) -> Result<usize, PortError> {
        let batch = queue
            .receive(max, self.config.visibility_secs, wait_ms)
            .await?;
        for msg in &batch {
            let _ = self.handle(queue, msg).await;
        }
        Ok(batch.len())
    }
}
