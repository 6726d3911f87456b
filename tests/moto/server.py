"""moto_server, with Amazon ECS and DynamoDB made to behave as their API references document
where moto 5.2.5 is more lenient. tests/moto/run.sh starts this instead of `.venv/bin/moto_server`
(same arguments: `-H 127.0.0.1 -p PORT`).

What changes, in moto's ECS JSON handlers (moto/ecs/responses.py) and, last, one DynamoDB
handler; every other service and operation is moto's own:

- RunTask `clientToken` ("Ensuring idempotency", ECS API reference, RunTask): "If you use
  the same client token with the same parameters, the same task is returned for 24 hours";
  the same token with different parameters is a `ConflictException` whose `resourceIds`
  are the tasks the token already started. moto ignores the token and starts a second task.
  The token must be at most 64 characters in the range 33-126 ("Up to 64 characters are
  allowed. The valid characters are characters in the range of 33-126, inclusive";
  `InvalidParameterException` otherwise).
  Tokens live in the account/region backend, so `POST /moto-api/reset` forgets them.
- ListTasks pagination (ECS API reference, ListTasks `maxResults`/`nextToken`): at most
  `maxResults` (1-100, default 100) ARNs per page and a `nextToken` when more follow. moto
  returns every ARN in one page.
- ListTasks `desiredStatus` defaults to `RUNNING` ("The default status filter is
  RUNNING"): without it, stopped tasks are not listed. moto lists them.
- DescribeTasks answers `failures: [{arn, reason: "MISSING"}]` for a requested task it does
  not know (ECS API reference, DescribeTasks / Failure). moto answers no task and no
  failure.
- A task carries `createdAt` and `startedAt` (ECS API reference, Task: "The Unix timestamp
  for the time when the task was created" / "... transitioned from the PENDING state to
  the RUNNING state"). moto sets neither; its tasks are RUNNING at once, so both are the
  RunTask time (the executor lifetime ceiling reads `startedAt`).

- RunTask `volumeConfigurations` (ECS-managed Amazon EBS volumes): moto ignores
  them. Here a RunTask that names one is checked as ECS documents it — the name must be a
  task definition volume with `configuredAtLaunch: true` ("To configure a volume at launch
  time, use this task definition revision and specify a volumeConfigurations object",
  ECS API reference, Volume), `managedEBSVolume.roleArn` is required, `sizeInGiB` is
  required unless `snapshotId` is given and the snapshot must exist
  (TaskManagedEBSVolumeConfiguration) — and ECS's work is done in moto's EC2 backend: one
  volume per new task, from the snapshot when named, with the `tagSpecifications` tags of
  resource type `volume`, attached (`in-use`) while the task runs. StopTask detaches it
  (`available`), or deletes it when `terminationPolicy.deleteOnTermination` is not
  `false` (the documented default deletes it). A task returned again for its client
  token creates nothing.

- EBS snapshots take time: "Snapshot creation is asynchronous. The snapshot is
  created immediately, but it remains in the pending state until all of data has been
  transferred to Amazon S3. This can take several hours" (Amazon EBS User Guide, "Create
  Amazon EBS snapshots"). moto's snapshots are `completed` at once. Here a new snapshot
  answers `pending` (CreateSnapshot, DescribeSnapshots, the `status` filter) until
  `SANDBOX_MOTO_SNAPSHOT_PENDING_SECS` seconds (default 2) passed since it was created,
  then `completed`. A RunTask whose managed volume names a snapshot that is not
  `completed` is refused with `InvalidParameterException`: EC2 creates a volume only from
  a completed snapshot (`CreateVolume` answers `IncorrectState`; velero-io/velero#1799),
  and where ECS would only fail the task's volume attach later, refusing at once makes a
  controller that restores a pending snapshot fail its test.

And one change to DynamoDB: the DynamoDB *write* requests (PutItem, UpdateItem,
DeleteItem, BatchWriteItem, TransactWriteItems) to one table are handled one at a time,
under a lock per table (moto's `DynamoHandler.call_action`); reads, and writes to other
tables, run as before. DynamoDB makes each item write atomic and serializes
transactions ("TransactWriteItems is a synchronous write operation that groups up to 100
action requests ... The actions are completed atomically so that either all of them
succeed, or all of them fail"; Developer Guide, "Isolation levels for DynamoDB
transactions": serializable between TransactWriteItems and other writes). moto_server
handles requests on threads, and moto's `transact_write_items` backs up the whole table
(a deep copy) before it starts and, when any condition fails, puts that copy back —
undoing every write other threads made to the table meanwhile. Seen under 32 workers: a
cancelled executor-slot transaction restored a counter from before
other workers' increments, so 15 slot holders stood against a counter of 12 and a 13th
task started past a cap of 12. (Probably also the "500 under 32 workers" the concurrency
test mentions; not verified.)

moto's other quirks are kept on purpose (shared/reference/moto.md): the ListTasks cluster
filter and DescribeTasks task ids still match as substrings, so the adapter's own exact
matching stays tested.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any

from moto.core.responses import ActionResult
from moto.dynamodb.responses import DynamoHandler
from moto.ecs.exceptions import ECSException, InvalidParameterException
from moto.ecs.responses import EC2ContainerServiceResponse
from moto.ec2.models.elastic_block_store import Snapshot
from moto.server import main

# "the same task is returned for 24 hours" (ECS API reference, RunTask clientToken).
CLIENT_TOKEN_TTL_SECS = 24 * 60 * 60
CLIENT_TOKEN_MAX_CHARS = 64
LIST_TASKS_DEFAULT_PAGE = 100

# One RunTask at a time per server: two concurrent replays of one token must not both
# start a task (ECS guarantees it; moto_server handles requests on threads).
_run_task_lock = threading.Lock()

_original_run_task = EC2ContainerServiceResponse.run_task
_original_list_tasks = EC2ContainerServiceResponse.list_tasks
_original_describe_tasks = EC2ContainerServiceResponse.describe_tasks
_original_stop_task = EC2ContainerServiceResponse.stop_task


class ConflictException(ECSException):
    """ECS `ConflictException`: the client token is in use with a different RunTask request;
    `resourceIds` are the task ARNs it already started."""

    code = "ConflictException"

    def __init__(self, message: str, resource_ids: list[str]) -> None:
        super().__init__(message)
        self.resourceIds = resource_ids


def _client_tokens(backend: Any) -> dict[str, tuple[str, list[str], float]]:
    """token -> (canonical parameters, task ARNs, first use), kept on the backend so that
    moto's reset (which re-initialises every backend) forgets them."""
    tokens = backend.__dict__.get("_sandbox_client_tokens")
    if tokens is None:
        tokens = {}
        backend.__dict__["_sandbox_client_tokens"] = tokens
    return tokens


