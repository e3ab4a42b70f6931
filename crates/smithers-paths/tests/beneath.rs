//! `Beneath` against a real directory tree shaped by an attacker: symlinks to the outside,
//! symlinked parents, swapped-in links, `..`.

use std::io::{Read, Write};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use smithers_errors::{CodedError, ErrorCode};
use smithers_paths::{Beneath, EntryKind};

fn tree() -> (tempfile::TempDir, tempfile::TempDir) {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("src/deep")).unwrap();
    std::fs::write(root.path().join("src/a.txt"), "a").unwrap();
    std::fs::write(outside.path().join("secret"), "secret").unwrap();
    symlink(outside.path(), root.path().join("out")).unwrap();
    symlink(outside.path().join("secret"), root.path().join("src/link")).unwrap();
    symlink("deep", root.path().join("src/inner")).unwrap();
    (root, outside)
}

#[test]
fn reads_and_writes_plain_paths() {
    let (root, _outside) = tree();
    let b = Beneath::open(root.path()).unwrap();
    let mut s = String::new();
    b.open_read(Path::new("src/a.txt"))
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "a");
    b.create_dir_all(Path::new("new/dir"), 0o755).unwrap();
    b.create_new(Path::new("new/dir/f"), 0o644)
        .unwrap()
        .write_all(b"x")
        .unwrap();
    b.rename(Path::new("new/dir/f"), Path::new("src/g"))
        .unwrap();
    assert_eq!(std::fs::read(root.path().join("src/g")).unwrap(), b"x");
    b.set_mode(Path::new("src/g"), 0o755).unwrap();
    let mode = std::fs::metadata(root.path().join("src/g"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
    assert_eq!(
        b.metadata(Path::new("src/g")).unwrap().unwrap().kind,
        EntryKind::File
    );
    assert_eq!(
        b.metadata(Path::new("src/link")).unwrap().unwrap().kind,
        EntryKind::Symlink
    );
    assert!(b.metadata(Path::new("nope/nope")).unwrap().is_none());
    b.remove_file(Path::new("src/g")).unwrap();
    b.remove_dir(Path::new("new/dir")).unwrap();
    b.sync_parent(Path::new("src/a.txt")).unwrap();
}

#[test]
fn never_follows_a_symlink_anywhere() {
    let (root, outside) = tree();
    let b = Beneath::open(root.path()).unwrap();
    // Final component is a symlink to a file outside: reading or writing it is refused.
    let e = b.open_read(Path::new("src/link")).unwrap_err();
    assert_eq!(e.code(), ErrorCode::ToolPathEscape, "{e}");
    // Parent is a symlink to a directory outside.
    let e = b.create_new(Path::new("out/pwned"), 0o644).unwrap_err();
    assert_eq!(e.code(), ErrorCode::ToolPathEscape, "{e}");
    assert!(!outside.path().join("pwned").exists());
    let e = b.create_dir_all(Path::new("out/x/y"), 0o755).unwrap_err();
    assert_eq!(e.code(), ErrorCode::ToolPathEscape, "{e}");
    assert!(!outside.path().join("x").exists());
    // Even a symlink that points inside the root is not traversed.
    let e = b.create_new(Path::new("src/inner/f"), 0o644).unwrap_err();
    assert_eq!(e.code(), ErrorCode::ToolPathEscape, "{e}");
    // chmod through a link is refused and leaves the target alone.
    let before = std::fs::metadata(outside.path().join("secret"))
        .unwrap()
        .permissions()
        .mode();
    assert!(b.set_mode(Path::new("src/link"), 0o777).is_err());
    let after = std::fs::metadata(outside.path().join("secret"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(before, after);
    // Removing a symlink removes the link, not the target.
    b.remove_file(Path::new("src/link")).unwrap();
    assert_eq!(
        std::fs::read(outside.path().join("secret")).unwrap(),
        b"secret"
    );
    // Renaming over a path whose parent is a link is refused.
    assert!(b
        .rename(Path::new("src/a.txt"), Path::new("out/a.txt"))
        .is_err());
    assert!(!outside.path().join("a.txt").exists());
}

#[test]
fn refuses_dotdot_and_absolute_paths() {
    let (root, outside) = tree();
    let b = Beneath::open(root.path()).unwrap();
    for bad in ["../x", "src/../../x", "/etc/passwd", "", "."] {
        let e = b.create_new(Path::new(bad), 0o644).unwrap_err();
        assert!(
            matches!(
                e.code(),
                ErrorCode::ToolPathEscape | ErrorCode::ToolPathInvalid
            ),
            "{bad}: {e}"
        );
    }
    let target = outside.path().join("x");
    assert!(!target.exists());
}

#[test]
fn a_symlink_swapped_in_after_a_check_still_cannot_redirect_a_write() {
    let (root, outside) = tree();
    let b = Beneath::open(root.path()).unwrap();
    // The check-then-use race, made deterministic: the path is a real directory when a naive
    // caller would have checked it, then becomes a symlink before the write.
    assert_eq!(
        b.metadata(Path::new("src/deep")).unwrap().unwrap().kind,
        EntryKind::Dir
    );
    std::fs::remove_dir(root.path().join("src/deep")).unwrap();
    symlink(outside.path(), root.path().join("src/deep")).unwrap();
    let e = b
        .create_new(Path::new("src/deep/pwned"), 0o644)
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ToolPathEscape, "{e}");
    assert!(!outside.path().join("pwned").exists());
}

#[test]
fn symlinks_are_created_as_data() {
    let (root, _outside) = tree();
    let b = Beneath::open(root.path()).unwrap();
    b.symlink(Path::new("/etc/passwd"), Path::new("src/pw"))
        .unwrap();
    assert_eq!(
        b.read_link(Path::new("src/pw")).unwrap(),
        Path::new("/etc/passwd")
    );
    // Creating a file "through" it is refused.
    assert!(b.create_new(Path::new("src/pw"), 0o644).is_err());
}

#[test]
fn read_regular_reads_bounded_regular_files_and_nothing_else() {
    let (root, _outside) = tree();
    let b = Beneath::open(root.path()).unwrap();
    assert_eq!(
        b.read_regular(Path::new("src/a.txt"), 1).unwrap(),
        Some(b"a".to_vec())
    );
    // Over the limit, a directory: not read.
    assert_eq!(b.read_regular(Path::new("src/a.txt"), 0).unwrap(), None);
    assert_eq!(
        b.read_regular(Path::new("src/deep"), 1 << 20).unwrap(),
        None
    );
    // A fifo is opened without blocking (no writer would ever come) and not read.
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.path().join("src/fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    assert_eq!(
        b.read_regular(Path::new("src/fifo"), 1 << 20).unwrap(),
        None
    );
    // A symlink, final or on the way, is an escape, never followed.
    for link in ["src/link", "out/secret", "src/inner/x"] {
        let err = b.read_regular(Path::new(link), 1 << 20).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ToolPathEscape, "{link}: {err}");
    }
    assert!(b.read_regular(Path::new("src/missing"), 1).is_err());
}
