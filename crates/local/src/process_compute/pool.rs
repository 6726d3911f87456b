//! The warm pool of [`ProcessCompute`] (split mode only).
//!
//! - **A member** is a listening executor started ahead of any assignment: the configured
//!   executor command (e.g. `codex exec-server --listen $LISTEN_URL`), with the executor's
//!   cleared environment (no key), in its own process group, working in
//!   `<workspace_root>/.pool/<name>` (a name no environment id can take: ids never start
//!   with `.`), logging to `<workspace_root>/.pool/<name>.log` (0600). Its row in
//!   `compute_instances` names no environment (`environment_id` = `''`, so `list` and
//!   `find` leave it out) and its row in `compute_pool` is `idle` with its listen URL.
//! - **The claim** is one `IMMEDIATE` transaction whose only guard is `UPDATE compute_pool
//!   SET state = 'assigned' WHERE instance_id = ? AND state = 'idle'` (a member whose
//!   executor is gone or stopping is skipped, and one created at or before the claim's
//!   bound is left for the refill to recycle). In the same transaction the member's
//!   directory becomes the generation's workspace (`<env>/g<generation>`: the snapshot the
//!   start names is restored into it, then it is renamed, so the running executor's working
//!   directory moves with it; a link stays at the old path, its `HOME`), the forwarder is
//!   spawned into the executor's process group and the row takes the assignment's tags.
//! - **The assignment channel** is the forwarder's own command line and environment, given
//!   by `serve` when it spawns the forwarder at claim time: the real `codex exec-server
//!   ... forward` (0.171.0) takes `--remote` and `--environment-id` as arguments and has no
//!   way to wait for them, so the forwarder cannot be pre-started. The slow part (the
//!   executor's process start; for the real thing, an npm-installed binary) is. The
//!   executor child never sees the assignment, no credential is made, nothing listens
//!   beyond the executor's own loopback socket.

use super::forwarder::{spawn_forwarder, watch_forwarder};
use super::liveness::{proc_stat, refresh, signal_group};
use super::rows::{COLUMNS, InstanceRow, RUNNING, STOPPED, load};
use super::start::free_loopback_url;
use super::workspaces::workspace_name;
use super::{DEP, ProcessCompute};
use crate::db::{DbError, now_ms, to_sql_int};
use crate::workspace_archive as ws;
use nix::sys::signal::Signal;
use rusqlite::{TransactionBehavior, params};
use sandbox_controller::pool::RECYCLE_REASON;
use sandbox_controller::ports::{
    Clock, Compute, PoolMember, PortError, Started, SystemClock, check_deadline,
};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, InstanceId};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The directory of pool members under the workspace root.
pub const POOL_DIR: &str = ".pool";

const IDLE: &str = "idle";
/// A member the refill took out of the pool for its age (stopped right after).
const RECYCLED: &str = "recycled";

/// Removes a member's directory (never claimed) or the link left where it was (claimed),
/// once its executor is gone. Errors are logged: a leftover is harmless and skipped by
/// every listing.
pub(super) fn remove_member_dir(path: &Path) {
    let result = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => std::fs::remove_file(path),
        Ok(_) => std::fs::remove_dir_all(path),
        Err(_) => Ok(()),
    };
    if let Err(e) = result {
        tracing::warn!(path = %path.display(), error = %e, "pool member directory not removed");
    }
}

fn pool_error(operation: &'static str, message: impl Into<String>) -> PortError {
    PortError::permanent(DEP, operation, message)
}

/// What the claim's transaction did.
enum Claim {
    /// No usable member.
    Miss,
    /// The token already names an instance (a replay).
    Existing(InstanceRow),
    /// Claimed, but not assigned (the member was killed).
    Failed(String),
    /// Claimed and assigned: the row and its forwarder.
    Assigned(InstanceRow, Box<tokio::process::Child>),
}

