//! `sim-executor`: the executor stand-in for the agents simulator.
//!
//! It plays the part of `codex exec-server --remote "$REMOTE_URL" --environment-id
//! "$ENVIRONMENT_ID"` against `agents-sim` (a real `codex exec-server` cannot register with
//! the simulator: it speaks the real registration + WebSocket protocol):
//!
//! 1. `POST $REMOTE_URL` (the session's `remote_url`,
//!    `http://127.0.0.1:PORT/v1/agents/environments/{id}/connect`) with
//!    `Authorization: Bearer $CODEX_API_KEY`, retrying connection errors, 429 and 5xx up to
//!    6 attempts (200 ms doubling, at most 2 s apart); any other refusal exits 3;
//! 2. stays alive until SIGTERM or SIGINT (or, with `--exit-on-stdin-close` /
//!    `EXIT_ON_STDIN_CLOSE=1`, until stdin closes, like the real flag);
//! 3. then `POST .../disconnect` for its connection (best effort) and exits 0.
//!
//! Issue 26, the split executor, the same two modes as the real `codex exec-server`:
//!
//! - `sim-executor exec-server --listen ws://127.0.0.1:PORT`: the **listening executor**. It
//!   needs no key, no `REMOTE_URL` and no `ENVIRONMENT_ID`; it serves the executor protocol
//!   (JSON-RPC over WebSocket: `initialize`, `process/start`, `process/read`, ...; see
//!   `agents_sim::exec_protocol`) and runs the commands it is given, until SIGTERM.
//! - `sim-executor exec-server --remote URL --environment-id ID forward --connect
//!   ws://127.0.0.1:PORT`: the **forwarder**, the only key holder. It connects as above with
//!   the body `{"executor_url": "ws://127.0.0.1:PORT"}`, so the simulator (as the harness)
//!   runs each turn's command on that executor. (The real forwarder relays Noise-encrypted
//!   rendezvous traffic instead; the simulator does not implement that handshake.)
//!
//! Arguments mirror the real executor so a local compute provider can swap the command:
//! `sim-executor [exec-server] [--remote URL] [--environment-id ID] [--name NAME]
//! [--exit-on-stdin-close] [--remote-transport T]`; `--remote` and `--environment-id`
//! default to the `REMOTE_URL` and `ENVIRONMENT_ID` environment variables. The key comes
//! only from `CODEX_API_KEY` and is never printed. Exit codes: 0 after a clean stop, 2 for
//! bad arguments or environment, 3 when the connect is refused or never succeeds.
#![deny(clippy::all)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

/// Connect attempts before giving up.
const CONNECT_ATTEMPTS: u32 = 6;
/// First retry delay; doubles per attempt up to [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(200);
/// Largest retry delay.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);
/// Timeout of one HTTP request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

struct Args {
    /// `--connect` of `forward`: the listening executor this forwarder serves.
    forward_to: Option<String>,
    remote_url: String,
    environment_id: String,
    key: String,
    name: Option<String>,
    exit_on_stdin_close: bool,
}

const USAGE: &str = "usage: sim-executor [exec-server] [--remote URL] [--environment-id ID] [--name NAME] \
[--exit-on-stdin-close] [forward --connect ws://127.0.0.1:PORT] (env: REMOTE_URL, ENVIRONMENT_ID, CODEX_API_KEY) \
| sim-executor exec-server --listen ws://127.0.0.1:PORT";

/// What to run.
enum Mode {
    /// `--listen URL`: the listening executor (no key), with the capability token of
    /// `--ws-auth capability-token --ws-token-file F` when given.
    Listen(String, Option<String>),
    /// Connect (single mode) or forward (with `forward --connect`).
    Connect(Args),
}

