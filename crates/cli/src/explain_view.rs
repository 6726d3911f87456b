//! `sandboxctl explain <id>`: one environment's story — its record, every decision (audit
//! entries) and every receipt merged in time order — and, once a close ran, the terminal
//! record of the cleanup.
//!
//! The snapshot chain (`snapshot_chain`): every workspace snapshot the environment's stops
//! took (from the stop receipts), oldest first, with the generation it holds, the snapshot
//! that generation was restored from (the record's chain keeps the parent links), and
//! whether it is still kept (the record's chain) or was deleted (retention or a close).
//!
//! The id may be a session id, an environment id or a compute id (an ECS task ARN, the
//! task id at its end, or a local `pid:...` handle); it is resolved in that order, and an
//! id nothing matches is a usage error that names the kinds tried.
//!
//! The terminal record (the seed's cleanup record): the one the close stored when it ended
//! ([`sandbox_controller::terminal`]: written once, never expires with the
//! history; `"stored": true`), read back as it was written. While a close is still in
//! progress (or for a record closed before terminal records were stored) it is assembled
//! as below, `"stored": false`:
//! - `session_deleted`: the `session_deleted` receipt (`DELETE` answered, or 404);
//! - `compute_stopped`: the last `compute_stopped` receipt, written only after the provider
//!   read the compute back stopped (ECS `DescribeTasks` `lastStatus` `STOPPED`, or gone);
//! - `executor_credential`: the executor key is one restricted key shared by every
//!   executor of the deployment (`api.agents.environments.connect` only), and the Agents
//!   API has no per-environment credential to revoke, so `revoked: false`, with `why`,
//!   `location` (where the key lives: the deployment's setting, in the stored record) and
//!   `rotate` (what to do if the sandbox may have exposed it);
//! - `workspace_disposition`: what the close did with the files, from its
//!   `workspace_closed` receipt (`deleted`, or `snapshot <id>` retained until a time), else
//!   what the last stop receipt says (`snapshot <id>`, `deleted`, `none`), else `none`;
//! - `effect_reconciliation`: from the record's evidence when it holds any:
//!   `unknown` while a question is open, else the latest resolution's effect (`observed`,
//!   `compensated`, `not_needed`, `abandoned`); without evidence, `observed` when a
//!   decision recorded turn and tool evidence
//!   for an owner (`reconcile`: a mid-turn disconnect, a timed-out submission found);
//!   `unknown` when a submission's outcome stayed unknown (`uncertain` on a timed-out
//!   input) with no later `reconcile`; `not_needed` otherwise.

use crate::backend::{BackendArgs, Ops};
use crate::report::{Verdict, checked_id, write_json};
use crate::timestamps::{stamp, utc};
use sandbox_controller::ports::{AuditEntry, Compute as _, Receipt, ReceiptKind, Registry as _};
use sandbox_controller::terminal::{ExecutorCredential, TerminalRecord};
use sandbox_core::ids::{EnvironmentId, InstanceId, SessionId};
use sandbox_core::record::{Record, RecordStatus};
use sandbox_core::workspace::WorkspaceDisposition;
use serde_json::{Value, json};
use std::io::Write;

/// Arguments of `sandboxctl explain`.
#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// A session id, an environment id or a compute id (ECS task ARN or id).
    pub id: String,
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// The kinds of id `explain` tries, in order.
pub const KINDS_TRIED: [&str; 3] = [
    "session id",
    "environment id",
    "compute id (task ARN or id)",
];

/// How the id was resolved.
struct Resolved {
    kind: &'static str,
    environment: EnvironmentId,
}

