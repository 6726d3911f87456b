//! End-to-end session lifecycle through the simulator, with a verifying webhook receiver.

mod common;

use agents_sim::{ConnectTimeoutOutcome, SessionEnvironment};
use common::{WAIT, sim_with_receiver, wait_until_async};
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::event::{AgentEvent, RequiredActionType};
use sandbox_core::session::{Environment, RequiredAction, SessionStatus};
use sandbox_core::turn::{ItemStatus, TurnStatus};
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn action_required_then_connect_runs_the_turn_and_goes_idle() {
    let (sim, rx) = sim_with_receiver(0, |c| {
        c.time_scale = 60.0;
        c.turn_secs = 60.0; // 1 s real
    })
    .await;
    let client = sim.client();

    let session = client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let sid = session.id.as_str().to_owned();
    assert_eq!(session.status, SessionStatus::Idle);
    assert!(session.required_actions.is_empty());
    let env = session.self_hosted().expect("self_hosted").clone();
    assert!(env.id.as_str().starts_with("env_"));
    assert_eq!(env.workspace_directory, "/workspace");
    assert_eq!(env.remote_url, sim.base_url());
    assert!(env.remote_url.starts_with("http://127.0.0.1:"));

    let created = rx.wait_for(&sid, "agent.session.created").await;
    let AgentEvent::SessionCreated(data) = created.kind else {
        panic!("created: {:?}", created.kind)
    };
    assert_eq!(data.environment_type, "self_hosted");
    assert_eq!(data.environment_id.as_ref(), Some(&env.id));
    assert_eq!(data.connect.unwrap().remote_url, env.remote_url);

    // Input without an executor: the session waits for a connection.
    let turn_id = client
        .submit_message(&sid, "Run the test suite.")
        .await
        .unwrap()
        .expect("turn id");
    let waiting = client.get_session(&sid).await.unwrap();
    assert_eq!(waiting.status, SessionStatus::RequiresAction);
    assert!(waiting.requires_connection_of(&env.id));
    assert_eq!(
        waiting.required_actions,
        vec![RequiredAction::EnvironmentConnection {
            environment_id: env.id.clone()
        }]
    );
    let action = rx.wait_for(&sid, "agent.session.action_required").await;
    let AgentEvent::SessionActionRequired(data) = action.kind else {
        panic!("action_required: {:?}", action.kind)
    };
    assert_eq!(
        data.required_action.kind,
        RequiredActionType::EnvironmentConnection
    );
    let info = client.get_environment(env.id.as_str()).await.unwrap();
    assert_eq!(info.status, EnvironmentStatus::Pending);
    let turns = client.list_turns(&sid).await.unwrap();
    assert_eq!(turns.data.len(), 1);
    assert_eq!(turns.data[0].status, TurnStatus::Queued);

    // The executor connects: the action clears and the turn runs.
    let conn = client.connect(env.id.as_str()).await.unwrap();
    assert!(conn.starts_with("conn_"));
    let running = client.get_session(&sid).await.unwrap();
    // In progress at once (or already done on a very slow machine: the turn takes 1 s).
    assert!(
        matches!(
            running.status,
            SessionStatus::InProgress | SessionStatus::Idle
        ),
        "{:?}",
        running.status
    );
    assert!(running.required_actions.is_empty());
    rx.wait_for(&sid, "agent.session.in_progress").await;

    let done = client
        .wait_for_status(&sid, SessionStatus::Idle, WAIT)
        .await
        .unwrap();
    assert!(done.required_actions.is_empty());
    assert!(done.last_active_at >= done.created_at);
    let idle = rx.wait_for(&sid, "agent.session.idle").await;
    assert!(
        matches!(idle.kind, AgentEvent::SessionIdle(ref d) if d.environment_id.as_ref() == Some(&env.id))
    );

    let turns = client.list_turns(&sid).await.unwrap();
    let turn = &turns.data[0];
    assert_eq!(turn.id, turn_id);
    assert_eq!(turn.status, TurnStatus::Completed);
    assert!(turn.error.is_none());
    assert!(turn.extra["started_at"].is_i64() && turn.extra["completed_at"].is_i64());
    let items = client.list_turn_items(&sid, &turn_id).await.unwrap();
    let kinds: Vec<_> = items.data.iter().map(|i| i.kind.as_str()).collect();
    assert_eq!(kinds, ["message", "command_execution", "message"]);
    let cmd = &items.data[1];
    assert_eq!(cmd.status, Some(ItemStatus::Completed));
    assert_eq!(cmd.extra["exit_code"], json!(0));
    assert_eq!(cmd.extra["cwd"], json!("/workspace"));
    assert_eq!(
        client
            .get_environment(env.id.as_str())
            .await
            .unwrap()
            .status,
        EnvironmentStatus::Connected
    );

    assert!(sim.wait_deliveries_idle(WAIT).await);
    assert_eq!(
        rx.types_of(&sid),
        [
            "agent.session.created",
            "agent.session.action_required",
            "agent.session.in_progress",
            "agent.session.idle"
        ]
    );
    assert_eq!(rx.verify_failures(), 0);
    let state = sim.state();
    let e = state.environment(env.id.as_str()).unwrap();
    assert!(e.connected);
    assert_eq!((e.connections, e.connect_count), (1, 1));
    sim.shutdown().await;
}

