//! The CLI's conventions (issue 17): the step's stdout is `run`'s only stdout, broken pipes,
//! the project's state directory ignored by git from its creation, read-only commands that
//! create nothing, ids never reused, size flags with units, short ids, `logs`, `rm`/`prune`.

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use support::native::{bin, git, sandboxes_usable};

/// The CLI with `args` (a subcommand and its flags), then `--root dir`.
fn cli(dir: &Path, args: &[&str]) -> Output {
    bin().args(args).arg("--root").arg(dir).output().unwrap()
}

/// `run --root dir FLAGS -- sh -c SCRIPT`, not yet started.
fn run_cmd(dir: &Path, flags: &[&str], script: &str) -> Command {
    let mut cmd = bin();
    cmd.arg("run")
        .arg("--root")
        .arg(dir)
        .args(flags)
        .args(["--", "sh", "-c", script]);
    cmd
}

/// [`run_cmd`], run to its end.
fn run_step(dir: &Path, flags: &[&str], script: &str) -> Output {
    run_cmd(dir, flags, script).output().unwrap()
}

/// Runs `cmd` with its stdout a pipe whose reader is gone before anything is written.
fn with_stdout_closed(mut cmd: Command) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
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
    let out = run_step(root, &[], "true");
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
    let out = cli(dir.path(), &["ls"]);
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
        let out = run_step(dir.path(), &[flag, value], "true");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value} accepted");
        assert!(stderr.contains(flag), "{flag} {value}: {stderr}");
        assert!(stderr.contains(expect), "{flag} {value}: {stderr}");
        assert!(!stderr.contains("memoryLimit"), "{flag} {value}: {stderr}");
    }
}

#[test]
fn following_an_unknown_run_is_answered_at_once() {
    if !sandboxes_usable() {
        return;
    }
    // A database that exists (one step ran), so that it is the run that is unknown.
    let dir = tempfile::tempdir().unwrap();
    assert!(run_step(dir.path(), &[], "true").status.success());
    let mut child = bin()
        .args(["events", "--follow", "--root"])
        .arg(dir.path())
        .arg("run-does-not-exist")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
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
    assert!(stderr.contains("no run"), "{stderr}");
}

#[test]
fn a_run_and_sandbox_id_is_never_reused() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fixed = ["--run-id", "run-fixed", "--sandbox-id", "sbx-fixed"];
    let first = run_step(dir.path(), &fixed, "echo one > one.txt");
    assert!(first.status.success(), "{first:?}");
    let bundle = dir
        .path()
        .join(".smithers/sandboxes/run-fixed/sbx-fixed/result/patches");
    let names = || -> Vec<_> {
        std::fs::read_dir(&bundle)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect()
    };
    let before = names();
    let second = run_step(dir.path(), &fixed, "echo two > two.txt");
    assert!(!second.status.success(), "the second run must be refused");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("never reused") && stderr.contains("sbx-fixed"),
        "{stderr}"
    );
    assert_eq!(before, names(), "the first bundle is untouched");
    // Asked for explicitly, an ended sandbox's ids may be taken again (a review is decided
    // first).
    let replace = [&fixed[..], &["--replace"]].concat();
    let early = run_step(dir.path(), &replace, "true");
    assert!(!early.status.success(), "replacing a sandbox in review");
    let rejected = cli(dir.path(), &["reject", "sbx-fixed", "--reason", "redo"]);
    assert!(rejected.status.success(), "{rejected:?}");
    let replaced = run_step(dir.path(), &replace, "echo two > two.txt");
    assert!(replaced.status.success(), "{replaced:?}");
}

#[test]
fn the_steps_stdout_is_the_commands_stdout_and_nothing_else() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = run_step(
        dir.path(),
        &[],
        "echo step-out; echo step-err >&2; echo x > f.txt",
    );
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

#[test]
fn a_closed_pipe_ends_printing_commands_quietly() {
    let mut doctor = bin();
    doctor.arg("doctor");
    let out = with_stdout_closed(doctor);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
    // 141 when the pipe broke (the shell's code for `cat` there), 0 if it never did; a
    // panic would be 101.
    assert!(
        matches!(out.status.code(), Some(0 | 141)),
        "{:?}: {stderr}",
        out.status
    );
}

/// `run ... 2>&1 | head`: stderr's reader is gone before the step ends (here, before it
/// starts). The progress and summary lines are dropped, and the step still runs to its
/// review: the sandbox is in review with its patch, not failed by a panic on a write.
#[test]
fn a_closed_stderr_does_not_lose_the_step() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ids = ["--run-id", "r-err", "--sandbox-id", "s-err"];
    let mut child = run_cmd(dir.path(), &ids, "seq 1 2000 >&2; echo done > f.txt")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let show = cli(dir.path(), &["show", "s-err", "--json"]);
    let shown: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(shown["status"], "review", "{shown}");
    assert_eq!(shown["review"]["patchCount"], 1, "{shown}");
}

