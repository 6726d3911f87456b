//! Reading one secret from AWS Secrets Manager (the webhook signing secret, the
//! application's API key) without ever printing it.
//!
//! Errors name the secret by its *name* (from the ARN: the part after `:secret:`, without
//! the 6-character random suffix Secrets Manager appends), never by its value.

use crate::sdk_error::{code, port_error};
use aws_sdk_secretsmanager::Client;
use std::fmt;

/// A secret value. `Debug` prints `SecretString(<redacted>)`; there is no `Display`, so it
/// never lands in a log or an error by accident. Read it with [`SecretString::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(String);

impl SecretString {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value. Pass it straight to where it is used; do not log or store it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretString(<redacted>)")
    }
}

/// Why a secret could not be read. Holds the secret's name, never its value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Secrets Manager does not know the secret (`ResourceNotFoundException`).
    #[error("secret {name} not found")]
    NotFound {
        /// The secret's name.
        name: String,
    },
    /// The secret has no string value (binary secret) or an empty one.
    #[error("secret {name} has no string value")]
    NoString {
        /// The secret's name.
        name: String,
    },
    /// The call failed (access denied, decryption failure, throttling, network).
    #[error("secret {name} could not be read: {message}")]
    Read {
        /// The secret's name.
        name: String,
        /// The service's error code and message (never the value).
        message: String,
        /// Whether retrying later may succeed (throttling, 5xx, timeouts).
        retryable: bool,
    },
}

/// The secret's name inside `arn_or_name`: `arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-AbCdEf`
/// gives `NAME`; anything else is taken as the name itself.
pub fn secret_name(arn_or_name: &str) -> &str {
    let Some((_, rest)) = arn_or_name
        .strip_prefix("arn:")
        .and_then(|r| r.split_once(":secret:"))
    else {
        return arn_or_name;
    };
    // A full ARN ends in `-` and 6 random characters (Secrets Manager User Guide).
    match rest.rsplit_once('-') {
        Some((name, suffix))
            if !name.is_empty()
                && suffix.len() == 6
                && suffix.bytes().all(|b| b.is_ascii_alphanumeric()) =>
        {
            name
        }
        _ => rest,
    }
}

/// Reads the current (`AWSCURRENT`) string value of the secret `arn` (an ARN or a name).
///
/// # Errors
/// [`SecretError`] naming the secret (never its value): not found, no string value, or a
/// failed call.
pub async fn read_secret(client: &Client, arn: &str) -> Result<SecretString, SecretError> {
    let name = secret_name(arn).to_owned();
    let out = match client.get_secret_value().secret_id(arn).send().await {
        Ok(out) => out,
        Err(e) if code(&e) == Some("ResourceNotFoundException") => {
            return Err(SecretError::NotFound { name });
        }
        Err(e) => {
            let err = port_error("secrets", "read", &e);
            return Err(SecretError::Read {
                name,
                message: err.message,
                retryable: err.retryable,
            });
        }
    };
    match out.secret_string() {
        Some(v) if !v.is_empty() => Ok(SecretString::new(v)),
        _ => Err(SecretError::NoString { name }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_arns_without_the_random_suffix() {
        assert_eq!(
            secret_name("arn:aws:secretsmanager:us-east-1:123456789012:secret:prod/webhook-AbC123"),
            "prod/webhook"
        );
        assert_eq!(
            secret_name("arn:aws:secretsmanager:us-east-1:123456789012:secret:plain"),
            "plain"
        );
        assert_eq!(secret_name("just-a-name"), "just-a-name");
    }

    #[test]
    fn debug_is_redacted() {
        let s = SecretString::new("hunter2-very-secret");
        assert_eq!(format!("{s:?}"), "SecretString(<redacted>)");
        assert_eq!(s.expose(), "hunter2-very-secret");
    }
}
