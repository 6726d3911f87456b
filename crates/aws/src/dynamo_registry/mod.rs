//! [`DynamoRegistry`]: the controller's [`Registry`] port on one Amazon DynamoDB table.
//!
//! # Table schema
//!
//! One table (what [`create_table`] creates and what the SAM/CDK templates declare):
//!
//! | setting | value |
//! |---|---|
//! | partition key | `pk` (S) |
//! | sort key | `sk` (S) |
//! | billing | on-demand (`PAY_PER_REQUEST`) |
//! | global secondary index | `by_session`: partition key `session_id` (S), projection `KEYS_ONLY` |
//! | global secondary index | `by_open`: partition key `open_shard` (S), sort key `pk` (S), projection `ALL` |
//! | time to live | attribute `expires_at` (N, Unix seconds) |
//!
//! Items (all numbers are DynamoDB `N`; times in Unix seconds unless named `_ms`):
//!
//! | item | `pk` | `sk` | other attributes |
//! |---|---|---|---|
//! | record (and lock) | effect key `agents-api:environment:{id}:compute` | `record` | `record` (S: the [`Record`] as JSON), `version`, `session_id` (S), `environment_id` (S), `updated_at_ms`; `open_shard` (S: `open#{0..15}`) while the record is not closed; the lock: `lock_owner` (S), `lock_until` |
//! | delivery ledger | `webhook#{webhook-id}` | `ledger` | `expires_at` |
//! | audit entry | effect key | `audit#{epoch ms, 15 digits}#{seq, 6 digits}#{16 hex}` | `entry` (S: [`AuditEntry`] JSON), `at`, `expires_at` (`at` + the history retention) |
//! | receipt | effect key | `receipt#{epoch ms, 15 digits}#{seq, 6 digits}#{16 hex}` | `receipt` (S: [`Receipt`] JSON), `at`, `expires_at` (`at` + the history retention) |
//! | executor slot holder | `capacity#executors` | `slot#{environment id}` | `environment_id` (S), `acquired_at` |
//! | executor slot counter | `capacity#executors` | `counter` | `in_use` |
//! | terminal record | effect key | `terminal` | `terminal` (S: the close's [`sandbox_controller::terminal::TerminalRecord`] JSON), `closed_at`; written once (`attribute_not_exists(pk)`), never an `expires_at`: it does not expire with the history |
//!
//! What each read touches (reads proportional to what is live):
//!
//! | read | call | items read |
//! |---|---|---|
//! | the sweep's records ([`Registry::list_open`]) | one `Query` per `by_open` shard (16), every page | the records that are not closed |
//! | executor slots ([`Registry::slots`]) | one consistent `Query` on `capacity#executors` | the counter and the holders |
//! | a record, a lock | `GetItem` / `UpdateItem` on (effect key, `record`) | one |
//! | receipts, audit entries of a key | consistent `Query` on the effect key, `begins_with(sk)` | that key's history within the retention |
//! | [`Registry::list`] (operators' views only) | consistent `Scan` of the table | the whole table |
//!
//! Only record items carry `session_id`, so the `by_session` index is sparse: it holds
//! the records and nothing else. Only records that are not closed carry `open_shard`
//! (every record write sets it, or removes it when the record is closed), so `by_open`
//! holds the open records and nothing else: closed records, history, the ledger and the
//! slot items never cost the sweep a read. Its partition key is sharded by a stable hash
//! (FNV-1a) of the environment id into 16 values, so no single index partition takes
//! every record write of the deployment (DynamoDB's per-partition throughput limit); the
//! sweep queries the 16 shards. The executor slots live in one partition
//! (`capacity#executors`), so reading them is one `Query`, whatever the table holds. The lock lives on the record item, so taking it reads the
//! record in the same call; a key locked before its first record write has an item with
//! the lock attributes only, which reads as no record (and is never listed). The record
//! item has no `expires_at`: TTL never deletes a record or a lock.
//!
//! # Rules
//!
//! - The executor cap per deployment: a slot is taken with one
//!   `TransactWriteItems` of a `ConditionCheck` of the fence on the record item, a `Put` of
//!   the environment's holder with `attribute_not_exists(pk)` and an `Update`
//!   `ADD in_use :one` on the counter with `attribute_not_exists(in_use) OR in_use < :cap`;
//!   given back with the fence, a `Delete` of the holder with `attribute_exists(pk)` and
//!   `ADD in_use :minus_one` with `in_use > :zero`. All or nothing: the counter always
//!   equals the number of holders, and concurrent workers cannot take more than `cap`.
//!   The `CancellationReasons` (request order) say which condition failed: the fence (lock
//!   lost), the holder (already held / not held) or the counter (full). A
//!   `TransactionConflict` (another transaction on the counter at the same moment) is
//!   retried (4 attempts in all, exponential pauses from 20 ms with jitter), then reported
//!   as a contended error ([`PortError::contended`]: the job ends as busy).
//! - Every write is conditional. Lock: `UpdateItem` with
//!   `attribute_not_exists(lock_until) OR lock_until < :now` (absent or expired; held at
//!   `now == lock_until`) and `ReturnValues=ALL_OLD`: the old item is the record, and an
//!   old `lock_until` means the take is `recovered`. Every write under the lock is fenced:
//!   `lock_owner = :owner AND lock_until >= :now`, plus, for a record write,
//!   `attribute_not_exists(version)` (create) or `version = :expected` (update); a failed
//!   condition is [`Write::Conflict`] (or `false` for a release). A release is one
//!   `UpdateItem` on the record item (record attributes set, lock attributes removed — or
//!   `lock_until` set to 0 for an unclean release) or, with an audit entry or a ledger
//!   entry, one `TransactWriteItems` of that update and the puts. Audit and receipt appends:
//!   `attribute_not_exists(pk)`, so a sort-key collision never overwrites (it is retried
//!   with a new suffix). The ledger put is the only unconditional write: remembering again
//!   extends an entry.
//! - DynamoDB TTL deletes expired items late (typically within days) and moto never
//!   deletes them, so reads compare `expires_at` with `now` themselves: a ledger entry with
//!   `expires_at <= now` reads as absent.
//! - History expires: audit entries and receipts carry `expires_at` = `at` + the history
//!   retention ([`DynamoRegistry::with_history_retention`], default
//!   [`DEFAULT_HISTORY_RETENTION_SECS`], 30 days). TTL deletes them late, so reads skip
//!   items whose `expires_at <= now` themselves (a `FilterExpression`).
//! - Reads of the table are strongly consistent (`ConsistentRead`). GSIs are eventually
//!   consistent (DynamoDB does not offer `ConsistentRead` on them): `by_open` may lag a
//!   write by a moment, which is fine for the sweep's discovery (docs/ARCHITECTURE.md principle 7):
//!   each sweep job re-reads its record consistently (its lock-free read, then the lock)
//!   before deciding, and a record missed once is listed by the next sweep. The `by_session`
//!   index is eventually consistent too, so [`Registry::find_by_session`]
//!   re-reads each candidate with a consistent `GetItem` and keeps only records whose
//!   stored session is the one asked for. A record created a moment ago may not be found
//!   by session yet on AWS.
//! - Sort keys of audit entries and receipts start with the write time in milliseconds and
//!   a per-handle sequence number that never goes backwards, so entries written through one
//!   handle list in write order even within one millisecond.
//!
//! Sources: the Amazon DynamoDB Developer Guide (condition expressions, reserved words —
//! every attribute name here goes through an `#name` placeholder —, TTL, GSI
//! consistency, transactions) and the API Reference (PutItem, UpdateItem,
//! TransactWriteItems and its `CancellationReasons`, Query, Scan).
//!
//! Files: this one (the schema's names, [`DynamoRegistry`] and its helpers); `codec.rs`
//! (the items: the fenced record write, decoding, sort keys, the fence as a
//! `ConditionCheck`, cancellation reasons); `registry.rs` (the [`Registry`] port);
//! `table.rs` ([`create_table`]).
//!
//! [`Registry`]: sandbox_controller::ports::Registry
//! [`Registry::list`]: sandbox_controller::ports::Registry::list
//! [`Registry::list_open`]: sandbox_controller::ports::Registry::list_open
//! [`Registry::slots`]: sandbox_controller::ports::Registry::slots
//! [`Registry::find_by_session`]: sandbox_controller::ports::Registry::find_by_session
//! [`Receipt`]: sandbox_controller::ports::Receipt
//! [`Write::Conflict`]: sandbox_controller::ports::Write::Conflict

