//! A moto server of one test's own, for the tests that load moto so much that they would
//! slow every other test sharing the run's server.
//!
//! moto's server is one Python process, serialised by the interpreter lock: while the
//! 200-environment concurrency test drives it with 32 workers, every other AWS test on
//! the same server sees its calls take seconds, and tests with real deadlines (a
//! three-second lock lease, a 30-second connect deadline) fail for a reason that is not
//! theirs (CI on 2026-12-02: three such failures, each green alone). [`PrivateMoto`]
//! starts `tests/moto/server.py` (the same ECS-as-documented server `tests/moto/run.sh`
//! starts) on a free port of 127.0.0.1 and makes [`crate::aws_stack::moto_endpoint`]
//! answer its endpoint for the rest of the process (nextest runs every test in a process
//! of its own). Dropping it ends the server, also when the test panics.

use anyhow::{Context as _, bail};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The endpoint [`crate::aws_stack::moto_endpoint`] answers instead of `MOTO_ENDPOINT`
/// once a [`PrivateMoto`] started in this process.
pub(crate) static OVERRIDE: OnceLock<String> = OnceLock::new();

/// How long the server may take to answer its first request (as `tests/moto/run.sh`).
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running moto server of this process; ended on drop.
pub struct PrivateMoto {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

impl PrivateMoto {
    /// Starts the server and points [`crate::aws_stack::moto_endpoint`] at it. Call it
    /// once per process, before any AWS resource is created.
    ///
    /// # Errors
    /// The project venv's Python is missing (`make venv`), the server does not answer
    /// within 20 s (its log is in the message), or one was already started here.
    pub fn start() -> anyhow::Result<Self> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let python = root.join(".venv/bin/python");
        if !python.exists() {
            bail!("{} is missing: run `make venv` first", python.display());
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = tempfile::NamedTempFile::new()?;
        let child = Command::new(&python)
            .arg(root.join("tests/moto/server.py"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(log.reopen()?)
            .stderr(log.reopen()?)
            .spawn()
            .with_context(|| format!("starting {}", python.display()))?;
        let endpoint = format!("http://127.0.0.1:{port}");
        let mut server = Self { child, endpoint };
        let deadline = Instant::now() + START_TIMEOUT;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = server.child.try_wait()? {
                bail!(
                    "moto exited during start-up ({status}): {}",
                    std::fs::read_to_string(log.path()).unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "moto did not listen on {} within {START_TIMEOUT:?}: {}",
                    server.endpoint,
                    std::fs::read_to_string(log.path()).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        OVERRIDE
            .set(server.endpoint.clone())
            .map_err(|_| anyhow::anyhow!("a private moto server already runs in this process"))?;
        Ok(server)
    }
}

impl Drop for PrivateMoto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
