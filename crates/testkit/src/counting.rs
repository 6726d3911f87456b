//! `Counting<P>`: counts every call a port receives, per port and operation, read or
//! write, into a [`CallLog`] that several decorated ports can share (one timeline).
//!
//! Port names: `agents_api`, `registry`, `compute`, `queue`. Which calls are reads and
//! which are writes is fixed by [`classify`].

use sandbox_agents_api::{ApiError, PageParams, SessionDeleted, SessionsApi};
use sandbox_controller::ports::{
    AuditEntry, Compute, Fence, Locked, Outgoing, PoolMember, PortError, Queue, Receipt, Received,
    Registry, Release, Sent, Slot, SlotRelease, Slots, Started, StoredKind, StoredWorkspace,
    Workspaces, Write,
};
use sandbox_core::compute::ComputeInstance;
use sandbox_core::decision::StartSpec;
use sandbox_core::environment::EnvironmentInfo;
use sandbox_core::ids::Generation;
use sandbox_core::ids::{DeploymentId, EffectKey, EnvironmentId, InstanceId, SessionId};
use sandbox_core::record::Record;
use sandbox_core::session::Session;
use sandbox_core::turn::{Item, Page, Turn};
use sandbox_core::workspace::WorkspaceDisposition;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// Whether a call only reads or changes state somewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Access {
    /// Reads state only.
    Read,
    /// Changes state (a conditional write that conflicts still counts: it was sent).
    Write,
}

/// One call a port received.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Call {
    /// `agents_api`, `registry`, `compute` or `queue`.
    pub port: &'static str,
    /// The trait method (`retrieve_session`, `put`, `start`, ...).
    pub op: &'static str,
    /// Read or write.
    pub access: Access,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rw = match self.access {
            Access::Read => "R",
            Access::Write => "W",
        };
        write!(f, "{}.{}({rw})", self.port, self.op)
    }
}

/// Whether `op` of `port` is a read or a write. Unknown pairs count as writes.
///
/// | port | reads | writes |
/// |---|---|---|
/// | `agents_api` | `retrieve_session`, `retrieve_environment`, `list_turns`, `list_turn_items` | `delete_session` |
/// | `registry` | `get`, `find_by_session`, `list`, `list_open`, `seen_delivery`, `receipts`, `slots` | `put`, `lock` (it also reads the record), `release`, `remember_delivery`, `audit`, `receipt` |
/// | `compute` | `describe`, `list` | `start`, `stop` |
/// | `queue` | `receive`, `dead_letter_count` | `send`, `send_batch` (one call), `ack`, `retry_after` |
pub fn classify(port: &str, op: &str) -> Access {
    let read = match port {
        "agents_api" => matches!(
            op,
            "retrieve_session" | "retrieve_environment" | "list_turns" | "list_turn_items"
        ),
        "registry" => matches!(
            op,
            "get"
                | "find_by_session"
                | "list"
                | "list_open"
                | "seen_delivery"
                | "receipts"
                | "slots"
        ),
        "compute" => matches!(op, "describe" | "describe_many" | "find" | "list"),
        "queue" => matches!(op, "receive" | "dead_letter_count"),
        _ => false,
    };
    if read { Access::Read } else { Access::Write }
}

/// The ports whose calls leave the process in production and count as remote calls in
/// the call budgets: the Agents API (HTTPS), the registry (DynamoDB) and the compute
/// provider (ECS). Queue calls (SQS) are the transport that carried the job and are
/// counted separately.
pub const REMOTE_PORTS: [&str; 3] = ["agents_api", "registry", "compute"];

/// A shared, ordered log of calls. Clones share the log.
#[derive(Clone, Debug, Default)]
pub struct CallLog {
    calls: Arc<Mutex<Vec<Call>>>,
}

impl CallLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    fn calls_mut(&self) -> MutexGuard<'_, Vec<Call>> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends a call of `port`.`op` (classified by [`classify`]).
    pub fn record(&self, port: &'static str, op: &'static str) {
        self.calls_mut().push(Call {
            port,
            op,
            access: classify(port, op),
        });
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls_mut().clone()
    }

    /// The calls so far as counts, and clears the log.
    pub fn take(&self) -> CallCounts {
        CallCounts {
            calls: std::mem::take(&mut *self.calls_mut()),
        }
    }

    /// The calls so far as counts (the log is kept).
    pub fn counts(&self) -> CallCounts {
        CallCounts {
            calls: self.calls(),
        }
    }

    /// Forgets every call.
    pub fn clear(&self) {
        self.calls_mut().clear();
    }
}

