//! Errors: [`SimError`] (starting the simulator) and [`ApiError`] (an HTTP error answer in
//! the OpenAI shape `{"error": {"message", "type", "param", "code"}}`).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// The simulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A [`SimConfig`](crate::SimConfig) value is unusable.
    #[error("invalid simulator configuration: {0}")]
    Config(String),
    /// The webhook secret is unusable (the secret itself is never printed).
    #[error("invalid webhook secret: {0}")]
    Secret(#[from] sandbox_core::webhook::SecretError),
    /// Binding 127.0.0.1 failed.
    #[error("could not bind 127.0.0.1:{port}: {source}")]
    Bind {
        /// The requested port (0 = any).
        port: u16,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP client for webhook deliveries could not be built.
    #[error("could not build the webhook HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// An API error answer: HTTP status plus the OpenAI error object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message (never contains a key).
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, ...
    pub kind: &'static str,
    /// The offending parameter, if any.
    pub param: Option<String>,
    /// Machine-readable code, if any.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_owned),
            code: None,
        }
    }

    /// The same error with a machine-readable `code`.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// 404 for an unknown or deleted object.
    pub fn not_found(what: &str, id: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("No {what} found with id '{id}'."),
            kind: "invalid_request_error",
            param: None,
            code: Some("not_found"),
        }
    }

    /// 401 for a missing or wrong bearer key (the key is never echoed).
    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// 400 when `OpenAI-Beta: agents=v1` is missing.
    pub fn beta_header_required() -> Self {
        Self::invalid(
            "The Agents API is in beta: send the header 'OpenAI-Beta: agents=v1'.",
            None,
        )
        .with_code("beta_header_required")
    }

    /// 409 for a request that conflicts with the object's state.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::CONFLICT,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("conflict"),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_body_has_the_openai_shape() {
        let e = ApiError::not_found("session", "sess_1");
        let b = e.body();
        let obj = b["error"].as_object().unwrap();
        let mut keys: Vec<_> = obj.keys().cloned().collect();
        keys.sort();
        assert_eq!(keys, ["code", "message", "param", "type"]);
        assert_eq!(e.status, StatusCode::NOT_FOUND);
    }
}
