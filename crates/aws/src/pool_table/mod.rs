//! The warm pool's DynamoDB table (docs/WARM_POOL.md "The pool table"): every
//! DynamoDB call of the pool, and nothing else. The ECS side is [`crate::ecs_pool`].
//!
//! # Table schema
//!
//! One table of its own (what [`create_table`] creates and what the SAM/CDK templates
//! declare), apart from the registry, so the executor task role's one grant
//! (`dynamodb:GetItem` on its own leading key) can never reach a registry item:
//!
//! | setting | value |
//! |---|---|
//! | partition key | `pk` (S), no sort key |
//! | billing | on-demand (`PAY_PER_REQUEST`) |
//! | global secondary index | `by_idle`: partition key `idle_deployment` (S), sort key `created_at` (N), projection `ALL` |
//! | global secondary index | `by_pool`: partition key `pool_deployment` (S), sort key `created_at` (N), projection `ALL` |
//! | global secondary index | `by_environment`: partition key `claimed_environment` (S), projection `ALL` |
//! | time to live | attribute `expires_at` (N, Unix seconds) |
//!
//! Items (numbers are DynamoDB `N`, times Unix seconds):
//!
//! | item | `pk` | attributes |
//! |---|---|---|
//! | member | `<task role id>:<task id>` ([`member_pk`]: the task's own `aws:userid`) | `deployment`, `task_arn`, `client_token`, `created_at`, `state` (`idle` \| `assigned` \| `recycled`), `idle_deployment` (= `deployment`, only while idle), `pool_deployment` (see below), once claimed `environment_id`, `session_id`, `remote_url`, `generation`, `idempotency_token`, `assigned_at`, `claimed_environment` (`<deployment>#<environment id>`); `expires_at` (absent while claimed and running) |
//! | launch | `launch#<deployment>#<client token>` ([`launch_pk`]) | `deployment`, `client_token`, `created_at`, `state` = `launching`, `pool_deployment`, `expires_at` = `created_at` + 1 day: written before a member's `RunTask`, deleted with the member's record |
//! | backstop cursor | `backstop#<deployment>` ([`backstop_pk`]) | `next_token` (the reconcile's next `ListTasks` page), `expires_at` |
//! | token | `token#<deployment>#<idempotency token>` | `task_arn`, `member_pk`, `environment_id`, `session_id`, `generation`, `expires_at` = claim + 24 h |
//! | refill lease | `refill#<deployment>` | `holder`, `lease_until`, `expires_at` = `lease_until` + 1 day |
//!
//! `expires_at` of a member: `created_at` + max age + 1 day while idle, none once claimed
//! (a claimed item never expires while its task may run), the stop + the history retention
//! once its environment stopped it, the recycle time + 1 day once recycled. Both
//! indexes are sparse: `idle_deployment` exists only while a member is idle (the claim and
//! the recycle `REMOVE` it), `pool_deployment` on launches, idle members and recycled
//! members until the reconcile sees their task stop (the claim `REMOVE`s it: no claimed
//! member is ever in `by_pool`), `claimed_environment` only once it is claimed.
//!
//! # Rules
//!
//! - **Expired reads as absent, everywhere.** TTL deletes late ("typically within a few
//!   days", DynamoDB Developer Guide, "Working with Time to Live (TTL)"; moto never), so
//!   every read compares `expires_at` with `now` itself, and every conditional write that
//!   creates an item accepts an expired one in its place.
//! - **Every write is conditional**: the member `PutItem` `attribute_not_exists(pk)`; the
//!   claim one `TransactWriteItems` of an `Update` of the member (`#state = :idle`, still
//!   this deployment's, `created_at > :bound`, unexpired: idle → assigned, `REMOVE
//!   idle_deployment`) and a `Put` of the token (`attribute_not_exists(pk)` or expired);
//!   the recycle `UpdateItem` `#state = :idle`; the reconcile's `DeleteItem` `#state =
//!   :idle`; the lease `UpdateItem` when absent, expired or already this holder's. A
//!   cancelled transaction's `CancellationReasons` come in request order (DynamoDB API
//!   Reference, TransactWriteItems, `TransactionCanceledException`): `[member, token]`.
//! - **Reads of the table are consistent** (`GetItem`, `BatchGetItem` with
//!   `ConsistentRead`); the indexes are not (GSIs offer no consistent read, DynamoDB
//!   Developer Guide, "Read consistency"), so a `Query` result is a candidate list: the
//!   claim's conditional write, not the `Query`, decides.
//! - `BatchGetItem` asks at most 100 keys per call and retries `UnprocessedKeys` (DynamoDB
//!   API Reference, BatchGetItem: "A single operation can retrieve up to 16 MB of data,
//!   which can contain as many as 100 items"; unprocessed keys are to be retried with
//!   exponential backoff).
//! - Every attribute name goes through an `#name` placeholder (several are reserved words:
//!   `state`, ...; DynamoDB Developer Guide, "Reserved words").
//!
//! Files: this one (the schema's names, [`create_table`], the table and its launch and
//! `by_pool` partition calls); `items.rs` (the items, their keys and decoding);
//! `claims.rs` (tokens, idle and claimed members, claim, recycle, release, refill lease).

