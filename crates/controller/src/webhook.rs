//! The webhook intake: verify the raw bytes, keep the events that matter, enqueue, answer.
//!
//! Answers (STYLE.md: handler errors are values that become responses, never crashes):
//! - 200 `{"status":"queued"}` only after the queue durably accepted the job, or
//!   `{"status":"ignored"}` for verified events that do not concern compute (unknown types
//!   included: agents-api.md says they must be accepted and ignored);
//! - 400 missing/duplicate/invalid headers or a malformed body; 401 failed signature or
//!   timestamp window; 413 a body over the limit (1 MiB by default) — none of them ever
//!   reaches the queue;
//! - 503 when the queue write fails: the sender retries, nothing is lost.

use crate::job::Job;
use crate::ports::{Clock, Outgoing, Queue};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use sandbox_core::event::{AgentEvent, RequiredActionType};
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::{ProvisionOn, Trigger};
use sandbox_core::webhook::WebhookVerifier;
use serde_json::json;
use std::sync::Arc;

/// Default maximum body size, bytes (1 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;

/// The webhook intake: a verifier, the events queue and a clock.
pub struct Intake<Q> {
    verifier: WebhookVerifier,
    queue: Q,
    clock: Arc<dyn Clock>,
    max_body_bytes: usize,
    provision_on: ProvisionOn,
}

/// An HTTP answer: status code and JSON body.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// JSON body: `{"status": ...}` on success, `{"error": ...}` otherwise.
    pub body: serde_json::Value,
}

impl Answer {
    fn ok(status: &str, detail: impl Into<String>) -> Self {
        Self {
            status: 200,
            body: json!({"status": status, "detail": detail.into()}),
        }
    }
    fn error(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            body: json!({"error": message.into()}),
        }
    }
}

/// What to do with a verified event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// Enqueue a job with this trigger.
    Keep {
        /// The trigger.
        trigger: Trigger,
        /// The session.
        session_id: SessionId,
        /// The environment, when the event names it.
        environment_id: Option<EnvironmentId>,
    },
    /// Accept (2xx) and drop.
    Drop(&'static str),
}

/// Keeps `action_required` with `environment_connection`, `failed`, `idle` (a shutdown
/// hint) and `in_progress` (cancels a pending stop) of self-hosted sessions; drops the
/// rest (other action types, `created`, environment events, unknown types). The routing
/// of a deployment that provisions on connection requests (the default); see
/// [`route_with`].
pub fn route(event: &AgentEvent) -> Route {
    route_with(event, ProvisionOn::ConnectionRequest)
}

/// As [`route`], and with [`ProvisionOn::Created`] also keeps `agent.session.created` of a
/// self-hosted session as [`Trigger::SessionCreated`] (the payload names the
/// environment and `connect.remote_url`; the worker still retrieves the session before
/// starting anything).
pub fn route_with(event: &AgentEvent, provision_on: ProvisionOn) -> Route {
    if let AgentEvent::SessionCreated(d) = event
        && provision_on == ProvisionOn::Created
    {
        if d.environment_type != "self_hosted" {
            return Route::Drop("not a self_hosted session");
        }
        return Route::Keep {
            trigger: Trigger::SessionCreated,
            session_id: d.id.clone(),
            environment_id: d.environment_id.clone(),
        };
    }
    let keep = |trigger, d: &sandbox_core::event::SessionStateChanged| {
        if d.environment_type != "self_hosted" {
            return Route::Drop("not a self_hosted session");
        }
        Route::Keep {
            trigger,
            session_id: d.id.clone(),
            environment_id: d.environment_id.clone(),
        }
    };
    match event {
        AgentEvent::SessionActionRequired(d) => match d.required_action.kind {
            RequiredActionType::EnvironmentConnection => Route::Keep {
                trigger: Trigger::ConnectionRequested,
                session_id: d.id.clone(),
                environment_id: None,
            },
            _ => Route::Drop("required action is not environment_connection"),
        },
        AgentEvent::SessionFailed(d) => keep(Trigger::Failed, d),
        AgentEvent::SessionIdle(d) => keep(Trigger::Idle, d),
        AgentEvent::SessionInProgress(d) => keep(Trigger::TurnStarted, d),
        AgentEvent::SessionCreated(_) => Route::Drop("session created: nothing to run yet"),
        AgentEvent::EnvironmentReady(_)
        | AgentEvent::EnvironmentFailed(_)
        | AgentEvent::EnvironmentSuspended(_)
        | AgentEvent::EnvironmentExpired(_) => Route::Drop("environment event"),
        AgentEvent::Unknown { .. } => Route::Drop("unknown event type"),
    }
}

