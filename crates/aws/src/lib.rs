//! The AWS backend of the controller: the port traits of
//! [`sandbox_controller::ports`] on AWS services.
//!
//! - [`sqs_queue`] — [`SqsQueue`]: the [`Queue`](sandbox_controller::ports::Queue) port on
//!   SQS (the FIFO events queue and the standard delay queue);
//! - [`dynamo_registry`] — [`DynamoRegistry`]: the
//!   [`Registry`](sandbox_controller::ports::Registry) port on one DynamoDB table (schema
//!   in the module docs; [`create_table`] creates it);
//! - [`ecs_compute`] — [`EcsCompute`]: the [`Compute`](sandbox_controller::ports::Compute)
//!   port on ECS Fargate tasks (a lost start is found again by its RunTask `clientToken`);
//! - [`ecs_pool`] and [`pool_table`] — the warm pool (docs/WARM_POOL.md) on ECS
//!   and its own DynamoDB table: [`EcsCompute::with_pool`] with a [`PoolConfig`];
//! - `ebs_workspaces` (feature `ec2`) — `EbsConfig`: workspaces on ECS-managed EBS
//!   volumes, snapshotted after the task stopped (the `Workspaces` port of `EcsCompute`);
//! - [`sqs_dead_letters`] — the dead-letter queues for the operator: find, peek, redrive;
//! - [`secrets`] — [`read_secret`]: one Secrets Manager value behind a redacted type;
//! - `bootstrap` (feature `bootstrap`) — creating the queues, the ECS cluster and task definition (and, on
//!   moto only, pinning task states) for tests and a local stack on moto;
//! - `strict_ecs` (feature `bootstrap`) — `StrictEcs`: the ECS client interceptor of the
//!   moto tests, which rejects requests the ECS API reference forbids, records every
//!   request's shape and can make new tasks lag like ECS;
//! - [`settings`] — the deployment's configuration from environment variables, read
//!   alike by the Lambda functions and `sandboxctl --backend aws`;
//! - [`sdk_config`] — [`load_sdk_config`]: the shared SDK configuration (region, optional
//!   endpoint override for moto).
//!
//! Features: `dynamodb` and `ecs` (default) bring the registry and the compute adapters;
//! the queue and the secrets reader are always in (the webhook function needs only
//! those: build it with `default-features = false`). `ec2` adds EBS workspaces (a heavy
//! build: only the worker and sweeper Lambdas enable it). `bootstrap` is test support.
//!
//! Every adapter passes the shared contract suite in
//! `sandbox_controller::contract` (feature `test-support`) against moto (`tests/moto/run.sh cargo nextest run -p
//! sandbox-aws`); where moto differs from AWS the module docs say so.
#![deny(clippy::all)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(feature = "bootstrap")]
pub mod bootstrap;
#[cfg(feature = "dynamodb")]
mod dynamo_item;
#[cfg(feature = "dynamodb")]
pub mod dynamo_registry;
#[cfg(feature = "ec2")]
pub mod ebs_workspaces;
#[cfg(feature = "ecs")]
pub mod ecs_compute;
#[cfg(feature = "ecs")]
pub mod ecs_pool;
#[cfg(feature = "ecs")]
mod ecs_task;
#[cfg(feature = "dynamodb")]
pub mod pool_table;
pub mod sdk_config;
mod sdk_error;
pub mod secrets;
pub mod settings;
pub mod sqs_dead_letters;
pub mod sqs_queue;
#[cfg(feature = "bootstrap")]
pub mod strict_ecs;

#[cfg(feature = "dynamodb")]
pub use dynamo_registry::{DynamoRegistry, OpenIndexBackfill, create_table};
#[cfg(feature = "ec2")]
pub use ebs_workspaces::EbsConfig;
#[cfg(feature = "ecs")]
pub use ecs_compute::{EcsCompute, EcsConfig};
#[cfg(feature = "ecs")]
pub use ecs_pool::{PoolConfig, pool_started_by};
pub use sdk_config::load_sdk_config;
pub use secrets::{SecretError, SecretString, read_secret};
pub use sqs_queue::{SqsQueue, SqsQueueOptions, sqs_fifo_id};
