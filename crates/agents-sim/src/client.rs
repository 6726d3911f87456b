//! [`SimClient`]: a small HTTP client for scenarios and tests, covering the simulated
//! Agents API (with the API key and beta header), the executor stand-in (with the executor
//! key) and the `/sim` control endpoints. Keys never appear in `Debug` or errors.

use crate::routes::TURN_ID_HEADER;
use crate::snapshot::{EmittedEvent, SimSnapshot};
use reqwest::{Method, RequestBuilder};
use sandbox_core::environment::EnvironmentInfo;
use sandbox_core::session::{Session, SessionStatus};
use sandbox_core::turn::{Item, Page, Turn};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::fmt;
use std::time::{Duration, Instant};

/// Default per-request timeout of [`SimClient`] (real time).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A failed [`SimClient`] call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The request did not complete (connection refused, timeout, ...). The URL is kept
    /// (it holds no secret); keys travel only in headers.
    #[error("request failed: {0}")]
    Http(#[from] reqwest::Error),
    /// The simulator answered with a non-2xx status.
    #[error("HTTP {status}: {body}")]
    Status {
        /// The status code.
        status: u16,
        /// The response body (an OpenAI error object).
        body: String,
    },
    /// The answer did not decode into the expected model.
    #[error("could not decode the answer: {0}")]
    Decode(#[from] serde_json::Error),
    /// A wait helper ran out of time.
    #[error("timed out: {0}")]
    Timeout(String),
}

impl ClientError {
    /// Whether the simulator answered 404 (unknown or deleted object).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Status { status: 404, .. })
    }

    /// The HTTP status, when there was an answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// The environment of a session to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionEnvironment {
    /// `{type: "self_hosted", workspace_directory}` (default directory `/workspace`).
    SelfHosted {
        /// `workspace_directory`, or `None` for the default.
        workspace_directory: Option<String>,
    },
    /// `{type: "openai_hosted"}`.
    OpenAiHosted,
    /// `{type: "none"}`.
    None,
}

impl SessionEnvironment {
    /// `self_hosted` with the default workspace directory.
    pub fn self_hosted() -> Self {
        Self::SelfHosted {
            workspace_directory: None,
        }
    }

    /// The request's `environment` object.
    pub fn to_json(&self) -> Value {
        match self {
            Self::SelfHosted {
                workspace_directory,
            } => json!({
                "type": "self_hosted",
                "workspace_directory": workspace_directory.as_deref().unwrap_or("/workspace"),
            }),
            Self::OpenAiHosted => json!({"type": "openai_hosted"}),
            Self::None => json!({"type": "none"}),
        }
    }
}

/// HTTP client of one simulator.
#[derive(Clone)]
pub struct SimClient {
    http: reqwest::Client,
    root: String,
    api_key: String,
    executor_key: String,
}

impl fmt::Debug for SimClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimClient")
            .field("root", &self.root)
            .field("api_key", &"<redacted>")
            .field("executor_key", &"<redacted>")
            .finish()
    }
}

impl SimClient {
    /// A client for the simulator at `base_url` (`http://127.0.0.1:PORT/v1`; the root
    /// without `/v1` is accepted too), using `api_key` on agents endpoints and
    /// keeping `executor_key` for the forwarders a test starts ([`Self::executor_key`]).
    /// Proxies are never used.
    pub fn new(base_url: &str, api_key: &str, executor_key: &str) -> Self {
        let trimmed = base_url.trim_end_matches('/');
        let root = trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_owned();
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(CLIENT_TIMEOUT)
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Self {
            http,
            root,
            api_key: api_key.to_owned(),
            executor_key: executor_key.to_owned(),
        }
    }

    /// The simulator root, `http://127.0.0.1:PORT`.
    pub fn root_url(&self) -> &str {
        &self.root
    }

