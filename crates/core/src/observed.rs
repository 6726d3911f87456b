//! Everything [`crate::decide`] looks at: one environment's observed state at one instant.
//!
//! The controller gathers it fresh for every decision (docs/ARCHITECTURE.md principle 1: events are
//! hints, state is authority): the session from the Agents API, the record from the
//! registry, the instances from the provider, optional turn evidence, and `now`.

use crate::compute::ComputeInstance;
use crate::environment::EnvironmentStatus;
use crate::event::RequiredActionType;
use crate::ids::EnvironmentId;
use crate::record::{Record, ShutdownLease};
use crate::session::Session;
use crate::turn::{ItemStatus, TurnStatus};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What made the controller look. A trigger selects the question; the observed state
/// answers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Trigger {
    /// `agent.session.action_required` with `environment_connection`.
    ConnectionRequested,
    /// `agent.session.action_required` of another type (not compute's business).
    OtherActionRequired {
        /// The action type from the webhook.
        action: RequiredActionType,
    },
    /// `agent.session.in_progress`: a turn started (cancels a pending stop).
    TurnStarted,
    /// `agent.session.idle`: a shutdown *hint*.
    Idle,
    /// `agent.session.failed`.
    Failed,
    /// Any other event (ignored).
    OtherEvent {
        /// The event type as sent.
        event_type: String,
    },
    /// A shutdown lease's recheck timer fired (the lease as it was scheduled).
    LeaseDue {
        /// The lease the timer was scheduled for.
        lease: ShutdownLease,
    },
    /// The scheduled sweeper reconciles this environment.
    Sweep,
    /// An operator closes the session (lifecycle-cases.md row 25).
    Close,
    /// An operator resets the environment's failed-start count (`sandboxctl
    /// reset-start-failures`): attempts resume at once instead of after the cooldown
    /// ([`Policy::start_failing_cooldown_secs`]).
    ResetStartFailures,
    /// An owner resolves the environment's open reconciliation (`sandboxctl resolve`):
    /// the evidence is closed under the effect-key lock with who, when and what; only
    /// then may an idle stop of the held compute proceed.
    Resolve {
        /// The owner's answer.
        resolution: crate::evidence::Resolution,
    },
    /// An application reports that its input submission timed out (row 21; `sandboxctl
    /// report-timeout` or the `timeout_reported` job on the events queue). The worker
    /// reads the session, its turns and the turn's items and records what became of the
    /// submission; nothing is ever resubmitted.
    TimeoutReported {
        /// The submission's turn id, when the application knows it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        turn_id: Option<String>,
        /// When the input was submitted, Unix seconds: without a turn id, the first turn
        /// created at or after this is the submission's.
        submitted_at: u64,
    },
    /// `agent.session.created` of a self-hosted session, kept only when the deployment
    /// provisions on creation ([`Policy::provision_on`] = [`ProvisionOn::Created`]): start
    /// the executor before the first input needs it (seeds 000, 004: application-managed
    /// provisioning).
    SessionCreated,
    /// A no-work lease's recheck timer fired (the lease as it was scheduled;
    /// [`Policy::no_work_secs`]).
    NoWorkLeaseDue {
        /// The no-work lease the timer was scheduled for.
        lease: ShutdownLease,
    },
}

/// The `agent.environment` status as the controller read it for this decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EnvironmentRead {
    /// Not read: the decision did not need it.
    #[default]
    NotRead,
    /// `GET /agents/environments/{id}` answered.
    Read {
        /// The status (`connected` means an executor is attached).
        status: EnvironmentStatus,
    },
    /// The read failed: missing evidence, never "not connected" (row 22).
    Unavailable,
}

impl EnvironmentRead {
    /// The status, when it was read.
    pub fn status(self) -> Option<EnvironmentStatus> {
        match self {
            Self::Read { status } => Some(status),
            _ => None,
        }
    }

    /// Whether it was read as `connected`.
    pub fn is_connected(self) -> bool {
        self.status() == Some(EnvironmentStatus::Connected)
    }
}

/// The session as retrieved just now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SessionView {
    /// `GET /agents/sessions/{id}` answered 200.
    Found {
        /// The session.
        session: Box<Session>,
    },
    /// It answered 404: deleted (no webhook is ever sent for a deletion).
    Deleted,
    /// No answer to rely on: evidence is missing (row 22).
    Unavailable {
        /// Why.
        cause: Unavailable,
    },
}

