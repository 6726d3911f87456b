//! The Agents API twin: sessions, environments, turns and items held in memory, with the
//! official JSON shapes. A session that is not stored answers 404, like a deleted one.
//!
//! Tests change the world with the helpers ([`TwinSessions::require_connection`],
//! [`TwinSessions::connect`], [`TwinSessions::set_status`], [`TwinSessions::remove`], ...)
//! and the controller reads it through [`SessionsApi`].

use sandbox_agents_api::{ApiError, PageParams, SessionDeleted, SessionsApi};
use sandbox_core::environment::{EnvironmentInfo, EnvironmentStatus};
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::session::{RequiredAction, Session, SessionStatus};
use sandbox_core::turn::{Item, Page, Turn};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The agent id every twin session carries.
pub const TWIN_AGENT_ID: &str = "agent_twin";

#[derive(Debug, Default)]
struct State {
    sessions: BTreeMap<SessionId, Session>,
    environments: BTreeMap<EnvironmentId, EnvironmentInfo>,
    /// Newest last.
    turns: BTreeMap<SessionId, Vec<Turn>>,
    items: BTreeMap<String, Vec<Item>>,
    deleted: Vec<SessionId>,
}

/// An in-memory Agents API. Clones share the same world.
#[derive(Clone, Debug, Default)]
pub struct TwinSessions {
    state: Arc<Mutex<State>>,
}

/// A self-hosted session in the official shape (`status` as given, no required action).
pub fn self_hosted_session(id: &SessionId, env: &EnvironmentId, status: SessionStatus) -> Session {
    let value = json!({
        "id": id, "object": "agent.session", "agent": {"id": TWIN_AGENT_ID},
        "created_at": 1_764_400_000, "last_active_at": 1_764_400_000,
        "status": status, "required_actions": [],
        "environment": {
            "type": "self_hosted", "id": env,
            "remote_url": format!("wss://agents.twin.invalid/v1/environments/{env}/connect"),
            "workspace_directory": "/workspace", "capability_directories": []
        },
        "metadata": {}, "error": null
    });
    serde_json::from_value(value).unwrap_or_else(|e| unreachable!("twin session shape: {e}"))
}

fn environment_info(env: &EnvironmentId, status: EnvironmentStatus) -> EnvironmentInfo {
    let value =
        json!({"id": env, "object": "agent.environment", "type": "self_hosted", "status": status});
    serde_json::from_value(value).unwrap_or_else(|e| unreachable!("twin environment shape: {e}"))
}

fn not_found(request: String) -> ApiError {
    ApiError::NotFound { request }
}

impl TwinSessions {
    /// An empty world.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds (or replaces) a self-hosted session of `env` with `status` and its
    /// environment (`ready`).
    pub fn add(&self, id: &SessionId, env: &EnvironmentId, status: SessionStatus) {
        let mut s = self.state();
        s.sessions
            .insert(id.clone(), self_hosted_session(id, env, status));
        s.environments
            .entry(env.clone())
            .or_insert_with(|| environment_info(env, EnvironmentStatus::Ready));
    }

    /// Stores `session` as is (any environment type).
    pub fn put(&self, session: Session) {
        self.state().sessions.insert(session.id.clone(), session);
    }

    /// The session as stored, if it exists.
    pub fn get(&self, id: &SessionId) -> Option<Session> {
        self.state().sessions.get(id).cloned()
    }

    /// The session's environment status, if known.
    pub fn environment_status(&self, env: &EnvironmentId) -> Option<EnvironmentStatus> {
        self.state().environments.get(env).map(|e| e.status)
    }

    /// The session now requires `environment_connection` for its environment
    /// (`requires_action`). No-op for an unknown session.
    pub fn require_connection(&self, id: &SessionId) {
        self.update(id, |s| {
            if let Some(env) = s.self_hosted().map(|e| e.id.clone()) {
                s.status = SessionStatus::RequiresAction;
                s.required_actions = vec![RequiredAction::EnvironmentConnection {
                    environment_id: env,
                }];
            }
        });
    }

    /// The executor of `env` connected: the environment reads `connected`; sessions that
    /// required its connection no longer do and move to `session_status`.
    pub fn connect(&self, env: &EnvironmentId, session_status: SessionStatus) {
        let mut s = self.state();
        s.environments.insert(
            env.clone(),
            environment_info(env, EnvironmentStatus::Connected),
        );
        for session in s.sessions.values_mut() {
            if session.requires_connection_of(env) {
                session.required_actions.clear();
                session.status = session_status;
            }
        }
    }

