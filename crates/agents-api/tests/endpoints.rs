//! Each endpoint against a local server: path, method, headers, query and parsing.

mod common;

use common::{Reply, SECRET, TestServer, client, environment_json, session_json, turn_json};
use sandbox_agents_api::{ApiError, Order, PageParams, SessionsApi};
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::session::{RequiredAction, SessionStatus};
use sandbox_core::turn::{ItemStatus, TurnStatus};
use sandbox_core::{EnvironmentId, SessionId};
use serde_json::json;
use std::sync::Arc;

#[tokio::test]
async fn retrieve_session_sends_auth_and_beta_headers_and_parses_the_session() {
    let server = TestServer::start(vec![Reply::json(200, session_json("sess_abc"))]).await;
    let session = client(&server, 3)
        .retrieve_session(&SessionId::new("sess_abc"))
        .await
        .unwrap();

    let seen = server.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "GET");
    assert_eq!(seen[0].path, "/v1/agents/sessions/sess_abc");
    assert_eq!(seen[0].query, None);
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {SECRET}").as_str())
    );
    assert_eq!(seen[0].header("openai-beta"), Some("agents=v1"));
    assert_eq!(
        seen[0].header("idempotency-key"),
        None,
        "only writes carry one"
    );

    assert_eq!(session.id, SessionId::new("sess_abc"));
    assert_eq!(session.object, "agent.session");
    assert_eq!(session.agent.id, "agent_68a1c0ffee");
    assert_eq!(session.agent.extra["model"], "gpt-5.2");
    assert_eq!(session.created_at, 1_789_000_000);
    assert_eq!(session.last_active_at, 1_789_000_420);
    assert_eq!(session.status, SessionStatus::RequiresAction);
    let env = EnvironmentId::new("env_7d2f");
    assert_eq!(
        session.required_actions,
        vec![RequiredAction::EnvironmentConnection {
            environment_id: env.clone()
        }]
    );
    assert!(session.requires_connection_of(&env));
    let hosted = session.self_hosted().expect("self-hosted environment");
    assert_eq!(hosted.id, env);
    assert_eq!(
        hosted.remote_url,
        "wss://agents.example.invalid/v1/env_7d2f/connect?ticket=abc"
    );
    assert_eq!(hosted.workspace_directory, "/workspace");
    assert!(hosted.capability_directories.is_empty());
    assert_eq!(session.metadata["owner"], "team-a");
    assert_eq!(session.error, None);
    assert_eq!(session.extra["vault_ids"], json!([]));
    assert_eq!(session.extra["usage"]["total_tokens"], 1540);
}

#[tokio::test]
async fn delete_session_sends_the_idempotency_key_and_parses_the_deletion() {
    let server = TestServer::start(vec![Reply::json(
        200,
        json!({"id": "sess_abc", "object": "agent.session.deleted", "deleted": true}),
    )])
    .await;
    let deleted = client(&server, 3)
        .delete_session(&SessionId::new("sess_abc"), "sl-delete-sess_abc-1")
        .await
        .unwrap();
    assert_eq!(deleted.id, SessionId::new("sess_abc"));
    assert_eq!(deleted.object, "agent.session.deleted");
    assert!(deleted.deleted);

    let seen = server.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "DELETE");
    assert_eq!(seen[0].path, "/v1/agents/sessions/sess_abc");
    assert_eq!(
        seen[0].header("idempotency-key"),
        Some("sl-delete-sess_abc-1")
    );
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {SECRET}").as_str())
    );
    assert_eq!(seen[0].header("openai-beta"), Some("agents=v1"));
}

#[tokio::test]
async fn retried_delete_repeats_the_same_idempotency_key() {
    let server = TestServer::start(vec![
        Reply::error(502),
        Reply::json(
            200,
            json!({"id": "sess_abc", "object": "agent.session.deleted", "deleted": true}),
        ),
    ])
    .await;
    client(&server, 3)
        .delete_session(&SessionId::new("sess_abc"), "key-1")
        .await
        .unwrap();
    let seen = server.requests();
    assert_eq!(seen.len(), 2);
    assert!(
        seen.iter()
            .all(|s| s.header("idempotency-key") == Some("key-1"))
    );
}

