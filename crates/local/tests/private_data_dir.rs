//! Local mode's data directory is the owner's only — the directory 0700,
//! every file the controller writes in it 0600 (registry and queue databases with their
//! WAL files, executor logs, snapshots, the settings file), also when the directory
//! existed with a wider mode.

use sandbox_controller::config::ControllerConfig;
use sandbox_controller::job::Job;
use sandbox_controller::ports::{Compute, NO_DEADLINE, Outgoing, Queue, Started};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation, SessionId, idempotency_token};
use sandbox_core::observed::Trigger;
use sandbox_local::{
    ExecutorCommand, ExecutorKey, KeySource, ProcessCompute, ProcessComputeConfig, QueueOptions,
    SqliteQueue, SqliteRegistry,
};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// Every regular file under `dir`, except inside the executors' own workspaces
/// (`workspaces/<env>/g<N>/`: what an executor writes there is its own).
fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            let executor_workspace = name.starts_with('g')
                && name[1..].chars().all(|c| c.is_ascii_digit())
                && p.ancestors()
                    .any(|a| a.file_name().is_some_and(|n| n == "workspaces"));
            if !executor_workspace {
                files(&p, out);
            }
        } else {
            out.push(p);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_data_dir_is_private() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // A directory left 0755 by an older version is narrowed too.
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    sandbox_local::private::create_private_dir(&data).unwrap();

    let _registry = SqliteRegistry::open(data.join("sandbox.db")).unwrap();
    let events = SqliteQueue::open(data.join("queues.db"), "events", QueueOptions::fifo()).unwrap();
    let job = Job {
        handoffs: 0,
        trigger: Trigger::Close,
        session_id: SessionId::new("sess_1"),
        environment_id: None,
        webhook_id: None,
        enqueued_at: 1,
        swept: None,
        operator_proof: None,
    };
    events
        .send(Outgoing {
            group: "sess_1".into(),
            dedup_id: "d1".into(),
            job,
            delay_secs: 0,
        })
        .await
        .unwrap();

    let mut config = ProcessComputeConfig::new(
        ExecutorCommand::new("sh", ["-c", "echo executor up; exec sleep 30"]),
        data.join("workspaces"),
        KeySource::Value(ExecutorKey::new("sk-test")),
        data.join("sandbox.db"),
    );
    config.stop_grace = Duration::from_secs(2);
    config.kill_on_drop = true;
    let compute = ProcessCompute::open(config).unwrap();
    let env = EnvironmentId::new("env_1");
    let spec = StartSpec {
        session_id: SessionId::new("sess_1"),
        remote_url: "wss://api.openai.com/x".into(),
        workspace_directory: "/workspace".into(),
        generation: Generation(1),
        idempotency_token: idempotency_token(&env, Generation(1)),
        environment_id: env,
        previous: None,
        restore: None,
    };
    let deployment = DeploymentId::new("local").unwrap();
    match compute
        .start(&spec, &deployment, NO_DEADLINE)
        .await
        .unwrap()
    {
        Started::Instance(_) => {}
        Started::Failed { reason } => panic!("start failed: {reason}"),
    }
    compute.shutdown_all().await.unwrap();

    sandbox_local::settings_file::write(&data, &ControllerConfig::new(deployment)).unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f"), "x").unwrap();
    sandbox_local::workspace_archive::archive_dir(&src, &data.join("snapshots").join("s1.tar.zst"))
        .unwrap();

    assert_eq!(mode(&data), 0o700, "data directory");
    let mut all = vec![];
    files(&data, &mut all);
    let names: Vec<String> = all
        .iter()
        .map(|p| p.strip_prefix(&data).unwrap().display().to_string())
        .collect();
    for wanted in [
        "sandbox.db",
        "queues.db",
        "controller-settings.json",
        "snapshots/s1.tar.zst",
    ] {
        assert!(
            names.iter().any(|n| n == wanted),
            "{wanted} missing from {names:?}"
        );
    }
    assert!(
        names.iter().any(|n| n.ends_with(".log")),
        "an executor log: {names:?}"
    );
    assert!(
        names.iter().any(|n| n.ends_with("-wal")),
        "a WAL file: {names:?}"
    );
    for p in &all {
        assert_eq!(mode(p) & 0o077, 0, "{} is {:o}", p.display(), mode(p));
    }
}

#[test]
fn embedded_config_debug_names_no_secret() {
    let mut cfg = sandbox_local::embedded::EmbeddedConfig::new(
        "/tmp/x",
        sandbox_agents_api::ClientConfig::new("sk-api-key-value"),
        "whsec_webhooksecretvalue",
        ExecutorCommand::new("true", Vec::<String>::new()),
        KeySource::Value(ExecutorKey::new("sk-executor-key-value")),
        ControllerConfig::new(DeploymentId::new("local").unwrap()),
    );
    cfg.previous_webhook_secrets = vec!["whsec_previoussecretvalue".into()];
    let shown = format!("{cfg:?}");
    for secret in [
        "sk-api-key-value",
        "webhooksecretvalue",
        "sk-executor-key-value",
        "previoussecretvalue",
    ] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    assert!(shown.contains("webhook_tolerance_secs"), "{shown}");
}
