//! Workspaces outlive compute (docs/ARCHITECTURE.md principle 8): the files of a stopped generation
//! are kept as a snapshot and restored into the next generation.
//!
//! agents-api.md: "Reusing the environment ID does not restore files in replacement
//! compute. Use provider storage or snapshots to preserve them." The controller snapshots
//! a workspace after its compute was read back stopped, records the snapshot in the
//! record's chain ([`crate::record::Record::snapshots`]), starts the next generation from
//! the latest one ([`crate::decision::StartSpec::restore`]), keeps the last
//! [`crate::observed::Policy::snapshot_keep`] per environment, and applies
//! [`crate::observed::Policy::close_workspace`] when the session is closed. Every stop and
//! close receipt says what happened to the files ([`WorkspaceDisposition`]).
//!
//! A snapshot is an EBS snapshot id (`snap-…`) on AWS, an archive name
//! (`g<generation>-<unix secs>.tar.zst`) in local mode.
//!
//! Snapshots take time: an EBS snapshot "remains in the pending state until all
//! of data has been transferred to Amazon S3. This can take several hours" (Amazon EBS
//! User Guide, "Create Amazon EBS snapshots"), and a `RunTask` `snapshotId` is
//! `CreateVolume`'s `SnapshotId`, which restores only a `completed` snapshot. So a start
//! names only a [`SnapshotState::Completed`] snapshot (the decision reads the latest one's
//! state, [`SnapshotRead`]), and a working copy is deleted only once the record names its
//! snapshot and that snapshot is completed. A local archive is complete when it is
//! written (renamed into place).

use crate::ids::Generation;
use serde::{Deserialize, Serialize};
use std::fmt;

/// One snapshot of an environment's workspace, as recorded in the record's chain.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SnapshotRef {
    /// The provider's id: an EBS snapshot id (`snap-0abc…`) or a local archive name.
    pub snapshot_id: String,
    /// The generation whose workspace it holds.
    pub generation: Generation,
    /// When it was taken, Unix seconds.
    pub taken_at: u64,
    /// The snapshot the generation was restored from, if any: the previous link of the
    /// chain (`sandboxctl explain` prints it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// When it may be deleted, Unix seconds: set when a close retains the workspace for
    /// [`CloseWorkspace::Retain`] days; the sweeper deletes it after this. `None`: kept
    /// while it is among the last [`crate::observed::Policy::snapshot_keep`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
}

/// The state of one snapshot, as the provider reports it (EC2 `DescribeSnapshots`
/// `State`; a local archive is `completed` once it exists).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotState {
    /// Still being copied (EC2 `pending`, also `recovering`): not restorable yet.
    Pending,
    /// Restorable (EC2 `completed`).
    Completed,
    /// Failed (EC2 `error`): holds nothing restorable.
    Error,
    /// The provider does not know it (EC2 `InvalidSnapshot.NotFound`, `recoverable` in the
    /// Recycle Bin; a missing archive).
    Gone,
}

impl SnapshotState {
    /// The state's spelling (`pending`, `completed`, `error`, `gone`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Completed => "completed",
            Self::Error => "error",
            Self::Gone => "gone",
        }
    }
}

impl fmt::Display for SnapshotState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The record's latest snapshot ([`crate::record::Record::latest_snapshot`]) as read for
/// one decision ([`crate::observed::Observed::snapshot`]): what a start would restore.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "read", rename_all = "snake_case")]
pub enum SnapshotRead {
    /// Not read: the worker reads it only when the decision asks
    /// ([`crate::decision::Reason::SnapshotNotRead`]), i.e. before a start.
    #[default]
    NotRead,
    /// Read just now.
    Read {
        /// The snapshot read.
        snapshot_id: String,
        /// Its state.
        state: SnapshotState,
    },
    /// The read failed (throttling, 5xx, a timeout): missing evidence, nothing starts.
    Unavailable {
        /// The snapshot that could not be read.
        snapshot_id: String,
    },
}

/// The read of a snapshot's state failed ([`SnapshotRead::Unavailable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotUnreadable;

impl SnapshotRead {
    /// The state read for `snapshot_id`, if this read is about it; `Err` when the read of
    /// it failed; `Ok(None)` when it was not read.
    pub fn state_of(&self, snapshot_id: &str) -> Result<Option<SnapshotState>, SnapshotUnreadable> {
        match self {
            Self::Read {
                snapshot_id: id,
                state,
            } if id == snapshot_id => Ok(Some(*state)),
            Self::Unavailable { snapshot_id: id } if id == snapshot_id => Err(SnapshotUnreadable),
            _ => Ok(None),
        }
    }
}

