//! `smithers-sandbox run`: one step through the orchestrator's lifecycle (concurrency gate,
//! rows and events in the SQLite store, create → ship → execute → collect → validate →
//! review → cleanup), on the native runtime (`bubblewrap`) or docker.
//!
//! While it runs: a progress display on a terminal (stage, elapsed time, the latest output
//! line, with the output scrolling above), plain lines otherwise, nothing but the final
//! document under `--json`. The step's output is relayed as [`OUTPUT_HELP`] says: inert on a
//! terminal, as is to a pipe or file. Ctrl-C cancels the step (its whole process tree is killed; the
//! sandbox ends `cancelled` with its bundle kept); a second Ctrl-C exits at once.

use crate::output::{say, say_raw};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode};
use smithers_orchestrator::{
    Heartbeat, OrchestratorError, SandboxOutcome, SandboxRequest, StepContext,
};
use smithers_runtime::{CancellationToken, Controls, StepCommand};

use super::backend::{self, RuntimeChoice};
use super::changes;
use super::context;
use super::progress::{note_stdout_gone, to_stdout, Display, Mode, Relay, Sink, STDOUT_GONE};
use super::review::decision_hints;
use super::run_args::controls;
pub use super::run_args::{RunArgs, OUTPUT_HELP};
use super::run_row;
use super::run_summary::{print_summary, StepNotes};
use crate::output::{coded_error, inert, render_text, Coded, EXIT_REJECTED};

fn invalid(message: String) -> anyhow::Error {
    coded_error(ErrorCode::InvalidInput, message, Value::Null)
}

/// Ids are never reused: a sandbox of that run and id in the database, or its directory in
/// the project (a bundle and review a new run would overwrite), is refused, naming both.
pub(crate) fn refuse_reused_ids(
    ctx: &context::Ctx,
    root: &std::path::Path,
    run_id: &str,
    sandbox_id: &str,
    replace: bool,
) -> anyhow::Result<()> {
    // Checked before they become a path (the request checks them again).
    let dir = root.join(context::sandbox_rel_dir(run_id, sandbox_id)?);
    let row = ctx.store().get_sandbox(run_id, sandbox_id).coded()?;
    let on_disk = std::fs::symlink_metadata(&dir).is_ok();
    if row.is_none() && !on_disk {
        return Ok(());
    }
    // `--replace`: asked for, so not silent; only over a sandbox that has ended (one in
    // review is decided first: accept or reject).
    let settled = row.as_ref().is_none_or(|r| r.status.is_terminal());
    if replace && settled {
        return Ok(());
    }
    let what = match &row {
        Some(r) => format!(
            "exists in {} (status {})",
            ctx.db_path.display(),
            r.status.as_str()
        ),
        None => format!("has a directory at {}", dir.display()),
    };
    Err(coded_error(
        ErrorCode::InvalidInput,
        inert(&format!(
            "sandbox {sandbox_id} of run {run_id} {what}: ids are never reused (its bundle and review would be overwritten); choose other ids, leave --run-id/--sandbox-id out, or, once it has ended (a review decided), pass --replace to discard it"
        )),
        json!({ "runId": run_id, "sandboxId": sandbox_id }),
    ))
}

/// A new id: a prefix, the time in ms (sortable), then bits of the sub-millisecond clock mixed
/// with the pid (so a run id and a sandbox id made together differ, and two processes starting
/// in the same millisecond do too).
pub fn new_id(prefix: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mix = (u64::from(now.subsec_nanos())
        ^ u64::from(std::process::id()).wrapping_mul(0x9e37_79b9))
    .wrapping_mul(0x2545_f491_4f6c_dd1d)
        >> 44;
    format!("{prefix}-{:x}-{mix:05x}", now.as_millis() as u64)
}

