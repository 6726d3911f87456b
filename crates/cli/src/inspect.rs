//! `sandboxctl status` and `sandboxctl explain`: read-only views of a local data directory
//! (the SQLite registry and executor table of `sandboxctl serve` or `demo --data-dir`).

use anyhow::Context as _;
use sandbox_controller::ports::{Clock as _, Registry as _, SystemClock};
use sandbox_core::ids::EnvironmentId;
use sandbox_local::SqliteRegistry;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `sandboxctl status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Data directory of the local stack.
    #[arg(long, default_value = ".sandbox-lifecycle")]
    data_dir: PathBuf,
}

/// Arguments of `sandboxctl explain`.
#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// Environment id or session id.
    id: String,
    /// Data directory of the local stack.
    #[arg(long, default_value = ".sandbox-lifecycle")]
    data_dir: PathBuf,
}

fn registry(data_dir: &std::path::Path) -> anyhow::Result<SqliteRegistry> {
    let db = data_dir.join("sandbox.db");
    anyhow::ensure!(db.is_file(), "no database at {}", db.display());
    SqliteRegistry::open(&db).context("opening the registry")
}

/// One line per environment record: status, generation, instance, lease, cleanup.
pub async fn status(args: StatusArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let reg = registry(&args.data_dir)?;
    let now = SystemClock.now();
    let mut records = reg.list().await?;
    records.sort_by(|a, b| a.environment_id.cmp(&b.environment_id));
    writeln!(
        out,
        "{:<28} {:<30} {:<8} {:>4} {:<34} notes",
        "environment", "session", "status", "gen", "instance"
    )?;
    for r in records {
        let mut notes = vec![];
        if let Some(l) = &r.lease {
            notes.push(format!(
                "stop due in {}s (g{})",
                l.due_at.saturating_sub(now),
                l.target.generation
            ));
        }
        if r.cleanup_required {
            notes.push("cleanup required".into());
        }
        if let Some(f) = &r.start_failure {
            notes.push(format!("{} failed start(s): {}", f.attempts, f.reason));
        }
        let instance = r
            .instance
            .as_ref()
            .map(|i| format!("{} (g{})", i.instance_id, i.generation))
            .unwrap_or_else(|| "-".into());
        writeln!(
            out,
            "{:<28} {:<30} {:<8} {:>4} {:<34} {}",
            r.environment_id.as_str(),
            r.session_id.as_str(),
            format!("{:?}", r.status).to_lowercase(),
            r.generation.0,
            instance,
            notes.join("; ")
        )?;
    }
    Ok(())
}

/// The audit trail (decisions and effects) and receipts of one environment.
pub async fn explain(args: ExplainArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let reg = registry(&args.data_dir)?;
    let env = match reg
        .find_by_session(&sandbox_core::ids::SessionId::new(args.id.as_str()))
        .await?
    {
        Some(r) => r.environment_id,
        None => EnvironmentId::new(args.id.as_str()),
    };
    let key = env.effect_key();
    let entries = reg.audit_entries(&key).await?;
    anyhow::ensure!(!entries.is_empty(), "no audit entries for {key}");
    writeln!(out, "{key}")?;
    for e in entries {
        writeln!(
            out,
            "  {} {:<22} → {:<13} {}",
            e.at,
            e.trigger["kind"].as_str().unwrap_or("?"),
            e.outcome,
            e.reason
        )?;
        for effect in &e.applied {
            writeln!(out, "      applied {effect}")?;
        }
        if let Some(err) = &e.error {
            writeln!(out, "      error   {err}")?;
        }
    }
    for r in reg.receipts(&key).await? {
        writeln!(
            out,
            "  {} receipt {}",
            r.at,
            serde_json::to_string(&r.kind)?
        )?;
    }
    Ok(())
}
