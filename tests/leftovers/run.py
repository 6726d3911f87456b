#!/usr/bin/env python3
"""Runs a command and fails when a process it started outlives it.

    tests/leftovers/run.py COMMAND [ARGS...]

`make test` runs all its steps under this. The script makes itself a child subreaper
(Linux `prctl(PR_SET_CHILD_SUBREAPER)`): a process started below it whose parent exits is
re-parented to this script instead of to init. So once COMMAND has exited, every process
still alive below this script was started by COMMAND and outlived it, whatever its name,
process group or session (a test's `setsid` child or a daemonized server included), and
nothing else on the machine is ever looked at (another checkout's test run, an editor, a
shell): no name patterns to keep up to date, no false alarms from concurrent runs.

After COMMAND exits, the script waits up to GRACE_SECS for such processes to end by
themselves (reaping them, as init would), then prints each survivor (pid, parent, command
line) on stderr, ends them (SIGTERM to each, SIGKILL to what is left after
KILL_AFTER_SECS) and exits 1, or with COMMAND's status if that already failed. Otherwise
it exits with COMMAND's status (128 + N when a signal N ended it). While COMMAND runs,
SIGINT is ignored here (the terminal sends it to COMMAND too) and SIGTERM is passed on to
COMMAND, so an interrupted run is still checked and cleaned up.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

# Processes that end this soon after COMMAND (a stop that is still escalating, an
# executor's last disconnect) are not reported.
GRACE_SECS = 2.0
# How long survivors get between SIGTERM and SIGKILL.
KILL_AFTER_SECS = 2.0
PR_SET_CHILD_SUBREAPER = 36
ME = "tests/leftovers/run.py"


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        sys.exit(f"{ME}: prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(err)} (Linux only)")


def stat_of(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    # `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0]


def cmdline_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return "?"
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace") or "?"


def descendants() -> dict[int, int]:
    """Live (not zombie) processes below this one: pid -> parent pid."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = stat_of(int(name))
            if stat is not None and stat[1] != "Z":
                parents[int(name)] = stat[0]
    below: dict[int, int] = {}
    frontier = [os.getpid()]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in below:
                below[pid] = ppid
                frontier.append(pid)
    return below


def reap() -> None:
    """Reaps every child that has exited (orphans re-parented here included)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def wait_gone(pids: set[int], seconds: float) -> set[int]:
    """Reaps for up to `seconds` until none of `pids` is left below; returns the rest."""
    deadline = time.monotonic() + seconds
    while True:
        reap()
        left = pids & set(descendants())
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def run(argv: list[str]) -> int:
    become_subreaper()
    child = os.posix_spawnp(argv[0], argv, os.environ)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def pass_on(signum: int, _frame: object) -> None:
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, pass_on)
    while True:
        try:
            pid, status = os.wait()
        except InterruptedError:
            continue
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            status = code if code >= 0 else 128 - code
            break
    # From here on, only leftovers: end them even if this script is signalled again.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    left = wait_gone(set(descendants()), GRACE_SECS)
    if not left:
        return status
    below = descendants()
    print(
        f"{ME}: {len(left)} process(es) started by `{' '.join(argv)}` outlived it:",
        file=sys.stderr,
    )
    for pid in sorted(left):
        print(f"  pid {pid} (parent {below.get(pid, '?')}): {cmdline_of(pid)}", file=sys.stderr)
    for sig, wait in ((signal.SIGTERM, KILL_AFTER_SECS), (signal.SIGKILL, KILL_AFTER_SECS)):
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        left = wait_gone(left, wait)
        if not left:
            break
    print(f"{ME}: ended them; a test that starts a process must end it, group and all", file=sys.stderr)
    return status or 1


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(f"usage: {ME} COMMAND [ARGS...]")
    sys.exit(run(sys.argv[1:]))
