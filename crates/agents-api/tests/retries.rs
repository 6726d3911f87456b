//! Retry, backoff, `Retry-After` and failure classification against a local server.

mod common;

use common::{Reply, TestServer, client, config, fast_retry, session_json};
use sandbox_agents_api::{AgentsClient, ApiError, SessionsApi};
use sandbox_core::SessionId;
use sandbox_core::observed::Unavailable;
use std::time::{Duration, Instant};

fn sess() -> SessionId {
    SessionId::new("sess_abc")
}

#[tokio::test]
async fn not_found_is_typed_and_never_retried() {
    let server = TestServer::start(vec![Reply::error(404)]).await;
    let err = client(&server, 4)
        .retrieve_session(&sess())
        .await
        .unwrap_err();
    match &err {
        ApiError::NotFound { request } => {
            assert_eq!(request, "GET /v1/agents/sessions/sess_abc");
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(err.is_not_found());
    assert_eq!(err.unavailable(), None);
    assert_eq!(server.count(), 1, "404 must not be retried");
}

#[tokio::test]
async fn server_error_then_success_succeeds_after_one_retry() {
    let server = TestServer::start(vec![
        Reply::error(500),
        Reply::json(200, session_json("sess_abc")),
    ])
    .await;
    let session = client(&server, 4).retrieve_session(&sess()).await.unwrap();
    assert_eq!(session.id, sess());
    assert_eq!(server.count(), 2);
}

#[tokio::test]
async fn rate_limit_retry_after_seconds_is_honoured() {
    let server = TestServer::start(vec![
        Reply::error(429).header("retry-after", "1"),
        Reply::json(200, session_json("sess_abc")),
    ])
    .await;
    // Backoff alone would wait 10 ms; Retry-After asks for 1 s.
    let api = client(&server, 4);
    let started = Instant::now();
    api.retrieve_session(&sess()).await.unwrap();
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_secs(1), "waited only {elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "waited {elapsed:?}");
    assert_eq!(server.count(), 2);
}

#[tokio::test]
async fn retry_after_is_capped_at_the_configured_maximum() {
    let server = TestServer::start(vec![
        Reply::error(503).header("retry-after", "3600"),
        Reply::json(200, session_json("sess_abc")),
    ])
    .await;
    let mut retry = fast_retry(4);
    retry.max_retry_after = Duration::from_millis(100);
    let api = AgentsClient::new(config(server.base_url(), retry)).unwrap();
    let started = Instant::now();
    api.retrieve_session(&sess()).await.unwrap();
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(100), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(2), "cap ignored: {elapsed:?}");
    assert_eq!(server.count(), 2);
}

#[tokio::test]
async fn persistent_503_is_a_server_error_after_exactly_max_attempts() {
    let server = TestServer::start(vec![Reply::error(503)]).await;
    let err = client(&server, 3)
        .retrieve_session(&sess())
        .await
        .unwrap_err();
    match &err {
        ApiError::Server {
            status, attempts, ..
        } => {
            assert_eq!(*status, 503);
            assert_eq!(*attempts, 3);
        }
        other => panic!("expected Server, got {other:?}"),
    }
    assert_eq!(err.unavailable(), Some(Unavailable::ServerError));
    assert_eq!(server.count(), 3);
}

#[tokio::test]
async fn default_policy_makes_four_attempts() {
    let server = TestServer::start(vec![Reply::error(500)]).await;
    let mut retry = fast_retry(4);
    retry.max_attempts = sandbox_agents_api::RetryPolicy::default().max_attempts;
    let api = AgentsClient::new(config(server.base_url(), retry)).unwrap();
    let err = api.retrieve_session(&sess()).await.unwrap_err();
    assert!(
        matches!(err, ApiError::Server { attempts: 4, .. }),
        "{err:?}"
    );
    assert_eq!(server.count(), 4);
}

#[tokio::test]
async fn persistent_429_is_rate_limited() {
    let server = TestServer::start(vec![Reply::error(429).header("retry-after", "0")]).await;
    let err = client(&server, 2)
        .retrieve_session(&sess())
        .await
        .unwrap_err();
    match &err {
        ApiError::RateLimited {
            attempts,
            retry_after,
            ..
        } => {
            assert_eq!(*attempts, 2);
            assert_eq!(*retry_after, Some(Duration::ZERO));
        }
        other => panic!("expected RateLimited, got {other:?}"),
    }
    assert_eq!(err.unavailable(), Some(Unavailable::RateLimited));
    assert_eq!(server.count(), 2);
}

#[tokio::test]
async fn other_4xx_are_http_errors_and_never_retried() {
    for status in [400, 401, 403, 409, 422] {
        let server = TestServer::start(vec![Reply::error(status)]).await;
        let err = client(&server, 4)
            .retrieve_session(&sess())
            .await
            .unwrap_err();
        assert!(
            matches!(err, ApiError::Http { status: s, .. } if s == status),
            "{status}: {err:?}"
        );
        assert_eq!(err.status(), Some(status));
        assert_eq!(err.unavailable(), None);
        assert_eq!(server.count(), 1, "{status} must not be retried");
    }
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let server = TestServer::start(vec![
        Reply::raw(307, "").header("location", "http://127.0.0.1:9/"),
    ])
    .await;
    let err = client(&server, 4)
        .retrieve_session(&sess())
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::Http { status: 307, .. }), "{err:?}");
    assert_eq!(server.count(), 1);
}

