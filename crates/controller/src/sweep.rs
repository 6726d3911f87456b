//! The sweeper: level-triggered reconciliation of the registry against the provider's
//! inventory and the sessions (docs/ARCHITECTURE.md principle 5).
//!
//! A sweep reads once and decides per environment ([`Controller::plan_sweep`]):
//! 1. every record that is not closed ([`Registry::list_open`]: DynamoDB's sparse
//!    `by_open` index, never the closed records or the history);
//! 2. the live compute of this deployment, once ([`Compute::list`]: ECS `ListTasks` with
//!    `startedBy` as the only filter, every page, then `DescribeTasks` per 100 ARNs);
//! 3. the computes records name that the list did not show, by id
//!    ([`Compute::describe_many`]: stopped ones, `MISSING` ones, and list lag);
//! 4. one [`Trigger::Sweep`] job per environment that has an open record or a live compute,
//!    carrying that environment's share of the read ([`SweptEvidence`]).
//!
//! So a sweep of N environments costs at most ⌈N/100⌉ `ListTasks` pages and 2 × ⌈N/100⌉
//! `DescribeTasks` calls, plus the calls of the effects it takes; a job decides on the
//! evidence while it is current and makes no provider call of its own (principle 7: one
//! inventory per sweep, shared by the per-environment decisions). Each job then goes
//! through the same worker path as any other (same lock, same decision), so orphans, stale
//! records, overdue shutdown leases, failed or deleted sessions with live compute and
//! half-done cleanups all heal (lifecycle-cases.md rows 26, 27).
//!
//! Settled records — stopped, or active with no compute, no failed start, no lease and no
//! cleanup, with nothing live for them — are swept once per
//! [`ControllerConfig::settled_resweep_secs`](crate::ControllerConfig) (a stable hash of
//! the environment id picks the sweep), not on every run; closed ones are not read at all
//! and never swept again unless a live compute of theirs shows up (its job then reads
//! the closed record under the lock).
//!
//! With the executor cap on ([`sandbox_core::observed::Policy::max_executors`]) the sweep
//! also reads the slots once ([`Registry::slots`], linear in the holders) and repairs what
//! a crash left: an environment holding a slot without live compute gets its sweep job
//! (settled or not), whose decision gives the slot back under the lock; a holder with no
//! record at all, older than the lock's lease, is given back under its environment's lock
//! once [`Compute::find`] shows nothing live ([`Controller::release_orphan_slots`]). A
//! counter that disagrees with the holders (changed outside the controller) is logged.
//!
//! [`Controller::sweep`] processes the jobs in place (local mode's `sweep now`, tests);
//! [`Controller::sweep_fan_out`] sends them to the sweep queue
//! ([`Controller::with_sweep_queue`]: a standard queue of their own, consumed with its own
//! concurrency, so a recheck due on the timers queue never waits behind a sweep's
//! thousands of jobs: a standard queue promises no order, SQS Developer Guide, "Amazon SQS
//! standard queues"), 10 per
//! [`Queue::send_batch`] call, spread over time but always within the sweep interval
//! ([`fan_out_delay`]), so no single invocation's duration grows with the deployment and
//! sweeps never overlap (the sweeper Lambda). Workspace cleanup runs after the jobs, at
//! most [`ControllerConfig::sweep_workspace_deletions_max`](crate::ControllerConfig)
//! deletions per sweep.

use crate::job::{Job, SweptEvidence};
use crate::ports::{
    Compute, Outgoing, PortError, Queue, Registry, SEND_BATCH_MAX, StoredKind, StoredWorkspace,
};
use crate::worker::{Controller, Disposition};
use sandbox_agents_api::SessionsApi;
use sandbox_core::compute::ComputeInstance;
use sandbox_core::ids::{EnvironmentId, InstanceId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::record::{Record, RecordStatus};
use std::collections::{BTreeMap, HashMap, HashSet};

/// What one sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Environments examined (one job each).
    pub environments: usize,
    /// Count of decisions per outcome name (`release`, `schedule-stop`, ...); empty for a
    /// fanned-out sweep (its jobs decide later, on the workers).
    pub outcomes: BTreeMap<String, usize>,
    /// Environments left for a later run (busy lock, missing evidence, failed effect).
    pub deferred: usize,
    /// Jobs sent to the sweep queue by a fanned-out sweep.
    pub enqueued: usize,
    /// Settled records not swept this time (their turn comes once per
    /// `settled_resweep_secs`).
    pub settled_skipped: usize,
    /// Stored workspaces deleted by this sweep: expired snapshots (a close's retention
    /// passed), snapshots and working copies no record keeps ([`Controller::sweep_workspaces`]).
    pub workspaces_deleted: usize,
    /// Calls to the sweep queue by a fanned-out sweep ([`Queue::send_batch`], up to 10
    /// jobs each).
    pub queue_calls: usize,
}

