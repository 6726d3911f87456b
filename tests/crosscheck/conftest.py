"""Requires SANDBOXCTL = path to a built `sandboxctl` binary; refuses to run without it."""

import os
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    raw = os.environ.get("SANDBOXCTL")
    hint = (
        "build it with `cargo build -p sandboxctl` and run "
        "`SANDBOXCTL=target/debug/sandboxctl .venv/bin/python -m pytest tests/crosscheck`"
    )
    if not raw:
        raise pytest.UsageError(f"SANDBOXCTL is not set: it must be the path to the sandboxctl binary; {hint}")
    path = Path(raw).resolve()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise pytest.UsageError(f"SANDBOXCTL={raw!r} is not an executable file; {hint}")
    os.environ["SANDBOXCTL"] = str(path)
