//! [`SqliteRegistry`]: the controller's registry on SQLite, with the conditional semantics
//! the DynamoDB registry has.
//!
//! Tables (all in one database file, shareable with the queues and the compute state):
//! - `registry_records`: effect key, environment, session (indexed), `version`, the record
//!   as JSON, last write time. A create is `INSERT ... ON CONFLICT DO NOTHING` (DynamoDB:
//!   `attribute_not_exists`); an update is `UPDATE ... WHERE version = ?expected`
//!   (DynamoDB: `version = :expected`); zero changed rows is [`Write::Conflict`].
//! - `registry_locks`: effect key, owner, `until` (Unix seconds). Taken in an `IMMEDIATE`
//!   transaction when absent or expired (`until < now`), reading the record in the same
//!   transaction (a row found expired makes the take `recovered`). Every write under the
//!   lock (`put`, `release`) runs in one `IMMEDIATE` transaction that first checks the
//!   fence (`owner` matches and `until >= now`). A clean release deletes the row; an
//!   unclean one sets `until = 0` (expired, so the next take is `recovered`).
//!   The partial index `registry_records_open` holds the rows whose record is not closed:
//!   [`Registry::list_open`] (the sweep's read) walks it and never the closed rows
//!   (the same read as DynamoDB's sparse `by_open` index).
//! - `registry_ledger`: webhook id, `expires_at` (Unix seconds); an entry with
//!   `expires_at <= now` reads as absent (DynamoDB TTL deletes late, so the same rule).
//! - `registry_audit`: append-only, ordered by an autoincrement id.
//! - `registry_receipts`: per effect key, ordered by an autoincrement id.
//! - History expires: an audit entry or a receipt older than the
//!   retention ([`SqliteRegistry::with_history_retention`], default 30 days) reads as
//!   absent, and [`SqliteRegistry::prune_history`] (called after every local sweep)
//!   deletes a bounded batch of them, oldest first, as DynamoDB's TTL does.
//! - `registry_slot_holders` (effect key, `acquired_at`) and `registry_slot_counter` (one
//!   row, `in_use`): the executor cap per deployment. An acquire or a
//!   release is one `IMMEDIATE` transaction that checks the fence, then the holder and the
//!   counter (`in_use < cap`), and changes both or neither.
//! - `registry_terminals`: effect key, `closed_at`, the close's terminal record
//!   as JSON; written once (`INSERT ... ON CONFLICT DO NOTHING`: zero changed rows means
//!   one is already stored) and never pruned with the history.

use crate::db::{Db, DbError, from_sql_int, now_ms, to_sql_int};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use sandbox_controller::ports::{
    AuditEntry, Fence, Locked, PortError, Receipt, Registry, Release, Slot, SlotHolder,
    SlotRelease, Slots, StoredRecord, Write,
};
use sandbox_core::ids::{EffectKey, EnvironmentId, SessionId};
use sandbox_core::record::Record;
use std::path::Path;