impl ProcessCompute {
    /// [`sandbox_controller::ports::Compute::start_pool_member`] (see the module docs).
    pub(super) async fn start_member(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<PoolMember, PortError> {
        const OP: &str = "start_pool_member";
        check_deadline(DEP, OP, SystemClock.now(), not_after)?;
        let config = &self.inner.config;
        if config.forwarder.is_none() {
            return Err(pool_error(
                OP,
                "the warm pool needs the split mode (a forwarder command): in the single mode the executor holds the key and its assignment from its start",
            ));
        }
        if config.command.needs_assignment() {
            return Err(pool_error(
                OP,
                "the executor command names the assignment ($REMOTE_URL, $ENVIRONMENT_ID, $SESSION_ID or $GENERATION): it cannot start before a claim",
            ));
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "m{}-{}-{}",
            now_ms(),
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let pool_dir = config.workspace_root.join(POOL_DIR);
        let member_dir = pool_dir.join(&name);
        let log_path = pool_dir.join(format!("{name}.log"));
        let listen_url = free_loopback_url()?;
        let _serial = self.inner.start_lock.lock().await;
        tokio::fs::create_dir_all(&member_dir).await.map_err(|e| {
            pool_error(
                OP,
                format!("{} could not be created: {e}", member_dir.display()),
            )
        })?;
        let args = self.listener_arguments(
            config
                .command
                .substituted_unassigned(&member_dir, &listen_url),
            &super::start::token_file(&log_path),
        )?;
        let mut cmd = super::command::executor_process(
            config.supervisor.as_ref(),
            &config.command.program,
            args,
        );
        self.base_env(&mut cmd, &member_dir);
        cmd.process_group(0);
        let deployment_s = deployment.as_str().to_owned();
        let member_s = member_dir.display().to_string();
        let log_s = log_path.display().to_string();
        let url = listen_url.clone();
        let (row, child) = self
            .inner
            .db
            .call(DEP, OP, move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let log = crate::private::create_private_file(Path::new(&log_s))
                    .and_then(|()| std::fs::OpenOptions::new().append(true).open(&log_s))
                    .and_then(|f| Ok((f.try_clone()?, f)));
                let (out, err) = match log {
                    Ok(pair) => pair,
                    Err(e) => return Ok(Err(format!("log file could not be opened: {e}"))),
                };
                cmd.stdout(out).stderr(err);
                let child = match cmd.spawn() {
                    Ok(c) => c,
                    Err(e) => return Ok(Err(format!("executor could not be spawned: {e}"))),
                };
                let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) else {
                    return Ok(Err("executor exited before it could be recorded".to_owned()));
                };
                let started_at_ms = now_ms();
                let row = InstanceRow {
                    instance_id: format!("local-{pid}-{started_at_ms}"),
                    deployment: deployment_s.clone(),
                    environment_id: String::new(),
                    session_id: String::new(),
                    generation: 0,
                    idempotency_token: format!("pool:{member_s}"),
                    pid,
                    proc_start_ticks: proc_stat(pid).ok().map(|(_, s)| s),
                    started_at_ms,
                    status: RUNNING.to_owned(),
                    exit_code: None,
                    exit_signal: None,
                    stop_reason: None,
                    stop_requested_at_ms: None,
                    stopped_at_ms: None,
                    workspace: member_s.clone(),
                    log_path: log_s,
                };
                let written = tx
                    .execute(
                        &format!(
                            "INSERT INTO compute_instances ({COLUMNS})
                             VALUES (?1, ?2, '', '', 0, ?3, ?4, ?5, ?6, ?7, NULL, NULL, NULL, NULL, NULL, ?8, ?9)"
                        ),
                        params![
                            row.instance_id,
                            row.deployment,
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
                        tx.execute(
                            "INSERT INTO compute_pool (instance_id, deployment, state, listen_url, member_dir)
                             VALUES (?1, ?2, 'idle', ?3, ?4)",
                            params![row.instance_id, deployment_s, url, member_s],
                        )
                    })
                    .and_then(|_| tx.commit());
                if let Err(e) = written {
                    signal_group(pid, None, Signal::SIGKILL);
                    return Err(DbError::Sql(e));
                }
                Ok(Ok((row, child)))
            })
            .await?
            .map_err(|reason| PortError::transient(DEP, OP, reason))?;
        tracing::info!(instance_id = %row.instance_id, pid = row.pid, %listen_url, "pool member started");
        self.watch_executor(row.instance_id.clone(), child, Some(member_dir));
        Ok(PoolMember {
            instance_id: row.instance().instance_id,
            created_at: u64::try_from(row.started_at_ms / 1000).unwrap_or(0),
        })
    }

