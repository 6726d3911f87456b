//! Cold start of the webhook function: exec of the bootstrap → first event answered.
//!
//! Two stubs on 127.0.0.1 stand in for what Lambda gives the process:
//! - the Lambda Runtime API (`AWS_LAMBDA_RUNTIME_API`): `GET .../invocation/next` answers one
//!   Function URL event (a signed 1 KiB delivery, signed now) with the
//!   `Lambda-Runtime-*` headers, then holds every later poll open; `POST
//!   .../invocation/{id}/response` is the moment measured;
//! - AWS (`AWS_ENDPOINT_URL`): Secrets Manager `GetSecretValue` (awsJson 1.1) answers the
//!   signing secret read at init, SQS `SendMessage` (awsJson 1.0, as `aws-sdk-sqs` speaks
//!   it) accepts the job.
//!
//! A run counts only if the answer is a 200 `queued` and the SQS stub got the message. The
//! process is then killed; its peak RSS is read from `/proc/PID/status` (`VmHWM`) while it
//! waits for the next event, which is after init and the first invocation.

use crate::deliveries::{self, SECRET};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::oneshot;

const FUNCTION_URL_EVENT: &str =
    include_str!("../../../events/lambda/function_url.action_required.json");
const SECRET_ARN: &str =
    "arn:aws:secretsmanager:us-east-1:000000000000:secret:bench-webhook-AbCdEf";
const FUNCTION_ARN: &str = "arn:aws:lambda:us-east-1:000000000000:function:bench-webhook";

/// What one run measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Run {
    /// Exec → the runtime stub received the first response, milliseconds.
    pub first_answer_ms: f64,
    /// `VmHWM` after the first answer, KiB.
    pub peak_rss_kib: u64,
}

/// The cold start measurement (`cold_start.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ColdStart {
    /// The bootstrap measured.
    pub bootstrap: PathBuf,
    /// Its size on disk, bytes (built stripped).
    pub binary_bytes: u64,
    /// Whether `file` (when present) says it is stripped; `None` when unknown.
    pub stripped: Option<bool>,
    /// The timed runs (one untimed warm-up run precedes them).
    pub runs: Vec<Run>,
    /// Median of `first_answer_ms`.
    pub median_ms: f64,
    /// 90th percentile of `first_answer_ms`.
    pub p90_ms: f64,
    /// Highest `peak_rss_kib` over the runs.
    pub max_peak_rss_kib: u64,
}

/// When the answer arrived, and the response body (or the error the runtime reported).
type Answered = oneshot::Sender<(Instant, Result<Vec<u8>, String>)>;

struct Armed {
    request_id: String,
    event: Vec<u8>,
    answered: Answered,
}

#[derive(Default)]
struct RuntimeStub {
    armed: Mutex<Option<Armed>>,
    /// The answer channel, once the event was handed out.
    waiting: Mutex<Option<Answered>>,
}

async fn next_invocation(State(stub): State<Arc<RuntimeStub>>) -> Response {
    let armed = stub.armed.lock().ok().and_then(|mut a| a.take());
    let Some(armed) = armed else {
        // Later polls wait until the process is killed, as on Lambda between invocations.
        std::future::pending::<()>().await;
        return StatusCode::NO_CONTENT.into_response();
    };
    if let Ok(mut w) = stub.waiting.lock() {
        *w = Some(armed.answered);
    }
    let deadline_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() + 30_000)
        .unwrap_or(0);
    let mut headers = HeaderMap::new();
    let mut set = |name: &'static str, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    };
    set("lambda-runtime-aws-request-id", armed.request_id);
    set("lambda-runtime-deadline-ms", deadline_ms.to_string());
    set("lambda-runtime-invoked-function-arn", FUNCTION_ARN.into());
    set(
        "lambda-runtime-trace-id",
        "Root=1-692a9b80-4f1c9a2e7b3d8e6f0a5c2b19;Sampled=0".into(),
    );
    set("content-type", "application/json".into());
    (headers, armed.event).into_response()
}

