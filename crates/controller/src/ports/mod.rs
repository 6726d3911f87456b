//! The ports: every side effect of the controller goes through one of these traits.
//!
//! Implementations: `sandbox-local` (SQLite, child processes) and `sandbox-aws` (SQS,
//! DynamoDB, ECS). Both pass the shared contract suite in `sandbox_controller::contract`.
//! All times are Unix seconds (`u64`) unless a name says otherwise.

use crate::job::Job;
use sandbox_core::compute::ComputeInstance;
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, EffectKey, EnvironmentId, InstanceId, SessionId};
use sandbox_core::record::Record;
use sandbox_core::workspace::{SnapshotState, WorkspaceDisposition};
use serde::{Deserialize, Serialize};
use std::future::Future;

/// A failure of a backend dependency (queue, registry, provider). Carries no secret.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{dependency} {operation} failed: {message}")]
pub struct PortError {
    /// `queue`, `registry`, `compute`, ...
    pub dependency: &'static str,
    /// The operation, e.g. `send`, `put`, `start`.
    pub operation: &'static str,
    /// What went wrong (no secret, no raw payload).
    pub message: String,
    /// Whether retrying later may succeed (throttling, timeouts, 5xx).
    pub retryable: bool,
    /// Whether another writer held the same item at that moment (DynamoDB
    /// `TransactionConflict`, after the adapter's jittered retries): retryable, and a job
    /// that meets it ends as "busy" — a short hand-off, like a held lock — never as a
    /// failed job. Always `false` unless built with [`PortError::contended`].
    pub contended: bool,
}

impl PortError {
    /// A retryable failure.
    pub fn transient(
        dependency: &'static str,
        operation: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            dependency,
            operation,
            message: message.into(),
            retryable: true,
            contended: false,
        }
    }
    /// A contended write (see [`PortError::contended`]): retryable, ends a job as busy.
    pub fn contended(
        dependency: &'static str,
        operation: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            dependency,
            operation,
            message: message.into(),
            retryable: true,
            contended: true,
        }
    }
    /// A failure retrying will not fix (bad configuration, invalid input).
    pub fn permanent(
        dependency: &'static str,
        operation: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            dependency,
            operation,
            message: message.into(),
            retryable: false,
            contended: false,
        }
    }
}

/// The wall clock, injectable so tests control time.
pub trait Clock: Send + Sync + 'static {
    /// Now, Unix seconds.
    fn now(&self) -> u64;
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }
}

/// A message to enqueue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The job (the body).
    pub job: Job,
    /// De-duplication id: the webhook-id for webhook jobs. A second send with the same id
    /// while the first is retained is accepted and dropped (SQS FIFO semantics).
    pub dedup_id: String,
    /// Ordering group: the session id. Messages of one group are delivered in order and
    /// one at a time (FIFO queues); standard queues ignore it.
    pub group: String,
    /// Delay before the message becomes visible, seconds (≤ 900; FIFO queues reject > 0).
    pub delay_secs: u32,
}

/// A received message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// Handle for `ack` / `retry_after` (SQS receipt handle; local row handle).
    pub receipt: String,
    /// Provider message id (SQS `MessageId`; the partial batch response's identifier).
    pub message_id: String,
    /// The job.
    pub job: Job,
    /// How many times this message has been received, this time included (≥ 1).
    pub receive_count: u32,
}

/// What happened to a send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// Stored for delivery.
    Queued,
    /// Dropped as a duplicate of a retained message with the same dedup id.
    Duplicate,
}

/// Messages per [`Queue::send_batch`] call at most (SQS `SendMessageBatch`: 10 entries).
pub const SEND_BATCH_MAX: usize = 10;

