//! The simulator's state: sessions, environments, turns and the idempotency cache, behind
//! one mutex, plus the shared clock, webhook dispatcher and change notifications.
//!
//! Every handler does its whole read-modify-write under the lock (no `.await` inside), so
//! concurrent requests see a consistent order and webhooks are emitted in state order.

pub(crate) mod relays;

use crate::clock::SimClock;
use crate::config::SimConfig;
use crate::error::SimError;
use crate::rng::IdGen;
use crate::snapshot::{DeliveryStats, EnvironmentSummary, SessionSummary, SimSnapshot};
use crate::webhooks::Dispatcher;
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::session::SessionStatus;
use sandbox_core::turn::TurnStatus;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;

/// The kind of a session's environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EnvKind {
    /// `none`.
    None,
    /// `openai_hosted`.
    OpenAiHosted,
    /// `self_hosted`.
    SelfHosted,
}

impl EnvKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::OpenAiHosted => "openai_hosted",
            Self::SelfHosted => "self_hosted",
        }
    }
}

/// Token usage counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub input: u64,
    pub cached: u64,
    pub output: u64,
    pub reasoning: u64,
}

impl Usage {
    pub(crate) fn add(self, o: Usage) -> Usage {
        Usage {
            input: self.input + o.input,
            cached: self.cached + o.cached,
            output: self.output + o.output,
            reasoning: self.reasoning + o.reasoning,
        }
    }
}

/// One session.
#[derive(Clone, Debug)]
pub(crate) struct SessionRec {
    pub id: String,
    pub agent: Value,
    pub agent_id: String,
    pub created_at: i64,
    pub last_active_at: i64,
    pub status: SessionStatus,
    pub required_actions: Vec<Value>,
    pub env_kind: EnvKind,
    pub env_id: Option<String>,
    pub remote_url: Option<String>,
    pub workspace_directory: String,
    pub metadata: BTreeMap<String, String>,
    pub error: Option<String>,
    pub vault_ids: Vec<String>,
    pub usage: Option<Usage>,
    pub deleted: bool,
    pub turn_ids: Vec<String>,
    /// Simulated time at which the current input started waiting for a connection.
    pub connect_wait_since: Option<f64>,
    /// Whether a driver task is running for this session.
    pub driver_running: bool,
}

/// One environment.
#[derive(Clone, Debug)]
pub(crate) struct EnvRec {
    pub id: String,
    pub kind: EnvKind,
    pub session_id: String,
    pub status: EnvironmentStatus,
    pub connections: BTreeSet<String>,
    /// The connections that are a registered forwarder's rendezvous socket
    /// ([`crate::rendezvous`]); a turn's command runs through the newest one.
    pub relay_connections: BTreeSet<String>,
    pub connect_count: u64,
    pub disconnect_count: u64,
    /// Executor registrations accepted, and refused for the key (401).
    pub registrations: u64,
    pub refused_registrations: u64,
    pub deleted: bool,
}

impl EnvRec {
    pub(crate) fn connected(&self) -> bool {
        !self.connections.is_empty()
    }
}

/// One turn.
#[derive(Clone, Debug)]
pub(crate) struct TurnRec {
    pub id: String,
    pub session_id: String,
    pub agent_id: String,
    pub status: TurnStatus,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub completed_at: Option<i64>,
    /// `(code, message)` of a failed turn.
    pub error: Option<(&'static str, String)>,
    /// The submitted user messages, each a `content` list.
    pub input: Vec<Vec<Value>>,
    pub items: Vec<Value>,
    pub usage: Option<Usage>,
    /// Simulated start time (fractional) and planned end.
    pub started: Option<f64>,
    pub run_until: Option<f64>,
    /// The relay connection (`conn_...`, a forwarder's rendezvous socket) this turn's
    /// command runs through (set when the turn starts on an environment that has one),
    /// whether the harness task was started, and its outcome.
    pub harness_connection: Option<String>,
    pub harness_started: bool,
    pub harness_result: Option<Result<crate::exec_protocol::CommandResult, String>>,
}

/// A replayable answer stored under an `Idempotency-Key`.
#[derive(Clone, Debug)]
pub(crate) struct CachedResponse {
    pub fingerprint: String,
    pub status: u16,
    pub body: Option<Value>,
    pub headers: Vec<(&'static str, String)>,
}

/// Everything behind the lock.
#[derive(Debug, Default)]
pub(crate) struct Inner {
    pub sessions: HashMap<String, SessionRec>,
    pub session_order: Vec<String>,
    pub environments: HashMap<String, EnvRec>,
    pub env_order: Vec<String>,
    pub turns: HashMap<String, TurnRec>,
    pub idempotency: HashMap<String, CachedResponse>,
}

impl Inner {
    /// The live (not deleted) session.
    pub(crate) fn live_session(&self, id: &str) -> Option<&SessionRec> {
        self.sessions.get(id).filter(|s| !s.deleted)
    }

    /// The live (not deleted) session, mutably.
    pub(crate) fn live_session_mut(&mut self, id: &str) -> Option<&mut SessionRec> {
        self.sessions.get_mut(id).filter(|s| !s.deleted)
    }

    /// The first turn of a session that is still active (queued or running), if any.
    pub(crate) fn active_turn(&self, session_id: &str) -> Option<String> {
        let s = self.sessions.get(session_id)?;
        s.turn_ids
            .iter()
            .find(|t| {
                self.turns.get(*t).is_some_and(|t| {
                    matches!(t.status, TurnStatus::Queued | TurnStatus::InProgress)
                })
            })
            .cloned()
    }

