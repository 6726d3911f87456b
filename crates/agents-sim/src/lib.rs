//! A local OpenAI Agents API simulator for the demo (`make run`) and end-to-end tests.
//!
//! It serves, on **127.0.0.1 only** (it never binds another address), the Agents API calls
//! the controller makes, with JSON shaped exactly like the official SDK 3.51.0 models and
//! the `events/` fixtures, and it delivers signed webhooks the way the API does: at least
//! once, with retries, and optionally duplicated, delayed and reordered.
//!
//! ```no_run
//! use agents_sim::{SessionEnvironment, SimConfig, spawn};
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let receiver: agents_sim::Url = "http://127.0.0.1:9000/webhooks".parse()?;
//! let sim = spawn(SimConfig::default().with_webhook(receiver, agents_sim::DEFAULT_WEBHOOK_SECRET)).await?;
//! let client = sim.client();
//! let session = client.create_session(SessionEnvironment::self_hosted()).await?;
//! client.submit_message(session.id.as_str(), "run the tests").await?; // -> requires_action
//! let env = session.self_hosted().map(|e| e.id.to_string()).unwrap_or_default();
//! client.connect(&env).await?; // the executor stand-in: the turn runs
//! sim.wait_deliveries_idle(Duration::from_secs(5)).await;
//! sim.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # What is simulated
//!
//! - **Sessions** (`POST/GET/DELETE /v1/agents/sessions[/{id}]`, list): `self_hosted`
//!   sessions get a fresh `env_...` environment whose `remote_url` is the API base
//!   `http://127.0.0.1:PORT/v1` (codex appends `/cloud/environment/{id}/register`);
//!   `openai_hosted` and
//!   `none` exist for the controller's ignore cases. Deleting answers
//!   `agent.session.deleted`, emits **no** webhook and leaves any executor connection
//!   alone (agents-api.md); the session and its environment answer 404 afterwards.
//! - **Input and turns** (`POST .../events`, turns, items): see [`turns`]
//!   for the state machine: no executor → `requires_action` + `environment_connection` +
//!   `agent.session.action_required`; connect → `in_progress`; after
//!   [`SimConfig::turn_secs`] → `completed` + `idle`; no connection within
//!   [`SimConfig::connect_deadline_secs`] → the input fails; a mid-turn disconnect fails the
//!   command item while the turn completes.
//! - **The executor**: the Agents API side of the real protocol of `codex exec-server
//!   forward` 0.171.0 (../shared/reference/executor-protocol.md): `registration`
//!   (`register`, `validate`; the restricted executor key as bearer, 401 for a wrong one,
//!   404 for an unknown environment), `rendezvous` (one WebSocket per registration; the
//!   environment is `connected` while it is up) and the harness as the Noise initiator
//!   running each turn's command through the forwarder. The real pinned codex and the
//!   `sim-executor` stand-in ([`forwarder`]) both register and relay this way;
//!   [`executor_connect`] is a control route that marks an environment connected without
//!   an executor (the moto harness, the simulator's own tests).
//! - **Webhooks**: see [`webhooks`]: Standard Webhooks signatures with
//!   [`sandbox_core::WebhookVerifier::sign`], `webhook-timestamp` from the real clock,
//!   retries with backoff, and the faults `duplicates`, `reorder` and `delay_ms`.
//! - **Time**: [`SimClock`] scales real time ([`SimConfig::time_scale`], default 60×) or
//!   runs manually (`0.0` + [`SimHandle::advance_clock`]); simulated seconds go into
//!   `created_at`/`last_active_at`/turn times and drive deadlines and durations.
//! - **Control** under `/sim` (no auth, loopback only): state snapshot, fail a session,
//!   make one wait on a function call, advance the clock, emit any event, wait for
//!   deliveries; see [`control`].
//!
//! Authentication: `/v1/agents/...` needs `Authorization: Bearer <api_key>` (401) and
//! `OpenAI-Beta: agents=v1` (400); the executor endpoints need the executor key instead
//! (401). Errors use the OpenAI shape `{"error": {"message", "type", "param", "code"}}`.
//! Keys and the webhook secret never appear in `Debug` output, logs or errors.
#![deny(clippy::all)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod auth;
mod body;
pub mod client;
pub mod clock;
pub mod config;
pub mod control;
pub mod error;
pub mod exec_protocol;
pub mod executor_connect;
pub mod forwarder;
pub mod noise_session;
mod objects;
pub mod pagination;
mod registration;
pub mod relay_frame;
mod rendezvous;
pub mod rng;
pub mod routes;
pub mod server;
pub mod snapshot;
pub mod state;
pub mod turns;
pub mod webhooks;

pub use auth::{BETA_HEADER, BETA_VALUE};
pub use client::{ClientError, SessionEnvironment, SimClient};
pub use clock::{SimClock, real_unix_secs};
pub use config::{
    ConnectTimeoutOutcome, DEFAULT_AGENT_ID, DEFAULT_API_KEY, DEFAULT_EXECUTOR_KEY,
    DEFAULT_WEBHOOK_SECRET, SimConfig,
};
pub use error::{ApiError, SimError};
/// The URL type of [`SimConfig::webhook_url`] (re-exported from `reqwest`).
pub use reqwest::Url;
pub use routes::{TURN_ID_HEADER, router};
pub use server::{SimHandle, spawn};
pub use snapshot::{DeliveryStats, EmittedEvent, EnvironmentSummary, SessionSummary, SimSnapshot};
pub use state::SimState;