def _task_by_arn(backend: Any, arn: str) -> Any | None:
    for cluster_tasks in backend.tasks.values():
        task = cluster_tasks.get(arn)
        if task is not None:
            return task
    return None


def _stamped(result: ActionResult) -> ActionResult:
    """Sets `createdAt` and `startedAt` on the tasks RunTask just started (see the module
    docs); a task returned again for its client token keeps its own."""
    now = datetime.now(timezone.utc)
    for task in result.result["tasks"]:  # type: ignore[index]
        if getattr(task, "created_at", None) is None:
            task.created_at = now
            task.started_at = now
    return result


class _EcsManagedAttachment:
    """Stands for the Fargate task a managed volume is attached to (moto's
    VolumeAttachment wants an instance with an `id`)."""

    def __init__(self, task_arn: str) -> None:
        self.id = "ecs-task-" + task_arn.rsplit("/", 1)[-1]


def _ec2(self: EC2ContainerServiceResponse) -> Any:
    from moto.ec2.models import ec2_backends

    return ec2_backends[self.current_account][self.region]


def _task_volumes(backend: Any) -> dict[str, list[tuple[str, bool]]]:
    """task ARN -> [(volume id, delete on termination)], kept on the ECS backend."""
    volumes = backend.__dict__.get("_sandbox_task_volumes")
    if volumes is None:
        volumes = {}
        backend.__dict__["_sandbox_task_volumes"] = volumes
    return volumes


