//! Simulated Fargate time to executor, warm (a claimed pool member) and cold (a new
//! task), from [`sandbox_testkit::fargate_time`]: the real controller on the twins with
//! Fargate's 30–60 s to `RUNNING` and the member forwarder's one-second poll of its item.
//! Target: warm p99 ≤ 2 s. Simulated time: the same seed gives the same figures on any
//! machine.

use sandbox_testkit::fargate_time::{PathTimes, measure_fargate_time};
use serde::{Deserialize, Serialize};

/// One path's figures, simulated milliseconds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct FargatePath {
    /// `warm` or `cold`.
    pub path: String,
    /// Sessions.
    pub sessions: usize,
    /// Median, ms.
    pub p50_ms: u64,
    /// 99th percentile, ms.
    pub p99_ms: u64,
    /// Largest, ms.
    pub max_ms: u64,
    /// Warm requests that found no running member.
    pub misses: usize,
}

fn row(path: &str, t: &PathTimes) -> FargatePath {
    FargatePath {
        path: path.to_owned(),
        sessions: t.ms.len(),
        p50_ms: t.quantile(0.5),
        p99_ms: t.quantile(0.99),
        max_ms: t.quantile(1.0),
        misses: t.misses,
    }
}

/// Both paths, `sessions` each, from `seed`.
///
/// # Panics
/// As [`measure_fargate_time`].
pub async fn measure(sessions: usize, seed: u64) -> Vec<FargatePath> {
    let t = measure_fargate_time(sessions, seed).await;
    vec![row("warm", &t.warm), row("cold", &t.cold)]
}
