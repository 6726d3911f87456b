//! SqliteRegistry: the shared registry contract plus local specifics.

use sandbox_controller::contract::{registry_contract, registry_slots_contract};
use sandbox_controller::ports::{AuditEntry, Fence, Registry, Release, Write};
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::record::Record;
use sandbox_local::SqliteRegistry;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_registry_passes_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let r = SqliteRegistry::open(dir.path().join("state.db")).unwrap();
    registry_contract(&r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_registry_passes_the_slots_contract() {
    let dir = tempfile::tempdir().unwrap();
    let r = SqliteRegistry::open(dir.path().join("state.db")).unwrap();
    registry_slots_contract(&r).await;
}

/// Two handles (two connections, as two `serve` processes would have) racing for the last
/// slots: never more holders than the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_racing_for_slots_never_exceed_the_cap() {
    use sandbox_controller::ports::Slot;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let a = SqliteRegistry::open(&path).unwrap();
    let b = SqliteRegistry::open(&path).unwrap();
    let mut tasks = Vec::new();
    for i in 0..32 {
        let r = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            let fence = Fence {
                key: EnvironmentId::new(format!("env_cap_{i}")).effect_key(),
                owner: format!("w{i}"),
            };
            assert!(
                r.lock(&fence.key, &fence.owner, 200, 100)
                    .await
                    .unwrap()
                    .is_some()
            );
            r.acquire_slot(&fence, 100, 5).await.unwrap()
        }));
    }
    let mut acquired = 0;
    for t in tasks {
        acquired += usize::from(t.await.unwrap() == Slot::Acquired);
    }
    assert_eq!(acquired, 5);
    let slots = b.slots().await.unwrap();
    assert_eq!((slots.in_use, slots.holders.len()), (5, 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contract_runs_concurrently_on_one_backend_and_two_handles() {
    let dir = tempfile::tempdir().unwrap();
    let a = SqliteRegistry::open(dir.path().join("state.db")).unwrap();
    let b = SqliteRegistry::open(dir.path().join("state.db")).unwrap();
    tokio::join!(
        registry_contract(&a),
        registry_contract(&b),
        registry_contract(&a)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_conditional_writes_from_two_handles_have_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let a = SqliteRegistry::open(&path).unwrap();
    let b = SqliteRegistry::open(&path).unwrap();
    let record = Record::new(EnvironmentId::new("env_race"), SessionId::new("sess_race"));
    let fence = Fence {
        key: record.environment_id.effect_key(),
        owner: "w-race".to_owned(),
    };
    assert!(
        a.lock(&fence.key, &fence.owner, 90, 10)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        a.put(&fence, 10, &record, None).await.unwrap(),
        Write::Written(1)
    );
    // The same holder's writes racing through two handles (a retried request).
    let mut tasks = Vec::new();
    for i in 0..16 {
        let r = if i % 2 == 0 { a.clone() } else { b.clone() };
        let mut rec = record.clone();
        rec.generation = sandbox_core::ids::Generation(i);
        let fence = fence.clone();
        tasks.push(tokio::spawn(async move {
            r.put(&fence, 11, &rec, Some(1)).await.unwrap()
        }));
    }
    let mut written = 0;
    for t in tasks {
        if t.await.unwrap() == Write::Written(2) {
            written += 1;
        }
    }
    assert_eq!(
        written, 1,
        "exactly one conditional write at version 1 wins"
    );
    // Lock races: exactly one of many owners takes a free lock.
    let key = record.environment_id.effect_key();
    let mut tasks = Vec::new();
    for i in 0..16 {
        let r = if i % 2 == 0 { a.clone() } else { b.clone() };
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            r.lock(&key, &format!("w{i}"), 200, 100).await.unwrap()
        }));
    }
    let mut taken = 0;
    for t in tasks {
        taken += usize::from(t.await.unwrap().is_some());
    }
    assert_eq!(taken, 1);
    assert!(
        a.lock_holder(&key)
            .await
            .unwrap()
            .is_some_and(|(_, until)| until == 200)
    );
}

