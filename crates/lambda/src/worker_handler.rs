//! The worker function: one SQS batch (events, timers or sweep queue: one event source
//! mapping each, [`QueueRoutes`]) through [`Controller::process`], answered with a partial
//! batch response.
//!
//! Per record, in batch order:
//! - the body is decoded as a [`Job`]. An **undecodable body is reported as a failure**
//!   (and logged with its message id, not its body): it returns after the queue's
//!   visibility timeout and the redrive policy moves it to the dead-letter queue after
//!   `maxReceiveCount` receives, where an operator can see it. Reporting it as a success
//!   would delete it silently; a job is a hint, but a lost hint is only repaired by the
//!   next sweep;
//! - then [`Controller::settle`] (the same code as local mode's queue loop):
//! - `Disposition::Done` → success (Lambda deletes the message);
//! - `Disposition::RetryAfter(secs)` (busy lock, missing evidence, a failed effect)
//!   → the same job is **handed off** to the timers queue as a new message with
//!   `DelaySeconds` = `secs` (≤ 900; [`Controller::hand_off`]), then success. A retry
//!   through the message itself would count toward its queue's `maxReceiveCount` — and on
//!   a FIFO batch so would every later record reported with it — so a job waiting for a
//!   lock would be dead-lettered without ever failing (`sandbox_controller::consume`
//!   docs). When the hand-off send fails, `ChangeMessageVisibility` to `secs` on the
//!   record's own queue, then failure;
//! - `Err` (a port failed) → `ChangeMessageVisibility` to
//!   `failure_backoff_secs(ApproximateReceiveCount)` (2^n s, ≤ 300, as local mode's
//!   queue loop), then failure; the redrive policy bounds the retries.
//!
//! A failed `ChangeMessageVisibility` is logged and the message is still reported: it then
//! returns after the queue's visibility timeout.
//!
//! FIFO batches stop at the first record that does not succeed (see
//! [`crate::batch_response`]).
//!
//! **The budget** comes from the invocation's deadline (the Lambda runtime `Context`
//! `deadline`, Unix milliseconds): a record is attempted only while at least
//! [`record_budget`] remains — the effect-key lock lease (`ControllerConfig::lock_ttl_secs`,
//! which bounds the longest job: no start or stop is sent after the lease's
//! `not_after`, and every write after the lease is refused) plus [`SETTLE_SECS`] for the
//! release and for deferring the records after it. The first record is always attempted;
//! the templates set the function timeout ≥ that budget (infra/sam/template.yaml,
//! `WorkerFunction`), so a record never outlives its invocation.
//!
//! **Records not attempted** (past the budget, or after a FIFO record that did not
//! succeed) are never left to the visibility timeout and never count toward the
//! dead-letter threshold: each is **deferred** ([`defer`]) — its job sent again as a new
//! message on the timers queue (a sweep record's on the sweep queue, so a deferred sweep
//! never lands among the rechecks) with `DelaySeconds` 0 (visible at once, receive count 1)
//! and [`Job::handoffs`] one higher, and the record reported a success (Lambda deletes
//! it). SQS counts a receive whether or not the consumer looked at the message, so a
//! record kept on its queue would count toward `maxReceiveCount`; a new message does not.
//! The deferral counter is the hand-off counter, capped by
//! [`sandbox_controller::consume::MAX_HANDOFFS`]: a job deferred (or handed off) that many
//! times is not sent again but made visible again at once on its own queue
//! (`ChangeMessageVisibility` to 0) and reported, so only then do its receives count
//! toward the dead-letter queue, where an operator sees it. The same applies when the
//! deferral's `SendMessage` fails, and to an undecodable body (nothing to defer).
//!
//! **The warm pool** (docs/WARM_POOL.md "Refill"): with `POOL_SIZE` > 0 a batch
//! that applied a start (a claim or a cold start after a miss) ends with
//! [`Controller::refill_pool`], if [`REFILL_BUDGET`] remains before the deadline; and an
//! EventBridge schedule invokes the function with `{"pool_refill": {}}` (every minute, only
//! with the pool on) to top the pool up, recycle members past their age and reconcile
//! ([`WorkerEvent`]). Both run under the deployment's refill lease, so concurrent
//! invocations never overfill the pool; a refill error is logged and never fails a batch.

