//! The webhook secret, read from an environment variable and turned into a verifier.
//!
//! The secret is never taken from a flag (flags show in process lists) and no error here
//! ever contains it: only the variable's name.

use sandbox_core::webhook::{SecretError, WebhookVerifier};
use std::env::{self, VarError};

/// Default name of the variable that holds the secret.
pub const DEFAULT_SECRET_ENV: &str = "WEBHOOK_SECRET";

/// The secret variable is unset or unusable. Messages name the variable, never its value.
#[derive(Debug, thiserror::Error)]
pub enum SecretEnvError {
    /// The variable is not set.
    #[error("environment variable {var} is not set (it must hold the webhook secret)")]
    Missing {
        /// Variable name.
        var: String,
    },
    /// The variable is not valid UTF-8.
    #[error("environment variable {var} is not valid UTF-8")]
    NotUnicode {
        /// Variable name.
        var: String,
    },
    /// The secret is empty, bad base64 after `whsec_`, or too short.
    #[error("environment variable {var} does not hold a usable webhook secret")]
    Unusable {
        /// Variable name.
        var: String,
        /// What is wrong with it (never the value).
        #[source]
        source: SecretError,
    },
}

/// Builds a verifier from the secret in `var` (`whsec_<base64>`, or raw UTF-8 bytes
/// without the prefix, as the official `openai` SDK does).
pub fn verifier_from_env(var: &str) -> Result<WebhookVerifier, SecretEnvError> {
    let secret = env::var(var).map_err(|e| match e {
        VarError::NotPresent => SecretEnvError::Missing { var: var.into() },
        VarError::NotUnicode(_) => SecretEnvError::NotUnicode { var: var.into() },
    })?;
    WebhookVerifier::new(&secret).map_err(|source| SecretEnvError::Unusable {
        var: var.into(),
        source,
    })
}
