//! The warm pool on ECS + DynamoDB (docs/WARM_POOL.md; `EcsCompute::with_pool`)
//! against moto: the pool contract, the crash paths (a member whose item was never
//! written, a claim whose tag never happened), concurrent claims, recycle after a claim,
//! an idle item whose task is gone, the refill lease, `Controller::refill_pool`, and the
//! exact ECS request shapes where moto is lenient (every ECS client behind
//! `sandbox_aws::strict_ecs::StrictEcs`).
//!
//! Time: the pool's clock is a [`TestClock`] (`EcsCompute::with_pool_clock`), so "older
//! than 120 s" and "past its maximum age" are reached by moving the clock, never by
//! sleeping; ECS's own `createdAt` stays the real time, which the clock starts at.

use crate::support::{
    CONTAINER, default_network, ecs_fixture, endpoint, now, pin_ecs_tasks, sdk, strict_ecs, unique,
};
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_ecs::config::interceptors::BeforeSerializationInterceptorContextRef;
use aws_sdk_ecs::config::{ConfigBag, Intercept};
use aws_sdk_ecs::error::BoxError;
use aws_sdk_ecs::operation::tag_resource::TagResourceInput;
use aws_sdk_ecs::types::{
    AssignPublicIp, AwsVpcConfiguration, LaunchType, NetworkConfiguration, Tag, Task, TaskField,
};
use sandbox_agents_api::{AgentsClient, ClientConfig};
use sandbox_aws::ecs_pool::{ORPHAN_REASON, POOL_MEMBER, TAG_POOL, TAG_POOL_ROLE};
use sandbox_aws::strict_ecs::StrictEcs;
use sandbox_aws::{DynamoRegistry, EcsCompute, EcsConfig, PoolConfig, pool_started_by};
use sandbox_controller::config::PoolSettings;
use sandbox_controller::contract::compute_pool_contract;
use sandbox_controller::pool::{RECYCLE_REASON, REFILL_LEASE_SECS, REPLAY_ONLY};
use sandbox_controller::ports::{Clock, Compute, NO_DEADLINE, Started};
use sandbox_controller::{Controller, ControllerConfig};
use sandbox_core::compute::ComputeInstance;
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation, SessionId, idempotency_token};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) const ROLE: &str = "AROATESTPOOLROLE01";
pub(crate) const MAX_AGE: u64 = 600;

/// A settable clock, Unix seconds.
#[derive(Debug)]
pub(crate) struct TestClock(AtomicU64);

impl TestClock {
    fn at(t: u64) -> Arc<Self> {
        Arc::new(Self(AtomicU64::new(t)))
    }
    pub(crate) fn advance(&self, secs: u64) {
        self.0.fetch_add(secs, Ordering::SeqCst);
    }
}

impl Clock for TestClock {
    fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// An `EcsCompute` with the pool on a fresh moto cluster and pool table.
pub(crate) struct PoolMoto {
    pub(crate) compute: EcsCompute,
    /// The adapter's ECS interceptor.
    pub(crate) guard: StrictEcs,
    /// The test's own ECS client (recorded apart).
    pub(crate) ecs: aws_sdk_ecs::Client,
    pub(crate) ddb: aws_sdk_dynamodb::Client,
    pub(crate) table: String,
    pub(crate) config: EcsConfig,
    pub(crate) pool: PoolConfig,
    pub(crate) clock: Arc<TestClock>,
}

pub(crate) async fn pool_moto() -> PoolMoto {
    pin_ecs_tasks().await;
    let (ecs, _) = strict_ecs().await;
    let cluster = format!("pool-{}", unique());
    let family = format!("executor-{}", unique());
    ecs_fixture(&ecs, &cluster, &family).await;
    let (subnet, security_group) = default_network().await;
    let config = EcsConfig {
        cluster,
        task_definition: family,
        container_name: CONTAINER.to_owned(),
        subnets: vec![subnet],
        security_groups: vec![security_group],
        assign_public_ip: true,
    };
    let sdk = sdk().await;
    let ddb = aws_sdk_dynamodb::Client::new(&sdk);
    let table = format!("pool-{}", unique());
    sandbox_aws::pool_table::create_table(&ddb, &table)
        .await
        .expect("pool create_table");
    let pool = PoolConfig {
        table_name: table.clone(),
        task_role_id: ROLE.to_owned(),
        max_age_secs: MAX_AGE,
        history_retention_secs: 30 * 86_400,
    };
    let clock = TestClock::at(now());
    let guard = StrictEcs::new();
    let compute = EcsCompute::new(guard.client(&sdk), config.clone())
        .with_pool(ddb.clone(), pool.clone())
        .with_pool_clock(clock.clone());
    PoolMoto {
        compute,
        guard,
        ecs,
        ddb,
        table,
        config,
        pool,
        clock,
    }
}

impl PoolMoto {
    /// Another `EcsCompute` on the same cluster, table and clock whose ECS client runs
    /// `interceptor` too.
    async fn compute_with(&self, interceptor: impl Intercept + 'static) -> EcsCompute {
        let sdk = sdk().await;
        let conf = aws_sdk_ecs::config::Builder::from(&sdk)
            .interceptor(StrictEcs::new())
            .interceptor(interceptor)
            .build();
        EcsCompute::new(aws_sdk_ecs::Client::from_conf(conf), self.config.clone())
            .with_pool(self.ddb.clone(), self.pool.clone())
            .with_pool_clock(self.clock.clone())
    }

