//! The kept workspace layer: when changes of a step were left out of its bundle for a size
//! limit, the backend keeps the step's workspace layer (the overlay's upper directory, or the
//! copy) at `<rootDir>/.smithers/sandboxes/<runId>/<sandboxId>/kept-layer` past cleanup, so
//! nothing the step wrote is lost; it goes when the review is rejected (accept applies none of it, so it stays).
//!
//! The path is always derived here from the project root and the validated ids, never read
//! from a database, a handle or a bundle (a crafted one must not name a host directory to
//! remove), and nothing is removed through a link on the way.

use std::path::{Path, PathBuf};

use crate::{RuntimeError, SandboxHandle};

/// The kept layer's directory name in the sandbox's project directory.
pub const KEPT_LAYER_DIR: &str = "kept-layer";

/// Beside it, what a copy of the layer (across file systems) could not make, if anything.
pub const KEPT_LAYER_NOTES: &str = "kept-layer.txt";

/// `<root>/.smithers/sandboxes/<runId>/<sandboxId>/kept-layer`, after validating the ids.
pub fn kept_layer_path(
    root: &Path,
    run_id: &str,
    sandbox_id: &str,
) -> Result<PathBuf, RuntimeError> {
    crate::config::validate_id("runId", run_id)?;
    crate::config::validate_id("sandboxId", sandbox_id)?;
    Ok(SandboxHandle::derived_sandbox_root(root, run_id, sandbox_id).join(KEPT_LAYER_DIR))
}

/// Removes the kept layer of a sandbox of the project at `root`, if there is one; true when
/// one was removed. Refuses (removing nothing) when the ids are not valid ids or a directory
/// from `<root>/.smithers` down to the sandbox's is a link; a `kept-layer` that is a link is
/// unlinked, never followed.
pub fn remove_kept_layer(
    root: &Path,
    run_id: &str,
    sandbox_id: &str,
) -> Result<bool, RuntimeError> {
    let path = kept_layer_path(root, run_id, sandbox_id)?;
    check_dirs_real(root, run_id, sandbox_id)?;
    let notes = path.with_file_name(KEPT_LAYER_NOTES);
    match std::fs::remove_file(&notes) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(RuntimeError::io("remove the kept layer's notes", &notes, e))
        }
        _ => {}
    }
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(RuntimeError::io("inspect the kept layer", &path, e)),
        Ok(m) if m.is_dir() => remove_tree(&path)
            .map(|()| true)
            .map_err(|e| RuntimeError::io("remove the kept layer", &path, e)),
        Ok(_) => std::fs::remove_file(&path)
            .map(|()| true)
            .map_err(|e| RuntimeError::io("remove the kept layer", &path, e)),
    }
}

/// Every directory from `<root>/.smithers` to the sandbox's must be a real directory.
fn check_dirs_real(root: &Path, run_id: &str, sandbox_id: &str) -> Result<(), RuntimeError> {
    let mut dir = root.to_path_buf();
    for part in [".smithers", "sandboxes", run_id, sandbox_id] {
        dir.push(part);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Ok(_) => {
                return Err(RuntimeError::InvalidControl {
                    control: "kept layer",
                    reason: format!(
                        "{} is not a directory (a link?); the kept layer is left alone",
                        dir.display()
                    ),
                })
            }
            Err(e) => return Err(RuntimeError::io("inspect", &dir, e)),
        }
    }
    Ok(())
}

/// Removes a tree the step wrote: it may hold directories it made unwritable or
/// unreadable (mode 000), which are opened up (the tree is ours: owner's mode bits) first.
/// `remove_dir_all` follows no link.
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            open_up(path);
            std::fs::remove_dir_all(path)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn open_up(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(m) = std::fs::symlink_metadata(dir) else {
        return;
    };
    if !m.is_dir() {
        return;
    }
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    if let Ok(rd) = std::fs::read_dir(dir) {
        for entry in rd.flatten() {
            open_up(&entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_only_the_derived_kept_layer() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("project");
        let kept = kept_layer_path(&root, "run", "sbx").unwrap();
        std::fs::create_dir_all(kept.join("sub/locked")).unwrap();
        std::fs::write(kept.join("sub/locked/big.bin"), b"x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(kept.join("sub"), std::fs::Permissions::from_mode(0o000)).unwrap();
        let notes = kept.with_file_name(KEPT_LAYER_NOTES);
        std::fs::write(&notes, "whiteout\n").unwrap();
        std::fs::write(kept.with_file_name("other"), "stays").unwrap();
        assert!(remove_kept_layer(&root, "run", "sbx").unwrap());
        assert!(!kept.exists() && !notes.exists());
        assert!(
            kept.with_file_name("other").is_file(),
            "only the kept layer goes"
        );
        assert!(
            !remove_kept_layer(&root, "run", "sbx").unwrap(),
            "nothing left"
        );
        // Ids that climb are refused.
        assert!(remove_kept_layer(&root, "..", "sbx").is_err());
        assert!(kept_layer_path(&root, "run", "a/b").is_err());
        // A planted link on the way is not followed: the directory it names stays.
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("sandboxes/run/sbx/kept-layer")).unwrap();
        let other = dir.path().join("other");
        std::fs::create_dir_all(&other).unwrap();
        std::os::unix::fs::symlink(&elsewhere, other.join(".smithers")).unwrap();
        assert!(remove_kept_layer(&other, "run", "sbx").is_err());
        assert!(elsewhere.join("sandboxes/run/sbx/kept-layer").is_dir());
        // A kept-layer that is a link is unlinked, its target kept.
        let target = dir.path().join("target");
        std::fs::create_dir_all(&target).unwrap();
        std::os::unix::fs::symlink(&target, &kept).unwrap();
        assert!(remove_kept_layer(&root, "run", "sbx").unwrap());
        assert!(target.is_dir());
    }
}
