//! The Agents API side of executor registration: `POST /v1/cloud/environment/{id}/register`
//! and `POST /v1/cloud/environment/{id}/validate`.
//!
//! Source: ../shared/reference/executor-protocol.md, "Registration and rendezvous", 1 and
//! 4. `codex exec-server forward --remote http://127.0.0.1:PORT/v1 --environment-id ID`
//! (or the single-process form) posts its static public keys with `Authorization: Bearer
//! <executor key>`; the answer names a rendezvous WebSocket ([`crate::rendezvous`]) whose
//! URL is the capability. When the harness opens a stream, the executor asks `/validate`
//! whether the harness's msg1 payload (`harness_key_authorization`) is one the simulator
//! issued for that registration, to the harness whose static X25519 key is
//! `harness_public_key.x25519_public_key`. The reference names a header
//! `x-codex-noise-stream-id`; the pinned 0.171.0 does not send it (measured), so it is
//! checked only when present.
//!
//! Errors (OpenAI shape `{error: {message, type, param, code}}`): 401 wrong or missing key,
//! 404 unknown or deleted environment, 400 a body without the keys or another security
//! profile; `/validate` answers 200 `{valid: false}` for an authorization it did not issue
//! (the executor then resets the stream) and 401/404 like registration.

use crate::auth::bearer_matches;
use crate::error::ApiError;
use crate::noise_session::{MLKEM768_PUBLIC_LEN, X25519_PUBLIC_LEN};
use crate::state::relays::Registration;
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

/// Routes: registration and validation (executor key).
pub(crate) fn routes() -> Router<SimState> {
    Router::new()
        .route(
            "/v1/cloud/environment/{environment_id}/register",
            post(register),
        )
        .route(
            "/v1/cloud/environment/{environment_id}/validate",
            post(validate),
        )
}

/// Checks the key and that `environment_id` is a live self-hosted environment.
/// Checks the bearer and the environment; a wrong key on a registration (`count`) is
/// counted in the environment's `refused_registrations`.
fn check(
    state: &SimState,
    headers: &HeaderMap,
    environment_id: &str,
    count: bool,
) -> Result<(), ApiError> {
    let key_ok = bearer_matches(headers, &state.config().executor_key);
    let mut inner = state.lock();
    if count
        && !key_ok
        && let Some(e) = inner.environments.get_mut(environment_id)
    {
        e.refused_registrations += 1;
    }
    if !key_ok {
        return Err(ApiError::unauthorized());
    }
    match inner
        .environments
        .get(environment_id)
        .filter(|e| !e.deleted)
    {
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
    check(&state, &headers, &environment_id, true)?;
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
        relays
            .registrations
            .insert(registration_id.clone(), registration);
        relays.tokens.insert(token.clone(), registration_id.clone());
    }
    if let Some(e) = state.lock().environments.get_mut(&environment_id) {
        e.registrations += 1;
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
    check(&state, &headers, &environment_id, false)?;
    // codex 0.171.0 sends no `x-codex-noise-stream-id` (measured); when present it must
    // name the stream the authorization was issued for.
    let stream_header = headers
        .get("x-codex-noise-stream-id")
        .and_then(|v| v.to_str().ok());
    let registration_id = body.get("executor_registration_id").and_then(Value::as_str);
    let authorization = body
        .get("harness_key_authorization")
        .and_then(Value::as_str);
    let harness_x25519 = body
        .pointer("/harness_public_key/x25519_public_key")
        .and_then(Value::as_str)
        .and_then(|k| B64.decode(k).ok());
    let relays = state.0.relays.lock().unwrap_or_else(|e| e.into_inner());
    let issued = authorization.and_then(|a| relays.authorizations.get(a));
    let stream_id = issued.map(|i| i.stream_id.clone()).unwrap_or_default();
    let valid = issued.is_some_and(|i| {
        Some(i.registration_id.as_str()) == registration_id
            && harness_x25519.as_deref() == Some(i.harness_x25519.as_slice())
            && stream_header.is_none_or(|h| h == i.stream_id)
    });
    tracing::info!(environment_id = %environment_id, stream_id, valid, "harness validated");
    Ok(Json(json!({"valid": valid})))
}
