//! [`ProcessCompute`]: the compute provider as real child processes, one executor process
//! per environment and generation (Unix only).
//!
//! - **Start** spawns the configured executor command (the real one is
//!   `codex exec-server --remote "$REMOTE_URL" --environment-id "$ENVIRONMENT_ID"`; see
//!   [`ExecutorCommand::codex_exec_server`]) in its own process group, with a cleared
//!   environment plus: `REMOTE_URL` (unchanged), `ENVIRONMENT_ID`, `CODEX_API_KEY` (read
//!   from the configured [`KeySource`] at each start, never logged, never in an error or
//!   `Debug`), `HOME` = the workspace, the variables named in
//!   [`ProcessComputeConfig::inherit_env`] and [`ProcessComputeConfig::extra_env`]. The
//!   working directory is the environment's workspace `<workspace_root>/<environment_id>`;
//!   stdout and stderr are appended to `executor-g<generation>.log` there; stdin is
//!   `/dev/null`. Its tags (deployment, environment, session, generation, idempotency
//!   token), pid, `/proc` start time, status and exit status are stored in SQLite table
//!   `compute_instances`, in the same transaction as the spawn. A start whose
//!   (deployment, idempotency token) already has an instance returns that instance and
//!   spawns nothing.
//! - **Read-back** (`describe`, `list`) refreshes liveness from the OS, never from memory
//!   alone: a child this process spawned is reaped by a task awaiting `wait()` (exit status
//!   recorded); a child adopted from a previous controller process is alive while
//!   `/proc/<pid>/stat` exists, is not a zombie and shows the recorded start time (so a
//!   reused pid reads as gone). A gone process reads `Stopped`.
//! - **Stop** sends SIGTERM to the process group, then SIGKILL once
//!   [`ProcessComputeConfig::stop_grace`] (default 10 s) has passed, then marks it stopped
//!   when gone. The escalation runs in the background; if the controller exits meanwhile,
//!   the next read-back after the grace sends the SIGKILL.
//! - **Split mode** (issue 26, [`ProcessComputeConfig::forwarder`] set): two children per
//!   instance in one process group. The *executor* (the configured command, e.g.
//!   `codex exec-server --listen $LISTEN_URL`) starts first, as the group leader, with a
//!   cleared environment that holds no key and no `REMOTE_URL` / `ENVIRONMENT_ID`: only
//!   `HOME` = the workspace, [`ProcessComputeConfig::inherit_env`] and
//!   [`ProcessComputeConfig::extra_env`]. `$LISTEN_URL` is `ws://127.0.0.1:PORT`, a port
//!   free at start. The *forwarder* (`... forward --connect $LISTEN_URL`) joins its group
//!   with the executor's variables plus `REMOTE_URL`, `ENVIRONMENT_ID` and `CODEX_API_KEY`:
//!   it alone holds the key. The recorded pid is the executor's; the forwarder's pid and
//!   start time go to table `compute_forwarders` in the same transaction. When the
//!   forwarder exits, the group is sent SIGTERM (the forwarder is essential, as in the
//!   Fargate task): a forwarder this process spawned is awaited; one adopted after a
//!   restart is watched through `/proc` every [`ADOPTED_FORWARDER_POLL`] (only its parent
//!   can await it). Both run as the controller's user: see the README's security section
//!   for what a same-user sandbox can still read.
//! - **Controller exit**: children survive a controller crash and are adopted by the next
//!   `ProcessCompute` over the same database. [`ProcessCompute::shutdown_all`] stops every
//!   live child the database knows (the demo calls it to leave no process behind);
//!   [`ProcessComputeConfig::kill_on_drop`] kills them when the last handle drops.

mod exit_tail;
mod pool;

use crate::db::{Db, DbError, from_sql_int, now_ms, to_sql_int};
use crate::workspace_archive as ws;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};
use sandbox_controller::ports::{Clock, Compute, PortError, Started, SystemClock, check_deadline};
use sandbox_controller::ports::{StoredKind, StoredWorkspace, Workspaces};
use sandbox_core::compute::{
    ComputeInstance, ComputeStatus, ESSENTIAL_CONTAINER_EXITED, ExitDetail,
};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation, InstanceId, SessionId};
use sandbox_core::workspace::{SnapshotState, WorkspaceDisposition};
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DEP: &str = "compute";

/// ECS `stopCode` of a task a user (here: the controller, an operator) stopped.
const USER_INITIATED: &str = "UserInitiated";

/// How often a stop or a shutdown looks whether a process is gone.
const POLL: Duration = Duration::from_millis(50);
/// How long to wait for a process to disappear after SIGKILL before giving up waiting.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// How often the watcher of an adopted forwarder (split mode, after a controller restart)
/// reads its liveness from `/proc`.
pub const ADOPTED_FORWARDER_POLL: Duration = Duration::from_millis(200);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS compute_instances (
    instance_id TEXT PRIMARY KEY,
    deployment TEXT NOT NULL,
    environment_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    idempotency_token TEXT NOT NULL,
    pid INTEGER NOT NULL,
    proc_start_ticks INTEGER,
    started_at_ms INTEGER NOT NULL,
    status TEXT NOT NULL,
    exit_code INTEGER,
    exit_signal INTEGER,
    stop_reason TEXT,
    stop_requested_at_ms INTEGER,
    stopped_at_ms INTEGER,
    workspace TEXT NOT NULL,
    log_path TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS compute_instances_token
    ON compute_instances (deployment, idempotency_token);
CREATE INDEX IF NOT EXISTS compute_instances_deployment
    ON compute_instances (deployment, started_at_ms);
CREATE TABLE IF NOT EXISTS compute_forwarders (
    instance_id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    proc_start_ticks INTEGER
);
CREATE TABLE IF NOT EXISTS compute_pool (
    instance_id TEXT PRIMARY KEY,
    deployment TEXT NOT NULL,
    state TEXT NOT NULL,
    listen_url TEXT NOT NULL,
    member_dir TEXT NOT NULL,
    claimed_at_ms INTEGER
);
CREATE INDEX IF NOT EXISTS compute_pool_idle ON compute_pool (deployment, state);
";

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

    /// Issue 26, the split mode's executor: `codex exec-server --listen $LISTEN_URL` (no key).
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

    /// Issue 26: `program exec-server --listen $LISTEN_URL`, the split mode's executor of
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
    fn bearer_on_stdin(&self) -> bool {
        self.args.iter().any(|a| a == "--registration-bearer-stdin")
    }

    /// Whether an argument names a value of the assignment (`$REMOTE_URL`,
    /// `$ENVIRONMENT_ID`, `$SESSION_ID`, `$GENERATION`): a command that does cannot be
    /// started before its assignment (issue 27: a pool member's executor).
    fn needs_assignment(&self) -> bool {
        self.args.iter().any(|a| {
            matches!(
                placeholder(a),
                Some("REMOTE_URL" | "ENVIRONMENT_ID" | "SESSION_ID" | "GENERATION")
            )
        })
    }

    /// The arguments with each placeholder `lookup` knows replaced; the others verbatim.
    fn substituted_with(&self, lookup: impl Fn(&str) -> Option<String>) -> Vec<String> {
        self.args
            .iter()
            .map(|a| {
                placeholder(a)
                    .and_then(&lookup)
                    .unwrap_or_else(|| a.clone())
            })
            .collect()
    }

    /// The arguments of a command started before its assignment (issue 27, a pool
    /// member's executor): only `$WORKSPACE_DIR` and `$LISTEN_URL` are replaced (the caller
    /// checked [`Self::needs_assignment`]).
    fn substituted_unassigned(&self, workspace: &Path, listen_url: &str) -> Vec<String> {
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

    fn substituted(&self, spec: &StartSpec, workspace: &Path, listen_url: &str) -> Vec<String> {
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
fn placeholder(arg: &str) -> Option<&str> {
    arg.strip_prefix("${")
        .and_then(|s| s.strip_suffix('}'))
        .or_else(|| arg.strip_prefix('$'))
}

/// The executor's restricted environment key (`api.agents.environments.connect` only).
/// Its `Debug` is redacted; it has no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct ExecutorKey(String);

impl ExecutorKey {
    /// Wraps a key value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
}

impl fmt::Debug for ExecutorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ExecutorKey(<redacted>)")
    }
}

/// Where the executor key comes from. Read at every start (so a rotated key is picked up);
/// surrounding whitespace is trimmed; an empty value is an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// A file holding the key (e.g. a mounted secret).
    File(PathBuf),
    /// An environment variable of the controller holding the key.
    EnvVar(String),
    /// The key itself (tests, embedding).
    Value(ExecutorKey),
}

