//! The warm pool's DynamoDB table (issue 27, docs/WARM_POOL.md "The pool table"): every
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

use crate::sdk_error::port_error;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, Delete, GlobalSecondaryIndex, KeySchemaElement, KeyType,
    KeysAndAttributes, Projection, ProjectionType, Put, ScalarAttributeType, TransactWriteItem,
    Update,
};
use backon::BackoffBuilder;
use sandbox_controller::ports::{Fence, PortError};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation, SessionId};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::dynamo_item::{Item, corrupt, get_n, get_s, is_condition_failed, n, s};

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

/// A member's state (`state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    /// Started, serving nobody, claimable while young enough.
    Idle,
    /// Claimed by one environment: an ordinary instance of it from now on.
    Assigned,
    /// Past its maximum age: being stopped, never claimed.
    Recycled,
}

impl MemberState {
    fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Assigned => "assigned",
            Self::Recycled => "recycled",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "idle" => Some(Self::Idle),
            "assigned" => Some(Self::Assigned),
            "recycled" => Some(Self::Recycled),
            _ => None,
        }
    }
}

/// What a claim assigned to a member (its item's claim attributes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// The environment.
    pub environment_id: EnvironmentId,
    /// Its session.
    pub session_id: SessionId,
    /// The executor generation.
    pub generation: Generation,
    /// The start's idempotency token.
    pub idempotency_token: String,
    /// When it was claimed, Unix seconds.
    pub assigned_at: u64,
}

/// A member item as read (unexpired).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberItem {
    /// `<task role id>:<task id>`.
    pub pk: String,
    /// The deployment that started it.
    pub deployment: String,
    /// The task's ARN.
    pub task_arn: String,
    /// When it was started, Unix seconds.
    pub created_at: u64,
    /// Its state.
    pub state: MemberState,
    /// Once claimed: what it serves.
    pub assignment: Option<Assignment>,
}

/// A token item as read (unexpired): what a token claimed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenItem {
    /// The claimed member's task ARN.
    pub task_arn: String,
    /// The claimed member's key.
    pub member_pk: String,
    /// The environment it was claimed for.
    pub environment_id: EnvironmentId,
    /// Its session.
    pub session_id: SessionId,
    /// The generation.
    pub generation: Generation,
}

/// A launch item as read (unexpired): a member's `RunTask` about to be sent, or sent and
/// not recorded yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchItem {
    /// `launch#<deployment>#<client token>` ([`launch_pk`]).
    pub pk: String,
    /// The `RunTask` `clientToken`.
    pub client_token: String,
    /// When it was written, Unix seconds (the member's `created_at` once recorded).
    pub created_at: u64,
}

/// An item of the refill's partition ([`POOL_INDEX`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolItem {
    /// A launch not recorded yet.
    Launch(LaunchItem),
    /// An idle member, or a recycled one whose stop is not confirmed yet.
    Member(MemberItem),
}

/// What a claim transaction did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimWrite {
    /// The member is assigned and the token written, together.
    Claimed,
    /// The member is no longer claimable (claimed, recycled, gone, too old): nothing
    /// written.
    MemberTaken,
    /// The token item exists already (this token claimed a member meanwhile): nothing
    /// written; read the token.
    TokenTaken,
    /// Another transaction held the member this moment (`TransactionConflict`): nothing
    /// written.
    Conflict,
    /// The environment's lock is no longer the claiming worker's (the fence's
    /// `ConditionCheck` failed): nothing written.
    LockLost,
}

/// The member key: `<task role id>:<task id>`, the task's own `aws:userid` (ECS assumes
/// the task role with the task id as the role session name; IAM User Guide, "IAM policy
/// elements: Variables and tags").
pub fn member_pk(task_role_id: &str, task_id: &str) -> String {
    format!("{task_role_id}:{task_id}")
}

/// The token key: `token#<deployment>#<idempotency token>`.
pub fn token_pk(deployment: &DeploymentId, token: &str) -> String {
    format!("token#{}#{token}", deployment.as_str())
}

/// The refill lease key: `refill#<deployment>`.
pub fn lease_pk(deployment: &DeploymentId) -> String {
    format!("refill#{}", deployment.as_str())
}

