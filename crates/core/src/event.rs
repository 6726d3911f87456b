//! Webhook events: the envelope `{id, object: "event", type, created_at, data}` and the
//! typed `data` of every `agent.*` type (agents-api.md, "Webhooks"; shapes checked against
//! `openai/types/webhooks/agent_*_webhook_event.py` of the official SDK 3.51.0).
//!
//! Parsing is forward compatible: an unknown `type` parses as [`AgentEvent::Unknown`]
//! (accepted with 2xx and ignored, never a delivery failure) and unknown fields are kept.
//! A known type whose `data` lacks a required field is an error: it is malformed input.

use crate::ids::{EnvironmentId, SessionId};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;

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
        match KnownKind::of(&self.kind) {
            Some(known) => known.typed_data(&self.data).map_err(|source| EventError {
                what: self.kind.clone(),
                source,
            }),
            None => Ok(AgentEvent::Unknown {
                kind: self.kind.clone(),
            }),
        }
    }
}

/// The `agent.*` types this build knows: the ones whose `data` has a typed struct.
#[derive(Clone, Copy, Debug)]
enum KnownKind {
    SessionCreated,
    SessionActionRequired,
    SessionInProgress,
    SessionIdle,
    SessionFailed,
    EnvironmentReady,
    EnvironmentFailed,
    EnvironmentSuspended,
    EnvironmentExpired,
}

impl KnownKind {
    /// The known type named by `type`, or `None` for [`AgentEvent::Unknown`].
    fn of(kind: &str) -> Option<Self> {
        Some(match kind {
            "agent.session.created" => Self::SessionCreated,
            "agent.session.action_required" => Self::SessionActionRequired,
            "agent.session.in_progress" => Self::SessionInProgress,
            "agent.session.idle" => Self::SessionIdle,
            "agent.session.failed" => Self::SessionFailed,
            "agent.environment.ready" => Self::EnvironmentReady,
            "agent.environment.failed" => Self::EnvironmentFailed,
            "agent.environment.suspended" => Self::EnvironmentSuspended,
            "agent.environment.expired" => Self::EnvironmentExpired,
            _ => return None,
        })
    }

    /// Deserializes `data` into this type's struct.
    fn typed_data<'de, D: Deserializer<'de>>(self, data: D) -> Result<AgentEvent, D::Error> {
        use AgentEvent as E;
        Ok(match self {
            Self::SessionCreated => E::SessionCreated(Deserialize::deserialize(data)?),
            Self::SessionActionRequired => {
                E::SessionActionRequired(Deserialize::deserialize(data)?)
            }
            Self::SessionInProgress => E::SessionInProgress(Deserialize::deserialize(data)?),
            Self::SessionIdle => E::SessionIdle(Deserialize::deserialize(data)?),
            Self::SessionFailed => E::SessionFailed(Deserialize::deserialize(data)?),
            Self::EnvironmentReady => E::EnvironmentReady(Deserialize::deserialize(data)?),
            Self::EnvironmentFailed => E::EnvironmentFailed(Deserialize::deserialize(data)?),
            Self::EnvironmentSuspended => E::EnvironmentSuspended(Deserialize::deserialize(data)?),
            Self::EnvironmentExpired => E::EnvironmentExpired(Deserialize::deserialize(data)?),
        })
    }
}

/// [`AgentEvent::from_body`]'s one pass: the envelope read field by field, `data` typed
/// in place when `type` came first. Stricter than the reference, never looser: whatever
/// it accepts, the reference accepts with the same result (pinned by `one_pass_tests`).
struct OnePass(AgentEvent);

/// An envelope key; any other key is skipped, as the reference's derive does.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum EnvelopeField {
    Id,
    Object,
    #[serde(rename = "type")]
    Kind,
    CreatedAt,
    Data,
    #[serde(other)]
    Other,
}

/// A JSON string, borrowed unless it has escapes (as the reference's `Cow<str>` fields).
#[derive(Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// `data` as read: typed already, or raw JSON while `type` was not yet known.
enum Data<'a> {
    Typed(AgentEvent),
    Raw(&'a RawValue),
}

/// Parses `data` in place as the struct of a known type.
struct TypedData(KnownKind);

impl<'de> DeserializeSeed<'de> for TypedData {
    type Value = AgentEvent;
    fn deserialize<D: Deserializer<'de>>(self, data: D) -> Result<AgentEvent, D::Error> {
        self.0.typed_data(data)
    }
}

impl<'de> Deserialize<'de> for OnePass {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        de.deserialize_map(OnePassVisitor)
    }
}

struct OnePassVisitor;