mod codec;
mod registry;
mod table;

pub(crate) use codec::fence_condition_check;
pub(crate) use table::await_active_with_ttl;
pub use table::create_table;

use crate::sdk_error::port_error;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, Put, TransactWriteItem, Update};
use backon::BackoffBuilder;
use codec::{FencedUpdate, SortKeys, cancellation, decode_record, now_ms, open_shard};
use sandbox_controller::ports::{AuditEntry, Fence, PortError};
use sandbox_core::ids::EffectKey;
use sandbox_core::record::{Record, RecordStatus};
use std::sync::Arc;
use std::time::Duration;

use crate::dynamo_item::{Item, corrupt, get_n, get_s, is_condition_failed, n, s};

const DEP: &str = "registry";

/// Partition key attribute.
pub const PK: &str = "pk";
/// Sort key attribute.
pub const SK: &str = "sk";
/// The global secondary index on `session_id`.
pub const SESSION_INDEX: &str = "by_session";
/// The GSI partition key attribute (records only).
pub const SESSION_ATTR: &str = "session_id";
/// The TTL attribute (Unix seconds).
pub const TTL_ATTR: &str = "expires_at";
/// The sparse global secondary index of the records that are not closed.
pub const OPEN_INDEX: &str = "by_open";
/// Its partition key attribute: `open#{shard}`, present only on records not closed.
pub const OPEN_ATTR: &str = "open_shard";
/// Shards of [`OPEN_INDEX`]'s partition key (the sweep queries each).
pub const OPEN_SHARDS: u64 = 16;
pub use sandbox_controller::ports::DEFAULT_HISTORY_RETENTION_SECS;

