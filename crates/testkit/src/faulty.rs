//! `Faulty<P>`: a port that fails on demand, following a shared [`FaultPlan`].
//!
//! A plan holds rules `(port, operation or any, fault, how many times)`; the first
//! rule that matches a call and applies to it fires, and each firing is logged
//! ([`FaultPlan::fired`]). Faults:
//!
//! | fault | applies to | the call |
//! |---|---|---|
//! | [`Fault::Throttled`] | every call | not made; `PortError` retryable / `ApiError::RateLimited` (429) |
//! | [`Fault::Timeout`] | every call | not made; retryable / `ApiError::Timeout` |
//! | [`Fault::ServerError`] | every call | not made; retryable / `ApiError::Server` (503) |
//! | [`Fault::LostResponse`] | every call | **made**, then the answer is lost: a timeout |
//! | [`Fault::FailedStart`] | `compute.start` | not made; `Started::Failed` (RunTask `failures` with HTTP 200) |
//! | [`Fault::Missing`] | `compute.describe` | not made; `None` (ECS `MISSING`) |
//! | [`Fault::Conflict`] | `registry.put`, `registry.lock`, `registry.release` | not made; `Write::Conflict` / `None` / `false` |
//!
//! Port names are those of [`crate::counting`]: `agents_api`, `registry`, `compute`,
//! `queue`.

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
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// One kind of failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Throttling (DynamoDB `ThrottlingException`, ECS/SQS throttling, HTTP 429).
    Throttled,
    /// No answer in time; the request was not processed.
    Timeout,
    /// HTTP 5xx / a transient service error; the request was not processed.
    ServerError,
    /// The request was processed but the answer was lost (a timeout after the effect).
    LostResponse,
    /// `compute.start` answered 200 with `failures` (capacity, quota, bad definition).
    FailedStart(String),
    /// `compute.describe` answered `MISSING`: `None`.
    Missing,
    /// A conditional write failed: `registry.put` conflicts, `registry.lock` is refused,
    /// `registry.release` is refused (lock lost or record changed), `registry.acquire_slot`
    /// and `registry.release_slot` find the lock lost.
    Conflict,
}

impl Fault {
    fn applies(&self, port: &str, op: &str) -> bool {
        match self {
            Self::Throttled | Self::Timeout | Self::ServerError | Self::LostResponse => true,
            Self::FailedStart(_) => port == "compute" && op == "start",
            Self::Missing => port == "compute" && op == "describe",
            Self::Conflict => {
                port == "registry"
                    && matches!(
                        op,
                        "put" | "lock" | "release" | "acquire_slot" | "release_slot"
                    )
            }
        }
    }
}

/// One rule of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRule {
    /// The port (`agents_api`, `registry`, `compute`, `queue`).
    pub port: &'static str,
    /// The operation, or `None` for every operation of the port.
    pub op: Option<&'static str>,
    /// What happens.
    pub fault: Fault,
    /// Firings left; `None`: forever (until [`FaultPlan::clear`]).
    pub remaining: Option<u32>,
    /// Chance that a matching call fires, percent (100: every matching call).
    pub percent: u64,
    /// Matching calls to let through before the rule starts firing.
    pub skip: u32,
}

/// A fault that fired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fired {
    /// The port.
    pub port: &'static str,
    /// The operation.
    pub op: &'static str,
    /// The fault.
    pub fault: Fault,
}

#[derive(Debug, Default)]
struct Plan {
    rules: Vec<FaultRule>,
    fired: Vec<Fired>,
    /// Drives percentage rules (seeded: deterministic).
    rng: Option<crate::rng::SimRng>,
}

/// The rules every [`Faulty`] port of a world consults. Clones share the plan.
#[derive(Clone, Debug, Default)]
pub struct FaultPlan {
    plan: Arc<Mutex<Plan>>,
}

impl FaultPlan {
    /// A plan with no rule (every call passes).
    pub fn new() -> Self {
        Self::default()
    }

    fn plan(&self) -> MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next `times` matching calls of `port`.`op` (`op` `None`: any) fail with `fault`.
    pub fn fail(&self, port: &'static str, op: Option<&'static str>, fault: Fault, times: u32) {
        self.fail_after(port, op, fault, 0, times);
    }

    /// As [`FaultPlan::fail`], after letting the next `skip` matching calls through.
    pub fn fail_after(
        &self,
        port: &'static str,
        op: Option<&'static str>,
        fault: Fault,
        skip: u32,
        times: u32,
    ) {
        self.plan().rules.push(FaultRule {
            port,
            op,
            fault,
            remaining: Some(times),
            percent: 100,
            skip,
        });
    }

