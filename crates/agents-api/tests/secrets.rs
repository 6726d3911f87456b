//! The API key never appears in `Debug`, `Display`, error chains or logs.

mod common;

use common::{Reply, SECRET, TestServer, client, config, fast_retry};
use sandbox_agents_api::{AgentsClient, ApiError, ClientConfig, SessionsApi};
use sandbox_core::SessionId;
use serde_json::json;

/// Display of the error and of every error in its source chain, plus its Debug.
fn everything_printed(err: &ApiError) -> String {
    let mut out = format!("{err}\n{err:?}\n");
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        out.push_str(&format!("{cause}\n{cause:?}\n"));
        source = cause.source();
    }
    out
}

#[tokio::test]
async fn key_is_not_in_debug_of_client_or_config() {
    let server = TestServer::start(vec![Reply::error(500)]).await;
    let cfg = config(server.base_url(), fast_retry(1));
    let config_debug = format!("{cfg:?} {:?}", cfg.api_key);
    assert!(!config_debug.contains(SECRET), "{config_debug}");
    assert!(config_debug.contains("<redacted>"));
    let api = AgentsClient::new(cfg).unwrap();
    let client_debug = format!("{api:?} {api:#?}");
    assert!(!client_debug.contains(SECRET), "{client_debug}");
    assert!(client_debug.contains("<redacted>"));
    assert!(!format!("{:?}", ClientConfig::new(SECRET)).contains(SECRET));
}

#[tokio::test]
async fn key_in_a_500_body_never_reaches_the_error() {
    let body = json!({"error": {"message": format!("invalid key {SECRET}"), "key": SECRET}});
    let server = TestServer::start(vec![Reply::json(500, body)]).await;
    let err = client(&server, 2)
        .retrieve_session(&SessionId::new("sess_abc"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ApiError::Server { status: 500, .. }),
        "{err:?}"
    );
    let printed = everything_printed(&err);
    assert!(!printed.contains(SECRET), "{printed}");
    assert!(!printed.contains("invalid key"), "no body text: {printed}");
    assert_eq!(
        err.to_string(),
        "GET /v1/agents/sessions/sess_abc: server error (HTTP 500) after 2 attempt(s)"
    );
}

#[tokio::test]
async fn key_in_a_malformed_200_body_never_reaches_the_decode_error() {
    // serde_json quotes offending values; our Decode error must not.
    let mut body = common::session_json("sess_abc");
    body["status"] = json!(SECRET);
    body["created_at"] = json!(SECRET);
    let server = TestServer::start(vec![Reply::json(200, body)]).await;
    let err = client(&server, 2)
        .retrieve_session(&SessionId::new("sess_abc"))
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::Decode { .. }), "{err:?}");
    let printed = everything_printed(&err);
    assert!(!printed.contains(SECRET), "{printed}");
}

#[tokio::test]
async fn key_is_not_in_transport_errors() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead);
    let api = AgentsClient::new(config(format!("http://{addr}/v1"), fast_retry(1))).unwrap();
    let err = api
        .retrieve_session(&SessionId::new("sess_abc"))
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::Connect { .. }), "{err:?}");
    let printed = everything_printed(&err);
    assert!(!printed.contains(SECRET), "{printed}");
}
