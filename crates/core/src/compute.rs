//! Compute as the provider reports it: one ECS Fargate task or one local child process
//! hosting `codex exec-server` for one environment and generation.

use crate::ids::{EnvironmentId, Generation, InstanceId, SessionId};
use serde::{Deserialize, Serialize};

/// One compute instance, as read back from the provider (ECS DescribeTasks, or the local
/// process table), never as remembered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeInstance {
    /// Provider id (task ARN, local process handle).
    pub instance_id: InstanceId,
    /// The environment it serves (from its tags).
    pub environment_id: EnvironmentId,
    /// The session it was started for (from its tags), if tagged.
    pub session_id: Option<SessionId>,
    /// The executor generation (from its tags).
    pub generation: Generation,
    /// Lifecycle status.
    pub status: ComputeStatus,
    /// When the provider started it, Unix seconds; `None` while provisioning.
    pub started_at: Option<u64>,
    /// Why a stopped instance stopped, as the provider says (ECS `stopCode`, e.g.
    /// [`TASK_FAILED_TO_START`], `EssentialContainerExited`, `UserInitiated`); `None` while
    /// it runs or when the provider gives none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_code: Option<String>,
    /// What a stopped instance died of, when the provider says (ECS `stoppedReason` and
    /// the essential container's `exitCode`; locally the exit status and the last lines of
    /// the executor's stderr); `None` while it runs or when nothing is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitDetail>,
}

/// What a stopped executor died of, as the provider reports it. Never a secret: the local
/// backend redacts its captured stderr before it is kept ([`redact_line`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitDetail {
    /// ECS `Task.stoppedReason` (e.g. `Essential container in task exited`), or locally
    /// how the child ended (`exited with status 1`, `killed by signal 9`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The essential container's `exitCode` (ECS `containers[].exitCode`), or the local
    /// child's exit status; `None` when killed by a signal or not reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The last lines the executor (and its forwarder) wrote to stderr, oldest first, at
    /// most [`EXIT_OUTPUT_MAX_LINES`] lines and [`EXIT_OUTPUT_MAX_BYTES`] bytes in all,
    /// redacted (local backend only; on ECS the logs are in CloudWatch Logs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output: Vec<String>,
}

/// At most this many stderr lines are kept in an [`ExitDetail`].
pub const EXIT_OUTPUT_MAX_LINES: usize = 20;
/// At most this many bytes of stderr (all lines together) are kept in an [`ExitDetail`].
pub const EXIT_OUTPUT_MAX_BYTES: usize = 4_096;

impl ExitDetail {
    /// One line for a record or an operator: `<reason>; exit code <n>; stderr: <last
    /// line> | ...` (the last three output lines), at most 1,024 bytes (cut on a character
    /// boundary).
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(r) = &self.reason {
            parts.push(r.clone());
        }
        if let Some(c) = self.exit_code {
            parts.push(format!("exit code {c}"));
        }
        let tail: Vec<&str> = self
            .output
            .iter()
            .rev()
            .take(3)
            .rev()
            .map(String::as_str)
            .collect();
        if !tail.is_empty() {
            parts.push(format!("stderr: {}", tail.join(" | ")));
        }
        let mut s = if parts.is_empty() {
            "no exit detail".to_owned()
        } else {
            parts.join("; ")
        };
        if s.len() > 1_024 {
            let mut cut = 1_024;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
        }
        s
    }
}