def _check_volume_configurations(self: EC2ContainerServiceResponse, body: dict) -> list[dict]:
    """The RunTask's managed EBS volume configurations, checked as ECS documents them."""
    configurations = body.get("volumeConfigurations") or []
    if not configurations:
        return []
    if len(configurations) > 1:
        raise InvalidParameterException("Only one volume configured at launch is supported.")
    definition = self.ecs_backend.describe_task_definition(body.get("taskDefinition"))
    at_launch = {v.get("name") for v in (definition.volumes or []) if v.get("configuredAtLaunch")}
    ec2 = _ec2(self)
    for configuration in configurations:
        name = configuration.get("name")
        if name not in at_launch:
            raise InvalidParameterException(
                f"The volume {name!r} is not a volume of the task definition with "
                "configuredAtLaunch set to true."
            )
        ebs = configuration.get("managedEBSVolume")
        if not ebs:
            raise InvalidParameterException("managedEBSVolume is required.")
        if not ebs.get("roleArn"):
            raise InvalidParameterException("managedEBSVolume.roleArn is required.")
        snapshot_id = ebs.get("snapshotId")
        if snapshot_id is None and not ebs.get("sizeInGiB"):
            raise InvalidParameterException(
                "managedEBSVolume.sizeInGiB is required when no snapshotId is given."
            )
        if snapshot_id is not None:
            try:
                snapshot = ec2.get_snapshot(snapshot_id)
            except Exception:
                raise InvalidParameterException(
                    f"The snapshot {snapshot_id} does not exist."
                ) from None
            if snapshot.status != "completed":
                raise InvalidParameterException(
                    f"The snapshot {snapshot_id} is {snapshot.status}: a volume is created "
                    "only from a completed snapshot."
                )
            size = ebs.get("sizeInGiB")
            if size is not None and int(size) < int(snapshot.volume.size):
                raise InvalidParameterException(
                    "managedEBSVolume.sizeInGiB must be at least the snapshot's size."
                )
        for spec in ebs.get("tagSpecifications") or []:
            if spec.get("resourceType") != "volume":
                raise InvalidParameterException("tagSpecifications[].resourceType must be volume.")
    return configurations


def _create_task_volumes(
    self: EC2ContainerServiceResponse, configurations: list[dict], result: ActionResult
) -> None:
    """What ECS does for a new task with a managed EBS volume: create, tag, attach."""
    from moto.ec2.models.elastic_block_store import VolumeAttachment

    if not configurations:
        return
    ec2 = _ec2(self)
    volumes = _task_volumes(self.ecs_backend)
    for task in result.result["tasks"]:  # type: ignore[index]
        if task.task_arn in volumes:
            continue
        created = []
        for configuration in configurations:
            ebs = configuration["managedEBSVolume"]
            snapshot_id = ebs.get("snapshotId")
            size = ebs.get("sizeInGiB")
            if size is None:
                size = ec2.get_snapshot(snapshot_id).volume.size
            volume = ec2.create_volume(
                size=int(size),
                zone_name=f"{self.region}a",
                snapshot_id=snapshot_id,
                encrypted=bool(ebs.get("encrypted", True)),
                volume_type=ebs.get("volumeType") or "gp3",
            )
            tags = {}
            for spec in ebs.get("tagSpecifications") or []:
                for tag in spec.get("tags") or []:
                    tags[tag["key"]] = tag.get("value", "")
            if tags:
                ec2.create_tags([volume.id], tags)
            volume.attachment = VolumeAttachment(
                volume, _EcsManagedAttachment(task.task_arn), "/dev/xvdf", "attached"
            )
            keep = (ebs.get("terminationPolicy") or {}).get("deleteOnTermination") is False
            created.append((volume.id, not keep))
        volumes[task.task_arn] = created