#[test]
fn a_closed_pipe_does_not_lose_the_step() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = with_stdout_closed(run_cmd(dir.path(), &[], "seq 1 20000; echo done > f.txt"));
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
        vec!["logs", "sbx-nothing"],
        vec!["prune"],
    ] {
        let out = cli(dir.path(), &args);
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
    let out = run_step(
        dir.path(),
        &["--sandbox-id", "sbx-shortid-7f3a9"],
        "echo x > f.txt",
    );
    assert!(out.status.success(), "{out:?}");
    for short in ["sbx-short", "7f3a9"] {
        let show = cli(dir.path(), &["review", short]);
        assert!(show.status.success(), "{short}: {show:?}");
        assert!(String::from_utf8_lossy(&show.stdout).contains("sbx-shortid-7f3a9"));
    }
    assert!(!cli(dir.path(), &["review", "zzzz"]).status.success());
}

#[test]
fn logs_prints_the_steps_output_again() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = run_step(
        dir.path(),
        &["--sandbox-id", "sbx-logs-0001"],
        "echo to-out; echo to-err >&2",
    );
    assert!(out.status.success(), "{out:?}");
    let logs = cli(dir.path(), &["logs", "sbx-logs-0001"]);
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
    let out = run_step(dir.path(), &["--sandbox-id", "sbx-logs-0002"], "true");
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
    let logs = cli(dir.path(), &["logs", "sbx-logs-0002"]);
    assert!(!logs.status.success(), "a linked log is refused");
    assert!(!String::from_utf8_lossy(&logs.stdout).contains("SECRET"));
}

#[test]
fn rm_and_prune_forget_only_ended_sandboxes() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for sid in ["sbx-rm-a", "sbx-rm-b"] {
        let out = run_step(
            dir.path(),
            &["--run-id", "run-rm", "--sandbox-id", sid],
            "echo x > f.txt",
        );
        assert!(out.status.success(), "{out:?}");
    }
    let sandboxes = dir.path().join(".smithers/sandboxes/run-rm");
    // In review: not removed.
    let refused = cli(dir.path(), &["rm", "sbx-rm-a"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("review"));
    assert!(sandboxes.join("sbx-rm-a").is_dir());
    for sid in ["sbx-rm-a", "sbx-rm-b"] {
        assert!(cli(dir.path(), &["reject", sid, "--reason", "no"])
            .status
            .success());
    }
    let removed = cli(dir.path(), &["rm", "sbx-rm-a"]);
    assert!(removed.status.success(), "{removed:?}");
    assert!(!sandboxes.join("sbx-rm-a").exists());
    assert!(
        !cli(dir.path(), &["show", "sbx-rm-a"]).status.success(),
        "its rows are gone"
    );
    let pruned = cli(dir.path(), &["--json", "prune"]);
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
    let out = run_step(
        dir.path(),
        &[
            "--run-id",
            "run-ln",
            "--sandbox-id",
            "sbx-ln",
            "--no-review",
        ],
        "true",
    );
    assert!(out.status.success(), "{out:?}");
    let sbx = dir.path().join(".smithers/sandboxes/run-ln/sbx-ln");
    std::fs::remove_dir_all(&sbx).unwrap();
    std::os::unix::fs::symlink(outside.path(), &sbx).unwrap();
    let rm = cli(dir.path(), &["rm", "sbx-ln"]);
    assert!(
        !rm.status.success(),
        "a linked sandbox directory is refused"
    );
    assert!(outside.path().join("keep.txt").exists());
}

/// A result file that is not valid JSON, and a stream cut off at `--max-output`, are said in
/// `run`'s summary (with why, and the flag that raises the cap) and in `--json`'s
/// `logNotes`, not only in the bundle's log.
#[test]
fn a_refused_result_and_a_cut_off_stream_are_named_in_the_summary() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = "echo '{bad' > $SMITHERS_SANDBOX_RESULT_PATH; head -c 5000 /dev/zero | tr '\\0' a";
    let out = run_step(dir.path(), &["--max-output", "1k"], script);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("result   not used: the result JSON is not valid JSON"),
        "{stderr}"
    );
    assert!(
        stderr.contains("cut off at maxOutputBytes (1024 bytes): raise it with --max-output"),
        "{stderr}"
    );
    let out = run_step(dir.path(), &["--json", "--max-output", "1k"], script);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kinds: Vec<&str> = doc["logNotes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["type"].as_str())
        .collect();
    assert!(
        kinds.contains(&"resultRejected") && kinds.contains(&"outputTruncated"),
        "{doc}"
    );
}

