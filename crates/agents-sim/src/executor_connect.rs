//! The executor stand-in endpoints: `POST /v1/agents/environments/{id}/connect` and
//! `POST .../disconnect` (or `DELETE .../connect`).
//!
//! A real `codex exec-server --remote <remote_url>` registers over HTTPS and then keeps a
//! WebSocket open; it cannot talk to this simulator. Here "an executor is connected" is
//! one HTTP call with `Authorization: Bearer <executor key>` (the restricted
//! `CODEX_API_KEY` of the sandbox; the API key is refused): each connect opens one
//! *connection* (`conn_...`) that stays open until a disconnect names it (or a disconnect
//! without a connection id closes them all). The environment is `connected` while at least
//! one connection is open and `disconnected` after the last one closes; two open
//! connections mean two executors (duplicate compute), visible in
//! [`EnvironmentSummary::connections`](crate::EnvironmentSummary::connections).
//!
//! A connect lets a waiting input run at once; a disconnect while a turn runs fails its
//! command item and completes the turn (agents-api.md). Connecting to the environment of a
//! deleted session answers 404; disconnecting from it is still accepted, so an executor
//! being stopped can always say goodbye.
//!
//! Answer of both: `{object: "agent.environment.connection", id, environment_id, status,
//! connections}` where `id` is the connection affected (connect) or `null` (disconnect of
//! all), `status` the environment's status and `connections` how many remain open.
//!
//! Issue 26, the split executor: a connect may carry a JSON body `{"executor_url":
//! "ws://127.0.0.1:PORT"}`, sent by the forwarder (`sim-executor ... forward --connect
//! URL`, the only process holding the key) to name the listening executor it serves. The
//! simulator then plays the harness: each turn's command runs on that executor over its
//! own protocol ([`crate::exec_protocol`]). Only a loopback `ws://` URL is accepted (400
//! otherwise); a connect without a body keeps the old behaviour (a simulated command).

use crate::auth::bearer_matches;
use crate::error::ApiError;
use crate::routes::parse_object;
use crate::state::{EnvKind, SimState};
use crate::turns::{ensure_driver, step};
use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::routing::post;
use sandbox_core::environment::EnvironmentStatus;
use serde_json::{Value, json};
use std::collections::HashMap;

/// Routes of the executor stand-in (executor key required).
pub(crate) fn routes() -> Router<SimState> {
    Router::new()
        .route(
            "/v1/agents/environments/{environment_id}/connect",
            post(connect).delete(disconnect),
        )
        .route(
            "/v1/agents/environments/{environment_id}/disconnect",
            post(disconnect),
        )
}

async fn connect(
    State(state): State<SimState>,
    Path(environment_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    if !bearer_matches(&headers, &state.config().executor_key) {
        return Err(ApiError::unauthorized());
    }
    let executor_url = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        match parse_object(&body)?.get("executor_url") {
            None | Some(Value::Null) => None,
            Some(Value::String(url)) if crate::exec_protocol::is_loopback_ws(url) => {
                Some(url.clone())
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    "executor_url must be a ws:// URL on a loopback address with a port.",
                    Some("executor_url"),
                ));
            }
        }
    };
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
        if let Some(url) = &executor_url {
            env.executor_urls.insert(conn.clone(), url.clone());
        }
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
    tracing::info!(environment_id = %environment_id, "executor connected");
    state.bump();
    ensure_driver(&state, &session_id);
    Ok(Json(answer))
}

async fn disconnect(
    State(state): State<SimState>,
    Path(environment_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    if !bearer_matches(&headers, &state.config().executor_key) {
        return Err(ApiError::unauthorized());
    }
    let req = parse_object(&body)?;
    let connection_id = query.get("connection_id").cloned().or_else(|| {
        req.get("connection_id")
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    let sh = &state.0;
    let (answer, session_id) = {
        let mut inner = state.lock();
        let now = sh.clock.now();
        let env = inner
            .environments
            .get_mut(&environment_id)
            .ok_or_else(|| ApiError::not_found("environment", &environment_id))?;
        let removed = match &connection_id {
            Some(c) => {
                env.executor_urls.remove(c);
                u64::from(env.connections.remove(c))
            }
            None => {
                let n = env.connections.len() as u64;
                env.connections.clear();
                env.executor_urls.clear();
                n
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
    tracing::info!(environment_id = %environment_id, "executor disconnected");
    state.bump();
    ensure_driver(&state, &session_id);
    Ok(Json(answer))
}