use crate::batch_response::{ItemOutcome, is_fifo_batch, is_fifo_record, partial_batch_response};
use crate::settings::queue_name_of_url;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use lambda_runtime::{Diagnostic, LambdaEvent, service_fn};
use sandbox_agents_api::SessionsApi;
use sandbox_controller::consume::{MAX_HANDOFFS, Settled};
use sandbox_controller::ports::{Compute, Outgoing, Queue, Registry};
use sandbox_controller::{Controller, ControllerConfig, Job};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing::Instrument;

/// Time a record's settlement may take after its job, seconds: the release, a hand-off
/// or a visibility change, and the deferral of the records after it (one `SendMessage`
/// each, a batch holds at most 10).
pub const SETTLE_SECS: u64 = 10;

/// The time a record needs before the invocation's deadline to be attempted: the
/// effect-key lock lease (the longest a job can act, [`ControllerConfig::lock_ttl_secs`])
/// plus [`SETTLE_SECS`]. With the defaults, 120 + 10 = 130 s; the worker's function
/// timeout (150 s) is at least this.
pub fn record_budget(config: &ControllerConfig) -> Duration {
    Duration::from_secs(config.lock_ttl_secs.saturating_add(SETTLE_SECS))
}

/// The time a batch needs before its deadline to end with a pool refill (a few `RunTask`
/// and `PutItem` calls; a refill cut short by the timeout leaves at most a member without
/// its item, which the next refill's reconcile stops).
pub const REFILL_BUDGET: Duration = Duration::from_secs(30);

/// What invoked the worker function.
#[derive(Debug)]
pub enum WorkerEvent {
    /// An SQS batch from the event source mapping (`{"Records": [...]}`).
    Sqs(SqsEvent),
    /// The pool's schedule: `{"pool_refill": {}}` (infra: `PoolRefillSchedule`).
    PoolRefill,
}

impl WorkerEvent {
    /// Reads an invocation's payload.
    ///
    /// # Errors
    /// A message naming what was expected, when the payload is neither.
    pub fn from_payload(payload: serde_json::Value) -> Result<Self, String> {
        if payload.get("Records").is_some() {
            return serde_json::from_value(payload)
                .map(Self::Sqs)
                .map_err(|e| format!("an SQS event whose records do not decode: {e}"));
        }
        if payload.get("pool_refill").is_some() {
            return Ok(Self::PoolRefill);
        }
        Err("neither an SQS event ({\"Records\": [...]}) nor {\"pool_refill\": {}}".to_owned())
    }
}

/// Runs one pool refill ([`Controller::refill_pool`]) and logs what it did; an error is
/// logged, never returned (the next batch or schedule refills). Returns the refill's
/// summary as JSON (`null` on error).
///
/// `deadline` is the invocation's deadline (`None`: no limit): the refill acts until
/// [`SETTLE_SECS`] before it at the latest ([`Controller::refill_pool_until`]), so it never
/// outlives its invocation (a Lambda timeout fails the whole SQS batch, which then returns
/// after the visibility timeout; Lambda Developer Guide, "Using Lambda with Amazon SQS").
pub async fn refill<Q, R, C, S>(
    controller: &Controller<Q, R, C, S>,
    deadline: Option<SystemTime>,
) -> serde_json::Value
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    let until = deadline.map_or(u64::MAX, |d| {
        d.duration_since(UNIX_EPOCH)
            .map_or(0, |t| t.as_secs())
            .saturating_sub(SETTLE_SECS)
    });
    match controller.refill_pool_until(until).await {
        Ok(r) => {
            tracing::info!(
                skipped = r.skipped,
                reconciled = r.reconciled,
                recycled = r.recycled,
                started = r.started,
                idle = r.idle,
                "pool refill"
            );
            serde_json::json!({
                "skipped": r.skipped, "reconciled": r.reconciled, "recycled": r.recycled,
                "started": r.started, "idle": r.idle,
            })
        }
        Err(e) => {
            tracing::warn!(error = %e, "pool refill failed; the next batch or schedule refills");
            serde_json::Value::Null
        }
    }
}

