//! The rendezvous WebSocket of a registration and the simulator as the Noise **initiator**
//! (the harness) over it.
//!
//! Source: ../shared/reference/executor-protocol.md, "Registration and rendezvous", 2–6.
//! The executor opens `ws://127.0.0.1:PORT/v1/cloud/rendezvous/{token}` (the URL from
//! [`crate::registration`] is the capability; no auth header). While that socket is up the
//! environment has one open *connection* (`conn_...`): it is `connected`, and it becomes
//! `disconnected` when the last socket drops; a drop while a turn runs fails the turn's
//! command item and completes the turn (agents-api.md), as before.
//!
//! A turn's command runs through the socket: the harness opens a stream (`Resume{}` then
//! `Handshake{msg1}` whose payload is an authorization token the executor checks with
//! `/validate`), reads `Handshake{msg2}` (or `Reset`), then exchanges `RelayData{seq}`
//! records of `u32 BE length ‖ JSON-RPC`; the JSON-RPC itself (`initialize`,
//! `initialized`, `process/start`, `process/read`) is [`crate::exec_protocol`]'s.
//! `POST /sim/environments/{id}/drop-executor` (no auth, loopback) closes every rendezvous
//! socket of an environment and cuts it off: its upgrades answer 503 from then on, so a
//! forwarder that lives on retries without reconnecting (a network partition; the
//! executor process keeps running).

use crate::exec_protocol::Pipe;
use crate::noise_session::{self, Reassembler, StaticKeys};
use crate::relay_frame::{Body, Frame};
use crate::state::SimState;
use crate::state::relays::{Issued, OpenStream, Registration, Socket, relays};
use crate::turns::{ensure_driver, step};
use axum::Json;
use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::{SinkExt, StreamExt};
use sandbox_core::environment::EnvironmentStatus;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, mpsc};

/// Routes: the rendezvous socket and the drop knob.
pub(crate) fn routes() -> Router<SimState> {
    Router::new()
        .route("/v1/cloud/rendezvous/{token}", get(rendezvous))
        .route(
            "/sim/environments/{environment_id}/drop-executor",
            post(drop_executor),
        )
}

async fn rendezvous(
    State(state): State<SimState>,
    Path(token): Path<String>,
    ws: WebSocketUpgrade,
) -> Response {
    let registration = {
        let r = relays(&state);
        r.tokens
            .get(&token)
            .and_then(|id| r.registrations.get(id).map(|reg| (id.clone(), reg.clone())))
    };
    let Some((registration_id, registration)) = registration else {
        return crate::error::ApiError::not_found("rendezvous", &token).into_response();
    };
    if relays(&state)
        .partitioned
        .contains(&registration.environment_id)
    {
        // Not a 4xx: the forwarder keeps its registration and retries with backoff.
        return axum::http::StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    ws.on_upgrade(move |socket| serve(state, socket, registration_id, registration))
}

async fn serve(state: SimState, socket: WebSocket, registration_id: String, reg: Registration) {
    let conn = state.0.ids.hex("conn_");
    let (open_tx, mut open_rx) = mpsc::channel::<OpenStream>(8);
    let kill = Arc::new(Notify::new());
    relays(&state).sockets.insert(
        conn.clone(),
        Socket {
            environment_id: reg.environment_id.clone(),
            open: open_tx,
            kill: kill.clone(),
        },
    );
    set_connection(&state, &reg.environment_id, &conn, true);
    let (mut sink, mut incoming) = socket.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Frame>(64);
    let mut streams: HashMap<String, mpsc::Sender<Body>> = HashMap::new();
    loop {
        tokio::select! {
            msg = incoming.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    if let Ok(f) = Frame::decode(&b)
                        && let Some(tx) = streams.get(&f.stream_id)
                    {
                        let _ = tx.send(f.body).await;
                    }
                }
                Some(Ok(Message::Close(_)) | Err(_)) | None => break,
                Some(Ok(_)) => {}
            },
            Some(frame) = out_rx.recv() => {
                if sink.send(Message::Binary(frame.encode().into())).await.is_err() {
                    break;
                }
            }
            Some(reply) = open_rx.recv() => {
                let stream_id = state.0.ids.hex("stream_");
                let (tx, rx) = mpsc::channel(64);
                streams.insert(stream_id.clone(), tx);
                let ctx = StreamCtx {
                    state: state.clone(),
                    registration_id: registration_id.clone(),
                    reg: reg.clone(),
                    stream_id,
                    out: out_tx.clone(),
                };
                tokio::spawn(harness_stream(ctx, rx, reply));
            }
            () = kill.notified() => {
                let _ = sink.send(Message::Close(None)).await;
                break;
            }
        }
    }
    relays(&state).sockets.remove(&conn);
    set_connection(&state, &reg.environment_id, &conn, false);
}

