//! API surface: authentication, JSON shapes (parsed with the sandbox-core models and the
//! controller's own client), pagination, and an optional dump of produced JSON for the
//! Python SDK cross-check (`SIM_JSON_OUT`).

mod common;

use agents_sim::{SessionEnvironment, SimConfig, SimState, router, spawn};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use sandbox_agents_api::{AgentsClient, ApiError, ClientConfig, PageParams, SessionsApi};
use sandbox_core::environment::{EnvironmentInfo, EnvironmentStatus};
use sandbox_core::session::{Session, SessionStatus};
use sandbox_core::turn::{Item, Page, Turn, TurnStatus};
use sandbox_core::{EnvironmentId, SessionId};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;
use tower::ServiceExt;

async fn call(state: &SimState, req: Request<Body>) -> (StatusCode, Value) {
    let resp = router(state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    (status, body)
}

fn req(
    method: &str,
    uri: &str,
    auth: Option<&str>,
    beta: bool,
    body: Option<Value>,
) -> Request<Body> {
    let mut b = Request::builder().method(method).uri(uri);
    if let Some(key) = auth {
        b = b.header("authorization", format!("Bearer {key}"));
    }
    if beta {
        b = b.header("openai-beta", "agents=v1");
    }
    match body {
        Some(v) => b
            .header("content-type", "application/json")
            .body(Body::from(v.to_string()))
            .unwrap(),
        None => b.body(Body::empty()).unwrap(),
    }
}

fn assert_error_shape(body: &Value) {
    let e = body["error"].as_object().expect("error object");
    for k in ["message", "type", "param", "code"] {
        assert!(e.contains_key(k), "error.{k} in {body}");
    }
    assert!(!body.to_string().contains("sk-"), "no key echoed");
}

#[tokio::test]
async fn agents_endpoints_require_the_api_key_and_the_beta_header() {
    let cfg = SimConfig::default().with_keys("sk-test-api", "sk-test-exec");
    let state = SimState::new(cfg, "http://127.0.0.1:9").unwrap();
    let create = json!({"environment": {"type": "self_hosted"}});

    let (s, b) = call(
        &state,
        req(
            "POST",
            "/v1/agents/sessions",
            None,
            true,
            Some(create.clone()),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_error_shape(&b);
    let (s, _) = call(
        &state,
        req(
            "POST",
            "/v1/agents/sessions",
            Some("sk-wrong"),
            true,
            Some(create.clone()),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = call(
        &state,
        req(
            "POST",
            "/v1/agents/sessions",
            Some("sk-test-exec"),
            true,
            Some(create.clone()),
        ),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::UNAUTHORIZED,
        "the executor key is not an API key"
    );
    let (s, b) = call(
        &state,
        req(
            "POST",
            "/v1/agents/sessions",
            Some("sk-test-api"),
            false,
            Some(create.clone()),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(b["error"]["code"], json!("beta_header_required"));
    let (s, session) = call(
        &state,
        req(
            "POST",
            "/v1/agents/sessions",
            Some("sk-test-api"),
            true,
            Some(create),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let remote_url = session["environment"]["remote_url"].as_str().unwrap();
    assert_eq!(remote_url, "http://127.0.0.1:9/v1");
    // The executor's registration (../shared/reference/executor-protocol.md): codex posts
    // to `{remote_url}/cloud/environment/{id}/register` with the executor key.
    let env_id = session["environment"]["id"].as_str().unwrap().to_owned();
    let register = &format!("/v1/cloud/environment/{env_id}/register");
    let keys = json!({
        "security_profile": "noise_hybrid_ik_v1",
        "executor_public_key": {
            "suite": "Noise_hybridIK_X25519+MLKEM768_AESGCM_SHA256",
            "x25519_public_key": B64.encode([7u8; 32]),
            "mlkem768_public_key": B64.encode([9u8; 1184]),
        },
    });
    let (s, b) = call(
        &state,
        req(
            "POST",
            register,
            Some("sk-test-api"),
            false,
            Some(keys.clone()),
        ),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::UNAUTHORIZED,
        "the API key is not an executor key"
    );
    assert_error_shape(&b);
    let (s, _) = call(
        &state,
        req("POST", register, None, false, Some(keys.clone())),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, b) = call(
        &state,
        req(
            "POST",
            "/v1/cloud/environment/env_unknown/register",
            Some("sk-test-exec"),
            false,
            Some(keys.clone()),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_error_shape(&b);
    let (s, b) = call(
        &state,
        req(
            "POST",
            register,
            Some("sk-test-exec"),
            false,
            Some(json!({"security_profile": "plain"})),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_error_shape(&b);
    let (s, c) = call(
        &state,
        req("POST", register, Some("sk-test-exec"), false, Some(keys)),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(c["environment_id"], json!(env_id));
    assert_eq!(c["security_profile"], json!("noise_hybrid_ik_v1"));
    assert!(
        c["url"]
            .as_str()
            .unwrap()
            .starts_with("ws://127.0.0.1:9/v1/cloud/rendezvous/"),
        "{c}"
    );
    assert!(
        c["executor_registration_id"]
            .as_str()
            .unwrap()
            .starts_with("exreg_")
    );
    // Registered is not connected: that takes the rendezvous socket.
    let (_, snap) = call(&state, req("GET", "/sim/state", None, false, None)).await;
    assert_eq!(snap["environments"][0]["connected"], json!(false));
    assert_eq!(snap["environments"][0]["registrations"], json!(1));
    assert_eq!(snap["environments"][0]["refused_registrations"], json!(2));
    // The simulated connection (control, no auth).
    let (s, c) = call(
        &state,
        req(
            "POST",
            &format!("/sim/environments/{env_id}/connect"),
            None,
            false,
            None,
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(c["status"], json!("connected"));

    let (s, b) = call(
        &state,
        req("GET", "/v1/nothing/here", Some("sk-test-api"), true, None),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_error_shape(&b);
    let (s, b) = call(
        &state,
        req(
            "POST",
            "/v1/agents/sessions",
            Some("sk-test-api"),
            true,
            Some(json!({"environment": {"type": "moon"}})),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(b["error"]["param"], json!("environment.type"));
    let (s, _) = call(
        &state,
        req(
            "POST",
            "/v1/agents/sessions",
            Some("sk-test-api"),
            true,
            Some(json!({"environment": {"type": "none"}, "metadata": {"k": 1}})),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _) = call(
        &state,
        req(
            "GET",
            "/v1/agents/sessions?limit=0",
            Some("sk-test-api"),
            true,
            None,
        ),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);

    // The control endpoints need no key.
    let (s, snap) = call(&state, req("GET", "/sim/state", None, false, None)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(snap["environments"][0]["connected"], json!(true));
    state.shutdown();
}

#[tokio::test]
async fn an_idempotency_key_replays_the_first_answer_and_refuses_other_requests() {
    let state = SimState::new(SimConfig::default(), "http://127.0.0.1:9").unwrap();
    let key = agents_sim::DEFAULT_API_KEY;
    let body = json!({"environment": {"type": "self_hosted"}});
    let mk = |body: Value| {
        let mut r = req("POST", "/v1/agents/sessions", Some(key), true, Some(body));
        r.headers_mut()
            .insert("idempotency-key", "create-1".parse().unwrap());
        r
    };
    let (s1, a) = call(&state, mk(body.clone())).await;
    let (s2, b) = call(&state, mk(body)).await;
    assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK));
    assert_eq!(a, b, "one session, not two");
    assert_eq!(state.snapshot().sessions.len(), 1);
    let (s3, e) = call(&state, mk(json!({"environment": {"type": "none"}}))).await;
    assert_eq!(s3, StatusCode::BAD_REQUEST);
    assert_eq!(e["error"]["code"], json!("idempotency_key_reused"));
    state.shutdown();
}

#[tokio::test]
async fn sessions_list_pages_with_cursors_and_filters() {
    let sim = spawn(SimConfig::default()).await.unwrap();
    let client = sim.client();
    let mut ids = Vec::new();
    for i in 0..5 {
        let tenant = if i % 2 == 0 { "acme" } else { "other" };
        let agent = if i == 4 { "agent_other" } else { "agent_main" };
        let s = client
            .create_session_json(&json!({
                "environment": {"type": "self_hosted", "workspace_directory": "/srv/work"},
                "agent": {"id": agent},
                "metadata": {"tenant": tenant},
            }))
            .await
            .unwrap();
        assert_eq!(s["environment"]["workspace_directory"], json!("/srv/work"));
        assert_eq!(s["metadata"]["tenant"], json!(tenant));
        ids.push(s["id"].as_str().unwrap().to_owned());
    }
    let page = client.get_json("/agents/sessions?limit=2").await.unwrap();
    let got: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        got,
        [ids[4].as_str(), ids[3].as_str()],
        "newest first by default"
    );
    assert_eq!(page["has_more"], json!(true));
    assert_eq!(page["object"], json!("list"));
    let after = page["last_id"].as_str().unwrap();
    let next = client
        .get_json(&format!("/agents/sessions?limit=2&after={after}"))
        .await
        .unwrap();
    assert_eq!(next["data"][0]["id"], json!(ids[2]));
    let acme = client
        .get_json("/agents/sessions?order=asc&metadata[tenant]=acme")
        .await
        .unwrap();
    let got: Vec<&str> = acme["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, [ids[0].as_str(), ids[2].as_str(), ids[4].as_str()]);
    let other_agent = client
        .get_json("/agents/sessions?agent_id=agent_other")
        .await
        .unwrap();
    assert_eq!(other_agent["data"].as_array().unwrap().len(), 1);
    let page: Page<Session> = serde_json::from_value(next).unwrap();
    assert_eq!(page.data.len(), 2);
    sim.shutdown().await;
}

#[tokio::test]
async fn the_controllers_agents_api_client_reads_the_simulator() {
    let sim = spawn(SimConfig::default().with_turn_secs(6.0))
        .await
        .unwrap();
    let sim_client = sim.client();
    let mut config = ClientConfig::new(agents_sim::DEFAULT_API_KEY);
    config.base_url = sim.base_url();
    let api = AgentsClient::new(config).unwrap();

    let created = sim_client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let env_id = created.self_hosted().unwrap().id.clone();
    let turn_id = sim_client
        .submit_message(created.id.as_str(), "hi")
        .await
        .unwrap()
        .unwrap();
    let s = api.retrieve_session(&created.id).await.unwrap();
    assert_eq!(s.status, SessionStatus::RequiresAction);
    assert!(s.requires_connection_of(&env_id));
    let e = api.retrieve_environment(&env_id).await.unwrap();
    assert_eq!(e.status, EnvironmentStatus::Pending);

    sim_client.connect(env_id.as_str()).await.unwrap();
    sim_client
        .wait_for_status(created.id.as_str(), SessionStatus::Idle, common::WAIT)
        .await
        .unwrap();
    let turns = api
        .list_turns(&created.id, &PageParams::latest(1))
        .await
        .unwrap();
    assert_eq!(turns.data[0].id, turn_id);
    assert_eq!(turns.data[0].status, TurnStatus::Completed);
    let items = api
        .list_turn_items(&created.id, &turn_id, &PageParams::default())
        .await
        .unwrap();
    assert!(items.data.iter().any(|i| i.kind == "command_execution"));
    assert_eq!(items.last_id, items.data.last().and_then(|i| i.id.clone()));

    let deleted = api.delete_session(&created.id, "delete-1").await.unwrap();
    assert!(deleted.deleted);
    let replay = api.delete_session(&created.id, "delete-1").await.unwrap();
    assert_eq!(replay, deleted);
    assert!(matches!(
        api.retrieve_session(&created.id).await,
        Err(ApiError::NotFound { .. })
    ));
    assert!(matches!(
        api.retrieve_environment(&EnvironmentId::new(env_id.as_str()))
            .await,
        Err(ApiError::NotFound { .. })
    ));
    assert!(matches!(
        api.retrieve_session(&SessionId::new("sess_unknown")).await,
        Err(ApiError::NotFound { .. })
    ));
    sim.shutdown().await;
}

/// Produces one document of every kind the simulator serves, checks each parses with the
/// sandbox-core models, and writes them under `$SIM_JSON_OUT/{sessions,environments,turns,
/// items,webhooks,pages}/` when that variable is set (for
/// `crates/agents-sim/crosscheck/validate_sim_json.py`, which validates them strictly
/// against the official SDK models). Without the variable nothing is written.
#[tokio::test]
async fn produced_json_parses_and_is_written_for_the_sdk_crosscheck() {
    let (sim, rx) = common::sim_with_receiver(0, |c| c.time_scale = 0.0).await;
    let client = sim.client();
    let mut docs: Vec<(String, Value)> = Vec::new();
    let put =
        |docs: &mut Vec<(String, Value)>, name: &str, v: Value| docs.push((name.to_owned(), v));

    // self_hosted: idle, requires_action, in_progress, idle after a turn, failed.
    let a = client
        .create_session_json(
            &json!({"environment": {"type": "self_hosted", "workspace_directory": "/workspace"},
                                     "metadata": {"tenant": "acme"}}),
        )
        .await
        .unwrap();
    let sid = a["id"].as_str().unwrap().to_owned();
    let env_id = a["environment"]["id"].as_str().unwrap().to_owned();
    put(&mut docs, "sessions/self_hosted.idle.new.json", a);
    let waiting_turn = client
        .submit_message(&sid, "Run the tests.")
        .await
        .unwrap()
        .unwrap();
    put(
        &mut docs,
        "sessions/self_hosted.requires_action.environment_connection.json",
        client.get_session_json(&sid).await.unwrap(),
    );
    put(
        &mut docs,
        "environments/self_hosted.pending.json",
        client
            .get_json(&format!("/agents/environments/{env_id}"))
            .await
            .unwrap(),
    );
    put(
        &mut docs,
        "turns/queued.json",
        client
            .get_json(&format!("/agents/sessions/{sid}/turns/{waiting_turn}"))
            .await
            .unwrap(),
    );
    put(
        &mut docs,
        "items/queued.json",
        client
            .get_json(&format!(
                "/agents/sessions/{sid}/turns/{waiting_turn}/items"
            ))
            .await
            .unwrap(),
    );
    let conn = client.connect(&env_id).await.unwrap();
    put(
        &mut docs,
        "sessions/self_hosted.in_progress.json",
        client.get_session_json(&sid).await.unwrap(),
    );
    put(
        &mut docs,
        "environments/self_hosted.connected.json",
        client
            .get_json(&format!("/agents/environments/{env_id}"))
            .await
            .unwrap(),
    );
    put(
        &mut docs,
        "turns/in_progress.json",
        client
            .get_json(&format!("/agents/sessions/{sid}/turns/{waiting_turn}"))
            .await
            .unwrap(),
    );
    put(
        &mut docs,
        "items/in_progress.json",
        client
            .get_json(&format!(
                "/agents/sessions/{sid}/turns/{waiting_turn}/items?order=asc"
            ))
            .await
            .unwrap(),
    );
    sim.advance_clock(30.0);
    client
        .wait_for_status(&sid, SessionStatus::Idle, common::WAIT)
        .await
        .unwrap();
    put(
        &mut docs,
        "sessions/self_hosted.idle.after_turn.json",
        client.get_session_json(&sid).await.unwrap(),
    );
    put(
        &mut docs,
        "turns/completed.json",
        client
            .get_json(&format!("/agents/sessions/{sid}/turns/{waiting_turn}"))
            .await
            .unwrap(),
    );
    put(
        &mut docs,
        "items/completed.json",
        client
            .get_json(&format!(
                "/agents/sessions/{sid}/turns/{waiting_turn}/items?order=asc"
            ))
            .await
            .unwrap(),
    );
    // Mid-turn disconnect.
    let cut_turn = client
        .submit_message(&sid, "Again.")
        .await
        .unwrap()
        .unwrap();
    client.disconnect(&env_id, Some(&conn)).await.unwrap();
    put(
        &mut docs,
        "environments/self_hosted.disconnected.json",
        client
            .get_json(&format!("/agents/environments/{env_id}"))
            .await
            .unwrap(),
    );
    put(
        &mut docs,
        "items/failed_command_execution.json",
        client
            .get_json(&format!(
                "/agents/sessions/{sid}/turns/{cut_turn}/items?order=asc"
            ))
            .await
            .unwrap(),
    );
    put(
        &mut docs,
        "pages/turns.json",
        client
            .get_json(&format!("/agents/sessions/{sid}/turns"))
            .await
            .unwrap(),
    );
    put(
        &mut docs,
        "items/session_items.json",
        client
            .get_json(&format!("/agents/sessions/{sid}/items?limit=100"))
            .await
            .unwrap(),
    );
    // Input failing at the deadline.
    let late_turn = client
        .submit_message(&sid, "Nobody connects.")
        .await
        .unwrap()
        .unwrap();
    sim.advance_clock(301.0);
    client
        .wait_for_status(&sid, SessionStatus::Idle, common::WAIT)
        .await
        .unwrap();
    put(
        &mut docs,
        "turns/failed.json",
        client
            .get_json(&format!("/agents/sessions/{sid}/turns/{late_turn}"))
            .await
            .unwrap(),
    );
    // Function call.
    client.require_function_call(&sid).await.unwrap();
    put(
        &mut docs,
        "sessions/self_hosted.requires_action.function_call.json",
        client.get_session_json(&sid).await.unwrap(),
    );
    // Failed session.
    let b = client
        .create_session(SessionEnvironment::self_hosted())
        .await
        .unwrap();
    client
        .fail_session(
            b.id.as_str(),
            Some("The self-hosted environment did not connect within 5 minutes."),
        )
        .await
        .unwrap();
    put(
        &mut docs,
        "sessions/self_hosted.failed.json",
        client.get_session_json(b.id.as_str()).await.unwrap(),
    );
    // Hosted and none.
    for (name, env) in [
        ("openai_hosted", json!({"type": "openai_hosted"})),
        ("none", json!({"type": "none"})),
    ] {
        let s = client
            .create_session_json(&json!({"environment": env}))
            .await
            .unwrap();
        put(&mut docs, &format!("sessions/{name}.idle.json"), s.clone());
        if name == "openai_hosted" {
            let id = s["environment"]["id"].as_str().unwrap();
            put(
                &mut docs,
                "environments/openai_hosted.ready.json",
                client
                    .get_json(&format!("/agents/environments/{id}"))
                    .await
                    .unwrap(),
            );
        }
    }
    put(
        &mut docs,
        "pages/sessions.json",
        client.get_json("/agents/sessions?limit=100").await.unwrap(),
    );
    let deleted = client.delete_session(b.id.as_str(), None).await.unwrap();
    put(&mut docs, "deleted/session.json", deleted);

    // Webhooks, exactly as received.
    assert!(sim.wait_deliveries_idle(common::WAIT).await);
    let mut seen = std::collections::BTreeSet::new();
    for r in rx.accepted() {
        let suffix = match &r.kind {
            sandbox_core::event::AgentEvent::SessionActionRequired(d) => {
                format!(
                    ".{}",
                    serde_json::to_value(d.required_action.kind)
                        .unwrap()
                        .as_str()
                        .unwrap()
                )
            }
            _ => String::new(),
        };
        let name = format!("webhooks/{}{suffix}.json", r.event.kind);
        if seen.insert(name.clone()) {
            put(&mut docs, &name, serde_json::from_slice(&r.raw).unwrap());
        }
    }
    for kind in [
        "agent.session.created",
        "agent.session.action_required.environment_connection",
        "agent.session.action_required.function_call",
        "agent.session.in_progress",
        "agent.session.idle",
        "agent.session.failed",
    ] {
        assert!(
            seen.contains(&format!("webhooks/{kind}.json")),
            "{kind} delivered"
        );
    }

    // Every document parses with the core models.
    for (name, v) in &docs {
        let folder = name.split('/').next().unwrap();
        let ok = match folder {
            "sessions" => serde_json::from_value::<Session>(v.clone()).is_ok(),
            "environments" => serde_json::from_value::<EnvironmentInfo>(v.clone()).is_ok(),
            "turns" => serde_json::from_value::<Turn>(v.clone()).is_ok(),
            "items" => serde_json::from_value::<Page<Item>>(v.clone()).is_ok(),
            "pages" if name.contains("turns") => {
                serde_json::from_value::<Page<Turn>>(v.clone()).is_ok()
            }
            "pages" => serde_json::from_value::<Page<Session>>(v.clone()).is_ok(),
            "webhooks" => sandbox_core::event::WebhookEvent::from_slice(v.to_string().as_bytes())
                .and_then(|e| e.parse_kind())
                .is_ok(),
            "deleted" => v["deleted"] == json!(true),
            _ => false,
        };
        assert!(ok, "{name} parses: {v}");
    }
    let failed_cmd = docs
        .iter()
        .find(|(n, _)| n == "items/failed_command_execution.json")
        .unwrap();
    assert!(
        failed_cmd.1["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["status"] == json!("failed"))
    );

    if let Some(dir) = std::env::var_os("SIM_JSON_OUT").filter(|d| !d.is_empty()) {
        let root = PathBuf::from(dir);
        for (name, v) in &docs {
            let path = root.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, serde_json::to_string_pretty(v).unwrap() + "\n").unwrap();
        }
        eprintln!("wrote {} documents under {}", docs.len(), root.display());
    }
    sim.shutdown().await;
    let _ = Duration::ZERO;
}
