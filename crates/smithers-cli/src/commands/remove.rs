//! `rm` and `prune`: forget ended sandboxes — their rows (sandbox, review, patches, lease;
//! the run's events stay as history) and their directory under the project's
//! `.smithers/sandboxes/`. A sandbox still running or awaiting review is never removed.
//!
//! The database and the tree may be crafted: the directory removed is derived from the row's
//! ids (plain names only) under the project's own `.smithers`, each level checked to be a real
//! directory (not a link), and removed without following any link inside.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use serde_json::{json, Value};
use smithers_errors::ErrorCode;
use smithers_store::SandboxRow;

use super::context::{self, Ctx, StoreArgs};
use super::flags::parse_duration_ms;
use crate::output::{coded_error, inert, Coded};

/// Arguments of `rm`.
#[derive(Debug, Args)]
pub struct RmArgs {
    /// The sandboxes: ids, unique short ids or `<runId>:<sandboxId>`.
    #[arg(required = true)]
    pub ids: Vec<String>,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Arguments of `prune`.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Only sandboxes that ended longer ago than this (e.g. 30m, 168h).
    #[arg(long, value_name = "DURATION")]
    pub older_than: Option<String>,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// The sandbox's directory in the project, every level above it a real directory; None when
/// it is not there.
fn sandbox_dir(root: &Path, row: &SandboxRow) -> anyhow::Result<Option<PathBuf>> {
    let rel = context::sandbox_rel_dir(&row.run_id, &row.sandbox_id)?;
    let mut dir = root.to_path_buf();
    for part in rel.components() {
        dir.push(part);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(coded_error(
                    ErrorCode::InvalidInput,
                    format!(
                        "{} is not a directory (a link?): nothing removed",
                        inert(&dir.display().to_string())
                    ),
                    json!({ "path": dir }),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(dir))
}

/// Refuses a sandbox that has not ended.
fn ended(row: &SandboxRow) -> anyhow::Result<()> {
    if !row.status.is_terminal() {
        return Err(coded_error(
            ErrorCode::InvalidInput,
            format!(
                "sandbox {}:{} is {}: only ended sandboxes are removed (decide a review first: accept or reject)",
                inert(&row.run_id),
                inert(&row.sandbox_id),
                row.status.as_str()
            ),
            json!({ "runId": row.run_id, "sandboxId": row.sandbox_id, "status": row.status.as_str() }),
        ));
    }
    Ok(())
}

/// Removes one ended sandbox: its directory, then its rows.
fn remove_one(ctx: &Ctx, root: &Path, row: &SandboxRow) -> anyhow::Result<()> {
    ended(row)?;
    if let Some(dir) = sandbox_dir(root, row)? {
        // remove_dir_all follows no link below `dir` (it unlinks links themselves).
        std::fs::remove_dir_all(&dir)?;
        // The run's directory goes with its last sandbox.
        if let Some(run_dir) = dir.parent() {
            let _ = std::fs::remove_dir(run_dir);
        }
    }
    ctx.store()
        .delete_sandbox(&row.run_id, &row.sandbox_id)
        .coded()?;
    Ok(())
}

/// Runs `rm`: every id is resolved first; nothing is removed when one is unknown or live.
pub fn rm(args: &RmArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let ctx = context::open_required(&args.store, json_out)?;
    let root = args.store.root_dir()?;
    let rows = args
        .ids
        .iter()
        .map(|id| context::resolve(&ctx, id))
        .collect::<anyhow::Result<Vec<_>>>()?;
    rows.iter().try_for_each(ended)?;
    report(&ctx, &root, &rows, json_out)
}

fn report(ctx: &Ctx, root: &Path, rows: &[SandboxRow], json_out: bool) -> anyhow::Result<ExitCode> {
    let mut removed = Vec::new();
    for row in rows {
        remove_one(ctx, root, row)?;
        if !json_out {
            println!("removed {}:{}", inert(&row.run_id), inert(&row.sandbox_id));
        }
        removed.push(json!({ "runId": row.run_id, "sandboxId": row.sandbox_id }));
    }
    if json_out {
        println!("{}", json!({ "removed": removed }));
    } else if removed.is_empty() {
        eprintln!("nothing to remove");
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `prune`: removes every ended sandbox (that ended before `--older-than`, if given).
pub fn prune(args: &PruneArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let Some(ctx) = context::open_existing(&args.store, json_out)? else {
        if json_out {
            println!("{}", json!({ "removed": [] }));
        } else {
            eprintln!("nothing to remove (no database here)");
        }
        return Ok(ExitCode::SUCCESS);
    };
    let root = args.store.root_dir()?;
    let cutoff = match &args.older_than {
        None => None,
        Some(t) => {
            let ms = parse_duration_ms(t).ok_or_else(|| {
                coded_error(
                    ErrorCode::InvalidInput,
                    format!("--older-than {t:?} is not a duration (e.g. 30m, 168h)"),
                    Value::Null,
                )
            })?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            Some(now - ms as i64)
        }
    };
    let rows: Vec<SandboxRow> = context::all_sandboxes(&ctx)?
        .into_iter()
        .filter(|r| r.status.is_terminal())
        .filter(|r| match cutoff {
            None => true,
            Some(cut) => r.completed_at_ms.is_some_and(|at| at < cut),
        })
        .collect();
    report(&ctx, &root, &rows, json_out)
}
