//! Whether an overlay workspace can work for a project: overlayfs in a user namespace copies
//! a file up (at its first write) under the file's own owner and group, and the sandbox's user
//! namespace maps only the runtime's ids. A file of another uid or gid (root running on a
//! user's checkout, a user on a tarball extracted as root, a shared group directory) shows as
//! `nobody` inside: writing it fails with EACCES, copying it up with EOVERFLOW, and the step
//! would end with part of its work silently missing. So the tree is checked before an overlay
//! is chosen, and `auto` takes a copy instead (whose files all belong to the runtime's uid).

use std::path::{Path, PathBuf};

/// An entry of the project not owned by the runtime's ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ForeignEntry {
    /// Relative to the project.
    pub path: PathBuf,
    pub uid: u32,
    pub gid: u32,
}

impl ForeignEntry {
    pub fn describe(&self, uid: u32, gid: u32) -> String {
        format!(
            "{} belongs to uid {} gid {} (the sandbox maps only uid {uid} gid {gid}): an overlay could not copy it up for writing",
            self.path.display(),
            self.uid,
            self.gid
        )
    }
}

/// The first entry below `root` (never following a symlink; the top-level `.smithers` and
/// `.git`, which the sandbox sees read-only or not at all, left out) whose owner is not `uid`
/// or whose group is not `gid`. Unreadable directories are reported as foreign too: an
/// overlay could not copy them up either.
pub(crate) fn first_foreign(root: &Path, uid: u32, gid: u32) -> Option<ForeignEntry> {
    use std::os::unix::fs::MetadataExt;
    let mut dirs: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&rel)) else {
            // A directory we cannot list: its owner is the reason (or it vanished).
            let md = std::fs::symlink_metadata(root.join(&rel)).ok()?;
            return Some(ForeignEntry {
                path: rel,
                uid: md.uid(),
                gid: md.gid(),
            });
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if rel.as_os_str().is_empty() && (name == ".smithers" || name == ".git") {
                continue;
            }
            // DirEntry::metadata is an lstat relative to the open directory.
            let Ok(md) = entry.metadata() else { continue };
            let path = rel.join(&name);
            if md.uid() != uid || md.gid() != gid {
                return Some(ForeignEntry {
                    path,
                    uid: md.uid(),
                    gid: md.gid(),
                });
            }
            if md.is_dir() {
                dirs.push(path);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_tree_of_one_owner_is_not_foreign() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/c"), "x").unwrap();
        let md = std::fs::metadata(dir.path()).unwrap();
        assert_eq!(first_foreign(dir.path(), md.uid(), md.gid()), None);
        let other = first_foreign(dir.path(), md.uid() + 1, md.gid()).unwrap();
        assert_eq!(other.uid, md.uid());
    }

    #[test]
    fn smithers_and_git_are_left_out_and_deep_entries_found() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("SKIP chown to another uid needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        for d in [".smithers", ".git", "src/deep"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        std::os::unix::fs::chown(dir.path().join(".git"), Some(1234), None).unwrap();
        std::os::unix::fs::chown(dir.path().join(".smithers"), Some(1234), None).unwrap();
        let md = std::fs::metadata(dir.path()).unwrap();
        assert_eq!(first_foreign(dir.path(), md.uid(), md.gid()), None);
        std::fs::write(dir.path().join("src/deep/f"), "x").unwrap();
        std::os::unix::fs::chown(dir.path().join("src/deep/f"), None, Some(4321)).unwrap();
        let found = first_foreign(dir.path(), md.uid(), md.gid()).unwrap();
        assert_eq!(found.path, Path::new("src/deep/f"));
        assert_eq!(found.gid, 4321);
    }
}