#[tokio::test]
async fn input_fails_when_no_executor_connects_before_the_deadline() {
    // 300 simulated seconds pass in 0.1 real seconds.
    let (sim, rx) = sim_with_receiver(0, |c| c.time_scale = 3000.0).await;
    let client = sim.client();
    let session = client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let sid = session.id.as_str().to_owned();
    let turn_id = client.submit_message(&sid, "hello").await.unwrap().unwrap();

    let s = client
        .wait_for_status(&sid, SessionStatus::Idle, WAIT)
        .await
        .unwrap();
    assert!(s.required_actions.is_empty(), "the action clears");
    assert_eq!(s.error, None, "the input fails, not the session");
    let turns = client.list_turns(&sid).await.unwrap();
    let turn = turns.data.iter().find(|t| t.id == turn_id).unwrap();
    assert_eq!(turn.status, TurnStatus::Failed);
    assert_eq!(turn.error.as_ref().unwrap()["code"], json!("sandbox_error"));
    let elapsed = turn.extra["completed_at"].as_i64().unwrap() - turn.created_at;
    assert!(elapsed >= 300, "failed after the deadline, got {elapsed}");

    rx.wait_for(&sid, "agent.session.idle").await;
    assert!(sim.wait_deliveries_idle(WAIT).await);
    assert_eq!(
        rx.types_of(&sid),
        [
            "agent.session.created",
            "agent.session.action_required",
            "agent.session.idle"
        ]
    );
    let env_id = session.self_hosted().unwrap().id.as_str().to_owned();
    let e = sim.state().environment(&env_id).unwrap().clone();
    assert!(!e.connected);
    assert_eq!(e.status, EnvironmentStatus::Pending);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_manual_clock_fails_the_input_only_once_advanced_past_the_deadline() {
    let (sim, _rx) = sim_with_receiver(0, |c| c.time_scale = 0.0).await;
    let client = sim.client();
    let session = client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let sid = session.id.as_str().to_owned();
    client.submit_message(&sid, "hello").await.unwrap();

    tokio::time::sleep(Duration::from_millis(200)).await;
    client.advance_clock(299.0).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        client.get_session(&sid).await.unwrap().status,
        SessionStatus::RequiresAction
    );
    sim.advance_clock(2.0);
    client
        .wait_for_status(&sid, SessionStatus::Idle, WAIT)
        .await
        .unwrap();
    let turns = client.list_turns(&sid).await.unwrap();
    assert_eq!(turns.data[0].status, TurnStatus::Failed);
    sim.shutdown().await;
}

#[tokio::test]
async fn the_fail_session_outcome_fails_the_whole_session_at_the_deadline() {
    let (sim, rx) = sim_with_receiver(0, |c| {
        c.time_scale = 3000.0;
        c.connect_timeout_outcome = ConnectTimeoutOutcome::FailSession;
    })
    .await;
    let client = sim.client();
    let session = client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let sid = session.id.as_str().to_owned();
    client.submit_message(&sid, "hello").await.unwrap();
    let s = client
        .wait_for_status(&sid, SessionStatus::Failed, WAIT)
        .await
        .unwrap();
    assert!(s.error.unwrap().contains("did not connect"));
    assert!(s.required_actions.is_empty());
    let failed = rx.wait_for(&sid, "agent.session.failed").await;
    assert!(matches!(failed.kind, AgentEvent::SessionFailed(_)));
    sim.shutdown().await;
}