/// Why evidence is missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unavailable {
    /// No response in time.
    Timeout,
    /// Connection refused, DNS, TLS.
    Unreachable,
    /// 5xx after retries.
    ServerError,
    /// 429 after retries.
    RateLimited,
}

/// The provider's instances for the environment, or unknown.
///
/// docs/ARCHITECTURE.md principle 7, "read by id, list to discover": the instance the record names is
/// always read by its id (ECS `DescribeTasks` on the ARN); a sweep adds the live instances
/// its deployment-wide list found for the environment. A recorded instance that is absent
/// here was answered `MISSING`: [`crate::decide`] treats it as not visible yet within
/// [`Policy::visibility_window_secs`] of being recorded, and as gone after that. Absence
/// from a list proves nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Inventory {
    /// Read back from the provider (stopped ones may be included).
    Known {
        /// The instances read for the environment.
        instances: Vec<ComputeInstance>,
    },
    /// The provider could not be read: never start or stop on that.
    Unavailable,
}

/// Evidence about the session's latest turn, fetched when it matters (rows 20, 21).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnEvidence {
    /// Turn id.
    pub turn_id: String,
    /// Turn status.
    pub status: TurnStatus,
    /// Tool items of the turn that failed or are incomplete: `(item id, item type, status)`.
    pub broken_tools: Vec<(String, String, ItemStatus)>,
}

/// Which sessions this deployment handles; handlers sharing a project never fight (row 24).
/// Every set condition must hold; an empty filter accepts every self-hosted session.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnershipFilter {
    /// Accepted `agent.id`s; empty accepts any agent.
    pub agent_ids: Vec<String>,
    /// Required `environment.workspace_directory`, if set.
    pub workspace_directory: Option<String>,
    /// Required `metadata` pairs (e.g. `{"owner": "team-a"}`).
    pub metadata: BTreeMap<String, String>,
}

impl OwnershipFilter {
    /// Whether `session` belongs to this deployment.
    pub fn accepts(&self, session: &Session) -> bool {
        let agent_ok = self.agent_ids.is_empty() || self.agent_ids.contains(&session.agent.id);
        let dir_ok = match (&self.workspace_directory, session.self_hosted()) {
            (None, _) => true,
            (Some(want), Some(env)) => &env.workspace_directory == want,
            (Some(_), None) => false,
        };
        let meta_ok = self
            .metadata
            .iter()
            .all(|(k, v)| session.metadata.get(k) == Some(v));
        agent_ok && dir_ok && meta_ok
    }
}

/// Why a metadata ownership rule (`OWNER_METADATA`, `serve --owner-metadata`) was refused.
/// The message never repeats the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetadataRuleError {
    /// An entry is not `key=value` with a non-empty key.
    #[error("each entry is key=value with a non-empty key")]
    NotAPair,
    /// A key is longer than 64 characters or a value longer than 512.
    #[error("metadata keys are at most 64 characters and values at most 512")]
    TooLong,
    /// The same key is given twice.
    #[error("a metadata key is given twice")]
    DuplicateKey,
    /// More than 16 pairs: no session could carry them all.
    #[error("at most 16 metadata pairs")]
    TooMany,
}

/// Parses the metadata ownership rule of [`OwnershipFilter::metadata`] from `key=value`
/// entries (split at the first `=`; keys and values are trimmed; an empty value is
/// allowed). Limits are the Agents API's for `agent.session.metadata` (agents-api.md: at
/// most 16 pairs, keys up to 64 characters, values up to 512): a rule beyond them could
/// never match, so it is refused rather than silently owning nothing.
///
/// # Errors
/// [`MetadataRuleError`]; nothing is returned on error.
pub fn parse_metadata_rule<'a>(
    entries: impl IntoIterator<Item = &'a str>,
) -> Result<BTreeMap<String, String>, MetadataRuleError> {
    let mut out = BTreeMap::new();
    for entry in entries {
        let (k, v) = entry.split_once('=').ok_or(MetadataRuleError::NotAPair)?;
        let (k, v) = (k.trim(), v.trim());
        if k.is_empty() {
            return Err(MetadataRuleError::NotAPair);
        }
        if k.chars().count() > 64 || v.chars().count() > 512 {
            return Err(MetadataRuleError::TooLong);
        }
        if out.insert(k.to_owned(), v.to_owned()).is_some() {
            return Err(MetadataRuleError::DuplicateKey);
        }
    }
    if out.len() > 16 {
        return Err(MetadataRuleError::TooMany);
    }
    Ok(out)
}

