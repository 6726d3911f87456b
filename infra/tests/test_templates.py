"""The SAM template and the CDK stack, checked offline after synthesis.

- Both declare the same resources (multiset of CloudFormation types) and give each role the
  same IAM actions: the SAM template and the `SandboxLifecycle` construct must not drift.
- Least privilege (issue "Deployable with SAM and with CDK", item 4), on both: no `*`
  resource for the ECS, IAM, DynamoDB, SQS and Secrets Manager actions; RunTask only on the
  executor family; PassRole only on the executor's two roles for ecs-tasks; task actions
  conditioned on the cluster; each secret readable only where it is needed; an executor
  task role without any policy, or with the warm pool on one statement reading
  only the task's own pool item.
- Wiring: every function environment variable is one the Rust code reads
  (crates/aws/src/settings/, parsed here), every required one is set, and the
  failed-start metric filter matches a message the controller really logs.

Roles are matched across the two templates by what uses them (a function, by its
`Description`; the task definition, by `ExecutionRoleArn` / `TaskRoleArn`), since
logical ids differ (CDK appends hashes).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from conftest import resolve_conditions

REPO = Path(__file__).resolve().parents[2]
SETTINGS_DIR = REPO / "crates" / "aws" / "src" / "settings"
METRICS_RS = REPO / "crates" / "controller" / "src" / "metrics.rs"

# Resource types that may legitimately differ between the two templates. Empty: the
# construct declares exactly what SAM generates (CDK metadata is off in bin/app.ts).
ALLOWED_TYPE_DIFFERENCES: Counter = Counter()

# Actions that must never have a bare "*" resource (item 4).
SCOPED_PREFIXES = ("ecs:", "iam:", "dynamodb:", "sqs:", "secretsmanager:", "ec2:")
# The actions granted on "*": they have no resource type in the Service Authorization
# Reference (ecr:GetAuthorizationToken grants no image access by itself; the two EC2
# reads list the workspace volumes and snapshots).
STAR_ONLY_ACTIONS = {"ecr:GetAuthorizationToken", "ec2:DescribeVolumes", "ec2:DescribeSnapshots"}
# EC2 actions that change something: each only on this deployment's tagged resources.
EC2_WRITE_ACTIONS = {"ec2:CreateSnapshot", "ec2:CreateTags", "ec2:DeleteVolume", "ec2:DeleteSnapshot"}


# ----------------------------------------------------------------------------- helpers
def resources(cfn: dict, cfn_type: str) -> dict[str, dict]:
    return {k: v for k, v in cfn["Resources"].items() if v["Type"] == cfn_type}


def ref_target(value) -> str | None:
    """The logical id named by `Ref` or `Fn::GetAtt`."""
    if isinstance(value, dict):
        if "Ref" in value:
            return value["Ref"]
        if "Fn::GetAtt" in value:
            att = value["Fn::GetAtt"]
            return att[0] if isinstance(att, list) else att.split(".")[0]
    return None


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def role_statements(cfn: dict, role_id: str) -> list[dict]:
    """Every statement granted to `role_id`: inline policies, AWS::IAM::Policy resources
    attached to it, and (failing the test) managed policies."""
    role = cfn["Resources"][role_id]["Properties"]
    assert not role.get("ManagedPolicyArns"), f"{role_id} has managed policies: least privilege is inline"
    out = []
    for policy in role.get("Policies", []):
        out += as_list(policy["PolicyDocument"]["Statement"])
    for policy in resources(cfn, "AWS::IAM::Policy").values():
        props = policy["Properties"]
        if any(ref_target(r) == role_id for r in props.get("Roles", [])):
            out += as_list(props["PolicyDocument"]["Statement"])
    return out


def actions_of(statements: list[dict]) -> set[str]:
    return {a for s in statements if s["Effect"] == "Allow" for a in as_list(s["Action"])}


def roles_by_purpose(cfn: dict) -> dict[str, str]:
    """{purpose: role logical id}: each function's role by its description, and the
    executor's execution and task roles."""
    out = {}
    for fn in resources(cfn, "AWS::Lambda::Function").values():
        props = fn["Properties"]
        out[props["Description"]] = ref_target(props["Role"])
    (task_def,) = resources(cfn, "AWS::ECS::TaskDefinition").values()
    out["executor execution role"] = ref_target(task_def["Properties"]["ExecutionRoleArn"])
    # Only with the warm pool on: without it the task definition names no task role.
    if "TaskRoleArn" in task_def["Properties"]:
        out["executor task role"] = ref_target(task_def["Properties"]["TaskRoleArn"])
    assert len(set(out.values())) == len(out), f"roles are shared between purposes: {out}"
    return out


def function_by_binary(cfn: dict, binary: str) -> dict:
    """The function whose description starts with `sandbox-lifecycle <binary>`."""
    (fn,) = [
        f["Properties"]
        for f in resources(cfn, "AWS::Lambda::Function").values()
        if f["Properties"]["Description"].startswith(f"sandbox-lifecycle {binary} ")
    ]
    return fn


def settings_vars() -> dict[str, dict[str, set[str]]]:
    """{"webhook"|"controller": {"required": {...}, "optional": {...}}}, read from the
    `impl WebhookSettings` block of settings/mod.rs and the controller's files of
    settings/ (`impl ControllerSettings` in controller.rs, the workspace volume's
    variables in volume.rs)."""
    root = (SETTINGS_DIR / "mod.rs").read_text()
    root = root.split("#[cfg(test)]")[0]
    webhook = root[root.index("impl WebhookSettings") :]
    controller = "".join(
        (SETTINGS_DIR / name).read_text().split("#[cfg(test)]")[0] for name in ("controller.rs", "volume.rs")
    )
    assert "impl ControllerSettings" in controller
    call = re.compile(r'vars\s*\.\s*(\w+)\(\s*"([A-Z0-9_]+)"', re.S)
    required_kinds = {"required", "queue_url", "secret_ref"}

    def collect(block: str) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {"required": set(), "optional": set()}
        for kind, var in call.findall(block):
            found["required" if kind in required_kinds else "optional"].add(var)
        # A variable read with `optional` first (EVENTS_DLQ_URL, then validated as a
        # queue URL) is optional.
        found["required"] -= found["optional"]
        # SUBNETS is read as a list but refused when empty.
        if re.search(r'Missing\s*\{\s*var:\s*"SUBNETS"', block):
            found["optional"].discard("SUBNETS")
            found["required"].add("SUBNETS")
        # Tests only (moto).
        found["optional"].discard("AWS_ENDPOINT_URL")
        return found

    return {"webhook": collect(webhook), "controller": collect(controller)}


# ----------------------------------------------------------------------------- agreement
# The warm pool and EBS workspaces exclude each other (a member starts without the
# environment's volume): the templates refuse the pair (test_the_pool_needs_the_split_executor).
@pytest.mark.parametrize(
    ("workspaces", "pool"),
    [(False, False), (True, False), (False, True)],
    ids=["workspaces-off-pool-off", "workspaces-on-pool-off", "workspaces-off-pool-on"],
)
def test_sam_and_cdk_declare_the_same_resource_types(request, workspaces, pool):
    sam_cfn, cdk_cfn = both(request, workspaces, pool)
    sam = Counter(r["Type"] for r in sam_cfn["Resources"].values())
    cdk = Counter(r["Type"] for r in cdk_cfn["Resources"].values())
    assert sam - cdk - ALLOWED_TYPE_DIFFERENCES == Counter(), "only in SAM"
    assert cdk - sam - ALLOWED_TYPE_DIFFERENCES == Counter(), "only in CDK"


def both(request, workspaces: bool, pool: bool = False) -> tuple[dict, dict]:
    """(SAM, CDK), with workspaces and the warm pool off (the defaults) or on."""
    suffix = ("_pool" if pool else "") + ("_workspaces_cfn" if workspaces else "_cfn")
    return request.getfixturevalue("sam" + suffix), request.getfixturevalue("cdk" + suffix)


# The warm pool and EBS workspaces exclude each other (a member starts without the
# environment's volume): the templates refuse the pair (test_the_pool_needs_the_split_executor).
@pytest.mark.parametrize(
    ("workspaces", "pool"),
    [(False, False), (True, False), (False, True)],
    ids=["workspaces-off-pool-off", "workspaces-on-pool-off", "workspaces-off-pool-on"],
)
def test_sam_and_cdk_grant_each_role_the_same_actions(request, workspaces, pool):
    sam_cfn, cdk_cfn = both(request, workspaces, pool)
    sam_roles, cdk_roles = roles_by_purpose(sam_cfn), roles_by_purpose(cdk_cfn)
    assert sam_roles.keys() == cdk_roles.keys()
    for purpose in sam_roles:
        sam = actions_of(role_statements(sam_cfn, sam_roles[purpose]))
        cdk = actions_of(role_statements(cdk_cfn, cdk_roles[purpose]))
        assert sam == cdk, f"{purpose}: only SAM {sorted(sam - cdk)}, only CDK {sorted(cdk - sam)}"


@pytest.mark.parametrize("pool", [False, True], ids=["pool-off", "pool-on"])
def test_sam_and_cdk_set_the_same_environment_variables(request, pool):
    sam_cfn, cdk_cfn = both(request, False, pool)
    for binary in ("webhook", "worker", "sweeper"):
        sam = function_by_binary(sam_cfn, binary)["Environment"]["Variables"].keys()
        cdk = function_by_binary(cdk_cfn, binary)["Environment"]["Variables"].keys()
        assert set(sam) == set(cdk), binary