#[tokio::test]
async fn a_mid_turn_disconnect_fails_the_command_but_completes_the_turn() {
    // Manual clock: the turn would never finish by itself.
    let (sim, rx) = sim_with_receiver(0, |c| c.time_scale = 0.0).await;
    let client = sim.client();
    let session = client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let sid = session.id.as_str().to_owned();
    let env_id = session.self_hosted().unwrap().id.as_str().to_owned();
    let conn = client.connect(&env_id).await.unwrap();

    // Already connected: no action is required, the turn runs at once.
    let turn_id = client
        .submit_message(&sid, "cargo test")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        client.get_session(&sid).await.unwrap().status,
        SessionStatus::InProgress
    );
    let items = client.list_turn_items(&sid, &turn_id).await.unwrap();
    assert_eq!(items.data[1].status, Some(ItemStatus::InProgress));

    client.disconnect(&env_id, Some(&conn)).await.unwrap();
    let s = client.get_session(&sid).await.unwrap();
    assert_eq!(s.status, SessionStatus::Idle);
    let turns = client.list_turns(&sid).await.unwrap();
    assert_eq!(turns.data[0].status, TurnStatus::Completed);
    let items = client.list_turn_items(&sid, &turn_id).await.unwrap();
    let cmd = items
        .data
        .iter()
        .find(|i| i.kind == "command_execution")
        .unwrap();
    assert_eq!(cmd.status, Some(ItemStatus::Failed));
    assert!(cmd.is_tool() && cmd.status.unwrap().is_broken());
    assert_eq!(cmd.extra["exit_code"], json!(null));
    assert_eq!(
        client.get_environment(&env_id).await.unwrap().status,
        EnvironmentStatus::Disconnected
    );

    assert!(sim.wait_deliveries_idle(WAIT).await);
    rx.wait_for(&sid, "agent.session.idle").await;
    assert_eq!(
        rx.types_of(&sid),
        [
            "agent.session.created",
            "agent.session.in_progress",
            "agent.session.idle"
        ]
    );

    // The next input needs a connection again.
    client.submit_message(&sid, "again").await.unwrap();
    assert_eq!(
        client.get_session(&sid).await.unwrap().status,
        SessionStatus::RequiresAction
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn deleting_a_session_answers_404_afterwards_and_emits_no_webhook() {
    let (sim, rx) = sim_with_receiver(0, |_| {}).await;
    let client = sim.client();
    let session = client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let sid = session.id.as_str().to_owned();
    let env_id = session.self_hosted().unwrap().id.as_str().to_owned();
    client.connect(&env_id).await.unwrap();

    let first = client.delete_session(&sid, Some("del-1")).await.unwrap();
    assert_eq!(
        first,
        json!({"id": sid, "object": "agent.session.deleted", "deleted": true})
    );
    // Same Idempotency-Key: the same answer, not a 404.
    let again = client.delete_session(&sid, Some("del-1")).await.unwrap();
    assert_eq!(again, first);
    // Without it (or with a new key) the session is gone.
    assert!(
        client
            .delete_session(&sid, None)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert!(
        client
            .delete_session(&sid, Some("del-2"))
            .await
            .unwrap_err()
            .is_not_found()
    );
    let err = client.get_session(&sid).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let body: serde_json::Value = match err {
        agents_sim::ClientError::Status { body, .. } => serde_json::from_str(&body).unwrap(),
        other => panic!("{other}"),
    };
    for k in ["message", "type", "param", "code"] {
        assert!(body["error"].get(k).is_some(), "error.{k}");
    }
    assert!(
        client
            .get_environment(&env_id)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert!(client.list_turns(&sid).await.unwrap_err().is_not_found());
    assert!(
        client
            .submit_message(&sid, "hi")
            .await
            .unwrap_err()
            .is_not_found()
    );
    let listed = client.get_json("/agents/sessions?limit=100").await.unwrap();
    assert!(
        listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["id"] != json!(sid))
    );

    assert!(sim.wait_deliveries_idle(WAIT).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(rx.types_of(&sid), ["agent.session.created"]);
    let state = sim.state();
    assert!(state.session(&sid).unwrap().deleted);
    assert_eq!(state.events_of_session(&sid).len(), 1);
    // Deleting the session does not stop the executor: it is still connected.
    let e = state.environment(&env_id).unwrap();
    assert!(e.deleted && e.connected);
    // A new connect is refused; a goodbye is accepted.
    assert!(client.connect(&env_id).await.unwrap_err().is_not_found());
    client.disconnect(&env_id, None).await.unwrap();
    assert!(!sim.state().environment(&env_id).unwrap().connected);
    sim.shutdown().await;
}

#[tokio::test]
async fn failing_a_session_emits_agent_session_failed() {
    let (sim, rx) = sim_with_receiver(0, |c| c.time_scale = 0.0).await;
    let client = sim.client();
    let session = client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let sid = session.id.as_str().to_owned();
    let turn_id = client.submit_message(&sid, "hello").await.unwrap().unwrap();
    client.fail_session(&sid, Some("boom")).await.unwrap();

    let s = client.get_session(&sid).await.unwrap();
    assert_eq!(s.status, SessionStatus::Failed);
    assert_eq!(s.error.as_deref(), Some("boom"));
    assert!(s.required_actions.is_empty());
    let turn = client.list_turns(&sid).await.unwrap().data.remove(0);
    assert_eq!(turn.id, turn_id);
    assert_eq!(turn.status, TurnStatus::Failed);
    let failed = rx.wait_for(&sid, "agent.session.failed").await;
    let AgentEvent::SessionFailed(d) = failed.kind else {
        panic!()
    };
    assert_eq!(d.environment_type, "self_hosted");
    // A failed session takes no input, and failing twice is a conflict.
    let err = client.submit_message(&sid, "more").await.unwrap_err();
    assert_eq!(err.status(), Some(400));
    assert_eq!(
        client.fail_session(&sid, None).await.unwrap_err().status(),
        Some(409)
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn a_function_call_action_is_not_a_connection_request() {
    let (sim, rx) = sim_with_receiver(0, |c| c.time_scale = 0.0).await;
    let client = sim.client();
    let session = client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let sid = session.id.as_str().to_owned();
    let action = client.require_function_call(&sid).await.unwrap();
    let call_id = action["call_id"].as_str().unwrap().to_owned();

    let s = client.get_session(&sid).await.unwrap();
    assert_eq!(s.status, SessionStatus::RequiresAction);
    assert!(matches!(
        s.required_actions[0],
        RequiredAction::FunctionCall { .. }
    ));
    assert!(!s.requires_connection_of(&session.self_hosted().unwrap().id));
    let ar = rx.wait_for(&sid, "agent.session.action_required").await;
    let AgentEvent::SessionActionRequired(d) = ar.kind else {
        panic!()
    };
    assert_eq!(d.required_action.kind, RequiredActionType::FunctionCall);

    // New messages wait for the tool result; the result resolves the action.
    let err = client.submit_message(&sid, "next").await.unwrap_err();
    assert_eq!(err.status(), Some(409));
    client
        .submit_events(
            &sid,
            &json!({"events": [{"type": "agent.session.input.tool_result", "call_id": call_id,
                                 "turn_id": action["turn_id"], "success": true, "output": "ok"}]}),
        )
        .await
        .unwrap();
    let s = client.get_session(&sid).await.unwrap();
    assert_eq!(s.status, SessionStatus::Idle);
    assert!(s.required_actions.is_empty());
    rx.wait_for(&sid, "agent.session.idle").await;
    sim.shutdown().await;
}

#[tokio::test]
async fn hosted_and_none_sessions_run_without_an_executor() {
    let (sim, rx) = sim_with_receiver(0, |c| c.turn_secs = 6.0).await; // 0.1 s real
    let client = sim.client();
    for env in [SessionEnvironment::OpenAiHosted, SessionEnvironment::None] {
        let session = client.create_session(env.clone()).await.unwrap();
        let sid = session.id.as_str().to_owned();
        assert!(session.self_hosted().is_none());
        match (&env, &session.environment) {
            (SessionEnvironment::OpenAiHosted, Environment::OpenAiHosted { id, .. }) => {
                assert!(id.as_str().starts_with("env_"));
                let info = client.get_environment(id.as_str()).await.unwrap();
                assert_eq!(info.kind, "openai_hosted");
                assert_eq!(info.status, EnvironmentStatus::Ready);
            }
            (SessionEnvironment::None, Environment::None) => {}
            other => panic!("{other:?}"),
        }
        client.submit_message(&sid, "hi").await.unwrap();
        let status = client.get_session(&sid).await.unwrap().status;
        assert!(
            matches!(status, SessionStatus::InProgress | SessionStatus::Idle),
            "runs at once: {status:?}"
        );
        rx.wait_for(&sid, "agent.session.in_progress").await;
        client
            .wait_for_status(&sid, SessionStatus::Idle, WAIT)
            .await
            .unwrap();
        rx.wait_for(&sid, "agent.session.idle").await;
        let types = rx.types_of(&sid);
        assert!(
            !types.iter().any(|t| t == "agent.session.action_required"),
            "{types:?}"
        );
        let created = rx.wait_for(&sid, "agent.session.created").await;
        let AgentEvent::SessionCreated(d) = created.kind else {
            panic!()
        };
        assert!(d.connect.is_none());
        assert_eq!(d.environment_id.is_none(), env == SessionEnvironment::None);
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn cancel_clears_a_pending_connection_request_and_queued_input_runs_in_order() {
    let (sim, rx) = sim_with_receiver(0, |c| c.time_scale = 0.0).await;
    let client = sim.client();
    let session = client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let sid = session.id.as_str().to_owned();
    let env_id = session.self_hosted().unwrap().id.as_str().to_owned();

    let first = client.submit_message(&sid, "one").await.unwrap().unwrap();
    client
        .submit_events(
            &sid,
            &json!({"events": [{"type": "agent.session.input.cancel"}]}),
        )
        .await
        .unwrap();
    let s = client.get_session(&sid).await.unwrap();
    assert_eq!(s.status, SessionStatus::Idle);
    assert!(s.required_actions.is_empty());
    let turns = client.list_turns(&sid).await.unwrap();
    assert_eq!(turns.data[0].id, first);
    assert_eq!(turns.data[0].status, TurnStatus::Cancelled);

    // Two inputs: the second waits behind the first; one connect runs both in order.
    let a = client.submit_message(&sid, "two").await.unwrap().unwrap();
    let b = client.submit_message(&sid, "three").await.unwrap().unwrap();
    client.connect(&env_id).await.unwrap();
    let status_of = |turns: &sandbox_core::turn::Page<sandbox_core::turn::Turn>, id: &str| {
        turns.data.iter().find(|t| t.id == id).map(|t| t.status)
    };
    let turns = client.list_turns(&sid).await.unwrap();
    assert_eq!(status_of(&turns, &a), Some(TurnStatus::InProgress));
    assert_eq!(status_of(&turns, &b), Some(TurnStatus::Queued));

    sim.advance_clock(30.0);
    wait_until_async("the second turn to start", || {
        let (client, sid, b) = (client.clone(), sid.clone(), b.clone());
        async move {
            let turns = client.list_turns(&sid).await.ok()?;
            (status_of(&turns, &b) == Some(TurnStatus::InProgress)).then_some(())
        }
    })
    .await;
    let turns = client.list_turns(&sid).await.unwrap();
    assert_eq!(status_of(&turns, &a), Some(TurnStatus::Completed));
    assert_eq!(
        client.get_session(&sid).await.unwrap().status,
        SessionStatus::InProgress
    );
    sim.advance_clock(30.0);
    client
        .wait_for_status(&sid, SessionStatus::Idle, WAIT)
        .await
        .unwrap();
    assert!(sim.wait_deliveries_idle(WAIT).await);
    assert_eq!(
        rx.types_of(&sid),
        [
            "agent.session.created",
            "agent.session.action_required",
            "agent.session.idle",
            "agent.session.action_required",
            "agent.session.in_progress",
            "agent.session.idle"
        ],
        "no idle between two queued turns"
    );
    sim.shutdown().await;
}