fn parse_args() -> Result<Mode, String> {
    let mut listen: Option<String> = None;
    let mut forward = false;
    let mut connect: Option<String> = None;
    let mut remote = std::env::var("REMOTE_URL").ok();
    let mut env_id = std::env::var("ENVIRONMENT_ID").ok();
    let mut name = None;
    let mut ws_auth: Option<String> = None;
    let mut ws_token_file: Option<String> = None;
    let mut bearer_stdin = false;
    let mut exit_on_stdin_close = std::env::var("EXIT_ON_STDIN_CLOSE")
        .is_ok_and(|v| matches!(v.as_str(), "1" | "true" | "yes"));
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().is_some_and(|a| a == "exec-server") {
        args.next();
    }
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let mut value = |flag: &str| {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--remote" => remote = Some(value("--remote")?),
            "--environment-id" => env_id = Some(value("--environment-id")?),
            "--name" => name = Some(value("--name")?),
            "--remote-transport" => {
                value("--remote-transport")?;
            }
            "--exit-on-stdin-close" => exit_on_stdin_close = true,
            "--listen" => listen = Some(value("--listen")?),
            "forward" => forward = true,
            "--connect" => connect = Some(value("--connect")?),
            "--ws-auth" => ws_auth = Some(value("--ws-auth")?),
            "--ws-token-file" => ws_token_file = Some(value("--ws-token-file")?),
            "--registration-bearer-stdin" => bearer_stdin = true,
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    if let Some(url) = listen {
        if forward {
            return Err("--listen and forward exclude each other".into());
        }
        if !agents_sim::exec_protocol::is_loopback_ws(&url) {
            return Err("--listen must be ws://127.0.0.1:PORT (loopback)".into());
        }
        let token = match (ws_auth.as_deref(), ws_token_file) {
            (None, None) => None,
            (Some("capability-token"), Some(path)) => {
                if !path.starts_with('/') {
                    return Err("--ws-token-file must be an absolute path".into());
                }
                let token = std::fs::read_to_string(&path)
                    .map_err(|e| format!("--ws-token-file {path}: {e}"))?;
                Some(token.trim().to_owned())
                    .filter(|t| !t.is_empty())
                    .ok_or("--ws-token-file is empty")?
                    .into()
            }
            (Some("capability-token"), None) => {
                return Err("--ws-auth capability-token needs --ws-token-file".into());
            }
            (Some(other), _) => {
                return Err(format!(
                    "--ws-auth {other:?} is not supported by this stand-in"
                ));
            }
            (None, Some(_)) => {
                return Err("--ws-token-file needs --ws-auth capability-token".into());
            }
        };
        return Ok(Mode::Listen(url, token));
    }
    if ws_auth.is_some() || ws_token_file.is_some() {
        return Err("--ws-auth and --ws-token-file belong to --listen".into());
    }
    if bearer_stdin && !forward {
        return Err("--registration-bearer-stdin belongs to forward".into());
    }
    let forward_to = match (forward, connect) {
        (true, Some(url)) if agents_sim::exec_protocol::is_loopback_ws(&url) => Some(url),
        (true, Some(_)) => return Err("--connect must be ws://127.0.0.1:PORT (loopback)".into()),
        (true, None) => return Err("forward needs --connect URL".into()),
        (false, Some(_)) => return Err("--connect belongs to forward".into()),
        (false, None) => None,
    };
    let remote_url = remote
        .filter(|r| !r.trim().is_empty())
        .ok_or("REMOTE_URL (or --remote) is required")?
        .trim()
        .trim_end_matches('/')
        .to_owned();
    let environment_id = env_id
        .filter(|e| !e.trim().is_empty())
        .ok_or("ENVIRONMENT_ID (or --environment-id) is required")?
        .trim()
        .to_owned();
    let key = if bearer_stdin {
        // One bearer line on stdin, newline-terminated, at most 16 KiB (as codex reads it).
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(std::io::Read::take(std::io::stdin(), 16 * 1024)),
            &mut line,
        )
        .map_err(|e| format!("--registration-bearer-stdin: {e}"))?;
        Some(line)
    } else {
        std::env::var("CODEX_API_KEY").ok()
    }
    .filter(|k| !k.trim().is_empty())
    .ok_or(
        "CODEX_API_KEY (or a bearer line on stdin with --registration-bearer-stdin) is required",
    )?
    .trim()
    .to_owned();
    if !remote_url.starts_with("http://") && !remote_url.starts_with("https://") {
        return Err(
            "REMOTE_URL must be an http(s) URL (this stand-in speaks HTTP to agents-sim only)"
                .into(),
        );
    }
    if !remote_url.ends_with(&format!("/environments/{environment_id}/connect")) {
        return Err("REMOTE_URL does not end with /environments/$ENVIRONMENT_ID/connect".into());
    }
    Ok(Mode::Connect(Args {
        forward_to,
        remote_url,
        environment_id,
        key,
        name,
        exit_on_stdin_close,
    }))
}

fn log(msg: &str) {
    eprintln!("sim-executor: {msg}");
}

enum ConnectError {
    Refused(u16),
    Unreachable(String),
}

async fn connect(http: &reqwest::Client, args: &Args) -> Result<String, ConnectError> {
    let mut delay = FIRST_RETRY_DELAY;
    let mut last = String::new();
    for attempt in 1..=CONNECT_ATTEMPTS {
        let mut request = http
            .post(&args.remote_url)
            .bearer_auth(&args.key)
            .header("OpenAI-Beta", "agents=v1");
        if let Some(url) = &args.forward_to {
            request = request.json(&serde_json::json!({"executor_url": url}));
        }
        let result = request.send().await;
        match result {
            Ok(resp) if resp.status().is_success() => {
                let body: serde_json::Value = resp.json().await.unwrap_or_default();
                let id = body
                    .get("id")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                return Ok(id);
            }
            Ok(resp) => {
                let status = resp.status();
                if !(status.is_server_error() || status.as_u16() == 429) {
                    return Err(ConnectError::Refused(status.as_u16()));
                }
                last = format!("HTTP {}", status.as_u16());
            }
            Err(err) => last = err.without_url().to_string(),
        }
        if attempt < CONNECT_ATTEMPTS {
            log(&format!(
                "connect attempt {attempt} failed ({last}); retrying in {delay:?}"
            ));
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(MAX_RETRY_DELAY);
        }
    }
    Err(ConnectError::Unreachable(last))
}