/// Opens or closes connection `conn` of an environment and lets waiting turns move.
fn set_connection(state: &SimState, environment_id: &str, conn: &str, open: bool) {
    let sh = &state.0;
    let session_id = {
        let mut inner = state.lock();
        let now = sh.clock.now();
        let Some(env) = inner.environments.get_mut(environment_id) else {
            return;
        };
        if open {
            env.connections.insert(conn.to_owned());
            env.relay_connections.insert(conn.to_owned());
            env.connect_count += 1;
            env.status = EnvironmentStatus::Connected;
        } else {
            env.relay_connections.remove(conn);
            env.disconnect_count += u64::from(env.connections.remove(conn));
            if env.connections.is_empty() && env.status == EnvironmentStatus::Connected {
                env.status = EnvironmentStatus::Disconnected;
            }
        }
        let session_id = env.session_id.clone();
        step(sh, &mut inner, &session_id, now);
        session_id
    };
    tracing::info!(environment_id, conn, open, "executor rendezvous socket");
    state.bump();
    ensure_driver(state, &session_id);
}

struct StreamCtx {
    state: SimState,
    registration_id: String,
    reg: Registration,
    stream_id: String,
    out: mpsc::Sender<Frame>,
}

impl StreamCtx {
    async fn send(&self, body: Body) -> Result<(), String> {
        self.out
            .send(Frame {
                stream_id: self.stream_id.clone(),
                body,
            })
            .await
            .map_err(|_| "the rendezvous socket closed".to_owned())
    }
}

/// The harness end of one stream: handshake, then JSON-RPC text ⇄ Noise records.
async fn harness_stream(ctx: StreamCtx, mut rx: mpsc::Receiver<Body>, reply: OpenStream) {
    let handshake = async {
        let authorization = ctx.state.0.ids.hex("hka_");
        let own = StaticKeys::generate()?;
        relays(&ctx.state).authorizations.insert(
            authorization.clone(),
            Issued {
                registration_id: ctx.registration_id.clone(),
                stream_id: ctx.stream_id.clone(),
                harness_x25519: own.x25519_public(),
            },
        );
        let prologue = noise_session::prologue(
            &ctx.reg.environment_id,
            &ctx.registration_id,
            &ctx.stream_id,
        );
        let mut hs = noise_session::initiator(own, &ctx.reg.x25519, &ctx.reg.mlkem, &prologue)?;
        let msg1 = noise_session::write(&mut hs, authorization.as_bytes())?;
        ctx.send(Body::Resume { next_seq: 0 }).await?;
        ctx.send(Body::Handshake { payload: msg1 }).await?;
        loop {
            match tokio::time::timeout(Duration::from_secs(20), rx.recv()).await {
                Err(_) => return Err("no handshake answer from the executor in 20 s".to_owned()),
                Ok(None) => return Err("the rendezvous socket closed".to_owned()),
                Ok(Some(Body::Handshake { payload })) => {
                    noise_session::read(&mut hs, &payload)?;
                    return noise_session::finish(hs);
                }
                Ok(Some(Body::Reset { reason })) => {
                    return Err(format!("the executor reset the stream: {reason}"));
                }
                Ok(Some(_)) => {}
            }
        }
    };
    let mut transport = match handshake.await {
        Ok(t) => t,
        Err(e) => {
            let _ = reply.send(Err(e));
            return;
        }
    };
    let (to_rpc, pipe_rx) = mpsc::channel::<String>(64);
    let (pipe_tx, mut from_rpc) = mpsc::channel::<String>(64);
    if reply
        .send(Ok(Pipe {
            tx: pipe_tx,
            rx: pipe_rx,
        }))
        .is_err()
    {
        return;
    }
    let (mut send_seq, mut recv_seq) = (0u64, 0u64);
    let mut reassembler = Reassembler::default();
    loop {
        tokio::select! {
            msg = from_rpc.recv() => {
                let Some(msg) = msg else { break };
                for rec in noise_session::records(msg.as_bytes()) {
                    let Ok(payload) = transport.send_vec(&rec) else { return };
                    if ctx.send(Body::Data { seq: send_seq, payload }).await.is_err() {
                        return;
                    }
                    send_seq += 1;
                }
            }
            body = rx.recv() => match body {
                Some(Body::Data { seq, payload }) if seq == recv_seq => {
                    recv_seq += 1;
                    let Ok(plain) = transport.receive_vec(&payload) else { return };
                    for m in reassembler.push(&plain) {
                        if to_rpc.send(String::from_utf8_lossy(&m).into_owned()).await.is_err() {
                            return;
                        }
                    }
                }
                Some(Body::Reset { .. }) | None => return,
                Some(_) => {}
            }
        }
    }
    let _ = ctx
        .send(Body::Reset {
            reason: "closed".to_owned(),
        })
        .await;
}

async fn drop_executor(
    State(state): State<SimState>,
    Path(environment_id): Path<String>,
) -> Json<Value> {
    let mut dropped = 0;
    let mut relays = relays(&state);
    relays.partitioned.insert(environment_id.clone());
    for s in relays.sockets.values() {
        if s.environment_id == environment_id {
            s.kill.notify_one();
            dropped += 1;
        }
    }
    drop(relays);
    // Simulated connections (the control route's) are dropped too.
    let simulated = state
        .lock()
        .environments
        .get(&environment_id)
        .map_or(0, |e| {
            e.connections.difference(&e.relay_connections).count()
        });
    if simulated > 0
        && crate::executor_connect::disconnect_simulated(&state, &environment_id, None).is_ok()
    {
        dropped += simulated;
    }
    Json(json!({"environment_id": environment_id, "dropped": dropped}))
}
