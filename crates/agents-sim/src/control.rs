//! Control endpoints for scenarios and tests, under `/sim` (no auth: the simulator only
//! binds 127.0.0.1).
//!
//! | method | path | effect |
//! |---|---|---|
//! | `GET` | `/sim/state` | [`SimSnapshot`](crate::SimSnapshot) |
//! | `POST` | `/sim/sessions/{id}/fail` `{error?}` | session `failed`, `error` set, active turns `failed`, webhook `agent.session.failed` |
//! | `POST` | `/sim/sessions/{id}/function_call` `{name?, arguments?}` | an idle session waits on a `function_call` action (a `waiting` turn), webhook `agent.session.action_required` with type `function_call`; a `tool_result` input resolves it |
//! | `POST` | `/sim/clock/advance` `{secs}` | simulated time jumps forward; answers `{now}` |
//! | `POST` | `/sim/webhooks/emit` `{type, data}` | emits an arbitrary event (e.g. an unknown type); answers the [`EmittedEvent`](crate::EmittedEvent) |
//! | `GET` | `/sim/deliveries/idle?timeout_ms=N` | waits (≤ N ms, default 5000) until no delivery is pending; answers `{idle, deliveries}` |
//!
//! Deleting a session without a webhook is the ordinary `DELETE /v1/agents/sessions/{id}`.

use crate::body::parse_object;
use crate::error::ApiError;
use crate::state::SimState;
use crate::turns::{emit_action_required, fail_session};
use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use sandbox_core::session::SessionStatus;
use sandbox_core::turn::TurnStatus;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Duration;

/// Default session error set by `/sim/sessions/{id}/fail`.
pub const DEFAULT_FAIL_ERROR: &str = "The session failed (simulated).";

/// The `/sim` routes.
pub(crate) fn routes() -> Router<SimState> {
    Router::new()
        .route("/sim/state", get(state_snapshot))
        .route("/sim/sessions/{session_id}/fail", post(fail))
        .route(
            "/sim/sessions/{session_id}/function_call",
            post(function_call),
        )
        .route("/sim/clock/advance", post(advance))
        .route("/sim/webhooks/emit", post(emit))
        .route("/sim/deliveries/idle", get(deliveries_idle))
}

async fn state_snapshot(State(state): State<SimState>) -> Json<Value> {
    Json(serde_json::to_value(state.snapshot()).unwrap_or(Value::Null))
}

async fn fail(
    State(state): State<SimState>,
    Path(session_id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req = parse_object(&body)?;
    let error = req
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or(DEFAULT_FAIL_ERROR)
        .to_owned();
    let failed = {
        let mut inner = state.lock();
        let now = state.clock().now();
        if inner.live_session(&session_id).is_none() {
            return Err(ApiError::not_found("session", &session_id));
        }
        fail_session(&state.0, &mut inner, &session_id, &error, now)
    };
    if !failed {
        return Err(ApiError::conflict("The session has already failed."));
    }
    state.bump();
    Ok(Json(
        json!({"id": session_id, "status": "failed", "error": error}),
    ))
}

async fn function_call(
    State(state): State<SimState>,
    Path(session_id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req = parse_object(&body)?;
    let name = req
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("lookup_ticket")
        .to_owned();
    let arguments = req
        .get("arguments")
        .cloned()
        .unwrap_or_else(|| json!({"key": "PAY-1234"}));
    let sh = &state.0;
    let action = {
        let mut inner = state.lock();
        let now = sh.clock.now();
        let now_i = now.floor() as i64;
        let busy = inner.active_turn(&session_id).is_some();
        let turn_id = sh.ids.hex("turn_");
        let call_id = sh.ids.hex("call_");
        let s = inner
            .live_session_mut(&session_id)
            .ok_or_else(|| ApiError::not_found("session", &session_id))?;
        if busy || s.status != SessionStatus::Idle || !s.required_actions.is_empty() {
            return Err(ApiError::conflict(
                "Only an idle session without required actions can be made to wait on a function call.",
            ));
        }
        let action = json!({
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "turn_id": turn_id,
        });
        s.required_actions.push(action.clone());
        s.status = SessionStatus::RequiresAction;
        s.last_active_at = now_i;
        s.turn_ids.push(turn_id.clone());
        let agent_id = s.agent_id.clone();
        let input = vec![vec![
            json!({"type": "input_text", "text": format!("Look up {name}.")}),
        ]];
        let mut turn = crate::state::TurnRec {
            id: turn_id.clone(),
            session_id: session_id.clone(),
            agent_id,
            status: TurnStatus::Waiting,
            created_at: now_i,
            started_at: Some(now_i),
            completed_at: None,
            error: None,
            input,
            items: Vec::new(),
            usage: None,
            started: Some(now),
            run_until: None,
            harness_connection: None,
            harness_started: false,
            harness_result: None,
        };
        turn.items = crate::turns::user_items(&turn);
        turn.items.push(json!({
            "id": sh.ids.hex("fc_"),
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "status": "completed",
            "turn_id": turn_id,
        }));
        inner.turns.insert(turn_id, turn);
        emit_action_required(sh, &session_id, "function_call", now_i);
        action
    };
    state.bump();
    Ok(Json(action))
}

async fn advance(State(state): State<SimState>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let req = parse_object(&body)?;
    let secs = req
        .get("secs")
        .and_then(Value::as_f64)
        .filter(|s| s.is_finite() && *s >= 0.0)
        .ok_or_else(|| ApiError::invalid("secs must be a non-negative number.", Some("secs")))?;
    state.advance_clock(secs);
    Ok(Json(json!({"now": state.clock().now_secs()})))
}

async fn emit(State(state): State<SimState>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let req = parse_object(&body)?;
    let kind = req
        .get("type")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::invalid("type is required.", Some("type")))?
        .to_owned();
    let data = req.get("data").cloned().unwrap_or_else(|| json!({}));
    let event = state.emit_event(&kind, data);
    Ok(Json(serde_json::to_value(event).unwrap_or(Value::Null)))
}

async fn deliveries_idle(
    State(state): State<SimState>,
    Query(q): Query<HashMap<String, String>>,
) -> Json<Value> {
    let ms = q
        .get("timeout_ms")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(5000)
        .min(600_000);
    let idle = state.wait_deliveries_idle(Duration::from_millis(ms)).await;
    Json(json!({"idle": idle, "deliveries": state.delivery_stats()}))
}
