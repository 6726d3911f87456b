//! Decide: [`sandbox_core::decide`] on what was observed, reading the state of the
//! snapshot a start would restore when the decision needs it.

use super::{Controller, SlotTaken};
use crate::job::Job;
use crate::ports::{Compute, Fence, Queue, Registry};
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
    /// Decides (step 5 of [`Controller::process`]): [`Controller::decide_with_snapshot`],
    /// then, for a decision that starts a compute, the executor slot
    /// ([`Controller::take_slot`]): at the cap the start becomes a `capacity_limit` wait.
    pub(super) async fn decide(
        &self,
        job: &Job,
        observed: &mut Observed,
        fence: &Fence,
    ) -> (Decision, SlotTaken) {
        let decision = self.decide_with_snapshot(observed).await;
        // A start takes an executor slot first (one conditional write); at the cap the
        // start becomes a `capacity_limit` wait.
        let (decision, slot) = self.take_slot(decision, observed, fence).await;
        tracing::info!(
            session_id = %job.session_id, environment_id = %observed.environment_id, outcome = %decision.outcome,
            reason = %decision.reason, effects = decision.effects.len(), "decided"
        );
        (decision, slot)
    }

    /// [`decide`], and when the decision needs the state of the snapshot a start would
    /// restore ([`Reason::SnapshotNotRead`]) the state read through
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
