//! Crash injection at side-effect boundaries, for crash-recovery tests.
//!
//! With the `test-support` feature, when the environment variable `SANDBOX_CRASH_AT` names
//! a point (read once per process), the process aborts there, as a killed Lambda or a
//! `kill -9` would: no unwinding, no unlock, no ack. Without the feature (every production
//! build) a crash point is an empty inline function: no comparison, no variable read.
//! Points: `after-lock`, `after-compute-start` (compute exists, record not written yet) and
//! `before-ack`.

/// Aborts the process if `SANDBOX_CRASH_AT` equals `point`.
#[cfg(feature = "test-support")]
pub fn crash_point(point: &'static str) {
    use std::sync::OnceLock;
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

/// Does nothing: crash points work only with the `test-support` feature.
#[cfg(not(feature = "test-support"))]
#[inline(always)]
pub fn crash_point(_point: &'static str) {}
