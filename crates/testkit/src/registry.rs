//! The registry twin: records with conditional writes on `version`, locks with an expiry,
//! the delivery ledger, the audit trail and receipts, in memory (DynamoDB semantics as
//! `sandbox-aws` uses them).
//!
//! Reads cost what DynamoDB's would: the open records are kept in their own
//! index (the sparse `by_open` index), receipts per effect key (one partition), and
//! [`TwinRegistry::items_read`] counts every item a read examined, so a test can show
//! that the sweep's reads do not grow with closed records or history.
//!
//! History expires as on DynamoDB: a receipt with `at` + the history
//! retention ([`TwinRegistry::with_history_retention`], default
//! [`DEFAULT_HISTORY_RETENTION_SECS`]) `<= now` of the registry's clock reads as absent,
//! whether or not TTL deleted it yet; a read still examines it (TTL deletes late, and
//! DynamoDB filters after reading). The inspection views ([`TwinRegistry::all_receipts`],
//! [`TwinRegistry::audit_entries`]) keep everything ever written.

use sandbox_controller::ports::{
    AuditEntry, Clock, DEFAULT_HISTORY_RETENTION_SECS, Fence, Locked, PortError, Receipt, Registry,
    Release, Slot, SlotHolder, SlotRelease, Slots, SystemClock, Write,
};
use sandbox_controller::terminal::TerminalRecord;
use sandbox_core::ids::{EffectKey, SessionId};
use sandbox_core::record::{Record, RecordStatus};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

/// A held lock (inspection view).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLock {
    /// The owner string the worker passed.
    pub owner: String,
    /// Held until, Unix seconds (expired once `until < now`).
    pub until: u64,
}

#[derive(Debug, Default)]
struct State {
    records: BTreeMap<EffectKey, Record>,
    locks: BTreeMap<EffectKey, HeldLock>,
    /// webhook id → expires at (Unix seconds).
    ledger: BTreeMap<String, u64>,
    audit: Vec<AuditEntry>,
    receipts: Vec<Receipt>,
    /// Receipts by effect key (the partition a `Query` reads).
    receipts_by_key: BTreeMap<EffectKey, Vec<Receipt>>,
    /// The effect keys of records that are not closed (the sparse index).
    open: BTreeSet<EffectKey>,
    /// Items examined by reads so far (records, receipts, slot items).
    items_read: u64,
    /// Executor slots: holders by effect key (acquired at) and the
    /// deployment's counter, changed together under the state's mutex (one transaction).
    slot_holders: BTreeMap<EffectKey, u64>,
    slots_in_use: u64,
    /// Terminal records of closes: written once, never expire.
    terminals: BTreeMap<EffectKey, TerminalRecord>,
}

impl State {
    /// Whether `fence.owner` holds the lock at `now` (held while `now <= until`).
    fn holds(&self, fence: &Fence, now: u64) -> bool {
        self.locks
            .get(&fence.key)
            .is_some_and(|l| l.owner == fence.owner && l.until >= now)
    }

    fn version(&self, key: &EffectKey) -> Option<u64> {
        self.records.get(key).map(|r| r.version)
    }

    /// Stores `record` at `expected + 1` (or 1); the caller checked the condition.
    fn store(&mut self, record: &Record, expected: Option<u64>) -> u64 {
        let version = expected.map_or(1, |v| v + 1);
        let mut stored = record.clone();
        stored.version = version;
        let key = record.environment_id.effect_key();
        if record.status == RecordStatus::Closed {
            self.open.remove(&key);
        } else {
            self.open.insert(key.clone());
        }
        self.records.insert(key, stored);
        version
    }
}

fn check_key(fence: &Fence, record: &Record) -> Result<(), PortError> {
    if record.environment_id.effect_key() == fence.key {
        Ok(())
    } else {
        Err(PortError::permanent(
            "registry",
            "put",
            "record belongs to another effect key than the lock",
        ))
    }
}

/// An in-memory registry. Clones share the same state.
#[derive(Clone)]
pub struct TwinRegistry {
    state: Arc<Mutex<State>>,
    /// What "now" is for history expiry (the world's clock in a simulation).
    clock: Arc<dyn Clock>,
    /// Seconds receipts are kept (`at` + this > now reads).
    history_retention_secs: u64,
}

