//! `sandboxctl decode`: parses an Agents API object from stdin with the `sandbox-core`
//! model and prints it re-serialized as compact JSON, so the project's view of an object
//! can be compared with the official SDK models.
//!
//! For `event`, the envelope is parsed, then `type` + `data` with
//! [`WebhookEvent::parse_kind`]; the printed `data` is the *typed* data re-serialized
//! (verbatim for unknown types, which are accepted).

use clap::{Args, ValueEnum};
use sandbox_core::environment::EnvironmentInfo;
use sandbox_core::event::{AgentEvent, EventError, WebhookEvent};
use sandbox_core::session::Session;
use sandbox_core::turn::{Item, Page, Turn};
use serde_json::Value;
use std::io::{self, Read, Write};
use std::process::ExitCode;

/// Arguments of `sandboxctl decode`.
#[derive(Debug, Args)]
pub struct DecodeArgs {
    /// Which object stdin holds.
    #[arg(value_enum)]
    pub model: Model,
}

/// The objects `decode` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Model {
    /// An `agent.session` (`sandbox_core::session::Session`).
    Session,
    /// A webhook envelope (`sandbox_core::event::WebhookEvent` + `parse_kind`).
    Event,
    /// An `agent.environment` (`sandbox_core::environment::EnvironmentInfo`).
    Environment,
    /// An `agent.session.turn` (`sandbox_core::turn::Turn`).
    Turn,
    /// A cursor page of turn items (`sandbox_core::turn::Page<Item>`).
    Items,
}

/// Why decoding failed.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The input is not a valid object of the requested model.
    #[error("malformed {model}: {error}")]
    Malformed {
        /// The model name.
        model: &'static str,
        /// Position and expectation (serde_json may quote an offending scalar value).
        error: serde_json::Error,
    },
    /// The webhook envelope or its typed `data` is malformed (the message already holds
    /// the JSON error, so it is not repeated as a source).
    #[error("{0}")]
    Event(EventError),
    /// Serializing the parsed object failed.
    #[error("re-serializing {model}")]
    Serialize {
        /// The model name.
        model: &'static str,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// Reading stdin or writing stdout failed.
    #[error("i/o failed")]
    Io(#[from] io::Error),
}

impl From<EventError> for DecodeError {
    fn from(e: EventError) -> Self {
        Self::Event(e)
    }
}

impl Model {
    fn name(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Event => "event",
            Self::Environment => "environment",
            Self::Turn => "turn",
            Self::Items => "items",
        }
    }
}

/// Reads one JSON object from `input`, parses it as `args.model` and writes it back as one
/// line of compact JSON.
pub fn run(
    args: &DecodeArgs,
    mut input: impl Read,
    out: &mut impl Write,
) -> Result<ExitCode, DecodeError> {
    let mut raw = Vec::new();
    input.read_to_end(&mut raw)?;
    let json = decode(args.model, &raw)?;
    writeln!(out, "{json}")?;
    Ok(ExitCode::SUCCESS)
}

/// Parses `raw` as `model` and returns the re-serialized compact JSON.
pub fn decode(model: Model, raw: &[u8]) -> Result<String, DecodeError> {
    let name = model.name();
    let malformed = |error| DecodeError::Malformed { model: name, error };
    let value = match model {
        Model::Session => to_value(
            name,
            &serde_json::from_slice::<Session>(raw).map_err(malformed)?,
        )?,
        Model::Environment => to_value(
            name,
            &serde_json::from_slice::<EnvironmentInfo>(raw).map_err(malformed)?,
        )?,
        Model::Turn => to_value(
            name,
            &serde_json::from_slice::<Turn>(raw).map_err(malformed)?,
        )?,
        Model::Items => to_value(
            name,
            &serde_json::from_slice::<Page<Item>>(raw).map_err(malformed)?,
        )?,
        Model::Event => {
            let mut event = WebhookEvent::from_slice(raw)?;
            if let Some(data) = typed_data(&event.parse_kind()?)? {
                event.data = data;
            }
            to_value(name, &event)?
        }
    };
    Ok(value.to_string())
}

/// The typed `data` of a known event re-serialized; `None` for unknown types.
fn typed_data(kind: &AgentEvent) -> Result<Option<Value>, DecodeError> {
    let model = "event data";
    Ok(Some(match kind {
        AgentEvent::SessionCreated(d) => to_value(model, d)?,
        AgentEvent::SessionActionRequired(d) => to_value(model, d)?,
        AgentEvent::SessionInProgress(d)
        | AgentEvent::SessionIdle(d)
        | AgentEvent::SessionFailed(d) => to_value(model, d)?,
        AgentEvent::EnvironmentReady(d)
        | AgentEvent::EnvironmentFailed(d)
        | AgentEvent::EnvironmentSuspended(d)
        | AgentEvent::EnvironmentExpired(d) => to_value(model, d)?,
        AgentEvent::Unknown { .. } => return Ok(None),
    }))
}

fn to_value<T: serde::Serialize>(model: &'static str, v: &T) -> Result<Value, DecodeError> {
    serde_json::to_value(v).map_err(|source| DecodeError::Serialize { model, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_input_names_the_model() {
        let err = decode(Model::Session, br#"{"id":"sess_secretish"}"#).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("malformed session:"), "{msg}");
    }

    #[test]
    fn unknown_event_type_keeps_data_verbatim() {
        let raw = br#"{"id":"evt_1","object":"event","type":"batch.completed","created_at":1,"data":{"id":"batch_1","x":[1]}}"#;
        let out: Value = serde_json::from_str(&decode(Model::Event, raw).unwrap()).unwrap();
        assert_eq!(out["data"], serde_json::json!({"id": "batch_1", "x": [1]}));
    }

    #[test]
    fn known_event_type_with_bad_data_is_malformed() {
        let raw = br#"{"id":"evt_1","object":"event","type":"agent.session.idle","created_at":1,"data":{"id":"sess_1"}}"#;
        assert!(matches!(
            decode(Model::Event, raw),
            Err(DecodeError::Event(_))
        ));
    }
}
