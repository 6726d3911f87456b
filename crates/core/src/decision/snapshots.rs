//! Snapshots take time (step 9 of [`super::decide`], before every start): a
//! start never restores a snapshot that is not `completed`.
//!
//! An EBS snapshot "remains in the pending state until all of data has been transferred
//! to Amazon S3. This can take several hours" (Amazon EBS User Guide, "Create Amazon EBS
//! snapshots"); a `RunTask` `snapshotId` is `CreateVolume`'s `SnapshotId`, and EC2 restores
//! a volume only from a `completed` snapshot. What the session gets meanwhile: nothing new
//! starts, with a visible reason, until the files can be restored whole:
//!
//! - the state of the snapshot the start would restore (the record's latest) was not read
//!   for this decision: `uncertain`, [`Reason::SnapshotNotRead`] — the worker reads it
//!   through the `Workspaces` port and decides again (one read, only before a start);
//! - the read failed: `uncertain`, [`Reason::SnapshotStateUnavailable`], retried after
//!   [`crate::observed::Policy::uncertain_retry_secs`];
//! - `pending` for less than [`crate::observed::Policy::snapshot_wait_secs`] since it was
//!   taken: `wait`, [`Reason::SnapshotPending`], rechecked every
//!   [`crate::observed::Policy::snapshot_recheck_secs`];
//! - `pending` past that bound: a failed start, [`Reason::SnapshotPendingTooLong`];
//! - `error` or gone: a failed start, [`Reason::SnapshotUnusable`].
//!
//! A failed start here is recorded like a `RunTask` failure (row 28): counted, backed off,
//! and after `max_start_attempts` held for an operator; it is never a start from an empty
//! workspace. The working copy the snapshot was taken from is still there (a volume is
//! deleted only once a completed snapshot of it is recorded), so an operator can recover
//! it. A snapshot taken in the same job as the start (a replacement's stop, or the save of
//! a generation that stopped on its own) is checked by the worker before it sends the
//! start: not completed, the start is deferred and this step decides the next look.

use super::View;
use crate::outcome::{Decision, Effect, Outcome};
use crate::reason::Reason;
use crate::record::StartFailure;
use crate::workspace::SnapshotState;

impl View<'_> {
    /// The decision that holds a start back because of the snapshot it would restore, if
    /// any, its `effects` (those the start path gathered: a cancelled lease, a counted
    /// `TaskFailedToStart`) first; `None`: nothing to restore, the latest snapshot is
    /// `completed`, or the record's current generation is newer than the latest snapshot
    /// (the worker saves that generation first and checks the new snapshot before the
    /// start). `failure`: the record's failed starts so far.
    pub(super) fn snapshot_not_restorable(
        &self,
        failure: Option<&StartFailure>,
        effects: &[Effect],
    ) -> Option<Decision> {
        let policy = &self.o.policy;
        let record = self.record?;
        let latest = record.latest_snapshot()?;
        if record
            .current()
            .is_some_and(|i| i.generation > latest.generation)
        {
            return None;
        }
        let held = |outcome: Outcome, reason: Reason| {
            Decision::new(outcome, reason).with(effects.iter().cloned())
        };
        let snapshot_id = latest.snapshot_id.clone();
        let state = match self.o.snapshot.state_of(&snapshot_id) {
            Ok(Some(state)) => state,
            Ok(None) => {
                return Some(
                    held(Outcome::Uncertain, Reason::SnapshotNotRead { snapshot_id })
                        .recheck(policy.uncertain_retry_secs),
                );
            }
            Err(_) => {
                return Some(
                    held(
                        Outcome::Uncertain,
                        Reason::SnapshotStateUnavailable { snapshot_id },
                    )
                    .recheck(policy.uncertain_retry_secs),
                );
            }
        };
        let pending_secs = self.o.now.saturating_sub(latest.taken_at);
        let reason = match state {
            SnapshotState::Completed => return None,
            SnapshotState::Pending if pending_secs < policy.snapshot_wait_secs => {
                let left = policy.snapshot_wait_secs - pending_secs;
                return Some(
                    held(
                        Outcome::Wait,
                        Reason::SnapshotPending {
                            snapshot_id,
                            pending_secs,
                        },
                    )
                    .recheck(policy.snapshot_recheck_secs.clamp(1, left)),
                );
            }
            SnapshotState::Pending => Reason::SnapshotPendingTooLong {
                snapshot_id,
                pending_secs,
            },
            SnapshotState::Error | SnapshotState::Gone => {
                Reason::SnapshotUnusable { snapshot_id, state }
            }
        };
        let attempts = failure.map_or(1, |f| f.attempts.saturating_add(1));
        let recorded = StartFailure {
            attempts,
            last_failed_at: self.o.now,
            reason: reason.to_string(),
            kind: crate::record::StartFailureKind::Start,
        };
        Some(
            held(Outcome::Reconcile, reason)
                .with([Effect::RecordStartFailure(recorded)])
                .recheck(policy.start_backoff_secs(attempts)),
        )
    }
}