impl KeySource {
    /// Where the key lives, for the terminal record's `executor_credential` (issue 25):
    /// the file's path or the variable's name, never the key.
    pub fn location(&self) -> String {
        match self {
            Self::File(path) => format!("the executor key file {}", path.display()),
            Self::EnvVar(var) => format!("the controller's environment variable {var}"),
            Self::Value(_) => "the key the controller was given at start (embedded)".into(),
        }
    }

    /// The key. Errors name the source (path or variable), never the value.
    fn read(&self) -> Result<String, PortError> {
        let raw = match self {
            Self::File(path) => std::fs::read_to_string(path).map_err(|e| {
                PortError::permanent(
                    DEP,
                    "start",
                    format!(
                        "executor key file {} could not be read: {}",
                        path.display(),
                        e.kind()
                    ),
                )
            })?,
            Self::EnvVar(name) => std::env::var(name).map_err(|_| {
                PortError::permanent(
                    DEP,
                    "start",
                    format!("executor key variable {name} is not set (or not UTF-8)"),
                )
            })?,
            Self::Value(k) => k.0.clone(),
        };
        let key = raw.trim();
        if key.is_empty() || key.contains('\0') {
            return Err(PortError::permanent(
                DEP,
                "start",
                "executor key source is empty or holds a NUL byte",
            ));
        }
        Ok(key.to_owned())
    }
}

/// Configuration of [`ProcessCompute`].
#[derive(Clone, Debug)]
pub struct ProcessComputeConfig {
    /// The executor command.
    pub command: ExecutorCommand,
    /// Parent of the per-environment workspaces `<workspace_root>/<environment_id>`
    /// (created as needed; kept across generations).
    pub workspace_root: PathBuf,
    /// Where the executor key (`CODEX_API_KEY`) comes from.
    pub key_source: KeySource,
    /// SQLite file holding the instance table (may be the queue and registry file).
    pub state_db: PathBuf,
    /// Between SIGTERM and SIGKILL. Default: 10 s.
    pub stop_grace: Duration,
    /// Controller variables passed through to the executor when set. Default: `PATH`,
    /// `LANG`, `LC_ALL`, `TZ`, `SSL_CERT_FILE`, `SSL_CERT_DIR`, `HTTPS_PROXY`,
    /// `https_proxy`, `HTTP_PROXY`, `http_proxy`, `NO_PROXY`, `no_proxy`. Everything else
    /// (the application's own API key in particular) is withheld.
    pub inherit_env: Vec<String>,
    /// Extra variables for the executor (e.g. `RUST_LOG`); `REMOTE_URL`, `ENVIRONMENT_ID`
    /// and `CODEX_API_KEY` cannot be overridden. Default: none.
    pub extra_env: Vec<(String, String)>,
    /// How long `list` keeps returning a stopped instance. Default: 1 h (ECS keeps stopped
    /// tasks visible for about that long). `describe` always finds it.
    pub stopped_retention: Duration,
    /// Kill (SIGKILL, whole process group) every live child in the database when the last
    /// handle drops. Default: `false` (children outlive the controller and are adopted).
    pub kill_on_drop: bool,
    /// The forwarder command of the split mode (see the module docs), e.g.
    /// `codex exec-server forward --remote $REMOTE_URL --environment-id $ENVIRONMENT_ID
    /// --connect $LISTEN_URL`. `None` (default): the single-process mode, where the
    /// executor itself holds the key.
    pub forwarder: Option<ExecutorCommand>,
    /// The supervisor the executor runs under ([`crate::supervise`]), e.g.
    /// `sandboxctl supervise --`: the executor's program and arguments are appended to it,
    /// and the recorded pid is the supervisor's. It is a child subreaper, so a stop ends
    /// every descendant of the executor, also one that left its process group. `None`
    /// (default): the executor is spawned directly (its `setsid` descendants can outlive
    /// a stop).
    pub supervisor: Option<ExecutorCommand>,
    /// The executor's socket admits only its forwarder (split mode with a supervisor):
    /// each listening executor and pool member gets `--ws-auth capability-token
    /// --ws-token-file <log>.ws-token` (a fresh 0600 token), and the forwarder's
    /// `--connect` is a relay served by its supervisor that admits only sockets of the
    /// forwarder's process tree and adds the token ([`crate::executor_relay`]). Default:
    /// `false` (any local client can drive the executor; tests only). `open` refuses it
    /// without [`Self::forwarder`] and [`Self::supervisor`].
    pub relay: bool,
}

impl ProcessComputeConfig {
    /// A configuration with the defaults above.
    pub fn new(
        command: ExecutorCommand,
        workspace_root: impl Into<PathBuf>,
        key_source: KeySource,
        state_db: impl Into<PathBuf>,
    ) -> Self {
        Self {
            command,
            workspace_root: workspace_root.into(),
            key_source,
            state_db: state_db.into(),
            stop_grace: Duration::from_secs(10),
            inherit_env: [
                "PATH",
                "LANG",
                "LC_ALL",
                "TZ",
                "SSL_CERT_FILE",
                "SSL_CERT_DIR",
                "HTTPS_PROXY",
                "https_proxy",
                "HTTP_PROXY",
                "http_proxy",
                "NO_PROXY",
                "no_proxy",
            ]
            .map(str::to_owned)
            .to_vec(),
            extra_env: Vec::new(),
            stopped_retention: Duration::from_secs(3600),
            kill_on_drop: false,
            forwarder: None,
            supervisor: None,
            relay: false,
        }
    }
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitInfo {
    /// Exit code, when it exited.
    pub code: Option<i32>,
    /// Signal number, when a signal ended it (15 SIGTERM, 9 SIGKILL).
    pub signal: Option<i32>,
}

impl From<std::process::ExitStatus> for ExitInfo {
    fn from(s: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        Self {
            code: s.code(),
            signal: s.signal(),
        }
    }
}

/// Everything recorded about one instance (for `sandboxctl status` and tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    /// The instance as `describe` reports it.
    pub instance: ComputeInstance,
    /// Its deployment tag.
    pub deployment: String,
    /// The idempotency token it was started with.
    pub idempotency_token: String,
    /// Process id (and process group id).
    pub pid: u32,
    /// Working directory.
    pub workspace: PathBuf,
    /// Where its stdout and stderr go.
    pub log_path: PathBuf,
    /// How it ended, when known (always for children of this process; never for adopted
    /// ones, whose exit status only their parent sees).
    pub exit: Option<ExitInfo>,
    /// The reason given to `stop`, if stopped on request.
    pub stop_reason: Option<String>,
    /// When it was seen gone, Unix milliseconds.
    pub stopped_at_ms: Option<i64>,
}

/// A row of `compute_instances`.
#[derive(Clone, Debug)]
struct InstanceRow {
    instance_id: String,
    deployment: String,
    environment_id: String,
    session_id: String,
    generation: u64,
    idempotency_token: String,
    pid: i32,
    proc_start_ticks: Option<u64>,
    started_at_ms: i64,
    status: String,
    exit_code: Option<i32>,
    exit_signal: Option<i32>,
    stop_reason: Option<String>,
    stop_requested_at_ms: Option<i64>,
    stopped_at_ms: Option<i64>,
    workspace: String,
    log_path: String,
}

