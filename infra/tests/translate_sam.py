"""Translates infra/sam/template.yaml to plain CloudFormation with the SAM translator
(aws-sam-translator, as shipped with aws-sam-cli), offline.

cfn-lint >= 1 no longer expands AWS::Serverless-2016-10-31 itself, so errors inside SAM
resources (events, function URLs) only show on the translated template.

    python infra/tests/translate_sam.py [TEMPLATE] [OUT.json]

Needs AWS_DEFAULT_REGION (the translator builds ARNs for the region's partition); no
credentials and no network: the template names no managed policy, so the translator's
policy loader is never called.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from samtranslator.public.exceptions import InvalidDocumentException
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

HERE = Path(__file__).resolve().parent
DEFAULT_TEMPLATE = HERE.parent / "sam" / "template.yaml"


class NoManagedPolicies:
    """Policy loader that refuses: a managed policy name would need IAM (network)."""

    def load(self) -> dict[str, str]:
        raise RuntimeError("the SAM template must not name managed policies (offline translation)")


# What `sam package` puts in place of a local CodeUri; `sam validate` does the same.
PACKAGED_CODE_URI = "s3://bucket/key"


def replace_local_code_uris(sam: dict) -> None:
    """Points every local `CodeUri` (Globals and functions) at an S3 URI, as `sam package`
    would: the translator accepts only S3 locations."""
    function_globals = sam.get("Globals", {}).get("Function", {})
    if isinstance(function_globals.get("CodeUri"), str):
        function_globals["CodeUri"] = PACKAGED_CODE_URI
    for resource in sam.get("Resources", {}).values():
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        props = resource.setdefault("Properties", {})
        if isinstance(props.get("CodeUri"), str) and not props["CodeUri"].startswith("s3://"):
            props["CodeUri"] = PACKAGED_CODE_URI


def translate(template_path: Path = DEFAULT_TEMPLATE) -> dict:
    """The CloudFormation template (a dict) that SAM makes of `template_path`."""
    sam = yaml_parse(template_path.read_text())
    replace_local_code_uris(sam)
    return transform(sam, {}, NoManagedPolicies())


def main(argv: list[str]) -> int:
    template = Path(argv[1]) if len(argv) > 1 else DEFAULT_TEMPLATE
    try:
        cfn = translate(template)
    except InvalidDocumentException as e:
        for cause in e.causes:
            print(f"{template}: {cause.message}", file=sys.stderr)
        return 1
    text = json.dumps(cfn, indent=1, sort_keys=True)
    if len(argv) > 2:
        Path(argv[2]).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
