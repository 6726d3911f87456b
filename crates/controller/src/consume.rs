//! Consuming a queue in-process (local mode): receive, process, then ack or retry.
//! The Lambda worker does the same per SQS batch, reporting failures instead.
//!
//! A job that is not processed now ([`Disposition::RetryAfter`]: a busy lock, missing
//! evidence, a failed effect) is **handed off**: sent again to the timers queue as a new
//! message with that delay, then acked ([`Controller::hand_off`]). Retrying it through
//! its own message would count toward the queue's `maxReceiveCount`, so a job that waits
//! for a lock longer than five retries would be dead-lettered without ever having failed:
//! seen on moto (1 of 200 environments under 32 workers, events queue) and in the
//! deterministic simulation (seed 8361829824754750494: a lock left by a crashed worker
//! lives 120 s, five 2 s retries of a timers message dead-lettered the only connection
//! request of a session). Receive counts now grow only on real failures and crashes. A job
//! is a hint — the worker decides from the session's current state whenever it runs — so
//! leaving the FIFO group's order is harmless; every hand-off is delayed, so there is no
//! tight loop. When the hand-off send fails, the message is retried on its own queue.
//!
//! **Hand-offs are capped** ([`MAX_HANDOFFS`]): a job handed off that many times (about
//! 76 minutes of waiting from the 15 s evidence retry, 32 minutes from the 2 s busy-lock
//! retry, the delays doubling up to 900 s) is *stuck*. It is no longer handed off: it is
//! logged at error level with its environment, counted in the `stuck_jobs` metric, and
//! retried through its own message, so its receive count grows and the queue's redrive
//! policy moves it to the dead-letter queue after `maxReceiveCount` receives, where the
//! dead-letter alarm fires and `sandboxctl dlq list` shows it (`dlq redrive` sends it
//! back with its hand-off count reset). Nothing is lost meanwhile: the sweeper re-derives
//! every environment on its own schedule.

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

/// What [`Controller::settle`] left for the caller to do with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Delete it: done, or its job was handed off to the timers queue.
    Delete,
    /// Keep it: it becomes visible again after its retry delay.
    Kept,
}

/// Hand-offs of one job before it counts as stuck (see the module docs).
pub const MAX_HANDOFFS: u32 = 10;

/// Largest delay of a standard queue's message (SQS `DelaySeconds`), seconds.
pub const MAX_DELAY_SECS: u32 = 900;

