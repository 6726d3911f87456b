//! The terminal record of a close (F9; seed 001: "cleanup needs an
//! application-owned terminal record"): written **once**, at the end of the close, as its
//! own stored item ([`crate::ports::Registry::put_terminal`]), and read back by
//! `sandboxctl explain`. It is assembled from what the close confirmed — the
//! `session_deleted` and `compute_stopped` receipts, the close's `workspace_closed`
//! receipt, the record's evidence — at the moment the record is marked closed, so later
//! history retention (audit entries and receipts expire) or a lost receipt
//! cannot change the answer.
//!
//! **Retention:** the terminal record never expires. It carries no `expires_at` (DynamoDB)
//! and no history prune deletes it (SQLite): it is the proof that every resource of the
//! session was accounted for, kept as long as the record it closes.
//!
//! Fields (seed 001's record, with the evidence behind each):
//! - `session_deleted` — the Agents API session was deleted (`DELETE` answered, or 404);
//! - `provider_instance_id` — the last compute the environment ran, if any;
//! - `compute_stopped` — the provider read it back stopped (ECS `DescribeTasks`
//!   `lastStatus` `STOPPED`, or gone), or nothing was ever started;
//! - `executor_revoked` + `executor_credential` — always `false`: the executor key is one
//!   restricted key (`api.agents.environments.connect` only) shared by every executor of
//!   the deployment, and the Agents API has no per-environment credential to revoke
//!   (agents-api.md). `executor_credential` tells the operator what to rotate and where;
//! - `workspace_disposition` — what the close did with the files;
//! - `effect_reconciliation` — `not_needed` without evidence, else the latest resolution's
//!   effect (`observed`, `compensated`, `not_needed`, `abandoned`); a close never ends with
//!   an open question (it waits for `resolve`), unless forced;
//! - `forced` — the close was forced past open evidence (`sandboxctl close --force`), which
//!   was then resolved `abandoned` by the operator named in `forced_by`.

use crate::receipt::{Receipt, ReceiptKind};
use sandbox_core::ids::{EffectKey, EnvironmentId, InstanceId, SessionId};
use sandbox_core::record::Record;
use serde::{Deserialize, Serialize};

/// The note of a resolution made by `sandboxctl close --force` (its `note` starts with
/// this): the terminal record's `forced` is read from it.
pub const FORCED_CLOSE_NOTE: &str = "forced close";

/// The session deletion, as the close confirmed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionDeletion {
    /// Whether a `session_deleted` receipt exists.
    pub confirmed: bool,
    /// When, Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<u64>,
}

/// The compute stop, as the provider read it back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeStop {
    /// Whether the stop is confirmed (read back stopped, or nothing was ever started).
    pub confirmed: bool,
    /// `stopped` (read back), `nothing started`, or `not confirmed`.
    pub read_back: String,
    /// When the stop was read back, Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<u64>,
    /// The compute read back stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<InstanceId>,
    /// The stopped generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// Why it was stopped (`closed`, `lease_expired`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What the operator must do about the executor credential.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutorCredential {
    /// Always `false` (module docs).
    pub revoked: bool,
    /// Why it was not revoked.
    pub why: String,
    /// Where the key lives ([`crate::ControllerConfig::executor_key_location`]).
    pub location: String,
    /// What to do, in one sentence.
    pub rotate: String,
}

/// The terminal record (module docs). Times in Unix seconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalRecord {
    /// The effect key (the stored item's key).
    pub effect_key: EffectKey,
    /// The session.
    pub session_id: SessionId,
    /// The environment.
    pub environment_id: EnvironmentId,
    /// The deployment that closed it.
    pub deployment: String,
    /// When the close ended (the record was marked closed).
    pub closed_at: u64,
    /// The session deletion.
    pub session_deleted: SessionDeletion,
    /// The last compute, if any ever ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_instance_id: Option<InstanceId>,
    /// The compute stop.
    pub compute_stopped: ComputeStop,
    /// Always `false`: see [`TerminalRecord::executor_credential`].
    pub executor_revoked: bool,
    /// What to rotate and where.
    pub executor_credential: ExecutorCredential,
    /// What the close did with the files (`deleted`, `snapshot <id>`, `none`).
    pub workspace_disposition: String,
    /// Until when the retained snapshots are kept, Unix seconds (`retain:<days>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_retained_until: Option<u64>,
    /// `observed`, `compensated`, `not_needed`, `abandoned` (module docs).
    pub effect_reconciliation: String,
    /// Whether the close was forced past open evidence.
    pub forced: bool,
    /// Who forced it, when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forced_by: Option<String>,
}

