//! `sim-executor`: the executor stand-in for the agents simulator, the real
//! `codex exec-server` CLI, smaller.
//!
//! The same two halves as the pinned codex 0.171.0
//! (../shared/reference/executor-protocol.md, "Command lines"):
//!
//! - `sim-executor exec-server --listen ws://127.0.0.1:PORT`: the **listening executor**. No
//!   key, no remote; it serves the executor's JSON-RPC over WebSocket (`initialize`,
//!   `process/start`, `process/read`, ...; `agents_sim::exec_protocol`) and runs the
//!   commands it is given, until SIGTERM.
//! - `sim-executor exec-server forward --remote URL --environment-id ID --connect
//!   ws://127.0.0.1:PORT`: the **forwarder**, the only key holder. It registers at
//!   `{URL}/cloud/environment/{ID}/register`, holds the rendezvous WebSocket, answers the
//!   harness's Noise handshakes and relays each stream to `--connect`
//!   (`agents_sim::forwarder`), exactly the protocol the real forwarder speaks.
//! - `sim-executor exec-server --remote URL --environment-id ID`: both in one process (a
//!   listener on an ephemeral loopback port and a forwarder to it).
//!
//! The key comes from `CODEX_API_KEY`, or with `--registration-bearer-stdin` from the first
//! line of stdin, and is never printed. `--remote` and `--environment-id` default to the
//! `REMOTE_URL` and `ENVIRONMENT_ID` environment variables. It runs until SIGTERM or SIGINT
//! (or, with `--exit-on-stdin-close` / `EXIT_ON_STDIN_CLOSE=1`, until stdin closes) and
//! then exits 0; the rendezvous socket closing is what makes the environment
//! `disconnected`. Exit codes: 2 for bad arguments or environment, 1 when registration
//! fails (as codex: no retry; an authentication failure says so).
#![deny(clippy::all)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

use agents_sim::forwarder::ForwardConfig;
use std::process::ExitCode;

/// The longest bearer line `--registration-bearer-stdin` reads (as codex: 16 KiB).
const MAX_BEARER_LINE: usize = 16 * 1024;

struct Args {
    /// `--connect` of `forward`: the listening executor this forwarder serves.
    forward_to: Option<String>,
    remote_url: String,
    environment_id: String,
    name: Option<String>,
    bearer_stdin: bool,
    exit_on_stdin_close: bool,
}

const USAGE: &str = "usage: sim-executor [exec-server] [--remote URL] [--environment-id ID] [--name NAME] \
[--exit-on-stdin-close] [--registration-bearer-stdin] (env: REMOTE_URL, ENVIRONMENT_ID, CODEX_API_KEY) \
| sim-executor exec-server forward --remote URL --environment-id ID --connect ws://127.0.0.1:PORT \
| sim-executor exec-server --listen ws://127.0.0.1:PORT [--ws-auth capability-token --ws-token-file PATH]";

/// What to run.
enum Mode {
    /// `--listen URL`: the listening executor (no key), with the capability token of
    /// `--ws-auth capability-token --ws-token-file F` when given (as codex 0.171.0: an
    /// upgrade request without `Authorization: Bearer <token>` is answered 401).
    Listen(String, Option<String>),
    /// Single mode (no `forward`) or the forwarder (`forward --connect`).
    Register(Args),
}

fn parse_args() -> Result<Mode, String> {
    let mut listen: Option<String> = None;
    let mut forward = false;
    let mut connect: Option<String> = None;
    let mut remote = std::env::var("REMOTE_URL").ok();
    let mut env_id = std::env::var("ENVIRONMENT_ID").ok();
    let mut name = None;
    let mut bearer_stdin = false;
    let mut ws_auth: Option<String> = None;
    let mut ws_token_file: Option<String> = None;
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
            "--registration-bearer-stdin" => bearer_stdin = true,
            "--listen" => listen = Some(value("--listen")?),
            "forward" => forward = true,
            "--connect" => connect = Some(value("--connect")?),
            "--ws-auth" => ws_auth = Some(value("--ws-auth")?),
            "--ws-token-file" => ws_token_file = Some(value("--ws-token-file")?),
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
        return Ok(Mode::Listen(url, listener_token(ws_auth, ws_token_file)?));
    }
    if ws_auth.is_some() || ws_token_file.is_some() {
        return Err("--ws-auth and --ws-token-file belong to --listen".into());
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
    if !remote_url.starts_with("http://") && !remote_url.starts_with("https://") {
        return Err("REMOTE_URL must be an http(s) URL".into());
    }
    Ok(Mode::Register(Args {
        forward_to,
        remote_url,
        environment_id,
        name,
        bearer_stdin,
        exit_on_stdin_close,
    }))
}