/// Our stdin for the step when it is a pipe or a file (`echo x | run -- wc`, `run -- sh <
/// script`): streamed into the command's stdin by the native runtime as it reads. A terminal
/// or `/dev/null` is not passed (the step reads EOF): a step has no terminal, and reading the
/// user's keystrokes into it unasked would surprise. Docker and codeplane carry no stream, so
/// there a piped stdin is left out and said so.
/// With `-i`, a terminal is passed too (as a stream; with `-t` the keys go to the step's
/// terminal instead, see `run_terminal`).
fn step_stdin(args: &RunArgs, json_out: bool) -> smithers_runtime::StepStdin {
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileTypeExt;
    let runtime = args.runtime;
    let piped = std::fs::metadata("/proc/self/fd/0").is_ok_and(|m| {
        let t = m.file_type();
        t.is_fifo() || t.is_file() || t.is_socket() || (args.interactive && t.is_char_device())
    });
    if !piped || args.tty {
        return smithers_runtime::StepStdin::default();
    }
    if runtime != RuntimeChoice::Bubblewrap {
        if !json_out {
            say!(
                "note: stdin is not passed to the step: the {} runtime carries no stdin stream (the step reads EOF)",
                runtime.kind()
            );
        }
        return smithers_runtime::StepStdin::default();
    }
    // Read through a descriptor of its own, not std's buffered stdin: what the step leaves
    // unread must not stay in a buffer of this process (the resident service serves the next
    // client from it).
    match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => smithers_runtime::StepStdin::from_reader(std::fs::File::from(fd)),
        Err(_) => smithers_runtime::StepStdin::from_reader(std::io::stdin()),
    }
}

/// How `run` learns of the user's Ctrl-C.
pub enum Interrupts {
    /// Its own SIGINT: the first cancels the step, the second exits at once.
    Signals,
    /// The resident service's client: it relays the first, and exits at the second itself
    /// (the service goes on with the cleanup).
    Client(smithers_resident::server::Interrupts),
}

/// Runs `run` in this process.
pub fn run(args: &RunArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    run_with(args, json_out, Interrupts::Signals, None).map(ExitCode::from)
}

/// Runs `run` for a client of the resident service (whose stdio and working directory are
/// this process's for the time), in a project the service keeps open.
pub fn run_served(
    args: &RunArgs,
    json_out: bool,
    interrupts: smithers_resident::server::Interrupts,
    cache: &mut context::ContextCache,
) -> anyhow::Result<u8> {
    run_with(args, json_out, Interrupts::Client(interrupts), Some(cache))
}

/// What `run` checked before anything is created.
pub(crate) struct Checked {
    pub(crate) controls: Controls,
    pub(crate) root: std::path::PathBuf,
    pub(crate) input: Value,
}

fn run_with(
    args: &RunArgs,
    json_out: bool,
    interrupts: Interrupts,
    cache: Option<&mut context::ContextCache>,
) -> anyhow::Result<u8> {
    let Checked {
        controls,
        root,
        input,
    } = check_before_creating(args)?;
    // A native step's sandbox is made on the other core while the store opens and the
    // step is recorded (a step a warm sandbox cannot serve starts cold at create, as before).
    // (The resident service's projects have a warm pool instead.)
    let prestart = (args.runtime == RuntimeChoice::Bubblewrap).then_some(&controls);
    // A process may run more than one `run` (the resident service): a reader that went
    // away was the last client's.
    STDOUT_GONE.store(false, std::sync::atomic::Ordering::SeqCst);
    let served = cache.is_some();
    let ctx = match cache {
        None if args.tty => context::CtxHandle::Own(terminal_context(args, json_out)?),
        None => context::CtxHandle::Own(context::open_with(
            &args.store,
            json_out,
            args.workspace.mode(),
            prestart,
        )?),
        Some(cache) => cache.get(&args.store, json_out, args.workspace.mode())?,
    };
    let run_id = args.run_id.clone().unwrap_or_else(|| new_id("run"));
    let sandbox_id = args.sandbox_id.clone().unwrap_or_else(|| new_id("sbx"));
    refuse_reused_ids(&ctx, &root, &run_id, &sandbox_id, args.replace)?;
    let req = step_request(args, json_out, &root, &run_id, &sandbox_id, controls, input);
    let (result, display) = execute_step(args, json_out, interrupts, &ctx, served, &req);
    report_outcome(args, json_out, &ctx, &req, &display, result)
}

