//! The compute twin: an ECS-like provider in memory.
//!
//! Instances are tagged with deployment, environment, session and generation; status
//! follows the clock (a start is `Provisioning` for [`ComputeTiming::start_secs`], a stop
//! `Stopping` for [`ComputeTiming::stop_secs`]). What else of Amazon ECS it reproduces is
//! chosen by [`AwsLike`] (each field cites the ECS documentation it follows; the digest is
//! `/work/shared/reference/aws-semantics.md`):
//!
//! - **request shapes** ECS rejects are rejected with a permanent [`PortError`]
//!   (`clientToken` > 64 characters or not ASCII, `startedBy` > 36 characters, a tag value
//!   > 256 characters, a `StopTask` reason > 255 characters);
//! - **eventual consistency** right after `RunTask`: `DescribeTasks` answers `MISSING`
//!   and `ListTasks` omits the task for a lag drawn per start;
//! - **forgetting**: a stopped task is described for an hour after it stopped, then
//!   `MISSING`; `ListTasks` (`desiredStatus` `RUNNING`, the default with `startedBy` as the
//!   only filter) never shows it once its stop was requested;
//! - **failed starts**: a fraction of starts stays `PROVISIONING` and then `STOPPED` with
//!   `stopCode` `TaskFailedToStart`;
//! - **`clientToken`**: a start replays the original task for 24 hours (the same token with
//!   other request parameters is a `ConflictException` naming that task, which the adapter
//!   adopts: answered with the task too), then starts a new one;
//! - **throttling**: a token bucket per ECS action on the simulated clock, a transient
//!   `ThrottlingException` when empty.
//!
//! [`TwinCompute::new`] is strict but instant ([`AwsLike::strict`]): it rejects invalid
//! requests, forgets stopped tasks after an hour and replays tokens for 24 h, with no lag,
//! no failed start and no throttling (the contract suite runs on it).
//! [`AwsLike::ecs`] turns everything on (the simulation's default).
//!
//! The twin also counts the ECS API calls each port call stands for ([`EcsCalls`]), the
//! way the AWS adapter (`crates/aws/src/ecs_compute/`) makes them: a describe is one
//! `DescribeTasks`, `describe_many` of n ids ⌈n/100⌉, a list of L live tasks
//! max(1, ⌈L/100⌉) `ListTasks` pages and ⌈L/100⌉ `DescribeTasks`.
//!
//! Workspaces follow Amazon EBS: a snapshot is `pending` for
//! [`SnapshotTiming::pending_secs`] on the twin's clock, then `completed` (or, for
//! [`SnapshotTiming::error_per_mille`] of them, `error`); "Snapshot creation is
//! asynchronous ... it remains in the pending state until all of data has been transferred
//! to Amazon S3. This can take several hours" (Amazon EBS User Guide, "Create Amazon EBS
//! snapshots"). The twin is strict: a start naming a snapshot that is not `completed` is
//! refused the way EC2's `CreateVolume` refuses it (`IncorrectState`, "Snapshot is in
//! invalid state"; velero-io/velero#1799: "EBS VolumeSnapshotter fails to create volume
//! from snapshot if the snapshot is still pending"): a failed start, logged
//! [`ComputeEvent::RestoreRefused`]. A volume is kept after its snapshot is taken; it is
//! deleted by [`Workspaces::delete_working_copy`] only once that snapshot is `completed`,
//! and `delete_stored` keeps a volume with snapshots none of which is `completed`
//! ([`ComputeEvent::VolumeDeleted`] logs every deletion).
//!
//! Every start and stop is logged ([`ComputeEvent`]) so a test can check what was asked
//! and in which state the provider was.

use crate::clock::SimClock;
use crate::rng::SimRng;
use sandbox_controller::ports::{
    Compute, PoolMember, PortError, Started, StoredKind, StoredWorkspace, Workspaces,
    check_deadline,
};
use sandbox_core::compute::{ComputeInstance, ComputeStatus, TASK_FAILED_TO_START};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation, InstanceId};
use sandbox_core::workspace::{SnapshotState, WorkspaceDisposition};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

/// How long transitions take on the twin, seconds (0: at once).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ComputeTiming {
    /// Seconds from `start` to `Running` (`Provisioning` before).
    pub start_secs: u64,
    /// Seconds from `stop` to `Stopped` (`Stopping` before).
    pub stop_secs: u64,
}

/// How EBS snapshots take time on the twin. Default: instant and never `error`
/// (the contract suite); the simulation keeps them `pending` for minutes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotTiming {
    /// Seconds a new snapshot stays `pending` on the twin's clock (0: `completed` at once).
    pub pending_secs: u64,
    /// Per mille of new snapshots that end in `error` instead of `completed`.
    pub error_per_mille: u64,
}

/// How warm pool members behave on the twin. Default: a member is `RUNNING` at
/// once and a recycle's stop always goes out (the contract suite). The simulation makes
/// them behave as on AWS, where a member is a Fargate task started by `RunTask` and a
/// recycle is two requests (docs/WARM_POOL.md, "ECS calls").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolTiming {
    /// Shortest time, seconds, from `start_pool_member` to `RUNNING`.
    pub start_secs_min: u64,
    /// Longest time, seconds, from `start_pool_member` to `RUNNING` (each member draws
    /// its own in `min..=max`). A Fargate task takes 30–60 s to reach `RUNNING`, image pull
    /// being most of it (docs/WARM_POOL.md; aws-semantics.md). A member still
    /// `PROVISIONING` is listed and may be claimed (the claim only writes its assignment;
    /// the forwarder reads it once it runs), and is then `PROVISIONING` as its
    /// environment's instance until that time.
    pub start_secs_max: u64,
    /// Recycles, per mille, whose `StopTask` does not go out after the guard write
    /// (idle → recycled): the call answers a transient error and the member keeps running,
    /// recycled, until a refill's [`Compute::reconcile_pool`] stops it. On AWS the recycle
    /// is an `UpdateItem` then a `StopTask`; a worker killed or throttled between the two
    /// leaves exactly that ([`Compute::recycle_pool_member`]'s errors).
    pub recycle_stop_fail_per_mille: u64,
}

/// ECS API limits the twin enforces (ECS API reference; aws-semantics.md).
pub mod limits {
    /// `RunTask` `clientToken`: "Up to 64 ASCII characters are allowed."
    pub const CLIENT_TOKEN_MAX: usize = 64;
    /// `RunTask` / `ListTasks` `startedBy`: "Up to 36 letters (uppercase and lowercase),
    /// numbers, hyphens (-), forward slash (/), and underscores (_) are allowed."
    pub const STARTED_BY_MAX: usize = 36;
    /// Tag values: "Maximum value length - 256 Unicode characters in UTF-8."
    pub const TAG_VALUE_MAX: usize = 256;
    /// `StopTask` `reason`: "Up to 255 characters are allowed in this message."
    pub const STOP_REASON_MAX: usize = 255;
    /// `DescribeTasks` `tasks`: at most 100 task ids per call; `ListTasks` pages hold at
    /// most 100 ARNs (`maxResults` ≤ 100).
    pub const PAGE: usize = 100;
    /// `clientToken` replay window: "the same result for 24 hours" (ECS API reference,
    /// "Ensuring idempotency"), seconds.
    pub const CLIENT_TOKEN_WINDOW_SECS: u64 = 24 * 3_600;
    /// Stopped tasks: "appear in the returned results for at least one hour" (ListTasks),
    /// then `DescribeTasks` answers `MISSING`; seconds.
    pub const STOPPED_RETENTION_SECS: u64 = 3_600;
    /// Fargate may keep a task `PROVISIONING` for about 30 minutes before stopping it with
    /// `TaskFailedToStart` (containers-roadmap #2381), seconds.
    pub const PROVISIONING_MAX_SECS: u64 = 30 * 60;
}

