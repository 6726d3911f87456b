//! The registry's item shapes: the record's fenced write (`FencedUpdate`), its decoding,
//! the fence as a `ConditionCheck`, the `by_open` shard and slot sort keys, the append-only
//! sort keys of audit entries and receipts, and what a cancelled `TransactWriteItems` says
//! (the schema is in the module docs of [`crate::dynamo_registry`]).

use super::{DEP, OPEN_ATTR, OPEN_SHARDS, PK, SESSION_ATTR, SK, SK_RECORD, SK_SLOT_PREFIX};
use crate::dynamo_item::{Item, corrupt, get_n, get_s, n, s};
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck};
use sandbox_controller::ports::{Fence, PortError, StoredRecord};
use sandbox_core::ids::EnvironmentId;
use sandbox_core::record::{Record, RecordStatus};
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Mutex;

/// The fence of `fence` as a `ConditionCheck` on its record item in the registry table
/// `table` (key `pk` = the effect key, `sk` = `record`): `lock_owner = :lock_owner AND
/// lock_until >= :now` (`now`, Unix seconds), i.e. the lock is still `fence.owner`'s. For
/// transactions that write other items — of this table or another one, as the warm pool's
/// claim (`crate::pool_table`) — only while the worker holds the environment's lock
/// (DynamoDB API Reference, TransactWriteItems: "ConditionCheck — Applies a condition to
/// an item that is not being modified by the transaction").
///
/// # Errors
/// A permanent [`PortError`] when the request cannot be built.
pub(crate) fn fence_condition_check(
    table: &str,
    fence: &Fence,
    now: u64,
    op: &'static str,
) -> Result<ConditionCheck, PortError> {
    ConditionCheck::builder()
        .table_name(table)
        .key(PK, s(fence.key.as_str()))
        .key(SK, s(SK_RECORD))
        .condition_expression("#lock_owner = :lock_owner AND #lock_until >= :now")
        .expression_attribute_names("#lock_owner", "lock_owner")
        .expression_attribute_names("#lock_until", "lock_until")
        .expression_attribute_values(":lock_owner", s(fence.owner.as_str()))
        .expression_attribute_values(":now", n(now))
        .build()
        .map_err(|e| PortError::permanent(DEP, op, format!("fence check could not be built: {e}")))
}

/// FNV-1a: stable across builds and platforms, so a record's shard never moves.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The `open_shard` value of an environment's open record: `open#{0..15}`.
pub(super) fn open_shard(env: &EnvironmentId) -> String {
    format!("open#{}", fnv1a(env.as_str()) % OPEN_SHARDS)
}

pub(super) fn slot_sk(env: &EnvironmentId) -> String {
    format!("{SK_SLOT_PREFIX}{}", env.as_str())
}

/// Monotonic `(epoch ms, sequence)` pairs for append-only sort keys.
#[derive(Debug, Default)]
pub(super) struct SortKeys {
    last: Mutex<(u64, u64)>,
}

impl SortKeys {
    /// `{prefix}{ms:015}#{seq:06}#{random:016x}`: ms never goes backwards on this handle,
    /// seq increments within one ms.
    pub(super) fn next(&self, prefix: &str) -> String {
        let now = now_ms();
        let (ms, seq) = {
            let mut last = self
                .last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *last = if now > last.0 {
                (now, 0)
            } else {
                (last.0, last.1 + 1)
            };
            *last
        };
        let random = std::hash::RandomState::new().hash_one((ms, seq, std::process::id()));
        format!("{prefix}{ms:015}#{seq:06}#{random:016x}")
    }
}

pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

pub(super) fn decode_record(item: &Item, operation: &'static str) -> Result<Record, PortError> {
    let json = get_s(item, "record", DEP, operation)?;
    let version = get_n(item, "version", DEP, operation)?;
    let mut record: Record = serde_json::from_str(json).map_err(|e| {
        corrupt(
            DEP,
            operation,
            format!("stored record could not be decoded: {e}"),
        )
    })?;
    record.version = version;
    Ok(record)
}

/// The record item's update and condition for a fenced write: `SET` of the record
/// attributes (when `record` is given) plus `extra` clauses, conditioned on the fence and
/// the version.
pub(super) struct FencedUpdate {
    pub(super) set: Vec<&'static str>,
    pub(super) remove: Vec<&'static str>,
    pub(super) condition: String,
    pub(super) names: HashMap<String, String>,
    pub(super) values: HashMap<String, AttributeValue>,
}