    /// Each matching call fails with `fault` with probability `percent` / 100, drawn
    /// from a generator seeded with `seed` (deterministic), until [`FaultPlan::clear`].
    pub fn fail_randomly(
        &self,
        port: &'static str,
        op: Option<&'static str>,
        fault: Fault,
        percent: u64,
        seed: u64,
    ) {
        let mut plan = self.plan();
        plan.rng
            .get_or_insert_with(|| crate::rng::SimRng::new(seed));
        plan.rules.push(FaultRule {
            port,
            op,
            fault,
            remaining: None,
            percent,
            skip: 0,
        });
    }

    /// Every matching call fails with `fault` until [`FaultPlan::clear`].
    pub fn fail_always(&self, port: &'static str, op: Option<&'static str>, fault: Fault) {
        self.plan().rules.push(FaultRule {
            port,
            op,
            fault,
            remaining: None,
            percent: 100,
            skip: 0,
        });
    }

    /// Removes every rule (the log of fired faults is kept).
    pub fn clear(&self) {
        self.plan().rules.clear();
    }

    /// Every fault that fired, in order.
    pub fn fired(&self) -> Vec<Fired> {
        self.plan().fired.clone()
    }

    /// The fault for this call, if a rule fires (and counts it down).
    pub fn check(&self, port: &'static str, op: &'static str) -> Option<Fault> {
        let mut guard = self.plan();
        let plan = &mut *guard;
        let rng = &mut plan.rng;
        let idx = plan.rules.iter().position(|r| {
            r.port == port
                && r.op.is_none_or(|o| o == op)
                && r.remaining != Some(0)
                && r.fault.applies(port, op)
                && (r.percent >= 100 || rng.as_mut().is_some_and(|g| g.chance(r.percent)))
        })?;
        let rule = &mut plan.rules[idx];
        if rule.skip > 0 {
            rule.skip -= 1;
            return None;
        }
        if let Some(n) = rule.remaining.as_mut() {
            *n -= 1;
        }
        let fault = rule.fault.clone();
        plan.fired.push(Fired {
            port,
            op,
            fault: fault.clone(),
        });
        Some(fault)
    }
}

/// A port that consults a [`FaultPlan`] before every call.
#[derive(Clone, Debug)]
pub struct Faulty<P> {
    /// The decorated port.
    pub inner: P,
    plan: FaultPlan,
}

impl<P> Faulty<P> {
    /// `inner`, failing as `plan` says.
    pub fn new(inner: P, plan: FaultPlan) -> Self {
        Self { inner, plan }
    }

    /// The shared plan.
    pub fn plan(&self) -> &FaultPlan {
        &self.plan
    }
}

fn port_error(port: &'static str, op: &'static str, fault: &Fault) -> PortError {
    let message = match fault {
        Fault::Throttled => "throttled (ThrottlingException): rate exceeded",
        Fault::Timeout => "timed out before a response",
        Fault::ServerError => "service unavailable (HTTP 503)",
        Fault::LostResponse => "timed out after the request was sent (outcome unknown)",
        Fault::FailedStart(_) | Fault::Missing | Fault::Conflict => "injected failure",
    };
    PortError::transient(port, op, message)
}

/// A `reqwest::Error` made without any network access (a request that fails to build),
/// to stand for the transport error inside `ApiError::Timeout`.
fn transport_error() -> reqwest::Error {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    let client = CLIENT.get_or_init(reqwest::Client::new);
    match client.get("twin://not a url").build() {
        Err(e) => e,
        Ok(_) => unreachable!("an unparsable URL never builds a request"),
    }
}

fn api_error(op: &'static str, fault: &Fault) -> ApiError {
    let request = format!("twin {op}");
    match fault {
        Fault::Throttled => ApiError::RateLimited {
            request,
            attempts: 3,
            retry_after: None,
        },
        Fault::ServerError => ApiError::Server {
            request,
            status: 503,
            attempts: 3,
            retry_after: None,
        },
        _ => ApiError::Timeout {
            request,
            attempts: 3,
            source: transport_error(),
        },
    }
}

/// Runs a `PortError` call through the plan.
macro_rules! guarded {
    ($self:ident, $port:literal, $op:literal, $call:expr) => {
        match $self.plan.check($port, $op) {
            None => $call.await,
            Some(Fault::LostResponse) => {
                let _ = $call.await;
                Err(port_error($port, $op, &Fault::LostResponse))
            }
            Some(f) => Err(port_error($port, $op, &f)),
        }
    };
}

