//! Bearer-key and beta-header checks.
//!
//! `/v1/agents/...` (except the executor endpoints) requires `Authorization: Bearer
//! <api_key>` (401 otherwise) and `OpenAI-Beta: agents=v1` (400 otherwise). The executor
//! endpoints require the executor key instead. Keys are compared in constant time and
//! never logged or echoed.

use crate::error::ApiError;
use crate::state::SimState;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The beta header name.
pub const BETA_HEADER: &str = "openai-beta";
/// The beta feature every agents call must name.
pub const BETA_VALUE: &str = "agents=v1";

/// Equality whose time depends only on the lengths, not on where the inputs differ.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether the request carries exactly one `Authorization: Bearer <expected>`.
pub(crate) fn bearer_matches(headers: &HeaderMap, expected: &str) -> bool {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return false;
    };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let Some((scheme, token)) = value.trim().split_once(' ') else {
        return false;
    };
    scheme.eq_ignore_ascii_case("bearer") && ct_eq(token.trim().as_bytes(), expected.as_bytes())
}

/// Whether some `OpenAI-Beta` header lists `agents=v1`.
pub(crate) fn beta_ok(headers: &HeaderMap) -> bool {
    headers.get_all(BETA_HEADER).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',')
                .any(|part| part.trim().eq_ignore_ascii_case(BETA_VALUE))
        })
    })
}

/// Middleware of the agents endpoints: API key (401), then beta header (400).
pub(crate) async fn require_api_key(
    State(state): State<SimState>,
    req: Request,
    next: Next,
) -> Response {
    if !bearer_matches(req.headers(), &state.config().api_key) {
        return ApiError::unauthorized().into_response();
    }
    if !beta_ok(req.headers()) {
        return ApiError::beta_header_required().into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn bearer_and_beta_checks() {
        let mut h = HeaderMap::new();
        assert!(!bearer_matches(&h, "k"));
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer key-1"));
        assert!(bearer_matches(&h, "key-1"));
        assert!(!bearer_matches(&h, "key-2"));
        assert!(!bearer_matches(&h, "key-10"));
        h.append(AUTHORIZATION, HeaderValue::from_static("Bearer key-1"));
        assert!(!bearer_matches(&h, "key-1"), "two Authorization headers");

        let mut h = HeaderMap::new();
        assert!(!beta_ok(&h));
        h.insert(
            BETA_HEADER,
            HeaderValue::from_static("assistants=v2, agents=v1"),
        );
        assert!(beta_ok(&h));
        h.insert(BETA_HEADER, HeaderValue::from_static("agents=v2"));
        assert!(!beta_ok(&h));
    }
}