    /// [`sandbox_controller::ports::Compute::list_pool`]: idle members whose executor
    /// runs (refreshed from the OS), oldest first.
    pub(super) async fn idle_members(
        &self,
        deployment: &DeploymentId,
    ) -> Result<Vec<PoolMember>, PortError> {
        let children = Arc::clone(&self.inner.children);
        let grace = self.inner.config.stop_grace;
        let deployment = deployment.as_str().to_owned();
        let rows = self
            .inner
            .db
            .call(DEP, "list_pool", move |conn| {
                let ids: Vec<String> = {
                    let mut stmt = conn.prepare_cached(
                        "SELECT p.instance_id FROM compute_pool p
                         JOIN compute_instances i ON i.instance_id = p.instance_id
                         WHERE p.deployment = ?1 AND p.state = 'idle' AND i.status = 'running'
                         ORDER BY i.started_at_ms, p.instance_id",
                    )?;
                    stmt.query_map(params![deployment], |r| r.get(0))?
                        .collect::<Result<_, _>>()?
                };
                let mut live = Vec::new();
                for id in ids {
                    if let Some(row) = load(conn, &id)? {
                        let row = refresh(conn, &children, grace, row)?;
                        if row.status == RUNNING {
                            live.push(row);
                        }
                    }
                }
                Ok(live)
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| PoolMember {
                created_at: u64::try_from(r.started_at_ms / 1000).unwrap_or(0),
                instance_id: r.instance().instance_id,
            })
            .collect())
    }

