//! The AWS adapters against moto (`tests/moto/run.sh cargo nextest run -p sandbox-aws`):
//! the shared contract suites plus adapter specifics. Every test uses its own queues,
//! table or clusters (unique names), so they run in parallel on one moto server. Without
//! `MOTO_ENDPOINT` every test fails with a message naming the runner.

mod compute;
mod pool;
mod pool_reconcile;
mod queue;
mod registry;
mod sdk_config;
mod secrets;
mod support;
mod workspaces;
