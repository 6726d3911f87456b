//! Consuming a queue in-process (local mode): receive, process, then ack or retry.
//! The Lambda worker does the same per SQS batch, reporting failures instead.
//!
//! A job from the **events** queue that is not processed now ([`Disposition::RetryAfter`]:
//! busy lock, missing evidence, a failed effect) is **handed off** to the timers queue
//! with that delay and acked ([`Controller::hand_off`]). Retrying it through the FIFO
//! events queue would count toward the queue's `maxReceiveCount`, so a job contended for
//! longer than that would be dead-lettered without ever having failed (seen on moto: 1 of
//! 200 environments under 32 workers). A job is a hint — the worker decides from the
//! session's current state whenever it runs — so leaving the group's order is harmless.
//! When the hand-off fails, the job is retried on its own queue as before.

use crate::job::Job;
use crate::ports::{Compute, Outgoing, PortError, Queue, Received, Registry};
use crate::worker::{Controller, Disposition, Processed};
use sandbox_agents_api::SessionsApi;

/// Retry delay for a job whose processing failed with a port error, seconds:
/// 2^(receive_count) capped at 300 (observable backoff; the queue's maximum receive count
/// moves a job that keeps failing to the dead-letter queue).
pub fn failure_backoff_secs(receive_count: u32) -> u32 {
    2u32.saturating_pow(receive_count.min(16)).min(300)
}

/// Largest delay of a standard queue's message (SQS `DelaySeconds`), seconds.
pub const MAX_DELAY_SECS: u32 = 900;

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// Processes one received message from `queue` (this controller's `events` or
    /// `timers` queue, told apart by address) and acks it, hands it off to the timers
    /// queue (an events job to retry later; see the module docs) or makes it visible
    /// again. Returns the processing result (`Err` when a port failed; the message is
    /// retried after [`failure_backoff_secs`]).
    pub async fn handle(&self, queue: &Q, msg: &Received) -> Result<Processed, PortError> {
        let result = self.process(&msg.job).await;
        crate::crash_point::crash_point("before-ack");
        let from_events = std::ptr::eq(queue, &self.events);
        let settle = match &result {
            Ok(p) => match p.disposition {
                Disposition::Done => queue.ack(&msg.receipt).await,
                Disposition::RetryAfter(secs) if from_events => {
                    match self
                        .hand_off(&msg.job, &msg.message_id, msg.receive_count, secs)
                        .await
                    {
                        Ok(()) => queue.ack(&msg.receipt).await,
                        Err(e) => {
                            tracing::warn!(message_id = %msg.message_id, error = %e, "hand-off failed; retrying on the events queue");
                            queue.retry_after(&msg.receipt, secs).await
                        }
                    }
                }
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

    /// Sends `job` (an events-queue job not processed now) to the timers queue, visible
    /// after `delay_secs` (capped at [`MAX_DELAY_SECS`]). The de-duplication id names the
    /// events message and its receive count (`handoff:{message_id}:{receive_count}`).
    ///
    /// # Errors
    /// The timers queue's send error; the caller then retries the message on its own
    /// queue.
    pub async fn hand_off(
        &self,
        job: &Job,
        message_id: &str,
        receive_count: u32,
        delay_secs: u32,
    ) -> Result<(), PortError> {
        self.timers
            .send(Outgoing {
                job: job.clone(),
                dedup_id: format!("handoff:{message_id}:{receive_count}"),
                group: job.group().to_owned(),
                delay_secs: delay_secs.min(MAX_DELAY_SECS),
            })
            .await
            .map(|_| ())
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
