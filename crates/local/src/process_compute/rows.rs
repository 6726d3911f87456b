//! The SQLite side of [`ProcessCompute`](super::ProcessCompute): the schema of tables
//! `compute_instances`, `compute_forwarders` and `compute_pool`, the row of an instance
//! ([`InstanceRow`]) and how it reads as a [`ComputeInstance`], and the queries on it.

use super::exit_tail;
use super::liveness::proc_stat;
use super::{ExitInfo, ProcessInfo};
use crate::db::{from_sql_int, now_ms, to_sql_int};
use rusqlite::{Connection, OptionalExtension, Row, params};
use sandbox_core::compute::{
    ComputeInstance, ComputeStatus, ESSENTIAL_CONTAINER_EXITED, ExitDetail,
};
use sandbox_core::ids::{EnvironmentId, Generation, InstanceId, SessionId};
use std::path::PathBuf;

/// ECS `stopCode` of a task a user (here: the controller, an operator) stopped.
pub(super) const USER_INITIATED: &str = "UserInitiated";

pub(super) const SCHEMA: &str = "
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

/// A row of `compute_instances`.
#[derive(Clone, Debug)]
pub(super) struct InstanceRow {
    pub(super) instance_id: String,
    pub(super) deployment: String,
    pub(super) environment_id: String,
    pub(super) session_id: String,
    pub(super) generation: u64,
    pub(super) idempotency_token: String,
    pub(super) pid: i32,
    pub(super) proc_start_ticks: Option<u64>,
    pub(super) started_at_ms: i64,
    pub(super) status: String,
    pub(super) exit_code: Option<i32>,
    pub(super) exit_signal: Option<i32>,
    pub(super) stop_reason: Option<String>,
    pub(super) stop_requested_at_ms: Option<i64>,
    pub(super) stopped_at_ms: Option<i64>,
    pub(super) workspace: String,
    pub(super) log_path: String,
}

pub(super) const COLUMNS: &str = "instance_id, deployment, environment_id, session_id, generation, \
    idempotency_token, pid, proc_start_ticks, started_at_ms, status, exit_code, exit_signal, \
    stop_reason, stop_requested_at_ms, stopped_at_ms, workspace, log_path";

pub(super) const RUNNING: &str = "running";
pub(super) const STOPPING: &str = "stopping";
pub(super) const STOPPED: &str = "stopped";

impl InstanceRow {
    pub(super) fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
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

    pub(super) fn status(&self) -> ComputeStatus {
        match self.status.as_str() {
            RUNNING => ComputeStatus::Running,
            STOPPING => ComputeStatus::Stopping,
            STOPPED => ComputeStatus::Stopped,
            _ => ComputeStatus::Pending,
        }
    }

    pub(super) fn instance(&self) -> ComputeInstance {
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
    pub(super) fn stop_code(&self) -> Option<String> {
        (self.status() == ComputeStatus::Stopped).then(|| {
            if self.stop_requested_at_ms.is_some() {
                USER_INITIATED.to_owned()
            } else {
                ESSENTIAL_CONTAINER_EXITED.to_owned()
            }
        })
    }

    pub(super) fn info(&self) -> ProcessInfo {
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

/// The instance a start with `token` already made in `deployment` (the idempotency
/// token's replay: a cold start and a pool claim answer it the same way), if any.
pub(super) fn instance_by_token(
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
pub(super) fn insert_forwarder(
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

pub(super) fn load(conn: &Connection, instance_id: &str) -> rusqlite::Result<Option<InstanceRow>> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM compute_instances WHERE instance_id = ?1"),
        params![instance_id],
        InstanceRow::from_row,
    )
    .optional()
}

pub(super) fn mark_stopped(
    conn: &Connection,
    id: &str,
    exit: Option<ExitInfo>,
) -> rusqlite::Result<()> {
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
