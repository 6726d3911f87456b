//! `sandboxctl migrate`: brings a deployment's stored data up to what this version reads.
//!
//! One migration today: the sweep reads the open records through the sparse
//! `by_open` index of the DynamoDB table, which holds only record items carrying
//! `open_shard`. A record written by a version before that index has no `open_shard` until
//! its next write, so an environment untouched since the upgrade is invisible to the
//! sweep's registry read (the sweep still finds its live task through the ECS inventory,
//! but not, say, an overdue lease with no task). `migrate` puts every such open record
//! into the index (`DynamoRegistry::backfill_open_index`: one `Scan`, one conditional
//! `UpdateItem` per record); `--dry-run` counts and writes nothing. Run it once after
//! upgrading from a version without `by_open`; a second run finds nothing to do. The
//! local backend has nothing to migrate (SQLite's partial index covers every row).
//!
//! Exit 0 when nothing is left to do, 1 when a dry run found records to backfill.

use crate::backend::Ops;
use crate::report::{Verdict, write_json};
use serde_json::json;
use std::io::Write;

/// Arguments of `sandboxctl migrate`.
#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    /// Count what would be migrated; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub backend: crate::backend::BackendArgs,
}

/// Runs `migrate` on `ops`' deployment, printing the target first.
///
/// # Errors
/// A registry call failed; what was migrated before stays migrated (run it again).
pub async fn run<O: Ops>(
    ops: &O,
    args: &MigrateArgs,
    out: &mut impl Write,
) -> anyhow::Result<Verdict> {
    let m = ops.migrate(args.dry_run).await?;
    let pending = if args.dry_run { m.open } else { 0 };
    if args.backend.json {
        write_json(
            out,
            "migrate",
            ops.backend(),
            json!({
                "deployment": ops.config().deployment.as_str(),
                "store": ops.store(),
                "dry_run": args.dry_run,
                "open_index": {
                    "open_records_missing": m.open,
                    "closed_records_missing": m.closed,
                    "backfilled": m.backfilled,
                    "changed_meanwhile": m.changed,
                },
            }),
        )?;
    } else {
        writeln!(
            out,
            "backend {}, deployment {}, {}",
            ops.backend(),
            ops.config().deployment,
            ops.store()
        )?;
        writeln!(
            out,
            "open-records index: {} open record(s) outside it, {} closed (left out){}",
            m.open,
            m.closed,
            if args.dry_run {
                "; dry run: nothing written".to_owned()
            } else {
                format!(
                    "; {} backfilled, {} written meanwhile by the controller",
                    m.backfilled, m.changed
                )
            }
        )?;
    }
    Ok(if pending > 0 {
        Verdict::Problem
    } else {
        Verdict::Ok
    })
}
