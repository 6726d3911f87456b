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


@pytest.fixture(scope="session")
def sam_cfn() -> dict:
    """infra/sam/template.yaml after the SAM transform."""
    return translate()


@pytest.fixture(scope="session")
def cdk_cfn() -> dict:
    """The synthesized CDK stack (`make infra-test` runs `cdk synth` first)."""
    if not CDK_TEMPLATE.exists():
        pytest.fail(f"{CDK_TEMPLATE} is missing: run `make infra-test` (it runs cdk synth first)")
    return json.loads(CDK_TEMPLATE.read_text())


@pytest.fixture(scope="session", params=["sam", "cdk"])
def any_cfn(request, sam_cfn, cdk_cfn) -> dict:
    """Each of the two templates in turn."""
    return sam_cfn if request.param == "sam" else cdk_cfn
