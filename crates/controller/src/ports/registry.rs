//! The registry port: records under effect keys, locks and their fences, the delivery
//! ledger, audit entries, receipts, executor slots and terminal records.

use super::PortError;
use crate::receipt::Receipt;
use sandbox_core::ids::{EffectKey, EnvironmentId, SessionId};
use sandbox_core::record::Record;
use serde::{Deserialize, Serialize};
use std::future::Future;

/// The outcome of a conditional write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// Written; the record's version is now the returned value.
    Written(u64),
    /// The condition failed: someone else changed the record first.
    Conflict,
}

/// An append-only audit entry: what was seen, the decision and what was done.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Unix seconds.
    pub at: u64,
    /// The effect key.
    pub effect_key: EffectKey,
    /// The session.
    pub session_id: SessionId,
    /// The trigger, as JSON.
    pub trigger: serde_json::Value,
    /// A summary of the observed state (session status, record, instances).
    pub observed: serde_json::Value,
    /// The decision's outcome (`start`, `schedule-stop`, ...).
    pub outcome: String,
    /// The decision's reason, human-readable.
    pub reason: String,
    /// The effects applied, in order, as JSON.
    pub applied: Vec<serde_json::Value>,
    /// The effect that failed, if one did.
    pub error: Option<String>,
}

/// Proof of a held effect-key lock, carried by every registry write made under it (a
/// fencing token): the registry refuses the write unless `owner` still holds the lock on
/// `key`, unexpired, at the writer's `now`.
///
/// Why: a worker paused past its lease (GC, a stopped process, a slow network) must not
/// overwrite what the next holder decided (a soak found exactly that: a
/// record write landing after the sweeper had released the compute it named).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The effect key the lock is on.
    pub key: EffectKey,
    /// The owner string the lock was taken with (unique per attempt).
    pub owner: String,
}

/// A record prepared for a fenced conditional write, shared by the registry adapters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRecord {
    /// The version the write stores: `expected + 1`, or 1 for a create.
    pub version: u64,
    /// The record with that version, as JSON.
    pub json: String,
}

impl StoredRecord {
    /// Checks that `record` belongs to the fence's effect key and encodes it at the next
    /// version after `expected` (`None`: a create, version 1).
    ///
    /// # Errors
    /// A permanent [`PortError`] (`registry`, `operation`) for a record of another effect
    /// key, a version overflow or a record that cannot be encoded.
    pub fn encode(
        fence: &Fence,
        record: &Record,
        expected: Option<u64>,
        operation: &'static str,
    ) -> Result<Self, PortError> {
        const DEP: &str = "registry";
        if record.environment_id.effect_key() != fence.key {
            return Err(PortError::permanent(
                DEP,
                operation,
                "record belongs to another effect key than the lock",
            ));
        }
        let version = match expected {
            None => 1,
            Some(v) => v
                .checked_add(1)
                .ok_or_else(|| PortError::permanent(DEP, operation, "record version overflow"))?,
        };
        let mut stored = record.clone();
        stored.version = version;
        let json = serde_json::to_string(&stored).map_err(|e| {
            PortError::permanent(DEP, operation, format!("record could not be encoded: {e}"))
        })?;
        Ok(Self { version, json })
    }
}

/// What [`Registry::lock`] found when it took the lock, read atomically with the take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Locked {
    /// The record under the key (`None`: no record yet).
    pub record: Option<Record>,
    /// The previous holder did not release cleanly: its lock had expired, or it released
    /// with [`Release::clean`] `false` (a start whose outcome is unknown). Whatever it
    /// started may be unrecorded, so the provider's inventory must be read.
    pub recovered: bool,
}

