//! The executor key: [`ExecutorKey`] (redacted `Debug`), where it is read from
//! ([`KeySource`], at every start) and how it is handed to a forwarder that reads it
//! from stdin ([`key_pipe`]).

use super::DEP;
use sandbox_controller::ports::PortError;
use std::fmt;
use std::path::PathBuf;

/// The executor's restricted environment key (`api.agents.environments.connect` only).
/// Its `Debug` is redacted; it has no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct ExecutorKey(String);

impl ExecutorKey {
    /// Wraps a key value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
}

impl fmt::Debug for ExecutorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ExecutorKey(<redacted>)")
    }
}

/// Where the executor key comes from. Read at every start (so a rotated key is picked up);
/// surrounding whitespace is trimmed; an empty value is an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// A file holding the key (e.g. a mounted secret).
    File(PathBuf),
    /// An environment variable of the controller holding the key.
    EnvVar(String),
    /// The key itself (tests, embedding).
    Value(ExecutorKey),
}

impl KeySource {
    /// Where the key lives, for the terminal record's `executor_credential`:
    /// the file's path or the variable's name, never the key.
    pub fn location(&self) -> String {
        match self {
            Self::File(path) => format!("the executor key file {}", path.display()),
            Self::EnvVar(var) => format!("the controller's environment variable {var}"),
            Self::Value(_) => "the key the controller was given at start (embedded)".into(),
        }
    }

    /// The key. Errors name the source (path or variable), never the value.
    pub(super) fn read(&self) -> Result<String, PortError> {
        let raw = match self {
            Self::File(path) => std::fs::read_to_string(path).map_err(|e| {
                PortError::permanent(
                    DEP,
                    "start",
                    format!(
                        "executor key file {} could not be read: {}",
                        path.display(),
                        e.kind()
                    ),
                )
            })?,
            Self::EnvVar(name) => std::env::var(name).map_err(|_| {
                PortError::permanent(
                    DEP,
                    "start",
                    format!("executor key variable {name} is not set (or not UTF-8)"),
                )
            })?,
            Self::Value(k) => k.0.clone(),
        };
        let key = raw.trim();
        if key.is_empty() || key.contains('\0') {
            return Err(PortError::permanent(
                DEP,
                "start",
                "executor key source is empty or holds a NUL byte",
            ));
        }
        Ok(key.to_owned())
    }
}

/// A pipe holding `key` and a newline, its write end closed: the forwarder's stdin for
/// `--registration-bearer-stdin` (one bearer line; codex 0.171.0 reads at most 16 KiB,
/// ../shared/reference/executor-protocol.md). The pipe buffer (64 KiB on Linux, pipe(7))
/// holds it, so the write never waits for the reader. Both ends are close-on-exec; the
/// read end becomes the child's fd 0 at spawn.
pub(super) fn key_pipe(key: &str) -> Result<std::process::Stdio, PortError> {
    use std::io::Write as _;
    let fail =
        |e: std::io::Error| PortError::transient(DEP, "start", format!("key pipe: {}", e.kind()));
    let (read, mut write) = std::io::pipe().map_err(fail)?;
    write.write_all(key.as_bytes()).map_err(fail)?;
    write.write_all(b"\n").map_err(fail)?;
    drop(write);
    Ok(std::process::Stdio::from(read))
}