/// A token bucket per ECS action (ECS developer guide, "Request throttling for the Amazon
/// ECS API": a bucket's maximum capacity is the burst rate, its refill rate the sustained
/// rate, one token per request, `ThrottlingException` "Rate exceeded" when empty). The
/// documented quotas differ per action and account; tests choose theirs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttle {
    /// Bucket capacity, requests (the burst rate).
    pub burst: u64,
    /// Refill, requests per second (the sustained rate).
    pub per_sec: u64,
}

/// Which of Amazon ECS's documented behaviours the twin reproduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AwsLike {
    /// Reject what the ECS API reference forbids with a permanent error (see [`limits`]):
    /// a `clientToken` over 64 characters or not ASCII, a `startedBy` over 36, a tag value
    /// (environment, session id) over 256, a stop reason over 255.
    pub validate: bool,
    /// Upper bound, milliseconds, of how long a started task stays invisible: `describe`
    /// answers `None` (ECS `MISSING`) and `list` omits it. Each start draws its own lag in
    /// `0..=max` (ECS reads are eventually consistent right after `RunTask`: "MISSING"
    /// from DescribeTasks and an absent ListTasks entry for seconds; aws-semantics.md).
    pub max_visibility_lag_ms: u64,
    /// Seconds after it reached `STOPPED` that a task is still described; after that
    /// `describe` answers `None` (ECS forgets: "stopped tasks appear in the returned
    /// results for at least one hour", then `MISSING`). `None`: never forgotten.
    pub forget_stopped_after_secs: Option<u64>,
    /// Starts, per mille, that never run: `PROVISIONING` for a time drawn in
    /// `1..=max_failed_start_secs`, then `STOPPED` with `stopCode` `TaskFailedToStart`
    /// (containers-roadmap #2381; ECS API reference, `Task.stopCode`).
    pub failed_start_per_mille: u64,
    /// Upper bound, seconds, of how long a failing start stays `PROVISIONING` (ECS: up to
    /// about 30 minutes, [`limits::PROVISIONING_MAX_SECS`]).
    pub max_failed_start_secs: u64,
    /// Seconds a `clientToken` replays the task it started (ECS: 24 hours); after that the
    /// same token starts a new task. `None`: forever.
    pub token_window_secs: Option<u64>,
    /// Per-action throttling; `None`: never throttled.
    pub throttle: Option<Throttle>,
    /// Seed of the twin's own generator (lags, failed starts): the same seed and the same
    /// sequence of calls give the same behaviour.
    pub seed: u64,
}

impl AwsLike {
    /// Strict but instant: ECS's request rules, forgetting after an hour and the 24-hour
    /// token window; no lag, no failed start, no throttling.
    pub fn strict() -> Self {
        Self {
            validate: true,
            max_visibility_lag_ms: 0,
            forget_stopped_after_secs: Some(limits::STOPPED_RETENTION_SECS),
            failed_start_per_mille: 0,
            max_failed_start_secs: limits::PROVISIONING_MAX_SECS,
            token_window_secs: Some(limits::CLIENT_TOKEN_WINDOW_SECS),
            throttle: None,
            seed: 0,
        }
    }

    /// Everything on except throttling (whose quota is the caller's choice): up to 5 s of
    /// visibility lag, forgetting after an hour, 5 % of starts stuck `PROVISIONING` for up
    /// to 30 min then `TaskFailedToStart`, the 24-hour token window.
    pub fn ecs(seed: u64) -> Self {
        Self {
            max_visibility_lag_ms: 5_000,
            failed_start_per_mille: 50,
            seed,
            ..Self::strict()
        }
    }
}

impl Default for AwsLike {
    fn default() -> Self {
        Self::strict()
    }
}

/// ECS API calls, as the AWS adapter would make them for the port calls the twin served
/// (throttled and rejected requests included: they were sent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EcsCalls {
    /// `RunTask`.
    pub run_task: u64,
    /// `DescribeTasks` (≤ 100 ids each).
    pub describe_tasks: u64,
    /// `ListTasks` pages (≤ 100 ARNs each).
    pub list_tasks: u64,
    /// `StopTask`.
    pub stop_task: u64,
}

/// The remote calls of the warm pool's refill side, by `service.Operation`
/// (`ecs.ListTasks`, `dynamodb.Query`, ...), as the AWS adapter makes them
/// (`crates/aws/src/ecs_pool.rs`, `crates/aws/src/pool_table/`; docs/WARM_POOL.md "ECS
/// calls"), counted apart from [`EcsCalls`] and never throttled:
///
/// - the refill lease: one `dynamodb.UpdateItem` per take;
/// - a member's start: `dynamodb.PutItem` (its launch), `ecs.RunTask`,
///   `dynamodb.TransactWriteItems` (its record);
/// - the list of the pool: `dynamodb.Query` (`by_idle`), ⌈idle / 100⌉ `ecs.DescribeTasks`;
/// - a recycle: `dynamodb.UpdateItem`, `ecs.StopTask`;
/// - the reconcile: `dynamodb.Query` (`by_pool`: idle and recycled members, never a claimed
///   one), ⌈those / 100⌉ `ecs.DescribeTasks`, per recycled member still live `ecs.StopTask`
///   and `dynamodb.UpdateItem`; then its backstop page: `dynamodb.GetItem` and
///   `dynamodb.PutItem` (the cursor), one `ecs.ListTasks`, and one `dynamodb.BatchGetItem`
///   when claimed members are live (the page holds tasks the partition does not name).
pub type PoolCalls = BTreeMap<String, u64>;

fn pool_call(s: &mut State, call: &str, n: u64) {
    if n > 0 {
        *s.pool_calls.entry(call.to_owned()).or_default() += n;
    }
}

/// What the twin's ECS behaviours did, for a test to check they were exercised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EcsAnswers {
    /// Reads by id of known tasks answered `MISSING` because they were started less than
    /// their visibility lag ago.
    pub missing_new: u64,
    /// Reads by id of known tasks answered `MISSING` because they stopped more than the
    /// retention ago (forgotten).
    pub missing_forgotten: u64,
    /// Starts that replayed a task by `clientToken`.
    pub replays: u64,
    /// Starts whose token named a task started with other parameters
    /// (`ConflictException` with `resourceIds`): that task, adopted.
    pub conflicts_adopted: u64,
    /// Starts whose token had been used more than the window ago: a new task.
    pub token_expired: u64,
    /// Starts drawn to fail (`TaskFailedToStart` later).
    pub failing_starts: u64,
    /// Requests throttled.
    pub throttled: u64,
    /// Snapshot state reads answered `pending` (a start waited for one).
    pub snapshot_pending_reads: u64,
    /// Recycles whose guard found the member claimed since (left to its
    /// environment).
    pub recycles_lost_to_claims: u64,
    /// Claims of a member still `PROVISIONING`.
    pub claims_provisioning: u64,
}

impl EcsCalls {
    /// All ECS calls.
    pub fn total(&self) -> u64 {
        self.run_task + self.describe_tasks + self.list_tasks + self.stop_task
    }
}

