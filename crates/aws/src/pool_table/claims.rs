//! The pool table's reads and writes of members after their start: the token read, the
//! idle and claimed queries, the member lookup, the claim transaction, recycle, release,
//! the idle item's removal and the refill lease (the schema and the rules are in the module
//! docs of [`crate::pool_table`]).

use super::PoolTable;
use super::items::{
    ClaimWrite, MemberItem, MemberState, TokenItem, build_error, claimed_environment,
    decode_member, decode_token, expired, lease_pk, token_pk,
};
use super::{
    BATCH_GET_ATTEMPTS, BATCH_GET_MAX, CLAIMED_ATTR, CREATED_ATTR, DAY_SECS, DEP,
    ENVIRONMENT_INDEX, IDLE_ATTR, IDLE_INDEX, PK, POOL_ATTR, STATE_ATTR, TOKEN_TTL_SECS, TTL_ATTR,
    unprocessed_backoff,
};
use crate::dynamo_item::{Item, is_condition_failed, n, s};
use crate::sdk_error::port_error;
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{KeysAndAttributes, Put, TransactWriteItem, Update};
use backon::BackoffBuilder;
use sandbox_controller::ports::{Fence, PortError};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, EnvironmentId};
use std::collections::HashMap;

impl PoolTable {
    /// The token item of `token` in `deployment` (consistent `GetItem`); `None` when absent
    /// or expired.
    pub(crate) async fn token(
        &self,
        deployment: &DeploymentId,
        token: &str,
        now: u64,
    ) -> Result<Option<TokenItem>, PortError> {
        let op = "claim_pool_member";
        let out = self
            .ddb
            .get_item()
            .table_name(self.table.as_ref())
            .key(PK, s(token_pk(deployment, token)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| port_error(DEP, op, &e))?;
        match out.item() {
            Some(item) if !expired(item, now, op)? => Ok(Some(decode_token(item, op)?)),
            _ => Ok(None),
        }
    }

    /// Idle members of `deployment` created after `created_after` (Unix seconds), oldest
    /// first, from `Query` on `by_idle` (eventually consistent: candidates, not facts).
    /// `limit` `Some(k)`: one page of at most `k` items read; `None`: every page. Items no
    /// longer idle (the index lags) and expired items are left out.
    pub(crate) async fn idle_members(
        &self,
        deployment: &DeploymentId,
        created_after: u64,
        now: u64,
        limit: Option<i32>,
    ) -> Result<Vec<MemberItem>, PortError> {
        let op = "list_pool";
        let request = self
            .ddb
            .query()
            .table_name(self.table.as_ref())
            .index_name(IDLE_INDEX)
            .key_condition_expression("#idle = :deployment AND #created > :bound")
            .expression_attribute_names("#idle", IDLE_ATTR)
            .expression_attribute_names("#created", CREATED_ATTR)
            .expression_attribute_values(":deployment", s(deployment.as_str()))
            .expression_attribute_values(":bound", n(created_after))
            .scan_index_forward(true);
        let mut items: Vec<Item> = Vec::new();
        match limit {
            Some(k) => {
                let out = request
                    .limit(k)
                    .send()
                    .await
                    .map_err(|e| port_error(DEP, op, &e))?;
                items.extend(out.items().iter().cloned());
            }
            None => {
                let mut pages = request.into_paginator().send();
                while let Some(page) = pages.next().await {
                    let page = page.map_err(|e| port_error(DEP, op, &e))?;
                    items.extend(page.items().iter().cloned());
                }
            }
        }
        let mut out = Vec::with_capacity(items.len());
        for item in &items {
            if expired(item, now, op)? {
                continue;
            }
            let member = decode_member(item, op)?;
            if member.state == MemberState::Idle && member.deployment == deployment.as_str() {
                out.push(member);
            }
        }
        Ok(out)
    }

    /// The members claimed for `environment_id` of `deployment`, from `Query` on
    /// `by_environment`, every page (eventually consistent); expired items left out.
    pub(crate) async fn claimed_for(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        now: u64,
    ) -> Result<Vec<MemberItem>, PortError> {
        let op = "find";
        let mut pages = self
            .ddb
            .query()
            .table_name(self.table.as_ref())
            .index_name(ENVIRONMENT_INDEX)
            .key_condition_expression("#claimed = :claimed")
            .expression_attribute_names("#claimed", CLAIMED_ATTR)
            .expression_attribute_values(
                ":claimed",
                s(claimed_environment(deployment, environment_id)),
            )
            .into_paginator()
            .send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| port_error(DEP, op, &e))?;
            for item in page.items() {
                if expired(item, now, op)? {
                    continue;
                }
                let member = decode_member(item, op)?;
                if member.state == MemberState::Assigned {
                    out.push(member);
                }
            }
        }
        Ok(out)
    }

    /// The member items under `pks` (consistent `BatchGetItem`, at most
    /// [`BATCH_GET_MAX`] keys a call, `UnprocessedKeys` asked again after
    /// [`unprocessed_backoff`]'s pauses, [`BATCH_GET_ATTEMPTS`] calls a chunk at most), by key; absent and
    /// expired ones left out. Duplicate keys are asked once (DynamoDB refuses duplicates
    /// in one request).
    pub(crate) async fn members(
        &self,
        pks: &[String],
        now: u64,
        op: &'static str,
    ) -> Result<HashMap<String, MemberItem>, PortError> {
        let mut unique: Vec<&String> = Vec::with_capacity(pks.len());
        for pk in pks {
            if !unique.contains(&pk) {
                unique.push(pk);
            }
        }
        let mut out = HashMap::new();
        for chunk in unique.chunks(BATCH_GET_MAX) {
            let mut keys = KeysAndAttributes::builder().consistent_read(true);
            for pk in chunk {
                keys = keys.keys(HashMap::from([(PK.to_owned(), s(pk.as_str()))]));
            }
            let mut pending = Some(keys.build().map_err(build_error(op))?);
            let mut pauses = unprocessed_backoff().build();
            while let Some(request) = pending.take() {
                let result = self
                    .ddb
                    .batch_get_item()
                    .request_items(self.table.as_ref(), request)
                    .send()
                    .await
                    .map_err(|e| port_error(DEP, op, &e))?;
                for item in result
                    .responses()
                    .and_then(|r| r.get(self.table.as_ref()))
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                {
                    if expired(item, now, op)? {
                        continue;
                    }
                    let member = decode_member(item, op)?;
                    out.insert(member.pk.clone(), member);
                }
                let left = result
                    .unprocessed_keys()
                    .and_then(|u| u.get(self.table.as_ref()))
                    .filter(|k| !k.keys().is_empty())
                    .cloned();
                if let Some(left) = left {
                    let Some(pause) = pauses.next() else {
                        return Err(PortError::transient(
                            DEP,
                            op,
                            format!(
                                "BatchGetItem left {} keys unprocessed after {BATCH_GET_ATTEMPTS} calls",
                                left.keys().len()
                            ),
                        ));
                    };
                    tokio::time::sleep(pause).await;
                    pending = Some(left);
                }
            }
        }
        Ok(out)
    }

    /// The claim: one `TransactWriteItems` of
    /// 1. an `Update` of the member `member_pk` with `ConditionExpression` `#state = :idle
    ///    AND #idle = :deployment AND #created > :bound AND #exp > :now` (idle, this
    ///    deployment's, young enough, unexpired) setting `state` `assigned`, the
    ///    assignment (`environment_id`, `session_id`, `remote_url`, `generation`,
    ///    `idempotency_token`, `assigned_at` = `now`, `claimed_environment`), and `REMOVE
    ///    idle_deployment, expires_at`: a claimed item never expires while its task may
    ///    run (its `by_environment` entry is how `find` sees the environment's executor,
    ///    whose task carries the pool's `startedBy`), whatever the lifetime caps; its
    ///    expiry is set at its stop ([`PoolTable::release`]);
    /// 2. a `Put` of the token item (`attribute_not_exists(pk) OR #exp <= :now`: absent or
    ///    expired), `expires_at` = `now` + [`TOKEN_TTL_SECS`].
    ///
    /// 3. with `lock` = (registry table, fence): a `ConditionCheck` of the environment's
    ///    record item, the lock still the fence's owner's and unexpired at `now`
    ///    ([`crate::dynamo_registry::fence_condition_check`]).
    ///
    /// All or nothing. The `CancellationReasons` (request order: member, token, lock) say
    /// which condition failed ([`ClaimWrite`]; the lock first: then nothing else matters).
    ///
    /// # Errors
    /// Any other failure (no answer, throttling, 5xx, validation): the outcome is unknown
    /// (the claim may be written; a replay reads the token).
    pub(crate) async fn claim(
        &self,
        member: &MemberItem,
        deployment: &DeploymentId,
        created_after: u64,
        spec: &StartSpec,
        now: u64,
        lock: Option<(&str, &Fence)>,
    ) -> Result<ClaimWrite, PortError> {
        let op = "claim_pool_member";
        let build = build_error(op);
        let update = Update::builder()
            .table_name(self.table.as_ref())
            .key(PK, s(member.pk.as_str()))
            .condition_expression(
                "#state = :idle AND #idle = :deployment AND #created > :bound AND #exp > :now",
            )
            // One string per line (no `\` line continuations: infra/tests'
            // test_iam_per_function.py scans this file's calls past its string literals).
            .update_expression(concat!(
                "SET #state = :assigned, #env = :env, #session = :session, #url = :url, ",
                "#generation = :generation, #token = :token, #assigned = :now, ",
                "#claimed = :claimed REMOVE #idle, #exp, #pool",
            ))
            .expression_attribute_names("#state", STATE_ATTR)
            .expression_attribute_names("#idle", IDLE_ATTR)
            .expression_attribute_names("#created", CREATED_ATTR)
            .expression_attribute_names("#exp", TTL_ATTR)
            .expression_attribute_names("#env", "environment_id")
            .expression_attribute_names("#session", "session_id")
            .expression_attribute_names("#url", "remote_url")
            .expression_attribute_names("#generation", "generation")
            .expression_attribute_names("#token", "idempotency_token")
            .expression_attribute_names("#assigned", "assigned_at")
            .expression_attribute_names("#claimed", CLAIMED_ATTR)
            .expression_attribute_names("#pool", POOL_ATTR)
            .expression_attribute_values(":idle", s(MemberState::Idle.as_str()))
            .expression_attribute_values(":assigned", s(MemberState::Assigned.as_str()))
            .expression_attribute_values(":deployment", s(deployment.as_str()))
            .expression_attribute_values(":bound", n(created_after))
            .expression_attribute_values(":now", n(now))
            .expression_attribute_values(":env", s(spec.environment_id.as_str()))
            .expression_attribute_values(":session", s(spec.session_id.as_str()))
            .expression_attribute_values(":url", s(spec.remote_url.as_str()))
            .expression_attribute_values(":generation", n(spec.generation.0))
            .expression_attribute_values(":token", s(spec.idempotency_token.as_str()))
            .expression_attribute_values(
                ":claimed",
                s(claimed_environment(deployment, &spec.environment_id)),
            )
            .build()
            .map_err(&build)?;
        let token = Put::builder()
            .table_name(self.table.as_ref())
            .item(PK, s(token_pk(deployment, &spec.idempotency_token)))
            .item("task_arn", s(member.task_arn.as_str()))
            .item("member_pk", s(member.pk.as_str()))
            .item("environment_id", s(spec.environment_id.as_str()))
            .item("session_id", s(spec.session_id.as_str()))
            .item("generation", n(spec.generation.0))
            .item(TTL_ATTR, n(now.saturating_add(TOKEN_TTL_SECS)))
            .condition_expression("attribute_not_exists(#pk) OR #exp <= :now")
            .expression_attribute_names("#pk", PK)
            .expression_attribute_names("#exp", TTL_ATTR)
            .expression_attribute_values(":now", n(now))
            .build()
            .map_err(&build)?;
        let mut request = self
            .ddb
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(update).build())
            .transact_items(TransactWriteItem::builder().put(token).build());
        if let Some((table, fence)) = lock {
            let check = crate::dynamo_registry::fence_condition_check(table, fence, now, op)?;
            request =
                request.transact_items(TransactWriteItem::builder().condition_check(check).build());
        }
        let res = request.send().await;
        let err = match res {
            Ok(_) => return Ok(ClaimWrite::Claimed),
            Err(e) => e,
        };
        let Some(TransactWriteItemsError::TransactionCanceledException(c)) = err.as_service_error()
        else {
            return Err(port_error(DEP, op, &err));
        };
        let reason = |i: usize| {
            c.cancellation_reasons()
                .get(i)
                .and_then(|r| r.code())
                .unwrap_or("None")
        };
        if lock.is_some() && reason(2) == "ConditionalCheckFailed" {
            return Ok(ClaimWrite::LockLost);
        }
        match (reason(0), reason(1)) {
            (_, "ConditionalCheckFailed") => Ok(ClaimWrite::TokenTaken),
            ("ConditionalCheckFailed", _) => Ok(ClaimWrite::MemberTaken),
            ("TransactionConflict", "None") => Ok(ClaimWrite::Conflict),
            (_, "TransactionConflict") => Err(PortError::contended(
                DEP,
                op,
                format!(
                    "TransactionConflict on the token item: {}",
                    DisplayErrorContext(&err)
                ),
            )),
            _ => Err(port_error(DEP, op, &err)),
        }
    }

    /// The recycle's guard: `UpdateItem` of `pk` with `ConditionExpression` `#state =
    /// :idle`, setting `state` `recycled`, `expires_at` = `now` + 1 day, `REMOVE
    /// idle_deployment`. `false` on `ConditionalCheckFailed` (claimed, recycled already,
    /// or no such member).
    pub(crate) async fn recycle(&self, pk: &str, now: u64) -> Result<bool, PortError> {
        let op = "recycle_pool_member";
        let res = self
            .ddb
            .update_item()
            .table_name(self.table.as_ref())
            .key(PK, s(pk))
            .condition_expression("#state = :idle")
            .update_expression("SET #state = :recycled, #exp = :expires REMOVE #idle")
            .expression_attribute_names("#state", STATE_ATTR)
            .expression_attribute_names("#exp", TTL_ATTR)
            .expression_attribute_names("#idle", IDLE_ATTR)
            .expression_attribute_values(":idle", s(MemberState::Idle.as_str()))
            .expression_attribute_values(":recycled", s(MemberState::Recycled.as_str()))
            .expression_attribute_values(":expires", n(now.saturating_add(DAY_SECS)))
            .send()
            .await;
        match res {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failed(&e) => Ok(false),
            Err(e) => Err(port_error(DEP, op, &e)),
        }
    }

    /// A claimed member's stop: `UpdateItem` of `pk` with `ConditionExpression` `#state =
    /// :assigned`, setting `expires_at` = `now` + the history retention (the item is kept
    /// as the registry keeps its history, then TTL deletes it). `false` on
    /// `ConditionalCheckFailed`: no claimed member under `pk` (a cold task, an idle or
    /// recycled member, or no item), nothing written.
    pub(crate) async fn release(&self, pk: &str, now: u64) -> Result<bool, PortError> {
        let op = "stop";
        let res = self
            .ddb
            .update_item()
            .table_name(self.table.as_ref())
            .key(PK, s(pk))
            .condition_expression("#state = :assigned")
            .update_expression("SET #exp = :expires")
            .expression_attribute_names("#state", STATE_ATTR)
            .expression_attribute_names("#exp", TTL_ATTR)
            .expression_attribute_values(":assigned", s(MemberState::Assigned.as_str()))
            .expression_attribute_values(
                ":expires",
                n(now.saturating_add(self.history_retention_secs)),
            )
            .send()
            .await;
        match res {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failed(&e) => Ok(false),
            Err(e) => Err(port_error(DEP, op, &e)),
        }
    }

    /// The reconcile's drop of an idle item whose task is gone: `DeleteItem` of `pk` with
    /// `ConditionExpression` `#state = :idle`. `false` on `ConditionalCheckFailed` (claimed
    /// or recycled meanwhile, or deleted already).
    pub(crate) async fn delete_idle(&self, pk: &str) -> Result<bool, PortError> {
        let op = "reconcile_pool";
        let res = self
            .ddb
            .delete_item()
            .table_name(self.table.as_ref())
            .key(PK, s(pk))
            .condition_expression("#state = :idle")
            .expression_attribute_names("#state", STATE_ATTR)
            .expression_attribute_values(":idle", s(MemberState::Idle.as_str()))
            .send()
            .await;
        match res {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failed(&e) => Ok(false),
            Err(e) => Err(port_error(DEP, op, &e)),
        }
    }

    /// The refill lease `refill#<deployment>`: `UpdateItem` with `ConditionExpression`
    /// `attribute_not_exists(#pk) OR #until < :now OR #holder = :holder` (absent, expired —
    /// held while `now <= lease_until` — or already this holder's, so a retried request
    /// whose first answer was lost still reports the take), setting `holder`,
    /// `lease_until` = `now` + `lease_secs` and `expires_at` = `lease_until` + 1 day.
    /// `false` on `ConditionalCheckFailed`: another holder has it.
    pub(crate) async fn take_lease(
        &self,
        deployment: &DeploymentId,
        holder: &str,
        now: u64,
        lease_secs: u64,
    ) -> Result<bool, PortError> {
        let op = "take_refill_lease";
        let until = now.saturating_add(lease_secs);
        let res = self
            .ddb
            .update_item()
            .table_name(self.table.as_ref())
            .key(PK, s(lease_pk(deployment)))
            .condition_expression("attribute_not_exists(#pk) OR #until < :now OR #holder = :holder")
            .update_expression("SET #holder = :holder, #until = :until, #exp = :expires")
            .expression_attribute_names("#pk", PK)
            .expression_attribute_names("#until", "lease_until")
            .expression_attribute_names("#holder", "holder")
            .expression_attribute_names("#exp", TTL_ATTR)
            .expression_attribute_values(":now", n(now))
            .expression_attribute_values(":holder", s(holder))
            .expression_attribute_values(":until", n(until))
            .expression_attribute_values(":expires", n(until.saturating_add(DAY_SECS)))
            .send()
            .await;
        match res {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failed(&e) => Ok(false),
            Err(e) => Err(port_error(DEP, op, &e)),
        }
    }
}
