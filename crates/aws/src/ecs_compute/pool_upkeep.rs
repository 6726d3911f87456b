//! The warm pool's upkeep on [`EcsCompute`] (the protocol is in [`crate::ecs_pool`]'s
//! docs): recycling and releasing a member, reconciling the pool from its table, and the
//! `ListTasks` backstop for orphans.

use super::{DEP, EcsCompute};
use crate::ecs_pool::{
    BACKSTOP_PAGE, ORPHAN_AGE_SECS, ORPHAN_REASON, Pool, STALE_REVISION_REASON, created_at,
    is_current_revision, is_live, is_pool_task, member_key_of, pool_started_by, task_id,
};
use crate::ecs_task::{TAG_DEPLOYMENT, TAG_ENVIRONMENT, tag_value};
use crate::pool_table::{LaunchItem, MemberState, PoolItem, member_pk};
use crate::sdk_error::port_error;
use aws_sdk_ecs::types::Task;
use sandbox_controller::pool::RECYCLE_REASON;
use sandbox_controller::ports::{PortError, check_deadline};
use sandbox_core::compute::ComputeStatus;
use sandbox_core::ids::{DeploymentId, InstanceId};
use std::collections::{HashMap, HashSet};

use super::pool::MemberRun;

impl EcsCompute {
    /// [`Compute::recycle_pool_member`](sandbox_controller::ports::Compute::recycle_pool_member):
    /// the member key from the configured task role id and the ARN's task id, the guarded
    /// `UpdateItem`, then `StopTask` ([`RECYCLE_REASON`]). Without the pool: a stop, as the
    /// trait's default.
    pub(crate) async fn pool_recycle(
        &self,
        id: &InstanceId,
        not_after: u64,
    ) -> Result<bool, PortError> {
        let op = "recycle_pool_member";
        let Some(pool) = self.pool.as_deref() else {
            self.stop_task(id.as_str(), RECYCLE_REASON, not_after, op)
                .await?;
            return Ok(true);
        };
        let now = self.clock.now();
        check_deadline(DEP, op, now, not_after)?;
        let task = task_id(id.as_str())
            .ok_or_else(|| PortError::permanent(DEP, op, format!("not a task ARN: {id}")))?;
        if !pool
            .table
            .recycle(&member_pk(&pool.config.task_role_id, task), now)
            .await?
        {
            return Ok(false);
        }
        self.stop_task(id.as_str(), RECYCLE_REASON, not_after, op)
            .await?;
        Ok(true)
    }

    /// After the `StopTask` of `id` by its environment: when `id` is a claimed member of
    /// this pool (its key from the configured task role id and the ARN's task id), its
    /// item gets its expiry ([`PoolTable::release`](crate::pool_table::PoolTable::release),
    /// one conditional `UpdateItem`; a cold task's fails its condition and writes
    /// nothing). Without the pool, or for an id that is not a task ARN: no call.
    ///
    /// # Errors
    /// The `UpdateItem`'s failure (the task is stopped; the stop is retried as a whole).
    pub(crate) async fn pool_release(&self, id: &InstanceId) -> Result<(), PortError> {
        let Some(pool) = self.pool.as_deref() else {
            return Ok(());
        };
        let Some(task) = task_id(id.as_str()) else {
            return Ok(());
        };
        if pool
            .table
            .release(
                &member_pk(&pool.config.task_role_id, task),
                self.clock.now(),
            )
            .await?
        {
            tracing::info!(task = %id, "claimed pool member stopped: its item now expires with the history retention");
        }
        Ok(())
    }

