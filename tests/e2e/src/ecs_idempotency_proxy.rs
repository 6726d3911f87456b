//! A pass-through proxy in front of moto that gives ECS `RunTask` its documented
//! idempotency, which moto does not implement (shared/reference/moto.md: "RunTask ignores
//! `clientToken`: the same token starts a new task").
//!
//! ECS: "If you use the same client token with the same parameters, the same task is
//! returned for 24 hours" (ECS API reference, RunTask `clientToken`; "Ensuring
//! idempotency"). The controller relies on it to recover a start whose worker died before
//! the record (the next holder replays the start with the same token). Every request is
//! forwarded unchanged to moto (all services share its endpoint); a `RunTask` whose
//! `clientToken` was answered before gets that first answer again, without reaching moto.
//! Every ECS request is also recorded as sent ([`EcsIdempotencyProxy::ecs_requests`]), so a
//! test of a separate process (`sandboxctl --backend aws`) can assert its request shapes.
//! Only 127.0.0.1; the server lives as long as the tokio runtime.

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

const RUN_TASK_TARGET: &str = "AmazonEC2ContainerServiceV20141113.RunTask";
/// The `X-Amz-Target` prefix of every ECS operation (JSON 1.1 protocol).
const ECS_TARGET_PREFIX: &str = "AmazonEC2ContainerServiceV20141113.";

/// One recorded ECS request: the operation (`RunTask`, ...) and its JSON body.
pub type EcsRequest = (String, serde_json::Value);

/// The proxy's address and what it replayed.
pub struct EcsIdempotencyProxy {
    /// `http://127.0.0.1:PORT`: the endpoint to give the AWS SDK.
    pub url: String,
    /// How many `RunTask` calls were answered from the first answer of their token.
    pub replays: Arc<Mutex<usize>>,
    requests: Arc<Mutex<Vec<EcsRequest>>>,
}

/// A first answer: HTTP status, content type, body.
type Answer = (u16, String, Bytes);

#[derive(Clone)]
struct State {
    upstream: String,
    client: reqwest::Client,
    answers: Arc<Mutex<HashMap<String, Answer>>>,
    replays: Arc<Mutex<usize>>,
    requests: Arc<Mutex<Vec<EcsRequest>>>,
}

async fn forward(
    axum::extract::State(s): axum::extract::State<State>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(op) = headers
        .get("x-amz-target")
        .and_then(|t| t.to_str().ok())
        .and_then(|t| t.strip_prefix(ECS_TARGET_PREFIX))
    {
        let body = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
        s.requests.lock().unwrap().push((op.to_owned(), body));
    }
    let run_task = headers
        .get("x-amz-target")
        .is_some_and(|t| t.as_bytes() == RUN_TASK_TARGET.as_bytes());
    let token = run_task
        .then(|| serde_json::from_slice::<serde_json::Value>(&body).ok())
        .flatten()
        .and_then(|v| v["clientToken"].as_str().map(str::to_owned));
    if let Some(token) = &token {
        let cached = s.answers.lock().unwrap().get(token).cloned();
        if let Some((status, content_type, body)) = cached {
            *s.replays.lock().unwrap() += 1;
            return (
                StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
                [("content-type", content_type)],
                body,
            )
                .into_response();
        }
    }
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = s
        .client
        .request(method, format!("{}{path}", s.upstream))
        .body(body);
    for (name, value) in &headers {
        if !matches!(name.as_str(), "host" | "content-length" | "connection") {
            request = request.header(name, value);
        }
    }
    let answer = match request.send().await {
        Ok(a) => a,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let status = answer.status().as_u16();
    let content_type = answer
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/x-amz-json-1.1")
        .to_owned();
    let body = answer.bytes().await.unwrap_or_default();
    if let Some(token) = token
        && status == 200
    {
        s.answers
            .lock()
            .unwrap()
            .insert(token, (status, content_type.clone(), body.clone()));
    }
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        [("content-type", content_type)],
        body,
    )
        .into_response()
}

impl EcsIdempotencyProxy {
    /// Starts the proxy for `upstream` (moto's endpoint) on an ephemeral port.
    ///
    /// # Errors
    /// No local port could be bound.
    pub async fn start(upstream: &str) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let replays = Arc::new(Mutex::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let state = State {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client: reqwest::Client::new(),
            answers: Arc::default(),
            replays: replays.clone(),
            requests: requests.clone(),
        };
        let app = axum::Router::new().fallback(forward).with_state(state);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            url,
            replays,
            requests,
        })
    }

    /// Every ECS request that reached the proxy, in order: the operation (`X-Amz-Target`
    /// without the service prefix) and the JSON body (`null` when it was not JSON).
    pub fn ecs_requests(&self) -> Vec<EcsRequest> {
        self.requests.lock().unwrap().clone()
    }
}
