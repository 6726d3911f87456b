//! Evidence beyond the record and the inventory: the environment status and the turns,
//! read only when they can change the decision.

use super::{Controller, Gathered};
use crate::job::Job;
use crate::ports::{Compute, Queue, Registry};
use sandbox_agents_api::{PageParams, SessionsApi};
use sandbox_core::compute::ComputeStatus;
use sandbox_core::decision::TurnDetail;
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::evidence::ToolLayer;
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::{EnvironmentRead, Inventory, SessionView, Trigger, TurnEvidence};
use sandbox_core::record::Record;

impl<Q, R, C, S> Controller<Q, R, C, S>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    /// The environment status and the turn evidence, fetched only when they can change the
    /// decision: the status when a running compute might be connected (reuse vs replace,
    /// which of several computes to keep) or after idle (mid-turn disconnect evidence, row
    /// 20); the latest turn and its items for row 20 and a timed-out submission (row 21,
    /// the reported submission's turn); the latest turn alone (one turns read, no items)
    /// before every stop of an idle session — a due lease, on its timer or a sweep — so a
    /// queued or running turn cancels the stop. A failed status read is
    /// [`EnvironmentRead::Unavailable`]: missing evidence, never "not connected"; a failed
    /// turns read is no evidence (never "no turn").
    pub(crate) async fn evidence(
        &self,
        job: &Job,
        env: &EnvironmentId,
        session: &SessionView,
        inventory: &Inventory,
        record: Option<&Record>,
        now: u64,
    ) -> Gathered {
        let SessionView::Found { session } = session else {
            return Gathered::default();
        };
        let (running, active) = match inventory {
            Inventory::Known { instances } => (
                instances.iter().any(|i| i.status == ComputeStatus::Running),
                instances.iter().filter(|i| i.status.is_active()).count(),
            ),
            Inventory::Unavailable => (false, 0),
        };
        // The connection request this record's instance was started for is no longer
        // required: read the status once to see the executor connected (the
        // `start_to_connected_seconds` metric; one read per instance, flat in the
        // deployment).
        let request_resolved = record.is_some_and(|r| {
            r.connection_requested_at.is_some()
                && r.instance.is_some()
                && r.instance_connected_at.is_none()
        }) && !session.requires_connection_of(env);
        let wants_status = running
            && (session.requires_connection_of(env)
                || job.trigger == Trigger::Idle
                || active > 1
                || request_resolved)
            || crate::connect_watch::watching(record, inventory);
        let status = if wants_status {
            match self.sessions.retrieve_environment(env).await {
                Ok(e) => EnvironmentRead::Read { status: e.status },
                Err(e) => {
                    tracing::warn!(environment_id = %env, error = %e, "environment status unavailable");
                    EnvironmentRead::Unavailable
                }
            }
        } else {
            EnvironmentRead::NotRead
        };
        let mut gathered = Gathered {
            status,
            ..Gathered::default()
        };
        if let Trigger::TimeoutReported {
            turn_id,
            submitted_at,
        } = &job.trigger
        {
            match self
                .submission_turn(&session.id, turn_id.as_deref(), *submitted_at)
                .await
            {
                Some(Some((turn, detail))) => {
                    gathered.turn = Some(turn);
                    gathered.detail = Some(detail);
                }
                Some(None) => gathered.turn_not_found = true,
                None => {}
            }
            return gathered;
        }
        let wants_items = job.trigger == Trigger::Idle
            && status.status() == Some(EnvironmentStatus::Disconnected);
        if wants_items {
            let latest = self.latest_turns(&session.id, 1).await;
            gathered.turns_read = latest.as_ref().is_some_and(Vec::is_empty);
            if let Some(turn) = latest.and_then(|p| p.into_iter().next())
                && let Some((t, detail)) = self.turn_with_items(&session.id, turn).await
            {
                gathered.turn = Some(t);
                gathered.detail = Some(detail);
                gathered.turns_read = true;
            }
        } else if self.may_stop(job, session, inventory, record, now)
            && let Some(turns) = self.latest_turns(&session.id, 1).await
        {
            // The status alone decides whether a stop is cancelled: no items read.
            gathered.turns_read = true;
            gathered.turn = turns.into_iter().next().map(|turn| TurnEvidence {
                turn_id: turn.id,
                status: turn.status,
                broken_tools: vec![],
            });
        }
        gathered
    }

    /// Whether this decision may stop an idle session's compute (every such stop
    /// reads the latest turn first): a compute is active, and the idle lease is due
    /// (its timer fired, or a sweep found it due) while the session reads idle, or the
    /// maximum lifetime has passed for an active compute, or the no-work lease is due (its
    /// timer, or any look once due). Then one turns read (the latest turn) precedes the
    /// decision, so a queued or running turn keeps the executor.
    pub(super) fn may_stop(
        &self,
        job: &Job,
        session: &sandbox_core::session::Session,
        inventory: &Inventory,
        record: Option<&Record>,
        now: u64,
    ) -> bool {
        let Inventory::Known { instances } = inventory else {
            return false;
        };
        let active: Vec<_> = instances.iter().filter(|i| i.status.is_active()).collect();
        if active.is_empty() {
            return false;
        }
        let idle =
            session.status == sandbox_core::session::SessionStatus::Idle && !session.is_busy();
        let lease_due = record
            .and_then(|r| r.lease.as_ref())
            .is_some_and(|l| now >= l.due_at);
        let idle_lease = match &job.trigger {
            Trigger::LeaseDue { lease } => now >= lease.due_at,
            Trigger::Sweep => lease_due,
            _ => false,
        };
        let max = self.config.policy.max_lifetime_secs;
        let lifetime = max > 0
            && active
                .iter()
                .any(|i| i.started_at.is_some_and(|s| now.saturating_sub(s) >= max));
        let no_work = matches!(job.trigger, Trigger::NoWorkLeaseDue { .. })
            || record
                .and_then(|r| r.no_work_lease.as_ref())
                .is_some_and(|l| now >= l.due_at);
        (idle && idle_lease) || lifetime || no_work
    }

    /// The session's latest `limit` turns (one call), newest first; `None` when the read
    /// failed.
    pub(super) async fn latest_turns(
        &self,
        session: &SessionId,
        limit: u32,
    ) -> Option<Vec<sandbox_core::turn::Turn>> {
        match self
            .sessions
            .list_turns(session, &PageParams::latest(limit))
            .await
        {
            Ok(page) => Some(page.data),
            Err(e) => {
                tracing::warn!(session_id = %session, error = %e, "turns unavailable");
                None
            }
        }
    }

    /// The turn's evidence with its items (one items read, first page of up to 100).
    pub(super) async fn turn_with_items(
        &self,
        session: &SessionId,
        turn: sandbox_core::turn::Turn,
    ) -> Option<(TurnEvidence, TurnDetail)> {
        let items = self
            .sessions
            .list_turn_items(session, &turn.id, &PageParams::latest(100))
            .await
            .map_err(|e| tracing::warn!(session_id = %session, turn_id = %turn.id, error = %e, "turn items unavailable"))
            .ok()?;
        let tools = items.data.iter().filter(|i| i.is_tool());
        let broken_tools = tools
            .clone()
            .filter_map(|i| {
                let status = i.status?;
                status
                    .is_broken()
                    .then(|| (i.id.clone().unwrap_or_default(), i.kind.clone(), status))
            })
            .collect();
        let detail = TurnDetail {
            error: turn.error.as_ref().map(|e| match e {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            }),
            tools: tools
                .filter_map(|i| {
                    let status = i.status?;
                    (status != sandbox_core::turn::ItemStatus::Completed).then(|| ToolLayer {
                        id: i.id.clone().unwrap_or_default(),
                        kind: i.kind.clone(),
                        status,
                    })
                })
                .collect(),
        };
        Some((
            TurnEvidence {
                turn_id: turn.id,
                status: turn.status,
                broken_tools,
            },
            detail,
        ))
    }

    /// A reported submission's turn (row 21): the turn with `turn_id`, else the first turn
    /// created at or after `submitted_at` (the submission creates the session's next turn),
    /// among the latest 100 turns (one turns read), with its items (one items read).
    /// `Some(None)`: read, no such turn (the submission never started); `None`: a read
    /// failed (missing evidence).
    pub(super) async fn submission_turn(
        &self,
        session: &SessionId,
        turn_id: Option<&str>,
        submitted_at: u64,
    ) -> Option<Option<(TurnEvidence, TurnDetail)>> {
        let turns = self.latest_turns(session, 100).await?;
        let found = match turn_id {
            Some(id) => turns.into_iter().find(|t| t.id == id),
            None => turns
                .into_iter()
                .filter(|t| t.created_at >= 0 && t.created_at as u64 >= submitted_at)
                .min_by_key(|t| t.created_at),
        };
        match found {
            None => Some(None),
            Some(turn) => self.turn_with_items(session, turn).await.map(Some),
        }
    }
}
