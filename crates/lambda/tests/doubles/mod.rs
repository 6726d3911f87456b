//! In-memory doubles of the controller's ports and of the Agents API, shared by the tests.
//! Each records what it was asked, and can be told to fail or to answer "busy".

use sandbox_agents_api::{ApiError, PageParams, SessionDeleted, SessionsApi};
use sandbox_controller::ports::{
    AuditEntry, Compute, Fence, Locked, PortError, Receipt, Registry, Release, Slot, SlotHolder,
    SlotRelease, Slots, Started, Write,
};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::decision::StartSpec;
use sandbox_core::environment::EnvironmentInfo;
use sandbox_core::ids::{DeploymentId, EffectKey, EnvironmentId, InstanceId, SessionId};
use sandbox_core::record::Record;
use sandbox_core::session::Session;
use sandbox_core::turn::{Item, Page, Turn};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The fixtures' fixed time: `webhook-timestamp` 1764400000 (events/README.md).
pub const FIXTURE_NOW: u64 = 1_764_400_000;

/// The controller's shared doubles: a stopped clock, and a queue that records sends and
/// visibility changes (`MemoryQueue` in these tests).
pub use sandbox_controller::doubles::{FixedClock, RecordingQueue as MemoryQueue};

/// A registry in memory: records by effect key, locks, the delivery ledger.
#[derive(Clone, Default)]
pub struct MemoryRegistry {
    pub records: Arc<Mutex<HashMap<EffectKey, Record>>>,
    pub ledger: Arc<Mutex<Vec<String>>>,
    /// `lock` answers "taken by someone else".
    pub busy: Arc<AtomicBool>,
    /// Every call fails (a registry outage).
    pub down: Arc<AtomicBool>,
    /// Executor slot holders, by effect key.
    pub slots: Arc<Mutex<Vec<EffectKey>>>,
    /// Terminal records of closes, written once.
    pub terminals: Arc<Mutex<HashMap<EffectKey, sandbox_controller::terminal::TerminalRecord>>>,
}

impl MemoryRegistry {
    fn store(&self, record: &Record, expected: Option<u64>) -> Write {
        let mut records = self.records.lock().unwrap();
        let key = record.environment_id.effect_key();
        if records.get(&key).map(|r| r.version) != expected {
            return Write::Conflict;
        }
        let version = expected.map_or(1, |v| v + 1);
        let mut stored = record.clone();
        stored.version = version;
        records.insert(key, stored);
        Write::Written(version)
    }

    fn up(&self) -> Result<(), PortError> {
        if self.down.load(Ordering::SeqCst) {
            Err(PortError::transient("registry", "call", "injected outage"))
        } else {
            Ok(())
        }
    }
}

