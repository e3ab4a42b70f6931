//! `review`, `accept`, `reject`: the durable review of a sandbox's patches.
//!
//! `review` renders the change like `git diff --stat` + `git diff` (smithers-patch's review
//! renderer, coloured only on a terminal), made inert: names quoted as git quotes them,
//! control characters and escape sequences shown escaped (also in a pipe: the exact bytes are
//! the bundle's patches, and `--json`'s `diff`), with warning lines naming the files that hold
//! them and the files the host runs by itself (hooks, editor tasks, CI, `.envrc`; `findings`
//! under `--json`); `accept` applies it through the orchestrator
//! (atomic and conflict-checked: on a conflict nothing is applied and every conflicting file
//! is named); `reject` records the decision with a reason.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Args;
use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode};
use smithers_store::{ReviewRow, ReviewState, SandboxRow};

use super::changes;
use super::context::{self, Ctx, StoreArgs};
use crate::output::{coded_error, color_allowed, inert, name, render_text, Coded, EXIT_REJECTED};

/// Arguments of `review`.
#[derive(Debug, Args)]
pub struct ReviewArgs {
    /// `<sandboxId>` (unique in the database) or `<runId>:<sandboxId>`.
    pub id: String,
    /// Never colour the diff (colour is used only when stdout is a terminal and NO_COLOR is
    /// unset).
    #[arg(long)]
    pub no_color: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Arguments of `accept`.
#[derive(Debug, Args)]
pub struct AcceptArgs {
    /// `<sandboxId>` or `<runId>:<sandboxId>`.
    pub id: String,
    /// Resolve text conflicts by writing conflict markers (`<<<<<<< host` / `=======` /
    /// `>>>>>>> sandbox`) into the files instead of refusing the accept; the files so written
    /// are listed, to be resolved by hand. Binary, symlink and file/directory conflicts still
    /// refuse the whole accept.
    #[arg(long)]
    pub conflict_markers: bool,
    /// Put the step's commits on this new branch instead of the current one, and apply
    /// nothing else (your HEAD, index and working tree stay as they are). Refused when the
    /// step made no commits, left changes it did not commit, or the branch exists.
    #[arg(long, value_name = "NAME", conflicts_with = "conflict_markers")]
    pub branch: Option<String>,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Arguments of `reject`.
#[derive(Debug, Args)]
pub struct RejectArgs {
    /// `<sandboxId>` or `<runId>:<sandboxId>`.
    pub id: String,
    /// Why (recorded in the review and in SandboxDiffRejected).
    #[arg(
        long,
        value_name = "TEXT",
        default_value = "rejected from the command line"
    )]
    pub reason: String,
    #[command(flatten)]
    pub store: StoreArgs,
}

fn review_of(ctx: &Ctx, row: &SandboxRow) -> anyhow::Result<ReviewRow> {
    ctx.store()
        .get_review(&row.run_id, &row.sandbox_id)
        .coded()?
        .ok_or_else(|| {
            coded_error(
                ErrorCode::InvalidInput,
                format!(
                    "sandbox {}:{} has no review (status {}: it produced no patches needing one)",
                    row.run_id,
                    row.sandbox_id,
                    row.status.as_str()
                ),
                json!({ "runId": row.run_id, "sandboxId": row.sandbox_id, "status": row.status.as_str() }),
            )
        })
}

/// The printed commands to decide a pending review (the id shell-quoted: it may come from a
/// database and must paste as one word).
pub fn decision_hints(id: &str, flags: &str) -> Vec<String> {
    let id = context::shell_quote(id);
    vec![
        format!("smithers-sandbox review {id}{flags}"),
        format!("smithers-sandbox accept {id}{flags}"),
        format!("smithers-sandbox reject {id}{flags} --reason '...'"),
    ]
}

