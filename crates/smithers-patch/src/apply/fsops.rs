//! File operations beneath the root: create, link, sync, read, list, remove.

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use smithers_paths::{Beneath, EntryKind};

use super::content::{Content, WriteError};
use super::paths::{io_error, p, path_error, split_parent};
use crate::error::{Conflict, PatchError};

pub(super) const ENOTDIR: i32 = 20;
pub(super) const EEXIST: i32 = 17;

/// Whether a write is flushed on its own (`fsync`) or by a later [`sync_fs`] of the batch.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Durability {
    Fsync,
    Batched,
}

pub(super) fn write_file_beneath(
    b: &Beneath,
    rel: &str,
    content: &[u8],
    perms: u32,
    owner: Option<(u32, u32)>,
    durability: Durability,
) -> Result<(), PatchError> {
    let held = Content::Held(content.to_vec());
    write_content_beneath(b, rel, &held, perms, owner, durability)
}

/// Creates `rel` with `content` (a large one written as it is made, and checked: one that is
/// no longer what was planned is a conflict).
pub(super) fn write_content_beneath(
    b: &Beneath,
    rel: &str,
    content: &Content,
    perms: u32,
    owner: Option<(u32, u32)>,
    durability: Durability,
) -> Result<(), PatchError> {
    let mut f = b
        .create_new(&p(rel), 0o600)
        .map_err(|e| path_error(rel, "create", e))?;
    content.write_to(&mut f).map_err(|e| match e {
        WriteError::Io(e) => io_error(rel, "write", e),
        WriteError::Changed(reason) => PatchError::Conflicts {
            conflicts: vec![Conflict {
                path: rel.to_string(),
                reason,
            }],
        },
    })?;
    if let Some((uid, gid)) = owner {
        let me = (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        );
        if me.0 == 0 && me != (uid, gid) {
            // Best effort: keep the file's owner when root applies into a user's tree.
            let _ = rustix::fs::fchown(
                &f,
                Some(rustix::process::Uid::from_raw(uid)),
                Some(rustix::process::Gid::from_raw(gid)),
            );
        }
    }
    // Explicit chmod after creation: the create mode is filtered by the umask.
    f.set_permissions(std::fs::Permissions::from_mode(perms))
        .map_err(|e| io_error(rel, "chmod", e))?;
    if durability == Durability::Fsync {
        f.sync_all().map_err(|e| io_error(rel, "fsync", e))?;
    }
    Ok(())
}

/// A directory descriptor for `*at` calls: the (trusted) root itself, or a directory reached
/// beneath it without following any symlink.
pub(super) fn dir_fd(b: &Beneath, root: &Path, dir: &str) -> Result<File, PatchError> {
    if dir.is_empty() {
        File::open(root).map_err(|e| io_error(".", "open root", e))
    } else {
        b.open_read(&p(dir))
            .map_err(|e| path_error(dir, "open directory", e))
    }
}

/// Hard-links `src` to `dst` (both beneath the root; the final name is not followed). Returns
/// false when the filesystem cannot (other device, no hard links): the caller then copies.
pub(super) fn try_link(b: &Beneath, root: &Path, src: &str, dst: &str) -> Result<bool, PatchError> {
    let (sd, sn) = split_parent(src);
    let (dd, dn) = split_parent(dst);
    let s = dir_fd(b, root, &sd)?;
    let d = dir_fd(b, root, &dd)?;
    match rustix::fs::linkat(&s, &sn, &d, &dn, rustix::fs::AtFlags::empty()) {
        Ok(()) => Ok(true),
        Err(
            rustix::io::Errno::XDEV
            | rustix::io::Errno::PERM
            | rustix::io::Errno::MLINK
            | rustix::io::Errno::OPNOTSUPP,
        ) => Ok(false),
        Err(e) => Err(io_error(src, "link backup", e.into())),
    }
}

/// Flushes the whole filesystem holding `dir` (`syncfs`): one barrier for a batch of staged
/// files or renames instead of one `fsync` per file and directory. Every entry an apply
/// touches is on this filesystem: staged files are renamed into place, which only succeeds
/// within one filesystem.
pub(super) fn sync_fs(b: &Beneath, dir: &str) -> Result<(), PatchError> {
    let f = b
        .open_read(&p(dir))
        .map_err(|e| path_error(dir, "open directory", e))?;
    rustix::fs::syncfs(&f).map_err(|e| io_error(dir, "syncfs", e.into()))
}

/// A host file's content (a large one hashed where it lies, kept open) and its metadata.
pub(super) fn read_file_beneath(
    b: &Beneath,
    rel: &str,
) -> Result<(Content, std::fs::Metadata), PatchError> {
    let f = b
        .open_read(&p(rel))
        .map_err(|e| path_error(rel, "open", e))?;
    let md = f.metadata().map_err(|e| io_error(rel, "stat", e))?;
    let content = Content::of_host_file(f).map_err(|e| io_error(rel, "read", e))?;
    Ok((content, md))
}

/// Lists a directory beneath the root (raw names only, without `.`/`..`), sorted.
pub(super) fn list_dir(
    b: &Beneath,
    rel: &str,
) -> Result<Vec<(Vec<u8>, rustix::fs::FileType)>, PatchError> {
    let f = b
        .open_read(&p(rel))
        .map_err(|e| path_error(rel, "open directory", e))?;
    let dir =
        rustix::fs::Dir::read_from(&f).map_err(|e| io_error(rel, "read directory", e.into()))?;
    let mut out = Vec::new();
    for entry in dir {
        let entry = entry.map_err(|e| io_error(rel, "read directory", e.into()))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        out.push((name.to_vec(), entry.file_type()));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

pub(super) fn exists(b: &Beneath, rel: &str) -> bool {
    matches!(b.metadata(&p(rel)), Ok(Some(_)))
}

pub(super) fn remove_if_exists(b: &Beneath, rel: &str) -> Result<(), PatchError> {
    match b.metadata(&p(rel)) {
        Ok(Some(m)) if m.kind == EntryKind::Dir => Ok(()),
        Ok(Some(_)) => b
            .remove_file(&p(rel))
            .map_err(|e| path_error(rel, "remove", e)),
        Ok(None) => Ok(()),
        Err(e) => Err(path_error(rel, "stat", e)),
    }
}
