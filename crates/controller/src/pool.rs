//! The warm pool (docs/WARM_POOL.md): pre-started executors that serve no environment
//! yet, claimed by a start instead of a cold start.
//!
//! - **Claim.** A `StartCompute` effect is applied by [`start_or_claim`]: with the pool on
//!   ([`PoolSettings::size`] > 0) it first claims an idle member
//!   ([`Compute::claim_pool_member`], one conditional write: the pick and the guard against
//!   double assignment), else it starts cold ([`Compute::start`]). Either way the worker
//!   records the instance the same way under the environment's lock, before the release
//!   (one compute per environment, adopt after a crash, the sweep: nothing changes for
//!   them). The pure decision does not know about the pool.
//! - **Refill.** [`plan_refill`] (pure) says which members to recycle and how many to
//!   start, so that the pool holds [`PoolSettings::size`] young idle members and — with the
//!   executor cap on ([`sandbox_core::observed::Policy::max_executors`]) — slots in use plus
//!   idle members stay within the cap. It recycles members older than
//!   [`PoolSettings::max_age_secs`], and also the oldest young members beyond the size or
//!   beyond the room the cap leaves. [`crate::refill`] applies it
//!   ([`crate::Controller::refill_pool`]): on a short timer in local mode, and on AWS after
//!   every batch that started an executor and every minute.
//!
//!   The cap's guard is still the slot counter
//!   ([`crate::ports::Registry::acquire_slot`]). A claimed member takes the slot of the
//!   environment that claims it, like a started compute. Idle members hold no slot, and
//!   the refill's count of slots in use is a read. So a start
//!   that takes a slot without taking a member (a miss, a replay, a member too old) can put
//!   slots in use plus idle members above the cap, by at most the pool's size. The next
//!   refill recycles the excess (the simulation's seeds 17218092366221545609 and
//!   9587870824524365567 showed the overshoot reaching the size before the trim).
//! - **Single-use.** A claimed member is an ordinary instance of its environment, stopped
//!   at release; nothing returns to the pool.
//! - **After an unclean predecessor** (the lock was `recovered`: a worker died after a
//!   start or a claim and before its record) a start claims nothing new: it asks the pool
//!   only whether its idempotency token already claimed a member ([`REPLAY_ONLY`]), then
//!   replays the cold start with the same token. Either way it gets back what the dead
//!   worker started: a claim by the token, or the task ECS returns for the same
//!   `clientToken` (24 h) — a new claim could not know that a cold start of the same
//!   generation already ran, and would leave two computes for one environment.
//! - **Recycle vs claim.** A recycle is guarded like a claim
//!   ([`Compute::recycle_pool_member`]: idle → recycled, one conditional write, then the
//!   stop), so a member the refill listed as idle and a worker claimed since is never
//!   stopped under its new environment.

use crate::config::PoolSettings;
use crate::ports::{Compute, Fence, PoolMember, PortError, Started};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, InstanceId};

pub use crate::ports::{RECYCLE_REASON, REPLAY_ONLY};

/// How a start was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartPath {
    /// A claimed pool member.
    Warm,
    /// A cold start ([`Compute::start`]): the pool is off, or it missed.
    Cold,
    /// After an unclean predecessor: what the token already started or claimed, returned
    /// by the pool's replay-only claim. Which of the two it was is not known, so the
    /// record does not call it a pool member (it only labels the time-to-connected
    /// metric, and this path is rare).
    Replay,
}

/// The environment's lock a start is applied under ([`start_or_claim`]).
#[derive(Clone, Copy, Debug)]
pub struct UnderLock<'a> {
    /// The lock held ([`Compute::claim_pool_member_fenced`] makes the claim under it).
    pub fence: &'a Fence,
    /// `false` when the lock was `recovered` (an unclean predecessor): nothing new is
    /// claimed ([`REPLAY_ONLY`]).
    pub new_claims: bool,
}

/// Applies a start: a claim of an idle member created after `now - pool.max_age_secs`
/// when the pool is on, else (or on a miss) a cold start. With `lock.new_claims` false (the
/// lock was `recovered`) the pool is asked only for the member this token already
/// claimed ([`REPLAY_ONLY`]) and the start is otherwise a cold replay. `now` and
/// `not_after` are Unix seconds. The claim is made under the environment's lock `lock.fence`
/// ([`Compute::claim_pool_member_fenced`]). Records `pool_hits` / `pool_misses` (not for a
/// replay).
///
/// # Errors
/// The [`PortError`] of the claim or the start: the outcome is unknown (the caller keeps
/// the lock unclean, so the next holder reads the environment's inventory).
pub async fn start_or_claim<C: Compute>(
    compute: &C,
    spec: &StartSpec,
    deployment: &DeploymentId,
    pool: PoolSettings,
    now: u64,
    not_after: u64,
    lock: UnderLock<'_>,
) -> Result<(Started, StartPath), PortError> {
    let UnderLock { fence, new_claims } = lock;
    if pool.size > 0 {
        let created_after = if new_claims {
            now.saturating_sub(pool.max_age_secs)
        } else {
            REPLAY_ONLY
        };
        match compute
            .claim_pool_member_fenced(spec, deployment, created_after, not_after, fence)
            .await?
        {
            Some(started) if new_claims => {
                crate::metrics::pool_claim(true);
                return Ok((started, StartPath::Warm));
            }
            Some(started) => return Ok((started, StartPath::Replay)),
            None if new_claims => {
                crate::metrics::pool_claim(false);
                tracing::info!(environment_id = %spec.environment_id, "pool miss: starting cold");
            }
            None => {
                tracing::info!(environment_id = %spec.environment_id,
                    "unclean predecessor, its token claimed no member: replaying the cold start");
            }
        }
    }
    let started = compute.start(spec, deployment, not_after).await?;
    Ok((started, StartPath::Cold))
}

