//! DynamoRegistry on moto: the registry contract, the table schema, TTL-expired ledger
//! items, lock expiry, ordering of appends, and session lookups.

use crate::support::{now, sdk, unique};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeValue, BillingMode, KeyType, ProjectionType, TimeToLiveStatus,
};
use sandbox_aws::{DynamoRegistry, create_table};
use sandbox_controller::contract::{registry_contract, registry_slots_contract};
use sandbox_controller::ports::{
    AuditEntry, Fence, Receipt, ReceiptKind, Registry, Release, Write,
};
use sandbox_core::ids::{EnvironmentId, InstanceId, SessionId};
use sandbox_core::record::Record;

async fn registry() -> (DynamoRegistry, Client, String) {
    let ddb = Client::new(&sdk().await);
    let table = format!("registry-{}", unique());
    create_table(&ddb, &table).await.expect("create_table");
    (DynamoRegistry::new(ddb.clone(), &table), ddb, table)
}

async fn raw_item(
    ddb: &Client,
    table: &str,
    pk: &str,
    sk: &str,
) -> Option<std::collections::HashMap<String, AttributeValue>> {
    ddb.get_item()
        .table_name(table)
        .key("pk", AttributeValue::S(pk.to_owned()))
        .key("sk", AttributeValue::S(sk.to_owned()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item()
        .cloned()
}

#[tokio::test]
async fn dynamo_registry_passes_the_contract() {
    let (r, _, _) = registry().await;
    registry_contract(&r).await;
}

#[tokio::test]
async fn dynamo_registry_passes_the_slots_contract() {
    let (r, _, _) = registry().await;
    registry_slots_contract(&r).await;
}

/// The slot items have the documented shape: one partition `capacity#executors` holding
/// the holders (sort key `slot#{environment id}`) and the counter (`counter`).
#[tokio::test]
async fn executor_slots_are_the_documented_items() {
    use sandbox_controller::ports::{Slot, SlotRelease};
    let (r, ddb, table) = registry().await;
    let env = EnvironmentId::new(format!("env_{}", unique()));
    let fence = Fence {
        key: env.effect_key(),
        owner: "w-slot".to_owned(),
    };
    let t = now();
    assert!(
        r.lock(&fence.key, &fence.owner, t + 60, t)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(r.acquire_slot(&fence, t, 1).await.unwrap(), Slot::Acquired);
    let holder_sk = format!("slot#{env}");
    let holder = raw_item(&ddb, &table, "capacity#executors", &holder_sk)
        .await
        .unwrap();
    assert_eq!(
        holder["environment_id"],
        AttributeValue::S(env.as_str().to_owned())
    );
    assert_eq!(holder["acquired_at"], AttributeValue::N(t.to_string()));
    let counter = raw_item(&ddb, &table, "capacity#executors", "counter")
        .await
        .unwrap();
    assert_eq!(counter["in_use"], AttributeValue::N("1".into()));
    // The slot items are not records: list() does not return them.
    assert!(r.list().await.unwrap().is_empty());
    assert_eq!(
        r.release_slot(&fence, t).await.unwrap(),
        SlotRelease::Released
    );
    assert!(
        raw_item(&ddb, &table, "capacity#executors", &holder_sk)
            .await
            .is_none()
    );
    let counter = raw_item(&ddb, &table, "capacity#executors", "counter")
        .await
        .unwrap();
    assert_eq!(counter["in_use"], AttributeValue::N("0".into()));
}

/// The table has exactly the schema the module docs (and the SAM/CDK templates) declare.
#[tokio::test]
async fn create_table_makes_the_documented_schema() {
    let (_, ddb, table) = registry().await;
    let out = ddb
        .describe_table()
        .table_name(&table)
        .send()
        .await
        .unwrap();
    let t = out.table().unwrap();
    let keys: Vec<(String, KeyType)> = t
        .key_schema()
        .iter()
        .map(|k| (k.attribute_name().to_owned(), k.key_type().clone()))
        .collect();
    assert_eq!(
        keys,
        vec![
            ("pk".to_owned(), KeyType::Hash),
            ("sk".to_owned(), KeyType::Range)
        ]
    );
    assert_eq!(
        t.billing_mode_summary().and_then(|b| b.billing_mode()),
        Some(&BillingMode::PayPerRequest)
    );
    let mut gsis = t.global_secondary_indexes().to_vec();
    gsis.sort_by(|a, b| a.index_name().cmp(&b.index_name()));
    let shape: Vec<(&str, Vec<&str>, Option<&ProjectionType>)> = gsis
        .iter()
        .map(|g| {
            (
                g.index_name().unwrap_or_default(),
                g.key_schema().iter().map(|k| k.attribute_name()).collect(),
                g.projection().and_then(|p| p.projection_type()),
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            (
                "by_open",
                vec!["open_shard", "pk"],
                Some(&ProjectionType::All)
            ),
            (
                "by_session",
                vec!["session_id"],
                Some(&ProjectionType::KeysOnly)
            ),
        ]
    );
    let ttl = ddb
        .describe_time_to_live()
        .table_name(&table)
        .send()
        .await
        .unwrap();
    let ttl = ttl.time_to_live_description().unwrap();
    assert_eq!(ttl.attribute_name(), Some("expires_at"));
    assert_eq!(ttl.time_to_live_status(), Some(&TimeToLiveStatus::Enabled));
}

/// moto never deletes TTL-expired items (AWS deletes them late): an expired ledger item
/// that is still stored reads as absent.
#[tokio::test]
async fn an_expired_ledger_item_still_stored_reads_absent() {
    let (r, ddb, table) = registry().await;
    let wh = format!("msg_{}", unique());
    let t = now();
    r.remember_delivery(&wh, t - 10).await.unwrap();
    let item = raw_item(&ddb, &table, &format!("webhook#{wh}"), "ledger").await;
    assert!(item.is_some(), "the expired item is still stored");
    assert!(!r.seen_delivery(&wh, t).await.unwrap());
    r.remember_delivery(&wh, t + 60).await.unwrap();
    assert!(r.seen_delivery(&wh, t).await.unwrap());
    assert!(
        !r.seen_delivery(&wh, t + 60).await.unwrap(),
        "expires_at <= now is absent"
    );
}

/// A lock is a lease on `lock_until` (epoch seconds) stored on the record item: held
/// through `until`, free after; a clean release removes the lock attributes, an unclean
/// one leaves `lock_until` at 0 (the next take is `recovered`); the record item never gets
/// a TTL attribute.
#[tokio::test]
async fn locks_live_on_the_record_item() {
    let (r, ddb, table) = registry().await;
    let env = EnvironmentId::new(format!("env_{}", unique()));
    let key = env.effect_key();
    let t = now();
    let taken = r.lock(&key, "a", t + 5, t).await.unwrap().expect("free");
    assert_eq!((taken.record, taken.recovered), (None, false));
    assert!(
        r.lock(&key, "b", t + 10, t + 5).await.unwrap().is_none(),
        "held at now == until"
    );
    assert!(
        r.lock(&key, "a", t + 10, t + 1).await.unwrap().is_none(),
        "not re-entrant"
    );
    let taken = r
        .lock(&key, "b", t + 10, t + 6)
        .await
        .unwrap()
        .expect("free once until < now");
    assert!(taken.recovered, "taken over from an expired holder");
    let item = raw_item(&ddb, &table, key.as_str(), "record")
        .await
        .expect("lock attributes on the record item");
    assert_eq!(
        item.get("lock_owner"),
        Some(&AttributeValue::S("b".to_owned()))
    );
    assert_eq!(
        item.get("lock_until"),
        Some(&AttributeValue::N((t + 10).to_string()))
    );
    assert!(
        !item.contains_key("expires_at"),
        "no TTL on the record item"
    );
    let fence = Fence {
        key: key.clone(),
        owner: "b".to_owned(),
    };
    let record = Record::new(env.clone(), SessionId::new("sess_lock"));
    let release = Release {
        record: Some((&record, None)),
        clean: false,
        ..Release::default()
    };
    assert!(r.release(&fence, t + 7, release).await.unwrap());
    let item = raw_item(&ddb, &table, key.as_str(), "record")
        .await
        .unwrap();
    assert_eq!(item.get("lock_until"), Some(&AttributeValue::N("0".into())));
    let taken = r
        .lock(&key, "c", t + 20, t + 8)
        .await
        .unwrap()
        .expect("free");
    assert!(
        taken.recovered,
        "an unclean release makes the next take recovered"
    );
    assert_eq!(taken.record.map(|rec| rec.version), Some(1));
    let fence = Fence {
        key: key.clone(),
        owner: "c".to_owned(),
    };
    let release = Release {
        clean: true,
        ..Release::default()
    };
    assert!(r.release(&fence, t + 9, release).await.unwrap());
    let item = raw_item(&ddb, &table, key.as_str(), "record")
        .await
        .unwrap();
    assert!(!item.contains_key("lock_owner") && !item.contains_key("lock_until"));
    assert!(item.contains_key("record"), "the record stays");
}

/// Writes `record` under a lock taken and released around it (the registry fences every
/// record write).
async fn put_locked(r: &DynamoRegistry, record: &Record, expected: Option<u64>) -> Write {
    let key = record.environment_id.effect_key();
    let t = now();
    let owner = format!("w-{}", unique());
    r.lock(&key, &owner, t + 60, t)
        .await
        .unwrap()
        .expect("lock free");
    let fence = Fence { key, owner };
    let w = r.put(&fence, t, record, expected).await.unwrap();
    let release = Release {
        clean: true,
        ..Release::default()
    };
    assert!(r.release(&fence, t, release).await.unwrap());
    w
}

/// Receipts and audit entries written back to back (many within one millisecond) read
/// back in write order, every page (60 receipts of about 20 KB: more than DynamoDB's 1 MB
/// page, which moto enforces too); `list` scans past them to the records.
#[tokio::test]
async fn appends_read_back_in_write_order() {
    let (r, _, _) = registry().await;
    let env = EnvironmentId::new(format!("env_{}", unique()));
    let key = env.effect_key();
    let session = SessionId::new("sess_order");
    let other = EnvironmentId::new(format!("env_{}_rec", unique()));
    let t = now();
    let mut receipts = Vec::new();
    for i in 0..60u64 {
        let receipt = Receipt {
            at: t + i,
            effect_key: key.clone(),
            kind: ReceiptKind::ComputeStopped {
                instance_id: InstanceId::new(format!("inst_{i}")),
                generation: i,
                reason: "x".repeat(20_000),
                workspace: Default::default(),
            },
        };
        r.receipt(&receipt).await.unwrap();
        receipts.push(receipt);
        let entry = AuditEntry {
            at: t + i,
            effect_key: key.clone(),
            session_id: session.clone(),
            trigger: serde_json::json!({"kind": "sweep"}),
            observed: serde_json::json!({"i": i}),
            outcome: "noop".to_owned(),
            reason: format!("entry {i}"),
            applied: vec![],
            error: None,
        };
        r.audit(&entry).await.unwrap();
    }
    // Written after 1.2 MB of other items: moto scans in insertion order.
    put_locked(&r, &Record::new(other.clone(), session.clone()), None).await;
    assert_eq!(r.receipts(&key).await.unwrap(), receipts);
    let audit = r.audit_entries(&key).await.unwrap();
    assert_eq!(
        audit.iter().map(|e| e.at).collect::<Vec<_>>(),
        (t..t + 60).collect::<Vec<_>>()
    );
    // Audit items and receipts never show up as records; the record behind them does.
    let all = r.list().await.unwrap();
    assert!(all.iter().all(|rec| rec.environment_id != env));
    assert_eq!(
        all.iter().filter(|rec| rec.environment_id == other).count(),
        1
    );
}

/// `find_by_session` reads the index, then the record itself: a record moved to another
/// session is found under the new one only.
#[tokio::test]
async fn find_by_session_follows_the_stored_record() {
    let (r, _, _) = registry().await;
    let u = unique();
    let env = EnvironmentId::new(format!("env_{u}"));
    let (s1, s2) = (
        SessionId::new(format!("sess_{u}_1")),
        SessionId::new(format!("sess_{u}_2")),
    );
    let mut record = Record::new(env.clone(), s1.clone());
    assert_eq!(put_locked(&r, &record, None).await, Write::Written(1));
    assert_eq!(
        r.find_by_session(&s1).await.unwrap().map(|x| x.version),
        Some(1)
    );
    record.session_id = s2.clone();
    assert_eq!(put_locked(&r, &record, Some(1)).await, Write::Written(2));
    assert_eq!(r.find_by_session(&s1).await.unwrap(), None);
    let found = r.find_by_session(&s2).await.unwrap().unwrap();
    assert_eq!((found.environment_id, found.version), (env, 2));
}

/// A record with a corrupt JSON attribute is a permanent error, not a panic or a silent
/// skip.
#[tokio::test]
async fn a_corrupt_record_is_a_permanent_error() {
    let (r, ddb, table) = registry().await;
    let key = EnvironmentId::new(format!("env_{}", unique())).effect_key();
    ddb.put_item()
        .table_name(&table)
        .item("pk", AttributeValue::S(key.as_str().to_owned()))
        .item("sk", AttributeValue::S("record".to_owned()))
        .item("record", AttributeValue::S("{oops".to_owned()))
        .item("version", AttributeValue::N("1".to_owned()))
        .send()
        .await
        .unwrap();
    let err = r.get(&key).await.unwrap_err();
    assert!(!err.retryable, "{err}");
    assert!(err.to_string().contains("decoded"), "{err}");
}

/// Items DynamoDB read for this client, summed from the responses (an SDK interceptor):
/// `ScannedCount` of every `Query` and `Scan` page (what DynamoDB read before any filter,
/// which is what it bills and what takes time) and one per `GetItem` that found an item.
#[derive(Clone, Debug, Default)]
struct ItemsRead(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl ItemsRead {
    fn take(&self) -> u64 {
        self.0.swap(0, std::sync::atomic::Ordering::Relaxed)
    }
}

impl aws_sdk_dynamodb::config::Intercept for ItemsRead {
    fn name(&self) -> &'static str {
        "ItemsRead"
    }

    fn read_after_execution(
        &self,
        context: &aws_sdk_dynamodb::config::interceptors::FinalizerInterceptorContextRef<'_>,
        _runtime_components: &aws_sdk_dynamodb::config::RuntimeComponents,
        _cfg: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        use aws_sdk_dynamodb::operation::{
            get_item::GetItemOutput, query::QueryOutput, scan::ScanOutput,
        };
        let Some(Ok(output)) = context.output_or_error() else {
            return Ok(());
        };
        let read = if let Some(q) = output.downcast_ref::<QueryOutput>() {
            u64::try_from(q.scanned_count()).unwrap_or(0)
        } else if let Some(s) = output.downcast_ref::<ScanOutput>() {
            u64::try_from(s.scanned_count()).unwrap_or(0)
        } else if let Some(g) = output.downcast_ref::<GetItemOutput>() {
            u64::from(g.item().is_some())
        } else {
            0
        };
        self.0.fetch_add(read, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// The sweep's registry reads (`list_open`, `slots`) read the open records and
/// the slot partition only: 30 days of audit entries and receipts per environment and as
/// many closed records again change nothing, while a table `Scan` (`list`, the operators'
/// view) reads all of it. Expired history reads as absent.
#[tokio::test]
async fn registry_reads_do_not_grow_with_history() {
    let counter = ItemsRead::default();
    let conf = aws_sdk_dynamodb::config::Builder::from(&sdk().await)
        .interceptor(counter.clone())
        .build();
    let ddb = Client::from_conf(conf);
    let table = format!("registry-{}", unique());
    create_table(&ddb, &table).await.expect("create_table");
    let r = DynamoRegistry::new(ddb, &table);
    let u = unique();
    let t = now();
    const OPEN: usize = 12;
    let open: Vec<EnvironmentId> = (0..OPEN)
        .map(|i| EnvironmentId::new(format!("env_{u}_{i}")))
        .collect();
    for env in &open {
        let record = Record::new(env.clone(), SessionId::new(format!("sess_{env}")));
        put_locked(&r, &record, None).await;
    }
    let (r, u) = (&r, &u);
    let close = |i: usize| async move {
        let env = EnvironmentId::new(format!("env_{u}_closed_{i}"));
        let mut record = Record::new(env.clone(), SessionId::new(format!("sess_{env}")));
        put_locked(r, &record, None).await;
        record.status = sandbox_core::record::RecordStatus::Closed;
        put_locked(r, &record, Some(1)).await;
    };
    close(0).await;
    counter.take();
    let sweep_reads = async || {
        let listed = r.list_open().await.unwrap();
        let slots = r.slots().await.unwrap();
        assert_eq!(listed.len(), OPEN, "every open record, no closed one");
        assert!(slots.holders.is_empty());
        counter.take()
    };
    let before = sweep_reads().await;
    let scan_before = {
        r.list().await.unwrap();
        counter.take()
    };
    // 30 days of history: a decision and a receipt per environment per day, plus closed
    // records, plus expired history (written 31 days ago: TTL has not deleted it yet).
    for (i, env) in open.iter().enumerate() {
        for day in 0..30u64 {
            let at = t - day * 86_400;
            r.audit(&AuditEntry {
                at,
                effect_key: env.effect_key(),
                session_id: SessionId::new(format!("sess_{env}")),
                trigger: serde_json::json!({"kind": "sweep"}),
                observed: serde_json::json!({"day": day}),
                outcome: "start".to_owned(),
                reason: "history".to_owned(),
                applied: vec![],
                error: None,
            })
            .await
            .unwrap();
            r.receipt(&Receipt {
                at,
                effect_key: env.effect_key(),
                kind: ReceiptKind::SessionDeleted {
                    session_id: SessionId::new(format!("sess_{env}_{day}")),
                },
            })
            .await
            .unwrap();
        }
        r.receipt(&Receipt {
            at: t - 31 * 86_400,
            effect_key: env.effect_key(),
            kind: ReceiptKind::SessionDeleted {
                session_id: SessionId::new("expired"),
            },
        })
        .await
        .unwrap();
        close(i + 1).await;
    }
    counter.take();
    let after = sweep_reads().await;
    assert_eq!(
        after, before,
        "the sweep's reads ({before} items before, {after} after) do not grow with history"
    );
    assert!(
        before as f64 <= 1.1 * OPEN as f64,
        "the sweep reads about the open records: {before} items for {OPEN}"
    );
    r.list().await.unwrap();
    let scan_after = counter.take();
    eprintln!(
        "moto: sweep reads {before} items before history, {after} after; a Scan reads {scan_before} → {scan_after}"
    );
    assert!(
        scan_after > scan_before + 30 * OPEN as u64,
        "the interceptor counts what a Scan reads ({scan_before} → {scan_after} items)"
    );
    let receipts = r.receipts(&open[0].effect_key()).await.unwrap();
    assert_eq!(receipts.len(), 30, "the expired receipt reads as absent");
}

/// Records written before the `by_open` index existed carry no `open_shard`, so
/// the sweep's read (`list_open`) never sees them; `backfill_open_index` (behind
/// `sandboxctl migrate`) puts every open one into the index, leaves closed ones out, writes
/// nothing on a dry run and nothing on a second run.
#[tokio::test]
async fn records_written_before_the_open_index_are_backfilled() {
    let (r, ddb, table) = registry().await;
    let u = unique();
    let old_open = EnvironmentId::new(format!("env_{u}_old_open"));
    let old_closed = EnvironmentId::new(format!("env_{u}_old_closed"));
    let new_open = EnvironmentId::new(format!("env_{u}_new_open"));
    for (env, closed) in [(&old_open, false), (&old_closed, true), (&new_open, false)] {
        let mut record = Record::new(env.clone(), SessionId::new(format!("sess_{env}")));
        if closed {
            record.status = sandbox_core::record::RecordStatus::Closed;
        }
        assert_eq!(put_locked(&r, &record, None).await, Write::Written(1));
    }
    // The two old records as a pre-issue-22 writer left them: no `open_shard`.
    for env in [&old_open, &old_closed] {
        ddb.update_item()
            .table_name(&table)
            .key(
                "pk",
                AttributeValue::S(env.effect_key().as_str().to_owned()),
            )
            .key("sk", AttributeValue::S("record".to_owned()))
            .update_expression("REMOVE open_shard")
            .send()
            .await
            .unwrap();
    }
    let open_ids = |records: Vec<Record>| -> Vec<EnvironmentId> {
        records.into_iter().map(|r| r.environment_id).collect()
    };
    assert_eq!(
        open_ids(r.list_open().await.unwrap()),
        vec![new_open.clone()]
    );

    let dry = r.backfill_open_index(true).await.unwrap();
    assert_eq!((dry.open, dry.closed, dry.backfilled), (1, 1, 0), "{dry:?}");
    assert_eq!(
        open_ids(r.list_open().await.unwrap()),
        vec![new_open.clone()]
    );

    let done = r.backfill_open_index(false).await.unwrap();
    assert_eq!(
        (done.open, done.closed, done.backfilled),
        (1, 1, 1),
        "{done:?}"
    );
    let mut listed = open_ids(r.list_open().await.unwrap());
    listed.sort();
    let mut expected = vec![new_open.clone(), old_open.clone()];
    expected.sort();
    assert_eq!(listed, expected);
    // The record itself is untouched (same version, same content).
    let stored = r.get(&old_open.effect_key()).await.unwrap().unwrap();
    assert_eq!(stored.version, 1);

    let again = r.backfill_open_index(false).await.unwrap();
    assert_eq!((again.open, again.backfilled), (0, 0), "{again:?}");
}
