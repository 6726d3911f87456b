//! A controller killed between "compute started" and "record written" (SIGABRT through
//! `SANDBOX_CRASH_AT=after-compute-start`), restarted on the same database: the job comes
//! back from the durable queue and the existing executor is adopted — still exactly one.
//! `E2E_SERVE_LOG=info` shows the controllers' logs (`--no-capture`).

use sandbox_controller::ports::Registry as _;
use sandbox_core::ids::EnvironmentId;
use sandbox_e2e::serve_process::{
    Reaper, free_port, interrupt, serve_command, sim_delivering_to, wait_port,
};
use sandbox_e2e::{os_executors, workspace_binary};
use sandbox_local::SqliteRegistry;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

fn serve(dir: &Path, sim_base: &str, port: u16, crash: bool) -> Child {
    let mut cmd = serve_command(
        dir,
        sim_base,
        port,
        &[
            "--deployment",
            "e2e-crash",
            "--grace-secs",
            "600",
            "--visibility-secs",
            "2",
            "--lock-ttl-secs",
            "3",
        ],
    );
    cmd.env("OPENAI_WEBHOOK_SECRET", agents_sim::DEFAULT_WEBHOOK_SECRET);
    if crash {
        cmd.env("SANDBOX_CRASH_AT", "after-compute-start");
    }
    cmd.spawn().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_start_and_record_then_restarted_adopts_the_executor() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let sim = sim_delivering_to(port).await;
    let client = sim.client();

    let mut reaper = Reaper::default();
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
    let second = serve(dir.path(), &sim.base_url(), port, false);
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
    let status = interrupt(second).await;
    assert!(status.success(), "{status:?}");
    assert!(os_executors(Some(&env)).is_empty());
    sim.shutdown().await;
}
