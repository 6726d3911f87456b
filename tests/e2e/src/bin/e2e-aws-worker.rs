//! A stand-in for the worker Lambda in the AWS end-to-end tests: the worker function's
//! own cold start (`ControllerSettings::from_env`, the API key from Secrets Manager, the
//! AWS adapters: `sandbox_lambda::aws_wiring::controller`), then, instead of Lambda's SQS
//! event sources, a loop receiving from the events, timers and sweep queues and handling each
//! message through the same `Controller::handle` (process, then ack, hand off or retry).
//!
//! Test-only knobs (the Lambda takes these from the queues' configuration):
//! `E2E_VISIBILITY_SECS` (receive visibility timeout) and `E2E_LOCK_TTL_SECS` (the lock
//! lease), so a killed worker's job and lock come back within seconds.
//! `SANDBOX_CRASH_AT` aborts the process at a crash point, as in every test.

use sandbox_lambda::aws_wiring;
use sandbox_lambda::settings::ControllerSettings;
use std::time::Duration;

fn secs(var: &str) -> Option<u64> {
    std::env::var(var).ok().and_then(|v| v.parse().ok())
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let mut settings = match ControllerSettings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cold start: {e}");
            std::process::exit(2);
        }
    };
    if let Some(v) = secs("E2E_VISIBILITY_SECS") {
        settings.controller.visibility_secs = v as u32;
    }
    if let Some(v) = secs("E2E_LOCK_TTL_SECS") {
        settings.controller.lock_ttl_secs = v;
    }
    settings.controller.stop_readback_interval = Duration::from_millis(100);
    let controller = match aws_wiring::controller(&settings).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cold start: {e}");
            std::process::exit(2);
        }
    };
    loop {
        for queue in [
            &controller.events,
            &controller.timers,
            controller.sweep_queue(),
        ] {
            if let Err(e) = controller.consume_once(queue, 10, 200).await {
                tracing::warn!(error = %e, "receive failed");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
