//! Debug-level logs: what they record, and that the key and bodies never appear.
//!
//! Alone in its own test binary: `tracing` caches per-callsite interest process-wide, so a
//! thread-local subscriber can miss events when other tests run in parallel threads.

mod common;

use common::{Reply, SECRET, TestServer, client};
use sandbox_agents_api::SessionsApi;
use sandbox_core::SessionId;
use serde_json::json;
use std::io::Write;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn debug_logs_have_method_path_status_attempt_but_no_key_or_body() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // The test runtime is single-threaded, so a thread-local default sees every event.
    let _guard = tracing::subscriber::set_default(subscriber);

    let body = json!({"error": {"message": format!("leaked {SECRET}")}});
    let server = TestServer::start(vec![
        Reply::json(500, body),
        Reply::json(200, common::session_json("sess_abc")),
    ])
    .await;
    client(&server, 3)
        .retrieve_session(&SessionId::new("sess_abc"))
        .await
        .unwrap();

    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(!logs.contains(SECRET), "{logs}");
    assert!(!logs.contains("leaked"), "no body in logs: {logs}");
    assert!(logs.contains("agents api: response"), "{logs}");
    assert!(logs.contains("method=GET"), "{logs}");
    assert!(
        logs.contains("path=\"/v1/agents/sessions/sess_abc\""),
        "{logs}"
    );
    assert!(logs.contains("status=500"), "{logs}");
    assert!(logs.contains("status=200"), "{logs}");
    assert!(logs.contains("attempt=2"), "{logs}");
    assert!(logs.contains("agents api: retrying"), "{logs}");
}
