//! The webhook function (Function URL or API Gateway): verify, enqueue, answer.
use sandbox_lambda::json_logs::{fatal, init};
use sandbox_lambda::settings::WebhookSettings;
use sandbox_lambda::{aws_wiring, webhook_handler};
use std::sync::Arc;

#[tokio::main]
async fn main() {
    init();
    let settings = WebhookSettings::from_env().unwrap_or_else(|e| fatal("cold start", &e));
    sandbox_lambda::emf::init(settings.deployment_id.as_deref().unwrap_or("unset"));
    let intake = aws_wiring::webhook_intake(&settings)
        .await
        .unwrap_or_else(|e| fatal("cold start", &e));
    if let Err(e) = webhook_handler::run(Arc::new(intake)).await {
        fatal("runtime", &e);
    }
}
