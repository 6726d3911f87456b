//! The simulator's observable state (`GET /sim/state`, [`SimHandle::state`](crate::SimHandle::state)):
//! sessions (deleted ones included), environments with their executor connections, the
//! webhook event log and the delivery counters.

use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::session::SessionStatus;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Everything a scenario or test may want to assert on, at one instant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimSnapshot {
    /// Simulated time, Unix seconds.
    pub now: i64,
    /// Simulated seconds per real second (`0` = manual clock).
    pub time_scale: f64,
    /// Every session ever created, in creation order (deleted ones with `deleted: true`).
    pub sessions: Vec<SessionSummary>,
    /// Every environment ever created, in creation order.
    pub environments: Vec<EnvironmentSummary>,
    /// Delivery counters.
    pub deliveries: DeliveryStats,
    /// Every webhook event emitted, in emission order.
    pub events: Vec<EmittedEvent>,
}

impl SimSnapshot {
    /// The session with this id, if it was ever created.
    pub fn session(&self, id: &str) -> Option<&SessionSummary> {
        self.sessions.iter().find(|s| s.id == id)
    }

    /// The environment with this id, if it was ever created.
    pub fn environment(&self, id: &str) -> Option<&EnvironmentSummary> {
        self.environments.iter().find(|e| e.id == id)
    }

    /// The emitted events of one session, in order.
    pub fn events_of_session(&self, session_id: &str) -> Vec<&EmittedEvent> {
        self.events
            .iter()
            .filter(|e| e.session_id.as_deref() == Some(session_id))
            .collect()
    }
}

/// One session, summarised.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionSummary {
    /// Session id.
    pub id: String,
    /// Current status.
    pub status: SessionStatus,
    /// Deleted through `DELETE /v1/agents/sessions/{id}` (the API then answers 404).
    pub deleted: bool,
    /// `none`, `openai_hosted` or `self_hosted`.
    pub environment_type: String,
    /// The environment id, when there is one.
    pub environment_id: Option<String>,
    /// The `type` of every current required action.
    pub required_actions: Vec<String>,
    /// Number of turns.
    pub turns: usize,
    /// The turn that is queued, waiting for a connection or running, if any.
    pub active_turn: Option<String>,
    /// The session's `error`.
    pub error: Option<String>,
}

/// One environment, with its executor connections.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EnvironmentSummary {
    /// Environment id.
    pub id: String,
    /// The session that owns it.
    pub session_id: String,
    /// `openai_hosted` or `self_hosted`.
    pub environment_type: String,
    /// Connection status as `GET /v1/agents/environments/{id}` reports it.
    pub status: EnvironmentStatus,
    /// Whether at least one executor is connected now.
    pub connected: bool,
    /// Executors connected now (more than one means duplicate compute).
    pub connections: usize,
    /// Successful connects so far.
    pub connect_count: u64,
    /// Disconnects so far.
    pub disconnect_count: u64,
    /// Executor registrations accepted (`POST .../cloud/environment/{id}/register`).
    #[serde(default)]
    pub registrations: u64,
    /// Registrations refused with 401 (a wrong or missing executor key).
    #[serde(default)]
    pub refused_registrations: u64,
    /// The owning session was deleted (the API answers 404; connections may linger).
    pub deleted: bool,
}

/// Webhook delivery counters. A *copy* is the original delivery or one of its
/// [`duplicates`](crate::SimConfig::duplicates); each copy is attempted until acknowledged
/// or out of attempts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryStats {
    /// Events emitted (also counted when no webhook URL is configured).
    pub emitted: u64,
    /// Copies scheduled for delivery (`emitted × (1 + duplicates)` with a URL).
    pub copies: u64,
    /// HTTP attempts made.
    pub attempted: u64,
    /// Attempts answered with 2xx.
    pub acknowledged: u64,
    /// Attempts answered with non-2xx or failed to connect.
    pub failed_attempts: u64,
    /// Copies abandoned after `max_delivery_attempts`.
    pub gave_up: u64,
    /// Copies not yet acknowledged or abandoned.
    pub pending: u64,
}

/// One emitted webhook event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EmittedEvent {
    /// The `webhook-id` header (`msg_...`), the same on every copy and retry.
    pub webhook_id: String,
    /// The envelope `id` (`evt_...`).
    pub event_id: String,
    /// The event type, e.g. `agent.session.idle`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Envelope `created_at` (simulated Unix seconds).
    pub created_at: i64,
    /// `data.id` of session events.
    pub session_id: Option<String>,
    /// The envelope `data`.
    pub data: Value,
    /// HTTP attempts for this event, all copies together.
    pub attempts: u64,
    /// Attempts answered with 2xx, all copies together.
    pub acknowledged: u64,
}
