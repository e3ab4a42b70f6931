//! Prepared roots: the part of a sandbox's root that is the same for every sandbox of a host
//! (the `/etc` copies, the merged-/usr and `/dev` symlinks, and the mount point of every
//! mount), made once in a directory of the state root. Each sandbox's init binds it as its
//! root and only mounts (see [`crate::plan::RootFs::Prepared`]). Measured here: building the
//! ~50-entry root on a fresh tmpfs took P1 about 0.75 ms of a 6 ms cold start; the dozen copies
//! and symlinks and the mount points of a prepared root are made once per host configuration.
//!
//! A prepared root is named by a hash of everything it holds: the plan's file operations, the
//! mount points, and the identity (device, inode, size, modification and change times) of each
//! host file it copies. An edited `/etc/resolv.conf` thus gives a new root at the next
//! execute, as the per-sandbox copies did. It is built under a temporary name and renamed into
//! place, so a root under its final name is complete; builders racing for the same name
//! (threads, processes sharing the state root) lose nothing. Once in place its content is
//! never written again (each sandbox binds it read-only); each use stamps its modification
//! time. Sandboxes already running keep the root they started with. When a new root is made
//! (a file changed), the others go if no mount of any process uses them and none was used
//! for [`UNUSED_FOR`] (a runtime of another build may still be using its own), so that a
//! host whose `/etc/resolv.conf` is rewritten every hour does not pile up roots.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::plan::{MountOp, PLAN_VERSION};

/// Prefix of prepared roots in the state root (a dot: not a sandbox's state directory).
pub(crate) const PREFIX: &str = ".root-";

/// Prefix of a root being built.
const BUILDING: &str = ".building.root-";

/// How long a prepared root must have gone unused before another's making removes it.
pub(crate) const UNUSED_FOR: Duration = Duration::from_secs(600);

/// The prepared root holding `files` (the plan's file operations) and the mount points of
/// `mounts`, made if it does not exist yet. Returns its path.
pub(crate) fn ensure(
    state_root: &Path,
    files: &[MountOp],
    mounts: &[MountOp],
) -> std::io::Result<PathBuf> {
    let dir = state_root.join(format!("{PREFIX}{:016x}", key(files, mounts)));
    // Stamping the use is also the existence check: one syscall on the common path.
    if stamp(&dir) {
        return Ok(dir);
    }
    static BUILDS: AtomicU64 = AtomicU64::new(0);
    let tmp = state_root.join(format!(
        "{BUILDING}{}-{}",
        std::process::id(),
        BUILDS.fetch_add(1, Ordering::Relaxed)
    ));
    let placed = build(&tmp, files, mounts).and_then(|()| std::fs::rename(&tmp, &dir));
    match placed {
        Ok(()) => {
            sweep(state_root, &dir, UNUSED_FOR);
            Ok(dir)
        }
        // Another builder placed the same root first (rename onto a non-empty directory).
        Err(_) if dir.is_dir() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(dir)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// The prepared root holding `files` and the mount points of `mounts` when it exists (and is
/// stamped as used): a key and one syscall, cheap enough for an async worker. `None`: it
/// must be made ([`ensure`], on a blocking thread).
pub(crate) fn existing(
    state_root: &Path,
    files: &[MountOp],
    mounts: &[MountOp],
) -> Option<PathBuf> {
    let dir = state_root.join(format!("{PREFIX}{:016x}", key(files, mounts)));
    stamp(&dir).then_some(dir)
}

/// Sets `dir`'s times to now; false when it does not exist (or cannot be stamped, in which
/// case it is made again).
fn stamp(dir: &Path) -> bool {
    let path = smithers_sandbox_init::sys::cpath(dir);
    // SAFETY: utimensat with a valid C string and a null `times` (meaning now).
    unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), std::ptr::null(), 0) == 0 }
}

