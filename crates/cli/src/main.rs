//! `sandboxctl`: operator tool for sandbox-lifecycle.
//!
//! - `sign`: the `webhook-signature` value of a body read from stdin;
//! - `verify`: checks a delivery (body on stdin) the way the webhook endpoint does;
//! - `decode`: parses an Agents API object from stdin with the `sandbox-core` models and
//!   prints it re-serialized;
//! - `serve`: the embedded stack (local mode) against an Agents API base URL;
//! - `demo`: the whole pipeline against the Agents API simulator (what `make run` runs);
//! - operating a deployment, on either backend (`--backend local|aws`, [`backend`]):
//!   `status`, `explain <id>` (read), `close <session> [--wait]`, `sweep [--dry-run]`,
//!   `dlq list|redrive`, `reset-start-failures <environment>`, `resolve <id> --effect ...`,
//!   `report-timeout <session>` (write: each enqueues a job
//!   the worker decides under the effect-key lock). `--json` prints one document of the
//!   schema in `crates/cli/sandboxctl.schema.json`. The `aws` backend needs the crate's
//!   `aws` feature (`cargo build -p sandboxctl --features aws`); the default build has
//!   none of the AWS SDK, so the demo builds fast.
//!
//! The webhook secret is read only from an environment variable (never a flag: flags show
//! in process lists) and is never printed; neither is any other secret.
//!
//! Exit codes: 0 success; 1 a delivery failed verification, or an operator command's
//! answer shows a problem ([`report`]); 2 unusable input, arguments, configuration or
//! access (malformed JSON, missing or invalid secret or setting, I/O or AWS failure).
#![deny(clippy::all)]
#![warn(missing_docs)]

mod backend;
mod dead_letters_cmd;
mod decode_object;
mod demo;
mod evidence_view;
mod explain_view;
mod migrate_cmd;
mod operator_jobs;
mod preflight;
mod report;
mod secret_from_env;
mod serve;
mod sign_delivery;
mod status_view;
mod timestamps;
mod verify_delivery;

use backend::{BackendArgs, BackendKind};

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

/// `sandboxctl supervise [--relay-listen URL --relay-to URL --relay-token-file PATH] --
/// PROGRAM ARGS...`.
#[derive(Debug, clap::Args)]
struct SuperviseArgs {
    /// Serve the forwarder-only relay on this `ws://127.0.0.1:PORT` (the forwarder's
    /// `--connect`; sandbox_local::executor_relay).
    #[arg(long, requires_all = ["relay_to", "relay_token_file"])]
    relay_listen: Option<String>,
    /// The listening executor the relay leads to (`ws://127.0.0.1:PORT`).
    #[arg(long, requires_all = ["relay_listen", "relay_token_file"])]
    relay_to: Option<String>,
    /// The executor's `--ws-token-file` (its capability token, added by the relay).
    #[arg(long, requires_all = ["relay_listen", "relay_to"])]
    relay_token_file: Option<std::path::PathBuf>,
    /// The executor program.
    program: String,
    /// Its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
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
    /// Run PROGRAM as a child subreaper's child and end every descendant it leaves when
    /// it exits (what `serve` runs each executor under; sandbox_local::supervise).
    #[command(hide = true)]
    Supervise(SuperviseArgs),
    /// Every environment, orphan and dead letter of a deployment (exit 1 on a problem).
    Status(status_view::StatusArgs),
    /// One environment's decisions and receipts in time order, by session, environment or
    /// task id, and the terminal record of its cleanup.
    Explain(explain_view::ExplainArgs),
    /// Close a session: enqueue the operator close (delete the session, stop the compute).
    Close(operator_jobs::CloseArgs),
    /// Enqueue a sweep of every environment now, or print what one would decide.
    Sweep(operator_jobs::SweepArgs),
    /// The dead-letter queues: list or redrive.
    #[command(subcommand)]
    Dlq(dead_letters_cmd::DlqCommand),
    /// Enqueue the reset of an environment's failed-start count.
    ResetStartFailures(operator_jobs::ResetArgs),
    /// Close an environment's open reconciliation with what the owner found (the idle stop
    /// of a held compute may then proceed).
    Resolve(operator_jobs::ResolveArgs),
    /// Ask what became of an input submission that timed out: the worker records
    /// still_running, completed, failed or not_found; nothing is resubmitted.
    ReportTimeout(operator_jobs::ReportTimeoutArgs),
    /// Bring stored data up to this version (after an upgrade): put records written
    /// before the sweep's open-records index into it. Idempotent; --dry-run counts.
    Migrate(migrate_cmd::MigrateArgs),
    /// Checks, from where executors run, that they can register: the provider's hosts
    /// resolve and accept TLS, the executor key is readable, the executor answers
    /// `--version`; on AWS from a one-off task of the executor task definition, with the
    /// executors' egress IP.
    Preflight(preflight::PreflightArgs),
}

