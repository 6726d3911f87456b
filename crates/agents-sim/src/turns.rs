//! The turn engine: how submitted input becomes a turn that waits for the executor, runs,
//! and leaves the session `idle` again, and the per-session driver task that moves it along
//! in simulated time.
//!
//! `step` is the whole state machine for one session; it is called under the state lock
//! by every handler that may unblock a session (submit, connect, disconnect, cancel) and by
//! the session's driver whenever the state changes or a simulated deadline passes. It is
//! idempotent: calling it twice at the same instant changes nothing the second time.
//!
//! Per active turn (agents-api.md, "Lifecycle rules"):
//! - queued, self-hosted, executor not connected: the session becomes `requires_action`
//!   with `[{type: environment_connection, environment_id}]` and one
//!   `agent.session.action_required` webhook; if nobody connects within
//!   `connect_deadline_secs` (simulated) the input fails (see
//!   [`ConnectTimeoutOutcome`]);
//! - queued and runnable (connected, or a hosted / `none` environment): the action clears,
//!   turn and session become `in_progress` (`agent.session.in_progress` webhook on the
//!   transition), a `command_execution` item starts (not for `none`);
//! - running, executor disconnected: the command item becomes `failed` (`exit_code` null,
//!   partial output) and the turn still `completed` with an assistant message saying so;
//! - running for `turn_secs`: the command `completed` with exit code 0, the turn
//!   `completed`;
//! - no active turn left: the session is `idle` (`agent.session.idle` webhook).

use crate::config::ConnectTimeoutOutcome;
use crate::objects;
use crate::state::{EnvKind, Inner, SessionRec, Shared, SimState, TurnRec, Usage};
use sandbox_core::session::SessionStatus;
use sandbox_core::turn::TurnStatus;
use serde_json::{Value, json};
use std::collections::HashMap;

/// What a driver does after a [`step`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Next {
    /// Nothing left to drive: the driver ends.
    Exit,
    /// Wake at this simulated time (or on any state change).
    Until(f64),
    /// Wake on the next state change.
    OnChange,
}

/// Token usage recorded for every simulated turn that ran.
const TURN_USAGE: Usage = Usage {
    input: 1200,
    cached: 0,
    output: 180,
    reasoning: 64,
};

fn first_active(turns: &HashMap<String, TurnRec>, ids: &[String]) -> Option<String> {
    ids.iter()
        .find(|id| {
            turns
                .get(*id)
                .is_some_and(|t| matches!(t.status, TurnStatus::Queued | TurnStatus::InProgress))
        })
        .cloned()
}

/// `data` of `agent.session.{in_progress,idle,failed}` (and the base of `created`).
pub(crate) fn state_event_data(s: &SessionRec) -> Value {
    let mut data = json!({"id": s.id, "environment_type": s.env_kind.as_str()});
    if let (Some(env_id), Some(obj)) = (&s.env_id, data.as_object_mut()) {
        obj.insert("environment_id".into(), json!(env_id));
    }
    data
}

fn emit_state(sh: &Shared, kind: &str, s: &SessionRec, now: i64) {
    sh.webhooks.emit(kind, state_event_data(s), now);
}

/// Emits `agent.session.action_required` for an action type.
pub(crate) fn emit_action_required(sh: &Shared, session_id: &str, action_type: &str, now: i64) {
    sh.webhooks.emit(
        "agent.session.action_required",
        json!({"id": session_id, "required_action": {"type": action_type}}),
        now,
    );
}

fn is_connection_action(a: &Value) -> bool {
    a.get("type").and_then(Value::as_str) == Some("environment_connection")
}

/// The user message items of a turn; their ids derive from the turn id, so a queued turn
/// and the same turn once started show the same ids.
pub(crate) fn user_items(t: &TurnRec) -> Vec<Value> {
    let stem = t.id.trim_start_matches("turn_");
    t.input
        .iter()
        .enumerate()
        .map(|(i, content)| objects::user_message(&format!("msg_{stem}u{i}"), &t.id, content))
        .collect()
}