fn finish(stub: &RuntimeStub, outcome: Result<Vec<u8>, String>) {
    let at = Instant::now();
    if let Some(tx) = stub.waiting.lock().ok().and_then(|mut w| w.take()) {
        let _ = tx.send((at, outcome));
    }
}

async fn invocation_response(
    State(stub): State<Arc<RuntimeStub>>,
    UrlPath(_id): UrlPath<String>,
    body: Bytes,
) -> StatusCode {
    finish(&stub, Ok(body.to_vec()));
    StatusCode::ACCEPTED
}

async fn invocation_error(
    State(stub): State<Arc<RuntimeStub>>,
    UrlPath(_id): UrlPath<String>,
    body: Bytes,
) -> StatusCode {
    finish(
        &stub,
        Err(format!(
            "invocation error: {}",
            String::from_utf8_lossy(&body)
        )),
    );
    StatusCode::ACCEPTED
}

async fn init_error(State(stub): State<Arc<RuntimeStub>>, body: Bytes) -> StatusCode {
    finish(
        &stub,
        Err(format!("init error: {}", String::from_utf8_lossy(&body))),
    );
    StatusCode::ACCEPTED
}

#[derive(Default)]
struct AwsStub {
    secret_reads: AtomicU64,
    sends: AtomicU64,
}

async fn aws(State(stub): State<Arc<AwsStub>>, headers: HeaderMap) -> Response {
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let (content_type, body) = match target {
        "secretsmanager.GetSecretValue" => {
            stub.secret_reads.fetch_add(1, Ordering::SeqCst);
            (
                "application/x-amz-json-1.1",
                serde_json::json!({
                    "ARN": SECRET_ARN,
                    "Name": "bench-webhook",
                    "SecretString": SECRET,
                    "VersionId": "00000000-0000-0000-0000-000000000001",
                    "VersionStages": ["AWSCURRENT"],
                    "CreatedDate": 1_764_400_000.0
                }),
            )
        }
        "AmazonSQS.SendMessage" => {
            let n = stub.sends.fetch_add(1, Ordering::SeqCst);
            (
                "application/x-amz-json-1.0",
                serde_json::json!({
                    "MessageId": format!("00000000-0000-0000-0000-{n:012}"),
                    "MD5OfMessageBody": "00000000000000000000000000000000",
                    "SequenceNumber": format!("{:020}", n + 1)
                }),
            )
        }
        other => {
            let mut res = (
                StatusCode::BAD_REQUEST,
                axum::Json(serde_json::json!({
                    "__type": "UnknownOperationException",
                    "message": format!("bench stub does not serve {other:?}")
                })),
            )
                .into_response();
            res.headers_mut().insert(
                "content-type",
                HeaderValue::from_static("application/x-amz-json-1.0"),
            );
            return res;
        }
    };
    let mut res = axum::Json(body).into_response();
    res.headers_mut()
        .insert("content-type", HeaderValue::from_static(content_type));
    res
}

async fn serve(app: Router) -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}

/// A Function URL event carrying a delivery signed at `now`.
fn event(request_id: &str) -> anyhow::Result<Vec<u8>> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let file = deliveries::make(1, now);
    let d = &file.deliveries[0];
    let mut ev: serde_json::Value = serde_json::from_str(FUNCTION_URL_EVENT)?;
    let headers = &mut ev["headers"];
    headers["content-length"] = d.body.len().to_string().into();
    headers["webhook-id"] = d.webhook_id.clone().into();
    headers["webhook-timestamp"] = now.to_string().into();
    headers["webhook-signature"] = d.signature.clone().into();
    ev["requestContext"]["requestId"] = request_id.into();
    ev["requestContext"]["timeEpoch"] = (now * 1000).into();
    ev["body"] = base64::engine::general_purpose::STANDARD
        .encode(&d.body)
        .into();
    ev["isBase64Encoded"] = true.into();
    Ok(serde_json::to_vec(&ev)?)
}