const COLUMNS: &str = "instance_id, deployment, environment_id, session_id, generation, \
    idempotency_token, pid, proc_start_ticks, started_at_ms, status, exit_code, exit_signal, \
    stop_reason, stop_requested_at_ms, stopped_at_ms, workspace, log_path";

const RUNNING: &str = "running";
const STOPPING: &str = "stopping";
const STOPPED: &str = "stopped";

impl InstanceRow {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            instance_id: r.get(0)?,
            deployment: r.get(1)?,
            environment_id: r.get(2)?,
            session_id: r.get(3)?,
            generation: from_sql_int(r.get(4)?),
            idempotency_token: r.get(5)?,
            pid: r.get(6)?,
            proc_start_ticks: r.get::<_, Option<i64>>(7)?.map(from_sql_int),
            started_at_ms: r.get(8)?,
            status: r.get(9)?,
            exit_code: r.get(10)?,
            exit_signal: r.get(11)?,
            stop_reason: r.get(12)?,
            stop_requested_at_ms: r.get(13)?,
            stopped_at_ms: r.get(14)?,
            workspace: r.get(15)?,
            log_path: r.get(16)?,
        })
    }

    fn status(&self) -> ComputeStatus {
        match self.status.as_str() {
            RUNNING => ComputeStatus::Running,
            STOPPING => ComputeStatus::Stopping,
            STOPPED => ComputeStatus::Stopped,
            _ => ComputeStatus::Pending,
        }
    }

    fn instance(&self) -> ComputeInstance {
        ComputeInstance {
            instance_id: InstanceId::new(self.instance_id.clone()),
            environment_id: EnvironmentId::new(self.environment_id.clone()),
            session_id: Some(SessionId::new(self.session_id.clone())),
            generation: Generation(self.generation),
            status: self.status(),
            started_at: Some(from_sql_int(self.started_at_ms) / 1000),
            stop_code: self.stop_code(),
            exit: (self.status() == ComputeStatus::Stopped).then(|| ExitDetail {
                reason: exit_tail::ended(self.exit_code, self.exit_signal),
                exit_code: self.exit_code,
                output: Vec::new(),
            }),
        }
    }

    /// The ECS `stopCode` a stopped child reads as: `UserInitiated` when a stop was
    /// requested (by the controller, an operator or a shutdown), else
    /// `EssentialContainerExited` (it ended by itself: the executor, or its forwarder,
    /// exited). `None` while it runs.
    fn stop_code(&self) -> Option<String> {
        (self.status() == ComputeStatus::Stopped).then(|| {
            if self.stop_requested_at_ms.is_some() {
                USER_INITIATED.to_owned()
            } else {
                ESSENTIAL_CONTAINER_EXITED.to_owned()
            }
        })
    }

    fn info(&self) -> ProcessInfo {
        let exit = (self.exit_code.is_some() || self.exit_signal.is_some()).then_some(ExitInfo {
            code: self.exit_code,
            signal: self.exit_signal,
        });
        ProcessInfo {
            instance: self.instance(),
            deployment: self.deployment.clone(),
            idempotency_token: self.idempotency_token.clone(),
            pid: u32::try_from(self.pid).unwrap_or(0),
            workspace: PathBuf::from(&self.workspace),
            log_path: PathBuf::from(&self.log_path),
            exit,
            stop_reason: self.stop_reason.clone(),
            stopped_at_ms: self.stopped_at_ms,
        }
    }
}

/// What this process knows about the children it spawned: pid and, once reaped, the exit.
type Children = Arc<Mutex<HashMap<String, Option<ExitInfo>>>>;

/// The instance a start with `token` already made in `deployment` (the idempotency
/// token's replay: a cold start and a pool claim answer it the same way), if any.
fn instance_by_token(
    conn: &Connection,
    deployment: &str,
    token: &str,
) -> rusqlite::Result<Option<InstanceRow>> {
    conn.query_row(
        &format!(
            "SELECT {COLUMNS} FROM compute_instances
             WHERE deployment = ?1 AND idempotency_token = ?2"
        ),
        params![deployment, token],
        InstanceRow::from_row,
    )
    .optional()
}

/// Records a split instance's forwarder (`compute_forwarders`: its pid and start ticks, so
/// a restart watches it and never signals a reused pid) inside `tx`; nothing without one.
fn insert_forwarder(
    tx: &rusqlite::Transaction<'_>,
    instance_id: &str,
    forwarder_pid: Option<u32>,
) -> rusqlite::Result<usize> {
    let Some(fpid) = forwarder_pid else {
        return Ok(0);
    };
    tx.execute(
        "INSERT INTO compute_forwarders (instance_id, pid, proc_start_ticks)
         VALUES (?1, ?2, ?3)",
        params![
            instance_id,
            fpid,
            i32::try_from(fpid)
                .ok()
                .and_then(|p| proc_stat(p).ok())
                .map(|(_, t)| to_sql_int(t))
        ],
    )
}

/// The `/proc/<pid>/stat` state letter and start time (clock ticks since boot).
fn proc_stat(pid: i32) -> std::io::Result<(char, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "unparsable /proc stat");
    let close = s.rfind(')').ok_or_else(bad)?;
    let mut fields = s[close + 1..].split_whitespace();
    let state = fields
        .next()
        .and_then(|f| f.chars().next())
        .ok_or_else(bad)?;
    // Field 3 is the state; field 22 is the start time.
    let start = fields
        .nth(18)
        .and_then(|f| f.parse().ok())
        .ok_or_else(bad)?;
    Ok((state, start))
}

fn proc_available() -> bool {
    Path::new("/proc/self/stat").exists()
}

/// Whether the process `pid` that started at `start_ticks` still exists and is not a
/// zombie. Without `/proc`, `kill(pid, 0)` decides (no pid-reuse check then).
fn process_alive(pid: i32, start_ticks: Option<u64>) -> bool {
    if pid <= 0 {
        return false;
    }
    if proc_available() {
        return match proc_stat(pid) {
            Ok((state, start)) => {
                !matches!(state, 'Z' | 'X' | 'x') && start_ticks.is_none_or(|t| t == start)
            }
            Err(_) => false,
        };
    }
    matches!(
        kill(Pid::from_raw(pid), None),
        Ok(()) | Err(nix::errno::Errno::EPERM)
    )
}

/// Liveness of a row: `None` while alive, `Some(exit if known)` when gone.
fn gone(children: &Children, row: &InstanceRow) -> Option<Option<ExitInfo>> {
    let own = children
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&row.instance_id)
        .copied();
    if let Some(Some(exit)) = own {
        return Some(Some(exit));
    }
    if process_alive(row.pid, row.proc_start_ticks) {
        None
    } else {
        Some(None)
    }
}

/// Signals the process group `pid`, unless `/proc` shows that `pid` now belongs to another
/// process than the one that started at `start_ticks` (issue 24: after pid reuse, a
/// group id equal to the reused pid would be someone else's group; Linux keeps a pid
/// number from reuse while it still names a live group, so a reused pid means no
/// straggler of ours is left to signal).
fn signal_group(pid: i32, start_ticks: Option<u64>, signal: Signal) {
    if let (Some(recorded), true) = (start_ticks, proc_available())
        && let Ok((_, start)) = proc_stat(pid)
        && start != recorded
    {
        tracing::warn!(pid, ?signal, "pid reused by another process; not signalled");
        return;
    }
    if pid > 0 {
        // A SIGKILLed supervisor cannot end the descendants that left the group: this does
        // (crate::supervise; without a supervisor it reaches those whose parent lives).
        if signal == Signal::SIGKILL {
            crate::supervise::kill_descendants(pid);
        }
        // ESRCH (already gone) is the expected race; nothing else can go wrong for a
        // group we created.
        let _ = killpg(Pid::from_raw(pid), signal);
    }
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

fn load(conn: &Connection, instance_id: &str) -> rusqlite::Result<Option<InstanceRow>> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM compute_instances WHERE instance_id = ?1"),
        params![instance_id],
        InstanceRow::from_row,
    )
    .optional()
}