/// Timing rules, all in seconds, and the cost and safety ceilings. Fields missing from a
/// serialized policy take their defaults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Policy {
    /// A running executor that has not connected within this many seconds of its start is
    /// replaced (row 10). Default 180 (the API itself waits up to 300 s for an input-time
    /// connection, agents-api.md).
    pub connect_deadline_secs: u64,
    /// Grace between an idle session and the stop (default 300).
    pub shutdown_grace_secs: u64,
    /// First retry delay after a failed start; doubles per attempt (default 15).
    pub start_retry_base_secs: u64,
    /// Cap of the start retry delay (default 600).
    pub start_retry_max_secs: u64,
    /// After this many consecutive failed starts, stop trying and hold for an operator
    /// (default 5; row 28: never loop creating compute).
    pub max_start_attempts: u32,
    /// Recheck delay while waiting on a start or stop in flight (default 10).
    pub recheck_secs: u64,
    /// Retry delay when evidence is unavailable (default 15).
    pub uncertain_retry_secs: u64,
    /// How long after it was recorded a compute the provider does not show (ECS
    /// `MISSING`, absent from `ListTasks`) counts as "not visible yet" — wait, never start
    /// another — rather than gone (default 300). ECS reads are eventually consistent right
    /// after `RunTask` (aws-semantics.md); ECS forgets stopped tasks after about an hour,
    /// so `MISSING` long after the start means gone.
    pub visibility_window_secs: u64,
    /// After [`Policy::max_start_attempts`] failed starts, attempts resume one at a time
    /// this long after the last failure (default 3,600); an operator can reset them at
    /// once ([`Trigger::ResetStartFailures`]).
    pub start_failing_cooldown_secs: u64,
    // --- Cost and safety ceilings. ---
    /// Maximum executor lifetime, seconds since the provider started it (default 28,800
    /// = 8 h; 0 = off). Past it an executor whose session is idle is stopped at once
    /// (`lifetime_exceeded`); a busy one at its next idle or at
    /// [`Policy::lifetime_hard_cap_secs`]. The next connection request starts a fresh
    /// generation as usual. (Bedrock AgentCore's default maximum lifetime is 8 h.)
    pub max_lifetime_secs: u64,
    /// Hard lifetime cap, seconds since the start (default 32,400 = the lifetime + 1 h;
    /// 0 = none): past it the executor is stopped even mid-turn (`lifetime_hard_cap`).
    /// Ignored when [`Policy::max_lifetime_secs`] is 0; never below it.
    pub lifetime_hard_cap_secs: u64,
    /// Idle without work, seconds (default 3,600; 0 = off): an executor whose session had
    /// no turn and no connection request for this long, whatever its status (e.g. waiting
    /// on a `function_call`), takes a no-work lease and is stopped
    /// ([`crate::decision::StopReason::NoWork`]) when the lease is due — after
    /// [`Policy::shutdown_grace_secs`] — unless new work arrived; a running turn is work.
    /// Evidence of work: the session's `last_active_at`, the noted connection request and
    /// the executor's start.
    pub no_work_secs: u64,
    /// At most this many replacements of an environment's executor for a missed connect
    /// deadline within [`Policy::replacement_window_secs`] (default 3; 0 = no cap); then
    /// the executor that did not connect is stopped, nothing new starts until the window
    /// frees, and the decision is `reconcile` with the evidence.
    pub max_replacements: u32,
    /// The replacement cap's window, seconds (default 3,600).
    pub replacement_window_secs: u64,
    /// Where the executor key may be sent: the `remote_url` of a session must use TLS
    /// (`wss`, the API's WebSocket URL, or `https`) with a host matching one entry, or
    /// else no compute starts (`reconcile`, `remote_url_not_allowed`). An entry is a host
    /// (`api.openai.com`), a wildcard for its subdomains (`*.example.com`), or
    /// `scheme://host` to allow exactly that scheme for that host (local mode:
    /// `http://127.0.0.1`). Default: `["api.openai.com"]`.
    ///
    /// Parsed once, when the policy is built or read ([`crate::remote_url::Allowlist`]);
    /// serialised as the list of entries.
    pub remote_url_allowlist: crate::remote_url::Allowlist,
    /// Workspace snapshots kept per environment, newest first (default 1; at least 1: the
    /// latest is what the next generation restores). Older ones are deleted after each
    /// new snapshot.
    #[serde(default = "default_snapshot_keep")]
    pub snapshot_keep: u32,
    /// What a close does with the workspace and its snapshots: `delete`, or `retain` for D
    /// days (default `retain:7`), after which the sweeper deletes them.
    #[serde(default)]
    pub close_workspace: crate::workspace::CloseWorkspace,
    /// Concurrency cap per deployment: at most this many environments
    /// hold an executor at once (default 0 = off). A start beyond it waits
    /// ([`crate::decision::Reason::CapacityLimit`]) and is retried with
    /// [`Policy::capacity_retry_secs`] until a slot frees. Enforced by the registry with a
    /// conditional write (a deployment-wide counter and one holder per environment,
    /// changed in one transaction), never by counting before the start.
    #[serde(default)]
    pub max_executors: u32,
    /// When a self-hosted session's executor is first started (seeds 000 and
    /// 004): on its first `environment_connection` requirement (the default), or already
    /// on `agent.session.created` ([`ProvisionOn::Created`], opt-in). The idle rules are
    /// the same either way.
    #[serde(default)]
    pub provision_on: ProvisionOn,
    /// How long a start waits for the snapshot it would restore to leave `pending`,
    /// seconds since the snapshot was taken (default 14,400 = 4 h: "this can take several
    /// hours", Amazon EBS User Guide, "Create Amazon EBS snapshots"). Past it the start is
    /// a failed start (`snapshot_pending_too_long`, counted and backed off like any).
    #[serde(default = "default_snapshot_wait_secs")]
    pub snapshot_wait_secs: u64,
    /// Delay between two looks at a `pending` snapshot a start waits for, seconds
    /// (default 30; ≥ 1).
    #[serde(default = "default_snapshot_recheck_secs")]
    pub snapshot_recheck_secs: u64,
}

