//! 50 sessions × 5 deliveries each (duplicates sent concurrently, reordered), 4 concurrent
//! workers: exactly 50 executors start, one per environment, and all stop after their
//! shutdown leases — counted from the registry and from the OS process table.

use sandbox_controller::ports::ReceiptKind;
use sandbox_core::decision::Effect;
use sandbox_core::record::RecordStatus;
use sandbox_e2e::{Harness, LifecycleHarness as _, Options, os_executors};
use std::collections::BTreeMap;
use std::time::Duration;

const SESSIONS: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_sessions_five_deliveries_each_start_exactly_fifty_executors_and_stop_them_all() {
    let h = Harness::start(Options {
        duplicates: 4,
        reorder: true,
        workers: 4,
        grace_secs: 2,
        // 5 real seconds per turn: every executor is alive at the same time.
        turn_secs: 300.0,
        ..Options::default()
    })
    .await
    .unwrap();
    let mut envs = vec![];
    for n in 0..SESSIONS {
        let s = h
            .client
            .create_session(agents_sim::SessionEnvironment::self_hosted())
            .await
            .unwrap();
        envs.push(s.self_hosted().unwrap().id.as_str().to_owned());
        h.client
            .submit_message(s.id.as_str(), &format!("task {n}"))
            .await
            .unwrap();
    }
    h.wait_until(
        "all executors connected",
        Duration::from_secs(90),
        || async {
            let state = h.client.state().await?;
            Ok(envs
                .iter()
                .all(|e| state.environment(e).is_some_and(|e| e.connected)))
        },
    )
    .await
    .unwrap();
    // The OS process table: exactly one executor per environment.
    let per_env: Vec<usize> = envs.iter().map(|e| os_executors(Some(e)).len()).collect();
    assert!(per_env.iter().all(|n| *n == 1), "{per_env:?}");

    h.wait_until(
        "every executor stopped",
        Duration::from_secs(120),
        || async {
            // Stopped per the provider AND recorded (the record is written after the
            // stop's read-back and receipt).
            for e in &envs {
                let recorded = h
                    .record(e)
                    .await?
                    .is_some_and(|r| r.status == RecordStatus::Stopped);
                if !recorded || !h.live(e).await?.is_empty() {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .await
    .unwrap();
    assert!(envs.iter().all(|e| os_executors(Some(e)).is_empty()));

    let c = h.controller();
    let audit = c.registry.audit_log().await.unwrap();
    let mut starts: BTreeMap<String, usize> = BTreeMap::new();
    for entry in &audit {
        for v in &entry.applied {
            if let Ok(Effect::StartCompute(s)) = serde_json::from_value::<Effect>(v.clone()) {
                *starts
                    .entry(s.environment_id.as_str().to_owned())
                    .or_default() += 1;
            }
        }
    }
    assert_eq!(starts.len(), SESSIONS, "{starts:?}");
    assert!(starts.values().all(|n| *n == 1), "{starts:?}");
    let lease_stops = c
        .registry
        .receipt_log()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| matches!(&r.kind, ReceiptKind::ComputeStopped { reason, .. } if reason == "lease_expired"))
        .count();
    assert_eq!(lease_stops, SESSIONS);
    for e in &envs {
        let r = h.record(e).await.unwrap().unwrap();
        assert_eq!(r.status, RecordStatus::Stopped, "{e}");
    }
    let state = h.client.state().await.unwrap();
    assert!(
        envs.iter()
            .all(|e| state.environment(e).unwrap().connect_count == 1)
    );
    assert!(h.sim.delivery_stats().copies >= (SESSIONS as u64) * 5);
    h.shutdown().await.unwrap();
}
