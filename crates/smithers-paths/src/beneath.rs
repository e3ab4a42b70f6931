//! File operations beneath a root directory that cannot be redirected outside it.
//!
//! Each operation resolves the *parent* of its target through the kernel with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` relative to a
//! descriptor of the root held open for the lifetime of [`Beneath`], then acts on the final
//! name with a `*at` call that does not follow a symlink there either (`O_NOFOLLOW`,
//! `unlinkat`, `renameat`, `symlinkat`, `mkdirat`). No symlink is ever traversed, inside the
//! root or out: the trees we write into (a project being patched, a bundle being unpacked) are
//! ones an untrusted step could have shaped, and "points inside today" is no guarantee.
//!
//! On kernels without `openat2` (before 5.6, or where seccomp hides it) the parent is reached
//! by a walk of `openat(O_PATH | O_DIRECTORY | O_NOFOLLOW)`, one component at a time, which
//! gives the same guarantee at the cost of one syscall per component.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::lexical::relative_components;
use crate::PathError;

/// Set once we learn the kernel has no `openat2`, so we stop asking.
static OPENAT2_MISSING: AtomicBool = AtomicBool::new(false);

/// Makes every later operation in this process use the `O_NOFOLLOW` walk instead of
/// `openat2`, as on a kernel before 5.6. For tests of that path; both give the same guarantee.
#[doc(hidden)]
pub fn force_component_walk() {
    OPENAT2_MISSING.store(true, Ordering::Relaxed);
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// What kind of entry a path names (never following a final symlink).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// `lstat` of an entry beneath the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryMeta {
    pub kind: EntryKind,
    /// Permission bits (`0o7777` part of `st_mode`).
    pub mode: u32,
    pub size: u64,
}

/// An open root directory; every path given to its methods is relative to it and confined to
/// it. Paths must be plain downward paths (no `..`, not absolute): see
/// [`crate::relative_components`].
#[derive(Debug)]
pub struct Beneath {
    root: OwnedFd,
    root_path: PathBuf,
}

