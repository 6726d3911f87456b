//! The controller: async orchestration of the lifecycle over small port traits.
//!
//! - [`webhook`] — `accept_delivery`: verify raw bytes, keep what matters, enqueue,
//!   answer; and the axum router shared by the Lambda and local mode;
//! - [`worker`] — `process` one job: observe, [`sandbox_core::decide`], act under the
//!   effect-key lock, record before release, audit;
//! - [`consume`] — receive, process, ack or retry (local mode's queue loop);
//! - [`refill`] — keep the warm pool at its size ([`pool`]: the plan and the claim);
//! - [`sweep`] — reconcile the registry against the provider inventory and the sessions;
//! - [`close`] — the operator's cleanup transaction;
//! - [`dry_run`] — what a sweep would decide, without a lock or an effect;
//! - [`terminal`] — the terminal record a close writes once;
//! - [`ports`] — the traits every backend implements;
//! - [`receipt`] — the proofs that a resource reached its final state (the registry
//!   stores them; the terminal record is assembled from them);
//! - [`metrics`] — the metric names and where they are recorded (the `metrics` facade;
//!   the Lambda functions emit them in CloudWatch embedded metric format).
//!
//! With the `test-support` feature (tests, the fuzz target and the benches only): `contract`
//! (the contract suite every adapter passes), `doubles` (a stopped clock and a recording
//! queue) and crash points that abort where `SANDBOX_CRASH_AT` says ([`crash_point`];
//! without the feature they compile to nothing).
#![forbid(unsafe_code)]
#![deny(clippy::all)]
#![warn(missing_docs)]

pub mod close;
pub mod config;
mod connect_watch;
pub mod consume;
#[cfg(feature = "test-support")]
pub mod contract;
pub mod crash_point;
#[cfg(feature = "test-support")]
pub mod doubles;
pub mod dry_run;
pub mod job;
pub mod metrics;
pub mod no_sessions;
pub mod operator_gate;
pub mod pool;
pub mod ports;
pub mod receipt;
pub mod refill;
pub mod sweep;
pub mod terminal;
pub mod webhook;
pub mod worker;

pub use close::CloseReport;
pub use config::ControllerConfig;
pub use job::{Job, SweptEvidence};
pub use no_sessions::NoSessions;
pub use sweep::{SweepPlan, SweepReport};
pub use terminal::TerminalRecord;
pub use webhook::{Intake, router};
pub use worker::{Controller, Disposition, Processed};
