//! `collect`: the result bundle from the outcome, the result JSON, the log, the artifacts in
//! `/result` and the patches of the overlay's upper layer. Everything read here was written by
//! the sandbox and is untrusted: no symlink is followed, sizes are bounded. No sandbox process
//! exists any more when collect runs (execute returns only then), so nothing races us.

use std::path::Path;

use serde_json::Value;
use smithers_bundle::{
    write_bundle, BundleFile, BundleStatus, DiffBundle, DiffOperation, DiffPatch, WriteParams,
};
use smithers_patch::{build_patch_files, detect_changes, DetectOptions, Operation};
use smithers_runtime::{CollectReport, ExecOutcome, RuntimeError, SandboxHandle, Termination};

use crate::Backend;

/// The bundle status: cancelled when cancelled; else the step's own word; else finished only
/// when the command exited 0.
pub(crate) fn status_of(outcome: Option<&ExecOutcome>) -> BundleStatus {
    let Some(outcome) = outcome else {
        return BundleStatus::Failed;
    };
    if outcome.termination == Termination::Cancelled {
        return BundleStatus::Cancelled;
    }
    if let Some(status) = outcome
        .result
        .as_ref()
        .and_then(|r| r.get("status"))
        .and_then(Value::as_str)
        .and_then(BundleStatus::parse)
    {
        return status;
    }
    if outcome.succeeded() {
        BundleStatus::Finished
    } else {
        BundleStatus::Failed
    }
}

/// Regular files below `dir`, as (`artifacts/<relative>`, bytes); symlinks and special files
/// are skipped (a bundle may not contain links, and following one would read a host file).
fn artifacts(dir: &Path) -> Result<Vec<BundleFile>, RuntimeError> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<BundleFile>) -> Result<(), RuntimeError> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(RuntimeError::io("read artifacts", dir, e)),
        };
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            let Ok(ft) = entry.file_type() else { continue };
            if ft.is_dir() {
                walk(root, &path, out)?;
            } else if ft.is_file() {
                let Ok(rel) = path.strip_prefix(root) else {
                    continue;
                };
                let Some(rel) = rel.to_str() else { continue };
                let content = read_nofollow(&path)
                    .map_err(|e| RuntimeError::io("read artifact", &path, e))?;
                out.push(BundleFile::new(format!("artifacts/{rel}"), content));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    Ok(out)
}

fn read_nofollow(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    // The bundle limit bounds what we may hold; write_bundle rejects a bundle beyond it.
    let mut out = Vec::new();
    (&mut f)
        .take(smithers_bundle::SANDBOX_MAX_BUNDLE_BYTES + 1)
        .read_to_end(&mut out)?;
    Ok(out)
}

/// The commit the project is at, for the diff bundle's `baseRef` (empty when not a git repo).
fn base_ref(root: &Path) -> String {
    let git = root.join(".git");
    let Ok(head) = std::fs::read_to_string(git.join("HEAD")) else {
        return String::new();
    };
    let head = head.trim();
    match head.strip_prefix("ref: ") {
        Some(r) if !r.contains("..") => std::fs::read_to_string(git.join(r))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| r.to_string()),
        Some(r) => r.to_string(),
        None => head.to_string(),
    }
}

