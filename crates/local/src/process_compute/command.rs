//! [`ExecutorCommand`]: the executor (or forwarder, or supervisor) program and its
//! arguments, with the placeholders a start replaces, and the process command built
//! from it under the configured supervisor.

use sandbox_core::decision::StartSpec;
use std::path::Path;

/// The executor program and its arguments.
///
/// An argument that is exactly one of `$REMOTE_URL`, `$ENVIRONMENT_ID`, `$SESSION_ID`,
/// `$GENERATION`, `$WORKSPACE_DIR` (or the `${NAME}` form) is replaced by that value at
/// each start. Nothing else is substituted, so a `sh -c` script sees `"$REMOTE_URL"` as
/// shell code and expands it from its environment (a URL is never spliced into shell
/// code). The key is never substituted: it only travels in the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutorCommand {
    /// The program (looked up on the child's `PATH` when it has no `/`).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
}

impl ExecutorCommand {
    /// A program with arguments. A relative program path with a `/`
    /// (`target/debug/sim-executor`) is made absolute against the current directory now:
    /// the child starts in its workspace directory, where the relative path would name
    /// nothing (`std::process::Command` resolves it against the child's directory).
    pub fn new(
        program: impl Into<String>,
        args: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        let program: String = program.into();
        let program = if program.contains('/') && !program.starts_with('/') {
            std::path::absolute(&program)
                .map(|p| p.display().to_string())
                .unwrap_or(program)
        } else {
            program
        };
        Self {
            program,
            args: args.into_iter().map(Into::into).collect(),
        }
    }

    /// The production executor:
    /// `codex exec-server --remote $REMOTE_URL --environment-id $ENVIRONMENT_ID`
    /// (agents-api.md: the executor).
    pub fn codex_exec_server() -> Self {
        Self::new(
            "codex",
            [
                "exec-server",
                "--remote",
                "$REMOTE_URL",
                "--environment-id",
                "$ENVIRONMENT_ID",
            ],
        )
    }

    /// The split mode's executor: `codex exec-server --listen $LISTEN_URL` (no key).
    pub fn codex_listen() -> Self {
        Self::listen("codex")
    }

    /// The split mode's forwarder (the key holder): `codex exec-server forward --remote
    /// $REMOTE_URL --environment-id $ENVIRONMENT_ID --connect $LISTEN_URL`. The options
    /// belong to `forward`: codex 0.171.0 refuses them before it (exit 2;
    /// ../shared/reference/executor-protocol.md, "Command lines").
    pub fn codex_forward() -> Self {
        Self::forward("codex")
    }

    /// `program exec-server --listen $LISTEN_URL`, the split mode's executor of
    /// any program speaking `codex exec-server`'s arguments (the real `codex`, the
    /// `sim-executor` stand-in).
    pub fn listen(program: impl Into<String>) -> Self {
        Self::new(program, ["exec-server", "--listen", "$LISTEN_URL"])
    }

    /// `program exec-server forward --remote $REMOTE_URL --environment-id
    /// $ENVIRONMENT_ID --connect $LISTEN_URL`, the split mode's forwarder of any program
    /// speaking `codex exec-server`'s arguments (options after `forward`, as codex 0.171.0
    /// requires).
    pub fn forward(program: impl Into<String>) -> Self {
        Self::new(
            program,
            [
                "exec-server",
                "forward",
                "--remote",
                "$REMOTE_URL",
                "--environment-id",
                "$ENVIRONMENT_ID",
                "--connect",
                "$LISTEN_URL",
                "--registration-bearer-stdin",
            ],
        )
    }

    /// The arguments that make a listening executor admit only clients that present the
    /// capability token in `token_file` (`Authorization: Bearer <token>`; codex 0.171.0
    /// answers any other upgrade request 401): `--ws-auth capability-token --ws-token-file
    /// <absolute path>`. Appended to the executor's arguments when
    /// [`ProcessComputeConfig::relay`] is on.
    pub fn listener_auth_arguments(token_file: &Path) -> Vec<String> {
        vec![
            "--ws-auth".to_owned(),
            "capability-token".to_owned(),
            "--ws-token-file".to_owned(),
            token_file.display().to_string(),
        ]
    }