    /// Whether the session's executor is connected (false for other environment types).
    pub(crate) fn executor_connected(&self, s: &SessionRec) -> bool {
        s.env_id
            .as_ref()
            .and_then(|id| self.environments.get(id))
            .is_some_and(EnvRec::connected)
    }
}

/// What the simulator shares between handlers and background tasks.
pub(crate) struct Shared {
    pub config: SimConfig,
    /// `http://127.0.0.1:PORT` (no trailing slash, no `/v1`).
    pub root_url: String,
    pub clock: SimClock,
    pub ids: IdGen,
    pub inner: Mutex<Inner>,
    pub webhooks: Dispatcher,
    /// Bumped after every state change, so drivers re-evaluate.
    pub version: watch::Sender<u64>,
    pub shutdown: watch::Sender<bool>,
    /// Executor registrations and rendezvous sockets ([`crate::rendezvous`]).
    pub relays: Mutex<relays::Relays>,
}

/// A handle on one simulator's state; cheap to clone. Build it with [`SimState::new`] and
/// serve it with [`router`](crate::router), or let [`spawn`](crate::spawn) do both.
#[derive(Clone)]
pub struct SimState(pub(crate) Arc<Shared>);

impl std::fmt::Debug for SimState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimState")
            .field("root_url", &self.0.root_url)
            .field("config", &self.0.config)
            .finish_non_exhaustive()
    }
}

impl SimState {
    /// Builds the state for a simulator reachable at `root_url` (`http://127.0.0.1:PORT`,
    /// used in every session's `remote_url`) and starts the webhook delivery task.
    ///
    /// # Errors
    /// [`SimError::Config`] for an unusable configuration, [`SimError::Secret`] for an
    /// unusable webhook secret.
    ///
    /// # Panics
    /// Outside a Tokio runtime (the delivery task is spawned here).
    pub fn new(config: SimConfig, root_url: impl Into<String>) -> Result<Self, SimError> {
        config.validate().map_err(SimError::Config)?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let webhooks = Dispatcher::new(&config, shutdown_rx)?;
        let clock = SimClock::new(config.time_scale);
        Ok(Self(Arc::new(Shared {
            root_url: root_url.into().trim_end_matches('/').to_owned(),
            clock,
            ids: IdGen::new(),
            inner: Mutex::new(Inner::default()),
            relays: Mutex::new(relays::Relays::default()),
            webhooks,
            version: watch::Sender::new(0),
            shutdown,
            config,
        })))
    }

    /// The API base URL, `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("{}/v1", self.0.root_url)
    }

    /// The simulator root, `http://127.0.0.1:PORT` (control endpoints live under `/sim`).
    pub fn root_url(&self) -> &str {
        &self.0.root_url
    }

    /// The configuration in force.
    pub fn config(&self) -> &SimConfig {
        &self.0.config
    }

    /// The simulated clock.
    pub fn clock(&self) -> &SimClock {
        &self.0.clock
    }

    /// Moves simulated time forward by `secs` simulated seconds (deadlines and turns react).
    pub fn advance_clock(&self, secs: f64) {
        self.0.clock.advance(secs);
        self.bump();
    }

    /// A consistent snapshot of sessions, environments, events and delivery counters.
    pub fn snapshot(&self) -> SimSnapshot {
        let inner = self.lock();
        let sessions = inner
            .session_order
            .iter()
            .filter_map(|id| inner.sessions.get(id))
            .map(|s| SessionSummary {
                id: s.id.clone(),
                status: s.status,
                deleted: s.deleted,
                environment_type: s.env_kind.as_str().to_owned(),
                environment_id: s.env_id.clone(),
                required_actions: s
                    .required_actions
                    .iter()
                    .filter_map(|a| a.get("type").and_then(Value::as_str).map(str::to_owned))
                    .collect(),
                turns: s.turn_ids.len(),
                active_turn: inner.active_turn(&s.id),
                error: s.error.clone(),
            })
            .collect();
        let environments = inner
            .env_order
            .iter()
            .filter_map(|id| inner.environments.get(id))
            .map(|e| EnvironmentSummary {
                id: e.id.clone(),
                session_id: e.session_id.clone(),
                environment_type: e.kind.as_str().to_owned(),
                status: e.status,
                connected: e.connected(),
                connections: e.connections.len(),
                connect_count: e.connect_count,
                disconnect_count: e.disconnect_count,
                registrations: e.registrations,
                refused_registrations: e.refused_registrations,
                deleted: e.deleted,
            })
            .collect();
        drop(inner);
        let (deliveries, events) = self.0.webhooks.ledger();
        SimSnapshot {
            now: self.0.clock.now_secs(),
            time_scale: self.0.clock.time_scale(),
            sessions,
            environments,
            deliveries,
            events,
        }
    }

    /// Delivery counters only.
    pub fn delivery_stats(&self) -> DeliveryStats {
        self.0.webhooks.ledger().0
    }

    /// Waits until every queued webhook copy is acknowledged or abandoned, at most
    /// `timeout` (real time). Returns whether it got there in time. Events emitted later
    /// (e.g. when a running turn completes) are not waited for.
    pub async fn wait_deliveries_idle(&self, timeout: Duration) -> bool {
        self.0.webhooks.wait_idle(timeout).await
    }

    /// Emits an arbitrary webhook event now (envelope `created_at` = simulated time), e.g.
    /// an `agent.environment.*` event or an unknown type a receiver must accept and ignore.
    pub fn emit_event(&self, kind: &str, data: Value) -> crate::snapshot::EmittedEvent {
        self.0.webhooks.emit(kind, data, self.0.clock.now_secs())
    }

    /// Stops background work: turn drivers and webhook deliveries end.
    pub fn shutdown(&self) {
        self.0.shutdown.send_replace(true);
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes every driver to re-evaluate its session.
    pub(crate) fn bump(&self) {
        self.0.version.send_modify(|v| *v = v.wrapping_add(1));
    }
}
