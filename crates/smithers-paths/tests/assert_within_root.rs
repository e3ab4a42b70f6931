use std::os::unix::fs::symlink;
use std::path::Path;

use smithers_errors::{CodedError, ErrorCode};
use smithers_paths::{assert_within_root, resolve};

#[test]
fn nearest_existing_ancestor_decides() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("dir")).unwrap();
    symlink(outside.path(), root.path().join("escape")).unwrap();
    symlink(root.path().join("dir"), root.path().join("inside")).unwrap();

    // Existing and not-yet-existing paths under a real directory are fine.
    assert_within_root(root.path(), &root.path().join("dir")).unwrap();
    assert_within_root(root.path(), &root.path().join("dir/new/deeper")).unwrap();
    // A link pointing inside is fine.
    assert_within_root(root.path(), &root.path().join("inside/new")).unwrap();
    // A not-yet-existing path beneath a link to the outside is not.
    let e = assert_within_root(root.path(), &root.path().join("escape/new/file")).unwrap_err();
    assert_eq!(e.code(), ErrorCode::ToolPathEscape);
    assert_eq!(e.to_string(), "Path escapes sandbox root (via symlink)");
}

#[test]
fn a_symlinked_root_is_compared_by_real_path() {
    let real = tempfile::tempdir().unwrap();
    let links = tempfile::tempdir().unwrap();
    let root = links.path().join("root");
    symlink(real.path(), &root).unwrap();
    let p = resolve(&root, "a/b").unwrap();
    assert_within_root(&root, &p).unwrap();
}

#[test]
fn other_errors_propagate() {
    let e = assert_within_root(
        Path::new("/definitely/not/here"),
        Path::new("/definitely/not/here/x"),
    )
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Internal);
}
