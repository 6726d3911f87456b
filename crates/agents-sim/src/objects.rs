//! Rendering of API objects as JSON, shaped exactly like the official SDK 3.51.0 models
//! (and the `events/` fixtures): `agent.session`, `agent.environment`,
//! `agent.session.turn`, turn items and cursor pages.

use crate::state::{EnvKind, EnvRec, SessionRec, TurnRec, Usage};
use serde_json::{Map, Value, json};

/// The full `agent` object of a session: the fixture's defaults, with `id`, and any of
/// `instructions`, `model`, `name`, `reasoning`, `service_tier`, `text`, `tools`,
/// `multi_agent`, `compaction`, `experimental` taken from the request's `agent` object.
pub(crate) fn agent_object(agent_id: &str, request: Option<&Map<String, Value>>) -> Value {
    let mut agent = json!({
        "id": agent_id,
        "instructions": "You maintain the repository in the workspace. Run the test suite before proposing a change.",
        "model": "gpt-5.1-codex",
        "multi_agent": {"enabled": false, "max_concurrent_subagents": null},
        "name": "sim-agent",
        "reasoning": {"effort": "medium", "summary": "auto"},
        "service_tier": "auto",
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tools": [],
        "compaction": {"async": true},
        "experimental": {"time_awareness": false},
    });
    if let (Some(req), Some(obj)) = (request, agent.as_object_mut()) {
        for key in [
            "instructions",
            "model",
            "name",
            "reasoning",
            "service_tier",
            "text",
            "tools",
            "multi_agent",
            "compaction",
            "experimental",
        ] {
            if let Some(v) = req.get(key)
                && !v.is_null()
            {
                obj.insert(key.to_owned(), v.clone());
            }
        }
    }
    agent
}

/// `TokenUsage`.
pub(crate) fn usage_json(u: Usage) -> Value {
    json!({
        "input_tokens": u.input,
        "input_tokens_details": {"cached_tokens": u.cached},
        "output_tokens": u.output,
        "output_tokens_details": {"reasoning_tokens": u.reasoning},
        "total_tokens": u.input + u.output,
    })
}

/// The session's `environment`, tagged by `type`.
pub(crate) fn session_environment_json(s: &SessionRec) -> Value {
    match s.env_kind {
        EnvKind::None => json!({"type": "none"}),
        EnvKind::OpenAiHosted => json!({
            "type": "openai_hosted",
            "id": s.env_id,
            "capability_directories": [],
            "files": [],
            "network": {"access": "disabled", "allowed_domains": []},
            "packages": {"npm": [], "python": [], "system": []},
            "plugins": [],
            "skills": [],
            "container_size": "small",
            "desktop": {"enabled": false},
        }),
        EnvKind::SelfHosted => json!({
            "type": "self_hosted",
            "id": s.env_id,
            "remote_url": s.remote_url,
            "workspace_directory": s.workspace_directory,
            "capability_directories": [],
        }),
    }
}

/// `agent.session`.
pub(crate) fn session_json(s: &SessionRec) -> Value {
    json!({
        "id": s.id,
        "object": "agent.session",
        "agent": s.agent,
        "created_at": s.created_at,
        "last_active_at": s.last_active_at,
        "status": s.status,
        "required_actions": s.required_actions,
        "environment": session_environment_json(s),
        "metadata": s.metadata,
        "error": s.error,
        "usage": s.usage.map(usage_json),
        "vault_ids": s.vault_ids,
    })
}

/// `agent.environment` (`GET /v1/agents/environments/{id}`).
pub(crate) fn environment_json(e: &EnvRec) -> Value {
    json!({
        "id": e.id,
        "object": "agent.environment",
        "type": e.kind.as_str(),
        "status": e.status,
        "files": [],
        "plugins": [],
        "skills": [],
    })
}

/// `agent.session.turn`.
pub(crate) fn turn_json(t: &TurnRec) -> Value {
    json!({
        "id": t.id,
        "object": "agent.session.turn",
        "session_id": t.session_id,
        "agent_id": t.agent_id,
        "status": t.status,
        "created_at": t.created_at,
        "started_at": t.started_at,
        "completed_at": t.completed_at,
        "error": t.error.as_ref().map(|(code, message)| json!({"code": code, "message": message})),
        "subagent_id": null,
        "usage": t.usage.map(usage_json),
    })
}

/// A user message item (`AgentSessionMessage`, role `user`, always `completed`).
pub(crate) fn user_message(id: &str, turn_id: &str, content: &[Value]) -> Value {
    json!({
        "id": id,
        "type": "message",
        "role": "user",
        "phase": null,
        "status": "completed",
        "turn_id": turn_id,
        "content": content,
    })
}

/// An assistant final answer (`AgentSessionMessage`, role `assistant`).
pub(crate) fn assistant_message(id: &str, turn_id: &str, text: &str) -> Value {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "phase": "final_answer",
        "status": "completed",
        "turn_id": turn_id,
        "content": [{"type": "output_text", "text": text}],
    })
}

/// A `command_execution` item in progress.
pub(crate) fn command_started(id: &str, turn_id: &str, command: &str, cwd: &str) -> Value {
    json!({
        "id": id,
        "type": "command_execution",
        "command": command,
        "cwd": cwd,
        "duration_ms": null,
        "exit_code": null,
        "output": null,
        "status": "in_progress",
        "turn_id": turn_id,
    })
}

/// Finishes a `command_execution` item in place: `status`, `exit_code`, `output` and
/// `duration_ms`.
pub(crate) fn command_finish(
    item: &mut Value,
    status: &str,
    exit_code: Option<i64>,
    output: &str,
    duration_ms: i64,
) {
    if let Some(obj) = item.as_object_mut() {
        obj.insert("status".into(), json!(status));
        obj.insert("exit_code".into(), json!(exit_code));
        obj.insert("output".into(), json!(output));
        obj.insert("duration_ms".into(), json!(duration_ms.max(0)));
    }
}

/// A cursor page. `first_id`/`last_id` are the ids of the first and last entries (the
/// item lists' cursor is `last_id`; turn and session lists continue after the last
/// entry's `id`, which is the same value here).
pub(crate) fn page_json(data: Vec<Value>, has_more: bool) -> Value {
    let id_of = |v: Option<&Value>| v.and_then(|v| v.get("id")).cloned().unwrap_or(Value::Null);
    let first_id = id_of(data.first());
    let last_id = id_of(data.last());
    json!({
        "object": "list",
        "data": data,
        "first_id": first_id,
        "last_id": last_id,
        "has_more": has_more,
    })
}