/// `line` with anything that looks like a credential replaced by `[redacted]`: the value
/// after `Bearer `, after a `key`/`token`/`secret`/`password`/`authorization` name and
/// `=` or `:`, and any word of 20+ characters that starts with `sk-` or mixes letters and
/// digits with no other characters (an API key's shape: OpenAI keys are `sk-...`; the
/// executor key is an opaque token). A 401 status line, a host name and a path survive.
pub fn redact_line(line: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut redact_next = false;
    for word in line.split(' ') {
        if redact_next && !word.is_empty() {
            out.push("[redacted]".to_owned());
            redact_next = false;
            continue;
        }
        let lower = word.to_ascii_lowercase();
        if lower == "bearer" || lower == "authorization:" {
            redact_next = true;
            out.push(word.to_owned());
            continue;
        }
        let named = ["key", "token", "secret", "password", "authorization"]
            .iter()
            .find_map(|n| {
                let i = lower.find(n)?;
                let rest = &word[i + n.len()..];
                let sep = rest.find(['=', ':'])?;
                // `name=value` or `name:value`: keep the name, drop the value.
                (rest[..sep]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_'))
                .then(|| &word[..i + n.len() + sep + 1])
            });
        if let Some(prefix) = named {
            if prefix.len() == word.len() {
                redact_next = true;
                out.push(word.to_owned());
            } else {
                out.push(format!("{prefix}[redacted]"));
            }
            continue;
        }
        if looks_like_a_key(word) {
            out.push("[redacted]".to_owned());
        } else {
            out.push(word.to_owned());
        }
    }
    out.join(" ")
}

fn looks_like_a_key(word: &str) -> bool {
    let w = word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-' && c != '_');
    if w.len() < 20 {
        return false;
    }
    if w.starts_with("sk-") {
        return true;
    }
    let token_chars = w
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    let digits = w.chars().any(|c| c.is_ascii_digit());
    let letters = w.chars().any(|c| c.is_ascii_alphabetic());
    token_chars && digits && letters
}

/// ECS `stopCode` of a task that stopped before it ever ran (capacity, image pull, ENI,
/// or `PROVISIONING` for ~30 min; ECS API reference, `Task.stopCode`; containers-roadmap
/// #2381). Such a stop counts as a failed start (lifecycle-cases.md row 28).
pub const TASK_FAILED_TO_START: &str = "TaskFailedToStart";

/// ECS `stopCode` of a task whose essential container exited by itself (ECS API
/// reference, `Task.stopCode`): for an executor that never connected, a failure to
/// register ([`crate::record::StartFailureKind::NeverConnected`]).
pub const ESSENTIAL_CONTAINER_EXITED: &str = "EssentialContainerExited";

/// Provider lifecycle status, normalised over ECS `lastStatus` and local processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeStatus {
    /// Accepted, resources being provisioned (ECS `PROVISIONING`).
    Provisioning,
    /// Being started (ECS `PENDING`, `ACTIVATING`).
    Pending,
    /// Running: the executor process exists (it may not be connected yet).
    Running,
    /// On its way down (ECS `DEACTIVATING`, `STOPPING`, `DEPROVISIONING`).
    Stopping,
    /// Gone (ECS `STOPPED`, `DELETED`; a reaped child process).
    Stopped,
}

impl ComputeStatus {
    /// Provisioning, pending or running: counts against "exactly one per environment".
    pub fn is_active(self) -> bool {
        matches!(self, Self::Provisioning | Self::Pending | Self::Running)
    }

    /// Provisioning or pending: a start is in flight.
    pub fn is_starting(self) -> bool {
        matches!(self, Self::Provisioning | Self::Pending)
    }

    /// Anything but stopped: some process may still exist.
    pub fn is_live(self) -> bool {
        !matches!(self, Self::Stopped)
    }

    /// Maps an ECS `lastStatus` string; unknown values count as `Pending` (alive, so a
    /// task in a new state is never mistaken for gone).
    pub fn from_ecs_last_status(s: &str) -> Self {
        match s {
            "PROVISIONING" => Self::Provisioning,
            "PENDING" | "ACTIVATING" => Self::Pending,
            "RUNNING" => Self::Running,
            "DEACTIVATING" | "STOPPING" | "DEPROVISIONING" => Self::Stopping,
            "STOPPED" | "DELETED" => Self::Stopped,
            _ => Self::Pending,
        }
    }
}

/// A reference to one exact compute: the instance and its generation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct InstanceRef {
    /// Provider id.
    pub instance_id: InstanceId,
    /// Executor generation.
    pub generation: Generation,
}

impl ComputeInstance {
    /// Whether the instance stopped without ever running ([`TASK_FAILED_TO_START`]).
    pub fn failed_to_start(&self) -> bool {
        self.status == ComputeStatus::Stopped
            && self.stop_code.as_deref() == Some(TASK_FAILED_TO_START)
    }

    /// This instance's [`InstanceRef`].
    pub fn as_ref(&self) -> InstanceRef {
        InstanceRef {
            instance_id: self.instance_id.clone(),
            generation: self.generation,
        }
    }
}