/// The launch key of a member's `RunTask`: `launch#<deployment>#<client token>`.
pub fn launch_pk(deployment: &DeploymentId, client_token: &str) -> String {
    format!("launch#{}#{client_token}", deployment.as_str())
}

/// The key of the reconcile's `ListTasks` cursor: `backstop#<deployment>`.
pub fn backstop_pk(deployment: &DeploymentId) -> String {
    format!("backstop#{}", deployment.as_str())
}

/// The `by_environment` key: `<deployment>#<environment id>`.
pub fn claimed_environment(deployment: &DeploymentId, environment_id: &EnvironmentId) -> String {
    format!("{}#{}", deployment.as_str(), environment_id.as_str())
}

fn build_error(
    operation: &'static str,
) -> impl Fn(aws_sdk_dynamodb::error::BuildError) -> PortError {
    move |e| PortError::permanent(DEP, operation, format!("request not built: {e}"))
}

/// Whether `item` is expired at `now` (`expires_at <= now`): it reads as absent. An item
/// without `expires_at` never expires.
fn expired(item: &Item, now: u64, operation: &'static str) -> Result<bool, PortError> {
    if !item.contains_key(TTL_ATTR) {
        return Ok(false);
    }
    Ok(get_n(item, TTL_ATTR, DEP, operation)? <= now)
}

fn decode_member(item: &Item, operation: &'static str) -> Result<MemberItem, PortError> {
    let state_text = get_s(item, STATE_ATTR, DEP, operation)?;
    let state = MemberState::parse(state_text).ok_or_else(|| {
        corrupt(
            DEP,
            operation,
            format!("unknown member state {state_text:?}"),
        )
    })?;
    let assignment = if item.contains_key("environment_id") {
        Some(Assignment {
            environment_id: EnvironmentId::new(get_s(item, "environment_id", DEP, operation)?),
            session_id: SessionId::new(get_s(item, "session_id", DEP, operation)?),
            generation: Generation(get_n(item, "generation", DEP, operation)?),
            idempotency_token: get_s(item, "idempotency_token", DEP, operation)?.to_owned(),
            assigned_at: get_n(item, "assigned_at", DEP, operation)?,
        })
    } else {
        None
    };
    if state == MemberState::Assigned && assignment.is_none() {
        return Err(corrupt(
            DEP,
            operation,
            "an assigned member without its assignment",
        ));
    }
    Ok(MemberItem {
        pk: get_s(item, PK, DEP, operation)?.to_owned(),
        deployment: get_s(item, "deployment", DEP, operation)?.to_owned(),
        task_arn: get_s(item, "task_arn", DEP, operation)?.to_owned(),
        created_at: get_n(item, CREATED_ATTR, DEP, operation)?,
        state,
        assignment,
    })
}

fn decode_token(item: &Item, operation: &'static str) -> Result<TokenItem, PortError> {
    Ok(TokenItem {
        task_arn: get_s(item, "task_arn", DEP, operation)?.to_owned(),
        member_pk: get_s(item, "member_pk", DEP, operation)?.to_owned(),
        environment_id: EnvironmentId::new(get_s(item, "environment_id", DEP, operation)?),
        session_id: SessionId::new(get_s(item, "session_id", DEP, operation)?),
        generation: Generation(get_n(item, "generation", DEP, operation)?),
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_the_documented_shapes() {
        let d = DeploymentId::new("prod").unwrap();
        assert_eq!(member_pk("AROAEXAMPLE", "abc123"), "AROAEXAMPLE:abc123");
        assert_eq!(token_pk(&d, "tok"), "token#prod#tok");
        assert_eq!(lease_pk(&d), "refill#prod");
        assert_eq!(
            claimed_environment(&d, &EnvironmentId::new("env_1")),
            "prod#env_1"
        );
    }

    #[test]
    fn an_item_expired_at_now_reads_as_absent() {
        let item: Item = HashMap::from([(TTL_ATTR.to_owned(), n(100))]);
        assert!(expired(&item, 100, "t").unwrap());
        assert!(!expired(&item, 99, "t").unwrap());
        assert!(!expired(&HashMap::new(), u64::MAX, "t").unwrap());
    }
}
