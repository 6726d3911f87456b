//! [`StrictEcs`]: an AWS SDK interceptor for the ECS client of every moto test, so the
//! adapter cannot drift from the documented API where moto is more lenient than ECS
//! (shared/reference/aws-semantics.md). Test support (feature `bootstrap`),
//! never in the default build.
//!
//! It does three things on every ECS call of the client it is installed on
//! ([`StrictEcs::client`]):
//!
//! 1. **Rejects** — before anything is serialized or sent — a request the Amazon ECS API
//!    Reference forbids ([`check_request`] on the typed input), failing the call with a [`ForbiddenRequest`]
//!    (the SDK reports it as a construction failure, which the adapters map to a permanent
//!    error). moto accepts every one of these:
//!    - `ListTasks` with `startedBy` and any other filter (`containerInstance`, `family`,
//!      `serviceName`, `desiredStatus`, `launchType`): "When you specify `startedBy` as the
//!      filter, it must be the only filter that you use" (ListTasks, `startedBy`);
//!    - `DescribeTasks` with more than 100 tasks: "A list of up to 100 task IDs or full ARN
//!      entries" (DescribeTasks, `tasks`);
//!    - `RunTask` with a `clientToken` over 64 characters or with a character outside
//!      33–126 ("Up to 64 characters are allowed. The valid characters are characters in
//!      the range of 33-126, inclusive", RunTask, `clientToken`), a `startedBy` over 36
//!      characters or with a character other than letters, digits, `-`, `/` and `_` ("Up
//!      to 36 letters (uppercase and lowercase), numbers, hyphens (-), forward slash (/),
//!      and underscores (_) are allowed", StartTask/RunTask, `startedBy`; the current
//!      RunTask model text says 128, the stricter documented limit is kept), more than 50
//!      tags, a tag key over 128 or a value over 256 characters ("Maximum number of tags
//!      per resource - 50", "Maximum key length - 128 Unicode characters in UTF-8",
//!      "Maximum value length - 256 Unicode characters in UTF-8", RunTask, `tags`);
//!    - `RunTask` with a managed EBS volume configuration ECS refuses
//!      ([`check_volume_configurations`]);
//!    - `StopTask` with a `reason` over 255 characters ("Up to 255 characters are allowed
//!      in this message", StopTask, `reason`);
//!    - `ListTasks` with a `startedBy` value ECS could never have stored (over 36
//!      characters or outside letters, digits, `-`, `/`, `_`: the RunTask/StartTask rule
//!      above; a pool's `ListTasks` by its `startedBy` is checked like an environment's);
//!    - `TagResource` (a claimed pool member is tagged after `RunTask`) without a
//!      `resourceArn` or without tags ("tags ... Required: Yes", TagResource), with more
//!      than 50 tags, a key over 128 or a value over 256 characters, or a key with the
//!      reserved `aws:` prefix ("Do not use aws:, AWS:, or any upper or lowercase
//!      combination of such as a prefix for either keys or values as it is reserved for
//!      Amazon Web Services use", TagResource, Tag).
//! 2. **Records** every request that passed, as sent: the operation (from `X-Amz-Target`)
//!    and the serialized JSON body ([`StrictEcs::requests`], [`StrictEcs::calls_of`]), so
//!    tests assert the exact request shapes (one entry per execution: a paginator's pages
//!    are separate entries; SDK retries of one execution are not).
//! 3. Optionally **lags** like ECS right after `RunTask` ([`StrictEcs::hide_new_tasks_for`]):
//!    "The Amazon ECS API follows an eventual consistency model ... the result of an API
//!    command you run that affects your Amazon ECS resources might not be immediately
//!    visible to all subsequent commands you run" (RunTask). A task a `RunTask` of this
//!    client returns is then, for the lag, left out of `ListTasks` pages and answered
//!    `failures: [{arn, reason: "MISSING"}]` (and no task) by `DescribeTasks`, by rewriting
//!    the deserialized output. moto itself shows a task at once.

