"""The warm pool's forwarder waiting for its assignment (docs/WARM_POOL.md "The
forwarder waits for its assignment"): infra/executor/await-assignment.mjs against a real
moto server (DynamoDB and STS) on 127.0.0.1 and a local stand-in for the ECS task metadata
endpoint v4, and entrypoint.sh's `forwarder` role running it.

The credentials are the ones ECS would give the task: moto's AssumeRole of an IAM role with
the task id as RoleSessionName, so GetCallerIdentity answers `<role id>:<task id>`, the
member item's key. (moto does not evaluate the task role's LeadingKeys condition; the
policy itself is checked in test_templates.py.)

Every process started here (moto, node, the entrypoint and its stub codex) is ended by the
test or fixture that started it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest
from test_executor import end_group

EXECUTOR = Path(__file__).resolve().parents[1] / "executor"
WAITER = EXECUTOR / "await-assignment.mjs"
ENTRYPOINT = EXECUTOR / "entrypoint.sh"
NODE = shutil.which("node")
TABLE = "sandbox-pool-test"
LISTEN = "ws://127.0.0.1:7070"
ASSIGNED = {
    "remote_url": "https://api.openai.com/v1/agents/environments/env_pool1/remote",
    "environment_id": "env_pool1",
}
REGION = "us-east-1"

STUB_CODEX = """#!/bin/sh
printf '%s\\n' "$@" > "$STUB_DIR/args"
trap 'exit 42' TERM
echo ready > "$STUB_DIR/ready"
while :; do sleep 0.05; done
"""
# Records the environment the entrypoint gives node, then runs the real node.
NODE_RECORDER = """#!/bin/sh
env > "$STUB_DIR/node-env"
exec {node} "$@"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def moto_endpoint():
    """moto_server on a free port of 127.0.0.1, for this module."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).read()
                break
            except OSError:
                assert proc.poll() is None, "moto_server exited during start-up"
                assert time.monotonic() < deadline, "moto_server did not answer within 30 s"
                time.sleep(0.2)
        yield endpoint
    finally:
        end_group(proc)


class Metadata:
    """The ECS task metadata endpoint v4 (`${ECS_CONTAINER_METADATA_URI_V4}/task`), serving
    the current test's task ARN, in a thread of this process."""

    def __init__(self):
        self.task_arn = ""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if self.path != "/v4/container-1/task":
                    self.send_error(404)
                    return
                body = json.dumps({"TaskARN": outer.task_arn, "Family": "sandbox-lifecycle-executor"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}/v4/container-1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture(scope="module")
def metadata():
    m = Metadata()
    try:
        yield m
    finally:
        m.close()


def client(service: str, endpoint: str, **credentials):
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=credentials.get("AccessKeyId", "test"),
        aws_secret_access_key=credentials.get("SecretAccessKey", "test"),
        aws_session_token=credentials.get("SessionToken"),
    )


@pytest.fixture(scope="module")
def pool(moto_endpoint):
    """The pool table (as the templates declare it) and the executor task role, in moto."""
    ddb = client("dynamodb", moto_endpoint)
    ddb.create_table(
        TableName=TABLE,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
    )
    role = client("iam", moto_endpoint).create_role(
        RoleName="sandbox-executor-task",
        AssumeRolePolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Principal": {"Service": "ecs-tasks.amazonaws.com"}, "Action": "sts:AssumeRole"}
                ],
            }
        ),
    )["Role"]
    return {"ddb": ddb, "role_id": role["RoleId"], "role_arn": role["Arn"]}


