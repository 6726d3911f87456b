//! How late a due lease recheck is handled while a sweep of N environments is in flight,
//! with the sweep's jobs on their own queue (deployed) and, as the control, on the timers
//! queue among the rechecks: [`sandbox_testkit::recheck_delay`] (the real controller on
//! the twins, simulated time; the same measurement `sweep_jobs_never_delay_rechecks`
//! asserts in `crates/testkit/tests/sweep_queue.rs`). Target: 0 s with the sweep queue.

use sandbox_testkit::recheck_delay::{Arrangement, RecheckLoad, measure_recheck_delay};
use serde::{Deserialize, Serialize};

/// One row: one arrangement at one deployment size.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RecheckDelayRow {
    /// Environments (one sweep job each).
    pub environments: usize,
    /// `sweep queue` or `one queue`.
    pub arrangement: String,
    /// Messages one queue's event source mapping handles per simulated second.
    pub jobs_per_sec: usize,
    /// The sweep interval the fan-out spreads over, seconds.
    pub sweep_interval_secs: u64,
    /// Lease rechecks that fell due while the sweep was in flight.
    pub rechecks: usize,
    /// Their delay past the due time, simulated seconds: median, 99th percentile, largest.
    pub p50_secs: u64,
    /// 99th percentile, seconds.
    pub p99_secs: u64,
    /// Largest, seconds.
    pub max_secs: u64,
    /// Sweep jobs sent and handled.
    pub sweep_jobs: usize,
}

fn name(a: Arrangement) -> &'static str {
    match a {
        Arrangement::SweepQueue => "sweep queue",
        Arrangement::OneQueue => "one queue",
    }
}

/// Both arrangements at each of `sizes` ([`RecheckLoad::at`]).
///
/// # Panics
/// As [`measure_recheck_delay`].
pub async fn measure(sizes: &[usize]) -> Vec<RecheckDelayRow> {
    let mut rows = Vec::new();
    for &n in sizes {
        for a in [Arrangement::SweepQueue, Arrangement::OneQueue] {
            let load = RecheckLoad::at(n);
            let m = measure_recheck_delay(load, a).await;
            rows.push(RecheckDelayRow {
                environments: n,
                arrangement: name(a).to_owned(),
                jobs_per_sec: load.jobs_per_sec,
                sweep_interval_secs: load.sweep_interval_secs,
                rechecks: m.delays_secs.len(),
                p50_secs: m.quantile(0.5),
                p99_secs: m.quantile(0.99),
                max_secs: m.max(),
                sweep_jobs: m.sweep_jobs_handled,
            });
        }
    }
    rows
}
