//! The controller's own record of one environment's compute, stored under its effect key
//! (`agents-api:environment:{environment_id}:compute`) and changed only by conditional
//! writes (docs/ARCHITECTURE.md principle 2).

use crate::compute::InstanceRef;
use crate::ids::{EnvironmentId, Generation, SessionId};
use serde::{Deserialize, Serialize};

/// One environment's compute record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The environment (the effect key derives from it).
    pub environment_id: EnvironmentId,
    /// The session that owns the environment.
    pub session_id: SessionId,
    /// High-water mark: the highest generation ever allocated for this environment
    /// (0: none yet). Never decreases, so a generation number (and its idempotency token)
    /// is never reused even after the provider forgets old instances.
    pub generation: Generation,
    /// The compute the record names as current: provider instance id and generation,
    /// written before the lock is released (docs/ARCHITECTURE.md principle 3). `None` before the first
    /// start or after a failed start.
    pub instance: Option<InstanceRef>,
    /// When the record began naming `instance` (the provider accepted the start, or the
    /// compute was adopted), Unix seconds. A recorded instance the provider does not show
    /// is "not visible yet" for [`crate::observed::Policy::visibility_window_secs`] after
    /// this, "gone" afterwards (ECS reads are eventually consistent: `DescribeTasks` can
    /// answer `MISSING` right after `RunTask`). `None` in records written before the field
    /// existed: absent means gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_recorded_at: Option<u64>,
    /// When the controller first observed the session's current `environment_connection`
    /// requirement, Unix seconds; cleared once no connection is required. The connect
    /// deadline of a running compute counts from the later of its start and this, so an
    /// executor that ran for an hour and briefly disconnected gets its full deadline to
    /// reconnect before it is replaced (lifecycle-cases.md row 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_requested_at: Option<u64>,
    /// What the controller believes.
    pub status: RecordStatus,
    /// A pending shutdown lease, if any.
    pub lease: Option<ShutdownLease>,
    /// Consecutive failed starts, if the last start failed.
    pub start_failure: Option<StartFailure>,
    /// Set when an operator close began; new work is rejected while it is set, and only
    /// the halves not yet confirmed (session deleted, compute stopped) are retried.
    pub cleanup_required: bool,
    /// Optimistic-concurrency version: every write conditions on it and increments it.
    pub version: u64,
    /// Reconciliation evidence held for an owner, open and recently resolved ([`crate::evidence`]). An open entry whose tool did not complete holds the compute:
    /// the idle lease does not stop it until `sandboxctl resolve` closes it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<crate::evidence::Evidence>,
    /// The connection state as last observed (`agent.environment.status` and since when),
    /// kept current by the worker whenever it reads the environment (the seed's mapping
    /// record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<crate::evidence::ConnectionObservation>,
    /// The id of the last event the worker reconciled this environment on: the delivery's
    /// `webhook-id` (the de-duplication key of the event, kept across retries), written by
    /// the decision that processed it (the seed's mapping record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reconciled_event_id: Option<String>,
    // --- Cost and safety ceilings. ---
    /// A pending no-work stop ([`crate::observed::Policy::no_work_secs`]): stop exactly
    /// `target` at `due_at` unless work arrives first. Separate from [`Record::lease`]
    /// (the idle lease), which any busy status cancels: a session waiting on a
    /// `function_call` is busy, yet has no work for the executor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_work_lease: Option<ShutdownLease>,
    /// When the executor was replaced for a missed connect deadline, Unix seconds, oldest
    /// first, within [`crate::observed::Policy::replacement_window_secs`]: the evidence of
    /// the replacement cap ([`crate::observed::Policy::max_replacements`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replacements: Vec<u64>,
    /// The workspace snapshot chain, oldest first: the snapshots this environment still
    /// keeps (the last [`crate::observed::Policy::snapshot_keep`], or those a close retains
    /// until their `expires_at`). The latest ([`Record::latest_snapshot`]) is the workspace
    /// reference the next generation restores (the seeds' "workspace snapshot reference").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<crate::workspace::SnapshotRef>,
    /// The snapshot the current generation was restored from, if any (the parent of the
    /// snapshot its stop takes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<String>,
    /// When the controller first saw the current instance's executor connected
    /// (`agent.environment.status` `connected`), Unix seconds; cleared whenever the record
    /// names a new instance. Observed, not reported: the worker reads the status once the
    /// connection request it started the instance for is no longer required (typically on
    /// the session's `in_progress` webhook), so this is an upper bound of the connect time.
    /// Feeds the `start_to_connected_seconds` metric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_connected_at: Option<u64>,
    /// The current instance was a claimed warm pool member (not a cold start);
    /// cleared whenever the record names a new instance. Labels `start_to_connected_seconds`
    /// (`path` = `warm` / `cold`). Absent in records written before the field: `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub instance_from_pool: bool,
}