/// `run` with no `--root`, from `cwd`.
fn run_from(cwd: &Path, script: &str) -> Output {
    bin()
        .current_dir(cwd)
        .args(["run", "--", "sh", "-c", script])
        .output()
        .unwrap()
}

#[test]
fn the_project_root_is_found_upward_like_git() {
    if !sandboxes_usable() {
        return;
    }
    // A repository: run from a subdirectory acts on the repository's top, and the step
    // starts in the same subdirectory of /workspace.
    let repo = tempfile::tempdir().unwrap();
    git(repo.path(), &["init", "-q"]);
    let sub = repo.path().join("src/deep");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("lib.txt"), "v1\n").unwrap();
    let out = run_from(&sub, "pwd; echo v2 > lib.txt");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "/workspace/src/deep\n"
    );
    assert!(repo.path().join(".smithers/sandbox.db").is_file());
    assert!(
        !sub.join(".smithers").exists(),
        "the subdirectory became a project"
    );
    // Read-only commands from the subdirectory find the same project.
    let ls = bin()
        .current_dir(&sub)
        .args(["--json", "ls"])
        .output()
        .unwrap();
    assert!(ls.status.success(), "{ls:?}");
    let rows: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    let accept = bin()
        .current_dir(&sub)
        .args(["accept", rows[0]["sandboxId"].as_str().unwrap()])
        .output()
        .unwrap();
    assert!(accept.status.success(), "{accept:?}");
    assert_eq!(
        std::fs::read_to_string(sub.join("lib.txt")).unwrap(),
        "v2\n"
    );

    // The nearest marker wins: a `.smithers` below the repository's top makes its own
    // project (and a git worktree's `.git` file counts as a top).
    let nested = repo.path().join("tools");
    std::fs::create_dir_all(nested.join(".smithers")).unwrap();
    std::fs::create_dir_all(nested.join("bin")).unwrap();
    let out = run_from(&nested.join("bin"), "pwd");
    assert!(out.status.success(), "{out:?}");
    // A project below its repository's top: the step starts at the project's host path
    // (where its git finds the repository; /workspace is the same view).
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "{}\n",
            std::fs::canonicalize(nested.join("bin")).unwrap().display()
        )
    );
    assert!(nested.join(".smithers/sandbox.db").is_file());
    let worktree = tempfile::tempdir().unwrap();
    std::fs::write(worktree.path().join(".git"), "gitdir: /nowhere\n").unwrap();
    std::fs::create_dir(worktree.path().join("w")).unwrap();
    let out = run_from(&worktree.path().join("w"), "pwd");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "/workspace/w\n");
    assert!(worktree.path().join(".smithers").is_dir());
}

/// `run --root dir -- sh -c SCRIPT` with `input` written to its stdin (a pipe), then closed.
fn run_with_stdin(dir: &Path, script: &str, input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = run_cmd(dir, &["--no-review"], script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    // Written from a thread: a step that reads little must not deadlock the test.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

#[test]
fn stdin_reaches_the_step() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = run_with_stdin(
        dir.path(),
        "read first; echo \"got $first\"; wc -l",
        b"one\ntwo\nthree\n",
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "got one\n2\n");
    // More than a pipe's buffer, streamed (not read whole before the step starts).
    let big = vec![b'x'; 4 << 20];
    let out = run_with_stdin(dir.path(), "wc -c", &big);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (4 << 20).to_string()
    );
    // A step that never reads its stdin ends on its own, whatever is still being written.
    let out = run_with_stdin(dir.path(), "echo done", &big);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
    // No stdin (here /dev/null, as under `output()`): the step reads EOF at once.
    let out = run_step(dir.path(), &["--no-review"], "cat; echo eof");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "eof\n");
    // No FIFO is left in the project: the FIFO is made in the sandbox's own request
    // directory (in its state, outside the project) and goes with it.
    let leftovers = std::process::Command::new("find")
        .arg(dir.path())
        .args(["-type", "p"])
        .output()
        .unwrap();
    assert!(leftovers.stdout.is_empty(), "{leftovers:?}");
}

