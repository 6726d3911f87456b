//! The executor's own protocol: JSON-RPC 2.0 messages, as served by `codex exec-server
//! --listen ws://127.0.0.1:PORT` (and by the `sim-executor` stand-in's `--listen`). Both
//! sides live here:
//!
//! - [`run_command`]: the simulator as the **harness**, over a [`Pipe`] of JSON-RPC
//!   messages. The pipe is a Noise stream of a forwarder's rendezvous socket
//!   ([`crate::rendezvous`]); the forwarder passes each message to its listening executor
//!   (the real pinned `codex` or the stand-in), so the command really executes there.
//! - [`serve`]: the stand-in's listener, the same methods for the subset the harness uses.
//!
//! Methods (from `codex-rs/exec-server/src/protocol.rs` of openai/codex, checked against
//! the pinned 0.171.0 binary): `initialize` `{clientName}` → `{sessionId,
//! environmentInfo: {shell, cwd (file URI), executorVersion, ...}}`; the `initialized`
//! notification; `environment/info`; `process/start` `{processId, argv, cwd (file URI),
//! env, tty, arg0}` → `{processId}`; `process/read` `{processId, afterSeq, maxBytes,
//! waitMs}` → `{chunks: [{seq, stream, chunk (base64)}], nextSeq, exited, exitCode,
//! closed, failure}` (chunks with `seq > afterSeq`); `process/terminate` `{processId}` →
//! `{running}`. The real executor also pushes `process/output`, `process/exited` and
//! `process/closed` notifications; [`run_command`] takes output from both, by `seq`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::Message;

/// How a command run by [`run_command`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandResult {
    /// Exit code (`None`: no exit code, e.g. killed by a signal, or `failure`).
    pub exit_code: Option<i32>,
    /// stdout and stderr in `seq` order, lossily UTF-8, at most [`MAX_OUTPUT`] bytes.
    pub output: String,
    /// The executor's `executorVersion` from `initialize` (`0.171.0` for the pinned codex,
    /// `sim-executor` for the stand-in).
    pub executor_version: Option<String>,
}

/// Output kept per command, bytes.
pub const MAX_OUTPUT: usize = 64 * 1024;

/// Is `url` a `ws://` URL on a loopback address (`127.0.0.0/8`, `localhost`, `[::1]`) with
/// a port? The only executor URLs the simulator connects to.
pub fn is_loopback_ws(url: &str) -> bool {
    loopback_port(url, "ws://").is_some_and(|p| p != 0)
}

/// The port of `url` when it is `scheme` (`"ws://"`, `"http://"`, ...) on a loopback
/// address (`127.0.0.0/8`, `localhost`, `[::1]`) with an explicit port (0 included: an
/// ephemeral one to listen on); `None` otherwise.
pub fn loopback_port(url: &str, scheme: &str) -> Option<u16> {
    let rest = url.strip_prefix(scheme)?;
    let authority = rest.split('/').next().unwrap_or_default();
    let (host, port) = authority.rsplit_once(':')?;
    let port = port.parse::<u16>().ok()?;
    let loopback = host == "localhost"
        || host == "[::1]"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback());
    loopback.then_some(port)
}

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;
#[cfg(test)]
type ClientWs =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A JSON-RPC message pipe to an executor: text messages out (`tx`) and in (`rx`; `None`
/// once closed), built over a Noise stream of the rendezvous relay ([`crate::rendezvous`]).
pub struct Pipe {
    /// Messages to the executor.
    pub tx: tokio::sync::mpsc::Sender<String>,
    /// Messages from the executor.
    pub rx: tokio::sync::mpsc::Receiver<String>,
}

struct Rpc {
    pipe: Pipe,
    next_id: u64,
    /// `process/output` chunks seen in notifications, by seq.
    chunks: BTreeMap<u64, Vec<u8>>,
}

impl Rpc {
    async fn send(&mut self, msg: Value) -> Result<(), String> {
        self.pipe
            .tx
            .send(msg.to_string())
            .await
            .map_err(|_| "executor connection closed".to_owned())
    }

    /// Sends a request and waits for its response, recording notifications meanwhile.
    async fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        loop {
            let text = self
                .pipe
                .rx
                .recv()
                .await
                .ok_or_else(|| format!("executor closed the connection during {method}"))?;
            let Ok(v) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            if v.get("id").and_then(Value::as_u64) == Some(id) {
                if let Some(err) = v.get("error") {
                    return Err(format!("executor answered {method} with an error: {err}"));
                }
                return Ok(v.get("result").cloned().unwrap_or(Value::Null));
            }
            if v.get("method").and_then(Value::as_str) == Some("process/output")
                && let Some(p) = v.get("params")
            {
                self.record_chunk(p);
            }
        }
    }

    fn record_chunk(&mut self, chunk: &Value) {
        let (Some(seq), Some(data)) = (
            chunk.get("seq").and_then(Value::as_u64),
            chunk.get("chunk").and_then(Value::as_str),
        ) else {
            return;
        };
        if let Ok(bytes) = B64.decode(data) {
            self.chunks.entry(seq).or_insert(bytes);
        }
    }
}

