//! [`SimConfig`]: keys, webhook target, time scale, lifecycle timings and delivery faults.

use reqwest::Url;
use std::fmt;
use std::ops::RangeInclusive;
use std::time::Duration;

/// Default API key accepted on `/v1/agents/...` (a local test value, not a secret).
pub const DEFAULT_API_KEY: &str = "sk-sim-local-api-key";
/// Default restricted executor key accepted on the connect endpoint (a local test value).
pub const DEFAULT_EXECUTOR_KEY: &str = "sk-sim-local-executor-key";
/// Default webhook signing secret: `whsec_` + base64 of the 32 ASCII bytes
/// `agents-sim-local-test-secret-32b`. TEST ONLY: it protects nothing.
pub const DEFAULT_WEBHOOK_SECRET: &str = "whsec_YWdlbnRzLXNpbS1sb2NhbC10ZXN0LXNlY3JldC0zMmI=";
/// Default agent id of sessions created without `agent.id` / `agent_id` (the id used by
/// the `events/` fixtures).
pub const DEFAULT_AGENT_ID: &str = "agent_68f1b9e0c1b1f319b345b93f";
/// Default time scale: 60 simulated seconds per real second.
pub const DEFAULT_TIME_SCALE: f64 = 60.0;
/// Default input-time connection deadline, in simulated seconds (the API waits 5 minutes).
pub const DEFAULT_CONNECT_DEADLINE_SECS: f64 = 300.0;
/// Default duration of one turn once it runs, in simulated seconds.
pub const DEFAULT_TURN_SECS: f64 = 30.0;
/// Default number of HTTP attempts per delivery copy (the first one included).
pub const DEFAULT_MAX_DELIVERY_ATTEMPTS: u32 = 8;
/// Default delay before the first delivery retry, in real time (doubles per retry).
pub const DEFAULT_RETRY_BASE_DELAY: Duration = Duration::from_millis(100);
/// Default largest delay between delivery retries, in real time.
pub const DEFAULT_RETRY_MAX_DELAY: Duration = Duration::from_secs(2);
/// Default timeout of one delivery HTTP attempt, in real time.
pub const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_secs(5);
/// Default command every simulated turn "runs" in its `command_execution` item.
pub const DEFAULT_TURN_COMMAND: &str = "cargo test --workspace";

/// What happens when no executor connects within the input-time connection deadline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConnectTimeoutOutcome {
    /// The input fails: its turn becomes `failed` (error code `sandbox_error`), the
    /// `environment_connection` action is cleared and the session goes back to `idle`
    /// (with an `agent.session.idle` webhook). The default.
    #[default]
    FailInput,
    /// The whole session fails: status `failed`, `error` set, the turn `failed`, and an
    /// `agent.session.failed` webhook (the `events/sessions/self_hosted.failed.json` story).
    FailSession,
}