/// The jobs one sweep decided to run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepPlan {
    /// One [`Trigger::Sweep`] job per environment, with its evidence.
    pub jobs: Vec<Job>,
    /// Settled records left out this time.
    pub settled_skipped: usize,
    /// The records the plan read: the open ones (the workspace sweep reuses them).
    pub records: Vec<Record>,
    /// Environments holding an executor slot with no record and no live compute, for
    /// longer than the lock's lease (a worker crashed between taking the
    /// slot and recording anything); [`Controller::release_orphan_slots`] gives them back.
    pub orphan_slots: Vec<EnvironmentId>,
}

/// Whether the record needs nothing unless its session changes: stopped, or active with
/// no compute and no failed start; no lease, no cleanup.
fn settled(r: &Record) -> bool {
    let quiet = r.lease.is_none() && !r.cleanup_required;
    let idle = match r.status {
        RecordStatus::Stopped | RecordStatus::Closed => true,
        RecordStatus::Active => r.instance.is_none() && r.start_failure.is_none(),
    };
    quiet && idle
}

/// FNV-1a: a hash that is stable across builds and platforms (unlike `std`'s), so a
/// settled environment's sweep slot does not move between Lambda versions.
fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Whether the sweep at `now` is the settled environment's turn: one sweep in every
/// `every_secs / interval_secs`, chosen by the environment id's hash.
fn settled_turn(env: &EnvironmentId, now: u64, interval_secs: u64, every_secs: u64) -> bool {
    let slots = (every_secs / interval_secs.max(1)).max(1);
    stable_hash(env.as_str()) % slots == (now / interval_secs.max(1)) % slots
}

