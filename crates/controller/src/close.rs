//! The operator's close (lifecycle-cases.md row 25): reject new work for the session, wait
//! out a start in flight, delete the session and stop the compute as two recorded
//! operations (two receipts). While either is ambiguous the record keeps
//! `cleanup_required`, every later look (a webhook, the sweeper, another close) retries
//! only what is not confirmed yet.

use crate::job::Job;
use crate::ports::{Compute, PortError, Queue, Receipt, Registry};
use crate::worker::{Controller, Disposition};
use sandbox_agents_api::SessionsApi;
use sandbox_core::decision::Outcome;
use sandbox_core::ids::SessionId;
use sandbox_core::observed::Trigger;
use sandbox_core::record::RecordStatus;
use std::time::Duration;

/// The result of a close.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloseReport {
    /// Whether the record is closed (both halves confirmed).
    pub closed: bool,
    /// Receipts of the environment so far (session deleted, compute stopped).
    pub receipts: Vec<Receipt>,
    /// Attempts made.
    pub attempts: u32,
    /// The last failure, if the close is still pending (`cleanup_required` is kept).
    pub pending: Option<String>,
}

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// Closes `session`: up to `max_attempts` passes, `pause` apart, until the record is
    /// closed.
    ///
    /// # Errors
    /// A [`PortError`] from the registry; a close that cannot finish in time is not an
    /// error: it returns `closed: false` with the reason and stays `cleanup_required`.
    pub async fn close(
        &self,
        session: &SessionId,
        max_attempts: u32,
        pause: Duration,
    ) -> Result<CloseReport, PortError> {
        let mut pending = None;
        let mut attempts = 0;
        while attempts < max_attempts {
            attempts += 1;
            let job = Job {
                handoffs: 0,
                swept: None,
                operator_proof: None,
                trigger: Trigger::Close,
                session_id: session.clone(),
                environment_id: None,
                webhook_id: None,
                enqueued_at: self.clock.now(),
            };
            // The caller holds this controller: it is the operator, not a queue message.
            let p = self.process_trusted(&job).await?;
            pending = p.error.clone().or(p.note.map(str::to_owned));
            let done = p.disposition == Disposition::Done
                && matches!(p.outcome(), Some(Outcome::Cleanup | Outcome::Ignore))
                && p.error.is_none();
            if done {
                break;
            }
            // Passes are `pause` apart: none after the last one.
            if attempts < max_attempts {
                tokio::time::sleep(pause).await;
            }
        }
        let record = self.registry.find_by_session(session).await?;
        let closed = record
            .as_ref()
            .is_some_and(|r| r.status == RecordStatus::Closed && !r.cleanup_required);
        let receipts = match &record {
            Some(r) => {
                self.registry
                    .receipts(&r.environment_id.effect_key())
                    .await?
            }
            None => vec![],
        };
        Ok(CloseReport {
            closed,
            receipts,
            attempts,
            pending: if closed { None } else { pending },
        })
    }
}
