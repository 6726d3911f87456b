//! Building and watching the children of a start: the executor's command and
//! environment (single or split mode), the forwarder's command with the key handover,
//! the listening executor's loopback URL and token file, and the waiter that records
//! the executor's exit.

use super::command::{ExecutorCommand, executor_process};
use super::forwarder::ForwarderCommand;
use super::key::key_pipe;
use super::pool;
use super::rows::{InstanceRow, mark_stopped};
use super::{DEP, ExitInfo, ProcessCompute};
use sandbox_controller::ports::PortError;
use sandbox_core::decision::StartSpec;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(super) enum Spawned {
    Existing(InstanceRow),
    New(
        InstanceRow,
        tokio::process::Child,
        Option<Box<tokio::process::Child>>,
    ),
    Failed(String),
}

impl ProcessCompute {
    /// Records `child` (the executor of instance `id`) as this process's own and awaits
    /// its exit in the background: the exit status is recorded and the instance marked
    /// stopped. `cleanup` (a pool member's directory, or the link left where it
    /// was once claimed) is removed after the exit.
    pub(super) fn watch_executor(
        &self,
        id: String,
        mut child: tokio::process::Child,
        cleanup: Option<PathBuf>,
    ) {
        self.inner
            .children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), None);
        let children = Arc::clone(&self.inner.children);
        let db = self.inner.db.clone();
        tokio::spawn(async move {
            match child.wait().await {
                Ok(status) => {
                    let exit = ExitInfo::from(status);
                    children
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id.clone(), Some(exit));
                    tracing::info!(instance_id = %id, code = ?exit.code, signal = ?exit.signal, "executor exited");
                    let id2 = id.clone();
                    if let Err(e) = db
                        .call(DEP, "reap", move |conn| {
                            Ok(mark_stopped(conn, &id2, Some(exit))?)
                        })
                        .await
                    {
                        tracing::error!(instance_id = %id, error = %e, "exit could not be recorded");
                    }
                }
                Err(e) => {
                    tracing::error!(instance_id = %id, error = %e, "waiting for the executor failed");
                }
            }
            if let Some(path) = cleanup {
                pool::remove_member_dir(&path);
            }
        });
    }

    pub(super) fn build_command(
        &self,
        spec: &StartSpec,
        key: &str,
        workspace: &Path,
    ) -> tokio::process::Command {
        let config = &self.inner.config;
        let mut cmd = executor_process(
            config.supervisor.as_ref(),
            &config.command.program,
            config.command.substituted(spec, workspace, ""),
        );
        self.base_env(&mut cmd, workspace);
        cmd.env("REMOTE_URL", &spec.remote_url)
            .env("ENVIRONMENT_ID", spec.environment_id.as_str())
            .env("CODEX_API_KEY", key)
            .process_group(0);
        cmd
    }

    /// Split mode: the executor (no key, no remote: only [`Self::base_env`]; with
    /// [`ProcessComputeConfig::relay`] its socket wants the token in `token_file`) and the
    /// forwarder ([`Self::forwarder_command`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn build_split_commands(
        &self,
        forwarder: &ExecutorCommand,
        spec: &StartSpec,
        key: &str,
        workspace: &Path,
        listen_url: &str,
        token_file: &Path,
    ) -> Result<(tokio::process::Command, ForwarderCommand), PortError> {
        let config = &self.inner.config;
        let mut executor = executor_process(
            config.supervisor.as_ref(),
            &config.command.program,
            self.listener_arguments(
                config.command.substituted(spec, workspace, listen_url),
                token_file,
            )?,
        );
        self.base_env(&mut executor, workspace);
        executor.process_group(0);
        let fwd =
            self.forwarder_command(forwarder, spec, key, workspace, listen_url, token_file)?;
        Ok((executor, fwd))
    }

    /// A listening executor's arguments: `args`, plus (with [`ProcessComputeConfig::relay`])
    /// the capability-token options over a fresh token written to `token_file` (0600).
    pub(super) fn listener_arguments(
        &self,
        mut args: Vec<String>,
        token_file: &Path,
    ) -> Result<Vec<String>, PortError> {
        if self.inner.config.relay {
            crate::executor_relay::write_token_file(token_file).map_err(|e| {
                PortError::transient(
                    DEP,
                    "start",
                    format!(
                        "token file {} could not be written: {e}",
                        token_file.display()
                    ),
                )
            })?;
            args.extend(ExecutorCommand::listener_auth_arguments(token_file));
        }
        Ok(args)
    }

    /// The forwarder, the key holder: its command with the assignment (`$LISTEN_URL` =
    /// the executor, or with [`ProcessComputeConfig::relay`] the relay its supervisor
    /// serves in front of it, `sandboxctl supervise --relay-listen R --relay-to L
    /// --relay-token-file T -- FORWARDER...`), [`Self::base_env`] plus `REMOTE_URL` and
    /// `ENVIRONMENT_ID`, and the key on a pipe as its stdin (one line) when it reads
    /// `--registration-bearer-stdin`, else in `CODEX_API_KEY`.
    pub(super) fn forwarder_command(
        &self,
        forwarder: &ExecutorCommand,
        spec: &StartSpec,
        key: &str,
        workspace: &Path,
        listen_url: &str,
        token_file: &Path,
    ) -> Result<ForwarderCommand, PortError> {
        let config = &self.inner.config;
        let mut fwd = match (&config.supervisor, config.relay) {
            (Some(sup), true) => {
                let relay_url = free_loopback_url()?;
                let mut cmd = tokio::process::Command::new(&sup.program);
                let prefix = sup
                    .args
                    .strip_suffix(&["--".to_owned()])
                    .unwrap_or(&sup.args);
                cmd.args(prefix)
                    .args(["--relay-listen", &relay_url, "--relay-to", listen_url])
                    .arg("--relay-token-file")
                    .arg(token_file)
                    .arg("--")
                    .arg(&forwarder.program)
                    .args(forwarder.substituted(spec, workspace, &relay_url));
                cmd
            }
            _ => {
                let mut cmd = tokio::process::Command::new(&forwarder.program);
                cmd.args(forwarder.substituted(spec, workspace, listen_url));
                cmd
            }
        };
        self.base_env(&mut fwd, workspace);
        fwd.env("REMOTE_URL", &spec.remote_url)
            .env("ENVIRONMENT_ID", spec.environment_id.as_str());
        if forwarder.bearer_on_stdin() {
            fwd.stdin(key_pipe(key)?);
        } else {
            fwd.env("CODEX_API_KEY", key);
        }
        Ok(ForwarderCommand(fwd))
    }

    /// The environment every child gets: cleared, then the inherited variables, `HOME` =
    /// the workspace and the extra variables; cwd the workspace, stdin `/dev/null`.
    pub(super) fn base_env(&self, cmd: &mut tokio::process::Command, workspace: &Path) {
        let config = &self.inner.config;
        cmd.env_clear();
        for name in &config.inherit_env {
            if let Some(v) = std::env::var_os(name) {
                cmd.env(name, v);
            }
        }
        cmd.env("HOME", workspace);
        for (k, v) in &config.extra_env {
            if !matches!(
                k.as_str(),
                "REMOTE_URL" | "ENVIRONMENT_ID" | "CODEX_API_KEY"
            ) {
                cmd.env(k, v);
            }
        }
        cmd.current_dir(workspace)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(false);
    }
}

/// The capability-token file of a listening executor: beside its log, `<log stem>.ws-token`.
pub(super) fn token_file(log_path: &Path) -> PathBuf {
    log_path.with_extension("ws-token")
}

/// A free loopback port for a listening executor: bound, read and released (the executor
/// binds it a moment later; a collision makes that start fail visibly, and the next
/// generation gets another port).
pub(super) fn free_loopback_url() -> Result<String, PortError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| {
        PortError::transient(DEP, "start", format!("no free loopback port: {}", e.kind()))
    })?;
    let port = listener
        .local_addr()
        .map_err(|e| {
            PortError::transient(DEP, "start", format!("no free loopback port: {}", e.kind()))
        })?
        .port();
    Ok(format!("ws://127.0.0.1:{port}"))
}