impl std::fmt::Debug for TwinRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TwinRegistry")
            .field("history_retention_secs", &self.history_retention_secs)
            .finish_non_exhaustive()
    }
}

impl Default for TwinRegistry {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            clock: Arc::new(SystemClock),
            history_retention_secs: DEFAULT_HISTORY_RETENTION_SECS,
        }
    }
}

impl TwinRegistry {
    /// An empty registry on the system clock with the default history retention.
    pub fn new() -> Self {
        Self::default()
    }

    /// History read against `clock` (a simulation's clock) instead of the system's.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Keeps receipts for `secs` seconds after their `at` (older ones read as absent).
    pub fn with_history_retention(mut self, secs: u64) -> Self {
        self.history_retention_secs = secs;
        self
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The record under `key`, if any (no call counted, no fault: inspection).
    pub fn record(&self, key: &EffectKey) -> Option<Record> {
        self.state().records.get(key).cloned()
    }

    /// Every record, by effect key.
    pub fn records(&self) -> Vec<Record> {
        self.state().records.values().cloned().collect()
    }

    /// The lock on `key`, if one was taken and not released (it may have expired).
    pub fn lock_of(&self, key: &EffectKey) -> Option<HeldLock> {
        self.state().locks.get(key).cloned()
    }

    /// The audit trail, oldest first.
    pub fn audit_entries(&self) -> Vec<AuditEntry> {
        self.state().audit.clone()
    }

    /// Every receipt, oldest first.
    pub fn all_receipts(&self) -> Vec<Receipt> {
        self.state().receipts.clone()
    }

    /// Items examined by the registry's reads so far (a record, a receipt, a slot item
    /// each; a lock or a `get` reads one item), as DynamoDB would count them for the
    /// layout in `sandbox_aws::dynamo_registry`.
    pub fn items_read(&self) -> u64 {
        self.state().items_read
    }

    /// The executor slots' counter (inspection).
    pub fn slots_in_use(&self) -> u64 {
        self.state().slots_in_use
    }

    /// Sets the executor slots' counter behind the controller's back (a drift to repair,
    /// for tests).
    pub fn set_slots_in_use(&self, in_use: u64) {
        self.state().slots_in_use = in_use;
    }
}

impl Registry for TwinRegistry {
    async fn get(&self, key: &EffectKey) -> Result<Option<Record>, PortError> {
        let mut s = self.state();
        s.items_read += 1;
        Ok(s.records.get(key).cloned())
    }

    async fn find_by_session(&self, session: &SessionId) -> Result<Option<Record>, PortError> {
        Ok(self
            .state()
            .records
            .values()
            .find(|r| &r.session_id == session)
            .cloned())
    }

    async fn put(
        &self,
        fence: &Fence,
        now: u64,
        record: &Record,
        expected_version: Option<u64>,
    ) -> Result<Write, PortError> {
        check_key(fence, record)?;
        let mut s = self.state();
        if !s.holds(fence, now) || s.version(&fence.key) != expected_version {
            return Ok(Write::Conflict);
        }
        Ok(Write::Written(s.store(record, expected_version)))
    }

    async fn list(&self) -> Result<Vec<Record>, PortError> {
        let mut s = self.state();
        s.items_read += s.records.len() as u64;
        Ok(s.records.values().cloned().collect())
    }

    async fn list_open(&self) -> Result<Vec<Record>, PortError> {
        let mut s = self.state();
        s.items_read += s.open.len() as u64;
        let mut out: Vec<Record> = s
            .open
            .iter()
            .filter_map(|k| s.records.get(k).cloned())
            .collect();
        out.sort_by(|a, b| a.environment_id.cmp(&b.environment_id));
        Ok(out)
    }

    async fn lock(
        &self,
        key: &EffectKey,
        owner: &str,
        until: u64,
        now: u64,
    ) -> Result<Option<Locked>, PortError> {
        let mut s = self.state();
        s.items_read += 1;
        let previous = s.locks.get(key);
        if previous.is_some_and(|l| l.until >= now) {
            return Ok(None);
        }
        let recovered = previous.is_some();
        s.locks.insert(
            key.clone(),
            HeldLock {
                owner: owner.to_owned(),
                until,
            },
        );
        Ok(Some(Locked {
            record: s.records.get(key).cloned(),
            recovered,
        }))
    }

