//! The `cleanup` verb: confine a handle to what is ours (see `owned`), keep a layer collect
//! marked kept, then kill and remove everything the sandbox had. Also undoes a failed
//! `create`.

use std::path::{Path, PathBuf};

use smithers_runtime::{RuntimeError, SandboxHandle};

use crate::backend::Backend;
use crate::copy;
use crate::files::{io_err, is_mount_point, remove_tree};
use crate::host::HostCaps;
use crate::owned;
use crate::runtime::NativeRuntime;
use crate::threads::{beside, blocking};
use smithers_sandbox_init::sys;

impl NativeRuntime {
    /// The `cleanup` verb.
    pub(crate) async fn cleanup_sandbox(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        let backend = match Backend::from_handle(handle, "cleanup") {
            Ok(b) => b,
            // A handle without state (create failed before producing one) holds nothing.
            Err(_) if handle.backend.is_null() => return Ok(()),
            Err(e) => return Err(e),
        };
        // A warm init never executed ends first (its cgroups are the sandbox's).
        drop(self.take_attached(&backend));
        let caps = self.caps();
        let handle = handle.clone();
        // Kills that wait for the cgroups to empty, removals that retry while they are busy,
        // whole trees removed: on a blocking thread (see `blocking`).
        blocking("clean up the sandbox", move || {
            cleanup_confined(&handle, &backend, &caps)
        })
        .await?
    }
}

