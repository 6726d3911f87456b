//! Every command line the product hands `codex`, run through the pinned binary
//! (infra/executor, `npm ci`), never a stub that records arguments.
//!
//! ../shared/reference/executor-protocol.md, "Command lines": the options of `forward`
//! belong to it, and 0.171.0 refuses them before it with a usage error (exit 2). A
//! `--help` run proves nothing about a command line, so each line here really runs:
//!
//! - a listener (`--listen ws://127.0.0.1:P`) must accept a TCP connection on `P`;
//! - a key holder (the forwarder, or the single-process executor) must reach registration:
//!   a `POST {remote}/cloud/environment/{id}/register` with the key as its bearer arrives
//!   at a recording HTTP server on 127.0.0.1 (it answers 401, so nothing goes further).
//!
//! The lines come from where the product builds them: `ExecutorCommand` of local mode
//! (single, listener, forwarder; a local pool member's forwarder uses the same
//! [`ExecutorCommand::arguments`]) and the Fargate entrypoint (`infra/executor/entrypoint.sh`,
//! roles `executor`, `forwarder`, `single`), with the real codex first on `PATH`. The
//! warm-pool path of the entrypoint (the assignment read from DynamoDB) runs the real codex
//! in infra/tests/test_await_assignment.py; `fargate_entrypoint.rs` relays a turn through both
//! roles, cold and warm, with the simulator.

use anyhow::{Context, bail};
use sandbox_core::ids::{EnvironmentId, Generation, SessionId, idempotency_token};
use sandbox_core::outcome::StartSpec;
use sandbox_e2e::{free_port, pinned_codex, pinned_codex_on_path};
use sandbox_local::process_compute::ExecutorCommand;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const KEY: &str = "sk-test-executor-key";
const ENV_ID: &str = "env_cmdline0123456789abcdef";
/// Starting the real codex on a loaded 2-core machine can take seconds.
const PATIENCE: Duration = Duration::from_secs(30);

/// A recording registration endpoint: every request's head (request line and headers,
/// lower-cased names) is kept, and each is answered 401 in the real API's error shape.
struct Registry {
    base: String,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Registry {
    async fn start() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}/v1", listener.local_addr()?);
        let heads = Arc::new(Mutex::new(Vec::new()));
        let kept = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    kept.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&buf).to_lowercase());
                    let body = r#"{"error":{"code":"invalid_api_key","message":"Incorrect API key provided."}}"#;
                    let answer = format!(
                        "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(answer.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        Ok(Self { base, heads })
    }

    /// Whether a registration of [`ENV_ID`] with [`KEY`] as bearer arrived.
    fn registered(&self) -> bool {
        let path = format!("post /v1/cloud/environment/{ENV_ID}/register ");
        let bearer = format!("authorization: bearer {}", KEY.to_lowercase());
        self.heads
            .lock()
            .unwrap()
            .iter()
            .any(|h| h.starts_with(&path) && h.contains(&bearer))
    }

    fn clear(&self) {
        self.heads.lock().unwrap().clear();
    }
}

/// What a command line must show to count as accepted.
#[derive(Clone, Copy, Debug)]
enum Proof {
    /// It listens on the port of its `--listen` URL.
    Listens(u16),
    /// It sent the registration to [`Registry`].
    Registers,
}