/// What the controller believes about the environment's compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordStatus {
    /// A compute of `generation` was started or adopted and not yet seen stopped.
    Active,
    /// The compute was stopped and read back stopped (or found gone).
    Stopped,
    /// The session is gone (deleted or closed); nothing may start for it again.
    Closed,
}

/// A pending shutdown: stop exactly `target` at `due_at` unless new work arrives first.
///
/// Source: agents-api.md, "idle is not a safe shutdown signal": a grace period absorbs
/// the idle that arrives just before queued input starts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShutdownLease {
    /// The exact instance and generation to stop; a newer generation is never stopped
    /// by this lease (lifecycle-cases.md row 18).
    pub target: InstanceRef,
    /// When the lease was taken, Unix seconds.
    pub requested_at: u64,
    /// When the stop becomes due, Unix seconds (`requested_at` + grace).
    pub due_at: u64,
}

/// The last failed start attempts (lifecycle-cases.md row 28: capacity, quota, a bad task
/// definition, failures returned with a success status).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartFailure {
    /// Consecutive failed attempts (≥ 1).
    pub attempts: u32,
    /// When the last attempt failed, Unix seconds.
    pub last_failed_at: u64,
    /// The provider's reason, as reported (never a secret).
    pub reason: String,
    /// What failed: the start itself (the default, and in records written before the
    /// field), or a generation that ran and stopped without its environment ever being
    /// seen `connected`.
    #[serde(default, skip_serializing_if = "StartFailureKind::is_start")]
    pub kind: StartFailureKind,
}

/// What kind of failed start a [`StartFailure`] counts. Both count toward the same
/// backoff and attempt cap ([`crate::observed::Policy::max_start_attempts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartFailureKind {
    /// The start failed: `RunTask` answered with `failures`, the task stopped with
    /// `TaskFailedToStart`, or a snapshot could not be restored (lifecycle-cases.md
    /// row 28).
    #[default]
    Start,
    /// The executor ran and stopped (task stopped, container exited, local child or
    /// forwarder exited) without its environment being seen `connected` since that
    /// generation started: a rejected executor key, an image without `codex`, a usage
    /// error, a forwarder that exits (agents-api.md: the executor must register before
    /// the session can use it). Past the cap the environment is held with evidence
    /// `executor_never_connects` until an owner resolves it.
    NeverConnected,
}

impl StartFailureKind {
    /// Whether this is [`StartFailureKind::Start`] (serde's skip test).
    pub fn is_start(&self) -> bool {
        *self == Self::Start
    }

    /// The name used in JSON and text (`start`, `never_connected`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::NeverConnected => "never_connected",
        }
    }
}

impl Record {
    /// A new record for an environment with nothing started yet (generation 0).
    pub fn new(environment_id: EnvironmentId, session_id: SessionId) -> Self {
        Self {
            environment_id,
            session_id,
            generation: Generation(0),
            instance: None,
            instance_recorded_at: None,
            connection_requested_at: None,
            status: RecordStatus::Active,
            lease: None,
            start_failure: None,
            cleanup_required: false,
            version: 0,
            evidence: Vec::new(),
            connection: None,
            last_reconciled_event_id: None,
            no_work_lease: None,
            replacements: Vec::new(),
            snapshots: Vec::new(),
            restored_from: None,
            instance_connected_at: None,
            instance_from_pool: false,
        }
    }

    /// The instance the record names as current, if any.
    pub fn current(&self) -> Option<&InstanceRef> {
        self.instance.as_ref()
    }

    /// Whether the record claims a compute is running or starting.
    pub fn claims_compute(&self) -> bool {
        self.status == RecordStatus::Active && self.instance.is_some()
    }

    /// The open evidence entries (questions no owner resolved yet).
    pub fn open_evidence(&self) -> impl Iterator<Item = &crate::evidence::Evidence> {
        self.evidence.iter().filter(|e| e.is_open())
    }

    /// The open entry that holds the compute with the files, if any
    /// ([`crate::evidence::Evidence::holds_files`]).
    pub fn holding_evidence(&self) -> Option<&crate::evidence::Evidence> {
        self.evidence.iter().find(|e| e.holds_files())
    }
    /// The latest workspace snapshot: what the next generation restores, `None` when no
    /// workspace was saved yet.
    pub fn latest_snapshot(&self) -> Option<&crate::workspace::SnapshotRef> {
        self.snapshots.last()
    }
}
