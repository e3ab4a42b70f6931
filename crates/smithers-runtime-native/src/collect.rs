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
use crate::cgroup::CgroupHost;
use crate::files::remove_tree;
use crate::owned;

use std::path::{Path, PathBuf};

/// `collect` from a stored handle: only on the backend `owned::confine_for_collect` rebuilds
/// and checks; the handle's own paths are never used.
pub(crate) fn collect_stored(
    handle: &SandboxHandle,
    stored: &Backend,
    state_root: &std::path::Path,
    layer_root: &std::path::Path,
    host: &CgroupHost,
) -> Result<CollectReport, RuntimeError> {
    let backend = owned::confine_for_collect(handle, stored, state_root, layer_root, host)?;
    collect(&backend, handle, false)
}

/// The bundle of the sandbox; `live` when it is still running (paused, for a session's diff).
pub(crate) fn collect(
    backend: &Backend,
    handle: &SandboxHandle,
    live: bool,
) -> Result<CollectReport, RuntimeError> {
    let merged = merged_upper(backend, live)?;
    let collected = collect_from(backend, handle, merged.as_deref());
    if let (true, Some(aside)) = (live, merged) {
        let _ = remove_tree(&aside);
    }
    collected
}

/// Over a stack of frozen layers (a session that made checkpoints or was forked), the upper
/// directory collect reads is one merged of them all (see `squash`). Once the sandbox has
/// ended it takes the upper directory's place and the stack is folded into it, so that a
/// second collect, a kept layer and accept see one layer as for any step (`None` returned:
/// read the upper directory); while the sandbox runs it is made aside and removed after use.
fn merged_upper(backend: &Backend, live: bool) -> Result<Option<PathBuf>, RuntimeError> {
    let mut record = crate::layers::LayerRecord::load(backend)?;
    if record.stack.is_empty() {
        return Ok(None);
    }
    let mut bottom_first = crate::layers::stack_paths(backend)?;
    bottom_first.reverse();
    bottom_first.push(backend.upper());
    let flips = crate::layers::flips_dir(backend);
    std::fs::create_dir_all(&flips).map_err(|e| RuntimeError::io("create", &flips, e))?;
    let tag = crate::layers::new_id();
    let merged = flips.join(format!("merged-{tag}"));
    crate::squash::squash(&bottom_first, &merged)
        .map_err(|e| RuntimeError::io("merge the workspace's layers", &merged, e))?;
    if live {
        return Ok(Some(merged));
    }
    let (upper, old_top) = (backend.upper(), flips.join(format!("top-{tag}")));
    std::fs::rename(&upper, &old_top).map_err(|e| RuntimeError::io("move", &upper, e))?;
    std::fs::rename(&merged, &upper).map_err(|e| RuntimeError::io("move", &merged, e))?;
    record.stack.clear();
    record.save(backend)?;
    let _ = remove_tree(&old_top);
    Ok(None)
}

