//! `sandboxctl sign`: the `webhook-signature` header value for a body on stdin.

use crate::secret_from_env::{self, SecretEnvError};
use clap::Args;
use std::io::{self, Read, Write};
use std::process::ExitCode;

/// Arguments of `sandboxctl sign`.
#[derive(Debug, Args)]
pub struct SignArgs {
    /// The `webhook-id` header value.
    #[arg(long)]
    pub webhook_id: String,
    /// The `webhook-timestamp` header value, Unix seconds.
    #[arg(long, value_name = "SECS")]
    pub timestamp: u64,
    /// Name of the environment variable that holds the secret.
    #[arg(long, value_name = "VAR", default_value = secret_from_env::DEFAULT_SECRET_ENV)]
    pub secret_env: String,
}

/// Why signing failed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The secret is missing or unusable.
    #[error(transparent)]
    Secret(#[from] SecretEnvError),
    /// Reading stdin or writing stdout failed.
    #[error("i/o failed")]
    Io(#[from] io::Error),
}

/// Reads the raw body from `input` (every byte, unchanged) and writes the signature line.
pub fn run(
    args: &SignArgs,
    mut input: impl Read,
    out: &mut impl Write,
) -> Result<ExitCode, SignError> {
    let verifier = secret_from_env::verifier_from_env(&args.secret_env)?;
    let mut body = Vec::new();
    input.read_to_end(&mut body)?;
    writeln!(
        out,
        "{}",
        verifier.sign(&args.webhook_id, args.timestamp, &body)
    )?;
    Ok(ExitCode::SUCCESS)
}
