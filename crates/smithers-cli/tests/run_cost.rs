//! A run costs what it changes, not what the project holds: `run` of the same one-file change
//! on a 20,000-file tree and on a 200-file tree makes about as many `stat`-family system calls,
//! counted with `strace -f` over the whole CLI process tree (the sandbox's too). Before the
//! ownership check stopped walking the project, the big tree's run made one `statx` per entry
//! (over 20,000), a hundred times the small one's.

mod support;

use std::path::Path;
use std::process::Command;

use support::native::{bin_path, sandboxes_usable};

/// A tree of `files` small files in directories of 100 (`src/dNNNN/fNNNNNN.rs`).
fn tree(files: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..files {
        let d = dir.path().join(format!("src/d{:04}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&d).unwrap();
        }
        std::fs::write(d.join(format!("f{i:06}.rs")), format!("// {i}\n")).unwrap();
    }
    dir
}

/// The stat-family calls (`stat`, `lstat`, `newfstatat`, `statx`) of one `run` of a step that
/// appends to one file, over every process and thread; `None` where strace cannot trace here.
fn stat_calls(project: &Path) -> Option<u64> {
    let summary = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new("strace")
        .args([
            "-f",
            "-qq",
            "-c",
            "-e",
            "trace=stat,lstat,newfstatat,statx",
            "-o",
        ])
        .arg(summary.path())
        .arg(bin_path())
        .env_remove("SMITHERS_DB")
        .args(["run", "--no-review", "--root"])
        .arg(project)
        .args(["--", "sh", "-c", "echo changed >> src/d0000/f000000.rs"])
        .output()
        .ok()?;
    let text = std::fs::read_to_string(summary.path()).unwrap_or_default();
    if !out.status.success() || !text.contains("total") {
        println!(
            "strace could not trace the run here: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            text
        );
        return None;
    }
    // `% time seconds usecs/call calls errors syscall`; the `total` row sums the calls.
    let total = text.lines().find(|l| l.trim_end().ends_with("total"))?;
    let cols: Vec<&str> = total.split_whitespace().collect();
    cols.get(cols.len().checked_sub(3)?)?.parse().ok()
}

#[test]
fn the_same_change_makes_as_many_stat_calls_on_20k_files_as_on_200() {
    if !sandboxes_usable() {
        return;
    }
    if Command::new("strace").arg("-V").output().is_err() {
        smithers_test_support::skip_optional(
            "strace is not installed (it counts the run's system calls)",
        );
        return;
    }
    let (small, big) = (tree(200), tree(20_000));
    // A first run of each: the project's store and state directory are made once per project.
    let (Some(_), Some(_)) = (stat_calls(small.path()), stat_calls(big.path())) else {
        smithers_test_support::skip_optional("strace cannot trace here");
        return;
    };
    let small_calls = stat_calls(small.path()).unwrap();
    let big_calls = stat_calls(big.path()).unwrap();
    println!("stat-family calls per run: 200 files {small_calls}, 20,000 files {big_calls}");
    // 100 times the files; the changed file's directory and its parents are what is read
    // (their entries: 100 files, src/'s 2 or 200 directories), not the tree.
    assert!(
        big_calls <= 3 * small_calls && big_calls < 5_000,
        "a run over 20,000 files made {big_calls} stat calls, over 200 files {small_calls}"
    );
}
