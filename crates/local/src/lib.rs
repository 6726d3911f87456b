//! The embedded backend of the sandbox-lifecycle controller (local mode, the default):
//!
//! | port | adapter | storage |
//! |---|---|---|
//! | [`Queue`](sandbox_controller::ports::Queue) | [`SqliteQueue`] (FIFO or standard) | SQLite tables `queue_*` |
//! | [`Registry`](sandbox_controller::ports::Registry) | [`SqliteRegistry`] | SQLite tables `registry_*` |
//! | [`Compute`](sandbox_controller::ports::Compute) | [`ProcessCompute`] (child processes) | SQLite table `compute_instances` |
//!
//! All three can share one database file (WAL mode; every call runs on tokio's blocking
//! pool) and pass the shared contract suite in `sandbox_controller::contract`. Units: times
//! in the port API are Unix seconds; queue timestamps are stored as Unix milliseconds.
//!
//! ```no_run
//! use sandbox_local::{QueueOptions, SqliteQueue, SqliteRegistry};
//! # fn main() -> Result<(), sandbox_controller::ports::PortError> {
//! let events = SqliteQueue::open("state.db", "events", QueueOptions::fifo())?;
//! let timers = SqliteQueue::open("state.db", "timers", QueueOptions::standard())?;
//! let registry = SqliteRegistry::open("state.db")?;
//! # let _ = (events, timers, registry);
//! # Ok(())
//! # }
//! ```
#![deny(clippy::all)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod db;
pub mod embedded;
pub mod executor_relay;
pub mod operator_key;
pub mod private;
mod proc_tree;
pub mod process_compute;
pub mod settings_file;
pub mod sqlite_queue;
pub mod sqlite_registry;
pub mod supervise;
pub mod workspace_archive;

pub use process_compute::{
    ExecutorCommand, ExecutorKey, ExitInfo, KeySource, ProcessCompute, ProcessComputeConfig,
    ProcessInfo,
};
pub use sqlite_queue::{DeadLetter, QueueOptions, QueueStats, SqliteQueue};
pub use sqlite_registry::SqliteRegistry;
