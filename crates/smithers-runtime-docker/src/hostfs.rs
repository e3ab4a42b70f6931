//! Host-side file work: the sandbox's state directories, the optional size-capped tmpfs for
//! the writable layer, and reading what the (untrusted) step left in `/result` without ever
//! following a link it planted.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use smithers_runtime::RuntimeError;

use crate::engine::RUNTIME;

/// Owner `uid:gid` of the project root: the identity the step runs as, so that files it
/// creates belong to the project's owner and it can write what the owner can write (with no
/// capabilities, uid 0 included).
pub(crate) fn owner_of(root: &Path) -> Result<(u32, u32), RuntimeError> {
    let md = std::fs::metadata(root).map_err(|e| RuntimeError::io("stat project root", root, e))?;
    if !md.is_dir() {
        return Err(RuntimeError::InvalidControl {
            control: "rootDir",
            reason: format!("{} is not a directory", root.display()),
        });
    }
    Ok((md.uid(), md.gid()))
}

/// This process's pid and start time, for the owner labels.
pub(crate) fn self_identity() -> (u32, u64) {
    let pid = std::process::id();
    (pid, process_start(pid).unwrap_or(0))
}

/// Start time of a process in clock ticks since boot (`/proc/<pid>/stat` field 22), or None
/// when it does not exist or exited and is not reaped yet (a zombie runs nothing, as the
/// store's owner check says too).
pub(crate) fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    if matches!(fields.next(), Some("Z" | "X")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Creates a directory and its parents with the given mode on the leaf.
pub(crate) fn mkdir(path: &Path, mode: u32) -> Result<(), RuntimeError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(|e| RuntimeError::io("create directory", path, e))
}

/// Mounts a tmpfs of `size` bytes at `dir`: the only way to cap the overlay's upper layer
/// without engine support for quotas. Needs CAP_SYS_ADMIN on the host.
pub(crate) fn mount_layer_tmpfs(dir: &Path, size: u64) -> Result<(), RuntimeError> {
    let data = std::ffi::CString::new(format!("size={size},mode=0755"))
        .map_err(|e| RuntimeError::spawn("encode tmpfs options", e))?;
    rustix::mount::mount(
        "smithers-layer",
        dir,
        "tmpfs",
        rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
        Some(data.as_c_str()),
    )
    .map_err(|e| RuntimeError::ControlUnsupported {
        runtime: RUNTIME,
        control: "diskLimit",
        reason: format!(
            "capping the workspace's writable layer needs a size-limited tmpfs at {} and \
             mounting it failed ({e}); run the orchestrator with CAP_SYS_ADMIN (as root) or \
             drop diskLimit",
            dir.display()
        ),
    })
}

/// Lazily unmounts `dir` if something is mounted there. Not mounted / missing is success.
pub(crate) fn unmount(dir: &Path) -> Result<(), RuntimeError> {
    match rustix::mount::unmount(dir, rustix::mount::UnmountFlags::DETACH) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::INVAL || e == rustix::io::Errno::NOENT => Ok(()),
        Err(e) => Err(RuntimeError::io(
            "unmount writable layer",
            dir,
            std::io::Error::from(e),
        )),
    }
}

/// Removes a directory tree; a missing tree is success (idempotent cleanup).
pub(crate) fn remove_tree(path: &Path) -> Result<(), RuntimeError> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(RuntimeError::io("remove", path, e)),
    }
}

/// Reads `dir/name` if it is a regular file of at most `max` bytes, never following a
/// symlink (neither `name` nor anything above it inside `dir`). None when absent, a symlink,
/// not a regular file, or too large: the step's result is then simply not there.
pub(crate) fn read_untrusted_file(dir: &Path, name: &str, max: u64) -> Option<Vec<u8>> {
    smithers_paths::Beneath::open(dir)
        .ok()?
        .read_regular(Path::new(name), max)
        .ok()?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untrusted_reads_never_follow_links() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"host secret").unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        std::os::unix::fs::symlink(&secret, out.join("result.json")).unwrap();
        assert_eq!(read_untrusted_file(&out, "result.json", 1 << 20), None);
        std::fs::remove_file(out.join("result.json")).unwrap();
        std::fs::write(out.join("result.json"), b"{}").unwrap();
        assert_eq!(
            read_untrusted_file(&out, "result.json", 1 << 20).as_deref(),
            Some(&b"{}"[..])
        );
        assert_eq!(read_untrusted_file(&out, "result.json", 1), None);
    }

    #[test]
    fn start_time_of_self_is_known() {
        let (pid, start) = self_identity();
        assert_eq!(pid, std::process::id());
        assert!(start > 0);
        assert_eq!(process_start(pid), Some(start));
    }
}
