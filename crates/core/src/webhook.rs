//! Standard Webhooks verification and signing, over the raw body bytes.
//!
//! Scheme (agents-api.md, "Webhook signatures"; <https://www.standardwebhooks.com>):
//! headers `webhook-id`, `webhook-timestamp` (Unix seconds) and `webhook-signature`, a
//! space-separated list of `v1,<base64 HMAC-SHA256>` entries; the signed content is
//! `{webhook-id}.{webhook-timestamp}.{raw body}`. Any one `v1` entry that matches is
//! enough, wherever it sits in the list (several are sent during secret rotation).
//!
//! Guarantees:
//! - the body is verified as bytes, before any JSON parsing;
//! - every candidate is compared in constant time over the full 32-byte tag, so an empty
//!   or truncated signature (`v1,`) never passes;
//! - entries with another version prefix (`v1a,`, `v2,`) never count;
//! - the timestamp must be plain ASCII digits (no sign, fraction, blank or exponent) and lie
//!   within the tolerance in both directions (default 300 s, as the official SDK);
//!   millisecond timestamps therefore fail as "in the future", and overflow cannot panic;
//! - errors say which check failed and never echo the secret or a signature.
//!
//! Secrets: `whsec_<base64>` is base64-decoded and the bytes are the HMAC key. A secret
//! *without* the prefix is used as its raw UTF-8 bytes, exactly as the official `openai`
//! Python SDK does (`webhooks.verify_signature`), so a secret pasted without the prefix
//! verifies the same deliveries there and here. Either way a key shorter than 16 bytes is
//! refused when the verifier is built ([`SecretError::TooShort`]), never per request, and
//! so is any malformed shape that would otherwise be accepted at start-up and then reject
//! every delivery with 401: a `v1,` prefix (a signature entry pasted as the secret),
//! whitespace anywhere, quotes, a comma, anything but visible ASCII.
//!
//! Rotation: a verifier may hold several secrets (the current one first, then the
//! previous ones, [`WebhookVerifier::with_secrets`]); a delivery verifies when a `v1`
//! entry matches any of them, so a secret is rotated without downtime. Signing uses the
//! first (current) secret.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::digest::{CtOutput, Output};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::fmt;

type HmacSha256 = Hmac<Sha256>;

/// Length of an HMAC-SHA256 tag, bytes.
const TAG_BYTES: usize = 32;
/// Stack buffer for decoding one signature entry: room for a 32-byte tag (44 base64
/// characters) with margin; an entry that decodes to more is too long to match anyway.
const TAG_DECODE_BUF: usize = 64;

/// Default timestamp tolerance, in seconds, in both directions (official SDK: 300 s).
pub const DEFAULT_TOLERANCE_SECS: u64 = 300;
/// Largest timestamp tolerance a deployment may configure, seconds: a signed
/// delivery can be replayed for as long as its timestamp is accepted, and the events
/// FIFO queue deduplicates a `webhook-id` for 5 minutes only (SQS
/// `MessageDeduplicationId`), so the window stays within a few dedup periods. A replay
/// inside it only re-triggers a reconcile of the same session (idempotent).
pub const MAX_TOLERANCE_SECS: u64 = 900;
/// Minimum HMAC key length in bytes.
pub const MIN_KEY_BYTES: usize = 16;
/// Header names, lowercase (lookups are case-insensitive).
pub const HEADER_ID: &str = "webhook-id";
/// See [`HEADER_ID`].
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
/// See [`HEADER_ID`].
pub const HEADER_SIGNATURE: &str = "webhook-signature";

