"""Validates JSON produced by agents-sim against the official `openai` SDK (3.51.0) models.

Produce the documents, then validate them:

    SIM_JSON_OUT=/tmp/sim-json cargo test -p agents-sim --test api produced_json
    .venv/bin/python crates/agents-sim/crosscheck/validate_sim_json.py /tmp/sim-json

Every document must pass `Model.model_validate(obj, strict=True)` and hold no field the
model does not declare (the same rules as tests/crosscheck for the events/ fixtures).
Exits non-zero on the first folder with a failure; prints one line per document.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from openai.pagination import SyncConversationCursorPage, SyncCursorPage
from openai.types.beta.agent_session import AgentSession
from openai.types.beta.agent_session_deleted import AgentSessionDeleted
from openai.types.beta.agent_session_item import AgentSessionItem
from openai.types.beta.agents.environment_info import EnvironmentInfo
from openai.types.beta.agents.sessions.turn import Turn
from openai.types.webhooks.agent_environment_ready_webhook_event import AgentEnvironmentReadyWebhookEvent
from openai.types.webhooks.agent_session_action_required_webhook_event import (
    AgentSessionActionRequiredWebhookEvent,
)
from openai.types.webhooks.agent_session_created_webhook_event import AgentSessionCreatedWebhookEvent
from openai.types.webhooks.agent_session_failed_webhook_event import AgentSessionFailedWebhookEvent
from openai.types.webhooks.agent_session_idle_webhook_event import AgentSessionIdleWebhookEvent
from openai.types.webhooks.agent_session_in_progress_webhook_event import AgentSessionInProgressWebhookEvent
from pydantic import BaseModel, TypeAdapter

WEBHOOK_MODELS: dict[str, type[BaseModel]] = {
    "agent.session.created": AgentSessionCreatedWebhookEvent,
    "agent.session.action_required": AgentSessionActionRequiredWebhookEvent,
    "agent.session.in_progress": AgentSessionInProgressWebhookEvent,
    "agent.session.idle": AgentSessionIdleWebhookEvent,
    "agent.session.failed": AgentSessionFailedWebhookEvent,
    "agent.environment.ready": AgentEnvironmentReadyWebhookEvent,
}
ITEM = TypeAdapter(AgentSessionItem)


def no_undeclared(value: Any, path: str = "$") -> None:
    if isinstance(value, BaseModel):
        extra = value.model_extra or {}
        assert not extra, f"{path}: fields not in {type(value).__name__}: {sorted(extra)}"
        for name in type(value).model_fields:
            no_undeclared(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            no_undeclared(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            no_undeclared(v, f"{path}.{k}")


def strict(model: type[BaseModel], obj: Any) -> None:
    no_undeclared(model.model_validate(obj, strict=True))


def items_page(obj: Any) -> None:
    SyncConversationCursorPage[AgentSessionItem].model_validate(obj, strict=True)
    for i, item in enumerate(obj["data"]):
        no_undeclared(ITEM.validate_python(item, strict=True), f"$.data[{i}]")


def check(folder: str, name: str, obj: Any) -> None:
    if folder == "sessions":
        strict(AgentSession, obj)
    elif folder == "environments":
        strict(EnvironmentInfo, obj)
    elif folder == "turns":
        strict(Turn, obj)
    elif folder == "items":
        items_page(obj)
    elif folder == "pages":
        model = Turn if name.startswith("turns") else AgentSession
        SyncCursorPage[model].model_validate(obj, strict=True)
        for entry in obj["data"]:
            strict(model, entry)
    elif folder == "webhooks":
        strict(WEBHOOK_MODELS[obj["type"]], obj)
    elif folder == "deleted":
        strict(AgentSessionDeleted, obj)
    else:
        raise AssertionError(f"unknown folder {folder}")


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    root = Path(sys.argv[1])
    paths = sorted(root.glob("*/*.json"))
    if not paths:
        print(f"no documents under {root}")
        return 1
    failures = 0
    for p in paths:
        try:
            check(p.parent.name, p.name, json.loads(p.read_text()))
            print(f"ok   {p.relative_to(root)}")
        except Exception as e:  # noqa: BLE001 - report every document
            failures += 1
            print(f"FAIL {p.relative_to(root)}: {e}")
    print(f"{len(paths) - failures}/{len(paths)} documents validate")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
