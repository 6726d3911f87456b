//! The Agents API endpoints under `/v1/agents` and the [`router`] that serves them together
//! with the executor endpoints ([`crate::executor_connect`]) and the control endpoints
//! ([`crate::control`]).
//!
//! | method | path | answer |
//! |---|---|---|
//! | `POST` | `/v1/agents/sessions` | `agent.session` (emits `agent.session.created`) |
//! | `GET` | `/v1/agents/sessions` | cursor page of sessions (`after`, `limit`, `order`, `agent_id`, `metadata[k]=v`) |
//! | `GET` | `/v1/agents/sessions/{id}` | `agent.session`; 404 once deleted |
//! | `DELETE` | `/v1/agents/sessions/{id}` | `{id, object: "agent.session.deleted", deleted: true}`; no webhook |
//! | `POST` | `/v1/agents/sessions/{id}/events` | 202, no body (header `x-sim-turn-id` names the turn a message created) |
//! | `GET` | `/v1/agents/sessions/{id}/turns` | cursor page of `agent.session.turn` |
//! | `GET` | `/v1/agents/sessions/{id}/turns/{turn_id}` | `agent.session.turn` |
//! | `GET` | `/v1/agents/sessions/{id}/turns/{turn_id}/items` | cursor page of items |
//! | `GET` | `/v1/agents/sessions/{id}/items` | cursor page of all the session's items |
//! | `GET` | `/v1/agents/environments/{id}` | `agent.environment` |
//!
//! Write calls (`POST` sessions, `POST` events, `DELETE`) honour `Idempotency-Key`: the
//! same key with the same request replays the first successful answer (header
//! `idempotent-replayed: true`), with a different request it is a 400.

use crate::auth::require_api_key;
use crate::body::parse_object;
use crate::error::ApiError;
use crate::objects;
use crate::pagination;
use crate::state::{CachedResponse, EnvKind, EnvRec, Inner, SessionRec, SimState, TurnRec};
use crate::turns::{self, ensure_driver, state_event_data};
use crate::{control, executor_connect};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::session::SessionStatus;
use sandbox_core::turn::TurnStatus;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// Header naming the turn created by `POST .../events` (a simulator extra; the real API
/// answers 202 without a body).
pub const TURN_ID_HEADER: &str = "x-sim-turn-id";
/// Header set on a replayed idempotent answer.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// Most metadata pairs a session may carry.
pub const MAX_METADATA_PAIRS: usize = 16;

/// The whole simulator as one axum router: agents endpoints (API key + beta header),
/// executor endpoints (executor key) and `/sim` control endpoints (no auth; the simulator
/// only ever binds 127.0.0.1). Unknown paths answer 404 in the OpenAI error shape.
pub fn router(state: SimState) -> Router {
    let api = Router::new()
        .route(
            "/v1/agents/sessions",
            get(list_sessions).post(create_session),
        )
        .route(
            "/v1/agents/sessions/{session_id}",
            get(get_session).delete(delete_session),
        )
        .route(
            "/v1/agents/sessions/{session_id}/events",
            axum::routing::post(submit_events),
        )
        .route("/v1/agents/sessions/{session_id}/turns", get(list_turns))
        .route(
            "/v1/agents/sessions/{session_id}/turns/{turn_id}",
            get(get_turn),
        )
        .route(
            "/v1/agents/sessions/{session_id}/turns/{turn_id}/items",
            get(list_turn_items),
        )
        .route(
            "/v1/agents/sessions/{session_id}/items",
            get(list_session_items),
        )
        .route(
            "/v1/agents/environments/{environment_id}",
            get(get_environment),
        )
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    api.merge(executor_connect::routes())
        .merge(crate::registration::routes())
        .merge(crate::rendezvous::routes())
        .merge(control::routes())
        .fallback(not_found)
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "Unknown path.".into(),
        kind: "invalid_request_error",
        param: None,
        code: Some("not_found"),
    }
}

