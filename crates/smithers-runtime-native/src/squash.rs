//! One upper layer from a stack of them: what a session's frozen layers and its upper
//! directory mean together over the project, as one upper directory the change detection
//! reads as it reads any step's. Made of hard links (a frozen layer is never written again,
//! and the upper directory is not at collect), so its cost is one link per entry, never a
//! copy of the data.
//!
//! The layers' contents were written by the sandbox: every entry is looked at without
//! following a link, and no process of the sandbox runs while this reads them (after the
//! stop, or paused for a diff).

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The xattr overlayfs (mounted with `userxattr`, as every workspace is) marks an opaque
/// directory with.
const OPAQUE: &str = "user.overlay.opaque";

/// Merges `layers` (bottom first) into `into`, a directory that must not exist yet. Its
/// directories stay writable (0700) while it is built, whatever the layers' modes (a step may
/// leave a directory read-only with files in it), and get their own modes at the end,
/// deepest first.
pub(crate) fn squash(layers: &[PathBuf], into: &Path) -> io::Result<()> {
    std::fs::create_dir(into)?;
    let mut modes = std::collections::BTreeMap::new();
    for layer in layers {
        merge(layer, into, &mut modes)?;
    }
    // Deepest first (longest paths), so that a directory is closed after its children.
    let mut dirs: Vec<(PathBuf, u32)> = modes.into_iter().collect();
    dirs.sort_by_key(|(p, _)| std::cmp::Reverse(p.components().count()));
    for (dir, mode) in dirs {
        if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))?;
        }
    }
    Ok(())
}

/// The modes the merged directories get at the end, by path.
type Modes = std::collections::BTreeMap<PathBuf, u32>;

/// While it is built, a merged directory is ours to write into.
const BUILDING: u32 = 0o700;

/// Puts `src` (a layer's directory) over `dst` (the merged one's), as overlayfs would see
/// it. Iterative: a step can make a tree deeper than a thread's stack.
fn merge(src: &Path, dst: &Path, modes: &mut Modes) -> io::Result<()> {
    let mut dirs = vec![(src.to_path_buf(), dst.to_path_buf())];
    while let Some((src, dst)) = dirs.pop() {
        for entry in std::fs::read_dir(&src)? {
            let entry = entry?;
            let (s, d) = (entry.path(), dst.join(entry.file_name()));
            let md = std::fs::symlink_metadata(&s)?;
            if md.is_dir() {
                if merge_dir(&s, &md, &d)? {
                    modes.insert(d.clone(), md.mode() & 0o7777);
                    dirs.push((s, d));
                }
            } else {
                remove_any(&d)?;
                link_or_copy(&s, &md, &d)?;
            }
        }
    }
    Ok(())
}

/// The directory `s` of a layer over `d`: merged into one already there, or in place of what
/// was there (then opaque, as overlayfs makes a directory made over a deleted name).
/// True when its entries are to be merged next.
fn merge_dir(s: &Path, md: &std::fs::Metadata, d: &Path) -> io::Result<bool> {
    let _ = md;
    let opaque = is_opaque(s);
    let below = std::fs::symlink_metadata(d).ok();
    match below {
        Some(b) if b.is_dir() && !opaque => {}
        _ => {
            let replaced = below.is_some();
            remove_any(d)?;
            std::fs::create_dir(d)?;
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(BUILDING))?;
            if opaque || replaced {
                set_opaque(d)?;
            }
        }
    }
    Ok(true)
}

fn is_opaque(dir: &Path) -> bool {
    matches!(get_xattr(dir, OPAQUE), Some(v) if v == b"y")
}

fn get_xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    let n = std::ffi::CString::new(name).ok()?;
    let mut buf = [0u8; 16];
    // SAFETY: valid C strings and a buffer of the length passed.
    let len =
        unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (len >= 0).then(|| buf[..len as usize].to_vec())
}

