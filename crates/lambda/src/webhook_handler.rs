//! The webhook function: the controller's axum router ([`sandbox_controller::router`])
//! behind `lambda_http`, so the Lambda and local mode answer deliveries with the same code.
//!
//! `lambda_http` accepts Lambda Function URL events and API Gateway HTTP API (payload 2.0)
//! events (both deserialize as `ApiGatewayV2httpRequest`) and API Gateway REST API (v1)
//! proxy events. A body with `isBase64Encoded: true` is decoded to its exact bytes before
//! the router sees it, and a text body is passed as is, so the signature is checked over
//! the bytes OpenAI signed.
//!
//! Every path is routed to the webhook endpoint: the function serves nothing else, and the
//! path seen here depends on the trigger (`/webhooks/openai` behind a Function URL, a
//! `/{stage}` prefix behind a REST API stage). Methods other than `POST` answer 405.

use axum::Router;
use axum::http::Uri;
use lambda_http::Request;
use lambda_http::tower::ServiceExt;
use lambda_http::tower::util::MapRequest;
use sandbox_controller::ports::Queue;
use sandbox_controller::{Intake, router};
use std::sync::Arc;

/// The webhook endpoint as a `tower` service over `lambda_http` requests.
pub type WebhookService = MapRequest<Router, fn(Request) -> Request>;

/// The path every request is routed to (one of the router's two routes).
const WEBHOOK_PATH: &str = "/webhook";

fn to_webhook_path(mut request: Request) -> Request {
    *request.uri_mut() = Uri::from_static(WEBHOOK_PATH);
    request
}

/// The service: [`sandbox_controller::router`] over `intake`, reached by every path.
pub fn service<Q: Queue>(intake: Arc<Intake<Q>>) -> WebhookService {
    router(intake).map_request(to_webhook_path as fn(Request) -> Request)
}

/// Serves webhook deliveries until the Lambda runtime stops the process.
///
/// # Errors
/// The runtime's error when the Lambda Runtime API is unreachable.
pub async fn run<Q: Queue>(intake: Arc<Intake<Q>>) -> Result<(), lambda_http::Error> {
    // The answer is complete here: flush this invocation's metrics before returning it.
    let flushed = service(intake).map_response(|answer| {
        crate::emf::flush();
        answer
    });
    lambda_http::run(flushed).await
}
