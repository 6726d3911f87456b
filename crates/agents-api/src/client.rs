//! [`AgentsClient`]: the reqwest-based implementation of [`SessionsApi`].

use crate::api::{PageParams, SessionDeleted, SessionsApi};
use crate::config::{ClientConfig, ConfigError, RetryPolicy};
use crate::error::{ApiError, DecodeError};
use backon::Retryable;
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use sandbox_core::environment::EnvironmentInfo;
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::session::Session;
use sandbox_core::turn::{Item, Page, Turn};
use serde::de::DeserializeOwned;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tracing::debug;

/// Header selecting the Agents API beta; sent on every call (agents-api.md: Transport).
pub const BETA_HEADER: &str = "openai-beta";
/// Value of [`BETA_HEADER`].
pub const BETA_VALUE: &str = "agents=v1";
/// Header carrying the caller's idempotency key on write calls (agents-api.md: Transport).
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

const USER_AGENT: &str = concat!("sandbox-lifecycle/", env!("CARGO_PKG_VERSION"));

/// Typed async client for the Agents API calls of [`SessionsApi`].
///
/// Every request carries `Authorization: Bearer <key>` (a header marked sensitive) and
/// `OpenAI-Beta: agents=v1`; redirects are not followed and no system proxy is used.
/// Cheap to clone (the connection pool is shared). Its `Debug` output never shows the key.
#[derive(Clone)]
pub struct AgentsClient {
    http: reqwest::Client,
    base: Url,
    retry: RetryPolicy,
    connect_timeout: Duration,
    request_timeout: Duration,
}

impl fmt::Debug for AgentsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentsClient")
            .field("base_url", &self.base.as_str())
            .field("api_key", &"<redacted>")
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl AgentsClient {
    /// Builds a client from `config`.
    ///
    /// # Errors
    /// [`ConfigError`] when the base URL is not an absolute `http(s)` URL without
    /// credentials, query or fragment; the key is empty or not a valid header value; a
    /// timeout is zero; `retry.max_attempts` is 0; or the HTTP client cannot be built.
    pub fn new(config: ClientConfig) -> Result<Self, ConfigError> {
        let base = parse_base_url(&config.base_url)?;
        if config.connect_timeout.is_zero() {
            return Err(ConfigError::InvalidTimeout {
                which: "connect_timeout",
            });
        }
        if config.request_timeout.is_zero() {
            return Err(ConfigError::InvalidTimeout {
                which: "request_timeout",
            });
        }
        if config.retry.max_attempts == 0 {
            return Err(ConfigError::InvalidRetry);
        }
        let key = config.api_key.expose();
        if key.is_empty() {
            return Err(ConfigError::InvalidApiKey);
        }
        let mut auth = HeaderValue::from_str(&format!("Bearer {key}"))
            .map_err(|_| ConfigError::InvalidApiKey)?;
        auth.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, auth);
        headers.insert(
            HeaderName::from_static(BETA_HEADER),
            HeaderValue::from_static(BETA_VALUE),
        );
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .user_agent(USER_AGENT)
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .map_err(|source| ConfigError::Client {
                source: source.without_url(),
            })?;
        Ok(Self {
            http,
            base,
            retry: config.retry,
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
        })
    }

    /// The validated base URL (trailing `/` removed).
    pub fn base_url(&self) -> &Url {
        &self.base
    }

    /// `{base}/{segments...}` with each segment percent-encoded, plus `query`.
    fn url(&self, segments: &[&str], query: &[(&'static str, String)]) -> Result<Url, ApiError> {
        if let Some(empty) = segments.iter().position(|s| s.is_empty()) {
            return Err(ApiError::InvalidArgument {
                reason: format!("path segment {empty} is empty (an id must not be empty)"),
            });
        }
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| ApiError::InvalidArgument {
                reason: "base URL cannot take a path".to_owned(),
            })?
            .pop_if_empty()
            .extend(segments);
        if !query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        Ok(url)
    }

    /// Sends `method url` with retries, then decodes a success body as `T`.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        idempotency_key: Option<HeaderValue>,
        expected: &'static str,
    ) -> Result<T, ApiError> {
        let request = format!("{method} {}", url.path());
        let body = self
            .send_with_retry(&method, &url, idempotency_key.as_ref(), &request)
            .await?;
        serde_json::from_slice(&body).map_err(|err| ApiError::Decode {
            request,
            source: DecodeError::from_serde(expected, &err),
        })
    }

    async fn send_with_retry(
        &self,
        method: &Method,
        url: &Url,
        idempotency_key: Option<&HeaderValue>,
        request: &str,
    ) -> Result<Vec<u8>, ApiError> {
        let attempts = AtomicU32::new(0);
        let attempts = &attempts;
        let max_retry_after = self.retry.max_retry_after;
        let path = url.path();
        let attempt_once = move || async move {
            let attempt = attempts.fetch_add(1, Ordering::Relaxed) + 1;
            self.send_once(method, url, idempotency_key, request, attempt)
                .await
        };
        attempt_once
            .retry(self.retry.backoff())
            .when(ApiError::is_retryable)
            .adjust(move |err: &ApiError, backoff: Option<Duration>| {
                // `None` means the attempts are used up: keep it `None`.
                backoff.map(|delay| match err.retry_after() {
                    Some(asked) => delay.max(asked.min(max_retry_after)),
                    None => delay,
                })
            })
            .notify(|err: &ApiError, delay: Duration| {
                debug!(
                    %method,
                    path,
                    attempt = attempts.load(Ordering::Relaxed),
                    delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    error = %err,
                    "agents api: retrying"
                );
            })
            .await
    }

    /// One attempt: send, classify the status, read the body of a success.
    async fn send_once(
        &self,
        method: &Method,
        url: &Url,
        idempotency_key: Option<&HeaderValue>,
        request: &str,
        attempt: u32,
    ) -> Result<Vec<u8>, ApiError> {
        let path = url.path();
        let mut builder = self.http.request(method.clone(), url.clone());
        if let Some(key) = idempotency_key {
            builder = builder.header(IDEMPOTENCY_KEY_HEADER, key.clone());
        }
        let started = Instant::now();
        let response = match builder.send().await {
            Ok(response) => response,
            Err(err) => {
                let err = transport_error(err, request, attempt);
                debug!(%method, path, attempt, error = %err, "agents api: no response");
                return Err(err);
            }
        };
        let status = response.status();
        debug!(
            %method,
            path,
            attempt,
            status = status.as_u16(),
            elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "agents api: response"
        );
        let request = request.to_owned();
        if status.is_success() {
            return match response.bytes().await {
                Ok(body) => Ok(body.to_vec()),
                Err(err) => {
                    let err = transport_error(err, &request, attempt);
                    debug!(%method, path, attempt, error = %err, "agents api: body not read");
                    Err(err)
                }
            };
        }
        // Error bodies are never read: they could echo secrets into logs or errors.
        let retry_after = retry_after(response.headers());
        Err(match status {
            StatusCode::NOT_FOUND => ApiError::NotFound { request },
            StatusCode::TOO_MANY_REQUESTS => ApiError::RateLimited {
                request,
                attempts: attempt,
                retry_after,
            },
            s if s.is_server_error() => ApiError::Server {
                request,
                status: s.as_u16(),
                attempts: attempt,
                retry_after,
            },
            s => ApiError::Http {
                request,
                status: s.as_u16(),
            },
        })
    }
}