    /// The task as ECS describes it (with tags).
    pub(crate) async fn task(&self, arn: &str) -> Task {
        let out = self
            .ecs
            .describe_tasks()
            .cluster(&self.config.cluster)
            .tasks(arn)
            .include(TaskField::Tags)
            .send()
            .await
            .unwrap();
        out.tasks()
            .iter()
            .find(|t| t.task_arn() == Some(arn))
            .cloned()
            .unwrap_or_else(|| panic!("{arn} not described"))
    }

    /// The member item of `arn`, raw (`None`: no item).
    pub(crate) async fn item(
        &self,
        arn: &str,
    ) -> Option<std::collections::HashMap<String, AttributeValue>> {
        let id = arn.rsplit('/').next().unwrap();
        self.ddb
            .get_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(format!("{ROLE}:{id}")))
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .item()
            .cloned()
    }

    /// Starts a pool task exactly as the adapter does, but writes no item: a worker killed
    /// between `RunTask` and `PutItem`.
    pub(crate) async fn run_bare_member(&self, d: &DeploymentId) -> String {
        let vpc = AwsVpcConfiguration::builder()
            .set_subnets(Some(self.config.subnets.clone()))
            .set_security_groups(Some(self.config.security_groups.clone()))
            .assign_public_ip(AssignPublicIp::Enabled)
            .build()
            .unwrap();
        let out = self
            .ecs
            .run_task()
            .cluster(&self.config.cluster)
            .task_definition(&self.config.task_definition)
            .launch_type(LaunchType::Fargate)
            .count(1)
            .started_by(pool_started_by(d))
            .client_token(format!("bare-{}", unique()))
            .network_configuration(
                NetworkConfiguration::builder()
                    .awsvpc_configuration(vpc)
                    .build(),
            )
            .tags(
                Tag::builder()
                    .key("sandbox:deployment")
                    .value(d.as_str())
                    .build(),
            )
            .tags(Tag::builder().key(TAG_POOL).value(POOL_MEMBER).build())
            .tags(Tag::builder().key(TAG_POOL_ROLE).value(ROLE).build())
            .send()
            .await
            .unwrap();
        out.tasks()[0].task_arn().unwrap().to_owned()
    }

    /// Stops every live pool task of `d` (the test's cleanup).
    pub(crate) async fn stop_all(&self, d: &DeploymentId) {
        let arns = self
            .ecs
            .list_tasks()
            .cluster(&self.config.cluster)
            .started_by(pool_started_by(d))
            .send()
            .await
            .unwrap()
            .task_arns()
            .to_vec();
        for arn in arns {
            self.ecs
                .stop_task()
                .cluster(&self.config.cluster)
                .task(arn)
                .reason("test cleanup")
                .send()
                .await
                .unwrap();
        }
    }
}

pub(crate) fn deployment() -> DeploymentId {
    DeploymentId::new(format!("p-{}", unique())).unwrap()
}

pub(crate) fn spec(env: &str) -> StartSpec {
    let environment_id = EnvironmentId::new(env);
    StartSpec {
        session_id: SessionId::new(format!("sess_{env}")),
        remote_url: format!("wss://agents.invalid/v1/environments/{env}/connect?x=1"),
        workspace_directory: "/workspace".to_owned(),
        generation: Generation(3),
        idempotency_token: idempotency_token(&environment_id, Generation(3)),
        environment_id,
        previous: None,
        restore: None,
    }
}

fn tag_of<'a>(task: &'a Task, key: &str) -> Option<&'a str> {
    task.tags()
        .iter()
        .find(|t| t.key() == Some(key))
        .and_then(|t| t.value())
}

pub(crate) fn claimed(started: Option<Started>) -> Option<ComputeInstance> {
    match started {
        None => None,
        Some(Started::Instance(i)) => Some(i),
        Some(Started::Failed { reason }) => panic!("claim failed: {reason}"),
    }
}

fn body_keys(body: &Value) -> BTreeSet<String> {
    body.as_object().unwrap().keys().cloned().collect()
}

#[tokio::test]
async fn ecs_pool_passes_the_pool_contract() {
    let m = pool_moto().await;
    let d = deployment();
    compute_pool_contract(&m.compute, &d).await;
    assert_eq!(m.guard.rejected(), vec![], "no request ECS would refuse");
    m.stop_all(&d).await;
}