/// One start or stop request as the provider saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ComputeEvent {
    /// `start` answered with an instance.
    Started {
        /// The instance (as returned).
        instance: ComputeInstance,
        /// `false` when the token matched an existing instance (idempotent replay).
        created: bool,
        /// Unix milliseconds.
        at_ms: u64,
    },
    /// A start named a snapshot that is not `completed`: refused like EC2's
    /// `CreateVolume` (`IncorrectState`), answered as a failed start. A controller that
    /// restores only completed snapshots never causes one.
    RestoreRefused {
        /// The snapshot named.
        snapshot_id: String,
        /// Its state then.
        state: SnapshotState,
        /// Unix milliseconds.
        at_ms: u64,
    },
    /// A workspace volume was deleted.
    VolumeDeleted {
        /// The environment tag.
        environment_id: EnvironmentId,
        /// The generation tag.
        generation: Generation,
        /// The port call that deleted it: `discard_workspace`, `delete_working_copy` or
        /// `delete_stored`.
        via: &'static str,
        /// The snapshots taken of it, with their state then.
        snapshots: Vec<(String, SnapshotState)>,
        /// Unix milliseconds.
        at_ms: u64,
    },
    /// `stop` was accepted.
    Stopped {
        /// The instance as it was just before the stop (`None`: unknown id).
        before: Option<ComputeInstance>,
        /// The id asked for.
        instance_id: InstanceId,
        /// The reason passed.
        reason: String,
        /// Unix milliseconds.
        at_ms: u64,
    },
}

#[derive(Debug)]
struct Instance {
    id: InstanceId,
    deployment: DeploymentId,
    spec: StartSpec,
    created_ms: u64,
    /// Invisible to `describe` and `list` before this (eventual consistency).
    visible_at_ms: u64,
    /// A start that never runs: `STOPPED` (`TaskFailedToStart`) at this time.
    fails_at_ms: Option<u64>,
    stop_requested_ms: Option<u64>,
    /// Died on its own (crash, spot reclaim): stopped at once, at this time.
    died_ms: Option<u64>,
    /// A claimed pool member: when it reaches `RUNNING` (Unix ms), from its own start
    /// ([`PoolTiming`]); `None`: [`ComputeTiming::start_secs`] after `created_ms`.
    running_at_ms: Option<u64>,
}

/// ECS `stopCode` of a task stopped by `StopTask` (ECS API reference, `Task.stopCode`).
pub const USER_INITIATED: &str = "UserInitiated";
/// ECS `stopCode` of a task whose essential container exited (a crashed executor).
pub const ESSENTIAL_CONTAINER_EXITED: &str = "EssentialContainerExited";

#[derive(Debug)]
struct State {
    instances: Vec<Instance>,
    by_id: HashMap<InstanceId, usize>,
    /// The latest instance started with each (deployment, token).
    by_token: HashMap<(DeploymentId, String), usize>,
    /// The member each (deployment, token) claimed. Apart from `by_token`, as
    /// on AWS: the pool's token items are the pool's, and ECS knows only `RunTask`'s own
    /// `clientToken`s, so a cold start with a token that claimed a member starts a new
    /// task, and a claim with a token that started cold claims anew.
    by_claim_token: HashMap<(DeploymentId, String), usize>,
    events: Vec<ComputeEvent>,
    next: u64,
    rng: SimRng,
    /// [`AwsLike::failed_start_per_mille`], changeable ([`TwinCompute::set_failed_starts`]).
    failed_start_per_mille: u64,
    /// Per ECS action: (milli-tokens, last refill, Unix ms).
    buckets: HashMap<&'static str, (u64, u64)>,
    calls: EcsCalls,
    /// The warm pool's calls ([`TwinCompute::take_pool_calls`]).
    pool_calls: PoolCalls,
    answers: EcsAnswers,
    /// Workspace volumes, by (deployment, environment, generation): files by path.
    volumes: HashMap<(DeploymentId, EnvironmentId, Generation), TwinVolume>,
    /// Workspace snapshots by id.
    snapshots: HashMap<String, TwinSnapshot>,
    /// Counter of volume and snapshot ids.
    ws_next: u64,
    /// Warm pool members, in start order.
    pool: Vec<TwinPoolMember>,
    /// How members behave ([`TwinCompute::set_pool_timing`]).
    pool_timing: PoolTiming,
    /// How snapshots take time ([`TwinCompute::set_snapshot_timing`]).
    snapshot_timing: SnapshotTiming,
    /// Cold starts' seconds to `RUNNING`, drawn per task in `min..=max`
    /// ([`TwinCompute::set_cold_start_secs`]); `None`: [`ComputeTiming::start_secs`].
    cold_start_secs: Option<(u64, u64)>,
}

/// Where a warm pool member of the twin stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    /// In the pool, live, serving no environment.
    Idle,
    /// Assigned to an environment: from then on an instance of it (its ground truth is
    /// [`TwinCompute::instances`]).
    Claimed,
    /// Taken by a recycle's guard write, its stop not sent yet: still running.
    Recycled,
    /// Stopped while in the pool (a recycle, or the reconcile of a recycled member).
    Stopped,
    /// Died on its own while in the pool ([`TwinCompute::kill`]).
    Died,
}

/// A warm pool member of the twin as it is (ground truth, [`TwinCompute::pool_members`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TwinPoolMember {
    /// Its id (the instance id it keeps once claimed).
    pub instance_id: InstanceId,
    /// Its deployment.
    pub deployment: DeploymentId,
    /// When it was started, Unix ms.
    pub created_ms: u64,
    /// When it reaches (reached) `RUNNING`, Unix ms.
    pub running_at_ms: u64,
    /// Where it stands.
    pub state: MemberState,
    /// Every environment a claim assigned it to, in order (single-use: at most one).
    pub claims: Vec<EnvironmentId>,
    /// When a recycle's guard write (idle → recycled) took it, Unix ms.
    pub recycled_ms: Option<u64>,
}

/// A workspace volume of the twin (ECS-managed EBS volume: created at `RunTask`, from the
/// snapshot the start names, kept after the task stops).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TwinVolume {
    /// Volume id (`vol-…`).
    pub id: String,
    /// Files by path.
    pub files: BTreeMap<String, String>,
    /// Created at, Unix seconds.
    pub created_at: u64,
}

/// A workspace snapshot of the twin (EBS snapshot tagged deployment, environment,
/// generation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TwinSnapshot {
    /// Snapshot id (`snap-…`).
    pub id: String,
    /// The deployment tag.
    pub deployment: DeploymentId,
    /// The environment tag.
    pub environment_id: EnvironmentId,
    /// The generation tag.
    pub generation: Generation,
    /// Files by path.
    pub files: BTreeMap<String, String>,
    /// Created at, Unix seconds.
    pub created_at: u64,
    /// The volume it was taken from.
    pub volume_id: String,
    /// When it leaves `pending`, Unix milliseconds.
    pub settles_at_ms: u64,
    /// It ends in `error`, not `completed`.
    pub ends_in_error: bool,
}

impl TwinSnapshot {
    /// Its state at `now_ms` (Unix milliseconds).
    pub fn state_at(&self, now_ms: u64) -> SnapshotState {
        match (now_ms >= self.settles_at_ms, self.ends_in_error) {
            (false, _) => SnapshotState::Pending,
            (true, false) => SnapshotState::Completed,
            (true, true) => SnapshotState::Error,
        }
    }
}

/// An in-memory compute provider. Clones share the same state.
#[derive(Clone, Debug)]
pub struct TwinCompute {
    clock: SimClock,
    timing: ComputeTiming,
    aws: AwsLike,
    state: Arc<Mutex<State>>,
}

const DEP: &str = "compute";

