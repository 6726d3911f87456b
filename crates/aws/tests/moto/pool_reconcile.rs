//! The refill's reconcile from the pool table (docs/WARM_POOL.md "Refill", "ECS calls";
//! `crates/aws/src/ecs_pool.rs`) against moto: its remote calls do not grow with the
//! members the pool has handed out, its one `ListTasks` page a refill still walks the
//! whole listing and finds an orphan among claimed members, and a member whose record was
//! lost is recorded by replaying its `RunTask` with the same `clientToken`.
//!
//! Calls are counted as sent: ECS requests by the adapter's `StrictEcs` recorder, DynamoDB
//! requests by [`DdbCalls`] (an SDK interceptor reading `X-Amz-Target`). The claimed
//! members are real moto tasks with the pool's `startedBy` and real assigned items, written
//! in bulk (`RunTask` `count` 10, `BatchWriteItem` 25), as many claims would leave them.

use crate::pool::{MAX_AGE, PoolMoto, ROLE, controller_with, deployment, pool_moto};
use crate::support::{now, sdk, unique};
use aws_sdk_dynamodb::config::interceptors::{
    BeforeSerializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsInput;
use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
use aws_sdk_ecs::types::{
    AssignPublicIp, AwsVpcConfiguration, LaunchType, NetworkConfiguration, Tag,
};
use sandbox_aws::ecs_pool::{ORPHAN_REASON, POOL_MEMBER, TAG_POOL, TAG_POOL_ROLE};
use sandbox_aws::{EcsCompute, pool_started_by};
use sandbox_controller::pool::REFILL_LEASE_SECS;
use sandbox_controller::ports::{Clock, Compute, NO_DEADLINE};
use sandbox_core::ids::DeploymentId;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// Every DynamoDB request this client sent, by operation (`X-Amz-Target`
/// `DynamoDB_20120810.<Operation>`), in order.
#[derive(Clone, Debug, Default)]
struct DdbCalls(Arc<Mutex<Vec<String>>>);

impl DdbCalls {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl Intercept for DdbCalls {
    fn name(&self) -> &'static str {
        "DdbCalls"
    }
    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let target = context
            .request()
            .headers()
            .get("x-amz-target")
            .unwrap_or("?");
        let op = target.rsplit('.').next().unwrap_or(target).to_owned();
        self.0.lock().unwrap().push(op);
        Ok(())
    }
}

/// Fails every `TransactWriteItems` before it is sent: a worker killed between a member's
/// `RunTask` and its record.
#[derive(Debug)]
struct NoTransactions;

impl Intercept for NoTransactions {
    fn name(&self) -> &'static str {
        "NoTransactions"
    }
    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if context
            .input()
            .downcast_ref::<TransactWriteItemsInput>()
            .is_some()
        {
            return Err("killed before TransactWriteItems".into());
        }
        Ok(())
    }
}

/// An `EcsCompute` on `m`'s cluster, table and clock whose ECS requests `m.guard` records
/// and whose DynamoDB client runs `interceptor`.
async fn compute_with_ddb(m: &PoolMoto, interceptor: impl Intercept + 'static) -> EcsCompute {
    let sdk = sdk().await;
    let ddb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk)
            .interceptor(interceptor)
            .build(),
    );
    EcsCompute::new(m.guard.client(&sdk), m.config.clone())
        .with_pool(ddb, m.pool.clone())
        .with_pool_clock(m.clock.clone())
}