/// A webhook signing secret that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The secret is empty (or only `whsec_`).
    #[error("webhook secret is empty")]
    Empty,
    /// The part after `whsec_` is not valid standard base64.
    #[error("webhook secret after the whsec_ prefix is not valid base64")]
    InvalidBase64,
    /// The key has fewer than [`MIN_KEY_BYTES`] bytes.
    #[error("webhook secret key is {len} bytes; at least 16 are required")]
    TooShort {
        /// Key length in bytes.
        len: usize,
    },
    /// The secret starts with a signature version (`v1,`): a `webhook-signature` entry
    /// was pasted instead of the secret.
    #[error(
        "webhook secret starts with a signature version prefix (v1,): paste the whsec_... secret, not a signature"
    )]
    VersionPrefix,
    /// The secret holds whitespace (leading, trailing or inside: a pasted newline, say).
    #[error("webhook secret contains whitespace (at its start, end or inside)")]
    Whitespace,
    /// The secret is wrapped in or holds quote characters.
    #[error("webhook secret contains quote characters; store the bare value")]
    Quoted,
    /// The secret holds a comma (a list, or a signature entry).
    #[error("webhook secret contains a comma; give each secret on its own")]
    Comma,
    /// The secret holds a character outside visible ASCII.
    #[error("webhook secret contains characters outside visible ASCII")]
    NotVisibleAscii,
    /// No secret was given.
    #[error("no webhook secret given")]
    NoSecrets,
    /// One secret of several is unusable.
    #[error("webhook secret {position} of {count}: {problem}")]
    InList {
        /// 1-based position in the list (1 = the current secret).
        position: usize,
        /// How many secrets were given.
        count: usize,
        /// What is wrong with it.
        problem: Box<SecretError>,
    },
}

/// Refuses the malformed shapes of a secret (see the module docs); never echoes it.
fn check_shape(secret: &str) -> Result<(), SecretError> {
    if secret.is_empty() {
        return Err(SecretError::Empty);
    }
    let lower = secret.trim_start().to_ascii_lowercase();
    if lower.starts_with("v1,") || lower.starts_with("v1a,") || lower.starts_with("v2,") {
        return Err(SecretError::VersionPrefix);
    }
    if secret.chars().any(char::is_whitespace) {
        return Err(SecretError::Whitespace);
    }
    if secret.contains(['"', '\'', '`']) {
        return Err(SecretError::Quoted);
    }
    if secret.contains(',') {
        return Err(SecretError::Comma);
    }
    if !secret.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(SecretError::NotVisibleAscii);
    }
    Ok(())
}

/// Which check a delivery failed. None of them echoes the secret or a signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// A required header is absent.
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    /// A required header appears more than once.
    #[error("header {0} appears more than once")]
    DuplicateHeader(&'static str),
    /// A header is empty or not visible ASCII.
    #[error("header {0} is empty or not visible ASCII")]
    InvalidHeader(&'static str),
    /// `webhook-timestamp` is not plain integer seconds.
    #[error("webhook-timestamp is not integer Unix seconds")]
    InvalidTimestamp,
    /// The timestamp is older than the tolerance.
    #[error("webhook-timestamp is {age_secs} s old (tolerance {tolerance_secs} s)")]
    TimestampTooOld {
        /// How old, in seconds.
        age_secs: u64,
        /// The tolerance in force, in seconds.
        tolerance_secs: u64,
    },
    /// The timestamp is further in the future than the tolerance.
    #[error("webhook-timestamp is {ahead_secs} s in the future (tolerance {tolerance_secs} s)")]
    TimestampInFuture {
        /// How far ahead, in seconds (saturated at `u64::MAX`).
        ahead_secs: u64,
        /// The tolerance in force, in seconds.
        tolerance_secs: u64,
    },
    /// `webhook-signature` holds no `v1,` entry at all.
    #[error("webhook-signature has no v1 entry")]
    NoV1Signature,
    /// No `v1` entry matches the expected signature.
    #[error("no webhook-signature entry matches")]
    SignatureMismatch,
}

impl VerifyError {
    /// The HTTP status a webhook endpoint answers with: 400 for a malformed or incomplete
    /// request (missing, duplicate or invalid headers), 401 for a request that fails
    /// authentication (bad timestamp window or signature). Never 5xx.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::MissingHeader(_) | Self::DuplicateHeader(_) | Self::InvalidHeader(_) => 400,
            _ => 401,
        }
    }
}

