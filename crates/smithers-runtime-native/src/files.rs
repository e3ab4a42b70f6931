//! File operations every verb shares: private writes, the state root's mode check, removing
//! a tree the overlay left unwritable, and telling a mount point.

use std::path::Path;

use smithers_runtime::RuntimeError;

pub(crate) fn io_err<'a>(
    operation: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> RuntimeError + 'a {
    move |e| RuntimeError::io(operation, path, e)
}

pub(crate) fn write_private(path: &Path, data: &[u8]) -> Result<(), RuntimeError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_err("write", path))?;
    f.write_all(data).map_err(io_err("write", path))
}

pub(crate) fn restrict_mode(dir: &Path) -> Result<(), RuntimeError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::symlink_metadata(dir).map_err(io_err("inspect state root", dir))?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != euid {
        return Err(RuntimeError::spawn(
            "use the state root",
            format!(
                "{} is not a directory owned by uid {euid} (refusing a planted path)",
                dir.display()
            ),
        ));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io_err("restrict state root", dir))?;
    }
    Ok(())
}

/// Removes a tree we own, making directories writable where the overlay's work dir left
/// them mode 000.
pub(crate) fn remove_tree(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            use std::os::unix::fs::PermissionsExt;
            fn open_up(p: &Path) {
                if let Ok(meta) = std::fs::symlink_metadata(p) {
                    if meta.is_dir() {
                        let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
                        if let Ok(rd) = std::fs::read_dir(p) {
                            for entry in rd.flatten() {
                                open_up(&entry.path());
                            }
                        }
                    }
                }
            }
            open_up(path);
            std::fs::remove_dir_all(path)
        }
        Err(e) => Err(e),
    }
}

pub(crate) fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (
        std::fs::metadata(path),
        path.parent().map(std::fs::metadata),
    ) {
        (Ok(a), Some(Ok(b))) => a.dev() != b.dev(),
        _ => false,
    }
}
