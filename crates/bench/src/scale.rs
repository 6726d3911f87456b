//! ECS calls per worker job and per sweep at N environments, and the sweep's wall time on
//! the twins, from [`sandbox_testkit::scale::measure_scale_table`] (issue 11). ECS calls
//! are counted as the AWS adapter makes them (`ListTasks` pages and `DescribeTasks` per
//! 100 tasks; see `sandbox_testkit::compute`).

use sandbox_testkit::compute::EcsCalls;
use sandbox_testkit::scale::measure_scale_table;
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
}

/// Measures one row per size.
pub fn measure(sizes: &[usize]) -> Vec<Scaled> {
    measure_scale_table(sizes)
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
        })
        .collect()
}