/// Leaves `count` members claimed in `d` as claims leave them: live tasks with the pool's
/// `startedBy`, the pool tags and `sandbox:environment`/`sandbox:session`/
/// `sandbox:generation` (one environment per `RunTask` of 10), and an assigned item each
/// (no `idle_deployment`, no `pool_deployment`, no expiry). Returns their ARNs.
async fn add_claimed(m: &PoolMoto, d: &DeploymentId, count: usize) -> Vec<String> {
    let vpc = AwsVpcConfiguration::builder()
        .set_subnets(Some(m.config.subnets.clone()))
        .set_security_groups(Some(m.config.security_groups.clone()))
        .assign_public_ip(AssignPublicIp::Enabled)
        .build()
        .unwrap();
    let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
    let mut arns = Vec::with_capacity(count);
    let mut items = Vec::with_capacity(count);
    let t = m.clock.now();
    while arns.len() < count {
        let batch = (count - arns.len()).min(10);
        let env = format!("env_{}", unique());
        let out = m
            .ecs
            .run_task()
            .cluster(&m.config.cluster)
            .task_definition(&m.config.task_definition)
            .launch_type(LaunchType::Fargate)
            .count(i32::try_from(batch).unwrap())
            .started_by(pool_started_by(d))
            .network_configuration(
                NetworkConfiguration::builder()
                    .awsvpc_configuration(vpc.clone())
                    .build(),
            )
            .tags(tag("sandbox:deployment", d.as_str()))
            .tags(tag(TAG_POOL, POOL_MEMBER))
            .tags(tag(TAG_POOL_ROLE, ROLE))
            .tags(tag("sandbox:environment", &env))
            .tags(tag("sandbox:session", &format!("sess_{env}")))
            .tags(tag("sandbox:generation", "1"))
            .send()
            .await
            .unwrap();
        assert_eq!(out.tasks().len(), batch, "{:?}", out.failures());
        for task in out.tasks() {
            let arn = task.task_arn().unwrap().to_owned();
            let id = arn.rsplit('/').next().unwrap();
            let s = |v: &str| AttributeValue::S(v.to_owned());
            let item = HashMap::from([
                ("pk".to_owned(), s(&format!("{ROLE}:{id}"))),
                ("deployment".to_owned(), s(d.as_str())),
                ("task_arn".to_owned(), s(&arn)),
                ("created_at".to_owned(), AttributeValue::N(t.to_string())),
                ("state".to_owned(), s("assigned")),
                ("environment_id".to_owned(), s(&env)),
                ("session_id".to_owned(), s(&format!("sess_{env}"))),
                ("remote_url".to_owned(), s("wss://agents.invalid/connect")),
                ("generation".to_owned(), AttributeValue::N("1".to_owned())),
                ("idempotency_token".to_owned(), s(&format!("tok-{id}"))),
                ("assigned_at".to_owned(), AttributeValue::N(t.to_string())),
                (
                    "claimed_environment".to_owned(),
                    s(&format!("{}#{env}", d.as_str())),
                ),
            ]);
            items.push(
                WriteRequest::builder()
                    .put_request(PutRequest::builder().set_item(Some(item)).build().unwrap())
                    .build(),
            );
            arns.push(arn);
        }
    }
    for chunk in items.chunks(25) {
        let out = m
            .ddb
            .batch_write_item()
            .request_items(&m.table, chunk.to_vec())
            .send()
            .await
            .unwrap();
        assert!(
            out.unprocessed_items().is_none_or(HashMap::is_empty),
            "moto processes every item"
        );
    }
    arns
}

/// The live tasks with the pool's `startedBy` in `d` (every page, the test's own client).
async fn live_pool_tasks(m: &PoolMoto, d: &DeploymentId) -> Vec<String> {
    let mut pages = m
        .ecs
        .list_tasks()
        .cluster(&m.config.cluster)
        .started_by(pool_started_by(d))
        .into_paginator()
        .send();
    let mut arns = Vec::new();
    while let Some(page) = pages.next().await {
        arns.extend(page.unwrap().task_arns().iter().cloned());
    }
    arns
}

/// The refill's remote calls by `service.Operation`.
fn tally(ecs: &[sandbox_aws::strict_ecs::EcsRequest], ddb: &[String]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in ecs {
        *out.entry(format!("ecs.{}", r.operation)).or_default() += 1;
    }
    for op in ddb {
        *out.entry(format!("dynamodb.{op}")).or_default() += 1;
    }
    out
}