impl SessionsApi for AgentsClient {
    async fn retrieve_session(&self, id: &SessionId) -> Result<Session, ApiError> {
        let url = self.url(&["agents", "sessions", id.as_str()], &[])?;
        self.call(Method::GET, url, None, "agent.session").await
    }

    async fn delete_session(
        &self,
        id: &SessionId,
        idempotency_key: &str,
    ) -> Result<SessionDeleted, ApiError> {
        let key = idempotency_header(idempotency_key)?;
        let url = self.url(&["agents", "sessions", id.as_str()], &[])?;
        self.call(Method::DELETE, url, Some(key), "agent.session.deleted")
            .await
    }

    async fn retrieve_environment(&self, id: &EnvironmentId) -> Result<EnvironmentInfo, ApiError> {
        let url = self.url(&["agents", "environments", id.as_str()], &[])?;
        self.call(Method::GET, url, None, "agent.environment").await
    }

    async fn list_turns(
        &self,
        session_id: &SessionId,
        page: &PageParams,
    ) -> Result<Page<Turn>, ApiError> {
        page.validate()?;
        let url = self.url(
            &["agents", "sessions", session_id.as_str(), "turns"],
            &page.query_pairs(),
        )?;
        self.call(Method::GET, url, None, "list of agent.session.turn")
            .await
    }

    async fn list_turn_items(
        &self,
        session_id: &SessionId,
        turn_id: &str,
        page: &PageParams,
    ) -> Result<Page<Item>, ApiError> {
        page.validate()?;
        let url = self.url(
            &[
                "agents",
                "sessions",
                session_id.as_str(),
                "turns",
                turn_id,
                "items",
            ],
            &page.query_pairs(),
        )?;
        self.call(Method::GET, url, None, "list of turn items")
            .await
    }
}

