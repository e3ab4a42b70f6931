//! Building the sandbox's root: one [`MountOp`] at a time, each checked. Also what the
//! runtime uses to make a prepared root's files and mount points, so that a prepared root and
//! a tmpfs root cannot differ.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::plan::{MountAttrs, MountOp, TargetKind};
use crate::sys::{self, cpath, cstring, SysError, SysResult};

pub(crate) fn join(root: &Path, inner: &Path) -> PathBuf {
    root.join(inner.strip_prefix("/").unwrap_or(inner))
}

/// `mkdir -p`, mkdir first: the root is a fresh tmpfs that only we write, where most paths
/// are new and their parents already made, so one syscall is the common case (a stat before
/// each mkdir cost about a hundred syscalls per sandbox). EEXIST is taken as done: something
/// else in the way fails the mount or file operation that follows, with its own error.
pub(crate) fn mkdir_p(path: &Path, mode: u32) -> SysResult<()> {
    let mode = Mode::from_raw_mode(mode);
    let failed = || format!("mkdir {}", path.display());
    match rustix::fs::mkdir(path, mode) {
        Ok(()) | Err(Errno::EXIST) => Ok(()),
        Err(Errno::NOENT) => {
            if let Some(parent) = path.parent() {
                mkdir_p(parent, 0o755)?;
            }
            match rustix::fs::mkdir(path, mode) {
                Ok(()) | Err(Errno::EXIST) => Ok(()),
                other => sys::rx(other, failed),
            }
        }
        other => sys::rx(other, failed),
    }
}

pub(crate) fn touch(path: &Path) -> SysResult<()> {
    if let Some(parent) = path.parent() {
        mkdir_p(parent, 0o755)?;
    }
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    // Closed when dropped: only its existence matters.
    sys::rx(
        rustix::fs::open(path, flags, Mode::from_raw_mode(0o644)),
        || format!("create {}", path.display()),
    )
    .map(drop)
}

fn attr_bits(a: MountAttrs) -> u64 {
    let mut bits = 0;
    if a.readonly {
        bits |= sys::MOUNT_ATTR_RDONLY;
    }
    if a.nosuid {
        bits |= sys::MOUNT_ATTR_NOSUID;
    }
    if a.nodev {
        bits |= sys::MOUNT_ATTR_NODEV;
    }
    if a.noexec {
        bits |= sys::MOUNT_ATTR_NOEXEC;
    }
    bits
}

/// Copies a regular file of at most `max` bytes, keeping its permission bits (without
/// setuid/setgid/sticky); anything else (gone, not a regular file, too big) is skipped. Raw
/// syscalls on one descriptor each, about half of what `std::fs` spends on a copy: P1 makes
/// a dozen of these for `/etc` on the path to the step's start.
fn copy_small_file(source: &Path, dest: &Path, max: u64) -> SysResult<()> {
    let Some((content, mode)) = read_small_file(source, max) else {
        return Ok(());
    };
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::CLOEXEC;
    let dst = sys::rx(
        rustix::fs::open(dest, flags, Mode::from_raw_mode(mode)),
        || format!("create {}", dest.display()),
    )?;
    sys::write_all_fd(dst.as_raw_fd(), &content)?;
    // The umask may have narrowed the mode at creation; say it exactly.
    sys::rx(rustix::fs::fchmod(&dst, Mode::from_raw_mode(mode)), || {
        format!("chmod {}", dest.display())
    })
}

