//! The pool table's items as values: a member's state, its assignment, the member, token and
//! launch items, the claim's transaction outcome, the keys (`member_pk`, `token_pk`, ...) and
//! the decoding of a stored item (the schema is in the module docs of [`crate::pool_table`]).

use super::{CREATED_ATTR, DEP, PK, STATE_ATTR, TTL_ATTR};
use crate::dynamo_item::{Item, corrupt, get_n, get_s};
use sandbox_controller::ports::PortError;
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation, SessionId};

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
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Assigned => "assigned",
            Self::Recycled => "recycled",
        }
    }

    pub(super) fn parse(s: &str) -> Option<Self> {
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

/// An item of the refill's partition ([`POOL_INDEX`](super::POOL_INDEX)).
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

pub(super) fn build_error(
    operation: &'static str,
) -> impl Fn(aws_sdk_dynamodb::error::BuildError) -> PortError {
    move |e| PortError::permanent(DEP, operation, format!("request not built: {e}"))
}

/// Whether `item` is expired at `now` (`expires_at <= now`): it reads as absent. An item
/// without `expires_at` never expires.
pub(super) fn expired(item: &Item, now: u64, operation: &'static str) -> Result<bool, PortError> {
    if !item.contains_key(TTL_ATTR) {
        return Ok(false);
    }
    Ok(get_n(item, TTL_ATTR, DEP, operation)? <= now)
}

pub(super) fn decode_member(item: &Item, operation: &'static str) -> Result<MemberItem, PortError> {
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

pub(super) fn decode_token(item: &Item, operation: &'static str) -> Result<TokenItem, PortError> {
    Ok(TokenItem {
        task_arn: get_s(item, "task_arn", DEP, operation)?.to_owned(),
        member_pk: get_s(item, "member_pk", DEP, operation)?.to_owned(),
        environment_id: EnvironmentId::new(get_s(item, "environment_id", DEP, operation)?),
        session_id: SessionId::new(get_s(item, "session_id", DEP, operation)?),
        generation: Generation(get_n(item, "generation", DEP, operation)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dynamo_item::n;
    use std::collections::HashMap;

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