/// Whether two starts send ECS the same `RunTask` parameters: what the adapter
/// (`crates/aws/src/ecs_compute/`) puts in the request — the `REMOTE_URL` and
/// `ENVIRONMENT_ID` overrides and the session, environment and generation tags (the
/// deployment is part of the token's key). `workspace_directory` and `previous` are not
/// sent, so they cannot make a `ConflictException`.
fn same_request(a: &StartSpec, b: &StartSpec) -> bool {
    a.environment_id == b.environment_id
        && a.session_id == b.session_id
        && a.remote_url == b.remote_url
        && a.generation == b.generation
        && a.restore.as_ref().map(|r| &r.snapshot_id) == b.restore.as_ref().map(|r| &r.snapshot_id)
}

fn pages(n: usize) -> u64 {
    n.div_ceil(limits::PAGE) as u64
}

impl TwinCompute {
    /// A provider whose transitions are instant, strict about requests
    /// ([`AwsLike::strict`]).
    pub fn new(clock: SimClock) -> Self {
        Self::with_timing(clock, ComputeTiming::default())
    }

    /// A provider with the given transition times ([`AwsLike::strict`]).
    pub fn with_timing(clock: SimClock, timing: ComputeTiming) -> Self {
        Self::aws_like(clock, timing, AwsLike::strict())
    }

    /// A provider with the given transition times and ECS behaviours.
    pub fn aws_like(clock: SimClock, timing: ComputeTiming, aws: AwsLike) -> Self {
        Self {
            clock,
            timing,
            aws,
            state: Arc::new(Mutex::new(State {
                instances: vec![],
                by_id: HashMap::new(),
                by_token: HashMap::new(),
                by_claim_token: HashMap::new(),
                events: vec![],
                next: 0,
                rng: SimRng::new(aws.seed),
                failed_start_per_mille: aws.failed_start_per_mille,
                buckets: HashMap::new(),
                calls: EcsCalls::default(),
                pool_calls: PoolCalls::default(),
                answers: EcsAnswers::default(),
                volumes: HashMap::new(),
                snapshots: HashMap::new(),
                ws_next: 0,
                pool: vec![],
                pool_timing: PoolTiming::default(),
                snapshot_timing: SnapshotTiming::default(),
                cold_start_secs: None,
            })),
        }
    }

    /// From now on, each new cold start (`RunTask` for an environment) takes its own time
    /// to `RUNNING`, drawn from the twin's seeded generator in `min_secs..=max_secs`, as a
    /// Fargate task does (30–60 s, image pull most of it: docs/WARM_POOL.md), instead of
    /// [`ComputeTiming::start_secs`].
    pub fn set_cold_start_secs(&self, min_secs: u64, max_secs: u64) {
        self.state().cold_start_secs = Some((min_secs, max_secs.max(min_secs)));
    }

    /// When the task (a cold start or a pool member) reaches or reached `RUNNING`, Unix ms
    /// (ground truth); `None` for an unknown id or a start that fails.
    pub fn running_at_ms(&self, id: &InstanceId) -> Option<u64> {
        let s = self.state();
        if let Some(m) = s.pool.iter().find(|m| &m.instance_id == id) {
            return Some(m.running_at_ms);
        }
        let i = &s.instances[*s.by_id.get(id)?];
        i.fails_at_ms.is_none().then(|| {
            i.running_at_ms
                .unwrap_or(i.created_ms + self.timing.start_secs * 1_000)
        })
    }

    /// From now on, new snapshots take time as `timing` says.
    pub fn set_snapshot_timing(&self, timing: SnapshotTiming) {
        self.state().snapshot_timing = timing;
    }

    /// From now on, pool members behave as `timing` says; members already
    /// started keep their start time.
    pub fn set_pool_timing(&self, timing: PoolTiming) {
        self.state().pool_timing = timing;
    }

    /// Every warm pool member ever started, in start order (ground truth).
    pub fn pool_members(&self) -> Vec<TwinPoolMember> {
        self.state().pool.clone()
    }

    /// `f` of every warm pool member ever started, in start order (ground truth), without
    /// copying them (the simulation reads them after every step).
    pub fn with_pool_members<R>(&self, f: impl FnOnce(&[TwinPoolMember]) -> R) -> R {
        f(&self.state().pool)
    }

    /// The ECS behaviours this twin reproduces.
    pub fn behaviour(&self) -> AwsLike {
        AwsLike {
            failed_start_per_mille: self.state().failed_start_per_mille,
            ..self.aws
        }
    }