/// A successful answer, replayable under an `Idempotency-Key`.
#[derive(Clone, Debug)]
pub(crate) struct Reply {
    pub status: StatusCode,
    pub body: Option<Value>,
    pub headers: Vec<(&'static str, String)>,
}

impl Reply {
    pub(crate) fn json(body: Value) -> Self {
        Self {
            status: StatusCode::OK,
            body: Some(body),
            headers: Vec::new(),
        }
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let mut resp = match self.body {
            Some(body) => (self.status, axum::Json(body)).into_response(),
            None => (self.status, Body::empty()).into_response(),
        };
        for (name, value) in self.headers {
            if let Ok(v) = HeaderValue::from_str(&value) {
                resp.headers_mut().insert(name, v);
            }
        }
        resp
    }
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get("idempotency-key") {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|k| !k.is_empty() && k.len() <= 255)
            .map(|k| Some(k.to_owned()))
            .ok_or_else(|| ApiError::invalid("Invalid Idempotency-Key header.", None)),
    }
}

/// Runs `f` under the state lock, honouring `Idempotency-Key` (see the module docs).
fn idempotent(
    state: &SimState,
    headers: &HeaderMap,
    fingerprint: String,
    f: impl FnOnce(&mut Inner) -> Result<Reply, ApiError>,
) -> Result<Reply, ApiError> {
    let key = idempotency_key(headers)?;
    let mut inner = state.lock();
    if let Some(k) = &key
        && let Some(cached) = inner.idempotency.get(k)
    {
        if cached.fingerprint != fingerprint {
            return Err(ApiError::invalid(
                "This Idempotency-Key was already used with a different request.",
                None,
            )
            .with_code("idempotency_key_reused"));
        }
        let mut headers = cached.headers.clone();
        headers.push((REPLAYED_HEADER, "true".into()));
        return Ok(Reply {
            status: StatusCode::from_u16(cached.status).unwrap_or(StatusCode::OK),
            body: cached.body.clone(),
            headers,
        });
    }
    let reply = f(&mut inner)?;
    if let Some(k) = key {
        inner.idempotency.insert(
            k,
            CachedResponse {
                fingerprint,
                status: reply.status.as_u16(),
                body: reply.body.clone(),
                headers: reply.headers.clone(),
            },
        );
    }
    Ok(reply)
}

fn fingerprint(method: &str, path: &str, body: &Bytes) -> String {
    format!("{method} {path} {}", String::from_utf8_lossy(body))
}

fn metadata_from(v: Option<&Value>) -> Result<BTreeMap<String, String>, ApiError> {
    let mut out = BTreeMap::new();
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(out);
    };
    let Some(map) = v.as_object() else {
        return Err(ApiError::invalid(
            "metadata must be an object of strings.",
            Some("metadata"),
        ));
    };
    if map.len() > MAX_METADATA_PAIRS {
        return Err(ApiError::invalid(
            format!("metadata holds at most {MAX_METADATA_PAIRS} pairs."),
            Some("metadata"),
        ));
    }
    for (k, v) in map {
        let Some(v) = v.as_str() else {
            return Err(ApiError::invalid(
                "metadata values must be strings.",
                Some("metadata"),
            ));
        };
        if k.is_empty() || k.chars().count() > 64 || v.chars().count() > 512 {
            return Err(ApiError::invalid(
                "metadata keys are 1 to 64 characters and values at most 512.",
                Some("metadata"),
            ));
        }
        out.insert(k.clone(), v.to_owned());
    }
    Ok(out)
}

