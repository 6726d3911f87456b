//! Decide: [`sandbox_core::decide`] on what was observed, reading the state of the
//! snapshot a start would restore when the decision needs it.

use super::Controller;
use crate::ports::{Compute, Queue, Registry};
use sandbox_agents_api::SessionsApi;
use sandbox_core::decision::{Decision, Reason, decide};
use sandbox_core::observed::Observed;
use sandbox_core::workspace::SnapshotRead;

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// [`decide`], and when the decision needs the state of the snapshot a start would
    /// restore ([`Reason::SnapshotNotRead`], issue 23) the state read through
    /// [`crate::ports::Workspaces::snapshot_state`] (one call) and `decide` again on it.
    /// A failed read is [`SnapshotRead::Unavailable`]: the decision is `uncertain`.
    pub(crate) async fn decide_with_snapshot(&self, observed: &mut Observed) -> Decision {
        let decision = decide(observed);
        let Reason::SnapshotNotRead { snapshot_id } = &decision.reason else {
            return decision;
        };
        observed.snapshot = match self
            .compute
            .snapshot_state(&self.config.deployment, snapshot_id)
            .await
        {
            Ok(state) => SnapshotRead::Read {
                snapshot_id: snapshot_id.clone(),
                state,
            },
            Err(e) => {
                tracing::warn!(%snapshot_id, error = %e, "snapshot state unavailable");
                SnapshotRead::Unavailable {
                    snapshot_id: snapshot_id.clone(),
                }
            }
        };
        decide(observed)
    }
}
