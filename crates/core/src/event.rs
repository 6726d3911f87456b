//! Webhook events: the envelope `{id, object: "event", type, created_at, data}` and the
//! typed `data` of every `agent.*` type (agents-api.md, "Webhooks"; shapes checked against
//! `openai/types/webhooks/agent_*_webhook_event.py` of the official SDK 3.51.0).
//!
//! Parsing is forward compatible: an unknown `type` parses as [`AgentEvent::Unknown`]
//! (accepted with 2xx and ignored, never a delivery failure) and unknown fields are kept.
//! A known type whose `data` lacks a required field is an error: it is malformed input.

use crate::ids::{EnvironmentId, SessionId};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The webhook envelope, with `data` kept as raw JSON until [`WebhookEvent::parse_kind`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WebhookEvent {
    /// Unique event id (`evt_...`). The *delivery* de-duplication key is the
    /// `webhook-id` header, which stays the same across retries of one delivery.
    pub id: String,
    /// Always `event`.
    pub object: String,
    /// Event type, e.g. `agent.session.action_required`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Unix seconds.
    pub created_at: i64,
    /// Type-specific payload.
    pub data: Value,
    /// Every other field verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A malformed event: the body is not an envelope, or a known type's `data` is wrong.
#[derive(Debug, thiserror::Error)]
#[error("malformed {what}: {source}")]
pub struct EventError {
    /// Which part failed: `envelope` or the event type.
    pub what: String,
    /// The JSON error (position and expectation, never the payload itself).
    #[source]
    pub source: serde_json::Error,
}

/// The typed meaning of an event.
#[derive(Clone, Debug, PartialEq)]
pub enum AgentEvent {
    /// `agent.session.created`.
    SessionCreated(SessionCreated),
    /// `agent.session.action_required`.
    SessionActionRequired(SessionActionRequired),
    /// `agent.session.in_progress`.
    SessionInProgress(SessionStateChanged),
    /// `agent.session.idle`.
    SessionIdle(SessionStateChanged),
    /// `agent.session.failed`.
    SessionFailed(SessionStateChanged),
    /// `agent.environment.ready` (mostly hosted environments).
    EnvironmentReady(EnvironmentChanged),
    /// `agent.environment.failed`.
    EnvironmentFailed(EnvironmentChanged),
    /// `agent.environment.suspended`.
    EnvironmentSuspended(EnvironmentChanged),
    /// `agent.environment.expired`.
    EnvironmentExpired(EnvironmentChanged),
    /// Any other type (other product areas, or agent types newer than this build).
    Unknown {
        /// The type as sent.
        kind: String,
    },
}

/// `data` of `agent.session.created`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionCreated {
    /// Session id.
    pub id: SessionId,
    /// `none`, `openai_hosted` or `self_hosted`.
    pub environment_type: String,
    /// Environment id, when one exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_id: Option<EnvironmentId>,
    /// Connection details of a self-hosted environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect: Option<Connect>,
}

/// `data.connect` of `agent.session.created`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Connect {
    /// The URL for `codex exec-server --remote`.
    pub remote_url: String,
}

/// `data` of `agent.session.action_required`: only the action type; retrieve the session
/// for details.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionActionRequired {
    /// Session id.
    pub id: SessionId,
    /// `{type}` of the required action.
    pub required_action: RequiredActionRef,
}

/// `data.required_action` of `agent.session.action_required`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequiredActionRef {
    /// The action type.
    #[serde(rename = "type")]
    pub kind: RequiredActionType,
}

/// The type of a required action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequiredActionType {
    /// The executor must (re)connect: the only type that concerns compute.
    EnvironmentConnection,
    /// A function result is needed.
    FunctionCall,
    /// MCP approval.
    McpApprovalRequest,
    /// Computer-use approval.
    ComputerUseApprovalRequest,
    /// A type this build does not know yet.
    #[serde(other)]
    Unknown,
}