/// Normalises one message's `content`: a string becomes one `input_text` part; a list keeps
/// its objects and turns strings into `input_text` parts.
fn content_list(v: &Value) -> Option<Vec<Value>> {
    match v {
        Value::String(s) => Some(vec![json!({"type": "input_text", "text": s})]),
        Value::Array(parts) if !parts.is_empty() => parts
            .iter()
            .map(|p| match p {
                Value::String(s) => Some(json!({"type": "input_text", "text": s})),
                Value::Object(o) if o.get("type").is_some_and(Value::is_string) => Some(p.clone()),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

/// The user messages of an `input` value: a string, or a list of `{role: "user", content}`.
fn messages_from_input(v: &Value) -> Option<Vec<Vec<Value>>> {
    match v {
        Value::String(_) => content_list(v).map(|c| vec![c]),
        Value::Array(msgs) if !msgs.is_empty() => msgs
            .iter()
            .map(|m| match m.get("role").and_then(Value::as_str) {
                Some("user") | None => m.get("content").and_then(content_list),
                Some(_) => None,
            })
            .collect(),
        _ => None,
    }
}

/// Creates a queued turn holding `input` and lets the session advance.
fn queue_turn(
    state: &SimState,
    inner: &mut Inner,
    sid: &str,
    input: Vec<Vec<Value>>,
    now: f64,
) -> Option<String> {
    let turn_id = state.0.ids.hex("turn_");
    let s = inner.sessions.get_mut(sid)?;
    s.turn_ids.push(turn_id.clone());
    s.last_active_at = now.floor() as i64;
    let turn = TurnRec {
        id: turn_id.clone(),
        session_id: sid.to_owned(),
        agent_id: s.agent_id.clone(),
        status: TurnStatus::Queued,
        created_at: now.floor() as i64,
        started_at: None,
        completed_at: None,
        error: None,
        input,
        items: Vec::new(),
        usage: None,
        started: None,
        run_until: None,
        harness_connection: None,
        harness_started: false,
        harness_result: None,
    };
    inner.turns.insert(turn_id.clone(), turn);
    turns::step(&state.0, inner, sid, now);
    Some(turn_id)
}

async fn create_session(
    State(state): State<SimState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Reply, ApiError> {
    let req = parse_object(&body)?;
    let env = req
        .get("environment")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            ApiError::invalid(
                "Missing required parameter: 'environment'.",
                Some("environment"),
            )
        })?;
    let kind = match env.get("type").and_then(Value::as_str) {
        Some("self_hosted") => EnvKind::SelfHosted,
        Some("openai_hosted") => EnvKind::OpenAiHosted,
        Some("none") => EnvKind::None,
        _ => {
            return Err(ApiError::invalid(
                "environment.type must be 'self_hosted', 'openai_hosted' or 'none'.",
                Some("environment.type"),
            ));
        }
    };
    let workspace_directory = match env.get("workspace_directory") {
        None | Some(Value::Null) => "/workspace".to_owned(),
        Some(Value::String(d)) if d.starts_with('/') => d.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                "environment.workspace_directory must be an absolute path.",
                Some("environment.workspace_directory"),
            ));
        }
    };
    let agent_req = match req.get("agent") {
        None | Some(Value::Null) => None,
        Some(Value::Object(a)) => Some(a),
        Some(_) => return Err(ApiError::invalid("agent must be an object.", Some("agent"))),
    };
    let agent_id = agent_req
        .and_then(|a| a.get("id"))
        .or_else(|| req.get("agent_id"))
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map_or_else(|| state.config().default_agent_id.clone(), str::to_owned);
    let metadata = metadata_from(req.get("metadata"))?;
    let vault_ids: Vec<String> = match req.get("vault_ids") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| ApiError::invalid("vault_ids must be strings.", Some("vault_ids")))?,
        Some(_) => {
            return Err(ApiError::invalid(
                "vault_ids must be a list.",
                Some("vault_ids"),
            ));
        }
    };
    let input = match req.get("input") {
        None | Some(Value::Null) => None,
        Some(v) => Some(messages_from_input(v).ok_or_else(|| {
            ApiError::invalid(
                "input must be a string or a list of user messages.",
                Some("input"),
            )
        })?),
    };
    let fp = fingerprint("POST", "/v1/agents/sessions", &body);
    let reply = idempotent(&state, &headers, fp, |inner| {
        let sh = &state.0;
        let now = sh.clock.now();
        let now_i = now.floor() as i64;
        let sid = sh.ids.hex("sess_");
        let env_id = (kind != EnvKind::None).then(|| sh.ids.hex("env_"));
        // The executor's `--remote`: codex appends `/cloud/environment/{id}/register`
        // (../shared/reference/executor-protocol.md, "Registration and rendezvous").
        let remote_url = (kind == EnvKind::SelfHosted).then(|| format!("{}/v1", sh.root_url));
        let session = SessionRec {
            id: sid.clone(),
            agent: objects::agent_object(&agent_id, agent_req),
            agent_id: agent_id.clone(),
            created_at: now_i,
            last_active_at: now_i,
            status: SessionStatus::Idle,
            required_actions: Vec::new(),
            env_kind: kind,
            env_id: env_id.clone(),
            remote_url: remote_url.clone(),
            workspace_directory: workspace_directory.clone(),
            metadata: metadata.clone(),
            error: None,
            vault_ids: vault_ids.clone(),
            usage: None,
            deleted: false,
            turn_ids: Vec::new(),
            connect_wait_since: None,
            driver_running: false,
        };
        if let Some(env_id) = &env_id {
            inner.env_order.push(env_id.clone());
            inner.environments.insert(
                env_id.clone(),
                EnvRec {
                    id: env_id.clone(),
                    kind,
                    session_id: sid.clone(),
                    status: if kind == EnvKind::SelfHosted {
                        EnvironmentStatus::Pending
                    } else {
                        EnvironmentStatus::Ready
                    },
                    connections: BTreeSet::new(),
                    relay_connections: BTreeSet::new(),
                    connect_count: 0,
                    disconnect_count: 0,
                    registrations: 0,
                    refused_registrations: 0,
                    deleted: false,
                },
            );
        }
        let mut data = state_event_data(&session);
        if let (Some(url), Some(obj)) = (&remote_url, data.as_object_mut()) {
            obj.insert("connect".into(), json!({"remote_url": url}));
        }
        inner.session_order.push(sid.clone());
        inner.sessions.insert(sid.clone(), session);
        sh.webhooks.emit("agent.session.created", data, now_i);
        if let Some(input) = input.clone() {
            queue_turn(&state, inner, &sid, input, now);
        }
        let s = inner
            .sessions
            .get(&sid)
            .ok_or_else(|| ApiError::not_found("session", &sid))?;
        Ok(Reply::json(objects::session_json(s)))
    })?;
    if let Some(sid) = reply
        .body
        .as_ref()
        .and_then(|b| b.get("id"))
        .and_then(Value::as_str)
    {
        state.bump();
        ensure_driver(&state, sid);
    }
    Ok(reply)
}

