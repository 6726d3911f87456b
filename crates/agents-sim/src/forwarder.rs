//! The executor side of the relay, as `codex exec-server forward` does it: register, hold
//! the rendezvous WebSocket, answer the harness's Noise handshakes as the **responder**,
//! and pass each stream's JSON-RPC to a listening executor (`--connect`). The
//! `sim-executor` stand-in runs this, so swapping it for the pinned codex changes speed,
//! not behaviour.
//!
//! Source: ../shared/reference/executor-protocol.md, "Registration and rendezvous", 1–6:
//!
//! 1. `POST {remote}/cloud/environment/{id}/register` (bearer = the executor key) with
//!    fresh static keys; the answer's `environment_id` must be the one asked for, else
//!    [`ForwardError::Protocol`]. 401/403 are [`ForwardError::Authentication`], any other
//!    status [`ForwardError::Refused`], no answer [`ForwardError::Unreachable`]. Nothing is
//!    retried: the pinned codex 0.171.0 exits 1 at the first failed registration
//!    (measured against it: 401, 404, 503 and a refused connection).
//! 2. Open the answer's `url` as a plain WebSocket; an upgrade refused with 4xx registers
//!    again; a socket that closes is reopened with a 1–30 s doubling backoff.
//! 3. Per stream (`Resume` then `Handshake{msg1}`): read msg1 with the stream's prologue,
//!    ask `POST {remote}/cloud/environment/{id}/validate` (header
//!    `x-codex-noise-stream-id`, body `{executor_registration_id, harness_public_key,
//!    harness_key_authorization}`); on `{valid: true}` answer `Handshake{msg2}` and open a
//!    WebSocket to `--connect`, else `Reset{"noise_relay_protocol_error"}`.
//! 4. Then `RelayData{seq}` records ⇄ binary WebSocket messages, one JSON-RPC message
//!    each (the plaintext framing is [`crate::noise_session`]'s).

use crate::noise_session::{self, Reassembler, StaticKeys};
use crate::relay_frame::{Body, Frame};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

/// First and largest delay before reopening a closed rendezvous socket (as codex).
const RECONNECT_DELAYS: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30));
/// Timeout of one HTTP request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The reset reason codex sends for a stream it refuses.
pub const PROTOCOL_ERROR: &str = "noise_relay_protocol_error";

/// What the forwarder needs: the `--remote` base (`http://127.0.0.1:PORT/v1`), the
/// environment, the executor key and the listening executor (`ws://127.0.0.1:PORT`).
#[derive(Clone)]
pub struct ForwardConfig {
    /// The registry base the session's `remote_url` names.
    pub remote: String,
    /// The environment to register for.
    pub environment_id: String,
    /// The executor key (bearer of registration and validation); never printed.
    pub key: String,
    /// The listening executor each stream is passed to.
    pub connect: String,
}

impl std::fmt::Debug for ForwardConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardConfig")
            .field("remote", &self.remote)
            .field("environment_id", &self.environment_id)
            .field("connect", &self.connect)
            .finish_non_exhaustive()
    }
}

/// Why the forwarder stopped. The texts follow the pinned codex's (measured:
/// `environment registry authentication failed (401 Unauthorized): <error.message>`).
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// Registration answered 401 or 403: the key is not accepted.
    #[error("environment registry authentication failed ({status}): {message}")]
    Authentication {
        /// The HTTP status with its reason, e.g. `401 Unauthorized`.
        status: String,
        /// The API's `error.message`.
        message: String,
    },
    /// Registration answered another status (404: unknown environment).
    #[error("environment registry request failed ({status}): {message}")]
    Refused {
        /// The HTTP status with its reason, e.g. `404 Not Found`.
        status: String,
        /// The API's `error.message`.
        message: String,
    },
    /// The registry did not answer.
    #[error("environment registry request failed: {0}")]
    Unreachable(String),
    /// An answer without the expected fields, or keys that could not be made.
    #[error("environment registry protocol error: {0}")]
    Protocol(String),
}

struct Registered {
    url: String,
    registration_id: String,
}

struct Ctx {
    http: reqwest::Client,
    cfg: ForwardConfig,
    keys: StaticKeys,
    registration_id: String,
}

