//! The benchmarks of docs/PERFORMANCE.md, run by `make bench` (mk/bench.mk):
//!
//! - [`deliveries`] — signed 1 KiB deliveries, written to a file so that the criterion
//!   benches (`benches/webhook_intake.rs`) and the official Python SDK
//!   (`scripts/bench/python_verify.py`) time the very same bytes;
//! - [`decide_cases`] — the observations `benches/decide.rs` times `decide()` on;
//! - [`cold_start`] — exec of the webhook bootstrap against a Lambda Runtime API stub and a
//!   Secrets Manager + SQS stub on 127.0.0.1, to the first event answered; binary size and
//!   peak RSS;
//! - [`throughput`] — worker throughput on the embedded backend (SQLite queue and registry)
//!   against the Agents API simulator, with duplicate deliveries, exactly-once asserted;
//! - [`transitions`] — remote calls per transition, counted by `sandbox-testkit`'s
//!   counting ports over its twins;
//! - [`time_to_executor`] — connection request → environment `connected` in
//!   local mode, warm (pool claims) and cold, with the real pinned codex executor when it
//!   is installed and the stand-in, and the controller's own share;
//! - [`pool_refill`] — the warm pool's refill: its remote calls after 100 / 1,000 /
//!   10,000 members handed out, on the compute twin (flat: docs/WARM_POOL.md "Refill");
//! - [`report`] — one table (stdout) and one JSON document from all of the above.
//!
//! Each measurement writes its own JSON file into the bench directory; [`report`] reads
//! them back, so a step can be re-run alone.
#![forbid(unsafe_code)]
#![deny(clippy::all)]
#![warn(missing_docs)]

pub mod cold_start;
pub mod decide_cases;
pub mod deliveries;
pub mod doubles;
pub mod fargate_time;
pub mod machine;
pub mod pool_refill;
pub mod recheck_delay;
pub mod report;
pub mod scale;
pub mod throughput;
pub mod time_to_executor;
pub mod transitions;
