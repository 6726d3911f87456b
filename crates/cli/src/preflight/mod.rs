//! `sandboxctl preflight`: before provisioning, check from where executors run that they
//! can register — the checks the provider's guide asks for when registration fails
//! (shared/reference/agents-api.md; shared/reference/executor-protocol.md):
//!
//! - each host the executor must reach (default: `api.openai.com` and
//!   `codex-cloud-environments.chatgpt.com`, port 443) resolves (`resolve <host>`) and
//!   accepts TLS with the system's roots (`tls <host>`: any HTTP answer over a verified
//!   TLS connection passes; a refused connection, a handshake or certificate failure, or
//!   a timeout fails);
//! - the executor key is readable where `serve` reads it (`--executor-key-file`, else the
//!   variable `--executor-key-env`) and not empty (`executor_key`; the key is never printed);
//! - the executor program answers `--version` (`executor_version`: its first line).
//!
//! One line per check (`ok` or `FAIL`, the check, what was found), or with `--json` one
//! `sandboxctl/v1` document (`checks`, `problems`); exit 1 when any check fails, 2 on a
//! usage error. On the local backend the checks run here: the local compute runs
//! executors on this machine with this process's environment. On the AWS backend
//! ([`aws`], feature `aws`) they run in a one-off task of the executor
//! task definition (the image's `preflight` role, infra/executor/preflight.mjs), which adds
//! `task` (the task ran its checks) and `egress_ip` (the public IP the executors leave
//! from); the `--json` document then also names the task (`task`).

#[cfg(feature = "aws")]
pub(crate) mod aws;

use crate::backend::{BackendArgs, BackendKind};
use crate::report::{Verdict, write_json};
use serde_json::{Value, json};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// The hosts the executor reaches, from the provider's guide (agents-api.md: the Agents
/// API; the executor's registration host).
pub const DEFAULT_HOSTS: [&str; 2] = ["api.openai.com", "codex-cloud-environments.chatgpt.com"];

/// `sandboxctl preflight`.
#[derive(Debug, clap::Args)]
pub struct PreflightArgs {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// A host the executor must reach, `host` or `host:port` (default port 443);
    /// repeatable. Default: the two hosts of the provider's guide.
    #[arg(long = "host")]
    pub hosts: Vec<String>,
    /// A PEM file of CA certificates trusted besides the system's roots (an egress proxy
    /// that re-signs TLS).
    #[arg(long)]
    pub tls_ca_file: Option<PathBuf>,
    /// File holding the executor key (as `serve --executor-key-file`).
    #[arg(long)]
    pub executor_key_file: Option<PathBuf>,
    /// Environment variable holding the executor key (as `serve --executor-key-env`).
    #[arg(long, default_value = "CODEX_API_KEY")]
    pub executor_key_env: String,
    /// The executor program whose `--version` is checked (as `serve --executor`).
    #[arg(long, default_value = "codex")]
    pub executor: String,
    /// Each check's time limit, seconds.
    #[arg(long, default_value_t = 5)]
    pub timeout_secs: u64,
    /// AWS: how long to wait for the preflight task to stop, seconds; it is stopped
    /// (`StopTask`) when this runs out.
    #[arg(long, default_value_t = 600)]
    pub wait_secs: u64,
    /// AWS: how often the task's status is read (`DescribeTasks`), milliseconds.
    #[arg(long, default_value_t = 2000, hide = true)]
    pub poll_ms: u64,
}

/// One check's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// `resolve <host>`, `tls <host>`, `executor_key`, `executor_version`.
    pub name: String,
    /// Whether it passed.
    pub ok: bool,
    /// What was found (a failure's cause), one line, never a secret.
    pub detail: String,
}

impl Check {
    /// A check from its result: `Ok(what was found)` passes, `Err(why)` fails; the
    /// detail folded to one line.
    pub(crate) fn new(name: impl Into<String>, result: Result<String, String>) -> Self {
        let (ok, detail) = match result {
            Ok(d) => (true, d),
            Err(d) => (false, d),
        };
        Self {
            name: name.into(),
            ok,
            detail: one_line(&detail),
        }
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `host` or `host:port` → (host, port); port 443 by default.
pub(crate) fn host_port(s: &str) -> Result<(String, u16), String> {
    match s.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() => p
            .parse::<u16>()
            .map(|p| (h.to_owned(), p))
            .map_err(|_| format!("{s:?}: the port is not a number")),
        Some(_) => Err(format!("{s:?}: no host")),
        None if s.is_empty() => Err("an empty host".to_owned()),
        None => Ok((s.to_owned(), 443)),
    }
}

/// Runs every check; the results in order.
///
/// # Errors
/// A usage error: a malformed `--host`, an unreadable `--tls-ca-file`.
pub async fn checks(args: &PreflightArgs) -> anyhow::Result<Vec<Check>> {
    let limit = Duration::from_secs(args.timeout_secs.max(1));
    let hosts: Vec<String> = if args.hosts.is_empty() {
        DEFAULT_HOSTS.iter().map(|h| (*h).to_owned()).collect()
    } else {
        args.hosts.clone()
    };
    let hosts = hosts
        .iter()
        .map(|h| host_port(h))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("--host {e}"))?;
    let extra_roots = match &args.tls_ca_file {
        Some(p) => {
            let pem = std::fs::read(p)
                .map_err(|e| anyhow::anyhow!("--tls-ca-file {}: {}", p.display(), e.kind()))?;
            reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| anyhow::anyhow!("--tls-ca-file {}: {e}", p.display()))?
        }
        None => vec![],
    };
    let mut out = Vec::new();
    for (host, port) in &hosts {
        let resolved = resolve(host, *port, limit).await;
        let first = resolved.as_ref().ok().and_then(|a| a.first().copied());
        out.push(Check::new(
            format!("resolve {host}"),
            resolved.map(|a| {
                let shown: Vec<String> = a.iter().take(3).map(|x| x.ip().to_string()).collect();
                format!("{} address(es): {}", a.len(), shown.join(", "))
            }),
        ));
        let tls = match first {
            Some(addr) => tls(host, *port, addr, &extra_roots, limit).await,
            None => Err("not checked: the name did not resolve".to_owned()),
        };
        out.push(Check::new(format!("tls {host}"), tls));
    }
    out.push(Check::new("executor_key", key_readable(args)));
    out.push(Check::new(
        "executor_version",
        version(&args.executor, limit).await,
    ));
    Ok(out)
}