/// `run -t`'s store and orchestrator: the native backend's step, on a terminal
/// ([`super::run_terminal::TerminalRuntime`]).
fn terminal_context(args: &RunArgs, json_out: bool) -> anyhow::Result<context::Ctx> {
    if args.runtime != RuntimeChoice::Bubblewrap {
        return Err(invalid(format!(
            "-t gives a step a terminal on the native runtime only; the {} runtime has none (yet)",
            args.runtime.kind()
        )));
    }
    if json_out {
        return Err(invalid(
            "-t shows the step's terminal on yours: it has no --json form".to_string(),
        ));
    }
    let db_path = args.store.db_path()?;
    let native = Arc::new(backend::native_runtime_with(args.workspace.mode())?);
    let terminal = super::run_terminal::TerminalRuntime::new(native.clone(), args.interactive);
    let orchestrator =
        backend::orchestrator_over(&db_path, native)?.with_runtime(Arc::new(terminal));
    context::open_over(Arc::new(orchestrator), db_path, json_out)
}

/// The checks made before anything is created: the runtime's configuration, the controls
/// (a refused mount makes no row, no sandbox), the input and the image.
pub(crate) fn check_before_creating(args: &RunArgs) -> anyhow::Result<Checked> {
    let controls = controls(args)?;
    // Said before anything is created: where the host or the cluster is, or what to set.
    backend::check_configured(args.runtime)?;
    let root = args.store.root_dir()?;
    // The controls are checked before anything is created (a refused mount makes no row,
    // no sandbox); the runtime checks them again at create.
    smithers_runtime::SandboxConfig {
        run_id: "check".into(),
        sandbox_id: "check".into(),
        runtime: args.runtime.kind(),
        root_dir: root.clone(),
        image: None,
        controls: controls.clone(),
        workspace_layers: Vec::new(),
    }
    .validate()
    .coded()?;
    let input: Value = match &args.input {
        Some(text) => serde_json::from_str(text)
            .map_err(|e| invalid(format!("--input is not valid JSON: {e}")))?,
        None => json!({}),
    };
    if args.runtime == RuntimeChoice::Docker && args.image.is_none() {
        return Err(invalid(
            "--runtime docker needs --image IMG (a local image)".to_string(),
        ));
    }
    Ok(Checked {
        controls,
        root,
        input,
    })
}

/// The step's request: its ids, its command (started where `run` was), input, image,
/// controls and review settings.
pub(crate) fn step_request(
    args: &RunArgs,
    json_out: bool,
    root: &std::path::Path,
    run_id: &str,
    sandbox_id: &str,
    controls: Controls,
    input: Value,
) -> SandboxRequest {
    let mut req = SandboxRequest::new(run_id, sandbox_id, root);
    req.runtime = Some(args.runtime.kind());
    // Run from a subdirectory of the project, the step starts in the same place in
    // /workspace (a path that is not UTF-8 cannot be said to the runtime: the top then).
    let cwd = args
        .store
        .subdir_of_cwd(root)
        .and_then(|rel| rel.to_str().map(|rel| format!("/workspace/{rel}")));
    req.command = Some(StepCommand {
        argv: args.command.clone(),
        cwd,
        stdin: step_stdin(args, json_out),
    });
    req.input = input;
    req.image = args.image.clone();
    req.controls = controls;
    req.review_diffs = !args.no_review;
    req.auto_accept_diffs = args.auto_accept;
    req
}