impl TerminalRecord {
    /// Assembles the terminal record of `record` (about to be marked closed at `now`) from
    /// its `receipts` (oldest first). Pure.
    pub fn assemble(
        record: &Record,
        receipts: &[Receipt],
        deployment: &str,
        executor_key_location: &str,
        now: u64,
    ) -> Self {
        let deleted_at = receipts.iter().rev().find_map(|r| match &r.kind {
            ReceiptKind::SessionDeleted { .. } => Some(r.at),
            _ => None,
        });
        let stopped = receipts.iter().rev().find_map(|r| match &r.kind {
            ReceiptKind::ComputeStopped {
                instance_id,
                generation,
                reason,
                ..
            } => Some((r.at, instance_id.clone(), *generation, reason.clone())),
            _ => None,
        });
        let nothing_started = record.instance.is_none() && record.generation.0 == 0;
        let compute_stopped = match stopped {
            Some((at, instance_id, generation, reason)) => ComputeStop {
                confirmed: true,
                read_back: "stopped".into(),
                at: Some(at),
                instance_id: Some(instance_id),
                generation: Some(generation),
                reason: Some(reason),
            },
            None => ComputeStop {
                confirmed: nothing_started,
                read_back: if nothing_started {
                    "nothing started".into()
                } else {
                    "not confirmed".into()
                },
                at: None,
                instance_id: None,
                generation: None,
                reason: None,
            },
        };
        let (workspace_disposition, workspace_retained_until) = receipts
            .iter()
            .rev()
            .find_map(|r| match &r.kind {
                ReceiptKind::WorkspaceClosed {
                    workspace,
                    retained_until,
                    ..
                } => Some((workspace.to_string(), *retained_until)),
                _ => None,
            })
            .or_else(|| {
                receipts.iter().rev().find_map(|r| match &r.kind {
                    ReceiptKind::ComputeStopped { workspace, .. } => {
                        Some((workspace.to_string(), None))
                    }
                    _ => None,
                })
            })
            .unwrap_or_else(|| ("none".into(), None));
        let latest = record
            .evidence
            .iter()
            .rev()
            .find_map(|e| e.resolution.as_ref());
        let effect_reconciliation = if record.open_evidence().next().is_some() {
            "unknown".to_owned()
        } else {
            latest
                .map_or("not_needed", |x| x.effect.as_str())
                .to_owned()
        };
        let forced_by = record
            .evidence
            .iter()
            .filter_map(|e| e.resolution.as_ref())
            .filter(|x| {
                x.note
                    .as_deref()
                    .is_some_and(|n| n.starts_with(FORCED_CLOSE_NOTE))
            })
            .map(|x| x.by.clone())
            .next_back();
        Self {
            effect_key: record.environment_id.effect_key(),
            session_id: record.session_id.clone(),
            environment_id: record.environment_id.clone(),
            deployment: deployment.to_owned(),
            closed_at: now,
            session_deleted: SessionDeletion {
                confirmed: deleted_at.is_some(),
                at: deleted_at,
            },
            provider_instance_id: record.instance.as_ref().map(|i| i.instance_id.clone()),
            compute_stopped,
            executor_revoked: false,
            executor_credential: ExecutorCredential {
                revoked: false,
                why: "one restricted executor key (api.agents.environments.connect only) is \
                      shared by every executor of the deployment; the Agents API has no \
                      per-environment credential to revoke"
                    .into(),
                location: executor_key_location.to_owned(),
                rotate: "if this executor's sandbox may have exposed the key (agent-generated \
                         code can read CODEX_API_KEY), create a new restricted environment key \
                         (dashboard: Environment keys), store it there, then delete the old key; \
                         otherwise nothing to do"
                    .into(),
            },
            workspace_disposition,
            workspace_retained_until,
            effect_reconciliation,
            forced: forced_by.is_some(),
            forced_by,
        }
    }
}
