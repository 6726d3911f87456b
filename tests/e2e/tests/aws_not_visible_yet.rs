//! Not visible yet and gone, on the AWS adapters over moto: the task a worker just started and
//! recorded is not visible yet — "The Amazon ECS API follows an eventual consistency model
//! ... the result of an API command you run that affects your Amazon ECS resources might
//! not be immediately visible to all subsequent commands you run" (ECS API reference,
//! RunTask) — so `DescribeTasks` on its ARN answers `MISSING` and `ListTasks` leaves it
//! out. moto shows a task at once; the controller's ECS client sits behind
//! `sandbox_aws::strict_ecs::StrictEcs` with a lag, which rewrites those answers the way
//! ECS gives them for every task a RunTask of that client returned.
//!
//! In each situation the next look at the environment — a second connection request, an
//! `agent.session.in_progress` event, a sweep recheck from the timers queue, a whole
//! sweep — decides `wait` (the record's task is "not visible yet" within
//! `Policy::visibility_window_secs` of being recorded) and never starts a second task:
//! one RunTask, one task in the cluster, counted without the lag. Once the task shows,
//! the same look keeps it.
//!
//! The jobs go through `Controller::process`, the worker's whole path (lock, read by ARN,
//! decide, act, release) on DynamoDB and SQS on moto, with the simulator as the Agents API.
//!
//! Run with `tests/moto/run.sh cargo nextest run -p sandbox-e2e -E 'test(aws)'`.