def test_sam_and_cdk_configure_functions_alike(sam_cfn, cdk_cfn):
    keys = ("Runtime", "Architectures", "Handler", "MemorySize", "Timeout")
    for binary in ("webhook", "worker", "sweeper"):
        sam, cdk = function_by_binary(sam_cfn, binary), function_by_binary(cdk_cfn, binary)
        assert {k: sam.get(k) for k in keys} == {k: cdk.get(k) for k in keys}, binary


# ----------------------------------------------------------------------------- least privilege
def test_scoped_actions_never_have_a_star_resource(any_cfn, any_pool_cfn):
    for cfn, role_id in [(c, r) for c in (any_cfn, any_pool_cfn) for r in roles_by_purpose(c).values()]:
        for statement in role_statements(cfn, role_id):
            # An explicit deny (the pool task role's "everything else") narrows; it grants nothing.
            if statement["Effect"] == "Deny":
                continue
            star = "*" in as_list(statement.get("Resource", []))
            actions = set(as_list(statement["Action"]))
            if star:
                assert actions <= STAR_ONLY_ACTIONS, f"{role_id}: {sorted(actions)} on *"
                assert not any(a.startswith(SCOPED_PREFIXES) for a in actions - STAR_ONLY_ACTIONS)
            assert not any(a.endswith("*") for a in actions), f"{role_id}: wildcard action {actions}"


def statements_with(cfn: dict, role_id: str, action: str) -> list[dict]:
    return [s for s in role_statements(cfn, role_id) if action in as_list(s["Action"])]


def flat(value) -> str:
    """A resource or condition value as text, with intrinsics spelled out (for matching)."""
    return json.dumps(value, sort_keys=True)


def test_sweeper_role_starts_stops_and_passes_nothing(any_cfn, any_workspaces_cfn, any_pool_cfn):
    # A sweep reads, fans out and deletes stored workspaces; the jobs it fans out
    # run in the worker. Also with the warm pool on (its refill is a worker job).
    for cfn in (any_cfn, any_workspaces_cfn, any_pool_cfn):
        roles = roles_by_purpose(cfn)
        (role_id,) = [r for p, r in roles.items() if p.startswith("sandbox-lifecycle sweeper")]
        granted = actions_of(role_statements(cfn, role_id))
        for action in ("ecs:RunTask", "ecs:StopTask", "ecs:TagResource", "iam:PassRole", "ec2:CreateSnapshot", "ec2:CreateTags"):
            assert action not in granted, action
        (cluster_id,) = resources(cfn, "AWS::ECS::Cluster")
        for action in ("ecs:DescribeTasks", "ecs:ListTasks"):
            (statement,) = statements_with(cfn, role_id, action)
            assert cluster_id in flat(statement["Condition"]["ArnEquals"]["ecs:cluster"]), action
            assert cluster_id in flat(statement["Resource"]), action


def test_only_the_worker_holds_the_agents_api_key(any_cfn, any_workspaces_cfn):
    # A sweep reads no session (aws_wiring::sweeper_controller builds the sweeper
    # with NoSessions), so the sweeper gets neither the key's ARN nor GetSecretValue on it.
    for cfn in (any_cfn, any_workspaces_cfn):
        sweeper = function_by_binary(cfn, "sweeper")["Environment"]["Variables"]
        assert "OPENAI_API_KEY_SECRET_ARN" not in sweeper
        assert "AGENTS_API_BASE_URL" not in sweeper
        worker = function_by_binary(cfn, "worker")["Environment"]["Variables"]
        assert "OPENAI_API_KEY_SECRET_ARN" in worker
        roles = roles_by_purpose(cfn)
        (sweeper_role,) = [r for p, r in roles.items() if p.startswith("sandbox-lifecycle sweeper")]
        assert "secretsmanager:GetSecretValue" not in actions_of(role_statements(cfn, sweeper_role))


def test_workspace_statements_and_the_infrastructure_role_exist_only_with_workspaces(any_cfn):
    roles = roles_by_purpose(any_cfn)
    for role_id in roles.values():
        granted = actions_of(role_statements(any_cfn, role_id))
        assert not {a for a in granted if a.startswith("ec2:")}, role_id
        passed = [flat(s["Resource"]) for s in statements_with(any_cfn, role_id, "iam:PassRole")]
        assert all("Infrastructure" not in p for p in passed), passed
    assert not [
        k
        for k, r in resources(any_cfn, "AWS::IAM::Role").items()
        if "ecs.amazonaws.com" in flat(r["Properties"]["AssumeRolePolicyDocument"])
    ]


def test_image_pull_is_scoped_to_the_executor_repository(any_cfn):
    role_id = roles_by_purpose(any_cfn)["executor execution role"]
    (pull,) = statements_with(any_cfn, role_id, "ecr:BatchGetImage")
    (resource,) = as_list(pull["Resource"])
    text = flat(resource)
    assert "repository/*" not in text, text
    if "ExecutorImage" in text:  # SAM: derived from the ExecutorImage parameter
        assert "repository/${Repository}" in text, text
    else:  # CDK: resolved from executorImage at synth time
        assert text.endswith(':ecr:us-east-1:123456789012:repository/sandbox-executor"]]}'), text


def test_webhook_and_worker_have_reserved_concurrency(sam_cfn, cdk_cfn):
    # A flood of unsigned POSTs is throttled at the webhook's own limit and cannot
    # take the regional concurrency the worker and the sweeper need.
    sam = {b: function_by_binary(sam_cfn, b).get("ReservedConcurrentExecutions") for b in ("webhook", "worker")}
    assert sam == {
        "webhook": {"Ref": "WebhookReservedConcurrency"},
        "worker": {"Fn::FindInMap": [
            "WorkerReservedConcurrency",
            {"Ref": "WorkerMaximumConcurrency"},
            {"Ref": "WorkerSweepMaximumConcurrency"},
        ]},
    }
    assert sam_cfn["Parameters"]["WebhookReservedConcurrency"]["Default"] == 10
    assert "WorkerReservedConcurrency" not in sam_cfn["Parameters"], "computed, never a free parameter"
    cdk = {b: function_by_binary(cdk_cfn, b).get("ReservedConcurrentExecutions") for b in ("webhook", "worker")}
    # 2 x 10 (events, timers) + 2 (sweep) + 1 (the refill), as SAM's defaults look it up.
    assert cdk == {"webhook": 10, "worker": 23}
    params = sam_cfn["Parameters"]
    looked_up = sam_cfn["Mappings"]["WorkerReservedConcurrency"][
        str(params["WorkerMaximumConcurrency"]["Default"])][str(params["WorkerSweepMaximumConcurrency"]["Default"])]
    assert looked_up == cdk["worker"]


def worker_reservation_sam(sam_cfn, max_concurrency, sweep_max_concurrency):
    """The worker's ReservedConcurrentExecutions SAM deploys for these two parameter values,
    evaluated as CloudFormation does: each value must be one of the parameter's
    AllowedValues (else the stack is refused before any change) and Fn::FindInMap must
    find the pair (else the stack is refused too). Raises ValueError for a refusal."""
    params = sam_cfn["Parameters"]
    for name, value in (("WorkerMaximumConcurrency", max_concurrency),
                        ("WorkerSweepMaximumConcurrency", sweep_max_concurrency)):
        if str(value) not in [str(v) for v in params[name]["AllowedValues"]]:
            raise ValueError(f"{name}={value} is not an allowed value")
    table = sam_cfn["Mappings"]["WorkerReservedConcurrency"]
    try:
        return table[str(max_concurrency)][str(sweep_max_concurrency)]
    except KeyError as e:
        raise ValueError(f"no reservation for {max_concurrency}/{sweep_max_concurrency}") from e


def test_worker_reservation_covers_every_source_and_the_refill_in_sam(sam_cfn):
    """Every allowed pair looks up 2 x WorkerMaximumConcurrency (events, timers) +
    WorkerSweepMaximumConcurrency + 1 (the refill): the sum CloudFormation cannot compute,
    tabulated. Each source's ScalingConfig names exactly these parameters, so the
    reservation can never fall below the sources' sum; a value outside the table (a
    reservation that would not cover them) is refused."""
    params = sam_cfn["Parameters"]
    for m in params["WorkerMaximumConcurrency"]["AllowedValues"]:
        assert 2 <= int(m) <= 1000, m  # Lambda's MaximumConcurrency range
        for sweep in params["WorkerSweepMaximumConcurrency"]["AllowedValues"]:
            assert 2 <= int(sweep) <= 1000, sweep
            assert worker_reservation_sam(sam_cfn, m, sweep) == 2 * int(m) + int(sweep) + 1, (m, sweep)
    # The table has no entry beyond the allowed values (nothing unreachable, nothing stale).
    table = sam_cfn["Mappings"]["WorkerReservedConcurrency"]
    assert sorted(table, key=int) == [str(v) for v in params["WorkerMaximumConcurrency"]["AllowedValues"]]
    for row in table.values():
        assert sorted(row, key=int) == [str(v) for v in params["WorkerSweepMaximumConcurrency"]["AllowedValues"]]
    # Misconfigured combinations are refused, not deployed with too small a reservation.
    for m, sweep in ((11, 2), (10, 3), (1, 2), (10, 1), (2000, 2)):
        with pytest.raises(ValueError):
            worker_reservation_sam(sam_cfn, m, sweep)
    assert source_concurrency(sam_cfn) == {
        "EventsQueue": {"Ref": "WorkerMaximumConcurrency"},
        "TimersQueue": {"Ref": "WorkerMaximumConcurrency"},
        "SweepQueue": {"Ref": "WorkerSweepMaximumConcurrency"},
    }