#[tokio::test]
async fn without_the_pool_the_pool_methods_keep_the_trait_defaults() {
    pin_ecs_tasks().await;
    let (ecs, _) = strict_ecs().await;
    let cluster = format!("nopool-{}", unique());
    let family = format!("executor-{}", unique());
    ecs_fixture(&ecs, &cluster, &family).await;
    let (subnet, security_group) = default_network().await;
    let guard = StrictEcs::new();
    let compute = EcsCompute::new(
        guard.client(&sdk().await),
        EcsConfig {
            cluster,
            task_definition: family,
            container_name: CONTAINER.to_owned(),
            subnets: vec![subnet],
            security_groups: vec![security_group],
            assign_public_ip: true,
        },
    );
    let d = deployment();
    let err = compute
        .start_pool_member(&d, NO_DEADLINE)
        .await
        .unwrap_err();
    assert!(!err.retryable, "{err}");
    assert!(compute.list_pool(&d).await.unwrap().is_empty());
    assert_eq!(
        claimed(
            compute
                .claim_pool_member(&spec("env_nopool"), &d, 0, NO_DEADLINE)
                .await
                .unwrap()
        ),
        None
    );
    assert_eq!(compute.reconcile_pool(&d, NO_DEADLINE).await.unwrap(), 0);
    assert!(
        compute
            .take_refill_lease(&d, "w", now(), 120)
            .await
            .is_err()
    );
    assert_eq!(guard.requests(), vec![], "no call without the pool");
}

#[tokio::test]
async fn a_member_and_its_claim_send_exactly_the_documented_ecs_requests() {
    let m = pool_moto().await;
    let d = deployment();
    let member = m.compute.start_pool_member(&d, NO_DEADLINE).await.unwrap();
    let runs = m.guard.calls_of("RunTask");
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    let token = run["clientToken"].as_str().unwrap();
    assert!(token.starts_with("pool-") && token.len() <= 64, "{token}");
    let mut expected = json!({
        "cluster": m.config.cluster,
        "taskDefinition": m.config.task_definition,
        "launchType": "FARGATE",
        "count": 1,
        "startedBy": pool_started_by(&d),
        "clientToken": token,
        "networkConfiguration": {"awsvpcConfiguration": {
            "subnets": m.config.subnets,
            "securityGroups": m.config.security_groups,
            "assignPublicIp": "ENABLED"
        }},
        "overrides": {"containerOverrides": [{
            "name": CONTAINER,
            "environment": [
                {"name": "POOL_TABLE_NAME", "value": m.table},
                {"name": "POOL_MAX_WAIT_SECS", "value": (MAX_AGE + 300).to_string()}
            ]
        }]},
        "tags": [
            {"key": "sandbox:deployment", "value": d.as_str()},
            {"key": "sandbox:pool", "value": "member"},
            {"key": "sandbox:pool-role", "value": ROLE}
        ],
        "propagateTags": "TASK_DEFINITION",
        "enableECSManagedTags": true
    });
    assert_eq!(run, &expected, "the member's RunTask, exactly");
    // A second later (the pool clock), so the first is the older of the two.
    m.clock.advance(1);
    let second = m.compute.start_pool_member(&d, NO_DEADLINE).await.unwrap();
    let runs = m.guard.calls_of("RunTask");
    assert_ne!(
        runs[1]["clientToken"], runs[0]["clientToken"],
        "a fresh clientToken per member"
    );
    expected["clientToken"] = runs[1]["clientToken"].clone();
    assert_eq!(runs[1], expected);
    // The item: idle, keyed by the task's own aws:userid.
    let item = m
        .item(member.instance_id.as_str())
        .await
        .expect("member item");
    assert_eq!(item["state"], AttributeValue::S("idle".into()));
    assert_eq!(
        item["idle_deployment"],
        AttributeValue::S(d.as_str().into())
    );
    assert_eq!(
        item["expires_at"],
        AttributeValue::N((member.created_at + MAX_AGE + 86_400).to_string())
    );

    // The claim: one DescribeTasks of the candidates, then TagResource with exactly the
    // assignment's three keys.
    m.guard.clear();
    let s = spec(&format!("env_{}", unique()));
    let got = claimed(
        m.compute
            .claim_pool_member(&s, &d, 0, NO_DEADLINE)
            .await
            .unwrap(),
    )
    .expect("claimed");
    assert_eq!(
        got.instance_id, member.instance_id,
        "the oldest member first"
    );
    let requests = m.guard.requests();
    let ops: Vec<&str> = requests.iter().map(|r| r.operation.as_str()).collect();
    assert_eq!(ops, vec!["DescribeTasks", "TagResource"]);
    assert_eq!(
        requests[1].body,
        json!({"resourceArn": member.instance_id.as_str(), "tags": [
            {"key": "sandbox:environment", "value": s.environment_id.as_str()},
            {"key": "sandbox:session", "value": s.session_id.as_str()},
            {"key": "sandbox:generation", "value": "3"}
        ]})
    );
    let item = m.item(member.instance_id.as_str()).await.unwrap();
    assert_eq!(item["state"], AttributeValue::S("assigned".into()));
    assert!(!item.contains_key("idle_deployment"), "out of by_idle");
    assert_eq!(
        item["claimed_environment"],
        AttributeValue::S(format!("{}#{}", d.as_str(), s.environment_id.as_str()))
    );
    assert_eq!(item["remote_url"], AttributeValue::S(s.remote_url.clone()));

    // find: the environment's startedBy alone, and one DescribeTasks for both sets.
    m.guard.clear();
    let found = m.compute.find(&d, &s.environment_id).await.unwrap();
    assert_eq!(
        found.iter().map(|i| &i.instance_id).collect::<Vec<_>>(),
        vec![&member.instance_id]
    );
    let requests = m.guard.requests();
    let ops: Vec<&str> = requests.iter().map(|r| r.operation.as_str()).collect();
    assert_eq!(ops, vec!["ListTasks", "DescribeTasks"]);
    assert_eq!(
        requests[1].body["tasks"],
        json!([member.instance_id.as_str()])
    );

    // The reconcile's one backstop ListTasks page: the pool's startedBy as the only
    // filter, at most 100 ARNs.
    m.guard.clear();
    assert_eq!(m.compute.reconcile_pool(&d, NO_DEADLINE).await.unwrap(), 0);
    let lists = m.guard.calls_of("ListTasks");
    assert_eq!(lists.len(), 1);
    assert_eq!(
        lists[0],
        json!({"cluster": m.config.cluster, "startedBy": pool_started_by(&d), "maxResults": 100})
    );
    assert_eq!(
        body_keys(&lists[0]),
        BTreeSet::from([
            "cluster".to_owned(),
            "maxResults".to_owned(),
            "startedBy".to_owned()
        ])
    );

    // The recycle: StopTask with reason pool_max_age.
    m.guard.clear();
    assert!(
        m.compute
            .recycle_pool_member(&second.instance_id, NO_DEADLINE)
            .await
            .unwrap()
    );
    assert_eq!(
        m.guard.calls_of("StopTask"),
        vec![
            json!({"cluster": m.config.cluster, "task": second.instance_id.as_str(), "reason": RECYCLE_REASON})
        ]
    );
    assert_eq!(m.guard.rejected(), vec![]);
    m.stop_all(&d).await;
}