impl Registry for MemoryRegistry {
    async fn get(&self, key: &EffectKey) -> Result<Option<Record>, PortError> {
        self.up()?;
        Ok(self.records.lock().unwrap().get(key).cloned())
    }
    async fn find_by_session(&self, session: &SessionId) -> Result<Option<Record>, PortError> {
        self.up()?;
        Ok(self
            .records
            .lock()
            .unwrap()
            .values()
            .find(|r| &r.session_id == session)
            .cloned())
    }
    async fn put(
        &self,
        _: &Fence,
        _: u64,
        record: &Record,
        expected: Option<u64>,
    ) -> Result<Write, PortError> {
        self.up()?;
        Ok(self.store(record, expected))
    }
    async fn list(&self) -> Result<Vec<Record>, PortError> {
        self.up()?;
        Ok(self.records.lock().unwrap().values().cloned().collect())
    }
    async fn list_open(&self) -> Result<Vec<Record>, PortError> {
        self.up()?;
        Ok(self
            .records
            .lock()
            .unwrap()
            .values()
            .filter(|r| r.status != sandbox_core::record::RecordStatus::Closed)
            .cloned()
            .collect())
    }
    /// Lock ownership is not modelled (one worker per test): free unless `busy`.
    async fn lock(
        &self,
        key: &EffectKey,
        _: &str,
        _: u64,
        _: u64,
    ) -> Result<Option<Locked>, PortError> {
        self.up()?;
        if self.busy.load(Ordering::SeqCst) {
            return Ok(None);
        }
        Ok(Some(Locked {
            record: self.records.lock().unwrap().get(key).cloned(),
            recovered: false,
        }))
    }
    async fn release(&self, _: &Fence, _: u64, release: Release<'_>) -> Result<bool, PortError> {
        self.up()?;
        if let Some((record, expected)) = release.record
            && self.store(record, expected) == Write::Conflict
        {
            return Ok(false);
        }
        if let Some((id, _)) = release.delivery {
            self.ledger.lock().unwrap().push(id.to_owned());
        }
        Ok(true)
    }
    async fn seen_delivery(&self, webhook_id: &str, _: u64) -> Result<bool, PortError> {
        self.up()?;
        Ok(self.ledger.lock().unwrap().iter().any(|w| w == webhook_id))
    }
    async fn remember_delivery(&self, webhook_id: &str, _: u64) -> Result<(), PortError> {
        self.up()?;
        self.ledger.lock().unwrap().push(webhook_id.to_owned());
        Ok(())
    }
    async fn audit(&self, _: &AuditEntry) -> Result<(), PortError> {
        self.up()
    }
    async fn receipt(&self, _: &Receipt) -> Result<(), PortError> {
        self.up()
    }
    async fn receipts(&self, _: &EffectKey) -> Result<Vec<Receipt>, PortError> {
        self.up()?;
        Ok(vec![])
    }
    /// One worker per test: the slot is free unless the cap is reached.
    async fn acquire_slot(&self, fence: &Fence, _: u64, cap: u32) -> Result<Slot, PortError> {
        self.up()?;
        let mut slots = self.slots.lock().unwrap();
        if slots.contains(&fence.key) {
            return Ok(Slot::Held);
        }
        if slots.len() >= cap as usize {
            return Ok(Slot::Full);
        }
        slots.push(fence.key.clone());
        Ok(Slot::Acquired)
    }
    async fn release_slot(&self, fence: &Fence, _: u64) -> Result<SlotRelease, PortError> {
        self.up()?;
        let mut slots = self.slots.lock().unwrap();
        let before = slots.len();
        slots.retain(|k| k != &fence.key);
        Ok(if slots.len() < before {
            SlotRelease::Released
        } else {
            SlotRelease::NotHeld
        })
    }
    async fn slots(&self) -> Result<Slots, PortError> {
        self.up()?;
        let slots = self.slots.lock().unwrap();
        Ok(Slots {
            in_use: slots.len() as u64,
            holders: slots
                .iter()
                .filter_map(|k| {
                    Some(SlotHolder {
                        environment_id: k.environment_id()?,
                        acquired_at: 0,
                    })
                })
                .collect(),
        })
    }
    async fn put_terminal(
        &self,
        terminal: &sandbox_controller::terminal::TerminalRecord,
    ) -> Result<bool, PortError> {
        self.up()?;
        let mut t = self.terminals.lock().unwrap();
        if t.contains_key(&terminal.effect_key) {
            return Ok(false);
        }
        t.insert(terminal.effect_key.clone(), terminal.clone());
        Ok(true)
    }
    async fn terminal(
        &self,
        key: &EffectKey,
    ) -> Result<Option<sandbox_controller::terminal::TerminalRecord>, PortError> {
        self.up()?;
        Ok(self.terminals.lock().unwrap().get(key).cloned())
    }
}

/// A provider that starts instances (running at once) and lists them.
#[derive(Clone, Default)]
pub struct MemoryCompute {
    pub instances: Arc<Mutex<Vec<ComputeInstance>>>,
    /// Warm pool members started; the pool lists none, so every refill plans a
    /// full pool.
    pub pool_starts: Arc<Mutex<u64>>,
}

