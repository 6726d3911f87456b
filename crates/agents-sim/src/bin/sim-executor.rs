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
//! line of stdin, and is never printed. It runs until SIGTERM or SIGINT (or, with
//! `--exit-on-stdin-close` / `CODEX_EXEC_SERVER_EXIT_ON_STDIN_CLOSE=1`, until stdin closes)
//! and then exits 0; the rendezvous socket closing is what makes the environment
//! `disconnected`. Exit codes as codex's: 2 for a command line codex refuses (clap's usage
//! error, the same table of accepted and refused lines: `agents-sim`'s
//! `the_stand_in_accepts_exactly_what_codex_accepts`), 1 for what codex refuses once
//! running (no key, a non-loopback remote, a `--connect` that is not `ws://`, a failed
//! registration: no retry; an authentication failure says so).
#![deny(clippy::all)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

use agents_sim::forwarder::ForwardConfig;
use std::process::ExitCode;

/// The longest bearer line `--registration-bearer-stdin` reads (as codex: 16 KiB).
const MAX_BEARER_LINE: usize = 16 * 1024;

/// `sim-executor`: the `exec-server` subcommand of `codex`, shaped as codex 0.171.0's
/// clap definition (../shared/reference/executor-protocol.md, "Command lines"), so a
/// command line is a usage error (exit 2) here exactly when it is one there: the options
/// of `forward` belong to `forward` (written before it they are the parent's, and
/// `forward` then misses its required `--remote`, `--environment-id` and `--connect`),
/// `--remote` requires `--environment-id`, and the enumerated values (`--ws-auth`,
/// `--remote-transport`) refuse anything else. Smaller: codex's configuration and sandbox
/// options (`-c`, `--enable`, proxies, SigV4, JWT listener auth) are not taken.
#[derive(clap::Parser)]
#[command(
    name = "sim-executor",
    version,
    about = "The codex exec-server stand-in"
)]
struct Cli {
    #[command(subcommand)]
    command: TopCommand,
}

#[derive(clap::Subcommand)]
enum TopCommand {
    /// The standalone exec-server (`codex exec-server`).
    ExecServer(ExecServer),
}

/// The options both `exec-server` and `exec-server forward` take for registration.
#[derive(clap::Args)]
struct Registration {
    /// Register this exec-server as a remote environment using the given base URL.
    #[arg(long, value_name = "URL", requires = "environment_id")]
    remote: Option<String>,
    /// Transport used for the remote executor connection (only `noise` is served).
    #[arg(long, value_enum, default_value_t = RemoteTransport::Noise)]
    remote_transport: RemoteTransport,
    /// Environment id to attach to when registering remotely.
    #[arg(long, value_name = "ID")]
    environment_id: Option<String>,
    /// Human-readable environment name.
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// Read one registration bearer from stdin (with `--remote`, as codex).
    #[arg(long, requires_all = ["remote", "environment_id"])]
    registration_bearer_stdin: bool,
    /// Exit when the parent-owned standard-input pipe closes (with `--remote`, as codex;
    /// also `CODEX_EXEC_SERVER_EXIT_ON_STDIN_CLOSE=1`).
    #[arg(long, requires_all = ["remote", "environment_id"])]
    exit_on_stdin_close: bool,
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = false)]
struct ExecServer {
    #[command(subcommand)]
    forward: Option<ExecServerCommand>,
    /// Transport endpoint URL: `ws://127.0.0.1:PORT` (this stand-in listens on loopback
    /// only; default: an ephemeral port, printed on stdout as codex does).
    #[arg(long, value_name = "URL")]
    listen: Option<String>,
    /// Authentication mode for incoming WebSocket connections.
    #[arg(long, value_enum, value_name = "MODE")]
    ws_auth: Option<WsAuth>,
    /// Absolute path to the capability-token file.
    #[arg(long, value_name = "PATH")]
    ws_token_file: Option<String>,
    #[command(flatten)]
    registration: Registration,
}

#[derive(clap::Subcommand)]
enum ExecServerCommand {
    /// Register an existing WebSocket exec-server as a remote environment.
    Forward(Forward),
}