/// A sequence of calls with counting helpers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// The calls, in order.
    pub calls: Vec<Call>,
}

impl CallCounts {
    /// Calls to the [`REMOTE_PORTS`] (Agents API, registry, compute), in order.
    pub fn remote(&self) -> Vec<Call> {
        self.calls
            .iter()
            .copied()
            .filter(|c| REMOTE_PORTS.contains(&c.port))
            .collect()
    }

    /// Number of remote calls.
    pub fn remote_total(&self) -> usize {
        self.remote().len()
    }

    /// Remote reads.
    pub fn remote_reads(&self) -> usize {
        self.remote()
            .iter()
            .filter(|c| c.access == Access::Read)
            .count()
    }

    /// Remote writes.
    pub fn remote_writes(&self) -> usize {
        self.remote()
            .iter()
            .filter(|c| c.access == Access::Write)
            .count()
    }

    /// Calls to one port.
    pub fn of_port(&self, port: &str) -> usize {
        self.calls.iter().filter(|c| c.port == port).count()
    }

    /// Calls of one port's operation.
    pub fn of(&self, port: &str, op: &str) -> usize {
        self.calls
            .iter()
            .filter(|c| c.port == port && c.op == op)
            .count()
    }

    /// `(reads, writes)` per port, ports in name order.
    pub fn per_port(&self) -> BTreeMap<&'static str, (usize, usize)> {
        let mut out: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
        for c in &self.calls {
            let e = out.entry(c.port).or_default();
            match c.access {
                Access::Read => e.0 += 1,
                Access::Write => e.1 += 1,
            }
        }
        out
    }

    /// The remote calls as `port.op(R|W)` joined by ` → ` (for messages and reports).
    pub fn remote_sequence(&self) -> String {
        self.remote()
            .iter()
            .map(Call::to_string)
            .collect::<Vec<_>>()
            .join(" → ")
    }

    /// Every call (queue included) as `port.op(R|W)` joined by ` → `.
    pub fn sequence(&self) -> String {
        self.calls
            .iter()
            .map(Call::to_string)
            .collect::<Vec<_>>()
            .join(" → ")
    }
}

/// A port that records every call in a [`CallLog`] before forwarding it.
#[derive(Clone, Debug)]
pub struct Counting<P> {
    /// The decorated port.
    pub inner: P,
    log: CallLog,
}

impl<P> Counting<P> {
    /// Counts the calls to `inner` into `log`.
    pub fn new(inner: P, log: CallLog) -> Self {
        Self { inner, log }
    }

    /// The shared log.
    pub fn log(&self) -> &CallLog {
        &self.log
    }
}

impl<Q: Queue> Queue for Counting<Q> {
    async fn send(&self, msg: Outgoing) -> Result<Sent, PortError> {
        self.log.record("queue", "send");
        self.inner.send(msg).await
    }
    async fn send_batch(&self, msgs: Vec<Outgoing>) -> Vec<Result<Sent, PortError>> {
        self.log.record("queue", "send_batch");
        self.inner.send_batch(msgs).await
    }

    async fn receive(
        &self,
        max: usize,
        visibility_secs: u32,
        wait_ms: u64,
    ) -> Result<Vec<Received>, PortError> {
        self.log.record("queue", "receive");
        self.inner.receive(max, visibility_secs, wait_ms).await
    }
    async fn ack(&self, receipt: &str) -> Result<(), PortError> {
        self.log.record("queue", "ack");
        self.inner.ack(receipt).await
    }
    async fn retry_after(&self, receipt: &str, delay_secs: u32) -> Result<(), PortError> {
        self.log.record("queue", "retry_after");
        self.inner.retry_after(receipt, delay_secs).await
    }
    async fn dead_letter_count(&self) -> Result<u64, PortError> {
        self.log.record("queue", "dead_letter_count");
        self.inner.dead_letter_count().await
    }
}

