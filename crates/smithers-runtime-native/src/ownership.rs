//! Files of other owners under an overlay workspace, at a cost set by what a step changes,
//! never by what the project holds.
//!
//! **What fails.** overlayfs in a user namespace copies a file up (at its first write) under
//! the file's own owner and group, and the sandbox's user namespace maps only the runtime's
//! ids. A file or directory of another uid or gid (root running on a user's checkout, a user
//! on a tarball extracted as root, a root-owned `node_modules` from `sudo npm install`) shows
//! as `nobody` inside. Reading it works as its mode allows. Changing it fails, in one of two
//! ways: where its mode refuses the runtime's uid, the permission check refuses the write
//! (EACCES: what an unprivileged runtime gets on the host too; the step, root in the sandbox,
//! holds no capability that could override it); where its mode would allow the write
//! (group- or world-writable), the copy-up does (EOVERFLOW: the kernel will not copy up a file
//! whose owner the namespace cannot name), and a new entry in such a directory fails the same
//! way. A copy workspace has none of this: the copy belongs to the runtime's uid.
//!
//! **Why not check every entry before the step.** That was done: a run over a 100k-file tree
//! then made ~100,000 `statx` calls before the step started (7.7 times the cost of the same
//! change on 1k files), and no cheap key can stand for its verdict: a `chown` changes only
//! the file's own ctime, not its directory's, so no cache keyed by directories (or by the
//! project's root) would notice one, and the kernel offers no change counter for a tree.
//! Mapping more ids would not help either: an ordinary user can map only its own, and root
//! mapping the owners would still leave the step, which has no capabilities, outside their
//! modes.
//!
//! **What is checked instead.**
//! - At create, the project's top directory ([`root_foreign`], one `lstat`): a tree another
//!   uid owns as a whole (the two common cases above) makes `auto` take a copy, saying why,
//!   and an explicit `overlay` is refused, as before.
//! - At collect, beside what the step changed ([`foreign_beside_changes`]): the lower entries
//!   of every directory of the upper layer (the directories the step wrote into, and their
//!   parents). A failed copy-up is always among them: the kernel copies up an entry's
//!   directories, top down, before the entry itself, so the directory of every entry whose
//!   copy-up was refused (EOVERFLOW) is in the upper layer when the step ends. Each found is
//!   named in the bundle's log with the fix (`--workspace copy`), so a change lost that way is
//!   never silent. A write refused by the permission check copies nothing up and leaves no
//!   trace; it is refused as the host would refuse it to an unprivileged runtime, the step saw
//!   EACCES, and when it sits beside something else the step changed it is named too.
//!   This costs the entries of the changed directories, not the tree: the same one-file change
//!   reads 104 entries' owners on a 200-file tree and 302 on a 20,000-file one, whose `src/`
//!   holds 200 directories (`tests/ownership_cost.rs`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Entries whose owner this module read, in this process (see [`entries_read`]).
static ENTRIES_READ: AtomicU64 = AtomicU64::new(0);

/// How many entries' owners this module has read in this process: what a test compares
/// between trees of different sizes to hold a run to costing what it changes.
pub fn entries_read() -> u64 {
    ENTRIES_READ.load(Ordering::Relaxed)
}

/// At most this many entries of other owners are named per collect; the log says how many
/// more there were.
const MAX_NAMED: usize = 20;

/// An entry of the project not owned by the runtime's ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ForeignEntry {
    /// Relative to the project (empty: the project itself).
    pub path: PathBuf,
    pub uid: u32,
    pub gid: u32,
}

impl ForeignEntry {
    pub fn describe(&self, uid: u32, gid: u32) -> String {
        let path = if self.path.as_os_str().is_empty() {
            "the project's top directory".to_string()
        } else {
            self.path.display().to_string()
        };
        format!(
            "{path} belongs to uid {} gid {} (the sandbox maps only uid {uid} gid {gid}): an overlay could not copy it up for writing",
            self.uid, self.gid
        )
    }
}

fn foreign(rel: PathBuf, md: &std::fs::Metadata, uid: u32, gid: u32) -> Option<ForeignEntry> {
    use std::os::unix::fs::MetadataExt;
    ENTRIES_READ.fetch_add(1, Ordering::Relaxed);
    (md.uid() != uid || md.gid() != gid).then(|| ForeignEntry {
        path: rel,
        uid: md.uid(),
        gid: md.gid(),
    })
}

/// The project's top directory, when another uid or gid owns it (or it cannot be read: the
/// overlay could not use it either). One `lstat`; see the module docs for why no more.
pub(crate) fn root_foreign(root: &Path, uid: u32, gid: u32) -> Option<ForeignEntry> {
    match std::fs::symlink_metadata(root) {
        Ok(md) => foreign(PathBuf::new(), &md, uid, gid),
        Err(_) => Some(ForeignEntry {
            path: PathBuf::new(),
            uid: u32::MAX,
            gid: u32::MAX,
        }),
    }
}

/// Whether `path`, a directory of an overlay's upper layer mounted with `userxattr`, is
/// opaque (the step removed and remade it: nothing below it comes from the lower layer).
fn is_opaque(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let mut value = [0u8; 2];
    // SAFETY: `c` is a valid NUL-terminated path and the name a NUL-terminated literal;
    // lgetxattr writes at most `value.len()` bytes into `value`.
    let n = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            c"user.overlay.opaque".as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    n == 1 && value[0] == b'y'
}

