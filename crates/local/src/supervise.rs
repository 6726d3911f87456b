//! The executor's supervisor (`sandboxctl supervise -- PROGRAM ARGS...`): a child
//! subreaper between `serve` and the executor, so that a local stop ends every descendant
//! of the executor, also those that left its process group (`setsid`, a double fork).
//!
//! Why: stopping sends signals to the executor's process group; agent code that calls
//! `setsid` (or double-forks) leaves the group and, once its parent exits, is reparented to
//! init, out of reach. A process marked `PR_SET_CHILD_SUBREAPER` (prctl(2)) instead
//! becomes the parent of every orphaned descendant, so the supervisor can find all of them
//! through the parent links in `/proc/<pid>/stat` (proc(5), field 4) and kill them.
//! cgroup v2 would do the same without a supervisor, but needs a delegated hierarchy that
//! many hosts (and this project's CI container: cgroup v1 only) do not give a user.
//!
//! How: the supervisor marks itself a subreaper, spawns the program (same process group,
//! environment, directory and stdio), forwards SIGTERM, SIGINT and SIGHUP to it, and when
//! it exits, SIGKILLs every remaining descendant (repeating until none is left, reaping
//! them), then exits with the program's status (128 + signal when a signal ended it).
//! `serve` records the supervisor's pid as the instance's; before a SIGKILL of the group
//! (the grace ran out) it kills the descendants itself ([`kill_descendants`]), since a
//! SIGKILLed supervisor cannot.
//!
//! What it does not stop: a descendant that another process adopts away (ptrace games) or
//! that runs as another user; and anything started in the instant between the program's
//! exit and the last sweep, which the bounded loop retries [`SWEEP_ROUNDS`] times.

pub use crate::proc_tree::descendants;

use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;
use std::process::ExitStatus;
use std::time::Duration;

/// How many kill-and-rescan rounds a sweep makes at most.
pub const SWEEP_ROUNDS: u32 = 50;

/// SIGKILLs every live descendant of `root`, rescanning until none is left or
/// [`SWEEP_ROUNDS`] rounds passed. Returns how many processes were signalled. Reaps
/// nothing (a caller with children of its own, `serve`, must not collect their statuses).
pub fn kill_descendants(root: i32) -> usize {
    sweep(root, false)
}

fn sweep(root: i32, reap: bool) -> usize {
    let mut killed = 0;
    for _ in 0..SWEEP_ROUNDS {
        let found = descendants(root);
        if found.is_empty() {
            break;
        }
        for pid in found {
            if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                killed += 1;
            }
        }
        if reap {
            reap_any();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    killed
}

/// Reaps every exited child of this process that is waiting (orphans it adopted).
fn reap_any() {
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if status == nix::sys::wait::WaitStatus::StillAlive {
            break;
        }
    }
}

/// The exit code of the supervisor for the program's `status`: its code, or 128 + the
/// signal that ended it (the shell's convention).
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Runs `program` with `args` under this process as a child subreaper (see the module
/// docs) and returns the exit code to end with. With `relay` (its listening socket, bound
/// before the program starts, and the executor it leads to), this process also serves the
/// forwarder-only relay ([`crate::executor_relay`]) for the program's process tree.
///
/// # Errors
/// The program cannot be spawned, or the process cannot become a subreaper.
pub fn run(
    program: &str,
    args: &[String],
    relay: Option<(std::net::TcpListener, crate::executor_relay::Relay)>,
) -> std::io::Result<i32> {
    nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)?;
    let mut child = std::process::Command::new(program).args(args).spawn()?;
    // Blocked after the spawn, so the program starts with the usual signal mask; the
    // signals are then taken with sigwait(2) instead of ending this process.
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGCHLD,
    ] {
        set.add(s);
    }
    set.thread_block().map_err(std::io::Error::from)?;
    let child_pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    // Started after the block, so its threads inherit it and the signals stay sigwait's.
    if let Some((listener, relay)) = relay {
        let root = child_pid.as_raw();
        std::thread::spawn(move || relay.serve(listener, root));
    }
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        match set.wait() {
            Ok(Signal::SIGCHLD) => reap_orphans_except(child_pid),
            Ok(sig) => {
                let _ = kill(child_pid, sig);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    sweep(i32::try_from(std::process::id()).unwrap_or(i32::MAX), true);
    Ok(exit_code(status))
}

/// Reaps exited adopted orphans (never the program itself, whose status `try_wait` reads).
fn reap_orphans_except(program: Pid) {
    let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    for (pid, ppid) in zombie_children(me) {
        if pid != program.as_raw() && ppid == me {
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        }
    }
}

/// `(pid, parent)` of the zombie children of `parent`.
fn zombie_children(parent: i32) -> Vec<(i32, i32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let rest = &stat[stat.rfind(')')? + 1..];
            let mut fields = rest.split_whitespace();
            let state = fields.next()?;
            let ppid: i32 = fields.next()?.parse().ok()?;
            (state == "Z" && ppid == parent).then_some((pid, ppid))
        })
        .collect()
}
