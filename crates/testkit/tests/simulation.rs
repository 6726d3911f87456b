//! Deterministic simulation of the invariants (part 3): seeded schedules of N
//! workers, the sweeper and an operator close over the interleaved twins, with crashes at
//! every side-effect boundary, lost and duplicated messages and simulated time. See
//! `sandbox_testkit::sim` for what each schedule does and checks.
//!
//! - `SIM_SCHEDULES=n` runs n schedules (default 2,000, the ECS-like compute twin on:
//!   visibility lag, forgetting, failed starts, the token window; snapshots `pending` for
//!   120 s,; the warm pool in 30 % of them); `make soak` uses 1,000,000.
//! - `SIM_SEED=s` replays exactly the schedule of seed `s` (printed on failure).
//! - `SIM_BASE=b` changes the base the schedule seeds derive from (default 0).
//! - `SIM_POOL_PERCENT=p` runs p % of the schedules with the warm pool (default
//!   30; 0: none, 100: all).
//! - `SIM_REFILL_AHEAD_MS=ms`: how far ahead of the workers' clock the refill's may run
//!   (default 2,000; larger makes the race of a recycle with a claim frequent).
//! - `SIM_CAP_SLACK=n` also checks, in the schedules with the warm pool and the executor
//!   cap, that slots in use plus idle members never exceed the cap by more
//!   than n (`plan_refill`'s doc says 1; seed 17218092366221545609 shows 2: see
//!   `SimConfig::cap_slack`).

use sandbox_testkit::sim::{
    Deadlines, PoolReport, ScheduleReport, SimConfig, run_schedule, schedule_seed,
};
use std::time::Instant;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

#[test]
fn seeded_schedules_with_crashes_keep_every_invariant() {
    let cfg = SimConfig {
        cap_slack: env_u64("SIM_CAP_SLACK"),
        pool_percent: env_u64("SIM_POOL_PERCENT").unwrap_or(SimConfig::default().pool_percent),
        broken_percent: env_u64("SIM_BROKEN_PERCENT")
            .unwrap_or(SimConfig::default().broken_percent),
        refill_clock_ahead_ms: env_u64("SIM_REFILL_AHEAD_MS")
            .unwrap_or(SimConfig::default().refill_clock_ahead_ms),
        ..SimConfig::default()
    };
    let rt = runtime();
    if let Some(seed) = env_u64("SIM_SEED") {
        // A replay shows the controller's own logs (decisions, outcomes, hand-offs).
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_test_writer()
            .try_init();
        match rt.block_on(run_schedule(seed, &cfg)) {
            Ok(r) => println!("seed {seed}: ok {r:?}"),
            Err(v) => panic!("{v}"),
        }
        return;
    }
    let schedules = env_u64("SIM_SCHEDULES").unwrap_or(2_000);
    let base = env_u64("SIM_BASE").unwrap_or(0);
    let started = Instant::now();
    let mut total = ScheduleReport::default();
    // The warm pool's counters, and in how many schedules it was on (capped).
    let mut pool = PoolReport::default();
    let (mut pool_schedules, mut capped_schedules) = (0u64, 0u64);
    // Progress on long runs (make soak): every tenth, at least every 100,000 schedules.
    let every = (schedules / 10).clamp(1, 100_000);
    for index in 0..schedules {
        if index > 0 && index % every == 0 && schedules >= 100_000 {
            println!(
                "simulation: {index} of {schedules} schedules ok after {:.1?}",
                started.elapsed()
            );
        }
        let seed = schedule_seed(base, index);
        match rt.block_on(run_schedule(seed, &cfg)) {
            Ok(r) => {
                total.crashes += r.crashes;
                total.lost += r.lost;
                total.duplicated += r.duplicated;
                total.starts += r.starts;
                total.stops += r.stops;
                total.dead_letters += r.dead_letters;
                total.sim_secs += r.sim_secs;
                total.polls += r.polls;
                total.fan_out_sweeps += r.fan_out_sweeps;
                total.deadline_kills += r.deadline_kills;
                total.ecs.missing_new += r.ecs.missing_new;
                total.ecs.missing_forgotten += r.ecs.missing_forgotten;
                total.ecs.replays += r.ecs.replays;
                total.ecs.failing_starts += r.ecs.failing_starts;
                total.ecs.snapshot_pending_reads += r.ecs.snapshot_pending_reads;
                total.ecs.recycles_lost_to_claims += r.ecs.recycles_lost_to_claims;
                total.ecs.claims_provisioning += r.ecs.claims_provisioning;
                total.volumes_deleted += r.volumes_deleted;
                total.broken_environments += r.broken_environments;
                total.broken_starts += r.broken_starts;
                total.broken_max_in_hour = total.broken_max_in_hour.max(r.broken_max_in_hour);
                total.queued_at_end = total.queued_at_end.max(r.queued_at_end);
                pool_schedules += u64::from(r.pool.on);
                capped_schedules += u64::from(r.pool.capped);
                pool.refills += r.pool.refills;
                pool.started += r.pool.started;
                pool.claims += r.pool.claims;
                pool.recycles += r.pool.recycles;
                pool.idle_killed += r.pool.idle_killed;
                pool.claimed_killed += r.pool.claimed_killed;
                pool.max_over_cap = pool.max_over_cap.max(r.pool.max_over_cap);
            }
            Err(v) => panic!("schedule {index} of {schedules} failed\n{v}"),
        }
    }
    println!(
        "simulation: {schedules} schedules ok in {:.1?} (base {base}): {} crashes, {} lost and \
         {} duplicated deliveries, {} computes started, {} stops, {} dead letters, {} simulated s, {} port calls, at most {} messages left queued; \
         {} fanned-out sweeps, {} jobs killed at their Lambda deadline; ECS twin: {} reads MISSING (new), {} MISSING (forgotten), {} clientToken replays, {} starts failing (TaskFailedToStart); EBS twin: {} snapshot reads pending, {} volumes deleted (each checked)",
        started.elapsed(),
        total.crashes,
        total.lost,
        total.duplicated,
        total.starts,
        total.stops,
        total.dead_letters,
        total.sim_secs,
        total.polls,
        total.queued_at_end,
        total.fan_out_sweeps,
        total.deadline_kills,
        total.ecs.missing_new,
        total.ecs.missing_forgotten,
        total.ecs.replays,
        total.ecs.failing_starts,
        total.ecs.snapshot_pending_reads,
        total.volumes_deleted,
    );
    println!(
        "warm pool: on in {pool_schedules} schedules ({capped_schedules} with the executor cap): \
         {} refills, {} members started, {} claimed ({} still provisioning), {} recycled ({} \
         recycles found the member claimed since), {} idle and {} claimed members killed; at \
         most {} over the cap (slots in use + idle members)",
        pool.refills,
        pool.started,
        pool.claims,
        total.ecs.claims_provisioning,
        pool.recycles,
        total.ecs.recycles_lost_to_claims,
        pool.idle_killed,
        pool.claimed_killed,
        pool.max_over_cap,
    );
    println!(
        "executors that never connect: {} environments, {} computes started for them, at most \
         {} in one hour for one environment (the policy allows {})",
        total.broken_environments,
        total.broken_starts,
        total.broken_max_in_hour,
        sandbox_testkit::sim::broken_start_bound(&sandbox_core::observed::Policy::default()),
    );
    assert!(total.crashes > 0 && total.starts > 0 && total.stops > 0 || schedules < 20);
    assert!(
        schedules < 200 || cfg.broken_percent == 0 || total.broken_starts > 0,
        "no executor that never connects was started: {total:?}"
    );
    // The ECS behaviours were exercised, not merely configured.
    let ecs = total.ecs;
    assert!(
        schedules < 200
            || (total.fan_out_sweeps > 0
                && ecs.missing_new > 0
                && ecs.missing_forgotten > 0
                && ecs.replays > 0
                && ecs.failing_starts > 0
                && ecs.snapshot_pending_reads > 0
                && total.volumes_deleted > 0),
        "an ECS behaviour never happened: {total:?}"
    );
    // The pool's races were exercised, not merely configured.
    assert!(
        schedules < 200
            || cfg.pool_percent == 0
            || (capped_schedules > 0
                && pool.claims > 0
                && pool.recycles > 0
                && pool.idle_killed > 0
                && pool.claimed_killed > 0),
        "a warm pool behaviour never happened: {pool:?}"
    );
}