/// The listener's capability token from `--ws-auth capability-token --ws-token-file F`
/// (an absolute path; the file's content, trimmed, not empty); `None` without `--ws-auth`.
fn listener_token(
    ws_auth: Option<String>,
    ws_token_file: Option<String>,
) -> Result<Option<String>, String> {
    match (ws_auth.as_deref(), ws_token_file) {
        (None, None) => Ok(None),
        (Some("capability-token"), Some(path)) => {
            if !path.starts_with('/') {
                return Err("--ws-token-file must be an absolute path".into());
            }
            let token = std::fs::read_to_string(&path)
                .map_err(|e| format!("--ws-token-file {path}: {e}"))?;
            let token = token.trim();
            if token.is_empty() {
                return Err("--ws-token-file is empty".into());
            }
            Ok(Some(token.to_owned()))
        }
        (Some("capability-token"), None) => {
            Err("--ws-auth capability-token needs --ws-token-file".into())
        }
        (Some(other), _) => Err(format!(
            "--ws-auth {other:?} is not supported by this stand-in"
        )),
        (None, Some(_)) => Err("--ws-token-file needs --ws-auth capability-token".into()),
    }
}

/// The executor key: `CODEX_API_KEY`, or the first stdin line with
/// `--registration-bearer-stdin`.
async fn read_key(from_stdin: bool) -> Result<String, String> {
    if !from_stdin {
        return std::env::var("CODEX_API_KEY")
            .ok()
            .map(|k| k.trim().to_owned())
            .filter(|k| !k.is_empty())
            .ok_or_else(|| "CODEX_API_KEY is required".to_owned());
    }
    use tokio::io::AsyncReadExt;
    let mut stdin = tokio::io::stdin();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() <= MAX_BEARER_LINE {
        match stdin.read(&mut byte).await {
            Ok(1) if byte[0] == b'\n' => break,
            Ok(1) => line.push(byte[0]),
            _ => {
                return Err("--registration-bearer-stdin: stdin ended before a bearer line".into());
            }
        }
    }
    let key = String::from_utf8(line).map_err(|_| "the bearer line is not UTF-8")?;
    let key = key.trim().to_owned();
    if key.is_empty() || key.len() > MAX_BEARER_LINE {
        return Err("--registration-bearer-stdin: empty or too long bearer line".into());
    }
    Ok(key)
}

fn log(msg: &str) {
    eprintln!("sim-executor: {msg}");
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

/// Binds `url`'s address and serves the executor protocol there.
async fn bind(url: &str) -> Result<tokio::net::TcpListener, ExitCode> {
    let addr = url
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .unwrap_or_default();
    tokio::net::TcpListener::bind(addr).await.map_err(|err| {
        log(&format!("cannot listen on {url}: {err}"));
        ExitCode::from(2)
    })
}

async fn listen(url: &str, token: Option<String>) -> ExitCode {
    let listener = match bind(url).await {
        Ok(l) => l,
        Err(code) => return code,
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
        Ok(Mode::Register(a)) => a,
        Ok(Mode::Listen(url, token)) => return listen(&url, token).await,
        Err(msg) => {
            log(&msg);
            return ExitCode::from(2);
        }
    };
    let key = match read_key(args.bearer_stdin).await {
        Ok(k) => k,
        Err(msg) => {
            log(&msg);
            return ExitCode::from(2);
        }
    };
    let connect = match &args.forward_to {
        Some(url) => url.clone(),
        None => {
            // Single mode: the listening half in this process, on an ephemeral port.
            let listener = match bind("127.0.0.1:0").await {
                Ok(l) => l,
                Err(code) => return code,
            };
            let url = match listener.local_addr() {
                Ok(a) => format!("ws://{a}"),
                Err(err) => {
                    log(&format!("no local address: {err}"));
                    return ExitCode::from(2);
                }
            };
            tokio::spawn(agents_sim::exec_protocol::serve(listener, None));
            url
        }
    };
    let cfg = ForwardConfig {
        remote: args.remote_url.clone(),
        environment_id: args.environment_id.clone(),
        key,
        connect,
    };
    let name = args
        .name
        .as_deref()
        .map(|n| format!(", name {n}"))
        .unwrap_or_default();
    let env = args.environment_id.clone();
    let on_connected = move |registration: &str| {
        log(&format!(
            "connected environment {env} (registration {registration}{name})"
        ));
    };
    let stop = async {
        if args.exit_on_stdin_close {
            tokio::select! {
                r = terminated() => r,
                () = stdin_closed() => "stdin closed",
            }
        } else {
            terminated().await
        }
    };
    tokio::select! {
        reason = stop => {
            log(&format!("{reason}: stopping"));
            ExitCode::SUCCESS
        }
        result = agents_sim::forwarder::run(cfg, on_connected) => {
            if let Err(e) = result {
                log(&format!("environment {}: {e}", args.environment_id));
            }
            ExitCode::from(1)
        }
    }
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