async fn resolve<O: Ops>(ops: &O, id: &str) -> anyhow::Result<Option<Resolved>> {
    if let Some(r) = ops.registry().find_by_session(&SessionId::new(id)).await? {
        return Ok(Some(Resolved {
            kind: "session",
            environment: r.environment_id,
        }));
    }
    let env = EnvironmentId::new(id);
    let key = env.effect_key();
    if ops.registry().get(&key).await?.is_some() || !ops.audit_entries(&key).await?.is_empty() {
        return Ok(Some(Resolved {
            kind: "environment",
            environment: env,
        }));
    }
    // A compute: the record that names it (by ARN, or by the task id at the ARN's end),
    // else the provider's read-back of its tags.
    let records = ops.registry().list().await?;
    let names = |r: &Record| {
        r.instance.as_ref().is_some_and(|i| {
            let s = i.instance_id.as_str();
            s == id || s.rsplit('/').next() == Some(id)
        })
    };
    if let Some(r) = records.iter().find(|r| names(r)) {
        return Ok(Some(Resolved {
            kind: "compute",
            environment: r.environment_id.clone(),
        }));
    }
    // The provider may refuse an id that is no task id at all (ECS
    // `InvalidParameterException`): that only means "not a compute".
    match ops.compute().describe(&InstanceId::new(id)).await {
        Ok(Some(i)) => Ok(Some(Resolved {
            kind: "compute",
            environment: i.environment_id,
        })),
        Ok(None) => Ok(None),
        Err(e) if !e.retryable => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn receipt_json(r: &Receipt) -> Value {
    let mut v = json!({"at": stamp(r.at), "kind": "receipt"});
    if let (Some(obj), Ok(Value::Object(kind))) = (v.as_object_mut(), serde_json::to_value(&r.kind))
    {
        obj.insert("receipt".into(), Value::Object(kind));
    }
    v
}

/// Whether the applied effect `applied` (as audited) is the one that wrote a receipt of
/// `kind`.
fn wrote(applied: &Value, kind: &ReceiptKind) -> bool {
    match kind {
        ReceiptKind::SessionDeleted { session_id } => {
            applied["effect"] == "delete_session" && applied["session_id"] == session_id.as_str()
        }
        ReceiptKind::ComputeStopped { instance_id, .. } => {
            applied["effect"] == "stop_compute"
                && applied["target"]["instance_id"] == instance_id.as_str()
        }
        ReceiptKind::WorkspaceClosed { .. } => applied["effect"] == "mark_closed",
    }
}

/// The snapshot chain (module docs), oldest first.
fn snapshot_chain(record: Option<&Record>, receipts: &[Receipt]) -> Vec<Value> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let kept = record.map(|r| r.snapshots.as_slice()).unwrap_or_default();
    let mut chain: Vec<Value> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    let taken = receipts.iter().filter_map(|r| match &r.kind {
        ReceiptKind::ComputeStopped {
            generation,
            workspace: WorkspaceDisposition::Snapshot { snapshot_id },
            ..
        } => Some((r.at, *generation, snapshot_id.clone())),
        _ => None,
    });
    // Snapshots taken outside a stop (of a generation that stopped behind the
    // controller's back) are only in the record's chain.
    let recorded = kept
        .iter()
        .map(|s| (s.taken_at, s.generation.0, s.snapshot_id.clone()));
    let mut all: Vec<(u64, u64, String)> = taken.chain(recorded).collect();
    all.sort();
    for (at, generation, id) in all {
        if seen.contains(&id) {
            continue;
        }
        seen.push(id.clone());
        // A retained snapshot past its expiry is the sweeper's to delete: not kept.
        let k = kept
            .iter()
            .find(|s| s.snapshot_id == id)
            .filter(|s| s.expires_at.is_none_or(|at| at > now));
        chain.push(json!({
            "snapshot_id": id,
            "generation": generation,
            "taken_at": stamp(k.map_or(at, |s| s.taken_at)),
            "restored_from": k.and_then(|s| s.parent.clone()),
            "kept": k.is_some(),
            "expires_at": k.and_then(|s| s.expires_at).map(stamp),
        }));
    }
    chain
}

/// The workspace disposition of the terminal record (module docs).
fn workspace_disposition(receipts: &[Receipt]) -> String {
    let closed = receipts.iter().rev().find_map(|r| match &r.kind {
        ReceiptKind::WorkspaceClosed {
            workspace,
            retained_until,
            ..
        } => Some(match retained_until {
            Some(until) => format!("{workspace} (retained until {})", utc(*until)),
            None => workspace.to_string(),
        }),
        _ => None,
    });
    let stopped = || {
        receipts.iter().rev().find_map(|r| match &r.kind {
            ReceiptKind::ComputeStopped { workspace, .. } => Some(workspace.to_string()),
            _ => None,
        })
    };
    closed
        .or_else(stopped)
        .unwrap_or_else(|| WorkspaceDisposition::None.to_string())
}

fn decision_json(e: &AuditEntry) -> Value {
    json!({
        "at": stamp(e.at),
        "kind": "decision",
        "trigger": e.trigger,
        "outcome": e.outcome,
        "reason": e.reason,
        "applied": e.applied,
        "error": e.error,
        "observed": e.observed,
    })
}

/// The terminal record (module docs), or `None` before any close or deletion.
fn terminal(record: Option<&Record>, audit: &[AuditEntry], receipts: &[Receipt]) -> Option<Value> {
    let closing = record.is_some_and(|r| r.cleanup_required || r.status == RecordStatus::Closed);
    let deleted = receipts.iter().rev().find_map(|r| match &r.kind {
        ReceiptKind::SessionDeleted { session_id } => Some((r.at, session_id.clone())),
        _ => None,
    });
    if !closing && deleted.is_none() {
        return None;
    }
    let stopped = receipts.iter().rev().find_map(|r| match &r.kind {
        ReceiptKind::ComputeStopped {
            instance_id,
            generation,
            reason,
            ..
        } => Some(json!({
            "confirmed": true,
            "at": stamp(r.at),
            "instance_id": instance_id,
            "generation": generation,
            "reason": reason,
            "read_back": "stopped",
        })),
        _ => None,
    });
    // A record that never named a compute has nothing to stop.
    let nothing_to_stop = record.is_some_and(|r| r.instance.is_none() && r.generation.0 == 0);
    let stop_confirmed = stopped.is_some() || nothing_to_stop;
    let reconcile = audit.iter().rposition(|e| e.outcome == "reconcile");
    let unknown = audit.iter().rposition(|e| {
        e.outcome == "uncertain" && e.trigger.get("kind") == Some(&json!("timeout_reported"))
    });
    // The record's evidence says it best: an open question is `unknown`, the latest
    // resolution says what the owner found.
    let from_record = record.and_then(|r| {
        if r.open_evidence().next().is_some() {
            return Some("unknown");
        }
        r.evidence
            .iter()
            .rev()
            .find_map(|e| e.resolution.as_ref().map(|x| x.effect.as_str()))
    });
    let effects = match (reconcile, unknown) {
        _ if from_record.is_some() => from_record.unwrap_or_default(),
        (Some(r), Some(u)) if u > r => "unknown",
        (None, Some(_)) => "unknown",
        (Some(_), _) => "observed",
        (None, None) => "not_needed",
    };
    Some(json!({
        "closed": record.is_some_and(|r| r.status == RecordStatus::Closed && !r.cleanup_required),
        "cleanup_required": record.is_some_and(|r| r.cleanup_required),
        "session_deleted": match &deleted {
            Some((at, session)) => json!({"confirmed": true, "at": stamp(*at), "session_id": session}),
            None => json!({"confirmed": false}),
        },
        "compute_stopped": stopped.unwrap_or_else(|| json!({
            "confirmed": nothing_to_stop,
            "read_back": if nothing_to_stop { "nothing started" } else { "not confirmed" },
        })),
        "stored": false,
        "executor_revoked": false,
        "executor_credential": credential_json(&fallback_credential(stop_confirmed)),
        "workspace_disposition": workspace_disposition(receipts),
        "effect_reconciliation": effects,
    }))
}

/// Whether history before the oldest kept decision was pruned, and
/// from when it is kept: the first decision about an environment observed no record, so
/// a record whose oldest kept decision observed one (or that has no decision at all) lost
/// its earlier history to the retention. `None`: the whole history is there.
fn history_pruned(record: Option<&Record>, audit: &[AuditEntry]) -> Option<Option<u64>> {
    match audit.first() {
        None => record.map(|_| None),
        Some(first) if !first.observed["record"].is_null() => Some(Some(first.at)),
        Some(_) => None,
    }
}

/// The credential note of a terminal record not stored yet (the close goes on).
fn fallback_credential(stop_confirmed: bool) -> ExecutorCredential {
    let mut c = sandbox_controller::TerminalRecord::assemble(
        &Record::new(EnvironmentId::new("-"), SessionId::new("-")),
        &[],
        "-",
        "the deployment's executor key (CODEX_API_KEY; named in the terminal record once the close ends)",
        0,
    )
    .executor_credential;
    if !stop_confirmed {
        c.why = format!("{}; the task is not confirmed stopped yet", c.why);
    }
    c
}

fn credential_json(c: &ExecutorCredential) -> Value {
    json!({"revoked": c.revoked, "why": c.why, "location": c.location, "rotate": c.rotate})
}

/// The stored terminal record in `explain`'s shape.
fn stored_terminal_json(t: &TerminalRecord, record: Option<&Record>) -> Value {
    let deleted = match t.session_deleted.at {
        Some(at) if t.session_deleted.confirmed => {
            json!({"confirmed": true, "at": stamp(at), "session_id": t.session_id})
        }
        _ => json!({"confirmed": t.session_deleted.confirmed}),
    };
    let c = &t.compute_stopped;
    let mut stopped = json!({"confirmed": c.confirmed, "read_back": c.read_back});
    if let Some(at) = c.at {
        stopped["at"] = stamp(at);
    }
    if let Some(id) = &c.instance_id {
        stopped["instance_id"] = json!(id);
    }
    if let Some(g) = c.generation {
        stopped["generation"] = json!(g);
    }
    if let Some(r) = &c.reason {
        stopped["reason"] = json!(r);
    }
    let disposition = match t.workspace_retained_until {
        Some(until) => format!(
            "{} (retained until {})",
            t.workspace_disposition,
            utc(until)
        ),
        None => t.workspace_disposition.clone(),
    };
    json!({
        "stored": true,
        "closed": record.is_none_or(|r| r.status == RecordStatus::Closed && !r.cleanup_required),
        "cleanup_required": record.is_some_and(|r| r.cleanup_required),
        "closed_at": stamp(t.closed_at),
        "session_deleted": deleted,
        "provider_instance_id": t.provider_instance_id,
        "compute_stopped": stopped,
        "executor_revoked": t.executor_revoked,
        "executor_credential": credential_json(&t.executor_credential),
        "workspace_disposition": disposition,
        "effect_reconciliation": t.effect_reconciliation,
        "forced": t.forced,
        "forced_by": t.forced_by,
    })
}

/// Runs `explain`.
///
/// # Errors
/// A malformed or unknown id (usage: naming the kinds tried) or a failed read (access).
pub async fn run<O: Ops>(
    ops: &O,
    args: &ExplainArgs,
    out: &mut impl Write,
) -> anyhow::Result<Verdict> {
    let id = checked_id("the id", &args.id)?;
    let Some(resolved) = resolve(ops, id).await? else {
        anyhow::bail!(
            "nothing matches {id:?} in the {} backend (tried as: {})",
            ops.backend(),
            KINDS_TRIED.join(", ")
        );
    };
    let key = resolved.environment.effect_key();
    let record = ops.registry().get(&key).await?;
    let audit = ops.audit_entries(&key).await?;
    let receipts = ops.registry().receipts(&key).await?;
    // Decisions by time (the audit is oldest first); each receipt right after the decision
    // whose effect wrote it (its `at` is the decision's start, the receipt's is later),
    // else by its own time.
    let mut keyed: Vec<((u64, usize, u8), u64, Value)> = audit
        .iter()
        .enumerate()
        .map(|(n, e)| ((e.at, n, 0), e.at, decision_json(e)))
        .collect();
    for r in &receipts {
        let anchor = audit
            .iter()
            .enumerate()
            .rev()
            .find(|(_, e)| e.at <= r.at && e.applied.iter().any(|a| wrote(a, &r.kind)));
        let key = anchor.map_or((r.at, usize::MAX, 1), |(n, e)| (e.at, n, 1));
        keyed.push((key, r.at, receipt_json(r)));
    }
    keyed.sort_by_key(|(key, _, _)| *key);
    let timeline: Vec<(u64, u8, Value)> = keyed.into_iter().map(|(_, at, v)| (at, 0, v)).collect();
    let terminal = match ops.registry().terminal(&key).await? {
        Some(t) => Some(stored_terminal_json(&t, record.as_ref())),
        None => terminal(record.as_ref(), &audit, &receipts),
    };
    let chain = snapshot_chain(record.as_ref(), &receipts);
    let pruned = history_pruned(record.as_ref(), &audit);
    let mut problems = vec![];
    if record.as_ref().is_some_and(|r| r.cleanup_required) {
        problems.push("cleanup required: the close is not finished".to_owned());
    }
    if let Some(last) = audit.last()
        && ["divergent", "reconcile"].contains(&last.outcome.as_str())
    {
        problems.push(format!("last decision {}: {}", last.outcome, last.reason));
    }
    if let Some(p) = record.as_ref().and_then(crate::evidence_view::problem) {
        problems.push(p);
    }
    if args.backend.json {
        write_json(
            out,
            "explain",
            ops.backend(),
            json!({
                "query": id,
                "resolved_as": resolved.kind,
                "environment_id": resolved.environment,
                "effect_key": key,
                "record": record,
                "timeline": timeline.iter().map(|(_, _, v)| v.clone()).collect::<Vec<_>>(),
                "snapshot_chain": chain,
                "terminal": terminal,
                "reconciliation": record.as_ref().map_or_else(Vec::new, |r| r.evidence.iter().map(crate::evidence_view::entry_json).collect()),
                "connection": record.as_ref().map_or(Value::Null, crate::evidence_view::connection_json),
                "history": {
                    "pruned": pruned.is_some(),
                    "kept_from": crate::timestamps::stamp_opt(pruned.flatten()),
                },
                "problems": problems,
            }),
        )?;
        return Ok(Verdict::of(&problems));
    }
    writeln!(out, "{key} (found as a {} id)", resolved.kind)?;
    match &record {
        Some(r) => writeln!(
            out,
            "  record: session {}, {:?}, generation {}, instance {}, cleanup_required {}",
            r.session_id,
            r.status,
            r.generation.0,
            r.instance.as_ref().map_or_else(
                || "-".to_owned(),
                |i| format!("{} (g{})", i.instance_id, i.generation.0)
            ),
            r.cleanup_required
        )?,
        None => writeln!(out, "  record: none")?,
    }
    if let Some(r) = &record {
        if let Some(c) = r.connection {
            writeln!(out, "  connection: {:?} since {}", c.status, utc(c.since))?;
        }
        if let (Some(started), Some(connected)) = (r.instance_recorded_at, r.instance_connected_at)
        {
            writeln!(
                out,
                "  executor first seen connected: {} ({} s after the start)",
                utc(connected),
                connected.saturating_sub(started)
            )?;
        }
        if let Some(f) = &r.start_failure {
            writeln!(
                out,
                "  start failure: {} in a row ({}), last at {}: {}",
                f.attempts,
                f.kind.as_str(),
                utc(f.last_failed_at),
                f.reason
            )?;
        }
        if let Some(id) = &r.last_reconciled_event_id {
            writeln!(out, "  last reconciled event: {id}")?;
        }
        crate::evidence_view::write_text(out, &r.evidence)?;
    }
    match pruned {
        Some(Some(from)) => writeln!(
            out,
            "  history: decisions before {} were pruned (audit entries and receipts expire after the history retention, HISTORY_RETENTION_DAYS / --history-retention-days)",
            utc(from)
        )?,
        Some(None) => writeln!(
            out,
            "  history: every decision was pruned (audit entries and receipts expire after the history retention, HISTORY_RETENTION_DAYS / --history-retention-days)"
        )?,
        None => {}
    }
    if !chain.is_empty() {
        writeln!(out, "  workspace snapshots (oldest first):")?;
        for s in &chain {
            let state = match (s["kept"].as_bool(), s["expires_at"]["utc"].as_str()) {
                (Some(true), Some(until)) => format!("kept until {until}"),
                (Some(true), None) => "kept".to_owned(),
                _ => "deleted".to_owned(),
            };
            writeln!(
                out,
                "    g{} {}{} — {state}",
                s["generation"],
                s["snapshot_id"].as_str().unwrap_or(""),
                s["restored_from"]
                    .as_str()
                    .map_or_else(String::new, |p| format!(" (restored from {p})")),
            )?;
        }
    }
    for (at, _, v) in &timeline {
        if v["kind"] == "decision" {
            writeln!(
                out,
                "  {} {:<22} → {:<13} {}",
                utc(*at),
                v["trigger"]["kind"].as_str().unwrap_or("?"),
                v["outcome"].as_str().unwrap_or("?"),
                v["reason"].as_str().unwrap_or("")
            )?;
            for effect in v["applied"].as_array().into_iter().flatten() {
                writeln!(out, "      applied {effect}")?;
            }
            if let Some(err) = v["error"].as_str() {
                writeln!(out, "      error   {err}")?;
            }
        } else {
            writeln!(out, "  {} receipt {}", utc(*at), v["receipt"])?;
        }
    }
    if let Some(t) = &terminal {
        writeln!(out, "  terminal record:")?;
        let deleted = &t["session_deleted"];
        writeln!(
            out,
            "    session deleted:       {}",
            if deleted["confirmed"] == true {
                format!(
                    "yes, receipt at {}",
                    deleted["at"]["utc"].as_str().unwrap_or("")
                )
            } else {
                "not confirmed".into()
            }
        )?;
        let stopped = &t["compute_stopped"];
        writeln!(
            out,
            "    compute stopped:       {}",
            match stopped["at"]["utc"].as_str() {
                Some(at) => format!(
                    "yes, {} read back stopped, receipt at {at}",
                    stopped["instance_id"].as_str().unwrap_or("")
                ),
                None => stopped["read_back"].as_str().unwrap_or("").to_owned(),
            }
        )?;
        let c = &t["executor_credential"];
        writeln!(
            out,
            "    executor credential:   not revoked: {}",
            c["why"].as_str().unwrap_or("")
        )?;
        writeln!(out, "      where: {}", c["location"].as_str().unwrap_or(""))?;
        writeln!(out, "      rotate: {}", c["rotate"].as_str().unwrap_or(""))?;
        if t["forced"] == true {
            writeln!(
                out,
                "    forced:                yes, by {} (open evidence abandoned)",
                t["forced_by"].as_str().unwrap_or("?")
            )?;
        }
        if t["stored"] == false {
            writeln!(
                out,
                "    (assembled: the close has not stored its record yet)"
            )?;
        }
        writeln!(
            out,
            "    workspace disposition: {}",
            t["workspace_disposition"].as_str().unwrap_or("")
        )?;
        writeln!(
            out,
            "    effect reconciliation: {}",
            t["effect_reconciliation"].as_str().unwrap_or("")
        )?;
    }
    for p in &problems {
        writeln!(out, "problem: {p}")?;
    }
    Ok(Verdict::of(&problems))
}
