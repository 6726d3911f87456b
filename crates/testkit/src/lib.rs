//! Test kit of the controller: in-memory twins of every port, decorators that count calls
//! and inject faults, the call budgets, and a deterministic simulation with crashes.
//!
//! - Twins ([`queue`], [`registry`], [`compute`], [`sessions`], [`clock`]) keep their
//!   state in memory and pass the shared contract suite of
//!   `sandbox_controller::contract` (`tests/twin_contract.rs`), so what holds over them
//!   holds over any backend that passes it. Clones of a twin share its state.
//! - Decorators: [`counting::Counting`] logs every call per port and operation (read or
//!   write); [`faulty::Faulty`] fails calls on demand (throttling, timeouts, 5xx, lost
//!   responses, failed starts with HTTP 200, `MISSING` read-backs, conditional-check
//!   failures); [`interleave::Interleaved`] makes every call a scheduling point.
//! - [`world::World`] wires a controller over decorated twins; [`budgets`] measures the
//!   remote calls of each transition (printed by `make bench`, bounded by
//!   `tests/call_budgets.rs`); [`sim`] runs one seeded schedule of workers, sweeper and
//!   operator with crashes, lost and duplicated messages (`tests/simulation.rs`).
//!
//! All times are Unix seconds unless a name says `_ms` (milliseconds).
#![forbid(unsafe_code)]
#![deny(clippy::all)]
#![warn(missing_docs)]

pub mod budgets;
pub mod clock;
pub mod compute;
pub mod counting;
pub mod fargate_time;
pub mod faulty;
pub mod interleave;
pub mod queue;
pub mod recheck_delay;
pub mod registry;
pub mod rng;
pub mod scale;
pub mod sessions;
pub mod sim;
pub mod world;

pub use budgets::{Transition, measure_transitions, measure_transitions_async};
pub use clock::SimClock;
pub use compute::{
    AwsLike, ComputeEvent, ComputeTiming, EcsAnswers, EcsCalls, SnapshotTiming, Throttle,
    TwinCompute,
};
pub use counting::{Access, Call, CallCounts, CallLog, Counting};
pub use faulty::{Fault, FaultPlan, Faulty};
pub use interleave::{Interleaved, Scheduler};
pub use queue::TwinQueue;
pub use registry::TwinRegistry;
pub use rng::SimRng;
pub use sessions::TwinSessions;
pub use world::World;
