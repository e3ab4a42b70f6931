//! Where a sandbox's parts are on the host, as its plan names them ([`host_layout`]), and the
//! git layer of an overlay workspace.

use smithers_runtime::RuntimeError;

use crate::backend::Backend;
use crate::plan::{self, HostLayout, WorkspaceFacts};

/// Where the sandbox's parts are on the host, and what the project holds at its top.
pub(crate) fn host_layout(
    backend: &Backend,
    copy: Option<std::path::PathBuf>,
) -> (HostLayout, WorkspaceFacts) {
    let layout = HostLayout {
        root_dir: backend.root_dir.clone(),
        // The caller's, from the sandbox's record (see `layers::stack_paths`).
        layers: Vec::new(),
        upper: backend.upper(),
        work: backend.work(),
        workspace_copy: copy,
        new_root: backend.new_root(),
        artifacts: backend.artifacts(),
        out: backend.out(),
        request: backend.request_dir(),
    };
    let workspace = match &layout.workspace_copy {
        None => WorkspaceFacts {
            has_git_dir: backend.root_dir.join(".git").is_dir(),
        },
        // The copy's stand-ins (see copy.rs): real directories only, never through a link.
        Some(copy) => {
            let dir = |name: &str| {
                std::fs::symlink_metadata(copy.join(name)).is_ok_and(|m| m.is_dir())
                    && std::fs::symlink_metadata(backend.root_dir.join(name))
                        .is_ok_and(|m| m.is_dir())
            };
            WorkspaceFacts {
                has_git_dir: dir(".git"),
            }
        }
    };
    (layout, workspace)
}

/// The repository an overlay workspace's git layer is over: its common directory, and, for a
/// project below its repository's top, that top and the project's path in it. `None` for a
/// copy, or a project in no repository.
pub(crate) fn git_repository(
    backend: &Backend,
    layout: &HostLayout,
) -> Option<(std::path::PathBuf, Option<(std::path::PathBuf, String)>)> {
    if layout.workspace_copy.is_some() {
        return None;
    }
    let root = &backend.root_dir;
    match smithers_git::worktree_dirs(root) {
        Some((_, common)) => Some((common, None)),
        None => smithers_git::enclosing_repository(root)
            .map(|(top, rel)| (top.join(".git"), Some((top, rel)))),
    }
}

/// The git layer of an overlay workspace, made (and its index prepared) here.
///
/// A git worktree (overlay mode): its repository's common directory becomes writable in the
/// sandbox through a layer of its own, so the step can commit (collect reads the commits from
/// that layer; the host's repository is written only on accept). The same for a project
/// below its repository's top: the top's `.git` through a layer, the host's index copied
/// there with the files outside the project marked skip-worktree, and the workspace shown
/// again at the project's host path.
pub(crate) fn git_layer(
    backend: &Backend,
    layout: &HostLayout,
) -> Result<Option<plan::GitCommonLayer>, RuntimeError> {
    let Some((common, below)) = git_repository(backend, layout) else {
        return Ok(None);
    };
    let (upper, work) = (backend.git_common_upper(), backend.git_common_work());
    for dir in [&upper, &work] {
        std::fs::create_dir_all(dir).map_err(|e| RuntimeError::io("make the git layer", dir, e))?;
    }
    if let Some((top, rel)) = &below {
        smithers_git::prepare_subdir_index(top, rel, &upper)
            .map_err(|e| RuntimeError::spawn("prepare the step's git index", e))?;
    }
    Ok(Some(plan::GitCommonLayer {
        common,
        upper,
        work,
        workspace_at: below.map(|(top, rel)| top.join(rel)),
    }))
}