/// Bridges a WebSocket to a [`Pipe`] (text and binary messages in, text out): the
/// harness talking to a listener directly, for this module's tests.
#[cfg(test)]
fn bridge(ws: ClientWs) -> Pipe {
    let (in_tx, in_rx) = tokio::sync::mpsc::channel::<String>(64);
    let (out_tx, mut out_rx) = tokio::sync::mpsc::channel::<String>(64);
    let (mut sink, mut stream) = ws.split();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                out = out_rx.recv() => match out {
                    Some(text) => {
                        if sink.send(Message::Text(text.into())).await.is_err() {
                            return;
                        }
                    }
                    None => {
                        let _ = sink.close().await;
                        return;
                    }
                },
                msg = stream.next() => match msg {
                    Some(Ok(Message::Text(t))) => {
                        if in_tx.send(t.to_string()).await.is_err() {
                            return;
                        }
                    }
                    Some(Ok(Message::Binary(b))) => {
                        if in_tx.send(String::from_utf8_lossy(&b).into_owned()).await.is_err() {
                            return;
                        }
                    }
                    Some(Ok(Message::Close(_)) | Err(_)) | None => return,
                    Some(Ok(_)) => {}
                },
            }
        }
    });
    Pipe {
        tx: out_tx,
        rx: in_rx,
    }
}

/// Runs `command` (`/bin/sh -c command`) in the executor at the other end of `pipe` as
/// the harness would: `initialize`, `initialized`, `process/start` in the executor's own
/// working directory (from `initialize`), then `process/read` until the process has
/// exited and its output is closed. The process gets an empty environment (`env: {}`).
///
/// # Errors
/// A message naming the step: a JSON-RPC error, a closed pipe, or `timeout` (then a
/// `process/terminate` is attempted).
pub async fn run_command(
    pipe: Pipe,
    command: &str,
    timeout: Duration,
) -> Result<CommandResult, String> {
    let mut rpc = Rpc {
        pipe,
        next_id: 0,
        chunks: BTreeMap::new(),
    };
    let run = async {
        let init = rpc
            .call("initialize", json!({"clientName": "agents-sim"}))
            .await?;
        let info = init.get("environmentInfo").cloned().unwrap_or(Value::Null);
        let executor_version = info
            .get("executorVersion")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let cwd = info
            .get("cwd")
            .and_then(Value::as_str)
            .unwrap_or("file:///")
            .to_owned();
        rpc.send(json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
            .await?;
        let process_id = "turn-command";
        rpc.call(
            "process/start",
            json!({
                "processId": process_id,
                "argv": ["/bin/sh", "-c", command],
                "cwd": cwd,
                "env": {},
                "tty": false,
                "arg0": null,
            }),
        )
        .await?;
        let mut after: Option<u64> = None;
        loop {
            let read = rpc
                .call(
                    "process/read",
                    json!({"processId": process_id, "afterSeq": after, "maxBytes": null, "waitMs": 1000}),
                )
                .await?;
            for c in read
                .get("chunks")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                rpc.record_chunk(c);
            }
            after = rpc.chunks.keys().next_back().copied().or(after);
            if let Some(f) = read.get("failure").and_then(Value::as_str) {
                return Err(format!("executor reported a process failure: {f}"));
            }
            let exited = read.get("exited").and_then(Value::as_bool) == Some(true);
            let closed = read.get("closed").and_then(Value::as_bool) == Some(true);
            if exited && closed {
                let exit_code = read
                    .get("exitCode")
                    .and_then(Value::as_i64)
                    .and_then(|c| i32::try_from(c).ok());
                return Ok((exit_code, executor_version));
            }
        }
    };
    let outcome = tokio::time::timeout(timeout, run).await;
    let (exit_code, executor_version) = match outcome {
        Ok(r) => r?,
        Err(_) => {
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                rpc.call("process/terminate", json!({"processId": "turn-command"})),
            )
            .await;
            return Err("timeout".to_owned());
        }
    };
    drop(rpc.pipe);
    let mut bytes = Vec::new();
    for chunk in rpc.chunks.values() {
        bytes.extend_from_slice(chunk);
    }
    bytes.truncate(MAX_OUTPUT);
    Ok(CommandResult {
        exit_code,
        output: String::from_utf8_lossy(&bytes).into_owned(),
        executor_version,
    })
}