/// Issue 18: a result JSON reporting `patches`, `diffBundle` or `bundlePath` (as the JS
/// provider kit's runners do) was ignored without an error; it is refused, naming the field.
#[test]
fn a_result_reporting_patches_or_a_bundle_is_refused_naming_the_field() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (field, value) in [
        ("patches", "[\"patches/0001.patch\"]"),
        (
            "diffBundle",
            "{\"seq\":1,\"baseRef\":\"HEAD\",\"patches\":[]}",
        ),
        ("bundlePath", "\"/tmp/elsewhere\""),
    ] {
        let script = format!(
            "echo '{{\"status\":\"finished\",\"outputs\":{{\"a\":1}},\"{field}\":{value}}}' > \"$SMITHERS_SANDBOX_RESULT_PATH\""
        );
        let out = run_step(dir.path(), &["--json", "--no-review"], &script);
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            doc["stepStatus"].as_str().or(doc["status"].as_str()),
            Some("failed"),
            "{field}: {doc}"
        );
        assert_eq!(doc["outputs"], serde_json::Value::Null, "{field}: {doc}");
        let notes = doc["logNotes"].to_string();
        assert!(notes.contains(&format!("`{field}`")), "{field}: {doc}");
    }
}

/// The log records of a `run` whose ids are given (`--run-id R --sandbox-id S`).
fn bundle_log(root: &Path, run: &str, sandbox: &str) -> Vec<serde_json::Value> {
    let log = root.join(format!(
        ".smithers/sandboxes/{run}/{sandbox}/result/logs/stream.ndjson"
    ));
    std::fs::read_to_string(&log)
        .unwrap_or_else(|e| panic!("{}: {e}", log.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `run` makes its step's sandbox while it opens the store (the native runtime's prestart): a
/// step a warm sandbox can serve runs in it, the same as cold; one it cannot serve (network)
/// starts cold.
#[test]
fn run_prepares_the_sandbox_while_it_opens_the_store() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("a.txt"), "one\n").unwrap();
    let ids = ["--run-id", "r-pre", "--sandbox-id", "s-warm"];
    let out = run_step(root, &ids, "echo two >> a.txt; echo done");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
    let log = bundle_log(root, "r-pre", "s-warm");
    assert!(
        log.iter().any(|r| r["type"] == "warmStart"),
        "the prestarted sandbox ran the step: {log:?}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("review   pending: 1 patch file(s)"),
        "{stderr}"
    );
    let ids = [
        "--run-id",
        "r-pre",
        "--sandbox-id",
        "s-net",
        "--allow-network",
    ];
    let out = run_step(root, &ids, "true");
    assert!(out.status.success(), "{out:?}");
    let log = bundle_log(root, "r-pre", "s-net");
    assert!(
        !log.iter().any(|r| r["type"] == "warmStart"),
        "a networked step starts cold: {log:?}"
    );
}

/// The children of `pid`, by their `/proc` records: (pid, comm, command line).
fn children_of(pid: u32) -> Vec<(u32, String, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{child}/status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        if field("PPid:") == pid.to_string() {
            let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push((child, field("Name:"), cmdline));
        }
    }
    found
}

/// `run`, still single-threaded when it knows its step, forks the sandbox's init from itself
/// (no zygote is executed): while the step runs, the CLI's children are that init, named
/// `smithers-init`, and no `--zygote`. The init's copy of the CLI's command line is scrubbed:
/// the step, which can read `/proc/1/cmdline`, finds `smithers-init` there, not the CLI's
/// flags and the project's host path. A networked step (cold) is not prestarted: its init
/// comes from the zygote as before.
#[test]
fn run_forks_the_sandbox_init_from_itself() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let watch = |flags: &[&str]| {
        let child = run_cmd(root, flags, "tr '\\0' ' ' < /proc/1/cmdline; sleep 1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Until the init shows among the CLI's children (it lives as long as the step).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut seen = Vec::new();
        while std::time::Instant::now() < deadline {
            seen = children_of(child.id());
            if seen.iter().any(|(_, name, _)| name == "smithers-init")
                || seen.iter().any(|(_, _, cmd)| cmd.contains("--zygote"))
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        (
            seen,
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )
    };
    let (warm, pid1) = watch(&["--run-id", "r-fork", "--sandbox-id", "s-warm"]);
    assert_eq!(pid1, "smithers-init", "the sandbox's pid 1 shows no more");
    assert!(
        warm.iter().any(|(_, name, _)| name == "smithers-init"),
        "the init is the CLI's own child: {warm:?}"
    );
    assert!(
        !warm.iter().any(|(_, _, cmd)| cmd.contains("--zygote")),
        "no zygote was executed: {warm:?}"
    );
    let log = bundle_log(root, "r-fork", "s-warm");
    assert!(log.iter().any(|r| r["type"] == "warmStart"), "{log:?}");
    let (cold, _) = watch(&[
        "--run-id",
        "r-fork",
        "--sandbox-id",
        "s-net",
        "--allow-network",
    ]);
    assert!(
        cold.iter().any(|(_, _, cmd)| cmd.contains("--zygote")),
        "a cold start forks from the zygote: {cold:?}"
    );
    assert!(
        !cold.iter().any(|(_, name, _)| name == "smithers-init"),
        "{cold:?}"
    );
}
