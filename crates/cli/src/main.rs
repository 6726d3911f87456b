//! `sandboxctl`: operator tool for sandbox-lifecycle.
//!
//! - `sign`: the `webhook-signature` value of a body read from stdin;
//! - `verify`: checks a delivery (body on stdin) the way the webhook endpoint does;
//! - `decode`: parses an Agents API object from stdin with the `sandbox-core` models and
//!   prints it re-serialized;
//! - `serve`: the embedded stack (local mode) against an Agents API base URL;
//! - `demo`: the whole pipeline against the Agents API simulator (what `make run` runs);
//! - `status`, `explain`: read-only views of a local data directory.
//!
//! The webhook secret is read only from an environment variable (never a flag: flags show
//! in process lists) and is never printed.
//!
//! Exit codes: 0 success; 1 a delivery failed verification; 2 unusable input, arguments or
//! configuration (malformed JSON, missing or invalid secret, I/O failure).
#![deny(clippy::all)]
#![warn(missing_docs)]

mod decode_object;
mod demo;
mod inspect;
mod secret_from_env;
mod serve;
mod sign_delivery;
mod verify_delivery;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use std::io::{self, Write as _};
use std::process::ExitCode;

/// Operator tool for sandbox-lifecycle: run the local stack against an Agents API
/// (`serve`) or the whole pipeline against the simulator (`demo`), read a local data
/// directory (`status`, `explain`), sign and verify webhook deliveries (`sign`, `verify`)
/// and decode Agents API objects (`decode`).
#[derive(Debug, Parser)]
#[command(name = "sandboxctl", version)]
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
    /// Run the embedded stack against an Agents API base URL until Ctrl-C.
    Serve(Box<serve::ServeArgs>),
    /// Run the whole pipeline against the simulator with a scripted scenario.
    Demo(demo::DemoArgs),
    /// List the environment records of a local data directory.
    Status(inspect::StatusArgs),
    /// Show the decisions, effects and receipts of one environment (or session).
    Explain(inspect::ExplainArgs),
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
    match cli.command {
        Command::Serve(args) => return block_on(true, serve::run(*args)),
        Command::Demo(args) => return block_on(false, demo::run(args)),
        Command::Status(args) => {
            return block_on(false, inspect::status(args, &mut io::stdout().lock()));
        }
        Command::Explain(args) => {
            return block_on(false, inspect::explain(args, &mut io::stdout().lock()));
        }
        _ => {}
    }
    let stdin = io::stdin().lock();
    let mut stdout = io::stdout().lock();
    let code = match cli.command {
        Command::Sign(args) => sign_delivery::run(&args, stdin, &mut stdout).context("sign")?,
        Command::Verify(args) => {
            verify_delivery::run(&args, stdin, &mut stdout).context("verify")?
        }
        Command::Decode(args) => decode_object::run(&args, stdin, &mut stdout).context("decode")?,
        Command::Serve(_) | Command::Demo(_) | Command::Status(_) | Command::Explain(_) => {
            unreachable!("async commands are handled above")
        }
    };
    stdout.flush().context("writing stdout")?;
    Ok(code)
}

/// A tokio runtime with logs on stderr (`RUST_LOG` overrides; info for `serve`, warnings
/// only for `demo`, whose timeline is the output).
fn runtime(verbose: bool) -> anyhow::Result<tokio::runtime::Runtime> {
    let default = if verbose { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .try_init();
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// Runs an async command to completion on a fresh runtime.
fn block_on(
    verbose: bool,
    fut: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<ExitCode> {
    runtime(verbose)?.block_on(fut).map(|()| ExitCode::SUCCESS)
}
