//! DynamoDB item helpers shared by the two tables this crate writes (the registry,
//! [`crate::dynamo_registry`], and the warm pool's, [`crate::pool_table`]): attribute
//! values, typed reads that name a missing or mistyped attribute, and the conditional
//! write's failure. No SDK call lives here (the IAM test of infra/tests reads each
//! adapter's calls from its own file).

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::types::AttributeValue;
use sandbox_controller::ports::PortError;
use std::collections::HashMap;

/// An item as the SDK reads and writes it.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// A string attribute value.
pub(crate) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

/// A number attribute value (DynamoDB `N`, sent as its decimal text).
pub(crate) fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// A stored item that does not decode: a permanent error of `dependency`'s `operation`.
pub(crate) fn corrupt(
    dependency: &'static str,
    operation: &'static str,
    message: impl Into<String>,
) -> PortError {
    PortError::permanent(dependency, operation, message)
}

/// The string attribute `name` of `item`.
///
/// # Errors
/// A permanent [`PortError`] of `dependency`/`operation` naming the attribute when it is
/// missing or not a string.
pub(crate) fn get_s<'a>(
    item: &'a Item,
    name: &str,
    dependency: &'static str,
    operation: &'static str,
) -> Result<&'a str, PortError> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Ok(v),
        _ => Err(corrupt(
            dependency,
            operation,
            format!("item attribute {name} is missing or not a string"),
        )),
    }
}

/// The unsigned integer attribute `name` of `item`.
///
/// # Errors
/// A permanent [`PortError`] of `dependency`/`operation` naming the attribute when it is
/// missing, not a number, or not an unsigned integer.
pub(crate) fn get_n(
    item: &Item,
    name: &str,
    dependency: &'static str,
    operation: &'static str,
) -> Result<u64, PortError> {
    match item.get(name) {
        Some(AttributeValue::N(v)) => v.parse::<u64>().map_err(|_| {
            corrupt(
                dependency,
                operation,
                format!("item attribute {name} is not an unsigned integer: {v:?}"),
            )
        }),
        _ => Err(corrupt(
            dependency,
            operation,
            format!("item attribute {name} is missing or not a number"),
        )),
    }
}

/// Whether a single-item write failed its condition (`ConditionalCheckFailedException`).
pub(crate) fn is_condition_failed<E>(err: &SdkError<E>) -> bool
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata,
{
    crate::sdk_error::code(err) == Some("ConditionalCheckFailedException")
}
