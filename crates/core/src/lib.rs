//! Pure lifecycle core of sandbox-lifecycle.
//!
//! Everything here is a function of its inputs: no I/O, no async runtime, no clock
//! (callers pass `now` as Unix seconds). The crate holds
//!
//! - the Agents API models the controller reads ([`session`], [`environment`], [`turn`],
//!   [`event`]), with field names exactly as the API spells them and forward-compatible
//!   parsing (unknown fields are kept, unknown enum values parse as `Unknown`);
//! - Standard Webhooks verification and signing over raw body bytes ([`webhook`]);
//! - identifiers, effect keys, generations and compute idempotency tokens ([`ids`]);
//! - the controller's own state ([`record`], [`compute`]) and the observation it decides on
//!   ([`observed`]);
//! - the decision itself, [`decide`], one concern per file of [`decision`], and the types it
//!   returns ([`outcome`], [`reason`]), which import nothing above them.
//!
//! Module layers, each importing only those before it: the API models, [`ids`],
//! [`compute`], [`workspace`], [`remote_url`] and [`webhook`]; [`evidence`]; [`record`];
//! [`observed`] and [`operator_proof`]; [`reason`] and [`outcome`]; [`decision`] (checked by
//! `tests/house_rules.rs`).
//!
//! Source of the rules: `shared/reference/agents-api.md` (API facts) and
//! `shared/reference/lifecycle-cases.md` (the situations and their one right outcome).
#![forbid(unsafe_code)]
#![deny(clippy::all)]
#![warn(missing_docs)]

pub mod compute;
pub mod decision;
pub mod environment;
pub mod event;
pub mod evidence;
pub mod ids;
pub mod observed;
pub mod operator_proof;
pub mod outcome;
pub mod reason;
pub mod record;
pub mod remote_url;
pub mod session;
pub mod turn;
pub mod webhook;
pub mod workspace;

pub use decision::{Decision, Effect, Outcome, Reason, StartSpec, StopSpec, decide};
pub use ids::{DeploymentId, EffectKey, EnvironmentId, Generation, InstanceId, SessionId};
pub use observed::{Inventory, Observed, OwnershipFilter, Policy, SessionView, Trigger};
pub use webhook::{VerifiedDelivery, VerifyError, WebhookVerifier};