fn collect_from(
    backend: &Backend,
    handle: &SandboxHandle,
    merged: Option<&Path>,
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
    let upper = merged.map_or_else(|| backend.upper(), Path::to_path_buf);
    let copy = backend.copy();
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use smithers_runtime::RuntimeKind;

    use super::*;
    use crate::cgroup::SandboxCgroups;
    use crate::owned::{CleanupRecord, CLEANUP_RECORD};

    fn handle(project: &Path, backend: &Backend) -> SandboxHandle {
        let root = SandboxHandle::derived_sandbox_root(project, "r1", "s1");
        SandboxHandle {
            runtime: RuntimeKind::Bubblewrap,
            run_id: "r1".into(),
            sandbox_id: "s1".into(),
            request_path: root.join("request"),
            result_path: root.join("result"),
            sandbox_root: root,
            container_id: None,
            workspace_id: None,
            backend: serde_json::to_value(backend).unwrap(),
        }
    }

    fn backend(state_dir: &Path, root_dir: &Path) -> Backend {
        Backend {
            state_dir: state_dir.to_path_buf(),
            root_dir: root_dir.to_path_buf(),
            layer_tmpfs: false,
            layer_dir: None,
            flat_layer: false,
            cgroups: SandboxCgroups::default(),
            workspace: WorkspaceState::Overlay,
        }
    }

    /// A victim directory laid out as a sandbox's state directory, and a snapshot of it.
    fn victim(dir: &Path) -> Vec<(String, Vec<u8>)> {
        std::fs::create_dir_all(dir.join("artifacts")).unwrap();
        std::fs::create_dir_all(dir.join("layer/upper")).unwrap();
        std::fs::write(dir.join("keep-layer"), b"").unwrap();
        std::fs::write(dir.join("stream.ndjson"), b"{\"v\":1}\n").unwrap();
        std::fs::write(dir.join("artifacts/secret.txt"), b"secret").unwrap();
        std::fs::write(dir.join("layer/upper/planted"), b"planted").unwrap();
        snapshot(dir)
    }

    fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        for p in [
            "keep-layer",
            "stream.ndjson",
            "artifacts/secret.txt",
            "layer/upper/planted",
        ] {
            out.push((
                p.to_string(),
                std::fs::read(dir.join(p)).unwrap_or_default(),
            ));
        }
        out
    }

    /// A handle from a crafted database whose backend names directories elsewhere is refused
    /// and nothing is read or written there (nor a bundle written in the project).
    #[test]
    fn a_stored_handle_naming_other_directories_is_refused_and_touches_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let (project, state_root, layer_root) = (
            tmp.path().join("proj"),
            tmp.path().join("state"),
            tmp.path().join("layers"),
        );
        let (victim_dir, secret) = (tmp.path().join("victim"), tmp.path().join("secret"));
        for d in [&project, &state_root, &layer_root, &secret] {
            std::fs::create_dir_all(d).unwrap();
        }
        let before = victim(&victim_dir);
        let host = CgroupHost::default();
        // The state directory elsewhere.
        let b = backend(&victim_dir, &project);
        let h = handle(&project, &b);
        let err = collect_stored(&h, &b, &state_root, &layer_root, &host).unwrap_err();
        assert!(err.to_string().contains("state directory"), "{err}");
        // The state directory ours (with its record), the project elsewhere.
        let state_dir = state_root.join("r1+s1");
        std::fs::create_dir_all(state_dir.join("layer/upper")).unwrap();
        let record = CleanupRecord::for_self(&project, &SandboxCgroups::default());
        std::fs::write(
            state_dir.join(CLEANUP_RECORD),
            serde_json::to_vec(&record).unwrap(),
        )
        .unwrap();
        let b = backend(&state_dir, &secret);
        let err = collect_stored(&h, &b, &state_root, &layer_root, &host).unwrap_err();
        assert!(
            err.to_string().contains("not the handle's project"),
            "{err}"
        );
        // A layer directory elsewhere.
        let b = Backend {
            layer_dir: Some(victim_dir.join("layer")),
            ..backend(&state_dir, &project)
        };
        let err = collect_stored(&h, &b, &state_root, &layer_root, &host).unwrap_err();
        assert!(err.to_string().contains("layer directory"), "{err}");
        assert_eq!(snapshot(&victim_dir), before);
        assert!(!h.result_path.exists(), "no bundle written");
        assert!(
            !victim_dir.join("result").exists() && !secret.join("result").exists(),
            "nothing written elsewhere"
        );
    }

    /// A sandbox directory (or its result directory) that is a link is refused: collect
    /// would replace what it points to.
    #[test]
    fn a_linked_result_or_sandbox_directory_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let (project, state_root, layer_root) = (
            tmp.path().join("proj"),
            tmp.path().join("state"),
            tmp.path().join("layers"),
        );
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("result")).unwrap();
        std::fs::write(elsewhere.join("result/precious.txt"), b"precious").unwrap();
        let state_dir = state_root.join("r1+s1");
        std::fs::create_dir_all(state_dir.join("layer/upper")).unwrap();
        std::fs::create_dir_all(&layer_root).unwrap();
        let record = CleanupRecord::for_self(&project, &SandboxCgroups::default());
        std::fs::write(
            state_dir.join(CLEANUP_RECORD),
            serde_json::to_vec(&record).unwrap(),
        )
        .unwrap();
        let b = backend(&state_dir, &project);
        let h = handle(&project, &b);
        let host = CgroupHost::default();
        // The result directory a link.
        std::fs::create_dir_all(&h.sandbox_root).unwrap();
        std::os::unix::fs::symlink(elsewhere.join("result"), &h.result_path).unwrap();
        let err = collect_stored(&h, &b, &state_root, &layer_root, &host).unwrap_err();
        assert!(err.to_string().contains("a link?"), "{err}");
        // The sandbox directory a link.
        std::fs::remove_file(&h.result_path).unwrap();
        std::fs::remove_dir(&h.sandbox_root).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &h.sandbox_root).unwrap();
        let err = collect_stored(&h, &b, &state_root, &layer_root, &host).unwrap_err();
        assert!(err.to_string().contains("a link?"), "{err}");
        assert_eq!(
            std::fs::read(elsewhere.join("result/precious.txt")).unwrap(),
            b"precious"
        );
        assert_eq!(
            std::fs::read_dir(elsewhere.join("result")).unwrap().count(),
            1
        );
    }
}
