//! The `agent.session` object as `GET /agents/sessions/{id}` returns it.
//!
//! Field names are exactly the API's (checked against the official Python SDK 3.51.0,
//! `openai/types/beta/agent_session.py`). Fields the controller does not read are kept
//! verbatim in `extra` maps, so a session parsed and serialized again is the same object;
//! unknown enum values parse as `Unknown` instead of failing (forward compatibility).
//! An `Unknown` value serializes as `"unknown"` (its original spelling is not kept): the
//! controller reads sessions, it never writes them back.

use crate::ids::{EnvironmentId, SessionId};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A Managed Agents session (`object: "agent.session"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Session {
    /// The session id.
    pub id: SessionId,
    /// Always `agent.session`.
    pub object: String,
    /// The agent running in the session; only `agent.id` is read (ownership filter).
    pub agent: Agent,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds.
    pub last_active_at: i64,
    /// `idle`, `in_progress`, `requires_action` or `failed`.
    pub status: SessionStatus,
    /// What must happen before the session can continue.
    pub required_actions: Vec<RequiredAction>,
    /// The execution environment (tagged by `type`).
    pub environment: Environment,
    /// Custom string pairs (at most 16; keys ≤ 64 chars, values ≤ 512).
    pub metadata: BTreeMap<String, String>,
    /// Why the session failed, if it did.
    #[serde(default)]
    pub error: Option<String>,
    /// Every other field (`usage`, `vault_ids`, `spend_control`, ...), kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The agent embedded in a session: its `id` plus every other field verbatim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Agent {
    /// The agent id (`agent.session.agent.id`), matched by the ownership filter.
    pub id: String,
    /// `model`, `tools`, `reasoning`, ... kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `agent.session.status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// No turn running, ready for input. Not a safe shutdown signal on its own
    /// (agents-api.md: idle can arrive just before queued input starts).
    Idle,
    /// A turn is running.
    InProgress,
    /// Waiting on `required_actions`.
    RequiresAction,
    /// The session failed.
    Failed,
    /// A status this build does not know yet.
    #[serde(other)]
    Unknown,
}

/// One entry of `required_actions`, tagged by `type`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RequiredAction {
    /// The executor must (re)connect. The ONLY action that justifies starting compute.
    EnvironmentConnection {
        /// The environment to connect.
        environment_id: EnvironmentId,
    },
    /// A function tool result is needed: not compute.
    FunctionCall {
        /// Id to echo with the result.
        call_id: String,
        /// Function name.
        name: String,
        /// Model-supplied arguments (any JSON).
        arguments: Value,
        /// The turn that asked.
        turn_id: String,
    },
    /// An MCP tool-call approval.
    McpApprovalRequest {
        /// Id to echo when responding.
        request_id: String,
        /// The turn that asked.
        turn_id: String,
        /// What to present (kept verbatim).
        request: Value,
    },
    /// A computer-use approval.
    ComputerUseApprovalRequest {
        /// Id to echo when responding.
        request_id: String,
        /// The turn that asked.
        turn_id: String,
        /// What to present (kept verbatim).
        request: Value,
    },
    /// An action type this build does not know yet (never starts compute).
    #[serde(other)]
    Unknown,
}

/// `agent.session.environment`, tagged by `type`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Environment {
    /// No execution environment.
    None,
    /// An OpenAI-hosted environment: never ours to run.
    #[serde(rename = "openai_hosted")]
    OpenAiHosted {
        /// Environment id.
        id: EnvironmentId,
        /// Every other field verbatim.
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
    /// The application runs the executor: this controller's job.
    SelfHosted(SelfHostedEnvironment),
    /// An environment type this build does not know yet (ignored).
    #[serde(other)]
    Unknown,
}

/// The `self_hosted` environment of a session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SelfHostedEnvironment {
    /// Environment id; the effect key is derived from it.
    pub id: EnvironmentId,
    /// Passed unchanged to `codex exec-server --remote` on every start and reconnect.
    pub remote_url: String,
    /// Defaults to `/workspace`; matched by the ownership filter.
    pub workspace_directory: String,
    /// Extra capability directories.
    pub capability_directories: Vec<String>,
    /// Every other field verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Session {
    /// The self-hosted environment, or `None` for `none`, `openai_hosted` and unknown types.
    pub fn self_hosted(&self) -> Option<&SelfHostedEnvironment> {
        match &self.environment {
            Environment::SelfHosted(env) => Some(env),
            _ => None,
        }
    }

    /// Whether `required_actions` currently holds an `environment_connection` for `env`.
    pub fn requires_connection_of(&self, env: &EnvironmentId) -> bool {
        self.required_actions.iter().any(|a| {
            matches!(a, RequiredAction::EnvironmentConnection { environment_id } if environment_id == env)
        })
    }

    /// Whether a turn is running or the session waits on any required action: the
    /// executor is (or is about to be) needed, so a pending shutdown must be cancelled.
    pub fn is_busy(&self) -> bool {
        matches!(
            self.status,
            SessionStatus::InProgress | SessionStatus::RequiresAction
        ) || !self.required_actions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_status_action_and_environment_types_parse() {
        let json = serde_json::json!({
            "id": "sess_1", "object": "agent.session", "agent": {"id": "agent_1", "model": "x"},
            "created_at": 1, "last_active_at": 2, "status": "hibernating",
            "required_actions": [{"type": "teleport", "where": "moon"}],
            "environment": {"type": "quantum", "id": "env_q"},
            "metadata": {}, "error": null, "brand_new_field": [1, 2]
        });
        let s: Session = serde_json::from_value(json).unwrap();
        assert_eq!(s.status, SessionStatus::Unknown);
        assert_eq!(s.required_actions, vec![RequiredAction::Unknown]);
        assert_eq!(s.environment, Environment::Unknown);
        assert!(s.extra.contains_key("brand_new_field"));
        assert!(s.agent.extra.contains_key("model"));
    }
}