/// Runs the step through the orchestrator with its progress display and Ctrl-C, between
/// the run's row in Smithers' run table being begun and settled; the store is synced after.
/// The outcome, and the display (what it saw of the step).
fn execute_step(
    args: &RunArgs,
    json_out: bool,
    interrupts: Interrupts,
    ctx: &context::CtxHandle,
    served: bool,
    req: &SandboxRequest,
) -> (Result<SandboxOutcome, OrchestratorError>, Arc<Display>) {
    let (run_id, sandbox_id, root) = (&req.run_id, &req.sandbox_id, &req.root_dir);
    // On a terminal the step's screen is the step's: no progress line drawn over it.
    let mode = if json_out || args.tty {
        Mode::Quiet
    } else if std::io::stderr().is_terminal() {
        Mode::Tty
    } else {
        Mode::Plain
    };
    let display = Arc::new(Display::new(mode, Relay::detect()));
    if !json_out {
        say!(
            "sandbox {}:{} ({}) over {}",
            inert(run_id),
            inert(sandbox_id),
            args.runtime.kind(),
            inert(&root.display().to_string())
        );
    }
    let cancel = CancellationToken::new();
    let hb_display = display.clone();
    let step_ctx = StepContext {
        heartbeat: Some(Arc::new(move |hb: &Heartbeat| hb_display.heartbeat(hb))),
        cancel: cancel.clone(),
        output: Some(Arc::new(Sink(display.clone()))),
    };

    // A row of Smithers' own run table, so its tools list this run (`smithers ps`).
    run_row::begin(ctx, run_id, sandbox_id, root, args.runtime.kind().as_str());
    let orchestrator = ctx.orchestrator.clone();
    let result = ctx.rt().block_on(async {
        let on_ctrl_c = cancel.clone();
        let ctrl_display = display.clone();
        let ctrl_c = match interrupts {
            Interrupts::Signals => Some(tokio::spawn(async move {
                // Ctrl-C, and a SIGTERM or SIGHUP (a CI job's timeout, a closed terminal)
                // too: the step is cancelled and cleaned up, a terminal set back. Only a
                // second Ctrl-C gives up on the cleanup (a closing terminal's shell sends a
                // second SIGHUP of its own).
                if interrupted().await {
                    on_ctrl_c.cancel();
                    ctrl_display.cancelling();
                    if tokio::signal::ctrl_c().await.is_ok() {
                        ctrl_display.finish();
                        super::run_terminal::put_terminal_back();
                        say!("interrupted again: exiting without waiting for cleanup");
                        std::process::exit(130);
                    }
                }
            })),
            Interrupts::Client(from_client) => {
                from_client.on_interrupt(move || {
                    if !on_ctrl_c.is_cancelled() {
                        on_ctrl_c.cancel();
                        ctrl_display.cancelling();
                    }
                });
                None
            }
        };
        let tick_display = display.clone();
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                tick_display.tick();
            }
        });
        // Served, the step's answer does not wait for its sandbox's cleanup: the service
        // starts it once it has answered, and awaits it before its next step on this project.
        let r = if served {
            let (r, finishing) = orchestrator.execute_then_finish(req, &step_ctx).await;
            ctx.finishing(finishing);
            r
        } else {
            orchestrator.execute(req, &step_ctx).await
        };
        ticker.abort();
        if let Some(ctrl_c) = ctrl_c {
            ctrl_c.abort();
        }
        r
    });
    display.finish();
    note_stdout_gone();
    run_row::settle(ctx, run_id, &result);
    // The step's rows are committed but, with `synchronous = NORMAL`, not yet synced: make
    // them durable before reporting (the store's drop does it too, but cannot say it failed).
    if let Err(e) = ctx.store().sync_wal() {
        say!(
            "warning: the store's last changes may not survive a power loss: {}",
            inert(&e.to_string())
        );
    }
    (result, display)
}

/// What the display saw of the step (from its heartbeats), for its report.
struct Seen {
    termination: Option<String>,
    exit_code: Option<i64>,
    enforcement: Option<Value>,
    egress: Option<Value>,
}

