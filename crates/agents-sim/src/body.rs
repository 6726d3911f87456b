//! Request bodies: an optional JSON object, refused as the real API refuses it (400
//! `invalid_request_error`).

use crate::error::ApiError;
use axum::body::Bytes;
use serde_json::{Map, Value};

/// Parses an optional JSON object body (an empty body is an empty object).
pub(crate) fn parse_object(body: &Bytes) -> Result<Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::invalid(
            "The request body must be a JSON object.",
            None,
        )),
        Err(e) => Err(ApiError::invalid(
            format!("The request body is not valid JSON: {e}"),
            None,
        )),
    }
}
