//! The CLI's conventions (issue 17): the project's state directory is ignored by git from its
//! creation, and size flags take units and name themselves in their errors.

mod support;

use std::process::Command;

use support::native::{bin, sandboxes_usable};

fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.email=t@example.com", "-c", "user.name=t"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_state_directory_is_ignored_by_git_from_its_creation() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("a.txt"), "one\n").unwrap();
    git(root, &["init", "-q"]);
    git(root, &["add", "."]);
    git(root, &["commit", "-qm", "base"]);
    let out = bin()
        .args(["run", "--root"])
        .arg(root)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(root.join(".smithers/sandbox.db").exists());
    assert_eq!(
        git(root, &["status", "--porcelain"]),
        "",
        "nothing to commit"
    );
    git(root, &["add", "-A"]);
    assert_eq!(git(root, &["diff", "--cached", "--name-only"]), "");
}

#[test]
fn an_existing_state_directory_is_left_as_the_user_made_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(".smithers")).unwrap();
    let out = bin()
        .args(["ls", "--root"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(!dir.path().join(".smithers/.gitignore").exists());
}

#[test]
fn size_flags_need_units_and_errors_name_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, value, expect) in [
        ("--memory", "512", "512m"),
        ("--disk", "0", "--disk"),
        ("--max-output", "0", "--max-output"),
        ("--memory", "2x", "--memory"),
    ] {
        let out = bin()
            .args(["run", "--root"])
            .arg(dir.path())
            .args([flag, value, "--", "true"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value} accepted");
        assert!(stderr.contains(flag), "{flag} {value}: {stderr}");
        assert!(stderr.contains(expect), "{flag} {value}: {stderr}");
        assert!(!stderr.contains("memoryLimit"), "{flag} {value}: {stderr}");
    }
}

#[test]
fn following_an_unknown_run_is_answered_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = bin()
        .args(["events", "--follow", "--root"])
        .arg(dir.path())
        .arg("run-does-not-exist")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The old code never returned: give it a generous bound, then kill it and fail.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("events --follow on an unknown run is still waiting");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    assert!(!status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no run") || stderr.contains("no database"),
        "{stderr}"
    );
}

