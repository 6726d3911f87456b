//! A controller killed between "compute started" and "record written" (SIGABRT through
//! `SANDBOX_CRASH_AT=after-compute-start`), restarted on the same database: the job comes
//! back from the durable queue and the existing executor is adopted — still exactly one.
//! `E2E_SERVE_LOG=info` shows the controllers' logs (`--no-capture`).

use agents_sim::{SimConfig, Url};
use sandbox_controller::ports::Registry as _;
use sandbox_core::ids::EnvironmentId;
use sandbox_e2e::{os_executors, workspace_binary};
use sandbox_local::SqliteRegistry;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn serve(dir: &Path, sim_base: &str, port: u16, crash: bool) -> Child {
    let key_file = dir.join("executor.key");
    let mut cmd = Command::new(workspace_binary("sandboxctl").unwrap());
    cmd.arg("serve")
        .args(["--agents-api", sim_base])
        .args(["--executor-key-file", key_file.to_str().unwrap()])
        .args([
            "--executor",
            workspace_binary("sim-executor").unwrap().to_str().unwrap(),
        ])
        .args(["--data-dir", dir.join("data").to_str().unwrap()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--deployment", "e2e-crash", "--grace-secs", "600"])
        .args(["--visibility-secs", "2", "--lock-ttl-secs", "3"])
        // The simulator's remote_url is http://127.0.0.1:PORT/... (issue 13 allowlist).
        .args(["--remote-url-allow", "http://127.0.0.1"])
        .arg("--stop-executors-on-exit")
        .args(["--", "exec-server"])
        .env("OPENAI_API_KEY", agents_sim::DEFAULT_API_KEY)
        .env("OPENAI_WEBHOOK_SECRET", agents_sim::DEFAULT_WEBHOOK_SECRET)
        .env(
            "RUST_LOG",
            std::env::var("E2E_SERVE_LOG").unwrap_or("warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if crash {
        cmd.env("SANDBOX_CRASH_AT", "after-compute-start");
    } else {
        cmd.env_remove("SANDBOX_CRASH_AT");
    }
    cmd.spawn().unwrap()
}

/// Kills what a failed assertion would otherwise leave running: the controllers and the
/// executors of the environment.
struct Reaper {
    pids: Vec<u32>,
    env: Option<String>,
}

impl Drop for Reaper {
    fn drop(&mut self) {
        let mut pids = self.pids.clone();
        if let Some(env) = &self.env {
            pids.extend(os_executors(Some(env)));
        }
        for pid in pids {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

async fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "serve never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_start_and_record_then_restarted_adopts_the_executor() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("executor.key"),
        agents_sim::DEFAULT_EXECUTOR_KEY,
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let sim = agents_sim::spawn(SimConfig::default().with_webhook(
        Url::parse(&format!("http://127.0.0.1:{port}/webhook")).unwrap(),
        agents_sim::DEFAULT_WEBHOOK_SECRET,
    ))
    .await
    .unwrap();
    let client = sim.client();

    let mut reaper = Reaper {
        pids: vec![],
        env: None,
    };
    let mut first = serve(dir.path(), &sim.base_url(), port, true);
    reaper.pids.push(first.id());
    wait_port(port).await;
    let s = client
        .create_session(agents_sim::SessionEnvironment::self_hosted())
        .await
        .unwrap();
    let env = s.self_hosted().unwrap().id.as_str().to_owned();
    reaper.env = Some(env.clone());
    client.submit_message(s.id.as_str(), "go").await.unwrap();

    // The controller dies right after starting the executor. A `sandboxctl` built without
    // sandbox-controller's `test-support` feature has no crash points and never exits.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = first.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "serve did not abort at SANDBOX_CRASH_AT=after-compute-start: was {} built \
             without sandbox-controller's test-support feature (build it with the workspace \
             test run, e.g. `make test`)?",
            workspace_binary("sandboxctl").unwrap().display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // 6 = SIGABRT (Linux): the crash point's abort, not some other failure.
    assert_eq!(
        status.signal(),
        Some(6),
        "the crash point aborts: {status:?}"
    );
    assert_eq!(
        os_executors(Some(&env)).len(),
        1,
        "the executor outlives the controller"
    );
    let db = dir.path().join("data").join("sandbox.db");
    let registry = SqliteRegistry::open(&db).unwrap();
    let key = EnvironmentId::new(env.as_str()).effect_key();
    let before = registry.get(&key).await.unwrap();
    assert!(
        before.as_ref().and_then(|r| r.instance.as_ref()).is_none(),
        "nothing recorded: {before:?}"
    );

    // Restart: the unacknowledged job reappears after its visibility timeout.
    let mut second = serve(dir.path(), &sim.base_url(), port, false);
    reaper.pids.push(second.id());
    let deadline = Instant::now() + Duration::from_secs(60);
    let record = loop {
        // The record is written before the decision's audit entry: wait for both.
        if let Some(r) = registry.get(&key).await.unwrap()
            && r.instance.is_some()
            && !registry.audit_entries(&key).await.unwrap().is_empty()
        {
            break r;
        }
        if Instant::now() >= deadline {
            let audit = registry.audit_entries(&key).await.unwrap();
            panic!(
                "never adopted: {:?}",
                audit
                    .iter()
                    .map(|e| (&e.outcome, &e.reason, &e.observed))
                    .collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let pids = os_executors(Some(&env));
    assert_eq!(pids.len(), 1, "still exactly one executor: {pids:?}");
    let audit = registry.audit_entries(&key).await.unwrap();
    // Adopted: by the redelivered job's start replaying the idempotency token while the
    // session still waits for its executor, or — once the executor connected and the
    // session went idle — by the sweep, which finds it connected (then leases it out).
    assert!(
        audit
            .iter()
            .any(|e| e.outcome == "adopt"
                || e.applied.iter().any(|a| a["effect"] == "adopt_compute")),
        "{:?}",
        audit.iter().map(|e| &e.outcome).collect::<Vec<_>>()
    );
    assert!(
        audit
            .iter()
            .all(|e| e.applied.iter().all(|a| a["effect"] != "start_compute")),
        "no second start"
    );
    assert_eq!(record.generation.0, 1);
    let state = client.state().await.unwrap();
    assert_eq!(state.environment(&env).unwrap().connect_count, 1);

    // SIGINT: serve stops and, with --stop-executors-on-exit, stops the executor.
    Command::new("kill")
        .args(["-INT", &second.id().to_string()])
        .status()
        .unwrap();
    let status = tokio::task::spawn_blocking(move || second.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(os_executors(Some(&env)).is_empty());
    sim.shutdown().await;
}