/// The refill's calls with a full pool of 2 and 10 vs 1,000 members claimed: the same
/// calls, one for one. The reconcile reads the refill's own partition (`Query` `by_pool`:
/// the 2 idle members) and one `ListTasks` page (the backstop), whatever the listing's
/// length; before, it listed, described and looked up every claimed member.
#[tokio::test]
async fn pool_refill_calls_do_not_grow_with_claimed_members() {
    let m = pool_moto().await;
    let mut tallies = Vec::new();
    for claimed in [10, 1_000] {
        let d = deployment();
        let ddb = DdbCalls::default();
        let compute = compute_with_ddb(&m, ddb.clone()).await;
        let c = controller_with(&m, &d, 2, 0, compute).await;
        let r = c.refill_pool().await.unwrap();
        assert_eq!((r.started, r.idle), (2, 2), "{r:?}");
        let arns = add_claimed(&m, &d, claimed).await;
        m.clock.advance(REFILL_LEASE_SECS + 1);
        m.guard.clear();
        ddb.take();
        let r = c.refill_pool().await.unwrap();
        assert_eq!(
            (r.skipped, r.reconciled, r.recycled, r.started, r.idle),
            (false, 0, 0, 0, 2),
            "{claimed} claimed: {r:?}"
        );
        let calls = tally(&m.guard.requests(), &ddb.take());
        eprintln!("refill with {claimed} claimed members: {calls:?}");
        tallies.push(calls);
        let live = live_pool_tasks(&m, &d).await;
        assert_eq!(live.len(), claimed + 2, "nothing stopped");
        assert!(arns.iter().all(|a| live.contains(a)));
        m.stop_all(&d).await;
    }
    assert_eq!(tallies[0], tallies[1], "calls at 10 vs 1,000 claimed");
    let expected: BTreeMap<String, usize> = [
        // lease take and shorten; cursor read and write; by_pool + by_idle; the page's
        // member items.
        ("dynamodb.UpdateItem", 2),
        ("dynamodb.GetItem", 1),
        ("dynamodb.PutItem", 1),
        ("dynamodb.Query", 2),
        ("dynamodb.BatchGetItem", 1),
        // the partition's members, the backstop page, the idle members' list.
        ("ecs.DescribeTasks", 2),
        ("ecs.ListTasks", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(tallies[0], expected);
    assert_eq!(m.guard.rejected(), vec![]);
}

/// One `ListTasks` page a refill still walks the whole listing: a pool task without its
/// item, started among 250 claimed members, is stopped as an orphan within ⌈252 / 100⌉
/// refills, and no claimed member is ever stopped.
#[tokio::test]
async fn the_backstop_finds_an_orphan_among_claimed_members_one_page_a_refill() {
    let m = pool_moto().await;
    let d = deployment();
    let ddb = DdbCalls::default();
    let c = controller_with(&m, &d, 1, 0, compute_with_ddb(&m, ddb.clone()).await).await;
    c.refill_pool().await.unwrap();
    let claimed = add_claimed(&m, &d, 250).await;
    let orphan = m.run_bare_member(&d).await;
    m.clock.advance(121);
    let mut refills = 0;
    while m.task(&orphan).await.desired_status() == Some("RUNNING") {
        assert!(refills < 3, "the orphan is on one of the 3 pages");
        m.clock.advance(REFILL_LEASE_SECS + 1);
        m.guard.clear();
        c.refill_pool().await.unwrap();
        assert_eq!(m.guard.calls_of("ListTasks").len(), 1, "one page a refill");
        refills += 1;
    }
    assert_eq!(m.task(&orphan).await.stopped_reason(), Some(ORPHAN_REASON));
    // Walk the listing twice more: nothing else is stopped.
    for _ in 0..6 {
        m.clock.advance(REFILL_LEASE_SECS + 1);
        let r = c.refill_pool().await.unwrap();
        assert_eq!((r.reconciled, r.started), (0, 0), "{r:?}");
    }
    let live = live_pool_tasks(&m, &d).await;
    assert_eq!(live.len(), 251, "the claimed members and the idle one");
    assert!(claimed.iter().all(|a| live.contains(a)));
    assert_eq!(m.guard.rejected(), vec![]);
    m.stop_all(&d).await;
}

/// A worker killed between a member's `RunTask` and its record leaves the launch item
/// written before the `RunTask`: the next reconcile sends the same `RunTask` again (same
/// `clientToken`, same request), ECS answers with the same task, and it is recorded idle
/// with the launch's `created_at`. No second task, no orphan.
#[tokio::test]
async fn a_member_whose_record_was_lost_is_recorded_by_replaying_its_run_task() {
    let m = pool_moto().await;
    let d = deployment();
    let t = m.clock.now();
    let dying = compute_with_ddb(&m, NoTransactions).await;
    let err = dying
        .start_pool_member(&d, NO_DEADLINE)
        .await
        .expect_err("killed before the record");
    assert!(err.message.contains("TransactWriteItems"), "{err}");
    let live = live_pool_tasks(&m, &d).await;
    assert_eq!(live.len(), 1);
    let arn = live[0].clone();
    assert!(m.item(&arn).await.is_none(), "not recorded");
    let runs = m.guard.calls_of("RunTask");
    let token = runs[0]["clientToken"].as_str().unwrap().to_owned();
    let launch_pk = format!("launch#{}#{token}", d.as_str());
    let launch = |m: &PoolMoto| {
        let (ddb, table, pk) = (m.ddb.clone(), m.table.clone(), launch_pk.clone());
        async move {
            ddb.get_item()
                .table_name(table)
                .key("pk", AttributeValue::S(pk))
                .consistent_read(true)
                .send()
                .await
                .unwrap()
                .item()
                .cloned()
        }
    };
    let item = launch(&m)
        .await
        .expect("the launch item, written before RunTask");
    assert_eq!(item["state"], AttributeValue::S("launching".into()));
    assert_eq!(item["client_token"], AttributeValue::S(token.clone()));
    assert!(
        m.compute.list_pool(&d).await.unwrap().is_empty(),
        "not a member yet"
    );

    m.clock.advance(30);
    m.guard.clear();
    assert_eq!(m.compute.reconcile_pool(&d, NO_DEADLINE).await.unwrap(), 1);
    let replays = m.guard.calls_of("RunTask");
    assert_eq!(replays.len(), 1);
    assert_eq!(replays[0], runs[0], "the same RunTask, clientToken and all");
    assert_eq!(
        live_pool_tasks(&m, &d).await,
        vec![arn.clone()],
        "no second task"
    );
    let member = m.item(&arn).await.expect("recorded");
    assert_eq!(member["state"], AttributeValue::S("idle".into()));
    assert_eq!(member["created_at"], AttributeValue::N(t.to_string()));
    assert_eq!(member["client_token"], AttributeValue::S(token));
    assert_eq!(
        member["expires_at"],
        AttributeValue::N((t + MAX_AGE + 86_400).to_string())
    );
    assert!(launch(&m).await.is_none(), "the launch item is gone");
    let pool = m.compute.list_pool(&d).await.unwrap();
    assert_eq!(pool.len(), 1);
    assert_eq!(pool[0].instance_id.as_str(), arn);
    assert_eq!(pool[0].created_at, t);
    // Nothing left to repair.
    assert_eq!(m.compute.reconcile_pool(&d, NO_DEADLINE).await.unwrap(), 0);
    assert!(now() >= t);
    assert_eq!(m.guard.rejected(), vec![]);
    m.stop_all(&d).await;
}

/// The claim's transaction is conditioned on the environment's lock (docs/WARM_POOL.md
/// rule 2): with `EcsCompute::with_claim_fence`, a claim whose fence is not the lock's
/// current owner — another worker took the lock after this one's expired — writes nothing
/// (the member stays idle, no token item, no tag) and is an error; the holder's own claim
/// goes through, and so does an unfenced claim (the trait's `claim_pool_member`).
#[tokio::test]
async fn the_claim_is_fenced_by_the_environment_s_lock() {
    use sandbox_controller::ports::{Fence, Registry};
    let m = pool_moto().await;
    let d = deployment();
    let registry_table = format!("pool-fence-{}", unique());
    sandbox_aws::create_table(&m.ddb, &registry_table)
        .await
        .expect("registry create_table");
    let registry = sandbox_aws::DynamoRegistry::new(m.ddb.clone(), &registry_table);
    let fenced = m.compute.clone().with_claim_fence(&registry_table);
    let member = m.compute.start_pool_member(&d, NO_DEADLINE).await.unwrap();
    let s = crate::pool::spec(&format!("env_{}", unique()));
    let key = s.environment_id.effect_key();
    let t = m.clock.now();
    // Worker A held the lock until t + 10; it expired and worker B holds it now.
    registry
        .lock(&key, "worker-a", t + 10, t)
        .await
        .unwrap()
        .expect("A locks");
    registry
        .lock(&key, "worker-b", t + 100, t + 11)
        .await
        .unwrap()
        .expect("B locks after A's lease");
    m.clock.advance(12);
    let stale = Fence {
        key: key.clone(),
        owner: "worker-a".to_owned(),
    };
    m.guard.clear();
    let err = fenced
        .claim_pool_member_fenced(&s, &d, 0, NO_DEADLINE, &stale)
        .await
        .expect_err("A's lock is gone");
    assert!(err.message.contains("no longer this worker's"), "{err}");
    let item = m.item(member.instance_id.as_str()).await.unwrap();
    assert_eq!(
        item["state"],
        AttributeValue::S("idle".into()),
        "nothing claimed"
    );
    assert_eq!(m.guard.calls_of("TagResource").len(), 0, "nothing tagged");
    let token_item = m
        .ddb
        .get_item()
        .table_name(&m.table)
        .key(
            "pk",
            AttributeValue::S(format!("token#{}#{}", d.as_str(), s.idempotency_token)),
        )
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    assert!(token_item.item().is_none(), "no token item");
    // B, the holder, claims it.
    let holder = Fence {
        key,
        owner: "worker-b".to_owned(),
    };
    let got = crate::pool::claimed(
        fenced
            .claim_pool_member_fenced(&s, &d, 0, NO_DEADLINE, &holder)
            .await
            .unwrap(),
    )
    .expect("claimed under the lock");
    assert_eq!(got.instance_id, member.instance_id);
    let item = m.item(member.instance_id.as_str()).await.unwrap();
    assert_eq!(item["state"], AttributeValue::S("assigned".into()));
    // Past B's lease, B's own fence fails too.
    let member2 = m.compute.start_pool_member(&d, NO_DEADLINE).await.unwrap();
    m.clock.advance(100);
    let s2 = crate::pool::spec(&s.environment_id.as_str().replace("env_", "env2_"));
    let late = Fence {
        key: s2.environment_id.effect_key(),
        owner: "worker-b".to_owned(),
    };
    assert!(
        fenced
            .claim_pool_member_fenced(&s2, &d, 0, NO_DEADLINE, &late)
            .await
            .is_err(),
        "no lock at all on that environment: nothing claimed"
    );
    assert_eq!(
        m.item(member2.instance_id.as_str()).await.unwrap()["state"],
        AttributeValue::S("idle".into())
    );
    assert_eq!(m.guard.rejected(), vec![]);
    m.stop_all(&d).await;
}
