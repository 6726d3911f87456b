//! What a stopped local executor died of ([`sandbox_core::compute::ExitDetail`]): how the
//! child ended (exit status or signal, from the `compute_instances` row) and the last
//! lines of the output it and its forwarder appended to `executor-g<generation>.log`.
//!
//! The tail is bounded: the last [`EXIT_OUTPUT_MAX_BYTES`] bytes of the log, at most
//! [`EXIT_OUTPUT_MAX_LINES`] lines, each redacted — every occurrence of the executor key
//! itself (read from the configured key source) and anything shaped like a credential
//! ([`redact_line`]). The key is never kept, logged or returned.

use sandbox_core::compute::{EXIT_OUTPUT_MAX_BYTES, EXIT_OUTPUT_MAX_LINES, redact_line};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// How the child ended, as a sentence: `exited with status 1`, `killed by signal 15`.
pub(super) fn ended(code: Option<i32>, signal: Option<i32>) -> Option<String> {
    match (code, signal) {
        (Some(c), _) => Some(format!("exited with status {c}")),
        (None, Some(s)) => Some(format!("killed by signal {s}")),
        (None, None) => None,
    }
}

/// The last lines of `log`, bounded and redacted (see the module docs).
pub(super) fn tail(log: &Path, key: Option<&str>) -> Vec<String> {
    let Ok(mut f) = std::fs::File::open(log) else {
        return Vec::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(EXIT_OUTPUT_MAX_BYTES as u64);
    if f.seek(SeekFrom::Start(from)).is_err() {
        return Vec::new();
    }
    let mut buf = Vec::with_capacity(EXIT_OUTPUT_MAX_BYTES);
    if f.take(EXIT_OUTPUT_MAX_BYTES as u64)
        .read_to_end(&mut buf)
        .is_err()
    {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let mut lines: Vec<&str> = text.lines().collect();
    // Started mid-line: the first piece is a fragment (it could be part of a key).
    if from > 0 && !lines.is_empty() {
        lines.remove(0);
    }
    let keep = lines
        .iter()
        .map(|l| l.trim_end())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>();
    let start = keep.len().saturating_sub(EXIT_OUTPUT_MAX_LINES);
    keep[start..]
        .iter()
        .map(|l| {
            let l = match key.filter(|k| !k.is_empty()) {
                Some(k) => l.replace(k, "[redacted]"),
                None => (*l).to_owned(),
            };
            redact_line(&l)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_is_bounded_and_never_holds_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("executor-g1.log");
        // A key with no credential shape (no digits): only the exact-value redaction
        // catches it.
        let key = "plainlettersonlysecretvalue";
        let mut text = String::new();
        for i in 0..200 {
            text.push_str(&format!("line {i}: nothing to see\n"));
        }
        text.push_str(&format!("connecting with {key}\n"));
        text.push_str("registration failed: 401 Unauthorized\n");
        std::fs::write(&log, text).unwrap();
        let lines = tail(&log, Some(key));
        assert_eq!(lines.len(), EXIT_OUTPUT_MAX_LINES);
        assert!(lines.iter().map(String::len).sum::<usize>() <= EXIT_OUTPUT_MAX_BYTES);
        assert_eq!(
            lines.last().unwrap(),
            "registration failed: 401 Unauthorized"
        );
        assert!(lines.iter().all(|l| !l.contains(key)), "{lines:?}");
        assert!(
            lines.iter().any(|l| l == "connecting with [redacted]"),
            "{lines:?}"
        );
        assert!(tail(&dir.path().join("missing.log"), Some(key)).is_empty());
        assert_eq!(
            ended(Some(1), None).as_deref(),
            Some("exited with status 1")
        );
        assert_eq!(ended(None, Some(9)).as_deref(), Some("killed by signal 9"));
    }
}
