//! `collect`: the result bundle from the overlay's upper layer (status and patches through
//! `smithers_runtime::collect`, the code the native runtime uses too), the step's result JSON,
//! its artifacts and the NDJSON log, written with `smithers-bundle` (validated first, README.md
//! last).

use std::path::Path;

use smithers_bundle::{
    write_bundle, BundleFile, WriteParams, SANDBOX_MAX_BUNDLE_BYTES, SANDBOX_MAX_PATCH_FILES,
};
use smithers_runtime::collect::{workspace_bundle, WorkspaceLayer};
use smithers_runtime::{CollectReport, ExecOutcome, RuntimeError, SandboxHandle};

use crate::hostfs;
use crate::plan::BackendState;

pub(crate) fn collect(
    handle: &SandboxHandle,
    state: &BackendState,
    root_dir: &Path,
    outcome: Option<&ExecOutcome>,
    result_rejected: bool,
    notes: &[String],
) -> Result<CollectReport, RuntimeError> {
    let bundle = workspace_bundle(
        root_dir,
        WorkspaceLayer::Upper(&state.upper),
        outcome,
        result_rejected,
    )?;
    let patch_count = bundle.patches.len();
    let budget = SANDBOX_MAX_BUNDLE_BYTES.saturating_sub(bundle.patch_bytes);
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
    extra.extend(bundle.changes.skipped.iter().map(|s| {
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

    let mut params = WriteParams::new(&handle.result_path, bundle.status);
    params.run_id = Some(handle.run_id.clone());
    params.output = outcome
        .and_then(|o| o.result.as_ref())
        .and_then(|r| r.get("outputs").cloned());
    params.patches = bundle.patches;
    params.artifacts = artifacts;
    params.stream_log_path = log.is_file().then_some(log);
    params.diff_bundle = bundle.diff_bundle;
    // A second collect replaces the first bundle.
    hostfs::remove_tree(&handle.result_path)?;
    write_bundle(&params).map_err(|e| RuntimeError::inner("write result bundle", &e))?;
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