def stop_task(self: EC2ContainerServiceResponse) -> ActionResult:
    result = _original_stop_task(self)
    task = result.result.get("task") if isinstance(result.result, dict) else None  # type: ignore[union-attr]
    arn = getattr(task, "task_arn", None)
    # The entry stays (empty): a replay of the task's client token creates nothing.
    known = _task_volumes(self.ecs_backend)
    volumes = known.get(arn, []) if arn else []
    if arn in known:
        known[arn] = []
    ec2 = _ec2(self)
    for volume_id, delete in volumes:
        volume = ec2.volumes.get(volume_id)
        if volume is None:
            continue
        volume.attachment = None
        if delete:
            ec2.delete_volume(volume_id)
    return result


def run_task(self: EC2ContainerServiceResponse) -> ActionResult:
    body = json.loads(self.body) if self.body else {}
    configurations = _check_volume_configurations(self, body)
    result = _run_task(self)
    _create_task_volumes(self, configurations, result)
    return result


def _run_task(self: EC2ContainerServiceResponse) -> ActionResult:
    token = self._get_param("clientToken")
    if token is None:
        return _stamped(_original_run_task(self))
    if len(token) > CLIENT_TOKEN_MAX_CHARS or not all(33 <= ord(c) <= 126 for c in token):
        raise InvalidParameterException(
            f"clientToken must be at most {CLIENT_TOKEN_MAX_CHARS} characters in the range "
            "33-126."
        )
    body = json.loads(self.body) if self.body else {}
    body.pop("clientToken", None)
    parameters = json.dumps(body, sort_keys=True, separators=(",", ":"))
    with _run_task_lock:
        backend = self.ecs_backend
        tokens = _client_tokens(backend)
        now = time.time()
        known = tokens.get(token)
        if known is not None and now - known[2] < CLIENT_TOKEN_TTL_SECS:
            known_parameters, arns, _ = known
            if known_parameters != parameters:
                raise ConflictException(
                    "The specified client token is already in use with different "
                    "parameters.",
                    arns,
                )
            tasks = [t for t in (_task_by_arn(backend, a) for a in arns) if t is not None]
            return ActionResult({"tasks": tasks, "failures": []})
        result = _stamped(_original_run_task(self))
        arns = [t.task_arn for t in result.result["tasks"]]  # type: ignore[index]
        if arns:
            tokens[token] = (parameters, arns, now)
        return result


def _page_token(arn: str) -> str:
    return base64.urlsafe_b64encode(arn.encode()).decode()