const SK_RECORD: &str = "record";
const SK_LEDGER: &str = "ledger";
/// Sort key prefix of an executor slot holder (under [`SLOTS_PK`]).
const SK_SLOT_PREFIX: &str = "slot#";
/// Sort key of a closed session's terminal record (never expires with history).
const SK_TERMINAL: &str = "terminal";
/// The partition key of the deployment's executor slot counter.
const SLOTS_PK: &str = "capacity#executors";
const SK_COUNTER: &str = "counter";
/// Attempts of a slot transaction cancelled by a `TransactionConflict`.
const SLOT_ATTEMPTS: u32 = 4;

/// Pauses between slot transactions cancelled by a `TransactionConflict`: exponential from
/// 20 ms (factor 2, at most 400 ms), each with random jitter (backon adds up to one more
/// pause's length), [`SLOT_ATTEMPTS`] − 1 of them. Jitter keeps workers that collided on
/// the counter from colliding again in lockstep (AWS Architecture Blog, "Exponential
/// Backoff And Jitter"; DynamoDB Developer Guide, "Error handling": retry
/// `TransactionConflict` with exponential backoff).
fn slot_conflict_backoff() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(20))
        .with_factor(2.0)
        .with_max_delay(Duration::from_millis(400))
        .with_max_times((SLOT_ATTEMPTS - 1) as usize)
        .with_jitter()
}
const AUDIT_PREFIX: &str = "audit#";
const RECEIPT_PREFIX: &str = "receipt#";
/// How long [`create_table`] waits for the table to become `ACTIVE`.
const CREATE_WAIT: Duration = Duration::from_secs(120);

/// The registry on DynamoDB. Cheap to clone (clones share the client and the sort-key
/// sequence).
#[derive(Clone, Debug)]
pub struct DynamoRegistry {
    client: Client,
    table: Arc<str>,
    sort_keys: Arc<SortKeys>,
    /// Seconds audit entries and receipts are kept (their `expires_at` = `at` + this).
    history_retention_secs: u64,
}

/// What [`DynamoRegistry::backfill_open_index`] found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenIndexBackfill {
    /// Records without `open_shard` that are not closed (each needs it).
    pub open: u64,
    /// Closed records without it (they belong outside the index: left alone).
    pub closed: u64,
    /// Open records given their `open_shard` by this run.
    pub backfilled: u64,
    /// Open records written meanwhile (their write set it; nothing to do).
    pub changed: u64,
}

