//! [`ProcessCompute`](super::ProcessCompute) as the controller's
//! [`Compute`](sandbox_controller::ports::Compute) port: start (spawn and record in one
//! transaction), the warm pool calls, describe, list and stop.

use super::exit_tail;
use super::forwarder::{spawn_forwarder, watch_forwarder};
use super::liveness::{proc_stat, refresh, signal_group};
use super::rows::{COLUMNS, InstanceRow, RUNNING, STOPPED, insert_forwarder, instance_by_token};
use super::start::{Spawned, free_loopback_url, token_file};
use super::workspaces::{fresh_workspace, workspace_name};
use super::{DEP, ProcessCompute};
use crate::db::{DbError, now_ms, to_sql_int};
use crate::workspace_archive as ws;
use nix::sys::signal::Signal;
use rusqlite::{TransactionBehavior, params};
use sandbox_controller::ports::{Clock, Compute, PortError, Started, SystemClock, check_deadline};
use sandbox_core::compute::ComputeInstance;
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, InstanceId};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
                // 0600: the log may quote what the executor printed.
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