/// Runs `cmd` (in a process group of its own, ended afterwards) until `proof` is seen, and
/// fails with its stderr when it exits first (a usage error: exit 2) or never shows it.
async fn runs(
    what: &str,
    mut cmd: Command,
    proof: Proof,
    registry: &Registry,
) -> anyhow::Result<()> {
    registry.clear();
    let stderr = tempfile::NamedTempFile::new()?;
    // The key on stdin, one line, for a command that reads it there (as the process
    // compute hands it over), else nothing on stdin.
    let bearer_stdin = cmd.get_args().any(|a| a == "--registration-bearer-stdin");
    cmd.stdin(if bearer_stdin {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::null())
    .stderr(stderr.reopen()?);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().with_context(|| format!("{what}: spawn"))?;
    if let Some(mut stdin) = child.stdin.take() {
        std::io::Write::write_all(&mut stdin, format!("{KEY}\n").as_bytes())?;
    }
    let outcome = wait_for_proof(&mut child, proof, registry).await;
    end_group(&mut child);
    let err = std::fs::read_to_string(stderr.path()).unwrap_or_default();
    match outcome {
        Ok(()) => Ok(()),
        Err(why) => bail!("{what}: {why}; stderr:\n{err}"),
    }
}

async fn wait_for_proof(
    child: &mut Child,
    proof: Proof,
    registry: &Registry,
) -> Result<(), String> {
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        let shown = match proof {
            Proof::Listens(port) => tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok(),
            Proof::Registers => registry.registered(),
        };
        if shown {
            return Ok(());
        }
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("exited with {status} before it {proof:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("did not show {proof:?} within {PATIENCE:?}"))
}

fn end_group(child: &mut Child) {
    // SIGKILL to the whole group (codex's own children included), then reap.
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status();
    let _ = child.kill();
    let _ = child.wait();
}

fn spec(remote_url: &str) -> StartSpec {
    let environment_id = EnvironmentId::new(ENV_ID);
    StartSpec {
        idempotency_token: idempotency_token(&environment_id, Generation(1)),
        environment_id,
        session_id: SessionId::new("sess_cmdline0123456789abcdef"),
        remote_url: remote_url.to_owned(),
        workspace_directory: "/workspace".into(),
        generation: Generation(1),
        previous: None,
        restore: None,
    }
}

/// A local-mode command as the process compute starts it: the substituted arguments, the
/// key on stdin for a command with `--registration-bearer-stdin` ([`runs`] writes it), else
/// in `CODEX_API_KEY`, `HOME` in a scratch directory (codex keeps state there).
fn local(command: &ExecutorCommand, spec: &StartSpec, listen: &str, home: &Path) -> Command {
    let args = command.arguments(spec, home, listen);
    let mut cmd = Command::new(&command.program);
    cmd.env_clear();
    if !args.iter().any(|a| a == "--registration-bearer-stdin") {
        cmd.env("CODEX_API_KEY", KEY);
    }
    cmd.args(args)
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home);
    cmd
}

/// The Fargate entrypoint in role `role`, with the pinned codex first on `PATH`.
fn entrypoint(
    role: &str,
    url: Option<&str>,
    env: &[(&str, &str)],
    bin: &Path,
    home: &Path,
) -> Command {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../infra/executor/entrypoint.sh");
    let mut cmd = Command::new("/bin/sh");
    cmd.arg(script).arg(role).args(url).env_clear().env(
        "PATH",
        format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        ),
    );
    cmd.env("HOME", home);
    // The recorded registration is http on 127.0.0.1; the entrypoint requires https unless
    // this test-only variable (never set by a template) says otherwise.
    cmd.env("SANDBOX_TEST_ONLY_LOOPBACK_HTTP", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_codex_command_line_runs_with_the_pinned_binary() -> anyhow::Result<()> {
    let codex = pinned_codex()?;
    let scratch = tempfile::tempdir()?;
    let home = scratch.path();
    let bin = pinned_codex_on_path(home)?;
    let registry = Registry::start().await?;
    let spec = spec(&registry.base);
    let program = |c: ExecutorCommand| ExecutorCommand::new(codex.display().to_string(), c.args);

    // The check can fail: the 0.169 form (options before `forward`) is refused by 0.171.0.
    let old_form = ExecutorCommand::new(
        codex.display().to_string(),
        [
            "exec-server",
            "--remote",
            "$REMOTE_URL",
            "--environment-id",
            "$ENVIRONMENT_ID",
            "forward",
            "--connect",
            "$LISTEN_URL",
        ],
    );
    let refused = runs(
        "the 0.169 forwarder form",
        local(&old_form, &spec, "ws://127.0.0.1:9", home),
        Proof::Registers,
        &registry,
    )
    .await;
    let why = refused.expect_err("codex 0.171.0 refuses options before `forward`");
    assert!(
        why.to_string().contains("exit status: 2"),
        "a usage error, exit 2: {why:#}"
    );

    // Local mode: single process, listener, forwarder.
    runs(
        "local single (ExecutorCommand::codex_exec_server)",
        local(
            &program(ExecutorCommand::codex_exec_server()),
            &spec,
            "",
            home,
        ),
        Proof::Registers,
        &registry,
    )
    .await?;
    let port = free_port();
    let listen = format!("ws://127.0.0.1:{port}");
    runs(
        "local listener (ExecutorCommand::codex_listen)",
        local(
            &program(ExecutorCommand::codex_listen()),
            &spec,
            &listen,
            home,
        ),
        Proof::Listens(port),
        &registry,
    )
    .await?;
    // The listener as the relay mode starts it: its socket wants a capability token.
    let token_file = home.join("listener.ws-token");
    std::fs::write(&token_file, "0123456789abcdef")?;
    let mut with_token = program(ExecutorCommand::codex_listen());
    with_token
        .args
        .extend(ExecutorCommand::listener_auth_arguments(&token_file));
    let port = free_port();
    runs(
        "local listener with a capability token (ExecutorCommand::listener_auth_arguments)",
        local(&with_token, &spec, &format!("ws://127.0.0.1:{port}"), home),
        Proof::Listens(port),
        &registry,
    )
    .await?;
    runs(
        "local forwarder (ExecutorCommand::codex_forward)",
        local(
            &program(ExecutorCommand::codex_forward()),
            &spec,
            &listen,
            home,
        ),
        Proof::Registers,
        &registry,
    )
    .await?;

    // The Fargate entrypoint's roles, as the task definition starts them.
    let port = free_port();
    let listen = format!("ws://127.0.0.1:{port}");
    runs(
        "entrypoint role executor",
        entrypoint("executor", Some(&listen), &[], &bin, home),
        Proof::Listens(port),
        &registry,
    )
    .await?;
    let inputs = [
        ("REMOTE_URL", registry.base.as_str()),
        ("ENVIRONMENT_ID", ENV_ID),
        ("CODEX_API_KEY", KEY),
    ];
    runs(
        "entrypoint role forwarder",
        entrypoint("forwarder", Some(&listen), &inputs, &bin, home),
        Proof::Registers,
        &registry,
    )
    .await?;
    runs(
        "entrypoint role single",
        entrypoint("single", None, &inputs, &bin, home),
        Proof::Registers,
        &registry,
    )
    .await?;
    Ok(())
}