/// When a deployment starts a session's first executor (`PROVISION_ON`, `serve
/// --provision-on`). Seed 000: an application "can start compute after creating a
/// session", or wait "until input needs an environment connection".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProvisionOn {
    /// Webhook-managed: only a current `environment_connection` required action starts
    /// compute (`agent.session.created` is dropped at the intake). The default.
    #[default]
    ConnectionRequest,
    /// Application-managed: `agent.session.created` of a self-hosted session is kept too,
    /// and the worker starts the executor then if the session (read again) is self-hosted,
    /// owned, not failed, not deleted and has no compute. A connection request later is
    /// handled as always.
    Created,
}

impl ProvisionOn {
    /// The setting's spelling: `connection_request` or `created`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConnectionRequest => "connection_request",
            Self::Created => "created",
        }
    }
}

impl std::str::FromStr for ProvisionOn {
    type Err = &'static str;

    /// `connection_request` (also `action_required`) or `created`, any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "connection_request" | "action_required" => Ok(Self::ConnectionRequest),
            "created" => Ok(Self::Created),
            _ => Err("`connection_request` or `created`"),
        }
    }
}

impl std::fmt::Display for ProvisionOn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn default_snapshot_keep() -> u32 {
    1
}

/// Default of [`Policy::snapshot_wait_secs`]: 4 h, seconds.
pub const DEFAULT_SNAPSHOT_WAIT_SECS: u64 = 14_400;
/// Default of [`Policy::snapshot_recheck_secs`], seconds.
pub const DEFAULT_SNAPSHOT_RECHECK_SECS: u64 = 30;

fn default_snapshot_wait_secs() -> u64 {
    DEFAULT_SNAPSHOT_WAIT_SECS
}

