//! Shared test support: the moto endpoint, SDK clients (ECS ones behind
//! `sandbox_aws::strict_ecs::StrictEcs`), unique names, moto's control API, ECS fixtures
//! and a tiny ECS JSON-protocol stub (the fixtures and the stub live in
//! `sandbox_aws::bootstrap`; these wrappers panic instead of returning errors).

use aws_config::SdkConfig;
use sandbox_aws::load_sdk_config;
use sandbox_aws::strict_ecs::StrictEcs;
use std::sync::atomic::{AtomicU64, Ordering};

/// The moto endpoint from `MOTO_ENDPOINT`. Panics (never skips) when it is unset.
pub fn endpoint() -> String {
    match std::env::var("MOTO_ENDPOINT") {
        Ok(v) if !v.is_empty() => v.trim_end_matches('/').to_owned(),
        _ => panic!(
            "MOTO_ENDPOINT is not set: these tests need moto. Run them through the runner, \
             which starts moto_server on 127.0.0.1 and sets MOTO_ENDPOINT and test \
             credentials: `tests/moto/run.sh cargo nextest run -p sandbox-aws` (from the \
             workspace root; install moto first with `.venv/bin/pip install -r \
             tests/moto/requirements.txt`)"
        ),
    }
}

/// The SDK configuration pointed at moto.
pub async fn sdk() -> SdkConfig {
    load_sdk_config(Some(&endpoint())).await
}

/// An ECS client on moto behind its own [`StrictEcs`] (requests the ECS API reference
/// forbids are refused, every request is recorded), and that interceptor.
pub async fn strict_ecs() -> (aws_sdk_ecs::Client, StrictEcs) {
    let guard = StrictEcs::new();
    (guard.client(&sdk().await), guard)
}

/// A short unique token for names: wall-clock nanoseconds, process id, a counter.
pub fn unique() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:x}{:x}{n:x}",
        nanos & 0xff_ffff_ffff,
        std::process::id() & 0xffff
    )
}

/// Now, Unix seconds.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Pins moto's ECS tasks in their status (moto otherwise advances a task one status step
/// per DescribeTasks call). Global to the moto server and idempotent.
pub async fn pin_ecs_tasks() {
    sandbox_aws::bootstrap::moto_pin_ecs_tasks(&endpoint())
        .await
        .expect("moto set-transition");
}

/// A subnet of moto's default VPC and that VPC's default security group (see
/// [`sandbox_aws::bootstrap::moto_default_network`]).
pub async fn default_network() -> (String, String) {
    sandbox_aws::bootstrap::moto_default_network(&endpoint())
        .await
        .expect("default network")
}

/// The executor container's name in the test task definitions.
pub const CONTAINER: &str = "executor";

/// Creates cluster `cluster` and registers a FARGATE/awsvpc task definition `family`
/// shaped like production (see [`sandbox_aws::bootstrap::register_task_definition`]).
/// Returns the task definition ARN.
pub async fn ecs_fixture(ecs: &aws_sdk_ecs::Client, cluster: &str, family: &str) -> String {
    ecs.create_cluster()
        .cluster_name(cluster)
        .send()
        .await
        .expect("CreateCluster");
    sandbox_aws::bootstrap::register_task_definition(ecs, family, CONTAINER)
        .await
        .expect("RegisterTaskDefinition")
}

pub use sandbox_aws::bootstrap::EcsStub;
