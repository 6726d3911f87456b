//! Workspaces: what happens to the files of a compute that stopped, before a start and at
//! a close (docs/ARCHITECTURE.md principle 8).

use super::{Act, Controller, stop_environment};
use crate::ports::{Compute, Queue, Receipt, ReceiptKind, Registry, StoredKind};
use sandbox_agents_api::SessionsApi;
use sandbox_core::decision::{StopReason, StopSpec};
use sandbox_core::workspace::{
    self, CloseWorkspace, SnapshotRef, SnapshotState, WorkspaceDisposition,
};

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// The workspace of a compute just read back `STOPPED` (docs/ARCHITECTURE.md principle 8):
    /// an orphan's or a divergent duplicate's is discarded (no record keeps it, or the
    /// kept compute's files are the live ones); a closed or deleted session's follows
    /// [`sandbox_core::observed::Policy::close_workspace`]; every other one is snapshotted,
    /// appended to the record's chain and the chain pruned to
    /// [`sandbox_core::observed::Policy::snapshot_keep`].
    pub(super) async fn stopped_workspace(
        &self,
        stop: &StopSpec,
        act: &mut Act,
    ) -> Result<WorkspaceDisposition, String> {
        let env = stop_environment(act);
        let generation = stop.target.generation;
        let discard = match stop.reason {
            StopReason::Orphan | StopReason::Divergent => true,
            StopReason::Closed | StopReason::SessionDeleted => {
                self.config.policy.close_workspace == CloseWorkspace::Delete
            }
            _ => false,
        };
        if discard {
            return self
                .compute
                .discard_workspace(&self.config.deployment, &env, generation)
                .await
                .map_err(|e| format!("workspace discard failed: {e}"));
        }
        let saved = self.save_workspace(act, generation).await?;
        if let (StopReason::Closed | StopReason::SessionDeleted, CloseWorkspace::Retain { days }) =
            (stop.reason, self.config.policy.close_workspace)
        {
            let until = self.clock.now().saturating_add(u64::from(days) * 86_400);
            for s in &mut act.fresh.snapshots {
                s.expires_at = Some(until);
            }
            act.dirty = true;
        }
        Ok(saved)
    }

    /// Saves generation `generation`'s workspace, appends the snapshot to the record's
    /// chain (its parent: what that generation was restored from) and prunes the chain.
    /// The save returns at once (the snapshot may be `pending`); the working copy is
    /// deleted here only when the written record already names the snapshot and it is
    /// `completed` (docs/ARCHITECTURE.md principle 8), else by a later save or the sweeper.
    pub(super) async fn save_workspace(
        &self,
        act: &mut Act,
        generation: sandbox_core::ids::Generation,
    ) -> Result<WorkspaceDisposition, String> {
        let env = stop_environment(act);
        let saved = self
            .compute
            .save_workspace(&self.config.deployment, &env, generation)
            .await
            .map_err(|e| format!("workspace snapshot failed (files kept): {e}"))?;
        let WorkspaceDisposition::Snapshot { snapshot_id } = &saved else {
            return Ok(saved);
        };
        // A working copy is deleted only once the record as written names its
        // snapshot (the version read under the lock or flushed since, never one only in
        // memory) and that snapshot is `completed`. A snapshot just taken is recorded by
        // this job's release; its working copy goes with a later save of the generation
        // or the sweeper, once the snapshot completed.
        let recorded = act
            .record
            .as_ref()
            .is_some_and(|r| r.snapshots.iter().any(|s| &s.snapshot_id == snapshot_id));
        if recorded {
            let completed = match self
                .compute
                .delete_working_copy(&self.config.deployment, &env, generation, snapshot_id)
                .await
            {
                Ok(deleted) => deleted,
                Err(e) => {
                    tracing::warn!(environment_id = %env, %generation, %snapshot_id, error = %e, "working copy not deleted; the sweeper retries");
                    false
                }
            };
            self.prune_snapshots(act, completed).await;
            return Ok(saved);
        }
        if !act
            .fresh
            .snapshots
            .iter()
            .any(|s| &s.snapshot_id == snapshot_id)
        {
            let parent = (act.fresh.current().map(|i| i.generation) == Some(generation))
                .then(|| act.fresh.restored_from.clone())
                .flatten();
            tracing::info!(environment_id = %env, %generation, %snapshot_id, "workspace snapshotted");
            act.fresh.snapshots.push(SnapshotRef {
                snapshot_id: snapshot_id.clone(),
                generation,
                taken_at: self.clock.now(),
                parent,
                expires_at: None,
            });
            // Open reconciliation evidence of this generation now points at its files.
            sandbox_core::evidence::attach_snapshot(
                &mut act.fresh.evidence,
                generation,
                snapshot_id,
            );
            act.dirty = true;
        }
        // Its state is not known yet (on EBS a new snapshot is `pending`): the prune reads
        // it if it would delete anything, and keeps one more while it is not completed.
        self.prune_snapshots(act, false).await;
        Ok(saved)
    }

    /// Deletes the snapshots beyond the last `snapshot_keep`, except those open
    /// reconciliation evidence names, and one more while the latest is not `completed`
    /// (`latest_completed`, else read when the chain is longer than `snapshot_keep`;
    /// [`workspace::prune`]); one whose delete fails stays
    /// in the chain (retried after the next snapshot; the sweeper reports it).
    pub(super) async fn prune_snapshots(&self, act: &mut Act, mut latest_completed: bool) {
        let keep = usize::try_from(self.config.policy.snapshot_keep.max(1)).unwrap_or(usize::MAX);
        // Only when a prune could delete something: one read of the latest's state.
        if !latest_completed
            && act.fresh.snapshots.len() > keep
            && let Some(latest) = act.fresh.latest_snapshot()
        {
            latest_completed = matches!(
                self.compute
                    .snapshot_state(&self.config.deployment, &latest.snapshot_id)
                    .await,
                Ok(SnapshotState::Completed)
            );
        }
        let prunable = workspace::prune(
            &act.fresh.snapshots,
            self.config.policy.snapshot_keep,
            latest_completed,
        )
        .into_iter()
        // A snapshot open evidence names is kept until an owner resolves it.
        .filter(|s| !sandbox_core::evidence::names_snapshot(&act.fresh.evidence, &s.snapshot_id))
        .collect::<Vec<_>>();
        for old in prunable {
            match self
                .compute
                .delete_stored(
                    &self.config.deployment,
                    StoredKind::Snapshot,
                    &old.snapshot_id,
                )
                .await
            {
                Ok(()) => {
                    tracing::info!(snapshot_id = %old.snapshot_id, "old workspace snapshot deleted (retention)");
                    act.fresh
                        .snapshots
                        .retain(|s| s.snapshot_id != old.snapshot_id);
                    act.dirty = true;
                }
                Err(e) => {
                    tracing::warn!(snapshot_id = %old.snapshot_id, error = %e, "old workspace snapshot not deleted; kept in the chain");
                }
            }
        }
    }

    /// Before a start: the workspace of the generation the record last named, if it was
    /// never saved (it stopped behind the controller's back, lifecycle-cases.md rows 11
    /// and 27), is saved now, so the new generation restores it. `decide()` starts only
    /// when no compute of the environment is active.
    pub(super) async fn save_unsaved_workspace(
        &self,
        act: &mut Act,
        next: sandbox_core::ids::Generation,
    ) -> Result<(), String> {
        let Some(last) = act.fresh.current().map(|i| i.generation) else {
            return Ok(());
        };
        let saved = act.fresh.latest_snapshot().map(|s| s.generation);
        if last >= next || saved.is_some_and(|g| g >= last) {
            return Ok(());
        }
        self.save_workspace(act, last).await.map(|_| ())
    }

    /// The close's workspace disposition, applied with `MarkClosed`
    /// ([`sandbox_core::observed::Policy::close_workspace`]): `delete` deletes the working
    /// copy and every snapshot; `retain` saves what is unsaved and keeps the snapshots
    /// until the expiry the sweeper enforces. One `WorkspaceClosed` receipt.
    pub(super) async fn close_workspace(&self, act: &mut Act) -> Result<(), String> {
        let env = act.fresh.environment_id.clone();
        let dep = &self.config.deployment;
        let now = self.clock.now();
        let (workspace, retained_until) = match self.config.policy.close_workspace {
            CloseWorkspace::Delete => {
                if let Some(last) = act.fresh.current().map(|i| i.generation) {
                    self.compute
                        .discard_workspace(dep, &env, last)
                        .await
                        .map_err(|e| format!("workspace discard failed: {e}"))?;
                }
                for s in act.fresh.snapshots.clone() {
                    self.compute
                        .delete_stored(dep, StoredKind::Snapshot, &s.snapshot_id)
                        .await
                        .map_err(|e| format!("snapshot {} delete failed: {e}", s.snapshot_id))?;
                    act.fresh
                        .snapshots
                        .retain(|k| k.snapshot_id != s.snapshot_id);
                    act.dirty = true;
                }
                (WorkspaceDisposition::Deleted, None)
            }
            CloseWorkspace::Retain { days } => {
                if let Some(last) = act.fresh.current().map(|i| i.generation)
                    && act
                        .fresh
                        .latest_snapshot()
                        .is_none_or(|s| s.generation < last)
                {
                    self.save_workspace(act, last).await?;
                }
                let until = now.saturating_add(u64::from(days) * 86_400);
                for s in &mut act.fresh.snapshots {
                    if s.expires_at.is_none() {
                        s.expires_at = Some(until);
                    }
                }
                act.dirty = true;
                let workspace =
                    act.fresh
                        .latest_snapshot()
                        .map_or(WorkspaceDisposition::None, |s| {
                            WorkspaceDisposition::Snapshot {
                                snapshot_id: s.snapshot_id.clone(),
                            }
                        });
                let until = act
                    .fresh
                    .snapshots
                    .iter()
                    .filter_map(|s| s.expires_at)
                    .max();
                (workspace, until)
            }
        };
        let receipt = Receipt {
            at: now,
            effect_key: env.effect_key(),
            kind: ReceiptKind::WorkspaceClosed {
                workspace,
                snapshots: act
                    .fresh
                    .snapshots
                    .iter()
                    .map(|s| s.snapshot_id.clone())
                    .collect(),
                retained_until,
            },
        };
        self.registry
            .receipt(&receipt)
            .await
            .map_err(|e| format!("receipt write failed: {e}"))
    }
}