/// Which of the controller's queues a record came from, by queue name (the last part of
/// both the queue URL and the record's `eventSourceARN`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueRoutes {
    timers_name: String,
    sweep_name: Option<String>,
}

/// The controller queue a record belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceQueue {
    /// The events queue (FIFO): webhook jobs.
    Events,
    /// The timers queue (standard): delayed rechecks.
    Timers,
    /// The sweep queue (standard): a fanned-out sweep's jobs
    /// ([`Controller::with_sweep_queue`]).
    Sweep,
}

impl QueueRoutes {
    /// Routes for the timers queue at `timers_queue_url`; every other record is an events
    /// record (see [`QueueRoutes::with_sweep`]).
    pub fn new(timers_queue_url: &str) -> Self {
        Self {
            timers_name: queue_name_of_url(timers_queue_url).to_owned(),
            sweep_name: None,
        }
    }

    /// Also routes the sweep queue at `sweep_queue_url` (`SWEEP_QUEUE_URL`): its records
    /// are settled (retried, deferred) on the sweep queue, never on the timers queue.
    #[must_use]
    pub fn with_sweep(mut self, sweep_queue_url: &str) -> Self {
        self.sweep_name = Some(queue_name_of_url(sweep_queue_url).to_owned());
        self
    }

    /// The queue `record` came from: the timers or the sweep queue when its ARN names it
    /// (or, without an ARN, the timers queue when it is not a FIFO record), else the events
    /// queue.
    pub fn source_of(&self, record: &SqsMessage) -> SourceQueue {
        match record.event_source_arn.as_deref() {
            Some(arn) => {
                let name = arn.rsplit(':').next();
                if name == Some(self.timers_name.as_str()) {
                    SourceQueue::Timers
                } else if name.is_some() && name == self.sweep_name.as_deref() {
                    SourceQueue::Sweep
                } else {
                    SourceQueue::Events
                }
            }
            None if !is_fifo_record(record) => SourceQueue::Timers,
            None => SourceQueue::Events,
        }
    }
}

/// The controller's port for the queue `source`.
fn queue_of<Q, R, C, S>(controller: &Controller<Q, R, C, S>, source: SourceQueue) -> &Q
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    match source {
        SourceQueue::Events => &controller.events,
        SourceQueue::Timers => &controller.timers,
        SourceQueue::Sweep => controller.sweep_queue(),
    }
}

/// Processes one SQS batch and returns the partial batch response.
///
/// `deadline` is the invocation's deadline (`None`: no limit); see the module docs.
pub async fn handle_batch<Q, R, C, S>(
    controller: &Controller<Q, R, C, S>,
    routes: &QueueRoutes,
    event: &SqsEvent,
    deadline: Option<SystemTime>,
) -> SqsBatchResponse
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    let fifo = is_fifo_batch(event);
    let budget = record_budget(&controller.config);
    let mut outcomes = Vec::with_capacity(event.records.len());
    let mut stop = false;
    let mut started = false;
    for (n, record) in event.records.iter().enumerate() {
        let id = record.message_id.as_deref().unwrap_or_default();
        let out_of_time = n > 0 && deadline.is_some_and(|d| SystemTime::now() + budget > d);
        let outcome = if stop || out_of_time {
            defer(controller, routes, record).await
        } else {
            let (outcome, start) = process_record(controller, routes, record).await;
            started |= start;
            outcome
        };
        stop |= out_of_time || (fifo && outcome != ItemOutcome::Succeeded);
        outcomes.push((id, outcome));
    }
    let response = partial_batch_response(outcomes.iter().map(|(id, o)| (*id, *o)), fifo);
    let not_attempted = outcomes
        .iter()
        .filter(|(_, o)| *o == ItemOutcome::NotAttempted)
        .count();
    let deferred = outcomes
        .iter()
        .filter(|(_, o)| *o == ItemOutcome::Deferred)
        .count();
    tracing::info!(
        records = event.records.len(),
        failures = response.batch_item_failures.len(),
        not_attempted,
        deferred,
        fifo,
        "batch done"
    );
    if started
        && controller.config.pool.size > 0
        && deadline.is_none_or(|d| SystemTime::now() + REFILL_BUDGET <= d)
    {
        refill(controller, deadline).await;
    }
    response
}

