//! The project's own `.smithers/` (its store, other sandboxes' requests and bundles) in a
//! step's view, through the real CLI, in both workspace modes: absent from `/workspace` (not a
//! read-only directory), so `ls -a` does not list it and `git clean -fdx` in the step succeeds;
//! the host's `.smithers` is untouched; a `.smithers` the step makes is left out of the patches
//! and named in the bundle's `leftOut` with the reason.

mod support;

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use support::native::{bin, git, sandboxes_usable};

/// `run --json --no-review --workspace MODE --root dir -- sh -c SCRIPT`, its output, its JSON
/// document and the bundle's log (where the step's stdout is).
fn run_json(dir: &Path, mode: &str, script: &str) -> (Output, Value, String) {
    let out = bin()
        .args([
            "--json",
            "run",
            "--no-review",
            "--workspace",
            mode,
            "--root",
        ])
        .arg(dir)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let log = std::fs::read_to_string(
        Path::new(doc["bundlePath"].as_str().unwrap_or("/nonexistent")).join("logs/stream.ndjson"),
    )
    .unwrap_or_default();
    (out, doc, log)
}

/// The step's stdout lines, from the bundle's log.
fn stdout_lines(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["type"] == "stdout")
        .filter_map(|r| r["line"].as_str().map(str::to_string))
        .collect()
}

/// A git project with a tracked file, an untracked one, an ignored directory, and state of
/// its own in `.smithers/`.
fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    std::fs::write(p.join("a.txt"), "tracked\n").unwrap();
    std::fs::write(p.join(".gitignore"), "target/\n").unwrap();
    git(p, &["init", "-q"]);
    git(p, &["add", "a.txt", ".gitignore"]);
    git(p, &["commit", "-qm", "base"]);
    std::fs::write(p.join("build.o"), "untracked\n").unwrap();
    std::fs::create_dir_all(p.join("target")).unwrap();
    std::fs::write(p.join("target/x"), "ignored\n").unwrap();
    std::fs::create_dir_all(p.join(".smithers")).unwrap();
    std::fs::write(p.join(".smithers/keep"), "the project's state\n").unwrap();
    dir
}

#[test]
fn the_state_dir_is_absent_from_the_step_and_git_clean_succeeds() {
    if !sandboxes_usable() {
        return;
    }
    for mode in ["overlay", "copy"] {
        let dir = project();
        let (out, doc, log) = run_json(
            dir.path(),
            mode,
            "ls -a; if [ -e .smithers ]; then echo STATE-SHOWN; fi; \
             git clean -fdx; echo clean-exit=$?",
        );
        assert_eq!(doc["exitCode"], 0, "{mode}: {out:?}\n{log}");
        let lines = stdout_lines(&log);
        assert!(lines.iter().any(|l| l == "a.txt"), "{mode}: {lines:?}");
        assert!(
            !lines.iter().any(|l| l == ".smithers" || l == "STATE-SHOWN"),
            "{mode}: .smithers is in the step's view: {lines:?}"
        );
        assert!(
            lines.iter().any(|l| l == "clean-exit=0")
                && lines.iter().any(|l| l == "Removing build.o")
                && lines.iter().any(|l| l == "Removing target/"),
            "{mode}: git clean -fdx failed: {lines:?}\n{log}"
        );
        // The host's state is untouched and nothing of it is in the patches.
        assert_eq!(
            std::fs::read_to_string(dir.path().join(".smithers/keep")).unwrap(),
            "the project's state\n"
        );
        let paths: Vec<&str> = doc["patches"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["path"].as_str())
            .collect();
        assert_eq!(paths, ["build.o"], "{mode}: {doc}");
        let left_out = doc["changeNotes"]["leftOut"].to_string();
        assert!(!left_out.contains(".smithers"), "{mode}: {left_out}");
    }
}

#[test]
fn a_smithers_dir_the_step_makes_is_left_out_and_named() {
    if !sandboxes_usable() {
        return;
    }
    for mode in ["overlay", "copy"] {
        let dir = project();
        let (out, doc, log) = run_json(
            dir.path(),
            mode,
            "mkdir .smithers && echo mine > .smithers/notes && echo new > b.txt",
        );
        assert_eq!(doc["exitCode"], 0, "{mode}: {out:?}\n{log}");
        let paths: Vec<&str> = doc["patches"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["path"].as_str())
            .collect();
        assert_eq!(paths, ["b.txt"], "{mode}: {doc}");
        let left_out = doc["changeNotes"]["leftOut"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            left_out.iter().any(|l| l["path"] == ".smithers/"
                && l["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("never patched"))),
            "{mode}: {}",
            doc["changeNotes"]
        );
        // The host's own .smithers is not the step's.
        assert!(!dir.path().join(".smithers/notes").exists());
    }
}
