//! A sandbox's workspace layer: where it goes, and what it holds once made.

use smithers_runtime::RuntimeError;

use crate::backend::{Backend, WorkspaceState};
use crate::files::{io_err, restrict_mode};
use crate::host::HostCaps;

/// Where the workspace layer of a sandbox whose directories are named `name` goes: on the
/// disk-backed layer root, flat, when it has no disk limit and that root is not the state
/// root (else in the state directory, the default of [`Backend::layer`]).
pub(crate) fn place_layer(
    caps: &HostCaps,
    c: &smithers_runtime::Controls,
    backend: &mut Backend,
    name: &str,
) -> Result<(), RuntimeError> {
    if c.disk_limit_bytes.is_none() && caps.layer_root != caps.state_root {
        std::fs::create_dir_all(&caps.layer_root)
            .map_err(io_err("create layer directory", &caps.layer_root))?;
        restrict_mode(&caps.layer_root)?;
        backend.layer_dir = Some(caps.layer_root.join(name));
        backend.flat_layer = true;
    }
    Ok(())
}

/// What a sandbox's layer holds, made once the layer is (and its tmpfs mounted): the overlay's
/// upper and work directories (the copy of copy mode is made by ship), `/result`, the output
/// and request directories; and the new root's mount point, shared by every sandbox.
pub(crate) fn make_layer_subdirs(backend: &Backend) -> Result<(), RuntimeError> {
    let layer = backend.layer();
    let overlay_dirs = match backend.workspace {
        // (A flat layer is the work directory itself.)
        WorkspaceState::Overlay => [backend.upper(), backend.work()]
            .into_iter()
            .filter(|d| *d != layer)
            .collect(),
        WorkspaceState::Copy { .. } => vec![],
    };
    for dir in
        overlay_dirs
            .into_iter()
            .chain([backend.artifacts(), backend.out(), backend.request_dir()])
    {
        std::fs::create_dir(&dir).map_err(io_err("create", &dir))?;
    }
    let new_root = backend.new_root();
    match std::fs::create_dir(&new_root) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            Err(RuntimeError::io("create", &new_root, e))
        }
        _ => Ok(()),
    }
}