mod claims;
mod items;

pub use items::{
    Assignment, ClaimWrite, LaunchItem, MemberItem, MemberState, PoolItem, TokenItem, backstop_pk,
    claimed_environment, launch_pk, lease_pk, member_pk, token_pk,
};

use crate::sdk_error::port_error;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, Delete, GlobalSecondaryIndex, KeySchemaElement, KeyType,
    Projection, ProjectionType, Put, ScalarAttributeType, TransactWriteItem,
};
use items::{build_error, decode_member, expired};
use sandbox_controller::ports::PortError;
use sandbox_core::ids::DeploymentId;
use std::sync::Arc;
use std::time::Duration;

use crate::dynamo_item::{get_n, get_s, is_condition_failed, n, s};

const DEP: &str = "pool";

/// Partition key attribute (the only key).
pub const PK: &str = "pk";
/// The sparse index of idle members: hash [`IDLE_ATTR`], range `created_at`.
pub const IDLE_INDEX: &str = "by_idle";
/// Its partition key: the member's deployment, present only while it is idle.
pub const IDLE_ATTR: &str = "idle_deployment";
/// The sparse index of claimed members: hash [`CLAIMED_ATTR`].
pub const ENVIRONMENT_INDEX: &str = "by_environment";
/// Its partition key: `<deployment>#<environment id>`, present once a member is claimed.
pub const CLAIMED_ATTR: &str = "claimed_environment";
/// The sparse index of the refill's own items (docs/WARM_POOL.md "Refill"): hash
/// [`POOL_ATTR`], range `created_at`. Launches, idle members and recycled members whose
/// stop is not yet confirmed; never a claimed member, so a `Query` of it is as long as the
/// pool, whatever the number of environments the pool served.
pub const POOL_INDEX: &str = "by_pool";
/// Its partition key: the deployment, present on a launch, an idle member and a recycled
/// member until the reconcile saw its task stop; the claim removes it.
pub const POOL_ATTR: &str = "pool_deployment";
/// The member's creation time (N, Unix seconds), the range key of [`IDLE_INDEX`].
pub const CREATED_ATTR: &str = "created_at";
/// The TTL attribute (N, Unix seconds).
pub const TTL_ATTR: &str = "expires_at";
/// One day, seconds: how long an idle member's item outlives its maximum age, and a
/// recycled member's item its recycle.
pub const DAY_SECS: u64 = 86_400;
/// How long a token item is kept, seconds: 24 h, as ECS keeps a `RunTask` `clientToken`
/// ("the same task is returned for 24 hours", ECS API reference, RunTask).
pub const TOKEN_TTL_SECS: u64 = 86_400;
/// Keys per `BatchGetItem` call (DynamoDB API Reference, BatchGetItem: up to 100 items).
pub const BATCH_GET_MAX: usize = 100;
/// `BatchGetItem` calls for one chunk while DynamoDB leaves keys unprocessed.
const BATCH_GET_ATTEMPTS: u32 = 5;