class Member:
    """One pool member: its task, the task role credentials ECS would give it, its item."""

    def __init__(self, pool: dict, moto_endpoint: str, metadata: Metadata, session_name: str | None = None):
        self.pool = pool
        self.task_id = secrets.token_hex(16)
        metadata.task_arn = f"arn:aws:ecs:{REGION}:123456789012:task/sandbox-cluster/{self.task_id}"
        credentials = client("sts", moto_endpoint).assume_role(
            RoleArn=pool["role_arn"], RoleSessionName=session_name or self.task_id
        )["Credentials"]
        self.key = f"{pool['role_id']}:{self.task_id}"
        self.env = {
            "PATH": os.environ["PATH"],
            "HOME": "/nonexistent",
            "AWS_CONFIG_FILE": "/nonexistent/config",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": moto_endpoint,
            "AWS_ACCESS_KEY_ID": credentials["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": credentials["SecretAccessKey"],
            "AWS_SESSION_TOKEN": credentials["SessionToken"],
            "ECS_CONTAINER_METADATA_URI_V4": metadata.uri,
            "POOL_TABLE_NAME": TABLE,
            "POOL_MAX_WAIT_SECS": "60",
        }

    def put(self, state: str, **attributes: str) -> None:
        item = {"pk": {"S": self.key}, "state": {"S": state}, "created_at": {"N": str(int(time.time()))}}
        item.update({k: {"S": v} for k, v in attributes.items()})
        self.pool["ddb"].put_item(TableName=TABLE, Item=item)

    def delete(self) -> None:
        self.pool["ddb"].delete_item(TableName=TABLE, Key={"pk": {"S": self.key}})

    def start_waiter(self, **env: str) -> subprocess.Popen:
        return subprocess.Popen(
            [NODE, str(WAITER)],
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )


@pytest.fixture
def member(pool, moto_endpoint, metadata) -> Member:
    assert NODE, "node is on PATH (mk/infra.mk checks it)"
    return Member(pool, moto_endpoint, metadata)


def finish(proc: subprocess.Popen, timeout: float = 20) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    finally:
        end_group(proc)


def polled(member: Member) -> None:
    """Long enough for the waiter to have started and read its idle item at least once."""
    time.sleep(2.5)


def test_the_waiter_prints_the_assignment_once_its_item_is_assigned(member):
    member.put("idle", idle_deployment="dep")
    proc = member.start_waiter()
    try:
        polled(member)
        assert proc.poll() is None, "an idle member keeps waiting"
        member.put("assigned", session_id="sess_1", **ASSIGNED)
        status, out, err = finish(proc)
    finally:
        end_group(proc)
    assert status == 0, err
    assert out == f"REMOTE_URL={ASSIGNED['remote_url']}\nENVIRONMENT_ID={ASSIGNED['environment_id']}\n"
    assert member.task_id in err


@pytest.mark.parametrize("end", ["recycled", "gone"])
def test_a_recycled_or_vanished_member_stops_without_an_assignment(member, end):
    member.put("idle", idle_deployment="dep")
    proc = member.start_waiter()
    try:
        polled(member)
        assert proc.poll() is None
        if end == "recycled":
            member.put("recycled")
        else:
            member.delete()
        status, out, err = finish(proc)
    finally:
        end_group(proc)
    assert status == 0, err
    assert out == ""
    assert ("recycled" if end == "recycled" else "gone") in err


def test_an_item_not_written_yet_is_waited_for(member):
    # RunTask comes before the member's PutItem: a missing item that never existed is not "gone".
    proc = member.start_waiter()
    try:
        polled(member)
        assert proc.poll() is None
        member.put("assigned", **ASSIGNED)
        status, out, err = finish(proc)
    finally:
        end_group(proc)
    assert status == 0, err
    assert out.splitlines() == [f"REMOTE_URL={ASSIGNED['remote_url']}", f"ENVIRONMENT_ID={ASSIGNED['environment_id']}"]


def test_a_session_name_other_than_the_task_id_is_refused(pool, moto_endpoint, metadata):
    other = Member(pool, moto_endpoint, metadata, session_name="not-the-task-id")
    other.put("assigned", **ASSIGNED)
    status, out, err = finish(other.start_waiter())
    assert status == 78, err
    assert out == ""
    assert "not-the-task-id" in err and other.task_id in err


@pytest.mark.parametrize(
    "remote_url",
    [
        "http://api.openai.com/v1/remote",  # http off loopback
        "https://user:pw@api.openai.com/v1/remote",  # userinfo
        "https://user@api.openai.com/v1/remote",
        "https://@api.openai.com/v1/remote",
        "https://api.openai.com/v1/re mote",  # whitespace
        "https://api.openai.com/v1/remote\nENVIRONMENT_ID=env_evil",  # a second line
        "wss://api.openai.com/v1/remote",
        "http://127.0.0.1.evil.example/remote",
        "http://localhost.evil.example/remote",
        "file:///etc/passwd",
        "",
    ],
)
def test_a_bad_remote_url_is_refused_and_nothing_is_printed(member, remote_url):
    member.put("assigned", remote_url=remote_url, environment_id="env_pool1")
    status, out, err = finish(member.start_waiter())
    assert status == 65, err
    assert out == ""
    assert "remote_url" in err


@pytest.mark.parametrize("environment_id", ["env;rm -rf /", "env 1", "$(id)", "e" * 129, ""])
def test_a_bad_environment_id_is_refused_and_nothing_is_printed(member, environment_id):
    member.put("assigned", remote_url=ASSIGNED["remote_url"], environment_id=environment_id)
    status, out, err = finish(member.start_waiter())
    assert status == 65, err
    assert out == ""
    assert "environment_id" in err


@pytest.mark.parametrize("remote_url", ["https://127.0.0.1:8443/remote", "https://agents.example.com/remote"])
def test_https_anywhere_is_accepted(member, remote_url):
    member.put("assigned", remote_url=remote_url, environment_id="env-2_B")
    status, out, err = finish(member.start_waiter())
    assert status == 0, err
    assert out == f"REMOTE_URL={remote_url}\nENVIRONMENT_ID=env-2_B\n"


@pytest.mark.parametrize(
    "remote_url",
    ["http://127.0.0.1:8080/remote", "http://127.9.8.7/remote", "http://localhost:9000/remote", "http://[::1]:9000/remote"],
)
def test_loopback_http_is_refused_on_fargate(member, remote_url):
    """The forwarder sends the key as its registration bearer: over loopback http it would
    cross the loopback the agent's container shares in cleartext (docs/SECURITY.md)."""
    member.put("assigned", remote_url=remote_url, environment_id="env-2_B")
    status, out, err = finish(member.start_waiter())
    assert status == 65, err
    assert out == ""
    assert "https" in err


def test_the_test_only_escape_admits_http_to_127_0_0_1_alone(member):
    """SANDBOX_TEST_ONLY_LOOPBACK_HTTP=1 (set by the tests that record a registration on
    127.0.0.1, never by a template) admits http://127.0.0.1 and nothing else."""
    member.put("assigned", remote_url="http://127.0.0.1:8080/remote", environment_id="env-2_B")
    status, out, _ = finish(member.start_waiter(SANDBOX_TEST_ONLY_LOOPBACK_HTTP="1"))
    assert status == 0 and out.startswith("REMOTE_URL=http://127.0.0.1:8080/remote\n")
    member.put("assigned", remote_url="http://localhost:8080/remote", environment_id="env-2_B")
    status, _, _ = finish(member.start_waiter(SANDBOX_TEST_ONLY_LOOPBACK_HTTP="1"))
    assert status == 65


def test_a_member_nobody_claims_stops_after_the_maximum_wait(member):
    member.put("idle", idle_deployment="dep")
    started = time.monotonic()
    status, out, err = finish(member.start_waiter(POOL_MAX_WAIT_SECS="2"))
    assert status == 0, err
    assert out == ""
    assert "POOL_MAX_WAIT_SECS" in err
    assert 1.5 <= time.monotonic() - started < 15


def test_sigterm_ends_the_waiter_promptly(member):
    member.put("idle", idle_deployment="dep")
    proc = member.start_waiter()
    try:
        polled(member)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        status, out, _ = finish(proc, timeout=5)
        assert time.monotonic() - started < 3
    finally:
        end_group(proc)
    assert status == 143
    assert out == ""


# ------------------------------------------------------------ through entrypoint.sh
@pytest.fixture
def stubs(tmp_path: Path) -> dict[str, str]:
    """A stub `codex` and a `node` that records its environment, first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "codex").write_text(STUB_CODEX)
    (bin_dir / "node").write_text(NODE_RECORDER.format(node=NODE))
    for name in ("codex", "node"):
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_DIR": str(tmp_path)}


def wait_for(path: Path, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def forwarder(member: Member, stubs: dict[str, str]) -> subprocess.Popen:
    env = {**member.env, **stubs, "CODEX_API_KEY": "test-executor-key"}
    return subprocess.Popen(
        ["/bin/sh", str(ENTRYPOINT), "forwarder", LISTEN],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_a_pool_forwarder_registers_with_its_assignment(member, stubs, tmp_path):
    member.put("idle", idle_deployment="dep")
    proc = forwarder(member, stubs)
    try:
        polled(member)
        assert not (tmp_path / "args").exists(), "codex waits for the assignment"
        member.put("assigned", **ASSIGNED)
        wait_for(tmp_path / "ready")
        assert (tmp_path / "args").read_text().splitlines() == [
            "exec-server",
            "forward",
            "--registration-bearer-stdin",
            "--remote",
            ASSIGNED["remote_url"],
            "--environment-id",
            ASSIGNED["environment_id"],
            "--connect",
            LISTEN,
        ]
    finally:
        end_group(proc)
    # The waiter reads only its pool item: it never holds the executor key.
    node_env = (tmp_path / "node-env").read_text()
    assert "CODEX_API_KEY" not in node_env and "test-executor-key" not in node_env
    assert "POOL_TABLE_NAME=" + TABLE in node_env.splitlines()


class _Registration(BaseHTTPRequestHandler):
    """Records each request's method, path and bearer, answers 401 in the API's error shape."""

    seen: list[tuple[str, str, str]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.seen.append(("POST", self.path, self.headers.get("Authorization", "")))
        body = b'{"error":{"code":"invalid_api_key","message":"Incorrect API key provided."}}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_the_pool_forwarder_command_line_runs_with_the_pinned_binary(member, tmp_path):
    """The pool path's command line, built by entrypoint.sh from the assignment, run by the
    pinned codex (not a stub): it reaches registration with the assignment's environment id
    and the key as bearer. (0.171.0 refuses `forward`'s options before `forward` with exit 2,
    ../shared/reference/executor-protocol.md.)"""
    from test_executor import CODEX

    assert CODEX.exists(), "make infra-tools installs the pinned codex"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "codex").symlink_to(CODEX)
    _Registration.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registration)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        remote = f"http://127.0.0.1:{server.server_address[1]}/v1"
        member.put("assigned", remote_url=remote, environment_id="env_pool1")
        env = {
            **member.env,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "HOME": str(tmp_path),
            "CODEX_API_KEY": "test-executor-key",
            # The recording server is http on 127.0.0.1 (production requires https).
            "SANDBOX_TEST_ONLY_LOOPBACK_HTTP": "1",
        }
        proc = subprocess.Popen(
            ["/bin/sh", str(ENTRYPOINT), "forwarder", LISTEN],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            want = ("POST", "/v1/cloud/environment/env_pool1/register", "Bearer test-executor-key")
            deadline = time.monotonic() + 30
            while want not in _Registration.seen:
                assert proc.poll() is None, f"exited {proc.returncode}: {proc.stderr.read()}"
                assert time.monotonic() < deadline, f"no registration; saw {_Registration.seen}"
                time.sleep(0.05)
        finally:
            end_group(proc)
    finally:
        server.shutdown()
        server.server_close()


def test_a_pool_forwarder_without_an_assignment_exits_0_and_starts_nothing(member, stubs, tmp_path):
    member.put("recycled")
    proc = forwarder(member, stubs)
    try:
        assert proc.wait(timeout=20) == 0
    finally:
        end_group(proc)
    assert not (tmp_path / "args").exists()


def test_a_pool_forwarder_passes_a_refusal_on_and_starts_nothing(member, stubs, tmp_path):
    member.put("assigned", remote_url="http://evil.example/remote", environment_id="env_1")
    proc = forwarder(member, stubs)
    try:
        assert proc.wait(timeout=20) == 65
    finally:
        end_group(proc)
    assert not (tmp_path / "args").exists()


def test_sigterm_while_the_forwarder_waits_ends_it_and_the_waiter(member, stubs, tmp_path):
    member.put("idle", idle_deployment="dep")
    proc = forwarder(member, stubs)
    try:
        wait_for(tmp_path / "node-env")
        polled(member)
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert proc.wait(timeout=5) == 143
        assert time.monotonic() - started < 3
        # Nothing of its process group is left (the waiter was ended, not orphaned).
        deadline = time.monotonic() + 3
        while True:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, "the waiter outlived the entrypoint"
            time.sleep(0.05)
    finally:
        end_group(proc)
    assert not (tmp_path / "args").exists()


def test_the_executor_role_never_waits_and_still_refuses_a_credential(member, stubs, tmp_path):
    env = {k: v for k, v in {**member.env, **stubs}.items() if not k.startswith("AWS_")}
    proc = subprocess.Popen(["/bin/sh", str(ENTRYPOINT), "executor", LISTEN], env=env, start_new_session=True)
    try:
        wait_for(tmp_path / "ready")
        assert (tmp_path / "args").read_text().splitlines() == ["exec-server", "--listen", LISTEN]
    finally:
        end_group(proc)
    assert not (tmp_path / "node-env").exists(), "the executor role must never run the waiter"
    result = subprocess.run(
        ["/bin/sh", str(ENTRYPOINT), "executor", LISTEN],
        env={**env, "CODEX_API_KEY": "test-executor-key"},
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert result.returncode == 64 and "CODEX_API_KEY" in result.stderr
    assert not (tmp_path / "node-env").exists()


# ------------------------------------------------------------ the image
def test_the_image_ships_the_waiter_next_to_its_pinned_sdk():
    """The Dockerfile copies await-assignment.mjs into /opt/codex, where `npm ci` installs
    the pinned @aws-sdk clients (ESM resolves packages from the script's directory up), and
    the entrypoint looks for it there; the SDK is pinned exactly, with integrity hashes."""
    dockerfile = (EXECUTOR / "Dockerfile").read_text()
    assert "WORKDIR /opt/codex" in dockerfile and "npm ci" in dockerfile
    assert "COPY --chmod=0644 await-assignment.mjs /opt/codex/await-assignment.mjs" in dockerfile
    assert "!await-assignment.mjs" in (EXECUTOR / ".dockerignore").read_text().splitlines()
    assert "waiter=/opt/codex/await-assignment.mjs" in ENTRYPOINT.read_text()
    dependencies = json.loads((EXECUTOR / "package.json").read_text())["dependencies"]
    lock = json.loads((EXECUTOR / "package-lock.json").read_text())["packages"]
    for name in ("@aws-sdk/client-dynamodb", "@aws-sdk/client-sts"):
        version = dependencies[name]
        assert version.count(".") == 2 and version.replace(".", "").isdigit(), f"pin {name} exactly"
        assert lock[f"node_modules/{name}"]["version"] == version
        assert lock[f"node_modules/{name}"]["integrity"].startswith("sha512-")