/// Runs `$body` (an async expression over `$ops`) on the backend `$args` select.
macro_rules! with_ops {
    ($args:expr, |$ops:ident| $body:expr) => {{
        let args: &BackendArgs = $args;
        match args.kind() {
            BackendKind::Local => {
                let $ops = backend::LocalOps::open(args)?;
                $body.await
            }
            #[cfg(feature = "aws")]
            BackendKind::Aws => {
                let $ops = backend::AwsOps::open().await?;
                $body.await
            }
            #[cfg(not(feature = "aws"))]
            BackendKind::Aws => Err(backend::aws_backend_not_built()),
        }
    }};
}

/// Exit code for unusable input, arguments or configuration (as clap's usage errors).
const EXIT_USAGE: u8 = 2;

/// `<this executable> supervise --`: the supervisor prefix of every local executor.
///
/// # Errors
/// The path of the running executable cannot be read.
pub(crate) fn supervisor_command() -> anyhow::Result<sandbox_local::ExecutorCommand> {
    let exe = std::env::current_exe().context("the path of sandboxctl (for supervise)")?;
    Ok(sandbox_local::ExecutorCommand::new(
        exe.display().to_string(),
        ["supervise", "--"],
    ))
}

/// The relay's bound socket and configuration, when `supervise` was asked to serve one.
fn supervise_relay(
    args: &SuperviseArgs,
) -> anyhow::Result<Option<(std::net::TcpListener, sandbox_local::executor_relay::Relay)>> {
    use sandbox_local::executor_relay::{Relay, loopback_addr, read_token_file};
    let (Some(listen), Some(to), Some(token_file)) =
        (&args.relay_listen, &args.relay_to, &args.relay_token_file)
    else {
        return Ok(None);
    };
    let listener = std::net::TcpListener::bind(loopback_addr(listen)?)
        .with_context(|| format!("relay: cannot listen on {listen}"))?;
    let token = read_token_file(token_file)
        .with_context(|| format!("relay: token file {}", token_file.display()))?;
    let upstream = loopback_addr(to)?;
    Ok(Some((listener, Relay { upstream, token })))
}

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
        Command::Supervise(args) => {
            let relay = supervise_relay(&args)?;
            let code = sandbox_local::supervise::run(&args.program, &args.args, relay)
                .with_context(|| format!("supervise {}", args.program))?;
            return Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)));
        }
        Command::Status(args) => {
            return operate(async move {
                with_ops!(&args.backend, |ops| status_view::run(
                    &ops,
                    &args,
                    &mut io::stdout().lock()
                ))
            });
        }
        Command::Explain(args) => {
            return operate(async move {
                with_ops!(&args.backend, |ops| explain_view::run(
                    &ops,
                    &args,
                    &mut io::stdout().lock()
                ))
            });
        }
        Command::Close(args) => {
            operator_jobs::refuse_inferred_backend(&args.backend, "close")?;
            return operate(async move {
                with_ops!(&args.backend, |ops| operator_jobs::close(
                    &ops,
                    &args,
                    &mut io::stdout().lock()
                ))
            });
        }
        Command::Sweep(args) => {
            return operate(async move {
                with_ops!(&args.backend, |ops| operator_jobs::sweep(
                    &ops,
                    &args,
                    &mut io::stdout().lock()
                ))
            });
        }
        Command::ResetStartFailures(args) => {
            return operate(async move {
                with_ops!(&args.backend, |ops| operator_jobs::reset_start_failures(
                    &ops,
                    &args,
                    &mut io::stdout().lock()
                ))
            });
        }
        Command::Resolve(args) => {
            operator_jobs::refuse_inferred_backend(&args.backend, "resolve")?;
            return operate(async move {
                with_ops!(&args.backend, |ops| operator_jobs::resolve(
                    &ops,
                    &args,
                    &mut io::stdout().lock()
                ))
            });
        }
        Command::Preflight(args) => {
            return operate(async move { preflight::run(&args, &mut io::stdout().lock()).await });
        }
        Command::ReportTimeout(args) => {
            return operate(async move {
                with_ops!(&args.backend, |ops| operator_jobs::report_timeout(
                    &ops,
                    &args,
                    &mut io::stdout().lock()
                ))
            });
        }
        Command::Migrate(args) => {
            return operate(async move {
                with_ops!(&args.backend, |ops| migrate_cmd::run(
                    &ops,
                    &args,
                    &mut io::stdout().lock()
                ))
            });
        }
        Command::Dlq(cmd) => {
            if let dead_letters_cmd::DlqCommand::Redrive(a) = &cmd {
                operator_jobs::refuse_inferred_backend(&a.backend, "dlq redrive")?;
            }
            return operate(async move {
                with_ops!(cmd.backend(), |ops| dead_letters_cmd::run(
                    &ops,
                    &cmd,
                    &mut io::stdout().lock()
                ))
            });
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
        Command::Serve(_)
        | Command::Supervise(_)
        | Command::Demo(_)
        | Command::Status(_)
        | Command::Explain(_)
        | Command::Close(_)
        | Command::Sweep(_)
        | Command::Dlq(_)
        | Command::ResetStartFailures(_)
        | Command::Resolve(_)
        | Command::ReportTimeout(_)
        | Command::Preflight(_)
        | Command::Migrate(_) => {
            unreachable!("async commands are handled above")
        }
    };
    stdout.flush().context("writing stdout")?;
    Ok(code)
}

