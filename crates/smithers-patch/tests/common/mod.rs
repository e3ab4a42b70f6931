//! Helpers shared by the integration tests: capability checks, overlay mounts, tree snapshots.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

pub use smithers_test_support::skip_or_fail;

/// Runs a shell script in `dir`, panicking with its output on failure.
pub fn sh(dir: &Path, script: &str) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("spawn sh");
    assert!(
        out.status.success(),
        "script failed ({}):\n{script}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Like [`sh`] but returns whether it succeeded (and its stderr).
pub fn try_sh(dir: &Path, script: &str) -> (bool, String) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("spawn sh");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The layout of one overlay experiment.
pub struct Layers {
    pub _tmp: tempfile::TempDir,
    pub lower: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub merged: PathBuf,
    pub snapshot: PathBuf,
}

impl Layers {
    pub fn new() -> Layers {
        let tmp = tempfile::tempdir().expect("tempdir");
        let p = tmp.path().to_path_buf();
        let l = Layers {
            lower: p.join("lower"),
            upper: p.join("upper"),
            work: p.join("work"),
            merged: p.join("merged"),
            snapshot: p.join("snapshot"),
            _tmp: tmp,
        };
        for d in [&l.lower, &l.upper, &l.work, &l.merged, &l.snapshot] {
            std::fs::create_dir_all(d).unwrap();
        }
        l
    }

    pub fn mount_opts(&self, extra: &str) -> String {
        format!(
            "lowerdir={},upperdir={},workdir={}{extra}",
            self.lower.display(),
            self.upper.display(),
            self.work.display()
        )
    }
}

/// Root with overlayfs available? Otherwise SKIP (or fail under CI).
pub fn require_root_overlay() -> bool {
    if !rustix::process::geteuid().is_root() {
        return skip_or_fail("overlay tests need root (mount -t overlay)");
    }
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs.lines().any(|l| l.trim_end().ends_with("overlay")) {
        // The module may still autoload on first mount; try it.
        let l = Layers::new();
        let (ok, err) = try_sh(
            &l.lower,
            &format!(
                "mount -t overlay overlay -o {} {} && umount {}",
                l.mount_opts(""),
                l.merged.display(),
                l.merged.display()
            ),
        );
        if !ok {
            return skip_or_fail(&format!("overlayfs not available: {err}"));
        }
    }
    true
}

/// One entry of a tree snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Snap {
    File { exec: bool, content: Vec<u8> },
    Symlink(PathBuf),
}

/// Every non-directory below `root` (not following symlinks), keyed by relative path,
/// except paths for which `skip` returns true.
pub fn snapshot(root: &Path, skip: &dyn Fn(&str) -> bool) -> BTreeMap<String, Snap> {
    let mut out = BTreeMap::new();
    fn walk(
        root: &Path,
        dir: &Path,
        skip: &dyn Fn(&str) -> bool,
        out: &mut BTreeMap<String, Snap>,
    ) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p
                .strip_prefix(root)
                .unwrap()
                .to_str()
                .expect("utf-8 names in tests")
                .to_string();
            if skip(&rel) {
                continue;
            }
            let md = std::fs::symlink_metadata(&p).unwrap();
            let ft = md.file_type();
            if ft.is_dir() {
                walk(root, &p, skip, out);
            } else if ft.is_symlink() {
                out.insert(rel, Snap::Symlink(std::fs::read_link(&p).unwrap()));
            } else if ft.is_file() {
                out.insert(
                    rel,
                    Snap::File {
                        exec: md.permissions().mode() & 0o100 != 0,
                        content: std::fs::read(&p).unwrap(),
                    },
                );
            } else if ft.is_fifo() || ft.is_socket() || ft.is_char_device() || ft.is_block_device()
            {
                // Special files cannot travel in patches; the caller skips them explicitly.
                panic!("special file {rel} not excluded from snapshot");
            }
        }
    }
    walk(root, root, skip, &mut out);
    out
}

/// Asserts two snapshots are identical, listing every difference.
pub fn assert_same_tree(expected: &BTreeMap<String, Snap>, actual: &BTreeMap<String, Snap>) {
    let mut diffs = Vec::new();
    for (k, v) in expected {
        match actual.get(k) {
            None => diffs.push(format!("missing in result: {k}")),
            Some(a) if a != v => diffs.push(format!("differs: {k}: expected {v:?}, got {a:?}")),
            _ => {}
        }
    }
    for k in actual.keys() {
        if !expected.contains_key(k) {
            diffs.push(format!("unexpected in result: {k}"));
        }
    }
    assert!(diffs.is_empty(), "trees differ:\n{}", diffs.join("\n"));
}

/// Waits until the filesystem's (coarse) timestamp clock has advanced, so that writes before
/// and after are ordered by their timestamps. An ordering barrier, not a timing assertion.
pub fn fs_clock_tick(dir: &Path) {
    use std::os::unix::fs::MetadataExt;
    let probe = dir.join(".tick");
    std::fs::write(&probe, "0").unwrap();
    let first = std::fs::metadata(&probe).unwrap();
    let start = (first.ctime(), first.ctime_nsec());
    loop {
        std::fs::write(&probe, "1").unwrap();
        let m = std::fs::metadata(&probe).unwrap();
        if (m.ctime(), m.ctime_nsec()) > start {
            break;
        }
        std::thread::yield_now();
    }
    std::fs::remove_file(&probe).unwrap();
}
