//! The warm pool, through the worker over the twins: a start claims an idle
//! member (one conditional write) and records it like a started compute; a miss starts
//! cold; members past their age are never claimed and the refill recycles them.

use sandbox_controller::Job;
use sandbox_controller::config::PoolSettings;
use sandbox_controller::contract::compute_pool_contract;
use sandbox_controller::pool::RECYCLE_REASON;
use sandbox_controller::ports::{Clock, Compute, Registry};
use sandbox_core::ids::{DeploymentId, EnvironmentId, InstanceId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::session::SessionStatus;
use sandbox_testkit::World;
use sandbox_testkit::compute::ComputeEvent;
use sandbox_testkit::world::TwinController;
use sandbox_testkit::{SimClock, TwinCompute};

fn pooled(world: &World, size: u32, max_age_secs: u64) -> TwinController {
    let mut config = World::config("pool");
    config.pool = PoolSettings { size, max_age_secs };
    world.controller_with(config)
}

/// Session `i` requires a connection to its environment.
fn requiring(world: &World, i: usize) -> (SessionId, EnvironmentId) {
    let (s, e) = (
        SessionId::new(format!("sess_pool_{i}")),
        EnvironmentId::new(format!("env_pool_{i}")),
    );
    world.sessions.add(&s, &e, SessionStatus::Idle);
    world.sessions.require_connection(&s);
    (s, e)
}

/// The job of session `s`'s connection request for environment `e`.
fn connection_requested(world: &World, s: SessionId, e: &EnvironmentId) -> Job {
    Job {
        handoffs: 0,
        swept: None,
        operator_proof: None,
        trigger: Trigger::ConnectionRequested,
        session_id: s,
        environment_id: Some(e.clone()),
        webhook_id: None,
        enqueued_at: world.clock.now(),
    }
}

/// Processes the connection request of session `i`; the instance its record names.
async fn start(world: &World, c: &TwinController, i: usize) -> InstanceId {
    let (s, e) = requiring(world, i);
    let job = connection_requested(world, s, &e);
    let p = c.process(&job).await.unwrap();
    assert_eq!(p.error, None, "{p:?}");
    let record = world.registry.record(&e.effect_key()).expect("a record");
    record.current().expect("an instance").instance_id.clone()
}

fn warm(world: &World, env: usize) -> bool {
    world
        .registry
        .record(&EnvironmentId::new(format!("env_pool_{env}")).effect_key())
        .is_some_and(|r| r.instance_from_pool)
}

fn cold_starts(world: &World) -> usize {
    world
        .compute
        .events()
        .iter()
        .filter(|e| matches!(e, ComputeEvent::Started { instance, created: true, .. } if instance.instance_id.as_str().starts_with("twin-task-")))
        .count()
}

#[tokio::test]
async fn compute_twin_passes_the_pool_contract() {
    let c = TwinCompute::new(SimClock::wall());
    compute_pool_contract(&c, &DeploymentId::new("twin-pool-contract").unwrap()).await;
}

#[tokio::test]
async fn a_claimed_pool_member_serves_exactly_one_environment() {
    let world = World::new();
    let c = pooled(&world, 2, 3_600);
    let filled = c.refill_pool().await.unwrap();
    assert_eq!((filled.started, filled.idle), (2, 2));
    let members: Vec<InstanceId> = world
        .compute
        .list_pool(&World::deployment())
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.instance_id)
        .collect();

    let first = start(&world, &c, 1).await;
    let second = start(&world, &c, 2).await;
    assert_ne!(first, second, "one member, one environment");
    assert!(members.contains(&first) && members.contains(&second));
    assert!(warm(&world, 1) && warm(&world, 2));
    assert_eq!(cold_starts(&world), 0, "both starts were claims");
    // Each environment has exactly its member as compute.
    for (env, id) in [(1, &first), (2, &second)] {
        let found = world
            .compute
            .find(
                &World::deployment(),
                &EnvironmentId::new(format!("env_pool_{env}")),
            )
            .await
            .unwrap();
        assert_eq!(
            found.iter().map(|i| &i.instance_id).collect::<Vec<_>>(),
            vec![id]
        );
    }
    // Single-use: the pool is empty until the refill starts new members.
    assert!(
        world
            .compute
            .list_pool(&World::deployment())
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(c.refill_pool().await.unwrap().started, 2);
    let fresh = world.compute.list_pool(&World::deployment()).await.unwrap();
    assert!(
        fresh
            .iter()
            .all(|m| m.instance_id != first && m.instance_id != second)
    );
    // A replayed job for environment 1 claims nothing more.
    assert_eq!(start(&world, &c, 1).await, first);
    assert_eq!(
        world
            .compute
            .list_pool(&World::deployment())
            .await
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn a_pool_miss_falls_back_to_a_cold_start() {
    let world = World::new();
    let c = pooled(&world, 1, 3_600);
    // The pool is on but empty: the start is cold.
    let cold = start(&world, &c, 1).await;
    assert!(cold.as_str().starts_with("twin-task-"), "{cold}");
    assert!(!warm(&world, 1));
    assert_eq!(cold_starts(&world), 1);
    // Refilled, the next start is warm; the one after misses again.
    c.refill_pool().await.unwrap();
    assert!(
        start(&world, &c, 2)
            .await
            .as_str()
            .starts_with("twin-pool-")
    );
    assert!(warm(&world, 2));
    assert!(
        start(&world, &c, 3)
            .await
            .as_str()
            .starts_with("twin-task-")
    );
    assert!(!warm(&world, 3));
    assert_eq!(cold_starts(&world), 2);
}

#[tokio::test]
async fn pool_members_past_their_age_are_recycled() {
    let world = World::new();
    let c = pooled(&world, 1, 100);
    c.refill_pool().await.unwrap();
    let old = world.compute.list_pool(&World::deployment()).await.unwrap();
    assert_eq!(old.len(), 1);
    world.clock.advance_secs(100);
    // At its maximum age the member is not claimed: the start is cold.
    let id = start(&world, &c, 1).await;
    assert!(id.as_str().starts_with("twin-task-"), "{id}");
    // The refill stops it and starts a replacement.
    let refilled = c.refill_pool().await.unwrap();
    assert_eq!(
        (refilled.recycled, refilled.started, refilled.idle),
        (1, 1, 1)
    );
    let stopped: Vec<_> = world
        .compute
        .events()
        .into_iter()
        .filter_map(|e| match e {
            ComputeEvent::Stopped {
                instance_id,
                reason,
                ..
            } => Some((instance_id, reason)),
            _ => None,
        })
        .collect();
    assert_eq!(
        stopped,
        vec![(old[0].instance_id.clone(), RECYCLE_REASON.to_owned())]
    );
    let now = world.compute.list_pool(&World::deployment()).await.unwrap();
    assert_eq!(now.len(), 1);
    assert_ne!(now[0].instance_id, old[0].instance_id);
    // The young replacement is claimed.
    assert_eq!(start(&world, &c, 2).await, now[0].instance_id);
}

/// `RunTask` started a task but its answer was lost while the pool was empty, so the
/// worker left the lock unclean. The pool fills before the retry, and ECS does not list
/// the new task yet: its reads lag `RunTask` (aws-semantics.md). The retry must not claim
/// the member, because a new claim cannot know that the same generation was already started
/// cold. It replays the cold start with the same token instead, which ECS answers with the
/// same task (`clientToken`, 24 h). One compute for the environment, and the member stays
/// in the pool (docs/WARM_POOL.md rule 4).
#[tokio::test]
async fn after_a_lost_cold_start_the_retry_replays_it_instead_of_claiming() {
    use sandbox_testkit::compute::{AwsLike, ComputeTiming};
    use sandbox_testkit::faulty::Fault;
    let aws = AwsLike {
        // A start stays unlisted for up to an hour; the seed's first draw is checked below.
        max_visibility_lag_ms: 3_600_000,
        seed: 7,
        ..AwsLike::strict()
    };
    let world = World::aws_like(ComputeTiming::default(), aws);
    let c = pooled(&world, 1, 3_600);
    world
        .faults
        .fail("compute", Some("start"), Fault::LostResponse, 1);
    let (s, e) = requiring(&world, 1);
    let job = connection_requested(&world, s, &e);
    let lost = c.process(&job).await.unwrap();
    assert!(
        lost.error
            .as_deref()
            .is_some_and(|m| m.contains("outcome unknown")),
        "{lost:?}"
    );
    let cold = world.compute.instances();
    assert_eq!(cold.len(), 1, "the lost start did start a task");
    assert!(
        world
            .compute
            .find(&World::deployment(), &e)
            .await
            .unwrap()
            .is_empty(),
        "precondition: ECS does not list the new task yet (pick another seed if the draw changed)"
    );
    c.refill_pool().await.unwrap();
    assert_eq!(
        world
            .compute
            .list_pool(&World::deployment())
            .await
            .unwrap()
            .len(),
        1
    );

    let retried = c.process(&job).await.unwrap();
    assert_eq!(retried.error, None, "{retried:?}");
    let record = world.registry.record(&e.effect_key()).expect("a record");
    assert_eq!(
        record.current().map(|i| &i.instance_id),
        Some(&cold[0].instance_id),
        "the record names the task the lost start started"
    );
    assert!(!record.instance_from_pool);
    assert_eq!(
        world.compute.instances().len(),
        1,
        "no second compute for the environment"
    );
    assert_eq!(
        world
            .compute
            .list_pool(&World::deployment())
            .await
            .unwrap()
            .len(),
        1,
        "the member was not claimed"
    );
}

/// A member claimed after the refill listed it, then recycled through the test decorators
/// the controller runs over (the simulation's `Interleaved`, the world's `Counting` and
/// `Faulty`): the recycle's guard holds, so the claimed member is left to its environment.
/// The decorators used to leave `recycle_pool_member` and `reconcile_pool` to the trait's
/// defaults, an unguarded `stop` and a no-op, so every recycle through them stopped the
/// member whatever its state (simulation seed 6038094601263162090). A recycle whose stop
/// did not go out leaves the member recycled and running until the reconcile, which the
/// decorators must forward too.
#[tokio::test]
async fn a_recycle_through_the_test_decorators_leaves_a_claimed_member_alone() {
    use sandbox_controller::ports::NO_DEADLINE;
    use sandbox_testkit::compute::{MemberState, PoolTiming};
    use sandbox_testkit::{CallLog, Counting, FaultPlan, Faulty, Interleaved};

    async fn check<C: Compute>(twin: &TwinCompute, c: &C) {
        let d = World::deployment();
        let member = c.start_pool_member(&d, NO_DEADLINE).await.unwrap();
        let spare = c.start_pool_member(&d, NO_DEADLINE).await.unwrap();
        let (s, e) = (SessionId::new("sess_dec"), EnvironmentId::new("env_dec"));
        let spec = sandbox_core::decision::StartSpec {
            environment_id: e.clone(),
            session_id: s,
            remote_url: "wss://agents.twin.invalid/x".to_owned(),
            workspace_directory: "/workspace".to_owned(),
            generation: sandbox_core::ids::Generation(1),
            idempotency_token: "tok-dec".to_owned(),
            previous: None,
            restore: None,
        };
        let claimed = c
            .claim_pool_member(&spec, &d, 0, NO_DEADLINE)
            .await
            .unwrap();
        assert!(
            matches!(claimed, Some(sandbox_controller::ports::Started::Instance(ref i)) if i.instance_id == member.instance_id)
        );
        assert!(
            !c.recycle_pool_member(&member.instance_id, NO_DEADLINE)
                .await
                .unwrap(),
            "a claimed member is not recycled"
        );
        let live = twin.live_of(&e);
        assert_eq!(
            live.len(),
            1,
            "the claimed member still serves its environment"
        );
        // A recycle whose stop does not go out; the reconcile stops the member.
        twin.set_pool_timing(PoolTiming {
            recycle_stop_fail_per_mille: 1_000,
            ..PoolTiming::default()
        });
        assert!(
            c.recycle_pool_member(&spare.instance_id, NO_DEADLINE)
                .await
                .is_err()
        );
        let state = |id: &InstanceId| {
            twin.pool_members()
                .into_iter()
                .find(|m| &m.instance_id == id)
                .map(|m| m.state)
        };
        assert_eq!(state(&spare.instance_id), Some(MemberState::Recycled));
        assert_eq!(c.reconcile_pool(&d, NO_DEADLINE).await.unwrap(), 1);
        assert_eq!(state(&spare.instance_id), Some(MemberState::Stopped));
    }

    let twin = TwinCompute::new(SimClock::wall());
    check(&twin, &Interleaved::new(twin.clone())).await;
    let twin = TwinCompute::new(SimClock::wall());
    check(&twin, &Counting::new(twin.clone(), CallLog::new())).await;
    let twin = TwinCompute::new(SimClock::wall());
    check(&twin, &Faulty::new(twin.clone(), FaultPlan::new())).await;
}

/// As on AWS, the pool's claim tokens and ECS's `clientToken`s are apart: a cold start
/// with a token that claimed a member starts a new task (ECS never saw the claim), and a
/// claim with a token that started cold claims a member (the pool never saw the start).
/// Only the controller's rule 4 (`REPLAY_ONLY` after an unclean predecessor) keeps one
/// compute per environment then; a twin that replayed across the two would hide a break
/// of it from the simulation.
#[tokio::test]
async fn the_twin_keeps_claim_tokens_apart_from_run_task_tokens() {
    use sandbox_controller::pool::REPLAY_ONLY;
    use sandbox_controller::ports::{NO_DEADLINE, Started};
    let twin = TwinCompute::new(SimClock::wall());
    let d = World::deployment();
    let spec = |token: &str| sandbox_core::decision::StartSpec {
        environment_id: EnvironmentId::new("env_tok"),
        session_id: SessionId::new("sess_tok"),
        remote_url: "wss://agents.twin.invalid/x".to_owned(),
        workspace_directory: "/workspace".to_owned(),
        generation: sandbox_core::ids::Generation(1),
        idempotency_token: token.to_owned(),
        previous: None,
        restore: None,
    };
    let id = |s: Option<Started>| match s {
        Some(Started::Instance(i)) => Some(i.instance_id),
        _ => None,
    };
    twin.start_pool_member(&d, NO_DEADLINE).await.unwrap();
    twin.start_pool_member(&d, NO_DEADLINE).await.unwrap();
    // A claim, then a cold start with its token: two tasks.
    let claimed = id(twin
        .claim_pool_member(&spec("tok-a"), &d, 0, NO_DEADLINE)
        .await
        .unwrap())
    .unwrap();
    let cold = id(Some(
        twin.start(&spec("tok-a"), &d, NO_DEADLINE).await.unwrap(),
    ))
    .unwrap();
    assert_ne!(claimed, cold);
    // The claim's replay still answers its member.
    let replayed = twin
        .claim_pool_member(&spec("tok-a"), &d, REPLAY_ONLY, NO_DEADLINE)
        .await
        .unwrap();
    assert_eq!(id(replayed), Some(claimed));
    // A cold start, then a replay-only claim with its token: nothing; a new claim: a member.
    twin.start(&spec("tok-b"), &d, NO_DEADLINE).await.unwrap();
    let none = twin
        .claim_pool_member(&spec("tok-b"), &d, REPLAY_ONLY, NO_DEADLINE)
        .await
        .unwrap();
    assert_eq!(id(none), None);
    assert!(
        id(twin
            .claim_pool_member(&spec("tok-b"), &d, 0, NO_DEADLINE)
            .await
            .unwrap())
        .is_some()
    );
}

/// Idle members count toward the executor cap. When starts that took no member (here: a
/// controller with the pool off) fill the slots while members wait, the next refill
/// recycles the members beyond the room the cap leaves, oldest first. Slots in use plus
/// idle members are then within the cap again (docs/WARM_POOL.md rule 6; the simulation
/// found the overshoot reaching the pool's size: seeds 17218092366221545609,
/// 9587870824524365567).
#[tokio::test]
async fn idle_members_above_the_room_the_cap_leaves_are_recycled() {
    let world = World::new();
    let capped = |size: u32| {
        let mut config = World::config("pool-cap");
        config.pool = PoolSettings {
            size,
            max_age_secs: 3_600,
        };
        config.policy.max_executors = 3;
        world.controller_with(config)
    };
    let pooled = capped(2);
    let filled = pooled.refill_pool().await.unwrap();
    assert_eq!((filled.started, filled.idle), (2, 2));
    let oldest = world.compute.list_pool(&World::deployment()).await.unwrap()[0]
        .instance_id
        .clone();
    // Two cold starts (the pool off for this controller) take two of the three slots.
    let cold = capped(0);
    for i in 1..=2 {
        let id = start(&world, &cold, i).await;
        assert!(id.as_str().starts_with("twin-task-"), "{id}");
    }
    assert_eq!(world.registry.slots().await.unwrap().in_use, 2);

    let trimmed = pooled.refill_pool().await.unwrap();
    assert_eq!((trimmed.recycled, trimmed.started, trimmed.idle), (1, 0, 1));
    let left = world.compute.list_pool(&World::deployment()).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_ne!(left[0].instance_id, oldest, "the oldest member went first");
}

/// A refill acts only within its deadline (the invocation's, less what the answer needs):
/// with no time left it takes no lease and starts nothing; with time it refills, and with a
/// deadline before its own bound the members are still started within it.
#[tokio::test]
async fn a_refill_never_outlives_its_invocation() {
    let world = World::new();
    let c = pooled(&world, 2, 3_600);
    let now = world.clock.now();
    let skipped = c.refill_pool_until(now).await.unwrap();
    assert!(skipped.skipped, "{skipped:?}");
    assert!(world.compute.pool_members().is_empty(), "nothing started");
    let done = c.refill_pool_until(now + 5).await.unwrap();
    assert_eq!((done.skipped, done.started), (false, 2));
    // A deadline already behind the clock (the invocation is about to end): nothing.
    world.clock.advance_secs(10);
    assert!(c.refill_pool_until(now + 5).await.unwrap().skipped);
    assert_eq!(world.compute.pool_members().len(), 2);
}