impl Beneath {
    /// Opens `root` (which is trusted: symlinks in *its* path are followed).
    pub fn open(root: &Path) -> Result<Self, PathError> {
        let fd = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| PathError::io("open root directory", root.display().to_string(), e.into()))?;
        Ok(Beneath {
            root: fd,
            root_path: root.to_path_buf(),
        })
    }

    /// The path the root was opened at (for messages).
    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// Opens an existing regular file for reading.
    pub fn open_read(&self, rel: &Path) -> Result<File, PathError> {
        let (parent, name) = self.parent_of(rel)?;
        let fd = rustix::fs::openat(
            &parent,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| self.err("open", rel, e))?;
        Ok(File::from(fd))
    }

    /// Reads `rel` whole if it is a regular file of at most `max` bytes: `Ok(None)` when it is
    /// anything else (a directory, a device, a fifo: opened without blocking, never read) or
    /// larger, also if it grew past `max` while read. For files an untrusted step left behind.
    pub fn read_regular(&self, rel: &Path, max: u64) -> Result<Option<Vec<u8>>, PathError> {
        use std::io::Read;
        let (parent, name) = self.parent_of(rel)?;
        let fd = rustix::fs::openat(
            &parent,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| self.err("open", rel, e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| self.err("stat", rel, e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_size as u64 > max {
            return Ok(None);
        }
        let mut buf = Vec::with_capacity(st.st_size as usize);
        File::from(fd)
            .take(max + 1)
            .read_to_end(&mut buf)
            .map_err(|e| PathError::io("read", rel.display().to_string(), e))?;
        Ok((buf.len() as u64 <= max).then_some(buf))
    }

    /// Creates a new file (it must not exist; parents must) for writing, with `mode`.
    pub fn create_new(&self, rel: &Path, mode: u32) -> Result<File, PathError> {
        let (parent, name) = self.parent_of(rel)?;
        let fd = rustix::fs::openat(
            &parent,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
        .map_err(|e| self.err("create", rel, e))?;
        Ok(File::from(fd))
    }

    /// Creates every missing directory of `rel` (like `mkdir -p`), refusing to pass through a
    /// symlink or a non-directory.
    pub fn create_dir_all(&self, rel: &Path, mode: u32) -> Result<(), PathError> {
        let parts = relative_components(rel)?;
        let mut current = rustix::io::dup(&self.root).map_err(|e| self.err("open", rel, e))?;
        for part in parts {
            match rustix::fs::mkdirat(&current, part, Mode::from_raw_mode(mode)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(self.err("create directory", rel, e)),
            }
            current = match rustix::fs::openat(
                &current,
                part,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                // O_NOFOLLOW|O_DIRECTORY on a symlink says ENOTDIR: report it as the escape
                // attempt it is, not as a confusing "not a directory".
                Err(Errno::NOTDIR) if is_symlink_at(&current, part) => {
                    return Err(self.err("open directory", rel, Errno::LOOP))
                }
                Err(e) => return Err(self.err("open directory", rel, e)),
            };
        }
        Ok(())
    }

    /// Renames `from` to `to` (both beneath the root), replacing a file at `to` atomically.
    pub fn rename(&self, from: &Path, to: &Path) -> Result<(), PathError> {
        let (from_parent, from_name) = self.parent_of(from)?;
        let (to_parent, to_name) = self.parent_of(to)?;
        rustix::fs::renameat(&from_parent, from_name, &to_parent, to_name)
            .map_err(|e| self.err("rename", from, e))
    }

    /// Removes a file or symlink (never what a symlink points at).
    pub fn remove_file(&self, rel: &Path) -> Result<(), PathError> {
        let (parent, name) = self.parent_of(rel)?;
        rustix::fs::unlinkat(&parent, name, AtFlags::empty())
            .map_err(|e| self.err("remove", rel, e))
    }

    /// Removes an empty directory.
    pub fn remove_dir(&self, rel: &Path) -> Result<(), PathError> {
        let (parent, name) = self.parent_of(rel)?;
        rustix::fs::unlinkat(&parent, name, AtFlags::REMOVEDIR)
            .map_err(|e| self.err("remove directory", rel, e))
    }

    /// Creates a symlink at `rel` whose content is `target`. The target is stored, never
    /// resolved: creating a link to `/etc/passwd` is harmless as long as nobody follows it,
    /// and nothing in this type does.
    pub fn symlink(&self, target: &Path, rel: &Path) -> Result<(), PathError> {
        let (parent, name) = self.parent_of(rel)?;
        rustix::fs::symlinkat(target, &parent, name).map_err(|e| self.err("create symlink", rel, e))
    }

    /// Reads the content of the symlink at `rel`.
    pub fn read_link(&self, rel: &Path) -> Result<PathBuf, PathError> {
        let (parent, name) = self.parent_of(rel)?;
        let target = rustix::fs::readlinkat(&parent, name, Vec::new())
            .map_err(|e| self.err("read link", rel, e))?;
        Ok(PathBuf::from(
            <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(target.into_bytes()),
        ))
    }

    /// `lstat` of `rel`; `Ok(None)` when it does not exist (including a missing parent).
    pub fn metadata(&self, rel: &Path) -> Result<Option<EntryMeta>, PathError> {
        let (parent, name) = match self.parent_of(rel) {
            Ok(found) => found,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => {
                let kind = match FileType::from_raw_mode(st.st_mode) {
                    FileType::RegularFile => EntryKind::File,
                    FileType::Directory => EntryKind::Dir,
                    FileType::Symlink => EntryKind::Symlink,
                    _ => EntryKind::Other,
                };
                Ok(Some(EntryMeta {
                    kind,
                    mode: st.st_mode & 0o7777,
                    size: st.st_size as u64,
                }))
            }
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(self.err("stat", rel, e)),
        }
    }

    /// Sets the permission bits of a regular file or directory (refuses a symlink).
    pub fn set_mode(&self, rel: &Path, mode: u32) -> Result<(), PathError> {
        let (parent, name) = self.parent_of(rel)?;
        let fd = rustix::fs::openat(
            &parent,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| self.err("open", rel, e))?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| self.err("chmod", rel, e))
    }

    /// Flushes the directory containing `rel` (after renames, for crash safety).
    pub fn sync_parent(&self, rel: &Path) -> Result<(), PathError> {
        let dir = self.open_parent(rel)?;
        rustix::fs::fsync(&dir).map_err(|e| self.err("sync directory of", rel, e))
    }

    /// Opens the directory containing `rel` for reading (an fsync-able descriptor), without
    /// following any symlink.
    pub fn open_parent(&self, rel: &Path) -> Result<OwnedFd, PathError> {
        let (parent, _) = self.parent_of(rel)?;
        // An O_PATH descriptor cannot be fsync'd: reopen the directory for reading.
        rustix::fs::openat(
            &parent,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| self.err("open directory", rel, e))
    }

    /// Opens the parent directory of `rel` without following any symlink, and returns it with
    /// the final component.
    fn parent_of<'p>(&self, rel: &'p Path) -> Result<(OwnedFd, &'p OsStr), PathError> {
        let mut parts = relative_components(rel)?;
        let name = parts
            .pop()
            .expect("relative_components returns at least one part");
        let parent_fd = if parts.is_empty() {
            rustix::io::dup(&self.root).map_err(|e| self.err("open", rel, e))?
        } else {
            let parent: PathBuf = parts.iter().collect();
            self.open_dir_beneath(&parent)
                .map_err(|e| self.err("open parent of", rel, e))?
        };
        Ok((parent_fd, name))
    }

    fn open_dir_beneath(&self, rel: &Path) -> Result<OwnedFd, Errno> {
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        if !OPENAT2_MISSING.load(Ordering::Relaxed) {
            match rustix::fs::openat2(&self.root, rel, flags, Mode::empty(), RESOLVE) {
                Err(Errno::NOSYS) | Err(Errno::PERM) if probe_openat2_missing() => {
                    OPENAT2_MISSING.store(true, Ordering::Relaxed);
                }
                other => return other,
            }
        }
        // Fallback: one component at a time, never following a symlink.
        let mut current = rustix::io::dup(&self.root)?;
        for part in rel.components() {
            let next = match rustix::fs::openat(
                current.as_fd(),
                part.as_os_str(),
                flags | OFlags::NOFOLLOW,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                Err(Errno::NOTDIR) if is_symlink_at(&current, part.as_os_str()) => {
                    return Err(Errno::LOOP)
                }
                Err(e) => return Err(e),
            };
            current = next;
            // O_PATH|O_NOFOLLOW on a symlink opens the link itself; O_DIRECTORY makes that
            // ENOTDIR, but check the type anyway rather than rely on that subtlety.
            let st = rustix::fs::fstat(&current)?;
            if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                return Err(Errno::NOTDIR);
            }
        }
        Ok(current)
    }

    fn err(&self, operation: &'static str, rel: &Path, errno: Errno) -> PathError {
        // ELOOP: a symlink was met where none may be; EXDEV: RESOLVE_BENEATH saw an escape.
        if errno == Errno::LOOP || errno == Errno::XDEV {
            return PathError::EscapeViaSymlink {
                path: rel.display().to_string(),
                root: self.root_path.display().to_string(),
            };
        }
        PathError::io(operation, rel.display().to_string(), errno.into())
    }
}

/// Distinguishes "openat2 does not exist here" (ENOSYS, or EPERM from a seccomp filter that
/// hides it) from a real ENOSYS/EPERM about the path, by asking for something trivially valid.
fn probe_openat2_missing() -> bool {
    matches!(
        rustix::fs::openat2(
            rustix::fs::CWD,
            ".",
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::empty()
        ),
        Err(Errno::NOSYS) | Err(Errno::PERM)
    )
}

fn is_symlink_at(dir: &OwnedFd, name: &OsStr) -> bool {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink)
}
