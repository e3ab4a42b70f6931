//! The same attacks as `beneath.rs`, on the fallback used by kernels without `openat2`.
//! A separate test binary, so forcing the fallback cannot affect the other tests.

use std::os::unix::fs::symlink;
use std::path::Path;

use smithers_errors::{CodedError, ErrorCode};
use smithers_paths::{force_component_walk, Beneath};

#[test]
fn the_component_walk_refuses_every_symlink_too() {
    force_component_walk();
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("a/b")).unwrap();
    symlink(outside.path(), root.path().join("out")).unwrap();
    symlink("b", root.path().join("a/inner")).unwrap();
    let b = Beneath::open(root.path()).unwrap();

    b.create_new(Path::new("a/b/ok"), 0o644).unwrap();
    assert!(root.path().join("a/b/ok").exists());
    for bad in ["out/pwned", "out/x/pwned", "a/inner/pwned"] {
        let e = b.create_new(Path::new(bad), 0o644).unwrap_err();
        assert_eq!(e.code(), ErrorCode::ToolPathEscape, "{bad}: {e}");
    }
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}