/// Advances one session as far as it can go at simulated time `now`.
pub(crate) fn step(sh: &Shared, inner: &mut Inner, sid: &str, now: f64) -> Next {
    let cfg = &sh.config;
    let now_i = now.floor() as i64;
    loop {
        let connected = match inner.sessions.get(sid) {
            Some(s) => inner.executor_connected(s),
            None => return Next::Exit,
        };
        let Inner {
            sessions,
            turns,
            environments,
            ..
        } = &mut *inner;
        let Some(s) = sessions.get_mut(sid) else {
            return Next::Exit;
        };
        if s.deleted || s.status == SessionStatus::Failed {
            return Next::Exit;
        }
        let Some(tid) = first_active(turns, &s.turn_ids) else {
            return Next::Exit;
        };
        if s.required_actions.iter().any(|a| !is_connection_action(a)) {
            // A function call or approval is pending: only new input resolves it.
            return Next::OnChange;
        }
        let Some(t) = turns.get_mut(&tid) else {
            return Next::Exit;
        };
        let needs_executor = s.env_kind == EnvKind::SelfHosted;
        match t.status {
            TurnStatus::Queued if needs_executor && !connected => {
                let since = match s.connect_wait_since {
                    Some(since) => since,
                    None => {
                        s.connect_wait_since = Some(now);
                        s.status = SessionStatus::RequiresAction;
                        s.required_actions = vec![json!({
                            "type": "environment_connection",
                            "environment_id": s.env_id,
                        })];
                        s.last_active_at = now_i;
                        emit_action_required(sh, &s.id, "environment_connection", now_i);
                        now
                    }
                };
                let deadline = since + cfg.connect_deadline_secs;
                if now < deadline {
                    return Next::Until(deadline);
                }
                let message = format!(
                    "The self-hosted environment did not connect within {} seconds.",
                    cfg.connect_deadline_secs
                );
                t.items = user_items(t);
                t.status = TurnStatus::Failed;
                t.completed_at = Some(now_i);
                t.error = Some(("sandbox_error", message.clone()));
                s.connect_wait_since = None;
                s.required_actions.clear();
                s.last_active_at = now_i;
                match cfg.connect_timeout_outcome {
                    ConnectTimeoutOutcome::FailSession => {
                        for other in s.turn_ids.clone() {
                            if let Some(o) = turns.get_mut(&other)
                                && matches!(o.status, TurnStatus::Queued)
                            {
                                o.status = TurnStatus::Failed;
                                o.completed_at = Some(now_i);
                                o.error = Some(("sandbox_error", message.clone()));
                            }
                        }
                        s.status = SessionStatus::Failed;
                        s.error = Some(message);
                        emit_state(sh, "agent.session.failed", s, now_i);
                        return Next::Exit;
                    }
                    ConnectTimeoutOutcome::FailInput => {
                        if first_active(turns, &s.turn_ids).is_none() {
                            s.status = SessionStatus::Idle;
                            emit_state(sh, "agent.session.idle", s, now_i);
                        }
                    }
                }
            }
            TurnStatus::Queued => {
                let was = s.status;
                s.connect_wait_since = None;
                s.required_actions.clear();
                s.status = SessionStatus::InProgress;
                s.last_active_at = now_i;
                t.status = TurnStatus::InProgress;
                t.started_at = Some(now_i);
                t.started = Some(now);
                t.run_until = Some(now + cfg.turn_secs);
                // A forwarder's rendezvous socket is up: the command runs in its executor
                // (the driver starts the harness task); the turn ends after it and
                // `turn_secs`.
                t.harness_connection = s
                    .env_id
                    .as_ref()
                    .and_then(|e| environments.get(e))
                    .and_then(|e| e.relay_connections.iter().next_back().cloned());
                t.items = user_items(t);
                if s.env_kind != EnvKind::None {
                    t.items.push(objects::command_started(
                        &sh.ids.hex("ce_"),
                        &t.id,
                        &cfg.turn_command,
                        &s.workspace_directory,
                    ));
                }
                if was != SessionStatus::InProgress {
                    emit_state(sh, "agent.session.in_progress", s, now_i);
                }
            }
            TurnStatus::InProgress => {
                let interrupted = needs_executor && !connected;
                // A turn lasts `turn_secs` and, when its command runs in an executor,
                // until that command ended too.
                if !interrupted && t.harness_connection.is_some() && t.harness_result.is_none() {
                    return Next::OnChange;
                }
                let due = t.run_until.is_none_or(|until| now >= until);
                if !interrupted && !due {
                    return Next::Until(t.run_until.unwrap_or(now));
                }
                finish_turn(sh, t, now, interrupted);
                s.usage = Some(s.usage.unwrap_or_default().add(TURN_USAGE));
                s.last_active_at = now_i;
                if first_active(turns, &s.turn_ids).is_none() {
                    s.status = SessionStatus::Idle;
                    emit_state(sh, "agent.session.idle", s, now_i);
                }
            }
            _ => return Next::Exit,
        }
    }
}

