//! Interleaving for deterministic simulations: [`Interleaved<P>`] makes every port call a
//! scheduling point, and [`Scheduler`] decides, from a seed, which actor runs next.
//!
//! Every call through an `Interleaved` port first yields once (returns `Pending` after
//! waking itself). A scheduler that polls actors one at a time therefore runs exactly one
//! port call per poll of an actor, and can interleave actors at every port call. Dropping
//! an actor's future at a yield is a crash right after its previous call returned: its
//! in-memory effects stay (a held lock stays held until it expires, a received message
//! comes back after its visibility timeout), nothing after it happens — the crash points
//! after lock, after compute start, after record and before ack are all such yields.

use sandbox_agents_api::{ApiError, PageParams, SessionDeleted, SessionsApi};
use sandbox_controller::ports::{
    AuditEntry, Compute, Fence, Locked, Outgoing, PoolMember, PortError, Queue, Receipt, Received,
    Registry, Release, Sent, SlotRelease, Slots, Started, StoredKind, StoredWorkspace, Workspaces,
    Write,
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
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// A future that is `Pending` once (waking itself at once), then `Ready`.
#[derive(Debug, Default)]
pub struct YieldOnce {
    yielded: bool,
}

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Yields once: a scheduling point.
pub fn yield_once() -> YieldOnce {
    YieldOnce::default()
}

/// A port whose every call is preceded by a scheduling point ([`yield_once`]).
#[derive(Clone, Debug)]
pub struct Interleaved<P> {
    /// The decorated port.
    pub inner: P,
}

impl<P> Interleaved<P> {
    /// Wraps `inner`.
    pub fn new(inner: P) -> Self {
        Self { inner }
    }
}

impl<Q: Queue> Queue for Interleaved<Q> {
    async fn send(&self, msg: Outgoing) -> Result<Sent, PortError> {
        yield_once().await;
        self.inner.send(msg).await
    }
    async fn receive(
        &self,
        max: usize,
        visibility_secs: u32,
        wait_ms: u64,
    ) -> Result<Vec<Received>, PortError> {
        yield_once().await;
        self.inner.receive(max, visibility_secs, wait_ms).await
    }
    async fn ack(&self, receipt: &str) -> Result<(), PortError> {
        yield_once().await;
        self.inner.ack(receipt).await
    }
    async fn retry_after(&self, receipt: &str, delay_secs: u32) -> Result<(), PortError> {
        yield_once().await;
        self.inner.retry_after(receipt, delay_secs).await
    }
    async fn dead_letter_count(&self) -> Result<u64, PortError> {
        yield_once().await;
        self.inner.dead_letter_count().await
    }
}

impl<R: Registry> Registry for Interleaved<R> {
    async fn get(&self, key: &EffectKey) -> Result<Option<Record>, PortError> {
        yield_once().await;
        self.inner.get(key).await
    }
    async fn find_by_session(&self, session: &SessionId) -> Result<Option<Record>, PortError> {
        yield_once().await;
        self.inner.find_by_session(session).await
    }
    async fn put(
        &self,
        fence: &Fence,
        now: u64,
        record: &Record,
        expected_version: Option<u64>,
    ) -> Result<Write, PortError> {
        yield_once().await;
        self.inner.put(fence, now, record, expected_version).await
    }
    async fn list(&self) -> Result<Vec<Record>, PortError> {
        yield_once().await;
        self.inner.list().await
    }
    async fn list_open(&self) -> Result<Vec<Record>, PortError> {
        yield_once().await;
        self.inner.list_open().await
    }
    async fn lock(
        &self,
        key: &EffectKey,
        owner: &str,
        until: u64,
        now: u64,
    ) -> Result<Option<Locked>, PortError> {
        yield_once().await;
        self.inner.lock(key, owner, until, now).await
    }
    async fn release(
        &self,
        fence: &Fence,
        now: u64,
        release: Release<'_>,
    ) -> Result<bool, PortError> {
        yield_once().await;
        self.inner.release(fence, now, release).await
    }
    async fn seen_delivery(&self, webhook_id: &str, now: u64) -> Result<bool, PortError> {
        yield_once().await;
        self.inner.seen_delivery(webhook_id, now).await
    }
    async fn remember_delivery(&self, webhook_id: &str, expires_at: u64) -> Result<(), PortError> {
        yield_once().await;
        self.inner.remember_delivery(webhook_id, expires_at).await
    }
    async fn audit(&self, entry: &AuditEntry) -> Result<(), PortError> {
        yield_once().await;
        self.inner.audit(entry).await
    }
    async fn receipt(&self, receipt: &Receipt) -> Result<(), PortError> {
        yield_once().await;
        self.inner.receipt(receipt).await
    }
    async fn receipts(&self, key: &EffectKey) -> Result<Vec<Receipt>, PortError> {
        yield_once().await;
        self.inner.receipts(key).await
    }
    async fn acquire_slot(
        &self,
        fence: &Fence,
        now: u64,
        cap: u32,
    ) -> Result<sandbox_controller::ports::Slot, PortError> {
        yield_once().await;
        self.inner.acquire_slot(fence, now, cap).await
    }
    async fn release_slot(&self, fence: &Fence, now: u64) -> Result<SlotRelease, PortError> {
        yield_once().await;
        self.inner.release_slot(fence, now).await
    }
    async fn slots(&self) -> Result<Slots, PortError> {
        yield_once().await;
        self.inner.slots().await
    }
    async fn put_terminal(
        &self,
        terminal: &sandbox_controller::terminal::TerminalRecord,
    ) -> Result<bool, PortError> {
        yield_once().await;
        self.inner.put_terminal(terminal).await
    }
    async fn terminal(
        &self,
        key: &EffectKey,
    ) -> Result<Option<sandbox_controller::terminal::TerminalRecord>, PortError> {
        yield_once().await;
        self.inner.terminal(key).await
    }
}

impl<C: Compute> Workspaces for Interleaved<C> {
    async fn save_workspace(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
    ) -> Result<WorkspaceDisposition, PortError> {
        yield_once().await;
        let _ = "save_workspace";
        self.inner
            .save_workspace(deployment, environment_id, generation)
            .await
    }
    async fn snapshot_state(
        &self,
        deployment: &DeploymentId,
        snapshot_id: &str,
    ) -> Result<sandbox_core::workspace::SnapshotState, PortError> {
        yield_once().await;
        let _ = "snapshot_state";
        self.inner.snapshot_state(deployment, snapshot_id).await
    }
    async fn delete_working_copy(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
        snapshot_id: &str,
    ) -> Result<bool, PortError> {
        yield_once().await;
        let _ = "delete_working_copy";
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
        yield_once().await;
        let _ = "discard_workspace";
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
        yield_once().await;
        let _ = "delete_stored";
        self.inner.delete_stored(deployment, kind, id).await
    }
    async fn list_stored(
        &self,
        deployment: &DeploymentId,
    ) -> Result<Vec<StoredWorkspace>, PortError> {
        yield_once().await;
        let _ = "list_stored";
        self.inner.list_stored(deployment).await
    }
}

impl<C: Compute> Compute for Interleaved<C> {
    async fn start(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<Started, PortError> {
        yield_once().await;
        self.inner.start(spec, deployment, not_after).await
    }
    async fn describe(&self, id: &InstanceId) -> Result<Option<ComputeInstance>, PortError> {
        yield_once().await;
        self.inner.describe(id).await
    }
    async fn describe_many(&self, ids: &[InstanceId]) -> Result<Vec<ComputeInstance>, PortError> {
        yield_once().await;
        self.inner.describe_many(ids).await
    }
    async fn find(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
    ) -> Result<Vec<ComputeInstance>, PortError> {
        yield_once().await;
        self.inner.find(deployment, environment_id).await
    }
    async fn list(&self, deployment: &DeploymentId) -> Result<Vec<ComputeInstance>, PortError> {
        yield_once().await;
        self.inner.list(deployment).await
    }
    async fn stop(&self, id: &InstanceId, reason: &str, not_after: u64) -> Result<(), PortError> {
        yield_once().await;
        self.inner.stop(id, reason, not_after).await
    }
    async fn start_pool_member(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<PoolMember, PortError> {
        yield_once().await;
        self.inner.start_pool_member(deployment, not_after).await
    }
    async fn list_pool(&self, deployment: &DeploymentId) -> Result<Vec<PoolMember>, PortError> {
        yield_once().await;
        self.inner.list_pool(deployment).await
    }
    async fn claim_pool_member(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        created_after: u64,
        not_after: u64,
    ) -> Result<Option<Started>, PortError> {
        yield_once().await;
        self.inner
            .claim_pool_member(spec, deployment, created_after, not_after)
            .await
    }
    // Forwarded, not left to the trait's defaults: the default recycle is an unguarded
    // stop and the default reconcile does nothing, so a decorator that omits them
    // silently drops the provider's guard (simulation seed 6038094601263162090).
    async fn recycle_pool_member(
        &self,
        id: &InstanceId,
        not_after: u64,
    ) -> Result<bool, PortError> {
        yield_once().await;
        self.inner.recycle_pool_member(id, not_after).await
    }
    async fn reconcile_pool(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<usize, PortError> {
        yield_once().await;
        self.inner.reconcile_pool(deployment, not_after).await
    }

    async fn take_pool_refill_lease(
        &self,
        deployment: &DeploymentId,
        holder: &str,
        now: u64,
        lease_secs: u64,
    ) -> Result<bool, PortError> {
        yield_once().await;
        self.inner
            .take_pool_refill_lease(deployment, holder, now, lease_secs)
            .await
    }
}

impl<S: SessionsApi> SessionsApi for Interleaved<S> {
    async fn retrieve_session(&self, id: &SessionId) -> Result<Session, ApiError> {
        yield_once().await;
        self.inner.retrieve_session(id).await
    }
    async fn delete_session(
        &self,
        id: &SessionId,
        idempotency_key: &str,
    ) -> Result<SessionDeleted, ApiError> {
        yield_once().await;
        self.inner.delete_session(id, idempotency_key).await
    }
    async fn retrieve_environment(&self, id: &EnvironmentId) -> Result<EnvironmentInfo, ApiError> {
        yield_once().await;
        self.inner.retrieve_environment(id).await
    }
    async fn list_turns(&self, id: &SessionId, page: &PageParams) -> Result<Page<Turn>, ApiError> {
        yield_once().await;
        self.inner.list_turns(id, page).await
    }
    async fn list_turn_items(
        &self,
        id: &SessionId,
        turn_id: &str,
        page: &PageParams,
    ) -> Result<Page<Item>, ApiError> {
        yield_once().await;
        self.inner.list_turn_items(id, turn_id, page).await
    }
}

/// A boxed actor future (not `Send`: everything runs on one thread).
pub type ActorFuture = Pin<Box<dyn Future<Output = ()>>>;

struct Flag {
    ready: AtomicBool,
    outer: Mutex<Option<Waker>>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.ready.store(true, Ordering::SeqCst);
        if let Some(w) = self.outer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            w.wake();
        }
    }
}

struct Slot {
    kind: String,
    fut: ActorFuture,
    flag: Arc<Flag>,
}

/// Runs actor futures one poll at a time, in an order the caller chooses (from a seed).
/// Slots are stable: an actor's index does not change while it runs.
#[derive(Default)]
pub struct Scheduler {
    slots: Vec<Option<Slot>>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.slots.iter().flatten().map(|s| &s.kind))
            .finish()
    }
}

