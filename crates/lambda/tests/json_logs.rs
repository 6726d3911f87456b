//! The log shape: one JSON object per line, fields at the top level, the open spans (with
//! the job's ids) in `spans`, no ANSI escapes.

use sandbox_lambda::json_logs::subscriber;
use std::io::Write;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn job_log_line_is_json_with_session_environment_and_task_ids() {
    let buffer = Buffer::default();
    let make = {
        let b = buffer.clone();
        move || b.clone()
    };
    tracing::subscriber::with_default(subscriber("info", make), || {
        let span = tracing::info_span!(
            "job",
            message_id = "m1",
            session_id = "sess_1",
            environment_id = "env_1"
        );
        let _in = span.enter();
        tracing::info!(
            instance_id = "arn:aws:ecs:us-east-1:123456789012:task/c/0f1e",
            "compute started"
        );
        tracing::debug!("filtered out at info");
    });
    let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    assert!(!text.contains('\u{1b}'), "no ANSI: {text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text}");
    let line: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["message"], "compute started");
    assert_eq!(
        line["instance_id"],
        "arn:aws:ecs:us-east-1:123456789012:task/c/0f1e"
    );
    assert_eq!(line["spans"][0]["name"], "job");
    assert_eq!(line["spans"][0]["session_id"], "sess_1");
    assert_eq!(line["spans"][0]["environment_id"], "env_1");
    assert!(line["timestamp"].is_string());
}