/// Every job has its invocation's deadline and dies at that instant,
/// like a crash. With deadlines far shorter than the templates' (a worker step 20 s, a
/// sweep 40 s: the chaos clock often jumps past them mid-job), many jobs are killed
/// mid-effect — after the lock, after a start, mid-stop — and still every schedule keeps
/// every invariant and loses nothing: the settle finds exactly one live compute per
/// session that needs one and none for the others.
#[test]
fn a_job_past_the_lambda_deadline_loses_nothing() {
    let cfg = SimConfig {
        deadlines: Some(Deadlines {
            worker_secs: 20,
            sweeper_secs: 40,
        }),
        ..SimConfig::default()
    };
    let rt = runtime();
    let schedules = env_u64("SIM_DEADLINE_SCHEDULES").unwrap_or(300);
    let mut kills = 0;
    let mut crashes = 0;
    for index in 0..schedules {
        let seed = schedule_seed(0x0dea_d11e, index);
        match rt.block_on(run_schedule(seed, &cfg)) {
            Ok(r) => {
                kills += r.deadline_kills;
                crashes += r.crashes;
            }
            Err(v) => panic!("schedule {index} of {schedules} failed\n{v}"),
        }
    }
    println!("{schedules} schedules: {kills} jobs killed at their deadline, {crashes} crashes");
    assert!(
        kills as u64 >= schedules / 10,
        "the deadline must actually kill jobs: {kills} kills in {schedules} schedules"
    );
}

/// Seeds `make soak` once failed on, replayed on every `make test`. Each names what it
/// found.
const SEEDS_THAT_FAILED: [(u64, &str); 2] = [
    // A generation that connected in a window no look saw, then died, was a failed start
    // (never seen connected) and the record let go of it unsaved; the sweeper then
    // deleted its volume. Its files are now saved before the record lets go.
    (
        5_528_975_510_425_205_349,
        "the unsaved workspace of a never-seen-connected generation",
    ),
    (
        14_296_041_499_507_077_887,
        "the same, with the start deferred for a pending snapshot",
    ),
];

#[test]
fn seeds_that_once_failed_keep_every_invariant() {
    let rt = runtime();
    for (seed, what) in SEEDS_THAT_FAILED {
        if let Err(v) = rt.block_on(run_schedule(seed, &SimConfig::default())) {
            panic!("seed {seed} ({what}) failed again\n{v}");
        }
    }
}
