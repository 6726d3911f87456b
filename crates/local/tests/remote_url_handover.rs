//! The `remote_url` the local executor is handed is exactly the text the
//! allowlist checked. Each candidate goes through the real decision (`decide`) and, when
//! it starts, through [`ProcessCompute`] to a real child that writes `$REMOTE_URL` and
//! its `--remote`-style argument to a file; a refused one never reaches a start.

use sandbox_controller::ports::{Compute, NO_DEADLINE, Started};
use sandbox_core::decision::{Effect, Outcome, decide};
use sandbox_core::ids::{DeploymentId, EnvironmentId, SessionId};
use sandbox_core::observed::{
    EnvironmentRead, Inventory, Observed, OwnershipFilter, Policy, SessionView, Trigger,
};
use sandbox_core::session::{
    Agent, Environment, RequiredAction, SelfHostedEnvironment, Session, SessionStatus,
};
use sandbox_local::{
    ExecutorCommand, ExecutorKey, KeySource, ProcessCompute, ProcessComputeConfig,
};
use std::time::{Duration, Instant};

const NOW: u64 = 1_800_000_000;

fn observed(env: &str, remote_url: &str, allow: &[&str]) -> Observed {
    let env = EnvironmentId::new(env);
    let session = Session {
        id: SessionId::new("sess_url"),
        object: "agent.session".into(),
        agent: Agent {
            id: "agent_1".into(),
            extra: Default::default(),
        },
        created_at: (NOW - 60) as i64,
        last_active_at: (NOW - 1) as i64,
        status: SessionStatus::RequiresAction,
        required_actions: vec![RequiredAction::EnvironmentConnection {
            environment_id: env.clone(),
        }],
        environment: Environment::SelfHosted(SelfHostedEnvironment {
            id: env.clone(),
            remote_url: remote_url.into(),
            workspace_directory: "/workspace".into(),
            capability_directories: vec![],
            extra: Default::default(),
        }),
        metadata: Default::default(),
        error: None,
        extra: Default::default(),
    };
    let policy = Policy {
        remote_url_allowlist: sandbox_core::remote_url::Allowlist::new(allow.iter().copied()),
        ..Policy::default()
    };
    Observed {
        trigger: Trigger::ConnectionRequested,
        environment_id: env,
        session: SessionView::Found {
            session: Box::new(session),
        },
        environment_status: EnvironmentRead::NotRead,
        record: None,
        inventory: Inventory::Known { instances: vec![] },
        latest_turn: None,
        filter: OwnershipFilter::default(),
        policy,
        now: NOW,
        turn_not_found: false,
        turns_read: false,
        snapshot: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_url_the_executor_gets_is_the_one_the_allowlist_checked() {
    let allow = ["api.openai.com", "http://127.0.0.1", "http://[::1]"];
    // (text, starts?) — every form the issue names, plus the canonical ones.
    let cases = [
        (
            "wss://api.openai.com/v1/agents/environments/env_url/connect",
            true,
        ),
        (
            "http://127.0.0.1:4010/v1/environments/env_url/connect?t=a%20b",
            true,
        ),
        ("http://[::1]:4010/v1/x", true),
        ("wss://api.openai.com\\@evil.test/x", false),
        ("wss://api%2eopenai%2ecom/x", false),
        ("wss://api.open\tai.com/x", false),
        ("wss://api.openai\n.com/x", false),
        ("wss://api\u{ff0e}openai\u{ff0e}com/x", false),
        ("WSS://api.openai.com/x", false),
        ("wss:api.openai.com/x", false),
        ("https://API.OPENAI.COM/x", false),
        ("wss://api.openai.com:443/x", false),
        ("http://2130706433:4010/x", false),
        ("http://0x7f.1:4010/x", false),
        ("http://0177.0.0.1:4010/x", false),
        ("https://api.openai.com@evil.test/", false),
        ("https://evil.test/x", false),
    ];
    let dir = tempfile::tempdir().unwrap();
    let script = r#"{ printf '%s\n' "$REMOTE_URL"; printf '%s\n' "$1"; echo END; } > url.txt; exec sleep 300"#;
    let mut config = ProcessComputeConfig::new(
        ExecutorCommand::new("sh", ["-c", script, "sh", "$REMOTE_URL"]),
        dir.path().join("workspaces"),
        KeySource::Value(ExecutorKey::new("sk-test")),
        dir.path().join("state.db"),
    );
    config.stop_grace = Duration::from_secs(2);
    config.kill_on_drop = true;
    let compute = ProcessCompute::open(config).unwrap();
    let checked = sandbox_core::remote_url::Allowlist::new(allow);
    let mut started = 0;
    for (i, (text, starts)) in cases.into_iter().enumerate() {
        // One environment per case: a start is idempotent per (environment, generation).
        let env = format!("env_url{i}");
        let d = decide(&observed(&env, text, &allow));
        let spec = d.effects.iter().find_map(|e| match e {
            Effect::StartCompute(s) => Some(s.clone()),
            _ => None,
        });
        assert_eq!(checked.check(text).is_ok(), starts, "{text:?}");
        let Some(spec) = spec else {
            assert!(!starts, "{text:?} was accepted but not started: {d:?}");
            assert_eq!(d.outcome, Outcome::Reconcile, "{text:?}");
            continue;
        };
        assert!(starts, "{text:?} reached a start");
        let inst = match compute
            .start(&spec, &DeploymentId::new("dep").unwrap(), NO_DEADLINE)
            .await
            .unwrap()
        {
            Started::Instance(i) => i,
            Started::Failed { reason } => panic!("start failed: {reason}"),
        };
        let file = dir
            .path()
            .join("workspaces")
            .join(&env)
            .join(format!("g{}", spec.generation.0))
            .join("url.txt");
        let deadline = Instant::now() + Duration::from_secs(10);
        let got = loop {
            if let Ok(s) = std::fs::read_to_string(&file)
                && s.ends_with("END\n")
            {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "{} never written",
                file.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // Byte for byte the text that was checked, in the variable and the argument, and
        // the text is its own WHATWG serialisation.
        assert_eq!(got, format!("{text}\n{text}\nEND\n"), "{text:?}");
        assert_eq!(url::Url::parse(text).unwrap().as_str(), text);
        compute
            .stop(&inst.instance_id, "test", u64::MAX)
            .await
            .unwrap();
        started += 1;
    }
    assert_eq!(started, 3);
    compute.shutdown_all().await.unwrap();
}
