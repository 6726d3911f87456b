//! A scripted Agents API stand-in on 127.0.0.1 (axum), and fixtures.
#![allow(dead_code)]

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use sandbox_agents_api::{AgentsClient, ClientConfig, RetryPolicy};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The API key every test uses; it must never show up in any output.
pub const SECRET: &str = "sk-proj-TEST-SECRET-3f9c2a7be1d04";

/// One scripted response.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    pub delay: Duration,
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Self {
        Self {
            status,
            headers: vec![("content-type", "application/json".to_owned())],
            body: body.to_string(),
            delay: Duration::ZERO,
        }
    }

    pub fn raw(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.to_owned(),
            delay: Duration::ZERO,
        }
    }

    pub fn error(status: u16) -> Self {
        Self::json(
            status,
            json!({"error": {"message": "scripted failure", "type": "server_error"}}),
        )
    }

    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }

    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// What the server saw of one request.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub headers: HeaderMap,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

#[derive(Default)]
struct Shared {
    script: Mutex<Vec<Reply>>,
    seen: Mutex<Vec<Seen>>,
}

/// A server answering every request with the next scripted reply; the last reply repeats.
pub struct TestServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl TestServer {
    pub async fn start(script: Vec<Reply>) -> Self {
        assert!(!script.is_empty());
        let shared = Arc::new(Shared {
            script: Mutex::new(script),
            seen: Mutex::default(),
        });
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        assert!(addr.ip().is_loopback());
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { addr, shared }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.shared.seen.lock().unwrap().len()
    }
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    shared.seen.lock().unwrap().push(Seen {
        method: req.method().to_string(),
        path: req.uri().path().to_owned(),
        query: req.uri().query().map(str::to_owned),
        headers: req.headers().clone(),
    });
    let reply = {
        let mut script = shared.script.lock().unwrap();
        if script.len() > 1 {
            script.remove(0)
        } else {
            script[0].clone()
        }
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut response = Response::new(Body::from(reply.body));
    *response.status_mut() = StatusCode::from_u16(reply.status).unwrap();
    for (name, value) in reply.headers {
        response.headers_mut().insert(
            HeaderName::from_static(name),
            HeaderValue::from_str(&value).unwrap(),
        );
    }
    response
}

/// Fast retry settings for tests: `max_attempts` attempts, 10 ms .. 40 ms, no jitter.
pub fn fast_retry(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        min_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(40),
        max_retry_after: Duration::from_secs(5),
        jitter: false,
    }
}

pub fn config(base_url: String, retry: RetryPolicy) -> ClientConfig {
    ClientConfig {
        base_url,
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(3),
        retry,
        ..ClientConfig::new(SECRET)
    }
}

pub fn client(server: &TestServer, max_attempts: u32) -> AgentsClient {
    AgentsClient::new(config(server.base_url(), fast_retry(max_attempts))).unwrap()
}

/// A realistic `agent.session` waiting for its self-hosted executor to connect. Its shape
/// was checked against the official Python SDK 3.51.0 models (`AgentSession`,
/// `EnvironmentInfo`, `Turn`, `AgentSessionItem` validate these fixtures).
pub fn session_json(id: &str) -> Value {
    json!({
        "id": id,
        "object": "agent.session",
        "agent": {
            "id": "agent_68a1c0ffee",
            "model": "gpt-5.2",
            "name": "coder",
            "instructions": "You are a careful coding agent.",
            "multi_agent": {"enabled": false},
            "reasoning": {"effort": "medium", "summary": "auto"},
            "service_tier": "auto",
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tools": []
        },
        "created_at": 1_789_000_000,
        "last_active_at": 1_789_000_420,
        "status": "requires_action",
        "required_actions": [
            {"type": "environment_connection", "environment_id": "env_7d2f"}
        ],
        "environment": {
            "type": "self_hosted",
            "id": "env_7d2f",
            "remote_url": "wss://agents.example.invalid/v1/env_7d2f/connect?ticket=abc",
            "workspace_directory": "/workspace",
            "capability_directories": []
        },
        "metadata": {"owner": "team-a"},
        "error": null,
        "vault_ids": [],
        "usage": {
            "input_tokens": 1200,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 340,
            "output_tokens_details": {"reasoning_tokens": 100},
            "total_tokens": 1540
        }
    })
}

/// An `agent.environment`.
pub fn environment_json(id: &str, status: &str) -> Value {
    json!({
        "id": id,
        "object": "agent.environment",
        "type": "self_hosted",
        "status": status,
        "files": [],
        "plugins": [],
        "skills": []
    })
}

/// An `agent.session.turn`.
pub fn turn_json(id: &str, session: &str, status: &str, created_at: i64) -> Value {
    json!({
        "id": id,
        "object": "agent.session.turn",
        "agent_id": "agent_68a1c0ffee",
        "session_id": session,
        "status": status,
        "created_at": created_at,
        "started_at": created_at + 1,
        "completed_at": null,
        "error": null
    })
}