    /// [`Compute::reconcile_pool`](sandbox_controller::ports::Compute::reconcile_pool) (see
    /// [`crate::ecs_pool`]): from the refill's partition of the pool table, then one page of
    /// the [`Self::pool_backstop`]. Its calls do not depend on how many members were
    /// claimed: `Query` `by_pool` (launches, idle and recycled members only),
    /// `DescribeTasks` of its members (≤ 100 each), one backstop page, and a call per item
    /// repaired or ended. Returns how many were repaired (a launch's `RunTask` replayed and
    /// recorded) or ended (a member or an orphan stopped, an item of a task that is gone
    /// deleted). Without the pool: nothing.
    pub(crate) async fn pool_reconcile(
        &self,
        deployment: &DeploymentId,
        not_after: u64,
    ) -> Result<usize, PortError> {
        let op = "reconcile_pool";
        let Some(pool) = self.pool.as_deref() else {
            return Ok(0);
        };
        let now = self.clock.now();
        check_deadline(DEP, op, now, not_after)?;
        let items = pool.table.pool_items(deployment, now).await?;
        let mut done = 0;
        let mut members = Vec::new();
        for item in items {
            match item {
                PoolItem::Launch(launch) => {
                    done += usize::from(
                        self.replay_launch(pool, deployment, &launch, now, not_after)
                            .await?,
                    );
                }
                PoolItem::Member(member) => members.push(member),
            }
        }
        let arns: Vec<String> = members.iter().map(|m| m.task_arn.clone()).collect();
        let tasks = if arns.is_empty() {
            HashMap::new()
        } else {
            self.describe_pool(&arns, op).await?
        };
        for member in &members {
            let task = tasks.get(&member.task_arn);
            let gone = match task {
                Some(t) => {
                    ComputeStatus::from_ecs_last_status(t.last_status().unwrap_or(""))
                        == ComputeStatus::Stopped
                }
                None => member.created_at.saturating_add(ORPHAN_AGE_SECS) < now,
            };
            let live = task.is_some_and(is_live);
            match member.state {
                MemberState::Recycled if live => {
                    tracing::info!(task = %member.task_arn, "recycled pool member still live: stopped");
                    self.stop_task(&member.task_arn, RECYCLE_REASON, not_after, op)
                        .await?;
                    pool.table.forget_recycled(&member.pk).await?;
                    done += 1;
                }
                // Stopped, being stopped, or long unknown to ECS: its stop is confirmed.
                MemberState::Recycled if gone || task.is_some() => {
                    pool.table.forget_recycled(&member.pk).await?;
                }
                MemberState::Idle if gone => {
                    check_deadline(DEP, op, self.clock.now(), not_after)?;
                    if pool.table.delete_idle(&member.pk).await? {
                        tracing::info!(task = %member.task_arn, member = %member.pk,
                            "idle pool item whose task is gone: deleted");
                        done += 1;
                    }
                }
                MemberState::Idle
                    if live
                        && !is_current_revision(
                            &self.config().task_definition,
                            task.and_then(Task::task_definition_arn),
                        ) =>
                {
                    check_deadline(DEP, op, self.clock.now(), not_after)?;
                    if pool.table.recycle(&member.pk, now).await? {
                        tracing::info!(task = %member.task_arn,
                            task_definition = task.and_then(Task::task_definition_arn),
                            "idle pool member of an older task definition revision: recycled");
                        self.stop_task(&member.task_arn, STALE_REVISION_REASON, not_after, op)
                            .await?;
                        pool.table.forget_recycled(&member.pk).await?;
                        done += 1;
                    }
                }
                // Uncertain (not visible yet, being stopped) or fine: the next refill looks
                // again.
                _ => {}
            }
        }
        let known: HashSet<&str> = members.iter().map(|m| m.task_arn.as_str()).collect();
        done += self
            .pool_backstop(pool, deployment, &known, now, not_after)
            .await?;
        Ok(done)
    }