#[tokio::test]
async fn audit_entries_list_per_key_in_order_and_everything_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let env = EnvironmentId::new("env_audit");
    let key = env.effect_key();
    {
        let r = SqliteRegistry::open(&path).unwrap();
        let fence = Fence {
            key: key.clone(),
            owner: "w-audit".to_owned(),
        };
        assert!(
            r.lock(&key, &fence.owner, 200, 100)
                .await
                .unwrap()
                .is_some()
        );
        let record = Record::new(env.clone(), SessionId::new("sess_audit"));
        let release = Release {
            record: Some((&record, None)),
            clean: true,
            ..Release::default()
        };
        assert!(r.release(&fence, 100, release).await.unwrap());
        for (i, outcome) in ["start", "wait", "schedule-stop"].iter().enumerate() {
            r.audit(&AuditEntry {
                at: 100 + i as u64,
                effect_key: if i == 1 {
                    EnvironmentId::new("env_other").effect_key()
                } else {
                    key.clone()
                },
                session_id: SessionId::new("sess_audit"),
                trigger: serde_json::json!({"kind": "idle"}),
                observed: serde_json::json!({}),
                outcome: (*outcome).to_owned(),
                reason: "test".to_owned(),
                applied: vec![],
                error: (i == 2).then(|| "boom".to_owned()),
            })
            .await
            .unwrap();
        }
        r.remember_delivery("msg_1", 500).await.unwrap();
        r.remember_delivery("msg_2", 50).await.unwrap();
    }
    // Entries written at Unix second 100: kept with a retention that reaches back there.
    let r = SqliteRegistry::open(&path)
        .unwrap()
        .with_history_retention(u64::MAX);
    let entries = r.audit_entries(&key).await.unwrap();
    let outcomes: Vec<&str> = entries.iter().map(|e| e.outcome.as_str()).collect();
    assert_eq!(outcomes, ["start", "schedule-stop"]);
    assert_eq!(entries[1].error.as_deref(), Some("boom"));
    assert_eq!(r.get(&key).await.unwrap().unwrap().version, 1);
    assert!(r.seen_delivery("msg_1", 100).await.unwrap());
    assert_eq!(r.purge_expired_deliveries(100).await.unwrap(), 1);
    assert!(r.seen_delivery("msg_1", 100).await.unwrap());
    assert!(!r.seen_delivery("msg_2", 10).await.unwrap(), "purged");
}

/// Audit entries and receipts older than the retention read as absent
/// (before any prune) and `prune_history` deletes them in bounded batches, oldest first,
/// leaving what is within the retention.
#[tokio::test]
async fn history_past_its_retention_reads_absent_and_is_pruned_in_batches() {
    use sandbox_controller::ports::{Receipt, ReceiptKind};
    let dir = tempfile::tempdir().unwrap();
    let r = SqliteRegistry::open(dir.path().join("state.db"))
        .unwrap()
        .with_history_retention(10 * 86_400);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let key = EnvironmentId::new("env_old").effect_key();
    for day in 0..20u64 {
        let at = now - day * 86_400 - 60;
        r.audit(&AuditEntry {
            at,
            effect_key: key.clone(),
            session_id: SessionId::new("sess_old"),
            trigger: serde_json::json!({"kind": "idle"}),
            observed: serde_json::json!({}),
            outcome: "ignore".to_owned(),
            reason: format!("day {day}"),
            applied: vec![],
            error: None,
        })
        .await
        .unwrap();
        r.receipt(&Receipt {
            at,
            effect_key: key.clone(),
            kind: ReceiptKind::SessionDeleted {
                session_id: SessionId::new("sess_old"),
            },
        })
        .await
        .unwrap();
    }
    // Days 0..9 are within the 10 days; 10..19 have expired.
    assert_eq!(r.audit_entries(&key).await.unwrap().len(), 10);
    assert_eq!(r.receipts(&key).await.unwrap().len(), 10);
    assert_eq!(r.audit_log().await.unwrap().len(), 20, "still stored");
    assert_eq!(r.prune_history(now, 4).await.unwrap(), 8, "4 per table");
    assert_eq!(r.audit_log().await.unwrap().len(), 16);
    assert_eq!(r.prune_history(now, 100).await.unwrap(), 12);
    assert_eq!(r.prune_history(now, 100).await.unwrap(), 0);
    assert_eq!(r.audit_log().await.unwrap().len(), 10);
    assert_eq!(r.receipt_log().await.unwrap().len(), 10);
    assert_eq!(
        r.audit_entries(&key).await.unwrap().len(),
        10,
        "the kept ones"
    );
}