async fn disconnect(http: &reqwest::Client, args: &Args, connection_id: &str) {
    let url = format!(
        "{}/disconnect",
        args.remote_url.trim_end_matches("/connect")
    );
    for attempt in 1..=2 {
        let result = http
            .post(&url)
            .bearer_auth(&args.key)
            .header("OpenAI-Beta", "agents=v1")
            .json(&serde_json::json!({"connection_id": connection_id}))
            .send()
            .await;
        match result {
            Ok(resp) if resp.status().is_success() => {
                log(&format!(
                    "disconnected from environment {}",
                    args.environment_id
                ));
                return;
            }
            Ok(resp) => {
                log(&format!(
                    "disconnect answered HTTP {}",
                    resp.status().as_u16()
                ));
                return;
            }
            Err(err) if attempt == 2 => {
                log(&format!("disconnect failed: {}", err.without_url()));
            }
            Err(_) => tokio::time::sleep(FIRST_RETRY_DELAY).await,
        }
    }
}

async fn stdin_closed() {
    use tokio::io::AsyncReadExt;
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 1024];
    loop {
        match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

#[cfg(unix)]
async fn terminated() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = tokio::signal::ctrl_c() => "SIGINT",
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}

#[cfg(not(unix))]
async fn terminated() -> &'static str {
    let _ = tokio::signal::ctrl_c().await;
    "Ctrl-C"
}

async fn listen(url: &str, token: Option<String>) -> ExitCode {
    let addr = url
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .unwrap_or_default();
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(err) => {
            log(&format!("cannot listen on {url}: {err}"));
            return ExitCode::from(2);
        }
    };
    log(&format!(
        "listening on {url} (no key{})",
        if token.is_some() {
            ", capability token required"
        } else {
            ""
        }
    ));
    let reason = tokio::select! {
        r = terminated() => r,
        () = agents_sim::exec_protocol::serve(listener, token) => "listener ended",
    };
    log(&format!("{reason}: stopping"));
    ExitCode::SUCCESS
}

async fn run() -> ExitCode {
    let args = match parse_args() {
        Ok(Mode::Connect(a)) => a,
        Ok(Mode::Listen(url, token)) => return listen(&url, token).await,
        Err(msg) => {
            log(&msg);
            return ExitCode::from(2);
        }
    };
    let http = match reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .build()
    {
        Ok(c) => c,
        Err(err) => {
            log(&format!("cannot build the HTTP client: {err}"));
            return ExitCode::from(2);
        }
    };
    if let Some(url) = &args.forward_to {
        // Like a readiness check: the environment is reported connected only once the
        // executor this forwarder serves accepts connections (at most 30 s).
        let addr = url
            .trim_start_matches("ws://")
            .split('/')
            .next()
            .unwrap_or_default();
        let started = std::time::Instant::now();
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            if started.elapsed() > Duration::from_secs(30) {
                log(&format!(
                    "the executor at {url} never accepted a connection"
                ));
                return ExitCode::from(3);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let connection_id = match connect(&http, &args).await {
        Ok(id) => id,
        Err(ConnectError::Refused(status)) => {
            log(&format!(
                "connect to environment {} refused with HTTP {status}",
                args.environment_id
            ));
            return ExitCode::from(3);
        }
        Err(ConnectError::Unreachable(why)) => {
            log(&format!(
                "could not connect environment {} after {CONNECT_ATTEMPTS} attempts: {why}",
                args.environment_id
            ));
            return ExitCode::from(3);
        }
    };
    log(&format!(
        "connected environment {} (connection {connection_id}{})",
        args.environment_id,
        args.name
            .as_deref()
            .map(|n| format!(", name {n}"))
            .unwrap_or_default()
    ));
    let reason = if args.exit_on_stdin_close {
        tokio::select! {
            r = terminated() => r,
            () = stdin_closed() => "stdin closed",
        }
    } else {
        terminated().await
    };
    log(&format!("{reason}: disconnecting"));
    disconnect(&http, &args, &connection_id).await;
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            log(&format!("cannot start the runtime: {err}"));
            return ExitCode::from(2);
        }
    };
    let code = runtime.block_on(run());
    // A pending stdin read runs on a blocking thread that would hold up runtime shutdown.
    runtime.shutdown_background();
    code
}
