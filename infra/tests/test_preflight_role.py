"""The executor image's `preflight` role (infra/executor/entrypoint.sh `preflight`, which
runs infra/executor/preflight.mjs), against real parts on 127.0.0.1 only: a TLS server
(Python's `ssl`, with a test CA made by the `openssl` command line and trusted through
NODE_EXTRA_CA_CERTS, as an egress proxy's CA would be), a closed port, a name that does not
resolve (`.invalid`, RFC 2606 section 2) and the real pinned `codex` answering `--version`.

What `sandboxctl preflight --backend aws` relies on (crates/cli/src/preflight/aws.rs): one
JSON line per check on stdout, in order, named as the local form names them, then a `done`
line; exit 0 when all pass and 1 when any fails; the key never printed.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

EXECUTOR = Path(__file__).resolve().parents[1] / "executor"
ENTRYPOINT = EXECUTOR / "entrypoint.sh"
CODEX_BIN = EXECUTOR / "node_modules" / ".bin"
KEY = "test-executor-key-never-printed"


def openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """A test CA (`ca.pem`) and a server certificate for IP 127.0.0.1 signed by it."""
    d = tmp_path_factory.mktemp("certs")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    openssl(d, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=preflight test CA")
    openssl(d, "req", *ec, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=127.0.0.1")
    (d / "leaf.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    openssl(
        d, "x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "leaf.pem", "-days", "1", "-extfile", "leaf.ext",
    )
    return d


@pytest.fixture
def tls_port(certs: Path):
    """A TLS server on 127.0.0.1 (a free port) that completes handshakes until the test ends."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs / "leaf.pem", certs / "leaf.key")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            conn.settimeout(5)
            try:
                with ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (OSError, ssl.SSLError):
                pass
            finally:
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(timeout=5)
    listener.close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run_preflight(env: dict[str, str]) -> tuple[int, list[dict], str, str]:
    """`entrypoint.sh preflight` with `env` (plus PATH with the pinned codex); its exit
    status, the JSON lines of stdout, raw stdout and stderr."""
    full = {"PATH": f"{CODEX_BIN}:{os.environ['PATH']}", "HOME": os.environ.get("HOME", "/tmp"), **env}
    proc = subprocess.run(
        ["/bin/sh", str(ENTRYPOINT), "preflight"], env=full, capture_output=True, text=True, timeout=60
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    return proc.returncode, lines, proc.stdout, proc.stderr


def by_name(lines: list[dict]) -> dict[str, dict]:
    return {line["name"]: line for line in lines if "name" in line}


def test_preflight_role_passes_when_everything_is_reachable(certs, tls_port):
    code, lines, out, err = run_preflight(
        {
            "PREFLIGHT_HOSTS": f"127.0.0.1:{tls_port}",
            "NODE_EXTRA_CA_CERTS": str(certs / "ca.pem"),
            "CODEX_API_KEY": KEY,
        }
    )
    assert code == 0, (out, err)
    assert [line.get("name") for line in lines] == [
        "resolve 127.0.0.1",
        "tls 127.0.0.1",
        "executor_key",
        "executor_version",
        None,
    ]
    assert all(line["preflight"] == "v1" for line in lines)
    checks = by_name(lines)
    assert all(c["ok"] for c in checks.values()), lines
    assert checks["tls 127.0.0.1"]["detail"].startswith(f"TLS accepted at 127.0.0.1:{tls_port} (TLSv1.")
    assert checks["executor_version"]["detail"] == "codex-cli 0.171.0"
    assert lines[-1] == {"preflight": "v1", "done": True, "failed": 0}
    assert KEY not in out and KEY not in err


def test_preflight_role_names_each_failure_in_one_line(certs, tls_port):
    closed = closed_port()
    code, lines, out, err = run_preflight(
        {
            # The TLS server's CA is not trusted here: a certificate failure.
            "PREFLIGHT_HOSTS": f"127.0.0.1:{tls_port},127.0.0.1:{closed},preflight-test.invalid",
            "PREFLIGHT_CODEX": "/nonexistent/codex",
            "PREFLIGHT_TIMEOUT_SECS": "5",
        }
    )
    assert code == 1, (out, err)
    checks = by_name(lines)
    assert checks["resolve 127.0.0.1"]["ok"]
    tls = checks["tls 127.0.0.1"]
    assert not tls["ok"]
    # Two hosts share the name 127.0.0.1: the later line (the closed port) wins in `by_name`.
    tls_lines = [line for line in lines if line.get("name") == "tls 127.0.0.1"]
    assert "certificate" in tls_lines[0]["detail"].lower(), tls_lines[0]
    assert "ECONNREFUSED" in tls_lines[1]["detail"], tls_lines[1]
    assert not checks["resolve preflight-test.invalid"]["ok"]
    assert "ENOTFOUND" in checks["resolve preflight-test.invalid"]["detail"]
    assert checks["tls preflight-test.invalid"] == {
        "preflight": "v1",
        "name": "tls preflight-test.invalid",
        "ok": False,
        "detail": "not checked: the name did not resolve",
    }
    assert checks["executor_key"]["ok"] is False
    assert "CODEX_API_KEY is not set" in checks["executor_key"]["detail"]
    assert checks["executor_version"]["ok"] is False
    assert "/nonexistent/codex --version" in checks["executor_version"]["detail"]
    assert lines[-1] == {"preflight": "v1", "done": True, "failed": 6}
    assert all("\n" not in line["detail"] for line in lines if "detail" in line)


def test_preflight_role_refuses_a_blank_key_and_never_shows_it(certs, tls_port):
    code, lines, out, err = run_preflight(
        {
            "PREFLIGHT_HOSTS": f"127.0.0.1:{tls_port}",
            "NODE_EXTRA_CA_CERTS": str(certs / "ca.pem"),
            "CODEX_API_KEY": "   ",
        }
    )
    assert code == 1, (out, err)
    checks = by_name(lines)
    assert checks["executor_key"] == {
        "preflight": "v1",
        "name": "executor_key",
        "ok": False,
        "detail": "the variable CODEX_API_KEY is empty",
    }
    assert [c["name"] for c in checks.values() if not c["ok"]] == ["executor_key"]


def test_preflight_role_refuses_a_malformed_host_list():
    code, lines, out, err = run_preflight({"PREFLIGHT_HOSTS": "api.openai.com:https", "CODEX_API_KEY": KEY})
    assert code == 64
    assert lines == []
    assert "PREFLIGHT_HOSTS" in err


def test_the_image_ships_the_preflight_checks():
    dockerfile = (EXECUTOR / "Dockerfile").read_text()
    assert "COPY --chmod=0644 preflight.mjs /opt/codex/preflight.mjs" in dockerfile