    /// Whether the command reads the registration bearer from stdin
    /// (`--registration-bearer-stdin`): the key is then piped to it, not put in its
    /// environment.
    pub(super) fn bearer_on_stdin(&self) -> bool {
        self.args.iter().any(|a| a == "--registration-bearer-stdin")
    }

    /// Whether an argument names a value of the assignment (`$REMOTE_URL`,
    /// `$ENVIRONMENT_ID`, `$SESSION_ID`, `$GENERATION`): a command that does cannot be
    /// started before its assignment (a pool member's executor).
    pub(super) fn needs_assignment(&self) -> bool {
        self.args.iter().any(|a| {
            matches!(
                placeholder(a),
                Some("REMOTE_URL" | "ENVIRONMENT_ID" | "SESSION_ID" | "GENERATION")
            )
        })
    }

    /// The arguments with each placeholder `lookup` knows replaced; the others verbatim.
    pub(super) fn substituted_with(&self, lookup: impl Fn(&str) -> Option<String>) -> Vec<String> {
        self.args
            .iter()
            .map(|a| {
                placeholder(a)
                    .and_then(&lookup)
                    .unwrap_or_else(|| a.clone())
            })
            .collect()
    }

    /// The arguments of a command started before its assignment (a pool
    /// member's executor): only `$WORKSPACE_DIR` and `$LISTEN_URL` are replaced (the caller
    /// checked [`Self::needs_assignment`]).
    pub(super) fn substituted_unassigned(&self, workspace: &Path, listen_url: &str) -> Vec<String> {
        self.substituted_with(|name| match name {
            "WORKSPACE_DIR" => Some(workspace.display().to_string()),
            "LISTEN_URL" => Some(listen_url.to_owned()),
            _ => None,
        })
    }

    /// The argument vector this command gets for `spec`: every placeholder replaced
    /// (`$REMOTE_URL`, `$ENVIRONMENT_ID`, `$SESSION_ID`, `$GENERATION`, `$WORKSPACE_DIR`,
    /// and `$LISTEN_URL` unless `listen_url` is empty), the rest verbatim. Exactly what a
    /// start hands the program (tests run it through the pinned codex).
    pub fn arguments(&self, spec: &StartSpec, workspace: &Path, listen_url: &str) -> Vec<String> {
        self.substituted(spec, workspace, listen_url)
    }

    pub(super) fn substituted(
        &self,
        spec: &StartSpec,
        workspace: &Path,
        listen_url: &str,
    ) -> Vec<String> {
        self.substituted_with(|name| match name {
            "REMOTE_URL" => Some(spec.remote_url.clone()),
            "ENVIRONMENT_ID" => Some(spec.environment_id.as_str().to_owned()),
            "SESSION_ID" => Some(spec.session_id.as_str().to_owned()),
            "GENERATION" => Some(spec.generation.0.to_string()),
            "WORKSPACE_DIR" => Some(workspace.display().to_string()),
            "LISTEN_URL" if !listen_url.is_empty() => Some(listen_url.to_owned()),
            _ => None,
        })
    }
}

/// The placeholder an argument is (`$NAME` or `${NAME}`), if it is one.
pub(super) fn placeholder(arg: &str) -> Option<&str> {
    arg.strip_prefix("${")
        .and_then(|s| s.strip_suffix('}'))
        .or_else(|| arg.strip_prefix('$'))
}

/// `tokio::process::Command` for the executor `program` with `args`, under the configured
/// supervisor when there is one ([`ProcessComputeConfig::supervisor`]).
pub(crate) fn executor_process(
    supervisor: Option<&ExecutorCommand>,
    program: &str,
    args: Vec<String>,
) -> tokio::process::Command {
    match supervisor {
        Some(sup) => {
            let mut cmd = tokio::process::Command::new(&sup.program);
            cmd.args(&sup.args).arg(program).args(args);
            cmd
        }
        None => {
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args);
            cmd
        }
    }
}