/// The final write of a decision, applied atomically with the lock's release.
#[derive(Clone, Copy, Debug, Default)]
pub struct Release<'a> {
    /// The record to write and the version it must still have (`None`: no record may
    /// exist), when the decision changed it.
    pub record: Option<(&'a Record, Option<u64>)>,
    /// The decision's audit entry.
    pub audit: Option<&'a AuditEntry>,
    /// A delivery to remember as processed: webhook id and expiry (Unix seconds).
    pub delivery: Option<(&'a str, u64)>,
    /// `true`: the holder knows everything it started is recorded, so the lock is
    /// deleted. `false`: the lock is left expired, so the next holder sees
    /// [`Locked::recovered`] and reads the provider's inventory.
    pub clean: bool,
}

/// What [`Registry::acquire_slot`] did (the executor cap per deployment,
/// [`sandbox_core::observed::Policy::max_executors`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// A slot was taken: the environment's holder written and the deployment's counter
    /// raised by one, in one atomic step.
    Acquired,
    /// The environment holds a slot already (its holder exists): nothing changed. A
    /// replacement or a restart after a failed start reuses the environment's slot.
    Held,
    /// Every slot is taken (the counter is at the cap): nothing changed; start nothing.
    Full,
    /// The fence failed (the lock is lost or expired): nothing changed.
    LockLost,
}

/// What [`Registry::release_slot`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotRelease {
    /// The environment's holder was deleted and the counter lowered by one, atomically.
    Released,
    /// The environment held no slot: nothing changed (a release is idempotent).
    NotHeld,
    /// The fence failed (the lock is lost or expired): nothing changed.
    LockLost,
}

/// One environment holding an executor slot (the sweeper's inventory of slots).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotHolder {
    /// The environment (its effect key is the holder's key).
    pub environment_id: EnvironmentId,
    /// When the slot was taken, Unix seconds.
    pub acquired_at: u64,
}

/// The deployment's executor slots as stored: the counter the cap is checked against and
/// the holders it counts (equal unless something outside the controller changed them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Slots {
    /// The counter (slots in use).
    pub in_use: u64,
    /// Every holder, by environment.
    pub holders: Vec<SlotHolder>,
}