impl<R: Registry> Registry for Counting<R> {
    async fn get(&self, key: &EffectKey) -> Result<Option<Record>, PortError> {
        self.log.record("registry", "get");
        self.inner.get(key).await
    }
    async fn find_by_session(&self, session: &SessionId) -> Result<Option<Record>, PortError> {
        self.log.record("registry", "find_by_session");
        self.inner.find_by_session(session).await
    }
    async fn put(
        &self,
        fence: &Fence,
        now: u64,
        record: &Record,
        expected_version: Option<u64>,
    ) -> Result<Write, PortError> {
        self.log.record("registry", "put");
        self.inner.put(fence, now, record, expected_version).await
    }
    async fn list(&self) -> Result<Vec<Record>, PortError> {
        self.log.record("registry", "list");
        self.inner.list().await
    }
    async fn list_open(&self) -> Result<Vec<Record>, PortError> {
        self.log.record("registry", "list_open");
        self.inner.list_open().await
    }
    async fn lock(
        &self,
        key: &EffectKey,
        owner: &str,
        until: u64,
        now: u64,
    ) -> Result<Option<Locked>, PortError> {
        self.log.record("registry", "lock");
        self.inner.lock(key, owner, until, now).await
    }
    async fn release(
        &self,
        fence: &Fence,
        now: u64,
        release: Release<'_>,
    ) -> Result<bool, PortError> {
        self.log.record("registry", "release");
        self.inner.release(fence, now, release).await
    }
    async fn seen_delivery(&self, webhook_id: &str, now: u64) -> Result<bool, PortError> {
        self.log.record("registry", "seen_delivery");
        self.inner.seen_delivery(webhook_id, now).await
    }
    async fn remember_delivery(&self, webhook_id: &str, expires_at: u64) -> Result<(), PortError> {
        self.log.record("registry", "remember_delivery");
        self.inner.remember_delivery(webhook_id, expires_at).await
    }
    async fn audit(&self, entry: &AuditEntry) -> Result<(), PortError> {
        self.log.record("registry", "audit");
        self.inner.audit(entry).await
    }
    async fn receipt(&self, receipt: &Receipt) -> Result<(), PortError> {
        self.log.record("registry", "receipt");
        self.inner.receipt(receipt).await
    }
    async fn receipts(&self, key: &EffectKey) -> Result<Vec<Receipt>, PortError> {
        self.log.record("registry", "receipts");
        self.inner.receipts(key).await
    }
    async fn acquire_slot(&self, fence: &Fence, now: u64, cap: u32) -> Result<Slot, PortError> {
        self.log.record("registry", "acquire_slot");
        self.inner.acquire_slot(fence, now, cap).await
    }
    async fn release_slot(&self, fence: &Fence, now: u64) -> Result<SlotRelease, PortError> {
        self.log.record("registry", "release_slot");
        self.inner.release_slot(fence, now).await
    }
    async fn slots(&self) -> Result<Slots, PortError> {
        self.log.record("registry", "slots");
        self.inner.slots().await
    }
    async fn put_terminal(
        &self,
        terminal: &sandbox_controller::terminal::TerminalRecord,
    ) -> Result<bool, PortError> {
        self.log.record("registry", "put_terminal");
        self.inner.put_terminal(terminal).await
    }
    async fn terminal(
        &self,
        key: &EffectKey,
    ) -> Result<Option<sandbox_controller::terminal::TerminalRecord>, PortError> {
        self.log.record("registry", "terminal");
        self.inner.terminal(key).await
    }
}

impl<C: Compute> Workspaces for Counting<C> {
    async fn save_workspace(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
    ) -> Result<WorkspaceDisposition, PortError> {
        self.log.record("workspace", "save_workspace");
        self.inner
            .save_workspace(deployment, environment_id, generation)
            .await
    }
    async fn snapshot_state(
        &self,
        deployment: &DeploymentId,
        snapshot_id: &str,
    ) -> Result<sandbox_core::workspace::SnapshotState, PortError> {
        self.log.record("workspace", "snapshot_state");
        self.inner.snapshot_state(deployment, snapshot_id).await
    }
    async fn delete_working_copy(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
        snapshot_id: &str,
    ) -> Result<bool, PortError> {
        self.log.record("workspace", "delete_working_copy");
        self.inner
            .delete_working_copy(deployment, environment_id, generation, snapshot_id)
            .await
    }
    async fn discard_workspace(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
    ) -> Result<WorkspaceDisposition, PortError> {
        self.log.record("workspace", "discard_workspace");
        self.inner
            .discard_workspace(deployment, environment_id, generation)
            .await
    }
    async fn delete_stored(
        &self,
        deployment: &DeploymentId,
        kind: StoredKind,
        id: &str,
    ) -> Result<(), PortError> {
        self.log.record("workspace", "delete_stored");
        self.inner.delete_stored(deployment, kind, id).await
    }
    async fn list_stored(
        &self,
        deployment: &DeploymentId,
    ) -> Result<Vec<StoredWorkspace>, PortError> {
        self.log.record("workspace", "list_stored");
        self.inner.list_stored(deployment).await
    }
}