    /// From now on, `per_mille` of the starts fail ([`AwsLike::failed_start_per_mille`]);
    /// starts already made keep their fate.
    pub fn set_failed_starts(&self, per_mille: u64) {
        self.state().failed_start_per_mille = per_mille;
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the instance reached `STOPPED` (Unix ms) and its `stopCode`, if it did by
    /// `now_ms`.
    fn stopped(&self, i: &Instance, now_ms: u64) -> Option<(u64, &'static str)> {
        [
            i.died_ms.map(|t| (t, ESSENTIAL_CONTAINER_EXITED)),
            i.stop_requested_ms
                .map(|t| (t + self.timing.stop_secs * 1_000, USER_INITIATED)),
            i.fails_at_ms.map(|t| (t, TASK_FAILED_TO_START)),
        ]
        .into_iter()
        .flatten()
        .filter(|(t, _)| *t <= now_ms)
        .min_by_key(|(t, _)| *t)
    }

    /// The instance as it is (ground truth, whatever ECS would answer).
    fn view(&self, i: &Instance, now_ms: u64) -> ComputeInstance {
        let running_at = i
            .running_at_ms
            .unwrap_or(i.created_ms + self.timing.start_secs * 1_000);
        let runs = i.fails_at_ms.is_none() && now_ms >= running_at;
        let (status, stop_code) = match (self.stopped(i, now_ms), i.stop_requested_ms) {
            (Some((_, code)), _) => (ComputeStatus::Stopped, Some(code.to_owned())),
            (None, Some(_)) => (ComputeStatus::Stopping, None),
            (None, None) if runs => (ComputeStatus::Running, None),
            (None, None) => (ComputeStatus::Provisioning, None),
        };
        let ran = i.fails_at_ms.is_none()
            && i.died_ms.is_none_or(|d| d >= running_at)
            && now_ms >= running_at;
        ComputeInstance {
            instance_id: i.id.clone(),
            environment_id: i.spec.environment_id.clone(),
            session_id: Some(i.spec.session_id.clone()),
            generation: i.spec.generation,
            status,
            started_at: ran.then_some(running_at / 1_000),
            // ECS `stoppedReason` and the essential container's exit code of a task that
            // ended by itself (the executor or its forwarder exited).
            exit: (stop_code.as_deref() == Some(ESSENTIAL_CONTAINER_EXITED)).then(|| {
                sandbox_core::compute::ExitDetail {
                    reason: Some("Essential container in task exited".into()),
                    exit_code: Some(1),
                    output: vec![],
                }
            }),
            stop_code,
        }
    }

    /// Whether ECS answers the instance at `now_ms` (not lagging, not forgotten).
    fn visible(&self, i: &Instance, now_ms: u64) -> bool {
        if now_ms < i.visible_at_ms {
            return false;
        }
        match (self.aws.forget_stopped_after_secs, self.stopped(i, now_ms)) {
            (Some(keep), Some((at, _))) => now_ms < at + keep * 1_000,
            _ => true,
        }
    }

    /// Whether ECS answers the instance, counting a `MISSING` answer by its cause.
    fn answered(&self, answers: &mut EcsAnswers, i: &Instance, now_ms: u64) -> bool {
        if self.visible(i, now_ms) {
            return true;
        }
        if now_ms < i.visible_at_ms {
            answers.missing_new += 1;
        } else {
            answers.missing_forgotten += 1;
        }
        false
    }

    /// One ECS request of `action`: counted, then throttled by its bucket.
    fn request(&self, s: &mut State, action: &'static str, now_ms: u64) -> Result<(), PortError> {
        match action {
            "RunTask" => s.calls.run_task += 1,
            "DescribeTasks" => s.calls.describe_tasks += 1,
            "ListTasks" => s.calls.list_tasks += 1,
            _ => s.calls.stop_task += 1,
        }
        let Some(t) = self.aws.throttle else {
            return Ok(());
        };
        let full = t.burst * 1_000;
        let (tokens, last) = s.buckets.entry(action).or_insert((full, now_ms));
        let refill = now_ms.saturating_sub(*last).saturating_mul(t.per_sec);
        *tokens = tokens.saturating_add(refill).min(full);
        *last = now_ms.max(*last);
        if *tokens < 1_000 {
            s.answers.throttled += 1;
            return Err(PortError::transient(
                DEP,
                match action {
                    "RunTask" => "start",
                    "StopTask" => "stop",
                    "ListTasks" => "list",
                    _ => "describe",
                },
                format!("ThrottlingException: Rate exceeded ({action})"),
            ));
        }
        *tokens -= 1_000;
        Ok(())
    }

    fn invalid(operation: &'static str, what: String) -> PortError {
        PortError::permanent(DEP, operation, format!("InvalidParameterException: {what}"))
    }

    fn check_started_by(&self, operation: &'static str, d: &DeploymentId) -> Result<(), PortError> {
        let n = d.as_str().chars().count();
        if self.aws.validate && n > limits::STARTED_BY_MAX {
            return Err(Self::invalid(
                operation,
                format!("startedBy has {n} characters (at most 36)"),
            ));
        }
        Ok(())
    }

    fn check_start(&self, spec: &StartSpec, deployment: &DeploymentId) -> Result<(), PortError> {
        if !self.aws.validate {
            return Ok(());
        }
        let token = &spec.idempotency_token;
        if token.chars().count() > limits::CLIENT_TOKEN_MAX || !token.is_ascii() {
            return Err(Self::invalid(
                "start",
                format!(
                    "clientToken must be at most 64 ASCII characters ({} characters)",
                    token.chars().count()
                ),
            ));
        }
        self.check_started_by("start", deployment)?;
        for (tag, value) in [
            ("environment", spec.environment_id.as_str()),
            ("session", spec.session_id.as_str()),
        ] {
            let n = value.chars().count();
            if n > limits::TAG_VALUE_MAX {
                return Err(Self::invalid(
                    "start",
                    format!("tag {tag} value has {n} characters (at most 256)"),
                ));
            }
        }
        Ok(())
    }

    /// Every instance of every deployment as it is now (ground truth: lagging and
    /// forgotten ones included).
    pub fn instances(&self) -> Vec<ComputeInstance> {
        let now = self.clock.now_ms();
        let s = self.state();
        s.instances.iter().map(|i| self.view(i, now)).collect()
    }

    /// The active (provisioning, pending, running) instances of `env` (ground truth).
    pub fn active_of(&self, env: &EnvironmentId) -> Vec<ComputeInstance> {
        self.instances()
            .into_iter()
            .filter(|i| &i.environment_id == env && i.status.is_active())
            .collect()
    }

    /// The live (not stopped) instances of `env` (ground truth).
    pub fn live_of(&self, env: &EnvironmentId) -> Vec<ComputeInstance> {
        self.instances()
            .into_iter()
            .filter(|i| &i.environment_id == env && i.status.is_live())
            .collect()
    }

    /// The spec an instance was started with (remote URL, token, ...).
    pub fn spec_of(&self, id: &InstanceId) -> Option<StartSpec> {
        let s = self.state();
        s.by_id.get(id).map(|&p| s.instances[p].spec.clone())
    }

    /// Every start and stop so far, in order.
    pub fn events(&self) -> Vec<ComputeEvent> {
        self.state().events.clone()
    }

    /// The events from index `from` on (for incremental checks).
    pub fn events_since(&self, from: usize) -> Vec<ComputeEvent> {
        self.state().events.get(from..).unwrap_or_default().to_vec()
    }

    /// The ECS API calls so far.
    pub fn ecs_calls(&self) -> EcsCalls {
        self.state().calls
    }

    /// What the ECS behaviours did so far.
    pub fn answers(&self) -> EcsAnswers {
        self.state().answers
    }

    /// The warm pool's refill-side calls so far ([`PoolCalls`]), and resets the count.
    pub fn take_pool_calls(&self) -> PoolCalls {
        std::mem::take(&mut self.state().pool_calls)
    }

    /// The ECS API calls so far, and resets the count.
    pub fn take_ecs_calls(&self) -> EcsCalls {
        std::mem::take(&mut self.state().calls)
    }

    /// The instance dies on its own (a crashed executor, a reclaimed task): `Stopped` at
    /// once, with no stop request. Returns whether it was live.
    pub fn kill(&self, id: &InstanceId) -> bool {
        let now = self.clock.now_ms();
        let mut s = self.state();
        if let Some(m) = s.pool.iter_mut().find(|m| {
            &m.instance_id == id && matches!(m.state, MemberState::Idle | MemberState::Recycled)
        }) {
            m.state = MemberState::Died;
            return true;
        }
        let Some(&pos) = s.by_id.get(id) else {
            return false;
        };
        let live = self.view(&s.instances[pos], now).status.is_live();
        if live {
            s.instances[pos].died_ms = Some(now);
        }
        live
    }
}

impl TwinCompute {
    /// Writes a file into the workspace volume of `generation` (as the agent would).
    /// `false` when that generation has no volume.
    pub fn write_file(
        &self,
        deployment: &DeploymentId,
        env: &EnvironmentId,
        generation: Generation,
        path: &str,
        content: &str,
    ) -> bool {
        let mut s = self.state();
        match s
            .volumes
            .get_mut(&(deployment.clone(), env.clone(), generation))
        {
            Some(v) => {
                v.files.insert(path.to_owned(), content.to_owned());
                true
            }
            None => false,
        }
    }

    /// The workspace volume of `generation`, if it exists.
    pub fn volume(
        &self,
        deployment: &DeploymentId,
        env: &EnvironmentId,
        generation: Generation,
    ) -> Option<TwinVolume> {
        self.state()
            .volumes
            .get(&(deployment.clone(), env.clone(), generation))
            .cloned()
    }

