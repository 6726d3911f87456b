//! ProcessCompute: the shared compute contracts plus real-process specifics (environment
//! and key hand-over, SIGKILL after the grace, adoption after a restart, idempotent start).

use sandbox_controller::contract::{
    WorkspaceProbe, compute_contract, compute_idempotency_contract, workspace_contract,
};
use sandbox_controller::ports::{Compute, NO_DEADLINE, Started};
use sandbox_core::compute::{ComputeInstance, ComputeStatus};
use sandbox_core::decision::StartSpec;
use sandbox_core::ids::{
    DeploymentId, EnvironmentId, Generation, InstanceId, SessionId, idempotency_token,
};
use sandbox_local::{
    ExecutorCommand, ExecutorKey, KeySource, ProcessCompute, ProcessComputeConfig,
};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// Everything every test in this binary logs (tracing, all levels).
static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;
impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(|| Capture)
            .try_init();
    });
}

fn logs() -> String {
    String::from_utf8_lossy(&LOGS.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
}

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        capture_logs();
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn root(&self) -> PathBuf {
        self.dir.path().join("workspaces")
    }
    fn db(&self) -> PathBuf {
        self.dir.path().join("state.db")
    }
    fn config(&self, command: ExecutorCommand, key: KeySource) -> ProcessComputeConfig {
        let mut c = ProcessComputeConfig::new(command, self.root(), key, self.db());
        c.stop_grace = Duration::from_secs(2);
        c.kill_on_drop = true;
        c
    }
    fn sleeper(&self) -> ProcessCompute {
        let key = KeySource::Value(ExecutorKey::new("sk-env-test"));
        ProcessCompute::open(self.config(ExecutorCommand::new("sleep", ["300"]), key)).unwrap()
    }
}

fn sh(script: &str) -> ExecutorCommand {
    ExecutorCommand::new("sh", ["-c", script])
}

fn spec(env: &str, generation: u64) -> StartSpec {
    let environment_id = EnvironmentId::new(env);
    StartSpec {
        session_id: SessionId::new(format!("sess_{env}")),
        remote_url: format!("wss://agents.example/v1/{env}/connect?token=a&b=c%20d"),
        workspace_directory: "/workspace".to_owned(),
        generation: Generation(generation),
        idempotency_token: idempotency_token(&environment_id, Generation(generation)),
        environment_id,
        previous: None,
        restore: None,
    }
}

fn deployment() -> DeploymentId {
    DeploymentId::new("local-test").unwrap()
}

async fn start(c: &ProcessCompute, spec: &StartSpec) -> ComputeInstance {
    match c.start(spec, &deployment(), NO_DEADLINE).await.unwrap() {
        Started::Instance(i) => i,
        Started::Failed { reason } => panic!("start failed: {reason}"),
    }
}

