//! The small things a new user meets first: the README's quick start runs as written,
//! `events` takes the ids the other commands take, `run echo hi` says where the `--` goes,
//! and a moved file is shown as a rename.

mod support;

use std::path::Path;
use std::process::Output;

use support::native::{bin, bin_path, git, sandboxes_usable};

fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    git(dir.path(), &["init", "-q", "-b", "main"]);
    std::fs::write(dir.path().join("a.txt"), "one\ntwo\n").unwrap();
    git(dir.path(), &["add", "a.txt"]);
    git(dir.path(), &["commit", "-q", "-m", "initial"]);
    dir
}

fn cli(dir: &Path, args: &[&str]) -> Output {
    bin().args(args).arg("--root").arg(dir).output().unwrap()
}

/// The first fenced `sh` block of the README, and the line it starts on.
fn quick_start() -> (usize, Vec<String>) {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let lines: Vec<&str> = readme.lines().collect();
    let start = lines.iter().position(|l| *l == "```sh").unwrap();
    let end = start + 1 + lines[start + 1..].iter().position(|l| *l == "```").unwrap();
    let block = lines[start + 1..end]
        .iter()
        .map(|l| l.split(" #").next().unwrap().trim().to_string())
        .collect();
    (start, block)
}

#[test]
fn the_readme_opens_with_a_quick_start_that_runs_as_written() {
    let (start, block) = quick_start();
    assert!(start < 12, "the quick start is on the first screen");
    assert!(block.len() <= 5, "{block:?}");
    let run = block
        .iter()
        .find(|l| l.starts_with("smithers-sandbox run "))
        .unwrap();
    assert!(block
        .iter()
        .any(|l| l.starts_with("smithers-sandbox review <id>")));
    assert!(block
        .iter()
        .any(|l| l.starts_with("smithers-sandbox accept <id>")));
    if !sandboxes_usable() {
        return;
    }
    // Run the README's own lines in a project, from its directory, with the binary on PATH.
    let dir = repo();
    let bin_dir = Path::new(bin_path()).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    let sh = |line: &str| {
        std::process::Command::new("sh")
            .args(["-c", line])
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("NO_COLOR", "1")
            .env_remove("SMITHERS_DB")
            .output()
            .unwrap()
    };
    let out = sh(run);
    assert!(out.status.success(), "{out:?}");
    assert!(
        !dir.path().join("hello.txt").exists(),
        "the project is untouched"
    );
    let ls = cli(dir.path(), &["--json", "ls"]);
    let rows: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    let id = rows
        .as_array()
        .and_then(|a| a.first())
        .or_else(|| rows["sandboxes"].as_array().and_then(|a| a.first()))
        .map(|r| r["sandboxId"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("{rows}"));
    for line in block.iter().filter(|l| l.contains("<id>")) {
        let out = sh(&line.replace("<id>", &id).replace(" (or: reject", ""));
        assert!(out.status.success(), "{line}: {out:?}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.path().join("hello.txt")).unwrap(),
        "hi\n"
    );
}

#[test]
fn events_takes_short_run_ids_and_sandbox_ids() {
    if !sandboxes_usable() {
        return;
    }
    let dir = repo();
    let out = bin()
        .args(["--json", "run", "--root"])
        .arg(dir.path())
        .args(["--", "true"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let run = doc["runId"].as_str().unwrap();
    let sandbox = doc["sandboxId"].as_str().unwrap();
    let full = cli(dir.path(), &["events", run]);
    assert!(full.status.success(), "{full:?}");
    for short in [
        &run[..run.len() - 3],
        &run[run.len() - 5..],
        sandbox,
        &sandbox[sandbox.len() - 5..],
    ] {
        let got = cli(dir.path(), &["events", short]);
        assert!(got.status.success(), "{short}: {got:?}");
        assert_eq!(got.stdout, full.stdout, "{short}");
    }
    let unknown = cli(dir.path(), &["events", "no-such-run"]);
    assert!(!unknown.status.success());
}

#[test]
fn run_without_the_dashes_says_where_they_go() {
    let dir = tempfile::tempdir().unwrap();
    let out = cli(dir.path(), &["run", "echo", "hi"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "tip: the step's command goes after `--`: smithers-sandbox run [OPTIONS] -- echo hi"
        ),
        "{err}"
    );
    // A mistyped option gets clap's own advice, not this one.
    let out = cli(dir.path(), &["run", "--no-such-flag", "--", "true"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("the step's command goes after"));
}

#[test]
fn a_moved_file_is_shown_as_a_rename() {
    if !sandboxes_usable() {
        return;
    }
    let dir = repo();
    let out = bin()
        .args(["run", "--root"])
        .arg(dir.path())
        .args(["--", "sh", "-c", "mkdir -p docs && mv a.txt docs/b.txt"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(
        summary.contains("docs/b.txt") && summary.contains("(renamed from a.txt)"),
        "{summary}"
    );
    let ls = cli(dir.path(), &["--json", "ls"]);
    let rows: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    let id = rows
        .as_array()
        .and_then(|a| a.first())
        .map(|r| r["sandboxId"].as_str().unwrap().to_string())
        .unwrap();
    let review = cli(dir.path(), &["--json", "review", &id]);
    let doc: serde_json::Value = serde_json::from_slice(&review.stdout).unwrap();
    let patches = doc["patches"].as_array().unwrap();
    assert!(
        patches
            .iter()
            .any(|p| p["path"] == "docs/b.txt" && p["renamedFrom"] == "a.txt"),
        "{doc}"
    );
}