    fn api(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}/v1{path}", self.root))
            .bearer_auth(&self.api_key)
            .header("OpenAI-Beta", "agents=v1")
    }

    /// The executor key this client was built with: what a forwarder it starts presents
    /// at registration (`CODEX_API_KEY`). Never logged.
    pub fn executor_key(&self) -> &str {
        &self.executor_key
    }

    fn control(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, format!("{}{path}", self.root))
    }

    async fn send(req: RequestBuilder) -> Result<reqwest::Response, ClientError> {
        let resp = req.send().await?;
        if resp.status().is_success() {
            Ok(resp)
        } else {
            let status = resp.status().as_u16();
            let body = resp.text().await.unwrap_or_default();
            Err(ClientError::Status { status, body })
        }
    }

    async fn json<T: DeserializeOwned>(req: RequestBuilder) -> Result<T, ClientError> {
        let bytes = Self::send(req).await?.bytes().await?;
        Ok(serde_json::from_slice(&bytes)?)
    }

    /// `POST /v1/agents/sessions` with any body; the raw session JSON.
    ///
    /// # Errors
    /// [`ClientError`] on transport failure or a non-2xx answer.
    pub async fn create_session_json(&self, body: &Value) -> Result<Value, ClientError> {
        Self::json(self.api(Method::POST, "/agents/sessions").json(body)).await
    }

    /// Creates a session with this environment (and no metadata).
    ///
    /// # Errors
    /// [`ClientError`] on transport failure, a non-2xx answer or an undecodable session.
    pub async fn create_session(&self, env: SessionEnvironment) -> Result<Session, ClientError> {
        let v = self
            .create_session_json(&json!({"environment": env.to_json()}))
            .await?;
        Ok(serde_json::from_value(v)?)
    }

    /// `GET /v1/agents/sessions/{id}` as raw JSON.
    ///
    /// # Errors
    /// [`ClientError::Status`] 404 once deleted; see [`ClientError`].
    pub async fn get_session_json(&self, id: &str) -> Result<Value, ClientError> {
        Self::json(self.api(Method::GET, &format!("/agents/sessions/{id}"))).await
    }

    /// `GET /v1/agents/sessions/{id}` parsed with the core model.
    ///
    /// # Errors
    /// As [`SimClient::get_session_json`], plus [`ClientError::Decode`].
    pub async fn get_session(&self, id: &str) -> Result<Session, ClientError> {
        Ok(serde_json::from_value(self.get_session_json(id).await?)?)
    }

    /// Authenticated `GET /v1{path}` (e.g. `/agents/sessions?order=asc`) as raw JSON.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn get_json(&self, path: &str) -> Result<Value, ClientError> {
        Self::json(self.api(Method::GET, path)).await
    }

    /// `DELETE /v1/agents/sessions/{id}`, with an optional `Idempotency-Key`.
    ///
    /// # Errors
    /// [`ClientError::Status`] 404 when already deleted (without a replayed key).
    pub async fn delete_session(
        &self,
        id: &str,
        idempotency_key: Option<&str>,
    ) -> Result<Value, ClientError> {
        let mut req = self.api(Method::DELETE, &format!("/agents/sessions/{id}"));
        if let Some(key) = idempotency_key {
            req = req.header("Idempotency-Key", key);
        }
        Self::json(req).await
    }

    /// Submits one user message (`agent.session.input.message`); returns the created turn's
    /// id (from the simulator's `x-sim-turn-id` header).
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn submit_message(
        &self,
        session_id: &str,
        text: &str,
    ) -> Result<Option<String>, ClientError> {
        let body = json!({"events": [{
            "type": "agent.session.input.message",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": text}]}],
        }]});
        self.submit_events(session_id, &body).await
    }

    /// `POST /v1/agents/sessions/{id}/events` with any body; the created turn id, if any.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn submit_events(
        &self,
        session_id: &str,
        body: &Value,
    ) -> Result<Option<String>, ClientError> {
        let resp = Self::send(
            self.api(
                Method::POST,
                &format!("/agents/sessions/{session_id}/events"),
            )
            .json(body),
        )
        .await?;
        Ok(resp
            .headers()
            .get(TURN_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned))
    }

    /// `GET /v1/agents/environments/{id}`.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn get_environment(
        &self,
        environment_id: &str,
    ) -> Result<EnvironmentInfo, ClientError> {
        Self::json(self.api(
            Method::GET,
            &format!("/agents/environments/{environment_id}"),
        ))
        .await
    }

    /// The first 100 turns of a session, oldest first.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn list_turns(&self, session_id: &str) -> Result<Page<Turn>, ClientError> {
        Self::json(self.api(
            Method::GET,
            &format!("/agents/sessions/{session_id}/turns?order=asc&limit=100"),
        ))
        .await
    }

    /// The first 100 items of a turn, oldest first.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn list_turn_items(
        &self,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Page<Item>, ClientError> {
        Self::json(self.api(
            Method::GET,
            &format!("/agents/sessions/{session_id}/turns/{turn_id}/items?order=asc&limit=100"),
        ))
        .await
    }

    /// Opens a simulated executor connection (`POST /sim/environments/{id}/connect`: the
    /// environment is `connected`, no command really runs); returns the connection id.
    ///
    /// # Errors
    /// [`ClientError::Status`] 404 for an unknown or deleted environment.
    pub async fn connect(&self, environment_id: &str) -> Result<String, ClientError> {
        let v: Value = Self::json(self.control(
            Method::POST,
            &format!("/sim/environments/{environment_id}/connect"),
        ))
        .await?;
        Ok(v.get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned())
    }

    /// Closes one simulated connection, or every simulated connection when
    /// `connection_id` is `None` (a relay socket closes only with its forwarder, or
    /// through [`Self::drop_executor`]).
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn disconnect(
        &self,
        environment_id: &str,
        connection_id: Option<&str>,
    ) -> Result<(), ClientError> {
        let body = json!({"connection_id": connection_id});
        Self::send(
            self.control(
                Method::POST,
                &format!("/sim/environments/{environment_id}/disconnect"),
            )
            .json(&body),
        )
        .await?;
        Ok(())
    }

    /// Closes every rendezvous socket of the environment from the simulator's side and
    /// keeps refusing new ones with 503 (`POST /sim/environments/{id}/drop-executor`), as
    /// a lost network would while the executor process lives on; returns how many were
    /// open.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn drop_executor(&self, environment_id: &str) -> Result<u64, ClientError> {
        let v: Value = Self::json(self.control(
            Method::POST,
            &format!("/sim/environments/{environment_id}/drop-executor"),
        ))
        .await?;
        Ok(v.get("dropped").and_then(Value::as_u64).unwrap_or_default())
    }

    /// `POST /sim/sessions/{id}/fail` (webhook `agent.session.failed`).
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn fail_session(
        &self,
        session_id: &str,
        error: Option<&str>,
    ) -> Result<(), ClientError> {
        let body = match error {
            Some(e) => json!({"error": e}),
            None => json!({}),
        };
        Self::send(
            self.control(Method::POST, &format!("/sim/sessions/{session_id}/fail"))
                .json(&body),
        )
        .await?;
        Ok(())
    }

    /// `POST /sim/sessions/{id}/function_call`; returns the required action.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn require_function_call(&self, session_id: &str) -> Result<Value, ClientError> {
        Self::json(
            self.control(
                Method::POST,
                &format!("/sim/sessions/{session_id}/function_call"),
            )
            .json(&json!({})),
        )
        .await
    }

    /// `POST /sim/clock/advance`.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn advance_clock(&self, secs: f64) -> Result<(), ClientError> {
        Self::send(
            self.control(Method::POST, "/sim/clock/advance")
                .json(&json!({"secs": secs})),
        )
        .await?;
        Ok(())
    }

    /// `POST /sim/webhooks/emit`.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn emit_webhook(&self, kind: &str, data: Value) -> Result<EmittedEvent, ClientError> {
        Self::json(
            self.control(Method::POST, "/sim/webhooks/emit")
                .json(&json!({"type": kind, "data": data})),
        )
        .await
    }

    /// `GET /sim/state`.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn state(&self) -> Result<SimSnapshot, ClientError> {
        Self::json(self.control(Method::GET, "/sim/state")).await
    }

    /// Polls the session every 20 ms (real time) until it has `status`, at most `timeout`.
    ///
    /// # Errors
    /// [`ClientError::Timeout`] naming the last status seen; any retrieval error.
    pub async fn wait_for_status(
        &self,
        session_id: &str,
        status: SessionStatus,
        timeout: Duration,
    ) -> Result<Session, ClientError> {
        let start = Instant::now();
        loop {
            let s = self.get_session(session_id).await?;
            if s.status == status {
                return Ok(s);
            }
            if start.elapsed() > timeout {
                return Err(ClientError::Timeout(format!(
                    "session {session_id} still {:?} after {timeout:?}, wanted {status:?}",
                    s.status
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
