//! The warm pool in local mode, end to end. `serve`'s embedded stack with the
//! split stand-in (`sim-executor exec-server --listen` pre-started as a pool member, its
//! forwarder spawned at the claim) and the simulator as the Agents API: a session's
//! executor is a claimed member, the environment reaches `connected` and a turn runs on it.

use sandbox_controller::ports::{Compute, Registry};
use sandbox_core::ids::EnvironmentId;
use sandbox_core::session::SessionStatus;
use sandbox_e2e::{Harness, LifecycleHarness, Options, pinned_codex, stand_in_split, wait_until};
use sandbox_local::process_compute::ExecutorCommand;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_executor_comes_from_the_pool_and_connects() {
    executor_comes_from_the_pool(stand_in_split().unwrap(), false).await;
}

/// The same with the real pinned codex as both halves, the forwarder behind the relay as
/// `serve` runs it: the pre-started member is `codex exec-server --listen`, the claim
/// spawns `codex exec-server forward`, which registers with the simulator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_codex_pool_member_is_claimed_and_relays_a_turn() {
    let codex = pinned_codex().unwrap().display().to_string();
    let split = (
        ExecutorCommand::listen(codex.clone()),
        ExecutorCommand::forward(codex),
    );
    executor_comes_from_the_pool(split, true).await;
}

async fn executor_comes_from_the_pool(split: (ExecutorCommand, ExecutorCommand), relay: bool) {
    sandbox_e2e::init_test_logs();
    let h = Harness::start(Options {
        split_executor: Some(split),
        pool_size: 1,
        relay,
        // Starting the real codex on a loaded 2-core machine can take seconds.
        sim_connect_deadline_secs: 3600.0,
        ..Options::default()
    })
    .await
    .unwrap();
    let c = h.stack().controller().clone();
    let deployment = c.config.deployment.clone();
    wait_until("a pool member is up", Duration::from_secs(30), || {
        let c = c.clone();
        let d = deployment.clone();
        async move { Ok(c.compute.list_pool(&d).await?.len() == 1) }
    })
    .await
    .unwrap();
    let member = c.compute.list_pool(&deployment).await.unwrap()[0].clone();

    let (s, env) = h.session_with_input().await.unwrap();
    h.client()
        .wait_for_status(s.id.as_str(), SessionStatus::Idle, Duration::from_secs(60))
        .await
        .unwrap();
    let live = h.live(&env).await.unwrap();
    assert_eq!(
        live.iter().map(|i| &i.instance_id).collect::<Vec<_>>(),
        vec![&member.instance_id],
        "the environment's executor is the claimed member"
    );
    let record = c
        .registry
        .get(&EnvironmentId::new(env.clone()).effect_key())
        .await
        .unwrap()
        .expect("a record");
    assert!(record.instance_from_pool, "recorded as warm: {record:?}");
    let turns = h.client().list_turns(s.id.as_str()).await.unwrap();
    assert_eq!(turns.data.len(), 1, "the turn ran on the claimed executor");
    // The refill replaces the claimed member with a fresh one.
    wait_until("the pool is refilled", Duration::from_secs(30), || {
        let c = c.clone();
        let d = deployment.clone();
        let claimed = member.instance_id.clone();
        async move {
            let p = c.compute.list_pool(&d).await?;
            Ok(p.len() == 1 && p[0].instance_id != claimed)
        }
    })
    .await
    .unwrap();
    h.shutdown().await.unwrap();
}
