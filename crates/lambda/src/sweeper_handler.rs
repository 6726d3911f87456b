//! The sweeper function: an EventBridge scheduled event runs one
//! [`Controller::sweep_fan_out`]: it reads the registry and the provider once and sends
//! one sweep job per environment to the sweep queue, spread over time, so the workers
//! decide in parallel and no invocation's duration grows with the deployment beyond the
//! reads themselves (2 × ⌈N/100⌉ + 1 ECS calls, the registry scan, ⌈N⌉ queue sends).
//!
//! The event's content is not used (a sweep re-derives everything from the registry, the
//! provider inventory and the sessions); its id and time are logged. The answer is the
//! report as JSON, `{"environments": N, "enqueued": N, "settled_skipped": N,
//! "outcomes": {}, "deferred": N, "dead_letters": N}`: `dead_letters` is the depth of the
//! events queue's dead-letter
//! queue (`EVENTS_DLQ_URL`; approximate, `null` when it could not be read), so each sweep
//! logs the jobs an operator has to look at (the DLQ alarm watches the same number).
//! A sweep that cannot list the registry or the inventory fails the invocation (an error,
//! visible in the function's metrics); EventBridge's asynchronous invoke retries it, and
//! the next schedule runs regardless.

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use lambda_runtime::{Diagnostic, LambdaEvent, service_fn};
use sandbox_agents_api::SessionsApi;
use sandbox_controller::ports::{Compute, PortError, Queue, Registry};
use sandbox_controller::{Controller, SweepReport};
use serde_json::{Value, json};
use std::sync::Arc;
use tracing::Instrument;

/// The report as the function's JSON answer; `dead_letters` is the events dead-letter
/// queue's depth (`None`: unreadable, answered as `null`).
pub fn report_json(report: &SweepReport, dead_letters: Option<u64>) -> Value {
    json!({
        "environments": report.environments,
        "enqueued": report.enqueued,
        "settled_skipped": report.settled_skipped,
        "outcomes": report.outcomes,
        "deferred": report.deferred,
        "dead_letters": dead_letters,
    })
}

/// Runs one sweep for a scheduled `event`.
///
/// # Errors
/// The [`PortError`] of a sweep that could not list the registry or the provider inventory.
pub async fn handle_schedule<Q, R, C, S>(
    controller: &Controller<Q, R, C, S>,
    event: &EventBridgeEvent<Value>,
) -> Result<Value, PortError>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    let span = tracing::info_span!(
        "sweep",
        event_id = event.id.as_deref(),
        scheduled_at = event.time.map(|t| t.to_rfc3339()),
        deployment = %controller.config.deployment,
    );
    async {
        let started = std::time::Instant::now();
        match controller.sweep_fan_out().await {
            Ok(report) => {
                sandbox_controller::metrics::sweep_done(
                    started.elapsed().as_secs_f64(),
                    report.environments,
                    report.deferred,
                );
                let dead_letters = match controller.events.dead_letter_count().await {
                    Ok(n) => Some(n),
                    Err(e) => {
                        tracing::warn!(error = %e, "events dead-letter queue depth unreadable");
                        None
                    }
                };
                let answer = report_json(&report, dead_letters);
                tracing::info!(
                    environments = report.environments,
                    enqueued = report.enqueued,
                    settled_skipped = report.settled_skipped,
                    deferred = report.deferred,
                    outcomes = %answer["outcomes"],
                    dead_letters,
                    "sweep done"
                );
                Ok(answer)
            }
            Err(e) => {
                tracing::error!(error = %e, "sweep skipped: inventory unavailable");
                Err(e)
            }
        }
    }
    .instrument(span)
    .await
}

/// Serves scheduled events with `controller` until the Lambda runtime stops the process.
/// A failed sweep fails its invocation with error type `SweepFailed`.
///
/// # Errors
/// The runtime's error when the Lambda Runtime API is unreachable.
pub async fn run<Q, R, C, S>(
    controller: Controller<Q, R, C, S>,
) -> Result<(), lambda_runtime::Error>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi + 'static,
{
    let controller = Arc::new(controller);
    lambda_runtime::run(service_fn(
        move |event: LambdaEvent<EventBridgeEvent<Value>>| {
            let controller = Arc::clone(&controller);
            async move {
                let answer = handle_schedule(&controller, &event.payload).await;
                crate::emf::flush();
                answer.map_err(|e| Diagnostic {
                    error_type: "SweepFailed".into(),
                    error_message: e.to_string(),
                })
            }
        },
    ))
    .await
}