/// Runs `review`.
pub fn review(args: &ReviewArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let ctx = context::open_required(&args.store, json_out)?;
    let row = context::resolve(&ctx, &args.id)?;
    let review = review_of(&ctx, &row)?;
    let (patches, notes) = changes::bundle_contents(std::path::Path::new(&review.bundle_path))?;
    let root = std::path::Path::new(&review.root_dir);
    // Read once against the host tree, for the counts, the warnings and the diff alike: a
    // file carried as a git binary patch only for not being UTF-8 is the text git sees.
    let shown = smithers_patch::PatchReview::new(&patches, Some(root));
    let changes = changes::changes_from(&patches, shown.stats());
    let mut findings = shown.findings(&smithers_patch::host_hooks_dirs(root));
    changes::add_change_notes(&mut findings, &notes);
    if json_out {
        let diff = smithers_patch::render_patches(&patches);
        println!(
            "{}",
            json!({
                "runId": row.run_id,
                "sandboxId": row.sandbox_id,
                "status": row.status.as_str(),
                "review": review_json(&review),
                "bundlePath": review.bundle_path,
                "rootDir": review.root_dir,
                "patches": changes.iter().map(changes::FileChange::to_json).collect::<Vec<_>>(),
                "diff": diff,
                "findings": findings,
                "commits": notes.commits,
                // What HEAD and the index get of the files the commits leave otherwise than
                // the patches (`commits.tipDiffers`): shown here as in the text review.
                "seriesDiff": changes::series_patch_json(
                    std::path::Path::new(&review.bundle_path),
                    &smithers_patch::host_hooks_dirs(root),
                ),
                "staged": notes.staged,
            })
        );
        return Ok(ExitCode::SUCCESS);
    }
    let color = !args.no_color && color_allowed() && std::io::stdout().is_terminal();
    let (bold, reset) = if color {
        ("\x1b[1m", "\x1b[m")
    } else {
        ("", "")
    };
    println!(
        "{bold}review of {}:{}{reset} — {}, {} patch file(s), {} changed line(s)",
        inert(&row.run_id),
        inert(&row.sandbox_id),
        inert(&state_text(&review)),
        review.patch_count,
        changes.iter().map(|c| c.added + c.removed).sum::<usize>()
    );
    println!("root:   {}", inert(&review.root_dir));
    println!("bundle: {}", inert(&review.bundle_path));
    println!();
    if let Some(series) = &notes.commits {
        let hooks = smithers_patch::host_hooks_dirs(std::path::Path::new(&review.root_dir));
        print!("{}", changes::render_commits(series, &hooks, bold, reset));
        println!();
        if !series.tip_differs.is_empty() {
            println!(
                "{bold}the commits leave {} file(s) otherwise than the working tree{reset} (committed, then changed again): HEAD and the index get this, the working tree the patches below",
                series.tip_differs.len()
            );
            let color = !args.no_color && color_allowed() && std::io::stdout().is_terminal();
            match changes::render_series_patch(
                std::path::Path::new(&review.bundle_path),
                &hooks,
                color,
            ) {
                Some(text) => print!("{text}"),
                None => println!("  (the bundle has no git/series.patch: accept will refuse it)"),
            }
            println!();
        }
    }
    if !notes.staged.is_empty() {
        // The index is written too: said before the diff, as the commits are.
        println!(
            "{bold}staged{reset} (the step ran git add/rm without committing; accept stages them too):"
        );
        for p in &notes.staged {
            println!("  {}", name(p));
        }
        println!();
    }
    print!(
        "{}",
        shown.render(&smithers_patch::ReviewOptions { color }, &findings)
    );
    if review.state == ReviewState::Pending {
        let root = std::path::PathBuf::from(&review.root_dir);
        println!();
        println!("decide with:");
        for h in decision_hints(&row.sandbox_id, &args.store.hint_flags(&root))
            .into_iter()
            .skip(1)
        {
            println!("  {}", inert(&h));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn state_text(review: &ReviewRow) -> String {
    match review.state {
        ReviewState::Pending => match &review.apply_error {
            Some(e) => format!("pending: the last accept applied nothing: {e}"),
            None => "pending (nothing applied yet)".into(),
        },
        ReviewState::Accepted if review.applied_by_caller() => {
            "accepted (the caller that held it for review applies it)".into()
        }
        ReviewState::Accepted => match &review.apply_error {
            Some(e) => format!("accepted, but applying failed: {e}"),
            None => "accepted (applying)".into(),
        },
        ReviewState::Applied => "accepted and applied".into(),
        ReviewState::Rejected => format!(
            "rejected{}",
            review
                .reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ),
    }
}

/// A review as JSON.
pub fn review_json(review: &ReviewRow) -> Value {
    json!({
        "state": review.state.as_str(),
        "reason": review.reason,
        "patchCount": review.patch_count,
        "totalDiffLines": review.total_diff_lines,
        "requestedAtMs": review.requested_at_ms,
        "decidedAtMs": review.decided_at_ms,
        "appliedAtMs": review.applied_at_ms,
        "applyError": review.apply_error,
        "appliedBy": review.applied_by,
    })
}

/// The conflicts named by an apply error (`details.cause.details.conflicts`).
fn conflicts_of(report: &smithers_errors::ErrorReport) -> Vec<(String, String)> {
    let cause = &report.details["cause"]["details"]["conflicts"];
    cause
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    (
                        c["path"].as_str().unwrap_or("?").to_string(),
                        c["reason"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `accept`.
pub fn accept(args: &AcceptArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let ctx = context::open_required(&args.store, json_out)?;
    let row = context::resolve(&ctx, &args.id)?;
    let review = review_of(&ctx, &row)?;
    let changes = changes::changes_of(
        Some(&review.bundle_path),
        &ctx.store().patches(&row.run_id, &row.sandbox_id).coded()?,
    );
    let result = ctx.rt().block_on(ctx.orchestrator.accept_onto(
        &row.run_id,
        &row.sandbox_id,
        args.conflict_markers,
        args.branch.as_deref(),
    ));
    let patches_json: Vec<Value> = changes.iter().map(changes::FileChange::to_json).collect();
    match result {
        Ok(done) => {
            if json_out {
                println!(
                    "{}",
                    json!({
                        "runId": row.run_id,
                        "sandboxId": row.sandbox_id,
                        "status": done.status,
                        "review": if review.applied_by_caller() { "accepted" } else { "applied" },
                        "appliedPatches": done.applied_patches,
                        "rootDir": review.root_dir,
                        "bundlePath": done.bundle_path,
                        "outputs": done.outputs,
                        "patches": patches_json,
                        "conflictMarkers": done.conflict_markers,
                        "branch": args.branch,
                    })
                );
            } else if review.applied_by_caller() {
                println!(
                    "accepted {}:{}: {} patch file(s); the caller that held it for review (the Smithers provider) applies them to {}",
                    inert(&row.run_id),
                    inert(&row.sandbox_id),
                    review.patch_count,
                    inert(&review.root_dir)
                );
                for line in changes::stat_lines(&changes) {
                    println!("  {line}");
                }
            } else if let Some(branch) = &args.branch {
                println!(
                    "accepted {}:{}: its commits are on the new branch {} of {} (the working tree was not touched)",
                    inert(&row.run_id),
                    inert(&row.sandbox_id),
                    inert(branch),
                    inert(&review.root_dir)
                );
                println!("status: {}", inert(&done.status));
            } else {
                println!(
                    "accepted {}:{}: {} patch file(s) applied to {}",
                    inert(&row.run_id),
                    inert(&row.sandbox_id),
                    done.applied_patches,
                    inert(&review.root_dir)
                );
                for line in changes::stat_lines(&changes) {
                    println!("  {line}");
                }
                if !done.conflict_markers.is_empty() {
                    println!(
                        "written with conflict markers (resolve the <<<<<<< host / ======= / >>>>>>> sandbox blocks):"
                    );
                    for p in &done.conflict_markers {
                        println!("  {}", name(p));
                    }
                }
                println!("status: {}", inert(&done.status));
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            let report = err.report();
            let conflicts = conflicts_of(&report);
            // What the rows say now, not what a failed accept usually leaves: an accept of a
            // review already accepted or rejected changed nothing, and says so.
            let (status, review_state) = stored_state(&ctx, &row.run_id, &row.sandbox_id);
            if json_out {
                println!(
                    "{}",
                    json!({
                        "runId": row.run_id,
                        "sandboxId": row.sandbox_id,
                        "status": status,
                        "review": review_state,
                        "applied": false,
                        "conflicts": conflicts.iter().map(|(p, r)| json!({"path": p, "reason": r})).collect::<Vec<_>>(),
                        "patches": patches_json,
                        "error": report.to_json(),
                    })
                );
            } else {
                if conflicts.is_empty() {
                    eprintln!("{}", render_text(&report));
                    if review_state != "pending" && review_state != "none" {
                        eprintln!(
                            "its review was {review_state} already (status {}); nothing was applied now",
                            inert(&status)
                        );
                    }
                } else {
                    eprintln!("error [{}]: {}", report.code, inert(&report.message));
                    eprintln!(
                        "nothing was applied; {} file(s) changed on the host since the sandbox started:",
                        conflicts.len()
                    );
                    for (path, reason) in &conflicts {
                        eprintln!("  conflict: {}: {}", name(path), inert(reason));
                    }
                    eprintln!(
                        "the review is still pending: fix the files and accept again, accept with --conflict-markers to resolve them by hand, or reject"
                    );
                }
            }
            Ok(ExitCode::from(EXIT_REJECTED))
        }
    }
}

/// The sandbox row's status and its review's state, as the store has them now.
fn stored_state(ctx: &context::Ctx, run_id: &str, sandbox_id: &str) -> (String, String) {
    let status = ctx
        .store()
        .get_sandbox(run_id, sandbox_id)
        .ok()
        .flatten()
        .map_or("unknown".to_string(), |r| r.status.as_str().to_string());
    let review = ctx
        .store()
        .get_review(run_id, sandbox_id)
        .ok()
        .flatten()
        .map_or("none".to_string(), |r| r.state.as_str().to_string());
    (status, review)
}

/// Runs `reject`.
pub fn reject(args: &RejectArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let ctx = context::open_required(&args.store, json_out)?;
    let row = context::resolve(&ctx, &args.id)?;
    let review = review_of(&ctx, &row)?;
    ctx.rt()
        .block_on(
            ctx.orchestrator
                .reject(&row.run_id, &row.sandbox_id, &args.reason),
        )
        .coded()?;
    let changes = changes::changes_of(
        Some(&review.bundle_path),
        &ctx.store().patches(&row.run_id, &row.sandbox_id).coded()?,
    );
    let status = ctx
        .store()
        .get_sandbox(&row.run_id, &row.sandbox_id)
        .coded()?
        .map(|r| r.status.as_str().to_string())
        .unwrap_or_else(|| "failed".into());
    if json_out {
        println!(
            "{}",
            json!({
                "runId": row.run_id,
                "sandboxId": row.sandbox_id,
                "status": status,
                "review": "rejected",
                "reason": args.reason,
                "bundlePath": review.bundle_path,
                "patches": changes.iter().map(changes::FileChange::to_json).collect::<Vec<_>>(),
            })
        );
    } else {
        println!(
            "rejected {}:{} ({}); nothing was applied to {}. The bundle stays at {}",
            inert(&row.run_id),
            inert(&row.sandbox_id),
            inert(&args.reason),
            inert(&review.root_dir),
            inert(&review.bundle_path)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `hold`.
#[derive(Debug, Args)]
pub struct HoldArgs {
    /// The result bundle: a directory under the project's
    /// `.smithers/sandboxes/<runId>/<sandboxId>/`.
    pub bundle: std::path::PathBuf,
    /// The run the bundle is of.
    #[arg(long, value_name = "ID")]
    pub run_id: String,
    /// The sandbox the bundle is of.
    #[arg(long, value_name = "ID")]
    pub sandbox_id: String,
    /// The runtime name the sandbox's row records.
    #[arg(long, value_name = "NAME", default_value = "smithers-sandbox")]
    pub runtime: String,
    /// The id of the sandbox on the host that ran it.
    #[arg(long, value_name = "ID")]
    pub remote_id: Option<String>,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// `hold`: a bundle a caller collected (the Smithers provider, from a `serve` host) waits in
/// this project's durable review; `review`, `accept` and `reject` decide it, and the caller,
/// which polls the review, applies an accepted bundle itself (accept applies nothing).
pub fn hold(args: &HoldArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let ctx = context::open(&args.store, json_out)?;
    let root = args.store.root_dir()?;
    // The bundle came from another host: it must be one of this project's sandbox
    // directories, reached through no link, so a review never names a file elsewhere.
    let dir = root.join(context::sandbox_rel_dir(&args.run_id, &args.sandbox_id)?);
    let refuse = |why: String| {
        coded_error(
            ErrorCode::InvalidInput,
            format!("hold {}: {why}", args.bundle.display()),
            json!({ "bundle": args.bundle, "expectedUnder": dir }),
        )
    };
    let meta = std::fs::symlink_metadata(&args.bundle).map_err(|e| refuse(e.to_string()))?;
    if !meta.is_dir() {
        return Err(refuse("not a directory (a link is never followed)".into()));
    }
    let bundle = std::fs::canonicalize(&args.bundle).map_err(|e| refuse(e.to_string()))?;
    let under =
        std::fs::canonicalize(&dir).map_err(|e| refuse(format!("{}: {e}", dir.display())))?;
    if bundle.parent() != Some(under.as_path()) || under != dir {
        return Err(refuse(format!(
            "a held bundle must be a directory directly under {}",
            dir.display()
        )));
    }
    let held = smithers_orchestrator::HeldBundle {
        run_id: args.run_id.clone(),
        sandbox_id: args.sandbox_id.clone(),
        root_dir: root.clone(),
        bundle_path: bundle,
        runtime: args.runtime.clone(),
        remote_run_id: args.remote_id.clone(),
    };
    let pending = ctx
        .rt()
        .block_on(ctx.orchestrator.hold_for_review(&held))
        .coded()?;
    let hints = decision_hints(&args.sandbox_id, &args.store.hint_flags(&root));
    if json_out {
        println!(
            "{}",
            json!({
                "runId": args.run_id,
                "sandboxId": args.sandbox_id,
                "bundlePath": pending.bundle_path,
                "review": {
                    "state": "pending",
                    "patchCount": pending.patch_count,
                    "totalDiffLines": pending.total_diff_lines,
                    "appliedBy": smithers_store::APPLIED_BY_CALLER,
                },
            })
        );
    } else {
        println!(
            "held {}:{} for review: {} patch file(s), {} changed line(s)",
            inert(&args.run_id),
            inert(&args.sandbox_id),
            pending.patch_count,
            pending.total_diff_lines
        );
        for hint in hints {
            println!("  {hint}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
