//! What every operator command answers: a verdict (the exit code) and, with `--json`, one
//! JSON document in the documented schema (`crates/cli/sandboxctl.schema.json`).
//!
//! Exit codes: 0 the answer shows nothing wrong; 1 it shows a problem (cleanup required,
//! a divergent or reconcile decision, an orphan, a dead-letter queue not empty, a close
//! not finished); 2 a usage or access error (bad input, missing settings, an AWS or
//! database call that failed), in which case nothing was changed by this command.

use serde_json::{Value, json};
use std::io::Write;

/// The schema id every `--json` document carries.
pub const SCHEMA: &str = "sandboxctl/v1";

/// The answer's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing wrong: exit 0.
    Ok,
    /// The answer shows a problem: exit 1.
    Problem,
}

impl Verdict {
    /// `Problem` when `problems` is not empty.
    pub fn of(problems: &[String]) -> Self {
        if problems.is_empty() {
            Self::Ok
        } else {
            Self::Problem
        }
    }

    /// The process exit code.
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Ok => 0,
            Self::Problem => 1,
        }
    }
}

/// Writes `body` (an object) as the `--json` document of `command` on `backend`.
pub fn write_json(
    out: &mut impl Write,
    command: &str,
    backend: &str,
    mut body: Value,
) -> anyhow::Result<()> {
    let obj = body
        .as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("a report body is an object"))?;
    obj.insert("schema".into(), json!(SCHEMA));
    obj.insert("command".into(), json!(command));
    obj.insert("backend".into(), json!(backend));
    serde_json::to_writer_pretty(&mut *out, &body)?;
    writeln!(out)?;
    Ok(())
}

/// Checks an id given on the command line: 1 to 256 characters of `[A-Za-z0-9_:/.-]`
/// (session and environment ids, ECS task ARNs and ids, local `pid:...` handles).
///
/// # Errors
/// A usage error naming `what`.
pub fn checked_id<'a>(what: &str, id: &'a str) -> anyhow::Result<&'a str> {
    let ok = !id.is_empty()
        && id.len() <= 256
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_:/.-".contains(c));
    anyhow::ensure!(ok, "{what} must be 1 to 256 characters of [A-Za-z0-9_:/.-]");
    Ok(id)
}