/// Configuration of one simulator. Every field is public; start from
/// [`SimConfig::default`] and override what matters. `Debug` redacts the keys and the
/// webhook secret.
#[derive(Clone)]
pub struct SimConfig {
    /// Bearer key required on every `/v1/agents/...` call except the executor endpoints.
    /// Default [`DEFAULT_API_KEY`].
    pub api_key: String,
    /// Restricted key an executor must present as the bearer of
    /// `/v1/cloud/environment/{id}/register` and `/validate` (the `CODEX_API_KEY` the
    /// forwarder holds; the API key is refused there and this key is refused everywhere
    /// else). Default
    /// [`DEFAULT_EXECUTOR_KEY`].
    pub executor_key: String,
    /// Where webhooks are delivered (`POST`); `None` records events without sending them.
    /// Default `None`.
    pub webhook_url: Option<Url>,
    /// Standard Webhooks signing secret (`whsec_<base64>` or raw, at least 16 key bytes).
    /// Default [`DEFAULT_WEBHOOK_SECRET`].
    pub webhook_secret: String,
    /// Simulated seconds per real second; `0.0` makes the clock manual
    /// (`POST /sim/clock/advance`). Default [`DEFAULT_TIME_SCALE`] (60).
    pub time_scale: f64,
    /// Input-time connection deadline in simulated seconds. Default 300.
    pub connect_deadline_secs: f64,
    /// What a missed connection deadline does. Default [`ConnectTimeoutOutcome::FailInput`].
    pub connect_timeout_outcome: ConnectTimeoutOutcome,
    /// How long a running turn takes, in simulated seconds. Default 30.
    pub turn_secs: f64,
    /// The `command` of each turn's `command_execution` item. Default
    /// [`DEFAULT_TURN_COMMAND`].
    pub turn_command: String,
    /// Agent id of sessions created without one. Default [`DEFAULT_AGENT_ID`].
    pub default_agent_id: String,
    /// Extra copies of every delivery (same `webhook-id`, same body); the even-numbered
    /// copies are sent concurrently with the original, the others shortly after. Default 0.
    pub duplicates: u32,
    /// Shuffle short windows (up to 4 deliveries collected within 30 ms) of pending
    /// deliveries with the seeded generator. Default `false` (deliveries are first
    /// attempted in emission order).
    pub reorder: bool,
    /// Extra real delay before each copy's first attempt, drawn uniformly from this range
    /// of milliseconds. Default `0..=0`.
    pub delay_ms: RangeInclusive<u64>,
    /// Seed of the fault generator (delays, reordering). Default 0.
    pub seed: u64,
    /// HTTP attempts per delivery copy, the first one included (at least 1). A copy is
    /// retried on a non-2xx answer or a connection error. Default 8.
    pub max_delivery_attempts: u32,
    /// Real delay before the first retry; doubles per retry up to `retry_max_delay`.
    /// Default 100 ms.
    pub retry_base_delay: Duration,
    /// Largest real delay between retries. Default 2 s.
    pub retry_max_delay: Duration,
    /// Real timeout of one delivery attempt. Default 5 s.
    pub delivery_timeout: Duration,
    /// Port to bind on 127.0.0.1 (`0` = any free port). The simulator never binds any
    /// other address. Default 0.
    pub port: u16,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            api_key: DEFAULT_API_KEY.to_owned(),
            executor_key: DEFAULT_EXECUTOR_KEY.to_owned(),
            webhook_url: None,
            webhook_secret: DEFAULT_WEBHOOK_SECRET.to_owned(),
            time_scale: DEFAULT_TIME_SCALE,
            connect_deadline_secs: DEFAULT_CONNECT_DEADLINE_SECS,
            connect_timeout_outcome: ConnectTimeoutOutcome::FailInput,
            turn_secs: DEFAULT_TURN_SECS,
            turn_command: DEFAULT_TURN_COMMAND.to_owned(),
            default_agent_id: DEFAULT_AGENT_ID.to_owned(),
            duplicates: 0,
            reorder: false,
            delay_ms: 0..=0,
            seed: 0,
            max_delivery_attempts: DEFAULT_MAX_DELIVERY_ATTEMPTS,
            retry_base_delay: DEFAULT_RETRY_BASE_DELAY,
            retry_max_delay: DEFAULT_RETRY_MAX_DELAY,
            delivery_timeout: DEFAULT_DELIVERY_TIMEOUT,
            port: 0,
        }
    }
}

impl fmt::Debug for SimConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimConfig")
            .field("api_key", &"<redacted>")
            .field("executor_key", &"<redacted>")
            .field("webhook_url", &self.webhook_url.as_ref().map(Url::as_str))
            .field("webhook_secret", &"<redacted>")
            .field("time_scale", &self.time_scale)
            .field("connect_deadline_secs", &self.connect_deadline_secs)
            .field("connect_timeout_outcome", &self.connect_timeout_outcome)
            .field("turn_secs", &self.turn_secs)
            .field("turn_command", &self.turn_command)
            .field("default_agent_id", &self.default_agent_id)
            .field("duplicates", &self.duplicates)
            .field("reorder", &self.reorder)
            .field("delay_ms", &self.delay_ms)
            .field("seed", &self.seed)
            .field("max_delivery_attempts", &self.max_delivery_attempts)
            .field("retry_base_delay", &self.retry_base_delay)
            .field("retry_max_delay", &self.retry_max_delay)
            .field("delivery_timeout", &self.delivery_timeout)
            .field("port", &self.port)
            .finish()
    }
}