def source_concurrency(cfn: dict) -> dict[str, object]:
    """{queue logical id: MaximumConcurrency} of every SQS event source mapping."""
    return {
        ref_target(m["Properties"]["EventSourceArn"]): m["Properties"]["ScalingConfig"]["MaximumConcurrency"]
        for m in resources(cfn, "AWS::Lambda::EventSourceMapping").values()
    }


def test_sweep_jobs_have_a_queue_and_a_source_of_their_own(any_cfn):
    """Three sources on the worker, one per queue: the sweep queue's with its own (lower by
    default) MaximumConcurrency, so a sweep's jobs never share the timers queue's source;
    the sweeper sends to the sweep queue and to no other."""
    sources = source_concurrency(any_cfn)
    names = {q: next(n for n in ("Events", "Timers", "Sweep") if f"{n}Queue" in q) for q in sources}
    assert sorted(names.values()) == ["Events", "Sweep", "Timers"], sources
    by_name = {names[q]: c for q, c in sources.items()}
    if all(isinstance(c, int) for c in by_name.values()):  # CDK: the defaults, resolved
        assert by_name == {"Events": 10, "Timers": 10, "Sweep": 2}
    sweeper = roles_by_purpose(any_cfn)["sandbox-lifecycle sweeper (scheduled reconciliation)"]
    sent_to = {
        ref_target(r)
        for st in role_statements(any_cfn, sweeper)
        if st["Effect"] == "Allow" and "sqs:SendMessage" in as_list(st["Action"])
        for r in as_list(st["Resource"])
    }
    assert len(sent_to) == 1 and "SweepQueue" in next(iter(sent_to)), sent_to


