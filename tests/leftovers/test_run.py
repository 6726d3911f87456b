"""tests/leftovers/run.py: it fails on a process its command leaves behind (and ends it),
passes on the command's status otherwise, and never looks at processes it did not start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

RUN = Path(__file__).resolve().parent / "run.py"


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RUN), *command], capture_output=True, text=True, timeout=60
    )


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_command_that_leaves_nothing_passes_with_its_status():
    assert run("true").returncode == 0
    assert run("sh", "-c", "exit 3").returncode == 3


def test_a_process_that_ends_within_the_grace_is_not_reported():
    result = run("sh", "-c", "(sleep 0.3 &)")
    assert result.returncode == 0, result.stderr


def test_a_leftover_fails_the_run_is_named_and_is_ended():
    # One plain background child, one in a session of its own whose parent exits at once.
    result = run("sh", "-c", "sleep 600 & echo $!; (setsid sleep 601 & echo $!)")
    assert result.returncode == 1, result.stderr
    assert "2 process(es)" in result.stderr
    assert "sleep 600" in result.stderr and "sleep 601" in result.stderr
    for pid in map(int, result.stdout.split()):
        assert not alive(pid), f"leftover {pid} still runs"


def test_a_failed_command_keeps_its_status_when_it_also_leaves_a_process():
    result = run("sh", "-c", "sleep 600 & exit 5")
    assert result.returncode == 5
    assert "sleep 600" in result.stderr


def test_processes_it_did_not_start_are_not_looked_at():
    outside = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        result = run("true")
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        assert outside.poll() is None, "a process started elsewhere was ended"
    finally:
        os.killpg(outside.pid, signal.SIGKILL)
        outside.wait()
