//! The proof that an operator forced a job: an HMAC-SHA256 tag, with a key only operators
//! and the worker hold, over the job's kind, session, enqueue time and trigger.
//!
//! Why it exists: the events queue is written by the webhook function, the sweeper, the
//! worker's own hand-offs, operators and applications (`timeout_reported`, `events/jobs/`).
//! A queue message is a hint, never an instruction (docs/ARCHITECTURE.md principle 1), but
//! `close`, `resolve` and `timeout_reported` for a session *no record names* would act on
//! the message's word alone (a close deletes the session with the application's key). The
//! worker therefore refuses those three for an unrecorded session unless the job carries
//! a tag this module verifies (docs/SECURITY.md).
//!
//! Why a MAC and not a separate queue: it works the same on both backends (the local queue
//! is a table of the same SQLite file every local writer can open) and needs no second
//! event source. The key is the operator key: a Secrets Manager secret only the worker and
//! operator roles may read on AWS, `<data-dir>/operator.key` (mode 0600) locally.
//!
//! Shapes: the key is any byte string of at least [`MIN_KEY_BYTES`]; the tag is standard
//! base64 (with padding) of the 32-byte HMAC-SHA256 output; the signed text is
//! [`signed_text`].

use crate::ids::SessionId;
use crate::observed::Trigger;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::fmt;

type HmacSha256 = Hmac<Sha256>;

/// Shortest accepted key, bytes (the HMAC-SHA256 output size: RFC 2104 section 3
/// recommends a key no shorter than the hash output).
pub const MIN_KEY_BYTES: usize = 32;

/// The operator key. Its `Debug` never prints the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct OperatorKey(Vec<u8>);

impl fmt::Debug for OperatorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OperatorKey({} bytes)", self.0.len())
    }
}

/// A key shorter than [`MIN_KEY_BYTES`] (after trimming surrounding whitespace).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the operator key has {0} bytes; at least 32 are required")]
pub struct ShortKey(pub usize);

impl OperatorKey {
    /// The key from its stored text (a file's or a secret's value), surrounding
    /// whitespace (a trailing newline) trimmed.
    ///
    /// # Errors
    /// [`ShortKey`] when fewer than [`MIN_KEY_BYTES`] bytes remain.
    pub fn from_text(text: &str) -> Result<Self, ShortKey> {
        let t = text.trim().as_bytes();
        if t.len() < MIN_KEY_BYTES {
            return Err(ShortKey(t.len()));
        }
        Ok(Self(t.to_vec()))
    }

    fn mac(
        &self,
        kind: &str,
        session: &SessionId,
        enqueued_at: u64,
        trigger: &Trigger,
    ) -> HmacSha256 {
        // A key of any length is accepted by HMAC (RFC 2104); the length was checked above.
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(signed_text(kind, session, enqueued_at, trigger).as_bytes());
        mac
    }

    /// The tag for a job: base64 of HMAC-SHA256(key, [`signed_text`]).
    pub fn sign(&self, session: &SessionId, enqueued_at: u64, trigger: &Trigger) -> String {
        let kind = trigger_kind(trigger);
        BASE64.encode(
            self.mac(&kind, session, enqueued_at, trigger)
                .finalize()
                .into_bytes(),
        )
    }

    /// Whether `tag` is this key's tag for the job (constant-time comparison).
    pub fn verify(
        &self,
        session: &SessionId,
        enqueued_at: u64,
        trigger: &Trigger,
        tag: &str,
    ) -> bool {
        let Ok(bytes) = BASE64.decode(tag.trim()) else {
            return false;
        };
        let kind = trigger_kind(trigger);
        self.mac(&kind, session, enqueued_at, trigger)
            .verify_slice(&bytes)
            .is_ok()
    }
}

/// The trigger's `kind` as the job's JSON spells it (`close`, `resolve`, ...).
pub fn trigger_kind(trigger: &Trigger) -> String {
    serde_json::to_value(trigger)
        .ok()
        .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_owned))
        .unwrap_or_default()
}

/// Whether a job of this trigger, for a session no record names, needs an operator's
/// proof: `close`, `resolve` and `timeout_reported` (the three jobs the CLI guards with
/// `--force`, and the three that act on a session the deployment never handled).
pub fn needs_proof_when_unrecorded(trigger: &Trigger) -> bool {
    matches!(
        trigger,
        Trigger::Close | Trigger::Resolve { .. } | Trigger::TimeoutReported { .. }
    )
}

/// The signed text: `sandbox-lifecycle operator job v1`, the kind, the session id, the
/// enqueue time (Unix seconds) and the trigger's JSON, one per line. Binding the trigger
/// makes a tag for one `resolve` answer useless for another; binding the session and
/// the kind makes a tag useless for any other session or job.
pub fn signed_text(kind: &str, session: &SessionId, enqueued_at: u64, trigger: &Trigger) -> String {
    let trigger_json = serde_json::to_string(trigger).unwrap_or_default();
    format!(
        "sandbox-lifecycle operator job v1\n{kind}\n{}\n{enqueued_at}\n{trigger_json}",
        session.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(c: char) -> OperatorKey {
        OperatorKey::from_text(&c.to_string().repeat(40)).unwrap()
    }

    #[test]
    fn a_tag_verifies_only_for_its_key_session_time_and_trigger() {
        let s = SessionId::new("sess_a");
        let tag = key('k').sign(&s, 10, &Trigger::Close);
        assert!(key('k').verify(&s, 10, &Trigger::Close, &tag));
        assert!(!key('j').verify(&s, 10, &Trigger::Close, &tag));
        assert!(!key('k').verify(&SessionId::new("sess_b"), 10, &Trigger::Close, &tag));
        assert!(!key('k').verify(&s, 11, &Trigger::Close, &tag));
        let timeout = Trigger::TimeoutReported {
            turn_id: None,
            submitted_at: 10,
        };
        assert!(!key('k').verify(&s, 10, &timeout, &tag));
        assert!(!key('k').verify(&s, 10, &Trigger::Close, "not base64!"));
        assert!(!key('k').verify(&s, 10, &Trigger::Close, ""));
    }

    #[test]
    fn a_short_key_is_refused_and_debug_hides_the_key() {
        assert_eq!(OperatorKey::from_text(" short \n"), Err(ShortKey(5)));
        let k = key('x');
        assert_eq!(format!("{k:?}"), "OperatorKey(40 bytes)");
        assert_eq!(trigger_kind(&Trigger::Close), "close");
        assert!(needs_proof_when_unrecorded(&Trigger::Close));
        assert!(!needs_proof_when_unrecorded(&Trigger::Sweep));
    }
}