    /// Every workspace snapshot, by id.
    pub fn snapshots(&self) -> Vec<TwinSnapshot> {
        let mut all: Vec<TwinSnapshot> = self.state().snapshots.values().cloned().collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// Leaves a tagged volume no compute uses (a crashed controller's leftover).
    pub fn leave_volume(
        &self,
        deployment: &DeploymentId,
        env: &EnvironmentId,
        generation: Generation,
    ) {
        let now = self.clock.now_ms() / 1000;
        let mut s = self.state();
        s.ws_next += 1;
        let id = format!("vol-twin{}", s.ws_next);
        s.volumes.insert(
            (deployment.clone(), env.clone(), generation),
            TwinVolume {
                id,
                files: BTreeMap::new(),
                created_at: now,
            },
        );
    }

    /// Removes the volume of `key`, logging [`ComputeEvent::VolumeDeleted`]; `false` when
    /// there was none.
    fn remove_volume(
        s: &mut State,
        key: &(DeploymentId, EnvironmentId, Generation),
        via: &'static str,
        now_ms: u64,
    ) -> bool {
        let Some(v) = s.volumes.remove(key) else {
            return false;
        };
        let mut snapshots: Vec<(String, SnapshotState)> = s
            .snapshots
            .values()
            .filter(|x| x.volume_id == v.id)
            .map(|x| (x.id.clone(), x.state_at(now_ms)))
            .collect();
        snapshots.sort_by(|a, b| a.0.cmp(&b.0));
        s.events.push(ComputeEvent::VolumeDeleted {
            environment_id: key.1.clone(),
            generation: key.2,
            via,
            snapshots,
            at_ms: now_ms,
        });
        true
    }

    /// Whether some instance of (deployment, env, generation) is not `STOPPED` yet.
    fn volume_in_use(
        &self,
        s: &State,
        deployment: &DeploymentId,
        env: &EnvironmentId,
        generation: Generation,
        now_ms: u64,
    ) -> bool {
        s.instances.iter().any(|i| {
            &i.deployment == deployment
                && &i.spec.environment_id == env
                && i.spec.generation == generation
                && self.view(i, now_ms).status != ComputeStatus::Stopped
        })
    }
}

impl Workspaces for TwinCompute {
    async fn save_workspace(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
    ) -> Result<WorkspaceDisposition, PortError> {
        let now = self.clock.now_ms();
        let mut s = self.state();
        // A retried save returns the generation's snapshot; one in `error` does not count.
        if let Some(done) = s.snapshots.values().find(|x| {
            &x.deployment == deployment
                && &x.environment_id == environment_id
                && x.generation == generation
                && x.state_at(now) != SnapshotState::Error
        }) {
            return Ok(WorkspaceDisposition::Snapshot {
                snapshot_id: done.id.clone(),
            });
        }
        let key = (deployment.clone(), environment_id.clone(), generation);
        if !s.volumes.contains_key(&key) {
            return Ok(WorkspaceDisposition::None);
        }
        if self.volume_in_use(&s, deployment, environment_id, generation, now) {
            // The controller snapshots only after the STOPPED read-back (the contract).
            return Err(PortError::permanent(
                "workspace",
                "save",
                format!("volume of {environment_id} generation {generation} is in use"),
            ));
        }
        // CreateSnapshot: the volume stays; the snapshot holds its files as of now.
        let volume = s.volumes.get(&key).cloned().unwrap_or_default();
        let timing = s.snapshot_timing;
        let ends_in_error =
            timing.error_per_mille > 0 && s.rng.below(1_000) < timing.error_per_mille;
        s.ws_next += 1;
        let id = format!("snap-twin{}", s.ws_next);
        s.snapshots.insert(
            id.clone(),
            TwinSnapshot {
                id: id.clone(),
                deployment: deployment.clone(),
                environment_id: environment_id.clone(),
                generation,
                files: volume.files,
                created_at: now / 1000,
                volume_id: volume.id,
                settles_at_ms: now + timing.pending_secs * 1_000,
                ends_in_error,
            },
        );
        Ok(WorkspaceDisposition::Snapshot { snapshot_id: id })
    }

    async fn discard_workspace(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
    ) -> Result<WorkspaceDisposition, PortError> {
        let now = self.clock.now_ms();
        let mut s = self.state();
        if self.volume_in_use(&s, deployment, environment_id, generation, now) {
            return Err(PortError::permanent(
                "workspace",
                "discard",
                format!("volume of {environment_id} generation {generation} is in use"),
            ));
        }
        let gone = Self::remove_volume(
            &mut s,
            &(deployment.clone(), environment_id.clone(), generation),
            "discard_workspace",
            now,
        );
        Ok(if gone {
            WorkspaceDisposition::Deleted
        } else {
            WorkspaceDisposition::None
        })
    }

    async fn snapshot_state(
        &self,
        deployment: &DeploymentId,
        snapshot_id: &str,
    ) -> Result<SnapshotState, PortError> {
        let now = self.clock.now_ms();
        let mut s = self.state();
        let state = s
            .snapshots
            .get(snapshot_id)
            .filter(|x| &x.deployment == deployment)
            .map_or(SnapshotState::Gone, |x| x.state_at(now));
        s.answers.snapshot_pending_reads += u64::from(state == SnapshotState::Pending);
        Ok(state)
    }

    async fn delete_working_copy(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
        snapshot_id: &str,
    ) -> Result<bool, PortError> {
        let now = self.clock.now_ms();
        let mut s = self.state();
        let key = (deployment.clone(), environment_id.clone(), generation);
        let Some(volume_id) = s.volumes.get(&key).map(|v| v.id.clone()) else {
            return Ok(true);
        };
        let completed = s.snapshots.get(snapshot_id).is_some_and(|x| {
            &x.deployment == deployment
                && x.volume_id == volume_id
                && x.state_at(now) == SnapshotState::Completed
        });
        if completed {
            Self::remove_volume(&mut s, &key, "delete_working_copy", now);
        }
        Ok(completed)
    }

    async fn delete_stored(
        &self,
        deployment: &DeploymentId,
        kind: StoredKind,
        id: &str,
    ) -> Result<(), PortError> {
        let now = self.clock.now_ms();
        let mut s = self.state();
        match kind {
            StoredKind::Snapshot => {
                if s.snapshots
                    .get(id)
                    .is_some_and(|x| &x.deployment == deployment)
                {
                    s.snapshots.remove(id);
                }
            }
            StoredKind::Volume => {
                let Some(key) = s
                    .volumes
                    .iter()
                    .find(|(k, v)| &k.0 == deployment && v.id == id)
                    .map(|(k, _)| k.clone())
                else {
                    return Ok(());
                };
                let states: Vec<SnapshotState> = s
                    .snapshots
                    .values()
                    .filter(|x| x.volume_id == id)
                    .map(|x| x.state_at(now))
                    .collect();
                if !states.is_empty() && !states.contains(&SnapshotState::Completed) {
                    return Err(PortError::transient(
                        "workspace",
                        "delete_stored",
                        format!("volume {id} has no completed snapshot; kept"),
                    ));
                }
                Self::remove_volume(&mut s, &key, "delete_stored", now);
            }
        }
        Ok(())
    }