async fn wait_for(
    c: &ProcessCompute,
    id: &InstanceId,
    status: ComputeStatus,
    within: Duration,
) -> ComputeInstance {
    let deadline = Instant::now() + within;
    loop {
        let i = c.describe(id).await.unwrap().expect("instance known");
        if i.status == status {
            return i;
        }
        assert!(
            Instant::now() < deadline,
            "{id} not {status:?} within {within:?}: {:?}",
            i.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_for_file(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with("END\n")
        {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{} never written",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether a process exists and is not a zombie (independent of the crate's own check).
fn os_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s[s.rfind(')').unwrap() + 2..].chars().next().unwrap();
            state != 'Z' && state != 'X'
        }
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_compute_passes_the_contracts() {
    let f = Fixture::new();
    let c = f.sleeper();
    compute_contract(&c, &deployment()).await;
    compute_idempotency_contract(&c, &deployment()).await;
    assert_eq!(
        c.shutdown_all().await.unwrap(),
        0,
        "the contracts stop what they start"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_executor_gets_remote_url_environment_id_and_key_and_the_key_leaks_nowhere() {
    let f = Fixture::new();
    let secret = "sk-env-9f8e7d6c5b4a-never-log-me";
    let key_file = f.dir.path().join("executor.key");
    std::fs::write(&key_file, format!("{secret}\n")).unwrap();
    let script = r#"{ printf 'REMOTE_URL=%s\n' "$REMOTE_URL"; printf 'ENVIRONMENT_ID=%s\n' "$ENVIRONMENT_ID"; printf 'CODEX_API_KEY=%s\n' "$CODEX_API_KEY"; printf 'HOME=%s\n' "$HOME"; printf 'ARG1=%s\n' "$1"; printf 'ARG2=%s\n' "$2"; printf 'CWD=%s\n' "$(pwd)"; env | cut -d= -f1 | sed 's/^/NAME=/'; echo END; } > env.txt; echo "executor up"; exec sleep 300"#;
    let command = ExecutorCommand::new(
        "sh",
        ["-c", script, "sh", "$REMOTE_URL", "${ENVIRONMENT_ID}"],
    );
    let config = f.config(command, KeySource::File(key_file.clone()));
    let c = ProcessCompute::open(config.clone()).unwrap();
    let s = spec("env_keys", 1);
    let inst = start(&c, &s).await;
    let workspace = f.root().join("env_keys").join("g1");
    let env = wait_for_file(&workspace.join("env.txt")).await;

    assert!(
        env.contains(&format!("REMOTE_URL={}\n", s.remote_url)),
        "{env}"
    );
    assert!(env.contains("ENVIRONMENT_ID=env_keys\n"), "{env}");
    assert!(
        env.contains(&format!("CODEX_API_KEY={secret}\n")),
        "key trimmed and passed: {env}"
    );
    assert!(
        env.contains(&format!("ARG1={}\n", s.remote_url)),
        "whole-argument substitution: {env}"
    );
    assert!(env.contains("ARG2=env_keys\n"), "{env}");
    let ws = std::fs::canonicalize(&workspace).unwrap();
    assert!(
        env.contains(&format!("HOME={}\n", workspace.display())),
        "{env}"
    );
    assert!(env.contains(&format!("CWD={}\n", ws.display())), "{env}");
    assert!(
        !env.contains("NAME=CARGO"),
        "the controller's environment is withheld: {env}"
    );

    // Where the key must not appear.
    let info = c.info(&inst.instance_id).await.unwrap().unwrap();
    assert_eq!(info.workspace, workspace);
    let mut outputs = vec![
        format!("{c:?}"),
        format!("{config:?}"),
        format!("{info:?}"),
        format!("{:?}", KeySource::Value(ExecutorKey::new(secret))),
    ];
    let bad = spec("../escape", 1);
    outputs.push(
        c.start(&bad, &deployment(), NO_DEADLINE)
            .await
            .unwrap_err()
            .to_string(),
    );
    let missing =
        ProcessCompute::open(f.config(sh("exit 0"), KeySource::File(f.dir.path().join("nope"))))
            .unwrap();
    let err = missing
        .start(&spec("env_missing", 1), &deployment(), NO_DEADLINE)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
    outputs.push(format!("{err} {err:?}"));
    let unset = ProcessCompute::open(f.config(
        sh("exit 0"),
        KeySource::EnvVar("SANDBOX_LOCAL_TEST_UNSET".into()),
    ))
    .unwrap();
    outputs.push(
        unset
            .start(&spec("env_unset", 1), &deployment(), NO_DEADLINE)
            .await
            .unwrap_err()
            .to_string(),
    );
    c.stop(&inst.instance_id, "test", NO_DEADLINE)
        .await
        .unwrap();
    wait_for(
        &c,
        &inst.instance_id,
        ComputeStatus::Stopped,
        Duration::from_secs(5),
    )
    .await;
    let log = std::fs::read_to_string(&info.log_path).unwrap();
    assert!(
        log.contains("executor up"),
        "child output goes to the log file: {log}"
    );
    outputs.push(log);
    outputs.push(logs());
    for name in ["state.db", "state.db-wal"] {
        if let Ok(bytes) = std::fs::read(f.dir.path().join(name)) {
            outputs.push(String::from_utf8_lossy(&bytes).into_owned());
        }
    }
    assert!(logs().contains("executor started"), "tracing captured");
    for out in &outputs {
        assert!(
            !out.contains(secret),
            "the executor key leaked into: {out:.300}"
        );
    }
    drop(key_file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_can_come_from_an_environment_variable() {
    let f = Fixture::new();
    // PATH is set in every test process (tests may not set variables: no unsafe code).
    let expected = std::env::var("PATH").unwrap();
    let script =
        r#"{ printf 'CODEX_API_KEY=%s\n' "$CODEX_API_KEY"; echo END; } > env.txt; exec sleep 300"#;
    let c = ProcessCompute::open(f.config(sh(script), KeySource::EnvVar("PATH".into()))).unwrap();
    let inst = start(&c, &spec("env_var_key", 1)).await;
    let env = wait_for_file(&f.root().join("env_var_key/g1/env.txt")).await;
    assert_eq!(env, format!("CODEX_API_KEY={}\nEND\n", expected.trim()));
    c.stop(&inst.instance_id, "test", NO_DEADLINE)
        .await
        .unwrap();
    wait_for(
        &c,
        &inst.instance_id,
        ComputeStatus::Stopped,
        Duration::from_secs(5),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_cooperative_child_and_records_the_signal() {
    let f = Fixture::new();
    let c = f.sleeper();
    let inst = start(&c, &spec("env_term", 1)).await;
    assert_eq!(inst.status, ComputeStatus::Running);
    let started = Instant::now();
    c.stop(&inst.instance_id, "lease_expired", NO_DEADLINE)
        .await
        .unwrap();
    wait_for(
        &c,
        &inst.instance_id,
        ComputeStatus::Stopped,
        Duration::from_secs(5),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_millis(1900),
        "no grace wait (2 s) for a cooperative child"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let info = loop {
        let info = c.info(&inst.instance_id).await.unwrap().unwrap();
        if info.exit.is_some() || Instant::now() > deadline {
            break info;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(info.exit.and_then(|e| e.signal), Some(15), "{info:?}");
    assert_eq!(info.stop_reason.as_deref(), Some("lease_expired"));
    assert!(!os_alive(info.pid));
    // Stopping again is accepted; an unknown id is an error.
    c.stop(&inst.instance_id, "again", NO_DEADLINE)
        .await
        .unwrap();
    assert!(
        c.stop(&InstanceId::new("local-1-2"), "x", NO_DEADLINE)
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_ignoring_sigterm_is_killed_after_the_grace() {
    let f = Fixture::new();
    let mut config = f.config(
        sh(r#"trap '' TERM; echo ready > ready.txt; while :; do sleep 0.1; done"#),
        KeySource::Value(ExecutorKey::new("k")),
    );
    config.stop_grace = Duration::from_secs(1);
    let c = ProcessCompute::open(config).unwrap();
    let inst = start(&c, &spec("env_stubborn", 1)).await;
    let ready = f.root().join("env_stubborn/g1/ready.txt");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "child never got ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    c.stop(&inst.instance_id, "test", NO_DEADLINE)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mid = c.describe(&inst.instance_id).await.unwrap().unwrap();
    assert_eq!(
        mid.status,
        ComputeStatus::Stopping,
        "still alive during the grace, SIGTERM ignored"
    );
    wait_for(
        &c,
        &inst.instance_id,
        ComputeStatus::Stopped,
        Duration::from_secs(5),
    )
    .await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(950),
        "killed before the grace: {elapsed:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let info = loop {
        let info = c.info(&inst.instance_id).await.unwrap().unwrap();
        if info.exit.is_some() || Instant::now() > deadline {
            break info;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        info.exit.and_then(|e| e.signal),
        Some(9),
        "SIGKILL: {info:?}"
    );
    assert!(!os_alive(info.pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_controller_adopts_live_children_and_reaps_dead_ones() {
    let f = Fixture::new();
    let mut config = f.config(
        ExecutorCommand::new("sleep", ["300"]),
        KeySource::Value(ExecutorKey::new("k")),
    );
    config.kill_on_drop = false;
    // The first controller runs on its own runtime, which is then shut down: its reaper
    // tasks die with it, as in a crashed process.
    let first_config = config.clone();
    let (a, b) = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let out = rt.block_on(async {
            let c = ProcessCompute::open(first_config).unwrap();
            let a = start(&c, &spec("env_adopt_a", 1)).await;
            let b = start(&c, &spec("env_adopt_b", 1)).await;
            (
                c.info(&a.instance_id).await.unwrap().unwrap(),
                c.info(&b.instance_id).await.unwrap().unwrap(),
            )
        });
        drop(rt);
        out
    })
    .join()
    .unwrap();
    assert!(
        os_alive(a.pid) && os_alive(b.pid),
        "children outlive their controller"
    );
    // One child dies while no controller runs.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(b.pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();

    config.kill_on_drop = true; // clean up whatever a failed assertion leaves
    let c = ProcessCompute::open(config).unwrap();
    let listed = c.list(&deployment()).await.unwrap();
    let status_of = |id: &InstanceId| {
        listed
            .iter()
            .find(|i| &i.instance_id == id)
            .map(|i| i.status)
    };
    assert_eq!(
        status_of(&a.instance.instance_id),
        Some(ComputeStatus::Running),
        "adopted: {listed:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let st = c
            .describe(&b.instance.instance_id)
            .await
            .unwrap()
            .unwrap()
            .status;
        if st == ComputeStatus::Stopped {
            break;
        }
        assert!(Instant::now() < deadline, "dead child not reaped: {st:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The idempotency token still finds the adopted instance: no second spawn.
    let again = start(&c, &spec("env_adopt_a", 1)).await;
    assert_eq!(again.instance_id, a.instance.instance_id);
    // And the new controller can stop it.
    c.stop(&a.instance.instance_id, "test", NO_DEADLINE)
        .await
        .unwrap();
    wait_for(
        &c,
        &a.instance.instance_id,
        ComputeStatus::Stopped,
        Duration::from_secs(5),
    )
    .await;
    assert!(!os_alive(a.pid));
}

/// After a restart the forwarder of an adopted split instance is watched like a
/// fresh one: killing it stops the executor, which read-back then records stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_controller_watches_the_adopted_forwarder() {
    let f = Fixture::new();
    let mut config = f.config(
        ExecutorCommand::new("sleep", ["300"]),
        KeySource::Value(ExecutorKey::new("k")),
    );
    config.forwarder = Some(ExecutorCommand::new("sleep", ["301"]));
    config.kill_on_drop = false;
    // The first controller runs on its own runtime, which is then shut down: its waiters
    // (the forwarder's included) die with it, as in a crashed process.
    let first_config = config.clone();
    let (executor, forwarder) = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let out = rt.block_on(async {
            let c = ProcessCompute::open(first_config).unwrap();
            let a = start(&c, &spec("env_adopt_fwd", 1)).await;
            let fwd = c.forwarder_pid(&a.instance_id).await.unwrap();
            (c.info(&a.instance_id).await.unwrap().unwrap(), fwd)
        });
        drop(rt);
        out
    })
    .join()
    .unwrap();
    let forwarder = forwarder.expect("the split start recorded its forwarder");
    assert_ne!(forwarder, executor.pid);
    assert!(
        os_alive(executor.pid) && os_alive(forwarder),
        "both outlive their controller"
    );

    config.kill_on_drop = true; // clean up whatever a failed assertion leaves
    let c = ProcessCompute::open(config).unwrap();
    let id = executor.instance.instance_id.clone();
    assert_eq!(
        c.describe(&id).await.unwrap().unwrap().status,
        ComputeStatus::Running,
        "adopted"
    );
    assert_eq!(c.forwarder_pid(&id).await.unwrap(), Some(forwarder));
    // Several watch periods with the forwarder alive: the executor keeps running.
    tokio::time::sleep(sandbox_local::process_compute::ADOPTED_FORWARDER_POLL * 3).await;
    assert!(os_alive(executor.pid), "no stop while the forwarder runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(forwarder as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_for(&c, &id, ComputeStatus::Stopped, Duration::from_secs(5)).await;
    assert!(!os_alive(executor.pid), "the executor is gone");
    let logs = logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("forwarder exited; stopping its executor")
                && l.contains(id.as_str())),
        "reported as for a fresh forwarder"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_pid_reads_as_stopped() {
    let f = Fixture::new();
    let c = f.sleeper();
    let inst = start(&c, &spec("env_reuse", 1)).await;
    let info = c.info(&inst.instance_id).await.unwrap().unwrap();
    // Pretend the recorded process started at another time: the live pid is someone else.
    let conn = rusqlite::Connection::open(f.db()).unwrap();
    conn.execute(
        "UPDATE compute_instances SET proc_start_ticks = proc_start_ticks + 1 WHERE instance_id = ?1",
        [inst.instance_id.as_str()],
    )
    .unwrap();
    // Another controller (no reaper knowledge) must not call the stranger ours.
    let other = ProcessCompute::open(f.config(
        ExecutorCommand::new("sleep", ["300"]),
        KeySource::Value(ExecutorKey::new("k")),
    ))
    .unwrap();
    let seen = other.describe(&inst.instance_id).await.unwrap().unwrap();
    assert_eq!(seen.status, ComputeStatus::Stopped);
    assert!(os_alive(info.pid), "the stranger was not signalled");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(info.pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_idempotency_token_spawns_once_even_concurrently() {
    let f = Fixture::new();
    let key = KeySource::Value(ExecutorKey::new("k"));
    let c = ProcessCompute::open(f.config(sh("echo spawned >> spawns.txt; exec sleep 300"), key))
        .unwrap();
    let s = spec("env_idem", 3);
    let (x, y) = tokio::join!(start(&c, &s), start(&c, &s));
    let z = start(&c, &s).await;
    assert_eq!(x.instance_id, y.instance_id);
    assert_eq!(x.instance_id, z.instance_id);
    assert_eq!(x.generation, Generation(3));
    // A second handle on the same database sees the same instance too.
    let other = ProcessCompute::open(c.config().clone()).unwrap();
    assert_eq!(start(&other, &s).await.instance_id, x.instance_id);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let spawns = std::fs::read_to_string(f.root().join("env_idem/g3/spawns.txt")).unwrap();
    assert_eq!(spawns, "spawned\n", "exactly one process was spawned");
    assert_eq!(c.list(&deployment()).await.unwrap().len(), 1);
    assert_eq!(c.shutdown_all().await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_program_is_a_failed_start_and_a_bad_environment_id_an_error() {
    let f = Fixture::new();
    let key = KeySource::Value(ExecutorKey::new("k"));
    let c = ProcessCompute::open(f.config(
        ExecutorCommand::new("/nonexistent/executor", Vec::<String>::new()),
        key,
    ))
    .unwrap();
    match c
        .start(&spec("env_missing_program", 1), &deployment(), NO_DEADLINE)
        .await
        .unwrap()
    {
        Started::Failed { reason } => assert!(reason.contains("spawned"), "{reason}"),
        Started::Instance(i) => panic!("started {i:?}"),
    }
    assert!(
        c.list(&deployment()).await.unwrap().is_empty(),
        "nothing recorded"
    );
    for bad in ["../x", ".hidden", "a/b", ""] {
        let err = c
            .start(&spec(bad, 1), &deployment(), NO_DEADLINE)
            .await
            .unwrap_err();
        assert!(!err.retryable, "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_all_stops_every_live_child_including_stubborn_ones() {
    let f = Fixture::new();
    let mut config = f.config(
        sh(r#"trap '' TERM; while :; do sleep 0.1; done"#),
        KeySource::Value(ExecutorKey::new("k")),
    );
    config.stop_grace = Duration::from_secs(1);
    let stubborn = ProcessCompute::open(config).unwrap();
    let sleeper = f.sleeper(); // same database
    let s1 = start(&stubborn, &spec("env_sd_1", 1)).await;
    let s2 = start(&sleeper, &spec("env_sd_2", 1)).await;
    let s3 = start(&sleeper, &spec("env_sd_3", 1)).await;
    let pids: Vec<u32> = futures_pids(&sleeper, [&s1, &s2, &s3]).await;
    let started = Instant::now();
    assert_eq!(
        stubborn.shutdown_all().await.unwrap(),
        3,
        "every live child in the database"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    for i in [&s1, &s2, &s3] {
        assert_eq!(
            sleeper
                .describe(&i.instance_id)
                .await
                .unwrap()
                .unwrap()
                .status,
            ComputeStatus::Stopped
        );
    }
    for pid in pids {
        assert!(!os_alive(pid), "{pid} still alive");
    }
    let _ = std::io::stderr().flush();
}

async fn futures_pids<const N: usize>(
    c: &ProcessCompute,
    insts: [&ComputeInstance; N],
) -> Vec<u32> {
    let mut out = Vec::new();
    for i in insts {
        out.push(c.info(&i.instance_id).await.unwrap().unwrap().pid);
    }
    out
}

/// The generation directories, as the executor sees them.
struct Dirs(PathBuf);

impl WorkspaceProbe for Dirs {
    async fn write(&self, env: &EnvironmentId, generation: Generation, path: &str, content: &str) {
        let p = self
            .0
            .join(env.as_str())
            .join(format!("g{}", generation.0))
            .join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    async fn read(
        &self,
        env: &EnvironmentId,
        generation: Generation,
        path: &str,
    ) -> Option<String> {
        let p = self
            .0
            .join(env.as_str())
            .join(format!("g{}", generation.0))
            .join(path);
        std::fs::read_to_string(p).ok()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_process_workspaces_pass_the_workspace_contract() {
    let f = Fixture::new();
    let c = f.sleeper();
    workspace_contract(&c, &deployment(), Some(&Dirs(f.root()))).await;
    // The archives are tar + zstd files under the data directory, per deployment.
    assert!(f.root().join(".snapshots").is_dir());
    c.shutdown_all().await.unwrap();
}

/// A split-mode compute whose executor and forwarder are `sleep`s.
fn pooled(f: &Fixture) -> ProcessCompute {
    let mut config = f.config(
        ExecutorCommand::new("sleep", ["300"]),
        KeySource::Value(ExecutorKey::new("sk-env-pool")),
    );
    // The assignment on the forwarder's command line, as the real `forward` takes it.
    config.forwarder = Some(ExecutorCommand::new(
        "sh",
        [
            "-c",
            "while :; do sleep 1; done",
            "forwarder",
            "$ENVIRONMENT_ID",
            "$LISTEN_URL",
        ],
    ));
    ProcessCompute::open(config).unwrap()
}

/// The command line of `pid` once it exec'd a command line containing `marker` (a
/// spawned child shows its parent's until its `execve`); panics after 10 s.
async fn cmdline_once_execd(pid: u32, marker: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        if c.contains(marker) {
            return c;
        }
        assert!(Instant::now() < deadline, "{pid} never ran {marker}: {c}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn proc_environ(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', "\n"))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_compute_passes_the_pool_contract() {
    let f = Fixture::new();
    let c = pooled(&f);
    sandbox_controller::contract::compute_pool_contract(&c, &deployment()).await;
    assert_eq!(
        c.shutdown_all().await.unwrap(),
        0,
        "the contract stopped all it started"
    );
}

/// The claimed member's executor keeps running, now in the generation's
/// workspace (its directory was renamed, so its working directory moved with it); the
/// forwarder spawned at the claim alone gets the assignment and the key; the executor's
/// environment holds neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_pool_member_runs_in_the_generation_workspace_and_only_its_forwarder_is_assigned()
{
    let f = Fixture::new();
    let c = pooled(&f);
    let member = c
        .start_pool_member(&deployment(), NO_DEADLINE)
        .await
        .unwrap();
    let before = c.info(&member.instance_id).await.unwrap().unwrap();
    let s = spec("env_pool_claim", 3);
    let claimed = match c
        .claim_pool_member(&s, &deployment(), 0, NO_DEADLINE)
        .await
        .unwrap()
    {
        Some(Started::Instance(i)) => i,
        other => panic!("not claimed: {other:?}"),
    };
    assert_eq!(claimed.instance_id, member.instance_id);
    let info = c.info(&claimed.instance_id).await.unwrap().unwrap();
    assert_eq!(
        info.pid, before.pid,
        "the pre-started executor serves the claim"
    );
    let workspace = f.root().join("env_pool_claim").join("g3");
    assert_eq!(info.workspace, workspace);
    assert_eq!(
        std::fs::read_link(format!("/proc/{}/cwd", info.pid)).unwrap(),
        workspace.canonicalize().unwrap()
    );
    let fwd = c
        .forwarder_pid(&claimed.instance_id)
        .await
        .unwrap()
        .expect("a forwarder");
    let fwd_cmdline = cmdline_once_execd(fwd, "forwarder").await;
    assert!(fwd_cmdline.contains("env_pool_claim"), "{fwd_cmdline}");
    cmdline_once_execd(info.pid, "sleep 300").await;
    let fwd_env = proc_environ(fwd);
    assert!(
        fwd_env.contains("CODEX_API_KEY=sk-env-pool")
            && fwd_env.contains("ENVIRONMENT_ID=env_pool_claim")
    );
    let exec_env = proc_environ(info.pid);
    assert!(
        !exec_env.is_empty(),
        "the executor's environment is readable"
    );
    for name in ["CODEX_API_KEY", "REMOTE_URL", "ENVIRONMENT_ID"] {
        assert!(
            !exec_env.contains(&format!("{name}=")),
            "{name} in the executor"
        );
    }
    assert_eq!(c.shutdown_all().await.unwrap(), 1);
}
