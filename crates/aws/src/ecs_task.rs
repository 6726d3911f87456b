//! The ECS task vocabulary shared by the compute adapter ([`crate::ecs_compute`]), its
//! warm pool ([`crate::ecs_pool`]) and EBS workspaces (`crate::ebs_workspaces`): the
//! `sandbox:*` tags every task carries and what a described task says (start time, stop
//! code, exit detail, the `failures` of a `RunTask` that started nothing).
//!
//! Sources: the Amazon ECS API Reference (`Task`, `Container`, `RunTask`) and the AWS
//! tagging rules (values ≤ 256 characters of letters, digits, spaces and `+ - = . _ : / @`).

use aws_sdk_ecs::types::{Tag, Task};
use sandbox_controller::ports::PortError;
use sandbox_core::compute::{ComputeStatus, ExitDetail, TASK_FAILED_TO_START, redact_line};

const DEP: &str = "compute";

/// Tag: the deployment id (also `startedBy`).
pub const TAG_DEPLOYMENT: &str = "sandbox:deployment";
/// Tag: the environment id.
pub const TAG_ENVIRONMENT: &str = "sandbox:environment";
/// Tag: the session id.
pub const TAG_SESSION: &str = "sandbox:session";
/// Tag: the executor generation (decimal).
pub const TAG_GENERATION: &str = "sandbox:generation";

/// AWS tag value limit, characters.
const MAX_TAG_VALUE_CHARS: usize = 256;

fn invalid(operation: &'static str, message: impl Into<String>) -> PortError {
    PortError::permanent(DEP, operation, message)
}

/// Checks a tag value against the AWS tagging rules.
pub(crate) fn check_tag_value(
    operation: &'static str,
    key: &str,
    value: &str,
) -> Result<(), PortError> {
    let len = value.chars().count();
    let ok_chars = value
        .chars()
        .all(|c| c.is_alphanumeric() || c == ' ' || "+-=._:/@".contains(c));
    if len > MAX_TAG_VALUE_CHARS || !ok_chars {
        return Err(invalid(
            operation,
            format!(
                "tag {key} value must be at most {MAX_TAG_VALUE_CHARS} letters, digits, spaces or + - = . _ : / @ (got {len} characters)"
            ),
        ));
    }
    Ok(())
}

pub(crate) fn tag(key: &str, value: &str) -> Tag {
    Tag::builder().key(key).value(value).build()
}

pub(crate) fn tag_value<'a>(task: &'a Task, key: &str) -> Option<&'a str> {
    task.tags()
        .iter()
        .find(|t| t.key() == Some(key))
        .and_then(|t| t.value())
}

