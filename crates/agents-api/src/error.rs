//! The one error type of every call, and its mapping to [`Unavailable`].

use sandbox_core::observed::Unavailable;
use std::time::Duration;

/// Why an Agents API call failed.
///
/// Every response-derived variant names the request as `"{METHOD} {path}"` (e.g.
/// `GET /agents/sessions/sess_1`; no host, no query string). No variant ever holds or
/// prints the API key or any part of a response body: error bodies are never read, and
/// [`DecodeError`] keeps only the position and category of a JSON mismatch. Wrapped
/// transport errors are stripped of their URL.
///
/// Retried before being returned (see [`crate::RetryPolicy`]): [`RateLimited`],
/// [`Server`], [`Timeout`] and [`Connect`]; their `attempts` field is how many attempts
/// were made in total. Everything else is returned after the first attempt.
///
/// [`RateLimited`]: ApiError::RateLimited
/// [`Server`]: ApiError::Server
/// [`Timeout`]: ApiError::Timeout
/// [`Connect`]: ApiError::Connect
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// HTTP 404: the session, environment or turn does not exist, or was deleted
    /// (agents-api.md: a deleted session answers 404; no webhook is sent for a deletion).
    /// Never retried.
    #[error("{request}: not found (HTTP 404)")]
    NotFound {
        /// `"{METHOD} {path}"`.
        request: String,
    },
    /// HTTP 429 on every attempt.
    #[error("{request}: rate limited (HTTP 429) after {attempts} attempt(s)")]
    RateLimited {
        /// `"{METHOD} {path}"`.
        request: String,
        /// Attempts made, the first one included.
        attempts: u32,
        /// The last response's `Retry-After` / `retry-after-ms`, uncapped, if it had one.
        retry_after: Option<Duration>,
    },
    /// HTTP 5xx on the last attempt.
    #[error("{request}: server error (HTTP {status}) after {attempts} attempt(s)")]
    Server {
        /// `"{METHOD} {path}"`.
        request: String,
        /// The status code (500..=599).
        status: u16,
        /// Attempts made, the first one included.
        attempts: u32,
        /// The last response's `Retry-After` / `retry-after-ms`, uncapped, if it had one.
        retry_after: Option<Duration>,
    },
    /// No complete response within the connect or request timeout on the last attempt.
    #[error("{request}: timed out after {attempts} attempt(s)")]
    Timeout {
        /// `"{METHOD} {path}"`.
        request: String,
        /// Attempts made, the first one included.
        attempts: u32,
        /// The transport error (URL stripped).
        #[source]
        source: reqwest::Error,
    },
    /// The connection could not be made (refused, DNS, TLS) or broke before a complete
    /// response arrived, on the last attempt.
    #[error("{request}: connection failed after {attempts} attempt(s)")]
    Connect {
        /// `"{METHOD} {path}"`.
        request: String,
        /// Attempts made, the first one included.
        attempts: u32,
        /// The transport error (URL stripped).
        #[source]
        source: reqwest::Error,
    },
    /// Any other non-success status (4xx other than 404 and 429, e.g. 400, 401, 403, 409;
    /// or an unexpected 1xx/3xx: redirects are not followed). Never retried.
    #[error("{request}: rejected (HTTP {status})")]
    Http {
        /// `"{METHOD} {path}"`.
        request: String,
        /// The status code.
        status: u16,
    },
    /// A success response whose body is not the expected JSON shape. Never retried.
    #[error("{request}: response body does not match the expected shape")]
    Decode {
        /// `"{METHOD} {path}"`.
        request: String,
        /// Where the mismatch is (never the offending text).
        #[source]
        source: DecodeError,
    },
    /// A transport failure that is neither a timeout nor a connection problem (should not
    /// happen with a valid configuration). Never retried.
    #[error("{request}: transport error")]
    Transport {
        /// `"{METHOD} {path}"`.
        request: String,
        /// The transport error (URL stripped).
        #[source]
        source: reqwest::Error,
    },
    /// The call was rejected before any request was sent, e.g. a page `limit` outside
    /// 1..=100 (agents-api.md: cursor pages), an empty id, or an unusable idempotency key.
    #[error("invalid argument: {reason}")]
    InvalidArgument {
        /// What is wrong (never a secret).
        reason: String,
    },
}