#[test]
fn a_run_and_sandbox_id_is_never_reused() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = |script: &str| {
        bin()
            .args(["run", "--root"])
            .arg(dir.path())
            .args(["--run-id", "run-fixed", "--sandbox-id", "sbx-fixed", "--"])
            .args(["sh", "-c", script])
            .output()
            .unwrap()
    };
    let first = run("echo one > one.txt");
    assert!(first.status.success(), "{first:?}");
    let bundle = dir
        .path()
        .join(".smithers/sandboxes/run-fixed/sbx-fixed/result/patches");
    let before: Vec<_> = std::fs::read_dir(&bundle)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    let second = run("echo two > two.txt");
    assert!(!second.status.success(), "the second run must be refused");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("never reused") && stderr.contains("sbx-fixed"),
        "{stderr}"
    );
    let after: Vec<_> = std::fs::read_dir(&bundle)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(before, after, "the first bundle is untouched");
    // Asked for explicitly, an ended sandbox's ids may be taken again (a review is decided
    // first).
    let early = bin()
        .args(["run", "--root"])
        .arg(dir.path())
        .args([
            "--run-id",
            "run-fixed",
            "--sandbox-id",
            "sbx-fixed",
            "--replace",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert!(!early.status.success(), "replacing a sandbox in review");
    let rejected = bin()
        .args(["reject", "sbx-fixed", "--reason", "redo", "--root"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(rejected.status.success(), "{rejected:?}");
    let replaced = bin()
        .args(["run", "--root"])
        .arg(dir.path())
        .args([
            "--run-id",
            "run-fixed",
            "--sandbox-id",
            "sbx-fixed",
            "--replace",
            "--",
        ])
        .args(["sh", "-c", "echo two > two.txt"])
        .output()
        .unwrap();
    assert!(replaced.status.success(), "{replaced:?}");
}

#[test]
fn the_steps_stdout_is_the_commands_stdout_and_nothing_else() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["run", "--root"])
        .arg(dir.path())
        .args([
            "--",
            "sh",
            "-c",
            "echo step-out; echo step-err >&2; echo x > f.txt",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "step-out\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("step-err"), "{stderr}");
    assert!(
        stderr.contains("status   finished"),
        "the summary is on stderr: {stderr}"
    );
    assert!(stderr.contains("review   pending"), "{stderr}");
}

/// Runs the binary with its stdout a pipe whose reader is gone before anything is written.
fn with_stdout_closed(args: &[&str], root: &std::path::Path) -> std::process::Output {
    let mut child = bin()
        .args(args)
        .arg("--root")
        .arg(root)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

#[test]
fn a_closed_pipe_ends_printing_commands_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let out = with_stdout_closed(&["doctor"], dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
}

#[test]
fn a_closed_pipe_does_not_lose_the_step() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = bin()
        .args(["run", "--root"])
        .arg(dir.path())
        .args(["--", "sh", "-c", "seq 1 20000; echo done > f.txt"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("stdout was closed"), "named: {stderr}");
    assert!(
        stderr.contains("review   pending"),
        "the step reached its review: {stderr}"
    );
}

#[test]
fn read_only_commands_create_no_state() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        vec!["ls"],
        vec!["--json", "ls"],
        vec!["show", "sbx-nothing"],
        vec!["events", "run-nothing"],
        vec!["metrics"],
        vec!["review", "sbx-nothing"],
    ] {
        let out = bin()
            .args(&args)
            .arg("--root")
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            !dir.path().join(".smithers").exists(),
            "{args:?} created state: {out:?}"
        );
    }
}

#[test]
fn a_sandbox_is_found_by_a_short_id() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["run", "--root"])
        .arg(dir.path())
        .args([
            "--sandbox-id",
            "sbx-shortid-7f3a9",
            "--",
            "sh",
            "-c",
            "echo x > f.txt",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    for short in ["sbx-short", "7f3a9"] {
        let show = bin()
            .args(["review", short, "--root"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(show.status.success(), "{short}: {show:?}");
        assert!(String::from_utf8_lossy(&show.stdout).contains("sbx-shortid-7f3a9"));
    }
    let none = bin()
        .args(["review", "zzzz", "--root"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!none.status.success());
}

#[test]
fn logs_prints_the_steps_output_again() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["run", "--root"])
        .arg(dir.path())
        .args([
            "--sandbox-id",
            "sbx-logs-0001",
            "--",
            "sh",
            "-c",
            "echo to-out; echo to-err >&2",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let logs = bin()
        .args(["logs", "sbx-logs-0001", "--root"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(logs.status.success(), "{logs:?}");
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "to-out\n");
    assert!(String::from_utf8_lossy(&logs.stderr).contains("to-err"));
}

#[test]
fn logs_reads_through_no_link_in_the_project() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["run", "--root"])
        .arg(dir.path())
        .args(["--sandbox-id", "sbx-logs-0002", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let log = dir
        .path()
        .join(".smithers/sandboxes")
        .read_dir()
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("sbx-logs-0002/result/logs/stream.ndjson");
    let secret = dir.path().join("secret.ndjson");
    std::fs::write(&secret, "{\"type\":\"stdout\",\"line\":\"SECRET\"}\n").unwrap();
    std::fs::remove_file(&log).unwrap();
    std::os::unix::fs::symlink(&secret, &log).unwrap();
    let logs = bin()
        .args(["logs", "sbx-logs-0002", "--root"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!logs.status.success(), "a linked log is refused");
    assert!(!String::from_utf8_lossy(&logs.stdout).contains("SECRET"));
}

#[test]
fn rm_and_prune_forget_only_ended_sandboxes() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = |sid: &str| {
        let out = bin()
            .args(["run", "--root"])
            .arg(dir.path())
            .args([
                "--run-id",
                "run-rm",
                "--sandbox-id",
                sid,
                "--",
                "sh",
                "-c",
                "echo x > f.txt",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    let cli = |args: &[&str]| {
        bin()
            .args(args)
            .arg("--root")
            .arg(dir.path())
            .output()
            .unwrap()
    };
    run("sbx-rm-a");
    run("sbx-rm-b");
    let sandboxes = dir.path().join(".smithers/sandboxes/run-rm");
    // In review: not removed.
    let refused = cli(&["rm", "sbx-rm-a"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("review"));
    assert!(sandboxes.join("sbx-rm-a").is_dir());
    assert!(cli(&["reject", "sbx-rm-a", "--reason", "no"])
        .status
        .success());
    assert!(cli(&["reject", "sbx-rm-b", "--reason", "no"])
        .status
        .success());
    let removed = cli(&["rm", "sbx-rm-a"]);
    assert!(removed.status.success(), "{removed:?}");
    assert!(!sandboxes.join("sbx-rm-a").exists());
    assert!(
        !cli(&["show", "sbx-rm-a"]).status.success(),
        "its rows are gone"
    );
    let pruned = cli(&["--json", "prune"]);
    assert!(pruned.status.success(), "{pruned:?}");
    assert!(String::from_utf8_lossy(&pruned.stdout).contains("sbx-rm-b"));
    assert!(
        !sandboxes.exists(),
        "the run's directory goes with its last sandbox"
    );
}

#[test]
fn rm_follows_no_link_out_of_the_project() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep.txt"), "precious").unwrap();
    let out = bin()
        .args(["run", "--root"])
        .arg(dir.path())
        .args([
            "--run-id",
            "run-ln",
            "--sandbox-id",
            "sbx-ln",
            "--no-review",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let sbx = dir.path().join(".smithers/sandboxes/run-ln/sbx-ln");
    std::fs::remove_dir_all(&sbx).unwrap();
    std::os::unix::fs::symlink(outside.path(), &sbx).unwrap();
    let rm = bin()
        .args(["rm", "sbx-ln", "--root"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        !rm.status.success(),
        "a linked sandbox directory is refused"
    );
    assert!(outside.path().join("keep.txt").exists());
}