/// A durable queue with visibility timeouts, receive counts and a dead-letter queue.
pub trait Queue: Send + Sync + 'static {
    /// Stores a message. Returns only once the queue durably accepted it.
    fn send(&self, msg: Outgoing) -> impl Future<Output = Result<Sent, PortError>> + Send;
    /// Stores up to [`SEND_BATCH_MAX`] messages in one call where the queue has one (SQS
    /// `SendMessageBatch`), each with its own delay; one result per message, in order: a
    /// batch can succeed for some messages and fail for others (SQS answers HTTP 200 with
    /// `Failed` entries). The default sends them one by one with [`Queue::send`].
    fn send_batch(
        &self,
        msgs: Vec<Outgoing>,
    ) -> impl Future<Output = Vec<Result<Sent, PortError>>> + Send {
        async move {
            let mut out = Vec::with_capacity(msgs.len());
            for msg in msgs {
                out.push(self.send(msg).await);
            }
            out
        }
    }
    /// Receives up to `max` visible messages (waiting up to `wait_ms` milliseconds for
    /// one), hiding each for `visibility_secs` seconds. Messages received more than the
    /// queue's maximum receive count go to its dead-letter queue instead.
    fn receive(
        &self,
        max: usize,
        visibility_secs: u32,
        wait_ms: u64,
    ) -> impl Future<Output = Result<Vec<Received>, PortError>> + Send;
    /// Deletes a processed message.
    fn ack(&self, receipt: &str) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Makes a message visible again after `delay_secs` seconds (retry with backoff).
    fn retry_after(
        &self,
        receipt: &str,
        delay_secs: u32,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Messages in the dead-letter queue (for `sandboxctl status` and tests).
    fn dead_letter_count(&self) -> impl Future<Output = Result<u64, PortError>> + Send;
}

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

/// Proof that a resource reached its final state, read back from its owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// Unix seconds.
    pub at: u64,
    /// The effect key.
    pub effect_key: EffectKey,
    /// What was confirmed.
    pub kind: ReceiptKind,
}

/// What a receipt confirms.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReceiptKind {
    /// A compute was read back stopped.
    ComputeStopped {
        /// Instance.
        instance_id: InstanceId,
        /// Generation.
        generation: u64,
        /// Why it was stopped (`lease_expired`, `session_deleted`, ...).
        reason: String,
        /// What happened to its workspace (`snapshot <id>`, `deleted`, ...); `none` in
        /// receipts written before workspaces were kept.
        #[serde(default)]
        workspace: WorkspaceDisposition,
    },
    /// `DELETE /agents/sessions/{id}` answered deleted (or 404: already gone).
    SessionDeleted {
        /// The session.
        session_id: SessionId,
    },
    /// The record was closed and the close's workspace disposition applied
    /// ([`sandbox_core::observed::Policy::close_workspace`]): every snapshot deleted
    /// (`deleted`), or the latest kept until `retained_until` (`snapshot <id>`), or
    /// nothing was ever saved (`none`).
    WorkspaceClosed {
        /// What happened to the files.
        workspace: WorkspaceDisposition,
        /// The snapshots still kept (ids, oldest first).
        snapshots: Vec<String>,
        /// Until when they are kept, Unix seconds (the sweeper deletes them after).
        retained_until: Option<u64>,
    },
}

/// Proof of a held effect-key lock, carried by every registry write made under it (a
/// fencing token): the registry refuses the write unless `owner` still holds the lock on
/// `key`, unexpired, at the writer's `now`.
///
/// Why: a worker paused past its lease (GC, a stopped process, a slow network) must not
/// overwrite what the next holder decided (the soak of issue 6 found exactly that: a
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

/// What [`Registry::acquire_slot`] did (issue 13 item 3, the executor cap per
/// deployment).
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
    /// Every record that is not closed, by environment id (the sweep's read, issue 22
    /// item 1): its cost is that of the open records only, never of closed records or
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
    /// cap `cap` (≥ 1; issue 13 item 3), all or nothing, if `fence.owner` holds the lock
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
    /// (issue 25): `true` when written, `false` when one is already stored (nothing
    /// changes: the first close's answer stands). Its own item, outside the record and the
    /// history: it never expires (DynamoDB: no `expires_at`; SQLite: no prune). One
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