    async fn release(
        &self,
        fence: &Fence,
        now: u64,
        release: Release<'_>,
    ) -> Result<bool, PortError> {
        if let Some((record, _)) = release.record {
            check_key(fence, record)?;
        }
        let mut s = self.state();
        if !s.holds(fence, now) {
            return Ok(false);
        }
        if let Some((record, expected)) = release.record {
            if s.version(&fence.key) != expected {
                return Ok(false);
            }
            s.store(record, expected);
        }
        if let Some(entry) = release.audit {
            s.audit.push(entry.clone());
        }
        if let Some((id, expires_at)) = release.delivery {
            s.ledger.insert(id.to_owned(), expires_at);
        }
        if release.clean {
            s.locks.remove(&fence.key);
        } else if let Some(lock) = s.locks.get_mut(&fence.key) {
            // Left expired: the next holder sees `recovered`.
            lock.until = 0;
        }
        Ok(true)
    }

    async fn seen_delivery(&self, webhook_id: &str, now: u64) -> Result<bool, PortError> {
        Ok(self
            .state()
            .ledger
            .get(webhook_id)
            .is_some_and(|expires| *expires >= now))
    }

    async fn remember_delivery(&self, webhook_id: &str, expires_at: u64) -> Result<(), PortError> {
        self.state()
            .ledger
            .insert(webhook_id.to_owned(), expires_at);
        Ok(())
    }

    async fn audit(&self, entry: &AuditEntry) -> Result<(), PortError> {
        self.state().audit.push(entry.clone());
        Ok(())
    }

    async fn receipt(&self, receipt: &Receipt) -> Result<(), PortError> {
        let mut s = self.state();
        s.receipts.push(receipt.clone());
        s.receipts_by_key
            .entry(receipt.effect_key.clone())
            .or_default()
            .push(receipt.clone());
        Ok(())
    }

    async fn receipts(&self, key: &EffectKey) -> Result<Vec<Receipt>, PortError> {
        let now = self.clock.now();
        let mut s = self.state();
        let all = s.receipts_by_key.get(key).cloned().unwrap_or_default();
        s.items_read += all.len() as u64;
        Ok(all
            .into_iter()
            .filter(|r| r.at.saturating_add(self.history_retention_secs) > now)
            .collect())
    }
    async fn acquire_slot(&self, fence: &Fence, now: u64, cap: u32) -> Result<Slot, PortError> {
        let mut s = self.state();
        if !s.holds(fence, now) {
            return Ok(Slot::LockLost);
        }
        if s.slot_holders.contains_key(&fence.key) {
            return Ok(Slot::Held);
        }
        if s.slots_in_use >= u64::from(cap) {
            return Ok(Slot::Full);
        }
        s.slot_holders.insert(fence.key.clone(), now);
        s.slots_in_use += 1;
        Ok(Slot::Acquired)
    }

    async fn release_slot(&self, fence: &Fence, now: u64) -> Result<SlotRelease, PortError> {
        let mut s = self.state();
        if !s.holds(fence, now) {
            return Ok(SlotRelease::LockLost);
        }
        if s.slot_holders.remove(&fence.key).is_none() {
            return Ok(SlotRelease::NotHeld);
        }
        s.slots_in_use = s.slots_in_use.saturating_sub(1);
        Ok(SlotRelease::Released)
    }

    async fn slots(&self) -> Result<Slots, PortError> {
        let mut s = self.state();
        // One partition: the counter and the holders.
        s.items_read += 1 + s.slot_holders.len() as u64;
        Ok(Slots {
            in_use: s.slots_in_use,
            holders: s
                .slot_holders
                .iter()
                .filter_map(|(k, at)| {
                    Some(SlotHolder {
                        environment_id: k.environment_id()?,
                        acquired_at: *at,
                    })
                })
                .map(|h| SlotHolder {
                    environment_id: h.environment_id,
                    acquired_at: h.acquired_at,
                })
                .collect(),
        })
    }
    async fn put_terminal(&self, terminal: &TerminalRecord) -> Result<bool, PortError> {
        let mut s = self.state();
        if s.terminals.contains_key(&terminal.effect_key) {
            return Ok(false);
        }
        s.terminals
            .insert(terminal.effect_key.clone(), terminal.clone());
        Ok(true)
    }

    async fn terminal(&self, key: &EffectKey) -> Result<Option<TerminalRecord>, PortError> {
        Ok(self.state().terminals.get(key).cloned())
    }
}