/// The content and permission bits (0o755 at most) of a regular file of at most `max` bytes;
/// `None` when it is missing, of another kind, or larger (even if it grew while being read).
fn read_small_file(source: &Path, max: u64) -> Option<(Vec<u8>, u32)> {
    let src = rustix::fs::open(source, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let st = rustix::fs::fstat(&src).ok()?;
    let size = u64::try_from(st.st_size).ok()?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || size > max {
        return None;
    }
    let mut buf = vec![0u8; size as usize + 1];
    let mut len = 0;
    loop {
        match rustix::io::read(&src, &mut buf[len..]) {
            Err(Errno::INTR) => continue,
            Ok(0) | Err(_) => break,
            Ok(n) => len += n,
        }
        if len == buf.len() {
            // Grew past its size since the fstat: over the limit, skip it.
            return None;
        }
    }
    buf.truncate(len);
    Some((buf, st.st_mode & 0o755))
}

fn mount_flags(a: MountAttrs) -> libc::c_ulong {
    let mut f = 0;
    if a.readonly {
        f |= libc::MS_RDONLY;
    }
    if a.nosuid {
        f |= libc::MS_NOSUID;
    }
    if a.nodev {
        f |= libc::MS_NODEV;
    }
    if a.noexec {
        f |= libc::MS_NOEXEC;
    }
    f
}

/// Applies attributes to a mount. mount_setattr only adds flags, so flags the kernel locked
/// on a mount inherited from the host are kept; the remount fallback has to repeat them.
fn set_attrs(path: &Path, attrs: MountAttrs, recursive: bool) -> SysResult<()> {
    let bits = attr_bits(attrs);
    if bits == 0 {
        return Ok(());
    }
    match sys::mount_setattr(path, bits, recursive) {
        Err(e) if e.errno == libc::ENOSYS => {
            let st = sys::statvfs(path)?;
            let mut locked: libc::c_ulong = 0;
            for (st_flag, ms_flag) in [
                (libc::ST_NOSUID, libc::MS_NOSUID),
                (libc::ST_NODEV, libc::MS_NODEV),
                (libc::ST_NOEXEC, libc::MS_NOEXEC),
                (libc::ST_NOATIME, libc::MS_NOATIME),
                (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
                (libc::ST_RELATIME, libc::MS_RELATIME),
            ] {
                if st.f_flag & st_flag != 0 {
                    locked |= ms_flag;
                }
            }
            sys::mount(
                None,
                path,
                None,
                libc::MS_REMOUNT | libc::MS_BIND | mount_flags(attrs) | locked,
                None,
            )
        }
        other => other,
    }
}

/// Hides `name` at the top of an overlay whose upper layer is `upper` (not mounted yet): an
/// overlay whiteout there, a 0/0 character device, which any process may make since Linux 5.8
/// (an overlay in a user namespace needs 5.11). What is already there stays: a whiteout from an
/// earlier mount of the same layer, or what a step made in its place then (its own, which it
/// may see again).
fn put_whiteout(upper: &Path, name: &str) -> SysResult<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(SysError {
            op: format!("hide {name:?} in the overlay: not a single name"),
            errno: libc::EINVAL,
        });
    }
    let at = upper.join(name);
    match rustix::fs::mknodat(
        rustix::fs::CWD,
        &at,
        FileType::CharacterDevice,
        Mode::empty(),
        0,
    ) {
        Ok(()) | Err(Errno::EXIST) => Ok(()),
        Err(e) => Err(SysError {
            op: format!(
                "make the whiteout {} (hiding {name} from the workspace)",
                at.display()
            ),
            errno: e.raw_os_error(),
        }),
    }
}

/// The `lowerdir` option's value: the frozen layers (top first), then the lower directory,
/// each escaped.
pub(crate) fn lowerdirs(layers: &[PathBuf], lower: &Path) -> String {
    let mut all: Vec<String> = layers.iter().map(|l| overlay_escape(l)).collect();
    all.push(overlay_escape(lower));
    all.join(":")
}