impl FencedUpdate {
    pub(super) fn new(fence: &Fence, now: u64) -> Self {
        Self {
            set: vec![],
            remove: vec![],
            condition: "#lock_owner = :lock_owner AND #lock_until >= :now".to_owned(),
            names: HashMap::from([
                ("#lock_owner".to_owned(), "lock_owner".to_owned()),
                ("#lock_until".to_owned(), "lock_until".to_owned()),
            ]),
            values: HashMap::from([
                (":lock_owner".to_owned(), s(fence.owner.as_str())),
                (":now".to_owned(), n(now)),
            ]),
        }
    }

    /// Adds the record write at `expected + 1` (or 1); returns the new version.
    pub(super) fn record(
        &mut self,
        fence: &Fence,
        record: &Record,
        expected: Option<u64>,
        op: &'static str,
    ) -> Result<u64, PortError> {
        let StoredRecord { version, json } = StoredRecord::encode(fence, record, expected, op)?;
        self.set.extend([
            "#record = :record",
            "#version = :version",
            "#session_id = :session_id",
            "#environment_id = :environment_id",
            "#updated_at_ms = :updated_at_ms",
        ]);
        for name in [
            "record",
            "version",
            SESSION_ATTR,
            "environment_id",
            "updated_at_ms",
        ] {
            self.names.insert(format!("#{name}"), name.to_owned());
        }
        self.values.extend([
            (":record".to_owned(), s(json)),
            (":version".to_owned(), n(version)),
            (":session_id".to_owned(), s(record.session_id.as_str())),
            (
                ":environment_id".to_owned(),
                s(record.environment_id.as_str()),
            ),
            (":updated_at_ms".to_owned(), n(now_ms())),
        ]);
        // The sparse `by_open` index: only records that are not closed carry the key.
        self.names
            .insert("#open_shard".to_owned(), OPEN_ATTR.to_owned());
        if record.status == RecordStatus::Closed {
            self.remove.push("#open_shard");
        } else {
            self.set.push("#open_shard = :open_shard");
            self.values.insert(
                ":open_shard".to_owned(),
                s(open_shard(&record.environment_id)),
            );
        }
        match expected {
            None => self
                .condition
                .push_str(" AND attribute_not_exists(#version)"),
            Some(expected) => {
                self.condition.push_str(" AND #version = :expected");
                self.values.insert(":expected".to_owned(), n(expected));
            }
        }
        Ok(version)
    }

    /// Adds the lock's release: removed (clean) or left expired at 0 (unclean).
    pub(super) fn release_lock(&mut self, clean: bool) {
        if clean {
            self.remove.extend(["#lock_owner", "#lock_until"]);
        } else {
            self.set.push("#lock_until = :released");
            self.values.insert(":released".to_owned(), n(0));
        }
    }

    pub(super) fn expression(&self) -> String {
        let mut out = String::new();
        if !self.set.is_empty() {
            out.push_str("SET ");
            out.push_str(&self.set.join(", "));
        }
        if !self.remove.is_empty() {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str("REMOVE ");
            out.push_str(&self.remove.join(", "));
        }
        out
    }
}

/// Which items of a cancelled `TransactWriteItems` failed, from its `CancellationReasons`
/// (request order): `(condition failed per item, any TransactionConflict)`. `None` when the
/// error is not a cancellation.
pub(super) fn cancellation(
    err: &SdkError<TransactWriteItemsError>,
    items: usize,
) -> Option<(Vec<bool>, bool)> {
    let Some(TransactWriteItemsError::TransactionCanceledException(c)) = err.as_service_error()
    else {
        return None;
    };
    let reasons = c.cancellation_reasons();
    let failed = (0..items)
        .map(|i| {
            reasons
                .get(i)
                .and_then(|r| r.code())
                .is_some_and(|code| code == "ConditionalCheckFailed")
        })
        .collect();
    let conflict = reasons
        .iter()
        .any(|r| r.code().is_some_and(|code| code == "TransactionConflict"));
    Some((failed, conflict))
}

#[cfg(test)]
mod tests {
    use super::super::RECEIPT_PREFIX;
    use super::*;

    #[test]
    fn sort_keys_increase_within_one_millisecond() {
        let keys = SortKeys::default();
        let all: Vec<String> = (0..1000).map(|_| keys.next(RECEIPT_PREFIX)).collect();
        let mut sorted = all.clone();
        sorted.sort();
        assert_eq!(all, sorted);
        assert!(all[0].starts_with(RECEIPT_PREFIX));
        assert_eq!(all[0].len(), RECEIPT_PREFIX.len() + 15 + 1 + 6 + 1 + 16);
    }
}