impl Scheduler {
    /// No actors.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an actor (ready at once); `kind` names it for reports and lookups.
    /// Returns its slot index.
    pub fn spawn(&mut self, kind: impl Into<String>, fut: ActorFuture) -> usize {
        let slot = Slot {
            kind: kind.into(),
            fut,
            flag: Arc::new(Flag {
                ready: AtomicBool::new(true),
                outer: Mutex::new(None),
            }),
        };
        match self.slots.iter().position(Option::is_none) {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        }
    }

    /// Indices of actors that can make progress now, ascending.
    pub fn ready(&self) -> Vec<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                s.as_ref()
                    .filter(|s| s.flag.ready.load(Ordering::SeqCst))
                    .map(|_| i)
            })
            .collect()
    }

    /// Indices of every running actor, ascending.
    pub fn running(&self) -> Vec<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|_| i))
            .collect()
    }

    /// Whether an actor of `kind` is running.
    pub fn has(&self, kind: &str) -> bool {
        self.slots.iter().flatten().any(|s| s.kind == kind)
    }

    /// The kind of the actor in slot `i`.
    pub fn kind(&self, i: usize) -> Option<&str> {
        self.slots.get(i)?.as_ref().map(|s| s.kind.as_str())
    }

    /// Whether no actor runs.
    pub fn is_idle(&self) -> bool {
        self.slots.iter().all(Option::is_none)
    }

    /// Polls actor `i` once; `outer` is woken when a not-ready actor becomes ready (e.g.
    /// a runtime timer fired). Returns `true` when the actor finished (its slot is freed).
    pub fn poll(&mut self, i: usize, outer: &Waker) -> bool {
        let Some(slot) = self.slots.get_mut(i).and_then(Option::as_mut) else {
            return false;
        };
        slot.flag.ready.store(false, Ordering::SeqCst);
        *slot.flag.outer.lock().unwrap_or_else(|p| p.into_inner()) = Some(outer.clone());
        let waker = Waker::from(slot.flag.clone());
        let mut cx = Context::from_waker(&waker);
        if slot.fut.as_mut().poll(&mut cx).is_ready() {
            self.slots[i] = None;
            return true;
        }
        false
    }

    /// Crashes actor `i`: its future is dropped where it stands.
    pub fn crash(&mut self, i: usize) -> Option<String> {
        self.slots.get_mut(i)?.take().map(|s| s.kind)
    }
}