    /// [`sandbox_controller::ports::Compute::claim_pool_member`] (see the module docs).
    pub(super) async fn claim_member(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        created_after: u64,
        not_after: u64,
    ) -> Result<Option<Started>, PortError> {
        const OP: &str = "claim_pool_member";
        let Some(forwarder) = self.inner.config.forwarder.clone() else {
            return Ok(None);
        };
        check_deadline(DEP, OP, SystemClock.now(), not_after)?;
        let root = self.inner.config.workspace_root.clone();
        let dir_name = workspace_name(&spec.environment_id)?.to_owned();
        let workspace = ws::generation_dir(&root, &dir_name, spec.generation);
        let restore_from = match &spec.restore {
            Some(r) => Some(ws::archive_path(
                &root,
                deployment.as_str(),
                &r.snapshot_id,
            )?),
            None => None,
        };
        let key = self.inner.config.key_source.read()?;
        let _serial = self.inner.start_lock.lock().await;
        let children = Arc::clone(&self.inner.children);
        let grace = self.inner.config.stop_grace;
        let deployment_s = deployment.as_str().to_owned();
        let spec_c = spec.clone();
        // A member created in the bound's second is too old: `created_at > created_after`.
        let min_started_ms =
            i64::try_from(created_after.saturating_add(1).saturating_mul(1000)).unwrap_or(i64::MAX);
        let this = self.clone();
        let claim = self
            .inner
            .db
            .call(DEP, OP, move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let existing =
                    super::rows::instance_by_token(&tx, &deployment_s, &spec_c.idempotency_token)?;
                if let Some(row) = existing {
                    let row = refresh(&tx, &children, grace, row)?;
                    tx.commit()?;
                    return Ok(Claim::Existing(row));
                }
                let candidates: Vec<(String, String, String)> = {
                    let mut stmt = tx.prepare_cached(
                        "SELECT p.instance_id, p.listen_url, p.member_dir FROM compute_pool p
                         JOIN compute_instances i ON i.instance_id = p.instance_id
                         WHERE p.deployment = ?1 AND p.state = 'idle' AND i.status = 'running'
                           AND i.started_at_ms >= ?2
                         ORDER BY i.started_at_ms, p.instance_id",
                    )?;
                    stmt.query_map(params![deployment_s, min_started_ms], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })?
                    .collect::<Result<_, _>>()?
                };
                for (id, listen_url, member_dir) in candidates {
                    let Some(row) = load(&tx, &id)? else { continue };
                    let row = refresh(&tx, &children, grace, row)?;
                    if row.status != RUNNING {
                        continue; // its executor is gone: never claimed
                    }
                    // The pick and the guard: idle → assigned, at most once.
                    let taken = tx.execute(
                        "UPDATE compute_pool SET state = 'assigned', claimed_at_ms = ?2
                         WHERE instance_id = ?1 AND state = ?3",
                        params![id, now_ms(), IDLE],
                    )?;
                    if taken != 1 {
                        continue;
                    }
                    let assigned = this.assign(
                        &tx,
                        row,
                        &spec_c,
                        &forwarder,
                        &key,
                        Path::new(&member_dir),
                        &workspace,
                        restore_from.as_deref(),
                        &listen_url,
                    )?;
                    tx.commit()?;
                    return Ok(assigned);
                }
                Ok(Claim::Miss)
            })
            .await?;
        match claim {
            Claim::Miss => Ok(None),
            Claim::Existing(row) => {
                tracing::info!(instance_id = %row.instance_id, "claim: instance with this idempotency token exists; returning it");
                Ok(Some(Started::Instance(row.instance())))
            }
            Claim::Failed(reason) => {
                tracing::warn!(environment_id = %spec.environment_id, %reason, "pool member claimed but not assigned: stopped");
                Ok(Some(Started::Failed { reason }))
            }
            Claim::Assigned(row, forwarder) => {
                watch_forwarder(
                    *forwarder,
                    row.pid,
                    row.proc_start_ticks,
                    row.instance_id.clone(),
                );
                tracing::info!(
                    instance_id = %row.instance_id, environment_id = %row.environment_id,
                    generation = row.generation, pid = row.pid, "pool member claimed"
                );
                Ok(Some(Started::Instance(row.instance())))
            }
        }
    }

    /// [`Compute::recycle_pool_member`]: idle → recycled in one guarded `UPDATE` (a
    /// member claimed since the refill listed it is left to its environment), then the
    /// stop.
    pub(super) async fn recycle_member(
        &self,
        id: &InstanceId,
        not_after: u64,
    ) -> Result<bool, PortError> {
        const OP: &str = "recycle_pool_member";
        check_deadline(DEP, OP, SystemClock.now(), not_after)?;
        let id_s = id.as_str().to_owned();
        let taken = self
            .inner
            .db
            .call(DEP, OP, move |conn| {
                Ok(conn.execute(
                    "UPDATE compute_pool SET state = ?3 WHERE instance_id = ?1 AND state = ?2",
                    params![id_s, IDLE, RECYCLED],
                )?)
            })
            .await?;
        if taken != 1 {
            return Ok(false);
        }
        self.stop(id, RECYCLE_REASON, not_after).await?;
        Ok(true)
    }

    /// [`Compute::reconcile_pool`]: members that are idle or recycled and whose executor
    /// exited (one adopted after a `serve` restart, one that died on its own) leave the
    /// pool and their directory is removed; a recycled member still running (its stop
    /// failed after the `UPDATE`) is stopped. Returns how many it handled.
    pub(super) async fn reconcile_members(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<usize, PortError> {
        const OP: &str = "reconcile_pool";
        check_deadline(DEP, OP, SystemClock.now(), not_after)?;
        let children = Arc::clone(&self.inner.children);
        let grace = self.inner.config.stop_grace;
        let deployment = deployment.as_str().to_owned();
        let (gone, to_stop) = self
            .inner
            .db
            .call(DEP, OP, move |conn| {
                let rows: Vec<(String, String, String)> = {
                    let mut stmt = conn.prepare_cached(
                        "SELECT instance_id, state, member_dir FROM compute_pool
                         WHERE deployment = ?1 AND state IN (?2, ?3)",
                    )?;
                    stmt.query_map(params![deployment, IDLE, RECYCLED], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })?
                    .collect::<Result<_, _>>()?
                };
                let (mut gone, mut to_stop) = (Vec::new(), Vec::new());
                for (id, state, dir) in rows {
                    let stopped = match load(conn, &id)? {
                        Some(row) => refresh(conn, &children, grace, row)?.status == STOPPED,
                        None => true,
                    };
                    if stopped {
                        conn.execute(
                            "DELETE FROM compute_pool WHERE instance_id = ?1 AND state = ?2",
                            params![id, state],
                        )?;
                        gone.push(dir);
                    } else if state == RECYCLED {
                        to_stop.push(id);
                    }
                }
                Ok((gone, to_stop))
            })
            .await?;
        for dir in &gone {
            remove_member_dir(Path::new(dir));
        }
        for id in &to_stop {
            self.stop(&InstanceId::new(id.as_str()), RECYCLE_REASON, not_after)
                .await?;
        }
        Ok(gone.len() + to_stop.len())
    }

    /// Inside the claim's transaction: the member's directory becomes the generation's
    /// workspace, the forwarder is spawned, the rows take the assignment. A failure to do
    /// so kills the member (single-use) and answers `Failed`; the claim still commits.
    #[allow(clippy::too_many_arguments)]
    fn assign(
        &self,
        tx: &rusqlite::Transaction<'_>,
        mut row: InstanceRow,
        spec: &StartSpec,
        forwarder: &super::ExecutorCommand,
        key: &str,
        member_dir: &Path,
        workspace: &Path,
        restore_from: Option<&Path>,
        listen_url: &str,
    ) -> Result<Claim, DbError> {
        let fail = |reason: String| {
            signal_group(row.pid, row.proc_start_ticks, Signal::SIGKILL);
            Ok(Claim::Failed(reason))
        };
        if let Err(e) = move_into_workspace(member_dir, workspace, restore_from) {
            return fail(format!("workspace could not be prepared: {e}"));
        }
        let token = super::start::token_file(Path::new(&row.log_path));
        let fwd = match self.forwarder_command(forwarder, spec, key, workspace, listen_url, &token)
        {
            Ok(f) => f,
            Err(e) => return fail(e.to_string()),
        };
        let child = match spawn_forwarder(fwd, row.pid, &row.log_path) {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        row.environment_id = spec.environment_id.as_str().to_owned();
        row.session_id = spec.session_id.as_str().to_owned();
        row.generation = spec.generation.0;
        row.idempotency_token = spec.idempotency_token.clone();
        row.workspace = workspace.display().to_string();
        let fpid = child.id();
        let written = tx
            .execute(
                "UPDATE compute_instances SET environment_id = ?2, session_id = ?3,
                     generation = ?4, idempotency_token = ?5, workspace = ?6
                 WHERE instance_id = ?1",
                params![
                    row.instance_id,
                    row.environment_id,
                    row.session_id,
                    to_sql_int(row.generation),
                    row.idempotency_token,
                    row.workspace
                ],
            )
            .and_then(|_| super::rows::insert_forwarder(tx, &row.instance_id, fpid));
        if let Err(e) = written {
            signal_group(row.pid, row.proc_start_ticks, Signal::SIGKILL);
            return Err(DbError::Sql(e));
        }
        Ok(Claim::Assigned(row, Box::new(child)))
    }
}

/// Makes `member_dir` the generation's workspace `workspace`: a leftover there is
/// replaced, the snapshot (if any) restored into the member's (unused, empty) directory,
/// which is then renamed (the running executor's working directory is the same directory
/// afterwards) and a link to it left at the old path (the executor's `HOME`).
fn move_into_workspace(
    member_dir: &Path,
    workspace: &Path,
    restore_from: Option<&Path>,
) -> Result<(), String> {
    let at = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    if let Some(parent) = workspace.parent() {
        std::fs::create_dir_all(parent).map_err(|e| at(parent, e))?;
    }
    if workspace.exists() {
        std::fs::remove_dir_all(workspace).map_err(|e| at(workspace, e))?;
    }
    if let Some(archive) = restore_from {
        ws::restore(archive, member_dir).map_err(|e| e.to_string())?;
    }
    std::fs::rename(member_dir, workspace).map_err(|e| at(member_dir, e))?;
    std::os::unix::fs::symlink(workspace, member_dir).map_err(|e| at(member_dir, e))
}
