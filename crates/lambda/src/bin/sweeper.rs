//! The sweeper function (EventBridge schedule): reconcile everything once. It holds no
//! Agents API key (`aws_wiring::sweeper_controller`): a sweep reads no session.
// The layout of `main`'s future (lambda_runtime's service over the sweep's nested
// futures) needs more than rustc's default query depth of 128.
#![recursion_limit = "256"]
use sandbox_lambda::json_logs::{fatal, init};
use sandbox_lambda::settings::ControllerSettings;
use sandbox_lambda::{aws_wiring, sweeper_handler};

#[tokio::main]
async fn main() {
    init();
    let settings = ControllerSettings::from_env().unwrap_or_else(|e| fatal("cold start", &e));
    if let Some(warning) = settings.ecs.executor_mode.start_up_warning() {
        tracing::warn!("{warning}");
    }
    sandbox_lambda::emf::init(settings.controller.deployment.as_str());
    let controller = aws_wiring::sweeper_controller(&settings)
        .await
        .unwrap_or_else(|e| fatal("cold start", &e));
    if let Err(e) = sweeper_handler::run(controller).await {
        fatal("runtime", &e);
    }
}
