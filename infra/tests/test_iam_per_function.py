"""One role per function, each granting exactly the AWS actions that
function's code sends, in SAM and CDK, with workspaces off and on and the warm pool
 off and on.

The actions come from the code: every SDK operation an adapter in crates/aws/src sends is
found in its source (a call `client.<operation>()` on an SDK client, test modules and
comments excluded) and mapped to its IAM action (the operation name in CamelCase, plus
the actions AWS authorizes alongside it, listed in IMPLIED with their source). Which
operations each function reaches is declared below per function, each with the code path
that sends it; the test fails when

- an adapter sends an operation no function and no non-deployed tool accounts for
  (a new call must be placed: the role would otherwise miss it), or a declared operation
  is no longer in the adapter's source (stale), or
- a role grants an action its function does not send (extra) or lacks one it sends
  (missing).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_templates import actions_of, role_statements, roles_by_purpose

REPO = Path(__file__).resolve().parents[2]
AWS_SRC = REPO / "crates" / "aws" / "src"

# Adapter source file -> the IAM service prefix of the SDK client it holds.
ADAPTERS = {
    "ecs_compute.rs": "ecs",
    "ebs_workspaces.rs": "ec2",
    "dynamo_registry.rs": "dynamodb",
    "sqs_queue.rs": "sqs",
    "sqs_dead_letters.rs": "sqs",
    "secrets.rs": "secretsmanager",
    # The warm pool (docs/WARM_POOL.md "ECS calls").
    "pool_table.rs": "dynamodb",
    "ecs_pool.rs": "ecs",
}
# The receivers the adapters call SDK operations on (field and variable names).
CLIENT_RECEIVER = r"\b(?:client|ecs|ec2|sqs|secrets|dynamodb|ddb)\s*\.\s*([a-z_]+)\s*\(\s*\)"

# Operations whose IAM action is not the operation's own name.
RENAMED = {
    # Waiters poll the describe call (aws-sdk-ec2 waiters; EC2 API reference).
    # TransactWriteItems has no action of its own: DynamoDB authorizes each item action
    # (DynamoDB Developer Guide, "Using IAM with DynamoDB transactions"); the item kinds
    # the adapter builds are found in its source (TRANSACT_ITEMS below).
    ("dynamodb", "transact_write_items"): set(),
    # SendMessageBatch is authorized as sqs:SendMessage (SQS Developer Guide, "Amazon SQS
    # API permissions: Actions and resource reference").
    ("sqs", "send_message_batch"): {"sqs:SendMessage"},
}
# Item kinds of a transaction -> their actions.
TRANSACT_ITEMS = {
    "ConditionCheck": "dynamodb:ConditionCheckItem",
    "Put": "dynamodb:PutItem",
    "Update": "dynamodb:UpdateItem",
    "Delete": "dynamodb:DeleteItem",
}
# Actions AWS authorizes along with an operation (each with its source).
IMPLIED = {
    # RunTask passes the task definition's execution and task roles (ECS Developer Guide,
    # "Task execution IAM role": iam:PassRole), tags the new task (ECS tagging
    # authorization: ecs:TagResource with ecs:CreateAction RunTask), and with a workspace
    # volume passes the ECS infrastructure role (volumeConfigurations roleArn).
    "ecs:RunTask": {"iam:PassRole", "ecs:TagResource"},
    # CreateSnapshot with TagSpecifications needs ec2:CreateTags (EC2 User Guide,
    # "Grant permission to tag resources during creation").
    "ec2:CreateSnapshot": {"ec2:CreateTags"},
}
# What every function's role needs outside its code: the Lambda runtime writes the logs.
RUNTIME = {"logs:CreateLogStream", "logs:PutLogEvents"}
# The worker's SQS event source mapping polls with the function's role (Lambda Developer
# Guide, "Using Lambda with Amazon SQS", execution role permissions).
EVENT_SOURCE = {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"}

# Operations in the adapters that no deployed function sends, and who sends them.
NOT_DEPLOYED = {
    # The table is created by the template; create_table is for tests and local tooling.
    ("dynamo_registry.rs", "create_table"): "tests (moto) only",
    ("dynamo_registry.rs", "describe_table"): "create_table's wait",
    ("dynamo_registry.rs", "update_time_to_live"): "create_table",
    # Dead-letter listing and redrive are operator commands (sandboxctl dead-letters).
    ("sqs_dead_letters.rs", "get_queue_url"): "sandboxctl dead-letters",
    ("sqs_dead_letters.rs", "get_queue_attributes"): "sandboxctl dead-letters",
    ("sqs_dead_letters.rs", "receive_message"): "sandboxctl dead-letters",
    ("sqs_dead_letters.rs", "change_message_visibility"): "sandboxctl dead-letters",
    ("sqs_dead_letters.rs", "send_message"): "sandboxctl dead-letters",
    ("sqs_dead_letters.rs", "delete_message"): "sandboxctl dead-letters",
    # The Lambda worker never receives or deletes itself (the event source mapping does,
    # EVENT_SOURCE); `receive`/`ack` serve sandboxctl and the moto tests.
    ("sqs_queue.rs", "receive_message"): "event source mapping / sandboxctl",
    ("sqs_queue.rs", "delete_message"): "event source mapping / sandboxctl",
    # Registry::list (a Scan of records) serves sandboxctl status and explain only; the
    # sweep reads the sparse by_open index with Query.
    ("dynamo_registry.rs", "scan"): "sandboxctl status / explain",
    # The pool table is created by the template too; these serve the moto tests.
    ("pool_table.rs", "create_table"): "tests (moto) only",
}

# Which operations each function reaches, with the code path. `workspaces`: only with
# workspaces on (ECS_INFRASTRUCTURE_ROLE_ARN set: EbsWorkspaces is built). `pool`: only with
# the warm pool on (POOL_SIZE > 0: the pool table and EcsPool are built).
REGISTRY_RUNTIME = {
    # DynamoRegistry: every runtime operation. Both the worker (decide/apply, locks, fence,
    # slots, ledger) and the sweeper (list, slots, release_orphan_slots' fenced
    # transaction) link the whole registry; it is not split per function (one adapter,
    # one table; the reads and writes a sweep does are already most of them).
    ("dynamo_registry.rs", op)
    for op in ("query", "put_item", "get_item", "update_item", "transact_write_items")
}
FUNCTIONS = {
    "webhook": {
        "always": {
            # secrets_at_init::read_webhook_verifiers -> secrets::read_secret
            ("secrets.rs", "get_secret_value"),
            # Intake::accept_delivery -> SqsQueue::send (events queue)
            ("sqs_queue.rs", "send_message"),
        },
        "workspaces": set(),
        "pool": set(),
        "extra": set(),
    },
    "worker": {
        "always": {
            # aws_wiring::controller -> read_api_key (the Agents API key)
            ("secrets.rs", "get_secret_value"),
            # timers re-enqueue, a sweep record's deferral, retries, dead-letter depth (SqsQueue)
            ("sqs_queue.rs", "send_message"),
            ("sqs_queue.rs", "change_message_visibility"),
            ("sqs_queue.rs", "get_queue_attributes"),
            # EcsCompute: start, stop, describe, list
            ("ecs_compute.rs", "run_task"),
            ("ecs_compute.rs", "stop_task"),
            ("ecs_compute.rs", "describe_tasks"),
            ("ecs_compute.rs", "list_tasks"),
        }
        | REGISTRY_RUNTIME,
        # EbsWorkspaces: snapshot after a stop, restore, list, delete
        "workspaces": {
            ("ebs_workspaces.rs", op)
            for op in (
                "create_snapshot",
                "describe_volumes",
                "describe_snapshots",
                "delete_volume",
                "delete_snapshot",
            )
        },
        # The pool (docs/WARM_POOL.md "ECS calls"): claim (token GetItem, Query by_idle,
        # DescribeTasks, TransactWriteItems, TagResource), refill (RunTask, member PutItem,
        # lease UpdateItem), recycle (UpdateItem, StopTask), reconcile (Query by_pool,
        # DescribeTasks, DeleteItem, StopTask, the backstop's ListTasks page and cursor), find (ListTasks, Query by_environment),
        # describe resolution of an untagged claimed member (BatchGetItem).
        "pool": {
            ("pool_table.rs", op)
            for op in (
                "get_item",
                "query",
                "put_item",
                "update_item",
                "delete_item",
                "batch_get_item",
                "transact_write_items",
            )
        }
        # The pool's members are started and tagged by ecs_compute/pool.rs and its reconcile
        # reads one backstop ListTasks page (ecs_compute/pool_upkeep.rs: maxResults,
        # nextToken); its reads and stops are EcsCompute's (above).
        | {("ecs_compute.rs", op) for op in ("run_task", "tag_resource", "list_tasks")},
        "extra": EVENT_SOURCE,
    },
    "sweeper": {
        "always": {
            # sweep_fan_out -> sweep_queue().send_batch (SendMessageBatch, 10 a call)
            # and .send; sweeper_handler -> events.dead_letter_count
            ("sqs_queue.rs", "send_message"),
            ("sqs_queue.rs", "send_message_batch"),
            ("sqs_queue.rs", "get_queue_attributes"),
            # plan_sweep -> compute.list / describe_many; release_orphan_slots -> find
            ("ecs_compute.rs", "list_tasks"),
            ("ecs_compute.rs", "describe_tasks"),
        }
        | REGISTRY_RUNTIME,
        # sweep_workspaces -> list_stored, delete_stored (never a snapshot)
        "workspaces": {
            ("ebs_workspaces.rs", op)
            for op in ("describe_volumes", "describe_snapshots", "delete_volume", "delete_snapshot")
        },
        # list / find resolve claimed pool members (BatchGetItem of member items, Query
        # by_environment); the sweep never runs, tags or stops a member (the worker
        # refills, on its schedule).
        "pool": {("pool_table.rs", "query"), ("pool_table.rs", "batch_get_item")},
        "extra": set(),
    },
}


def strip_tests_and_comments(src: str) -> str:
    m = re.search(r"\n#\[cfg\(test\)\]\nmod tests", src)
    if m:
        src = src[: m.start()]
    src = re.sub(r'r#"(?:.|\n)*?"#', '""', src)
    # `\\[\s\S]`: an escape may be a backslash-newline (a string continued on the next
    # line); `.` would stop there and leave the rest of the file misread.
    src = re.sub(r'"(?:\\[\s\S]|[^"\\])*"', '""', src)
    return re.sub(r"//[^\n]*", "", src)


def adapter_source(file: str) -> str:
    """An adapter's code, tests and comments stripped: `X.rs`, or every file of the
    directory module `X/` (one adapter split by concern, as the house rules count it)."""
    path = AWS_SRC / file
    if path.is_file():
        return strip_tests_and_comments(path.read_text())
    directory = AWS_SRC / file.removesuffix(".rs")
    files = sorted(directory.glob("*.rs"))
    assert files, f"adapter {file}: neither {path} nor {directory}/*.rs exists"
    return "\n".join(strip_tests_and_comments(f.read_text()) for f in files)


def adapter_operations() -> dict[tuple[str, str], set[str]]:
    """{(file, operation): IAM actions}, for every SDK operation the adapters send."""
    out = {}
    for file, service in ADAPTERS.items():
        src = adapter_source(file)
        for op in set(re.findall(CLIENT_RECEIVER, src)) - {"clone"}:
            if (service, op) in RENAMED:
                actions = set(RENAMED[(service, op)])
                if op == "transact_write_items":
                    kinds = set(re.findall(r"\b(ConditionCheck|Put|Update|Delete)::builder\(\)", src))
                    actions |= {TRANSACT_ITEMS[k] for k in kinds}
            else:
                actions = {f"{service}:" + "".join(w.capitalize() for w in op.split("_"))}
            out[(file, op)] = actions
    return out


def expected_actions(function: str, workspaces: bool, pool: bool = False) -> set[str]:
    ops = adapter_operations()
    spec = FUNCTIONS[function]
    reached = spec["always"] | (spec["workspaces"] if workspaces else set()) | (spec["pool"] if pool else set())
    actions = set(RUNTIME) | spec["extra"]
    for key in reached:
        actions |= ops[key]
    for action in list(actions):
        actions |= IMPLIED.get(action, set())
    return actions


def test_every_adapter_operation_is_placed_and_every_declared_one_exists():
    ops = adapter_operations()
    assert ("ecs_compute.rs", "run_task") in ops, "the scan finds the adapters' calls"
    declared = set(NOT_DEPLOYED)
    for spec in FUNCTIONS.values():
        declared |= spec["always"] | spec["workspaces"] | spec["pool"]
    assert set(ops) - declared == set(), "operations sent by an adapter but placed in no function"
    assert declared - set(ops) == set(), "declared operations the adapters no longer send"


# The warm pool and EBS workspaces exclude each other (a member starts without the
# environment's volume): the templates refuse the pair (test_the_pool_needs_the_split_executor).
@pytest.mark.parametrize(
    ("workspaces", "pool"),
    [(False, False), (True, False), (False, True)],
    ids=["workspaces-off-pool-off", "workspaces-on-pool-off", "workspaces-off-pool-on"],
)
def test_each_role_grants_exactly_what_its_function_calls(request, workspaces, pool):
    suffix = ("_pool" if pool else "") + ("_workspaces_cfn" if workspaces else "_cfn")
    for template in ("sam", "cdk"):
        cfn = request.getfixturevalue(template + suffix)
        roles = roles_by_purpose(cfn)
        for function in FUNCTIONS:
            (role_id,) = [r for p, r in roles.items() if p.startswith(f"sandbox-lifecycle {function} ")]
            granted = actions_of(role_statements(cfn, role_id))
            wanted = expected_actions(function, workspaces, pool)
            where = f"{template}, workspaces {'on' if workspaces else 'off'}, pool {'on' if pool else 'off'}, {function}"
            assert granted - wanted == set(), f"{where}: extra {sorted(granted - wanted)}"
            assert wanted - granted == set(), f"{where}: missing {sorted(wanted - granted)}"
