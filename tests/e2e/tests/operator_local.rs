//! `sandboxctl` against a running local stack's data directory, as an operator uses it:
//! every command, `--json` validated against the schema, the exit codes, and the close
//! taken through the worker (two receipts, the terminal record).

use sandbox_controller::job::Job;
use sandbox_controller::ports::{Outgoing, Queue as _};
use sandbox_core::ids::SessionId;
use sandbox_core::observed::Trigger;
use sandbox_e2e::LifecycleHarness as _;
use sandbox_e2e::operator_cli::sandboxctl;
use sandbox_e2e::{DEPLOYMENT, Harness, Options};
use sandbox_local::SqliteRegistry;
use sandbox_local::embedded::EVENTS_QUEUE;
use sandbox_local::sqlite_queue::{QueueOptions, SqliteQueue};
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operator_command_on_a_running_local_stack() {
    let h = Harness::start(Options {
        grace_secs: 600,
        ..Options::default()
    })
    .await
    .unwrap();
    let dir = h.dir.path().to_str().unwrap().to_owned();
    let local = ["--data-dir", dir.as_str(), "--deployment", DEPLOYMENT];
    let with = |cmd: &[&str]| -> Vec<String> {
        cmd.iter()
            .map(|s| (*s).to_owned())
            .chain(local.iter().map(|s| (*s).to_owned()))
            .collect()
    };
    async fn run(args: Vec<String>, envs: &[(&str, &str)]) -> sandbox_e2e::operator_cli::CtlOutput {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        sandboxctl(&refs, envs).await
    }

    let (s, env) = h.session_with_input().await.unwrap();
    let session = s.id.as_str().to_owned();
    h.wait_until("executor connected", T, || h.connected(&env))
        .await
        .unwrap();
    let task = h
        .record(&env)
        .await
        .unwrap()
        .unwrap()
        .instance
        .unwrap()
        .instance_id;

    // status: the environment, its running executor, no problem.
    let out = run(with(&["status", "--json"]), &[]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let doc = out.json();
    let e = &doc["environments"][0];
    assert_eq!(e["environment_id"], env.as_str());
    assert_eq!(e["instance"]["provider_status"], "running");
    assert_eq!(e["instance"]["instance_id"], task.as_str());
    assert!(
        e["last_decision"]["at"]["utc"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );
    let text = run(with(&["status", "--session", &session]), &[]).await;
    assert_eq!(text.code, 0, "{text:?}");
    assert!(text.stdout.contains(&env), "{}", text.stdout);
    let none = run(with(&["status", "--json", "--status", "closed"]), &[]).await;
    assert_eq!(none.json()["environments"], serde_json::json!([]));

    // explain by each kind of id resolves to the same environment.
    for (id, kind) in [
        (session.as_str(), "session"),
        (env.as_str(), "environment"),
        (task.as_str(), "compute"),
    ] {
        let out = run(with(&["explain", "--json", id]), &[]).await;
        assert_eq!(out.code, 0, "{out:?}");
        let doc = out.json();
        assert_eq!(doc["resolved_as"], kind);
        assert_eq!(doc["environment_id"], env.as_str());
        assert_eq!(doc["timeline"][0]["outcome"], "start");
        assert!(doc["terminal"].is_null(), "no close yet");
    }
    let unknown = run(with(&["explain", "sess_nobody"]), &[]).await;
    assert_eq!(unknown.code, 2);
    assert!(
        unknown
            .stderr
            .contains("session id, environment id, compute id"),
        "{unknown:?}"
    );
    let bad = run(with(&["explain", "x y"]), &[]).await;
    assert_eq!(bad.code, 2, "{bad:?}");

    // sweep --dry-run reads the sessions and changes nothing; sweep enqueues.
    let base = h.sim.base_url();
    let keyed = [
        ("OPENAI_API_KEY", agents_sim::DEFAULT_API_KEY),
        ("AGENTS_API_BASE_URL", base.as_str()),
    ];
    let dry = run(with(&["sweep", "--dry-run", "--json"]), &keyed).await;
    assert_eq!(dry.code, 0, "{dry:?}");
    let dry = dry.json();
    assert_eq!(dry["decisions"][0]["environment_id"], env.as_str());
    assert_eq!(dry["enqueued"], 0);
    let no_key = run(with(&["sweep", "--dry-run"]), &[]).await;
    assert_eq!(no_key.code, 2, "{no_key:?}");
    assert!(no_key.stderr.contains("OPENAI_API_KEY"));
    let sweep = run(with(&["sweep", "--json"]), &[]).await;
    assert_eq!(sweep.code, 0, "{sweep:?}");
    assert_eq!(sweep.json()["enqueued"], 1);

    // reset-start-failures: nothing to reset here; an unknown environment is a usage error.
    let reset = run(with(&["reset-start-failures", "--json", &env]), &[]).await;
    assert_eq!(reset.code, 0, "{reset:?}");
    assert_eq!(reset.json()["enqueued"], false);
    let reset = run(with(&["reset-start-failures", "env_nobody"]), &[]).await;
    assert_eq!(reset.code, 2, "{reset:?}");

    // dlq list: all three empty.
    let dlq = run(with(&["dlq", "list", "--json"]), &[]).await;
    assert_eq!(dlq.code, 0, "{dlq:?}");
    assert_eq!(
        dlq.json()["queues"],
        serde_json::json!({"events": [], "timers": [], "sweep": []})
    );

    // close --wait: the worker closes it; two receipts; the terminal record.
    let close = run(
        with(&[
            "close",
            "--yes",
            "--wait",
            "--timeout-secs",
            "60",
            "--json",
            &session,
        ]),
        &[],
    )
    .await;
    assert_eq!(close.code, 0, "{close:?}");
    let close = close.json();
    assert_eq!(close["result"]["closed"], true);
    let mut kinds: Vec<&str> = close["result"]["receipts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        ["compute_stopped", "session_deleted", "workspace_closed"]
    );
    let explain = run(with(&["explain", "--json", &session]), &[])
        .await
        .json();
    let t = &explain["terminal"];
    assert_eq!(t["closed"], true);
    assert_eq!(t["session_deleted"]["confirmed"], true);
    assert_eq!(t["compute_stopped"]["read_back"], "stopped");
    assert_eq!(t["compute_stopped"]["instance_id"], task.as_str());
    // The close stored its terminal record; the credential note says what to
    // rotate and where.
    assert_eq!(t["stored"], true);
    assert_eq!(t["executor_revoked"], false);
    assert_eq!(t["executor_credential"]["revoked"], false);
    assert!(
        t["executor_credential"]["rotate"]
            .as_str()
            .unwrap()
            .contains("new restricted environment key"),
        "{t}"
    );
    assert!(
        !t["executor_credential"]["location"]
            .as_str()
            .unwrap()
            .is_empty()
    );
    // The default close disposition retains the workspace for 7 days: the close's stop
    // archived generation 1, and the chain shows it kept until then.
    let snapshot = format!("{}/g1.tar.zst", explain["environment_id"].as_str().unwrap());
    let disposition = t["workspace_disposition"].as_str().unwrap();
    assert!(
        disposition.starts_with(&format!("snapshot {snapshot} (retained until ")),
        "{disposition}"
    );
    let chain = explain["snapshot_chain"].as_array().unwrap();
    assert_eq!(chain.len(), 1, "{chain:?}");
    assert_eq!(chain[0]["snapshot_id"], snapshot.as_str());
    assert_eq!(chain[0]["kept"], true);
    assert!(chain[0]["expires_at"]["unix"].is_u64());
    assert_eq!(t["effect_reconciliation"], "not_needed");
    let text = run(with(&["explain", &session]), &[]).await;
    assert!(text.stdout.contains("terminal record:"), "{}", text.stdout);
    assert!(
        text.stdout.contains("workspace snapshots (oldest first):"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("session deleted:       yes"),
        "{}",
        text.stdout
    );
    let closed = run(with(&["status", "--json", "--status", "closed"]), &[]).await;
    assert_eq!(closed.code, 0, "{closed:?}");
    assert_eq!(closed.json()["environments"][0]["status"], "closed");
    h.shutdown().await.unwrap();
}

#[tokio::test]
async fn dead_letters_are_listed_then_redriven_with_their_hand_offs_reset() {
    let dir = tempfile::tempdir().unwrap();
    SqliteRegistry::open(dir.path().join("sandbox.db")).unwrap();
    let events = SqliteQueue::open(
        dir.path().join("queues.db"),
        EVENTS_QUEUE,
        QueueOptions::fifo().with_max_receive_count(1),
    )
    .unwrap();
    let job = Job {
        handoffs: 10,
        trigger: Trigger::Sweep,
        session_id: SessionId::new("sess_stuck"),
        environment_id: None,
        webhook_id: None,
        enqueued_at: 1,
        swept: None,
        operator_proof: None,
    };
    events
        .send(Outgoing {
            group: "sess_stuck".into(),
            dedup_id: "d1".into(),
            job: job.clone(),
            delay_secs: 0,
        })
        .await
        .unwrap();
    // Received once and not acked: the next receive dead-letters it.
    assert_eq!(events.receive(1, 0, 0).await.unwrap().len(), 1);
    assert!(events.receive(1, 0, 0).await.unwrap().is_empty());
    let d = dir.path().to_str().unwrap();
    let list = sandboxctl(&["dlq", "list", "--json", "--data-dir", d], &[]).await;
    assert_eq!(list.code, 1, "a dead letter is a problem: {list:?}");
    let doc = list.json();
    assert_eq!(doc["queues"]["events"][0]["job"]["handoffs"], 10);
    assert_eq!(doc["queues"]["timers"], serde_json::json!([]));
    let status = sandboxctl(&["status", "--json", "--data-dir", d], &[]).await;
    assert_eq!(status.code, 1, "{status:?}");
    assert_eq!(status.json()["dead_letters"]["events"], 1);
    let redrive = sandboxctl(
        &[
            "dlq",
            "redrive",
            // sess_stuck has no record: the ownership guard needs --force (and --yes off a
            // terminal).
            "--force",
            "--yes",
            "--queue",
            "events",
            "--json",
            "--data-dir",
            d,
        ],
        &[],
    )
    .await;
    assert_eq!(redrive.code, 0, "{redrive:?}");
    assert_eq!(redrive.json()["queues"]["events"]["moved"], 1);
    let back = events.receive(1, 30, 0).await.unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].job, Job { handoffs: 0, ..job });
    let list = sandboxctl(&["dlq", "list", "--data-dir", d], &[]).await;
    assert_eq!(list.code, 0, "{list:?}");
    let bad = sandboxctl(&["dlq", "list", "--max", "0", "--data-dir", d], &[]).await;
    assert_eq!(bad.code, 2, "{bad:?}");
}

/// `resolve` and `report-timeout` refuse bad input with exit 2 and change
/// nothing; a resolve with nothing open enqueues nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_and_report_timeout_refuse_bad_input_and_change_nothing() {
    let h = Harness::start(Options {
        grace_secs: 600,
        ..Options::default()
    })
    .await
    .unwrap();
    let (s, env) = h.session_with_input().await.unwrap();
    let session = s.id.as_str().to_owned();
    h.wait_until("executor connected", T, || h.connected(&env))
        .await
        .unwrap();
    let before = h.record(&env).await.unwrap().unwrap();

    let bad = h
        .sandboxctl(&["resolve", &session, "--effect", "unknown"])
        .await;
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(
        bad.stderr
            .contains("observed, compensated, not_needed, abandoned"),
        "{bad:?}"
    );
    let nobody = h
        .sandboxctl(&["resolve", "sess_nobody", "--effect", "observed"])
        .await;
    assert_eq!(nobody.code, 2, "{nobody:?}");
    let control = h
        .sandboxctl(&["resolve", &env, "--effect", "observed", "--note", "a\u{7}b"])
        .await;
    assert_eq!(control.code, 2, "{control:?}");
    let nothing = h
        .sandboxctl(&["resolve", &env, "--effect", "not_needed", "--yes", "--json"])
        .await;
    assert_eq!(nothing.code, 0, "{nothing:?}");
    let doc = nothing.json();
    assert_eq!(
        (doc["open"].as_u64(), doc["enqueued"].as_bool()),
        (Some(0), Some(false))
    );

    let unknown = h.sandboxctl(&["report-timeout", "sess_nobody"]).await;
    assert_eq!(unknown.code, 2, "{unknown:?}");
    let future = h
        .sandboxctl(&["report-timeout", &session, "--submitted-at", "99999999999"])
        .await;
    assert_eq!(future.code, 2, "{future:?}");
    let bad_turn = h
        .sandboxctl(&["report-timeout", &session, "--turn", "turn with spaces"])
        .await;
    assert_eq!(bad_turn.code, 2, "{bad_turn:?}");

    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = h.record(&env).await.unwrap().unwrap();
    assert!(after.evidence.is_empty(), "{after:?}");
    assert_eq!(after.instance, before.instance);
    h.shutdown().await.unwrap();
}
