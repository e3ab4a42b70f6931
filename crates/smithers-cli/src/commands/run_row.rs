//! The `_smithers_runs` row of a run `smithers-sandbox run` starts (issue 18): Smithers' own
//! run table, so that its tools (`smithers ps`, `inspect`) list our runs beside the workflows'.
//! See `smithers_store::CliRunStart` for which rows are ours.

use crate::output::say;
use std::path::Path;

use serde_json::json;
use smithers_errors::CodedError;
use smithers_orchestrator::SandboxOutcome;

use super::context;
use crate::output::inert;

/// Records the run in `_smithers_runs` (status `running`); a failure is a warning: the step
/// runs either way, and its own rows are what review and accept read.
pub(super) fn begin(
    ctx: &context::Ctx,
    run_id: &str,
    sandbox_id: &str,
    root: &Path,
    runtime: &str,
) {
    let git = root.join(".git");
    let (vcs_type, vcs_revision) = if git.exists() {
        (Some("git".to_string()), git_head_commit(&git))
    } else {
        (None, None)
    };
    let start = smithers_store::CliRunStart {
        run_id: run_id.to_string(),
        at_ms: now_ms(),
        vcs_root: vcs_type.as_ref().map(|_| root.display().to_string()),
        vcs_type,
        vcs_revision,
        config_json: Some(json!({ "runtime": runtime, "sandboxId": sandbox_id }).to_string()),
    };
    if let Err(e) = ctx.store().begin_cli_run(&start) {
        say!(
            "warning: the run's _smithers_runs row was not written: {}",
            inert(&e.to_string())
        );
    }
}

/// The run's `_smithers_runs` status once the step has ended: `waiting-approval` while its
/// changes wait in review (accept or reject settles it), else the step's.
pub(super) fn settle(
    ctx: &context::Ctx,
    run_id: &str,
    result: &Result<SandboxOutcome, smithers_orchestrator::OrchestratorError>,
) {
    use smithers_store::RunStatus;
    let (status, error) = match result {
        Err(err) => (RunStatus::Failed, Some(err.report().to_json().to_string())),
        Ok(SandboxOutcome::Cancelled { .. }) => (RunStatus::Cancelled, None),
        Ok(SandboxOutcome::Completed(done)) => (RunStatus::of_bundle_status(&done.status), None),
        Ok(SandboxOutcome::AwaitingReview(_)) => (RunStatus::WaitingApproval, None),
    };
    if let Err(e) = ctx
        .store()
        .settle_cli_run(run_id, status, now_ms(), error.as_deref())
    {
        say!(
            "warning: the run's _smithers_runs row was not updated: {}",
            inert(&e.to_string())
        );
    }
}

/// HEAD's commit of the repository whose `.git` is `git` (a directory), read without running
/// git: a detached HEAD, or a branch's loose ref. `None` otherwise (a packed ref, a worktree's
/// `.git` file): the row's `vcs_revision` is then empty, not guessed.
fn git_head_commit(git: &Path) -> Option<String> {
    let is_commit = |s: &str| s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let head = read_small(&git.join("HEAD"))?;
    let head = head.trim();
    if is_commit(head) {
        return Some(head.to_string());
    }
    let name = head.strip_prefix("ref: refs/heads/")?;
    if name
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return None;
    }
    let commit = read_small(&git.join("refs/heads").join(name))?;
    let commit = commit.trim();
    is_commit(commit).then(|| commit.to_string())
}

/// A file of at most 4 KiB (HEAD and refs are tens of bytes; the tree is not trusted).
fn read_small(path: &Path) -> Option<String> {
    use std::io::Read as _;
    let mut buf = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(4096)
        .read_to_string(&mut buf)
        .ok()?;
    Some(buf)
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