fn mark_stopped(conn: &Connection, id: &str, exit: Option<ExitInfo>) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE compute_instances
         SET status = 'stopped',
             exit_code = COALESCE(exit_code, ?2),
             exit_signal = COALESCE(exit_signal, ?3),
             stopped_at_ms = COALESCE(stopped_at_ms, ?4)
         WHERE instance_id = ?1",
        params![
            id,
            exit.and_then(|e| e.code),
            exit.and_then(|e| e.signal),
            now_ms()
        ],
    )?;
    Ok(())
}

/// Brings a row up to date with the OS: a gone process becomes `stopped` (with its exit
/// status when known); a `stopping` one past its grace gets SIGKILL.
fn refresh(
    conn: &Connection,
    children: &Children,
    grace: Duration,
    row: InstanceRow,
) -> rusqlite::Result<InstanceRow> {
    if row.status == STOPPED {
        return Ok(row);
    }
    match gone(children, &row) {
        Some(exit) => {
            mark_stopped(conn, &row.instance_id, exit)?;
            if row.status == STOPPING {
                signal_group(row.pid, row.proc_start_ticks, Signal::SIGKILL); // stragglers of the group
            }
            Ok(load(conn, &row.instance_id)?.unwrap_or(row))
        }
        None => {
            if row.status == STOPPING {
                let due = row
                    .stop_requested_at_ms
                    .unwrap_or(0)
                    .saturating_add(i64::try_from(grace.as_millis()).unwrap_or(i64::MAX));
                if now_ms() >= due {
                    tracing::warn!(instance_id = %row.instance_id, pid = row.pid, "stop grace elapsed; sending SIGKILL");
                    signal_group(row.pid, row.proc_start_ticks, Signal::SIGKILL);
                }
            }
            Ok(row)
        }
    }
}

/// Replaces `dir` by an empty directory, or by the contents of `archive`.
fn fresh_workspace(dir: &Path, archive: Option<&Path>) -> Result<(), String> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    match archive {
        Some(a) => ws::restore(a, dir).map_err(|e| e.to_string()),
        None => std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display())),
    }
}

/// A directory-safe environment id: 1 to 128 of `[A-Za-z0-9._-]`, not starting with `.`.
fn workspace_name(env: &EnvironmentId) -> Result<&str, PortError> {
    let s = env.as_str();
    let ok = !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(s)
    } else {
        Err(PortError::permanent(
            DEP,
            "start",
            "environment id is not usable as a workspace directory name (1 to 128 of [A-Za-z0-9._-], not starting with '.')",
        ))
    }
}

struct Inner {
    config: ProcessComputeConfig,
    db: Db,
    children: Children,
    start_lock: tokio::sync::Mutex<()>,
}

impl Inner {
    async fn load_refreshed(
        &self,
        operation: &'static str,
        id: &str,
    ) -> Result<Option<InstanceRow>, PortError> {
        let children = Arc::clone(&self.children);
        let grace = self.config.stop_grace;
        let id = id.to_owned();
        self.db
            .call(DEP, operation, move |conn| {
                Ok(match load(conn, &id)? {
                    Some(row) => Some(refresh(conn, &children, grace, row)?),
                    None => None,
                })
            })
            .await
    }

    async fn live_rows(&self, operation: &'static str) -> Result<Vec<InstanceRow>, PortError> {
        let children = Arc::clone(&self.children);
        let grace = self.config.stop_grace;
        self.db
            .call(DEP, operation, move |conn| {
                let rows: Vec<InstanceRow> = {
                    let mut stmt = conn.prepare_cached(&format!(
                        "SELECT {COLUMNS} FROM compute_instances WHERE status != 'stopped' ORDER BY started_at_ms"
                    ))?;
                    stmt.query_map([], InstanceRow::from_row)?.collect::<Result<_, _>>()?
                };
                let mut live = Vec::new();
                for row in rows {
                    let row = refresh(conn, &children, grace, row)?;
                    if row.status != STOPPED {
                        live.push(row);
                    }
                }
                Ok(live)
            })
            .await
    }

    /// Marks `row` stopping (keeping the first reason and request time) and sends SIGTERM
    /// to its process group.
    async fn request_stop(&self, row: &InstanceRow, reason: &str) -> Result<(), PortError> {
        let id = row.instance_id.clone();
        let reason = reason.to_owned();
        self.db
            .call(DEP, "stop", move |conn| {
                conn.execute(
                    "UPDATE compute_instances
                     SET status = 'stopping',
                         stop_reason = COALESCE(stop_reason, ?2),
                         stop_requested_at_ms = COALESCE(stop_requested_at_ms, ?3)
                     WHERE instance_id = ?1 AND status != 'stopped'",
                    params![id, reason, now_ms()],
                )?;
                Ok(())
            })
            .await?;
        if gone(&self.children, row).is_none() {
            signal_group(row.pid, row.proc_start_ticks, Signal::SIGTERM);
        }
        Ok(())
    }

    /// Waits up to the grace for every row's process to go, SIGKILLs the rest, waits for
    /// them (bounded), then records them stopped.
    async fn finish_stops(&self, rows: Vec<InstanceRow>) -> Result<(), PortError> {
        let deadline = Instant::now() + self.config.stop_grace;
        let mut alive: Vec<InstanceRow> = rows;
        while !alive.is_empty() && Instant::now() < deadline {
            alive.retain(|r| gone(&self.children, r).is_none());
            if !alive.is_empty() {
                tokio::time::sleep(POLL).await;
            }
        }
        for r in &alive {
            tracing::warn!(instance_id = %r.instance_id, pid = r.pid, "stop grace elapsed; sending SIGKILL");
            signal_group(r.pid, r.proc_start_ticks, Signal::SIGKILL);
        }
        let kill_deadline = Instant::now() + KILL_WAIT;
        while !alive.is_empty() && Instant::now() < kill_deadline {
            tokio::time::sleep(POLL).await;
            alive.retain(|r| gone(&self.children, r).is_none());
        }
        for r in &alive {
            tracing::error!(instance_id = %r.instance_id, pid = r.pid, "process survived SIGKILL");
        }
        Ok(())
    }
}

/// Kills every live child recorded in the database when the last handle drops, if
/// configured.
struct DropGuard {
    inner: Arc<Inner>,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.inner.config.kill_on_drop {
            return;
        }
        let conn = self.inner.db.lock();
        let rows: Vec<InstanceRow> = match conn
            .prepare(&format!(
                "SELECT {COLUMNS} FROM compute_instances WHERE status != 'stopped'"
            ))
            .and_then(|mut s| s.query_map([], InstanceRow::from_row)?.collect())
        {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!(error = %e, "kill_on_drop: instances could not be read");
                return;
            }
        };
        for row in rows {
            if gone(&self.inner.children, &row).is_none() {
                signal_group(row.pid, row.proc_start_ticks, Signal::SIGKILL);
                tracing::info!(instance_id = %row.instance_id, pid = row.pid, "killed on drop");
            }
            let _ = conn.execute(
                "UPDATE compute_instances SET status = 'stopping',
                     stop_reason = COALESCE(stop_reason, 'controller_dropped'),
                     stop_requested_at_ms = COALESCE(stop_requested_at_ms, ?2)
                 WHERE instance_id = ?1 AND status != 'stopped'",
                params![row.instance_id, now_ms()],
            );
        }
    }
}

