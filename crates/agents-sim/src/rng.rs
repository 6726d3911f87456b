//! A tiny seeded pseudo-random generator (SplitMix64) and the id generator.
//!
//! Faults (delivery delays, reordering, duplicate timing) draw from a generator seeded with
//! [`SimConfig::seed`](crate::SimConfig::seed), so a scenario replays the same choices.
//! Object ids draw from a separate generator seeded from the wall clock and a process-wide
//! counter, so two simulators in one process (or two runs) never hand out the same id.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// SplitMix64: small, fast, good enough for test fault injection (not cryptographic).
#[derive(Clone, Debug)]
pub struct SimRng(u64);

impl SimRng {
    /// A generator whose whole sequence is determined by `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `lo..=hi` (returns `lo` when `hi <= lo`).
    pub fn range_inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        let span = hi - lo;
        if span == u64::MAX {
            return self.next_u64();
        }
        lo + self.next_u64() % (span + 1)
    }

    /// Fisher–Yates shuffle in place.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.range_inclusive(0, i as u64) as usize;
            items.swap(i, j);
        }
    }
}

static ID_STREAMS: AtomicU64 = AtomicU64::new(1);

/// Generates object ids shaped like the API's (`sess_` + 24 hex, `msg_` + 27 base62, ...).
#[derive(Debug)]
pub(crate) struct IdGen(Mutex<SimRng>);

const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

impl IdGen {
    /// A generator seeded from the wall clock (nanoseconds) and a process-wide counter.
    pub(crate) fn new() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let stream = ID_STREAMS.fetch_add(1, Ordering::Relaxed);
        let seed =
            nanos ^ stream.wrapping_mul(0xA076_1D64_78BD_642F) ^ u64::from(std::process::id());
        Self(Mutex::new(SimRng::new(seed)))
    }

    /// `prefix` + 24 lowercase hex characters (96 random bits), e.g. `sess_0e25c6de...`.
    pub(crate) fn hex(&self, prefix: &str) -> String {
        let mut rng = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (a, b) = (rng.next_u64(), rng.next_u64());
        format!("{prefix}{:016x}{:08x}", a, b >> 32)
    }

    /// `prefix` + 27 base62 characters, the shape of a Standard Webhooks `msg_` id.
    pub(crate) fn base62(&self, prefix: &str) -> String {
        let mut rng = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::with_capacity(prefix.len() + 27);
        out.push_str(prefix);
        for _ in 0..27 {
            out.push(BASE62[(rng.next_u64() % 62) as usize] as char);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_and_ranges_hold() {
        let (mut a, mut b) = (SimRng::new(7), SimRng::new(7));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
            let v = a.range_inclusive(3, 9);
            assert!((3..=9).contains(&v));
            b.range_inclusive(3, 9);
        }
        assert_eq!(a.range_inclusive(5, 5), 5);
        assert_eq!(a.range_inclusive(5, 1), 5);
    }

    #[test]
    fn shuffle_keeps_every_element() {
        let mut v: Vec<u32> = (0..20).collect();
        SimRng::new(1).shuffle(&mut v);
        let mut sorted = v.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..20).collect::<Vec<_>>());
        assert_ne!(v, sorted, "seed 1 should move something");
    }

    #[test]
    fn ids_have_the_api_shapes_and_differ_between_generators() {
        let (g1, g2) = (IdGen::new(), IdGen::new());
        let s = g1.hex("sess_");
        assert_eq!(s.len(), 5 + 24);
        assert!(s[5..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(s, g2.hex("sess_"));
        let m = g1.base62("msg_");
        assert_eq!(m.len(), 4 + 27);
        assert!(m[4..].bytes().all(|b| b.is_ascii_alphanumeric()));
    }
}