const DEP: &str = "registry";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS registry_records (
    effect_key TEXT PRIMARY KEY,
    environment_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    record TEXT NOT NULL,
    updated_at_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS registry_records_session ON registry_records (session_id);
CREATE INDEX IF NOT EXISTS registry_records_open ON registry_records (effect_key)
    WHERE json_extract(record, '$.status') <> 'closed';
CREATE TABLE IF NOT EXISTS registry_locks (
    effect_key TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    until INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS registry_ledger (
    webhook_id TEXT PRIMARY KEY,
    expires_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS registry_ledger_expiry ON registry_ledger (expires_at);
CREATE TABLE IF NOT EXISTS registry_audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    effect_key TEXT NOT NULL,
    session_id TEXT NOT NULL,
    at INTEGER NOT NULL,
    entry TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS registry_audit_key ON registry_audit (effect_key, id);
CREATE INDEX IF NOT EXISTS registry_audit_session ON registry_audit (session_id, id);
CREATE INDEX IF NOT EXISTS registry_audit_at ON registry_audit (at);
CREATE TABLE IF NOT EXISTS registry_receipts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    effect_key TEXT NOT NULL,
    at INTEGER NOT NULL,
    receipt TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS registry_receipts_key ON registry_receipts (effect_key, id);
CREATE INDEX IF NOT EXISTS registry_receipts_at ON registry_receipts (at);
CREATE TABLE IF NOT EXISTS registry_slot_holders (
    effect_key TEXT PRIMARY KEY,
    environment_id TEXT NOT NULL,
    acquired_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS registry_slot_counter (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    in_use INTEGER NOT NULL CHECK (in_use >= 0)
);
CREATE TABLE IF NOT EXISTS registry_terminals (
    effect_key TEXT PRIMARY KEY,
    closed_at INTEGER NOT NULL,
    terminal TEXT NOT NULL
);
";

/// The executor slots' counter (0 when the row was never written).
fn slots_in_use(conn: &Connection) -> Result<u64, DbError> {
    let n: Option<i64> = conn
        .query_row(
            "SELECT in_use FROM registry_slot_counter WHERE id = 1",
            [],
            |r| r.get(0),
        )
        .optional()?;
    Ok(n.map_or(0, from_sql_int))
}

fn holds_slot(conn: &Connection, key: &str) -> Result<bool, DbError> {
    Ok(conn
        .query_row(
            "SELECT 1 FROM registry_slot_holders WHERE effect_key = ?1",
            params![key],
            |_| Ok(()),
        )
        .optional()?
        .is_some())
}

/// The registry on SQLite. Cheap to clone (clones share one connection); several handles
/// or processes may share the database file.
#[derive(Clone, Debug)]
pub struct SqliteRegistry {
    db: Db,
    /// Seconds audit entries and receipts are kept.
    history_retention_secs: u64,
}

pub use sandbox_controller::ports::DEFAULT_HISTORY_RETENTION_SECS;

fn now_secs() -> u64 {
    u64::try_from(now_ms() / 1000).unwrap_or(0)
}

fn decode_record(json: &str, version: i64) -> Result<Record, DbError> {
    let mut record: Record = serde_json::from_str(json)?;
    record.version = from_sql_int(version);
    Ok(record)
}

fn read_record(conn: &Connection, key: &str) -> Result<Option<Record>, DbError> {
    let row: Option<(String, i64)> = conn
        .query_row(
            "SELECT record, version FROM registry_records WHERE effect_key = ?1",
            params![key],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    row.map(|(json, v)| decode_record(&json, v)).transpose()
}

/// Whether `fence.owner` holds the lock on `fence.key` at `now` (held while `now <= until`).
fn holds(conn: &Connection, fence: &Fence, now: u64) -> Result<bool, DbError> {
    Ok(conn
        .query_row(
            "SELECT 1 FROM registry_locks WHERE effect_key = ?1 AND owner = ?2 AND until >= ?3",
            params![fence.key.as_str(), fence.owner, to_sql_int(now)],
            |_| Ok(()),
        )
        .optional()?
        .is_some())
}

fn remember(conn: &Connection, webhook_id: &str, expires_at: u64) -> Result<(), DbError> {
    conn.execute(
        "INSERT INTO registry_ledger (webhook_id, expires_at) VALUES (?1, ?2)
         ON CONFLICT (webhook_id) DO UPDATE SET expires_at = excluded.expires_at",
        params![webhook_id, to_sql_int(expires_at)],
    )?;
    Ok(())
}

/// A record encoded for a conditional write.
struct RecordRow {
    key: String,
    env: String,
    session: String,
    json: String,
    expected: Option<u64>,
    version: u64,
}

impl RecordRow {
    fn encode(
        fence: &Fence,
        record: &Record,
        expected: Option<u64>,
        operation: &'static str,
    ) -> Result<Self, PortError> {
        let StoredRecord { version, json } =
            StoredRecord::encode(fence, record, expected, operation)?;
        Ok(Self {
            key: fence.key.as_str().to_owned(),
            env: record.environment_id.as_str().to_owned(),
            session: record.session_id.as_str().to_owned(),
            json,
            expected,
            version,
        })
    }

    /// Writes the row if the stored version is the expected one; whether it was written.
    fn write(&self, conn: &Connection) -> Result<bool, DbError> {
        let now = now_ms();
        let changed = match self.expected {
            None => conn.execute(
                "INSERT INTO registry_records
                   (effect_key, environment_id, session_id, version, record, updated_at_ms)
                 VALUES (?1, ?2, ?3, 1, ?4, ?5)
                 ON CONFLICT (effect_key) DO NOTHING",
                params![self.key, self.env, self.session, self.json, now],
            )?,
            Some(expected) => conn.execute(
                "UPDATE registry_records
                 SET session_id = ?2, version = ?3, record = ?4, updated_at_ms = ?5
                 WHERE effect_key = ?1 AND version = ?6",
                params![
                    self.key,
                    self.session,
                    to_sql_int(self.version),
                    self.json,
                    now,
                    to_sql_int(expected)
                ],
            )?,
        };
        Ok(changed == 1)
    }
}

/// An audit entry encoded for the append.
struct AuditRow {
    key: String,
    session: String,
    at: i64,
    json: String,
}

impl AuditRow {
    fn encode(entry: &AuditEntry) -> Result<Self, PortError> {
        let json = serde_json::to_string(entry).map_err(|e| {
            PortError::permanent(DEP, "audit", format!("entry could not be encoded: {e}"))
        })?;
        Ok(Self {
            key: entry.effect_key.as_str().to_owned(),
            session: entry.session_id.as_str().to_owned(),
            at: to_sql_int(entry.at),
            json,
        })
    }

    fn insert(&self, conn: &Connection) -> Result<(), DbError> {
        conn.execute(
            "INSERT INTO registry_audit (effect_key, session_id, at, entry) VALUES (?1, ?2, ?3, ?4)",
            params![self.key, self.session, self.at, self.json],
        )?;
        Ok(())
    }
}

impl SqliteRegistry {
    /// Opens (creating if needed) the registry tables in the database file `path`. Blocks
    /// briefly.
    ///
    /// # Errors
    /// A permanent [`PortError`] when the file cannot be opened or the schema not created.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, PortError> {
        let db =
            Db::open(path.as_ref(), SCHEMA).map_err(|e| DbError::Sql(e).into_port(DEP, "open"))?;
        Ok(Self {
            db,
            history_retention_secs: DEFAULT_HISTORY_RETENTION_SECS,
        })
    }

    /// The same registry keeping audit entries and receipts `secs` seconds (older ones
    /// read as absent and are pruned). Makes no call.
    #[must_use]
    pub fn with_history_retention(mut self, secs: u64) -> Self {
        self.history_retention_secs = secs;
        self
    }

    /// Seconds audit entries and receipts are kept.
    pub fn history_retention_secs(&self) -> u64 {
        self.history_retention_secs
    }

    /// Entries written at or before this time (Unix seconds) have expired at `now`.
    fn history_cutoff(&self, now: u64) -> i64 {
        to_sql_int(now.saturating_sub(self.history_retention_secs))
    }

    /// Deletes at most `max` expired audit entries and at most `max` expired receipts
    /// (oldest first), and the expired ledger entries; returns how many history rows were
    /// deleted. Bounded, so a backlog never holds the database's write lock for long: what
    /// is left goes on the next call.
    ///
    /// # Errors
    /// A [`PortError`] when the database fails.
    pub async fn prune_history(&self, now: u64, max: usize) -> Result<u64, PortError> {
        let cutoff = self.history_cutoff(now);
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        self.db
            .call(DEP, "prune_history", move |conn| {
                let mut n = 0;
                for table in ["registry_audit", "registry_receipts"] {
                    n += conn.execute(
                        &format!(
                            "DELETE FROM {table} WHERE id IN
                               (SELECT id FROM {table} WHERE at <= ?1 ORDER BY at LIMIT ?2)"
                        ),
                        params![cutoff, max],
                    )?;
                }
                conn.execute(
                    "DELETE FROM registry_ledger WHERE expires_at <= ?1",
                    params![to_sql_int(now)],
                )?;
                Ok(n as u64)
            })
            .await
    }

    /// The audit entries of one effect key, oldest first (for `sandboxctl explain`).
    ///
    /// # Errors
    /// A [`PortError`] when the database fails or an entry cannot be decoded.
    pub async fn audit_entries(&self, key: &EffectKey) -> Result<Vec<AuditEntry>, PortError> {
        self.json_rows(
            "audit_entries",
            "SELECT entry FROM registry_audit WHERE effect_key = ?1 AND at > ?2 ORDER BY id",
            Some((key, self.history_cutoff(now_secs()))),
        )
        .await
    }

    /// Every audit entry, in the order they were written (the timeline of `sandboxctl
    /// demo`).
    ///
    /// # Errors
    /// A [`PortError`] when the database fails or an entry cannot be decoded.
    pub async fn audit_log(&self) -> Result<Vec<AuditEntry>, PortError> {
        self.json_rows(
            "audit_log",
            "SELECT entry FROM registry_audit ORDER BY id",
            None,
        )
        .await
    }

    /// Every receipt, in the order they were written.
    ///
    /// # Errors
    /// A [`PortError`] when the database fails or a receipt cannot be decoded.
    pub async fn receipt_log(&self) -> Result<Vec<Receipt>, PortError> {
        self.json_rows(
            "receipt_log",
            "SELECT receipt FROM registry_receipts ORDER BY id",
            None,
        )
        .await
    }

    /// Runs `sql` (one JSON text column, optionally bound to an effect key as `?1` and a
    /// history cutoff, Unix seconds, as `?2`) and decodes every row.
    async fn json_rows<T>(
        &self,
        operation: &'static str,
        sql: &'static str,
        key: Option<(&EffectKey, i64)>,
    ) -> Result<Vec<T>, PortError>
    where
        T: serde::de::DeserializeOwned + Send + 'static,
    {
        let key = key.map(|(k, cutoff)| (k.as_str().to_owned(), cutoff));
        self.db
            .call(DEP, operation, move |conn| {
                let mut stmt = conn.prepare_cached(sql)?;
                let column = |r: &rusqlite::Row<'_>| r.get::<_, String>(0);
                let rows: Vec<String> = match &key {
                    Some((k, cutoff)) => stmt
                        .query_map(params![k, cutoff], column)?
                        .collect::<Result<_, _>>()?,
                    None => stmt.query_map([], column)?.collect::<Result<_, _>>()?,
                };
                let mut out = Vec::new();
                for json in rows {
                    out.push(serde_json::from_str(&json)?);
                }
                Ok(out)
            })
            .await
    }

    /// Deletes ledger entries that expired at `now` (Unix seconds); returns how many. Reads
    /// already treat them as absent: this only reclaims space.
    ///
    /// # Errors
    /// A [`PortError`] when the database fails.
    pub async fn purge_expired_deliveries(&self, now: u64) -> Result<u64, PortError> {
        self.db
            .call(DEP, "purge_expired_deliveries", move |conn| {
                let n = conn.execute(
                    "DELETE FROM registry_ledger WHERE expires_at <= ?1",
                    params![to_sql_int(now)],
                )?;
                Ok(n as u64)
            })
            .await
    }

    /// The current holder of the lock on `key` and its expiry (Unix seconds), expired or
    /// not (for `sandboxctl status`).
    ///
    /// # Errors
    /// A [`PortError`] when the database fails.
    pub async fn lock_holder(&self, key: &EffectKey) -> Result<Option<(String, u64)>, PortError> {
        let key = key.as_str().to_owned();
        self.db
            .call(DEP, "lock_holder", move |conn| {
                Ok(conn
                    .query_row(
                        "SELECT owner, until FROM registry_locks WHERE effect_key = ?1",
                        params![key],
                        |r| Ok((r.get::<_, String>(0)?, from_sql_int(r.get(1)?))),
                    )
                    .optional()?)
            })
            .await
    }
}

impl Registry for SqliteRegistry {
    async fn get(&self, key: &EffectKey) -> Result<Option<Record>, PortError> {
        let key = key.as_str().to_owned();
        self.db
            .call(DEP, "get", move |conn| read_record(conn, &key))
            .await
    }

    async fn find_by_session(&self, session: &SessionId) -> Result<Option<Record>, PortError> {
        let session = session.as_str().to_owned();
        self.db
            .call(DEP, "find_by_session", move |conn| {
                let row: Option<(String, i64)> = conn
                    .query_row(
                        "SELECT record, version FROM registry_records WHERE session_id = ?1
                         ORDER BY updated_at_ms DESC, effect_key LIMIT 1",
                        params![session],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?;
                row.map(|(json, v)| decode_record(&json, v)).transpose()
            })
            .await
    }

    async fn put(
        &self,
        fence: &Fence,
        now: u64,
        record: &Record,
        expected_version: Option<u64>,
    ) -> Result<Write, PortError> {
        let row = RecordRow::encode(fence, record, expected_version, "put")?;
        let fence = fence.clone();
        self.db
            .call(DEP, "put", move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                if !holds(&tx, &fence, now)? || !row.write(&tx)? {
                    return Ok(Write::Conflict);
                }
                tx.commit()?;
                Ok(Write::Written(row.version))
            })
            .await
    }

    async fn list(&self) -> Result<Vec<Record>, PortError> {
        self.db
            .call(DEP, "list", move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT record, version FROM registry_records ORDER BY effect_key",
                )?;
                let rows =
                    stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
                let mut out = Vec::new();
                for row in rows {
                    let (json, v) = row?;
                    out.push(decode_record(&json, v)?);
                }
                Ok(out)
            })
            .await
    }

    async fn list_open(&self) -> Result<Vec<Record>, PortError> {
        self.db
            .call(DEP, "list_open", move |conn| {
                // The WHERE clause is the partial index's, so SQLite reads that index.
                let mut stmt = conn.prepare_cached(
                    "SELECT record, version FROM registry_records INDEXED BY registry_records_open
                     WHERE json_extract(record, '$.status') <> 'closed' ORDER BY effect_key",
                )?;
                let rows =
                    stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
                let mut out = Vec::new();
                for row in rows {
                    let (json, v) = row?;
                    out.push(decode_record(&json, v)?);
                }
                out.sort_by(|a: &Record, b: &Record| a.environment_id.cmp(&b.environment_id));
                Ok(out)
            })
            .await
    }

    async fn lock(
        &self,
        key: &EffectKey,
        owner: &str,
        until: u64,
        now: u64,
    ) -> Result<Option<Locked>, PortError> {
        let key = key.as_str().to_owned();
        let owner = owner.to_owned();
        self.db
            .call(DEP, "lock", move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let previous: Option<i64> = tx
                    .query_row(
                        "SELECT until FROM registry_locks WHERE effect_key = ?1",
                        params![key],
                        |r| r.get(0),
                    )
                    .optional()?;
                if previous.is_some_and(|until| from_sql_int(until) >= now) {
                    return Ok(None);
                }
                tx.execute(
                    "INSERT INTO registry_locks (effect_key, owner, until) VALUES (?1, ?2, ?3)
                     ON CONFLICT (effect_key) DO UPDATE
                       SET owner = excluded.owner, until = excluded.until",
                    params![key, owner, to_sql_int(until)],
                )?;
                let record = read_record(&tx, &key)?;
                tx.commit()?;
                Ok(Some(Locked {
                    record,
                    recovered: previous.is_some(),
                }))
            })
            .await
    }

    async fn release(
        &self,
        fence: &Fence,
        now: u64,
        release: Release<'_>,
    ) -> Result<bool, PortError> {
        let row = release
            .record
            .map(|(record, expected)| RecordRow::encode(fence, record, expected, "release"))
            .transpose()?;
        let audit = release.audit.map(AuditRow::encode).transpose()?;
        let delivery = release.delivery.map(|(id, at)| (id.to_owned(), at));
        let clean = release.clean;
        let fence = fence.clone();
        self.db
            .call(DEP, "release", move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                if !holds(&tx, &fence, now)? {
                    return Ok(false);
                }
                if let Some(row) = &row
                    && !row.write(&tx)?
                {
                    return Ok(false);
                }
                if let Some(audit) = &audit {
                    audit.insert(&tx)?;
                }
                if let Some((id, expires_at)) = &delivery {
                    remember(&tx, id, *expires_at)?;
                }
                if clean {
                    tx.execute(
                        "DELETE FROM registry_locks WHERE effect_key = ?1",
                        params![fence.key.as_str()],
                    )?;
                } else {
                    // Left expired: the next holder sees `recovered`.
                    tx.execute(
                        "UPDATE registry_locks SET until = 0 WHERE effect_key = ?1",
                        params![fence.key.as_str()],
                    )?;
                }
                tx.commit()?;
                Ok(true)
            })
            .await
    }

    async fn seen_delivery(&self, webhook_id: &str, now: u64) -> Result<bool, PortError> {
        let webhook_id = webhook_id.to_owned();
        self.db
            .call(DEP, "seen_delivery", move |conn| {
                Ok(conn
                    .query_row(
                        "SELECT 1 FROM registry_ledger WHERE webhook_id = ?1 AND expires_at > ?2",
                        params![webhook_id, to_sql_int(now)],
                        |_| Ok(()),
                    )
                    .optional()?
                    .is_some())
            })
            .await
    }

    async fn remember_delivery(&self, webhook_id: &str, expires_at: u64) -> Result<(), PortError> {
        let webhook_id = webhook_id.to_owned();
        self.db
            .call(DEP, "remember_delivery", move |conn| {
                remember(conn, &webhook_id, expires_at)
            })
            .await
    }

    async fn audit(&self, entry: &AuditEntry) -> Result<(), PortError> {
        let row = AuditRow::encode(entry)?;
        self.db
            .call(DEP, "audit", move |conn| row.insert(conn))
            .await
    }

    async fn receipt(&self, receipt: &Receipt) -> Result<(), PortError> {
        let json = serde_json::to_string(receipt).map_err(|e| {
            PortError::permanent(DEP, "receipt", format!("receipt could not be encoded: {e}"))
        })?;
        let key = receipt.effect_key.as_str().to_owned();
        let at = to_sql_int(receipt.at);
        self.db
            .call(DEP, "receipt", move |conn| {
                conn.execute(
                    "INSERT INTO registry_receipts (effect_key, at, receipt) VALUES (?1, ?2, ?3)",
                    params![key, at, json],
                )?;
                Ok(())
            })
            .await
    }

    async fn receipts(&self, key: &EffectKey) -> Result<Vec<Receipt>, PortError> {
        self.json_rows(
            "receipts",
            "SELECT receipt FROM registry_receipts WHERE effect_key = ?1 AND at > ?2 ORDER BY id",
            Some((key, self.history_cutoff(now_secs()))),
        )
        .await
    }

    async fn acquire_slot(&self, fence: &Fence, now: u64, cap: u32) -> Result<Slot, PortError> {
        let fence = fence.clone();
        self.db
            .call(DEP, "acquire_slot", move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                if !holds(&tx, &fence, now)? {
                    return Ok(Slot::LockLost);
                }
                if holds_slot(&tx, fence.key.as_str())? {
                    return Ok(Slot::Held);
                }
                if slots_in_use(&tx)? >= u64::from(cap) {
                    return Ok(Slot::Full);
                }
                let Some(env) = fence.key.environment_id() else {
                    return Err(DbError::Invalid(format!(
                        "not an environment's effect key: {}",
                        fence.key
                    )));
                };
                tx.execute(
                    "INSERT INTO registry_slot_holders (effect_key, environment_id, acquired_at)
                     VALUES (?1, ?2, ?3)",
                    params![fence.key.as_str(), env.as_str(), to_sql_int(now)],
                )?;
                tx.execute(
                    "INSERT INTO registry_slot_counter (id, in_use) VALUES (1, 1)
                     ON CONFLICT (id) DO UPDATE SET in_use = in_use + 1",
                    [],
                )?;
                tx.commit()?;
                Ok(Slot::Acquired)
            })
            .await
    }

    async fn release_slot(&self, fence: &Fence, now: u64) -> Result<SlotRelease, PortError> {
        let fence = fence.clone();
        self.db
            .call(DEP, "release_slot", move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                if !holds(&tx, &fence, now)? {
                    return Ok(SlotRelease::LockLost);
                }
                let deleted = tx.execute(
                    "DELETE FROM registry_slot_holders WHERE effect_key = ?1",
                    params![fence.key.as_str()],
                )?;
                if deleted == 0 {
                    return Ok(SlotRelease::NotHeld);
                }
                tx.execute(
                    "UPDATE registry_slot_counter SET in_use = in_use - 1 WHERE id = 1 AND in_use > 0",
                    [],
                )?;
                tx.commit()?;
                Ok(SlotRelease::Released)
            })
            .await
    }

    async fn slots(&self) -> Result<Slots, PortError> {
        self.db
            .call(DEP, "slots", move |conn| {
                let tx = conn.transaction()?;
                let in_use = slots_in_use(&tx)?;
                let mut stmt = tx.prepare_cached(
                    "SELECT environment_id, acquired_at FROM registry_slot_holders ORDER BY effect_key",
                )?;
                let rows = stmt.query_map([], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
                })?;
                let mut holders = Vec::new();
                for row in rows {
                    let (env, at) = row?;
                    holders.push(SlotHolder {
                        environment_id: EnvironmentId::new(env),
                        acquired_at: from_sql_int(at),
                    });
                }
                drop(stmt);
                tx.commit()?;
                Ok(Slots { in_use, holders })
            })
            .await
    }

    async fn put_terminal(
        &self,
        terminal: &sandbox_controller::terminal::TerminalRecord,
    ) -> Result<bool, PortError> {
        let json = serde_json::to_string(terminal).map_err(|e| {
            PortError::permanent(
                DEP,
                "put_terminal",
                format!("terminal record could not be encoded: {e}"),
            )
        })?;
        let key = terminal.effect_key.as_str().to_owned();
        let at = to_sql_int(terminal.closed_at);
        self.db
            .call(DEP, "put_terminal", move |conn| {
                let changed = conn.execute(
                    "INSERT INTO registry_terminals (effect_key, closed_at, terminal) \
                     VALUES (?1, ?2, ?3) ON CONFLICT (effect_key) DO NOTHING",
                    params![key, at, json],
                )?;
                Ok(changed == 1)
            })
            .await
    }

    async fn terminal(
        &self,
        key: &EffectKey,
    ) -> Result<Option<sandbox_controller::terminal::TerminalRecord>, PortError> {
        // Not through `json_rows`: a terminal record has no history cutoff (it never
        // expires with the audit trail and receipts).
        let key = key.as_str().to_owned();
        let json: Option<String> = self
            .db
            .call(DEP, "terminal", move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT terminal FROM registry_terminals WHERE effect_key = ?1",
                )?;
                let mut rows = stmt.query_map(params![key], |r| r.get::<_, String>(0))?;
                Ok(rows.next().transpose()?)
            })
            .await?;
        json.map(|j| {
            serde_json::from_str(&j).map_err(|e| {
                PortError::permanent(
                    DEP,
                    "terminal",
                    format!("terminal record could not be decoded: {e}"),
                )
            })
        })
        .transpose()
    }
}