fn vm_hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn stripped(path: &Path) -> Option<bool> {
    let out = std::process::Command::new("file").arg(path).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("not stripped") {
        Some(false)
    } else if text.contains("stripped") {
        Some(true)
    } else {
        None
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Runs the bootstrap `runs` times (after one warm-up), each a fresh process, and
/// measures exec → first event answered. Child output goes to `log`.
///
/// # Errors
/// A run that does not answer within 10 s, answers anything but a queued 200, or does not
/// reach the SQS stub.
pub async fn measure(bootstrap: &Path, runs: usize, log: &Path) -> anyhow::Result<ColdStart> {
    let runtime = Arc::new(RuntimeStub::default());
    let runtime_addr = serve(
        Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next_invocation))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(invocation_response),
            )
            .route(
                "/2018-06-01/runtime/invocation/{id}/error",
                post(invocation_error),
            )
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .with_state(runtime.clone()),
    )
    .await?;
    let aws_stub = Arc::new(AwsStub::default());
    let aws_addr = serve(Router::new().fallback(aws).with_state(aws_stub.clone())).await?;
    let log_file = std::fs::File::create(log)?;

    let mut timed = Vec::new();
    for n in 0..=runs {
        let request_id = format!("00000000-0000-4000-8000-{n:012}");
        let (tx, rx) = oneshot::channel();
        *runtime
            .armed
            .lock()
            .map_err(|_| anyhow::anyhow!("stub lock poisoned"))? = Some(Armed {
            request_id: request_id.clone(),
            event: event(&request_id)?,
            answered: tx,
        });
        let sends_before = aws_stub.sends.load(Ordering::SeqCst);
        let mut cmd = tokio::process::Command::new(bootstrap);
        cmd.env_clear()
            .env("AWS_LAMBDA_RUNTIME_API", runtime_addr.to_string())
            .env("AWS_LAMBDA_FUNCTION_NAME", "bench-webhook")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/bench-webhook")
            .env("AWS_LAMBDA_LOG_STREAM_NAME", format!("bench/{n}"))
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "AKIDBENCHSTUB")
            .env("AWS_SECRET_ACCESS_KEY", "bench-stub-secret-access-key")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
            .env("AWS_ENDPOINT_URL", format!("http://{aws_addr}"))
            .env(
                "EVENTS_QUEUE_URL",
                format!("http://{aws_addr}/000000000000/bench-events.fifo"),
            )
            .env("WEBHOOK_SECRET_ARN", SECRET_ARN)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file.try_clone()?)
            .kill_on_drop(true);
        let t0 = Instant::now();
        let mut child = cmd.spawn()?;
        let pid = child.id().unwrap_or(0);
        let answer = tokio::time::timeout(Duration::from_secs(10), rx).await;
        let rss = vm_hwm_kib(pid);
        let _ = child.start_kill();
        let _ = child.wait().await;
        let (t1, outcome) = answer
            .map_err(|_| anyhow::anyhow!("run {n}: no answer within 10 s (see {log:?})"))?
            .map_err(|_| anyhow::anyhow!("run {n}: runtime stub dropped the answer"))?;
        let body = outcome.map_err(|e| anyhow::anyhow!("run {n}: {e}"))?;
        let response: serde_json::Value = serde_json::from_slice(&body)?;
        let inner = response["body"].as_str().unwrap_or_default();
        anyhow::ensure!(
            response["statusCode"] == 200 && inner.contains("queued"),
            "run {n}: unexpected answer {response}"
        );
        anyhow::ensure!(
            aws_stub.sends.load(Ordering::SeqCst) == sends_before + 1,
            "run {n}: the job did not reach the SQS stub"
        );
        if n > 0 {
            timed.push(Run {
                first_answer_ms: (t1 - t0).as_secs_f64() * 1e3,
                peak_rss_kib: rss,
            });
        }
    }
    let mut ms: Vec<f64> = timed.iter().map(|r| r.first_answer_ms).collect();
    ms.sort_by(f64::total_cmp);
    Ok(ColdStart {
        bootstrap: bootstrap.to_owned(),
        binary_bytes: std::fs::metadata(bootstrap)?.len(),
        stripped: stripped(bootstrap),
        median_ms: percentile(&ms, 0.5),
        p90_ms: percentile(&ms, 0.9),
        max_peak_rss_kib: timed.iter().map(|r| r.peak_rss_kib).max().unwrap_or(0),
        runs: timed,
    })
}
