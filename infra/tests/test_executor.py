"""The executor image definition (infra/executor), checked without Docker.

There is no Docker engine here, so the image itself is never built in tests. What can be
checked is: the entrypoint (shellcheck, and its behaviour with a stand-in `codex`: the
arguments it passes, SIGTERM forwarding, refusing to start without its inputs), the pinned
`@openai/codex` package (installed from the lock file by mk/infra.mk, its
`codex exec-server --help` must answer and list the flags the entrypoint uses), and the
Dockerfile's shape.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXECUTOR = Path(__file__).resolve().parents[1] / "executor"
ENTRYPOINT = EXECUTOR / "entrypoint.sh"
CODEX = EXECUTOR / "node_modules" / ".bin" / "codex"
SHELLCHECK = Path(sys.executable).parent / "shellcheck"

# A stand-in for `codex`: records its arguments, announces it runs, and on SIGTERM records
# the signal and exits 42 (so the test can tell the entrypoint passed the child's status on).
STUB_CODEX = """#!/bin/sh
printf '%s\\n' "$@" > "$STUB_DIR/args"
printf '%s' "${CODEX_API_KEY:-}" > "$STUB_DIR/env_key"
case " $* " in
  *" --registration-bearer-stdin "*) IFS= read -r bearer; printf '%s' "$bearer" > "$STUB_DIR/stdin" ;;