/// Reports how the step ended: the JSON document under `--json`, the summary otherwise.
/// Returns the exit status.
fn report_outcome(
    args: &RunArgs,
    json_out: bool,
    ctx: &context::CtxHandle,
    req: &SandboxRequest,
    display: &Display,
    result: Result<SandboxOutcome, OrchestratorError>,
) -> anyhow::Result<u8> {
    let (run_id, sandbox_id, root) = (&req.run_id, &req.sandbox_id, &req.root_dir);
    let (termination, exit_code, enforcement, egress) = {
        let st = display.lock();
        (
            st.termination.clone(),
            st.exit_code,
            st.enforcement.clone(),
            st.egress.clone(),
        )
    };
    let hints = decision_hints(sandbox_id, &args.store.hint_flags(root));
    let base = json!({
        "runId": run_id,
        "sandboxId": sandbox_id,
        "runtime": args.runtime.kind().as_str(),
        "rootDir": root,
        "db": ctx.db_path,
        "termination": termination,
        "exitCode": exit_code,
        "recovered": context::recovered_json(ctx.recovered()),
        "enforcement": enforcement,
    });
    let mut doc = base;
    if let Some(e) = &egress {
        doc["egress"] = e.clone();
    }
    let seen = Seen {
        termination,
        exit_code,
        enforcement,
        egress,
    };
    let code = match result {
        Err(err) => return Ok(report_failed(ctx, json_out, req, doc, &err)),
        Ok(SandboxOutcome::Cancelled { bundle_path }) => {
            if json_out {
                doc["status"] = json!("cancelled");
                doc["bundlePath"] = json!(bundle_path);
                doc["outputs"] = Value::Null;
                doc["patches"] = json!([]);
                doc["review"] = Value::Null;
                to_stdout(&doc.to_string());
            } else {
                say!("status   cancelled (nothing was applied)");
                if let Some(b) = bundle_path {
                    say!("bundle   {}", inert(&b.display().to_string()));
                }
            }
            130
        }
        Ok(SandboxOutcome::Completed(done)) => {
            report_completed(args, json_out, root, doc, done, seen)
        }
        Ok(SandboxOutcome::AwaitingReview(pending)) => {
            report_review(json_out, root, doc, pending, seen, &hints)
        }
    };
    Ok(code)
}

/// The report of a step the lifecycle stopped (its error): [`EXIT_REJECTED`].
fn report_failed(
    ctx: &context::CtxHandle,
    json_out: bool,
    req: &SandboxRequest,
    mut doc: Value,
    err: &OrchestratorError,
) -> u8 {
    let (run_id, sandbox_id) = (&req.run_id, &req.sandbox_id);
    let report = err.report();
    let bundle_path = ctx
        .store()
        .get_sandbox(run_id, sandbox_id)
        .ok()
        .flatten()
        .and_then(|r| r.bundle_path);
    if json_out {
        doc["status"] = json!("failed");
        doc["bundlePath"] = json!(bundle_path);
        doc["outputs"] = Value::Null;
        doc["patches"] = json!([]);
        doc["review"] = Value::Null;
        doc["error"] = report.to_json();
        to_stdout(&doc.to_string());
    } else {
        say!("{}", render_text(&report));
        say!("status   failed");
        if let Some(b) = bundle_path {
            say!("bundle   {}", inert(&b));
        }
    }
    EXIT_REJECTED
}

/// The report of a step that completed (its patches applied, or none to review).
fn report_completed(
    args: &RunArgs,
    json_out: bool,
    root: &std::path::Path,
    mut doc: Value,
    done: smithers_orchestrator::CompletedSandbox,
    seen: Seen,
) -> u8 {
    let Seen {
        termination,
        exit_code,
        enforcement,
        egress,
    } = seen;
    // Read again only when there are patches to show (the lifecycle inspected the
    // bundle: its notes are in the outcome).
    let (patches, notes) = if done.patch_files.is_empty() {
        (Vec::new(), done.change_notes.clone())
    } else {
        changes::bundle_contents(&done.bundle_path).unwrap_or_default()
    };
    let changes = changes::changes(&patches);
    let review_state = if args.auto_accept && done.applied_patches > 0 {
        json!("applied")
    } else {
        Value::Null
    };
    let log_notes = changes::log_notes(&done.bundle_path);
    if json_out {
        doc["status"] = json!(done.status);
        doc["bundlePath"] = json!(done.bundle_path);
        doc["logNotes"] = json!(log_notes);
        doc["outputs"] = done.outputs.clone().unwrap_or(Value::Null);
        doc["patches"] = json!(changes
            .iter()
            .map(changes::FileChange::to_json)
            .collect::<Vec<_>>());
        doc["appliedPatches"] = json!(done.applied_patches);
        doc["review"] = review_state;
        doc["changeNotes"] = changes::change_notes_json(&notes);
        to_stdout(&doc.to_string());
    } else {
        print_summary(
            &done.status,
            termination.as_deref(),
            exit_code,
            done.outputs.as_ref(),
            &done.bundle_path,
            &changes,
            StepNotes {
                enforcement: enforcement.as_ref(),
                egress: egress.as_ref(),
                log: &log_notes,
                commits: notes.commits.as_ref(),
            },
        );
        if done.applied_patches > 0 {
            say!(
                "applied  {} patch file(s) to {}",
                done.applied_patches,
                inert(&root.display().to_string())
            );
        }
    }
    status_exit(&done.status, termination.as_deref(), exit_code)
}

