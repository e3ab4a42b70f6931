//! `collect`: the result bundle from the overlay's upper layer (status and patches through
//! `smithers_runtime::collect`, the code the native runtime uses too), the step's result JSON,
//! its artifacts and the NDJSON log, written with `smithers-bundle` (validated first, README.md
//! last).

use std::path::Path;

use smithers_runtime::collect::{write_workspace_bundle, BundleSources, WorkspaceLayer};
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
    // A second collect replaces the first bundle.
    hostfs::remove_tree(&handle.result_path)?;
    write_workspace_bundle(
        handle,
        BundleSources {
            project: root_dir,
            layer: WorkspaceLayer::Upper(&state.upper),
            outcome,
            result_rejected,
            artifacts: &state.artifacts_dir,
            log: &state.state_dir.join("stream.ndjson"),
            notes,
            git_common_layer: None,
        },
    )
}