impl DynamoRegistry {
    /// A registry on the existing table `table` (see [`create_table`] for its schema).
    /// Makes no call.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        let table: String = table.into();
        Self {
            client,
            table: table.into(),
            sort_keys: Arc::new(SortKeys::default()),
            history_retention_secs: DEFAULT_HISTORY_RETENTION_SECS,
        }
    }

    /// The same registry with audit entries and receipts kept `secs` seconds (their
    /// `expires_at`). Makes no call.
    #[must_use]
    pub fn with_history_retention(mut self, secs: u64) -> Self {
        self.history_retention_secs = secs;
        self
    }

    /// Seconds audit entries and receipts are kept.
    pub fn history_retention_secs(&self) -> u64 {
        self.history_retention_secs
    }

    /// When an entry written at `at` (Unix seconds) expires.
    fn expires_at(&self, at: u64) -> u64 {
        at.saturating_add(self.history_retention_secs)
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Puts the records written before the `by_open` index existed into it:
    /// such a record has no `open_shard`, so
    /// [`Registry::list_open`](sandbox_controller::ports::Registry::list_open) (the sweep's read)
    /// never sees it until its next write. One consistent `Scan` of the record items that
    /// lack the attribute (every page; an operator's one-off, `sandboxctl migrate`: the
    /// functions' roles grant no `Scan`), then for each record that is not closed one
    /// `UpdateItem` `SET open_shard` conditioned on `version = :v AND
    /// attribute_not_exists(open_shard)`: a record written meanwhile already carries it (every
    /// record write sets it), and its failed condition counts as `changed`. With `dry_run`
    /// nothing is written. Idempotent: a second run finds nothing to do.
    ///
    /// # Errors
    /// A [`PortError`] from the `Scan` or an `UpdateItem`, or a record that cannot be
    /// decoded; what was written before it stays written (each update stands alone).
    pub async fn backfill_open_index(&self, dry_run: bool) -> Result<OpenIndexBackfill, PortError> {
        let op = "backfill_open_index";
        let mut pages = self
            .client
            .scan()
            .table_name(self.table.as_ref())
            .consistent_read(true)
            .filter_expression(
                "#sk = :record AND attribute_exists(#record) AND attribute_not_exists(#open)",
            )
            .expression_attribute_names("#sk", SK)
            .expression_attribute_names("#record", "record")
            .expression_attribute_names("#open", OPEN_ATTR)
            .expression_attribute_values(":record", s(SK_RECORD))
            .into_paginator()
            .send();
        let mut missing = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| port_error(DEP, op, &e))?;
            for item in page.items() {
                missing.push(decode_record(item, op)?);
            }
        }
        let mut report = OpenIndexBackfill::default();
        for record in missing {
            if record.status == RecordStatus::Closed {
                report.closed += 1;
                continue;
            }
            report.open += 1;
            if dry_run {
                continue;
            }
            let written = self
                .client
                .update_item()
                .table_name(self.table.as_ref())
                .key(PK, s(record.environment_id.effect_key().as_str()))
                .key(SK, s(SK_RECORD))
                .update_expression("SET #open = :open")
                .condition_expression("#version = :v AND attribute_not_exists(#open)")
                .expression_attribute_names("#open", OPEN_ATTR)
                .expression_attribute_names("#version", "version")
                .expression_attribute_values(":open", s(open_shard(&record.environment_id)))
                .expression_attribute_values(":v", n(record.version))
                .send()
                .await;
            match written {
                Ok(_) => report.backfilled += 1,
                Err(e) if is_condition_failed(&e) => report.changed += 1,
                Err(e) => return Err(port_error(DEP, op, &e)),
            }
        }
        Ok(report)
    }

    /// The audit entries of one effect key, oldest first (for `sandboxctl explain`).
    ///
    /// # Errors
    /// A [`PortError`] when a call fails or an entry cannot be decoded.
    pub async fn audit_entries(&self, key: &EffectKey) -> Result<Vec<AuditEntry>, PortError> {
        let op = "audit_entries";
        self.query_prefix(key, AUDIT_PREFIX, op)
            .await?
            .iter()
            .map(|item| {
                serde_json::from_str(get_s(item, "entry", DEP, op)?)
                    .map_err(|e| corrupt(DEP, op, format!("audit entry could not be decoded: {e}")))
            })
            .collect()
    }

    /// Every item under `key` whose sort key starts with `prefix`, in sort-key order
    /// (consistent Query, every page).
    async fn query_prefix(
        &self,
        key: &EffectKey,
        prefix: &str,
        op: &'static str,
    ) -> Result<Vec<Item>, PortError> {
        let mut pages = self
            .client
            .query()
            .table_name(self.table.as_ref())
            .consistent_read(true)
            .key_condition_expression("#pk = :pk AND begins_with(#sk, :prefix)")
            .expression_attribute_names("#pk", PK)
            .expression_attribute_names("#sk", SK)
            .expression_attribute_values(":pk", s(key.as_str()))
            .expression_attribute_values(":prefix", s(prefix))
            // TTL deletes late: an expired entry reads as absent. Entries written before
            // retention existed have no `expires_at` and are kept.
            .filter_expression("attribute_not_exists(#expires_at) OR #expires_at > :now")
            .expression_attribute_names("#expires_at", TTL_ATTR)
            .expression_attribute_values(":now", n(now_ms() / 1000))
            .scan_index_forward(true)
            .into_paginator()
            .send();
        let mut items = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| port_error(DEP, op, &e))?;
            items.extend(page.items().iter().cloned());
        }
        Ok(items)
    }

    /// Appends an item under `key` with a fresh `prefix` sort key, never overwriting.
    async fn append(
        &self,
        key: &EffectKey,
        prefix: &str,
        attrs: Vec<(&'static str, AttributeValue)>,
        op: &'static str,
    ) -> Result<(), PortError> {
        // A collision needs the same ms, sequence and 64 random bits: one retry suffices.
        for _ in 0..2 {
            let mut req = self
                .client
                .put_item()
                .table_name(self.table.as_ref())
                .item(PK, s(key.as_str()))
                .item(SK, s(self.sort_keys.next(prefix)))
                .condition_expression("attribute_not_exists(#pk)")
                .expression_attribute_names("#pk", PK);
            for (name, value) in &attrs {
                req = req.item(*name, value.clone());
            }
            match req.send().await {
                Ok(_) => return Ok(()),
                Err(e) if is_condition_failed(&e) => continue,
                Err(e) => return Err(port_error(DEP, op, &e)),
            }
        }
        Err(PortError::transient(
            DEP,
            op,
            "sort key collided twice; try again",
        ))
    }

    /// The record item of `key`, read consistently, with its `updated_at_ms`.
    async fn get_record_item(
        &self,
        key: &str,
        op: &'static str,
    ) -> Result<Option<(Record, u64)>, PortError> {
        let out = self
            .client
            .get_item()
            .table_name(self.table.as_ref())
            .key(PK, s(key))
            .key(SK, s(SK_RECORD))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| port_error(DEP, op, &e))?;
        match out.item() {
            // A key locked before its first record write has the lock attributes only.
            Some(item) if item.contains_key("record") => {
                let updated = get_n(item, "updated_at_ms", DEP, op).unwrap_or(0);
                Ok(Some((decode_record(item, op)?, updated)))
            }
            _ => Ok(None),
        }
    }

    /// One fenced `UpdateItem` on the record item; whether the condition held.
    async fn update_fenced(
        &self,
        key: &EffectKey,
        update: FencedUpdate,
        op: &'static str,
    ) -> Result<bool, PortError> {
        let res = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .key(PK, s(key.as_str()))
            .key(SK, s(SK_RECORD))
            .update_expression(update.expression())
            .condition_expression(update.condition)
            .set_expression_attribute_names(Some(update.names))
            .set_expression_attribute_values(Some(update.values))
            .send()
            .await;
        match res {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failed(&e) => Ok(false),
            Err(e) => Err(port_error(DEP, op, &e)),
        }
    }

    /// The fence as a `ConditionCheck` on the record item (the lock's owner, unexpired at
    /// `now`), for transactions that write other items under the lock.
    fn fence_check(
        &self,
        fence: &Fence,
        now: u64,
        op: &'static str,
    ) -> Result<ConditionCheck, PortError> {
        fence_condition_check(&self.table, fence, now, op)
    }

    /// Runs one slot transaction: `None` when it was written, `Some(failed)` with the
    /// condition-failed flag of each item when it was cancelled on a condition. A
    /// `TransactionConflict` is retried ([`SLOT_ATTEMPTS`] attempts in all, pauses from
    /// [`slot_conflict_backoff`]); after the last it is [`PortError::contended`] (the job
    /// ends as busy, not failed).
    async fn slot_transaction(
        &self,
        items: Vec<TransactWriteItem>,
        op: &'static str,
    ) -> Result<Option<Vec<bool>>, PortError> {
        let count = items.len();
        let mut delays = slot_conflict_backoff().build();
        loop {
            let res = self
                .client
                .transact_write_items()
                .set_transact_items(Some(items.clone()))
                .send()
                .await;
            let err = match res {
                Ok(_) => return Ok(None),
                Err(e) => e,
            };
            match cancellation(&err, count) {
                Some((failed, _)) if failed.iter().any(|f| *f) => return Ok(Some(failed)),
                Some((_, true)) => match delays.next() {
                    Some(pause) => tokio::time::sleep(pause).await,
                    None => {
                        return Err(PortError::contended(
                            DEP,
                            op,
                            format!(
                                "TransactionConflict after {SLOT_ATTEMPTS} attempts: {}",
                                DisplayErrorContext(&err)
                            ),
                        ));
                    }
                },
                _ => return Err(port_error(DEP, op, &err)),
            }
        }
    }

    /// The release as one transaction: the fenced update of the record item, the audit
    /// entry (a fresh sort key, never overwriting) and the ledger entry.
    async fn release_transaction(
        &self,
        key: &EffectKey,
        update: FencedUpdate,
        audit: Option<&AuditEntry>,
        delivery: Option<(&str, u64)>,
    ) -> Result<bool, PortError> {
        let op = "release";
        let build = |what: &str, e: aws_sdk_dynamodb::error::BuildError| {
            PortError::permanent(DEP, op, format!("{what} could not be built: {e}"))
        };
        let update = Update::builder()
            .table_name(self.table.as_ref())
            .key(PK, s(key.as_str()))
            .key(SK, s(SK_RECORD))
            .update_expression(update.expression())
            .condition_expression(update.condition)
            .set_expression_attribute_names(Some(update.names))
            .set_expression_attribute_values(Some(update.values))
            .build()
            .map_err(|e| build("update", e))?;
        let audit_json = audit
            .map(|entry| {
                serde_json::to_string(entry).map_err(|e| {
                    PortError::permanent(DEP, op, format!("entry could not be encoded: {e}"))
                })
            })
            .transpose()?;
        // A sort-key collision (same ms, sequence and 64 random bits) cancels the
        // transaction on the audit put: one retry with a new key suffices.
        for _ in 0..2 {
            let mut items = vec![TransactWriteItem::builder().update(update.clone()).build()];
            let audit_at = items.len();
            if let (Some(entry), Some(json)) = (audit, &audit_json) {
                let put = Put::builder()
                    .table_name(self.table.as_ref())
                    .item(PK, s(key.as_str()))
                    .item(SK, s(self.sort_keys.next(AUDIT_PREFIX)))
                    .item("entry", s(json.as_str()))
                    .item("at", n(entry.at))
                    .item(TTL_ATTR, n(self.expires_at(entry.at)))
                    .condition_expression("attribute_not_exists(#pk)")
                    .expression_attribute_names("#pk", PK)
                    .build()
                    .map_err(|e| build("audit put", e))?;
                items.push(TransactWriteItem::builder().put(put).build());
            }
            if let Some((id, expires_at)) = delivery {
                let put = Put::builder()
                    .table_name(self.table.as_ref())
                    .item(PK, s(format!("webhook#{id}")))
                    .item(SK, s(SK_LEDGER))
                    .item(TTL_ATTR, n(expires_at))
                    .build()
                    .map_err(|e| build("ledger put", e))?;
                items.push(TransactWriteItem::builder().put(put).build());
            }
            let res = self
                .client
                .transact_write_items()
                .set_transact_items(Some(items))
                .send()
                .await;
            let err = match res {
                Ok(_) => return Ok(true),
                Err(e) => e,
            };
            let failed = |i: usize| match err.as_service_error() {
                Some(TransactWriteItemsError::TransactionCanceledException(c)) => c
                    .cancellation_reasons()
                    .get(i)
                    .and_then(|r| r.code())
                    .is_some_and(|code| code == "ConditionalCheckFailed"),
                _ => false,
            };
            if failed(0) {
                return Ok(false);
            }
            if audit.is_some() && failed(audit_at) {
                continue;
            }
            return Err(port_error(DEP, op, &err));
        }
        Err(PortError::transient(
            DEP,
            op,
            "audit sort key collided twice; try again",
        ))
    }
}