use aws_config::SdkConfig;
use aws_sdk_ecs::config::interceptors::{
    BeforeSerializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
    FinalizerInterceptorContextMut,
};
use aws_sdk_ecs::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_ecs::error::BoxError;
use aws_sdk_ecs::operation::describe_tasks::{DescribeTasksInput, DescribeTasksOutput};
use aws_sdk_ecs::operation::list_tasks::{ListTasksInput, ListTasksOutput};
use aws_sdk_ecs::operation::run_task::{RunTaskInput, RunTaskOutput};
use aws_sdk_ecs::operation::stop_task::StopTaskInput;
use aws_sdk_ecs::operation::tag_resource::TagResourceInput;
use aws_sdk_ecs::types::Failure;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// `DescribeTasks`: at most this many tasks per call (ECS API reference, DescribeTasks).
pub const MAX_DESCRIBE_TASKS: usize = 100;
/// `RunTask` `clientToken`: at most this many characters (ECS API reference, RunTask).
pub const MAX_CLIENT_TOKEN_CHARS: usize = 64;
/// `startedBy`: at most this many characters (ECS API reference, StartTask/RunTask).
pub const MAX_STARTED_BY_CHARS: usize = 36;
/// Tags per resource (ECS API reference, RunTask `tags`).
pub const MAX_TAGS: usize = 50;
/// Tag key length, Unicode characters (ECS API reference, RunTask `tags`).
pub const MAX_TAG_KEY_CHARS: usize = 128;
/// Tag value length, Unicode characters (ECS API reference, RunTask `tags`).
pub const MAX_TAG_VALUE_CHARS: usize = 256;
/// `StopTask` `reason`: at most this many characters (ECS API reference, StopTask).
pub const MAX_STOP_REASON_CHARS: usize = 255;

/// A request the ECS API reference forbids, refused by [`StrictEcs`] before it is sent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "ECS would reject this {operation} request: {rule} (Amazon ECS API Reference, {operation})"
)]
pub struct ForbiddenRequest {
    /// The ECS operation (`ListTasks`, `DescribeTasks`, `RunTask`, `StopTask`,
    /// `TagResource`).
    pub operation: &'static str,
    /// Which documented rule the request breaks.
    pub rule: String,
}

fn forbidden(operation: &'static str, rule: impl Into<String>) -> ForbiddenRequest {
    ForbiddenRequest {
        operation,
        rule: rule.into(),
    }
}

fn chars(s: &str) -> usize {
    s.chars().count()
}

/// `ListTasks`: `startedBy` must be the only filter ("When you specify `startedBy` as the
/// filter, it must be the only filter that you use"). `cluster`, `maxResults` and
/// `nextToken` are not filters.
///
/// # Errors
/// [`ForbiddenRequest`] naming the other filters.
pub fn check_list_tasks(input: &ListTasksInput) -> Result<(), ForbiddenRequest> {
    let Some(by) = input.started_by() else {
        return Ok(());
    };
    check_started_by("ListTasks", by)?;
    let others: Vec<&str> = [
        ("containerInstance", input.container_instance().is_some()),
        ("family", input.family().is_some()),
        ("serviceName", input.service_name().is_some()),
        ("desiredStatus", input.desired_status().is_some()),
        ("launchType", input.launch_type().is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect();
    if others.is_empty() {
        return Ok(());
    }
    Err(forbidden(
        "ListTasks",
        format!(
            "startedBy must be the only filter, got startedBy with {}",
            others.join(", ")
        ),
    ))
}

/// `DescribeTasks`: at most [`MAX_DESCRIBE_TASKS`] tasks.
///
/// # Errors
/// [`ForbiddenRequest`] with the count.
pub fn check_describe_tasks(input: &DescribeTasksInput) -> Result<(), ForbiddenRequest> {
    let n = input.tasks().len();
    if n > MAX_DESCRIBE_TASKS {
        return Err(forbidden(
            "DescribeTasks",
            format!("at most {MAX_DESCRIBE_TASKS} tasks per call, got {n}"),
        ));
    }
    Ok(())
}

/// `RunTask`: `clientToken` ≤ 64 characters in 33–126; `startedBy` ≤ 36 letters, digits,
/// `-`, `/`, `_`; ≤ 50 tags, keys ≤ 128 and values ≤ 256 characters.
///
/// # Errors
/// [`ForbiddenRequest`] naming the first broken rule.
pub fn check_run_task(input: &RunTaskInput) -> Result<(), ForbiddenRequest> {
    const OP: &str = "RunTask";
    if let Some(token) = input.client_token() {
        let n = chars(token);
        if n > MAX_CLIENT_TOKEN_CHARS || !token.chars().all(|c| ('!'..='~').contains(&c)) {
            return Err(forbidden(
                OP,
                format!(
                    "clientToken must be at most {MAX_CLIENT_TOKEN_CHARS} characters in the range 33-126, got {n} characters"
                ),
            ));
        }
    }
    if let Some(by) = input.started_by() {
        check_started_by(OP, by)?;
    }
    check_volume_configurations(input)?;
    check_tags(OP, input.tags())
}

/// A `startedBy` value: at most [`MAX_STARTED_BY_CHARS`] letters, digits, `-`, `/`, `_`.
fn check_started_by(operation: &'static str, by: &str) -> Result<(), ForbiddenRequest> {
    let n = chars(by);
    let ok = by
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '/' | '_'));
    if n > MAX_STARTED_BY_CHARS || !ok {
        return Err(forbidden(
            operation,
            format!(
                "startedBy must be at most {MAX_STARTED_BY_CHARS} letters, numbers, -, / or _, got {n} characters"
            ),
        ));
    }
    Ok(())
}

