//! How `status` and `explain` show a record's reconciliation evidence: one JSON
//! shape and one text rendering, shared.

use crate::timestamps::{stamp, utc};
use sandbox_core::evidence::Evidence;
use sandbox_core::record::Record;
use serde_json::{Value, json};
use std::io::Write;

/// One evidence entry as JSON: the four layers, the trigger, when it was observed, and the
/// resolution (`null` while open).
pub fn entry_json(e: &Evidence) -> Value {
    json!({
        "trigger": e.trigger.as_str(),
        "reason": e.reason,
        "open": e.is_open(),
        "holds_compute": e.holds_files(),
        "turn": e.turn.as_ref().map(|t| json!({"id": t.id, "status": t.status, "error": t.error})),
        "tools": e.tools.iter().map(|t| json!({"id": t.id, "type": t.kind, "status": t.status})).collect::<Vec<_>>(),
        "workspace": {
            "generation": e.workspace.generation.0,
            "live_in": e.workspace.live_in.as_ref().map(|i| json!({"instance_id": i.instance_id, "generation": i.generation.0})),
            "snapshot": e.workspace.snapshot,
            "summary": e.workspace.to_string(),
        },
        "effect": e.effect.as_str(),
        "submission": e.submission.map(|s| s.as_str()),
        "observed_at": stamp(e.observed_at),
        "resolution": e.resolution.as_ref().map(|r| json!({
            "effect": r.effect.as_str(), "by": r.by, "at": stamp(r.at), "note": r.note,
        })),
    })
}

/// The record's connection state as JSON (`null` when never read).
pub fn connection_json(r: &Record) -> Value {
    r.connection.map_or(
        Value::Null,
        |c| json!({"status": c.status, "since": stamp(c.since), "read_at": stamp(c.read_at)}),
    )
}

/// The problem an open entry raises, naming the command that closes it.
pub fn problem(r: &Record) -> Option<String> {
    let open: Vec<&Evidence> = r.open_evidence().collect();
    let first = open.first()?;
    let env = &r.environment_id;
    let held = if r.holding_evidence().is_some() {
        "held for an owner (the idle stop waits)"
    } else {
        "open for an owner"
    };
    Some(format!(
        "{env}: {} reconciliation(s) {held}: {}{}; resolve with `sandboxctl resolve {env} --effect observed|compensated|not_needed|abandoned`",
        open.len(),
        first.trigger.as_str(),
        first
            .turn
            .as_ref()
            .map(|t| format!(" (turn {})", t.id))
            .unwrap_or_default()
    ))
}

/// Prints the entries, indented, one block each.
pub fn write_text(out: &mut impl Write, entries: &[Evidence]) -> std::io::Result<()> {
    for e in entries {
        let state = match &e.resolution {
            None => "OPEN".to_owned(),
            Some(r) => format!(
                "resolved {} by {} at {}",
                r.effect.as_str(),
                r.by,
                utc(r.at)
            ),
        };
        writeln!(
            out,
            "  evidence {} observed {} [{state}]{}",
            e.trigger.as_str(),
            utc(e.observed_at),
            if e.holds_files() {
                " — holds the compute"
            } else {
                ""
            }
        )?;
        if let Some(t) = &e.turn {
            writeln!(
                out,
                "    turn:      {} {:?}{}",
                t.id,
                t.status,
                t.error
                    .as_ref()
                    .map(|x| format!(", error {x}"))
                    .unwrap_or_default()
            )?;
        }
        for t in &e.tools {
            writeln!(out, "    tool:      {} {} {:?}", t.id, t.kind, t.status)?;
        }
        writeln!(out, "    workspace: {}", e.workspace)?;
        writeln!(out, "    effect:    {}", e.effect.as_str())?;
        if let Some(s) = e.submission {
            writeln!(out, "    submission: {}", s.as_str())?;
        }
        if let Some(note) = e.resolution.as_ref().and_then(|r| r.note.as_ref()) {
            writeln!(out, "    note:      {note}")?;
        }
    }
    Ok(())
}
