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
pub fn prune(chain: &[SnapshotRef], keep: u32) -> Vec<SnapshotRef> {
    let keep = usize::try_from(keep.max(1)).unwrap_or(usize::MAX);
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
        assert_eq!(prune(&chain, 1), vec![snap("a", 1), snap("b", 2)]);
        assert_eq!(prune(&chain, 2), vec![snap("a", 1)]);
        assert!(prune(&chain, 3).is_empty());
        assert_eq!(prune(&chain, 0), prune(&chain, 1));
        assert!(prune(&[], 1).is_empty());
    }

    #[test]
    fn prune_leaves_retained_snapshots_to_the_sweeper() {
        let mut old = snap("a", 1);
        old.expires_at = Some(100);
        assert!(prune(&[old, snap("b", 2)], 1).is_empty());
    }
}