/// Pauses before asking again for `UnprocessedKeys`: exponential from 50 ms (factor 2, at
/// most 800 ms) with jitter, [`BATCH_GET_ATTEMPTS`] − 1 of them ("we strongly recommend
/// that you use an exponential backoff algorithm", DynamoDB API Reference, BatchGetItem).
fn unprocessed_backoff() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_factor(2.0)
        .with_max_delay(Duration::from_millis(800))
        .with_max_times((BATCH_GET_ATTEMPTS - 1) as usize)
        .with_jitter()
}
const STATE_ATTR: &str = "state";
/// The state of a launch item: written before its `RunTask`, deleted when the member is
/// recorded.
const LAUNCHING: &str = "launching";

/// Creates the pool table `table` with the schema in the module docs (for tests and local
/// tooling; production tables come from the SAM/CDK templates), waits until it is `ACTIVE`
/// (at most 120 s) and enables TTL on `expires_at`.
///
/// # Errors
/// A [`PortError`] when a call fails (including `ResourceInUseException` when the table
/// exists) or the table does not become active in time.
pub async fn create_table(client: &Client, table: &str) -> Result<(), PortError> {
    let op = "create_table";
    let build = build_error(op);
    let attr = |name: &str, kind: ScalarAttributeType| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(kind)
            .build()
            .map_err(&build)
    };
    let key = |name: &str, kind: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .map_err(&build)
    };
    let all = || {
        Projection::builder()
            .projection_type(ProjectionType::All)
            .build()
    };
    let idle = GlobalSecondaryIndex::builder()
        .index_name(IDLE_INDEX)
        .key_schema(key(IDLE_ATTR, KeyType::Hash)?)
        .key_schema(key(CREATED_ATTR, KeyType::Range)?)
        .projection(all())
        .build()
        .map_err(&build)?;
    let refill = GlobalSecondaryIndex::builder()
        .index_name(POOL_INDEX)
        .key_schema(key(POOL_ATTR, KeyType::Hash)?)
        .key_schema(key(CREATED_ATTR, KeyType::Range)?)
        .projection(all())
        .build()
        .map_err(&build)?;
    let claimed = GlobalSecondaryIndex::builder()
        .index_name(ENVIRONMENT_INDEX)
        .key_schema(key(CLAIMED_ATTR, KeyType::Hash)?)
        .projection(all())
        .build()
        .map_err(&build)?;
    client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr(PK, ScalarAttributeType::S)?)
        .attribute_definitions(attr(IDLE_ATTR, ScalarAttributeType::S)?)
        .attribute_definitions(attr(CREATED_ATTR, ScalarAttributeType::N)?)
        .attribute_definitions(attr(CLAIMED_ATTR, ScalarAttributeType::S)?)
        .attribute_definitions(attr(POOL_ATTR, ScalarAttributeType::S)?)
        .key_schema(key(PK, KeyType::Hash)?)
        .global_secondary_indexes(idle)
        .global_secondary_indexes(refill)
        .global_secondary_indexes(claimed)
        .send()
        .await
        .map_err(|e| port_error(DEP, op, &e))?;
    crate::dynamo_registry::await_active_with_ttl(client, table, TTL_ATTR, op).await
}

/// The pool table: its client, name and expiry settings. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct PoolTable {
    ddb: Client,
    table: Arc<str>,
    /// A member's maximum age, seconds (an idle item expires this + 1 day after its start).
    max_age_secs: u64,
    /// How long a claimed member's item is kept after the claim, seconds.
    history_retention_secs: u64,
}

impl PoolTable {
    /// The table `table`. Makes no call.
    pub(crate) fn new(
        ddb: Client,
        table: &str,
        max_age_secs: u64,
        history_retention_secs: u64,
    ) -> Self {
        Self {
            ddb,
            table: table.into(),
            max_age_secs,
            history_retention_secs,
        }
    }