impl<Q: Queue> Intake<Q> {
    /// An intake over `queue` (the events queue, FIFO).
    pub fn new(verifier: WebhookVerifier, queue: Q, clock: Arc<dyn Clock>) -> Self {
        Self {
            verifier,
            queue,
            clock,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            provision_on: ProvisionOn::default(),
        }
    }

    /// Sets when the deployment provisions: with [`ProvisionOn::Created`] the
    /// intake keeps `agent.session.created` of self-hosted sessions ([`route_with`]).
    pub fn with_provision_on(mut self, provision_on: ProvisionOn) -> Self {
        self.provision_on = provision_on;
        self
    }

    /// Sets the body limit, bytes.
    pub fn with_max_body_bytes(mut self, max: usize) -> Self {
        self.max_body_bytes = max;
        self
    }

    /// The events queue.
    pub fn queue(&self) -> &Q {
        &self.queue
    }

    /// Handles one delivery: `headers` (any case) and the raw `body` bytes.
    /// Never panics; see the module docs for the answers.
    pub async fn accept_delivery<'a, I>(&self, headers: I, body: &[u8]) -> Answer
    where
        I: IntoIterator<Item = (&'a str, &'a [u8])>,
    {
        if body.len() > self.max_body_bytes {
            crate::metrics::webhook_rejected("too_large");
            return Answer::error(413, "body exceeds the size limit");
        }
        let now = self.clock.now();
        let verified = match self.verifier.verify(headers, body, now) {
            Ok(v) => v,
            Err(e) => {
                // Debug, not warn: anyone can send unsigned POSTs, so a warn per
                // rejection lets a flood fill the logs; the metric counts every one.
                tracing::debug!(error = %e, "webhook rejected");
                crate::metrics::webhook_rejected(if e.http_status() == 401 {
                    "signature"
                } else {
                    "headers"
                });
                return Answer::error(e.http_status(), e.to_string());
            }
        };
        let event = match AgentEvent::from_body(body) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(webhook_id = %verified.webhook_id, what = %e.what, "malformed event");
                crate::metrics::webhook_rejected("malformed");
                return Answer::error(400, format!("malformed {}", e.what));
            }
        };
        let (trigger, session_id, environment_id) = match route_with(&event, self.provision_on) {
            Route::Keep {
                trigger,
                session_id,
                environment_id,
            } => (trigger, session_id, environment_id),
            Route::Drop(why) => {
                tracing::debug!(webhook_id = %verified.webhook_id, why, "webhook ignored");
                crate::metrics::webhook_ignored();
                return Answer::ok("ignored", why);
            }
        };
        let job = Job {
            handoffs: 0,
            swept: None,
            operator_proof: None,
            trigger,
            session_id,
            environment_id,
            webhook_id: Some(verified.webhook_id.clone()),
            enqueued_at: now,
        };
        let msg = Outgoing {
            dedup_id: verified.webhook_id.clone(),
            group: job.group().to_owned(),
            job,
            delay_secs: 0,
        };
        let session = msg.group.clone();
        match self.queue.send(msg).await {
            Ok(sent) => {
                tracing::info!(webhook_id = %verified.webhook_id, session_id = %session, ?sent, "webhook queued");
                crate::metrics::webhook_accepted();
                Answer::ok("queued", format!("{sent:?}").to_lowercase())
            }
            Err(e) => {
                tracing::error!(webhook_id = %verified.webhook_id, error = %e, "queue write failed");
                crate::metrics::webhook_rejected("queue_unavailable");
                Answer::error(503, "queue unavailable; retry")
            }
        }
    }
}

/// The webhook endpoint as an axum router: `POST /` and `POST /webhook`. Used by the
/// Lambda (through lambda_http) and by local mode alike.
pub fn router<Q: Queue>(intake: Arc<Intake<Q>>) -> Router {
    let limit = intake.max_body_bytes;
    Router::new()
        .route("/", post(handle::<Q>))
        .route("/webhook", post(handle::<Q>))
        // One byte over our own limit, so our 413 answers first and consistently.
        .layer(DefaultBodyLimit::max(limit.saturating_add(1)))
        .with_state(intake)
}

async fn handle<Q: Queue>(
    State(intake): State<Arc<Intake<Q>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let pairs: Vec<(&str, &[u8])> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_bytes()))
        .collect();
    let answer = intake.accept_delivery(pairs, &body).await;
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(answer.body)).into_response()
}