/// The delay of job `i` of a fanned-out sweep of `jobs` jobs, seconds:
/// `i / jobs_per_sec` while the whole sweep fits the window, else the jobs spread evenly
/// over it (`i × window / jobs`). The window is the sweep interval, at most SQS's 900 s
/// delay limit, so every delay is below the interval: the next sweep never starts while
/// this one's jobs are still waiting, and the Agents API read rate stays at most
/// `jobs_per_sec` unless the deployment outgrows it (then it is `jobs / window`).
pub fn fan_out_delay(i: usize, jobs: usize, jobs_per_sec: u32, interval_secs: u64) -> u32 {
    let window = interval_secs.clamp(1, 900);
    let rate = u64::from(jobs_per_sec.max(1));
    let (i, jobs) = (i as u64, jobs as u64);
    let delay = if jobs.div_ceil(rate) <= window {
        i / rate
    } else {
        i.saturating_mul(window) / jobs.max(1)
    };
    u32::try_from(delay.min(window - 1)).unwrap_or(0)
}

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// Reads the registry and the provider once and plans one sweep job per environment
    /// (see the module docs for the reads and their cost).
    ///
    /// # Errors
    /// A [`PortError`] when the registry or the provider cannot be read: a sweep never
    /// acts on a partial inventory.
    pub async fn plan_sweep(&self) -> Result<SweepPlan, PortError> {
        let now = self.clock.now();
        let records = self.registry.list_open().await?;
        crate::metrics::held_environments(
            records
                .iter()
                .filter(|r| r.open_evidence().next().is_some())
                .count(),
        );
        let live = self.compute.list(&self.config.deployment).await?;
        let listed: HashSet<&InstanceId> = live.iter().map(|i| &i.instance_id).collect();
        let unlisted: Vec<InstanceId> = records
            .iter()
            .filter(|r| r.claims_compute() || r.lease.is_some())
            .flat_map(|r| {
                r.current()
                    .into_iter()
                    .chain(r.lease.as_ref().map(|l| &l.target))
            })
            .map(|i| i.instance_id.clone())
            .filter(|id| !listed.contains(id))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let described = if unlisted.is_empty() {
            vec![]
        } else {
            self.compute.describe_many(&unlisted).await?
        };
        // Hash maps and sets for the per-environment lookups (one each per record): the
        // sweep's own work stays linear in what is live (a tree map's
        // string comparisons made it grow ×2 faster than N from 100 to 10,000).
        let mut by_env: HashMap<EnvironmentId, Vec<ComputeInstance>> = HashMap::new();
        for i in live.into_iter().chain(described) {
            by_env.entry(i.environment_id.clone()).or_default().push(i);
        }
        let has_live = |env: &EnvironmentId| {
            by_env
                .get(env)
                .is_some_and(|all| all.iter().any(|i| i.status.is_live()))
        };
        let job = |env: &EnvironmentId, session: SessionId, record: Option<&Record>| Job {
            handoffs: 0,
            trigger: Trigger::Sweep,
            session_id: session,
            environment_id: Some(env.clone()),
            webhook_id: None,
            enqueued_at: now,
            swept: Some(SweptEvidence {
                read_at: now,
                record_version: record.map(|r| r.version),
                instances: by_env.get(env).cloned().unwrap_or_default(),
            }),
            operator_proof: None,
        };
        let mut plan = SweepPlan::default();
        let mut recorded: HashSet<&EnvironmentId> = HashSet::new();
        for r in &records {
            recorded.insert(&r.environment_id);
            let env = &r.environment_id;
            if !has_live(env) && settled(r) {
                let closed = r.status == RecordStatus::Closed;
                let resweep = self.config.settled_resweep_secs;
                if closed
                    || (resweep > 0
                        && !settled_turn(env, now, self.config.sweep_interval_secs, resweep))
                {
                    plan.settled_skipped += usize::from(!closed);
                    continue;
                }
            }
            plan.jobs.push(job(env, r.session_id.clone(), Some(r)));
        }
        // Compute no open record names, in environment order (a deterministic plan).
        let mut unrecorded: Vec<(&EnvironmentId, &Vec<ComputeInstance>)> = by_env
            .iter()
            .filter(|(env, _)| !recorded.contains(env))
            .collect();
        unrecorded.sort_unstable_by_key(|(env, _)| *env);
        for (env, instances) in unrecorded {
            let Some(live) = instances.iter().find(|i| i.status.is_live()) else {
                continue;
            };
            match live.session_id.clone() {
                Some(session) => plan.jobs.push(job(env, session, None)),
                None => {
                    tracing::warn!(instance_id = %live.instance_id, "live compute without a session tag")
                }
            }
        }
        if self.config.policy.max_executors > 0 {
            self.plan_slot_repairs(&mut plan, &records, &has_live, &job, now)
                .await?;
        }
        plan.records = records;
        Ok(plan)
    }

    /// The slots' share of a sweep plan (see the module docs).
    async fn plan_slot_repairs(
        &self,
        plan: &mut SweepPlan,
        records: &[Record],
        has_live: &(dyn Fn(&EnvironmentId) -> bool + Sync),
        job: &(dyn Fn(&EnvironmentId, SessionId, Option<&Record>) -> Job + Sync),
        now: u64,
    ) -> Result<(), PortError> {
        let slots = self.registry.slots().await?;
        crate::metrics::executor_slots(slots.in_use);
        if slots.in_use != slots.holders.len() as u64 {
            tracing::warn!(
                in_use = slots.in_use,
                holders = slots.holders.len(),
                "executor slot counter disagrees with its holders (changed outside the controller?)"
            );
        }
        let planned: HashSet<EnvironmentId> = plan
            .jobs
            .iter()
            .filter_map(|j| j.environment_id.clone())
            .collect();
        let by_env: HashMap<&EnvironmentId, &Record> =
            records.iter().map(|r| (&r.environment_id, r)).collect();
        for h in &slots.holders {
            let env = &h.environment_id;
            if planned.contains(env) || has_live(env) {
                continue;
            }
            // The sweep read the open records only: a holder without one may hold a closed
            // record (one point read; holders are at most the cap).
            let closed = match by_env.get(env) {
                Some(_) => None,
                None => self.registry.get(&env.effect_key()).await?,
            };
            match by_env.get(env).copied().or(closed.as_ref()) {
                Some(r) => plan.jobs.push(job(env, r.session_id.clone(), Some(r))),
                None if now > h.acquired_at.saturating_add(self.config.lock_ttl_secs) => {
                    plan.orphan_slots.push(env.clone());
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Gives back the slots of [`SweepPlan::orphan_slots`], each under its environment's
    /// lock, only when the lock reads no record and [`Compute::find`] shows nothing live
    /// for the environment (one lock, one find, one slot release, one lock release each).
    /// Returns how many were given back; failures are logged (the next sweep retries).
    pub async fn release_orphan_slots(&self, plan: &SweepPlan) -> usize {
        let mut given_back = 0;
        for env in &plan.orphan_slots {
            let now = self.clock.now();
            let fence = crate::ports::Fence {
                key: env.effect_key(),
                owner: format!("{}#sweep-slot-{now}", self.config.worker_id),
            };
            let locked = match self
                .registry
                .lock(
                    &fence.key,
                    &fence.owner,
                    now + self.config.lock_ttl_secs,
                    now,
                )
                .await
            {
                Ok(Some(locked)) => locked,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(environment_id = %env, error = %e, "orphan slot: lock failed");
                    continue;
                }
            };
            let free = locked.record.is_none()
                && matches!(
                    self.compute.find(&self.config.deployment, env).await,
                    Ok(found) if !found.iter().any(|i| i.status.is_live())
                );
            if free {
                match self.registry.release_slot(&fence, self.clock.now()).await {
                    Ok(crate::ports::SlotRelease::Released) => {
                        tracing::info!(environment_id = %env, "orphan executor slot given back");
                        given_back += 1;
                    }
                    Ok(other) => {
                        tracing::debug!(environment_id = %env, result = ?other, "orphan slot not released")
                    }
                    Err(e) => {
                        tracing::warn!(environment_id = %env, error = %e, "orphan slot release failed")
                    }
                }
            }
            let release = crate::ports::Release {
                // An unclean predecessor stays visible to the next holder.
                clean: !locked.recovered,
                ..crate::ports::Release::default()
            };
            if let Err(e) = self
                .registry
                .release(&fence, self.clock.now(), release)
                .await
            {
                tracing::warn!(environment_id = %env, error = %e, "orphan slot: lock release failed (it expires)");
            }
        }
        given_back
    }

    /// Runs one sweep in place: plans it, then processes every job through the worker path.
    ///
    /// # Errors
    /// As [`Controller::plan_sweep`].
    pub async fn sweep(&self) -> Result<SweepReport, PortError> {
        let plan = self.plan_sweep().await?;
        let mut report = SweepReport {
            environments: plan.jobs.len(),
            settled_skipped: plan.settled_skipped,
            ..SweepReport::default()
        };
        self.release_orphan_slots(&plan).await;
        for job in &plan.jobs {
            match self.process(job).await {
                Ok(p) => {
                    if let Some(outcome) = p.outcome() {
                        *report.outcomes.entry(outcome.to_string()).or_default() += 1;
                    }
                    if p.disposition != Disposition::Done {
                        report.deferred += 1;
                    }
                }
                Err(e) => {
                    tracing::warn!(environment_id = ?job.environment_id, error = %e, "sweep deferred");
                    report.deferred += 1;
                }
            }
        }
        report.workspaces_deleted = self.sweep_workspaces(&plan.records).await;
        Ok(report)
    }

    /// Gives the sweep's jobs a queue of their own (standard, delays up to 900 s): a
    /// fanned-out sweep sends there instead of to the timers queue, and the worker consumes
    /// it with its own concurrency (the `SWEEP_QUEUE_URL` setting; local mode's `sweep`
    /// queue). Without it the jobs share the timers queue, where at 10,000 environments
    /// due rechecks wait behind them (`sandbox-bench recheck-delay`).
    #[must_use]
    pub fn with_sweep_queue(mut self, sweep: Q) -> Self {
        self.sweep = Some(sweep);
        self
    }

    /// The queue a fanned-out sweep's jobs go to: the sweep queue, or the timers queue
    /// when none was given ([`Controller::with_sweep_queue`]).
    pub fn sweep_queue(&self) -> &Q {
        self.sweep.as_ref().unwrap_or(&self.timers)
    }

    /// Runs one sweep by fanning out: plans it, then sends every job to the sweep queue
    /// ([`Controller::sweep_queue`]) in batches of [`SEND_BATCH_MAX`] ([`Queue::send_batch`]: one `SendMessageBatch`
    /// per 10 jobs), job `i` delayed by [`fan_out_delay`] (within the sweep interval), so
    /// the workers decide in parallel and the sweep's Agents API reads are spread out.
    /// Then the workspace cleanup, bounded per run. A job that could not be sent (a failed
    /// call or a failed entry of a batch) is counted as deferred: the next sweep plans it
    /// again.
    ///
    /// # Errors
    /// As [`Controller::plan_sweep`].
    pub async fn sweep_fan_out(&self) -> Result<SweepReport, PortError> {
        let plan = self.plan_sweep().await?;
        let mut report = SweepReport {
            environments: plan.jobs.len(),
            settled_skipped: plan.settled_skipped,
            ..SweepReport::default()
        };
        self.release_orphan_slots(&plan).await;
        let total = plan.jobs.len();
        let messages: Vec<Outgoing> = plan
            .jobs
            .into_iter()
            .enumerate()
            .map(|(i, job)| {
                let key = job
                    .environment_id
                    .as_ref()
                    .map(|e| e.effect_key().to_string())
                    .unwrap_or_default();
                Outgoing {
                    group: job.group().to_owned(),
                    dedup_id: format!("sweep:{key}:{}", job.enqueued_at),
                    delay_secs: fan_out_delay(
                        i,
                        total,
                        self.config.sweep_jobs_per_sec,
                        self.config.sweep_interval_secs,
                    ),
                    job,
                }
            })
            .collect();
        let mut messages = messages.into_iter().peekable();
        while messages.peek().is_some() {
            let batch: Vec<Outgoing> = messages.by_ref().take(SEND_BATCH_MAX).collect();
            let keys: Vec<String> = batch.iter().map(|m| m.dedup_id.clone()).collect();
            report.queue_calls += 1;
            for (result, key) in self
                .sweep_queue()
                .send_batch(batch)
                .await
                .into_iter()
                .zip(keys)
            {
                match result {
                    Ok(_) => report.enqueued += 1,
                    Err(e) => {
                        tracing::warn!(job = %key, error = %e, "sweep job not sent; the next sweep plans it again");
                        report.deferred += 1;
                    }
                }
            }
        }
        report.workspaces_deleted = self.sweep_workspaces(&plan.records).await;
        Ok(report)
    }
}

/// Whether the sweeper deletes stored workspace `w` (module docs of
/// [`Controller::sweep_workspaces`]), given its environment's record.
fn expendable(w: &StoredWorkspace, record: Option<&Record>, now: u64, grace_secs: u64) -> bool {
    if w.in_use {
        return false;
    }
    let old = now.saturating_sub(w.created_at) >= grace_secs;
    match w.kind {
        StoredKind::Snapshot => {
            let kept = record.and_then(|r| r.snapshots.iter().find(|s| s.snapshot_id == w.id));
            // A snapshot newer than the latest an open record names may be the
            // only copy of a generation whose save was never recorded (a release that
            // failed); the next save of that generation records it.
            let unrecorded_newer = record.is_some_and(|r| {
                r.status != RecordStatus::Closed
                    && r.latest_snapshot()
                        .is_none_or(|s| s.generation < w.generation)
            });
            match kept {
                Some(s) => s.expires_at.is_some_and(|at| at <= now),
                None => old && !unrecorded_newer,
            }
        }
        StoredKind::Volume => {
            let unsaved = record.is_some_and(|r| {
                r.status != RecordStatus::Closed
                    && r.latest_snapshot()
                        .is_none_or(|s| s.generation < w.generation)
            });
            !unsaved && old
        }
    }
}

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// Deletes the stored workspaces of this deployment nobody needs, from one
    /// [`crate::ports::Workspaces::list_stored`] (linear in what is stored) against the
    /// `records` the sweep read:
    /// - a snapshot in a record's chain whose `expires_at` passed (a close retained it for
    ///   [`sandbox_core::workspace::CloseWorkspace::Retain`] days);
    /// - a snapshot no record's chain names (a worker that crashed before recording it, a
    ///   record that is gone), older than `Policy::visibility_window_secs` (a snapshot just
    ///   taken is recorded when its worker releases the lock), and never one of a newer
    ///   generation than the latest snapshot an open record names (it may be the
    ///   only copy of that generation's files; the next save of it records it);
    /// - a working copy (EBS volume, local directory) not in use whose environment has no
    ///   record, a closed one, or a snapshot of that generation or a later one, older than
    ///   the same window. A stopped generation not saved yet is kept: the next start or
    ///   the close saves it. The adapter keeps a working copy none of whose snapshots is
    ///   `completed` ([`crate::ports::Workspaces::delete_stored`]).
    ///
    /// `records` are the open ones the sweep read: a workspace of an environment without
    /// an open record is only deleted after a point read ([`Registry::get`]) of its
    /// record, which may be closed and retain a snapshot (or be open and missing from the
    /// index for a moment). At most
    /// [`ControllerConfig::sweep_workspace_deletions_max`](crate::ControllerConfig)
    /// deletions and ten times as many such reads per sweep; the walk starts at a
    /// different place each sweep, so what is left is reached by a later one.
    ///
    /// Returns how many were deleted; failures are logged and left for the next sweep.
    pub async fn sweep_workspaces(&self, records: &[Record]) -> usize {
        let now = self.clock.now();
        let stored = match self.compute.list_stored(&self.config.deployment).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "stored workspaces unavailable: none deleted this sweep");
                return 0;
            }
        };
        let by_env: HashMap<&EnvironmentId, &Record> =
            records.iter().map(|r| (&r.environment_id, r)).collect();
        let grace = self.config.policy.visibility_window_secs;
        let max = self.config.sweep_workspace_deletions_max;
        let mut reads_left = max.saturating_mul(10);
        let mut closed: HashMap<EnvironmentId, Option<Record>> = HashMap::new();
        let mut deleted = 0;
        let start = if stored.is_empty() {
            0
        } else {
            usize::try_from(now / self.config.sweep_interval_secs.max(1))
                .unwrap_or(0)
                .wrapping_mul(max.max(1))
                % stored.len()
        };
        for w in stored[start..].iter().chain(&stored[..start]) {
            if deleted >= max {
                tracing::info!(
                    max,
                    "workspace cleanup bound reached; the next sweep goes on"
                );
                break;
            }
            let mut record = by_env.get(&w.environment_id).copied();
            if !expendable(w, record, now, grace) {
                continue;
            }
            if record.is_none() {
                if !closed.contains_key(&w.environment_id) {
                    if reads_left == 0 {
                        continue;
                    }
                    reads_left -= 1;
                    match self.registry.get(&w.environment_id.effect_key()).await {
                        Ok(r) => {
                            closed.insert(w.environment_id.clone(), r);
                        }
                        Err(e) => {
                            tracing::warn!(environment_id = %w.environment_id, error = %e, "record unreadable: its snapshot is kept this sweep");
                            continue;
                        }
                    }
                }
                record = closed.get(&w.environment_id).and_then(Option::as_ref);
                if !expendable(w, record, now, grace) {
                    continue;
                }
            }
            match self
                .compute
                .delete_stored(&self.config.deployment, w.kind, &w.id)
                .await
            {
                Ok(()) => {
                    tracing::info!(kind = ?w.kind, id = %w.id, environment_id = %w.environment_id, generation = %w.generation, "stored workspace deleted by the sweep");
                    deleted += 1;
                }
                Err(e) => {
                    tracing::warn!(kind = ?w.kind, id = %w.id, error = %e, "stored workspace not deleted; next sweep retries");
                }
            }
        }
        deleted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_settled_environment_gets_one_sweep_per_period() {
        let env = EnvironmentId::new("env_settled_1");
        let turns = (0..12u64)
            .filter(|k| settled_turn(&env, 1_800_000_000 + k * 300, 300, 3_600))
            .count();
        assert_eq!(turns, 1, "one of every twelve 5-minute sweeps");
        assert!(settled_turn(&env, 1_800_000_000, 300, 300), "every sweep");
    }

    #[test]
    fn fan_out_delays_stay_within_the_interval() {
        for jobs in [1, 10, 100, 6_000, 6_001, 10_000, 100_000] {
            let delays: Vec<u32> = (0..jobs).map(|i| fan_out_delay(i, jobs, 20, 300)).collect();
            assert!(delays.iter().all(|&d| d < 300), "{jobs} jobs");
            assert!(
                delays.windows(2).all(|w| w[0] <= w[1]),
                "{jobs} jobs in order"
            );
        }
        // Fits at 20 jobs/s: 100 jobs over 5 s.
        assert_eq!(fan_out_delay(99, 100, 20, 300), 4);
        // 10,000 jobs do not fit (500 s): spread over the 300 s interval.
        assert_eq!(fan_out_delay(9_999, 10_000, 20, 300), 299);
        assert_eq!(fan_out_delay(5_000, 10_000, 20, 300), 150);
        // The SQS delay limit caps a longer interval.
        assert!(fan_out_delay(99_999, 100_000, 20, 3_600) < 900);
    }

    #[test]
    fn stable_hash_is_fnv1a() {
        assert_eq!(stable_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stable_hash("a"), 0xaf63_dc4c_8601_ec8c);
    }
}