/// How long audit entries and receipts are kept by default, seconds (30 days; issue 22
/// item 2): DynamoDB writes them with `expires_at` = `at` + this (TTL), SQLite prunes them
/// after every local sweep, the twin reads them as absent. Every adapter reads an entry
/// with `at + retention <= now` as absent, whether or not it was deleted yet
/// ([`crate::contract::registry_history_retention_contract`]). Terminal records never
/// expire.
pub const DEFAULT_HISTORY_RETENTION_SECS: u64 = 30 * 86_400;

/// What a start produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Started {
    /// The provider accepted it: the instance (possibly still provisioning).
    Instance(ComputeInstance),
    /// The provider answered without an instance (capacity, quota, bad definition —
    /// including failures returned with a success status). Retrying later may work.
    Failed {
        /// The provider's reason, as reported (never a secret).
        reason: String,
    },
}

/// An idle member of the warm pool (issue 27): a pre-started executor that serves no
/// environment yet (its listening executor up, no forwarder or a forwarder waiting for
/// its assignment), single-use: once claimed it is an ordinary instance of one
/// environment, stopped at release like any other, never returned to the pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolMember {
    /// Provider id (the instance id it keeps once claimed).
    pub instance_id: InstanceId,
    /// When it was started, Unix seconds (its age is measured from this).
    pub created_at: u64,
}

/// No deadline: for callers that hold no effect-key lock (tests, operator tools).
pub const NO_DEADLINE: u64 = u64::MAX;

/// Refuses an effect whose deadline passed: `Err` (transient, nothing sent) when
/// `now > not_after` (both Unix seconds). Adapters call it immediately before sending a
/// start or stop, so a worker paused past its lock's lease (a stopped process, a laptop
/// that slept) cannot act on a decision the next holder may have replaced: the window
/// shrinks from "any pause" to the request's own transit time (DynamoDB fences the
/// registry; ECS has no fencing token, so the deadline is the next best thing).
///
/// # Errors
/// A transient [`PortError`] naming `dependency` and `operation`.
pub fn check_deadline(
    dependency: &'static str,
    operation: &'static str,
    now: u64,
    not_after: u64,
) -> Result<(), PortError> {
    if now > not_after {
        return Err(PortError::transient(
            dependency,
            operation,
            format!(
                "not sent: the effect's deadline passed {} s ago (the effect-key lock may be lost)",
                now - not_after
            ),
        ));
    }
    Ok(())
}