esac
trap 'echo TERM > "$STUB_DIR/signal"; exit 42' TERM
echo ready > "$STUB_DIR/ready"
while :; do sleep 0.05; done
"""

INPUTS = {
    "REMOTE_URL": "https://api.openai.com/v1/agents/environments/env_123/remote",
    "ENVIRONMENT_ID": "env_123",
    "CODEX_API_KEY": "test-executor-key",
}


@pytest.fixture
def stub_env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "codex"
    stub.write_text(STUB_CODEX)
    stub.chmod(0o755)
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STUB_DIR": str(tmp_path),
        **INPUTS,
    }


def start_entrypoint(env: dict[str, str]) -> subprocess.Popen:
    """The entrypoint shell in a process group of its own (with the stub `codex` and its
    `sleep`s), so that `end_group` reaches all of them."""
    return subprocess.Popen(["/bin/sh", str(ENTRYPOINT)], env=env, start_new_session=True)


def end_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the entrypoint (it forwards it to `codex`), then SIGKILL to whatever is
    left of its process group, then reap it. Killing the shell alone would orphan the stub."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_for(path: Path, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_entrypoint_passes_shellcheck():
    result = subprocess.run([str(SHELLCHECK), "--shell=sh", str(ENTRYPOINT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_entrypoint_starts_exec_server_with_the_overrides(stub_env, tmp_path):
    proc = start_entrypoint(stub_env)
    try:
        wait_for(tmp_path / "ready")
        args = (tmp_path / "args").read_text().splitlines()
        assert args == [
            "exec-server",
            "--remote",
            INPUTS["REMOTE_URL"],
            "--environment-id",
            INPUTS["ENVIRONMENT_ID"],
        ]
    finally:
        end_group(proc)


def test_entrypoint_forwards_sigterm_and_exits_with_the_child_status(stub_env, tmp_path):
    proc = start_entrypoint(stub_env)
    try:
        wait_for(tmp_path / "ready")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 42
        assert (tmp_path / "signal").read_text().strip() == "TERM"
    finally:
        end_group(proc)


@pytest.mark.parametrize("missing", sorted(INPUTS))
def test_entrypoint_refuses_to_start_without_an_input(stub_env, tmp_path, missing):
    env = {k: v for k, v in stub_env.items() if k != missing}
    result = subprocess.run(["/bin/sh", str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=10)
    assert result.returncode == 64
    assert missing in result.stderr
    assert INPUTS["CODEX_API_KEY"] not in result.stderr
    assert not (tmp_path / "args").exists(), "codex must not start"


def test_pinned_codex_exec_server_answers_help():
    assert CODEX.exists(), f"{CODEX} is missing: mk/infra.mk installs it with npm ci"
    result = subprocess.run([str(CODEX), "exec-server", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for flag in ("--remote", "--environment-id"):
        assert flag in result.stdout, f"`codex exec-server --help` does not list {flag}"


def test_installed_codex_is_the_pinned_version():
    pinned = json.loads((EXECUTOR / "package.json").read_text())["dependencies"]["@openai/codex"]
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", pinned), "pin an exact version"
    result = subprocess.run([str(CODEX), "--version"], capture_output=True, text=True, timeout=60)
    assert result.stdout.split()[-1] == pinned


def test_lock_pins_the_linux_binaries_of_both_architectures():
    lock = json.loads((EXECUTOR / "package-lock.json").read_text())["packages"]
    for arch in ("arm64", "x64"):
        entry = lock[f"node_modules/@openai/codex-linux-{arch}"]
        assert entry["integrity"].startswith("sha512-"), arch


def test_dockerfile_builds_a_non_root_node_lts_image():
    text = (EXECUTOR / "Dockerfile").read_text()
    (image,) = re.findall(r"^ARG NODE_IMAGE=node:(\d+)-", text, re.M)
    assert int(image) % 2 == 0, "Node LTS lines are the even majors"
    assert "ca-certificates" in text
    assert re.search(r"COPY package\.json package-lock\.json", text) and "npm ci" in text
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0"), "the executor runs as a non-root user"
    assert re.findall(r"^WORKDIR (\S+)", text, re.M)[-1] == "/workspace"
    assert 'ENTRYPOINT ["/usr/local/bin/executor-entrypoint"]' in text
    assert "COPY --chmod=0755 entrypoint.sh /usr/local/bin/executor-entrypoint" in text


# ------------------------------------------------------------ the split roles
LISTEN = "ws://127.0.0.1:7070"


def run_role(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(["/bin/sh", str(ENTRYPOINT), *args], env=env, start_new_session=True)


def test_entrypoint_executor_role_listens_on_loopback_without_a_credential(stub_env, tmp_path):
    env = {k: v for k, v in stub_env.items() if k not in INPUTS}
    proc = run_role(env, "executor", LISTEN)
    try:
        wait_for(tmp_path / "ready")
        assert (tmp_path / "args").read_text().splitlines() == ["exec-server", "--listen", LISTEN]
    finally:
        end_group(proc)


@pytest.mark.parametrize("var", ["CODEX_API_KEY", "OPENAI_API_KEY", "CODEX_ACCESS_TOKEN", "REMOTE_URL"])
def test_entrypoint_executor_role_refuses_a_credential(stub_env, tmp_path, var):
    env = {k: v for k, v in stub_env.items() if k not in INPUTS}
    env[var] = "test-executor-key"
    result = subprocess.run(
        ["/bin/sh", str(ENTRYPOINT), "executor", LISTEN], env=env, capture_output=True, text=True, timeout=10
    )
    assert result.returncode == 64
    assert var in result.stderr and "test-executor-key" not in result.stderr
    assert not (tmp_path / "args").exists(), "codex must not start"


@pytest.mark.parametrize("url", ["ws://0.0.0.0:7070", "ws://10.0.0.1:7070", "wss://127.0.0.1:7070", ""])
def test_entrypoint_executor_and_forwarder_refuse_a_non_loopback_url(stub_env, tmp_path, url):
    for role in ("executor", "forwarder"):
        env = dict(stub_env) if role == "forwarder" else {k: v for k, v in stub_env.items() if k not in INPUTS}
        result = subprocess.run(
            ["/bin/sh", str(ENTRYPOINT), role, url], env=env, capture_output=True, text=True, timeout=10
        )
        assert result.returncode == 64, role
    assert not (tmp_path / "args").exists()


def test_entrypoint_forwarder_role_registers_and_connects_to_the_executor(stub_env, tmp_path):
    proc = run_role(stub_env, "forwarder", LISTEN)
    try:
        wait_for(tmp_path / "ready")
        assert (tmp_path / "args").read_text().splitlines() == [
            "exec-server",
            "forward",
            "--registration-bearer-stdin",
            "--remote",
            INPUTS["REMOTE_URL"],
            "--environment-id",
            INPUTS["ENVIRONMENT_ID"],
            "--connect",
            LISTEN,
        ]
    finally:
        end_group(proc)


@pytest.mark.parametrize("missing", sorted(INPUTS))
def test_entrypoint_forwarder_refuses_to_start_without_an_input(stub_env, tmp_path, missing):
    env = {k: v for k, v in stub_env.items() if k != missing}
    result = subprocess.run(
        ["/bin/sh", str(ENTRYPOINT), "forwarder", LISTEN], env=env, capture_output=True, text=True, timeout=10
    )
    assert result.returncode == 64 and missing in result.stderr
    assert INPUTS["CODEX_API_KEY"] not in result.stderr


def test_entrypoint_single_role_says_it_holds_the_key(stub_env, tmp_path):
    proc = subprocess.Popen(
        ["/bin/sh", str(ENTRYPOINT), "single"], env=stub_env, start_new_session=True, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(tmp_path / "ready")
    finally:
        end_group(proc)
    err = proc.stderr.read()
    assert "holds CODEX_API_KEY" in err and INPUTS["CODEX_API_KEY"] not in err


def test_pinned_codex_can_split_listen_and_forward():
    """The split relies on `--listen` and `forward --connect` of the pinned version; `forward`
    has no flag to present a `--ws-auth` token, so the listener runs without `--ws-auth`."""
    main = subprocess.run([str(CODEX), "exec-server", "--help"], capture_output=True, text=True, timeout=60)
    assert "--listen" in main.stdout and "forward" in main.stdout
    fwd = subprocess.run([str(CODEX), "exec-server", "forward", "--help"], capture_output=True, text=True, timeout=60)
    assert fwd.returncode == 0, fwd.stderr
    assert "--connect" in fwd.stdout
    assert "--ws-token" not in fwd.stdout and "--ws-auth" not in fwd.stdout


# ------------------------------------------------------------ https-only remote URLs (docs/SECURITY.md)
@pytest.mark.parametrize("remote_url", ["http://127.0.0.1:8080/v1", "http://localhost:8080/v1", "http://[::1]:8080/v1", "ws://127.0.0.1:1/v1"])
def test_entrypoint_forwarder_and_single_refuse_a_remote_url_that_is_not_https(stub_env, tmp_path, remote_url):
    """The key is the forwarder's registration bearer: over loopback http it would cross the
    loopback the agent's container shares in cleartext. Refused (65) before codex starts;
    the test-only escape SANDBOX_TEST_ONLY_LOOPBACK_HTTP=1 admits http://127.0.0.1 alone."""
    for role, args in (("forwarder", [LISTEN]), ("single", [])):
        env = {**stub_env, "REMOTE_URL": remote_url}
        result = subprocess.run(
            ["/bin/sh", str(ENTRYPOINT), role, *args], env=env, capture_output=True, text=True, timeout=10
        )
        assert result.returncode == 65, (role, result.stderr)
        assert "not https" in result.stderr
        assert INPUTS["CODEX_API_KEY"] not in result.stderr
    assert not (tmp_path / "args").exists(), "codex must not start"
    escaped = {**stub_env, "REMOTE_URL": remote_url, "SANDBOX_TEST_ONLY_LOOPBACK_HTTP": "1"}
    if remote_url.startswith("http://127.0.0.1:"):
        proc = run_role(escaped, "forwarder", LISTEN)
        try:
            wait_for(tmp_path / "ready")
        finally:
            end_group(proc)
    else:
        result = subprocess.run(
            ["/bin/sh", str(ENTRYPOINT), "forwarder", LISTEN], env=escaped, capture_output=True, text=True, timeout=10
        )
        assert result.returncode == 65, result.stderr


def test_no_key_in_the_forwarder_environment_or_command_line(stub_env, tmp_path):
    """Fargate's forwarder gets the key on stdin (`--registration-bearer-stdin`): codex's
    environment has no CODEX_API_KEY and its command line does not carry the key, and the
    one line on its stdin is the key. (The real codex registers with it as the bearer:
    tests/e2e `every_codex_command_line_runs_with_the_pinned_binary` and
    `test_the_pool_forwarder_command_line_runs_with_the_pinned_binary` record it.)"""
    proc = run_role(stub_env, "forwarder", LISTEN)
    try:
        wait_for(tmp_path / "ready")
        wait_for(tmp_path / "stdin")
        args = (tmp_path / "args").read_text()
        assert "--registration-bearer-stdin" in args.splitlines()
        assert INPUTS["CODEX_API_KEY"] not in args
        assert (tmp_path / "env_key").read_text() == ""
        assert (tmp_path / "stdin").read_text() == INPUTS["CODEX_API_KEY"]
    finally:
        end_group(proc)