/// Tags of a request: at most [`MAX_TAGS`], keys ≤ [`MAX_TAG_KEY_CHARS`] and values ≤
/// [`MAX_TAG_VALUE_CHARS`] characters.
fn check_tags(
    operation: &'static str,
    tags: &[aws_sdk_ecs::types::Tag],
) -> Result<(), ForbiddenRequest> {
    if tags.len() > MAX_TAGS {
        return Err(forbidden(
            operation,
            format!("at most {MAX_TAGS} tags, got {}", tags.len()),
        ));
    }
    for t in tags {
        let key = t.key().unwrap_or_default();
        if chars(key) > MAX_TAG_KEY_CHARS {
            return Err(forbidden(
                operation,
                format!(
                    "tag keys are at most {MAX_TAG_KEY_CHARS} characters, got {}",
                    chars(key)
                ),
            ));
        }
        let value = t.value().unwrap_or_default();
        if chars(value) > MAX_TAG_VALUE_CHARS {
            return Err(forbidden(
                operation,
                format!(
                    "tag values are at most {MAX_TAG_VALUE_CHARS} characters, got {} for {key}",
                    chars(value)
                ),
            ));
        }
    }
    Ok(())
}

/// `TagResource`: a `resourceArn`, at least one tag, the tag limits of [`check_tags`], and
/// no key with the reserved `aws:` prefix (any case).
///
/// # Errors
/// [`ForbiddenRequest`] naming the first broken rule.
pub fn check_tag_resource(input: &TagResourceInput) -> Result<(), ForbiddenRequest> {
    const OP: &str = "TagResource";
    if input.resource_arn().is_none_or(str::is_empty) {
        return Err(forbidden(OP, "resourceArn is required"));
    }
    let tags = input.tags();
    if tags.is_empty() {
        return Err(forbidden(OP, "tags is required (at least one tag)"));
    }
    if let Some(key) = tags
        .iter()
        .filter_map(|t| t.key())
        .find(|k| k.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("aws:")))
    {
        return Err(forbidden(
            OP,
            format!("tag key {key} uses the reserved aws: prefix"),
        ));
    }
    check_tags(OP, tags)
}