/// Defers one record the batch does not attempt (see the module docs): its job goes to
/// the timers queue as a new message visible at once (`DelaySeconds` 0, de-duplication id
/// `defer:{message_id}:{receive_count}`, `handoffs` + 1) → [`ItemOutcome::Deferred`]
/// (Lambda deletes the record). When the job cannot be decoded, has reached
/// [`MAX_HANDOFFS`], or the send fails: `ChangeMessageVisibility` to 0 on the record's own
/// queue → [`ItemOutcome::NotAttempted`] (reported; a failed visibility change is logged
/// and the queue's timeout applies).
pub async fn defer<Q, R, C, S>(
    controller: &Controller<Q, R, C, S>,
    routes: &QueueRoutes,
    record: &SqsMessage,
) -> ItemOutcome
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    let message_id = record.message_id.as_deref().unwrap_or_default();
    let receive_count = receive_count(record);
    let job = record
        .body
        .as_deref()
        .and_then(|b| serde_json::from_str::<Job>(b).ok());
    let source = routes.source_of(record);
    if let Some(job) = job {
        if job.handoffs < MAX_HANDOFFS {
            let mut next = job;
            next.handoffs = next.handoffs.saturating_add(1);
            let target = match source {
                SourceQueue::Sweep => controller.sweep_queue(),
                SourceQueue::Events | SourceQueue::Timers => &controller.timers,
            };
            let sent = target
                .send(Outgoing {
                    group: next.group().to_owned(),
                    dedup_id: format!("defer:{message_id}:{receive_count}"),
                    delay_secs: 0,
                    job: next,
                })
                .await;
            match sent {
                Ok(_) => {
                    tracing::info!(
                        message_id,
                        receive_count,
                        "record not attempted: deferred to the timers or sweep queue, visible at once"
                    );
                    return ItemOutcome::Deferred;
                }
                Err(e) => tracing::warn!(message_id, error = %e,
                    "deferral failed; the record is made visible again at once"),
            }
        } else {
            tracing::warn!(
                message_id,
                receive_count,
                "record not attempted and its hand-off cap reached: visible again at once on its own queue"
            );
        }
    }
    let queue = queue_of(controller, source);
    match record.receipt_handle.as_deref() {
        Some(receipt) => {
            if let Err(e) = queue.retry_after(receipt, 0).await {
                tracing::warn!(message_id, error = %e, "visibility change failed; the queue's timeout applies");
            }
        }
        None => tracing::warn!(message_id, "no receipt handle; the queue's timeout applies"),
    }
    ItemOutcome::NotAttempted
}

/// The record's `ApproximateReceiveCount` (1 when absent).
fn receive_count(record: &SqsMessage) -> u32 {
    record
        .attributes
        .get("ApproximateReceiveCount")
        .and_then(|c| c.parse::<u32>().ok())
        .unwrap_or(1)
}

/// Processes one record; see the module docs.
pub async fn handle_record<Q, R, C, S>(
    controller: &Controller<Q, R, C, S>,
    routes: &QueueRoutes,
    record: &SqsMessage,
) -> ItemOutcome
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    process_record(controller, routes, record).await.0
}