impl<'de> Visitor<'de> for OnePassVisitor {
    type Value = OnePass;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a webhook event object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OnePass, A::Error> {
        // Each key once, as the reference's derive: a repeated one is an error.
        fn once<'de, T: Deserialize<'de>, A: MapAccess<'de>>(
            map: &mut A,
            slot: &mut Option<T>,
            name: &'static str,
        ) -> Result<(), A::Error> {
            if slot.is_some() {
                return Err(de::Error::duplicate_field(name));
            }
            *slot = Some(map.next_value()?);
            Ok(())
        }
        let mut id: Option<Text<'de>> = None;
        let mut object: Option<Text<'de>> = None;
        let mut kind: Option<Text<'de>> = None;
        let mut created_at: Option<i64> = None;
        let mut data: Option<Data<'de>> = None;
        while let Some(field) = map.next_key()? {
            match field {
                EnvelopeField::Id => once(&mut map, &mut id, "id")?,
                EnvelopeField::Object => once(&mut map, &mut object, "object")?,
                EnvelopeField::Kind => once(&mut map, &mut kind, "type")?,
                EnvelopeField::CreatedAt => once(&mut map, &mut created_at, "created_at")?,
                EnvelopeField::Data => {
                    if data.is_some() {
                        return Err(de::Error::duplicate_field("data"));
                    }
                    let known = kind.as_ref().and_then(|k| KnownKind::of(&k.0));
                    data = Some(match known {
                        Some(known) => Data::Typed(map.next_value_seed(TypedData(known))?),
                        None => Data::Raw(map.next_value()?),
                    });
                }
                EnvelopeField::Other => {
                    map.next_value::<de::IgnoredAny>()?;
                }
            }
        }
        let (Some(_), Some(_), Some(Text(kind)), Some(_), Some(data)) =
            (id, object, kind, created_at, data)
        else {
            return Err(de::Error::custom("missing envelope field"));
        };
        let event = match (data, KnownKind::of(&kind)) {
            (Data::Typed(event), _) => event,
            (Data::Raw(raw), Some(known)) => {
                let mut de = serde_json::Deserializer::from_str(raw.get());
                known
                    .typed_data(&mut de)
                    .and_then(|event| de.end().map(|()| event))
                    .map_err(de::Error::custom)?
            }
            (Data::Raw(_), None) => AgentEvent::Unknown {
                kind: kind.into_owned(),
            },
        };
        Ok(OnePass(event))
    }
}

impl AgentEvent {
    /// The typed meaning of a raw (already verified) webhook body: the same result as
    /// [`WebhookEvent::from_slice`] then [`WebhookEvent::parse_kind`] (the envelope needs
    /// `id`, `object`, `type`, `created_at` and `data`, with the same types), without
    /// building the envelope's JSON tree. (Unlike `from_slice`, it also takes the five
    /// envelope fields as a JSON array and does not check the UTF-8 of skipped envelope
    /// fields, as it always has.) This is the webhook intake's hot path (verify + parse +
    /// route, `make bench`).
    ///
    /// One pass over the bytes when the body is UTF-8 and `type` comes before `data` (as
    /// the Agents API sends it): `data` is then parsed straight into its typed struct while
    /// the envelope is read, other fields are skipped. Otherwise `data` is borrowed as raw
    /// JSON and parsed once the envelope is complete. A body this pass does not accept is
    /// parsed again by the reference parse (envelope with raw `data`, then typed `data`),
    /// whose answer (error or event) is final, so errors and edge cases are exactly the
    /// reference's.
    ///
    /// # Errors
    /// [`EventError`] (`what` = `envelope` or the event type), as the two-step parse.
    pub fn from_body(body: &[u8]) -> Result<Self, EventError> {
        // The whole-body UTF-8 check stands in for the one the reference does on the raw
        // `data` (a borrowed `RawValue` must be UTF-8), since the one pass skips unknown
        // strings without checking them. Stricter is fine: a failure falls back.
        let one_pass = std::str::from_utf8(body)
            .ok()
            .and_then(|text| serde_json::from_str::<OnePass>(text).ok());
        match one_pass {
            Some(OnePass(event)) => Ok(event),
            None => Self::from_body_reference(body),
        }
    }

