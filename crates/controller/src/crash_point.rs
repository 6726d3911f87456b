//! Crash injection at side-effect boundaries, for crash-recovery tests.
//!
//! When the environment variable `SANDBOX_CRASH_AT` names a point (read once per process),
//! the process aborts there, as a killed Lambda or a `kill -9` would: no unwinding, no
//! unlock, no ack. Unset (always, in production), each point costs one comparison.
//! Points: `after-lock`, `after-compute-start` (compute exists, record not written yet),
//! `after-record`, `before-ack`.

use std::sync::OnceLock;

/// Aborts the process if `SANDBOX_CRASH_AT` equals `point`.
pub fn crash_point(point: &'static str) {
    static AT: OnceLock<Option<String>> = OnceLock::new();
    if AT
        .get_or_init(|| std::env::var("SANDBOX_CRASH_AT").ok())
        .as_deref()
        == Some(point)
    {
        eprintln!("SANDBOX_CRASH_AT={point}: aborting");
        std::process::abort();
    }
}