/// The compute provider: ECS Fargate tasks, or local child processes.
///
/// Every instance is tagged with deployment, environment, session and generation.
/// docs/ARCHITECTURE.md principle 7, "read by id, list to discover": the controller reads the
/// instance a record names with [`Compute::describe`] (one call, whatever the size of the
/// deployment); only the sweep lists the deployment ([`Compute::list`]), to discover what
/// nobody recorded. What a worker that crashed after a start left unrecorded is found by
/// the next holder of the lock, which sees the lock `recovered` and reads that one
/// environment's live instances ([`Compute::find`], constant cost), and a replayed start
/// with the same idempotency token returns the same task (ECS `clientToken`, 24 h). Starts and stops carry a deadline, `not_after` (Unix seconds): the
/// adapter sends nothing once it passed (see [`check_deadline`]).
pub trait Compute: Workspaces + Send + Sync + 'static {
    /// Starts the executor for `spec` (environment id, remote URL unchanged, generation,
    /// idempotency token), tagged with `deployment`, unless `not_after` passed.
    ///
    /// Idempotent by `spec.idempotency_token` for at least 24 hours: a start whose token
    /// already started an instance returns that instance (whatever its status now) and
    /// starts nothing (ECS API reference, RunTask `clientToken`, "Ensuring idempotency").
    /// Never lists the deployment.
    fn start(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> impl Future<Output = Result<Started, PortError>> + Send;
    /// Reads one instance back by id: one provider call (ECS `DescribeTasks` on the ARN).
    /// `None`: the provider does not know it (ECS `MISSING`). Right after a start that
    /// means "not visible yet", long after it "gone": the caller decides which
    /// ([`sandbox_core::observed::Policy::visibility_window_secs`]); the adapter neither
    /// retries nor infers.
    fn describe(
        &self,
        id: &InstanceId,
    ) -> impl Future<Output = Result<Option<ComputeInstance>, PortError>> + Send;
    /// Reads several instances back by id, in any order; unknown (`MISSING`) ids are left
    /// out. ECS: one `DescribeTasks` per 100 ids (its limit). The default calls
    /// [`Compute::describe`] once per id.
    fn describe_many(
        &self,
        ids: &[InstanceId],
    ) -> impl Future<Output = Result<Vec<ComputeInstance>, PortError>> + Send {
        async move {
            let mut found = Vec::with_capacity(ids.len());
            for id in ids {
                found.extend(self.describe(id).await?);
            }
            Ok(found)
        }
    }
    /// The live instances `deployment` started for one environment, in a constant number
    /// of provider calls (ECS: `ListTasks` with the environment's `startedBy`,
    /// [`sandbox_core::ids::environment_started_by`], as the only filter, then one
    /// `DescribeTasks`): how a worker that takes over an unclean lock finds a compute its
    /// predecessor started but never recorded, without listing the deployment. Eventually
    /// consistent like every list. The default filters [`Compute::list`] (adapters whose
    /// list is local and cheap).
    fn find(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
    ) -> impl Future<Output = Result<Vec<ComputeInstance>, PortError>> + Send {
        async move {
            Ok(self
                .list(deployment)
                .await?
                .into_iter()
                .filter(|i| &i.environment_id == environment_id)
                .collect())
        }
    }
    /// The live (provisioning, pending, running) instances tagged with `deployment`, every
    /// page: discovery for the sweep, never evidence that an instance is gone. Eventually
    /// consistent: a just-started instance may be missing, and one being stopped may be
    /// left out. ECS: `ListTasks` with the task definition's `family` and `desiredStatus`
    /// `RUNNING` (a combination the API reference allows; `startedBy` is per environment),
    /// every page, then `DescribeTasks` per 100 ARNs, keeping this deployment's tag.
    fn list(
        &self,
        deployment: &DeploymentId,
    ) -> impl Future<Output = Result<Vec<ComputeInstance>, PortError>> + Send;
    /// Asks the provider to stop `id` (SIGTERM, then SIGKILL after a grace; ECS StopTask
    /// with `reason`), unless `not_after` passed. Returns once the request is accepted;
    /// read back with `describe`.
    fn stop(
        &self,
        id: &InstanceId,
        reason: &str,
        not_after: u64,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Issue 27: starts one warm pool member of `deployment` (see [`PoolMember`]), unless
    /// `not_after` passed. A member is in neither [`Compute::list`] nor [`Compute::find`]
    /// until it is claimed (it names no environment): only in [`Compute::list_pool`].
    /// It is stopped with [`Compute::stop`] like any instance, and a stopped member is
    /// never claimed. The default: a provider without a pool refuses (permanent).
    ///
    /// # Errors
    /// A [`PortError`]: nothing was started, or (transient) the outcome is unknown.
    fn start_pool_member(
        &self,
        _deployment: &DeploymentId,
        _not_after: u64,
    ) -> impl Future<Output = Result<PoolMember, PortError>> + Send {
        async {
            Err(PortError::permanent(
                "compute",
                "start_pool_member",
                "this compute provider has no warm pool",
            ))
        }
    }
    /// Issue 27: the idle, live members of `deployment`'s pool, oldest first (claimed,
    /// stopped or dead members are left out). The default: none.
    fn list_pool(
        &self,
        _deployment: &DeploymentId,
    ) -> impl Future<Output = Result<Vec<PoolMember>, PortError>> + Send {
        async { Ok(Vec::new()) }
    }
    /// Issue 27: assigns `spec` (environment id, session, `remote_url`, generation,
    /// idempotency token, restore) to one idle, live member of `deployment` created at or
    /// after `created_after` (Unix seconds: older members are past their maximum age and
    /// left for the refill to recycle), unless `not_after` passed.
    ///
    /// The pick and the guard against double assignment are ONE conditional write
    /// (idle → assigned): of two concurrent claims, at most one gets a given member
    /// (twin: under its mutex; SQLite: one `UPDATE ... WHERE state = 'idle'` in an
    /// `IMMEDIATE` transaction; DynamoDB: one `TransactWriteItems` whose member update
    /// is conditioned on `#state = :idle`). Idempotent by `spec.idempotency_token`: a
    /// token that already claimed a member returns that member and claims nothing. A token
    /// that started cold is not necessarily known to the pool (ECS keeps a `RunTask`
    /// `clientToken` to itself), which is why a start after an unclean predecessor claims
    /// nothing new ([`crate::pool::REPLAY_ONLY`]) and replays the cold start instead.
    ///
    /// With `created_after` = [`crate::pool::REPLAY_ONLY`] no member is young enough:
    /// only the token's own earlier claim can be returned (after an unclean predecessor).
    ///
    /// `Ok(None)`: a miss (no usable member; the caller starts cold). `Ok(Some(..))`: the
    /// claimed member as an instance of the environment (tagged like a started one, found
    /// by [`Compute::find`] from then on), or `Failed` when the member was claimed but
    /// could not be assigned (it is stopped: single-use). The default: always a miss.
    ///
    /// # Errors
    /// A [`PortError`]: the outcome is unknown (the member may be assigned), as for a
    /// start.
    fn claim_pool_member(
        &self,
        _spec: &StartSpec,
        _deployment: &DeploymentId,
        _created_after: u64,
        _not_after: u64,
    ) -> impl Future<Output = Result<Option<Started>, PortError>> + Send {
        async { Ok(None) }
    }
    /// [`Compute::claim_pool_member`] made while the caller holds the environment's lock
    /// `fence` (docs/WARM_POOL.md rule 2): a provider whose claim is one transaction
    /// includes the lock as a condition of it (DynamoDB: a `ConditionCheck` on the
    /// environment's registry record, `lock_owner = fence.owner` and unexpired), so a
    /// worker whose lock has passed to another claims nothing — an error, the outcome
    /// known (nothing written). The default (providers whose claim cannot see the
    /// registry, and the test doubles): the unfenced claim.
    fn claim_pool_member_fenced(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        created_after: u64,
        not_after: u64,
        _fence: &Fence,
    ) -> impl Future<Output = Result<Option<Started>, PortError>> + Send {
        self.claim_pool_member(spec, deployment, created_after, not_after)
    }
    /// Issue 27: stops the idle member `id` for its age, unless it was claimed since the
    /// refill listed it. The guard is one conditional write (idle → recycled: twin under
    /// its mutex, SQLite `UPDATE ... WHERE state = 'idle'`, DynamoDB `UpdateItem` with
    /// `ConditionExpression` `#state = :idle`), then the stop (reason
    /// [`crate::pool::RECYCLE_REASON`]), unless `not_after` passed. A recycled member is
    /// never claimed. `Ok(false)`: it was claimed (it serves an environment now and is left
    /// alone) or is no longer a member. The default stops it (providers without a pool
    /// have no members).
    ///
    /// # Errors
    /// A [`PortError`] of the write or the stop: the member may be recycled and not yet
    /// stopped; the next refill stops it (it is no longer idle, so nobody claims it).
    fn recycle_pool_member(
        &self,
        id: &InstanceId,
        not_after: u64,
    ) -> impl Future<Output = Result<bool, PortError>> + Send {
        async move {
            self.stop(id, crate::pool::RECYCLE_REASON, not_after)
                .await
                .map(|()| true)
        }
    }
    /// Issue 27: ends what the pool's bookkeeping lost track of in `deployment`, unless
    /// `not_after` passed, and returns how many members it stopped or forgot: a member
    /// started whose bookkeeping was never written (ECS: a pool task no item names, a
    /// worker killed between `RunTask` and `PutItem`) is stopped once it is older than
    /// the provider's visibility window; bookkeeping of a member that is gone (an idle
    /// item whose task stopped, a local member's directory whose executor exited) is
    /// dropped; a member recycled but not yet stopped is stopped. Runs first in every
    /// refill. The default: nothing to reconcile.
    ///
    /// # Errors
    /// A [`PortError`] of a read or a stop; what was done stays done.
    fn reconcile_pool(
        &self,
        _deployment: &DeploymentId,
        _not_after: u64,
    ) -> impl Future<Output = Result<usize, PortError>> + Send {
        async { Ok(0) }
    }
    /// Issue 27: takes `deployment`'s refill lease for `lease_secs` as `holder` at `now`
    /// (Unix seconds), so that concurrent refills (several Lambda workers) do not overfill
    /// the pool: `Ok(false)` while another holder's lease runs. DynamoDB: one conditional
    /// `UpdateItem` on `refill#<deployment>` (`attribute_not_exists(lease_until) OR
    /// lease_until < :now`). The lease is never released early: it also spaces refills
    /// `lease_secs` apart. The default: always `Ok(true)` (one refill loop per process:
    /// local mode, the twin).
    ///
    /// # Errors
    /// A [`PortError`] of the write: no refill this time.
    fn take_pool_refill_lease(
        &self,
        _deployment: &DeploymentId,
        _holder: &str,
        _now: u64,
        _lease_secs: u64,
    ) -> impl Future<Output = Result<bool, PortError>> + Send {
        async { Ok(true) }
    }
}

/// What kind of stored workspace a [`StoredWorkspace`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoredKind {
    /// A saved copy (EBS snapshot, local archive).
    Snapshot,
    /// A working copy (EBS volume, local directory).
    Volume,
}