use agents_sim::SimHandle;
use sandbox_agents_api::AgentsClient;
use sandbox_aws::strict_ecs::StrictEcs;
use sandbox_controller::ports::{Clock, Compute as _, NO_DEADLINE, Registry as _, SystemClock};
use sandbox_controller::{Controller, Job, Processed};
use sandbox_core::compute::ComputeStatus;
use sandbox_core::decision::{Outcome, Reason};
use sandbox_core::ids::{DeploymentId, EnvironmentId, InstanceId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_e2e::aws_stack::{
    AwsController, AwsOptions, AwsResources, frozen_sim_with_a_waiting_session, harness_config,
    unique,
};
use std::sync::Arc;
use std::time::Duration;

/// How long the lag hides a new task: longer than any of these tests.
const LAG: Duration = Duration::from_secs(600);

/// The controller on moto with a lagging ECS client, and a session whose environment
/// needs its executor (input submitted, the simulator's clock stopped).
struct Lagging {
    resources: AwsResources,
    guard: StrictEcs,
    c: AwsController,
    sim: SimHandle,
    session: SessionId,
    env: EnvironmentId,
}

impl Lagging {
    async fn start() -> Self {
        let resources = AwsResources::create().await.unwrap();
        let guard = resources.ecs_guard.clone();
        guard.hide_new_tasks_for(LAG);
        let (sim, s, env, api) = frozen_sim_with_a_waiting_session().await;
        // No executor ever connects here (the simulator's clock stands still): a connect
        // deadline longer than the test, so a slow run never turns the wait into a
        // replacement of the task it waits for.
        let config = harness_config(
            DeploymentId::new(format!("nv-{}", unique())).unwrap(),
            &AwsOptions {
                connect_deadline_secs: 3_600,
                ..AwsOptions::default()
            },
        );
        let c = Controller::new(
            resources.events(),
            resources.timers(),
            resources.registry(),
            resources.compute(),
            AgentsClient::new(api).unwrap(),
            Arc::new(SystemClock) as Arc<dyn Clock>,
            config,
        );
        Self {
            resources,
            guard,
            c,
            sim,
            session: s.id.clone(),
            env,
        }
    }

    fn job(&self, trigger: Trigger) -> Job {
        Job {
            handoffs: 0,
            swept: None,
            operator_proof: None,
            trigger,
            session_id: self.session.clone(),
            environment_id: Some(self.env.clone()),
            webhook_id: None,
            enqueued_at: SystemClock.now(),
        }
    }

    async fn process(&self, trigger: Trigger) -> Processed {
        self.c.process(&self.job(trigger)).await.unwrap()
    }

    fn run_tasks(&self) -> usize {
        self.guard.calls_of("RunTask").len()
    }

    /// Every task in the cluster, live or stopped, read without the lag.
    async fn tasks(&self) -> Vec<InstanceId> {
        self.resources
            .all_tasks()
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.instance_id)
            .collect()
    }

    /// The first connection request starts task A and records it; ECS does not show A
    /// yet: `DescribeTasks` on its ARN answers MISSING, `ListTasks` leaves it out.
    async fn started_and_not_visible(&self) -> InstanceId {
        let p = self.process(Trigger::ConnectionRequested).await;
        assert_eq!(p.outcome(), Some(Outcome::Start), "{p:?}");
        assert_eq!(self.run_tasks(), 1);
        let record = self
            .c
            .registry
            .get(&self.env.effect_key())
            .await
            .unwrap()
            .expect("record");
        let a = record
            .instance
            .expect("the record names the task")
            .instance_id;
        assert_eq!(self.guard.hidden(), vec![a.as_str().to_owned()]);
        assert_eq!(self.c.compute.describe(&a).await.unwrap(), None, "MISSING");
        assert!(
            self.c
                .compute
                .list(&self.c.config.deployment)
                .await
                .unwrap()
                .is_empty(),
            "not listed"
        );
        assert_eq!(self.tasks().await, vec![a.clone()]);
        a
    }

    /// `p` waits for the recorded task, which is not visible yet, and starts nothing.
    fn assert_waits_for_it(&self, p: &Processed) {
        let d = p.decision.as_ref().unwrap_or_else(|| panic!("{p:?}"));
        assert_eq!(d.outcome, Outcome::Wait, "{p:?}");
        assert!(
            matches!(d.reason, Reason::ComputeNotVisibleYet { .. }),
            "{p:?}"
        );
        assert!(p.error.is_none(), "{p:?}");
        assert_eq!(self.run_tasks(), 1, "no second RunTask");
    }

    /// Once ECS shows A, the same look keeps it: still one task, no new RunTask.
    async fn once_visible_keeps_it(&self, trigger: Trigger, a: &InstanceId) {
        self.guard.stop_hiding();
        let p = self.process(trigger).await;
        assert_ne!(p.outcome(), Some(Outcome::Start), "{p:?}");
        assert_eq!(self.run_tasks(), 1, "{p:?}");
        assert_eq!(self.tasks().await, vec![a.clone()]);
        let record = self
            .c
            .registry
            .get(&self.env.effect_key())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.instance.unwrap().instance_id, *a);
    }

    async fn finish(self, a: &InstanceId) {
        self.c.compute.stop(a, "test", NO_DEADLINE).await.unwrap();
        assert_eq!(
            self.guard.rejected(),
            vec![],
            "no request the ECS API reference forbids"
        );
        self.sim.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_a_second_connection_request_while_the_recorded_task_is_not_yet_visible_never_starts_a_second_task()
 {
    let l = Lagging::start().await;
    let a = l.started_and_not_visible().await;
    for _ in 0..3 {
        let p = l.process(Trigger::ConnectionRequested).await;
        l.assert_waits_for_it(&p);
    }
    assert_eq!(l.tasks().await, vec![a.clone()], "one task");
    l.once_visible_keeps_it(Trigger::ConnectionRequested, &a)
        .await;
    l.finish(&a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_an_in_progress_event_while_the_recorded_task_is_not_yet_visible_never_starts_a_second_task()
 {
    let l = Lagging::start().await;
    let a = l.started_and_not_visible().await;
    let p = l.process(Trigger::TurnStarted).await;
    l.assert_waits_for_it(&p);
    assert_eq!(l.tasks().await, vec![a.clone()], "one task");
    l.once_visible_keeps_it(Trigger::TurnStarted, &a).await;
    l.finish(&a).await;
}

/// A recheck from the timers queue (a `Sweep` job without evidence: the worker reads the
/// record's task by ARN) and a whole sweep (one `ListTasks` by `startedBy`, which leaves
/// A out, then the records' tasks by ARN, which answer MISSING).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_a_sweep_recheck_while_the_recorded_task_is_not_yet_visible_never_starts_a_second_task()
{
    let l = Lagging::start().await;
    let a = l.started_and_not_visible().await;
    let p = l.process(Trigger::Sweep).await;
    l.assert_waits_for_it(&p);

    let before = l.guard.requests().len();
    let report = l.c.sweep().await.unwrap();
    assert_eq!(report.environments, 1, "{report:?}");
    assert_eq!(
        report.outcomes.get(Outcome::Wait.as_str()),
        Some(&1),
        "{report:?}"
    );
    assert_eq!(
        report.outcomes.get(Outcome::Start.as_str()),
        None,
        "{report:?}"
    );
    assert_eq!(l.run_tasks(), 1, "the sweep started nothing");
    let swept = l.guard.requests().split_off(before);
    let td = &l.resources.ecs.task_definition;
    let family = td.rsplit('/').next().unwrap().split(':').next().unwrap();
    assert_eq!(
        swept[0].body,
        serde_json::json!({"cluster": l.resources.ecs.cluster, "family": family, "desiredStatus": "RUNNING"}),
        "the sweep's inventory: ListTasks by family and RUNNING"
    );
    assert!(
        swept.iter().any(|r| r.operation == "DescribeTasks"
            && r.body["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t == a.as_str())),
        "the sweep read the recorded task by its ARN: {swept:?}"
    );
    assert_eq!(l.tasks().await, vec![a.clone()], "one task");
    let live = l.resources.all_tasks().await.unwrap();
    assert_eq!(live[0].status, ComputeStatus::Running);

    l.once_visible_keeps_it(Trigger::Sweep, &a).await;
    l.finish(&a).await;
}
