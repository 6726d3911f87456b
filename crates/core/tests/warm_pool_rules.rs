//! The warm pool's rules in the pure decision (docs/WARM_POOL.md): a claimed member is an
//! ordinary instance of its environment, whose connect deadline counts from its claim
//! (`sandbox_core::decision::connect_clock`), not from its task's start in the pool.

mod support;

use sandbox_core::compute::ComputeStatus::Running;
use sandbox_core::decision::{Outcome, Reason, decide};
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::observed::Trigger;
use support::*;

/// A member that waited 50 minutes in the pool is claimed as the replacement of a
/// generation whose connection request is 200 s old: it gets the whole deadline (180 s
/// in the default policy) from the claim, and is replaced only once that passes.
#[test]
fn a_claimed_member_gets_the_full_connect_deadline() {
    let deadline = test_policy().connect_deadline_secs;
    let claimed_at = NOW - 10;
    let mut r = active_record(4, "member-4");
    r.connection_requested_at = Some(NOW - 200);
    r.instance_recorded_at = Some(claimed_at);
    r.instance_from_pool = true;
    let o = observe(Trigger::Sweep, requires_connection())
        .with_record(r.clone())
        .with_instances(vec![instance("member-4", 4, Running, Some(NOW - 3_000))])
        .with_env_status(EnvironmentStatus::Disconnected);
    let d = decide(&o);
    assert_eq!(
        (d.outcome, d.reason.clone()),
        (Outcome::Wait, Reason::ExecutorConnecting),
        "{d:?}"
    );
    assert_eq!(d.recheck_after_secs, Some(deadline - 10 + 1));
    // Still waiting at the last second of the deadline counted from the claim.
    assert_eq!(
        decide(&o.clone().at(claimed_at + deadline)).outcome,
        Outcome::Wait
    );
    // Past it: replaced, as any executor that did not connect.
    let d = decide(&o.clone().at(claimed_at + deadline + 1));
    assert_eq!(d.outcome, Outcome::Replace, "{d:?}");

    // The same task started cold (not from the pool) counts from its own start: the
    // deadline passed long ago.
    r.instance_from_pool = false;
    let cold = observe(Trigger::Sweep, requires_connection())
        .with_record(r)
        .with_instances(vec![instance("member-4", 4, Running, Some(NOW - 3_000))])
        .with_env_status(EnvironmentStatus::Disconnected);
    assert_eq!(decide(&cold).outcome, Outcome::Replace);
}
