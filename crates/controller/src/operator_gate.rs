//! Queue messages are not operator commands: the worker refuses a `close`, `resolve` or
//! `timeout_reported` job for a session no record of this deployment names unless the job
//! carries an operator's proof ([`sandbox_core::operator_proof`]) that verifies with the
//! deployment's operator key ([`crate::ControllerConfig::operator_key`]).
//!
//! Why: the CLI's `--force` guard only protects an honest operator from a typo. Anything
//! that can write the events queue (an application allowed to send `timeout_reported`, a
//! compromised function, in local mode anything that can write the queue database) could
//! otherwise make the worker delete a session the deployment never handled with the
//! application's key (docs/SECURITY.md). A recorded session needs no proof: its jobs
//! are hints the worker decides on from the session and the record (docs/ARCHITECTURE.md
//! principle 1), exactly as before.

use crate::job::Job;
use crate::ports::{Compute, PortError, Queue, Registry};
use crate::worker::{Controller, Disposition, Processed};
use sandbox_agents_api::SessionsApi;
use sandbox_core::operator_proof::{needs_proof_when_unrecorded, trigger_kind};

/// The note of a refused job ([`Processed::note`]).
pub const REFUSED_NOTE: &str =
    "operator job for a session no record names, without a valid operator proof: refused";

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// `Some(refused)` (disposition `Done`: the message is deleted, nothing was read from
    /// the Agents API and nothing written) when `job` is a `close`, `resolve` or
    /// `timeout_reported` for a session no record names and its `operator_proof` is
    /// missing or does not verify with the configured operator key (no key configured:
    /// every such job is refused). `None` when the job may proceed.
    ///
    /// # Errors
    /// A [`PortError`] when the registry cannot be read (the job is retried).
    pub(crate) async fn refuse_unproven_operator_job(
        &self,
        job: &Job,
    ) -> Result<Option<Processed>, PortError> {
        if !needs_proof_when_unrecorded(&job.trigger) {
            return Ok(None);
        }
        if self
            .registry
            .find_by_session(&job.session_id)
            .await?
            .is_some()
        {
            return Ok(None);
        }
        let proven = match (&self.config.operator_key, &job.operator_proof) {
            (Some(key), Some(tag)) => {
                key.verify(&job.session_id, job.enqueued_at, &job.trigger, tag)
            }
            _ => false,
        };
        if proven {
            tracing::info!(
                session_id = %job.session_id,
                kind = %trigger_kind(&job.trigger),
                "operator-forced job for an unrecorded session: proof verified"
            );
            return Ok(None);
        }
        tracing::warn!(
            session_id = %job.session_id,
            kind = %trigger_kind(&job.trigger),
            has_proof = job.operator_proof.is_some(),
            has_key = self.config.operator_key.is_some(),
            "{REFUSED_NOTE}"
        );
        Ok(Some(Processed::skipped(REFUSED_NOTE, Disposition::Done)))
    }
}