    /// `PutItem` of the launch item [`launch_pk`]`(deployment, client_token)` before its
    /// `RunTask` (`attribute_not_exists(pk)`): `state` `launching`, `client_token`,
    /// `created_at`, `pool_deployment` (so the reconcile finds it in [`POOL_INDEX`]) and
    /// `expires_at` = `created_at` + 1 day (a `RunTask` `clientToken` is replayed for 24 h,
    /// ECS API Reference, "Ensuring idempotency"). A `ConditionalCheckFailed` (a fresh
    /// token is unique, so never expected) is a permanent error.
    pub(crate) async fn put_launch(
        &self,
        deployment: &DeploymentId,
        client_token: &str,
        created_at: u64,
    ) -> Result<(), PortError> {
        let op = "start_pool_member";
        let pk = launch_pk(deployment, client_token);
        self.ddb
            .put_item()
            .table_name(self.table.as_ref())
            .item(PK, s(pk.as_str()))
            .item("deployment", s(deployment.as_str()))
            .item("client_token", s(client_token))
            .item(CREATED_ATTR, n(created_at))
            .item(STATE_ATTR, s(LAUNCHING))
            .item(POOL_ATTR, s(deployment.as_str()))
            .item(TTL_ATTR, n(created_at.saturating_add(DAY_SECS)))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", PK)
            .send()
            .await
            .map_err(|e| {
                if is_condition_failed(&e) {
                    PortError::permanent(DEP, op, format!("launch item {pk} exists already"))
                } else {
                    port_error(DEP, op, &e)
                }
            })?;
        Ok(())
    }

