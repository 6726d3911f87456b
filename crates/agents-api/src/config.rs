//! Client configuration: base URL, API key, timeouts and the retry policy.

use std::fmt;
use std::time::Duration;

/// The Agents API base URL used when none is configured (agents-api.md: Transport).
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// Default TCP/TLS connect timeout: 5 seconds.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Default overall timeout of one HTTP attempt (connect, send, and read the whole response
/// body): 20 seconds.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// The application's OpenAI API key, sent as `Authorization: Bearer <key>`.
///
/// Its `Debug` output is always `ApiKey(<redacted>)`, and it has no `Display`, no
/// `Serialize` and no public accessor: the key can only leave this crate inside the
/// `Authorization` header, which is marked sensitive. (agents-api.md: the application's own
/// key never enters the sandbox; this crate also keeps it out of every log and error.)
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key as given (e.g. read from the environment or a secret store). It is
    /// validated by [`crate::AgentsClient::new`]: it must be non-empty and a valid HTTP
    /// header value.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl From<String> for ApiKey {
    fn from(key: String) -> Self {
        Self(key)
    }
}

/// How failed attempts are retried.
///
/// Retried: HTTP 429, HTTP 5xx, connection failures and timeouts. Never retried: 404
/// ([`crate::ApiError::NotFound`]), every other 4xx, and responses that do not decode.
/// The delay between attempts grows exponentially (computed by the `backon` crate) from
/// [`min_delay`](Self::min_delay) by a factor of 2 up to [`max_delay`](Self::max_delay),
/// optionally with jitter; when the response carries `Retry-After` (whole seconds) or
/// `retry-after-ms` (milliseconds), the delay is at least that long, capped at
/// [`max_retry_after`](Self::max_retry_after).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts per call, the first one included (default 4; must be ≥ 1; 1 means no
    /// retry).
    pub max_attempts: u32,
    /// Delay before the first retry (default 500 ms).
    pub min_delay: Duration,
    /// Largest backoff delay (default 8 s); a server's `Retry-After` may exceed it up to
    /// [`max_retry_after`](Self::max_retry_after).
    pub max_delay: Duration,
    /// Largest delay a server's `Retry-After` can impose (default 30 s). A longer
    /// `Retry-After` is capped to this value, not ignored.
    pub max_retry_after: Duration,
    /// Add random jitter (up to +100 % of the current delay) to each backoff delay
    /// (default `true`), so that many controllers do not retry in lockstep.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            min_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(30),
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// The backoff schedule for one call: `max_attempts - 1` delays.
    pub(crate) fn backoff(&self) -> backon::ExponentialBuilder {
        let retries = usize::try_from(self.max_attempts.saturating_sub(1)).unwrap_or(usize::MAX);
        let builder = backon::ExponentialBuilder::new()
            .with_factor(2.0)
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_max_times(retries);
        if self.jitter {
            builder.with_jitter()
        } else {
            builder
        }
    }
}

/// Everything [`crate::AgentsClient::new`] needs.
///
/// Build it with [`ClientConfig::new`] and override fields as needed:
///
/// ```
/// use sandbox_agents_api::{ClientConfig, RetryPolicy};
/// use std::time::Duration;
///
/// let config = ClientConfig {
///     base_url: "http://127.0.0.1:8080/v1".into(),
///     request_timeout: Duration::from_secs(5),
///     retry: RetryPolicy { max_attempts: 2, ..RetryPolicy::default() },
///     ..ClientConfig::new("sk-test")
/// };
/// assert!(!format!("{config:?}").contains("sk-test"));
/// ```
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// API root, e.g. `https://api.openai.com/v1` (the default). Endpoint paths such as
    /// `/agents/sessions/{id}` are appended to it; a trailing `/` is ignored. Must be an
    /// absolute `http` or `https` URL without credentials, query or fragment.
    pub base_url: String,
    /// The bearer key (redacted in `Debug`).
    pub api_key: ApiKey,
    /// TCP (and TLS) connect timeout per attempt (default 5 s; must be non-zero).
    pub connect_timeout: Duration,
    /// Overall timeout per attempt, from sending the request to reading the whole response
    /// body (default 20 s; must be non-zero). A call with retries can take up to about
    /// `max_attempts × request_timeout` plus the delays.
    pub request_timeout: Duration,
    /// Retry policy.
    pub retry: RetryPolicy,
}

impl ClientConfig {
    /// A configuration with the given key and every other field at its default:
    /// [`DEFAULT_BASE_URL`], [`DEFAULT_CONNECT_TIMEOUT`], [`DEFAULT_REQUEST_TIMEOUT`] and
    /// [`RetryPolicy::default`].
    pub fn new(api_key: impl Into<String>) -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key: ApiKey::new(api_key),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            retry: RetryPolicy::default(),
        }
    }
}

/// A [`ClientConfig`] that [`crate::AgentsClient::new`] refused. Messages never contain the
/// key or the base URL itself.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The base URL is unusable.
    #[error("invalid base URL: {reason}")]
    InvalidBaseUrl {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The API key is empty or not a valid HTTP header value.
    #[error("invalid API key: must be non-empty visible ASCII")]
    InvalidApiKey,
    /// A timeout is zero.
    #[error("invalid {which}: must be greater than zero")]
    InvalidTimeout {
        /// `connect_timeout` or `request_timeout`.
        which: &'static str,
    },
    /// `retry.max_attempts` is zero.
    #[error("invalid retry policy: max_attempts must be at least 1")]
    InvalidRetry,
    /// The HTTP client could not be built (e.g. the TLS backend failed to initialise).
    #[error("could not build the HTTP client")]
    Client {
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },
}