#[tokio::test]
async fn invalid_idempotency_key_is_rejected_before_any_request() {
    let server = TestServer::start(vec![Reply::error(500)]).await;
    let api = client(&server, 3);
    for key in ["", "two\nlines"] {
        let err = api
            .delete_session(&SessionId::new("sess_abc"), key)
            .await
            .unwrap_err();
        assert!(matches!(err, ApiError::InvalidArgument { .. }), "{err:?}");
    }
    assert_eq!(server.count(), 0);
}

#[tokio::test]
async fn retrieve_environment_parses_status_and_keeps_other_fields() {
    let server = TestServer::start(vec![Reply::json(
        200,
        environment_json("env_7d2f", "connected"),
    )])
    .await;
    let env = client(&server, 3)
        .retrieve_environment(&EnvironmentId::new("env_7d2f"))
        .await
        .unwrap();
    assert_eq!(env.id, EnvironmentId::new("env_7d2f"));
    assert_eq!(env.object, "agent.environment");
    assert_eq!(env.kind, "self_hosted");
    assert_eq!(env.status, EnvironmentStatus::Connected);
    assert!(env.extra.contains_key("files"));
    let seen = server.requests();
    assert_eq!(seen[0].method, "GET");
    assert_eq!(seen[0].path, "/v1/agents/environments/env_7d2f");
    assert_eq!(seen[0].header("openai-beta"), Some("agents=v1"));
}

#[tokio::test]
async fn list_turns_passes_cursor_params_through_and_parses_the_page() {
    let page = json!({
        "object": "list",
        "data": [
            turn_json("turn_3", "sess_abc", "in_progress", 1_789_000_300),
            turn_json("turn_2", "sess_abc", "completed", 1_789_000_200)
        ],
        "first_id": "turn_3",
        "last_id": "turn_2",
        "has_more": true
    });
    let server = TestServer::start(vec![Reply::json(200, page)]).await;
    let api = client(&server, 3);
    let params = PageParams {
        after: Some("turn_4".into()),
        limit: Some(2),
        order: Some(Order::Desc),
    };
    let turns = api
        .list_turns(&SessionId::new("sess_abc"), &params)
        .await
        .unwrap();
    assert_eq!(turns.data.len(), 2);
    assert_eq!(turns.data[0].id, "turn_3");
    assert_eq!(turns.data[0].status, TurnStatus::InProgress);
    assert_eq!(turns.data[1].status, TurnStatus::Completed);
    assert!(turns.has_more);
    assert_eq!(turns.last_id.as_deref(), Some("turn_2"));
    assert_eq!(turns.extra["first_id"], "turn_3");

    // No parameters: nothing in the query string (API defaults apply).
    api.list_turns(&SessionId::new("sess_abc"), &PageParams::default())
        .await
        .unwrap();
    // Ascending with a limit only.
    api.list_turns(
        &SessionId::new("sess_abc"),
        &PageParams {
            limit: Some(100),
            order: Some(Order::Asc),
            ..PageParams::default()
        },
    )
    .await
    .unwrap();

    let seen = server.requests();
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter()
            .all(|s| s.path == "/v1/agents/sessions/sess_abc/turns")
    );
    assert_eq!(
        seen[0].query.as_deref(),
        Some("after=turn_4&limit=2&order=desc")
    );
    assert_eq!(seen[1].query, None);
    assert_eq!(seen[2].query.as_deref(), Some("limit=100&order=asc"));
}

