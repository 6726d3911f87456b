//! Creating the registry table ([`create_table`]) and waiting until a new table is
//! `ACTIVE` with TTL on (shared with the pool table).

use super::{
    CREATE_WAIT, DEP, OPEN_ATTR, OPEN_INDEX, PK, SESSION_ATTR, SESSION_INDEX, SK, TTL_ATTR,
};
use crate::sdk_error::port_error;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TableStatus, TimeToLiveSpecification,
};
use sandbox_controller::ports::PortError;
use std::time::Duration;

/// Creates the registry table `table` with the schema in the module docs (for tests and
/// local bootstrap; production tables come from the SAM/CDK templates), waits until it is
/// `ACTIVE` (at most 120 s) and enables TTL on `expires_at`.
///
/// # Errors
/// A [`PortError`] when a call fails (including `ResourceInUseException` when the table
/// exists) or the table does not become active in time.
pub async fn create_table(client: &Client, table: &str) -> Result<(), PortError> {
    let op = "create_table";
    let build = |e: aws_sdk_dynamodb::error::BuildError| {
        PortError::permanent(DEP, op, format!("request not built: {e}"))
    };
    let attr = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .map_err(build)
    };
    let key = |name: &str, kind: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .map_err(build)
    };
    let index = GlobalSecondaryIndex::builder()
        .index_name(SESSION_INDEX)
        .key_schema(key(SESSION_ATTR, KeyType::Hash)?)
        .projection(
            Projection::builder()
                .projection_type(ProjectionType::KeysOnly)
                .build(),
        )
        .build()
        .map_err(build)?;
    let open_index = GlobalSecondaryIndex::builder()
        .index_name(OPEN_INDEX)
        .key_schema(key(OPEN_ATTR, KeyType::Hash)?)
        .key_schema(key(PK, KeyType::Range)?)
        .projection(
            Projection::builder()
                .projection_type(ProjectionType::All)
                .build(),
        )
        .build()
        .map_err(build)?;
    client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr(PK)?)
        .attribute_definitions(attr(SK)?)
        .attribute_definitions(attr(SESSION_ATTR)?)
        .attribute_definitions(attr(OPEN_ATTR)?)
        .key_schema(key(PK, KeyType::Hash)?)
        .key_schema(key(SK, KeyType::Range)?)
        .global_secondary_indexes(index)
        .global_secondary_indexes(open_index)
        .send()
        .await
        .map_err(|e| port_error(DEP, op, &e))?;
    await_active_with_ttl(client, table, TTL_ATTR, op).await
}

/// Waits (up to 120 s, every 500 ms) until the new table `table` is `ACTIVE`, then turns
/// DynamoDB TTL on for `ttl_attr`: the end of every `create_table` of this crate (tests
/// and local tooling; the templates create the deployed tables).
///
/// # Errors
/// A [`PortError`] of a call, or a transient one when the table is not `ACTIVE` in time.
pub(crate) async fn await_active_with_ttl(
    client: &Client,
    table: &str,
    ttl_attr: &str,
    op: &'static str,
) -> Result<(), PortError> {
    let build = |e: aws_sdk_dynamodb::error::BuildError| {
        PortError::permanent(DEP, op, format!("table definition: {e}"))
    };
    let deadline = tokio::time::Instant::now() + CREATE_WAIT;
    loop {
        let out = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| port_error(DEP, op, &e))?;
        if out.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(PortError::transient(
                DEP,
                op,
                format!("table {table} not ACTIVE after {CREATE_WAIT:?}"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    client
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .attribute_name(ttl_attr)
                .enabled(true)
                .build()
                .map_err(build)?,
        )
        .send()
        .await
        .map_err(|e| port_error(DEP, op, &e))?;
    Ok(())
}