fn finish_turn(sh: &Shared, t: &mut TurnRec, now: f64, interrupted: bool) {
    let now_i = now.floor() as i64;
    let elapsed_ms = t
        .started
        .map(|s| ((now - s) * 1000.0).round() as i64)
        .unwrap_or(0);
    let mut ran_command = false;
    let harness = t.harness_result.clone();
    let mut harness_text = None;
    if let Some(cmd) = t
        .items
        .iter_mut()
        .find(|i| i.get("type").and_then(Value::as_str) == Some("command_execution"))
    {
        ran_command = true;
        if let (false, Some(result)) = (interrupted, &harness) {
            // What the executor really answered.
            let (status, code, output) = match result {
                Ok(r) => (
                    if r.exit_code == Some(0) {
                        "completed"
                    } else {
                        "failed"
                    },
                    r.exit_code.map(i64::from),
                    r.output.clone(),
                ),
                Err(e) => ("failed", None, format!("executor error: {e}\n")),
            };
            objects::command_finish(cmd, status, code, &output, elapsed_ms);
            harness_text = Some(match code {
                Some(c) => format!("The command exited with code {c}."),
                None => "The command did not finish in the executor.".to_owned(),
            });
        } else if interrupted {
            objects::command_finish(
                cmd,
                "failed",
                None,
                "   Compiling workspace v0.1.0 (/workspace)\n    Running unittests src/lib.rs\n",
                elapsed_ms,
            );
        } else {
            objects::command_finish(
                cmd,
                "completed",
                Some(0),
                "test result: ok. 42 passed; 0 failed; 0 ignored\n",
                elapsed_ms,
            );
        }
    }
    let text = match (interrupted, ran_command) {
        (true, _) => {
            "The command was interrupted because the execution environment disconnected. Please re-run it."
        }
        (false, true) => "The test suite passed.",
        (false, false) => "Done.",
    };
    let text = harness_text.as_deref().unwrap_or(text);
    t.items
        .push(objects::assistant_message(&sh.ids.hex("msg_"), &t.id, text));
    t.status = TurnStatus::Completed;
    t.completed_at = Some(now_i);
    t.usage = Some(TURN_USAGE);
}

/// Fails a session (control endpoint): active turns fail, actions clear, status `failed`,
/// `error` set, `agent.session.failed` webhook. `false` if the session is unknown, deleted
/// or already failed.
pub(crate) fn fail_session(
    sh: &Shared,
    inner: &mut Inner,
    sid: &str,
    error: &str,
    now: f64,
) -> bool {
    let now_i = now.floor() as i64;
    let Inner {
        sessions, turns, ..
    } = &mut *inner;
    let Some(s) = sessions.get_mut(sid).filter(|s| !s.deleted) else {
        return false;
    };
    if s.status == SessionStatus::Failed {
        return false;
    }
    for id in &s.turn_ids {
        if let Some(t) = turns.get_mut(id)
            && matches!(
                t.status,
                TurnStatus::Queued | TurnStatus::InProgress | TurnStatus::Waiting
            )
        {
            if t.status == TurnStatus::Queued {
                t.items = user_items(t);
            }
            for item in &mut t.items {
                if item.get("status").and_then(Value::as_str) == Some("in_progress")
                    && let Some(obj) = item.as_object_mut()
                {
                    obj.insert("status".into(), json!("incomplete"));
                }
            }
            t.status = TurnStatus::Failed;
            t.completed_at = Some(now_i);
            t.error = Some(("internal_error", "The session failed.".to_owned()));
        }
    }
    s.status = SessionStatus::Failed;
    s.error = Some(error.to_owned());
    s.required_actions.clear();
    s.connect_wait_since = None;
    s.last_active_at = now_i;
    emit_state(sh, "agent.session.failed", s, now_i);
    true
}

