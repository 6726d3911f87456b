//! `sandboxctl`: operator tool for sandbox-lifecycle.
//!
//! - `sign`: the `webhook-signature` value of a body read from stdin;
//! - `verify`: checks a delivery (body on stdin) the way the webhook endpoint does;
//! - `decode`: parses an Agents API object from stdin with the `sandbox-core` models and
//!   prints it re-serialized.
//!
//! The webhook secret is read only from an environment variable (never a flag: flags show
//! in process lists) and is never printed.
//!
//! Exit codes: 0 success; 1 a delivery failed verification; 2 unusable input, arguments or
//! configuration (malformed JSON, missing or invalid secret, I/O failure).
#![deny(clippy::all)]
#![warn(missing_docs)]

mod decode_object;
mod secret_from_env;
mod sign_delivery;
mod verify_delivery;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use std::io::{self, Write as _};
use std::process::ExitCode;

/// Operator tool for sandbox-lifecycle.
#[derive(Debug, Parser)]
#[command(name = "sandboxctl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the `webhook-signature` value for the raw body read from stdin.
    Sign(sign_delivery::SignArgs),
    /// Verify a delivery whose raw body is read from stdin; prints `ok` or the error.
    Verify(verify_delivery::VerifyArgs),
    /// Parse an Agents API object from stdin and print it re-serialized (compact JSON).
    Decode(decode_object::DecodeArgs),
}

/// Exit code for unusable input, arguments or configuration (as clap's usage errors).
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("sandboxctl: {err:#}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let stdin = io::stdin().lock();
    let mut stdout = io::stdout().lock();
    let code = match cli.command {
        Command::Sign(args) => sign_delivery::run(&args, stdin, &mut stdout).context("sign")?,
        Command::Verify(args) => {
            verify_delivery::run(&args, stdin, &mut stdout).context("verify")?
        }
        Command::Decode(args) => decode_object::run(&args, stdin, &mut stdout).context("decode")?,
    };
    stdout.flush().context("writing stdout")?;
    Ok(code)
}