async fn get_session(
    State(state): State<SimState>,
    Path(session_id): Path<String>,
) -> Result<Reply, ApiError> {
    let inner = state.lock();
    let s = inner
        .live_session(&session_id)
        .ok_or_else(|| ApiError::not_found("session", &session_id))?;
    Ok(Reply::json(objects::session_json(s)))
}

async fn delete_session(
    State(state): State<SimState>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
) -> Result<Reply, ApiError> {
    let fp = format!("DELETE /v1/agents/sessions/{session_id}");
    let reply = idempotent(&state, &headers, fp, |inner| {
        let s = inner
            .live_session_mut(&session_id)
            .ok_or_else(|| ApiError::not_found("session", &session_id))?;
        s.deleted = true;
        let env_id = s.env_id.clone();
        if let Some(env) = env_id.and_then(|id| inner.environments.get_mut(&id)) {
            env.deleted = true;
        }
        Ok(Reply::json(json!({
            "id": session_id,
            "object": "agent.session.deleted",
            "deleted": true,
        })))
    })?;
    state.bump();
    Ok(reply)
}

/// One parsed input event.
enum Input {
    Messages(Vec<Vec<Value>>),
    Cancel,
    ToolResult { call_id: String },
}

fn parse_events(req: &Map<String, Value>) -> Result<Vec<Input>, ApiError> {
    let events = req
        .get("events")
        .and_then(Value::as_array)
        .filter(|e| !e.is_empty())
        .ok_or_else(|| ApiError::invalid("events must be a non-empty list.", Some("events")))?;
    events
        .iter()
        .enumerate()
        .map(|(i, ev)| {
            let param = format!("events[{i}]");
            let bad = |msg: &str| ApiError::invalid(msg.to_owned(), Some(&param));
            match ev.get("type").and_then(Value::as_str) {
                Some("agent.session.input.message" | "message") => {
                    let msgs = if let Some(input) = ev.get("input") {
                        messages_from_input(input)
                    } else if let Some(content) = ev.get("content") {
                        content_list(content).map(|c| vec![c])
                    } else {
                        ev.get("text").and_then(content_list).map(|c| vec![c])
                    };
                    msgs.map(Input::Messages).ok_or_else(|| {
                        bad("a message event needs `input` (user messages), `content` or `text`.")
                    })
                }
                Some("agent.session.input.cancel" | "cancel") => Ok(Input::Cancel),
                Some("agent.session.input.tool_result" | "tool_result") => ev
                    .get("call_id")
                    .and_then(Value::as_str)
                    .map(|c| Input::ToolResult {
                        call_id: c.to_owned(),
                    })
                    .ok_or_else(|| bad("a tool_result event needs `call_id`.")),
                Some(other) => Err(bad(&format!(
                    "The simulator does not support input events of type '{other}'."
                ))),
                None => Err(bad("every event needs a `type`.")),
            }
        })
        .collect()
}