/// Runs an Agents API call through the plan.
macro_rules! guarded_api {
    ($self:ident, $op:literal, $call:expr) => {
        match $self.plan.check("agents_api", $op) {
            None => $call.await,
            Some(Fault::LostResponse) => {
                let _ = $call.await;
                Err(api_error($op, &Fault::LostResponse))
            }
            Some(f) => Err(api_error($op, &f)),
        }
    };
}

impl<Q: Queue> Queue for Faulty<Q> {
    async fn send(&self, msg: Outgoing) -> Result<Sent, PortError> {
        guarded!(self, "queue", "send", self.inner.send(msg.clone()))
    }
    async fn receive(
        &self,
        max: usize,
        visibility_secs: u32,
        wait_ms: u64,
    ) -> Result<Vec<Received>, PortError> {
        guarded!(
            self,
            "queue",
            "receive",
            self.inner.receive(max, visibility_secs, wait_ms)
        )
    }
    async fn ack(&self, receipt: &str) -> Result<(), PortError> {
        guarded!(self, "queue", "ack", self.inner.ack(receipt))
    }
    async fn retry_after(&self, receipt: &str, delay_secs: u32) -> Result<(), PortError> {
        guarded!(
            self,
            "queue",
            "retry_after",
            self.inner.retry_after(receipt, delay_secs)
        )
    }
    async fn dead_letter_count(&self) -> Result<u64, PortError> {
        guarded!(
            self,
            "queue",
            "dead_letter_count",
            self.inner.dead_letter_count()
        )
    }
}

impl<R: Registry> Registry for Faulty<R> {
    async fn get(&self, key: &EffectKey) -> Result<Option<Record>, PortError> {
        guarded!(self, "registry", "get", self.inner.get(key))
    }
    async fn find_by_session(&self, session: &SessionId) -> Result<Option<Record>, PortError> {
        guarded!(
            self,
            "registry",
            "find_by_session",
            self.inner.find_by_session(session)
        )
    }
    async fn put(
        &self,
        fence: &Fence,
        now: u64,
        record: &Record,
        expected_version: Option<u64>,
    ) -> Result<Write, PortError> {
        if self.plan.check_peek_conflict("put") {
            return Ok(Write::Conflict);
        }
        guarded!(
            self,
            "registry",
            "put",
            self.inner.put(fence, now, record, expected_version)
        )
    }
    async fn list(&self) -> Result<Vec<Record>, PortError> {
        guarded!(self, "registry", "list", self.inner.list())
    }
    async fn list_open(&self) -> Result<Vec<Record>, PortError> {
        guarded!(self, "registry", "list_open", self.inner.list_open())
    }
    async fn lock(
        &self,
        key: &EffectKey,
        owner: &str,
        until: u64,
        now: u64,
    ) -> Result<Option<Locked>, PortError> {
        if self.plan.check_peek_conflict("lock") {
            return Ok(None);
        }
        guarded!(
            self,
            "registry",
            "lock",
            self.inner.lock(key, owner, until, now)
        )
    }
    async fn release(
        &self,
        fence: &Fence,
        now: u64,
        release: Release<'_>,
    ) -> Result<bool, PortError> {
        if self.plan.check_peek_conflict("release") {
            return Ok(false);
        }
        guarded!(
            self,
            "registry",
            "release",
            self.inner.release(fence, now, release)
        )
    }
    async fn seen_delivery(&self, webhook_id: &str, now: u64) -> Result<bool, PortError> {
        guarded!(
            self,
            "registry",
            "seen_delivery",
            self.inner.seen_delivery(webhook_id, now)
        )
    }
    async fn remember_delivery(&self, webhook_id: &str, expires_at: u64) -> Result<(), PortError> {
        guarded!(
            self,
            "registry",
            "remember_delivery",
            self.inner.remember_delivery(webhook_id, expires_at)
        )
    }
    async fn audit(&self, entry: &AuditEntry) -> Result<(), PortError> {
        guarded!(self, "registry", "audit", self.inner.audit(entry))
    }
    async fn receipt(&self, receipt: &Receipt) -> Result<(), PortError> {
        guarded!(self, "registry", "receipt", self.inner.receipt(receipt))
    }
    async fn receipts(&self, key: &EffectKey) -> Result<Vec<Receipt>, PortError> {
        guarded!(self, "registry", "receipts", self.inner.receipts(key))
    }
    async fn acquire_slot(&self, fence: &Fence, now: u64, cap: u32) -> Result<Slot, PortError> {
        if self.plan.check_peek_conflict("acquire_slot") {
            return Ok(Slot::LockLost);
        }
        guarded!(
            self,
            "registry",
            "acquire_slot",
            self.inner.acquire_slot(fence, now, cap)
        )
    }
    async fn release_slot(&self, fence: &Fence, now: u64) -> Result<SlotRelease, PortError> {
        if self.plan.check_peek_conflict("release_slot") {
            return Ok(SlotRelease::LockLost);
        }
        guarded!(
            self,
            "registry",
            "release_slot",
            self.inner.release_slot(fence, now)
        )
    }
    async fn slots(&self) -> Result<Slots, PortError> {
        guarded!(self, "registry", "slots", self.inner.slots())
    }
    async fn put_terminal(
        &self,
        terminal: &sandbox_controller::terminal::TerminalRecord,
    ) -> Result<bool, PortError> {
        guarded!(
            self,
            "registry",
            "put_terminal",
            self.inner.put_terminal(terminal)
        )
    }
    async fn terminal(
        &self,
        key: &EffectKey,
    ) -> Result<Option<sandbox_controller::terminal::TerminalRecord>, PortError> {
        guarded!(self, "registry", "terminal", self.inner.terminal(key))
    }
}

