//! The worker function (SQS events, timers and sweep queues): process each job, report failures.
use sandbox_lambda::aws_wiring;
use sandbox_lambda::json_logs::{fatal, init};
use sandbox_lambda::settings::ControllerSettings;
use sandbox_lambda::worker_handler::{self, QueueRoutes};

#[tokio::main]
async fn main() {
    init();
    let settings = ControllerSettings::from_env().unwrap_or_else(|e| fatal("cold start", &e));
    if let Some(warning) = settings.ecs.executor_mode.start_up_warning() {
        tracing::warn!("{warning}");
    }
    sandbox_lambda::emf::init(settings.controller.deployment.as_str());
    let controller = aws_wiring::controller(&settings)
        .await
        .unwrap_or_else(|e| fatal("cold start", &e));
    let routes = QueueRoutes::new(&settings.timers_queue_url).with_sweep(&settings.sweep_queue_url);
    if let Err(e) = worker_handler::run(controller, routes).await {
        fatal("runtime", &e);
    }
}