/// [`handle_record`], and whether its job applied a start (a claim or a cold start: the
/// batch then ends with a pool refill when the pool is on).
async fn process_record<Q, R, C, S>(
    controller: &Controller<Q, R, C, S>,
    routes: &QueueRoutes,
    record: &SqsMessage,
) -> (ItemOutcome, bool)
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi,
{
    let message_id = record.message_id.as_deref().unwrap_or_default();
    let job: Job = match record.body.as_deref().map(serde_json::from_str) {
        Some(Ok(job)) => job,
        Some(Err(e)) => {
            tracing::error!(
                message_id, line = e.line(), column = e.column(), category = ?e.classify(),
                "undecodable job body; reported failed so the redrive policy dead-letters it"
            );
            return (ItemOutcome::Failed, false);
        }
        None => {
            tracing::error!(message_id, "record without a body; reported failed");
            return (ItemOutcome::Failed, false);
        }
    };
    let queue = queue_of(controller, routes.source_of(record));
    let receive_count = receive_count(record);
    let span = tracing::info_span!(
        "job",
        message_id,
        session_id = %job.session_id,
        environment_id = job.environment_id.as_ref().map(|e| e.as_str()),
        webhook_id = job.webhook_id.as_deref(),
        trigger = trigger_kind(&job),
        receive_count,
    );
    async {
        let result = controller.process(&job).await;
        let mut started = false;
        if let Ok(p) = &result {
            let outcome = p.outcome().map(|o| o.to_string());
            started = p
                .applied
                .iter()
                .any(|e| matches!(e, sandbox_core::decision::Effect::StartCompute(_)));
            tracing::info!(outcome, note = p.note, error = p.error, applied = p.applied.len(), disposition = ?p.disposition, "job processed");
        }
        let receipt = record.receipt_handle.as_deref();
        let outcome = match controller
            .settle(queue, &job, message_id, receive_count, receipt, &result)
            .await
        {
            Settled::Delete => ItemOutcome::Succeeded,
            Settled::Kept => ItemOutcome::Failed,
        };
        (outcome, started)
    }
    .instrument(span)
    .await
}

/// The trigger's `kind` (`connection_requested`, `lease_due`, ...) for logs.
fn trigger_kind(job: &Job) -> String {
    serde_json::to_value(&job.trigger)
        .ok()
        .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_owned))
        .unwrap_or_default()
}

/// Serves SQS batches with `controller` until the Lambda runtime stops the process.
///
/// # Errors
/// The runtime's error when the Lambda Runtime API is unreachable.
pub async fn run<Q, R, C, S>(
    controller: Controller<Q, R, C, S>,
    routes: QueueRoutes,
) -> Result<(), lambda_runtime::Error>
where
    Q: Queue,
    R: Registry,
    C: Compute,
    S: SessionsApi + 'static,
{
    let shared = Arc::new((controller, routes));
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| {
        let shared = Arc::clone(&shared);
        async move {
            let deadline = UNIX_EPOCH + Duration::from_millis(event.context.deadline);
            let (controller, routes) = &*shared;
            let answer = match WorkerEvent::from_payload(event.payload) {
                Ok(WorkerEvent::Sqs(batch)) => {
                    let response = handle_batch(controller, routes, &batch, Some(deadline)).await;
                    serde_json::to_value(response).map_err(|e| Diagnostic {
                        error_type: "ResponseNotEncoded".into(),
                        error_message: e.to_string(),
                    })
                }
                Ok(WorkerEvent::PoolRefill) => Ok(
                    serde_json::json!({ "pool_refill": refill(controller, Some(deadline)).await }),
                ),
                Err(message) => {
                    tracing::error!(%message, "invocation payload refused");
                    Err(Diagnostic {
                        error_type: "UnknownEvent".into(),
                        error_message: message,
                    })
                }
            };
            crate::emf::flush();
            answer
        }
    }))
    .await
}
