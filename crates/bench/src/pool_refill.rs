//! The warm pool's refill at scale (docs/WARM_POOL.md "Refill"): the remote calls of one
//! refill of a full pool after it has handed out N members, on the compute twin, whose
//! [`PoolCalls`](sandbox_testkit::compute::PoolCalls) count them as the AWS adapter makes
//! them (`crates/aws/src/ecs_pool.rs`; the same breakdown is asserted against moto by
//! `pool_refill_calls_do_not_grow_with_claimed_members` in `crates/aws/tests/moto`).
//! Target: the same calls at every N, since the reconcile reads the pool's own partition
//! and one `ListTasks` page, never the members it handed out.

use sandbox_controller::config::PoolSettings;
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{EnvironmentId, Generation, SessionId, idempotency_token};
use sandbox_testkit::world::World;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The pool size of the measured refills.
pub const POOL_SIZE: u32 = 10;

/// One row: a refill after `claimed` members were handed out.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RefillCalls {
    /// Members claimed (live, each its environment's executor).
    pub claimed: usize,
    /// The refill's calls by `service.Operation`.
    pub calls: BTreeMap<String, u64>,
    /// Their sum.
    pub total: u64,
    /// Members the refill started (the pool was full: 0).
    pub started: usize,
}

/// A refill's calls at each size of `sizes` (claimed members), each on a fresh world:
/// fill the pool, claim `claimed` members (the pool refilled every [`POOL_SIZE`] claims, as
/// after each batch), then one measured refill of the full pool.
///
/// # Panics
/// When a twin call fails (the strict twin never fails these).
pub async fn measure(sizes: &[usize]) -> Vec<RefillCalls> {
    let mut rows = Vec::with_capacity(sizes.len());
    for &claimed in sizes {
        let world = World::new();
        let mut config = World::config("bench-pool");
        config.pool = PoolSettings {
            size: POOL_SIZE,
            max_age_secs: 3_600,
        };
        let c = world.controller_with(config);
        let d = World::deployment();
        c.refill_pool().await.expect("fill");
        for n in 0..claimed {
            let env = EnvironmentId::new(format!("env_{n}"));
            let spec = StartSpec {
                session_id: SessionId::new(format!("sess_{n}")),
                remote_url: format!("wss://agents.twin.invalid/v1/environments/env_{n}/connect"),
                workspace_directory: "/workspace".to_owned(),
                generation: Generation(1),
                idempotency_token: idempotency_token(&env, Generation(1)),
                environment_id: env,
                previous: None,
                restore: None,
            };
            use sandbox_controller::ports::Compute as _;
            let got = world
                .compute
                .claim_pool_member(&spec, &d, 0, u64::MAX)
                .await
                .expect("claim");
            assert!(got.is_some(), "a member for claim {n}");
            if (n + 1) % POOL_SIZE as usize == 0 {
                c.refill_pool().await.expect("refill");
            }
        }
        c.refill_pool().await.expect("top up");
        world.compute.take_pool_calls();
        let r = c.refill_pool().await.expect("measured refill");
        let calls = world.compute.take_pool_calls();
        rows.push(RefillCalls {
            claimed,
            total: calls.values().sum(),
            calls,
            started: r.started,
        });
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The twin's count is the adapter's: the same breakdown
    /// `pool_refill_calls_do_not_grow_with_claimed_members` asserts against moto with the
    /// real adapter (crates/aws/tests/moto/pool_reconcile.rs), at 10 and 1,000 claimed.
    #[tokio::test]
    async fn the_twin_counts_the_refill_as_the_adapter_makes_it() {
        let expected: BTreeMap<String, u64> = [
            ("dynamodb.UpdateItem", 2),
            ("dynamodb.GetItem", 1),
            ("dynamodb.PutItem", 1),
            ("dynamodb.Query", 2),
            ("dynamodb.BatchGetItem", 1),
            ("ecs.DescribeTasks", 2),
            ("ecs.ListTasks", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let rows = measure(&[10, 1_000]).await;
        for r in &rows {
            assert_eq!(r.calls, expected, "{} claimed", r.claimed);
            assert_eq!((r.total, r.started), (10, 0));
        }
    }
}
