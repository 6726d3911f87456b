//! Metrics in CloudWatch embedded metric format (EMF): the `metrics` recorder of every
//! function, flushed to stdout once per invocation.
//!
//! The controller records through the `metrics` facade (`sandbox_controller::metrics`:
//! names, units, labels); [`init`] installs `metrics_cloudwatch_embedded`'s recorder with
//! the namespace `SandboxLifecycle` and one dimension, `deployment` (this stack's
//! `DEPLOYMENT_ID`: one value per deployment, so two stacks in one account never mix),
//! and [`flush`] writes one JSON document per label set to stdout, which Lambda sends
//! to CloudWatch Logs, where the documents become metrics without any API call
//! (the EMF specification: "Specification: Embedded metric format", Amazon CloudWatch
//! User Guide). Only counters and histograms that changed since the last flush are
//! written; an invocation that recorded nothing writes nothing.
//!
//! No id is ever a dimension: the labels are bounded sets (`outcome`, `reason`).

use metrics_cloudwatch_embedded::{Builder, Collector};
use std::sync::OnceLock;

static COLLECTOR: OnceLock<&'static Collector> = OnceLock::new();

/// Installs the EMF recorder for this process, with `deployment` as the `deployment`
/// dimension of every metric. Returns `false` (and records nothing) when a recorder is
/// installed already: a second call is harmless.
pub fn init(deployment: &str) -> bool {
    if COLLECTOR.get().is_some() {
        return false;
    }
    match Builder::new()
        .cloudwatch_namespace(sandbox_controller::metrics::NAMESPACE)
        .with_dimension("deployment", deployment.to_owned())
        .init()
    {
        Ok(collector) => {
            let _ = COLLECTOR.set(collector);
            sandbox_controller::metrics::describe();
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "metrics recorder not installed");
            false
        }
    }
}

/// Writes the metrics recorded since the last flush to `out`, one EMF document per line.
///
/// # Errors
/// The writer's error.
pub fn flush_to(out: impl std::io::Write) -> std::io::Result<()> {
    match COLLECTOR.get() {
        Some(collector) => collector.flush(out),
        None => Ok(()),
    }
}

/// [`flush_to`] stdout (where Lambda's log capture picks the documents up); a failed
/// write is logged, never fatal.
pub fn flush() {
    let stdout = std::io::stdout();
    if let Err(e) = flush_to(stdout.lock()) {
        tracing::warn!(error = %e, "metrics flush failed");
    }
}
