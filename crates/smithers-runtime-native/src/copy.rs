//! The copy workspace: where overlayfs cannot be mounted (or copy mode is asked for), `ship`
//! copies the project into the sandbox's state directory and that copy is bound read-write
//! at `/workspace`. The project itself stays the untouched "lower" tree that `collect`
//! compares the copy with (`smithers_patch::detect_changes_by_compare`), so the patches are
//! the ones an overlay would have given.
//!
//! What is copied, never following a symlink: directories (their modes and times applied
//! once filled), regular files (content, permission bits without setuid/setgid, times;
//! hard links become separate files), symlinks as symlinks (their targets are not read or
//! checked: a link is data), fifos and sockets as such. Device nodes cannot be created
//! without privilege and are left out (listed in [`CopyReport::left_out`]). Owners are not
//! kept: everything belongs to the runtime's uid, which is root inside the sandbox.
//!
//! The top-level `.smithers` (the project's own state, whatever kind of entry it is) is not
//! copied and nothing stands in for it: the step does not see it, as in overlay mode
//! (`plan::HIDDEN_TOP_LEVEL`), and one the step makes is its own (collect leaves it out of
//! the patches, named). A top-level `.git` directory is not copied either: an empty directory
//! is the target on which the host's `.git` is bound read-only (a hook written there would run
//! on the host).

use std::ffi::CString;
use std::fs::{File, Metadata};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use smithers_runtime::RuntimeError;

/// What a copy did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CopyReport {
    pub files: u64,
    pub bytes: u64,
    /// Entries that could not be reproduced (device nodes, names that vanished mid-copy are
    /// not listed: they are simply gone).
    pub left_out: Vec<String>,
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> RuntimeError + 'a {
    move |e| RuntimeError::io(op, path, e)
}

fn cstr(path: &Path) -> Result<CString, RuntimeError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        RuntimeError::io(
            "copy the project",
            path,
            std::io::Error::from(std::io::ErrorKind::InvalidInput),
        )
    })
}

/// Access and modification time of `md`, as `utimensat` wants them.
fn times(md: &Metadata) -> [libc::timespec; 2] {
    [
        libc::timespec {
            tv_sec: md.atime() as libc::time_t,
            tv_nsec: md.atime_nsec() as _,
        },
        libc::timespec {
            tv_sec: md.mtime() as libc::time_t,
            tv_nsec: md.mtime_nsec() as _,
        },
    ]
}

/// Sets `path`'s times without following it when it is a symlink.
fn set_times_nofollow(path: &Path, md: &Metadata) -> Result<(), RuntimeError> {
    let c = cstr(path)?;
    let ts = times(md);
    // SAFETY: `c` is a valid NUL-terminated path and `ts` an array of two timespecs, both
    // alive for the call; AT_SYMLINK_NOFOLLOW makes it act on a symlink itself.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(RuntimeError::io(
            "set times in the workspace copy",
            path,
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Permission bits kept on a copy: no setuid/setgid (the copy is the runtime user's; the
/// mount is nosuid anyway).
fn kept_mode(md: &Metadata) -> u32 {
    md.mode() & 0o1777
}

/// Copies the project `src` into `dst` (which must not exist). See the module docs.
pub(crate) fn copy_project(
    src: &Path,
    dst: &Path,
    mut manifest: Option<&mut smithers_patch::CopyManifestWriter>,
) -> Result<CopyReport, RuntimeError> {
    let mut report = CopyReport::default();
    let root_md = std::fs::metadata(src).map_err(io("read the project", src))?;
    std::fs::create_dir(dst).map_err(io("create the workspace copy", dst))?;
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(0o700))
        .map_err(io("create the workspace copy", dst))?;
    let entries = sorted_entries(src)?;
    for (name, path) in entries {
        let Some(md) = lstat(&path)? else { continue };
        if crate::plan::HIDDEN_TOP_LEVEL
            .iter()
            .any(|hidden| name == std::ffi::OsStr::new(hidden))
        {
            continue;
        }
        let target = dst.join(&name);
        if name == ".git" && md.is_dir() {
            // Empty: the mount point of the host's .git.
            std::fs::create_dir(&target).map_err(io("create the workspace copy", &target))?;
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))
                .map_err(io("create the workspace copy", &target))?;
            continue;
        }
        copy_entry(
            &path,
            &md,
            &target,
            Path::new(&name),
            &mut report,
            manifest.as_deref_mut(),
        )?;
    }
    finish_dir(dst, &root_md)?;
    Ok(report)
}

