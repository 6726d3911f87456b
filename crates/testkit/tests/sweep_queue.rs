//! Sweep jobs on a queue of their own: a sweep of 10,000 environments in flight never
//! delays a due recheck, where the single-queue arrangement did
//! (`sandbox_testkit::recheck_delay`: the real controller on the twins, simulated time).

use sandbox_testkit::recheck_delay::{Arrangement, RecheckLoad, measure_recheck_delay};

/// At 10,000 environments a sweep fans out its jobs (over the 300 s interval: about 33 a
/// second, more than the 25 a second one queue's event source mapping handles) while an
/// environment goes idle every 10 s, each scheduling a lease recheck due 60 s later. With
/// the sweep queue every recheck is handled in the second it falls due, every idle
/// executor is stopped, and the sweep still completes; the control, the sweep's jobs on the timers
/// queue, delays the rechecks behind the sweep's backlog (so this test can fail).
#[tokio::test(flavor = "current_thread")]
async fn sweep_jobs_never_delay_rechecks() {
    let load = RecheckLoad::at(10_000);
    let own = measure_recheck_delay(load, Arrangement::SweepQueue).await;
    assert_eq!(own.sweep_jobs, 10_000, "{:?}", own.sweep_jobs);
    assert_eq!(
        own.sweep_jobs_handled, own.sweep_jobs,
        "the sweep completes"
    );
    assert!(own.delays_secs.len() >= 25, "{:?}", own.delays_secs);
    assert_eq!(own.idled_still_running, 0, "every lease ended in a stop");
    let stops = own
        .recheck_outcomes
        .iter()
        .filter(|o| o.as_deref() == Some("stop"))
        .count();
    assert!(
        stops * 2 > own.recheck_outcomes.len(),
        "the rechecks themselves stopped (a sweep job may get there first): {:?}",
        own.recheck_outcomes
    );
    assert_eq!(
        own.max(),
        0,
        "every recheck handled at its due time: {:?}",
        own.delays_secs
    );

    let control = measure_recheck_delay(load, Arrangement::OneQueue).await;
    assert_eq!(control.sweep_jobs_handled, control.sweep_jobs);
    assert_eq!(control.delays_secs.len(), own.delays_secs.len());
    assert!(
        control.max() >= 30,
        "on one queue the rechecks wait behind the sweep: {:?}",
        control.delays_secs
    );
}