fn set_opaque(dir: &Path) -> io::Result<()> {
    let p = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    let n = std::ffi::CString::new(OPAQUE)?;
    // SAFETY: valid C strings and a value of the length passed.
    let ret = unsafe { libc::lsetxattr(p.as_ptr(), n.as_ptr(), b"y".as_ptr().cast(), 1, 0) };
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Removes whatever is at `path` in the merged directory (links of ours, directories we
/// made, all writable while it is built); nothing there is fine.
fn remove_any(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// A hard link of `s` at `d` (never through a link: `linkat` without following); where the
/// kernel refuses one (another owner's file under `protected_hardlinks`, too many links), a
/// copy of what `s` is.
fn link_or_copy(s: &Path, md: &std::fs::Metadata, d: &Path) -> io::Result<()> {
    match std::fs::hard_link(s, d) {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EMLINK)) => {
            let ft = md.file_type();
            if ft.is_symlink() {
                std::os::unix::fs::symlink(std::fs::read_link(s)?, d)
            } else if ft.is_file() {
                copy_file(s, md, d)
            } else if ft.is_char_device() && md.rdev() == 0 {
                make_whiteout(d)
            } else {
                Err(e)
            }
        }
        Err(e) => Err(e),
    }
}

fn copy_file(s: &Path, md: &std::fs::Metadata, d: &Path) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut from = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(s)?;
    let mut to = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(md.mode() & 0o7777)
        .open(d)?;
    io::copy(&mut from, &mut to)?;
    Ok(())
}

fn make_whiteout(d: &Path) -> io::Result<()> {
    let p = std::ffi::CString::new(d.as_os_str().as_encoded_bytes())?;
    // SAFETY: a valid C string; a 0/0 character device needs no privilege since Linux 5.8.
    let ret = unsafe { libc::mknod(p.as_ptr(), libc::S_IFCHR | 0o600, 0) };
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, data: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, data).unwrap();
    }

    fn whiteout(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        make_whiteout(path).unwrap();
    }

    fn is_whiteout(path: &Path) -> bool {
        std::fs::symlink_metadata(path)
            .is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == 0)
    }

    #[test]
    fn upper_layers_win_and_deletions_and_opaque_directories_carry() {
        let dir = tempfile::tempdir().unwrap();
        let (l0, l1, l2) = (
            dir.path().join("0"),
            dir.path().join("1"),
            dir.path().join("2"),
        );
        write(&l0.join("a"), "a0");
        write(&l0.join("d/x"), "x0");
        write(&l0.join("gone"), "g");
        write(&l0.join("e/kept"), "k");
        write(&l1.join("a"), "a1");
        whiteout(&l1.join("gone"));
        whiteout(&l1.join("d"));
        write(&l2.join("d/y"), "y2");
        write(&l2.join("e/new"), "n");
        std::fs::create_dir_all(l2.join("o")).unwrap();
        set_opaque(&l2.join("o")).unwrap();
        write(&l0.join("o/old"), "old");
        let into = dir.path().join("merged");
        squash(&[l0, l1, l2], &into).unwrap();
        assert_eq!(std::fs::read_to_string(into.join("a")).unwrap(), "a1");
        assert!(is_whiteout(&into.join("gone")));
        // A directory made over a deleted one hides what the project has there.
        assert!(!into.join("d/x").exists());
        assert_eq!(std::fs::read_to_string(into.join("d/y")).unwrap(), "y2");
        assert!(is_opaque(&into.join("d")));
        // A directory in two layers is both layers' entries, not opaque.
        assert!(into.join("e/kept").exists() && into.join("e/new").exists());
        assert!(!is_opaque(&into.join("e")));
        // An opaque one is its own layer's entries only.
        assert!(!into.join("o/old").exists());
        assert!(is_opaque(&into.join("o")));
    }

    #[test]
    fn read_only_directories_are_merged_and_keep_their_modes() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (l0, l1) = (dir.path().join("0"), dir.path().join("1"));
        write(&l0.join("ro/a"), "a");
        write(&l1.join("ro/b"), "b");
        for l in [&l0, &l1] {
            std::fs::set_permissions(l.join("ro"), std::fs::Permissions::from_mode(0o555)).unwrap();
        }
        let into = dir.path().join("merged");
        squash(&[l0.clone(), l1.clone()], &into).unwrap();
        assert!(into.join("ro/a").exists() && into.join("ro/b").exists());
        let mode = std::fs::metadata(into.join("ro")).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o555);
        for d in [&l0, &l1, &into] {
            std::fs::set_permissions(d.join("ro"), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }

    #[test]
    fn links_are_linked_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let l0 = dir.path().join("0");
        std::fs::create_dir(&l0).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", l0.join("link")).unwrap();
        let into = dir.path().join("merged");
        squash(&[l0], &into).unwrap();
        assert_eq!(
            std::fs::read_link(into.join("link")).unwrap(),
            Path::new("/etc/passwd")
        );
    }
}