fn lstat(path: &Path) -> Result<Option<Metadata>, RuntimeError> {
    match std::fs::symlink_metadata(path) {
        Ok(md) => Ok(Some(md)),
        // Removed since it was listed: the host changed its tree; nothing to copy.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(RuntimeError::io("read the project", path, e)),
    }
}

fn sorted_entries(dir: &Path) -> Result<Vec<(std::ffi::OsString, PathBuf)>, RuntimeError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io("read the project", dir))? {
        let entry = entry.map_err(io("read the project", dir))?;
        out.push((entry.file_name(), entry.path()));
    }
    out.sort();
    Ok(out)
}

/// Applies a directory's mode and times once its entries are in (a read-only directory could
/// not be filled afterwards, and filling it would change its mtime).
fn finish_dir(dst: &Path, md: &Metadata) -> Result<(), RuntimeError> {
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(kept_mode(md)))
        .map_err(io("set the mode in the workspace copy", dst))?;
    set_times_nofollow(dst, md)
}

fn copy_entry(
    src: &Path,
    md: &Metadata,
    dst: &Path,
    rel: &Path,
    report: &mut CopyReport,
    mut manifest: Option<&mut smithers_patch::CopyManifestWriter>,
) -> Result<(), RuntimeError> {
    let ft = md.file_type();
    if ft.is_dir() {
        std::fs::create_dir(dst).map_err(io("create in the workspace copy", dst))?;
        std::fs::set_permissions(dst, std::fs::Permissions::from_mode(0o700))
            .map_err(io("create in the workspace copy", dst))?;
        let entries = match sorted_entries(src) {
            Ok(e) => e,
            Err(_) if lstat(src)?.is_none() => Vec::new(),
            Err(e) => return Err(e),
        };
        for (name, path) in entries {
            let Some(cmd) = lstat(&path)? else { continue };
            copy_entry(
                &path,
                &cmd,
                &dst.join(&name),
                &rel.join(&name),
                report,
                manifest.as_deref_mut(),
            )?;
        }
        return finish_dir(dst, md);
    }
    if ft.is_symlink() {
        let target = match std::fs::read_link(src) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(RuntimeError::io("read the project", src, e)),
        };
        std::os::unix::fs::symlink(&target, dst)
            .map_err(io("create in the workspace copy", dst))?;
        set_times_nofollow(dst, md)?;
        let made = std::fs::symlink_metadata(dst).map_err(io("read the workspace copy", dst))?;
        return record(manifest, rel, &made, dst);
    }
    if ft.is_file() {
        let mut from = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(src)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(RuntimeError::io("read the project", src, e)),
        };
        // Replaced by something else than a regular file since the lstat: skip it as gone.
        let now = from.metadata().map_err(io("read the project", src))?;
        if !now.is_file() {
            return Ok(());
        }
        let mut to = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dst)
            .map_err(io("create in the workspace copy", dst))?;
        // std::io::copy uses copy_file_range where it can (reflinks on filesystems that have
        // them), a buffer otherwise: the file is never held in memory whole.
        let n = std::io::copy(&mut from, &mut to).map_err(io("copy into the workspace", dst))?;
        report.files += 1;
        report.bytes += n;
        to.set_permissions(std::fs::Permissions::from_mode(kept_mode(&now)))
            .map_err(io("set the mode in the workspace copy", dst))?;
        set_file_times(&to, &now, dst)?;
        // The entry as the copy leaves it: its times are set, nothing else will touch it.
        let made = to.metadata().map_err(io("read the workspace copy", dst))?;
        return record(manifest, rel, &made, dst);
    }
    if ft.is_fifo() || ft.is_socket() {
        let kind = if ft.is_fifo() {
            libc::S_IFIFO
        } else {
            libc::S_IFSOCK
        };
        let c = cstr(dst)?;
        // SAFETY: `c` is a valid NUL-terminated path alive for the call; a fifo or socket
        // node needs no privilege and no device number.
        let rc = unsafe { libc::mknod(c.as_ptr(), kind | kept_mode(md), 0) };
        if rc != 0 {
            return Err(RuntimeError::io(
                "create in the workspace copy",
                dst,
                std::io::Error::last_os_error(),
            ));
        }
        return set_times_nofollow(dst, md);
    }
    // Character and block devices.
    report.left_out.push(format!(
        "{}: device node (cannot be created without privilege)",
        rel.display()
    ));
    Ok(())
}