    /// Sets the environment's status (e.g. `disconnected` after the executor died).
    pub fn set_environment_status(&self, env: &EnvironmentId, status: EnvironmentStatus) {
        self.state()
            .environments
            .insert(env.clone(), environment_info(env, status));
    }

    /// Sets a session's status and clears its required actions (unless it becomes
    /// `requires_action`, where they are kept).
    pub fn set_status(&self, id: &SessionId, status: SessionStatus) {
        self.update(id, |s| {
            if status != SessionStatus::RequiresAction {
                s.required_actions.clear();
            }
            s.status = status;
        });
    }

    /// Removes a session (it answers 404 from now on, as after a deletion).
    pub fn remove(&self, id: &SessionId) {
        self.state().sessions.remove(id);
    }

    /// Sessions deleted through `delete_session`, in order.
    pub fn deleted(&self) -> Vec<SessionId> {
        self.state().deleted.clone()
    }

    /// Appends a turn (newest last) with its items.
    pub fn push_turn(&self, session: &SessionId, turn: Turn, items: Vec<Item>) {
        let mut s = self.state();
        s.items.insert(turn.id.clone(), items);
        s.turns.entry(session.clone()).or_default().push(turn);
    }

    /// How many turns the session has: the twin never adds one itself, so a test can
    /// assert that the controller submitted no input (never resubmit).
    pub fn turn_count(&self, session: &SessionId) -> usize {
        self.state().turns.get(session).map_or(0, Vec::len)
    }

    fn update(&self, id: &SessionId, f: impl FnOnce(&mut Session)) {
        if let Some(s) = self.state().sessions.get_mut(id) {
            f(s);
        }
    }
}

fn page<T: Clone>(all: &[T], params: &PageParams) -> Result<Page<T>, ApiError> {
    params.validate()?;
    let limit = params.limit.unwrap_or(20) as usize;
    // Newest first (the API default, and `PageParams::latest`).
    let data: Vec<T> = all.iter().rev().take(limit).cloned().collect();
    Ok(Page {
        has_more: all.len() > data.len(),
        data,
        last_id: None,
        extra: serde_json::Map::new(),
    })
}

impl SessionsApi for TwinSessions {
    async fn retrieve_session(&self, id: &SessionId) -> Result<Session, ApiError> {
        self.get(id)
            .ok_or_else(|| not_found(format!("GET /agents/sessions/{id}")))
    }

    async fn delete_session(
        &self,
        id: &SessionId,
        idempotency_key: &str,
    ) -> Result<SessionDeleted, ApiError> {
        if idempotency_key.is_empty() {
            return Err(ApiError::InvalidArgument {
                reason: "empty idempotency key".to_owned(),
            });
        }
        let mut s = self.state();
        if s.sessions.remove(id).is_none() {
            return Err(not_found(format!("DELETE /agents/sessions/{id}")));
        }
        s.deleted.push(id.clone());
        Ok(SessionDeleted {
            id: id.clone(),
            object: "agent.session.deleted".to_owned(),
            deleted: true,
        })
    }

    async fn retrieve_environment(&self, id: &EnvironmentId) -> Result<EnvironmentInfo, ApiError> {
        self.state()
            .environments
            .get(id)
            .cloned()
            .ok_or_else(|| not_found(format!("GET /agents/environments/{id}")))
    }

    async fn list_turns(
        &self,
        id: &SessionId,
        params: &PageParams,
    ) -> Result<Page<Turn>, ApiError> {
        let s = self.state();
        if !s.sessions.contains_key(id) {
            return Err(not_found(format!("GET /agents/sessions/{id}/turns")));
        }
        page(
            s.turns.get(id).map(Vec::as_slice).unwrap_or_default(),
            params,
        )
    }

    async fn list_turn_items(
        &self,
        id: &SessionId,
        turn_id: &str,
        params: &PageParams,
    ) -> Result<Page<Item>, ApiError> {
        if turn_id.is_empty() {
            return Err(ApiError::InvalidArgument {
                reason: "empty turn id".to_owned(),
            });
        }
        let s = self.state();
        match s.items.get(turn_id) {
            Some(items) if s.sessions.contains_key(id) => page(items, params),
            _ => Err(not_found(format!(
                "GET /agents/sessions/{id}/turns/{turn_id}/items"
            ))),
        }
    }
}
