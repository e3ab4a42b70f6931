//! `collect`: the result bundle from the outcome, the result JSON, the log, the artifacts in
//! `/result` and the patches of the overlay's upper layer (or, in copy mode, of the copy
//! compared with the project), written by `smithers_runtime::collect::write_workspace_bundle`,
//! the code the docker runtime uses too. Everything read there was written by the sandbox and
//! is untrusted: no symlink is followed, sizes are bounded. No sandbox process but the exiting
//! init exists any more when collect runs (execute returns only then), so nothing races us.

use smithers_runtime::collect::{
    detect_options_from_env, write_workspace_bundle_with, BundleSources, CollectOptions,
    WorkspaceLayer,
};
use smithers_runtime::{CollectReport, ExecOutcome, RuntimeError, SandboxHandle};

use crate::backend::{Backend, WorkspaceState};
use crate::files::remove_tree;

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
    let manifest = backend.copy_manifest_file();
    let git_common = backend.git_common_upper();
    let layer = match backend.workspace {
        WorkspaceState::Overlay => WorkspaceLayer::Upper(&upper),
        WorkspaceState::Copy { .. } => WorkspaceLayer::Copy {
            tree: &copy,
            manifest: Some(&manifest),
        },
    };
    // A second collect replaces the first bundle. The empty directories execute made for
    // this one (`prepare_bundle_dirs`) are kept.
    if handle.result_path.exists()
        && !smithers_bundle::holds_only_prepared_dirs(&handle.result_path)
    {
        remove_tree(&handle.result_path)
            .map_err(|e| RuntimeError::io("replace the previous bundle", &handle.result_path, e))?;
    }
    // Where the layer is kept if changes are left out for a limit: derived from the ids
    // (cleanup moves it there; see `keep_layer` in lib.rs).
    let kept_layer = handle.project_root().ok().and_then(|root| {
        smithers_runtime::kept_layer::kept_layer_path(&root, &handle.run_id, &handle.sandbox_id)
            .ok()
    });
    let options = CollectOptions {
        kept_layer,
        detect: Some(detect_options_from_env()),
    };
    // Files of other owners beside what the step changed: a write to one failed in the
    // overlay, so the log names them (the `ownership` module says why this suffices).
    let ownership_notes = match backend.workspace {
        WorkspaceState::Overlay => {
            crate::ownership::notes_beside_changes(&backend.root_dir, &upper)
        }
        WorkspaceState::Copy { .. } => Vec::new(),
    };
    let done = write_workspace_bundle_with(
        handle,
        BundleSources {
            project: &backend.root_dir,
            layer,
            outcome: outcome.as_ref(),
            result_rejected: rejected,
            artifacts: &backend.artifacts(),
            log: &backend.log_file(),
            notes: &ownership_notes,
            git_common_layer: git_common.is_dir().then_some(git_common.as_path()),
        },
        &options,
    )?;
    // The marker tells cleanup (maybe in another process) to keep the layer; it is in the
    // state directory, which cleanup derives from the ids and checks is ours. A second
    // collect that left nothing out takes it away again.
    let marker = backend.keep_layer_marker();
    if done.keep_layer {
        std::fs::write(&marker, b"")
            .map_err(|e| RuntimeError::io("mark the layer kept", &marker, e))?;
    } else if let Err(e) = std::fs::remove_file(&marker) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(RuntimeError::io("unmark the layer kept", &marker, e));
        }
    }
    Ok(done.report)
}
