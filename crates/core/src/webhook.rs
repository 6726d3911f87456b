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
//! refused when the verifier is built ([`SecretError::TooShort`]), never per request.

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

/// Verifies and signs Standard Webhooks deliveries with one secret.
///
/// Build it once per process (cold start) with [`WebhookVerifier::new`]; `Debug` never
/// prints the key.
#[derive(Clone)]
pub struct WebhookVerifier {
    mac: HmacSha256,
    tolerance_secs: u64,
}

impl fmt::Debug for WebhookVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookVerifier")
            .field("key", &"<redacted>")
            .field("tolerance_secs", &self.tolerance_secs)
            .finish()
    }
}

impl WebhookVerifier {
    /// Builds a verifier from a secret (`whsec_<base64>`, or raw bytes without the prefix;
    /// see the module docs), with the default tolerance of 300 s.
    ///
    /// # Errors
    /// [`SecretError`] for an empty secret, invalid base64 after `whsec_`, or a key
    /// shorter than 16 bytes.
    pub fn new(secret: &str) -> Result<Self, SecretError> {
        let secret = secret.trim();
        let key = match secret.strip_prefix("whsec_") {
            Some("") => return Err(SecretError::Empty),
            Some(b64) => BASE64.decode(b64).map_err(|_| SecretError::InvalidBase64)?,
            None if secret.is_empty() => return Err(SecretError::Empty),
            None => secret.as_bytes().to_vec(),
        };
        if key.len() < MIN_KEY_BYTES {
            return Err(SecretError::TooShort { len: key.len() });
        }
        let mac = HmacSha256::new_from_slice(&key).map_err(|_| SecretError::Empty)?;
        Ok(Self {
            mac,
            tolerance_secs: DEFAULT_TOLERANCE_SECS,
        })
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
        // The tag is finalized once, however many entries there are.
        let expected = self.tag(webhook_id, timestamp, body).finalize();
        let mut saw_v1 = false;
        let mut matched = false;
        for entry in signature.split(' ').filter(|e| !e.is_empty()) {
            let Some(("v1", b64)) = entry.split_once(',') else {
                continue;
            };
            saw_v1 = true;
            // Decoding failures (including "longer than the buffer") and any length other
            // than 32 bytes just mean "this entry does not match". Every v1 entry is
            // checked (no early exit) so timing does not reveal which one matched; the
            // comparison itself is `CtOutput`'s constant-time one over all 32 bytes.
            let mut candidate = [0u8; TAG_DECODE_BUF];
            if let Ok(TAG_BYTES) = BASE64.decode_slice(b64, &mut candidate) {
                let mut tag = Output::<HmacSha256>::default();
                tag.copy_from_slice(&candidate[..TAG_BYTES]);
                matched |= expected == CtOutput::new(tag);
            }
        }
        if matched {
            Ok(VerifiedDelivery {
                webhook_id: webhook_id.to_owned(),
                timestamp: ts,
            })
        } else if saw_v1 {
            Err(VerifyError::SignatureMismatch)
        } else {
            Err(VerifyError::NoV1Signature)
        }
    }

    /// Signs a delivery: returns the `webhook-signature` value `v1,<base64>` for
    /// `webhook_id`, `timestamp` (Unix seconds) and the raw body. For tests, the simulator
    /// and `sandboxctl sign`.
    pub fn sign(&self, webhook_id: &str, timestamp: u64, body: &[u8]) -> String {
        let tag = self
            .tag(webhook_id, &timestamp.to_string(), body)
            .finalize()
            .into_bytes();
        format!("v1,{}", BASE64.encode(tag))
    }

    fn tag(&self, webhook_id: &str, timestamp: &str, body: &[u8]) -> HmacSha256 {
        let mut mac = self.mac.clone();
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