async fn resolve(
    host: &str,
    port: u16,
    limit: Duration,
) -> Result<Vec<std::net::SocketAddr>, String> {
    match tokio::time::timeout(limit, tokio::net::lookup_host((host, port))).await {
        Err(_) => Err(format!("no answer within {} s", limit.as_secs())),
        Ok(Err(e)) => Err(format!("does not resolve: {e}")),
        Ok(Ok(addrs)) => {
            let addrs: Vec<_> = addrs.collect();
            if addrs.is_empty() {
                Err("resolves to no address".to_owned())
            } else {
                Ok(addrs)
            }
        }
    }
}

/// A verified TLS connection to `host` at `addr`: one `GET /` (any HTTP status passes).
async fn tls(
    host: &str,
    port: u16,
    addr: std::net::SocketAddr,
    extra_roots: &[reqwest::Certificate],
    limit: Duration,
) -> Result<String, String> {
    let client = reqwest::Client::builder()
        .timeout(limit)
        .connect_timeout(limit)
        .redirect(reqwest::redirect::Policy::none())
        .tls_certs_merge(extra_roots.iter().cloned())
        .resolve(host, addr)
        .build()
        .map_err(|e| format!("TLS client: {e}"))?;
    let url = format!("https://{host}:{port}/");
    match client.get(&url).send().await {
        Ok(r) => Ok(format!(
            "TLS accepted at {addr} (HTTP {})",
            r.status().as_u16()
        )),
        Err(e) => {
            let e = e.without_url();
            let mut why = vec![e.to_string()];
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                why.push(s.to_string());
                src = s.source();
            }
            Err(format!("at {addr}: {}", why.join(": ")))
        }
    }
}

fn key_readable(args: &PreflightArgs) -> Result<String, String> {
    let (raw, from) = match &args.executor_key_file {
        Some(p) => (
            std::fs::read_to_string(p)
                .map_err(|e| format!("the file {} could not be read: {}", p.display(), e.kind()))?,
            format!("the file {}", p.display()),
        ),
        None => (
            std::env::var(&args.executor_key_env).map_err(|_| {
                format!(
                    "the variable {} is not set (or not UTF-8)",
                    args.executor_key_env
                )
            })?,
            format!("the variable {}", args.executor_key_env),
        ),
    };
    if raw.trim().is_empty() {
        return Err(format!("{from} is empty"));
    }
    Ok(format!("readable from {from}, not empty"))
}

async fn version(program: &str, limit: Duration) -> Result<String, String> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.arg("--version")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = match tokio::time::timeout(limit, cmd.output()).await {
        Err(_) => {
            return Err(format!(
                "{program} --version: no answer within {} s",
                limit.as_secs()
            ));
        }
        Ok(Err(e)) => return Err(format!("{program} could not be run: {e}")),
        Ok(Ok(o)) => o,
    };
    let first = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_owned()
    };
    if !out.status.success() {
        return Err(format!(
            "{program} --version {}: {}",
            out.status,
            first(&out.stderr)
        ));
    }
    Ok(first(&out.stdout))
}

/// Runs `preflight` on the backend `args` selects.
///
/// # Errors
/// Usage and configuration errors (exit 2); on AWS also an AWS call the wait depends on
/// (`DescribeTasks`, `StopTask`) failing; `--backend aws` in a build without the `aws`
/// feature.
pub async fn run(args: &PreflightArgs, out: &mut impl Write) -> anyhow::Result<Verdict> {
    let (backend, checks, task): (&str, Vec<Check>, Option<Option<String>>) =
        match args.backend.kind() {
            BackendKind::Local => ("local", checks(args).await?, None),
            #[cfg(feature = "aws")]
            BackendKind::Aws => {
                let outcome = aws::checks(args).await?;
                ("aws", outcome.checks, Some(outcome.task_arn))
            }
            #[cfg(not(feature = "aws"))]
            BackendKind::Aws => return Err(crate::backend::aws_backend_not_built()),
        };
    let problems: Vec<String> = checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| format!("{}: {}", c.name, c.detail))
        .collect();
    if args.backend.json {
        let list: Vec<Value> = checks
            .iter()
            .map(|c| json!({"name": c.name, "ok": c.ok, "detail": c.detail}))
            .collect();
        let mut body = json!({"checks": list, "problems": problems});
        if let Some(task) = task {
            body["task"] = json!(task);
        }
        write_json(out, "preflight", backend, body)?;
    } else {
        for c in &checks {
            writeln!(
                out,
                "{} {}: {}",
                if c.ok { "ok  " } else { "FAIL" },
                c.name,
                c.detail
            )?;
        }
    }
    Ok(Verdict::of(&problems))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_take_port_443_unless_given() {
        assert_eq!(
            host_port("api.openai.com"),
            Ok(("api.openai.com".into(), 443))
        );
        assert_eq!(host_port("127.0.0.1:8443"), Ok(("127.0.0.1".into(), 8443)));
        assert!(host_port("x:y").is_err());
        assert!(host_port(":1").is_err());
    }
}