/// Everything `cleanup` does, also used to roll back a failed `create`; `handle_dirs` are the
/// handle's directories in the project that go too.
pub(crate) fn cleanup_backend(
    backend: &Backend,
    handle_dirs: &[&Path],
    kept_layer: Option<&Path>,
) -> Result<(), RuntimeError> {
    let mut problems = Vec::new();
    // Nothing may be removed from under a live sandbox.
    if backend.cgroups.populated() {
        backend
            .cgroups
            .kill_and_wait(std::time::Duration::from_secs(5));
    }
    // Before the layer's tmpfs goes: the step's writes that the bundle could not carry.
    if backend.keep_layer_marker().exists() {
        keep_layer(backend, kept_layer)?;
    }
    // Only our own sandbox's mounts: the layer tmpfs (and, defensively, a root left mounted by
    // a crashed init would be in its own mount namespace, gone with it).
    if backend.layer_tmpfs {
        let layer = backend.layer();
        if is_mount_point(&layer) {
            if let Err(e) = sys::umount2(&layer, libc::MNT_DETACH) {
                problems.push(e.to_string());
            }
        }
    }
    // Then everything side by side: on a disk mounted with `discard` (this project's machines)
    // each removed directory or data file waits for its blocks' discard, ~0.1 ms apiece. The
    // layer's `upper/` and `work/` and each of the handle's directories in the project are
    // removed on other threads; this one removes the cgroups and the state directory (a
    // tmpfs, by default), then (older handles) the emptied layer directory.
    let mut trees: Vec<PathBuf> = handle_dirs.iter().map(|d| d.to_path_buf()).collect();
    // A worktree's git layer, beside the upper directory (absent for every other project).
    trees.extend(
        [backend.git_common_upper(), backend.git_common_work()]
            .into_iter()
            .filter(|d| std::fs::symlink_metadata(d).is_ok()),
    );
    // A session's flips' leftovers, beside its upper directory.
    trees.extend(
        Some(crate::layers::flips_dir(backend)).filter(|d| std::fs::symlink_metadata(d).is_ok()),
    );
    let emptied_layer = match (&backend.layer_dir, backend.flat_layer) {
        // The layer (the work directory, or the copy's parent) and the upper beside it.
        (Some(layer), true) => {
            trees.extend([layer.clone(), backend.upper()]);
            None
        }
        (Some(layer), false) => {
            trees.extend([backend.upper(), backend.work(), backend.copy()]);
            Some(layer)
        }
        (None, _) => None,
    };
    let removals = beside(trees.into_iter().map(|tree| {
        move || {
            remove_tree(&tree)
                .err()
                .map(|e| format!("remove {}: {e}", tree.display()))
        }
    }));
    let left = backend.cgroups.remove(std::time::Duration::from_secs(5));
    if !left.is_empty() {
        problems.push(format!(
            "cgroups still busy: {}",
            left.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if let Err(e) = remove_tree(&backend.state_dir) {
        problems.push(format!("remove {}: {e}", backend.state_dir.display()));
    }
    for removal in removals.wait() {
        match removal {
            Some(problem) => problems.extend(problem),
            None => problems.push("a removal failed without a report (it panicked)".into()),
        }
    }
    // Frozen layers no sandbox names any more (this one's record went with its state).
    if let (Some(store), Some(state_root)) =
        (crate::layers::store(backend), backend.state_dir.parent())
    {
        if store.is_dir() {
            crate::layers::collect_garbage(state_root, &store);
        }
    }
    if let Some(layer) = emptied_layer {
        if let Err(e) = remove_tree(layer) {
            problems.push(format!("remove {}: {e}", layer.display()));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(RuntimeError::spawn(
            "clean up the sandbox",
            problems.join("; "),
        ))
    }
}

/// Moves the step's written layer (the overlay's upper directory, or the copy) to
/// `kept_layer`, the sandbox's `kept-layer` directory that cleanup derived from the ids, so
/// that the changes collect left out for a size limit are not lost: a rename where both are
/// on one file system, else a copy (modes, times and links kept; what a copy cannot make,
/// such as the overlay's whiteouts, is listed in `kept-layer.txt` beside it) and then the
/// layer is removed with the rest. Fails closed: with no trusted place to keep it, or when
/// the copy fails, cleanup stops before anything is removed.
fn keep_layer(backend: &Backend, kept_layer: Option<&Path>) -> Result<(), RuntimeError> {
    let Some(dest) = kept_layer else {
        return Err(RuntimeError::spawn(
            "keep the workspace layer",
            "changes were left out of the bundle for a size limit, and the sandbox's project directory is not one cleanup may write (see the other problems); the layer is left where it is",
        ));
    };
    let src = backend.written_layer();
    let marker = backend.keep_layer_marker();
    if std::fs::symlink_metadata(&src).is_err() {
        // Moved already (a cleanup stopped after the move): the kept layer is in place.
        return std::fs::remove_file(&marker).map_err(io_err("remove", &marker));
    }
    // An earlier kept layer of these ids (a second collect and cleanup) is replaced.
    if std::fs::symlink_metadata(dest).is_ok() {
        remove_tree(dest).map_err(|e| RuntimeError::io("replace the kept layer", dest, e))?;
    }
    let list = dest.with_file_name(smithers_runtime::kept_layer::KEPT_LAYER_NOTES);
    if let Err(e) = std::fs::remove_file(&list) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(RuntimeError::io("replace the kept layer", &list, e));
        }
    }
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(io_err("create", parent))?;
    }
    match std::fs::rename(&src, dest) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            let report = copy::copy_project(&src, dest, None)?;
            if !report.left_out.is_empty() {
                let text = format!(
                    "not copied from the workspace layer (not regular files, links or directories):\n{}\n",
                    report.left_out.join("\n")
                );
                std::fs::write(&list, text).map_err(io_err("write", &list))?;
            }
        }
        Err(e) => return Err(RuntimeError::io("keep the workspace layer", &src, e)),
    }
    std::fs::remove_file(&marker).map_err(io_err("remove", &marker))
}

/// `cleanup` once the handle is read: confines it to what is ours (see `owned::confine`),
/// then removes everything the sandbox had.
pub(crate) fn cleanup_confined(
    handle: &SandboxHandle,
    backend: &Backend,
    caps: &HostCaps,
) -> Result<(), RuntimeError> {
    test_stall::cleanup(&handle.sandbox_id);
    let confined = owned::confine(
        handle,
        backend,
        &caps.state_root,
        &caps.layer_root,
        &caps.cgroups,
    )?;
    let dirs: Vec<&Path> = confined.request_dir.iter().map(PathBuf::as_path).collect();
    let cleaned = cleanup_backend(&confined.backend, &dirs, confined.kept_layer.as_deref());
    if confined.left_alone.is_empty() {
        return cleaned;
    }
    let left = format!("left alone: {}", confined.left_alone.join("; "));
    Err(match cleaned {
        Ok(()) => RuntimeError::spawn("clean up the sandbox", left),
        Err(e) => RuntimeError::spawn("clean up the sandbox", format!("{e}; {left}")),
    })
}

