//! Shared SQLite plumbing: opening a database in WAL mode, running blocking calls off the
//! async runtime, mapping errors to [`PortError`] and the clock helpers.

use rusqlite::{Connection, ErrorCode};
use sandbox_controller::ports::PortError;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How long a statement waits for another connection's write lock before failing with a
/// (retryable) busy error.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The first and the longest wait between two attempts to get a busy write lock.
const BUSY_FIRST_WAIT: Duration = Duration::from_micros(20);
const BUSY_MAX_WAIT: Duration = Duration::from_millis(2);

/// The busy handler: retry after a wait that doubles from 20 µs to at most 2 ms, giving
/// up once the waits add up to [`BUSY_TIMEOUT`]. SQLite's own `busy_timeout` handler
/// sleeps 1, 2, 5, 10 ... 100 ms; write transactions here last tens of microseconds, so
/// its first sleep alone was longer than the wait it covered (with the queues and the
/// registry on three connections to one file, `make bench` measured 675 events/s with it).
fn busy_wait(attempt: i32) -> bool {
    match busy_schedule(u32::try_from(attempt).unwrap_or(0)) {
        Some(wait) => {
            std::thread::sleep(wait);
            true
        }
        None => false,
    }
}

/// The wait before retry number `attempt` (0-based), or `None` to give up: 20 µs · 2^k up
/// to 2 ms, then 2 ms, until the waits so far reach [`BUSY_TIMEOUT`].
fn busy_schedule(attempt: u32) -> Option<Duration> {
    let doublings = (BUSY_MAX_WAIT.as_micros() / BUSY_FIRST_WAIT.as_micros()).ilog2();
    let ramp = attempt.min(doublings);
    let waited =
        BUSY_FIRST_WAIT * (2u32.pow(ramp) - 1) + BUSY_MAX_WAIT * attempt.saturating_sub(doublings);
    if waited >= BUSY_TIMEOUT {
        return None;
    }
    Some(if attempt < doublings {
        BUSY_FIRST_WAIT * 2u32.pow(attempt)
    } else {
        BUSY_MAX_WAIT
    })
}

/// A failure inside a blocking database call.
#[derive(Debug)]
pub(crate) enum DbError {
    /// SQLite reported an error.
    Sql(rusqlite::Error),
    /// A stored value could not be decoded, or the input is invalid: not retryable.
    Invalid(String),
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Sql(e)
    }
}

impl From<serde_json::Error> for DbError {
    fn from(e: serde_json::Error) -> Self {
        // serde_json's message holds positions and the expected shape, not the payload.
        Self::Invalid(format!("stored JSON could not be decoded: {e}"))
    }
}

impl DbError {
    /// Maps to a [`PortError`]: busy, locked and I/O failures are retryable.
    pub(crate) fn into_port(self, dependency: &'static str, operation: &'static str) -> PortError {
        match self {
            Self::Sql(e) => {
                let retryable = matches!(
                    e.sqlite_error_code(),
                    Some(
                        ErrorCode::DatabaseBusy
                            | ErrorCode::DatabaseLocked
                            | ErrorCode::SystemIoFailure
                    )
                );
                let message = format!("sqlite: {e}");
                if retryable {
                    PortError::transient(dependency, operation, message)
                } else {
                    PortError::permanent(dependency, operation, message)
                }
            }
            Self::Invalid(message) => PortError::permanent(dependency, operation, message),
        }
    }
}

/// Opens (creating if needed) a SQLite database for concurrent use by several connections
/// and processes: WAL journal, `synchronous = NORMAL`, a busy handler that waits at most
/// [`BUSY_TIMEOUT`] in short steps ([`busy_wait`]).
///
/// In WAL mode `NORMAL` keeps every committed write across a crash of the process (the
/// controller's crash model: record before release holds); only a power loss or OS crash
/// may roll back the last commits — and that also kills the child-process executors this
/// registry records, so nothing recorded outlives it. `FULL` fsyncs every commit and cost
/// about 2× the worker throughput on disk (`make bench`).
pub(crate) fn open_connection(path: &Path) -> Result<Connection, rusqlite::Error> {
    // The database holds the queues (an executor must not add a `close` job) and
    // the registry, so it is the owner's only (0600); SQLite gives its `-wal` and `-shm`
    // files the database file's mode.
    crate::private::create_private_file(path).map_err(|e| {
        rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
            Some(format!("{}: {e}", path.display())),
        )
    })?;
    let mut conn = Connection::open(path)?;
    conn.busy_handler(Some(busy_wait))?;
    // journal_mode returns a row; query it rather than execute.
    let _mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    conn.execute_batch("PRAGMA synchronous = NORMAL;")?;
    Ok(conn)
}

/// One connection shared by the clones of an adapter; every call runs on the blocking
/// thread pool with the connection locked.
#[derive(Clone)]
pub(crate) struct Db {
    conn: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").finish_non_exhaustive()
    }
}

impl Db {
    /// Opens `path` and runs `schema` (idempotent `CREATE ... IF NOT EXISTS` statements).
    pub(crate) fn open(path: &Path, schema: &str) -> Result<Self, rusqlite::Error> {
        let conn = open_connection(path)?;
        conn.execute_batch(schema)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Locks the connection (a poisoned lock is recovered: SQLite rolls back an unfinished
    /// transaction when its `Transaction` guard is dropped by the panicking thread).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` with the connection on the blocking pool.
    pub(crate) async fn call<T, F>(
        &self,
        dependency: &'static str,
        operation: &'static str,
        f: F,
    ) -> Result<T, PortError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, DbError> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            let mut guard = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut guard)
        })
        .await
        .map_err(|e| {
            PortError::transient(dependency, operation, format!("blocking task failed: {e}"))
        })?
        .map_err(|e| e.into_port(dependency, operation))
    }
}

/// Now, Unix milliseconds.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// 64 random bits as 16 hex digits (std's randomly seeded SipHash; not for secrets).
pub(crate) fn random_hex() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_i64(now_ms());
    format!("{:016x}", h.finish())
}

/// A `u64` as SQLite's `i64` (values above `i64::MAX` saturate; Unix seconds and versions
/// never get there).
pub(crate) fn to_sql_int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A stored `i64` as `u64` (negative values read as 0).
pub(crate) fn from_sql_int(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_waits_start_short_and_add_up_to_the_timeout() {
        let waits: Vec<Duration> = (0..).map_while(busy_schedule).collect();
        assert_eq!(waits[0], Duration::from_micros(20));
        assert_eq!(waits[1], Duration::from_micros(40));
        assert!(waits.iter().all(|w| *w <= BUSY_MAX_WAIT));
        let total: Duration = waits.iter().sum();
        assert!(
            total >= BUSY_TIMEOUT - BUSY_MAX_WAIT && total <= BUSY_TIMEOUT + BUSY_MAX_WAIT,
            "{total:?}"
        );
    }
}