/// Delay of a job's next hand-off, seconds: `delay_secs` (what the worker asked for, ≥ 1)
/// doubled once per earlier hand-off (`handoffs`), at most [`MAX_DELAY_SECS`].
pub fn handoff_delay_secs(delay_secs: u32, handoffs: u32) -> u32 {
    delay_secs
        .max(1)
        .saturating_mul(2u32.saturating_pow(handoffs.min(16)))
        .min(MAX_DELAY_SECS)
}

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// Processes one received message from `queue` and acks it, hands its job off to the
    /// timers queue (a job to retry later; see the module docs) or makes it visible
    /// again. Returns the processing result (`Err` when a port failed; the message is
    /// retried after [`failure_backoff_secs`]).
    pub async fn handle(&self, queue: &Q, msg: &Received) -> Result<Processed, PortError> {
        let result = self.process(&msg.job).await;
        crate::crash_point::crash_point("before-ack");
        tracing::debug!(
            message_id = %msg.message_id,
            session_id = %msg.job.session_id,
            receive_count = msg.receive_count,
            result = ?result.as_ref().map(|p| (p.disposition, p.note)),
            "settling"
        );
        let settled = match self
            .settle(
                queue,
                &msg.job,
                &msg.message_id,
                msg.receive_count,
                Some(&msg.receipt),
                &result,
            )
            .await
        {
            Settled::Delete => queue.ack(&msg.receipt).await,
            Settled::Kept => Ok(()),
        };
        if let Err(e) = settled {
            // The visibility timeout returns the message on its own.
            tracing::warn!(message_id = %msg.message_id, error = %e, "ack failed");
        }
        result
    }

    /// What becomes of a received message once its job was processed (`result`), shared by
    /// the queue loop above and the Lambda worker:
    /// - done → [`Settled::Delete`];
    /// - [`Disposition::RetryAfter`] → the job is handed off ([`Controller::hand_off`]) →
    ///   [`Settled::Delete`]; when the hand-off fails, or the job was handed off
    ///   [`MAX_HANDOFFS`] times already (stuck: toward the dead-letter queue), the message
    ///   itself is made visible again after the delay → [`Settled::Kept`];
    /// - a port error → visible again after [`failure_backoff_secs`]`(receive_count)` →
    ///   [`Settled::Kept`] (the redrive policy bounds these retries).
    ///
    /// Deleting is the caller's part (an ack here, a success in the Lambda's partial batch
    /// response). A failed visibility change (or no `receipt`) is logged: the queue's
    /// visibility timeout then returns the message.
    pub async fn settle(
        &self,
        queue: &Q,
        job: &Job,
        message_id: &str,
        receive_count: u32,
        receipt: Option<&str>,
        result: &Result<Processed, PortError>,
    ) -> Settled {
        let delay = match result {
            Ok(p) => match p.disposition {
                Disposition::Done => return Settled::Delete,
                Disposition::RetryAfter(secs) if job.handoffs >= MAX_HANDOFFS => {
                    tracing::error!(
                        message_id,
                        session_id = %job.session_id,
                        environment_id = job.environment_id.as_ref().map(|e| e.as_str()),
                        handoffs = job.handoffs,
                        receive_count,
                        reason = p.note.or(p.error.as_deref()).unwrap_or("deferred"),
                        "job stuck: hand-off cap reached; retried through its own message toward the dead-letter queue"
                    );
                    crate::metrics::stuck_job();
                    secs
                }
                Disposition::RetryAfter(secs) => {
                    match self.hand_off(job, message_id, receive_count, secs).await {
                        Ok(()) => {
                            crate::metrics::handoff();
                            tracing::info!(
                                message_id,
                                retry_after_secs = secs,
                                "job handed off to the timers queue"
                            );
                            return Settled::Delete;
                        }
                        Err(e) => {
                            tracing::warn!(message_id, error = %e, "hand-off failed; retrying the message itself");
                            secs
                        }
                    }
                }
            },
            Err(e) => {
                let secs = failure_backoff_secs(receive_count);
                tracing::warn!(message_id, error = %e, retry_after_secs = secs, "job failed; will retry");
                secs
            }
        };
        match receipt {
            Some(receipt) => {
                if let Err(e) = queue.retry_after(receipt, delay).await {
                    tracing::warn!(message_id, error = %e, "visibility change failed; the queue's timeout applies");
                }
            }
            None => tracing::warn!(message_id, "no receipt handle; the queue's timeout applies"),
        }
        Settled::Kept
    }

    /// Sends `job` (a job not processed now) to the timers queue as a new message with
    /// [`Job::handoffs`] one higher, visible after [`handoff_delay_secs`]`(delay_secs,
    /// job.handoffs)`: the delay doubles with every hand-off of the same job, up to
    /// [`MAX_DELAY_SECS`], so a job that keeps waiting (an Agents API outage, a lock
    /// held until its expiry) backs off instead of looping. The de-duplication id names
    /// the message it replaces and its receive count
    /// (`handoff:{message_id}:{receive_count}`).
    ///
    /// # Errors
    /// The timers queue's send error; the caller then retries the message itself.
    pub async fn hand_off(
        &self,
        job: &Job,
        message_id: &str,
        receive_count: u32,
        delay_secs: u32,
    ) -> Result<(), PortError> {
        let mut next = job.clone();
        next.handoffs = job.handoffs.saturating_add(1);
        self.timers
            .send(Outgoing {
                group: next.group().to_owned(),
                dedup_id: format!("handoff:{message_id}:{receive_count}"),
                delay_secs: handoff_delay_secs(delay_secs, job.handoffs),
                job: next,
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