    /// The reference parse of [`AgentEvent::from_body`]: the envelope with `data` borrowed
    /// as raw JSON, then `data` parsed into the typed struct of `type`.
    fn from_body_reference(body: &[u8]) -> Result<Self, EventError> {
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
        match KnownKind::of(kind) {
            Some(known) => {
                let mut de = serde_json::Deserializer::from_str(envelope.data.get());
                known
                    .typed_data(&mut de)
                    .and_then(|event| de.end().map(|()| event))
                    .map_err(|source| EventError {
                        what: kind.to_owned(),
                        source,
                    })
            }
            None => Ok(Self::Unknown { kind: kind.into() }),
        }
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

/// The one pass against the reference parse (what `from_body` was before the one pass):
/// the one pass may refuse a body the reference takes (it then falls back), never the
/// reverse, and when both take a body they agree.
#[cfg(test)]
mod one_pass_tests {
    use super::*;
    use proptest::prelude::*;

    /// Checks the one pass against the reference on `body`, and that `from_body` answers
    /// exactly as the reference (event, or error with the same `what`).
    fn check(body: &[u8]) {
        let reference = AgentEvent::from_body_reference(body).map_err(|e| e.what);
        if let Some(Ok(OnePass(event))) = std::str::from_utf8(body)
            .ok()
            .map(serde_json::from_str::<OnePass>)
        {
            assert_eq!(
                Ok(&event),
                reference.as_ref(),
                "one pass looser than the reference: {}",
                String::from_utf8_lossy(body)
            );
        }
        let answer = AgentEvent::from_body(body).map_err(|e| e.what);
        assert_eq!(answer, reference, "{}", String::from_utf8_lossy(body));
    }

    const IDLE_DATA: &str = r#"{"id":"s","environment_type":"self_hosted"}"#;

    #[test]
    fn repeated_envelope_fields_are_refused_before_or_after_data() {
        for (field, value) in [
            ("id", r#""e""#),
            ("object", r#""event""#),
            ("type", r#""agent.session.idle""#),
            ("created_at", "1"),
            ("data", IDLE_DATA),
        ] {
            let base = format!(
                r#""id":"e","object":"event","type":"agent.session.idle","created_at":1,"data":{IDLE_DATA}"#
            );
            for body in [
                format!(r#"{{"{field}":{value},{base}}}"#),
                format!(r#"{{{base},"{field}":{value}}}"#),
            ] {
                assert!(AgentEvent::from_body(body.as_bytes()).is_err(), "{body}");
                check(body.as_bytes());
            }
        }
    }

    #[test]
    fn data_before_type_parses_as_with_type_first() {
        let body = format!(
            r#"{{"data":{IDLE_DATA},"id":"e","object":"event","created_at":1,"type":"agent.session.idle"}}"#
        );
        assert!(matches!(
            AgentEvent::from_body(body.as_bytes()),
            Ok(AgentEvent::SessionIdle(_))
        ));
        check(body.as_bytes());
        check(
            br#"{"data":{},"id":"e","object":"event","created_at":1,"type":"agent.session.idle"}"#,
        );
    }

    #[test]
    fn edge_cases_answer_exactly_as_the_reference() {
        let idle = |extra: &str, data: &str| {
            format!(
                r#"{{"id":"e","object":"event","type":"agent.session.idle","created_at":1,"data":{data}{extra}}}"#
            )
            .into_bytes()
        };
        let mut bodies: Vec<Vec<u8>> = vec![
            idle("", IDLE_DATA),
            idle(r#","extra":{"a":[1,2,{"b":null}]}"#, IDLE_DATA),
            idle("", r#"{"id":"s","environment_type":"self_hosted","x":"\u00e9\ud83d\ude00"}"#),
            idle("", r#"{"id":"s","environment_type":"self_hosted","x":"\ud800"}"#),
            idle("", r#"{"id":"s","environment_type":"self_hosted","id":"t"}"#),
            idle("", r#"{"id":"s","environment_type":"self_hosted"} "#),
            idle("", r#"{"id":"s","environment_type":"self_hosted","x":"a	b"}"#),
            idle(" x", IDLE_DATA),
            idle(",", IDLE_DATA),
            br#"{"id":"e","object":"event","ty\u0070e":"agent.session.idle","created_at":1,"data":{"id":"s","environment_type":"self_hosted"}}"#.to_vec(),
            br#"{"id":"e\n","object":"ev\u0065nt","type":"agent.session.idl\u0065","created_at":1,"data":{"id":"s","environment_type":"self_hosted"}}"#.to_vec(),
            br#"{"id":"e","object":"event","type":"agent.session.idle","created_at":1.0,"data":{"id":"s","environment_type":"self_hosted"}}"#.to_vec(),
            br#"{"id":"e","object":"event","type":"agent.session.idle","created_at":-9223372036854775808,"data":{"id":"s","environment_type":"self_hosted"}}"#.to_vec(),
            br#"{"id":"e","object":"event","type":"agent.session.idle","created_at":9223372036854775808,"data":{"id":"s","environment_type":"self_hosted"}}"#.to_vec(),
            br#"{"id":null,"object":"event","type":"agent.session.idle","created_at":1,"data":{"id":"s","environment_type":"self_hosted"}}"#.to_vec(),
            br#"{"id":"e","object":"event","type":"x.y","created_at":1,"data":null}"#.to_vec(),
            br#"{"id":"e","object":"event","type":7,"created_at":1,"data":{}}"#.to_vec(),
            // The reference's derive also takes the envelope as an array.
            br#"["e","event","agent.session.idle",1,{"id":"s","environment_type":"self_hosted"}]"#.to_vec(),
            br#""e""#.to_vec(),
        ];
        // Invalid UTF-8 (0x01 stands for 0xff) in a skipped envelope field (the reference
        // skips it unchecked), inside `data` (the reference refuses it) and in a typed field.
        let ff = |body: Vec<u8>| -> Vec<u8> {
            body.into_iter()
                .map(|b| if b == 1 { 0xff } else { b })
                .collect()
        };
        bodies.push(ff(idle(",\"extra\":\"\u{1}\"", IDLE_DATA)));
        bodies.push(ff(idle(
            "",
            "{\"id\":\"s\",\"environment_type\":\"self_hosted\",\"x\":\"\u{1}\"}",
        )));
        bodies.push(ff(idle(
            "",
            "{\"id\":\"\u{1}\",\"environment_type\":\"self_hosted\"}",
        )));
        for body in &bodies {
            check(body);
        }
    }

    /// One envelope member: a key (sometimes escaped or unknown) and a value of any kind.
    fn member() -> impl Strategy<Value = String> {
        let key = prop::sample::select(vec![
            "id",
            "object",
            "type",
            "created_at",
            "data",
            "extra",
            "ty\\u0070e",
            "Data",
        ]);
        let value = prop::sample::select(vec![
            r#""evt_1""#,
            r#""event""#,
            r#""agent.session.idle""#,
            r#""agent.session.action_required""#,
            r#""agent.environment.ready""#,
            r#""batch.completed""#,
            "1764399999",
            "-1",
            "1.5",
            "null",
            "[]",
            r#"{"id":"s","environment_type":"self_hosted"}"#,
            r#"{"id":"s","environment_type":"self_hosted","environment_id":"env_1"}"#,
            r#"{"id":"s","required_action":{"type":"environment_connection"}}"#,
            r#"{"id":"s","required_action":{"type":"something_new"},"pad":"x\"y"}"#,
            r#"{"id":"env_1"}"#,
            r#"{"id":7}"#,
            r#"{}"#,
        ]);
        (key, value).prop_map(|(k, v)| format!(r#""{k}":{v}"#))
    }

    proptest! {
        #[test]
        fn one_pass_never_takes_a_body_the_reference_refuses(
            members in prop::collection::vec(member(), 0..8),
            flip in prop::option::of((any::<prop::sample::Index>(), any::<u8>())),
        ) {
            let mut body = format!("{{{}}}", members.join(",")).into_bytes();
            if let Some((at, byte)) = flip {
                let at = at.index(body.len());
                body[at] = byte;
            }
            check(&body);
        }

        #[test]
        fn complete_envelopes_in_any_order_answer_as_the_reference(
            kind in prop::sample::select(vec![
                "agent.session.created", "agent.session.action_required",
                "agent.session.in_progress", "agent.session.idle", "agent.session.failed",
                "agent.environment.ready", "agent.environment.failed",
                "agent.environment.suspended", "agent.environment.expired", "other.kind",
            ]),
            data in prop::sample::select(vec![
                r#"{"id":"s","environment_type":"self_hosted","environment_id":"env_1"}"#,
                r#"{"id":"s","environment_type":"none","connect":{"remote_url":"wss://x"}}"#,
                r#"{"id":"s","required_action":{"type":"environment_connection"},"m":{"p":"q"}}"#,
                r#"{"id":"env_1","extra":[1,{"a":"b"}]}"#,
                r#"{"id":"s"}"#,
                r#"[1,2]"#,
            ]),
            order in Just(vec![0usize, 1, 2, 3, 4]).prop_shuffle(),
        ) {
            let members = [
                r#""id":"evt_1""#.to_owned(),
                r#""object":"event""#.to_owned(),
                format!(r#""type":"{kind}""#),
                r#""created_at":1764399999"#.to_owned(),
                format!(r#""data":{data}"#),
            ];
            let body: Vec<&str> = order.iter().map(|&i| members[i].as_str()).collect();
            check(format!("{{{}}}", body.join(",")).as_bytes());
        }
    }
}
