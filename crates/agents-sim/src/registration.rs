//! The Agents API side of executor registration: `POST /v1/cloud/environment/{id}/register`
//! and `POST /v1/cloud/environment/{id}/validate`, plus the `/sim/executor/...` control
//! knobs tests use to make them fail.
//!
//! Source: ../shared/reference/executor-protocol.md, "Registration and rendezvous", 1 and
//! 4. `codex exec-server forward --remote http://127.0.0.1:PORT/v1 --environment-id ID`
//! (or the single-process form) posts its static public keys with `Authorization: Bearer
//! <executor key>`; the answer names a rendezvous WebSocket ([`crate::rendezvous`]) whose
//! URL is the capability. When the harness opens a stream, the executor asks `/validate`
//! whether the harness's msg1 payload (`harness_key_authorization`) is one the simulator
//! issued for that registration and stream (header `x-codex-noise-stream-id`).
//!
//! Errors (OpenAI shape `{error: {message, type, param, code}}`): 401 wrong or missing key,
//! 404 unknown or deleted environment, 400 a body without the keys or another security
//! profile; `/validate` answers 200 `{valid: false}` for an authorization it did not issue
//! (the executor then resets the stream) and 401/404 like registration.

use crate::auth::bearer_matches;
use crate::error::ApiError;
use crate::noise_session::{MLKEM768_PUBLIC_LEN, X25519_PUBLIC_LEN};
use crate::state::{EnvKind, SimState};
use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::post;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

/// The only security profile.
pub const SECURITY_PROFILE: &str = "noise_hybrid_ik_v1";

/// One registration: the executor's static keys, for the harness's handshakes.
#[derive(Clone, Debug)]
pub(crate) struct Registration {
    pub environment_id: String,
    pub x25519: Vec<u8>,
    pub mlkem: Vec<u8>,
}

/// Test faults of registration (set through `POST /sim/executor/faults`).
#[derive(Clone, Debug, Default)]
pub(crate) struct Faults {
    /// Answer every registration with this status (401 or 404) instead of registering.
    pub register_status: Option<u16>,
    /// Answer every `/validate` with `{valid: false}`.
    pub refuse_validate: bool,
}

/// Routes: registration and validation (executor key) and the fault knobs (no auth).
pub(crate) fn routes() -> Router<SimState> {
    Router::new()
        .route("/v1/cloud/environment/{environment_id}/register", post(register))
        .route("/v1/cloud/environment/{environment_id}/validate", post(validate))
        .route("/sim/executor/faults", post(set_faults))
}

/// Checks the key and that `environment_id` is a live self-hosted environment.
fn check(state: &SimState, headers: &HeaderMap, environment_id: &str) -> Result<(), ApiError> {
    if !bearer_matches(headers, &state.config().executor_key) {
        return Err(ApiError::unauthorized());
    }
    let inner = state.lock();
    match inner.environments.get(environment_id).filter(|e| !e.deleted) {
        Some(e) if e.kind == EnvKind::SelfHosted => Ok(()),
        _ => Err(ApiError::not_found("environment", environment_id)),
    }
}

fn key(body: &Value, field: &str, len: usize) -> Result<Vec<u8>, ApiError> {
    body.pointer(&format!("/executor_public_key/{field}"))
        .and_then(Value::as_str)
        .and_then(|s| B64.decode(s).ok())
        .filter(|k| k.len() == len)
        .ok_or_else(|| {
            ApiError::invalid(
                format!("executor_public_key.{field} must be base64 of {len} bytes."),
                Some("executor_public_key"),
            )
        })
}

async fn register(
    State(state): State<SimState>,
    Path(environment_id): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Result<Json<Value>, ApiError> {
    match state.0.relays.lock().unwrap_or_else(|e| e.into_inner()).faults.register_status {
        Some(401) => return Err(ApiError::unauthorized()),
        Some(_) => return Err(ApiError::not_found("environment", &environment_id)),
        None => {}
    }
    check(&state, &headers, &environment_id)?;
    if body.get("security_profile").and_then(Value::as_str) != Some(SECURITY_PROFILE) {
        return Err(ApiError::invalid(
            format!("security_profile must be {SECURITY_PROFILE}."),
            Some("security_profile"),
        ));
    }
    let registration = Registration {
        environment_id: environment_id.clone(),
        x25519: key(&body, "x25519_public_key", X25519_PUBLIC_LEN)?,
        mlkem: key(&body, "mlkem768_public_key", MLKEM768_PUBLIC_LEN)?,
    };
    let registration_id = state.0.ids.hex("exreg_");
    let token = state.0.ids.hex("rdv_");
    {
        let mut relays = state.0.relays.lock().unwrap_or_else(|e| e.into_inner());
        relays.registrations.insert(registration_id.clone(), registration);
        relays.tokens.insert(token.clone(), registration_id.clone());
        relays.register_count += 1;
    }
    let ws_root = state.0.root_url.replacen("http://", "ws://", 1);
    tracing::info!(environment_id = %environment_id, registration_id = %registration_id, "executor registered");
    Ok(Json(json!({
        "environment_id": environment_id,
        "url": format!("{ws_root}/v1/cloud/rendezvous/{token}"),
        "security_profile": SECURITY_PROFILE,
        "executor_registration_id": registration_id,
    })))
}

async fn validate(
    State(state): State<SimState>,
    Path(environment_id): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Result<Json<Value>, ApiError> {
    check(&state, &headers, &environment_id)?;
    let stream_id = headers
        .get("x-codex-noise-stream-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let registration_id = body.get("executor_registration_id").and_then(Value::as_str);
    let authorization = body.get("harness_key_authorization").and_then(Value::as_str);
    let relays = state.0.relays.lock().unwrap_or_else(|e| e.into_inner());
    let issued = relays.authorizations.get(stream_id);
    let valid = !relays.faults.refuse_validate
        && matches!((issued, registration_id, authorization),
            (Some((reg, auth)), Some(r), Some(a)) if reg == r && authorization_matches(a, auth));
    tracing::info!(environment_id = %environment_id, stream_id, valid, "harness validated");
    Ok(Json(json!({"valid": valid})))
}

/// The executor forwards msg1's payload as a string: the token itself or its base64.
fn authorization_matches(sent: &str, issued: &str) -> bool {
    sent == issued || B64.decode(sent).is_ok_and(|b| b == issued.as_bytes())
}

async fn set_faults(State(state): State<SimState>, Json(body): Json<Value>) -> Json<Value> {
    let mut relays = state.0.relays.lock().unwrap_or_else(|e| e.into_inner());
    relays.faults = Faults {
        register_status: body
            .get("register_status")
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok()),
        refuse_validate: body.get("refuse_validate").and_then(Value::as_bool) == Some(true),
    };
    Json(json!({"register_status": relays.faults.register_status, "refuse_validate": relays.faults.refuse_validate}))
}
