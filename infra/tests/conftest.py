"""Fixtures: the SAM template translated to CloudFormation, and the CDK stack as `cdk synth`
wrote it (mk/infra.mk synthesizes it before running pytest)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from translate_sam import translate

INFRA = Path(__file__).resolve().parent.parent
REPO = INFRA.parent
CDK_TEMPLATE = Path(
    os.environ.get("CDK_TEMPLATE", INFRA / "cdk" / "cdk.out" / "SandboxLifecycle.template.json")
)
# The same stack synthesized with workspaces on (workspaceVolumeGiB > 0; mk/infra.mk).
CDK_WORKSPACES_TEMPLATE = Path(
    os.environ.get(
        "CDK_WORKSPACES_TEMPLATE", INFRA / "cdk" / "cdk.out.workspaces" / "SandboxLifecycle.template.json"
    )
)
# The same stack with the warm pool on (poolSize > 0); workspaces are off (the
# templates refuse the pool with workspaces).
CDK_POOL_TEMPLATE = Path(
    os.environ.get("CDK_POOL_TEMPLATE", INFRA / "cdk" / "cdk.out.pool" / "SandboxLifecycle.template.json")
)


# ExecutorEgress open (the default): no DNS Firewall resources (docs/EGRESS.md).
EGRESS_OPEN = {"EgressAllowlist": False, "HasEgressExtraDomains": False}
# The same stack with ExecutorEgress allowlist and two extra domains (mk/infra.mk).
CDK_EGRESS_TEMPLATE = Path(
    os.environ.get("CDK_EGRESS_TEMPLATE", INFRA / "cdk" / "cdk.out.egress" / "SandboxLifecycle.template.json")
)


def resolve_conditions(value, conditions: dict[str, bool]):
    """`value` with every `Fn::If` on one of `conditions` replaced by its branch and
    `AWS::NoValue` results dropped (from lists and objects), as CloudFormation does at
    deploy time. An `Fn::If` on another condition is kept, its branches resolved (an
    `AWS::NoValue` branch stays: it is one of the three arguments)."""
    no_value = object()

    def walk(v):
        if isinstance(v, dict):
            if set(v) == {"Fn::If"}:
                cond, yes, no = v["Fn::If"]
                if cond in conditions:
                    return walk(yes if conditions[cond] else no)
                kept = [{"Ref": "AWS::NoValue"} if x is no_value else x for x in (walk(yes), walk(no))]
                return {"Fn::If": [cond, *kept]}
            if v == {"Ref": "AWS::NoValue"}:
                return no_value
            out = {k: walk(x) for k, x in v.items()}
            return {k: x for k, x in out.items() if x is not no_value}
        if isinstance(v, list):
            return [x for x in (walk(x) for x in v) if x is not no_value]
        return v

    return walk(value)


def with_conditions(cfn: dict, values: dict[str, bool]) -> dict:
    """`cfn` as CloudFormation would deploy it with the named conditions at `values`
    ([`resolve_conditions`]), and resources whose `Condition` is false removed. Other
    conditions are left as they are."""
    out = resolve_conditions(cfn, values)
    out["Resources"] = {
        k: r for k, r in out["Resources"].items() if values.get(r.get("Condition"), True)
    }
    return out


@pytest.fixture(scope="session")
def sam_cfn_raw() -> dict:
    """infra/sam/template.yaml after the SAM transform, conditions unresolved."""
    return translate()


@pytest.fixture(scope="session")
def sam_cfn(sam_cfn_raw) -> dict:
    """The SAM template as deployed with its defaults: workspaces off (WorkspaceVolumeGiB 0),
    the warm pool off (PoolSize 0), egress open (ExecutorEgress open)."""
    return with_conditions(sam_cfn_raw, {"HasWorkspaceVolumes": False, "PoolEnabled": False, **EGRESS_OPEN})


@pytest.fixture(scope="session")
def sam_workspaces_cfn(sam_cfn_raw) -> dict:
    """The SAM template as deployed with workspaces on (the pool off)."""
    return with_conditions(sam_cfn_raw, {"HasWorkspaceVolumes": True, "PoolEnabled": False, **EGRESS_OPEN})


@pytest.fixture(scope="session")
def sam_pool_cfn(sam_cfn_raw) -> dict:
    """The SAM template as deployed with the warm pool on (PoolSize > 0), workspaces off."""
    return with_conditions(sam_cfn_raw, {"HasWorkspaceVolumes": False, "PoolEnabled": True, **EGRESS_OPEN})


def _load(path: Path) -> dict:
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make infra-test` (it runs cdk synth first)")
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def cdk_cfn() -> dict:
    """The synthesized CDK stack (`make infra-test` runs `cdk synth` first)."""
    return _load(CDK_TEMPLATE)


@pytest.fixture(scope="session")
def cdk_workspaces_cfn() -> dict:
    """The synthesized CDK stack with workspaces on."""
    return _load(CDK_WORKSPACES_TEMPLATE)


@pytest.fixture(scope="session")
def cdk_pool_cfn() -> dict:
    """The synthesized CDK stack with the warm pool on (poolSize 2)."""
    return _load(CDK_POOL_TEMPLATE)


@pytest.fixture(scope="session", params=["sam", "cdk"])
def any_pool_cfn(request, sam_pool_cfn, cdk_pool_cfn) -> dict:
    """Each of the two templates in turn, the warm pool on (workspaces off)."""
    return sam_pool_cfn if request.param == "sam" else cdk_pool_cfn


@pytest.fixture(scope="session", params=["sam", "cdk"])
def any_cfn(request, sam_cfn, cdk_cfn) -> dict:
    """Each of the two templates in turn (defaults: workspaces off)."""
    return sam_cfn if request.param == "sam" else cdk_cfn


@pytest.fixture(scope="session", params=["sam", "cdk"])
def any_workspaces_cfn(request, sam_workspaces_cfn, cdk_workspaces_cfn) -> dict:
    """Each of the two templates in turn, workspaces on."""
    return sam_workspaces_cfn if request.param == "sam" else cdk_workspaces_cfn


@pytest.fixture(scope="session")
def cdk_egress_cfn() -> dict:
    """The synthesized CDK stack with executorEgress allowlist and the extra domains of
    mk/infra.mk (CDK_EGRESS_EXTRA_DOMAINS)."""
    return _load(CDK_EGRESS_TEMPLATE)