pub(crate) fn collect(
    backend: &Backend,
    handle: &SandboxHandle,
) -> Result<CollectReport, RuntimeError> {
    if !backend.state_dir.is_dir() {
        return Err(RuntimeError::OutOfOrder {
            verb: "collect",
            reason: "the sandbox does not exist (cleaned up?)".into(),
        });
    }
    let outcome: Option<ExecOutcome> = std::fs::read(backend.outcome_file())
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    // A result the step gave but that broke a limit makes the step failed (the log's
    // `resultRejected` record names the limit); it is never reported as finished.
    let rejected = std::fs::read_to_string(backend.result_problem_file()).ok();
    let mut status = status_of(outcome.as_ref());
    if rejected.is_some() && status == BundleStatus::Finished {
        status = BundleStatus::Failed;
    }
    let output = outcome
        .as_ref()
        .and_then(|o| o.result.as_ref())
        .and_then(|r| r.get("outputs"))
        .cloned();

    let changes = detect_changes(
        &backend.root_dir,
        &backend.upper(),
        &DetectOptions::default(),
    )
    .map_err(|e| RuntimeError::inner("detect the workspace changes", &e))?;
    let rendered = build_patch_files(&changes);
    let patches: Vec<BundleFile> = rendered
        .files
        .iter()
        .map(|f| BundleFile::new(f.bundle_path.clone(), f.content.clone()))
        .collect();
    let diff_bundle = (!rendered.diff_bundle.is_empty()).then(|| DiffBundle {
        seq: 0,
        base_ref: base_ref(&backend.root_dir),
        patches: rendered
            .diff_bundle
            .iter()
            .map(|d| DiffPatch {
                path: d.path.clone(),
                operation: match d.operation {
                    Operation::Add => DiffOperation::Add,
                    Operation::Modify => DiffOperation::Modify,
                    Operation::Delete => DiffOperation::Delete,
                },
                diff: d.diff.clone(),
                binary_content: d.binary_content.clone(),
            })
            .collect(),
    });
    let log = backend.log_file();
    let params = WriteParams {
        bundle_path: handle.result_path.clone(),
        output,
        status,
        run_id: Some(handle.run_id.clone()),
        patches,
        artifacts: artifacts(&backend.artifacts())?,
        stream_log_path: log.is_file().then_some(log),
        diff_bundle,
    };
    // A second collect replaces the first bundle.
    if handle.result_path.exists() {
        crate::remove_tree(&handle.result_path)
            .map_err(|e| RuntimeError::io("replace the previous bundle", &handle.result_path, e))?;
    }
    write_bundle(&params).map_err(|e| RuntimeError::inner("write the result bundle", &e))?;
    Ok(CollectReport {
        bundle_path: handle.result_path.clone(),
        patch_count: rendered.files.len(),
        ignored_paths: changes.ignored.iter().map(|i| i.path.clone()).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use smithers_runtime::{EnforcementReport, ResourceUsage};
    use std::time::Duration;

    fn outcome(termination: Termination, code: Option<i32>, result: Option<Value>) -> ExecOutcome {
        ExecOutcome {
            termination,
            exit_code: code,
            signal: None,
            duration: Duration::from_millis(1),
            stdout_bytes: 0,
            stderr_bytes: 0,
            stdout_truncated: false,
            stderr_truncated: false,
            usage: ResourceUsage::default(),
            enforcement: EnforcementReport::default(),
            result,
        }
    }

    #[test]
    fn status_rules() {
        assert_eq!(status_of(None), BundleStatus::Failed);
        assert_eq!(
            status_of(Some(&outcome(Termination::Exited, Some(0), None))),
            BundleStatus::Finished
        );
        assert_eq!(
            status_of(Some(&outcome(Termination::Exited, Some(3), None))),
            BundleStatus::Failed
        );
        assert_eq!(
            status_of(Some(&outcome(Termination::Memory, None, None))),
            BundleStatus::Failed
        );
        let said_failed = Some(serde_json::json!({"status": "failed"}));
        assert_eq!(
            status_of(Some(&outcome(Termination::Exited, Some(0), said_failed))),
            BundleStatus::Failed
        );
        let said_finished = Some(serde_json::json!({"status": "finished"}));
        assert_eq!(
            status_of(Some(&outcome(
                Termination::Exited,
                Some(1),
                said_finished.clone()
            ))),
            BundleStatus::Finished
        );
        assert_eq!(
            status_of(Some(&outcome(Termination::Cancelled, None, said_finished))),
            BundleStatus::Cancelled
        );
    }
}
