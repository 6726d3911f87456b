//! ECS calls per worker job and per sweep at N environments, and the sweep's wall time on
//! the twins, from [`sandbox_testkit::scale::measure_scale_table`]. ECS calls
//! are counted as the AWS adapter makes them (`ListTasks` pages and `DescribeTasks` per
//! 100 tasks; see `sandbox_testkit::compute`). Registry items read per sweep and
//! per job, registry writes of the no-effect sweep and queue calls of the fan-out, each
//! with no history and with days of simulated history
//! ([`sandbox_testkit::scale::measure_scale_with_history`]).

use sandbox_testkit::compute::EcsCalls;
use sandbox_testkit::scale::measure_scale_table_with_history;
use serde::{Deserialize, Serialize};

/// ECS calls by action.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Calls {
    /// `RunTask`.
    pub run_task: u64,
    /// `DescribeTasks`.
    pub describe_tasks: u64,
    /// `ListTasks` pages.
    pub list_tasks: u64,
    /// `StopTask`.
    pub stop_task: u64,
    /// All of them.
    pub total: u64,
}

impl From<EcsCalls> for Calls {
    fn from(c: EcsCalls) -> Self {
        Self {
            run_task: c.run_task,
            describe_tasks: c.describe_tasks,
            list_tasks: c.list_tasks,
            stop_task: c.stop_task,
            total: c.total(),
        }
    }
}

/// One row (`scale.json` is a list of these).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Scaled {
    /// Environments in the deployment.
    pub environments: usize,
    /// A start job.
    pub start: Calls,
    /// A second connection request right after the start.
    pub reuse_wait: Calls,
    /// An idle job that schedules a shutdown lease.
    pub idle_lease: Calls,
    /// The lease-due job that stops the task.
    pub lease_stop: Calls,
    /// One in-place sweep with nothing to do.
    pub sweep: Calls,
    /// The bound for it: 3 × ⌈N/100⌉.
    pub sweep_bound: u64,
    /// Its decisions other than `ignore` (0: no effect).
    pub sweep_not_ignored: usize,
    /// Its wall time, milliseconds.
    pub sweep_ms: f64,
    /// One fanned-out sweep (read + sends to the timers queue).
    pub fan_out: Calls,
    /// Its wall time, milliseconds.
    pub fan_out_ms: f64,
    /// Days of simulated history before the measurement (0: none).
    #[serde(default)]
    pub history_days: u64,
    /// Records that are not closed.
    #[serde(default)]
    pub open_records: usize,
    /// Registry items the fanned-out sweep read (the sweeper's own read).
    #[serde(default)]
    pub sweep_items_read: u64,
    /// Registry items the in-place sweep read, its N jobs included.
    #[serde(default)]
    pub sweep_with_jobs_items_read: u64,
    /// Registry items read by the most expensive of the measured jobs.
    #[serde(default)]
    pub job_items_read: u64,
    /// Registry writes of the no-effect sweep.
    #[serde(default)]
    pub sweep_registry_writes: usize,
    /// Queue calls of the fanned-out sweep.
    #[serde(default)]
    pub fan_out_queue_calls: usize,
}

/// Measures one row per size and days of history.
pub fn measure(sizes: &[usize], history_days: &[u64]) -> Vec<Scaled> {
    measure_scale_table_with_history(sizes, history_days)
        .into_iter()
        .map(|r| Scaled {
            environments: r.environments,
            start: r.start.into(),
            reuse_wait: r.reuse_wait.into(),
            idle_lease: r.idle_lease.into(),
            lease_stop: r.lease_stop.into(),
            sweep: r.sweep.into(),
            sweep_bound: r.sweep_bound(),
            sweep_not_ignored: r.sweep_not_ignored,
            sweep_ms: r.sweep_ms,
            fan_out: r.fan_out.into(),
            fan_out_ms: r.fan_out_ms,
            history_days: r.history_days,
            open_records: r.open_records,
            sweep_items_read: r.fan_out_items_read,
            sweep_with_jobs_items_read: r.sweep_items_read,
            job_items_read: r.job_items_read.iter().copied().max().unwrap_or(0),
            sweep_registry_writes: r.sweep_registry_writes,
            fan_out_queue_calls: r.fan_out_queue_calls,
        })
        .collect()
}