def test_worker_role_is_scoped_to_the_executor(any_workspaces_cfn):
    any_cfn = any_workspaces_cfn
    roles = roles_by_purpose(any_cfn)
    (role_id,) = [r for p, r in roles.items() if p.startswith("sandbox-lifecycle worker")]
    (cluster_id,) = resources(any_cfn, "AWS::ECS::Cluster")

    (run,) = statements_with(any_cfn, role_id, "ecs:RunTask")
    (resource,) = as_list(run["Resource"])
    assert "task-definition/" in flat(resource) and "-executor:*" in flat(resource)
    assert cluster_id in flat(run["Condition"]["ArnEquals"]["ecs:cluster"])

    for action in ("ecs:StopTask", "ecs:DescribeTasks", "ecs:ListTasks"):
        (statement,) = statements_with(any_cfn, role_id, action)
        assert cluster_id in flat(statement["Condition"]["ArnEquals"]["ecs:cluster"]), action
        assert cluster_id in flat(statement["Resource"]), action

    (tag,) = statements_with(any_cfn, role_id, "ecs:TagResource")
    assert tag["Condition"] == {"StringEquals": {"ecs:CreateAction": "RunTask"}}

    pass_task, pass_infra = sorted(
        statements_with(any_cfn, role_id, "iam:PassRole"),
        key=lambda s: flat(s["Condition"]),
    )
    passed = {ref_target(r) for r in as_list(pass_task["Resource"])}
    assert passed == {roles["executor execution role"]}, "no task role is passed without the pool"
    assert pass_task["Condition"] == {"StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}}
    # The ECS infrastructure role (EBS workspace volumes), to ECS only.
    (infra_role,) = [ref_target(r) for r in as_list(pass_infra["Resource"])]
    assert infra_role == infrastructure_role(any_cfn)
    assert pass_infra["Condition"] == {"StringEquals": {"iam:PassedToService": "ecs.amazonaws.com"}}

    (table_id,) = resources(any_cfn, "AWS::DynamoDB::Table")
    for statement in role_statements(any_cfn, role_id):
        actions = as_list(statement["Action"])
        if any(a.startswith("dynamodb:") for a in actions):
            for r in as_list(statement["Resource"]):
                assert table_id in flat(r), r
        if any(a.startswith("sqs:") for a in actions):
            queues = set(resources(any_cfn, "AWS::SQS::Queue"))
            for r in as_list(statement["Resource"]):
                assert ref_target(r) in queues, r


def infrastructure_role(cfn: dict) -> str:
    """The ECS infrastructure role: the one role ecs.amazonaws.com assumes."""
    (role_id,) = [
        k
        for k, r in resources(cfn, "AWS::IAM::Role").items()
        if "ecs.amazonaws.com" in flat(r["Properties"]["AssumeRolePolicyDocument"])
    ]
    return role_id


def test_the_infrastructure_role_has_only_the_managed_ebs_volume_policy(any_workspaces_cfn):
    any_cfn = any_workspaces_cfn
    role = any_cfn["Resources"][infrastructure_role(any_cfn)]["Properties"]
    (managed,) = role["ManagedPolicyArns"]
    assert "policy/service-role/AmazonECSInfrastructureRolePolicyForVolumes" in flat(managed)
    assert not role.get("Policies")


@pytest.mark.parametrize("purpose_prefix", ["sandbox-lifecycle worker", "sandbox-lifecycle sweeper"])
def test_ec2_workspace_actions_are_conditioned_on_the_deployment_tag(any_workspaces_cfn, purpose_prefix):
    any_cfn = any_workspaces_cfn
    (role_id,) = [r for p, r in roles_by_purpose(any_cfn).items() if p.startswith(purpose_prefix)]
    statements = role_statements(any_cfn, role_id)
    granted = actions_of(statements)
    # The sweeper deletes and lists; only the worker snapshots (and tags the snapshot).
    wanted = EC2_WRITE_ACTIONS if "worker" in purpose_prefix else {"ec2:DeleteVolume", "ec2:DeleteSnapshot"}
    assert {a for a in granted if a in EC2_WRITE_ACTIONS} == wanted
    assert {"ec2:DescribeVolumes", "ec2:DescribeSnapshots"} <= granted
    assert {a for a in granted if a.startswith("ec2:")} <= EC2_WRITE_ACTIONS | STAR_ONLY_ACTIONS
    for statement in statements:
        actions = set(as_list(statement["Action"]))
        if not actions & EC2_WRITE_ACTIONS:
            continue
        resources_ = flat(statement["Resource"])
        assert ":volume/" in resources_ or ":snapshot/" in resources_, statement
        condition = statement["Condition"]["StringEquals"]
        if actions == {"ec2:CreateTags"}:
            assert condition == {"ec2:CreateAction": "CreateSnapshot"}
        else:
            (key,) = condition
            assert key in ("aws:ResourceTag/sandbox:deployment", "aws:RequestTag/sandbox:deployment"), statement


def test_the_workspace_volume_is_off_by_default_and_mounted_when_on(sam_cfn_raw, cdk_cfn):
    sam_cfn = sam_cfn_raw
    for cfn in (sam_cfn, cdk_cfn):
        for binary in ("worker", "sweeper"):
            variables = function_by_binary(cfn, binary)["Environment"]["Variables"]
            for var in ("ECS_INFRASTRUCTURE_ROLE_ARN", "WORKSPACE_VOLUME_GIB", "WORKSPACE_VOLUME_TYPE"):
                assert var in variables, (binary, var)
    # CDK with its defaults: off, so no volume and empty variables (blank = unset).
    cdk_worker = function_by_binary(cdk_cfn, "worker")["Environment"]["Variables"]
    assert cdk_worker["WORKSPACE_VOLUME_GIB"] == ""
    assert cdk_worker["ECS_INFRASTRUCTURE_ROLE_ARN"] == ""
    (cdk_td,) = resources(cdk_cfn, "AWS::ECS::TaskDefinition").values()
    assert "Volumes" not in cdk_td["Properties"]
    # SAM: everything hangs on one condition, WorkspaceVolumeGiB > 0.
    assert str(sam_cfn["Parameters"]["WorkspaceVolumeGiB"]["Default"]) == "0"
    (sam_td,) = resources(sam_cfn, "AWS::ECS::TaskDefinition").values()
    volumes = sam_td["Properties"]["Volumes"]["Fn::If"]
    assert volumes[0] == "HasWorkspaceVolumes"
    assert volumes[1] == [{"Name": "workspace", "ConfiguredAtLaunch": True}]
    mounts = sam_td["Properties"]["ContainerDefinitions"][0]["MountPoints"]["Fn::If"]
    assert mounts[1] == [{"SourceVolume": "workspace", "ContainerPath": "/workspace", "ReadOnly": False}]
    sam_worker = function_by_binary(sam_cfn, "worker")["Environment"]["Variables"]
    assert sam_worker["ECS_INFRASTRUCTURE_ROLE_ARN"]["Fn::If"][0] == "HasWorkspaceVolumes"
    assert sam_worker["WORKSPACE_VOLUME_GIB"]["Fn::If"][1] == {"Ref": "WorkspaceVolumeGiB"}


# Every DynamoDB action the registry adapter sends from the functions
# (crates/aws/src/dynamo_registry/; `Scan` only serves sandboxctl's `Registry::list`).
# TransactWriteItems has no action of its own: it is authorized per item action
# (ConditionCheckItem for the fence, PutItem, UpdateItem, DeleteItem; DynamoDB Developer
# Guide, "Using IAM with DynamoDB transactions").
REGISTRY_ACTIONS = {
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:ConditionCheckItem",
    "dynamodb:Query",
}


def test_worker_and_sweeper_may_send_every_registry_call(any_cfn):
    roles = roles_by_purpose(any_cfn)
    checked = 0
    for purpose, role_id in roles.items():
        if not purpose.split(" (")[0].endswith(("worker", "sweeper")):
            continue
        granted = {
            a
            for statement in role_statements(any_cfn, role_id)
            for a in as_list(statement["Action"])
            if a.startswith("dynamodb:")
        }
        assert REGISTRY_ACTIONS <= granted, f"{purpose}: missing {sorted(REGISTRY_ACTIONS - granted)}"
        checked += 1
    assert checked >= 1, roles


def test_each_secret_is_readable_only_where_needed(any_cfn):
    roles = roles_by_purpose(any_cfn)
    readers: dict[str, set[str]] = {}
    for purpose, role_id in roles.items():
        for s in statements_with(any_cfn, role_id, "secretsmanager:GetSecretValue"):
            for r in as_list(s["Resource"]):
                readers.setdefault(flat(r), set()).add(purpose.split(" (")[0])
    # The webhook may also read the previous signing secret (a rotation): same reader.
    assert sorted(set(map(tuple, map(sorted, readers.values())))) == sorted(
        [
            ("executor execution role",),
            ("sandbox-lifecycle webhook",),
            # The sweeper reads no session, so only the worker reads the API key.
            ("sandbox-lifecycle worker",),
        ]
    ), readers
    # No other secret action anywhere.
    for role_id in roles.values():
        for a in actions_of(role_statements(any_cfn, role_id)):
            assert not a.startswith("secretsmanager:") or a == "secretsmanager:GetSecretValue"


def test_the_sandbox_has_no_task_role_without_the_pool(any_cfn):
    """Without the warm pool the task definition names no task role and none is declared:
    code in the sandbox gets no AWS credential at all (the container credentials endpoint
    has nothing to hand out), so no same-account resource policy admitting `Principal: "*"`
    under an account or VPC-endpoint condition can admit it."""
    (task_def,) = resources(any_cfn, "AWS::ECS::TaskDefinition").values()
    assert "TaskRoleArn" not in task_def["Properties"]
    assert "executor task role" not in roles_by_purpose(any_cfn)
    trusted_by_tasks = [
        k
        for k, r in resources(any_cfn, "AWS::IAM::Role").items()
        if "ecs-tasks.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])
    ]
    assert trusted_by_tasks == [roles_by_purpose(any_cfn)["executor execution role"]], trusted_by_tasks


def test_the_execution_and_infrastructure_roles_trust_only_this_account(any_workspaces_cfn):
    """The confused-deputy guard (IAM User Guide, "The confused deputy problem") on the
    roles ECS itself assumes: aws:SourceAccount = this account."""
    cfn = any_workspaces_cfn
    ids = [roles_by_purpose(cfn)["executor execution role"], infrastructure_role(cfn)]
    for role_id in ids:
        (statement,) = cfn["Resources"][role_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        account = render(statement["Condition"]["StringEquals"]["aws:SourceAccount"])
        assert account in ("${AWS::AccountId}", "123456789012"), (role_id, account)


def test_webhook_can_only_enqueue_and_read_its_secret(any_cfn):
    (role_id,) = [r for p, r in roles_by_purpose(any_cfn).items() if p.startswith("sandbox-lifecycle webhook")]
    assert actions_of(role_statements(any_cfn, role_id)) == {
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "secretsmanager:GetSecretValue",
        "sqs:SendMessage",
    }


# ----------------------------------------------------------------------------- wiring
def test_functions_set_exactly_the_variables_the_code_reads(any_cfn, any_pool_cfn):
    wanted = settings_vars()
    for cfn, binary, kind in [
        (cfn, binary, kind)
        for cfn in (any_cfn, any_pool_cfn)
        for binary, kind in (("webhook", "webhook"), ("worker", "controller"), ("sweeper", "controller"))
    ]:
        variables = set(function_by_binary(cfn, binary)["Environment"]["Variables"])
        known = wanted[kind]["required"] | wanted[kind]["optional"]
        assert variables <= known, f"{binary}: not read by the code: {sorted(variables - known)}"
        missing = wanted[kind]["required"] - variables
        assert not missing, f"{binary}: required by the code but unset: {sorted(missing)}"


def test_settings_parser_sees_the_known_variables():
    wanted = settings_vars()
    assert wanted["webhook"]["required"] == {"EVENTS_QUEUE_URL", "WEBHOOK_SECRET_ARN"}
    assert {"TABLE_NAME", "DEPLOYMENT_ID", "SUBNETS"} <= wanted["controller"]["required"]
    # Required only where sessions are read (the worker; ControllerSettings::
    # api_key_secret); the sweeper is given none (test_only_the_worker_holds_the_agents_api_key).
    assert "OPENAI_API_KEY_SECRET_ARN" in wanted["controller"]["optional"]
    assert {"AGENT_IDS", "WORKSPACE_DIRECTORY", "SHUTDOWN_GRACE_SECS"} <= wanted["controller"]["optional"]
    # The cost and safety ceilings, and the webhook's rotation and tolerance.
    assert {
        "MAX_LIFETIME_SECS",
        "LIFETIME_HARD_CAP_SECS",
        "NO_WORK_SECS",
        "MAX_REPLACEMENTS",
        "REPLACEMENT_WINDOW_SECS",
        "REMOTE_URL_ALLOWLIST",
        "MAX_EXECUTORS",
    } <= wanted["controller"]["optional"]
    assert {"WEBHOOK_PREVIOUS_SECRET_ARN", "WEBHOOK_TOLERANCE_SECS"} <= wanted["webhook"]["optional"]


def test_ceiling_parameters_reach_both_controller_functions_in_sam_and_cdk(sam_cfn, cdk_cfn):
    ceilings = {
        "MAX_LIFETIME_SECS": "MaxLifetimeSecs",
        "LIFETIME_HARD_CAP_SECS": "LifetimeHardCapSecs",
        "NO_WORK_SECS": "NoWorkSecs",
        "MAX_REPLACEMENTS": "MaxReplacements",
        "REPLACEMENT_WINDOW_SECS": "ReplacementWindowSecs",
        "REMOTE_URL_ALLOWLIST": "RemoteUrlAllowlist",
        "MAX_EXECUTORS": "MaxExecutors",
    }
    defaults = {
        "MAX_LIFETIME_SECS": "28800",
        "LIFETIME_HARD_CAP_SECS": "32400",
        "NO_WORK_SECS": "3600",
        "MAX_REPLACEMENTS": "3",
        "REPLACEMENT_WINDOW_SECS": "3600",
        "REMOTE_URL_ALLOWLIST": "api.openai.com",
        "MAX_EXECUTORS": "0",
    }
    for binary in ("worker", "sweeper"):
        sam = function_by_binary(sam_cfn, binary)["Environment"]["Variables"]
        cdk = function_by_binary(cdk_cfn, binary)["Environment"]["Variables"]
        for var, parameter in ceilings.items():
            assert sam[var] == {"Ref": parameter}, (binary, var)
            assert str(sam_cfn["Parameters"][parameter]["Default"]) == defaults[var], parameter
            assert cdk[var] == defaults[var], (binary, var)
    for cfn in (sam_cfn, cdk_cfn):
        webhook = function_by_binary(cfn, "webhook")["Environment"]["Variables"]
        assert "WEBHOOK_TOLERANCE_SECS" in webhook


def test_ownership_and_provisioning_settings_reach_the_functions_in_sam_and_cdk(sam_cfn, cdk_cfn):
    """`OWNER_METADATA` goes wherever `AGENT_IDS` goes (worker, sweeper), and
    `PROVISION_ON` to them and to the webhook (whose intake keeps `agent.session.created`
    only when it is `created`); SAM through parameters, CDK with the code's defaults."""
    wanted = settings_vars()
    assert {"OWNER_METADATA", "PROVISION_ON"} <= wanted["controller"]["optional"]
    assert "PROVISION_ON" in wanted["webhook"]["optional"]
    assert sam_cfn["Parameters"]["OwnerMetadata"]["Default"] == ""
    assert sam_cfn["Parameters"]["ProvisionOn"]["Default"] == "connection_request"
    assert set(sam_cfn["Parameters"]["ProvisionOn"]["AllowedValues"]) == {"connection_request", "created"}
    for binary in ("worker", "sweeper"):
        sam = function_by_binary(sam_cfn, binary)["Environment"]["Variables"]
        cdk = function_by_binary(cdk_cfn, binary)["Environment"]["Variables"]
        assert sam["AGENT_IDS"] == {"Ref": "AgentIds"}
        assert sam["OWNER_METADATA"] == {"Ref": "OwnerMetadata"}, binary
        assert sam["PROVISION_ON"] == {"Ref": "ProvisionOn"}, binary
        assert cdk["OWNER_METADATA"] == "", binary
        assert cdk["PROVISION_ON"] == "connection_request", binary
    assert function_by_binary(sam_cfn, "webhook")["Environment"]["Variables"]["PROVISION_ON"] == {"Ref": "ProvisionOn"}
    assert function_by_binary(cdk_cfn, "webhook")["Environment"]["Variables"]["PROVISION_ON"] == "connection_request"
    pattern = re.compile(sam_cfn["Parameters"]["OwnerMetadata"]["AllowedPattern"])
    for ok in ("", "owner=team-a", "owner=team-a,tier=gold", "k="):
        assert pattern.fullmatch(ok), ok
    for bad in ("owner", "=x", "a=1,", ",a=1", "a=1,,b=2"):
        assert not pattern.fullmatch(bad), bad


def test_every_sam_parameter_is_used(sam_cfn_raw):
    sam_cfn = sam_cfn_raw
    body = flat(sam_cfn["Resources"]) + flat(sam_cfn.get("Outputs", {})) + flat(sam_cfn.get("Conditions", {}))
    for name in sam_cfn["Parameters"]:
        assert f'"Ref": "{name}"' in body or "${" + name + "}" in body, f"parameter {name} is unused"


def test_failed_starts_come_from_the_metric_not_a_log_filter(any_cfn):
    # The controller counts every failed start (RunTask `failures` and TaskFailedToStart)
    # in `start_failures`; a log filter on a message text drifts silently.
    assert resources(any_cfn, "AWS::Logs::MetricFilter") == {}


def test_consumed_queues_outlast_six_worker_timeouts(any_cfn):
    worker = function_by_binary(any_cfn, "worker")
    mappings = resources(any_cfn, "AWS::Lambda::EventSourceMapping").values()
    queues = any_cfn["Resources"]
    assert len(mappings) == 3
    for m in mappings:
        props = m["Properties"]
        assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        queue = queues[ref_target(props["EventSourceArn"])]["Properties"]
        assert queue["VisibilityTimeout"] >= 6 * worker["Timeout"]
        assert queue["RedrivePolicy"]["maxReceiveCount"] == 5


def executor_task_definition(cfn: dict, single: bool = False) -> dict:
    """The task definition's properties; SAM's split/single conditions resolved."""
    (task_def,) = resources(cfn, "AWS::ECS::TaskDefinition").values()
    return resolve_conditions(task_def["Properties"], {"SingleContainerExecutor": single})


def test_executor_gets_only_the_key_from_secrets(any_cfn):
    containers = {c["Name"]: c for c in executor_task_definition(any_cfn)["ContainerDefinitions"]}
    assert [s["Name"] for s in containers["forwarder"]["Secrets"]] == ["CODEX_API_KEY"]
    for container in containers.values():
        assert "Environment" not in container, "REMOTE_URL / ENVIRONMENT_ID come from RunTask overrides"
        assert container["LogConfiguration"]["LogDriver"] == "awslogs"
    assert containers["executor"]["WorkingDirectory"] == "/workspace"


def test_the_executor_container_holds_no_credential(any_cfn):
    """In the default (split) mode the agent's container holds no credential.

    - two containers, `executor` and `forwarder`, both essential, same image;
    - the executor container: no `Secrets`, no `Environment`, no `EnvironmentFiles`, it runs
      the entrypoint's `executor` role listening on a loopback WebSocket, and depends on the
      forwarder having started;
    - the forwarder: the key as its only secret (`valueFrom` the executor key secret, read
      by the execution role at launch), connects to the same loopback URL, no mount points;
    - no `PidMode` (containers do not see each other's /proc), no `IpcMode`, no volume
      mounted by the forwarder (nothing shared on disk), no `LinuxParameters` capabilities
      added; the task role has no policy (it cannot read the secret; ECS Exec would need
      ssmmessages on it) and only the execution role may read the key secret;
    - the controller's overrides go to the forwarder (`CONTAINER_NAME`), and
      `EXECUTOR_MODE` is `split`.
    """
    props = executor_task_definition(any_cfn)
    containers = {c["Name"]: c for c in props["ContainerDefinitions"]}
    assert set(containers) == {"executor", "forwarder"}
    executor, forwarder = containers["executor"], containers["forwarder"]
    for container in (executor, forwarder):
        assert container["Essential"] is True
        assert "LinuxParameters" not in container and "Privileged" not in container
    assert flat(executor["Image"]) == flat(forwarder["Image"])
    for key in ("Secrets", "Environment", "EnvironmentFiles", "RepositoryCredentials"):
        assert key not in executor, f"the executor container must not have {key}"
    assert executor["Command"][0] == "executor"
    listen = executor["Command"][1]
    assert re.fullmatch(r"ws://127\.0\.0\.1:[0-9]+", listen)
    assert executor["DependsOn"] == [{"ContainerName": "forwarder", "Condition": "START"}]
    assert forwarder["Command"] == ["forwarder", listen]
    assert [s["Name"] for s in forwarder["Secrets"]] == ["CODEX_API_KEY"]
    assert "MountPoints" not in forwarder and "VolumesFrom" not in forwarder
    assert "VolumesFrom" not in executor
    for key in ("PidMode", "IpcMode"):
        assert key not in props, f"the task must not set {key}"
    # Roles: no task role (nothing in the containers holds an AWS credential); the key
    # secret is readable by the execution role only.
    roles = roles_by_purpose(any_cfn)
    assert "executor task role" not in roles
    (read_key,) = statements_with(any_cfn, roles["executor execution role"], "secretsmanager:GetSecretValue")
    assert as_list(read_key["Resource"]) == [forwarder["Secrets"][0]["ValueFrom"]]
    for binary in ("worker", "sweeper"):
        variables = function_by_binary(any_cfn, binary)["Environment"]["Variables"]
        assert resolve_conditions(variables["CONTAINER_NAME"], {"SingleContainerExecutor": False}) == "forwarder"
        mode = variables["EXECUTOR_MODE"]
        assert mode == "split" or (mode == {"Ref": "ExecutorMode"} and any_cfn["Parameters"]["ExecutorMode"]["Default"] == "split")


def test_the_single_container_fallback_is_marked_as_holding_the_key(sam_cfn):
    """ExecutorMode single (codex without `forward`): one container, the key in it."""
    assert sam_cfn["Parameters"]["ExecutorMode"]["AllowedValues"] == ["split", "single"]
    props = executor_task_definition(sam_cfn, single=True)
    (container,) = props["ContainerDefinitions"]
    assert container["Name"] == "executor" and container["Command"] == ["single"]
    assert [s["Name"] for s in container["Secrets"]] == ["CODEX_API_KEY"]
    assert "DependsOn" not in container
    worker = function_by_binary(sam_cfn, "worker")["Environment"]["Variables"]
    assert resolve_conditions(worker["CONTAINER_NAME"], {"SingleContainerExecutor": True}) == "executor"
    assert "holds the key" in sam_cfn["Parameters"]["ExecutorMode"]["Description"]


def test_registry_table_matches_the_adapter_schema(any_cfn):
    (table,) = resources(any_cfn, "AWS::DynamoDB::Table").values()
    props = table["Properties"]
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    assert props["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert props["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    assert {(k["AttributeName"], k["KeyType"]) for k in props["KeySchema"]} == {("pk", "HASH"), ("sk", "RANGE")}
    gsis = {g["IndexName"]: g for g in props["GlobalSecondaryIndexes"]}
    assert set(gsis) == {"by_session", "by_open"}
    assert gsis["by_session"]["KeySchema"] == [{"AttributeName": "session_id", "KeyType": "HASH"}]
    assert gsis["by_session"]["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    # The sweep's read, the sparse index of records that are not closed.
    assert gsis["by_open"]["KeySchema"] == [
        {"AttributeName": "open_shard", "KeyType": "HASH"},
        {"AttributeName": "pk", "KeyType": "RANGE"},
    ]
    assert gsis["by_open"]["Projection"] == {"ProjectionType": "ALL"}
    attributes = {(a["AttributeName"], a["AttributeType"]) for a in props["AttributeDefinitions"]}
    assert attributes == {("pk", "S"), ("sk", "S"), ("session_id", "S"), ("open_shard", "S")}


def test_the_sweeper_runs_one_at_a_time_without_retries(any_cfn):
    """The sweeper: reserved concurrency 1; no Lambda async retries and a short event
    age (an event throttled behind a running sweep is dropped, not queued for hours); the
    schedule's target without EventBridge retries."""
    (fn_id,) = [
        k
        for k, f in resources(any_cfn, "AWS::Lambda::Function").items()
        if f["Properties"]["Description"].startswith("sandbox-lifecycle sweeper ")
    ]
    assert any_cfn["Resources"][fn_id]["Properties"]["ReservedConcurrentExecutions"] == 1
    configs = [
        c["Properties"]
        for c in resources(any_cfn, "AWS::Lambda::EventInvokeConfig").values()
        if ref_target(c["Properties"]["FunctionName"]) == fn_id
    ]
    assert len(configs) == 1, configs
    assert configs[0]["MaximumRetryAttempts"] == 0
    assert configs[0]["MaximumEventAgeInSeconds"] == 60
    targets = [
        t
        for rule in resources(any_cfn, "AWS::Events::Rule").values()
        for t in rule["Properties"].get("Targets", [])
        if ref_target(t["Arn"]) == fn_id
    ]
    assert len(targets) == 1, targets
    assert targets[0]["RetryPolicy"]["MaximumRetryAttempts"] == 0


def test_history_retention_reaches_both_controller_functions(sam_cfn, cdk_cfn):
    for binary in ("worker", "sweeper"):
        assert function_by_binary(sam_cfn, binary)["Environment"]["Variables"]["HISTORY_RETENTION_DAYS"] == {
            "Ref": "HistoryRetentionDays"
        }
        assert function_by_binary(cdk_cfn, binary)["Environment"]["Variables"]["HISTORY_RETENTION_DAYS"] == "30"
    assert str(sam_cfn["Parameters"]["HistoryRetentionDays"]["Default"]) == "30"
    assert "HISTORY_RETENTION_DAYS" in settings_vars()["controller"]["optional"]


# ----------------------------------------------------------------------------- alarms, dashboard
def emitted_metric_names() -> set[str]:
    """The metric names the controller records (the `names` module of metrics.rs)."""
    return set(re.findall(r'pub const [A-Z_]+: &str = "([a-z_]+)";', METRICS_RS.read_text()))


def alarm_signatures(cfn: dict) -> Counter:
    """Each alarm as (namespace, metric, dimensions, statistic, period, evaluation periods,
    datapoints to alarm, threshold, operator). A dimension whose value is an intrinsic (a
    queue name, a function name, the deployment id) counts by name only."""
    out = Counter()
    for alarm in resources(cfn, "AWS::CloudWatch::Alarm").values():
        p = alarm["Properties"]
        dims = tuple(
            sorted(
                (d["Name"], d["Value"] if isinstance(d["Value"], str) and d["Name"] != "deployment" else "<ref>")
                for d in p.get("Dimensions", [])
            )
        )
        # The log metric filter's namespace names the stack (an intrinsic in SAM).
        namespace = p["Namespace"]
        if not isinstance(namespace, str) or namespace.startswith("sandbox-lifecycle/"):
            namespace = "<stack>"
        evaluation = int(p["EvaluationPeriods"])
        out[
            (
                namespace,
                p["MetricName"],
                dims,
                p["Statistic"],
                int(p["Period"]),
                evaluation,
                int(p.get("DatapointsToAlarm", evaluation)),
                float(p["Threshold"]),
                p["ComparisonOperator"],
            )
        ] += 1
    return out


@pytest.mark.parametrize("pool", [False, True], ids=["pool-off", "pool-on"])
def test_sam_and_cdk_define_the_same_alarms(request, pool):
    sam_cfn, cdk_cfn = both(request, False, pool)
    sam, cdk = alarm_signatures(sam_cfn), alarm_signatures(cdk_cfn)
    assert sam == cdk, f"only SAM {sorted((sam - cdk).elements())}, only CDK {sorted((cdk - sam).elements())}"


def test_alarms_cover_the_lifecycle_and_name_only_emitted_metrics(any_cfn):
    alarms = alarm_signatures(any_cfn)
    emf = {
        (metric, dict(dims).get("outcome") or dict(dims).get("reason"), evaluation)
        for (ns, metric, dims, _, _, evaluation, *_) in alarms
        if ns == "SandboxLifecycle"
    }
    assert emf == {
        ("decisions", "divergent", 1),
        ("decisions", "reconcile", 3),  # held 15 minutes: three 5-minute periods
        ("decisions", "uncertain", 3),
        ("orphans_released", None, 1),
        ("stuck_jobs", None, 1),
        ("start_failures", None, 1),
        ("executor_never_connected", None, 1),
        # The ceilings that need an owner at once.
        ("ceilings", "remote_url_not_allowed", 1),
        ("ceilings", "replacement_cap", 1),
    }
    assert {m for m, _, _ in emf} <= emitted_metric_names()
    for ns, _, dims, *_ in alarms:
        if ns == "SandboxLifecycle":
            assert ("deployment", "<ref>") in dims, "every EMF alarm is scoped to this deployment"
            assert {name for name, _ in dims} <= {"deployment", "outcome", "reason"}, "never an id as a dimension"
    others = {(ns, metric) for (ns, metric, *_) in alarms if ns != "SandboxLifecycle"}
    assert others == {
        ("AWS/SQS", "ApproximateNumberOfMessagesVisible"),
        ("AWS/Lambda", "Errors"),
    }


def test_one_dashboard_shows_the_lifecycle_at_a_glance(any_cfn):
    (dashboard,) = resources(any_cfn, "AWS::CloudWatch::Dashboard").values()
    body = flat(dashboard["Properties"]["DashboardBody"])
    shown = {m for m in emitted_metric_names() if re.search(r'\\*"' + m + r'\\*"', body)}
    assert shown == emitted_metric_names(), f"not on the dashboard: {sorted(emitted_metric_names() - shown)}"
    for title in ("Decisions by outcome", "Dead letters", "Function errors", "Sweeps", "Webhook deliveries"):
        assert title in body, title


def test_make_deploy_passes_every_parameter_and_context_key(sam_cfn):
    """`make deploy-sam` / `make deploy-cdk` map a variable to every SAM parameter and every
    CDK context key the app reads (docs/DEPLOYING.md, "Deploy on AWS"), so no setting needs a hand-written
    override."""
    mk = (REPO / "mk" / "infra.mk").read_text()
    sam_block = mk[mk.index("SAM_PARAMETERS =") : mk.index("deploy-sam:")]
    for name in sam_cfn["Parameters"]:
        assert f"{name}=" in sam_block or f"sam-param,{name}," in sam_block, f"make deploy-sam cannot set {name}"
    app = (REPO / "infra" / "cdk" / "bin" / "app.ts").read_text()
    keys = set(re.findall(r'\b(?:context|integer|list|required|metadataPairs)\("([A-Za-z]+)"\)', app)) - {"placeholderCode"}
    cdk_block = mk[mk.index("CDK_CONTEXT =") : mk.index("cdk-bootstrap:")]
    for key in keys:
        assert f"'{key}=" in cdk_block or f"cdk-context,{key}," in cdk_block or f"-c {key}=" in cdk_block, (
            f"make deploy-cdk cannot set {key}"
        )


# ----------------------------------------------------------------------------- the warm pool
# docs/WARM_POOL.md: PoolSize > 0 adds the pool table, the executor task role's one
# statement, the worker's and the sweeper's pool statements, the pool settings and the
# "pool runs dry" alarm; PoolSize 0 (the default) adds none of them.
POOL_VARIABLES = {"POOL_SIZE", "POOL_MAX_AGE_SECS", "POOL_TABLE_NAME", "POOL_TASK_ROLE_ID"}


def render(value) -> str:
    """A resource or condition value as one string: `Ref` as `${Name}`, `Fn::GetAtt` as
    `${Id.Attribute}`, `Fn::Sub` (without a variable map) as its text, `Fn::Join` joined.
    SAM writes `!Sub "${PoolTable.Arn}/index/*"` where CDK writes a `Fn::Join`; both render
    to `${<table id>.Arn}/index/*`."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        (key, arg), = value.items()
        if key == "Ref":
            return "${" + arg + "}"
        if key == "Fn::GetAtt":
            return "${" + (".".join(arg) if isinstance(arg, list) else arg) + "}"
        if key == "Fn::Sub" and isinstance(arg, str):
            return arg
        if key == "Fn::Join":
            sep, parts = arg
            return sep.join(render(p) for p in parts)
    raise AssertionError(f"cannot render {value!r}")


def pool_table(cfn: dict) -> str:
    """The pool table's logical id: the one table with the by_idle index."""
    (table_id,) = [
        k
        for k, t in resources(cfn, "AWS::DynamoDB::Table").items()
        if "by_idle" in {g["IndexName"] for g in t["Properties"].get("GlobalSecondaryIndexes", [])}
    ]
    return table_id


def role_of(cfn: dict, binary: str) -> str:
    (role_id,) = [r for p, r in roles_by_purpose(cfn).items() if p.startswith(f"sandbox-lifecycle {binary} ")]
    return role_id


def test_the_task_role_reads_only_its_own_pool_item(any_cfn, any_pool_cfn):
    """With the pool off the task role has no policy and there is no pool table. With it on,
    exactly one statement: dynamodb:GetItem on the pool table (not an index, not the
    registry), only for the leading key `${aws:userid}` (= `<role id>:<task id>`, the
    task's own member item), written literally as the IAM policy variable."""
    assert "executor task role" not in roles_by_purpose(any_cfn)
    assert len(resources(any_cfn, "AWS::DynamoDB::Table")) == 1, "only the registry without the pool"

    cfn = any_pool_cfn
    role_id = roles_by_purpose(cfn)["executor task role"]
    statement, deny_actions, deny_resources = role_statements(cfn, role_id)
    # The one grant, then explicit denies of everything else (an explicit deny wins over a
    # resource policy's allow: IAM User Guide, "Policy evaluation logic").
    assert deny_actions["Effect"] == "Deny" and as_list(deny_actions["NotAction"]) == ["dynamodb:GetItem"]
    assert as_list(deny_actions["Resource"]) == ["*"] and "Condition" not in deny_actions
    assert deny_resources["Effect"] == "Deny" and as_list(deny_resources["Action"]) == ["dynamodb:GetItem"]
    assert as_list(deny_resources["NotResource"]) == [{"Fn::GetAtt": [pool_table(cfn), "Arn"]}]
    assert "Condition" not in deny_resources
    assert set(statement) <= {"Sid", "Effect", "Action", "Resource", "Condition"}, statement
    assert statement["Effect"] == "Allow"
    assert as_list(statement["Action"]) == ["dynamodb:GetItem"]
    (resource,) = as_list(statement["Resource"])
    assert resource == {"Fn::GetAtt": [pool_table(cfn), "Arn"]}, resource
    assert statement["Condition"] == {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["${aws:userid}"]}}
    # Literally, as CloudFormation hands it to IAM: not inside an Fn::Sub (which would
    # substitute it) and not escaped.
    role_json = json.dumps(cfn["Resources"][role_id])
    assert '"dynamodb:LeadingKeys": ["${aws:userid}"]' in role_json
    assert "Fn::Sub" not in json.dumps(statement["Condition"])
    assert not role_json.count("${!")
    assert not cfn["Resources"][role_id]["Properties"].get("ManagedPolicyArns")


def test_the_task_role_trusts_only_ecs_tasks_of_this_account(any_cfn, any_pool_cfn):
    """The confused-deputy guard (ECS Developer Guide, "Amazon ECS task IAM role"):
    ecs-tasks.amazonaws.com only, aws:SourceAccount = this account, aws:SourceArn like
    arn:PARTITION:ecs:REGION:ACCOUNT:*. Nothing else may assume it (not the role itself)."""
    for cfn in (any_pool_cfn,):
        role_id = roles_by_purpose(cfn)["executor task role"]
        document = cfn["Resources"][role_id]["Properties"]["AssumeRolePolicyDocument"]
        (statement,) = document["Statement"]
        assert statement["Effect"] == "Allow"
        assert statement["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}
        assert as_list(statement["Action"]) == ["sts:AssumeRole"]
        condition = statement["Condition"]
        assert set(condition) == {"ArnLike", "StringEquals"}, condition
        assert set(condition["StringEquals"]) == {"aws:SourceAccount"}
        assert set(condition["ArnLike"]) == {"aws:SourceArn"}
        account = render(condition["StringEquals"]["aws:SourceAccount"])
        assert account in ("${AWS::AccountId}", "123456789012"), account
        source = render(condition["ArnLike"]["aws:SourceArn"])
        region = "${AWS::Region}" if account == "${AWS::AccountId}" else "us-east-1"
        assert source == f"arn:${{AWS::Partition}}:ecs:{region}:{account}:*", source


def test_the_pool_table_matches_the_adapter_schema(any_pool_cfn):
    """docs/WARM_POOL.md "The pool table": on demand, key pk (S) only, sparse GSIs by_idle
    (idle_deployment S / created_at N), by_pool (pool_deployment S / created_at N) and
    by_environment (claimed_environment S), all projecting ALL, TTL on expires_at; encrypted and recoverable like the registry."""
    cfn = any_pool_cfn
    tables = resources(cfn, "AWS::DynamoDB::Table")
    assert len(tables) == 2
    table_id = pool_table(cfn)
    props = tables[table_id]["Properties"]
    (registry,) = [t["Properties"] for k, t in tables.items() if k != table_id]
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    assert props["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
    attributes = {(a["AttributeName"], a["AttributeType"]) for a in props["AttributeDefinitions"]}
    assert attributes == {
        ("pk", "S"),
        ("idle_deployment", "S"),
        ("created_at", "N"),
        ("claimed_environment", "S"),
        ("pool_deployment", "S"),
    }
    gsis = {g["IndexName"]: g for g in props["GlobalSecondaryIndexes"]}
    assert set(gsis) == {"by_idle", "by_pool", "by_environment"}
    assert gsis["by_idle"]["KeySchema"] == [
        {"AttributeName": "idle_deployment", "KeyType": "HASH"},
        {"AttributeName": "created_at", "KeyType": "RANGE"},
    ]
    assert gsis["by_pool"]["KeySchema"] == [
        {"AttributeName": "pool_deployment", "KeyType": "HASH"},
        {"AttributeName": "created_at", "KeyType": "RANGE"},
    ]
    assert gsis["by_environment"]["KeySchema"] == [{"AttributeName": "claimed_environment", "KeyType": "HASH"}]
    for gsi in gsis.values():
        assert gsi["Projection"] == {"ProjectionType": "ALL"}
        assert "ProvisionedThroughput" not in gsi
    assert props["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert props["PointInTimeRecoverySpecification"] == registry["PointInTimeRecoverySpecification"]
    assert props["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    assert props["SSESpecification"] == registry["SSESpecification"]
    assert props["SSESpecification"]["SSEEnabled"] is True
    assert "StreamSpecification" not in props


def test_pool_settings_reach_the_worker_and_the_sweeper_only(sam_cfn, cdk_cfn, sam_pool_cfn, cdk_pool_cfn):
    """POOL_SIZE and POOL_MAX_AGE_SECS always (worker, sweeper); POOL_TABLE_NAME (the pool
    table) and POOL_TASK_ROLE_ID (the task role's unique id, the first half of every member
    key) only with the pool on; the webhook gets none."""
    for cfn, on in ((sam_cfn, False), (cdk_cfn, False), (sam_pool_cfn, True), (cdk_pool_cfn, True)):
        webhook = function_by_binary(cfn, "webhook")["Environment"]["Variables"]
        assert not POOL_VARIABLES & set(webhook)
        task_role = roles_by_purpose(cfn).get("executor task role")
        assert (task_role is not None) == on
        for binary in ("worker", "sweeper"):
            variables = function_by_binary(cfn, binary)["Environment"]["Variables"]
            present = POOL_VARIABLES & set(variables)
            if on:
                assert present == POOL_VARIABLES, binary
                assert variables["POOL_TABLE_NAME"] == {"Ref": pool_table(cfn)}, binary
                assert variables["POOL_TASK_ROLE_ID"] == {"Fn::GetAtt": [task_role, "RoleId"]}, binary
            else:
                assert present == {"POOL_SIZE", "POOL_MAX_AGE_SECS"}, binary
    for cfn in (sam_cfn, sam_pool_cfn):
        for binary in ("worker", "sweeper"):
            variables = function_by_binary(cfn, binary)["Environment"]["Variables"]
            assert variables["POOL_SIZE"] == {"Ref": "PoolSize"}
            assert variables["POOL_MAX_AGE_SECS"] == {"Ref": "PoolMaxAgeSecs"}
    parameters = sam_cfn["Parameters"]
    assert (str(parameters["PoolSize"]["Default"]), str(parameters["PoolSize"]["MinValue"])) == ("0", "0")
    assert (str(parameters["PoolMaxAgeSecs"]["Default"]), str(parameters["PoolMaxAgeSecs"]["MinValue"])) == ("3600", "60")
    assert sam_cfn["Conditions"]["PoolEnabled"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "PoolSize"}, 0]}]}
    for binary in ("worker", "sweeper"):
        off = function_by_binary(cdk_cfn, binary)["Environment"]["Variables"]
        assert (off["POOL_SIZE"], off["POOL_MAX_AGE_SECS"]) == ("0", "3600")
        on = function_by_binary(cdk_pool_cfn, binary)["Environment"]["Variables"]
        assert (on["POOL_SIZE"], on["POOL_MAX_AGE_SECS"]) == ("2", "3600")  # mk/infra.mk: -c poolSize=2


def test_pool_variables_are_read_by_the_settings():
    """The wiring contract with crates/aws/src/settings/ (docs/WARM_POOL.md, "Settings")."""
    assert POOL_VARIABLES <= settings_vars()["controller"]["optional"] | settings_vars()["controller"]["required"]


def test_pool_statements_are_scoped_to_the_pool_table(any_pool_cfn):
    """The worker: the pool table's item and query actions on the table and its indexes
    only, and TagResource outside RunTask only on a pool member with the assignment's tag
    keys. The sweeper: Query on by_environment and BatchGetItem on the table, nothing else
    of the pool. No other role names the pool table."""
    cfn = any_pool_cfn
    table = pool_table(cfn)
    table_arn = "${" + table + ".Arn}"

    def pool_statements(role_id: str) -> list[dict]:
        return [s for s in role_statements(cfn, role_id) if table in flat(s["Resource"])]

    worker = role_of(cfn, "worker")
    (statement,) = pool_statements(worker)
    assert set(as_list(statement["Action"])) == {
        "dynamodb:GetItem",
        "dynamodb:Query",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
        "dynamodb:BatchGetItem",
    }
    assert sorted(render(r) for r in as_list(statement["Resource"])) == sorted([table_arn, table_arn + "/index/*"])
    assert "Condition" not in statement

    sweeper = role_of(cfn, "sweeper")
    granted = {(a, render(r)) for s in pool_statements(sweeper) for a in as_list(s["Action"]) for r in as_list(s["Resource"])}
    assert granted == {
        ("dynamodb:Query", table_arn + "/index/by_environment"),
        ("dynamodb:BatchGetItem", table_arn),
    }

    # The registry statements never name the pool table, and nothing else does.
    for purpose, role_id in roles_by_purpose(cfn).items():
        if role_id not in (worker, sweeper, roles_by_purpose(cfn).get("executor task role")):
            assert not pool_statements(role_id), purpose
    for role_id in (worker, sweeper):
        for s in role_statements(cfn, role_id):
            if "Registry" == s.get("Sid"):
                assert table not in flat(s["Resource"])

    (cluster_id,) = resources(cfn, "AWS::ECS::Cluster")
    tags = statements_with(cfn, worker, "ecs:TagResource")
    on_run = [s for s in tags if s.get("Condition") == {"StringEquals": {"ecs:CreateAction": "RunTask"}}]
    claimed = [s for s in tags if s not in on_run]
    assert len(on_run) == 1 and len(claimed) == 1, tags
    (claim,) = claimed
    assert as_list(claim["Action"]) == ["ecs:TagResource"]
    (resource,) = as_list(claim["Resource"])
    assert ":task/" in flat(resource) and cluster_id in flat(resource)
    assert claim["Condition"] == {
        "StringEquals": {"aws:ResourceTag/sandbox:pool": "member"},
        "ForAllValues:StringEquals": {"aws:TagKeys": ["sandbox:environment", "sandbox:session", "sandbox:generation"]},
    }


def test_pool_runs_dry_alarm_only_with_the_pool(any_cfn, any_pool_cfn):
    """pool_misses Sum >= 1 in 2 of 3 periods of 300 s, scoped to the deployment, with the
    alarm actions of the other EMF alarms; no such alarm with the pool off."""

    def pool_alarms(cfn):
        return [a["Properties"] for a in resources(cfn, "AWS::CloudWatch::Alarm").values() if a["Properties"]["MetricName"] == "pool_misses"]

    assert pool_alarms(any_cfn) == []
    (alarm,) = pool_alarms(any_pool_cfn)
    assert "pool_misses" in emitted_metric_names()
    assert alarm["Namespace"] == "SandboxLifecycle"
    assert [d["Name"] for d in alarm["Dimensions"]] == ["deployment"]
    (failed_starts,) = [
        a["Properties"]
        for a in resources(any_pool_cfn, "AWS::CloudWatch::Alarm").values()
        if a["Properties"]["MetricName"] == "start_failures"
    ]
    assert alarm["Dimensions"] == failed_starts["Dimensions"]
    assert alarm.get("AlarmActions") == failed_starts.get("AlarmActions")
    assert (alarm["Statistic"], int(alarm["Period"]), int(alarm["EvaluationPeriods"]), int(alarm["DatapointsToAlarm"])) == ("Sum", 300, 3, 2)
    assert (float(alarm["Threshold"]), alarm["ComparisonOperator"]) == (1.0, "GreaterThanOrEqualToThreshold")
    assert alarm["TreatMissingData"] == "notBreaching"


def evaluate_rule_function(value, parameters: dict[str, str]):
    """A CloudFormation rule function (the subset the template uses) for given parameters."""
    if isinstance(value, (str, int)):
        return str(value)
    (key, arg), = value.items()
    if key == "Ref":
        return parameters[arg]
    if key == "Fn::Equals":
        a, b = (evaluate_rule_function(x, parameters) for x in arg)
        return a == b
    if key == "Fn::Not":
        (inner,) = arg
        return not evaluate_rule_function(inner, parameters)
    raise AssertionError(f"unexpected rule function {key}")


def test_the_pool_needs_the_split_executor(sam_cfn_raw):
    """In single mode the executor holds the key from its first instant: a rule refuses
    PoolSize > 0 with it before anything is created (CDK refuses it at synth:
    infra/cdk/test). The rule's test is the PoolEnabled condition's (rules cannot name
    conditions)."""
    rules = sam_cfn_raw["Rules"]
    (rule,) = [r for r in rules.values() if "PoolSize" in flat(r)]
    assert rule["RuleCondition"] == sam_cfn_raw["Conditions"]["PoolEnabled"]

    def refused(pool_size: str, mode: str, gib: str = "0") -> bool:
        parameters = {"PoolSize": pool_size, "ExecutorMode": mode, "WorkspaceVolumeGiB": gib}
        if not evaluate_rule_function(rule["RuleCondition"], parameters):
            return False
        return not all(evaluate_rule_function(a["Assert"], parameters) for a in rule["Assertions"])

    assert refused("1", "single") and refused("10", "single")
    assert not refused("1", "split") and not refused("0", "single") and not refused("0", "split")
    # A member starts without the environment's workspace volume: refused with workspaces.
    assert refused("1", "split", "20") and not refused("0", "split", "20")
    descriptions = " ".join(a["AssertDescription"] for a in rule["Assertions"])
    assert "split" in descriptions and "WorkspaceVolumeGiB" in descriptions


def test_the_pool_is_refilled_by_a_schedule_that_invokes_the_worker(any_cfn, any_pool_cfn):
    """With the pool on, one EventBridge rule invokes the worker every minute with
    {"pool_refill": {}} (crates/lambda/src/worker_handler.rs WorkerEvent), no retries, and
    a permission lets only that rule invoke it; the sweeper is never the target (it holds
    no RunTask). With the pool off there is no such rule."""
    def refill_rules(cfn):
        out = []
        for rid, res in cfn["Resources"].items():
            if res["Type"] != "AWS::Events::Rule":
                continue
            for target in res["Properties"].get("Targets", []):
                if "pool_refill" in json.dumps(target.get("Input", "")):
                    out.append((rid, res, target))
        return out

    assert refill_rules(any_cfn) == []
    (rid, rule, target), = refill_rules(any_pool_cfn)
    assert rule["Properties"]["ScheduleExpression"] in ("rate(1 minute)", "rate(1 minutes)")
    assert json.loads(target["Input"]) == {"pool_refill": {}}
    assert target["RetryPolicy"]["MaximumRetryAttempts"] == 0
    worker = [r for r, res in any_pool_cfn["Resources"].items()
              if res["Type"] == "AWS::Lambda::Function" and "worker" in flat(res["Properties"].get("Description", "")).lower()
              or r.startswith("WorkerFunction")]
    assert any(w in flat(target["Arn"]) for w in worker), target["Arn"]
    permissions = [res for res in any_pool_cfn["Resources"].values()
                   if res["Type"] == "AWS::Lambda::Permission" and rid in flat(res["Properties"].get("SourceArn", ""))]
    assert len(permissions) == 1
    assert permissions[0]["Properties"]["Principal"] == "events.amazonaws.com"


# ----------------------------------------------------------------------------- who may send (docs/SECURITY.md)
def test_only_the_roles_that_send_may_send_to_the_queues(any_cfn):
    """Each queue's policy denies sqs:SendMessage to every principal but the roles whose own
    policies send to it (webhook: events; worker: timers; worker and sweeper: sweep) and, when given,
    QueueSenderArns / queueSenderArns: the set in the deny's ArnNotLike is computed from the
    role statements, so a new sender without a queue-policy entry (or the reverse) fails."""
    queues = {k for k in resources(any_cfn, "AWS::SQS::Queue") if "RedrivePolicy" in any_cfn["Resources"][k]["Properties"]}
    assert len(queues) == 3, queues
    policies = resources(any_cfn, "AWS::SQS::QueuePolicy")
    assert len(policies) == 3
    for queue in queues:
        senders = {
            role_id
            for role_id in resources(any_cfn, "AWS::IAM::Role")
            for s in role_statements(any_cfn, role_id)
            if s["Effect"] == "Allow"
            and "sqs:SendMessage" in as_list(s["Action"])
            and queue in {ref_target(r) for r in as_list(s["Resource"])}
        }
        assert senders, queue
        (policy,) = [p for p in policies.values() if [ref_target(q) for q in p["Properties"]["Queues"]] == [queue]]
        document = resolve_conditions(policy["Properties"]["PolicyDocument"], {"HasQueueSenders": False})
        (statement,) = as_list(document["Statement"])
        assert statement["Effect"] == "Deny"
        assert statement["Principal"] in ("*", {"AWS": "*"})
        assert as_list(statement["Action"]) == ["sqs:SendMessage"]
        assert [ref_target(r) for r in as_list(statement["Resource"])] == [queue]
        (key,) = statement["Condition"]["ArnNotLike"]
        assert key == "aws:PrincipalArn"
        allowed = {ref_target(a) for a in as_list(statement["Condition"]["ArnNotLike"][key])}
        assert allowed == senders, (queue, allowed, senders)


def test_queue_sender_arns_join_the_function_roles_in_sam(sam_cfn):
    """With QueueSenderArns given, SAM's deny lists the function roles and then the given
    principals (one Fn::Split of the joined list); without, the roles alone."""
    for policy in resources(sam_cfn, "AWS::SQS::QueuePolicy").values():
        (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
        arns = statement["Condition"]["ArnNotLike"]["aws:PrincipalArn"]
        cond, given, absent = arns["Fn::If"]
        assert cond == "HasQueueSenders"
        joined = given["Fn::Split"][1]["Fn::Join"][1]
        assert joined[:-1] == absent
        assert joined[-1] == {"Fn::Join": [",", {"Ref": "QueueSenderArns"}]}


def test_no_template_sets_a_test_only_variable(any_cfn, any_pool_cfn):
    """SANDBOX_TEST_ONLY_LOOPBACK_HTTP (the entrypoint's and the waiter's escape for tests
    that record a registration on http://127.0.0.1) appears in no deployed template."""
    for cfn in (any_cfn, any_pool_cfn):
        assert "SANDBOX_TEST_ONLY" not in json.dumps(cfn)