/// `data` of `agent.session.{in_progress,idle,failed}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionStateChanged {
    /// Session id.
    pub id: SessionId,
    /// `none`, `openai_hosted` or `self_hosted`.
    pub environment_type: String,
    /// Environment id, when one exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_id: Option<EnvironmentId>,
}

/// `data` of `agent.environment.*`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EnvironmentChanged {
    /// Environment id.
    pub id: EnvironmentId,
}

impl WebhookEvent {
    /// Parses an envelope from the raw (already verified) body.
    ///
    /// # Errors
    /// [`EventError`] when the body is not a JSON object with `id`, `object`, `type`,
    /// `created_at` and `data`.
    pub fn from_slice(body: &[u8]) -> Result<Self, EventError> {
        serde_json::from_slice(body).map_err(|source| EventError {
            what: "envelope".into(),
            source,
        })
    }

    /// The typed meaning of `type` + `data`.
    ///
    /// # Errors
    /// [`EventError`] when a known type's `data` lacks a required field or has a wrong
    /// type. Unknown types never fail.
    pub fn parse_kind(&self) -> Result<AgentEvent, EventError> {
        fn data<T: serde::de::DeserializeOwned>(e: &WebhookEvent) -> Result<T, EventError> {
            T::deserialize(&e.data).map_err(|source| EventError {
                what: e.kind.clone(),
                source,
            })
        }
        Ok(match self.kind.as_str() {
            "agent.session.created" => AgentEvent::SessionCreated(data(self)?),
            "agent.session.action_required" => AgentEvent::SessionActionRequired(data(self)?),
            "agent.session.in_progress" => AgentEvent::SessionInProgress(data(self)?),
            "agent.session.idle" => AgentEvent::SessionIdle(data(self)?),
            "agent.session.failed" => AgentEvent::SessionFailed(data(self)?),
            "agent.environment.ready" => AgentEvent::EnvironmentReady(data(self)?),
            "agent.environment.failed" => AgentEvent::EnvironmentFailed(data(self)?),
            "agent.environment.suspended" => AgentEvent::EnvironmentSuspended(data(self)?),
            "agent.environment.expired" => AgentEvent::EnvironmentExpired(data(self)?),
            other => AgentEvent::Unknown { kind: other.into() },
        })
    }
}

