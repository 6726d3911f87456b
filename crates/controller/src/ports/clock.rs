//! The clock port.

/// The wall clock, injectable so tests control time.
pub trait Clock: Send + Sync + 'static {
    /// Now, Unix seconds.
    fn now(&self) -> u64;
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }
}