#[tokio::test]
async fn list_turn_items_uses_the_turn_path_and_parses_tool_statuses() {
    let page = json!({
        "object": "list",
        "data": [
            {"id": "msg_1", "type": "message", "role": "user", "status": "completed",
             "turn_id": "turn_3", "content": [{"type": "input_text", "text": "run the tests"}]},
            {"id": "ce_1", "type": "command_execution", "status": "failed", "turn_id": "turn_3",
             "command": "cargo test", "cwd": "/workspace", "exit_code": null, "output": ""},
            {"id": "fco_1", "type": "function_call_output", "status": "completed",
             "turn_id": "turn_3", "call_id": "call_1", "error": null}
        ],
        "first_id": "msg_1",
        "last_id": "fco_1",
        "has_more": false
    });
    let server = TestServer::start(vec![Reply::json(200, page)]).await;
    let items = client(&server, 3)
        .list_turn_items(
            &SessionId::new("sess_abc"),
            "turn_3",
            &PageParams {
                limit: Some(50),
                order: Some(Order::Asc),
                after: Some("item_0".into()),
            },
        )
        .await
        .unwrap();
    assert_eq!(items.data.len(), 3);
    assert_eq!(items.data[0].kind, "message");
    assert_eq!(items.data[0].status, Some(ItemStatus::Completed));
    assert_eq!(items.data[1].kind, "command_execution");
    assert_eq!(items.data[1].status, Some(ItemStatus::Failed));
    assert_eq!(items.data[2].status, Some(ItemStatus::Completed));
    assert!(!items.has_more);

    let seen = server.requests();
    assert_eq!(
        seen[0].path,
        "/v1/agents/sessions/sess_abc/turns/turn_3/items"
    );
    assert_eq!(
        seen[0].query.as_deref(),
        Some("after=item_0&limit=50&order=asc")
    );
    assert_eq!(seen[0].header("openai-beta"), Some("agents=v1"));
}

#[tokio::test]
async fn limit_out_of_range_is_rejected_before_any_request() {
    let server = TestServer::start(vec![Reply::json(200, json!({"data": []}))]).await;
    let api = client(&server, 3);
    let session = SessionId::new("sess_abc");
    for limit in [0, 101, 1000] {
        let page = PageParams {
            limit: Some(limit),
            ..PageParams::default()
        };
        let err = api.list_turns(&session, &page).await.unwrap_err();
        match &err {
            ApiError::InvalidArgument { reason } => {
                assert!(reason.contains("between 1 and 100"), "{reason}");
                assert!(reason.contains(&limit.to_string()), "{reason}");
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        assert_eq!(err.unavailable(), None);
        let err = api
            .list_turn_items(&session, "turn_1", &page)
            .await
            .unwrap_err();
        assert!(matches!(err, ApiError::InvalidArgument { .. }), "{err:?}");
    }
    assert_eq!(server.count(), 0, "no request may be sent");
}

#[tokio::test]
async fn empty_ids_are_rejected_before_any_request() {
    let server = TestServer::start(vec![Reply::json(200, json!({"data": []}))]).await;
    let api = client(&server, 3);
    let err = api.retrieve_session(&SessionId::new("")).await.unwrap_err();
    assert!(matches!(err, ApiError::InvalidArgument { .. }), "{err:?}");
    let err = api
        .list_turn_items(&SessionId::new("sess_abc"), "", &PageParams::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::InvalidArgument { .. }), "{err:?}");
    assert_eq!(server.count(), 0);
}

#[tokio::test]
async fn ids_are_percent_encoded_as_one_path_segment() {
    let server = TestServer::start(vec![Reply::error(404)]).await;
    let err = client(&server, 3)
        .retrieve_session(&SessionId::new("../environments/env_1"))
        .await
        .unwrap_err();
    assert!(err.is_not_found());
    assert_eq!(
        server.requests()[0].path,
        "/v1/agents/sessions/..%2Fenvironments%2Fenv_1"
    );
}

#[tokio::test]
async fn calls_run_inside_tokio_spawn() {
    let server = TestServer::start(vec![Reply::json(200, session_json("sess_abc"))]).await;
    let api = Arc::new(client(&server, 3));

    // Generic over the trait, as the controller uses it.
    async fn status_of<A: SessionsApi + 'static>(api: Arc<A>) -> SessionStatus {
        tokio::spawn(async move {
            api.retrieve_session(&SessionId::new("sess_abc"))
                .await
                .unwrap()
                .status
        })
        .await
        .unwrap()
    }
    assert_eq!(status_of(api).await, SessionStatus::RequiresAction);
}