impl ApiError {
    /// The evidence gap this error represents for a decision (`SessionView::Unavailable`),
    /// or `None` when the error is an answer or a bug rather than missing evidence.
    ///
    /// | error | `Unavailable` |
    /// |---|---|
    /// | `Timeout` | `Timeout` |
    /// | `Connect` | `Unreachable` |
    /// | `Server` | `ServerError` |
    /// | `RateLimited` | `RateLimited` |
    /// | `NotFound`, `Http`, `Decode`, `Transport`, `InvalidArgument` | `None` |
    ///
    /// `NotFound` is an answer, not a gap: for a session it means deleted
    /// (`SessionView::Deleted`).
    pub fn unavailable(&self) -> Option<Unavailable> {
        match self {
            Self::Timeout { .. } => Some(Unavailable::Timeout),
            Self::Connect { .. } => Some(Unavailable::Unreachable),
            Self::Server { .. } => Some(Unavailable::ServerError),
            Self::RateLimited { .. } => Some(Unavailable::RateLimited),
            Self::NotFound { .. }
            | Self::Http { .. }
            | Self::Decode { .. }
            | Self::Transport { .. }
            | Self::InvalidArgument { .. } => None,
        }
    }

    /// Whether this kind of failure is retried by [`crate::AgentsClient`]: 429, 5xx,
    /// timeouts and connection failures.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::RateLimited { .. }
                | Self::Server { .. }
                | Self::Timeout { .. }
                | Self::Connect { .. }
        )
    }

    /// Whether this is [`ApiError::NotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// The HTTP status behind the error, if a response was received.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::NotFound { .. } => Some(404),
            Self::RateLimited { .. } => Some(429),
            Self::Server { status, .. } | Self::Http { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The server's requested delay (`Retry-After` / `retry-after-ms`, uncapped).
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_after, .. } | Self::Server { retry_after, .. } => {
                *retry_after
            }
            _ => None,
        }
    }
}

/// Where a response body failed to match the expected JSON shape.
///
/// Deliberately holds no text from the body: `serde_json`'s own messages can quote values
/// (e.g. ``unknown variant `...` ``), so only the category and position are kept.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("expected {expected} JSON: {category} error at line {line}, column {column}")]
pub struct DecodeError {
    /// What was expected, e.g. `agent.session`.
    pub expected: &'static str,
    /// `syntax` (not JSON), `data` (JSON of the wrong shape), `eof` (truncated) or `io`.
    pub category: &'static str,
    /// 1-based line of the mismatch.
    pub line: usize,
    /// 1-based column of the mismatch.
    pub column: usize,
}

impl DecodeError {
    pub(crate) fn from_serde(expected: &'static str, err: &serde_json::Error) -> Self {
        use serde_json::error::Category;
        let category = match err.classify() {
            Category::Io => "io",
            Category::Syntax => "syntax",
            Category::Data => "data",
            Category::Eof => "eof",
        };
        Self {
            expected,
            category,
            line: err.line(),
            column: err.column(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_of_answers_and_invalid_arguments_is_none() {
        let not_found = ApiError::NotFound {
            request: "GET /agents/sessions/s".into(),
        };
        assert_eq!(not_found.unavailable(), None);
        assert!(not_found.is_not_found());
        assert!(!not_found.is_retryable());
        let http = ApiError::Http {
            request: "GET /x".into(),
            status: 400,
        };
        assert_eq!(http.unavailable(), None);
        assert_eq!(http.status(), Some(400));
        let server = ApiError::Server {
            request: "GET /x".into(),
            status: 502,
            attempts: 3,
            retry_after: None,
        };
        assert_eq!(server.unavailable(), Some(Unavailable::ServerError));
        assert!(server.is_retryable());
        let limited = ApiError::RateLimited {
            request: "GET /x".into(),
            attempts: 3,
            retry_after: Some(Duration::from_secs(1)),
        };
        assert_eq!(limited.unavailable(), Some(Unavailable::RateLimited));
        assert_eq!(limited.retry_after(), Some(Duration::from_secs(1)));
    }

    #[test]
    fn decode_error_never_quotes_the_body() {
        let secret = "sk-very-secret-value";
        let body = format!(r#"{{"status": "{secret}"}}"#);
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct S {
            status: u8,
        }
        let err = serde_json::from_str::<S>(&body).unwrap_err();
        assert!(err.to_string().contains(secret), "serde quotes values");
        let ours = DecodeError::from_serde("thing", &err);
        assert!(!ours.to_string().contains(secret));
        assert!(!format!("{ours:?}").contains(secret));
        assert_eq!(ours.category, "data");
        assert_eq!(ours.line, 1);
    }
}