fn default_snapshot_recheck_secs() -> u64 {
    DEFAULT_SNAPSHOT_RECHECK_SECS
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            connect_deadline_secs: 180,
            shutdown_grace_secs: 300,
            start_retry_base_secs: 15,
            start_retry_max_secs: 600,
            max_start_attempts: 5,
            recheck_secs: 10,
            uncertain_retry_secs: 15,
            visibility_window_secs: 300,
            start_failing_cooldown_secs: 3_600,
            max_lifetime_secs: 28_800,
            lifetime_hard_cap_secs: 32_400,
            no_work_secs: 3_600,
            max_replacements: 3,
            replacement_window_secs: 3_600,
            remote_url_allowlist: vec![DEFAULT_REMOTE_URL_HOST].into(),
            snapshot_keep: 1,
            close_workspace: crate::workspace::CloseWorkspace::default(),
            max_executors: 0,
            provision_on: ProvisionOn::ConnectionRequest,
            snapshot_wait_secs: DEFAULT_SNAPSHOT_WAIT_SECS,
            snapshot_recheck_secs: DEFAULT_SNAPSHOT_RECHECK_SECS,
        }
    }
}

/// The default `remote_url` allowlist entry.
pub const DEFAULT_REMOTE_URL_HOST: &str = "api.openai.com";

/// Longest delay between two looks of a start waiting for an executor slot, seconds
/// ([`Policy::capacity_retry_secs`]): a slot freed at the cap is taken within this, well
/// inside the Agents API's 300 s wait for the executor's connection (agents-api.md).
pub const CAPACITY_RETRY_MAX_SECS: u64 = 30;

impl Policy {
    /// Delay before the next look of a start that found the executor cap reached
    /// ([`Policy::max_executors`]), seconds: [`Policy::recheck_secs`] at first, then a
    /// quarter of the time the connection request has waited (`waited_secs`), at most
    /// [`CAPACITY_RETRY_MAX_SECS`] — a backoff that keeps waiting environments from
    /// polling the registry in lockstep while never sleeping through most of the API's
    /// 300 s connection wait. Always ≥ 1.
    pub fn capacity_retry_secs(&self, waited_secs: u64) -> u64 {
        let first = self.recheck_secs.clamp(1, CAPACITY_RETRY_MAX_SECS);
        (waited_secs / 4).clamp(first, CAPACITY_RETRY_MAX_SECS)
    }

    /// Delay before start attempt `attempts + 1`, in seconds: base × 2^(attempts-1), capped.
    pub fn start_backoff_secs(&self, attempts: u32) -> u64 {
        let exp = attempts.saturating_sub(1).min(32);
        self.start_retry_base_secs
            .saturating_mul(1u64 << exp)
            .min(self.start_retry_max_secs)
    }
}

/// One environment's observed state: the whole input of [`crate::decide`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Observed {
    /// What made the controller look.
    pub trigger: Trigger,
    /// The environment being decided (from the event, the session or the record).
    pub environment_id: EnvironmentId,
    /// The session, retrieved just now.
    pub session: SessionView,
    /// The `agent.environment` status, when it was read (`connected` means the executor
    /// is attached); a failed read is missing evidence.
    pub environment_status: EnvironmentRead,
    /// The controller's record under the effect key, if one exists.
    pub record: Option<Record>,
    /// The provider's instances tagged for the environment.
    pub inventory: Inventory,
    /// The latest turn, when fetched.
    pub latest_turn: Option<TurnEvidence>,
    /// This deployment's ownership filter.
    pub filter: OwnershipFilter,
    /// Timing rules.
    pub policy: Policy,
    /// Unix seconds.
    pub now: u64,
    /// For [`Trigger::TimeoutReported`]: the turns were read and no turn matches the
    /// submission (it never started). `false` when not read or when found.
    #[serde(default)]
    pub turn_not_found: bool,
    /// The session's latest turn was read for this decision: `latest_turn` is
    /// the answer (`None`: the session has no turn). `false` when not read or when the
    /// read failed. Every stop of an idle session — its lease, the maximum lifetime, the
    /// no-work lease — needs it: without a turn read nothing is stopped (a queued turn
    /// may be about to start, agents-api.md), except past the hard lifetime cap, where
    /// the stop is recorded with evidence for an owner.
    #[serde(default)]
    pub turns_read: bool,
    /// The state of the record's latest snapshot, what a start would restore:
    /// read by the worker when the decision asks for it before a start
    /// ([`crate::decision::Reason::SnapshotNotRead`]); [`crate::workspace::SnapshotRead::NotRead`] otherwise.
    #[serde(default)]
    pub snapshot: crate::workspace::SnapshotRead,
}