/// What a verified delivery proved: its id (the de-duplication key, the same on every
/// retry) and its timestamp in Unix seconds. The body is the caller's, unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedDelivery {
    /// The `webhook-id` header.
    pub webhook_id: String,
    /// The `webhook-timestamp` header, Unix seconds.
    pub timestamp: u64,
}

/// Verifies and signs Standard Webhooks deliveries with one or more secrets (the current
/// one first, then the previous ones during a rotation).
///
/// Build it once per process (cold start) with [`WebhookVerifier::new`] or
/// [`WebhookVerifier::with_secrets`]; `Debug` never prints a key.
#[derive(Clone)]
pub struct WebhookVerifier {
    /// One keyed MAC per secret; the first is the current one (signing).
    macs: Vec<HmacSha256>,
    tolerance_secs: u64,
}

impl fmt::Debug for WebhookVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookVerifier")
            .field("keys", &format_args!("<{} redacted>", self.macs.len()))
            .field("tolerance_secs", &self.tolerance_secs)
            .finish()
    }
}

impl WebhookVerifier {
    /// Builds a verifier from a secret (`whsec_<base64>`, or raw bytes without the prefix;
    /// see the module docs), with the default tolerance of 300 s.
    ///
    /// # Errors
    /// [`SecretError`] for an empty secret, a malformed shape (a `v1,` prefix, whitespace,
    /// quotes, a comma, non-visible ASCII), invalid base64 after `whsec_`, or a key
    /// shorter than 16 bytes.
    pub fn new(secret: &str) -> Result<Self, SecretError> {
        Ok(Self {
            macs: vec![Self::mac(secret)?],
            tolerance_secs: DEFAULT_TOLERANCE_SECS,
        })
    }