#[tokio::test]
async fn wrong_json_shape_is_a_decode_error_and_not_retried() {
    let server = TestServer::start(vec![Reply::json(
        200,
        serde_json::json!({"id": "sess_abc", "object": "agent.session"}),
    )])
    .await;
    let err = client(&server, 4)
        .retrieve_session(&sess())
        .await
        .unwrap_err();
    match &err {
        ApiError::Decode { source, .. } => {
            assert_eq!(source.expected, "agent.session");
            assert_eq!(source.category, "data");
        }
        other => panic!("expected Decode, got {other:?}"),
    }
    assert_eq!(err.unavailable(), None);
    assert_eq!(server.count(), 1);

    let server = TestServer::start(vec![Reply::raw(200, "<html>gateway</html>")]).await;
    let err = client(&server, 4)
        .retrieve_session(&sess())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ApiError::Decode { source, .. } if source.category == "syntax"),
        "{err:?}"
    );
}

#[tokio::test]
async fn connection_refused_is_a_connect_error_after_all_attempts() {
    // Bind, note the port, drop the listener: nothing listens there any more.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead);
    let api = AgentsClient::new(config(format!("http://{addr}/v1"), fast_retry(3))).unwrap();
    let err = api.retrieve_session(&sess()).await.unwrap_err();
    match &err {
        ApiError::Connect { attempts, .. } => assert_eq!(*attempts, 3),
        other => panic!("expected Connect, got {other:?}"),
    }
    assert!(std::error::Error::source(&err).is_some(), "cause is kept");
    assert_eq!(err.unavailable(), Some(Unavailable::Unreachable));
}

#[tokio::test]
async fn slow_server_beyond_the_request_timeout_is_a_timeout() {
    let server = TestServer::start(vec![
        Reply::json(200, session_json("sess_abc")).delay(Duration::from_secs(5)),
    ])
    .await;
    let mut cfg = config(server.base_url(), fast_retry(2));
    cfg.request_timeout = Duration::from_millis(200);
    let api = AgentsClient::new(cfg).unwrap();
    let started = Instant::now();
    let err = api.retrieve_session(&sess()).await.unwrap_err();
    let elapsed = started.elapsed();
    match &err {
        ApiError::Timeout { attempts, .. } => assert_eq!(*attempts, 2),
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert_eq!(err.unavailable(), Some(Unavailable::Timeout));
    assert_eq!(server.count(), 2);
    assert!(elapsed >= Duration::from_millis(400), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
}

#[tokio::test]
async fn timeout_then_success_is_retried() {
    let server = TestServer::start(vec![
        Reply::json(200, session_json("sess_abc")).delay(Duration::from_secs(5)),
        Reply::json(200, session_json("sess_abc")),
    ])
    .await;
    let mut cfg = config(server.base_url(), fast_retry(3));
    cfg.request_timeout = Duration::from_millis(200);
    let api = AgentsClient::new(cfg).unwrap();
    api.retrieve_session(&sess()).await.unwrap();
    assert_eq!(server.count(), 2);
}
