//! `sandboxctl verify`: checks a delivery exactly as the webhook endpoint does.
//!
//! The three header values are given as flags and checked by
//! [`WebhookVerifier::verify`](sandbox_core::webhook::WebhookVerifier::verify) with every
//! header rule (non-empty, visible ASCII, timestamp format and window, `v1` entries).

use crate::secret_from_env::{self, SecretEnvError};
use clap::Args;
use sandbox_core::webhook::{
    DEFAULT_TOLERANCE_SECS, HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP, VerifyError,
};
use std::io::{self, Read, Write};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

/// Arguments of `sandboxctl verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The `webhook-id` header value.
    #[arg(long)]
    pub webhook_id: String,
    /// The `webhook-timestamp` header value as received (checked by the verifier, so a
    /// malformed value is reported as a verification failure).
    #[arg(long, value_name = "SECS")]
    pub timestamp: String,
    /// The `webhook-signature` header value (`v1,<base64>` entries separated by spaces).
    #[arg(long, value_name = "SIG")]
    pub signature: String,
    /// The current time, Unix seconds (default: the system clock). Fixtures with fixed
    /// timestamps pass their own timestamp here.
    #[arg(long, value_name = "SECS")]
    pub now: Option<u64>,
    /// Accepted timestamp distance from `now`, in seconds, in both directions.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_TOLERANCE_SECS)]
    pub tolerance: u64,
    /// Name of the environment variable that holds the secret.
    #[arg(long, value_name = "VAR", default_value = secret_from_env::DEFAULT_SECRET_ENV)]
    pub secret_env: String,
}

/// Why verification could not be carried out (a rejected delivery is not an error).
#[derive(Debug, thiserror::Error)]
pub enum VerifyRunError {
    /// The secret is missing or unusable.
    #[error(transparent)]
    Secret(#[from] SecretEnvError),
    /// The system clock is before 1970.
    #[error("system clock is before the Unix epoch")]
    Clock,
    /// Reading stdin or writing stdout failed.
    #[error("i/o failed")]
    Io(#[from] io::Error),
}

/// Reads the raw body from `input`, verifies it and writes `ok` (exit 0) or the typed
/// rejection `Variant: message` (exit 1).
pub fn run(
    args: &VerifyArgs,
    mut input: impl Read,
    out: &mut impl Write,
) -> Result<ExitCode, VerifyRunError> {
    let verifier =
        secret_from_env::verifier_from_env(&args.secret_env)?.with_tolerance_secs(args.tolerance);
    let now = match args.now {
        Some(now) => now,
        None => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| VerifyRunError::Clock)?
            .as_secs(),
    };
    let mut body = Vec::new();
    input.read_to_end(&mut body)?;
    let headers = [
        (HEADER_ID, args.webhook_id.as_bytes()),
        (HEADER_TIMESTAMP, args.timestamp.as_bytes()),
        (HEADER_SIGNATURE, args.signature.as_bytes()),
    ];
    match verifier.verify(headers, &body, now) {
        Ok(_) => {
            writeln!(out, "ok")?;
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            writeln!(out, "{}: {err}", variant_name(&err))?;
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The variant name of a [`VerifyError`], e.g. `SignatureMismatch`.
fn variant_name(err: &VerifyError) -> &'static str {
    match err {
        VerifyError::MissingHeader(_) => "MissingHeader",
        VerifyError::DuplicateHeader(_) => "DuplicateHeader",
        VerifyError::InvalidHeader(_) => "InvalidHeader",
        VerifyError::InvalidTimestamp => "InvalidTimestamp",
        VerifyError::TimestampTooOld { .. } => "TimestampTooOld",
        VerifyError::TimestampInFuture { .. } => "TimestampInFuture",
        VerifyError::NoV1Signature => "NoV1Signature",
        VerifyError::SignatureMismatch => "SignatureMismatch",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_names_match_debug_output() {
        let all = [
            VerifyError::MissingHeader(HEADER_ID),
            VerifyError::DuplicateHeader(HEADER_ID),
            VerifyError::InvalidHeader(HEADER_ID),
            VerifyError::InvalidTimestamp,
            VerifyError::TimestampTooOld {
                age_secs: 1,
                tolerance_secs: 0,
            },
            VerifyError::TimestampInFuture {
                ahead_secs: 1,
                tolerance_secs: 0,
            },
            VerifyError::NoV1Signature,
            VerifyError::SignatureMismatch,
        ];
        for err in all {
            assert!(
                format!("{err:?}").starts_with(variant_name(&err)),
                "{err:?}"
            );
        }
    }
}