    /// Builds a verifier that accepts a delivery signed with any of `secrets` (the current
    /// secret first, then the previous ones: a rotation without downtime), with the
    /// default tolerance of 300 s. [`WebhookVerifier::sign`] uses the first.
    ///
    /// # Errors
    /// [`SecretError::NoSecrets`] for an empty list; otherwise
    /// [`SecretError::InList`] naming the position of the first unusable secret and what
    /// is wrong with it (as [`WebhookVerifier::new`]), never its value.
    pub fn with_secrets<S: AsRef<str>>(secrets: &[S]) -> Result<Self, SecretError> {
        if secrets.is_empty() {
            return Err(SecretError::NoSecrets);
        }
        let count = secrets.len();
        let macs = secrets
            .iter()
            .enumerate()
            .map(|(i, s)| {
                Self::mac(s.as_ref()).map_err(|problem| SecretError::InList {
                    position: i + 1,
                    count,
                    problem: Box::new(problem),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            macs,
            tolerance_secs: DEFAULT_TOLERANCE_SECS,
        })
    }

    /// How many secrets this verifier accepts.
    pub fn secret_count(&self) -> usize {
        self.macs.len()
    }

    fn mac(secret: &str) -> Result<HmacSha256, SecretError> {
        check_shape(secret)?;
        let key = match secret.strip_prefix("whsec_") {
            Some("") => return Err(SecretError::Empty),
            Some(b64) => BASE64.decode(b64).map_err(|_| SecretError::InvalidBase64)?,
            None if secret.is_empty() => return Err(SecretError::Empty),
            None => secret.as_bytes().to_vec(),
        };
        if key.len() < MIN_KEY_BYTES {
            return Err(SecretError::TooShort { len: key.len() });
        }
        HmacSha256::new_from_slice(&key).map_err(|_| SecretError::Empty)
    }

    /// Sets the timestamp tolerance in seconds (both directions).
    pub fn with_tolerance_secs(mut self, tolerance_secs: u64) -> Self {
        self.tolerance_secs = tolerance_secs;
        self
    }

    /// The tolerance in force, in seconds.
    pub fn tolerance_secs(&self) -> u64 {
        self.tolerance_secs
    }

    /// Verifies a delivery given all request headers (names matched case-insensitively)
    /// and the raw body bytes, at `now` (Unix seconds).
    ///
    /// # Errors
    /// The first failed check, in this order: headers present, unique and visible ASCII;
    /// timestamp format; timestamp window; at least one `v1` entry; a matching entry.
    pub fn verify<'a, I>(
        &self,
        headers: I,
        body: &[u8],
        now: u64,
    ) -> Result<VerifiedDelivery, VerifyError>
    where
        I: IntoIterator<Item = (&'a str, &'a [u8])>,
    {
        let mut found: [Option<&[u8]>; 3] = [None; 3];
        let names = [HEADER_ID, HEADER_TIMESTAMP, HEADER_SIGNATURE];
        for (name, value) in headers {
            for (slot, wanted) in found.iter_mut().zip(names) {
                if name.eq_ignore_ascii_case(wanted) {
                    if slot.is_some() {
                        return Err(VerifyError::DuplicateHeader(wanted));
                    }
                    *slot = Some(value);
                }
            }
        }
        let get = |i: usize| -> Result<&str, VerifyError> {
            let raw = found[i].ok_or(VerifyError::MissingHeader(names[i]))?;
            let text = std::str::from_utf8(raw)
                .ok()
                .map(str::trim)
                .filter(|t| !t.is_empty() && is_visible_ascii(t.as_bytes()))
                .ok_or(VerifyError::InvalidHeader(names[i]))?;
            Ok(text)
        };
        let (id, ts, sig) = (get(0)?, get(1)?, get(2)?);
        self.verify_parts(id, ts, sig, body, now)
    }

    /// Verifies a delivery from the three header values and the raw body bytes, at `now`
    /// (Unix seconds). See [`WebhookVerifier::verify`].
    ///
    /// # Errors
    /// As [`WebhookVerifier::verify`], minus the header presence checks.
    pub fn verify_parts(
        &self,
        webhook_id: &str,
        timestamp: &str,
        signature: &str,
        body: &[u8],
        now: u64,
    ) -> Result<VerifiedDelivery, VerifyError> {
        if webhook_id.is_empty() {
            return Err(VerifyError::InvalidHeader(HEADER_ID));
        }
        let ts = parse_timestamp(timestamp)?;
        self.check_window(ts, now)?;
        // The cheap pre-check first: decode every `v1,` entry; without one
        // that decodes to a 32-byte tag nothing can match, so the request is refused
        // before any HMAC over the (up to 1 MiB) body is computed.
        let mut saw_v1 = false;
        let mut candidates: Vec<CtOutput<HmacSha256>> = Vec::new();
        for entry in signature.split(' ').filter(|e| !e.is_empty()) {
            let Some(("v1", b64)) = entry.split_once(',') else {
                continue;
            };
            saw_v1 = true;
            // Decoding failures (including "longer than the buffer") and any length other
            // than 32 bytes just mean "this entry does not match".
            let mut candidate = [0u8; TAG_DECODE_BUF];
            if let Ok(TAG_BYTES) = BASE64.decode_slice(b64, &mut candidate) {
                let mut tag = Output::<HmacSha256>::default();
                tag.copy_from_slice(&candidate[..TAG_BYTES]);
                candidates.push(CtOutput::new(tag));
            }
        }
        if candidates.is_empty() {
            return Err(if saw_v1 {
                VerifyError::SignatureMismatch
            } else {
                VerifyError::NoV1Signature
            });
        }
        // Each secret's tag is finalized once, however many entries there are. Every
        // well-formed entry is compared with every tag (no early exit) so timing does not
        // reveal which one matched; the comparison itself is `CtOutput`'s constant-time
        // one over all 32 bytes.
        let mut matched = false;
        for mac in &self.macs {
            let expected = Self::tag(mac, webhook_id, timestamp, body).finalize();
            for c in &candidates {
                matched |= expected == *c;
            }
        }
        if matched {
            Ok(VerifiedDelivery {
                webhook_id: webhook_id.to_owned(),
                timestamp: ts,
            })
        } else {
            Err(VerifyError::SignatureMismatch)
        }
    }

    /// Signs a delivery: returns the `webhook-signature` value `v1,<base64>` for
    /// `webhook_id`, `timestamp` (Unix seconds) and the raw body. For tests, the simulator
    /// and `sandboxctl sign`.
    pub fn sign(&self, webhook_id: &str, timestamp: u64, body: &[u8]) -> String {
        let tag = Self::tag(&self.macs[0], webhook_id, &timestamp.to_string(), body)
            .finalize()
            .into_bytes();
        format!("v1,{}", BASE64.encode(tag))
    }

    fn tag(mac: &HmacSha256, webhook_id: &str, timestamp: &str, body: &[u8]) -> HmacSha256 {
        #[cfg(test)]
        tests::TAGS.with(|n| n.set(n.get() + 1));
        let mut mac = mac.clone();
        mac.update(webhook_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }

    fn check_window(&self, ts: u64, now: u64) -> Result<(), VerifyError> {
        let tolerance_secs = self.tolerance_secs;
        if ts < now && now - ts > tolerance_secs {
            return Err(VerifyError::TimestampTooOld {
                age_secs: now - ts,
                tolerance_secs,
            });
        }
        if ts > now && ts - now > tolerance_secs {
            return Err(VerifyError::TimestampInFuture {
                ahead_secs: ts - now,
                tolerance_secs,
            });
        }
        Ok(())
    }
}

/// Plain ASCII digits only: `u64::from_str` alone would accept a leading `+`.
fn parse_timestamp(s: &str) -> Result<u64, VerifyError> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(VerifyError::InvalidTimestamp);
    }
    s.parse::<u64>().map_err(|_| VerifyError::InvalidTimestamp)
}