/// What a refill should do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RefillPlan {
    /// Members past their maximum age, to stop (reason [`RECYCLE_REASON`]).
    pub recycle: Vec<InstanceId>,
    /// Members to start.
    pub start: usize,
}

/// The refill for the idle members `idle` at `now` (Unix seconds):
/// - recycle every member with `created_at + max_age_secs <= now` (the same bound the claim
///   uses, so a member is either claimable or recycled);
/// - keep at most `settings.size` of the young ones, and with a cap (`cap` > 0; 0: no cap)
///   at most `cap - slots_in_use`; recycle the oldest of the rest (members count toward the
///   executor cap);
/// - start enough to reach `settings.size` young members within that same room.
pub fn plan_refill(
    idle: &[PoolMember],
    settings: PoolSettings,
    cap: u32,
    slots_in_use: u64,
    now: u64,
) -> RefillPlan {
    let created_after = now.saturating_sub(settings.max_age_secs);
    let (mut young, old): (Vec<&PoolMember>, Vec<&PoolMember>) =
        idle.iter().partition(|m| m.created_at > created_after);
    let mut keep = u64::from(settings.size);
    if cap > 0 {
        keep = keep.min(u64::from(cap).saturating_sub(slots_in_use));
    }
    // The oldest young members go first: they are the nearest to their maximum age.
    young.sort_by_key(|m| (m.created_at, m.instance_id.as_str().to_owned()));
    let excess = (young.len() as u64).saturating_sub(keep);
    let excess = usize::try_from(excess).unwrap_or(usize::MAX);
    let kept = young.len() - excess.min(young.len());
    let recycle = old
        .into_iter()
        .chain(young.iter().take(excess).copied())
        .map(|m| m.instance_id.clone())
        .collect();
    RefillPlan {
        recycle,
        start: usize::try_from(keep.saturating_sub(kept as u64)).unwrap_or(usize::MAX),
    }
}

/// Seconds the deployment's refill lease ([`Compute::take_pool_refill_lease`]) is still
/// held after a refill ends: refills are at least this far apart, short enough that the
/// next claim's refill is not skipped for long.
pub const REFILL_LEASE_SECS: u64 = 20;

/// The longest a refill may act, seconds: no `RunTask` or `StopTask` is sent after its
/// start + this (nor after the caller's deadline,
/// [`crate::Controller::refill_pool_until`]), and the whole refill is cut off then. Well inside the Lambda limit of 900 s ("Lambda
/// quotas": function timeout) and the worker's function timeout.
pub const REFILL_MAX_SECS: u64 = 60;

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, created_at: u64) -> PoolMember {
        PoolMember {
            instance_id: InstanceId::new(id),
            created_at,
        }
    }

    const SETTINGS: PoolSettings = PoolSettings {
        size: 2,
        max_age_secs: 100,
    };

    #[test]
    fn an_empty_pool_is_filled_to_its_size() {
        assert_eq!(plan_refill(&[], SETTINGS, 0, 0, 1_000).start, 2);
    }

    #[test]
    fn members_at_their_maximum_age_are_recycled_and_replaced() {
        let plan = plan_refill(
            &[member("old", 900), member("young", 901)],
            SETTINGS,
            0,
            0,
            1_000,
        );
        assert_eq!(plan.recycle, vec![InstanceId::new("old")]);
        assert_eq!(plan.start, 1);
    }

    #[test]
    fn the_refill_leaves_room_under_the_executor_cap() {
        // 3 slots in use of 4, no member yet: one member fits.
        assert_eq!(plan_refill(&[], SETTINGS, 4, 3, 1_000).start, 1);
        // The cap is full: nothing is started, and nothing goes negative.
        assert_eq!(
            plan_refill(&[member("m", 990)], SETTINGS, 4, 4, 1_000).start,
            0
        );
    }

    #[test]
    fn the_refill_trims_idle_members_above_the_room_the_executor_cap_leaves() {
        // Cap 4, 3 slots in use, 2 young members: one is too many; the oldest goes.
        let plan = plan_refill(
            &[member("newer", 995), member("older", 990)],
            SETTINGS,
            4,
            3,
            1_000,
        );
        assert_eq!(plan.recycle, vec![InstanceId::new("older")]);
        assert_eq!(plan.start, 0);
        // The cap is full: every idle member goes, old ones included.
        let plan = plan_refill(&[member("a", 995), member("old", 1)], SETTINGS, 4, 4, 1_000);
        assert_eq!(plan.recycle.len(), 2);
        assert_eq!(plan.start, 0);
    }

    #[test]
    fn the_refill_trims_idle_members_above_the_pool_size() {
        let plan = plan_refill(
            &[member("c", 997), member("a", 991), member("b", 993)],
            SETTINGS,
            0,
            0,
            1_000,
        );
        assert_eq!(plan.recycle, vec![InstanceId::new("a")]);
        assert_eq!(plan.start, 0);
    }

    #[test]
    fn a_pool_that_is_off_starts_nothing_and_still_recycles() {
        let off = PoolSettings {
            size: 0,
            ..SETTINGS
        };
        let plan = plan_refill(&[member("old", 1)], off, 0, 0, 1_000);
        assert_eq!((plan.recycle.len(), plan.start), (1, 0));
    }
}