    async fn list_stored(
        &self,
        deployment: &DeploymentId,
    ) -> Result<Vec<StoredWorkspace>, PortError> {
        let now = self.clock.now_ms();
        let s = self.state();
        let mut out: Vec<StoredWorkspace> = s
            .snapshots
            .values()
            .filter(|x| &x.deployment == deployment)
            .map(|x| StoredWorkspace {
                kind: StoredKind::Snapshot,
                id: x.id.clone(),
                environment_id: x.environment_id.clone(),
                generation: x.generation,
                created_at: x.created_at,
                in_use: false,
            })
            .collect();
        // Which volumes an instance still uses, in one pass over the instances (asking
        // `volume_in_use` per volume made the sweep quadratic in the deployment).
        let in_use: std::collections::HashSet<(&EnvironmentId, Generation)> = s
            .instances
            .iter()
            .filter(|i| &i.deployment == deployment)
            .filter(|i| self.view(i, now).status != ComputeStatus::Stopped)
            .map(|i| (&i.spec.environment_id, i.spec.generation))
            .collect();
        out.extend(
            s.volumes
                .iter()
                .filter(|(k, _)| &k.0 == deployment)
                .map(|(k, v)| StoredWorkspace {
                    kind: StoredKind::Volume,
                    id: v.id.clone(),
                    environment_id: k.1.clone(),
                    generation: k.2,
                    created_at: v.created_at,
                    in_use: in_use.contains(&(&k.1, k.2)),
                }),
        );
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }
}

impl TwinCompute {
    /// Creates the workspace volume of a start or claim (from the snapshot it names) and
    /// stores `instance` under its id and token (a claim's token apart from `RunTask`'s).
    fn launch(
        &self,
        s: &mut State,
        instance: Instance,
        key: (DeploymentId, String),
        now: u64,
        claim: bool,
    ) -> Started {
        let spec = instance.spec.clone();
        let deployment = instance.deployment.clone();
        let id = instance.id.clone();
        let files = match &spec.restore {
            None => BTreeMap::new(),
            Some(r) => match s.snapshots.get(&r.snapshot_id) {
                // EC2 CreateVolume restores only a `completed` snapshot (module docs).
                Some(snap) if snap.state_at(now) != SnapshotState::Completed => {
                    let state = snap.state_at(now);
                    s.events.push(ComputeEvent::RestoreRefused {
                        snapshot_id: r.snapshot_id.clone(),
                        state,
                        at_ms: now,
                    });
                    return Started::Failed {
                        reason: format!(
                            "IncorrectState: snapshot {} is in invalid state - {state}",
                            r.snapshot_id
                        ),
                    };
                }
                Some(snap) => snap.files.clone(),
                // ECS: the task fails to attach a volume from a snapshot that is gone.
                None => {
                    return Started::Failed {
                        reason: format!(
                            "InvalidSnapshot.NotFound: snapshot {} does not exist",
                            r.snapshot_id
                        ),
                    };
                }
            },
        };
        s.ws_next += 1;
        let volume = TwinVolume {
            id: format!("vol-twin{}", s.ws_next),
            files,
            created_at: now / 1000,
        };
        s.volumes.insert(
            (
                deployment.clone(),
                spec.environment_id.clone(),
                spec.generation,
            ),
            volume,
        );
        let view = self.view(&instance, now);
        let pos = s.instances.len();
        s.instances.push(instance);
        s.by_id.insert(id, pos);
        if claim {
            s.by_claim_token.insert(key, pos);
        } else {
            s.by_token.insert(key, pos);
        }
        s.events.push(ComputeEvent::Started {
            instance: view.clone(),
            created: true,
            at_ms: now,
        });
        Started::Instance(view)
    }
}

impl Compute for TwinCompute {
    async fn start(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<Started, PortError> {
        let now = self.clock.now_ms();
        check_deadline(DEP, "start", now / 1000, not_after)?;
        let mut s = self.state();
        self.request(&mut s, "RunTask", now)?;
        self.check_start(spec, deployment)?;
        let key = (deployment.clone(), spec.idempotency_token.clone());
        let window_ms = self.aws.token_window_secs.map(|w| w * 1_000);
        let used = s.by_token.get(&key).copied();
        if let Some(p) = used
            && window_ms.is_none_or(|w| now < s.instances[p].created_ms + w)
        {
            // The same token with other parameters is a `ConflictException` naming the
            // task (`resourceIds`); the adapter adopts that task (ecs_compute.rs,
            // `run_task_error`), so the port answers it like a replay.
            if same_request(&s.instances[p].spec, spec) {
                s.answers.replays += 1;
            } else {
                s.answers.conflicts_adopted += 1;
            }
            let instance = self.view(&s.instances[p], now);
            s.events.push(ComputeEvent::Started {
                instance: instance.clone(),
                created: false,
                at_ms: now,
            });
            return Ok(Started::Instance(instance));
        }
        s.answers.token_expired += u64::from(used.is_some());
        s.next += 1;
        // Ends in a letter, so no id is a prefix-plus-digit of another.
        let id = InstanceId::new(format!("twin-task-{}-t", s.next));
        let lag = s.rng.below(self.aws.max_visibility_lag_ms + 1);
        let fails_at_ms = (s.failed_start_per_mille > 0
            && s.rng.below(1_000) < s.failed_start_per_mille)
            .then(|| now + 1_000 * (1 + s.rng.below(self.aws.max_failed_start_secs.max(1))));
        s.answers.failing_starts += u64::from(fails_at_ms.is_some());
        let running_at_ms = s
            .cold_start_secs
            .map(|(min, max)| now + 1_000 * (min + s.rng.below(max - min + 1)));
        let instance = Instance {
            id,
            deployment: deployment.clone(),
            spec: spec.clone(),
            created_ms: now,
            visible_at_ms: now + lag,
            fails_at_ms,
            stop_requested_ms: None,
            died_ms: None,
            running_at_ms,
        };
        Ok(self.launch(&mut s, instance, key, now, false))
    }

    async fn describe(&self, id: &InstanceId) -> Result<Option<ComputeInstance>, PortError> {
        let now = self.clock.now_ms();
        let mut s = self.state();
        self.request(&mut s, "DescribeTasks", now)?;
        let s = &mut *s;
        Ok(s.by_id
            .get(id)
            .map(|&p| &s.instances[p])
            .filter(|i| self.answered(&mut s.answers, i, now))
            .map(|i| self.view(i, now)))
    }

    async fn describe_many(&self, ids: &[InstanceId]) -> Result<Vec<ComputeInstance>, PortError> {
        let now = self.clock.now_ms();
        let mut s = self.state();
        for _ in ids.chunks(limits::PAGE) {
            self.request(&mut s, "DescribeTasks", now)?;
        }
        let s = &mut *s;
        Ok(ids
            .iter()
            .filter_map(|id| s.by_id.get(id))
            .map(|&p| &s.instances[p])
            .filter(|i| self.answered(&mut s.answers, i, now))
            .map(|i| self.view(i, now))
            .collect())
    }

    async fn list(&self, deployment: &DeploymentId) -> Result<Vec<ComputeInstance>, PortError> {
        let now = self.clock.now_ms();
        let mut s = self.state();
        self.check_started_by("list", deployment)?;
        // `startedBy` alone: `desiredStatus` RUNNING, so a task whose stop was requested
        // (or that stopped on its own) is not listed.
        let live: Vec<ComputeInstance> = s
            .instances
            .iter()
            .filter(|i| &i.deployment == deployment && i.stop_requested_ms.is_none())
            .filter(|i| self.visible(i, now))
            .map(|i| self.view(i, now))
            .filter(|i| i.status.is_active())
            .collect();
        for _ in 0..pages(live.len()).max(1) {
            self.request(&mut s, "ListTasks", now)?;
        }
        for _ in 0..pages(live.len()) {
            self.request(&mut s, "DescribeTasks", now)?;
        }
        Ok(live)
    }

    async fn stop(&self, id: &InstanceId, reason: &str, not_after: u64) -> Result<(), PortError> {
        let now = self.clock.now_ms();
        check_deadline(DEP, "stop", now / 1000, not_after)?;
        let mut s = self.state();
        self.request(&mut s, "StopTask", now)?;
        let n = reason.chars().count();
        if self.aws.validate && n > limits::STOP_REASON_MAX {
            return Err(Self::invalid(
                "stop",
                format!("reason has {n} characters (at most 255)"),
            ));
        }
        if let Some(m) = s.pool.iter_mut().find(|m| {
            &m.instance_id == id && matches!(m.state, MemberState::Idle | MemberState::Recycled)
        }) {
            m.state = MemberState::Stopped;
        }
        let pos = s.by_id.get(id).copied();
        let before = pos.map(|p| self.view(&s.instances[p], now));
        if let Some(p) = pos
            && s.instances[p].stop_requested_ms.is_none()
        {
            s.instances[p].stop_requested_ms = Some(now);
        }
        s.events.push(ComputeEvent::Stopped {
            before,
            instance_id: id.clone(),
            reason: reason.to_owned(),
            at_ms: now,
        });
        Ok(())
    }

    async fn start_pool_member(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<PoolMember, PortError> {
        let now = self.clock.now_ms();
        check_deadline(DEP, "start_pool_member", now / 1000, not_after)?;
        let mut s = self.state();
        pool_call(&mut s, "dynamodb.PutItem", 1);
        pool_call(&mut s, "ecs.RunTask", 1);
        self.request(&mut s, "RunTask", now)?;
        pool_call(&mut s, "dynamodb.TransactWriteItems", 1);
        s.next += 1;
        let id = InstanceId::new(format!("twin-pool-{}-t", s.next));
        let t = s.pool_timing;
        let start_secs = if t.start_secs_max > t.start_secs_min {
            t.start_secs_min + s.rng.below(t.start_secs_max - t.start_secs_min + 1)
        } else {
            t.start_secs_min
        };
        s.pool.push(TwinPoolMember {
            instance_id: id.clone(),
            deployment: deployment.clone(),
            created_ms: now,
            running_at_ms: now + start_secs * 1_000,
            state: MemberState::Idle,
            claims: vec![],
            recycled_ms: None,
        });
        Ok(PoolMember {
            instance_id: id,
            created_at: now / 1000,
        })
    }

    async fn list_pool(&self, deployment: &DeploymentId) -> Result<Vec<PoolMember>, PortError> {
        let mut s = self.state();
        let idle: Vec<PoolMember> = s
            .pool
            .iter()
            .filter(|m| &m.deployment == deployment && m.state == MemberState::Idle)
            .map(|m| PoolMember {
                instance_id: m.instance_id.clone(),
                created_at: m.created_ms / 1000,
            })
            .collect();
        pool_call(&mut s, "dynamodb.Query", 1);
        pool_call(&mut s, "ecs.DescribeTasks", pages(idle.len()));
        Ok(idle)
    }

    /// Under the twin's mutex: idle → recycled, then the stop (→ stopped); a member claimed
    /// since is left alone. [`PoolTiming::recycle_stop_fail_per_mille`] of them stop short
    /// of the stop (a transient error; the member runs on, recycled, until
    /// [`Compute::reconcile_pool`]).
    async fn recycle_pool_member(
        &self,
        id: &InstanceId,
        not_after: u64,
    ) -> Result<bool, PortError> {
        let now = self.clock.now_ms();
        check_deadline(DEP, "recycle_pool_member", now / 1000, not_after)?;
        {
            let mut s = self.state();
            let fail = s.pool_timing.recycle_stop_fail_per_mille;
            let Some(m) = s
                .pool
                .iter_mut()
                .find(|m| &m.instance_id == id && m.state == MemberState::Idle)
            else {
                let claimed = s
                    .pool
                    .iter()
                    .any(|m| &m.instance_id == id && m.state == MemberState::Claimed);
                s.answers.recycles_lost_to_claims += u64::from(claimed);
                pool_call(&mut s, "dynamodb.UpdateItem", 1);
                return Ok(false);
            };
            m.state = MemberState::Recycled;
            m.recycled_ms = Some(now);
            pool_call(&mut s, "dynamodb.UpdateItem", 1);
            if fail > 0 && s.rng.below(1_000) < fail {
                return Err(PortError::transient(
                    DEP,
                    "recycle_pool_member",
                    format!("member {id} recycled, its StopTask not sent"),
                ));
            }
        }
        pool_call(&mut self.state(), "ecs.StopTask", 1);
        self.stop(id, sandbox_controller::pool::RECYCLE_REASON, not_after)
            .await?;
        Ok(true)
    }

    /// Under the twin's mutex: the pick (the oldest idle member young enough) and the
    /// write (idle → claimed) are one step, so two claims never get one member.
    async fn claim_pool_member(
        &self,
        spec: &StartSpec,
        deployment: &DeploymentId,
        created_after: u64,
        not_after: u64,
    ) -> Result<Option<Started>, PortError> {
        let now = self.clock.now_ms();
        check_deadline(DEP, "claim_pool_member", now / 1000, not_after)?;
        let mut s = self.state();
        self.check_start(spec, deployment)?;
        let key = (deployment.clone(), spec.idempotency_token.clone());
        // Strict, as on AWS: the pool knows the tokens of its own claims only (ECS keeps a
        // cold start's `clientToken` to itself), so a token that started cold is no replay.
        if let Some(&p) = s.by_claim_token.get(&key) {
            s.answers.replays += 1;
            return Ok(Some(Started::Instance(self.view(&s.instances[p], now))));
        }
        let Some(m) = s.pool.iter_mut().find(|m| {
            &m.deployment == deployment
                && m.state == MemberState::Idle
                && m.created_ms / 1000 > created_after
        }) else {
            return Ok(None);
        };
        m.state = MemberState::Claimed;
        m.claims.push(spec.environment_id.clone());
        let provisioning = now < m.running_at_ms;
        let instance = Instance {
            id: m.instance_id.clone(),
            deployment: deployment.clone(),
            spec: spec.clone(),
            // Started when the member was (running from its own start time on), and
            // visible at once.
            created_ms: m.created_ms,
            visible_at_ms: now,
            fails_at_ms: None,
            stop_requested_ms: None,
            died_ms: None,
            running_at_ms: Some(m.running_at_ms),
        };
        s.answers.claims_provisioning += u64::from(provisioning);
        Ok(Some(self.launch(&mut s, instance, key, now, true)))
    }

    /// Stops every recycled member still running (its recycle's stop did not go out,
    /// [`PoolTiming::recycle_stop_fail_per_mille`]). The twin's other bookkeeping cannot
    /// be lost: a member's start and its record are one step here.
    async fn reconcile_pool(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<usize, PortError> {
        let now = self.clock.now_ms();
        check_deadline(DEP, "reconcile_pool", now / 1000, not_after)?;
        let recycled: Vec<InstanceId> = {
            let mut s = self.state();
            let mine = |m: &&TwinPoolMember| &m.deployment == deployment;
            let partition = s
                .pool
                .iter()
                .filter(mine)
                .filter(|m| matches!(m.state, MemberState::Idle | MemberState::Recycled))
                .count();
            let recycled: Vec<InstanceId> = s
                .pool
                .iter()
                .filter(mine)
                .filter(|m| m.state == MemberState::Recycled)
                .map(|m| m.instance_id.clone())
                .collect();
            let claimed_live = s
                .pool
                .iter()
                .filter(mine)
                .filter(|m| m.state == MemberState::Claimed)
                .any(|m| {
                    s.by_id.get(&m.instance_id).is_some_and(|&p| {
                        s.instances[p].stop_requested_ms.is_none()
                            && s.instances[p].died_ms.is_none()
                    })
                });
            pool_call(&mut s, "dynamodb.Query", 1);
            pool_call(&mut s, "ecs.DescribeTasks", pages(partition));
            pool_call(&mut s, "ecs.StopTask", recycled.len() as u64);
            pool_call(&mut s, "dynamodb.UpdateItem", recycled.len() as u64);
            pool_call(&mut s, "dynamodb.GetItem", 1);
            pool_call(&mut s, "ecs.ListTasks", 1);
            pool_call(&mut s, "dynamodb.PutItem", 1);
            pool_call(&mut s, "dynamodb.BatchGetItem", u64::from(claimed_live));
            recycled
        };
        for id in &recycled {
            self.stop(id, sandbox_controller::pool::RECYCLE_REASON, not_after)
                .await?;
        }
        Ok(recycled.len())
    }

    /// Always granted (the twin serves one process); counted as the adapter's
    /// `dynamodb.UpdateItem` ([`PoolCalls`]).
    async fn take_pool_refill_lease(
        &self,
        _deployment: &DeploymentId,
        _holder: &str,
        _now: u64,
        _lease_secs: u64,
    ) -> Result<bool, PortError> {
        pool_call(&mut self.state(), "dynamodb.UpdateItem", 1);
        Ok(true)
    }
}
