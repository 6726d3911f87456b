//! The AWS Lambda functions of sandbox-lifecycle, each a thin shell over the controller:
//!
//! | binary | trigger | does |
//! |---|---|---|
//! | `webhook` | Function URL / API Gateway (HTTP or REST) | verify the raw bytes, enqueue a job on the events queue, answer ([`webhook_handler`]) |
//! | `worker` | SQS: events queue (FIFO) and timers queue | `Controller::process` per record, partial batch response ([`worker_handler`], [`batch_response`]) |
//! | `sweeper` | EventBridge schedule | `Controller::sweep` ([`sweeper_handler`]) |
//!
//! Each binary reads its [`settings`] from environment variables, reads its secrets once
//! per cold start ([`secrets_at_init`]), builds its AWS clients once ([`aws_wiring`]) and
//! runs. Logs are JSON ([`json_logs`]); metrics are CloudWatch embedded metric format
//! documents flushed after every invocation ([`emf`]).
//!
//! Features: `webhook`, `worker`, `sweeper` (all by default). The webhook alone
//! (`--no-default-features --features webhook`) links only the SQS and Secrets Manager
//! clients; `worker` and `sweeper` add DynamoDB, ECS and the Agents API client.
#![forbid(unsafe_code)]
#![deny(clippy::all)]
#![warn(missing_docs)]

pub mod aws_wiring;
#[cfg(feature = "worker")]
pub mod batch_response;
pub mod emf;
pub mod json_logs;
pub mod secrets_at_init;
/// The settings, shared with `sandboxctl --backend aws`: they live in `sandbox_aws::settings`.
pub use sandbox_aws::settings;
#[cfg(feature = "sweeper")]
pub mod sweeper_handler;
#[cfg(feature = "webhook")]
pub mod webhook_handler;
#[cfg(feature = "worker")]
pub mod worker_handler;