fn parse_base_url(raw: &str) -> Result<Url, ConfigError> {
    let invalid = |reason| ConfigError::InvalidBaseUrl { reason };
    let mut url = Url::parse(raw.trim()).map_err(|_| invalid("not an absolute URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("scheme must be http or https"));
    }
    if url.cannot_be_a_base() || url.host().is_none() {
        return Err(invalid("URL has no host"));
    }
    // The bearer key never travels in clear text, except to this machine (a
    // local simulator or a TLS proxy on loopback).
    let loopback = url.host_str().is_some_and(|h| {
        h.eq_ignore_ascii_case("localhost")
            || h.trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|a| a.is_loopback())
    });
    if url.scheme() == "http" && !loopback {
        return Err(invalid(
            "http is allowed only for a loopback host; use https",
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid("URL must not contain credentials"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("URL must not contain a query or fragment"));
    }
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.pop_if_empty();
    }
    Ok(url)
}

fn idempotency_header(key: &str) -> Result<HeaderValue, ApiError> {
    if key.is_empty() {
        return Err(ApiError::InvalidArgument {
            reason: "idempotency key must not be empty".to_owned(),
        });
    }
    HeaderValue::from_str(key).map_err(|_| ApiError::InvalidArgument {
        reason: "idempotency key must be visible ASCII".to_owned(),
    })
}

/// Classifies a reqwest error (URL stripped) as timeout, connection or other transport
/// failure.
fn transport_error(err: reqwest::Error, request: &str, attempt: u32) -> ApiError {
    let request = request.to_owned();
    let source = err.without_url();
    if source.is_timeout() {
        ApiError::Timeout {
            request,
            attempts: attempt,
            source,
        }
    } else if source.is_connect() || source.is_request() || source.is_body() {
        // Refused, DNS, TLS, or a connection that broke mid-exchange: all "unreachable".
        ApiError::Connect {
            request,
            attempts: attempt,
            source,
        }
    } else {
        ApiError::Transport { request, source }
    }
}

/// The delay a response asks for: `retry-after-ms` (milliseconds, OpenAI's extension, may
/// be fractional) when present and valid, else `Retry-After` in whole seconds. The
/// HTTP-date form of `Retry-After` is ignored (the exponential backoff applies instead).
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64((ms / 1000.0).min(u32::MAX as f64)));
    }
    text("retry-after")
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, HeaderValue::from_static(v));
        }
        map
    }

    #[test]
    fn retry_after_reads_seconds_and_milliseconds() {
        assert_eq!(retry_after(&headers(&[])), None);
        assert_eq!(
            retry_after(&headers(&[("retry-after", "2")])),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after", " 7 ")])),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            retry_after(&headers(&[(
                "retry-after",
                "Wed, 21 Oct 2015 07:28:00 GMT"
            )])),
            None
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "-1")])), None);
        assert_eq!(
            retry_after(&headers(&[("retry-after-ms", "250"), ("retry-after", "9")])),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after-ms", "nan"), ("retry-after", "9")])),
            Some(Duration::from_secs(9))
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after-ms", "1e300")])),
            Some(Duration::from_secs(u64::from(u32::MAX)))
        );
    }

    #[test]
    fn base_url_rules() {
        let ok = parse_base_url("https://api.openai.com/v1/").unwrap();
        assert_eq!(ok.as_str(), "https://api.openai.com/v1");
        assert_eq!(
            parse_base_url("http://127.0.0.1:9/").unwrap().as_str(),
            "http://127.0.0.1:9/"
        );
        assert!(parse_base_url("http://localhost:9/v1").is_ok());
        assert!(parse_base_url("http://[::1]:9/v1").is_ok());
        for bad in [
            "http://api.openai.com/v1",
            "http://10.0.0.1/v1",
            "http://127.0.0.1.evil.test/v1",
            "api.openai.com/v1",
            "ftp://example.com/",
            "https://user:pw@example.com/v1",
            "https://example.com/v1?key=x",
            "mailto:x@example.com",
        ] {
            assert!(parse_base_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_encode_segments_and_reject_empty_ids() {
        let client = AgentsClient::new(ClientConfig {
            base_url: "http://127.0.0.1:9/v1/".into(),
            ..ClientConfig::new("k")
        })
        .unwrap();
        let url = client
            .url(
                &["agents", "sessions", "a/b?c"],
                &[("after", "x y".to_owned())],
            )
            .unwrap();
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:9/v1/agents/sessions/a%2Fb%3Fc?after=x+y"
        );
        assert!(matches!(
            client.url(&["agents", "sessions", ""], &[]),
            Err(ApiError::InvalidArgument { .. })
        ));
    }

    #[test]
    fn config_is_validated() {
        let bad_key = AgentsClient::new(ClientConfig::new("")).unwrap_err();
        assert!(matches!(bad_key, ConfigError::InvalidApiKey));
        let newline = AgentsClient::new(ClientConfig::new("sk-x\nInjected: 1")).unwrap_err();
        assert!(matches!(newline, ConfigError::InvalidApiKey));
        assert!(!newline.to_string().contains("sk-x"));
        let zero = AgentsClient::new(ClientConfig {
            request_timeout: Duration::ZERO,
            ..ClientConfig::new("k")
        })
        .unwrap_err();
        assert!(matches!(zero, ConfigError::InvalidTimeout { .. }));
        let no_attempts = AgentsClient::new(ClientConfig {
            retry: RetryPolicy {
                max_attempts: 0,
                ..RetryPolicy::default()
            },
            ..ClientConfig::new("k")
        })
        .unwrap_err();
        assert!(matches!(no_attempts, ConfigError::InvalidRetry));
    }

    #[test]
    fn idempotency_key_must_be_a_header_value() {
        assert!(idempotency_header("").is_err());
        assert!(idempotency_header("a\nb").is_err());
        assert!(idempotency_header("sl-delete-sess_1").is_ok());
    }
}