/// Whether log lines carry ANSI colour codes: only when stderr is a terminal and
/// `NO_COLOR` is unset or empty (<https://no-color.org>: "when present and not an empty
/// string" it disables colour). `sandboxctl serve 2> serve.log` writes plain lines.
fn log_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// A tokio runtime with logs on stderr (`RUST_LOG` overrides; info for `serve`, warnings
/// only for `demo`, whose timeline is the output), coloured only on a terminal
/// ([`log_colour`]).
fn runtime(verbose: bool) -> anyhow::Result<tokio::runtime::Runtime> {
    use std::io::IsTerminal as _;
    let default = if verbose { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let colour = log_colour(
        io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(io::stderr)
        .try_init();
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// Runs an operator command (logs: warnings only, on stderr) and turns its verdict into
/// the exit code (0 or 1; an error is 2, in `main`).
fn operate(
    fut: impl std::future::Future<Output = anyhow::Result<report::Verdict>>,
) -> anyhow::Result<ExitCode> {
    runtime(false)?
        .block_on(fut)
        .map(|v| ExitCode::from(v.exit_code()))
}

/// Runs an async command to completion on a fresh runtime.
fn block_on(
    verbose: bool,
    fut: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<ExitCode> {
    runtime(verbose)?.block_on(fut).map(|()| ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::log_colour;
    use std::ffi::OsStr;
    use std::io::{Read as _, Seek as _};
    use std::sync::{Arc, Mutex};

    /// clap checks a command's definition (duplicate argument names, conflicting
    /// flags) only when that command is parsed: this checks every subcommand at once, so
    /// a clash such as two `--force` flags on `close` fails here, not in an E2E.
    #[test]
    fn every_subcommand_definition_is_valid() {
        use clap::CommandFactory as _;
        super::Cli::command().debug_assert();
    }

    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        assert!(log_colour(true, None));
        assert!(log_colour(true, Some(OsStr::new(""))));
        assert!(!log_colour(true, Some(OsStr::new("1"))));
        assert!(!log_colour(false, None));
        assert!(!log_colour(false, Some(OsStr::new(""))));
    }

    /// Writes one warning through the same subscriber `runtime` installs, to a file, with
    /// the colour `log_colour` picks for a non-terminal; returns the file's bytes.
    fn log_to_file(ansi: bool) -> Vec<u8> {
        let file = Arc::new(Mutex::new(tempfile::tempfile().unwrap()));
        let writer = {
            let file = Arc::clone(&file);
            move || -> std::fs::File { file.lock().unwrap().try_clone().unwrap() }
        };
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
            .with_ansi(ansi)
            .with_writer(writer)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(environment_id = "env_1", "executor not connected");
        });
        let mut f = file.lock().unwrap();
        f.rewind().unwrap();
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes).unwrap();
        bytes
    }

    #[test]
    fn a_log_written_to_a_file_has_no_escape_byte() {
        let plain = log_to_file(log_colour(false, None));
        assert!(
            String::from_utf8_lossy(&plain).contains("executor not connected"),
            "the line was written"
        );
        assert!(
            !plain.contains(&0x1b),
            "{}",
            String::from_utf8_lossy(&plain)
        );
        // The check can fail: the same line on a terminal is coloured.
        assert!(log_to_file(log_colour(true, None)).contains(&0x1b));
    }
}