impl<C: Compute> Compute for Counting<C> {
    async fn start(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<Started, PortError> {
        self.log.record("compute", "start");
        self.inner.start(spec, deployment, not_after).await
    }
    async fn describe(&self, id: &InstanceId) -> Result<Option<ComputeInstance>, PortError> {
        self.log.record("compute", "describe");
        self.inner.describe(id).await
    }
    async fn describe_many(&self, ids: &[InstanceId]) -> Result<Vec<ComputeInstance>, PortError> {
        // One remote call per 100 ids, as ECS DescribeTasks.
        for _ in ids.chunks(100) {
            self.log.record("compute", "describe_many");
        }
        self.inner.describe_many(ids).await
    }
    async fn find(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
    ) -> Result<Vec<ComputeInstance>, PortError> {
        self.log.record("compute", "find");
        self.inner.find(deployment, environment_id).await
    }
    async fn list(&self, deployment: &DeploymentId) -> Result<Vec<ComputeInstance>, PortError> {
        self.log.record("compute", "list");
        self.inner.list(deployment).await
    }
    async fn stop(&self, id: &InstanceId, reason: &str, not_after: u64) -> Result<(), PortError> {
        self.log.record("compute", "stop");
        self.inner.stop(id, reason, not_after).await
    }
    async fn start_pool_member(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<PoolMember, PortError> {
        self.log.record("compute", "start_pool_member");
        self.inner.start_pool_member(deployment, not_after).await
    }
    async fn list_pool(&self, deployment: &DeploymentId) -> Result<Vec<PoolMember>, PortError> {
        self.log.record("compute", "list_pool");
        self.inner.list_pool(deployment).await
    }
    async fn claim_pool_member(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        created_after: u64,
        not_after: u64,
    ) -> Result<Option<Started>, PortError> {
        self.log.record("compute", "claim_pool_member");
        self.inner
            .claim_pool_member(spec, deployment, created_after, not_after)
            .await
    }
    // Forwarded, not left to the trait's defaults (an unguarded stop, a no-op reconcile).
    async fn recycle_pool_member(
        &self,
        id: &InstanceId,
        not_after: u64,
    ) -> Result<bool, PortError> {
        self.log.record("compute", "recycle_pool_member");
        self.inner.recycle_pool_member(id, not_after).await
    }
    async fn reconcile_pool(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<usize, PortError> {
        self.log.record("compute", "reconcile_pool");
        self.inner.reconcile_pool(deployment, not_after).await
    }

    async fn take_pool_refill_lease(
        &self,
        deployment: &DeploymentId,
        holder: &str,
        now: u64,
        lease_secs: u64,
    ) -> Result<bool, PortError> {
        self.log.record("compute", "take_pool_refill_lease");
        self.inner
            .take_pool_refill_lease(deployment, holder, now, lease_secs)
            .await
    }
}

impl<S: SessionsApi> SessionsApi for Counting<S> {
    async fn retrieve_session(&self, id: &SessionId) -> Result<Session, ApiError> {
        self.log.record("agents_api", "retrieve_session");
        self.inner.retrieve_session(id).await
    }
    async fn delete_session(
        &self,
        id: &SessionId,
        idempotency_key: &str,
    ) -> Result<SessionDeleted, ApiError> {
        self.log.record("agents_api", "delete_session");
        self.inner.delete_session(id, idempotency_key).await
    }
    async fn retrieve_environment(&self, id: &EnvironmentId) -> Result<EnvironmentInfo, ApiError> {
        self.log.record("agents_api", "retrieve_environment");
        self.inner.retrieve_environment(id).await
    }
    async fn list_turns(&self, id: &SessionId, page: &PageParams) -> Result<Page<Turn>, ApiError> {
        self.log.record("agents_api", "list_turns");
        self.inner.list_turns(id, page).await
    }
    async fn list_turn_items(
        &self,
        id: &SessionId,
        turn_id: &str,
        page: &PageParams,
    ) -> Result<Page<Item>, ApiError> {
        self.log.record("agents_api", "list_turn_items");
        self.inner.list_turn_items(id, turn_id, page).await
    }
}