/// The report of a step whose changes wait in review: the review's warnings and the
/// commands that decide it.
fn report_review(
    json_out: bool,
    root: &std::path::Path,
    mut doc: Value,
    pending: smithers_orchestrator::PendingReview,
    seen: Seen,
    hints: &[String],
) -> u8 {
    let Seen {
        termination,
        exit_code,
        enforcement,
        egress,
    } = seen;
    let (patches, notes) = changes::bundle_contents(&pending.bundle_path).unwrap_or_default();
    let changes = changes::changes(&patches);
    let log_notes = changes::log_notes(&pending.bundle_path);
    if json_out {
        doc["logNotes"] = json!(log_notes);
        doc["status"] = json!("review");
        doc["stepStatus"] = json!(pending.status);
        doc["bundlePath"] = json!(pending.bundle_path);
        doc["changeNotes"] = changes::change_notes_json(&notes);
        doc["outputs"] = pending.outputs.clone().unwrap_or(Value::Null);
        doc["patches"] = json!(changes
            .iter()
            .map(changes::FileChange::to_json)
            .collect::<Vec<_>>());
        doc["review"] = json!({
            "state": "pending",
            "patchCount": pending.patch_count,
            "totalDiffLines": pending.total_diff_lines,
            "commands": hints,
        });
        to_stdout(&doc.to_string());
    } else {
        print_summary(
            &pending.status,
            termination.as_deref(),
            exit_code,
            pending.outputs.as_ref(),
            &pending.bundle_path,
            &changes,
            StepNotes {
                enforcement: enforcement.as_ref(),
                egress: egress.as_ref(),
                log: &log_notes,
                commits: notes.commits.as_ref(),
            },
        );
        say!(
            "review   pending: {} patch file(s), {} changed line(s), NOT applied yet",
            pending.patch_count,
            pending.total_diff_lines
        );
        // The review's warnings, so that nobody accepts from this summary unwarned.
        let mut findings =
            smithers_patch::review_findings(&patches, &smithers_patch::host_hooks_dirs(root));
        changes::add_change_notes(&mut findings, &notes);
        say_raw!("{}", smithers_patch::render_findings(&findings, false));
        for h in hints {
            say!("  {}", inert(h));
        }
    }
    status_exit(&pending.status, termination.as_deref(), exit_code)
}

/// 0 for a finished step; the step's own exit code when it failed with one; 124 for a
/// timeout (like timeout(1)); 1 otherwise.
fn status_exit(status: &str, termination: Option<&str>, exit_code: Option<i64>) -> u8 {
    if status == "finished" {
        return 0;
    }
    if status == "cancelled" {
        return 130;
    }
    match (termination, exit_code) {
        (Some("timeout"), _) => 124,
        (_, Some(c)) if (1..=255).contains(&c) => c as u8,
        _ => EXIT_REJECTED,
    }
}

/// Resolves at the next SIGINT, SIGTERM or SIGHUP (false if none can be listened for).
async fn interrupted() -> bool {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return tokio::signal::ctrl_c().await.is_ok();
    };
    tokio::select! {
        c = tokio::signal::ctrl_c() => c.is_ok(),
        _ = term.recv() => true,
        _ = hup.recv() => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_prefixed_and_distinct_over_time() {
        let a = new_id("sbx");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = new_id("sbx");
        assert!(a.starts_with("sbx-"));
        assert_ne!(a, b);
    }

    #[test]
    fn exit_codes_follow_the_step() {
        assert_eq!(status_exit("finished", Some("exited"), Some(0)), 0);
        assert_eq!(status_exit("failed", Some("exited"), Some(3)), 3);
        assert_eq!(status_exit("failed", Some("timeout"), None), 124);
        assert_eq!(status_exit("cancelled", None, None), 130);
        assert_eq!(status_exit("failed", None, None), 1);
    }
}