impl AgentEvent {
    /// The typed meaning of a raw (already verified) webhook body in one pass: the same
    /// result as [`WebhookEvent::from_slice`] then [`WebhookEvent::parse_kind`] (the
    /// envelope needs `id`, `object`, `type`, `created_at` and `data`, with the same types),
    /// without building the envelope's JSON tree: `data` is borrowed as raw JSON and
    /// parsed once into its typed struct, other fields are skipped. This is the webhook
    /// intake's hot path (verify + parse + route, `make bench`).
    ///
    /// # Errors
    /// [`EventError`] (`what` = `envelope` or the event type), as the two-step parse.
    pub fn from_body(body: &[u8]) -> Result<Self, EventError> {
        use serde_json::value::RawValue;
        use std::borrow::Cow;
        // Field types as in `WebhookEvent`: a body either parses both ways or neither.
        #[derive(Deserialize)]
        struct Envelope<'a> {
            #[serde(rename = "id", borrow)]
            _id: Cow<'a, str>,
            #[serde(rename = "object", borrow)]
            _object: Cow<'a, str>,
            #[serde(rename = "type", borrow)]
            kind: Cow<'a, str>,
            #[serde(rename = "created_at")]
            _created_at: i64,
            #[serde(borrow)]
            data: &'a RawValue,
        }
        let envelope: Envelope<'_> = serde_json::from_slice(body).map_err(|source| EventError {
            what: "envelope".into(),
            source,
        })?;
        let kind = envelope.kind.as_ref();
        let data = envelope.data.get();
        fn typed<'a, T: Deserialize<'a>>(kind: &str, data: &'a str) -> Result<T, EventError> {
            serde_json::from_str(data).map_err(|source| EventError {
                what: kind.to_owned(),
                source,
            })
        }
        Ok(match kind {
            "agent.session.created" => Self::SessionCreated(typed(kind, data)?),
            "agent.session.action_required" => Self::SessionActionRequired(typed(kind, data)?),
            "agent.session.in_progress" => Self::SessionInProgress(typed(kind, data)?),
            "agent.session.idle" => Self::SessionIdle(typed(kind, data)?),
            "agent.session.failed" => Self::SessionFailed(typed(kind, data)?),
            "agent.environment.ready" => Self::EnvironmentReady(typed(kind, data)?),
            "agent.environment.failed" => Self::EnvironmentFailed(typed(kind, data)?),
            "agent.environment.suspended" => Self::EnvironmentSuspended(typed(kind, data)?),
            "agent.environment.expired" => Self::EnvironmentExpired(typed(kind, data)?),
            other => Self::Unknown { kind: other.into() },
        })
    }

    /// The session the event is about, for session events.
    pub fn session_id(&self) -> Option<&SessionId> {
        match self {
            Self::SessionCreated(d) => Some(&d.id),
            Self::SessionActionRequired(d) => Some(&d.id),
            Self::SessionInProgress(d) | Self::SessionIdle(d) | Self::SessionFailed(d) => {
                Some(&d.id)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_type_parses_as_unknown_and_known_type_with_bad_data_fails() {
        let e = WebhookEvent::from_slice(
            br#"{"id":"evt_1","object":"event","type":"batch.completed","created_at":1,"data":{"id":"b"}}"#,
        )
        .unwrap();
        assert_eq!(
            e.parse_kind().unwrap(),
            AgentEvent::Unknown {
                kind: "batch.completed".into()
            }
        );
        let bad = WebhookEvent::from_slice(
            br#"{"id":"evt_1","object":"event","type":"agent.session.idle","created_at":1,"data":{}}"#,
        )
        .unwrap();
        assert!(bad.parse_kind().is_err());
    }

    /// The two-step parse (envelope, then `parse_kind`), for comparison.
    fn two_step(body: &[u8]) -> Result<AgentEvent, String> {
        WebhookEvent::from_slice(body)
            .and_then(|e| e.parse_kind())
            .map_err(|e| e.what)
    }

    #[test]
    fn one_pass_parse_matches_the_two_step_parse_on_every_fixture_and_malformed_body() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../events/webhooks");
        let mut bodies: Vec<Vec<u8>> = std::fs::read_dir(dir)
            .unwrap()
            .map(|f| std::fs::read(f.unwrap().path()).unwrap())
            .collect();
        assert!(bodies.len() >= 9, "fixtures in {dir}");
        for bad in [
            &br#"{"object":"event","type":"agent.session.idle","created_at":1,"data":{"id":"s"}}"#[..],
            br#"{"id":7,"object":"event","type":"agent.session.idle","created_at":1,"data":{"id":"s"}}"#,
            br#"{"id":"e","object":"event","type":"agent.session.idle","created_at":"1","data":{"id":"s"}}"#,
            br#"{"id":"e","object":"event","type":"agent.session.idle","created_at":1}"#,
            br#"{"id":"e","object":"event","type":"agent.session.idle","created_at":1,"data":{}}"#,
            br#"{"id":"e","object":"event","type":"agent.sess\u0069on.idle","created_at":1,"data":{"id":"s"}}"#,
            br#"{"id":"e","object":"event","type":"x.y","created_at":1,"data":[1,2]}"#,
            br#"[]"#,
            br#"{"id":"e","#,
            b"",
        ] {
            bodies.push(bad.to_vec());
        }
        for body in &bodies {
            let one = AgentEvent::from_body(body).map_err(|e| e.what);
            assert_eq!(one, two_step(body), "{}", String::from_utf8_lossy(body));
        }
    }
}