#[tokio::test]
async fn a_member_whose_item_was_never_written_is_stopped_by_reconcile_once_older_than_120_s() {
    let m = pool_moto().await;
    let d = deployment();
    let kept = m.compute.start_pool_member(&d, NO_DEADLINE).await.unwrap();
    let orphan = m.run_bare_member(&d).await;
    assert!(m.item(&orphan).await.is_none());
    assert!(
        !m.compute
            .list_pool(&d)
            .await
            .unwrap()
            .iter()
            .any(|p| p.instance_id.as_str() == orphan),
        "no item, so not in the pool"
    );
    assert_eq!(
        m.compute.reconcile_pool(&d, NO_DEADLINE).await.unwrap(),
        0,
        "young: its PutItem may still come"
    );
    assert_eq!(m.task(&orphan).await.desired_status(), Some("RUNNING"));
    m.clock.advance(121);
    assert_eq!(m.compute.reconcile_pool(&d, NO_DEADLINE).await.unwrap(), 1);
    let task = m.task(&orphan).await;
    assert_eq!(task.last_status(), Some("STOPPED"));
    assert_eq!(task.stopped_reason(), Some(ORPHAN_REASON));
    let member = m.task(kept.instance_id.as_str()).await;
    assert_eq!(
        member.desired_status(),
        Some("RUNNING"),
        "a member with its item is left alone"
    );
    assert_eq!(m.compute.reconcile_pool(&d, NO_DEADLINE).await.unwrap(), 0);
    assert_eq!(m.guard.rejected(), vec![]);
    m.stop_all(&d).await;
}

/// Fails every `TagResource` before it is sent: a worker killed between the claim's
/// transaction and its tag.
#[derive(Debug)]
struct NoTagging;