impl FaultPlan {
    /// Fires a `Conflict` rule for `registry`.`op` if one matches (checked before the
    /// generic faults so a conflict is an answer, not an error).
    fn check_peek_conflict(&self, op: &'static str) -> bool {
        let mut guard = self.plan();
        let plan = &mut *guard;
        let rng = &mut plan.rng;
        let Some(idx) = plan.rules.iter().position(|r| {
            r.port == "registry"
                && r.op.is_none_or(|o| o == op)
                && r.remaining != Some(0)
                && r.fault == Fault::Conflict
                && (r.percent >= 100 || rng.as_mut().is_some_and(|g| g.chance(r.percent)))
        }) else {
            return false;
        };
        if let Some(n) = plan.rules[idx].remaining.as_mut() {
            *n -= 1;
        }
        plan.fired.push(Fired {
            port: "registry",
            op,
            fault: Fault::Conflict,
        });
        true
    }
}

impl<C> Faulty<C> {
    /// A planned fault of port `workspace`, operation `op`, as an error.
    fn fail_workspace(&self, op: &'static str) -> Result<(), PortError> {
        match self.plan.check("workspace", op) {
            None => Ok(()),
            Some(f) => Err(port_error("workspace", op, &f)),
        }
    }
}

impl<C: Compute> Workspaces for Faulty<C> {
    async fn save_workspace(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
    ) -> Result<WorkspaceDisposition, PortError> {
        self.fail_workspace("save_workspace")?;
        self.inner
            .save_workspace(deployment, environment_id, generation)
            .await
    }
    async fn snapshot_state(
        &self,
        deployment: &DeploymentId,
        snapshot_id: &str,
    ) -> Result<sandbox_core::workspace::SnapshotState, PortError> {
        self.fail_workspace("snapshot_state")?;
        self.inner.snapshot_state(deployment, snapshot_id).await
    }
    async fn delete_working_copy(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
        snapshot_id: &str,
    ) -> Result<bool, PortError> {
        self.fail_workspace("delete_working_copy")?;
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
        self.fail_workspace("discard_workspace")?;
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
        self.fail_workspace("delete_stored")?;
        self.inner.delete_stored(deployment, kind, id).await
    }
    async fn list_stored(
        &self,
        deployment: &DeploymentId,
    ) -> Result<Vec<StoredWorkspace>, PortError> {
        self.fail_workspace("list_stored")?;
        self.inner.list_stored(deployment).await
    }
}