/// A test hook, compiled into debug builds only: `SMITHERS_SANDBOX_TEST_CLEANUP_STALL=
/// <prefix>:<ms>` makes the cleanup of every sandbox whose id starts with `<prefix>` sleep
/// `<ms>` first, in the blocking part, as a cleanup waiting on a busy cgroup or mount does.
/// The load test uses it to hold cleanups stuck while it checks that `serve` still answers
/// (nothing the kernel offers keeps a cleanup waiting that long on demand: SIGKILL and
/// lazy unmounts win within milliseconds). Release builds ignore the variable.
mod test_stall {
    #[cfg(debug_assertions)]
    pub(crate) fn cleanup(sandbox_id: &str) {
        let Ok(spec) = std::env::var("SMITHERS_SANDBOX_TEST_CLEANUP_STALL") else {
            return;
        };
        let Some((prefix, ms)) = spec.rsplit_once(':') else {
            return;
        };
        if let (false, Ok(ms)) = (prefix.is_empty(), ms.parse::<u64>()) {
            if sandbox_id.starts_with(prefix) {
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
        }
    }

    #[cfg(not(debug_assertions))]
    pub(crate) fn cleanup(_: &str) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::WorkspaceState;
    use crate::cgroup::SandboxCgroups;

    /// Cleanup keeps a layer marked kept: moved across file systems (the state directory on
    /// /dev/shm, the project on another) by a copy that keeps contents, links and fifos, then
    /// the rest is removed; without a trusted place it fails before removing anything.
    #[test]
    fn cleanup_keeps_a_marked_layer_across_file_systems() {
        let shm = Path::new("/dev/shm");
        let project = tempfile::tempdir().unwrap();
        if !sys::is_tmpfs(shm) || sys::is_tmpfs(project.path()) {
            smithers_test_support::skip_optional(
                "no tmpfs at /dev/shm beside a disk-backed $TMPDIR",
            );
            return;
        }
        let state = tempfile::tempdir_in(shm).unwrap();
        let backend = Backend {
            state_dir: state.path().join("r+s"),
            root_dir: project.path().to_path_buf(),
            layer_tmpfs: false,
            layer_dir: None,
            flat_layer: false,
            cgroups: SandboxCgroups::default(),
            workspace: WorkspaceState::Overlay,
        };
        let upper = backend.upper();
        std::fs::create_dir_all(upper.join("d")).unwrap();
        std::fs::write(upper.join("d/big.bin"), vec![7u8; 5000]).unwrap();
        std::os::unix::fs::symlink("d/big.bin", upper.join("link")).unwrap();
        let fifo = upper.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        std::fs::write(backend.keep_layer_marker(), b"").unwrap();
        // No trusted place: nothing is removed.
        let err = cleanup_backend(&backend, &[], None).unwrap_err();
        assert!(err.to_string().contains("left where it is"), "{err}");
        assert!(upper.join("d/big.bin").is_file() && backend.state_dir.is_dir());
        let kept = smithers_runtime::kept_layer::kept_layer_path(project.path(), "r", "s").unwrap();
        cleanup_backend(&backend, &[], Some(&kept)).unwrap();
        assert_eq!(
            std::fs::read(kept.join("d/big.bin")).unwrap(),
            vec![7u8; 5000]
        );
        assert_eq!(
            std::fs::read_link(kept.join("link")).unwrap(),
            Path::new("d/big.bin")
        );
        // A fifo is made again; only device nodes (the overlay's whiteouts), which need
        // privilege, would be listed beside the kept layer.
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(kept.join("fifo"))
            .unwrap()
            .file_type()
            .is_fifo());
        assert!(!kept
            .with_file_name(smithers_runtime::kept_layer::KEPT_LAYER_NOTES)
            .exists());
        assert!(!backend.state_dir.exists() && !upper.exists());
        // Without the marker, the layer is removed as before.
        std::fs::create_dir_all(upper.join("d")).unwrap();
        std::fs::write(upper.join("d/x"), b"x").unwrap();
        cleanup_backend(&backend, &[], Some(&kept)).unwrap();
        assert!(!upper.exists());
        assert!(
            kept.join("d/big.bin").is_file(),
            "an unmarked cleanup leaves it alone"
        );
    }
}