/// Deadlines (`not_after`) are not modelled: the tests' clock is fixed.
/// Keeps no workspace (the defaults: `none`).
impl sandbox_controller::ports::Workspaces for MemoryCompute {}

impl Compute for MemoryCompute {
    async fn start_pool_member(
        &self,
        _: &DeploymentId,
        _: u64,
    ) -> Result<sandbox_controller::ports::PoolMember, PortError> {
        let mut n = self.pool_starts.lock().unwrap();
        *n += 1;
        Ok(sandbox_controller::ports::PoolMember {
            instance_id: sandbox_core::ids::InstanceId::new(format!("pool-{n}")),
            created_at: FIXTURE_NOW,
        })
    }

    async fn start(
        &self,
        spec: &StartSpec,
        _: &DeploymentId,
        _: u64,
    ) -> Result<Started, PortError> {
        let mut instances = self.instances.lock().unwrap();
        let instance = ComputeInstance {
            instance_id: InstanceId::new(format!("task-{}", instances.len() + 1)),
            environment_id: spec.environment_id.clone(),
            session_id: Some(spec.session_id.clone()),
            generation: spec.generation,
            status: ComputeStatus::Running,
            started_at: Some(FIXTURE_NOW),
            stop_code: None,
            exit: None,
        };
        instances.push(instance.clone());
        Ok(Started::Instance(instance))
    }
    async fn describe(&self, id: &InstanceId) -> Result<Option<ComputeInstance>, PortError> {
        Ok(self
            .instances
            .lock()
            .unwrap()
            .iter()
            .find(|i| &i.instance_id == id)
            .cloned())
    }
    async fn list(&self, _: &DeploymentId) -> Result<Vec<ComputeInstance>, PortError> {
        Ok(self.instances.lock().unwrap().clone())
    }
    async fn stop(&self, id: &InstanceId, _: &str, _: u64) -> Result<(), PortError> {
        for i in self.instances.lock().unwrap().iter_mut() {
            if &i.instance_id == id {
                i.status = ComputeStatus::Stopped;
            }
        }
        Ok(())
    }
}

/// The Agents API: the sessions it knows, 404 for everything else. Counts session reads.
#[derive(Clone, Default)]
pub struct FakeSessions {
    pub sessions: Arc<Mutex<HashMap<SessionId, Session>>>,
    pub reads: Arc<AtomicUsize>,
}

fn not_found(request: String) -> ApiError {
    ApiError::NotFound { request }
}

impl SessionsApi for FakeSessions {
    async fn retrieve_session(&self, id: &SessionId) -> Result<Session, ApiError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.sessions
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| not_found(format!("GET /agents/sessions/{id}")))
    }
    async fn delete_session(&self, id: &SessionId, _: &str) -> Result<SessionDeleted, ApiError> {
        Err(not_found(format!("DELETE /agents/sessions/{id}")))
    }
    async fn retrieve_environment(&self, id: &EnvironmentId) -> Result<EnvironmentInfo, ApiError> {
        Err(not_found(format!("GET /agents/environments/{id}")))
    }
    async fn list_turns(&self, id: &SessionId, _: &PageParams) -> Result<Page<Turn>, ApiError> {
        Err(not_found(format!("GET /agents/sessions/{id}/turns")))
    }
    async fn list_turn_items(
        &self,
        id: &SessionId,
        turn: &str,
        _: &PageParams,
    ) -> Result<Page<Item>, ApiError> {
        Err(not_found(format!(
            "GET /agents/sessions/{id}/turns/{turn}/items"
        )))
    }
}

/// A file under the workspace's `events/` folder.
pub fn workspace_event(path: &str) -> String {
    let full = format!("{}/../../events/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))
}

/// A file under this crate's `tests/fixtures/` folder.
pub fn crate_fixture(name: &str) -> String {
    let full = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))
}