/// Child-process compute: one executor process per environment and generation. Cheap to
/// clone (clones share the state). See the module docs for the process model.
#[derive(Clone)]
pub struct ProcessCompute {
    inner: Arc<Inner>,
    _guard: Arc<DropGuard>,
}

impl fmt::Debug for ProcessCompute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessCompute")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

enum Spawned {
    Existing(InstanceRow),
    New(
        InstanceRow,
        tokio::process::Child,
        Option<Box<tokio::process::Child>>,
    ),
    Failed(String),
}

/// Spawns the forwarder of a split start into the executor's process group `pgid`, its
/// output appended to the same log. `Err` is the failure reason (the caller kills the
/// executor).
fn spawn_forwarder(
    ForwarderCommand(mut cmd): ForwarderCommand,
    pgid: i32,
    log_path: &str,
) -> Result<tokio::process::Child, String> {
    let open = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .map_err(|e| format!("log file could not be opened: {e}"))
    };
    cmd.stdout(open()?).stderr(open()?).process_group(pgid);
    cmd.spawn()
        .map_err(|e| format!("forwarder could not be spawned: {e}"))
}

/// The forwarder is essential: when it exits, SIGTERM goes to its group (the executor),
/// whose own waiter (or, for an adopted executor, the next read-back) records the
/// instance's end. One rule for both watchers below.
fn forwarder_exited(
    pgid: i32,
    start_ticks: Option<u64>,
    instance_id: &str,
    exit: Option<ExitInfo>,
) {
    tracing::info!(instance_id = %instance_id, code = ?exit.and_then(|e| e.code), signal = ?exit.and_then(|e| e.signal), "forwarder exited; stopping its executor");
    // The executor may have ended (and its pid been reused) before the forwarder:
    // signalled only while the recorded start time still matches (issue 24).
    signal_group(pgid, start_ticks, Signal::SIGTERM);
}

/// Watches the forwarder this process spawned: awaits its exit.
fn watch_forwarder(
    mut child: tokio::process::Child,
    pgid: i32,
    start_ticks: Option<u64>,
    instance_id: String,
) {
    tokio::spawn(async move {
        let exit = child.wait().await.ok().map(ExitInfo::from);
        forwarder_exited(pgid, start_ticks, &instance_id, exit);
    });
}

/// A forwarder recorded by an earlier controller process whose executor still runs.
struct AdoptedForwarder {
    instance_id: String,
    pid: i32,
    proc_start_ticks: Option<u64>,
    executor_pid: i32,
    executor_start_ticks: Option<u64>,
}

/// Watches a forwarder adopted after a restart: it is no child of this process, so its
/// exit is read from `/proc` (gone, a zombie, or its pid reused) every
/// [`ADOPTED_FORWARDER_POLL`]. The watch ends without a signal once the executor is gone
/// (stopped on request or crashed: its read-back records that).
fn watch_adopted_forwarder(f: AdoptedForwarder) {
    tokio::spawn(async move {
        loop {
            if !process_alive(f.executor_pid, f.executor_start_ticks) {
                return;
            }
            if !process_alive(f.pid, f.proc_start_ticks) {
                break;
            }
            tokio::time::sleep(ADOPTED_FORWARDER_POLL).await;
        }
        // Its exit status went to its parent, the earlier controller.
        forwarder_exited(f.executor_pid, f.executor_start_ticks, &f.instance_id, None);
    });
}

/// The recorded forwarders of instances not marked stopped.
fn adopted_forwarders(conn: &Connection) -> rusqlite::Result<Vec<AdoptedForwarder>> {
    let mut stmt = conn.prepare(
        "SELECT f.instance_id, f.pid, f.proc_start_ticks, i.pid, i.proc_start_ticks
         FROM compute_forwarders f JOIN compute_instances i ON i.instance_id = f.instance_id
         WHERE i.status != 'stopped'",
    )?;
    stmt.query_map([], |r| {
        Ok(AdoptedForwarder {
            instance_id: r.get(0)?,
            pid: r.get(1)?,
            proc_start_ticks: r.get::<_, Option<i64>>(2)?.map(from_sql_int),
            executor_pid: r.get(3)?,
            executor_start_ticks: r.get::<_, Option<i64>>(4)?.map(from_sql_int),
        })
    })?
    .collect()
}

