//! The [`Registry`] port on [`DynamoRegistry`]: every port method as one DynamoDB call or
//! transaction (the schema and the rules are in the module docs of
//! [`crate::dynamo_registry`]).

use super::codec::{FencedUpdate, decode_record, slot_sk};
use super::{
    AUDIT_PREFIX, DEP, DynamoRegistry, OPEN_ATTR, OPEN_INDEX, OPEN_SHARDS, PK, RECEIPT_PREFIX,
    SESSION_ATTR, SESSION_INDEX, SK, SK_COUNTER, SK_LEDGER, SK_RECORD, SK_SLOT_PREFIX, SK_TERMINAL,
    SLOTS_PK, TTL_ATTR,
};
use crate::dynamo_item::{corrupt, get_n, get_s, is_condition_failed, n, s};
use crate::sdk_error::port_error;
use aws_sdk_dynamodb::types::{
    AttributeValue, Delete, Put, ReturnValue, TransactWriteItem, Update,
};
use sandbox_controller::ports::{
    AuditEntry, Fence, Locked, PortError, Receipt, Registry, Release, Slot, SlotHolder,
    SlotRelease, Slots, Write,
};
use sandbox_core::ids::{EffectKey, EnvironmentId, SessionId};
use sandbox_core::record::Record;

impl Registry for DynamoRegistry {
    async fn get(&self, key: &EffectKey) -> Result<Option<Record>, PortError> {
        Ok(self
            .get_record_item(key.as_str(), "get")
            .await?
            .map(|(r, _)| r))
    }