def _after_token(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (ValueError, UnicodeDecodeError):
        raise InvalidParameterException("Invalid nextToken.") from None


def list_tasks(self: EC2ContainerServiceResponse) -> ActionResult:
    tasks = self.ecs_backend.list_tasks(
        self._get_param("cluster", "default"),
        self._get_param("containerInstance"),
        self._get_param("family"),
        self._get_param("startedBy"),
        self._get_param("serviceName"),
        self._get_param("desiredStatus") or "RUNNING",
    )
    arns = [t.task_arn for t in tasks]
    page = self._get_int_param("maxResults", LIST_TASKS_DEFAULT_PAGE)
    if not 1 <= page <= 100:
        raise InvalidParameterException("maxResults must be between 1 and 100.")
    start = 0
    token = self._get_param("nextToken")
    if token:
        after = _after_token(token)
        if after not in arns:
            raise InvalidParameterException("Invalid nextToken.")
        start = arns.index(after) + 1
    result: dict[str, Any] = {"taskArns": arns[start : start + page]}
    if start + page < len(arns):
        result["nextToken"] = _page_token(arns[start + page - 1])
    return ActionResult(result)


def describe_tasks(self: EC2ContainerServiceResponse) -> ActionResult:
    result = _original_describe_tasks(self)
    answer = result.result  # {"tasks": [...], "failures": []}
    found: set[str] = set()
    for task in answer["tasks"]:  # type: ignore[index]
        found.add(task.task_arn)
        found.add(task.task_arn.rsplit("/", 1)[-1])
    for requested in self._get_param("tasks", []):
        if requested not in found:
            answer["failures"].append({"arn": requested, "reason": "MISSING"})  # type: ignore[index]
    return result


# One DynamoDB write at a time per table (see the module docs): moto's transactions
# restore a whole-table copy on failure, which is only safe with no concurrent writer to
# that table. Reads, and writes to other tables (other tests), are not held up.
_DYNAMODB_WRITES = frozenset(
    {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"}
)
_table_locks: dict[str, threading.Lock] = {}
_table_locks_guard = threading.Lock()
_original_dynamodb_call_action = DynamoHandler.call_action


def _written_tables(operation: str, raw: Any) -> list[str]:
    """The tables a write request names, sorted (locks are taken in that order)."""
    try:
        body = json.loads(raw.decode() if isinstance(raw, bytes) else raw or "{}")
    except (ValueError, UnicodeDecodeError):
        return []
    if operation == "TransactWriteItems":
        names = {
            op.get("TableName")
            for item in body.get("TransactItems", [])
            for op in item.values()
            if isinstance(op, dict)
        }
    elif operation == "BatchWriteItem":
        names = set(body.get("RequestItems", {}))
    else:
        names = {body.get("TableName")}
    return sorted(n for n in names if isinstance(n, str))


def dynamodb_call_action(self: DynamoHandler) -> Any:
    target = self.headers.get("X-Amz-Target") or self.headers.get("x-amz-target") or ""
    operation = target.rsplit(".", 1)[-1]
    if operation not in _DYNAMODB_WRITES:
        return _original_dynamodb_call_action(self)
    with _table_locks_guard:
        locks = [
            _table_locks.setdefault(name, threading.Lock())
            for name in _written_tables(operation, self.body)
        ]
    for lock in locks:
        lock.acquire()
    try:
        return _original_dynamodb_call_action(self)
    finally:
        for lock in reversed(locks):
            lock.release()


# Seconds a new snapshot stays `pending` (module docs).
SNAPSHOT_PENDING_SECS = float(os.environ.get("SANDBOX_MOTO_SNAPSHOT_PENDING_SECS", "2"))


def _snapshot_status(self: Any) -> str:
    """`pending` until SNAPSHOT_PENDING_SECS after the snapshot's creation, then what moto set."""
    status = self.__dict__.get("_sandbox_status", "completed")
    ready_at = self.__dict__.get("_sandbox_ready_at", 0.0)
    if status == "completed" and time.time() < ready_at:
        return "pending"
    return status


def _set_snapshot_status(self: Any, value: str) -> None:
    if "_sandbox_ready_at" not in self.__dict__:
        self.__dict__["_sandbox_ready_at"] = time.time() + SNAPSHOT_PENDING_SECS
    self.__dict__["_sandbox_status"] = value


Snapshot.status = property(_snapshot_status, _set_snapshot_status)  # type: ignore[assignment]
DynamoHandler.call_action = dynamodb_call_action  # type: ignore[method-assign]
EC2ContainerServiceResponse.run_task = run_task  # type: ignore[method-assign]
EC2ContainerServiceResponse.list_tasks = list_tasks  # type: ignore[method-assign]
EC2ContainerServiceResponse.describe_tasks = describe_tasks  # type: ignore[method-assign]
EC2ContainerServiceResponse.stop_task = stop_task  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
