//! Stopping: SIGTERM to the process group, SIGKILL once the grace has passed, the wait
//! until the processes are gone, and the kill of every live child when the last handle
//! drops ([`ProcessComputeConfig::kill_on_drop`](super::ProcessComputeConfig::kill_on_drop)).

use super::liveness::{gone, signal_group};
use super::rows::{COLUMNS, InstanceRow};
use super::{DEP, Inner};
use crate::db::now_ms;
use nix::sys::signal::Signal;
use rusqlite::params;
use sandbox_controller::ports::PortError;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a stop or a shutdown looks whether a process is gone.
pub(super) const POLL: Duration = Duration::from_millis(50);
/// How long to wait for a process to disappear after SIGKILL before giving up waiting.
pub(super) const KILL_WAIT: Duration = Duration::from_secs(10);

impl Inner {
    /// Marks `row` stopping (keeping the first reason and request time) and sends SIGTERM
    /// to its process group.
    pub(super) async fn request_stop(
        &self,
        row: &InstanceRow,
        reason: &str,
    ) -> Result<(), PortError> {
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
    pub(super) async fn finish_stops(&self, rows: Vec<InstanceRow>) -> Result<(), PortError> {
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
pub(super) struct DropGuard {
    pub(super) inner: Arc<Inner>,
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