/// Adds a copied file or symlink to the manifest with the inode and ctime the copy left it
/// with (see `smithers_patch::CopyManifest`).
fn record(
    manifest: Option<&mut smithers_patch::CopyManifestWriter>,
    rel: &Path,
    made: &Metadata,
    dst: &Path,
) -> Result<(), RuntimeError> {
    use std::os::unix::ffi::OsStrExt;
    let Some(manifest) = manifest else {
        return Ok(());
    };
    manifest
        .add(
            rel.as_os_str().as_bytes(),
            smithers_patch::CopyIdentity {
                ino: made.ino(),
                ctime: (made.ctime(), made.ctime_nsec() as u32),
            },
        )
        .map_err(io("write the copy manifest", dst))
}

fn set_file_times(f: &File, md: &Metadata, path: &Path) -> Result<(), RuntimeError> {
    let t = std::fs::FileTimes::new()
        .set_accessed(
            std::time::UNIX_EPOCH
                + std::time::Duration::new(md.atime().max(0) as u64, md.atime_nsec() as u32),
        )
        .set_modified(
            std::time::UNIX_EPOCH
                + std::time::Duration::new(md.mtime().max(0) as u64, md.mtime_nsec() as u32),
        );
    f.set_times(t)
        .map_err(io("set times in the workspace copy", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(dir: &Path, script: &str) {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn copies_modes_links_times_and_leaves_out_state() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        std::fs::create_dir(&src).unwrap();
        sh(
            &src,
            "mkdir -p sub ro .smithers/sandboxes .git/hooks && printf 'x' > sub/f && chmod 755 sub/f && \
             printf 'secret' > .smithers/sandbox.db && printf 'h' > .git/hooks/pre-commit && \
             ln -s /etc/passwd abs && ln -s sub/f rel && ln -s missing dangling && \
             printf 'h' > hard1 && ln hard1 hard2 && mkfifo pipe && printf 'r' > ro/in && chmod 555 ro && \
             touch -d '2001-02-03 04:05:06' sub/f && chmod 4755 sub/f",
        );
        let dst = tmp.path().join("copy");
        let report = copy_project(&src, &dst, None).unwrap();
        assert!(report.left_out.is_empty(), "{:?}", report.left_out);
        // .smithers: absent; .git: an empty stand-in only.
        assert!(std::fs::symlink_metadata(dst.join(".smithers")).is_err());
        assert_eq!(std::fs::read_dir(dst.join(".git")).unwrap().count(), 0);
        let f = std::fs::metadata(dst.join("sub/f")).unwrap();
        assert_eq!(f.mode() & 0o7777, 0o755, "setuid dropped, the rest kept");
        assert_eq!(
            f.mtime(),
            std::fs::metadata(src.join("sub/f")).unwrap().mtime()
        );
        for (link, target) in [
            ("abs", "/etc/passwd"),
            ("rel", "sub/f"),
            ("dangling", "missing"),
        ] {
            assert_eq!(
                std::fs::read_link(dst.join(link)).unwrap(),
                Path::new(target)
            );
        }
        assert!(std::fs::symlink_metadata(dst.join("pipe"))
            .unwrap()
            .file_type()
            .is_fifo());
        let (h1, h2) = (
            std::fs::metadata(dst.join("hard1")).unwrap(),
            std::fs::metadata(dst.join("hard2")).unwrap(),
        );
        assert_ne!(h1.ino(), h2.ino(), "hard links become separate files");
        assert_eq!(std::fs::read(dst.join("ro/in")).unwrap(), b"r");
        assert_eq!(
            std::fs::metadata(dst.join("ro")).unwrap().mode() & 0o777,
            0o555
        );
        assert_eq!(report.files, 4);
        // The source is untouched (the original setuid bit still there).
        assert_eq!(
            std::fs::metadata(src.join("sub/f")).unwrap().mode() & 0o7777,
            0o4755
        );
        // Device nodes cannot be made without privilege: left out and said so (as root only,
        // the one who can plant one in a test tree).
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            sh(&src, "mknod null c 1 3");
            let again = tmp.path().join("copy2");
            let report = copy_project(&src, &again, None).unwrap();
            assert_eq!(report.left_out.len(), 1, "{:?}", report.left_out);
            assert!(report.left_out[0].starts_with("null: device node"));
            assert!(std::fs::symlink_metadata(again.join("null")).is_err());
            std::fs::set_permissions(again.join("ro"), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }
        // A second copy into an existing directory is refused, not merged.
        assert!(copy_project(&src, &dst, None).is_err());
        // Writable again, so that tempdir can remove both trees without root.
        for d in [&src, &dst] {
            std::fs::set_permissions(d.join("ro"), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
}
