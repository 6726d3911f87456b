//! `sandboxctl serve` as a child process, the way an operator runs it: the command line the
//! end-to-end tests share, waiting for its webhook port, and a reaper that ends what a
//! failed assertion would leave running (the controllers and their executors).

use crate::{SIM_REMOTE_URL_HOST, os_executors, workspace_binary};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `sandboxctl serve` against the simulator at `sim_base`, listening on `127.0.0.1:port`,
/// with its data in `dir/data`, the simulator's executor stand-in and key file
/// (`dir/executor.key`, written here), the simulator's `remote_url` host allowed and
/// `--stop-executors-on-exit`; `extra` flags come before the executor's arguments.
///
/// The environment is cleared but for `PATH`, `OPENAI_API_KEY` (the simulator's) and
/// `RUST_LOG` (`E2E_SERVE_LOG`, default `warn`): the caller sets the webhook secret
/// variables. Standard output is discarded, standard error inherited.
///
/// # Panics
/// When the binaries are not built or the key file cannot be written.
pub fn serve_command(dir: &Path, sim_base: &str, port: u16, extra: &[&str]) -> Command {
    let key_file = dir.join("executor.key");
    std::fs::write(&key_file, agents_sim::DEFAULT_EXECUTOR_KEY).unwrap();
    // serve refuses a key file others can read.
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let mut cmd = Command::new(workspace_binary("sandboxctl").unwrap());
    cmd.arg("serve")
        .args(["--agents-api", sim_base])
        .args(["--executor-key-file", key_file.to_str().unwrap()])
        .args([
            "--executor",
            workspace_binary("sim-executor").unwrap().to_str().unwrap(),
        ])
        .args(["--data-dir", dir.join("data").to_str().unwrap()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        // The simulator's remote_url is http://127.0.0.1:PORT/... (the remote URL allowlist).
        .args(["--remote-url-allow", SIM_REMOTE_URL_HOST])
        .arg("--stop-executors-on-exit")
        .args(extra)
        // The stand-in in single mode, as codex: `exec-server --remote URL --environment-id ID`.
        .arg("--")
        .args(sandbox_local::process_compute::ExecutorCommand::codex_exec_server().args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("OPENAI_API_KEY", agents_sim::DEFAULT_API_KEY)
        .env(
            "RUST_LOG",
            std::env::var("E2E_SERVE_LOG").unwrap_or("warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    cmd
}

pub use crate::free_port;

/// Waits up to 30 s for something to listen on `127.0.0.1:port`.
///
/// # Panics
/// Nothing listened in time.
pub async fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "serve never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kills (SIGKILL), on drop, the processes in `pids` and the executors of `env`: what a
/// failed assertion would otherwise leave running.
#[derive(Default)]
pub struct Reaper {
    /// Controller processes.
    pub pids: Vec<u32>,
    /// The environment whose executors to end.
    pub env: Option<String>,
}

impl Drop for Reaper {
    fn drop(&mut self) {
        let mut pids = self.pids.clone();
        if let Some(env) = &self.env {
            pids.extend(os_executors(Some(env)));
        }
        for pid in pids {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

/// The simulator, delivering its webhooks to `127.0.0.1:port/webhook` signed with its
/// default secret.
///
/// # Panics
/// When it cannot start.
pub async fn sim_delivering_to(port: u16) -> agents_sim::SimHandle {
    agents_sim::spawn(agents_sim::SimConfig::default().with_webhook(
        agents_sim::Url::parse(&format!("http://127.0.0.1:{port}/webhook")).unwrap(),
        agents_sim::DEFAULT_WEBHOOK_SECRET,
    ))
    .await
    .unwrap()
}

/// Sends `serve` SIGINT (Ctrl-C) and waits for it to exit, off the async runtime.
///
/// # Panics
/// When the signal or the wait fails.
pub async fn interrupt(mut child: std::process::Child) -> std::process::ExitStatus {
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap()
}
