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
//! - **Split mode** ([`ProcessComputeConfig::forwarder`] set): two children per
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
//!   can await it). Both run as the controller's user: see docs/SECURITY.md
//!   for what a same-user sandbox can still read.
//! - **Controller exit**: children survive a controller crash and are adopted by the next
//!   `ProcessCompute` over the same database. [`ProcessCompute::shutdown_all`] stops every
//!   live child the database knows (the demo calls it to leave no process behind);
//!   [`ProcessComputeConfig::kill_on_drop`] kills them when the last handle drops.

mod command;
mod compute;
mod exit_tail;
mod forwarder;
mod key;
mod liveness;
mod pool;
mod rows;
mod start;
mod stop;
mod workspaces;

pub use command::ExecutorCommand;
pub use key::{ExecutorKey, KeySource};

use crate::db::{Db, DbError};
use forwarder::{adopted_forwarders, watch_adopted_forwarder};
use liveness::{Children, process_alive, refresh};
use rows::{COLUMNS, InstanceRow, SCHEMA, STOPPED, load};
use rusqlite::{OptionalExtension, params};
use sandbox_controller::ports::PortError;
use sandbox_core::compute::ComputeInstance;
use sandbox_core::ids::InstanceId;
use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stop::DropGuard;

const DEP: &str = "compute";

/// How often the watcher of an adopted forwarder (split mode, after a controller restart)
/// reads its liveness from `/proc`.
pub const ADOPTED_FORWARDER_POLL: Duration = Duration::from_millis(200);

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

    /// The pid of a split instance's forwarder as recorded at start (`None` in
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
}