// ---------------------------------------------------------------- the stand-in's side

#[derive(Default)]
struct ProcState {
    /// `(seq, stream, bytes)`.
    chunks: Vec<(u64, &'static str, Vec<u8>)>,
    next_seq: u64,
    exited: bool,
    exit_code: Option<i32>,
    closed: bool,
    child_pid: Option<u32>,
}

struct Proc {
    state: Mutex<ProcState>,
    changed: Notify,
}

impl Proc {
    fn push(&self, stream: &'static str, bytes: Vec<u8>) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.next_seq += 1;
        let seq = s.next_seq;
        s.chunks.push((seq, stream, bytes));
        drop(s);
        self.changed.notify_waiters();
    }
}

/// What the stand-in reports as `environmentInfo`.
fn environment_info() -> Value {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    json!({
        "shell": {"name": "sh", "path": "/bin/sh"},
        "executorVersion": "sim-executor",
        "cwd": format!("file://{}", cwd.display()),
        "platformOs": std::env::consts::OS,
    })
}

fn path_of(uri: &str) -> PathBuf {
    PathBuf::from(uri.strip_prefix("file://").unwrap_or(uri))
}

async fn pump(proc: Arc<Proc>, stream: &'static str, mut r: impl tokio::io::AsyncRead + Unpin) {
    let mut buf = vec![0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => proc.push(stream, buf[..n].to_vec()),
        }
    }
}

fn start_process(params: &Value) -> Result<Arc<Proc>, String> {
    let argv: Vec<String> = params
        .get("argv")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let Some((program, args)) = argv.split_first() else {
        return Err("argv is empty".to_owned());
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).env_clear();
    if let Some(env) = params.get("env").and_then(Value::as_object) {
        for (k, v) in env {
            if let Some(v) = v.as_str() {
                cmd.env(k, v);
            }
        }
    }
    if let Some(cwd) = params.get("cwd").and_then(Value::as_str) {
        cmd.current_dir(path_of(cwd));
    }
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| format!("spawn {program}: {e}"))?;
    let proc = Arc::new(Proc {
        state: Mutex::new(ProcState {
            child_pid: child.id(),
            ..ProcState::default()
        }),
        changed: Notify::new(),
    });
    let out = child.stdout.take();
    let err = child.stderr.take();
    let p = Arc::clone(&proc);
    tokio::spawn(async move {
        let a = async {
            if let Some(o) = out {
                pump(Arc::clone(&p), "stdout", o).await;
            }
        };
        let b = async {
            if let Some(e) = err {
                pump(Arc::clone(&p), "stderr", e).await;
            }
        };
        tokio::join!(a, b);
        let status = child.wait().await.ok();
        let mut s = p.state.lock().unwrap_or_else(|x| x.into_inner());
        s.exited = true;
        s.closed = true;
        s.exit_code = status.and_then(|st| st.code());
        s.next_seq += 2;
        drop(s);
        p.changed.notify_waiters();
    });
    Ok(proc)
}