/// Removes the prepared roots of `state_root` but `keep` that no mount uses and that were
/// last used `unused_for` ago or more, and builds left behind as long ago by a crash.
fn sweep(state_root: &Path, keep: &Path, unused_for: Duration) {
    let Ok(entries) = std::fs::read_dir(state_root) else {
        return;
    };
    let now = std::time::SystemTime::now();
    let old: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let ours = name.starts_with(PREFIX) || name.starts_with(BUILDING);
            let idle = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age >= unused_for);
            ours && idle && e.path() != keep
        })
        .map(|e| e.path())
        .collect();
    if old.is_empty() {
        return;
    }
    let mounted = mounted_roots();
    for dir in old {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.is_some_and(|n| mounted.contains(&n)) {
            continue;
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The names of the prepared roots that some mount, in any mount namespace this process can
/// see, has as its root (a sandbox binds its root from one).
fn mounted_roots() -> std::collections::HashSet<String> {
    let mut found = std::collections::HashSet::new();
    let mut namespaces = std::collections::HashSet::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in procs.flatten() {
        let pid = entry.file_name();
        if !pid.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // One read per mount namespace.
        let ns = std::fs::read_link(entry.path().join("ns/mnt")).ok();
        if ns.as_ref().is_some_and(|ns| !namespaces.insert(ns.clone())) {
            continue;
        }
        if let Ok(text) = std::fs::read_to_string(entry.path().join("mountinfo")) {
            found.extend(roots_in_mountinfo(&text));
        }
    }
    found
}

/// The prepared-root names among the mount roots (fourth field) of a mountinfo text.
fn roots_in_mountinfo(text: &str) -> impl Iterator<Item = String> + '_ {
    text.lines().filter_map(|line| {
        let root = line.split(' ').nth(3)?;
        let name = root.rsplit('/').next()?;
        name.starts_with(PREFIX).then(|| name.to_string())
    })
}

/// FNV-1a over the plan version, the ops and the copied files' identities: stable across
/// processes and builds of the same version, which is all a name in the state root needs.
fn key(files: &[MountOp], mounts: &[MountOp]) -> u64 {
    let mut hash = Fnv(0xcbf2_9ce4_8422_2325);
    hash.write(&PLAN_VERSION.to_le_bytes());
    hash.write(&serde_json::to_vec(files).unwrap_or_default());
    for op in mounts {
        if let Some((path, kind, mode)) = op.mount_point() {
            hash.write(path.as_os_str().as_encoded_bytes());
            hash.write(&[kind as u8, 0]);
            hash.write(&mode.to_le_bytes());
        }
    }
    for op in files {
        if let MountOp::CopyFile { source, .. } = op {
            match std::fs::metadata(source) {
                Ok(m) => {
                    for n in [
                        m.dev(),
                        m.ino(),
                        m.size(),
                        m.mtime() as u64,
                        m.mtime_nsec() as u64,
                        m.ctime() as u64,
                        m.ctime_nsec() as u64,
                    ] {
                        hash.write(&n.to_le_bytes());
                    }
                }
                Err(_) => hash.write(b"absent"),
            }
        }
    }
    hash.0
}

struct Fnv(u64);

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Makes the root in `dir` with the init's own code for each entry, so that a prepared root
/// and a tmpfs root cannot differ in what they hold.
fn build(dir: &Path, files: &[MountOp], mounts: &[MountOp]) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o755).create(dir)?;
    let sys_err = |e: smithers_sandbox_init::sys::SysError| std::io::Error::other(e.to_string());
    for op in files {
        smithers_sandbox_init::apply(op, dir, false).map_err(sys_err)?;
    }
    for op in mounts {
        smithers_sandbox_init::make_mount_point(op, dir).map_err(sys_err)?;
    }
    // The root directory itself as the tmpfs root is (`mode=0755`), whatever the umask.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{MountAttrs, TargetKind};

    fn ops(source: &Path) -> (Vec<MountOp>, Vec<MountOp>) {
        let files = vec![
            MountOp::Dir {
                path: "/etc".into(),
                mode: 0o755,
            },
            MountOp::CopyFile {
                source: source.to_path_buf(),
                path: "/etc/passwd".into(),
                max_bytes: 1 << 20,
            },
            MountOp::Symlink {
                path: "/bin".into(),
                target: "usr/bin".into(),
            },
        ];
        let mounts = vec![
            MountOp::Bind {
                source: "/usr".into(),
                path: "/usr".into(),
                kind: TargetKind::Dir,
                attrs: MountAttrs::RO,
                optional: true,
            },
            MountOp::Bind {
                source: "/dev/null".into(),
                path: "/dev/null".into(),
                kind: TargetKind::File,
                attrs: MountAttrs::DEVICE,
                optional: true,
            },
            MountOp::Proc {
                path: "/proc".into(),
            },
            MountOp::Setattr {
                path: "/".into(),
                attrs: MountAttrs::RO,
            },
        ];
        (files, mounts)
    }

    /// A scratch directory with a host file to copy (holding `content`) and an empty state
    /// root: (the scratch directory, the file, the state root).
    fn scratch(content: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let source = tmp.path().join("passwd");
        std::fs::write(&source, content).unwrap();
        let state = tmp.path().join("state");
        std::fs::create_dir(&state).unwrap();
        (tmp, source, state)
    }

    #[test]
    fn holds_the_files_and_mount_points_and_follows_the_copied_files() {
        use std::os::unix::fs::PermissionsExt;
        let (_tmp, source, state) = scratch("root:x:0:0::/:/bin/sh\n");
        let (files, mounts) = ops(&source);

        let root = ensure(&state, &files, &mounts).unwrap();
        assert!(root
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(PREFIX));
        assert_eq!(
            std::fs::read_to_string(root.join("etc/passwd")).unwrap(),
            "root:x:0:0::/:/bin/sh\n"
        );
        assert_eq!(
            std::fs::read_link(root.join("bin")).unwrap(),
            Path::new("usr/bin")
        );
        assert!(root.join("usr").is_dir());
        assert!(root.join("dev/null").is_file());
        let proc_mode = std::fs::metadata(root.join("proc")).unwrap().permissions();
        assert_eq!(proc_mode.mode() & 0o777, 0o555);
        // Only the root and no scratch directory left behind.
        let names: Vec<_> = std::fs::read_dir(&state).unwrap().flatten().collect();
        assert_eq!(names.len(), 1);

        // Unchanged inputs: the same root. A changed copied file: a new one, with the change.
        assert_eq!(ensure(&state, &files, &mounts).unwrap(), root);
        std::fs::write(&source, "root:x:0:0::/root:/bin/bash\n").unwrap();
        let changed = ensure(&state, &files, &mounts).unwrap();
        assert_ne!(changed, root);
        assert_eq!(
            std::fs::read_to_string(changed.join("etc/passwd")).unwrap(),
            "root:x:0:0::/root:/bin/bash\n"
        );
        // Different mount points: a different root too.
        let fewer = &mounts[..1];
        assert_ne!(ensure(&state, &files, fewer).unwrap(), changed);
    }

    #[test]
    fn making_a_new_root_removes_unused_old_ones() {
        let (_tmp, source, state) = scratch("a\n");
        let (files, mounts) = ops(&source);
        let first = ensure(&state, &files, &mounts).unwrap();
        std::fs::write(&source, "b\n").unwrap();
        // Used just now: kept when the next one is made.
        let second = ensure(&state, &files, &mounts).unwrap();
        assert!(first.is_dir() && second.is_dir());
        // Unused for long enough, and no mount has it: removed; the one kept stays.
        sweep(&state, &second, Duration::ZERO);
        assert!(!first.exists());
        assert!(second.is_dir());
        // Using a root stamps it (a sweep spares what was used within `UNUSED_FOR`).
        let before = std::fs::metadata(&second).unwrap().modified().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(ensure(&state, &files, &mounts).unwrap(), second);
        let after = std::fs::metadata(&second).unwrap().modified().unwrap();
        assert!(after > before);
    }

    #[test]
    fn mounted_roots_are_read_from_mountinfo() {
        let text = "\
25 1 0:21 / / rw - ext4 /dev/vda rw
611 610 0:26 /smithers-sandbox-0/.root-00aa11bb22cc33dd / ro,nosuid,nodev - tmpfs tmpfs rw
612 611 0:30 / /usr ro - ext4 /dev/vda rw
";
        let names: Vec<String> = roots_in_mountinfo(text).collect();
        assert_eq!(names, vec![".root-00aa11bb22cc33dd".to_string()]);
    }

    #[test]
    fn a_failed_build_leaves_nothing() {
        let (_tmp, _, state) = scratch("");
        // A symlink and then a directory at the same path cannot both be made.
        let files = vec![
            MountOp::Symlink {
                path: "/lib".into(),
                target: "usr/lib".into(),
            },
            MountOp::CopyFile {
                source: "/etc/hostname".into(),
                path: "/lib/x/y".into(),
                max_bytes: 1 << 20,
            },
        ];
        assert!(ensure(&state, &files, &[]).is_err());
        assert_eq!(std::fs::read_dir(&state).unwrap().count(), 0);
    }
}