impl SimConfig {
    /// Sets the bearer API key and the executor key.
    pub fn with_keys(
        mut self,
        api_key: impl Into<String>,
        executor_key: impl Into<String>,
    ) -> Self {
        self.api_key = api_key.into();
        self.executor_key = executor_key.into();
        self
    }

    /// Delivers webhooks to `url`, signed with `secret`.
    pub fn with_webhook(mut self, url: Url, secret: impl Into<String>) -> Self {
        self.webhook_url = Some(url);
        self.webhook_secret = secret.into();
        self
    }

    /// Sets simulated seconds per real second (`0.0` = manual clock).
    pub fn with_time_scale(mut self, time_scale: f64) -> Self {
        self.time_scale = time_scale;
        self
    }

    /// Sets the input-time connection deadline (simulated seconds).
    pub fn with_connect_deadline_secs(mut self, secs: f64) -> Self {
        self.connect_deadline_secs = secs;
        self
    }

    /// Sets [`SimConfig::turn_command`]: the command of every turn (run for real when the
    /// executor's forwarder named a listening executor).
    pub fn with_turn_command(mut self, command: impl Into<String>) -> Self {
        self.turn_command = command.into();
        self
    }

    /// Sets the duration of a running turn (simulated seconds).
    pub fn with_turn_secs(mut self, secs: f64) -> Self {
        self.turn_secs = secs;
        self
    }

    /// Sets the delivery faults: extra copies, reordering and the delay range (ms).
    pub fn with_faults(
        mut self,
        duplicates: u32,
        reorder: bool,
        delay_ms: RangeInclusive<u64>,
    ) -> Self {
        self.duplicates = duplicates;
        self.reorder = reorder;
        self.delay_ms = delay_ms;
        self
    }

    /// Checks the values `spawn` relies on.
    ///
    /// # Errors
    /// A message naming the offending field.
    pub(crate) fn validate(&self) -> Result<(), String> {
        let header_safe = |s: &str| !s.is_empty() && s.bytes().all(|b| (0x21..0x7f).contains(&b));
        if !header_safe(&self.api_key) {
            return Err("api_key must be non-empty visible ASCII without spaces".into());
        }
        if !header_safe(&self.executor_key) {
            return Err("executor_key must be non-empty visible ASCII without spaces".into());
        }
        if self.api_key == self.executor_key {
            return Err(
                "executor_key must differ from api_key (the API key never enters the sandbox)"
                    .into(),
            );
        }
        if !(self.time_scale.is_finite() && self.time_scale >= 0.0) {
            return Err("time_scale must be finite and >= 0".into());
        }
        for (name, v) in [
            ("connect_deadline_secs", self.connect_deadline_secs),
            ("turn_secs", self.turn_secs),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{name} must be finite and >= 0"));
            }
        }
        if self.max_delivery_attempts == 0 {
            return Err("max_delivery_attempts must be at least 1".into());
        }
        if self.delay_ms.start() > self.delay_ms.end() {
            return Err("delay_ms range is empty".into());
        }
        if self.delivery_timeout.is_zero() {
            return Err("delivery_timeout must be greater than zero".into());
        }
        if let Some(url) = &self.webhook_url
            && !matches!(url.scheme(), "http" | "https")
        {
            return Err("webhook_url must be http or https".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_debug_redacts() {
        let c = SimConfig::default();
        assert!(c.validate().is_ok());
        let dbg = format!("{c:?}");
        assert!(!dbg.contains(DEFAULT_API_KEY));
        assert!(!dbg.contains(DEFAULT_EXECUTOR_KEY));
        assert!(!dbg.contains(DEFAULT_WEBHOOK_SECRET));
        assert!(sandbox_core::WebhookVerifier::new(DEFAULT_WEBHOOK_SECRET).is_ok());
    }

    #[test]
    fn rejects_shared_keys_and_bad_numbers() {
        let c = SimConfig::default().with_keys("same", "same");
        assert!(c.validate().unwrap_err().contains("executor_key"));
        let c = SimConfig::default().with_time_scale(f64::NAN);
        assert!(c.validate().is_err());
        let c = SimConfig {
            max_delivery_attempts: 0,
            ..SimConfig::default()
        };
        assert!(c.validate().is_err());
    }
}
