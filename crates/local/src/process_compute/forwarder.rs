//! The forwarder of a split instance (the key holder): spawning it into its executor's
//! process group, and watching it (awaited when this process spawned it, read from
//! `/proc` when adopted after a restart) so that its exit stops the executor.

use super::liveness::{process_alive, signal_group};
use super::{ADOPTED_FORWARDER_POLL, ExitInfo};
use crate::db::from_sql_int;
use nix::sys::signal::Signal;
use rusqlite::Connection;

/// The forwarder of a split start, spawned right after its executor (into the executor's
/// process group).
pub(super) struct ForwarderCommand(pub(super) tokio::process::Command);

/// Spawns the forwarder of a split start into the executor's process group `pgid`, its
/// output appended to the same log. `Err` is the failure reason (the caller kills the
/// executor).
pub(super) fn spawn_forwarder(
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
pub(super) fn forwarder_exited(
    pgid: i32,
    start_ticks: Option<u64>,
    instance_id: &str,
    exit: Option<ExitInfo>,
) {
    tracing::info!(instance_id = %instance_id, code = ?exit.and_then(|e| e.code), signal = ?exit.and_then(|e| e.signal), "forwarder exited; stopping its executor");
    // The executor may have ended (and its pid been reused) before the forwarder:
    // signalled only while the recorded start time still matches.
    signal_group(pgid, start_ticks, Signal::SIGTERM);
}

/// Watches the forwarder this process spawned: awaits its exit.
pub(super) fn watch_forwarder(
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
pub(super) struct AdoptedForwarder {
    pub(super) instance_id: String,
    pub(super) pid: i32,
    pub(super) proc_start_ticks: Option<u64>,
    pub(super) executor_pid: i32,
    pub(super) executor_start_ticks: Option<u64>,
}

/// Watches a forwarder adopted after a restart: it is no child of this process, so its
/// exit is read from `/proc` (gone, a zombie, or its pid reused) every
/// [`ADOPTED_FORWARDER_POLL`]. The watch ends without a signal once the executor is gone
/// (stopped on request or crashed: its read-back records that).
pub(super) fn watch_adopted_forwarder(f: AdoptedForwarder) {
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
pub(super) fn adopted_forwarders(conn: &Connection) -> rusqlite::Result<Vec<AdoptedForwarder>> {
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