impl Intercept for NoTagging {
    fn name(&self) -> &'static str {
        "NoTagging"
    }
    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if context.input().downcast_ref::<TagResourceInput>().is_some() {
            return Err("killed before TagResource".into());
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_claim_whose_tag_never_happened_is_found_described_listed_and_retagged_by_its_replay() {
    let m = pool_moto().await;
    let d = deployment();
    let member = m.compute.start_pool_member(&d, NO_DEADLINE).await.unwrap();
    let s = spec(&format!("env_{}", unique()));
    let dying = m.compute_with(NoTagging).await;
    let err = dying
        .claim_pool_member(&s, &d, 0, NO_DEADLINE)
        .await
        .expect_err("the tag failed: outcome unknown");
    assert!(err.message.contains("killed before TagResource"), "{err}");
    let task = m.task(member.instance_id.as_str()).await;
    assert_eq!(tag_of(&task, "sandbox:environment"), None, "never tagged");

    // find (Query by_environment), describe and list resolve it from its item.
    let found = m.compute.find(&d, &s.environment_id).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let i = &found[0];
    assert_eq!(i.instance_id, member.instance_id);
    assert_eq!(
        (&i.environment_id, i.session_id.as_ref(), i.generation),
        (&s.environment_id, Some(&s.session_id), s.generation)
    );
    assert!(i.status.is_active());
    let described = m
        .compute
        .describe(&member.instance_id)
        .await
        .unwrap()
        .expect("described");
    assert_eq!(&described, i);
    assert_eq!(
        m.compute
            .describe_many(std::slice::from_ref(&member.instance_id))
            .await
            .unwrap(),
        vec![i.clone()]
    );
    assert!(
        m.compute.list(&d).await.unwrap().contains(i),
        "the sweep sees it as its environment's compute"
    );
    assert!(
        m.compute.list_pool(&d).await.unwrap().is_empty(),
        "claimed: out of the pool"
    );

    // The next holder (lock recovered) replays by the token only: the same member,
    // tagged now.
    m.guard.clear();
    let replay = claimed(
        m.compute
            .claim_pool_member(&s, &d, REPLAY_ONLY, NO_DEADLINE)
            .await
            .unwrap(),
    )
    .expect("the token's claim");
    assert_eq!(replay.instance_id, member.instance_id);
    assert_eq!(m.guard.calls_of("TagResource").len(), 1, "re-tagged");
    let task = m.task(member.instance_id.as_str()).await;
    assert_eq!(
        tag_of(&task, "sandbox:environment"),
        Some(s.environment_id.as_str())
    );
    assert_eq!(
        tag_of(&task, "sandbox:session"),
        Some(s.session_id.as_str())
    );
    assert_eq!(tag_of(&task, "sandbox:generation"), Some("3"));
    // A replay of a tagged member does not tag again.
    m.guard.clear();
    claimed(
        m.compute
            .claim_pool_member(&s, &d, REPLAY_ONLY, NO_DEADLINE)
            .await
            .unwrap(),
    )
    .expect("replayed");
    assert_eq!(m.guard.calls_of("TagResource").len(), 0);
    assert_eq!(m.guard.rejected(), vec![]);
    m.stop_all(&d).await;
}

#[tokio::test]
async fn of_concurrent_claims_of_one_member_exactly_one_wins_and_a_recycle_then_leaves_it_running()
{
    let m = pool_moto().await;
    let d = deployment();
    let member = m.compute.start_pool_member(&d, NO_DEADLINE).await.unwrap();
    let specs: Vec<StartSpec> = (0..4)
        .map(|n| spec(&format!("env_{}_{n}", unique())))
        .collect();
    let handles: Vec<_> = specs
        .iter()
        .cloned()
        .map(|s| {
            let c = m.compute.clone();
            let d = d.clone();
            tokio::spawn(async move { c.claim_pool_member(&s, &d, 0, NO_DEADLINE).await })
        })
        .collect();
    let mut winners = Vec::new();
    for (n, h) in handles.into_iter().enumerate() {
        if let Some(i) = claimed(h.await.unwrap().unwrap()) {
            winners.push((n, i));
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    let (n, won) = &winners[0];
    assert_eq!(won.instance_id, member.instance_id);
    for (k, s) in specs.iter().enumerate() {
        let found = m.compute.find(&d, &s.environment_id).await.unwrap();
        assert_eq!(found.len(), usize::from(k == *n), "{k}: {found:?}");
    }
    assert!(
        !m.compute
            .recycle_pool_member(&member.instance_id, NO_DEADLINE)
            .await
            .unwrap(),
        "claimed: not recycled"
    );
    let task = m.task(member.instance_id.as_str()).await;
    assert_eq!(
        (task.last_status(), task.desired_status()),
        (Some("RUNNING"), Some("RUNNING"))
    );
    assert_eq!(
        m.compute.reconcile_pool(&d, NO_DEADLINE).await.unwrap(),
        0,
        "reconcile leaves a claimed member alone too"
    );
    m.stop_all(&d).await;
}

#[tokio::test]
async fn an_idle_item_whose_task_is_gone_is_deleted_by_reconcile() {
    let m = pool_moto().await;
    let d = deployment();
    let gone = m.compute.start_pool_member(&d, NO_DEADLINE).await.unwrap();
    let live = m.compute.start_pool_member(&d, NO_DEADLINE).await.unwrap();
    // Its forwarder gave up waiting: the task stopped by itself.
    m.ecs
        .stop_task()
        .cluster(&m.config.cluster)
        .task(gone.instance_id.as_str())
        .reason("Essential container in task exited")
        .send()
        .await
        .unwrap();
    // An item whose task ECS does not know at all (long gone), and a young one (maybe
    // not visible yet).
    let fake = |id: &str| {
        format!(
            "arn:aws:ecs:us-east-1:123456789012:task/{}/{id}",
            m.config.cluster
        )
    };
    let put = |arn: String, created_at: u64| {
        let id = arn.rsplit('/').next().unwrap().to_owned();
        m.ddb
            .put_item()
            .table_name(&m.table)
            .item("pk", AttributeValue::S(format!("{ROLE}:{id}")))
            .item("deployment", AttributeValue::S(d.as_str().into()))
            .item("task_arn", AttributeValue::S(arn))
            .item("created_at", AttributeValue::N(created_at.to_string()))
            .item("state", AttributeValue::S("idle".into()))
            .item("idle_deployment", AttributeValue::S(d.as_str().into()))
            .item("pool_deployment", AttributeValue::S(d.as_str().into()))
            .item(
                "expires_at",
                AttributeValue::N((created_at + MAX_AGE + 86_400).to_string()),
            )
            .send()
    };
    let t = m.clock.now();
    let old_unknown = fake(&format!("f0{}", unique()));
    let young_unknown = fake(&format!("f1{}", unique()));
    put(old_unknown.clone(), t - 300).await.unwrap();
    put(young_unknown.clone(), t + 1).await.unwrap();

    assert_eq!(
        m.compute.reconcile_pool(&d, NO_DEADLINE).await.unwrap(),
        2,
        "the stopped task's item and the unknown old one"
    );
    assert!(m.item(gone.instance_id.as_str()).await.is_none());
    assert!(m.item(&old_unknown).await.is_none());
    assert!(
        m.item(&young_unknown).await.is_some(),
        "uncertain: left for a later refill"
    );
    assert!(m.item(live.instance_id.as_str()).await.is_some());
    let pool: Vec<String> = m
        .compute
        .list_pool(&d)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.instance_id.as_str().to_owned())
        .collect();
    assert_eq!(
        pool,
        vec![live.instance_id.as_str().to_owned(), young_unknown.clone()],
        "the live member, and the young one ECS may not show yet"
    );
    m.clock.advance(122);
    assert_eq!(m.compute.reconcile_pool(&d, NO_DEADLINE).await.unwrap(), 1);
    assert!(m.item(&young_unknown).await.is_none());
    assert_eq!(m.guard.rejected(), vec![]);
    m.stop_all(&d).await;
}

#[tokio::test]
async fn the_refill_lease_has_one_holder_until_it_expires() {
    let m = pool_moto().await;
    let d = deployment();
    let t = m.clock.now();
    let (a, b) = tokio::join!(
        m.compute.take_refill_lease(&d, "worker-a", t, 120),
        m.compute.take_refill_lease(&d, "worker-b", t, 120),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a ^ b, "exactly one of two takers wins: {a} {b}");
    let (winner, loser) = if a {
        ("worker-a", "worker-b")
    } else {
        ("worker-b", "worker-a")
    };
    assert!(
        !m.compute
            .take_refill_lease(&d, loser, t + 120, 120)
            .await
            .unwrap(),
        "held through lease_until"
    );
    assert!(
        m.compute
            .take_refill_lease(&d, winner, t + 60, 120)
            .await
            .unwrap(),
        "its holder takes it again (a retried request)"
    );
    assert!(
        !m.compute
            .take_refill_lease(&d, loser, t + 180, 120)
            .await
            .unwrap(),
        "extended by the holder's take"
    );
    assert!(
        m.compute
            .take_refill_lease(&d, loser, t + 181, 120)
            .await
            .unwrap(),
        "expired: taken by another"
    );
    assert!(
        m.compute
            .take_refill_lease(&deployment(), winner, t, 120)
            .await
            .unwrap(),
        "a lease per deployment"
    );
}

async fn controller(
    m: &PoolMoto,
    d: &DeploymentId,
    size: u32,
    cap: u32,
) -> Controller<sandbox_aws::SqsQueue, DynamoRegistry, EcsCompute, AgentsClient> {
    controller_with(m, d, size, cap, m.compute.clone()).await
}

/// [`controller`] over `compute` (e.g. one whose clients count their calls).
pub(crate) async fn controller_with(
    m: &PoolMoto,
    d: &DeploymentId,
    size: u32,
    cap: u32,
    compute: EcsCompute,
) -> Controller<sandbox_aws::SqsQueue, DynamoRegistry, EcsCompute, AgentsClient> {
    let sdk = sdk().await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queues = sandbox_aws::bootstrap::create_queues(&sqs, &format!("pool-{}", unique()))
        .await
        .unwrap();
    let ddb = aws_sdk_dynamodb::Client::new(&sdk);
    let table = format!("pool-registry-{}", unique());
    sandbox_aws::create_table(&ddb, &table)
        .await
        .expect("registry create_table");
    let mut api = ClientConfig::new("sk-unused".to_owned());
    api.base_url = format!("{}/unused", endpoint());
    let mut config = ControllerConfig::new(d.clone());
    config.pool = PoolSettings {
        size,
        max_age_secs: MAX_AGE,
    };
    config.policy.max_executors = cap;
    Controller::new(
        queues.events(&sqs),
        queues.timers(&sqs),
        DynamoRegistry::new(ddb, &table),
        compute,
        AgentsClient::new(api).unwrap(),
        m.clock.clone() as Arc<dyn Clock>,
        config,
    )
}

#[tokio::test]
async fn refill_pool_fills_to_size_recycles_past_the_maximum_age_and_respects_the_cap() {
    let m = pool_moto().await;
    let d = deployment();
    let c = controller(&m, &d, 2, 0).await;
    let r = c.refill_pool().await.unwrap();
    assert_eq!((r.started, r.recycled, r.idle), (2, 0, 2), "{r:?}");
    let first: Vec<_> = m.compute.list_pool(&d).await.unwrap();
    assert_eq!(first.len(), 2);
    // Refills are at least the lease's tail apart (a refill within it is skipped).
    let r = c.refill_pool().await.unwrap();
    assert!(r.skipped, "inside the previous refill's lease: {r:?}");
    m.clock.advance(REFILL_LEASE_SECS + 1);
    let r = c.refill_pool().await.unwrap();
    assert_eq!((r.started, r.recycled, r.idle), (0, 0, 2), "full: {r:?}");

    // Past the maximum age: both recycled (stopped, pool_max_age) and replaced.
    m.clock.advance(MAX_AGE);
    let r = c.refill_pool().await.unwrap();
    assert_eq!((r.started, r.recycled, r.idle), (2, 2, 2), "{r:?}");
    for old in &first {
        let task = m.task(old.instance_id.as_str()).await;
        assert_eq!(task.desired_status(), Some("STOPPED"));
        assert_eq!(task.stopped_reason(), Some(RECYCLE_REASON));
        assert_eq!(
            m.item(old.instance_id.as_str()).await.unwrap()["state"],
            AttributeValue::S("recycled".into())
        );
    }
    let now_pool = m.compute.list_pool(&d).await.unwrap();
    assert_eq!(now_pool.len(), 2);
    assert!(now_pool.iter().all(|p| !first.contains(p)));
    m.stop_all(&d).await;

    // The executor cap: idle members count toward it.
    let capped = deployment();
    let c = controller(&m, &capped, 2, 1).await;
    let r = c.refill_pool().await.unwrap();
    assert_eq!(
        (r.started, r.idle),
        (1, 1),
        "a cap of 1 leaves room for one: {r:?}"
    );
    m.clock.advance(REFILL_LEASE_SECS + 1);
    let r = c.refill_pool().await.unwrap();
    assert_eq!((r.started, r.idle), (0, 1), "{r:?}");
    assert_eq!(m.compute.list_pool(&capped).await.unwrap().len(), 1);
    assert_eq!(m.guard.rejected(), vec![]);
    m.stop_all(&capped).await;
}

#[tokio::test]
async fn the_guard_refuses_tag_resource_and_list_tasks_shapes_ecs_forbids() {
    let (ecs, guard) = strict_ecs().await;
    let arn = "arn:aws:ecs:us-east-1:123456789012:task/c/0123";
    let reserved = ecs
        .tag_resource()
        .resource_arn(arn)
        .tags(Tag::builder().key("aws:x").value("v").build())
        .send()
        .await;
    assert!(reserved.is_err());
    let long_value = ecs
        .tag_resource()
        .resource_arn(arn)
        .tags(
            Tag::builder()
                .key("sandbox:environment")
                .value("v".repeat(257))
                .build(),
        )
        .send()
        .await;
    assert!(long_value.is_err());
    let none = ecs.tag_resource().resource_arn(arn).send().await;
    assert!(none.is_err());
    let long_started_by = ecs
        .list_tasks()
        .cluster("c")
        .started_by("x".repeat(37))
        .send()
        .await;
    assert!(long_started_by.is_err());
    let rejected: Vec<&str> = guard
        .rejected()
        .iter()
        .map(|r| r.operation)
        .collect::<Vec<_>>();
    assert_eq!(
        rejected,
        vec!["TagResource", "TagResource", "TagResource", "ListTasks"]
    );
    assert_eq!(guard.requests(), vec![], "nothing was sent");
}

#[tokio::test]
async fn with_ebs_workspaces_a_member_is_refused_and_claims_miss() {
    let m = pool_moto().await;
    let d = deployment();
    let idle = m.compute.start_pool_member(&d, NO_DEADLINE).await.unwrap();
    let with_workspaces = m.compute.clone().with_workspaces(
        sandbox_aws::ebs_workspaces::ec2_client(&sdk().await),
        sandbox_aws::EbsConfig::new("arn:aws:iam::123456789012:role/ecs-infra", 20),
    );
    let err = with_workspaces
        .start_pool_member(&d, NO_DEADLINE)
        .await
        .expect_err("refused");
    assert!(!err.retryable, "{err}");
    assert!(err.message.contains("workspace"), "{err}");
    assert_eq!(
        claimed(
            with_workspaces
                .claim_pool_member(&spec(&format!("env_{}", unique())), &d, 0, NO_DEADLINE)
                .await
                .unwrap()
        ),
        None,
        "an idle member is there, but it cannot carry the workspace volume"
    );
    assert_eq!(
        m.compute.list_pool(&d).await.unwrap().len(),
        1,
        "nothing started, nothing claimed"
    );
    assert_eq!(
        m.item(idle.instance_id.as_str()).await.unwrap()["state"],
        AttributeValue::S("idle".into())
    );
    m.stop_all(&d).await;
}

/// A claimed member is its environment's until the environment stops it: its item keeps
/// no expiry while it runs (with lifetime caps off a session may outlive any retention),
/// and the refill's reconcile never stops a task that carries an environment — nor one
/// whose claimed item names it without the tag (a worker died before `TagResource`).
#[tokio::test]
async fn a_claimed_member_in_use_is_never_stopped_by_the_refill() {
    let m = pool_moto().await;
    let d = deployment();
    let tagged = m.compute.start_pool_member(&d, NO_DEADLINE).await.unwrap();
    m.clock.advance(1);
    let untagged = m.compute.start_pool_member(&d, NO_DEADLINE).await.unwrap();
    let s = spec(&format!("env_{}", unique()));
    let got = claimed(
        m.compute
            .claim_pool_member(&s, &d, 0, NO_DEADLINE)
            .await
            .unwrap(),
    )
    .expect("claimed");
    assert_eq!(got.instance_id, tagged.instance_id);
    let s2 = spec(&format!("env_{}", unique()));
    m.compute_with(NoTagging)
        .await
        .claim_pool_member(&s2, &d, 0, NO_DEADLINE)
        .await
        .expect_err("the tag failed: outcome unknown");
    let item = m.item(tagged.instance_id.as_str()).await.expect("item");
    assert_eq!(item["state"], AttributeValue::S("assigned".into()));
    assert!(
        !item.contains_key("expires_at"),
        "a claimed item never expires while its task may run: {item:?}"
    );
    // Past the history retention (30 days) and any orphan age: the reconcile leaves both.
    m.clock.advance(31 * 86_400);
    assert_eq!(m.compute.reconcile_pool(&d, NO_DEADLINE).await.unwrap(), 0);
    for member in [&tagged, &untagged] {
        let task = m.task(member.instance_id.as_str()).await;
        assert_eq!(task.desired_status(), Some("RUNNING"), "{member:?}");
    }
    // The environment still finds its executor through the item.
    let found = m.compute.find(&d, &s2.environment_id).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].instance_id, untagged.instance_id);
    // Its stop by the environment gives the item its expiry: the history retention.
    m.compute
        .stop(&tagged.instance_id, "released", NO_DEADLINE)
        .await
        .unwrap();
    let item = m.item(tagged.instance_id.as_str()).await.expect("item");
    assert_eq!(
        item["expires_at"],
        AttributeValue::N((m.clock.now() + 30 * 86_400).to_string())
    );
    assert_eq!(m.guard.rejected(), vec![]);
    m.stop_all(&d).await;
}