    /// Records the member `pk` that the launch `launch` started as `task_arn`: one
    /// `TransactWriteItems` of a `Put` of the idle member (`attribute_not_exists(pk)`;
    /// `deployment`, `task_arn`, `client_token`, `created_at` = the launch's, `state`
    /// `idle`, `idle_deployment` and `pool_deployment` = the deployment, `expires_at` =
    /// `created_at` + max age + 1 day) and a `Delete` of the launch item. When the member
    /// exists already (a replay of the same `clientToken` recorded it first), only the
    /// launch item is deleted (`DeleteItem`) and the answer is `false`.
    ///
    /// # Errors
    /// Any other failure: the outcome is unknown (the launch item stays, and the next
    /// reconcile replays its `RunTask`: ECS returns the same task).
    pub(crate) async fn record_member(
        &self,
        pk: &str,
        deployment: &DeploymentId,
        task_arn: &str,
        launch: &LaunchItem,
    ) -> Result<bool, PortError> {
        let op = "start_pool_member";
        let build = build_error(op);
        let expires_at = launch
            .created_at
            .saturating_add(self.max_age_secs)
            .saturating_add(DAY_SECS);
        let member = Put::builder()
            .table_name(self.table.as_ref())
            .item(PK, s(pk))
            .item("deployment", s(deployment.as_str()))
            .item("task_arn", s(task_arn))
            .item("client_token", s(launch.client_token.as_str()))
            .item(CREATED_ATTR, n(launch.created_at))
            .item(STATE_ATTR, s(MemberState::Idle.as_str()))
            .item(IDLE_ATTR, s(deployment.as_str()))
            .item(POOL_ATTR, s(deployment.as_str()))
            .item(TTL_ATTR, n(expires_at))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", PK)
            .build()
            .map_err(&build)?;
        let delete = Delete::builder()
            .table_name(self.table.as_ref())
            .key(PK, s(launch.pk.as_str()))
            .build()
            .map_err(&build)?;
        let res = self
            .ddb
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().put(member).build())
            .transact_items(TransactWriteItem::builder().delete(delete).build())
            .send()
            .await;
        let err = match res {
            Ok(_) => return Ok(true),
            Err(e) => e,
        };
        let recorded = matches!(
            err.as_service_error(),
            Some(TransactWriteItemsError::TransactionCanceledException(c))
                if c.cancellation_reasons().first().and_then(|r| r.code())
                    == Some("ConditionalCheckFailed")
        );
        if !recorded {
            return Err(port_error(DEP, op, &err));
        }
        self.delete_launch(&launch.pk).await?;
        Ok(false)
    }

    /// `DeleteItem` of the launch item `pk` (no condition: deleting an absent item is a
    /// success).
    pub(crate) async fn delete_launch(&self, pk: &str) -> Result<(), PortError> {
        let op = "reconcile_pool";
        self.ddb
            .delete_item()
            .table_name(self.table.as_ref())
            .key(PK, s(pk))
            .send()
            .await
            .map_err(|e| port_error(DEP, op, &e))?;
        Ok(())
    }

    /// The refill's partition of `deployment`: `Query` on [`POOL_INDEX`], every page,
    /// oldest first (eventually consistent): launches not recorded yet, idle members, and
    /// recycled members whose stop the reconcile has not confirmed. Claimed members are
    /// never in it. Expired items are left out.
    pub(crate) async fn pool_items(
        &self,
        deployment: &DeploymentId,
        now: u64,
    ) -> Result<Vec<PoolItem>, PortError> {
        let op = "reconcile_pool";
        let mut pages = self
            .ddb
            .query()
            .table_name(self.table.as_ref())
            .index_name(POOL_INDEX)
            .key_condition_expression("#pool = :deployment")
            .expression_attribute_names("#pool", POOL_ATTR)
            .expression_attribute_values(":deployment", s(deployment.as_str()))
            .scan_index_forward(true)
            .into_paginator()
            .send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| port_error(DEP, op, &e))?;
            for item in page.items() {
                if expired(item, now, op)? {
                    continue;
                }
                if get_s(item, STATE_ATTR, DEP, op)? == LAUNCHING {
                    out.push(PoolItem::Launch(LaunchItem {
                        pk: get_s(item, PK, DEP, op)?.to_owned(),
                        client_token: get_s(item, "client_token", DEP, op)?.to_owned(),
                        created_at: get_n(item, CREATED_ATTR, DEP, op)?,
                    }));
                    continue;
                }
                let member = decode_member(item, op)?;
                if member.state != MemberState::Assigned && member.deployment == deployment.as_str()
                {
                    out.push(PoolItem::Member(member));
                }
            }
        }
        Ok(out)
    }

    /// A recycled member whose task the reconcile saw stop (or stopped): `UpdateItem` of
    /// `pk` with `ConditionExpression` `#state = :recycled`, `REMOVE pool_deployment` (it
    /// leaves the refill's partition; its item expires as set by the recycle). `false` on
    /// `ConditionalCheckFailed`.
    pub(crate) async fn forget_recycled(&self, pk: &str) -> Result<bool, PortError> {
        let op = "reconcile_pool";
        let res = self
            .ddb
            .update_item()
            .table_name(self.table.as_ref())
            .key(PK, s(pk))
            .condition_expression("#state = :recycled")
            .update_expression("REMOVE #pool")
            .expression_attribute_names("#state", STATE_ATTR)
            .expression_attribute_names("#pool", POOL_ATTR)
            .expression_attribute_values(":recycled", s(MemberState::Recycled.as_str()))
            .send()
            .await;
        match res {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failed(&e) => Ok(false),
            Err(e) => Err(port_error(DEP, op, &e)),
        }
    }

    /// The reconcile's `ListTasks` cursor of `deployment` (consistent `GetItem` of
    /// [`backstop_pk`]): the `nextToken` of the page to read next; `None` to start over.
    pub(crate) async fn backstop_cursor(
        &self,
        deployment: &DeploymentId,
        now: u64,
    ) -> Result<Option<String>, PortError> {
        let op = "reconcile_pool";
        let out = self
            .ddb
            .get_item()
            .table_name(self.table.as_ref())
            .key(PK, s(backstop_pk(deployment)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| port_error(DEP, op, &e))?;
        match out.item() {
            Some(item) if !expired(item, now, op)? && item.contains_key("next_token") => {
                Ok(Some(get_s(item, "next_token", DEP, op)?.to_owned()))
            }
            _ => Ok(None),
        }
    }

    /// Stores the cursor (`PutItem` of [`backstop_pk`]: `next_token` when `Some`,
    /// `expires_at` = `now` + 1 day).
    pub(crate) async fn set_backstop_cursor(
        &self,
        deployment: &DeploymentId,
        next_token: Option<&str>,
        now: u64,
    ) -> Result<(), PortError> {
        let op = "reconcile_pool";
        let mut put = self
            .ddb
            .put_item()
            .table_name(self.table.as_ref())
            .item(PK, s(backstop_pk(deployment)))
            .item(TTL_ATTR, n(now.saturating_add(DAY_SECS)));
        if let Some(token) = next_token {
            put = put.item("next_token", s(token));
        }
        put.send().await.map_err(|e| port_error(DEP, op, &e))?;
        Ok(())
    }
}