async fn submit_events(
    State(state): State<SimState>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Reply, ApiError> {
    let req = parse_object(&body)?;
    let inputs = parse_events(&req)?;
    let fp = fingerprint(
        "POST",
        &format!("/v1/agents/sessions/{session_id}/events"),
        &body,
    );
    let reply = idempotent(&state, &headers, fp, |inner| {
        let sh = &state.0;
        let now = sh.clock.now();
        let now_i = now.floor() as i64;
        let s = inner
            .live_session(&session_id)
            .ok_or_else(|| ApiError::not_found("session", &session_id))?;
        if s.status == SessionStatus::Failed {
            return Err(
                ApiError::invalid("The session has failed and accepts no input.", None)
                    .with_code("session_failed"),
            );
        }
        // Validate everything before changing anything.
        let pending_calls: Vec<String> = s
            .required_actions
            .iter()
            .filter(|a| a.get("type").and_then(Value::as_str) == Some("function_call"))
            .filter_map(|a| a.get("call_id").and_then(Value::as_str).map(str::to_owned))
            .collect();
        let has_messages = inputs.iter().any(|i| matches!(i, Input::Messages(_)));
        let mut resolved = BTreeSet::new();
        for input in &inputs {
            if let Input::ToolResult { call_id } = input {
                if !pending_calls.contains(call_id) {
                    return Err(ApiError::invalid(
                        format!("No pending function call with call_id '{call_id}'."),
                        Some("call_id"),
                    ));
                }
                resolved.insert(call_id.clone());
            }
        }
        let blocking = pending_calls.iter().any(|c| !resolved.contains(c));
        if has_messages && blocking {
            return Err(ApiError::conflict(
                "The session is waiting for a function call result; submit a tool_result first.",
            ));
        }
        let mut turn_id = None;
        for input in inputs.iter() {
            match input {
                Input::ToolResult { call_id } => {
                    resolve_function_call(&state, inner, &session_id, call_id, now)
                }
                Input::Cancel => {
                    turns::cancel_active(sh, inner, &session_id, now);
                }
                Input::Messages(msgs) => {
                    turn_id = queue_turn(&state, inner, &session_id, msgs.clone(), now);
                }
            }
        }
        if let Some(s) = inner.live_session_mut(&session_id) {
            s.last_active_at = now_i;
        }
        Ok(Reply {
            status: StatusCode::ACCEPTED,
            body: None,
            headers: turn_id
                .map(|t| vec![(TURN_ID_HEADER, t)])
                .unwrap_or_default(),
        })
    })?;
    state.bump();
    ensure_driver(&state, &session_id);
    Ok(reply)
}

/// Resolves a pending `function_call` action: its waiting turn completes and, with nothing
/// else pending, the session goes `idle` (webhook).
fn resolve_function_call(state: &SimState, inner: &mut Inner, sid: &str, call_id: &str, now: f64) {
    let sh = &state.0;
    let now_i = now.floor() as i64;
    let Inner {
        sessions, turns, ..
    } = inner;
    let Some(s) = sessions.get_mut(sid) else {
        return;
    };
    let mut turn_id = None;
    s.required_actions.retain(|a| {
        let hit = a.get("call_id").and_then(Value::as_str) == Some(call_id);
        if hit {
            turn_id = a.get("turn_id").and_then(Value::as_str).map(str::to_owned);
        }
        !hit
    });
    if let Some(t) = turn_id.and_then(|id| turns.get_mut(&id))
        && t.status == TurnStatus::Waiting
    {
        t.items.push(json!({
            "id": sh.ids.hex("fco_"),
            "type": "function_call_output",
            "call_id": call_id,
            "error": null,
            "output": "ok",
            "status": "completed",
            "turn_id": t.id,
        }));
        t.items.push(objects::assistant_message(
            &sh.ids.hex("msg_"),
            &t.id,
            "Thanks, done.",
        ));
        t.status = TurnStatus::Completed;
        t.completed_at = Some(now_i);
    }
    s.last_active_at = now_i;
    let active = s.turn_ids.iter().any(|id| {
        turns
            .get(id)
            .is_some_and(|t| matches!(t.status, TurnStatus::Queued | TurnStatus::InProgress))
    });
    if s.required_actions.is_empty() && !active {
        s.status = SessionStatus::Idle;
        sh.webhooks
            .emit("agent.session.idle", state_event_data(s), now_i);
    }
}

async fn list_sessions(
    State(state): State<SimState>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Result<Reply, ApiError> {
    let q = pagination::parse(&pairs)?;
    let agent_id = pairs
        .iter()
        .find(|(k, _)| k == "agent_id")
        .map(|(_, v)| v.clone());
    let metadata: Vec<(String, String)> = pairs
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix("metadata[")
                .and_then(|rest| rest.strip_suffix(']'))
                .map(|key| (key.to_owned(), v.clone()))
        })
        .collect();
    let inner = state.lock();
    let entries = inner
        .session_order
        .iter()
        .filter_map(|id| inner.sessions.get(id))
        .map(|s| {
            let visible = !s.deleted
                && agent_id.as_ref().is_none_or(|a| *a == s.agent_id)
                && metadata.iter().all(|(k, v)| s.metadata.get(k) == Some(v));
            (s.id.clone(), visible.then(|| objects::session_json(s)))
        })
        .collect();
    let (data, has_more) = pagination::paginate(entries, &q)?;
    Ok(Reply::json(objects::page_json(data, has_more)))
}

