//! `collect`: the result bundle from the outcome, the result JSON, the log, the artifacts in
//! `/result` and the patches of the overlay's upper layer (or, in copy mode, of the copy
//! compared with the project). Everything read here was written by
//! the sandbox and is untrusted: no symlink is followed, sizes are bounded. No sandbox process
//! exists any more when collect runs (execute returns only then), so nothing races us.

use std::path::Path;

use smithers_bundle::{write_bundle, BundleFile, WriteParams};
use smithers_runtime::collect::{workspace_bundle, WorkspaceLayer};
use smithers_runtime::{CollectReport, ExecOutcome, RuntimeError, SandboxHandle};

use crate::{Backend, WorkspaceState};

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
    let rejected = backend.result_problem_file().exists();
    let (upper, copy) = (backend.upper(), backend.copy());
    let layer = match backend.workspace {
        WorkspaceState::Overlay => WorkspaceLayer::Upper(&upper),
        WorkspaceState::Copy { .. } => WorkspaceLayer::Copy(&copy),
    };
    let bundle = workspace_bundle(&backend.root_dir, layer, outcome.as_ref(), rejected)?;
    let output = outcome
        .as_ref()
        .and_then(|o| o.result.as_ref())
        .and_then(|r| r.get("outputs"))
        .cloned();
    let patch_count = bundle.patches.len();
    let log = backend.log_file();
    let params = WriteParams {
        bundle_path: handle.result_path.clone(),
        output,
        status: bundle.status,
        run_id: Some(handle.run_id.clone()),
        patches: bundle.patches,
        artifacts: artifacts(&backend.artifacts())?,
        stream_log_path: log.is_file().then_some(log),
        diff_bundle: bundle.diff_bundle,
    };
    // A second collect replaces the first bundle.
    if handle.result_path.exists() {
        crate::remove_tree(&handle.result_path)
            .map_err(|e| RuntimeError::io("replace the previous bundle", &handle.result_path, e))?;
    }
    write_bundle(&params).map_err(|e| RuntimeError::inner("write the result bundle", &e))?;
    Ok(CollectReport {
        bundle_path: handle.result_path.clone(),
        patch_count,
        ignored_paths: bundle
            .changes
            .ignored
            .iter()
            .map(|i| i.path.clone())
            .collect(),
    })
}
