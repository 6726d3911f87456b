//! Simulated executor connections, a control knob for tests that need an environment
//! `connected` without running an executor: `POST /sim/environments/{id}/connect` and
//! `POST /sim/environments/{id}/disconnect` (no auth, loopback only, like the rest of
//! `/sim`). The one real executor path is the relay ([`crate::registration`],
//! [`crate::rendezvous`]); a connection opened here runs no command: the turn's command
//! item is simulated and completes after [`SimConfig::turn_secs`](crate::SimConfig).
//!
//! Each connect opens one *connection* (`conn_...`) that stays open until a disconnect
//! names it (or a disconnect without a connection id closes them all, relay sockets
//! excepted). The environment is `connected` while at least one connection is open and
//! `disconnected` after the last one closes; two open connections mean two executors
//! (duplicate compute), visible in
//! [`EnvironmentSummary::connections`](crate::EnvironmentSummary::connections).
//!
//! A connect lets a waiting input run at once; a disconnect while a turn runs fails its
//! command item and completes the turn (agents-api.md). Connecting to the environment of a
//! deleted session answers 404 (400 for an environment that is not `self_hosted`);
//! disconnecting from it is still accepted.
//!
//! Answer of both: `{object: "agent.environment.connection", id, environment_id, status,
//! connections}` where `id` is the connection affected (connect) or `null` (disconnect of
//! all), `status` the environment's status and `connections` how many remain open.

use crate::body::parse_object;
use crate::error::ApiError;
use crate::state::{EnvKind, SimState};
use crate::turns::{ensure_driver, step};
use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::routing::post;
use sandbox_core::environment::EnvironmentStatus;
use serde_json::{Value, json};
use std::collections::HashMap;

/// Routes of the simulated connections (control: no auth).
pub(crate) fn routes() -> Router<SimState> {
    Router::new()
        .route("/sim/environments/{environment_id}/connect", post(connect))
        .route(
            "/sim/environments/{environment_id}/disconnect",
            post(disconnect),
        )
}

async fn connect(
    State(state): State<SimState>,
    Path(environment_id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    if !body.iter().all(u8::is_ascii_whitespace) {
        parse_object(&body)?;
    }
    let sh = &state.0;
    let (answer, session_id) = {
        let mut inner = state.lock();
        let now = sh.clock.now();
        let env = inner
            .environments
            .get_mut(&environment_id)
            .filter(|e| !e.deleted)
            .ok_or_else(|| ApiError::not_found("environment", &environment_id))?;
        if env.kind != EnvKind::SelfHosted {
            return Err(ApiError::invalid(
                "Only self_hosted environments accept executor connections.",
                None,
            ));
        }
        let conn = sh.ids.hex("conn_");
        env.connections.insert(conn.clone());
        env.connect_count += 1;
        env.status = EnvironmentStatus::Connected;
        let answer = json!({
            "object": "agent.environment.connection",
            "id": conn,
            "environment_id": environment_id,
            "status": env.status,
            "connections": env.connections.len(),
        });
        let session_id = env.session_id.clone();
        step(sh, &mut inner, &session_id, now);
        (answer, session_id)
    };
    tracing::info!(environment_id = %environment_id, "simulated executor connected");
    state.bump();
    ensure_driver(&state, &session_id);
    Ok(Json(answer))
}

async fn disconnect(
    State(state): State<SimState>,
    Path(environment_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req = parse_object(&body)?;
    let connection_id = query.get("connection_id").cloned().or_else(|| {
        req.get("connection_id")
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    disconnect_simulated(&state, &environment_id, connection_id.as_deref()).map(Json)
}

/// Closes the simulated connection `connection_id` of the environment, or all of them
/// (`None`; relay sockets excepted: they close with their socket), and lets its session's
/// turn see it. Answer as the route's.
///
/// # Errors
/// 404 for an unknown environment.
pub(crate) fn disconnect_simulated(
    state: &SimState,
    environment_id: &str,
    connection_id: Option<&str>,
) -> Result<Value, ApiError> {
    let connection_id = connection_id.map(str::to_owned);
    let sh = &state.0;
    let (answer, session_id) = {
        let mut inner = state.lock();
        let now = sh.clock.now();
        let env = inner
            .environments
            .get_mut(environment_id)
            .ok_or_else(|| ApiError::not_found("environment", environment_id))?;
        // A relay socket's connection closes with the socket, not here.
        let removed = match &connection_id {
            Some(c) if env.relay_connections.contains(c) => 0,
            Some(c) => u64::from(env.connections.remove(c)),
            None => {
                let simulated: Vec<String> = env
                    .connections
                    .difference(&env.relay_connections)
                    .cloned()
                    .collect();
                for c in &simulated {
                    env.connections.remove(c);
                }
                simulated.len() as u64
            }
        };
        env.disconnect_count += removed;
        if env.connections.is_empty() && env.status == EnvironmentStatus::Connected {
            env.status = EnvironmentStatus::Disconnected;
        }
        let answer = json!({
            "object": "agent.environment.connection",
            "id": connection_id,
            "environment_id": environment_id,
            "status": env.status,
            "connections": env.connections.len(),
        });
        let session_id = env.session_id.clone();
        step(sh, &mut inner, &session_id, now);
        (answer, session_id)
    };
    tracing::info!(environment_id = %environment_id, "simulated executor disconnected");
    state.bump();
    ensure_driver(state, &session_id);
    Ok(answer)
}