/// One stored workspace of this deployment, as the provider lists it (tagged deployment,
/// environment, generation): what the sweeper reconciles against the records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredWorkspace {
    /// Snapshot or working copy.
    pub kind: StoredKind,
    /// Provider id (`snap-…`, `vol-…`, an archive or directory name).
    pub id: String,
    /// The environment (tag).
    pub environment_id: EnvironmentId,
    /// The generation (tag).
    pub generation: sandbox_core::ids::Generation,
    /// When it was created, Unix seconds.
    pub created_at: u64,
    /// Attached to a running compute (an EBS volume `in-use`, a local directory of a live
    /// executor): never deleted.
    pub in_use: bool,
}

/// Workspace persistence: files outlive compute (docs/ARCHITECTURE.md principle 8; agents-api.md:
/// "reusing the environment ID does not restore files in replacement compute").
///
/// The controller calls [`Workspaces::save_workspace`] only after the compute of that
/// generation was read back stopped (ECS `STOPPED`): nothing writes to the files any more.
/// Restoring is part of [`Compute::start`] ([`StartSpec::restore`]), so the sandbox never
/// holds a credential for it. Every method is idempotent, and deletes of what is already
/// gone succeed. The defaults keep nothing (`none`): a provider without persistence.
pub trait Workspaces: Send + Sync + 'static {
    /// Saves the workspace of `generation` of `environment_id`: requests its snapshot
    /// (EBS `CreateSnapshot`) and returns at once, without waiting for it to complete and
    /// without deleting the working copy (issue 23: the record must name the snapshot
    /// before the working copy can go; [`Workspaces::delete_working_copy`] does that once
    /// the snapshot is `completed`). Returns `Snapshot { id }` (its state may be
    /// `pending`: [`Workspaces::snapshot_state`]), `None` when there is nothing to save
    /// (never written or saved already and gone), or `RetainedLocalDir` when the working
    /// copy could not be saved and was left in place. A second call for a generation
    /// already saved returns the same snapshot (one in `error` does not count: a new one
    /// is taken).
    ///
    /// # Errors
    /// A [`PortError`]: nothing was deleted; the caller retries (e.g. through the queue
    /// while ECS still detaches the volume).
    fn save_workspace(
        &self,
        _deployment: &DeploymentId,
        _environment_id: &EnvironmentId,
        _generation: sandbox_core::ids::Generation,
    ) -> impl Future<Output = Result<WorkspaceDisposition, PortError>> + Send {
        async { Ok(WorkspaceDisposition::None) }
    }
    /// The state of snapshot `snapshot_id` of `deployment` (EBS `DescribeSnapshots`; a
    /// local archive is `completed` once it exists). A snapshot the provider does not know
    /// is [`SnapshotState::Gone`]. The default (no persistence): `completed`.
    ///
    /// # Errors
    /// A [`PortError`]: the state is unknown; nothing may start from it.
    fn snapshot_state(
        &self,
        _deployment: &DeploymentId,
        _snapshot_id: &str,
    ) -> impl Future<Output = Result<SnapshotState, PortError>> + Send {
        async { Ok(SnapshotState::Completed) }
    }
    /// Deletes the working copy of `generation` (EBS: its volumes) once `snapshot_id`, the
    /// snapshot the record names for it, is `completed`: `Ok(true)` when deleted or
    /// already gone, `Ok(false)` when kept because the snapshot is not `completed` yet (a
    /// later save of that generation or the sweeper deletes it). The caller calls it only
    /// after the record naming `snapshot_id` was written (issue 23: the only copy of the
    /// files is never a snapshot nobody recorded). The default: `Ok(true)`.
    ///
    /// # Errors
    /// A [`PortError`]: nothing was deleted; retry.
    fn delete_working_copy(
        &self,
        _deployment: &DeploymentId,
        _environment_id: &EnvironmentId,
        _generation: sandbox_core::ids::Generation,
        _snapshot_id: &str,
    ) -> impl Future<Output = Result<bool, PortError>> + Send {
        async { Ok(true) }
    }
    /// Deletes the working copy of `generation` without saving it (a close with
    /// `delete`, an orphan, a divergent duplicate). `Deleted` or `None` (nothing there).
    ///
    /// # Errors
    /// A [`PortError`]: retry.
    fn discard_workspace(
        &self,
        _deployment: &DeploymentId,
        _environment_id: &EnvironmentId,
        _generation: sandbox_core::ids::Generation,
    ) -> impl Future<Output = Result<WorkspaceDisposition, PortError>> + Send {
        async { Ok(WorkspaceDisposition::None) }
    }
    /// Deletes one stored workspace by kind and id (a pruned or expired snapshot, an
    /// orphaned volume); one that is gone already counts as deleted. A working copy that
    /// has snapshots, none of them `completed`, is kept (a transient error): it may be
    /// the only copy of the files (issue 23).
    ///
    /// # Errors
    /// A [`PortError`]: retry.
    fn delete_stored(
        &self,
        _deployment: &DeploymentId,
        _kind: StoredKind,
        _id: &str,
    ) -> impl Future<Output = Result<(), PortError>> + Send {
        async { Ok(()) }
    }
    /// Every stored workspace of `deployment` (snapshots and working copies), every page:
    /// the sweeper's inventory. Linear in what is stored.
    ///
    /// # Errors
    /// A [`PortError`]: the sweeper deletes nothing on a partial inventory.
    fn list_stored(
        &self,
        _deployment: &DeploymentId,
    ) -> impl Future<Output = Result<Vec<StoredWorkspace>, PortError>> + Send {
        async { Ok(Vec::new()) }
    }
}