/// Escapes a path for overlayfs' option parser (`,` separates options, `:` lower layers).
fn overlay_escape(path: &Path) -> String {
    let s = path.to_string_lossy();
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | ',' | ':') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Makes the mount point of a mount op in the root being built (see
/// [`MountOp::mount_point`]); nothing for other ops.
pub fn make_mount_point(op: &MountOp, root: &Path) -> SysResult<()> {
    match op.mount_point() {
        Some((path, TargetKind::Dir, mode)) => mkdir_p(&join(root, path), mode),
        Some((path, TargetKind::File, _)) => touch(&join(root, path)),
        None => Ok(()),
    }
}

/// Carries out one op of the plan in the root being built at `root`. `prepared`: the root is
/// a prepared one ([`crate::plan::RootFs::Prepared`]), whose mount points exist. Also used by
/// the runtime to make a prepared root's files (its `prepared_root`).
pub fn apply(op: &MountOp, root: &Path, prepared: bool) -> SysResult<()> {
    if let MountOp::Bind {
        source,
        optional: true,
        ..
    } = op
    {
        if std::fs::symlink_metadata(source).is_err() {
            return Ok(());
        }
    }
    // A prepared root has every mount point, except one below a tmpfs an earlier op mounted
    // (a repository under /tmp, say, for a worktree or a project below its top): made there.
    let missing = || {
        matches!(op, MountOp::Overlay { path, .. } | MountOp::Bind { path, .. }
            if std::fs::symlink_metadata(join(root, path)).is_err())
    };
    if !prepared || missing() {
        make_mount_point(op, root)?;
    }
    match op {
        MountOp::Dir { path, mode } => mkdir_p(&join(root, path), *mode),
        MountOp::Symlink { path, target } => {
            let at = join(root, path);
            if let Some(parent) = at.parent() {
                mkdir_p(parent, 0o755)?;
            }
            std::os::unix::fs::symlink(target, &at).map_err(|e| SysError {
                op: format!("symlink {}", at.display()),
                errno: e.raw_os_error().unwrap_or(0),
            })
        }
        MountOp::Tmpfs {
            path,
            size_bytes,
            mode,
            attrs,
        } => {
            let at = join(root, path);
            let data = cstring(&format!("mode={mode:o},size={size_bytes}"));
            sys::mount(
                Some(c"tmpfs"),
                &at,
                Some(c"tmpfs"),
                mount_flags(*attrs),
                Some(&data),
            )
        }
        MountOp::Bind {
            source,
            path,
            attrs,
            ..
        } => {
            let at = join(root, path);
            let src = cpath(source);
            sys::mount(Some(&src), &at, None, libc::MS_BIND | libc::MS_REC, None)?;
            set_attrs(&at, *attrs, true)
        }
        MountOp::CopyFile {
            source,
            path,
            max_bytes,
        } => {
            let at = join(root, path);
            if let Some(parent) = at.parent() {
                mkdir_p(parent, 0o755)?;
            }
            copy_small_file(source, &at, *max_bytes)
        }
        MountOp::Rebind {
            path,
            attrs,
            optional,
        } => {
            let at = join(root, path);
            if *optional && std::fs::symlink_metadata(&at).is_err() {
                return Ok(());
            }
            let src = cpath(&at);
            sys::mount(Some(&src), &at, None, libc::MS_BIND | libc::MS_REC, None)?;
            set_attrs(&at, *attrs, true)
        }
        MountOp::Overlay {
            lower,
            layers,
            upper,
            work,
            path,
            attrs,
            hide,
        } => mount_overlay(
            root,
            &lowerdirs(layers, lower),
            upper,
            work,
            path,
            *attrs,
            hide,
        ),
        MountOp::Proc { path } => {
            let at = join(root, path);
            sys::mount(
                Some(c"proc"),
                &at,
                Some(c"proc"),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                None,
            )
        }
        MountOp::Devpts { path } => {
            let at = join(root, path);
            sys::mount(
                Some(c"devpts"),
                &at,
                Some(c"devpts"),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                Some(c"newinstance,ptmxmode=0666,mode=0620"),
            )
        }
        MountOp::Setattr { path, attrs } => set_attrs(&join(root, path), *attrs, false),
    }
}

/// Mounts an overlay of `lower` (upper layer `upper`, its names in `hide` whited out first) at
/// `path` in the root, and checks that the kernel did not fall back to read-only.
fn mount_overlay(
    root: &Path,
    lowerdir: &str,
    upper: &Path,
    work: &Path,
    path: &Path,
    attrs: MountAttrs,
    hide: &[String],
) -> SysResult<()> {
    let at = join(root, path);
    mount_overlay_at(&at, lowerdir, upper, work, attrs, hide)?;
    // A workdir the kernel cannot use makes overlayfs fall back to read-only silently.
    let st = sys::statvfs(&at)?;
    if !attrs.readonly && st.f_flag & libc::ST_RDONLY != 0 {
        return Err(SysError {
            op: format!(
                "overlay at {} was mounted read-only (workdir {} unusable)",
                path.display(),
                work.display()
            ),
            errno: libc::EROFS,
        });
    }
    Ok(())
}

/// Mounts the overlay of `lowerdir` (see [`lowerdirs`]) at `at`: the whiteouts of `hide` put
/// in `upper` first. The mount a sandbox starts with and the one a flip swaps in are made
/// here alike.
pub(crate) fn mount_overlay_at(
    at: &Path,
    lowerdir: &str,
    upper: &Path,
    work: &Path,
    attrs: MountAttrs,
    hide: &[String],
) -> SysResult<()> {
    for name in hide {
        put_whiteout(upper, name)?;
    }
    let options = format!(
        "lowerdir={lowerdir},upperdir={},workdir={},userxattr",
        overlay_escape(upper),
        overlay_escape(work)
    );
    // `volatile` (Linux 5.10): the upper layer is never synced. Without it, the
    // overlay's unmount, when the sandbox's last process exits, syncs the whole file
    // system the upper layer is on (`sync_filesystem` of the host's disk, whatever
    // else is dirty there) on the way to cleanup. The layer is thrown away after
    // collect, which reads it through the page cache, so a crash can lose nothing it
    // would have kept. A kernel without the option refuses it (EINVAL): mounted
    // without it then.
    let mount = |data: &str| {
        sys::mount(
            Some(c"overlay"),
            at,
            Some(c"overlay"),
            mount_flags(attrs),
            Some(&cstring(data)),
        )
    };
    match mount(&format!("{options},volatile")) {
        Err(e) if e.errno == libc::EINVAL => mount(&options),
        other => other,
    }
}
