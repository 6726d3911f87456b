//! Typed async client for the OpenAI Agents API calls of the sandbox-lifecycle controller.
//!
//! The controller re-reads state before every decision (events are hints, state is
//! authority); this crate is how it reads the Agents API side of that state:
//!
//! | call | endpoint | returns |
//! |---|---|---|
//! | [`SessionsApi::retrieve_session`] | `GET /agents/sessions/{id}` | [`Session`](sandbox_core::session::Session) |
//! | [`SessionsApi::delete_session`] | `DELETE /agents/sessions/{id}` (+ `Idempotency-Key`) | [`SessionDeleted`] |
//! | [`SessionsApi::retrieve_environment`] | `GET /agents/environments/{id}` | [`EnvironmentInfo`](sandbox_core::environment::EnvironmentInfo) |
//! | [`SessionsApi::list_turns`] | `GET /agents/sessions/{id}/turns` | [`Page`](sandbox_core::turn::Page)`<`[`Turn`](sandbox_core::turn::Turn)`>` |
//! | [`SessionsApi::list_turn_items`] | `GET /agents/sessions/{id}/turns/{turn_id}/items` | `Page<`[`Item`](sandbox_core::turn::Item)`>` |
//!
//! Transport (agents-api.md: Transport): configurable base URL (default
//! `https://api.openai.com/v1`), `Authorization: Bearer <key>` and `OpenAI-Beta: agents=v1`
//! on every call, rustls TLS, a connect timeout (default 5 s) and an overall per-attempt
//! timeout (default 20 s). Failed attempts are retried with exponential backoff (the
//! `backon` crate) on 429, 5xx, timeouts and connection failures, honouring `Retry-After`
//! up to a cap; 404 is [`ApiError::NotFound`] at once, other 4xx are [`ApiError::Http`].
//! [`ApiError::unavailable`] maps a failure to the decision core's
//! [`Unavailable`](sandbox_core::observed::Unavailable).
//!
//! Secrets: the API key appears in no `Debug`, `Display`, error or log; error response
//! bodies are never read and JSON decode errors keep only positions. Debug-level
//! `tracing` events record method, path, attempt, status and elapsed time.
//!
//! ```no_run
//! use sandbox_agents_api::{AgentsClient, ApiError, ClientConfig, SessionsApi};
//! use sandbox_core::SessionId;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = AgentsClient::new(ClientConfig::new(std::env::var("OPENAI_API_KEY")?))?;
//! match client.retrieve_session(&SessionId::new("sess_123")).await {
//!     Ok(session) => println!("{:?}", session.status),
//!     Err(ApiError::NotFound { .. }) => println!("deleted"),
//!     Err(err) => println!("unavailable: {:?}", err.unavailable()),
//! }
//! # Ok(()) }
//! ```
#![deny(clippy::all)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod api;
mod client;
mod config;
mod error;

pub use api::{MAX_PAGE_LIMIT, MIN_PAGE_LIMIT, Order, PageParams, SessionDeleted, SessionsApi};
pub use client::{AgentsClient, BETA_HEADER, BETA_VALUE, IDEMPOTENCY_KEY_HEADER};
pub use config::{
    ApiKey, ClientConfig, ConfigError, DEFAULT_BASE_URL, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT, RetryPolicy,
};
pub use error::{ApiError, DecodeError};