/// Every byte is visible ASCII or a space (0x20..=0x7e). Without an early exit: header
/// values are short and valid ones are read to the end anyway.
fn is_visible_ascii(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .fold(true, |ok, &b| ok & (0x20..0x7f).contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        /// HMACs computed on this thread (counted in [`WebhookVerifier::tag`]).
        pub(super) static TAGS: Cell<usize> = const { Cell::new(0) };
    }

    fn tags() -> usize {
        TAGS.with(Cell::get)
    }

    #[test]
    fn no_well_formed_v1_entry_is_refused_before_any_hmac() {
        let v = WebhookVerifier::with_secrets(&[
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_b3RoZXItc2VjcmV0LWZvci1yb3RhdGlvbg==",
        ])
        .unwrap();
        let body = vec![b'x'; 1 << 20];
        let now = 1_800_000_000;
        let ts = now.to_string();
        for (sig, want) in [
            ("", VerifyError::NoV1Signature),
            ("v2,abc v1a,xyz", VerifyError::NoV1Signature),
            ("v1,", VerifyError::SignatureMismatch),
            ("v1,not-base64!", VerifyError::SignatureMismatch),
            ("v1,AAAA", VerifyError::SignatureMismatch), // 3 bytes, not 32
        ] {
            let before = tags();
            assert_eq!(
                v.verify_parts("msg_1", &ts, sig, &body, now).unwrap_err(),
                want
            );
            assert_eq!(tags(), before, "{sig:?}: no HMAC computed");
        }
        // A well-formed entry costs one HMAC per secret, and a right one passes.
        let before = tags();
        let wrong = format!("v1,{}", BASE64.encode([0u8; 32]));
        assert_eq!(
            v.verify_parts("msg_1", &ts, &wrong, &body, now)
                .unwrap_err(),
            VerifyError::SignatureMismatch
        );
        assert_eq!(tags(), before + 2);
        let right = v.sign("msg_1", now, &body);
        let both = format!("{wrong} {right}");
        assert!(v.verify_parts("msg_1", &ts, &both, &body, now).is_ok());
    }
}