#[derive(clap::Args)]
struct Forward {
    /// Destination exec-server WebSocket URL.
    #[arg(long, value_name = "URL")]
    connect: String,
    /// Register this exec-server as a remote environment using the given base URL.
    #[arg(long, value_name = "URL")]
    remote: String,
    /// Transport used for the remote executor connection (only `noise` is served).
    #[arg(long, value_enum, default_value_t = RemoteTransport::Noise)]
    remote_transport: RemoteTransport,
    /// Environment id to attach to when registering remotely.
    #[arg(long, value_name = "ID")]
    environment_id: String,
    /// Human-readable environment name.
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// Read one registration bearer from stdin.
    #[arg(long)]
    registration_bearer_stdin: bool,
    /// Exit when the parent-owned standard-input pipe closes.
    #[arg(long)]
    exit_on_stdin_close: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RemoteTransport {
    Noise,
    Direct,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum WsAuth {
    CapabilityToken,
    SignedBearerToken,
}

/// A registering half: the forwarder (`forward_to` set) or single mode.
struct Args {
    /// `--connect` of `forward`: the listening executor this forwarder serves.
    forward_to: Option<String>,
    remote_url: String,
    environment_id: String,
    name: Option<String>,
    bearer_stdin: bool,
    exit_on_stdin_close: bool,
}

/// What to run.
enum Mode {
    /// `--listen URL` (or neither `--remote` nor `forward`): the listening executor (no
    /// key), with the capability token of `--ws-auth capability-token --ws-token-file F`
    /// when given (as codex 0.171.0: an upgrade request without `Authorization: Bearer
    /// <token>` is answered 401).
    Listen(String, Option<String>),
    /// Single mode (`--remote` without `forward`) or the forwarder (`forward --connect`).
    Register(Args),
}

/// The parsed command line checked as codex checks it once clap has accepted it: every
/// `Err` here is a runtime refusal, exit 1 as codex (`unsupported --listen URL`, `forward
/// destination must be a ws:// or wss:// URL`, the API-key host restriction, listener auth
/// flags without `--ws-auth`), never a usage error.
fn mode_of(cli: Cli) -> Result<Mode, String> {
    let TopCommand::ExecServer(server) = cli.command;
    let stdin_close_env = std::env::var("CODEX_EXEC_SERVER_EXIT_ON_STDIN_CLOSE")
        .is_ok_and(|v| matches!(v.as_str(), "1" | "true" | "yes"));
    let args = match server.forward {
        Some(ExecServerCommand::Forward(f)) => {
            if !f.connect.starts_with("ws://") && !f.connect.starts_with("wss://") {
                return Err("failed to configure exec-server websocket: forward destination must be a ws:// or wss:// URL".into());
            }
            if !agents_sim::exec_protocol::is_loopback_ws(&f.connect) {
                return Err(
                    "--connect must be ws://127.0.0.1:PORT (this stand-in relays to loopback only)"
                        .into(),
                );
            }
            transport_is_served(f.remote_transport)?;
            Args {
                forward_to: Some(f.connect),
                remote_url: f.remote,
                environment_id: f.environment_id,
                name: f.name,
                bearer_stdin: f.registration_bearer_stdin,
                exit_on_stdin_close: f.exit_on_stdin_close || stdin_close_env,
            }
        }
        None => {
            let token = listener_token(server.ws_auth, server.ws_token_file)?;
            let r = server.registration;
            match (r.remote, r.environment_id) {
                (Some(remote), Some(environment_id)) => {
                    transport_is_served(r.remote_transport)?;
                    if server.listen.is_some() || token.is_some() {
                        return Err("single mode listens on its own ephemeral port: --listen and --ws-auth are not served with --remote by this stand-in".into());
                    }
                    Args {
                        forward_to: None,
                        remote_url: remote,
                        environment_id,
                        name: r.name,
                        bearer_stdin: r.registration_bearer_stdin,
                        exit_on_stdin_close: r.exit_on_stdin_close || stdin_close_env,
                    }
                }
                _ => {
                    let url = server
                        .listen
                        .unwrap_or_else(|| "ws://127.0.0.1:0".to_owned());
                    if !url.starts_with("ws://") {
                        return Err(format!(
                            "unsupported --listen URL `{url}`; expected `ws://IP:PORT`"
                        ));
                    }
                    if !is_loopback_listen(&url) {
                        return Err("--listen must be ws://127.0.0.1:PORT (this stand-in listens on loopback only)".into());
                    }
                    return Ok(Mode::Listen(url, token));
                }
            }
        }
    };
    let remote_url = args.remote_url.trim().trim_end_matches('/').to_owned();
    if !is_loopback_http(&remote_url) {
        return Err("remote exec-server API-key authentication is restricted to HTTPS openai.com and openai.org hosts and subdomains or loopback hosts (this stand-in: loopback only)".into());
    }
    Ok(Mode::Register(Args { remote_url, ..args }))
}

/// Only the Noise relay is served (the protocol the simulator's rendezvous speaks).
fn transport_is_served(transport: RemoteTransport) -> Result<(), String> {
    match transport {
        RemoteTransport::Noise => Ok(()),
        RemoteTransport::Direct => {
            Err("--remote-transport direct is not served by this stand-in".into())
        }
    }
}

/// `ws://` on a loopback host, any port (0: ephemeral).
fn is_loopback_listen(url: &str) -> bool {
    agents_sim::exec_protocol::loopback_port(url, "ws://").is_some()
}

/// `http(s)://` on a loopback host with a port (with a path or not).
fn is_loopback_http(url: &str) -> bool {
    ["http://", "https://"]
        .iter()
        .any(|scheme| agents_sim::exec_protocol::loopback_port(url, scheme).is_some())
}

/// The listener's capability token from `--ws-auth capability-token --ws-token-file F`
/// (the file's content, trimmed, not empty); `None` without `--ws-auth`. Errors as codex
/// 0.171.0's (exit 1): a token file without `--ws-auth`, `capability-token` without a file,
/// an unreadable file. `signed-bearer-token` is not served by this stand-in.
fn listener_token(
    ws_auth: Option<WsAuth>,
    ws_token_file: Option<String>,
) -> Result<Option<String>, String> {
    match (ws_auth, ws_token_file) {
        (None, None) => Ok(None),
        (Some(WsAuth::CapabilityToken), Some(path)) => {
            let token = std::fs::read_to_string(&path)
                .map_err(|e| format!("failed to read websocket auth secret {path}: {e}"))?;
            let token = token.trim();
            if token.is_empty() {
                return Err(format!("websocket auth secret {path} is empty"));
            }
            Ok(Some(token.to_owned()))
        }
        (Some(WsAuth::CapabilityToken), None) => Err(
            "`--ws-token-file` or `--ws-token-sha256` is required when `--ws-auth capability-token` is set"
                .into(),
        ),
        (Some(WsAuth::SignedBearerToken), _) => {
            Err("--ws-auth signed-bearer-token is not served by this stand-in".into())
        }
        (None, Some(_)) => Err(
            "websocket auth flags require `--ws-auth capability-token` or `--ws-auth signed-bearer-token`"
                .into(),
        ),
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
            .ok_or_else(|| {
                "remote exec-server registration requires API key authentication: set CODEX_API_KEY"
                    .to_owned()
            });
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
        ExitCode::FAILURE
    })
}

async fn listen(url: &str, token: Option<String>) -> ExitCode {
    let listener = match bind(url).await {
        Ok(l) => l,
        Err(code) => return code,
    };
    // As codex: the bound URL on stdout (the only way to learn an ephemeral port).
    let bound = match listener.local_addr() {
        Ok(a) => format!("ws://{a}"),
        Err(_) => url.to_owned(),
    };
    println!("{bound}");
    log(&format!(
        "listening on {bound} (no key{})",
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

async fn run(cli: Cli) -> ExitCode {
    let args = match mode_of(cli) {
        Ok(Mode::Register(a)) => a,
        Ok(Mode::Listen(url, token)) => return listen(&url, token).await,
        Err(msg) => {
            log(&msg);
            return ExitCode::FAILURE;
        }
    };
    let key = match read_key(args.bearer_stdin).await {
        Ok(k) => k,
        Err(msg) => {
            log(&msg);
            return ExitCode::FAILURE;
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
                    return ExitCode::FAILURE;
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
    // Usage errors exit 2 with clap's message, as codex's do; --help and --version exit 0.
    let cli = <Cli as clap::Parser>::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            log(&format!("cannot start the runtime: {err}"));
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run(cli));
    // A pending stdin read runs on a blocking thread that would hold up runtime shutdown.
    runtime.shutdown_background();
    code
}