/// Cancels the session's active turn (`agent.session.input.cancel`): the turn becomes
/// `cancelled`, an unfinished command `incomplete`, a pending connection action clears; the
/// session goes `idle` (webhook) when nothing else is queued. `false` if nothing was active.
pub(crate) fn cancel_active(sh: &Shared, inner: &mut Inner, sid: &str, now: f64) -> bool {
    let now_i = now.floor() as i64;
    let Inner {
        sessions, turns, ..
    } = &mut *inner;
    let Some(s) = sessions.get_mut(sid) else {
        return false;
    };
    let Some(tid) = first_active(turns, &s.turn_ids) else {
        return false;
    };
    let Some(t) = turns.get_mut(&tid) else {
        return false;
    };
    if t.status == TurnStatus::Queued {
        t.items = user_items(t);
    }
    for item in &mut t.items {
        if item.get("status").and_then(Value::as_str) == Some("in_progress")
            && let Some(obj) = item.as_object_mut()
        {
            obj.insert("status".into(), json!("incomplete"));
        }
    }
    t.status = TurnStatus::Cancelled;
    t.completed_at = Some(now_i);
    s.connect_wait_since = None;
    s.required_actions.retain(|a| !is_connection_action(a));
    s.last_active_at = now_i;
    if first_active(turns, &s.turn_ids).is_none() && s.required_actions.is_empty() {
        s.status = SessionStatus::Idle;
        emit_state(sh, "agent.session.idle", s, now_i);
    }
    true
}

/// Starts the session's driver task unless one runs or there is nothing to drive.
pub(crate) fn ensure_driver(state: &SimState, sid: &str) {
    let start = {
        let mut inner = state.lock();
        let active = inner.active_turn(sid).is_some();
        match inner.sessions.get_mut(sid) {
            Some(s)
                if active
                    && !s.driver_running
                    && !s.deleted
                    && s.status != SessionStatus::Failed =>
            {
                s.driver_running = true;
                true
            }
            _ => false,
        }
    };
    if start {
        tokio::spawn(drive(state.clone(), sid.to_owned()));
    }
}

/// How long a turn's command may run in the executor (real time).
const HARNESS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Starts the harness task of the session's running turn when it runs through a relay
/// connection and none was started: it runs [`SimConfig::turn_command`](crate::SimConfig)
/// in the executor over a new Noise stream ([`crate::state::relays::run_command`]), stores
/// the outcome in the turn and wakes the drivers; [`step`] then completes the turn with it.
fn start_harness(state: &SimState, inner: &mut Inner, sid: &str) {
    let Some(tid) = inner.active_turn(sid) else {
        return;
    };
    let Some(t) = inner.turns.get_mut(&tid) else {
        return;
    };
    if t.status != TurnStatus::InProgress || t.harness_started {
        return;
    }
    let Some(conn) = t.harness_connection.clone() else {
        return;
    };
    t.harness_started = true;
    let state = state.clone();
    let command = state.config().turn_command.clone();
    tokio::spawn(async move {
        let result =
            crate::state::relays::run_command(&state, &conn, &command, HARNESS_TIMEOUT).await;
        match &result {
            Ok(r) => {
                tracing::info!(turn_id = %tid, exit_code = ?r.exit_code, executor_version = ?r.executor_version, "turn command ran in the executor")
            }
            Err(e) => {
                // The turn records it (a failed command item); an executor stopped on
                // purpose ends its commands this way, so it is no warning.
                tracing::info!(turn_id = %tid, error = %e, "turn command failed in the executor")
            }
        }
        if let Some(t) = state.lock().turns.get_mut(&tid) {
            t.harness_result = Some(result);
        }
        state.bump();
    });
}

async fn drive(state: SimState, sid: String) {
    let mut version = state.0.version.subscribe();
    let mut shutdown = state.0.shutdown.subscribe();
    loop {
        if *shutdown.borrow_and_update() {
            return;
        }
        version.borrow_and_update();
        let next = {
            let now = state.clock().now();
            let mut inner = state.lock();
            let next = step(&state.0, &mut inner, &sid, now);
            start_harness(&state, &mut inner, &sid);
            if next == Next::Exit
                && let Some(s) = inner.sessions.get_mut(&sid)
            {
                // Cleared under the same lock as the decision, so a submit that follows
                // sees it and starts a new driver.
                s.driver_running = false;
            }
            next
        };
        let changed = async {
            if version.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        match next {
            Next::Exit => return,
            Next::Until(deadline) => {
                tokio::select! {
                    () = state.clock().sleep_until(deadline) => {}
                    () = changed => {}
                    _ = shutdown.changed() => {}
                }
            }
            Next::OnChange => {
                tokio::select! {
                    () = changed => {}
                    _ = shutdown.changed() => {}
                }
            }
        }
    }
}
