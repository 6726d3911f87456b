//! JSON logs, one object per line, for CloudWatch Logs Insights.
//!
//! Each line has `timestamp`, `level`, `message`, the event's fields at the top level, and
//! `spans`: the open spans with their fields, outermost first. The Lambda runtime opens a
//! span with `requestId`; the handlers open `job` (`message_id`, `session_id`,
//! `environment_id`, `webhook_id`, `trigger`) and `sweep` spans; the controller's own
//! events add `instance_id` (the ECS task ARN) and `generation`. No ANSI colours. Secrets
//! never reach a log: the API key and webhook secret types redact their `Debug`, and
//! errors name variables and ARNs only.
//!
//! The level comes from `RUST_LOG` (`target=level` directives, comma-separated, as
//! [`Targets`] parses them: no span or field filters), else from `AWS_LAMBDA_LOG_LEVEL`
//! (the function's log-level setting: `TRACE` … `FATAL`), else `info`. [`Targets`] rather
//! than `EnvFilter`: it needs no regex engine, which keeps the webhook bootstrap small
//! (its cold start is mostly paging the binary in).

use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;

/// The filter: `RUST_LOG`, else `AWS_LAMBDA_LOG_LEVEL`, else `info`.
fn filter_from(lookup: impl Fn(&str) -> Option<String>) -> Targets {
    if let Some(directives) = lookup("RUST_LOG")
        && let Ok(filter) = directives.parse::<Targets>()
    {
        return filter;
    }
    let level = match lookup("AWS_LAMBDA_LOG_LEVEL")
        .map(|l| l.to_ascii_lowercase())
        .as_deref()
    {
        Some("trace") => "trace",
        Some("debug") => "debug",
        Some("warn") => "warn",
        Some("error" | "fatal") => "error",
        _ => "info",
    };
    level.parse().unwrap_or_else(|_| info())
}

/// Everything at `info` and above.
fn info() -> Targets {
    Targets::new().with_default(tracing::Level::INFO)
}

/// A JSON subscriber writing to `writer` with the directives in `filter` (tests pass a
/// buffer).
pub fn subscriber<W>(filter: &str, writer: W) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    build(filter.parse().unwrap_or_else(|_| info()), writer)
}

fn build<W>(filter: Targets, writer: W) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .json()
        .with_ansi(false)
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(true)
        .with_target(false)
        .with_writer(writer)
        .finish()
        .with(filter)
}

/// Installs the JSON subscriber on stdout for the whole process (call first in `main`).
pub fn init() {
    let filter = filter_from(|k| std::env::var(k).ok());
    // A second call (tests) keeps the first subscriber.
    let _ = tracing::subscriber::set_global_default(build(filter, std::io::stdout));
}

/// Logs one line naming what failed (`stage`: `cold start` or `runtime`), then exits with
/// status 1: Lambda reports the failure and starts a fresh execution environment on the
/// next invocation.
pub fn fatal(stage: &'static str, error: &dyn std::fmt::Display) -> ! {
    tracing::error!(stage, error = %error, "function stopped");
    std::process::exit(1)
}
