//! Remote calls per transition (start, duplicate delivery, idle, stop, sweep of an idle
//! environment), from [`sandbox_testkit::budgets::measure_transitions`]: counting
//! decorators over the in-memory twins of every port. A remote call is one that leaves
//! the process in production (Agents API, registry, compute); queue calls are the job's
//! transport and are listed apart.

use sandbox_testkit::budgets::{
    DUPLICATE_MAX_REMOTE_READS, DUPLICATE_MAX_REMOTE_WRITES, START_MAX_REMOTE_CALLS,
    measure_transitions,
};
use serde::{Deserialize, Serialize};

/// One transition's counts (`transitions.json` is a list of these).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Counted {
    /// `start`, `duplicate delivery`, ...
    pub name: String,
    /// What was measured.
    pub description: String,
    /// The decision's outcome (or the note when nothing was decided).
    pub outcome: String,
    /// Remote calls in all.
    pub remote: usize,
    /// Remote reads.
    pub reads: usize,
    /// Remote writes.
    pub writes: usize,
    /// Agents API calls.
    pub agents_api: usize,
    /// Registry calls.
    pub registry: usize,
    /// Compute provider calls.
    pub compute: usize,
    /// Queue calls (not remote calls).
    pub queue: usize,
    /// Every call as `port.operation`, in order.
    pub calls: Vec<String>,
    /// The target for this transition, if it has one.
    pub target: Option<String>,
    /// Whether the target is met (`None` without a target).
    pub met: Option<bool>,
}

/// Measures every transition.
pub fn measure() -> Vec<Counted> {
    measure_transitions()
        .into_iter()
        .map(|t| {
            let (target, met) = match t.name {
                "start" => (
                    Some(format!("≤ {START_MAX_REMOTE_CALLS} remote calls")),
                    Some(t.remote() <= START_MAX_REMOTE_CALLS),
                ),
                "duplicate delivery" => (
                    Some(format!(
                        "≤ {DUPLICATE_MAX_REMOTE_READS} remote reads, {DUPLICATE_MAX_REMOTE_WRITES} writes"
                    )),
                    Some(
                        t.remote_reads() <= DUPLICATE_MAX_REMOTE_READS
                            && t.remote_writes() == DUPLICATE_MAX_REMOTE_WRITES,
                    ),
                ),
                _ => (None, None),
            };
            Counted {
                name: t.name.to_owned(),
                description: t.description.to_owned(),
                outcome: t.outcome.clone(),
                remote: t.remote(),
                reads: t.remote_reads(),
                writes: t.remote_writes(),
                agents_api: t.counts.of_port("agents_api"),
                registry: t.counts.of_port("registry"),
                compute: t.counts.of_port("compute"),
                queue: t.queue_calls(),
                calls: t
                    .counts
                    .calls
                    .iter()
                    .map(|c| format!("{}.{}", c.port, c.op))
                    .collect(),
                target,
                met,
            }
        })
        .collect()
}