/// What happened to a workspace when its compute stopped or its session closed, as every
/// stop and close receipt says it.
///
/// Serialized as its display string (`"snapshot snap-0abc"`, `"deleted"`, ...), so a
/// receipt reads the same in JSON as in a log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum WorkspaceDisposition {
    /// The files were saved in this snapshot (and the working copy deleted).
    Snapshot {
        /// The snapshot id.
        snapshot_id: String,
    },
    /// The files and every snapshot of the environment were deleted (a close with
    /// [`CloseWorkspace::Delete`], an orphan, a divergent duplicate).
    Deleted,
    /// The working directory was left in place (local mode, when it could not be archived:
    /// nothing is deleted that was not saved).
    RetainedLocalDir {
        /// The directory.
        path: String,
    },
    /// The compute kept no files (a provider without workspace persistence, or a
    /// generation that never wrote any).
    #[default]
    None,
}

impl fmt::Display for WorkspaceDisposition {
    /// `snapshot <id>`, `deleted`, `retained local dir <path>`, `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Snapshot { snapshot_id } => write!(f, "snapshot {snapshot_id}"),
            Self::Deleted => f.write_str("deleted"),
            Self::RetainedLocalDir { path } => write!(f, "retained local dir {path}"),
            Self::None => f.write_str("none"),
        }
    }
}

impl From<WorkspaceDisposition> for String {
    fn from(d: WorkspaceDisposition) -> Self {
        d.to_string()
    }
}

impl TryFrom<String> for WorkspaceDisposition {
    type Error = String;

    /// Parses the display form.
    fn try_from(s: String) -> Result<Self, Self::Error> {
        match s.as_str() {
            "deleted" => return Ok(Self::Deleted),
            "none" => return Ok(Self::None),
            _ => {}
        }
        if let Some(id) = s.strip_prefix("snapshot ").filter(|id| !id.is_empty()) {
            return Ok(Self::Snapshot {
                snapshot_id: id.to_owned(),
            });
        }
        if let Some(path) = s.strip_prefix("retained local dir ") {
            return Ok(Self::RetainedLocalDir {
                path: path.to_owned(),
            });
        }
        Err(format!("not a workspace disposition: {s:?}"))
    }
}

/// What a close does with the environment's workspace and snapshots.
/// Serialized as `delete` or `retain:<days>` (the settings' syntax).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum CloseWorkspace {
    /// Delete the working copy and every snapshot at once.
    Delete,
    /// Snapshot the workspace and keep the snapshots this many days after the close; the
    /// sweeper deletes them afterwards.
    Retain {
        /// Days (≥ 1).
        days: u32,
    },
}

impl Default for CloseWorkspace {
    /// Retain for 7 days: a close never destroys files an operator may still want.
    fn default() -> Self {
        Self::Retain { days: 7 }
    }
}

impl fmt::Display for CloseWorkspace {
    /// `delete` or `retain:<days>` (the settings' syntax).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Delete => f.write_str("delete"),
            Self::Retain { days } => write!(f, "retain:{days}"),
        }
    }
}

impl From<CloseWorkspace> for String {
    fn from(c: CloseWorkspace) -> Self {
        c.to_string()
    }
}

impl TryFrom<String> for CloseWorkspace {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl std::str::FromStr for CloseWorkspace {
    type Err = String;

    /// Parses `delete` or `retain:<days>` (days ≥ 1).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s == "delete" {
            return Ok(Self::Delete);
        }
        let days = s
            .strip_prefix("retain:")
            .and_then(|d| d.parse::<u32>().ok())
            .filter(|d| *d >= 1)
            .ok_or_else(|| {
                format!("close workspace disposition {s:?} is not `delete` or `retain:<days ≥ 1>`")
            })?;
        Ok(Self::Retain { days })
    }
}

