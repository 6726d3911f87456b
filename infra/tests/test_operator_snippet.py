"""The README's operator snippet (section "Operate", `--backend aws`) exports the worker's
variables with `eval`: every value must reach the shell as one quoted word (`jq`'s `@sh`),
so a value holding `$(...)`, `;` or a quote is exported as text and never run. The jq
program is read from README.md itself, so the README cannot drift from what is tested."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def snippet_jq_program() -> str:
    text = README.read_text()
    (program,) = re.findall(r"jq -r '([^']*to_entries[^']*)'", text)
    return program


HOSTILE = {
    "PLAIN": "https://sqs.us-east-1.amazonaws.com/123456789012/q",
    "SUBSTITUTION": "$(touch {marker})",
    "BACKTICKS": "`touch {marker}`",
    "SEMICOLON": "x; touch {marker}",
    "QUOTE": "it's \"quoted\" $HOME",
    "NEWLINE": "a\ntouch {marker}",
}


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed")
def test_the_operator_snippet_runs_no_value(tmp_path):
    marker = tmp_path / "pwned"
    variables = {k: v.format(marker=marker) for k, v in HOSTILE.items()}
    program = snippet_jq_program()
    assert "@sh" in program, program
    exports = subprocess.run(
        ["jq", "-r", program], input=json.dumps(variables), capture_output=True, text=True, check=True
    ).stdout
    script = f'eval "$(cat <<\'EOF\'\n{exports}EOF\n)"\n' + "".join(
        f'printf "%s\\0" "${k}"\n' for k in variables
    )
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert not marker.exists(), "a value was run by the eval"
    assert out.split("\0")[:-1] == list(variables.values())


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed")
def test_without_at_sh_the_same_values_run(tmp_path):
    """The control: the unquoted form the README used to print runs the substitution."""
    marker = tmp_path / "pwned"
    exports = subprocess.run(
        ["jq", "-r", 'to_entries[] | "export \\(.key)=\\(.value)"'],
        input=json.dumps({"SUBSTITUTION": f"$(touch {marker})"}),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    subprocess.run(["/bin/sh", "-c", f'eval "{exports.strip()}"'], check=False)
    assert marker.exists()
