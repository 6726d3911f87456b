//! Small in-memory doubles of the [`Clock`] and [`Queue`] ports, shared by the test
//! suites, the fuzz target and the benches (the full twins of every port, with SQS
//! semantics and simulated time, are in `sandbox-testkit`).
//!
//! Not for production: [`RecordingQueue`] never delivers anything.

use crate::ports::{Clock, Outgoing, PortError, Queue, Received, Sent};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A clock stopped at one instant, Unix seconds.
#[derive(Clone, Copy, Debug)]
pub struct FixedClock(pub u64);

impl Clock for FixedClock {
    fn now(&self) -> u64 {
        self.0
    }
}

/// A queue that records every accepted send and every `retry_after`, and fails every send
/// while [`RecordingQueue::failing`] is set (a queue outage: a transient [`PortError`]).
/// `receive` returns nothing; `ack` does nothing. Clones share the same records.
#[derive(Clone, Debug, Default)]
pub struct RecordingQueue {
    /// Accepted sends, in order.
    pub sent: Arc<Mutex<Vec<Outgoing>>>,
    /// `(receipt handle, delay seconds)` of every `retry_after`, in order.
    pub retries: Arc<Mutex<Vec<(String, u32)>>>,
    /// While set, `send` fails.
    pub failing: Arc<AtomicBool>,
}

impl RecordingQueue {
    /// The accepted sends (a guard over [`RecordingQueue::sent`]).
    pub fn sent(&self) -> MutexGuard<'_, Vec<Outgoing>> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes every later `send` fail (`true`) or succeed (`false`).
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }
}

impl Queue for RecordingQueue {
    async fn send(&self, msg: Outgoing) -> Result<Sent, PortError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(PortError::transient("queue", "send", "injected failure"));
        }
        self.sent().push(msg);
        Ok(Sent::Queued)
    }
    async fn receive(&self, _: usize, _: u32, _: u64) -> Result<Vec<Received>, PortError> {
        Ok(vec![])
    }
    async fn ack(&self, _: &str) -> Result<(), PortError> {
        Ok(())
    }
    async fn retry_after(&self, receipt: &str, delay_secs: u32) -> Result<(), PortError> {
        self.retries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((receipt.to_owned(), delay_secs));
        Ok(())
    }
    async fn dead_letter_count(&self) -> Result<u64, PortError> {
        Ok(0)
    }
}