fn endpoint(cfg: &ForwardConfig, what: &str) -> String {
    format!(
        "{}/cloud/environment/{}/{what}",
        cfg.remote.trim_end_matches('/'),
        cfg.environment_id
    )
}

async fn error_message(resp: reqwest::Response) -> String {
    let body: Value = resp.json().await.unwrap_or_default();
    body.pointer("/error/message")
        .and_then(Value::as_str)
        .unwrap_or("no error message")
        .to_owned()
}

async fn register(
    http: &reqwest::Client,
    cfg: &ForwardConfig,
    keys: &StaticKeys,
) -> Result<Registered, ForwardError> {
    let body = json!({
        "security_profile": crate::registration::SECURITY_PROFILE,
        "executor_public_key": noise_session::public_key_json(&keys.x25519_public(), &keys.mlkem_public()),
    });
    let resp = http
        .post(endpoint(cfg, "register"))
        .bearer_auth(&cfg.key)
        .json(&body)
        .send()
        .await
        .map_err(|e| ForwardError::Unreachable(e.without_url().to_string()))?;
    let code = resp.status();
    if !code.is_success() {
        let status = code.to_string();
        let message = error_message(resp).await;
        return Err(if matches!(code.as_u16(), 401 | 403) {
            ForwardError::Authentication { status, message }
        } else {
            ForwardError::Refused { status, message }
        });
    }
    let v: Value = resp
        .json()
        .await
        .map_err(|e| ForwardError::Protocol(e.without_url().to_string()))?;
    let field = |name: &str| {
        v.get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| ForwardError::Protocol(format!("registration answer lacks {name}")))
    };
    if field("environment_id")? != cfg.environment_id {
        return Err(ForwardError::Protocol(
            "registration answered for another environment".to_owned(),
        ));
    }
    Ok(Registered {
        url: field("url")?,
        registration_id: field("executor_registration_id")?,
    })
}

/// Runs the forwarder until registration fails for good; `on_connected` is called each
/// time a rendezvous socket opens (for logs).
///
/// # Errors
/// See [`ForwardError`]; a closed socket is reopened, not an error.
pub async fn run(cfg: ForwardConfig, on_connected: impl Fn(&str)) -> Result<(), ForwardError> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| ForwardError::Protocol(e.to_string()))?;
    let keys = StaticKeys::generate().map_err(ForwardError::Protocol)?;
    loop {
        let reg = register(&http, &cfg, &keys).await?;
        let ctx = Arc::new(Ctx {
            http: http.clone(),
            cfg: cfg.clone(),
            keys: keys.clone(),
            registration_id: reg.registration_id.clone(),
        });
        let mut delay = RECONNECT_DELAYS.0;
        loop {
            match tokio_tungstenite::connect_async(reg.url.as_str()).await {
                Ok((ws, _)) => {
                    delay = RECONNECT_DELAYS.0;
                    on_connected(&reg.registration_id);
                    serve(ctx.clone(), ws).await;
                }
                Err(tokio_tungstenite::tungstenite::Error::Http(resp))
                    if resp.status().is_client_error() =>
                {
                    break; // the registration is gone: register again
                }
                Err(e) => tracing::warn!(error = %e, "rendezvous connect failed"),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(RECONNECT_DELAYS.1);
        }
    }
}

type ClientWs =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One rendezvous socket: routes frames to per-stream tasks until it closes.
async fn serve(ctx: Arc<Ctx>, ws: ClientWs) {
    let (mut sink, mut incoming) = ws.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Frame>(256);
    let mut streams: HashMap<String, mpsc::Sender<Body>> = HashMap::new();
    loop {
        tokio::select! {
            msg = incoming.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    let Ok(frame) = Frame::decode(&b) else { continue };
                    streams.retain(|_, tx| !tx.is_closed());
                    let tx = streams.entry(frame.stream_id.clone()).or_insert_with(|| {
                        let (tx, rx) = mpsc::channel(256);
                        tokio::spawn(stream(ctx.clone(), frame.stream_id.clone(), rx, out_tx.clone()));
                        tx
                    });
                    let _ = tx.send(frame.body).await;
                }
                Some(Ok(Message::Close(_)) | Err(_)) | None => return,
                Some(Ok(_)) => {}
            },
            Some(frame) = out_rx.recv() => {
                if sink.send(Message::Binary(frame.encode().into())).await.is_err() {
                    return;
                }
            }
        }
    }
}