impl ProcessCompute {
    /// Opens the instance table in `config.state_db` (creating it if needed) and creates the
    /// workspace root. Instances recorded by a previous controller process are adopted:
    /// read-back reports them `Running` while their process lives, `Stopped` once it is gone;
    /// the forwarder of an adopted split instance is watched like a fresh one (its exit
    /// stops the executor) when `open` runs inside a Tokio runtime. Blocks briefly.
    ///
    /// # Errors
    /// A permanent [`PortError`] when the database or the workspace root cannot be opened
    /// or created.
    pub fn open(config: ProcessComputeConfig) -> Result<Self, PortError> {
        if config.relay && (config.forwarder.is_none() || config.supervisor.is_none()) {
            return Err(PortError::permanent(
                DEP,
                "open",
                "relay needs the split mode (a forwarder command) and a supervisor (the relay runs in the forwarder's supervisor)",
            ));
        }
        std::fs::create_dir_all(&config.workspace_root).map_err(|e| {
            PortError::permanent(
                DEP,
                "open",
                format!(
                    "workspace root {} could not be created: {e}",
                    config.workspace_root.display()
                ),
            )
        })?;
        let db = Db::open(&config.state_db, SCHEMA)
            .map_err(|e| DbError::Sql(e).into_port(DEP, "open"))?;
        if tokio::runtime::Handle::try_current().is_ok() {
            let adopted = adopted_forwarders(&db.lock())
                .map_err(|e| DbError::Sql(e).into_port(DEP, "open"))?;
            for f in adopted {
                if process_alive(f.executor_pid, f.executor_start_ticks) {
                    tracing::info!(instance_id = %f.instance_id, forwarder_pid = f.pid, "adopted split instance: watching its forwarder");
                    watch_adopted_forwarder(f);
                }
            }
        }
        let inner = Arc::new(Inner {
            config,
            db,
            children: Arc::new(Mutex::new(HashMap::new())),
            start_lock: tokio::sync::Mutex::new(()),
        });
        Ok(Self {
            _guard: Arc::new(DropGuard {
                inner: Arc::clone(&inner),
            }),
            inner,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ProcessComputeConfig {
        &self.inner.config
    }

    /// Everything recorded about one instance, refreshed from the OS.
    ///
    /// # Errors
    /// A [`PortError`] when the database fails.
    pub async fn info(&self, id: &InstanceId) -> Result<Option<ProcessInfo>, PortError> {
        Ok(self
            .inner
            .load_refreshed("info", id.as_str())
            .await?
            .map(|r| r.info()))
    }

    /// Issue 26: the pid of a split instance's forwarder as recorded at start (`None` in
    /// single mode or for an unknown instance); whether it still runs is not checked.
    ///
    /// # Errors
    /// A [`PortError`] when the database fails.
    pub async fn forwarder_pid(&self, id: &InstanceId) -> Result<Option<u32>, PortError> {
        let id = id.as_str().to_owned();
        self.inner
            .db
            .call(DEP, "info", move |conn| {
                Ok(conn
                    .query_row(
                        "SELECT pid FROM compute_forwarders WHERE instance_id = ?1",
                        params![id],
                        |r| r.get::<_, u32>(0),
                    )
                    .optional()?)
            })
            .await
    }

    /// Stops every live child the database knows (spawned by this process or adopted):
    /// SIGTERM to each process group, SIGKILL after the grace, then waits until they are
    /// gone (at most the grace plus 10 s) and records them stopped. Returns how many were
    /// live. Call it before the controller exits to leave no process behind.
    ///
    /// # Errors
    /// A [`PortError`] when the database fails.
    pub async fn shutdown_all(&self) -> Result<usize, PortError> {
        let rows = self.inner.live_rows("shutdown_all").await?;
        let n = rows.len();
        for row in &rows {
            self.inner.request_stop(row, "controller_shutdown").await?;
        }
        self.inner.finish_stops(rows).await?;
        let _ = self.inner.live_rows("shutdown_all").await?;
        tracing::info!(stopped = n, "process compute shut down");
        Ok(n)
    }

    /// Records `child` (the executor of instance `id`) as this process's own and awaits
    /// its exit in the background: the exit status is recorded and the instance marked
    /// stopped. `cleanup` (issue 27: a pool member's directory, or the link left where it
    /// was once claimed) is removed after the exit.
    fn watch_executor(
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

    fn build_command(
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
    fn build_split_commands(
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
    fn listener_arguments(
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
    fn forwarder_command(
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
    fn base_env(&self, cmd: &mut tokio::process::Command, workspace: &Path) {
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

/// The forwarder of a split start, spawned right after its executor (into the executor's
/// process group).
struct ForwarderCommand(tokio::process::Command);

/// The capability-token file of a listening executor: beside its log, `<log stem>.ws-token`.
fn token_file(log_path: &Path) -> PathBuf {
    log_path.with_extension("ws-token")
}

/// A pipe holding `key` and a newline, its write end closed: the forwarder's stdin for
/// `--registration-bearer-stdin` (one bearer line; codex 0.171.0 reads at most 16 KiB,
/// ../shared/reference/executor-protocol.md). The pipe buffer (64 KiB on Linux, pipe(7))
/// holds it, so the write never waits for the reader. Both ends are close-on-exec; the
/// read end becomes the child's fd 0 at spawn.
fn key_pipe(key: &str) -> Result<std::process::Stdio, PortError> {
    use std::io::Write as _;
    let fail =
        |e: std::io::Error| PortError::transient(DEP, "start", format!("key pipe: {}", e.kind()));
    let (read, mut write) = std::io::pipe().map_err(fail)?;
    write.write_all(key.as_bytes()).map_err(fail)?;
    write.write_all(b"\n").map_err(fail)?;
    drop(write);
    Ok(std::process::Stdio::from(read))
}

/// A free loopback port for a listening executor: bound, read and released (the executor
/// binds it a moment later; a collision makes that start fail visibly, and the next
/// generation gets another port).
fn free_loopback_url() -> Result<String, PortError> {
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

impl Compute for ProcessCompute {
    async fn start(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<Started, PortError> {
        check_deadline(DEP, "start", SystemClock.now(), not_after)?;
        let dir_name = workspace_name(&spec.environment_id)?;
        let env_dir = self.inner.config.workspace_root.join(dir_name);
        let workspace =
            ws::generation_dir(&self.inner.config.workspace_root, dir_name, spec.generation);
        let restore_from = match &spec.restore {
            Some(r) => Some(ws::archive_path(
                &self.inner.config.workspace_root,
                deployment.as_str(),
                &r.snapshot_id,
            )?),
            None => None,
        };
        let key = self.inner.config.key_source.read()?;
        let _serial = self.inner.start_lock.lock().await;

        tokio::fs::create_dir_all(&env_dir).await.map_err(|e| {
            PortError::permanent(
                DEP,
                "start",
                format!("workspace {} could not be created: {e}", env_dir.display()),
            )
        })?;
        let log_path = env_dir.join(format!("executor-g{}.log", spec.generation.0));
        let (mut cmd, forwarder) = match &self.inner.config.forwarder {
            Some(fwd) => {
                let listen_url = free_loopback_url()?;
                let token = token_file(&log_path);
                let (e, f) =
                    self.build_split_commands(fwd, spec, &key, &workspace, &listen_url, &token)?;
                (e, Some(f))
            }
            None => (self.build_command(spec, &key, &workspace), None),
        };
        drop(key);

        let spec_c = spec.clone();
        let deployment_s = deployment.as_str().to_owned();
        let workspace_s = workspace.display().to_string();
        let workspace_p = workspace.clone();
        let log_s = log_path.display().to_string();
        let spawned = self
            .inner
            .db
            .call(DEP, "start", move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let existing =
                    instance_by_token(&tx, &deployment_s, &spec_c.idempotency_token)?;
                if let Some(row) = existing {
                    return Ok(Spawned::Existing(row));
                }
                // A fresh directory for the generation, restored from the snapshot the
                // start names (a leftover of a start that failed before it was recorded
                // is replaced).
                if let Err(e) = fresh_workspace(&workspace_p, restore_from.as_deref()) {
                    return Ok(Spawned::Failed(format!("workspace could not be prepared: {e}")));
                }
                // 0600: the log may quote what the executor printed (issue 24).
                let log = match crate::private::create_private_file(Path::new(&log_s))
                    .and_then(|()| std::fs::OpenOptions::new().append(true).open(&log_s))
                {
                    Ok(f) => f,
                    Err(e) => return Ok(Spawned::Failed(format!("log file could not be opened: {e}"))),
                };
                let log_err = match log.try_clone() {
                    Ok(f) => f,
                    Err(e) => return Ok(Spawned::Failed(format!("log file could not be opened: {e}"))),
                };
                cmd.stdout(log).stderr(log_err);
                let mut child = match cmd.spawn() {
                    Ok(c) => c,
                    Err(e) => return Ok(Spawned::Failed(format!("executor could not be spawned: {e}"))),
                };
                let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) else {
                    return Ok(Spawned::Failed("executor exited before it could be recorded".to_owned()));
                };
                let forwarder_child = match forwarder {
                    Some(f) => match spawn_forwarder(f, pid, &log_s) {
                        Ok(c) => Some(Box::new(c)),
                        Err(e) => {
                            // Our own child, not reaped yet: its pid cannot be reused.
                            signal_group(pid, None, Signal::SIGKILL);
                            let _ = child.start_kill();
                            return Ok(Spawned::Failed(e));
                        }
                    },
                    None => None,
                };
                let proc_start = proc_stat(pid).ok().map(|(_, s)| s);
                let started_at_ms = now_ms();
                let row = InstanceRow {
                    instance_id: format!("local-{pid}-{started_at_ms}"),
                    deployment: deployment_s,
                    environment_id: spec_c.environment_id.as_str().to_owned(),
                    session_id: spec_c.session_id.as_str().to_owned(),
                    generation: spec_c.generation.0,
                    idempotency_token: spec_c.idempotency_token.clone(),
                    pid,
                    proc_start_ticks: proc_start,
                    started_at_ms,
                    status: RUNNING.to_owned(),
                    exit_code: None,
                    exit_signal: None,
                    stop_reason: None,
                    stop_requested_at_ms: None,
                    stopped_at_ms: None,
                    workspace: workspace_s,
                    log_path: log_s,
                };
                let inserted = tx
                    .execute(
                        &format!(
                            "INSERT INTO compute_instances ({COLUMNS})
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, NULL, NULL, NULL, NULL, NULL, ?11, ?12)"
                        ),
                        params![
                            row.instance_id,
                            row.deployment,
                            row.environment_id,
                            row.session_id,
                            to_sql_int(row.generation),
                            row.idempotency_token,
                            row.pid,
                            row.proc_start_ticks.map(to_sql_int),
                            row.started_at_ms,
                            row.status,
                            row.workspace,
                            row.log_path
                        ],
                    )
                    .and_then(|_| {
                        insert_forwarder(
                            &tx,
                            &row.instance_id,
                            forwarder_child.as_deref().and_then(tokio::process::Child::id),
                        )
                    })
                    .and_then(|_| tx.commit());
                if let Err(e) = inserted {
                    signal_group(pid, None, Signal::SIGKILL);
                    let _ = child.start_kill();
                    return Err(DbError::Sql(e));
                }
                Ok(Spawned::New(row, child, forwarder_child))
            })
            .await?;

        match spawned {
            Spawned::Existing(row) => {
                let children = Arc::clone(&self.inner.children);
                let grace = self.inner.config.stop_grace;
                let row = self
                    .inner
                    .db
                    .call(DEP, "start", move |conn| {
                        Ok(refresh(conn, &children, grace, row)?)
                    })
                    .await?;
                tracing::info!(instance_id = %row.instance_id, environment_id = %row.environment_id, generation = row.generation, "start: instance with this idempotency token exists; returning it");
                Ok(Started::Instance(row.instance()))
            }
            Spawned::Failed(reason) => {
                tracing::warn!(environment_id = %spec.environment_id, generation = spec.generation.0, %reason, "executor start failed");
                Ok(Started::Failed { reason })
            }
            Spawned::New(row, child, forwarder_child) => {
                if let Some(fwd) = forwarder_child {
                    watch_forwarder(*fwd, row.pid, row.proc_start_ticks, row.instance_id.clone());
                }
                tracing::info!(
                    instance_id = %row.instance_id,
                    environment_id = %row.environment_id,
                    session_id = %row.session_id,
                    generation = row.generation,
                    pid = row.pid,
                    "executor started"
                );
                self.watch_executor(row.instance_id.clone(), child, None);
                Ok(Started::Instance(row.instance()))
            }
        }
    }

    async fn start_pool_member(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<sandbox_controller::ports::PoolMember, PortError> {
        self.start_member(deployment, not_after).await
    }

    async fn list_pool(
        &self,
        deployment: &DeploymentId,
    ) -> Result<Vec<sandbox_controller::ports::PoolMember>, PortError> {
        self.idle_members(deployment).await
    }

    async fn claim_pool_member(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        created_after: u64,
        not_after: u64,
    ) -> Result<Option<Started>, PortError> {
        self.claim_member(spec, deployment, created_after, not_after)
            .await
    }

    async fn recycle_pool_member(
        &self,
        id: &InstanceId,
        not_after: u64,
    ) -> Result<bool, PortError> {
        self.recycle_member(id, not_after).await
    }

    async fn reconcile_pool(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<usize, PortError> {
        self.reconcile_members(deployment, not_after).await
    }

    /// Read by id, a stopped instance also carries the redacted tail of its log
    /// ([`exit_tail`]): what the executor and its forwarder wrote before they ended.
    async fn describe(&self, id: &InstanceId) -> Result<Option<ComputeInstance>, PortError> {
        let Some(row) = self.inner.load_refreshed("describe", id.as_str()).await? else {
            return Ok(None);
        };
        let mut instance = row.instance();
        if instance.exit.is_some() {
            let key = self.inner.config.key_source.read().ok();
            let log = PathBuf::from(&row.log_path);
            let output = tokio::task::spawn_blocking(move || exit_tail::tail(&log, key.as_deref()))
                .await
                .unwrap_or_default();
            if let Some(exit) = instance.exit.as_mut() {
                exit.output = output;
            }
        }
        Ok(Some(instance))
    }

    async fn list(&self, deployment: &DeploymentId) -> Result<Vec<ComputeInstance>, PortError> {
        let children = Arc::clone(&self.inner.children);
        let grace = self.inner.config.stop_grace;
        let retention_ms =
            i64::try_from(self.inner.config.stopped_retention.as_millis()).unwrap_or(i64::MAX);
        let deployment = deployment.as_str().to_owned();
        self.inner
            .db
            .call(DEP, "list", move |conn| {
                let rows: Vec<InstanceRow> = {
                    let mut stmt = conn.prepare_cached(&format!(
                        "SELECT {COLUMNS} FROM compute_instances
                         WHERE deployment = ?1 AND environment_id != ''
                           AND (status != 'stopped' OR stopped_at_ms IS NULL OR stopped_at_ms >= ?2)
                         ORDER BY started_at_ms, instance_id"
                    ))?;
                    stmt.query_map(
                        params![deployment, now_ms().saturating_sub(retention_ms)],
                        InstanceRow::from_row,
                    )?
                    .collect::<Result<_, _>>()?
                };
                let mut out = Vec::with_capacity(rows.len());
                for row in rows {
                    // Live ones only, as ECS lists tasks whose desired status is RUNNING.
                    let instance = refresh(conn, &children, grace, row)?.instance();
                    if instance.status.is_active() {
                        out.push(instance);
                    }
                }
                Ok(out)
            })
            .await
    }

    async fn stop(&self, id: &InstanceId, reason: &str, not_after: u64) -> Result<(), PortError> {
        check_deadline(DEP, "stop", SystemClock.now(), not_after)?;
        let Some(row) = self.inner.load_refreshed("stop", id.as_str()).await? else {
            return Err(PortError::permanent(
                DEP,
                "stop",
                format!("unknown instance {id}"),
            ));
        };
        if row.status == STOPPED {
            return Ok(());
        }
        tracing::info!(instance_id = %row.instance_id, pid = row.pid, reason, "stopping executor (SIGTERM)");
        self.inner.request_stop(&row, reason).await?;
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move {
            let id = row.instance_id.clone();
            if let Err(e) = inner.finish_stops(vec![row]).await {
                tracing::error!(instance_id = %id, error = %e, "stop could not be finished");
            }
            if let Err(e) = inner.load_refreshed("stop", &id).await {
                tracing::error!(instance_id = %id, error = %e, "stop could not be recorded");
            }
        });
        Ok(())
    }
}

impl ProcessCompute {
    /// Whether an executor of (`env`, `generation`) is still live (its directory in use).
    async fn generation_live(
        &self,
        env: &str,
        generation: Generation,
        operation: &'static str,
    ) -> Result<bool, PortError> {
        Ok(self
            .inner
            .live_rows(operation)
            .await?
            .iter()
            .any(|r| r.environment_id == env && r.generation == generation.0))
    }

    fn in_use(env: &str, generation: Generation, operation: &'static str) -> PortError {
        PortError::permanent(
            "workspace",
            operation,
            format!("the workspace of {env} generation {generation} is in use by a live executor"),
        )
    }
}

/// Local workspace persistence (see [`crate::workspace_archive`] for the layout): a
/// stopped generation's directory becomes `tar` + `zstd` archive, the next generation's
/// directory is restored from the archive its start names. One data directory is one
/// deployment, so `deployment` only scopes nothing here.
impl Workspaces for ProcessCompute {
    async fn save_workspace(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
    ) -> Result<WorkspaceDisposition, PortError> {
        let env = ws::checked_env(environment_id, "save")?;
        let root = self.inner.config.workspace_root.clone();
        let id = ws::snapshot_id(env, generation);
        let archive = ws::archive_path(&root, deployment.as_str(), &id)?;
        let dir = ws::generation_dir(&root, env, generation);
        if archive.is_file() {
            // Saved already (a retried save): the directory may remain if the crash came
            // between the rename and the delete.
            if dir.exists() && !self.generation_live(env, generation, "save").await? {
                let _ = tokio::fs::remove_dir_all(&dir).await;
            }
            return Ok(WorkspaceDisposition::Snapshot { snapshot_id: id });
        }
        if !dir.is_dir() {
            return Ok(WorkspaceDisposition::None);
        }
        if self.generation_live(env, generation, "save").await? {
            return Err(Self::in_use(env, generation, "save"));
        }
        let (d, a) = (dir.clone(), archive.clone());
        tokio::task::spawn_blocking(move || ws::archive_dir(&d, &a))
            .await
            .map_err(|e| PortError::transient("workspace", "save", e.to_string()))??;
        tokio::fs::remove_dir_all(&dir).await.map_err(|e| {
            PortError::transient("workspace", "save", format!("{}: {e}", dir.display()))
        })?;
        tracing::info!(environment_id = %environment_id, %generation, snapshot_id = %id, "workspace archived");
        Ok(WorkspaceDisposition::Snapshot { snapshot_id: id })
    }

    /// An archive is complete once it exists (written to a temporary name, then renamed):
    /// `completed`, else `gone`.
    async fn snapshot_state(
        &self,
        deployment: &DeploymentId,
        snapshot_id: &str,
    ) -> Result<SnapshotState, PortError> {
        let root = &self.inner.config.workspace_root;
        // Not an archive name this deployment could have written: no such snapshot.
        let Ok(archive) = ws::archive_path(root, deployment.as_str(), snapshot_id) else {
            return Ok(SnapshotState::Gone);
        };
        Ok(if archive.is_file() {
            SnapshotState::Completed
        } else {
            SnapshotState::Gone
        })
    }

    /// Local mode's save deletes the directory itself once the archive is in place (an
    /// archive is complete when it exists; one not recorded yet is kept by the sweeper,
    /// which never deletes a snapshot newer than the record's latest, and a retried save
    /// returns it, issue 23). This deletes a directory a crash left after its archive.
    async fn delete_working_copy(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
        snapshot_id: &str,
    ) -> Result<bool, PortError> {
        let env = ws::checked_env(environment_id, "delete_working_copy")?;
        let root = &self.inner.config.workspace_root;
        if !ws::archive_path(root, deployment.as_str(), snapshot_id)?.is_file() {
            return Ok(false);
        }
        let dir = ws::generation_dir(root, env, generation);
        if dir.exists() {
            if self
                .generation_live(env, generation, "delete_working_copy")
                .await?
            {
                return Err(Self::in_use(env, generation, "delete_working_copy"));
            }
            tokio::fs::remove_dir_all(&dir).await.map_err(|e| {
                PortError::transient(
                    "workspace",
                    "delete_working_copy",
                    format!("{}: {e}", dir.display()),
                )
            })?;
        }
        Ok(true)
    }

    async fn discard_workspace(
        &self,
        _deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
    ) -> Result<WorkspaceDisposition, PortError> {
        let env = ws::checked_env(environment_id, "discard")?;
        let dir = ws::generation_dir(&self.inner.config.workspace_root, env, generation);
        if !dir.exists() {
            return Ok(WorkspaceDisposition::None);
        }
        if self.generation_live(env, generation, "discard").await? {
            return Err(Self::in_use(env, generation, "discard"));
        }
        tokio::fs::remove_dir_all(&dir).await.map_err(|e| {
            PortError::transient("workspace", "discard", format!("{}: {e}", dir.display()))
        })?;
        Ok(WorkspaceDisposition::Deleted)
    }

    async fn delete_stored(
        &self,
        deployment: &DeploymentId,
        kind: StoredKind,
        id: &str,
    ) -> Result<(), PortError> {
        let root = &self.inner.config.workspace_root;
        let result = match kind {
            StoredKind::Snapshot => {
                tokio::fs::remove_file(ws::archive_path(root, deployment.as_str(), id)?).await
            }
            StoredKind::Volume => {
                let dir = ws::volume_path(root, id)?;
                let (env, g) = id.split_once("/g").unwrap_or_default();
                let generation = Generation(g.parse().unwrap_or_default());
                if self.generation_live(env, generation, "delete").await? {
                    return Err(Self::in_use(env, generation, "delete"));
                }
                tokio::fs::remove_dir_all(dir).await
            }
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(PortError::transient(
                "workspace",
                "delete",
                format!("{id}: {e}"),
            )),
        }
    }

    async fn list_stored(
        &self,
        deployment: &DeploymentId,
    ) -> Result<Vec<StoredWorkspace>, PortError> {
        let root = self.inner.config.workspace_root.clone();
        let live: Vec<(String, u64)> = self
            .inner
            .live_rows("list_stored")
            .await?
            .into_iter()
            .map(|r| (r.environment_id, r.generation))
            .collect();
        let dep = deployment.as_str().to_owned();
        let owned: Vec<(String, u64)> = self
            .inner
            .db
            .call(DEP, "list_stored", move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT DISTINCT environment_id, generation FROM compute_instances WHERE deployment = ?1",
                )?;
                let rows = stmt
                    .query_map(params![dep], |r| {
                        Ok((r.get::<_, String>(0)?, from_sql_int(r.get(1)?)))
                    })?
                    .collect::<Result<_, _>>()?;
                Ok(rows)
            })
            .await?;
        let dep = deployment.as_str().to_owned();
        tokio::task::spawn_blocking(move || list_local(&root, &dep, &owned, &live))
            .await
            .map_err(|e| PortError::transient("workspace", "list", e.to_string()))?
    }
}

/// Every archive of `deployment` and every generation directory its executors used under
/// `root` (`owned`: the (environment, generation) pairs of its instances).
fn list_local(
    root: &Path,
    deployment: &str,
    owned: &[(String, u64)],
    live: &[(String, u64)],
) -> Result<Vec<StoredWorkspace>, PortError> {
    let read = |p: &Path| -> Result<Vec<std::fs::DirEntry>, PortError> {
        match std::fs::read_dir(p) {
            Ok(rd) => rd.collect::<Result<Vec<_>, _>>().map_err(|e| {
                PortError::transient("workspace", "list", format!("{}: {e}", p.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(vec![]),
            Err(e) => Err(PortError::transient(
                "workspace",
                "list",
                format!("{}: {e}", p.display()),
            )),
        }
    };
    let mut out = Vec::new();
    for env_entry in read(root)? {
        let Some(env) = env_entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if env == ws::SNAPSHOT_DIR {
            for env_dir in read(&env_entry.path().join(deployment))? {
                let Some(env) = env_dir.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                for f in read(&env_dir.path())? {
                    let name = f.file_name().to_string_lossy().into_owned();
                    let id = format!("{env}/{name}");
                    let Ok(path) = ws::archive_path(root, deployment, &id) else {
                        continue;
                    };
                    let g = name
                        .trim_start_matches('g')
                        .trim_end_matches(".tar.zst")
                        .parse()
                        .unwrap_or_default();
                    out.push(StoredWorkspace {
                        kind: StoredKind::Snapshot,
                        id,
                        environment_id: EnvironmentId::new(env.clone()),
                        generation: Generation(g),
                        created_at: ws::mtime_secs(&path),
                        in_use: false,
                    });
                }
            }
            continue;
        }
        if !ws::dir_safe(&env) || !env_entry.path().is_dir() {
            continue;
        }
        for g in read(&env_entry.path())? {
            let name = g.file_name().to_string_lossy().into_owned();
            let id = format!("{env}/{name}");
            if ws::volume_path(root, &id).is_err() || !g.path().is_dir() {
                continue;
            }
            let generation: u64 = name[1..].parse().unwrap_or_default();
            if !owned.iter().any(|(e, n)| *e == env && *n == generation) {
                continue;
            }
            out.push(StoredWorkspace {
                kind: StoredKind::Volume,
                id,
                environment_id: EnvironmentId::new(env.clone()),
                generation: Generation(generation),
                created_at: ws::mtime_secs(&g.path()),
                in_use: live.iter().any(|(e, n)| *e == env && *n == generation),
            });
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

#[cfg(test)]
mod pid_reuse_tests {
    use super::*;
    use std::os::unix::process::CommandExt as _;

    /// Issue 24: a recorded start time that is not the live process's one means the pid
    /// was reused; the group is not signalled.
    #[test]
    fn no_signal_to_a_reused_pid() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let (_, start) = proc_stat(pid).unwrap();
        signal_group(pid, Some(start + 1), Signal::SIGKILL);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            child.try_wait().unwrap().is_none(),
            "another start time: not killed"
        );
        signal_group(pid, Some(start), Signal::SIGKILL);
        let status = child.wait().unwrap();
        assert!(!status.success(), "its own start time: killed");
    }
}
