//! The registry twin: records with conditional writes on `version`, locks with an expiry,
//! the delivery ledger, the audit trail and receipts, in memory (DynamoDB semantics as
//! `sandbox-aws` uses them).

use sandbox_controller::ports::{AuditEntry, PortError, Receipt, Registry, Write};
use sandbox_core::ids::{EffectKey, SessionId};
use sandbox_core::record::Record;
use std::collections::BTreeMap;
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
}

/// An in-memory registry. Clones share the same state.
#[derive(Clone, Debug, Default)]
pub struct TwinRegistry {
    state: Arc<Mutex<State>>,
}

impl TwinRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
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
}

impl Registry for TwinRegistry {
    async fn get(&self, key: &EffectKey) -> Result<Option<Record>, PortError> {
        Ok(self.record(key))
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
        record: &Record,
        expected_version: Option<u64>,
    ) -> Result<Write, PortError> {
        let key = record.environment_id.effect_key();
        let mut s = self.state();
        if s.records.get(&key).map(|r| r.version) != expected_version {
            return Ok(Write::Conflict);
        }
        let version = expected_version.map_or(1, |v| v + 1);
        let mut stored = record.clone();
        stored.version = version;
        s.records.insert(key, stored);
        Ok(Write::Written(version))
    }

    async fn list(&self) -> Result<Vec<Record>, PortError> {
        Ok(self.records())
    }

    async fn lock(
        &self,
        key: &EffectKey,
        owner: &str,
        until: u64,
        now: u64,
    ) -> Result<bool, PortError> {
        let mut s = self.state();
        let free = s
            .locks
            .get(key)
            .is_none_or(|l| l.until < now || l.owner == owner);
        if free {
            s.locks.insert(
                key.clone(),
                HeldLock {
                    owner: owner.to_owned(),
                    until,
                },
            );
        }
        Ok(free)
    }

    async fn unlock(&self, key: &EffectKey, owner: &str) -> Result<(), PortError> {
        let mut s = self.state();
        if s.locks.get(key).is_some_and(|l| l.owner == owner) {
            s.locks.remove(key);
        }
        Ok(())
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
        self.state().receipts.push(receipt.clone());
        Ok(())
    }

    async fn receipts(&self, key: &EffectKey) -> Result<Vec<Receipt>, PortError> {
        Ok(self
            .state()
            .receipts
            .iter()
            .filter(|r| &r.effect_key == key)
            .cloned()
            .collect())
    }
}