/// Truncates to at most `max` characters.
pub(crate) fn truncate_chars(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

pub(crate) fn started_at(task: &Task) -> Option<u64> {
    task.started_at()
        .or(task.created_at())
        .and_then(|t| u64::try_from(t.secs()).ok())
}

/// The `stopCode` of a stopped task; `TaskFailedToStart` when it stopped without ever
/// starting (no `startedAt`) and ECS gave no code.
pub(crate) fn stop_code(task: &Task, status: ComputeStatus) -> Option<String> {
    if status != ComputeStatus::Stopped {
        return None;
    }
    match task.stop_code() {
        Some(code) => Some(code.as_str().to_owned()),
        None if task.started_at().is_none() => Some(TASK_FAILED_TO_START.to_owned()),
        None => None,
    }
}

/// What a stopped task died of: ECS `stoppedReason`, the exit code of the essential
/// container that ended it (the first with a non-zero `exitCode`, else the first with
/// one: both containers of the split task are essential, so either exiting stops the
/// task), and one line per container that reported an exit or a `reason` (`<name>: exit
/// code <n> (<reason>)`), redacted ([`sandbox_core::compute::redact_line`]). `None` while
/// the task is not `STOPPED`. ECS API reference, `Task.stoppedReason`,
/// `Container.exitCode`, `Container.reason`.
pub(crate) fn exit_detail(task: &Task, status: ComputeStatus) -> Option<ExitDetail> {
    if status != ComputeStatus::Stopped {
        return None;
    }
    let containers = task.containers();
    let exit_code = containers
        .iter()
        .filter_map(|c| c.exit_code())
        .find(|c| *c != 0)
        .or_else(|| containers.iter().find_map(|c| c.exit_code()));
    let output = containers
        .iter()
        .filter(|c| c.exit_code().is_some() || c.reason().is_some())
        .map(|c| {
            let mut line = c.name().unwrap_or("container").to_owned();
            if let Some(code) = c.exit_code() {
                line.push_str(&format!(": exit code {code}"));
            }
            if let Some(r) = c.reason() {
                line.push_str(&format!(" ({r})"));
            }
            redact_line(&line)
        })
        .take(sandbox_core::compute::EXIT_OUTPUT_MAX_LINES)
        .collect();
    Some(ExitDetail {
        reason: task.stopped_reason().map(redact_line),
        exit_code,
        output,
    })
}

/// Why a `RunTask` answer (HTTP 200) started no task: its `failures` as `"<arn>: <reason>
/// (<detail>)"`, joined with `; ` (capacity, ENI limits, a bad task definition).
pub(crate) fn run_task_failures(out: &aws_sdk_ecs::operation::run_task::RunTaskOutput) -> String {
    if out.failures().is_empty() {
        return "RunTask returned no task and no failure".to_owned();
    }
    out.failures()
        .iter()
        .map(|f| {
            format!(
                "{}: {}{}",
                f.arn().unwrap_or("-"),
                f.reason().unwrap_or("unknown"),
                f.detail().map(|d| format!(" ({d})")).unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ecs_compute::MAX_STOP_REASON_CHARS;

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate_chars("abc", 2), "ab");
        assert_eq!(truncate_chars("ééé", 2), "éé");
        assert_eq!(truncate_chars("ab", 255), "ab");
        let long = "x".repeat(300);
        assert_eq!(truncate_chars(&long, MAX_STOP_REASON_CHARS).len(), 255);
    }

    #[test]
    fn tag_values_follow_the_aws_rules() {
        assert!(check_tag_value("t", "k", "env_abc-1.2:3/4@x").is_ok());
        assert!(check_tag_value("t", "k", "has space").is_ok());
        assert!(check_tag_value("t", "k", "bad!").is_err());
        assert!(check_tag_value("t", "k", &"a".repeat(257)).is_err());
    }

    /// The shape `DescribeTasks` gives a task whose forwarder exited after a 401 (ECS API
    /// reference, `Task.stoppedReason`, `Container.exitCode`, `Container.reason`): the
    /// exit detail keeps the reason, the non-zero exit code and one line per container.
    #[test]
    fn a_stopped_tasks_exit_is_read_from_stopped_reason_and_the_containers() {
        use aws_sdk_ecs::types::Container;
        let task = Task::builder()
            .last_status("STOPPED")
            .stop_code(aws_sdk_ecs::types::TaskStopCode::EssentialContainerExited)
            .stopped_reason("Essential container in task exited")
            .containers(Container::builder().name("executor").exit_code(143).build())
            .containers(
                Container::builder()
                    .name("forwarder")
                    .exit_code(1)
                    .reason("registration refused: 401 Unauthorized")
                    .build(),
            )
            .build();
        let d = exit_detail(&task, ComputeStatus::Stopped).expect("a stopped task has one");
        assert_eq!(
            d.reason.as_deref(),
            Some("Essential container in task exited")
        );
        assert_eq!(d.exit_code, Some(143), "the first non-zero exit code");
        assert_eq!(
            d.output,
            vec![
                "executor: exit code 143".to_owned(),
                "forwarder: exit code 1 (registration refused: 401 Unauthorized)".to_owned(),
            ]
        );
        assert!(d.summary().contains("exit code 143"));
        assert_eq!(exit_detail(&task, ComputeStatus::Running), None);
        let clean = Task::builder()
            .containers(Container::builder().name("executor").exit_code(0).build())
            .build();
        assert_eq!(
            exit_detail(&clean, ComputeStatus::Stopped).and_then(|d| d.exit_code),
            Some(0)
        );
    }
}
