//! The simulated clock: scaled real time plus manual advances.
//!
//! Simulated time is what the simulated API reports and measures: `created_at`,
//! `last_active_at`, the envelope `created_at` of webhook events, turn durations and the
//! input-time connection deadline. It starts at the real Unix time when the clock is built
//! and runs `time_scale` times faster than real time (`time_scale = 60.0`: one real second
//! is one simulated minute, so the 300 s connection deadline passes in 5 real seconds);
//! [`SimClock::advance`] jumps it forward. `time_scale = 0.0` freezes it: it then moves
//! only by [`SimClock::advance`] (a fully manual clock for tests).
//!
//! The `webhook-timestamp` header is *not* simulated time: receivers check it against their
//! real clock (±300 s), so deliveries are signed with the real wall clock
//! ([`real_unix_secs`]).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// The real wall-clock time in whole Unix seconds (used for `webhook-timestamp`).
pub fn real_unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn real_unix_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// A cheaply clonable simulated clock (see the module docs).
#[derive(Clone, Debug)]
pub struct SimClock {
    inner: Arc<ClockInner>,
}

#[derive(Debug)]
struct ClockInner {
    start_real: Instant,
    start_unix: f64,
    time_scale: f64,
    /// Total manual advance in simulated seconds; every change wakes sleepers.
    offset: watch::Sender<f64>,
}

impl SimClock {
    /// A clock starting at the real current Unix time and running `time_scale` simulated
    /// seconds per real second (`0.0` = manual only). Negative or non-finite scales are
    /// treated as `0.0`.
    pub fn new(time_scale: f64) -> Self {
        let time_scale = if time_scale.is_finite() && time_scale > 0.0 {
            time_scale
        } else {
            0.0
        };
        Self {
            inner: Arc::new(ClockInner {
                start_real: Instant::now(),
                start_unix: real_unix_f64(),
                time_scale,
                offset: watch::Sender::new(0.0),
            }),
        }
    }

    /// Simulated seconds per real second (`0.0` for a manual clock).
    pub fn time_scale(&self) -> f64 {
        self.inner.time_scale
    }

    /// The simulated time now, in fractional Unix seconds.
    pub fn now(&self) -> f64 {
        let elapsed = self.inner.start_real.elapsed().as_secs_f64();
        self.inner.start_unix + elapsed * self.inner.time_scale + *self.inner.offset.borrow()
    }

    /// The simulated time now, in whole Unix seconds (what API objects carry).
    pub fn now_secs(&self) -> i64 {
        self.now().floor() as i64
    }

    /// Moves simulated time forward by `secs` simulated seconds (ignored unless positive
    /// and finite) and wakes every [`SimClock::sleep_until`].
    pub fn advance(&self, secs: f64) {
        if secs.is_finite() && secs > 0.0 {
            self.inner.offset.send_modify(|o| *o += secs);
        }
    }

    /// The real time that `sim_secs` simulated seconds take at the current scale, or
    /// `None` for a manual clock (they never pass by themselves).
    pub fn real_duration(&self, sim_secs: f64) -> Option<Duration> {
        if self.inner.time_scale <= 0.0 {
            return None;
        }
        let real = (sim_secs.max(0.0) / self.inner.time_scale).min(86_400.0);
        Some(Duration::from_secs_f64(real))
    }

    /// Waits until simulated time reaches `deadline` (fractional Unix seconds), whether by
    /// the passing of real time or by [`SimClock::advance`].
    pub async fn sleep_until(&self, deadline: f64) {
        let mut advanced = self.inner.offset.subscribe();
        loop {
            advanced.borrow_and_update();
            let remaining = deadline - self.now();
            if remaining <= 0.0 {
                return;
            }
            match self.real_duration(remaining) {
                // A small floor avoids a busy loop on float rounding near the deadline.
                Some(real) => {
                    tokio::select! {
                        () = tokio::time::sleep(real.max(Duration::from_millis(1))) => {}
                        _ = advanced.changed() => {}
                    }
                }
                None => {
                    if advanced.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// Waits `secs` simulated seconds from now.
    pub async fn sleep(&self, secs: f64) {
        let deadline = self.now() + secs;
        self.sleep_until(deadline).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_near_real_time_and_advances() {
        let c = SimClock::new(0.0);
        let real = real_unix_secs() as i64;
        assert!((c.now_secs() - real).abs() <= 1);
        c.advance(300.0);
        assert!((c.now_secs() - real - 300).abs() <= 1);
        c.advance(-5.0);
        c.advance(f64::NAN);
        assert!((c.now_secs() - real - 300).abs() <= 1);
        assert_eq!(c.real_duration(10.0), None);
    }

    #[test]
    fn scale_converts_durations() {
        let c = SimClock::new(60.0);
        assert_eq!(c.real_duration(60.0), Some(Duration::from_secs(1)));
        assert_eq!(SimClock::new(-3.0).time_scale(), 0.0);
    }

    #[tokio::test]
    async fn manual_clock_sleeper_wakes_on_advance() {
        let c = SimClock::new(0.0);
        let deadline = c.now() + 100.0;
        let c2 = c.clone();
        let sleeper = tokio::spawn(async move { c2.sleep_until(deadline).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!sleeper.is_finished());
        c.advance(50.0);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!sleeper.is_finished());
        c.advance(51.0);
        tokio::time::timeout(Duration::from_secs(2), sleeper)
            .await
            .expect("woke")
            .expect("joined");
    }

    #[tokio::test]
    async fn fast_clock_passes_simulated_minutes_quickly() {
        let c = SimClock::new(6000.0);
        let t = Instant::now();
        c.sleep(300.0).await; // 50 ms real
        assert!(t.elapsed() < Duration::from_secs(2));
    }
}