/// `RunTask` `volumeConfigurations` (ECS-managed EBS): at most one ("only one volume
/// configured at launch is supported", ECS API reference, Volume); `managedEBSVolume`
/// with a non-empty `roleArn` ("Required: Yes"), a `sizeInGiB` unless a `snapshotId` is
/// given, and `tagSpecifications[].resourceType` `volume` (TaskManagedEBSVolumeConfiguration,
/// EBSTagSpecification). moto ignores all of it.
///
/// # Errors
/// [`ForbiddenRequest`] naming the first broken rule.
pub fn check_volume_configurations(input: &RunTaskInput) -> Result<(), ForbiddenRequest> {
    const OP: &str = "RunTask";
    let all = input.volume_configurations();
    if all.len() > 1 {
        return Err(forbidden(
            OP,
            "only one volume configured at launch is supported",
        ));
    }
    for v in all {
        let Some(ebs) = v.managed_ebs_volume() else {
            return Err(forbidden(
                OP,
                "volumeConfigurations[].managedEBSVolume is required",
            ));
        };
        if ebs.role_arn().is_empty() {
            return Err(forbidden(OP, "managedEBSVolume.roleArn is required"));
        }
        if ebs.size_in_gib().is_none() && ebs.snapshot_id().is_none() {
            return Err(forbidden(
                OP,
                "managedEBSVolume.sizeInGiB is required without a snapshotId",
            ));
        }
        if ebs
            .tag_specifications()
            .iter()
            .any(|t| t.resource_type().as_str() != "volume")
        {
            return Err(forbidden(
                OP,
                "managedEBSVolume.tagSpecifications[].resourceType must be volume",
            ));
        }
    }
    Ok(())
}

/// `StopTask`: `reason` ≤ 255 characters.
///
/// # Errors
/// [`ForbiddenRequest`] with the length.
pub fn check_stop_task(input: &StopTaskInput) -> Result<(), ForbiddenRequest> {
    let n = input.reason().map(chars).unwrap_or(0);
    if n > MAX_STOP_REASON_CHARS {
        return Err(forbidden(
            "StopTask",
            format!("reason must be at most {MAX_STOP_REASON_CHARS} characters, got {n}"),
        ));
    }
    Ok(())
}

/// One request as sent: the operation and the serialized JSON body.
#[derive(Clone, Debug, PartialEq)]
pub struct EcsRequest {
    /// The ECS operation, e.g. `ListTasks` (from the `X-Amz-Target` header).
    pub operation: String,
    /// The JSON body (`Value::Null` if it was not JSON).
    pub body: Value,
}

#[derive(Debug, Default)]
struct State {
    requests: Vec<EcsRequest>,
    rejected: Vec<ForbiddenRequest>,
    /// How long tasks started from now on stay invisible; `None`: no lag.
    lag: Option<Duration>,
    /// Task ARN → until when it is invisible.
    hidden: HashMap<String, Instant>,
}

impl State {
    fn is_hidden(&self, arn: &str, now: Instant) -> bool {
        self.hidden.get(arn).is_some_and(|until| now < *until)
    }
}

/// The interceptor (see the module docs). Clones share the recorded requests and the lag
/// state, so a test keeps one clone and installs another on the client.
#[derive(Clone, Debug, Default)]
pub struct StrictEcs {
    state: Arc<Mutex<State>>,
}

impl StrictEcs {
    /// A guard that records, with no lag.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An ECS client built from `sdk` with this interceptor installed.
    pub fn client(&self, sdk: &SdkConfig) -> aws_sdk_ecs::Client {
        let config = aws_sdk_ecs::config::Builder::from(sdk)
            .interceptor(self.clone())
            .build();
        aws_sdk_ecs::Client::from_conf(config)
    }

    /// Every request sent so far, in order.
    pub fn requests(&self) -> Vec<EcsRequest> {
        self.state().requests.clone()
    }

    /// The bodies of the requests of `operation` (e.g. `"ListTasks"`), in order.
    pub fn calls_of(&self, operation: &str) -> Vec<Value> {
        self.state()
            .requests
            .iter()
            .filter(|r| r.operation == operation)
            .map(|r| r.body.clone())
            .collect()
    }

    /// The requests refused so far, in order.
    pub fn rejected(&self) -> Vec<ForbiddenRequest> {
        self.state().rejected.clone()
    }

    /// Forgets the recorded and refused requests (the lag state stays).
    pub fn clear(&self) {
        let mut s = self.state();
        s.requests.clear();
        s.rejected.clear();
    }