async fn read_process(proc: &Proc, params: &Value) -> Value {
    let after = params.get("afterSeq").and_then(Value::as_u64).unwrap_or(0);
    let wait = Duration::from_millis(
        params
            .get("waitMs")
            .and_then(Value::as_u64)
            .unwrap_or(0)
            .min(30_000),
    );
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let notified = proc.changed.notified();
        {
            let s = proc.state.lock().unwrap_or_else(|p| p.into_inner());
            let chunks: Vec<Value> = s
                .chunks
                .iter()
                .filter(|(seq, _, _)| *seq > after)
                .map(|(seq, stream, bytes)| {
                    json!({"seq": seq, "stream": stream, "chunk": B64.encode(bytes)})
                })
                .collect();
            if !chunks.is_empty() || s.closed || tokio::time::Instant::now() >= deadline {
                return json!({
                    "chunks": chunks,
                    "nextSeq": s.next_seq + 1,
                    "exited": s.exited,
                    "exitCode": s.exit_code,
                    "closed": s.closed,
                    "failure": null,
                    "sandboxDenied": false,
                });
            }
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}

async fn handle(ws: Ws) {
    let (mut tx, mut rx) = ws.split();
    let mut procs: HashMap<String, Arc<Proc>> = HashMap::new();
    while let Some(Ok(msg)) = rx.next().await {
        let text = match msg {
            Message::Text(t) => t.to_string(),
            // What a relay forwarder passes through (binary messages of JSON-RPC text).
            Message::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
            Message::Close(_) => break,
            _ => continue,
        };
        let Ok(req) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        let Some(id) = req.get("id").cloned() else {
            continue; // a notification (`initialized`)
        };
        let params = req.get("params").cloned().unwrap_or(Value::Null);
        let process_id = params
            .get("processId")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let result: Result<Value, (i64, String)> = match req
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default()
        {
            "initialize" => Ok(json!({
                "sessionId": format!("sim-{}", std::process::id()),
                "environmentInfo": environment_info(),
            })),
            "environment/info" => Ok(environment_info()),
            "process/start" if procs.contains_key(&process_id) => {
                Err((-32600, format!("process {process_id} already exists")))
            }
            "process/start" => match start_process(&params) {
                Ok(p) => {
                    procs.insert(process_id.clone(), p);
                    Ok(json!({"processId": process_id}))
                }
                Err(e) => Err((-32603, e)),
            },
            "process/read" => match procs.get(&process_id) {
                Some(p) => Ok(read_process(p, &params).await),
                None => Err((-32600, format!("unknown process {process_id}"))),
            },
            "process/terminate" => match procs.get(&process_id) {
                Some(p) => {
                    let (pid, running) = {
                        let s = p.state.lock().unwrap_or_else(|x| x.into_inner());
                        (s.child_pid, !s.exited)
                    };
                    if let (Some(pid), true) = (pid, running) {
                        let _ = std::process::Command::new("kill")
                            .args(["-TERM", &pid.to_string()])
                            .status();
                    }
                    Ok(json!({"running": running}))
                }
                None => Err((-32600, format!("unknown process {process_id}"))),
            },
            other => Err((
                -32601,
                format!("method {other} is not served by sim-executor"),
            )),
        };
        let answer = match result {
            Ok(r) => json!({"id": id, "result": r}),
            Err((code, message)) => json!({"id": id, "error": {"code": code, "message": message}}),
        };
        if tx
            .send(Message::Text(answer.to_string().into()))
            .await
            .is_err()
        {
            break;
        }
    }
}

/// Serves the executor protocol subset above on `listener` until the task is dropped:
/// one task per WebSocket connection, processes scoped to their connection. With `token`
/// (`--ws-auth capability-token`), an upgrade request without `Authorization: Bearer
/// <token>` is answered 401, as codex 0.171.0 answers it.
pub async fn serve(listener: TcpListener, token: Option<String>) {
    use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let token = token.clone();
        tokio::spawn(async move {
            // The callback's signature is tungstenite's (`Callback`): its error is a response.
            #[allow(clippy::result_large_err)]
            let check = move |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
                let Some(want) = &token else { return Ok(resp) };
                let presented = req
                    .headers()
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "));
                if presented == Some(want.as_str()) {
                    Ok(resp)
                } else {
                    let mut refused = ErrorResponse::new(None);
                    *refused.status_mut() =
                        tokio_tungstenite::tungstenite::http::StatusCode::UNAUTHORIZED;
                    Err(refused)
                }
            };
            if let Ok(ws) = tokio_tungstenite::accept_hdr_async(stream, check).await {
                handle(ws).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_websockets_are_executor_urls() {
        for ok in [
            "ws://127.0.0.1:7070",
            "ws://localhost:1",
            "ws://[::1]:9",
            "ws://127.3.0.1:80/x",
        ] {
            assert!(is_loopback_ws(ok), "{ok}");
        }
        for bad in [
            "wss://127.0.0.1:7070",
            "ws://10.0.0.1:7070",
            "ws://example.com:80",
            "ws://127.0.0.1",
            "ws://127.0.0.1:0",
            "http://127.0.0.1:80",
            "ws://127.0.0.1.evil.com:80",
        ] {
            assert!(!is_loopback_ws(bad), "{bad}");
        }
    }

    #[tokio::test]
    async fn the_stand_in_listener_runs_a_command_for_the_harness() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(serve(listener, None));
        let (ws, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .unwrap();
        let r = run_command(
            bridge(ws),
            "echo out; echo err >&2; exit 7",
            Duration::from_secs(20),
        )
        .await
        .unwrap();
        assert_eq!(r.exit_code, Some(7));
        assert!(
            r.output.contains("out\n") && r.output.contains("err\n"),
            "{r:?}"
        );
        assert_eq!(r.executor_version.as_deref(), Some("sim-executor"));
        server.abort();
    }
}