fn turn_of<'a>(inner: &'a Inner, session_id: &str, turn_id: &str) -> Result<&'a TurnRec, ApiError> {
    inner
        .live_session(session_id)
        .ok_or_else(|| ApiError::not_found("session", session_id))?;
    inner
        .turns
        .get(turn_id)
        .filter(|t| t.session_id == session_id)
        .ok_or_else(|| ApiError::not_found("turn", turn_id))
}

/// Items of a turn as the API shows them: a queued turn shows its user messages already.
fn visible_items(t: &TurnRec) -> Vec<Value> {
    if t.status == TurnStatus::Queued && t.items.is_empty() {
        return turns::user_items(t);
    }
    t.items.clone()
}

async fn list_turns(
    State(state): State<SimState>,
    Path(session_id): Path<String>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Result<Reply, ApiError> {
    let q = pagination::parse(&pairs)?;
    let inner = state.lock();
    let s = inner
        .live_session(&session_id)
        .ok_or_else(|| ApiError::not_found("session", &session_id))?;
    let entries = s
        .turn_ids
        .iter()
        .filter_map(|id| inner.turns.get(id))
        .map(|t| (t.id.clone(), Some(objects::turn_json(t))))
        .collect();
    let (data, has_more) = pagination::paginate(entries, &q)?;
    Ok(Reply::json(objects::page_json(data, has_more)))
}

async fn get_turn(
    State(state): State<SimState>,
    Path((session_id, turn_id)): Path<(String, String)>,
) -> Result<Reply, ApiError> {
    let inner = state.lock();
    let t = turn_of(&inner, &session_id, &turn_id)?;
    Ok(Reply::json(objects::turn_json(t)))
}

fn items_page(items: Vec<Value>, pairs: &[(String, String)]) -> Result<Reply, ApiError> {
    let q = pagination::parse(pairs)?;
    let entries = items
        .into_iter()
        .map(|i| {
            (
                i.get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                Some(i),
            )
        })
        .collect();
    let (data, has_more) = pagination::paginate(entries, &q)?;
    Ok(Reply::json(objects::page_json(data, has_more)))
}

async fn list_turn_items(
    State(state): State<SimState>,
    Path((session_id, turn_id)): Path<(String, String)>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Result<Reply, ApiError> {
    let items = {
        let inner = state.lock();
        let t = turn_of(&inner, &session_id, &turn_id)?;
        visible_items(t)
    };
    items_page(items, &pairs)
}

async fn list_session_items(
    State(state): State<SimState>,
    Path(session_id): Path<String>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Result<Reply, ApiError> {
    let items = {
        let inner = state.lock();
        let s = inner
            .live_session(&session_id)
            .ok_or_else(|| ApiError::not_found("session", &session_id))?;
        s.turn_ids
            .iter()
            .filter_map(|id| inner.turns.get(id))
            .flat_map(visible_items)
            .collect()
    };
    items_page(items, &pairs)
}

async fn get_environment(
    State(state): State<SimState>,
    Path(environment_id): Path<String>,
) -> Result<Reply, ApiError> {
    let inner = state.lock();
    let e = inner
        .environments
        .get(&environment_id)
        .filter(|e| !e.deleted)
        .ok_or_else(|| ApiError::not_found("environment", &environment_id))?;
    Ok(Reply::json(objects::environment_json(e)))
}