/// The snapshots of a chain to delete so that only the last `keep` remain (oldest first;
/// `keep` 0 counts as 1: the latest is never pruned, it is the next generation's files).
/// Snapshots that carry an expiry are left to the sweeper.
///
/// `latest_completed`: whether the latest is known [`SnapshotState::Completed`]. When it
/// is not (still `pending`, or not read), one more is kept: the last completed snapshot is
/// never pruned while a newer one may still fail; the next prune, after the
/// newer one completed, deletes it.
pub fn prune(chain: &[SnapshotRef], keep: u32, latest_completed: bool) -> Vec<SnapshotRef> {
    let keep = keep.max(1).saturating_add(u32::from(!latest_completed));
    let keep = usize::try_from(keep).unwrap_or(usize::MAX);
    let n = chain.len().saturating_sub(keep);
    chain[..n]
        .iter()
        .filter(|s| s.expires_at.is_none())
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(id: &str, g: u64) -> SnapshotRef {
        SnapshotRef {
            snapshot_id: id.into(),
            generation: Generation(g),
            taken_at: g,
            parent: None,
            expires_at: None,
        }
    }

    #[test]
    fn disposition_reads_as_the_receipt_says_it() {
        let s = WorkspaceDisposition::Snapshot {
            snapshot_id: "snap-1".into(),
        };
        assert_eq!(s.to_string(), "snapshot snap-1");
        assert_eq!(WorkspaceDisposition::Deleted.to_string(), "deleted");
        assert_eq!(WorkspaceDisposition::None.to_string(), "none");
        assert_eq!(
            WorkspaceDisposition::RetainedLocalDir { path: "/d".into() }.to_string(),
            "retained local dir /d"
        );
        for d in [
            s,
            WorkspaceDisposition::Deleted,
            WorkspaceDisposition::None,
            WorkspaceDisposition::RetainedLocalDir {
                path: "/d x".into(),
            },
        ] {
            let json = serde_json::to_string(&d).unwrap();
            assert_eq!(
                serde_json::from_str::<WorkspaceDisposition>(&json).unwrap(),
                d
            );
        }
        assert!(serde_json::from_str::<WorkspaceDisposition>("\"kept\"").is_err());
    }

    #[test]
    fn close_workspace_parses_delete_and_retain_days_and_rejects_the_rest() {
        assert_eq!("delete".parse(), Ok(CloseWorkspace::Delete));
        assert_eq!("retain:3".parse(), Ok(CloseWorkspace::Retain { days: 3 }));
        assert!("retain:0".parse::<CloseWorkspace>().is_err());
        assert!("retain".parse::<CloseWorkspace>().is_err());
        assert!("keep".parse::<CloseWorkspace>().is_err());
        assert_eq!(CloseWorkspace::Retain { days: 3 }.to_string(), "retain:3");
    }

    #[test]
    fn prune_keeps_the_last_k_and_never_the_latest() {
        let chain = vec![snap("a", 1), snap("b", 2), snap("c", 3)];
        assert_eq!(prune(&chain, 1, true), vec![snap("a", 1), snap("b", 2)]);
        assert_eq!(prune(&chain, 2, true), vec![snap("a", 1)]);
        assert!(prune(&chain, 3, true).is_empty());
        assert_eq!(prune(&chain, 0, true), prune(&chain, 1, true));
        assert!(prune(&[], 1, true).is_empty());
    }

    #[test]
    fn prune_keeps_the_last_completed_snapshot_while_a_newer_one_is_pending() {
        let chain = vec![snap("a", 1), snap("b", 2), snap("c", 3)];
        // `c` pending: `b` (the last that surely completed) stays.
        assert_eq!(prune(&chain, 1, false), vec![snap("a", 1)]);
        assert!(prune(&chain, 2, false).is_empty());
    }

    #[test]
    fn a_snapshot_read_answers_only_for_its_own_snapshot() {
        let read = SnapshotRead::Read {
            snapshot_id: "snap-1".into(),
            state: SnapshotState::Pending,
        };
        assert_eq!(read.state_of("snap-1"), Ok(Some(SnapshotState::Pending)));
        assert_eq!(read.state_of("snap-2"), Ok(None));
        let failed = SnapshotRead::Unavailable {
            snapshot_id: "snap-1".into(),
        };
        assert_eq!(failed.state_of("snap-1"), Err(SnapshotUnreadable));
        assert_eq!(SnapshotRead::NotRead.state_of("snap-1"), Ok(None));
    }

    #[test]
    fn prune_leaves_retained_snapshots_to_the_sweeper() {
        let mut old = snap("a", 1);
        old.expires_at = Some(100);
        assert!(prune(&[old, snap("b", 2)], 1, true).is_empty());
    }
}