/// The registry: records under effect keys, locks, the delivery ledger, audit and receipts.
///
/// Every record change is a conditional write on the record's `version` *and* on the lock
/// ([`Fence`]); locks are leases with an expiry in Unix seconds and an expired lock counts
/// as absent for [`Registry::lock`] and as lost for every fenced write.
pub trait Registry: Send + Sync + 'static {
    /// The record under `key`, if any.
    fn get(
        &self,
        key: &EffectKey,
    ) -> impl Future<Output = Result<Option<Record>, PortError>> + Send;
    /// The record of the environment `session` owns, if any (for jobs without an
    /// environment id and for deleted sessions).
    fn find_by_session(
        &self,
        session: &SessionId,
    ) -> impl Future<Output = Result<Option<Record>, PortError>> + Send;
    /// Writes `record` (under `fence.key`) if `fence.owner` holds the lock with
    /// `until >= now` and the stored version equals `expected_version` (`None`: no record
    /// may exist). The stored version becomes `expected_version + 1` (or 1). Either
    /// condition failing is [`Write::Conflict`] and changes nothing.
    ///
    /// # Errors
    /// A permanent [`PortError`] when `record` belongs to another effect key than the fence.
    fn put(
        &self,
        fence: &Fence,
        now: u64,
        record: &Record,
        expected_version: Option<u64>,
    ) -> impl Future<Output = Result<Write, PortError>> + Send;
    /// Every record, closed ones included (operators' views: `sandboxctl status`,
    /// `explain`).
    fn list(&self) -> impl Future<Output = Result<Vec<Record>, PortError>> + Send;
    /// Every record that is not closed, by environment id (the sweep's read): its
    /// cost is that of the open records only, never of closed records or
    /// history (DynamoDB: a `Query` per shard of a sparse index; SQLite: an index on
    /// the open rows). It may lag the latest writes (DynamoDB GSIs are eventually
    /// consistent): callers re-read a record consistently under its lock before acting
    /// on it (docs/ARCHITECTURE.md principle 7).
    fn list_open(&self) -> impl Future<Output = Result<Vec<Record>, PortError>> + Send;
    /// Takes the lock on `key` for `owner` until `until` (Unix seconds) if it is free or
    /// expired at `now` (held while `now <= until`), and reads the record in the same
    /// atomic step. `None`: another owner holds it.
    fn lock(
        &self,
        key: &EffectKey,
        owner: &str,
        until: u64,
        now: u64,
    ) -> impl Future<Output = Result<Option<Locked>, PortError>> + Send;
    /// Applies `release` and releases the lock, all or nothing, if `fence.owner` still
    /// holds the lock at `now` and the record (if any) still has the expected version.
    /// Returns `false` when either condition failed: nothing was written, the lock left
    /// as it was (it expires on its own). One remote call (DynamoDB: one
    /// `TransactWriteItems` or `UpdateItem`; SQLite: one transaction).
    fn release(
        &self,
        fence: &Fence,
        now: u64,
        release: Release<'_>,
    ) -> impl Future<Output = Result<bool, PortError>> + Send;
    /// Whether `webhook_id` was processed already (ledger entries expire at their
    /// `expires_at`; an expired entry reads as absent).
    fn seen_delivery(
        &self,
        webhook_id: &str,
        now: u64,
    ) -> impl Future<Output = Result<bool, PortError>> + Send;
    /// Records `webhook_id` as processed until `expires_at` (Unix seconds), outside any
    /// lock (deliveries that name no environment).
    fn remember_delivery(
        &self,
        webhook_id: &str,
        expires_at: u64,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Appends an audit entry.
    fn audit(&self, entry: &AuditEntry) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Stores a receipt.
    fn receipt(&self, receipt: &Receipt) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Receipts of one effect key, oldest first.
    fn receipts(
        &self,
        key: &EffectKey,
    ) -> impl Future<Output = Result<Vec<Receipt>, PortError>> + Send;
    /// Takes an executor slot for the environment of `fence.key` under the deployment's
    /// cap `cap` (≥ 1), all or nothing, if `fence.owner` holds the lock
    /// at `now`: writes the environment's holder (absent before) and raises the
    /// deployment's counter by one (below `cap` before). Never counts live compute first:
    /// the conditional write is what makes concurrent workers unable to exceed the cap.
    /// One remote call (DynamoDB: one `TransactWriteItems` of a `ConditionCheck` on the
    /// lock, a `Put` of the holder with `attribute_not_exists`, an `Update` `ADD` on the
    /// counter with `in_use < :cap`; SQLite: one transaction).
    fn acquire_slot(
        &self,
        fence: &Fence,
        now: u64,
        cap: u32,
    ) -> impl Future<Output = Result<Slot, PortError>> + Send;
    /// Gives back the environment's executor slot, all or nothing, if `fence.owner` holds
    /// the lock at `now`: deletes the holder (present before) and lowers the counter by one
    /// (never below zero). Called only once the environment has no compute: a stop read
    /// back `STOPPED`, a failed start, a close. One remote call.
    fn release_slot(
        &self,
        fence: &Fence,
        now: u64,
    ) -> impl Future<Output = Result<SlotRelease, PortError>> + Send;
    /// The counter and every holder (the sweeper's inventory; linear in the holders,
    /// read consistently).
    fn slots(&self) -> impl Future<Output = Result<Slots, PortError>> + Send;
    /// Stores the terminal record of a close under `terminal.effect_key`, **once**
    /// ([`crate::terminal`]): `true` when written, `false` when one is already stored
    /// (nothing changes: the first close's answer stands). Its own item, outside the record
    /// and the history: it never expires (DynamoDB: no `expires_at`; SQLite: no prune). One
    /// conditional write (DynamoDB: `PutItem` with `attribute_not_exists(pk)`; SQLite:
    /// `INSERT ... ON CONFLICT DO NOTHING`).
    fn put_terminal(
        &self,
        terminal: &crate::terminal::TerminalRecord,
    ) -> impl Future<Output = Result<bool, PortError>> + Send;
    /// The terminal record stored for `key`, if a close wrote one.
    fn terminal(
        &self,
        key: &EffectKey,
    ) -> impl Future<Output = Result<Option<crate::terminal::TerminalRecord>, PortError>> + Send;
}

/// How long audit entries and receipts are kept by default, seconds (30 days):
/// DynamoDB writes them with `expires_at` = `at` + this (TTL), SQLite prunes them
/// after every local sweep, the twin reads them as absent. Every adapter reads an entry
/// with `at + retention <= now` as absent, whether or not it was deleted yet
/// ([`crate::contract::registry_history_retention_contract`]). Terminal records never
/// expire.
pub const DEFAULT_HISTORY_RETENTION_SECS: u64 = 30 * 86_400;