async fn validate(
    ctx: &Ctx,
    stream_id: &str,
    harness: Option<(Vec<u8>, Vec<u8>)>,
    auth: &[u8],
) -> bool {
    let harness_public_key =
        harness.map_or(Value::Null, |(x, k)| noise_session::public_key_json(&x, &k));
    let body = json!({
        "executor_registration_id": ctx.registration_id,
        "harness_public_key": harness_public_key,
        "harness_key_authorization": String::from_utf8_lossy(auth),
    });
    let resp = ctx
        .http
        .post(endpoint(&ctx.cfg, "validate"))
        .bearer_auth(&ctx.cfg.key)
        .header("x-codex-noise-stream-id", stream_id)
        .json(&body)
        .send()
        .await;
    match resp {
        Ok(r) if r.status().is_success() => r
            .json::<Value>()
            .await
            .is_ok_and(|v| v.get("valid") == Some(&Value::Bool(true))),
        _ => false,
    }
}

/// One stream: handshake (responder), validation, then the relay to the listener.
async fn stream(
    ctx: Arc<Ctx>,
    stream_id: String,
    mut rx: mpsc::Receiver<Body>,
    out: mpsc::Sender<Frame>,
) {
    let send = |body: Body| {
        let out = out.clone();
        let stream_id = stream_id.clone();
        async move { out.send(Frame { stream_id, body }).await.is_ok() }
    };
    let msg1 = loop {
        match rx.recv().await {
            Some(Body::Handshake { payload }) => break payload,
            Some(Body::Reset { .. }) | None => return,
            Some(_) => {}
        }
    };
    let prologue =
        noise_session::prologue(&ctx.cfg.environment_id, &ctx.registration_id, &stream_id);
    let accepted = async {
        let mut hs = noise_session::responder(ctx.keys.clone(), &prologue).ok()?;
        let auth = noise_session::read(&mut hs, &msg1).ok()?;
        if !validate(&ctx, &stream_id, noise_session::remote_static(&hs), &auth).await {
            return None;
        }
        let msg2 = noise_session::write(&mut hs, &[]).ok()?;
        let transport = noise_session::finish(hs).ok()?;
        let (ws, _) = tokio_tungstenite::connect_async(ctx.cfg.connect.as_str())
            .await
            .ok()?;
        Some((msg2, transport, ws))
    };
    let Some((msg2, mut transport, ws)) = accepted.await else {
        send(Body::Reset {
            reason: PROTOCOL_ERROR.to_owned(),
        })
        .await;
        return;
    };
    if !send(Body::Handshake { payload: msg2 }).await {
        return;
    }
    let (mut to_exec, mut from_exec) = ws.split();
    let (mut send_seq, mut recv_seq) = (0u64, 0u64);
    let mut reassembler = Reassembler::default();
    loop {
        tokio::select! {
            body = rx.recv() => match body {
                Some(Body::Data { seq, payload }) if seq == recv_seq => {
                    recv_seq += 1;
                    let Ok(plain) = transport.receive_vec(&payload) else { break };
                    let mut open = true;
                    for m in reassembler.push(&plain) {
                        open = open && to_exec.send(Message::Binary(m.into())).await.is_ok();
                    }
                    if !open {
                        break;
                    }
                }
                Some(Body::Reset { .. }) | None => {
                    let _ = to_exec.close().await;
                    return;
                }
                Some(_) => {}
            },
            msg = from_exec.next() => {
                let bytes = match msg {
                    Some(Ok(Message::Text(t))) => t.as_bytes().to_vec(),
                    Some(Ok(Message::Binary(b))) => b.to_vec(),
                    Some(Ok(_)) => continue,
                    Some(Err(_)) | None => break,
                };
                for rec in noise_session::records(&bytes) {
                    let Ok(payload) = transport.send_vec(&rec) else { return };
                    if !send(Body::Data { seq: send_seq, payload }).await {
                        return;
                    }
                    send_seq += 1;
                }
            }
        }
    }
    send(Body::Reset {
        reason: "closed".to_owned(),
    })
    .await;
}
