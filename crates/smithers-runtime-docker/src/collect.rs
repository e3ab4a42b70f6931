//! `collect`: the result bundle from the overlay's upper layer (patches, through
//! `smithers-patch` exactly as the local runtime), the step's result JSON, its artifacts and
//! the NDJSON log, written with `smithers-bundle` (validated first, README.md last).

use std::path::Path;

use serde_json::Value;
use smithers_bundle::{
    write_bundle, BundleFile, BundleStatus, DiffBundle, DiffOperation, DiffPatch, WriteParams,
    SANDBOX_MAX_BUNDLE_BYTES, SANDBOX_MAX_PATCH_FILES,
};
use smithers_patch::{build_patch_files, detect_changes, DetectOptions, Operation};
use smithers_runtime::{CollectReport, ExecOutcome, RuntimeError, SandboxHandle, Termination};

use crate::hostfs;
use crate::plan::BackendState;

/// The bundle status, with the local runtime's rule: cancelled when cancelled; else the
/// step's own word; else finished only when the command exited 0.
pub(crate) fn bundle_status(outcome: Option<&ExecOutcome>) -> BundleStatus {
    let Some(o) = outcome else {
        return BundleStatus::Failed;
    };
    if o.termination == Termination::Cancelled {
        return BundleStatus::Cancelled;
    }
    if let Some(status) = o
        .result
        .as_ref()
        .and_then(|r| r.get("status"))
        .and_then(Value::as_str)
        .and_then(BundleStatus::parse)
    {
        return status;
    }
    if o.succeeded() {
        BundleStatus::Finished
    } else {
        BundleStatus::Failed
    }
}

/// The commit the project is at, for the diff bundle's `baseRef` (empty when not a git repo);
/// the same rule as the local runtime.
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
    handle: &SandboxHandle,
    state: &BackendState,
    root_dir: &Path,
    outcome: Option<&ExecOutcome>,
    result_rejected: bool,
    notes: &[String],
) -> Result<CollectReport, RuntimeError> {
    let changes = detect_changes(root_dir, &state.upper, &DetectOptions::default())
        .map_err(|e| RuntimeError::inner("detect workspace changes", &e))?;
    let files = build_patch_files(&changes);
    let patch_count = files.files.len();
    let patches: Vec<BundleFile> = files
        .files
        .iter()
        .map(|f| BundleFile::new(f.bundle_path.clone(), f.content.clone().into_bytes()))
        .collect();
    let diff_bundle = (!files.diff_bundle.is_empty()).then(|| DiffBundle {
        seq: 0,
        base_ref: base_ref(root_dir),
        patches: files
            .diff_bundle
            .iter()
            .map(|d| DiffPatch {
                path: d.path.clone(),
                operation: match d.operation {
                    Operation::Add => DiffOperation::Add,
                    Operation::Delete => DiffOperation::Delete,
                    Operation::Modify => DiffOperation::Modify,
                },
                diff: d.diff.clone(),
                binary_content: d.binary_content.clone(),
            })
            .collect(),
    });

    let budget = SANDBOX_MAX_BUNDLE_BYTES.saturating_sub(files.total_bytes());
    let (found, skipped) =
        hostfs::collect_artifacts(&state.artifacts_dir, SANDBOX_MAX_PATCH_FILES, budget);
    let artifacts = found
        .into_iter()
        .map(|a| BundleFile::new(format!("artifacts/{}", a.rel), a.content))
        .collect();

    // Notes about what was left out go at the end of the log, never silently dropped.
    let log = state.state_dir.join("stream.ndjson");
    let mut extra: Vec<String> = notes.to_vec();
    extra.extend(
        skipped
            .into_iter()
            .map(|s| format!("artifact skipped: {s}")),
    );
    extra.extend(changes.skipped.iter().map(|s| {
        format!(
            "change not representable as a patch: {}: {}",
            s.path, s.reason
        )
    }));
    if !extra.is_empty() {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| RuntimeError::io("append log", &log, e))?;
        for n in extra {
            let rec =
                serde_json::json!({"kind": "note", "message": n, "timestampMs": crate::now_ms()});
            writeln!(f, "{rec}").map_err(|e| RuntimeError::io("append log", &log, e))?;
        }
    }

    let status = match bundle_status(outcome) {
        BundleStatus::Cancelled => BundleStatus::Cancelled,
        _ if result_rejected => BundleStatus::Failed,
        s => s,
    };
    let mut params = WriteParams::new(&handle.result_path, status);
    params.run_id = Some(handle.run_id.clone());
    params.output = outcome
        .and_then(|o| o.result.as_ref())
        .and_then(|r| r.get("outputs").cloned());
    params.patches = patches;
    params.artifacts = artifacts;
    params.stream_log_path = log.is_file().then_some(log);
    params.diff_bundle = diff_bundle;
    // A second collect replaces the first bundle.
    hostfs::remove_tree(&handle.result_path)?;
    write_bundle(&params).map_err(|e| RuntimeError::inner("write result bundle", &e))?;
    Ok(CollectReport {
        bundle_path: handle.result_path.clone(),
        patch_count,
        ignored_paths: changes.ignored.iter().map(|i| i.path.clone()).collect(),
    })
}