    /// From now on, every task a `RunTask` of this client returns is invisible for `lag`
    /// after that answer: left out of `ListTasks`, `MISSING` to `DescribeTasks` (ECS's
    /// eventual consistency right after `RunTask`).
    pub fn hide_new_tasks_for(&self, lag: Duration) {
        self.state().lag = Some(lag);
    }

    /// Ends the lag: new tasks are visible at once and every hidden task shows up.
    pub fn stop_hiding(&self) {
        let mut s = self.state();
        s.lag = None;
        s.hidden.clear();
    }

    /// The tasks invisible right now.
    pub fn hidden(&self) -> Vec<String> {
        let now = Instant::now();
        let s = self.state();
        let mut arns: Vec<String> = s
            .hidden
            .iter()
            .filter(|(_, until)| now < **until)
            .map(|(arn, _)| arn.clone())
            .collect();
        arns.sort();
        arns
    }

    /// Applies the lag to a deserialized output (see [`StrictEcs::hide_new_tasks_for`]).
    fn lag_output(&self, context: &mut FinalizerInterceptorContextMut<'_>) {
        let Some(Ok(output)) = context.output_or_error_mut() else {
            return;
        };
        let now = Instant::now();
        let mut s = self.state();
        if let Some(run) = output.downcast_ref::<RunTaskOutput>() {
            if let Some(lag) = s.lag {
                for arn in run.tasks().iter().filter_map(|t| t.task_arn()) {
                    s.hidden.entry(arn.to_owned()).or_insert(now + lag);
                }
            }
            return;
        }
        if s.hidden.is_empty() {
            return;
        }
        if let Some(list) = output.downcast_mut::<ListTasksOutput>() {
            if let Some(arns) = list.task_arns.as_mut() {
                arns.retain(|a| !s.is_hidden(a, now));
            }
        } else if let Some(described) = output.downcast_mut::<DescribeTasksOutput>()
            && let Some(tasks) = described.tasks.as_mut()
        {
            let mut missing = Vec::new();
            tasks.retain(|t| match t.task_arn() {
                Some(arn) if s.is_hidden(arn, now) => {
                    missing.push(Failure::builder().arn(arn).reason("MISSING").build());
                    false
                }
                _ => true,
            });
            described
                .failures
                .get_or_insert_with(Vec::new)
                .extend(missing);
        }
    }
}

/// Checks the typed ECS input of a call against the API reference ([`check_list_tasks`],
/// [`check_describe_tasks`], [`check_run_task`], [`check_stop_task`],
/// [`check_tag_resource`]); other operations pass.
///
/// # Errors
/// The [`ForbiddenRequest`] of the first broken rule.
pub fn check_request(
    context: &BeforeSerializationInterceptorContextRef<'_>,
) -> Result<(), ForbiddenRequest> {
    let input = context.input();
    if let Some(i) = input.downcast_ref::<ListTasksInput>() {
        check_list_tasks(i)
    } else if let Some(i) = input.downcast_ref::<DescribeTasksInput>() {
        check_describe_tasks(i)
    } else if let Some(i) = input.downcast_ref::<RunTaskInput>() {
        check_run_task(i)
    } else if let Some(i) = input.downcast_ref::<StopTaskInput>() {
        check_stop_task(i)
    } else if let Some(i) = input.downcast_ref::<TagResourceInput>() {
        check_tag_resource(i)
    } else {
        Ok(())
    }
}

impl Intercept for StrictEcs {
    fn name(&self) -> &'static str {
        "StrictEcs"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        check_request(context).map_err(|e| {
            self.state().rejected.push(e.clone());
            Box::new(e) as BoxError
        })
    }

    fn read_after_serialization(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        let operation = request
            .headers()
            .get("x-amz-target")
            .and_then(|t| t.rsplit('.').next())
            .unwrap_or_default()
            .to_owned();
        let body = request
            .body()
            .bytes()
            .and_then(|b| serde_json::from_slice(b).ok())
            .unwrap_or(Value::Null);
        self.state().requests.push(EcsRequest { operation, body });
        Ok(())
    }

    fn modify_before_completion(
        &self,
        context: &mut FinalizerInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        self.lag_output(context);
        Ok(())
    }
}
