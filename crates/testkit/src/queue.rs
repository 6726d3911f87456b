//! The queue twin: SQS semantics in memory, for the FIFO events queue and the standard
//! (delay) timers queue.
//!
//! - FIFO: messages of one group come in order, one at a time: a group is blocked while
//!   its oldest message is in flight or hidden by `retry_after`; a send whose dedup id was
//!   sent within the de-duplication window (5 minutes, as SQS) is dropped and reported
//!   [`Sent::Duplicate`]; `delay_secs > 0` is rejected.
//! - Standard: no ordering, no de-duplication; `delay_secs` ≤ 900 hides a message.
//! - Both: a received message is hidden for its visibility timeout; its receive count
//!   grows by one per receive; a message already received `max_receive_count` times goes
//!   to the dead-letter queue on its next receive instead of being delivered.
//!
//! Time comes from a [`SimClock`]; with a wall clock, `receive` long-polls for real (the
//! contract suite), with a manual clock it never waits.

use crate::clock::SimClock;
use sandbox_controller::ports::{Outgoing, PortError, Queue, Received, Sent};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// SQS FIFO de-duplication interval, milliseconds (5 minutes).
pub const DEDUP_WINDOW_MS: u64 = 300_000;
/// Largest `delay_secs` a standard queue accepts (SQS limit), seconds.
pub const MAX_DELAY_SECS: u32 = 900;

/// The kind of queue a twin imitates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueKind {
    /// SQS FIFO (the events queue).
    Fifo,
    /// SQS standard (the timers queue).
    Standard,
}

/// One stored message (inspection view).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredMessage {
    /// The outgoing message as sent.
    pub msg: Outgoing,
    /// Provider message id.
    pub message_id: String,
    /// Receives so far.
    pub receive_count: u32,
    /// When the message is (next) visible, Unix milliseconds.
    pub visible_at_ms: u64,
    /// Whether it was received at least once and not settled since (in flight or hidden
    /// by a retry).
    pub received: bool,
}

#[derive(Debug)]
struct Stored {
    view: StoredMessage,
    receipt: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    messages: Vec<Stored>,
    /// dedup id → retained until (Unix ms).
    dedup: BTreeMap<String, u64>,
    dead_letters: Vec<StoredMessage>,
}

