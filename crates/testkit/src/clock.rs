//! A simulated clock: time moves only when a test advances it, or follows the wall clock
//! (for the contract suite, which waits for real).

use sandbox_controller::ports::Clock;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Default start of a manual clock, Unix seconds (2025-11-29, the fixtures' epoch).
pub const DEFAULT_START_SECS: u64 = 1_764_400_000;

/// A clock shared by every twin of one world. Cheap to clone (one `Arc`).
///
/// Resolution is milliseconds; [`Clock::now`] answers whole Unix seconds (floor).
#[derive(Clone, Debug)]
pub struct SimClock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
enum Inner {
    /// Unix milliseconds, advanced by hand.
    Manual(AtomicU64),
    /// The system clock.
    Wall,
}

impl SimClock {
    /// A manual clock at `start_secs` (Unix seconds); it never moves on its own.
    pub fn manual(start_secs: u64) -> Self {
        Self {
            inner: Arc::new(Inner::Manual(AtomicU64::new(start_secs * 1_000))),
        }
    }

    /// A manual clock at [`DEFAULT_START_SECS`].
    pub fn new() -> Self {
        Self::manual(DEFAULT_START_SECS)
    }

    /// A clock that follows the system clock (advancing it is a no-op). Used where real
    /// waits are part of the test (the contract suite's visibility checks).
    pub fn wall() -> Self {
        Self {
            inner: Arc::new(Inner::Wall),
        }
    }

    /// Whether this clock follows the system clock.
    pub fn is_wall(&self) -> bool {
        matches!(*self.inner, Inner::Wall)
    }

    /// Now, Unix milliseconds.
    pub fn now_ms(&self) -> u64 {
        match &*self.inner {
            Inner::Manual(ms) => ms.load(Ordering::SeqCst),
            Inner::Wall => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        }
    }

    /// Moves a manual clock forward by `by` (no-op on a wall clock).
    pub fn advance(&self, by: Duration) {
        if let Inner::Manual(ms) = &*self.inner {
            ms.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
        }
    }

    /// Moves a manual clock forward by `secs` seconds.
    pub fn advance_secs(&self, secs: u64) {
        self.advance(Duration::from_secs(secs));
    }

    /// Moves a manual clock forward to `unix_ms` (Unix milliseconds) if that is later.
    pub fn advance_to_ms(&self, unix_ms: u64) {
        if let Inner::Manual(ms) = &*self.inner {
            ms.fetch_max(unix_ms, Ordering::SeqCst);
        }
    }
}

impl Default for SimClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SimClock {
    fn now(&self) -> u64 {
        self.now_ms() / 1_000
    }
}

/// A host's view of a [`SimClock`], running `ahead_ms` ahead of it: another machine's
/// clock. NTP keeps hosts within milliseconds, but the controller reads whole seconds
/// ([`Clock::now`]), so two hosts can disagree by a second at a boundary: the simulation
/// gives the warm pool's refill such a clock, so that a member at its maximum
/// age is recycled by the refill while a worker may still claim it.
#[derive(Clone, Debug)]
pub struct SkewedClock {
    /// The shared clock.
    pub inner: SimClock,
    /// How far this host runs ahead, milliseconds.
    pub ahead_ms: u64,
}

impl Clock for SkewedClock {
    fn now(&self) -> u64 {
        (self.inner.now_ms() + self.ahead_ms) / 1_000
    }
}