impl<C: Compute> Compute for Faulty<C> {
    async fn start(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<Started, PortError> {
        match self.plan.check("compute", "start") {
            None => self.inner.start(spec, deployment, not_after).await,
            Some(Fault::FailedStart(reason)) => Ok(Started::Failed { reason }),
            Some(Fault::LostResponse) => {
                let _ = self.inner.start(spec, deployment, not_after).await;
                Err(port_error("compute", "start", &Fault::LostResponse))
            }
            Some(f) => Err(port_error("compute", "start", &f)),
        }
    }
    async fn describe(&self, id: &InstanceId) -> Result<Option<ComputeInstance>, PortError> {
        match self.plan.check("compute", "describe") {
            None => self.inner.describe(id).await,
            Some(Fault::Missing) => Ok(None),
            Some(Fault::LostResponse) => {
                let _ = self.inner.describe(id).await;
                Err(port_error("compute", "describe", &Fault::LostResponse))
            }
            Some(f) => Err(port_error("compute", "describe", &f)),
        }
    }
    async fn describe_many(&self, ids: &[InstanceId]) -> Result<Vec<ComputeInstance>, PortError> {
        match self.plan.check("compute", "describe_many") {
            None => self.inner.describe_many(ids).await,
            Some(Fault::Missing) => Ok(vec![]),
            Some(Fault::LostResponse) => {
                let _ = self.inner.describe_many(ids).await;
                Err(port_error("compute", "describe_many", &Fault::LostResponse))
            }
            Some(f) => Err(port_error("compute", "describe_many", &f)),
        }
    }
    async fn find(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
    ) -> Result<Vec<ComputeInstance>, PortError> {
        guarded!(
            self,
            "compute",
            "find",
            self.inner.find(deployment, environment_id)
        )
    }
    async fn list(&self, deployment: &DeploymentId) -> Result<Vec<ComputeInstance>, PortError> {
        guarded!(self, "compute", "list", self.inner.list(deployment))
    }
    async fn stop(&self, id: &InstanceId, reason: &str, not_after: u64) -> Result<(), PortError> {
        guarded!(
            self,
            "compute",
            "stop",
            self.inner.stop(id, reason, not_after)
        )
    }
    async fn start_pool_member(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<PoolMember, PortError> {
        if let Some(f) = self.plan.check("compute", "start_pool_member") {
            return Err(port_error("compute", "start_pool_member", &f));
        }
        self.inner.start_pool_member(deployment, not_after).await
    }
    async fn list_pool(&self, deployment: &DeploymentId) -> Result<Vec<PoolMember>, PortError> {
        if let Some(f) = self.plan.check("compute", "list_pool") {
            return Err(port_error("compute", "list_pool", &f));
        }
        self.inner.list_pool(deployment).await
    }
    async fn claim_pool_member(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        created_after: u64,
        not_after: u64,
    ) -> Result<Option<Started>, PortError> {
        let claim = self
            .inner
            .claim_pool_member(spec, deployment, created_after, not_after);
        match self.plan.check("compute", "claim_pool_member") {
            None => claim.await,
            Some(Fault::LostResponse) => {
                // Claimed, but the answer is lost: the outcome is unknown to the caller.
                let _ = claim.await;
                Err(port_error(
                    "compute",
                    "claim_pool_member",
                    &Fault::LostResponse,
                ))
            }
            Some(f) => Err(port_error("compute", "claim_pool_member", &f)),
        }
    }
    // Forwarded, not left to the trait's defaults (an unguarded stop, a no-op reconcile).
    async fn recycle_pool_member(
        &self,
        id: &InstanceId,
        not_after: u64,
    ) -> Result<bool, PortError> {
        guarded!(
            self,
            "compute",
            "recycle_pool_member",
            self.inner.recycle_pool_member(id, not_after)
        )
    }
    async fn reconcile_pool(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<usize, PortError> {
        guarded!(
            self,
            "compute",
            "reconcile_pool",
            self.inner.reconcile_pool(deployment, not_after)
        )
    }

    async fn take_pool_refill_lease(
        &self,
        deployment: &DeploymentId,
        holder: &str,
        now: u64,
        lease_secs: u64,
    ) -> Result<bool, PortError> {
        guarded!(
            self,
            "compute",
            "take_pool_refill_lease",
            self.inner
                .take_pool_refill_lease(deployment, holder, now, lease_secs)
        )
    }
}

impl<S: SessionsApi> SessionsApi for Faulty<S> {
    async fn retrieve_session(&self, id: &SessionId) -> Result<Session, ApiError> {
        guarded_api!(self, "retrieve_session", self.inner.retrieve_session(id))
    }
    async fn delete_session(
        &self,
        id: &SessionId,
        idempotency_key: &str,
    ) -> Result<SessionDeleted, ApiError> {
        guarded_api!(
            self,
            "delete_session",
            self.inner.delete_session(id, idempotency_key)
        )
    }
    async fn retrieve_environment(&self, id: &EnvironmentId) -> Result<EnvironmentInfo, ApiError> {
        guarded_api!(
            self,
            "retrieve_environment",
            self.inner.retrieve_environment(id)
        )
    }
    async fn list_turns(&self, id: &SessionId, page: &PageParams) -> Result<Page<Turn>, ApiError> {
        guarded_api!(self, "list_turns", self.inner.list_turns(id, page))
    }
    async fn list_turn_items(
        &self,
        id: &SessionId,
        turn_id: &str,
        page: &PageParams,
    ) -> Result<Page<Item>, ApiError> {
        guarded_api!(
            self,
            "list_turn_items",
            self.inner.list_turn_items(id, turn_id, page)
        )
    }
}
