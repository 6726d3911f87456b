//! Whether a recorded process still runs, read from the OS (`/proc/<pid>/stat`, or the
//! exit status of a child this process awaits), how a row is brought up to date with it
//! ([`refresh`]), and signalling a process group without hitting a reused pid.

use super::ExitInfo;
use super::rows::{InstanceRow, STOPPED, STOPPING, load, mark_stopped};
use crate::db::now_ms;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use rusqlite::Connection;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What this process knows about the children it spawned: pid and, once reaped, the exit.
pub(super) type Children = Arc<Mutex<HashMap<String, Option<ExitInfo>>>>;

/// The `/proc/<pid>/stat` state letter and start time (clock ticks since boot).
pub(super) fn proc_stat(pid: i32) -> std::io::Result<(char, u64)> {
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

pub(super) fn proc_available() -> bool {
    Path::new("/proc/self/stat").exists()
}

/// Whether the process `pid` that started at `start_ticks` still exists and is not a
/// zombie. Without `/proc`, `kill(pid, 0)` decides (no pid-reuse check then).
pub(super) fn process_alive(pid: i32, start_ticks: Option<u64>) -> bool {
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
pub(super) fn gone(children: &Children, row: &InstanceRow) -> Option<Option<ExitInfo>> {
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
/// process than the one that started at `start_ticks` (after pid reuse, a
/// group id equal to the reused pid would be someone else's group; Linux keeps a pid
/// number from reuse while it still names a live group, so a reused pid means no
/// straggler of ours is left to signal).
pub(super) fn signal_group(pid: i32, start_ticks: Option<u64>, signal: Signal) {
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

/// Brings a row up to date with the OS: a gone process becomes `stopped` (with its exit
/// status when known); a `stopping` one past its grace gets SIGKILL.
pub(super) fn refresh(
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

#[cfg(test)]
mod pid_reuse_tests {
    use super::*;
    use std::os::unix::process::CommandExt as _;

    /// A recorded start time that is not the live process's one means the pid
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