    /// A launch the reconcile found unrecorded (a worker died or was cut off between its
    /// `PutItem` and the member's record): older than the maximum age, it is dropped (a
    /// member it started would be past its age; such a task, live without an item, is the
    /// backstop's orphan); otherwise its `RunTask` is sent again with the same
    /// `clientToken` — ECS returns the task the token started (24 h), or starts it if the
    /// first never arrived — and recorded. A refused `RunTask` drops the launch. `true`
    /// when a member was recorded.
    async fn replay_launch(
        &self,
        pool: &Pool,
        deployment: &DeploymentId,
        launch: &LaunchItem,
        now: u64,
        not_after: u64,
    ) -> Result<bool, PortError> {
        let op = "reconcile_pool";
        if now.saturating_sub(launch.created_at) > pool.config.max_age_secs {
            tracing::warn!(launch = %launch.pk, "pool launch older than the maximum age, never recorded: dropped");
            pool.table.delete_launch(&launch.pk).await?;
            return Ok(false);
        }
        check_deadline(DEP, op, self.clock.now(), not_after)?;
        match self
            .run_member(pool, deployment, &launch.client_token, op)
            .await
        {
            Ok(MemberRun::Task(arn)) => {
                self.record_run(pool, deployment, &arn, launch, op).await?;
                tracing::info!(task = %arn, launch = %launch.pk,
                    "pool launch replayed by its clientToken and recorded");
                Ok(true)
            }
            Ok(MemberRun::Refused(why)) => {
                tracing::warn!(launch = %launch.pk, why, "pool launch replay started no task: dropped");
                pool.table.delete_launch(&launch.pk).await?;
                Ok(false)
            }
            Err(e) if !e.retryable => {
                tracing::warn!(launch = %launch.pk, error = %e, "pool launch replay refused: dropped");
                pool.table.delete_launch(&launch.pk).await?;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// The backstop for pool tasks no item names (a launch dropped while its task ran, an
    /// item lost): one `ListTasks` page of at most [`BACKSTOP_PAGE`] ARNs by the pool's
    /// `startedBy` per reconcile, from the cursor kept in the pool table (`GetItem`, then
    /// `PutItem` of the page's `nextToken`; an answer refusing the cursor starts over), so
    /// the whole listing — claimed members keep the pool's `startedBy` — is walked one page
    /// a refill, never all at once. Of the page, the tasks not in the refill's partition
    /// (`known`) are looked up by member key (`BatchGetItem`: a claimed member has its
    /// item); only those without an item are described (`DescribeTasks`), and a live one of
    /// this deployment without a `sandbox:environment` tag (a task with an environment is
    /// only the sweep's), keyed with the configured task role and older than
    /// [`ORPHAN_AGE_SECS`] is stopped ([`ORPHAN_REASON`]).
    async fn pool_backstop(
        &self,
        pool: &Pool,
        deployment: &DeploymentId,
        known: &HashSet<&str>,
        now: u64,
        not_after: u64,
    ) -> Result<usize, PortError> {
        let op = "reconcile_pool";
        let started_by = pool_started_by(deployment);
        let cursor = pool.table.backstop_cursor(deployment, now).await?;
        let (arns, next) = match self.list_page(&started_by, cursor.as_deref(), op).await {
            Ok(page) => page,
            Err(e) if cursor.is_some() && !e.retryable => {
                tracing::info!(error = %e, "pool backstop cursor refused: starting over");
                self.list_page(&started_by, None, op).await?
            }
            Err(e) => return Err(e),
        };
        pool.table
            .set_backstop_cursor(deployment, next.as_deref(), now)
            .await?;
        let role = pool.config.task_role_id.as_str();
        let unknown: Vec<(String, &String)> = arns
            .iter()
            .filter(|arn| !known.contains(arn.as_str()))
            .filter_map(|arn| Some((member_pk(role, task_id(arn)?), arn)))
            .collect();
        if unknown.is_empty() {
            return Ok(0);
        }
        let keys: Vec<String> = unknown.iter().map(|(k, _)| k.clone()).collect();
        let items = pool.table.members(&keys, now, op).await?;
        let without: Vec<String> = unknown
            .iter()
            .filter(|(k, arn)| items.get(k).is_none_or(|i| &i.task_arn != *arn))
            .map(|(_, arn)| (*arn).clone())
            .collect();
        if without.is_empty() {
            return Ok(0);
        }
        let tasks = self.describe_pool(&without, op).await?;
        let mut stopped = 0;
        for (arn, task) in &tasks {
            let orphan = is_live(task)
                && is_pool_task(task)
                && tag_value(task, TAG_DEPLOYMENT) == Some(deployment.as_str())
                && tag_value(task, TAG_ENVIRONMENT).is_none()
                && member_key_of(task).is_some_and(|k| keys.contains(&k));
            let Some(created) = created_at(task).filter(|_| orphan) else {
                continue;
            };
            if now.saturating_sub(created) > ORPHAN_AGE_SECS {
                tracing::warn!(task = %arn, age_secs = now.saturating_sub(created),
                    "pool task without its member item: stopped");
                self.stop_task(arn, ORPHAN_REASON, not_after, op).await?;
                stopped += 1;
            }
        }
        Ok(stopped)
    }

    /// One `ListTasks` page: the cluster, `startedBy` (the only filter: "When you specify
    /// `startedBy` as the filter, it must be the only filter that you use", ECS API
    /// Reference, ListTasks; `desiredStatus` is then its default, `RUNNING`), `maxResults`
    /// [`BACKSTOP_PAGE`] and `nextToken` when given. Returns the ARNs and the next token.
    async fn list_page(
        &self,
        started_by: &str,
        next_token: Option<&str>,
        op: &'static str,
    ) -> Result<(Vec<String>, Option<String>), PortError> {
        let out = self
            .client
            .list_tasks()
            .cluster(&self.config().cluster)
            .started_by(started_by)
            .max_results(BACKSTOP_PAGE)
            .set_next_token(next_token.map(str::to_owned))
            .send()
            .await
            .map_err(|e| port_error(DEP, op, &e))?;
        Ok((
            out.task_arns().to_vec(),
            out.next_token().map(str::to_owned),
        ))
    }
}