    async fn find_by_session(&self, session: &SessionId) -> Result<Option<Record>, PortError> {
        let op = "find_by_session";
        let mut pages = self
            .client
            .query()
            .table_name(self.table.as_ref())
            .index_name(SESSION_INDEX)
            .key_condition_expression("#s = :s")
            .expression_attribute_names("#s", SESSION_ATTR)
            .expression_attribute_values(":s", s(session.as_str()))
            .into_paginator()
            .send();
        let mut keys = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| port_error(DEP, op, &e))?;
            for item in page.items() {
                if get_s(item, SK, DEP, op)? == SK_RECORD {
                    keys.push(get_s(item, PK, DEP, op)?.to_owned());
                }
            }
        }
        keys.sort();
        keys.dedup();
        // The index is eventually consistent: re-read each record and keep the ones that
        // still belong to the session; the most recently written wins (as in SQLite).
        let mut best: Option<(Record, u64)> = None;
        for key in keys {
            if let Some((record, updated)) = self.get_record_item(&key, op).await?
                && &record.session_id == session
                && best.as_ref().is_none_or(|(_, u)| updated > *u)
            {
                best = Some((record, updated));
            }
        }
        Ok(best.map(|(r, _)| r))
    }

    async fn put(
        &self,
        fence: &Fence,
        now: u64,
        record: &Record,
        expected_version: Option<u64>,
    ) -> Result<Write, PortError> {
        let op = "put";
        let mut update = FencedUpdate::new(fence, now);
        let version = update.record(fence, record, expected_version, op)?;
        Ok(if self.update_fenced(&fence.key, update, op).await? {
            Write::Written(version)
        } else {
            Write::Conflict
        })
    }

    async fn list(&self) -> Result<Vec<Record>, PortError> {
        let op = "list";
        let mut pages = self
            .client
            .scan()
            .table_name(self.table.as_ref())
            .consistent_read(true)
            .filter_expression("#sk = :record AND attribute_exists(#record)")
            .expression_attribute_names("#sk", SK)
            .expression_attribute_names("#record", "record")
            .expression_attribute_values(":record", s(SK_RECORD))
            .into_paginator()
            .send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| port_error(DEP, op, &e))?;
            for item in page.items() {
                out.push(decode_record(item, op)?);
            }
        }
        out.sort_by(|a, b| a.environment_id.cmp(&b.environment_id));
        Ok(out)
    }

    async fn list_open(&self) -> Result<Vec<Record>, PortError> {
        let op = "list_open";
        let mut out = Vec::new();
        for shard in 0..OPEN_SHARDS {
            // A GSI read is eventually consistent (no ConsistentRead on an index): see the
            // module docs for why the sweep may discover on it.
            let mut pages = self
                .client
                .query()
                .table_name(self.table.as_ref())
                .index_name(OPEN_INDEX)
                .key_condition_expression("#open = :open")
                .expression_attribute_names("#open", OPEN_ATTR)
                .expression_attribute_values(":open", s(format!("open#{shard}")))
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                let page = page.map_err(|e| port_error(DEP, op, &e))?;
                for item in page.items() {
                    if item.contains_key("record") {
                        out.push(decode_record(item, op)?);
                    }
                }
            }
        }
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
        let op = "lock";
        let res = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .key(PK, s(key.as_str()))
            .key(SK, s(SK_RECORD))
            .update_expression("SET #lock_owner = :owner, #lock_until = :until")
            .condition_expression("attribute_not_exists(#lock_until) OR #lock_until < :now")
            .expression_attribute_names("#lock_owner", "lock_owner")
            .expression_attribute_names("#lock_until", "lock_until")
            .expression_attribute_values(":owner", s(owner))
            .expression_attribute_values(":until", n(until))
            .expression_attribute_values(":now", n(now))
            .return_values(ReturnValue::AllOld)
            .send()
            .await;
        let old = match res {
            Ok(out) => out.attributes.unwrap_or_default(),
            Err(e) if is_condition_failed(&e) => return Ok(None),
            Err(e) => return Err(port_error(DEP, op, &e)),
        };
        let record = if old.contains_key("record") {
            Some(decode_record(&old, op)?)
        } else {
            None
        };
        Ok(Some(Locked {
            record,
            recovered: old.contains_key("lock_until"),
        }))
    }

    async fn release(
        &self,
        fence: &Fence,
        now: u64,
        release: Release<'_>,
    ) -> Result<bool, PortError> {
        let op = "release";
        let mut update = FencedUpdate::new(fence, now);
        if let Some((record, expected)) = release.record {
            update.record(fence, record, expected, op)?;
        }
        update.release_lock(release.clean);
        if release.audit.is_none() && release.delivery.is_none() {
            return self.update_fenced(&fence.key, update, op).await;
        }
        self.release_transaction(&fence.key, update, release.audit, release.delivery)
            .await
    }

    async fn seen_delivery(&self, webhook_id: &str, now: u64) -> Result<bool, PortError> {
        let op = "seen_delivery";
        let out = self
            .client
            .get_item()
            .table_name(self.table.as_ref())
            .key(PK, s(format!("webhook#{webhook_id}")))
            .key(SK, s(SK_LEDGER))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| port_error(DEP, op, &e))?;
        match out.item() {
            None => Ok(false),
            // Expired but not yet deleted by TTL reads as absent.
            Some(item) => Ok(get_n(item, TTL_ATTR, DEP, op)? > now),
        }
    }

    async fn remember_delivery(&self, webhook_id: &str, expires_at: u64) -> Result<(), PortError> {
        self.client
            .put_item()
            .table_name(self.table.as_ref())
            .item(PK, s(format!("webhook#{webhook_id}")))
            .item(SK, s(SK_LEDGER))
            .item(TTL_ATTR, n(expires_at))
            .send()
            .await
            .map_err(|e| port_error(DEP, "remember_delivery", &e))?;
        Ok(())
    }

    async fn audit(&self, entry: &AuditEntry) -> Result<(), PortError> {
        let json = serde_json::to_string(entry).map_err(|e| {
            PortError::permanent(DEP, "audit", format!("entry could not be encoded: {e}"))
        })?;
        self.append(
            &entry.effect_key,
            AUDIT_PREFIX,
            vec![
                ("entry", s(json)),
                ("at", n(entry.at)),
                (TTL_ATTR, n(self.expires_at(entry.at))),
            ],
            "audit",
        )
        .await
    }

    async fn receipt(&self, receipt: &Receipt) -> Result<(), PortError> {
        let json = serde_json::to_string(receipt).map_err(|e| {
            PortError::permanent(DEP, "receipt", format!("receipt could not be encoded: {e}"))
        })?;
        self.append(
            &receipt.effect_key,
            RECEIPT_PREFIX,
            vec![
                ("receipt", s(json)),
                ("at", n(receipt.at)),
                (TTL_ATTR, n(self.expires_at(receipt.at))),
            ],
            "receipt",
        )
        .await
    }

    async fn receipts(&self, key: &EffectKey) -> Result<Vec<Receipt>, PortError> {
        let op = "receipts";
        self.query_prefix(key, RECEIPT_PREFIX, op)
            .await?
            .iter()
            .map(|item| {
                serde_json::from_str(get_s(item, "receipt", DEP, op)?)
                    .map_err(|e| corrupt(DEP, op, format!("receipt could not be decoded: {e}")))
            })
            .collect()
    }

    async fn acquire_slot(&self, fence: &Fence, now: u64, cap: u32) -> Result<Slot, PortError> {
        let op = "acquire_slot";
        let env = fence.key.environment_id().ok_or_else(|| {
            PortError::permanent(
                DEP,
                op,
                "the fence's key is not an environment's effect key",
            )
        })?;
        let build = |what: &str, e: aws_sdk_dynamodb::error::BuildError| {
            PortError::permanent(DEP, op, format!("{what} could not be built: {e}"))
        };
        let holder = Put::builder()
            .table_name(self.table.as_ref())
            .item(PK, s(SLOTS_PK))
            .item(SK, s(slot_sk(&env)))
            .item("environment_id", s(env.as_str()))
            .item("acquired_at", n(now))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", PK)
            .build()
            .map_err(|e| build("holder put", e))?;
        let counter = Update::builder()
            .table_name(self.table.as_ref())
            .key(PK, s(SLOTS_PK))
            .key(SK, s(SK_COUNTER))
            .update_expression("ADD #in_use :one")
            .condition_expression("attribute_not_exists(#in_use) OR #in_use < :cap")
            .expression_attribute_names("#in_use", "in_use")
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":cap", n(u64::from(cap)))
            .build()
            .map_err(|e| build("counter update", e))?;
        let items = vec![
            TransactWriteItem::builder()
                .condition_check(self.fence_check(fence, now, op)?)
                .build(),
            TransactWriteItem::builder().put(holder).build(),
            TransactWriteItem::builder().update(counter).build(),
        ];
        let Some(failed) = self.slot_transaction(items, op).await? else {
            return Ok(Slot::Acquired);
        };
        Ok(match failed.as_slice() {
            [true, ..] => Slot::LockLost,
            [_, true, ..] => Slot::Held,
            [_, _, true] => Slot::Full,
            _ => {
                return Err(PortError::transient(
                    DEP,
                    op,
                    "transaction cancelled without a failed condition",
                ));
            }
        })
    }

    async fn release_slot(&self, fence: &Fence, now: u64) -> Result<SlotRelease, PortError> {
        let op = "release_slot";
        let env = fence.key.environment_id().ok_or_else(|| {
            PortError::permanent(
                DEP,
                op,
                "the fence's key is not an environment's effect key",
            )
        })?;
        let build = |what: &str, e: aws_sdk_dynamodb::error::BuildError| {
            PortError::permanent(DEP, op, format!("{what} could not be built: {e}"))
        };
        let holder = Delete::builder()
            .table_name(self.table.as_ref())
            .key(PK, s(SLOTS_PK))
            .key(SK, s(slot_sk(&env)))
            .condition_expression("attribute_exists(#pk)")
            .expression_attribute_names("#pk", PK)
            .build()
            .map_err(|e| build("holder delete", e))?;
        let counter = Update::builder()
            .table_name(self.table.as_ref())
            .key(PK, s(SLOTS_PK))
            .key(SK, s(SK_COUNTER))
            .update_expression("ADD #in_use :minus_one")
            .condition_expression("#in_use > :zero")
            .expression_attribute_names("#in_use", "in_use")
            .expression_attribute_values(":minus_one", AttributeValue::N("-1".into()))
            .expression_attribute_values(":zero", n(0))
            .build()
            .map_err(|e| build("counter update", e))?;
        let check = self.fence_check(fence, now, op)?;
        let items = vec![
            TransactWriteItem::builder()
                .condition_check(check.clone())
                .build(),
            TransactWriteItem::builder().delete(holder.clone()).build(),
            TransactWriteItem::builder().update(counter).build(),
        ];
        let failed = match self.slot_transaction(items, op).await? {
            None => return Ok(SlotRelease::Released),
            Some(failed) => failed,
        };
        match failed.as_slice() {
            [true, ..] => Ok(SlotRelease::LockLost),
            [_, true, ..] => Ok(SlotRelease::NotHeld),
            [_, _, true] => {
                // The counter is already 0 although a holder exists (changed outside the
                // controller): delete the holder alone, never count below zero.
                tracing::warn!(effect_key = %fence.key, "executor slot counter at 0 with a holder: releasing the holder alone");
                let items = vec![
                    TransactWriteItem::builder().condition_check(check).build(),
                    TransactWriteItem::builder().delete(holder).build(),
                ];
                Ok(match self.slot_transaction(items, op).await?.as_deref() {
                    None => SlotRelease::Released,
                    Some([true, ..]) => SlotRelease::LockLost,
                    Some(_) => SlotRelease::NotHeld,
                })
            }
            _ => Err(PortError::transient(
                DEP,
                op,
                "transaction cancelled without a failed condition",
            )),
        }
    }

    async fn slots(&self) -> Result<Slots, PortError> {
        let op = "slots";
        // One partition holds the counter and every holder: one consistent Query.
        let mut pages = self
            .client
            .query()
            .table_name(self.table.as_ref())
            .consistent_read(true)
            .key_condition_expression("#pk = :pk")
            .expression_attribute_names("#pk", PK)
            .expression_attribute_values(":pk", s(SLOTS_PK))
            .into_paginator()
            .send();
        let mut in_use = 0;
        let mut holders = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| port_error(DEP, op, &e))?;
            for item in page.items() {
                let sk = get_s(item, SK, DEP, op)?;
                if sk == SK_COUNTER {
                    if item.contains_key("in_use") {
                        in_use = get_n(item, "in_use", DEP, op)?;
                    }
                } else if sk.starts_with(SK_SLOT_PREFIX) {
                    holders.push(SlotHolder {
                        environment_id: EnvironmentId::new(get_s(item, "environment_id", DEP, op)?),
                        acquired_at: get_n(item, "acquired_at", DEP, op)?,
                    });
                }
            }
        }
        holders.sort_by(|a, b| a.environment_id.cmp(&b.environment_id));
        Ok(Slots { in_use, holders })
    }

    /// `PutItem` (pk = effect key, sk = `terminal`) with `attribute_not_exists(pk)`: a
    /// `ConditionalCheckFailedException` means one is stored already (`false`, unchanged).
    /// No `expires_at`: TTL never deletes it (DynamoDB Developer Guide, "Time to Live":
    /// only items carrying the TTL attribute expire).
    async fn put_terminal(
        &self,
        terminal: &sandbox_controller::terminal::TerminalRecord,
    ) -> Result<bool, PortError> {
        let op = "put_terminal";
        let json = serde_json::to_string(terminal).map_err(|e| {
            PortError::permanent(
                DEP,
                op,
                format!("terminal record could not be encoded: {e}"),
            )
        })?;
        match self
            .client
            .put_item()
            .table_name(self.table.as_ref())
            .item(PK, s(terminal.effect_key.as_str()))
            .item(SK, s(SK_TERMINAL))
            .item("terminal", s(json))
            .item("closed_at", n(terminal.closed_at))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", PK)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failed(&e) => Ok(false),
            Err(e) => Err(port_error(DEP, op, &e)),
        }
    }

    /// One consistent `GetItem` of (effect key, `terminal`).
    async fn terminal(
        &self,
        key: &EffectKey,
    ) -> Result<Option<sandbox_controller::terminal::TerminalRecord>, PortError> {
        let op = "terminal";
        let out = self
            .client
            .get_item()
            .table_name(self.table.as_ref())
            .key(PK, s(key.as_str()))
            .key(SK, s(SK_TERMINAL))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| port_error(DEP, op, &e))?;
        match out.item() {
            Some(item) => serde_json::from_str(get_s(item, "terminal", DEP, op)?)
                .map(Some)
                .map_err(|e| {
                    corrupt(
                        DEP,
                        op,
                        format!("terminal record could not be decoded: {e}"),
                    )
                }),
            None => Ok(None),
        }
    }
}