/// An in-memory queue with SQS semantics. Clones share the same queue.
#[derive(Clone, Debug)]
pub struct TwinQueue {
    kind: QueueKind,
    max_receive_count: u32,
    clock: SimClock,
    state: Arc<Mutex<State>>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl TwinQueue {
    /// A FIFO queue dead-lettering after `max_receive_count` receives.
    pub fn fifo(clock: SimClock, max_receive_count: u32) -> Self {
        Self::new(QueueKind::Fifo, clock, max_receive_count)
    }

    /// A standard queue dead-lettering after `max_receive_count` receives.
    pub fn standard(clock: SimClock, max_receive_count: u32) -> Self {
        Self::new(QueueKind::Standard, clock, max_receive_count)
    }

    /// A queue of `kind`.
    pub fn new(kind: QueueKind, clock: SimClock, max_receive_count: u32) -> Self {
        Self {
            kind,
            max_receive_count: max_receive_count.max(1),
            clock,
            state: Arc::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every message not yet deleted or dead-lettered, oldest first.
    pub fn messages(&self) -> Vec<StoredMessage> {
        self.state()
            .messages
            .iter()
            .map(|m| m.view.clone())
            .collect()
    }

    /// Messages not yet deleted or dead-lettered.
    pub fn len(&self) -> usize {
        self.state().messages.len()
    }

    /// Whether no message is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The dead-lettered messages, oldest first.
    pub fn dead_letters(&self) -> Vec<StoredMessage> {
        self.state().dead_letters.clone()
    }

    /// Moves every dead letter back to the queue (receive count reset, visible now), as
    /// an SQS DLQ redrive does. Returns how many moved.
    pub fn redrive(&self) -> usize {
        let now = self.clock.now_ms();
        let mut s = self.state();
        let dead = std::mem::take(&mut s.dead_letters);
        let n = dead.len();
        for mut view in dead {
            view.receive_count = 0;
            view.visible_at_ms = now;
            view.received = false;
            s.messages.push(Stored {
                view,
                receipt: None,
            });
        }
        n
    }

    /// The earliest time any stored message becomes visible, Unix milliseconds.
    pub fn next_visible_at_ms(&self) -> Option<u64> {
        self.state()
            .messages
            .iter()
            .map(|m| m.view.visible_at_ms)
            .min()
    }

    /// Removes every stored message whose job matches `lose` (a lost message, for
    /// simulations). Returns how many were removed.
    pub fn lose_where(&self, lose: impl Fn(&StoredMessage) -> bool) -> usize {
        let mut s = self.state();
        let before = s.messages.len();
        s.messages.retain(|m| !lose(&m.view));
        before - s.messages.len()
    }

    fn take_visible(&self, max: usize, visibility_secs: u32) -> Vec<Received> {
        let now = self.clock.now_ms();
        let mut s = self.state();
        let mut out = Vec::new();
        let mut blocked: HashSet<String> = HashSet::new();
        let mut i = 0;
        while i < s.messages.len() && out.len() < max {
            let fifo = self.kind == QueueKind::Fifo;
            let group = s.messages[i].view.msg.group.clone();
            if fifo && blocked.contains(&group) {
                i += 1;
                continue;
            }
            if s.messages[i].view.visible_at_ms > now {
                if fifo {
                    blocked.insert(group);
                }
                i += 1;
                continue;
            }
            if s.messages[i].view.receive_count >= self.max_receive_count {
                let dead = s.messages.remove(i);
                s.dead_letters.push(dead.view);
                continue;
            }
            let m = &mut s.messages[i];
            m.view.receive_count += 1;
            m.view.visible_at_ms = now + u64::from(visibility_secs) * 1_000;
            m.view.received = true;
            let receipt = format!(
                "rcpt-{}-{}",
                m.view.message_id,
                NEXT_ID.fetch_add(1, Ordering::Relaxed)
            );
            m.receipt = Some(receipt.clone());
            out.push(Received {
                receipt,
                message_id: m.view.message_id.clone(),
                job: m.view.msg.job.clone(),
                receive_count: m.view.receive_count,
            });
            if fifo {
                blocked.insert(group);
            }
            i += 1;
        }
        out
    }
}

impl Queue for TwinQueue {
    async fn send(&self, msg: Outgoing) -> Result<Sent, PortError> {
        if self.kind == QueueKind::Fifo && msg.delay_secs > 0 {
            return Err(PortError::permanent(
                "queue",
                "send",
                "a FIFO queue rejects a per-message delay",
            ));
        }
        if msg.delay_secs > MAX_DELAY_SECS {
            return Err(PortError::permanent(
                "queue",
                "send",
                format!("delay_secs {} exceeds {MAX_DELAY_SECS}", msg.delay_secs),
            ));
        }
        let now = self.clock.now_ms();
        let mut s = self.state();
        if self.kind == QueueKind::Fifo {
            s.dedup.retain(|_, until| *until > now);
            if s.dedup.contains_key(&msg.dedup_id) {
                return Ok(Sent::Duplicate);
            }
            s.dedup.insert(msg.dedup_id.clone(), now + DEDUP_WINDOW_MS);
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let visible_at_ms = now + u64::from(msg.delay_secs) * 1_000;
        s.messages.push(Stored {
            view: StoredMessage {
                msg,
                message_id: format!("msg-{id}"),
                receive_count: 0,
                visible_at_ms,
                received: false,
            },
            receipt: None,
        });
        Ok(Sent::Queued)
    }

    async fn receive(
        &self,
        max: usize,
        visibility_secs: u32,
        wait_ms: u64,
    ) -> Result<Vec<Received>, PortError> {
        let deadline = self.clock.now_ms() + wait_ms;
        loop {
            let got = self.take_visible(max, visibility_secs);
            if !got.is_empty() || !self.clock.is_wall() || self.clock.now_ms() >= deadline {
                return Ok(got);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn ack(&self, receipt: &str) -> Result<(), PortError> {
        // A stale receipt (the message was received again since) deletes nothing and
        // succeeds, as SQS does.
        let mut s = self.state();
        s.messages.retain(|m| m.receipt.as_deref() != Some(receipt));
        Ok(())
    }

    async fn retry_after(&self, receipt: &str, delay_secs: u32) -> Result<(), PortError> {
        let now = self.clock.now_ms();
        let mut s = self.state();
        match s
            .messages
            .iter_mut()
            .find(|m| m.receipt.as_deref() == Some(receipt))
        {
            Some(m) => {
                m.view.visible_at_ms = now + u64::from(delay_secs) * 1_000;
                Ok(())
            }
            None => Err(PortError::permanent(
                "queue",
                "retry_after",
                "receipt handle is not current (message not in flight)",
            )),
        }
    }

    async fn dead_letter_count(&self) -> Result<u64, PortError> {
        Ok(self.state().dead_letters.len() as u64)
    }
}