/// After a deploy (a new task definition revision), claims hand out only members of the
/// configured revision, even when an older member of the previous revision is idle, and the
/// reconcile recycles the old one (`pool_stale_revision`) before anything claims it.
#[tokio::test]
async fn claims_hand_out_only_the_current_task_definition() {
    let m = pool_moto().await;
    let d = deployment();
    let first = sandbox_aws::bootstrap::register_task_definition(
        &m.ecs,
        &m.config.task_definition,
        CONTAINER,
    )
    .await
    .expect("a revision");
    let sdk = sdk().await;
    let with_revision = |arn: &str| {
        let mut config = m.config.clone();
        config.task_definition = arn.to_owned();
        EcsCompute::new(m.guard.client(&sdk), config)
            .with_pool(m.ddb.clone(), m.pool.clone())
            .with_pool_clock(m.clock.clone())
    };
    let old = with_revision(&first)
        .start_pool_member(&d, NO_DEADLINE)
        .await
        .unwrap();
    m.clock.advance(1);
    let second = sandbox_aws::bootstrap::register_task_definition(
        &m.ecs,
        &m.config.task_definition,
        CONTAINER,
    )
    .await
    .expect("the next revision");
    assert_ne!(first, second);
    let deployed = with_revision(&second);
    let current = deployed.start_pool_member(&d, NO_DEADLINE).await.unwrap();
    assert_eq!(
        m.task(current.instance_id.as_str())
            .await
            .task_definition_arn(),
        Some(second.as_str())
    );
    // The old member is older (first in by_idle) yet never handed out.
    let s = spec(&format!("env_{}", unique()));
    let got = claimed(
        deployed
            .claim_pool_member(&s, &d, 0, NO_DEADLINE)
            .await
            .unwrap(),
    )
    .expect("the current member");
    assert_eq!(got.instance_id, current.instance_id);
    let s2 = spec(&format!("env_{}", unique()));
    assert!(
        claimed(
            deployed
                .claim_pool_member(&s2, &d, 0, NO_DEADLINE)
                .await
                .unwrap()
        )
        .is_none(),
        "the only idle member left runs the previous revision: a miss, so a cold start"
    );
    // The reconcile recycles it.
    assert_eq!(deployed.reconcile_pool(&d, NO_DEADLINE).await.unwrap(), 1);
    let task = m.task(old.instance_id.as_str()).await;
    assert_eq!(task.desired_status(), Some("STOPPED"));
    assert_eq!(
        task.stopped_reason(),
        Some(sandbox_aws::ecs_pool::STALE_REVISION_REASON)
    );
    let item = m.item(old.instance_id.as_str()).await.expect("item");
    assert_eq!(item["state"], AttributeValue::S("recycled".into()));
    assert_eq!(m.guard.rejected(), vec![]);
    m.stop_all(&d).await;
}

#[test]
fn the_current_revision_is_the_configured_one() {
    use sandbox_aws::ecs_pool::is_current_revision;
    let arn = "arn:aws:ecs:us-east-1:123456789012:task-definition/executor:7";
    assert!(is_current_revision(arn, Some(arn)));
    assert!(!is_current_revision(
        "arn:aws:ecs:us-east-1:123456789012:task-definition/executor:8",
        Some(arn)
    ));
    assert!(is_current_revision("executor:7", Some(arn)));
    assert!(!is_current_revision("executor:6", Some(arn)));
    assert!(is_current_revision("executor", Some(arn)));
    assert!(!is_current_revision("other", Some(arn)));
    assert!(!is_current_revision("executor", None));
}