/// The lower entries of other owners beside what a step changed (see the module docs): for
/// each directory of the upper layer `upper` that is not opaque, the entries of the same
/// directory of the project `lower`. The top-level names the step never sees
/// ([`crate::plan::HIDDEN_TOP_LEVEL`]) are left out. Never follows a symlink. Returns at
/// most [`MAX_NAMED`] entries and how many were found in all.
pub(crate) fn foreign_beside_changes(
    lower: &Path,
    upper: &Path,
    uid: u32,
    gid: u32,
) -> (Vec<ForeignEntry>, usize) {
    let hidden = |rel: &Path, name: &std::ffi::OsStr| {
        rel.as_os_str().is_empty() && crate::plan::HIDDEN_TOP_LEVEL.iter().any(|h| name == *h)
    };
    let (mut named, mut total) = (Vec::new(), 0usize);
    let mut dirs: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        let Ok(changed) = std::fs::read_dir(upper.join(&rel)) else {
            continue;
        };
        for entry in changed.flatten() {
            let name = entry.file_name();
            // DirEntry::file_type does not follow a symlink.
            if entry.file_type().is_ok_and(|t| t.is_dir())
                && !hidden(&rel, &name)
                && !is_opaque(&entry.path())
            {
                dirs.push(rel.join(&name));
            }
        }
        let Ok(beside) = std::fs::read_dir(lower.join(&rel)) else {
            continue;
        };
        for entry in beside.flatten() {
            let name = entry.file_name();
            if hidden(&rel, &name) {
                continue;
            }
            // DirEntry::metadata is an lstat relative to the open directory.
            let Ok(md) = entry.metadata() else { continue };
            if let Some(found) = foreign(rel.join(&name), &md, uid, gid) {
                total += 1;
                if named.len() < MAX_NAMED {
                    named.push(found);
                }
            }
        }
    }
    named.sort_by(|a, b| a.path.cmp(&b.path));
    (named, total)
}

/// The bundle log's notes for [`foreign_beside_changes`] of a sandbox run by this process's
/// ids: nothing when every entry beside the step's changes is the runtime's.
pub(crate) fn notes_beside_changes(lower: &Path, upper: &Path) -> Vec<String> {
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let (named, total) = foreign_beside_changes(lower, upper, uid, gid);
    if total == 0 {
        return Vec::new();
    }
    let mut notes = vec![format!(
        "files of other owners beside the step's changes ({total}): the overlay workspace could not change them (a write was refused with EACCES, or with EOVERFLOW where their mode allowed it, and a change the step made that way is missing from the patches); run the step again with --workspace copy, whose copy is the runtime's, or as the files' owner"
    )];
    notes.extend(named.iter().map(|f| f.describe(uid, gid)));
    if total > named.len() {
        notes.push(format!(
            "... and {} more files of other owners",
            total - named.len()
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn only_the_top_directory_is_read_at_create() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/c"), "x").unwrap();
        let md = std::fs::metadata(dir.path()).unwrap();
        let before = entries_read();
        assert_eq!(root_foreign(dir.path(), md.uid(), md.gid()), None);
        let other = root_foreign(dir.path(), md.uid() + 1, md.gid()).unwrap();
        assert_eq!(other.uid, md.uid());
        assert!(other
            .describe(md.uid() + 1, md.gid())
            .starts_with("the project's top"));
        // Other tests of this process may read entries meanwhile: at least these two.
        assert!(entries_read() >= before + 2);
        assert!(root_foreign(&dir.path().join("missing"), 0, 0).is_some());
    }

    #[test]
    fn entries_beside_changed_directories_are_read_and_others_are_not() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            smithers_test_support::skip_optional("chown to another uid needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
        for d in ["src/a", "src/b", "untouched/deep", ".smithers"] {
            std::fs::create_dir_all(lower.join(d)).unwrap();
        }
        for f in [
            "src/a/mine",
            "src/a/theirs",
            "src/b/theirs",
            "untouched/deep/theirs",
        ] {
            std::fs::write(lower.join(f), "x").unwrap();
        }
        for f in [
            "src/a/theirs",
            "src/b/theirs",
            "untouched/deep/theirs",
            ".smithers",
        ] {
            std::os::unix::fs::chown(lower.join(f), Some(4321), None).unwrap();
        }
        // The step changed src/a/mine: src and src/a are in the upper layer.
        std::fs::create_dir_all(upper.join("src/a")).unwrap();
        std::fs::write(upper.join("src/a/mine"), "y").unwrap();
        let md = std::fs::metadata(&lower).unwrap();
        let (named, total) = foreign_beside_changes(&lower, &upper, md.uid(), md.gid());
        // src/a/theirs is beside the change; src/b/theirs and untouched/ are not read.
        assert_eq!(total, 1, "{named:?}");
        assert_eq!(named[0].path, Path::new("src/a/theirs"));
        assert_eq!(named[0].uid, 4321);
        // A foreign directory beside a change is named itself (a new file in it failed).
        std::os::unix::fs::chown(lower.join("src/b"), Some(4321), None).unwrap();
        let (named, total) = foreign_beside_changes(&lower, &upper, md.uid(), md.gid());
        assert_eq!(total, 2);
        assert_eq!(named[1].path, Path::new("src/b"));
    }
}
