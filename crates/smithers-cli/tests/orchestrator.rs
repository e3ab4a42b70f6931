//! The orchestrator-facing commands, run as a user would through the real binary and the
//! native runtime: run → review → accept/reject, conflicts, `--json` shapes, events replay and
//! follow, Ctrl-C, crash recovery after a killed `run`, metrics from the database.
//!
//! Every test needs real sandboxes (user/mount/pid namespaces and an overlay workspace). When
//! the host cannot provide them (asked through `smithers-sandbox doctor --json`) the test
//! prints `SKIP <reason>`; under `CI=true` it fails instead.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_smithers-sandbox"));
    // Hints and colours must not depend on the caller's terminal or environment.
    c.env_remove("SMITHERS_DB").env("NO_COLOR", "1");
    c
}

/// Whether this host can run native sandboxes (SKIP otherwise, panic under CI=true).
fn usable() -> bool {
    let out = bin().args(["doctor", "--json"]).output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let missing: Vec<String> = [
        "user-namespace",
        "mount-namespace",
        "pid-namespace",
        "workspace-cow",
    ]
    .iter()
    .filter(|name| {
        !report["protections"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["name"] == **name && p["status"] == "enforced")
    })
    .map(|s| s.to_string())
    .collect();
    missing.is_empty()
        || smithers_test_support::skip_or_fail(&format!(
            "native sandboxes unavailable: {missing:?}; doctor said: {}",
            String::from_utf8_lossy(&out.stdout)
        ))
}

/// A tiny project with a typo.
fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("app.py"),
        "def greet(name):\n    return \"Helo, \" + name\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("README"), "demo\n").unwrap();
    dir
}

fn root_arg(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

fn cli(root: &Path, args: &[&str]) -> Output {
    bin()
        .args(args)
        .arg("--root")
        .arg(root)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

const FIX_SCRIPT: &str = "sed -i 's/Helo/Hello/' app.py && printf 'fixed the greeting\\n' > NOTES.md \
     && echo step-output-line && printf '{\"outputs\":{\"fixed\":true}}' > \"$SMITHERS_SANDBOX_RESULT_PATH\"";

/// `run --json` of the fixing step; returns the document.
fn run_fix(root: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["run", "--json"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        "--root",
        root.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        FIX_SCRIPT,
    ]);
    let out = bin().args(&args).stdin(Stdio::null()).output().unwrap();
    let doc = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{doc}");
    doc
}

fn read(p: PathBuf) -> String {
    std::fs::read_to_string(p).unwrap()
}

#[test]
fn run_then_review_then_accept_applies_to_the_host_tree() {
    if !usable() {
        return;
    }
    let dir = project();
    let root = dir.path();
    let doc = run_fix(root, &[]);
    assert_eq!(doc["status"], "review", "{doc}");
    assert_eq!(doc["stepStatus"], "finished");
    assert_eq!(doc["outputs"]["fixed"], true);
    assert_eq!(doc["review"]["state"], "pending");
    assert_eq!(doc["review"]["patchCount"], 2);
    assert_eq!(doc["review"]["totalDiffLines"], 3);
    let mut paths: Vec<&str> = doc["patches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    paths.sort();
    assert_eq!(paths, ["NOTES.md", "app.py"]);
    let sid = doc["sandboxId"].as_str().unwrap().to_string();
    let run_id = doc["runId"].as_str().unwrap().to_string();
    assert!(Path::new(doc["bundlePath"].as_str().unwrap())
        .join("README.md")
        .is_file());
    // Nothing applied yet.
    assert!(read(root.join("app.py")).contains("Helo"));
    assert!(!root.join("NOTES.md").exists());

    // review: stat block and unified diff, no colour when not a terminal.
    let out = cli(root, &["review", &sid]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("2 files changed, 2 insertions(+), 1 deletion(-)"),
        "{text}"
    );
    assert!(text.contains("diff --git a/app.py b/app.py"), "{text}");
    assert!(text.contains("-    return \"Helo, \" + name"), "{text}");
    assert!(text.contains("+    return \"Hello, \" + name"), "{text}");
    assert!(
        text.contains(&format!("smithers-sandbox accept {sid}")),
        "{text}"
    );
    assert!(!text.contains('\x1b'), "colour on a pipe: {text}");

    // review --json, addressed as run:sandbox.
    let out = cli(root, &["review", "--json", &format!("{run_id}:{sid}")]);
    let rv = json_of(&out);
    assert_eq!(rv["runId"], run_id.as_str());
    assert_eq!(rv["sandboxId"], sid.as_str());
    assert_eq!(rv["status"], "review");
    assert_eq!(rv["review"]["state"], "pending");
    assert!(rv["diff"].as_str().unwrap().contains("+fixed the greeting"));
    let app = rv["patches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["path"] == "app.py")
        .unwrap();
    assert_eq!(
        (app["added"].as_u64(), app["removed"].as_u64()),
        (Some(1), Some(1))
    );

    // accept applies.
    let out = cli(root, &["accept", "--json", &sid]);
    let acc = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{acc}");
    assert_eq!(acc["status"], "finished");
    assert_eq!(acc["review"], "applied");
    assert_eq!(acc["appliedPatches"], 2);
    assert!(read(root.join("app.py")).contains("\"Hello, \""));
    assert_eq!(read(root.join("NOTES.md")), "fixed the greeting\n");

    // ls / show reflect it.
    let ls = json_of(&cli(root, &["ls", "--json", "--run", &run_id]));
    assert_eq!(ls.as_array().unwrap().len(), 1);
    assert_eq!(ls[0]["status"], "finished");
    assert_eq!(ls[0]["review"]["state"], "applied");
    let show = json_of(&cli(root, &["show", "--json", &sid]));
    assert_eq!(show["status"], "finished");
    let types: Vec<&str> = show["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "SandboxCreated",
            "SandboxShipped",
            "SandboxHeartbeat",
            "SandboxBundleReceived",
            "SandboxDiffReviewRequested",
            "SandboxDiffAccepted",
            "SandboxCompleted"
        ]
    );
    // A second accept is refused: the review is decided.
    let again = cli(root, &["accept", &sid]);
    assert_eq!(again.status.code(), Some(1));
}

#[test]
fn reject_leaves_the_host_tree_untouched() {
    if !usable() {
        return;
    }
    let dir = project();
    let root = dir.path();
    let before = read(root.join("app.py"));
    let doc = run_fix(root, &[]);
    let sid = doc["sandboxId"].as_str().unwrap();
    let out = cli(root, &["reject", "--json", sid, "--reason", "not this way"]);
    let rj = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{rj}");
    assert_eq!(rj["review"], "rejected");
    assert_eq!(rj["status"], "failed");
    assert_eq!(rj["patches"].as_array().unwrap().len(), 2);
    assert_eq!(read(root.join("app.py")), before);
    assert!(!root.join("NOTES.md").exists());
    let events = cli(root, &["events", "--json", doc["runId"].as_str().unwrap()]);
    let text = String::from_utf8(events.stdout).unwrap();
    let rejected: Value = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["type"] == "SandboxDiffRejected")
        .expect("a SandboxDiffRejected event");
    assert_eq!(rejected["reason"], "not this way");
}

#[test]
fn accept_with_a_conflict_names_the_file_and_applies_nothing() {
    if !usable() {
        return;
    }
    let dir = project();
    let root = dir.path();
    let doc = run_fix(root, &[]);
    let sid = doc["sandboxId"].as_str().unwrap();
    // The host changes the same line meanwhile.
    let host = "def greet(name):\n    return \"Hi, \" + name\n";
    std::fs::write(root.join("app.py"), host).unwrap();
    let out = cli(root, &["accept", sid]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("TOOL_PATCH_FAILED"), "{err}");
    assert!(err.contains("conflict: app.py"), "{err}");
    assert_eq!(read(root.join("app.py")), host);
    assert!(!root.join("NOTES.md").exists(), "partial apply");
    // The review is still pending: a retry fails the same way (nothing written)...
    let out = cli(root, &["accept", "--json", sid]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_of(&out)["review"], "pending");
    assert_eq!(read(root.join("app.py")), host);
    // ...and one asking for conflict markers resolves it: both versions of the line are in
    // app.py between markers, and the rest of the change is applied.
    let out = cli(root, &["accept", "--json", "--conflict-markers", sid]);
    let doc = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{doc}");
    assert_eq!(doc["conflictMarkers"], serde_json::json!(["app.py"]));
    let merged = read(root.join("app.py"));
    assert!(
        merged.contains("<<<<<<< host\n") && merged.contains(">>>>>>> sandbox\n"),
        "{merged}"
    );
    assert!(merged.contains("Hi, "), "the host's line is kept: {merged}");
    assert!(root.join("NOTES.md").exists(), "the rest is applied");
}

#[test]
fn json_shapes_of_finished_failed_and_auto_accepted_steps() {
    if !usable() {
        return;
    }
    let dir = project();
    let root = dir.path();
    let r = root_arg(root);
    // No change: finished, no patches, no review.
    let out = bin()
        .args(["run", "--json", "--root", &r, "--", "true"])
        .output()
        .unwrap();
    let doc = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{doc}");
    for key in [
        "runId",
        "sandboxId",
        "status",
        "bundlePath",
        "patches",
        "outputs",
    ] {
        assert!(doc.get(key).is_some(), "missing {key}: {doc}");
    }
    assert_eq!(doc["status"], "finished");
    assert_eq!(doc["patches"], Value::Array(vec![]));
    assert_eq!(doc["review"], Value::Null);
    assert_eq!(doc["db"], format!("{r}/.smithers/sandbox.db").as_str());

    // A failing step: status failed, its exit code becomes ours.
    let out = bin()
        .args(["run", "--json", "--root", &r, "--", "sh", "-c", "exit 3"])
        .output()
        .unwrap();
    let doc = json_of(&out);
    assert_eq!(out.status.code(), Some(3), "{doc}");
    assert_eq!(doc["status"], "failed");
    assert_eq!(doc["exitCode"], 3);

    // --auto-accept: applied at once, with explicit ids and a separate database.
    let db = root.join("other.db");
    let out = bin()
        .args([
            "run",
            "--json",
            "--auto-accept",
            "--run-id",
            "r1",
            "--sandbox-id",
            "s1",
            "--root",
            &r,
            "--db",
            db.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            FIX_SCRIPT,
        ])
        .output()
        .unwrap();
    let doc = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{doc}");
    assert_eq!(
        (&doc["runId"], &doc["sandboxId"], &doc["status"]),
        (
            &Value::from("r1"),
            &Value::from("s1"),
            &Value::from("finished")
        )
    );
    assert_eq!(doc["appliedPatches"], 2);
    assert!(read(root.join("app.py")).contains("Hello"));
    // That run is in the other database only.
    let ls = json_of(&cli(root, &["ls", "--json", "--run", "r1"]));
    assert_eq!(ls, Value::Array(vec![]));
    let ls = bin()
        .args(["ls", "--json", "--db", db.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(json_of(&ls)[0]["sandboxId"], "s1");

    // Bad input: a coded error, nothing run.
    let out = bin()
        .args([
            "run",
            "--json",
            "--root",
            &r,
            "--timeout",
            "soon",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_of(&out)["code"], "INVALID_INPUT");
    // Unknown id.
    let out = cli(root, &["show", "--json", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_of(&out)["code"], "INVALID_INPUT");
}

fn event_lines(out: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn events_replay_from_a_seq_and_follow_until_the_run_settles() {
    if !usable() {
        return;
    }
    let dir = project();
    let root = dir.path();
    let r = root_arg(root);
    let out = bin()
        .args([
            "run", "--json", "--run-id", "ev", "--root", &r, "--", "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let all = event_lines(&cli(root, &["events", "--json", "ev"]).stdout);
    let seqs: Vec<i64> = all.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (0..all.len() as i64).collect::<Vec<_>>());
    assert_eq!(all[0]["type"], "SandboxCreated");
    assert_eq!(all.last().unwrap()["type"], "SandboxCompleted");
    let tail = event_lines(&cli(root, &["events", "--json", "--since", "2", "ev"]).stdout);
    assert_eq!(tail, all[2..]);
    let human = String::from_utf8(cli(root, &["events", "ev"]).stdout).unwrap();
    assert!(
        human.contains("#0") && human.contains("SandboxCompleted"),
        "{human}"
    );

    // Follow a second sandbox of the same run while it runs; the follower ends by itself.
    let mut step = bin()
        .args([
            "run",
            "--json",
            "--run-id",
            "ev",
            "--sandbox-id",
            "slow",
            "--root",
            &r,
            "--",
            "sh",
            "-c",
            "sleep 1; echo done",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_status(root, "ev", "slow", &["shipped", "finished"]);
    let follower = bin()
        .args(["events", "--json", "--follow", "--since"])
        .arg(all.len().to_string())
        .args(["ev", "--root", &r])
        .output()
        .unwrap();
    assert_eq!(follower.status.code(), Some(0));
    let followed = event_lines(&follower.stdout);
    assert_eq!(followed[0]["seq"].as_i64(), Some(all.len() as i64));
    assert_eq!(followed[0]["sandboxId"], "slow");
    assert_eq!(followed.last().unwrap()["type"], "SandboxCompleted");
    assert_eq!(followed.last().unwrap()["sandboxId"], "slow");
    assert!(step.wait().unwrap().success());
}

/// Polls `ls --json` until the sandbox has one of `statuses` (no timing assertion: a generous
/// ceiling only turns a hang into a failure).
fn wait_for_status(root: &Path, run: &str, sid: &str, statuses: &[&str]) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ls = json_of(&cli(root, &["ls", "--json", "--run", run]));
        if let Some(row) =
            ls.as_array().unwrap().iter().find(|r| {
                r["sandboxId"] == sid && statuses.contains(&r["status"].as_str().unwrap())
            })
        {
            return row.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{sid} never reached {statuses:?}: {ls}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn spawn_sleeper(root: &Path, run: &str, sid: &str) -> Child {
    bin()
        .args([
            "run",
            "--json",
            "--run-id",
            run,
            "--sandbox-id",
            sid,
            "--root",
        ])
        .arg(root)
        .args(["--", "sh", "-c", "echo started; sleep 60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn ctrl_c_cancels_the_step() {
    if !usable() {
        return;
    }
    let dir = project();
    let root = dir.path();
    let mut child = spawn_sleeper(root, "cc", "s");
    wait_for_status(root, "cc", "s", &["shipped"]);
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    let rc = unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    assert_eq!(rc, 0);
    let out = wait_with_output(&mut child);
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = json_of(&out);
    assert_eq!(doc["status"], "cancelled");
    let row = wait_for_status(root, "cc", "s", &["cancelled"]);
    assert_eq!(row["status"], "cancelled");
}

/// A SIGTERM (a CI job's timeout, a supervisor) or a SIGHUP (a closed terminal) is a Ctrl-C:
/// the step is cancelled and cleaned up, not left to a later recovery.
#[test]
fn sigterm_and_sighup_cancel_the_step_as_ctrl_c_does() {
    if !usable() {
        return;
    }
    let dir = project();
    let root = dir.path();
    for (signal, sandbox) in [(libc::SIGTERM, "term"), (libc::SIGHUP, "hup")] {
        let mut child = spawn_sleeper(root, "sig", sandbox);
        wait_for_status(root, "sig", sandbox, &["shipped"]);
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let out = wait_with_output(&mut child);
        assert_eq!(
            out.status.code(),
            Some(130),
            "{signal}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(json_of(&out)["status"], "cancelled");
        wait_for_status(root, "sig", sandbox, &["cancelled"]);
    }
}

fn wait_with_output(child: &mut Child) -> Output {
    let status = child.wait().unwrap();
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    use std::io::Read;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    Output {
        status,
        stdout,
        stderr,
    }
}

#[test]
fn a_killed_run_is_recovered_by_the_next_command() {
    if !usable() {
        return;
    }
    let dir = project();
    let root = dir.path();
    let mut child = spawn_sleeper(root, "crash", "s");
    wait_for_status(root, "crash", "s", &["shipped"]);
    child.kill().unwrap(); // SIGKILL: no cleanup, no final row
    child.wait().unwrap();
    // The next command that opens the store recovers it.
    let out = cli(root, &["ls", "--run", "crash"]);
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("recovered orphaned sandbox crash:s"), "{err}");
    let ls = json_of(&cli(root, &["ls", "--json", "--run", "crash"]));
    assert_eq!(ls[0]["status"], "failed");
    let events = event_lines(&cli(root, &["events", "--json", "crash"]).stdout);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "SandboxFailed");
    assert_eq!(last["error"]["details"]["reason"], "orphaned");
    assert_eq!(last["error"]["details"]["cleanedUp"], true, "{last}");
    // The slot is free again: the same ids can run, when asked for (never silently).
    let again = |replace: bool| {
        let mut cmd = bin();
        cmd.args(["run", "--json", "--run-id", "crash", "--sandbox-id", "s"]);
        if replace {
            cmd.arg("--replace");
        }
        cmd.arg("--root")
            .arg(root)
            .args(["--", "true"])
            .output()
            .unwrap()
    };
    let refused = again(false);
    assert!(!refused.status.success(), "reused ids without --replace");
    assert_eq!(json_of(&again(true))["status"], "finished");
}

#[test]
fn metrics_are_derived_from_the_database() {
    if !usable() {
        return;
    }
    let dir = project();
    let root = dir.path();
    let r = root_arg(root);
    for cmd in ["true", "false"] {
        bin()
            .args(["run", "--json", "--root", &r, "--", cmd])
            .output()
            .unwrap();
    }
    let out = cli(root, &["metrics"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "smithers_sandbox_created_total{runtime=\"bubblewrap\"} 2\n",
        "smithers_sandbox_completed_total{runtime=\"bubblewrap\",status=\"finished\"} 1\n",
        "smithers_sandbox_completed_total{runtime=\"bubblewrap\",status=\"failed\"} 1\n",
        "smithers_sandbox_duration_ms_count 2\n",
        "smithers_sandbox_bundle_size_bytes_count 2\n",
        "smithers_sandbox_patch_count_count 2\n",
        "smithers_sandbox_transport_duration_ms_count 6\n",
        "# TYPE smithers_sandbox_active gauge\n",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

/// Every file under `root` but `.smithers/`: relative path → (mode, content or link target).
fn snapshot(root: &Path) -> std::collections::BTreeMap<String, (u32, Vec<u8>)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_str()
                .unwrap()
                .to_string();
            if rel == ".smithers" {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode();
            if meta.is_dir() {
                out.insert(rel, (mode, Vec::new()));
                stack.push(path);
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(rel, (mode, target.into_os_string().into_encoded_bytes()));
            } else {
                out.insert(rel, (mode, std::fs::read(&path).unwrap()));
            }
        }
    }
    out
}

/// Host pids whose command line contains `marker`.
fn marker_pids(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

/// The step's own processes carrying `marker`: those whose program is `sh` (the step and
/// its daemonised child). Any other process is not the step: the `run` process itself, and
/// for an instant each process it forks (the sandbox's init) or spawns (before its exec),
/// carry the same command line.
fn step_pids(marker: &str) -> Vec<u32> {
    marker_pids(marker)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).next() == Some(b"sh".as_slice()))
        })
        .collect()
}

/// The orchestrating process is SIGKILLed mid-step 20 times in a row (three runs, a new
/// sandbox each time, each step modifying the workspace and leaving a daemonised child). Then:
/// no sandbox process is left, every row is terminal, every run's `seq` is gap-free from 0,
/// every orphan was cleaned up, and the host tree is byte-identical to before.
#[test]
fn twenty_sigkills_in_a_row_leave_nothing_behind() {
    if !usable() {
        return;
    }
    let dir = project();
    let root = dir.path();
    let before = snapshot(root);
    let marker = format!("smithers-crash-marker-{}", std::process::id());
    let runs = ["crash-a", "crash-b", "crash-c"];
    for i in 0..20 {
        let run = runs[i % runs.len()];
        let sid = format!("s{i:02}");
        // Each iteration's processes carry their own marker (which contains the common one):
        // the previous iteration's sandbox may still be dying when this one starts.
        let this = format!("{marker}-it{i:02}-");
        let script = format!(
            "echo changed >> app.py; echo new > new.txt; (setsid sh -c 'sleep 600; : {this}' &); sleep 600; : {this}"
        );
        let mut child = bin()
            .args([
                "run",
                "--json",
                "--run-id",
                run,
                "--sandbox-id",
                &sid,
                "--root",
            ])
            .arg(root)
            .args(["--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Mid-step: the step (and its daemonised child) is running inside the sandbox.
        let deadline = Instant::now() + Duration::from_secs(60);
        while step_pids(&this).len() < 2 {
            assert!(
                Instant::now() < deadline,
                "iteration {i}: the step never started"
            );
            if let Some(status) = child.try_wait().unwrap() {
                panic!("iteration {i}: run exited early: {status:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }

    // The next command recovers whatever the last kill left.
    let out = cli(root, &["ls"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // No sandbox process is left (bounded wait for the kernel to reap the last ones).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = marker_pids(&marker);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sandbox processes survived: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Every row terminal, every orphan cleaned up, every run's seq gap-free.
    let ls = json_of(&cli(root, &["ls", "--json"]));
    let rows = ls.as_array().unwrap();
    assert_eq!(rows.len(), 20, "{ls}");
    for row in rows {
        assert!(
            ["finished", "failed", "cancelled"].contains(&row["status"].as_str().unwrap()),
            "non-terminal row: {row}"
        );
    }
    for run in runs {
        let events = event_lines(&cli(root, &["events", "--json", run]).stdout);
        let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
        assert_eq!(
            seqs,
            (0..seqs.len() as i64).collect::<Vec<_>>(),
            "{run}: gaps in {seqs:?}"
        );
        let orphans: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "SandboxFailed")
            .collect();
        assert!(
            !orphans.is_empty(),
            "{run}: no sandbox was recorded as failed"
        );
        for e in orphans {
            assert_eq!(e["error"]["details"]["reason"], "orphaned", "{e}");
            assert_eq!(e["error"]["details"]["cleanedUp"], true, "{e}");
        }
    }

    // The host tree is untouched: the steps' writes stayed in their overlays.
    assert_eq!(snapshot(root), before, "the host tree changed");
}

/// The host edits the same file, away from the step's change, while the change waits for
/// review: accepting merges both (the patch is relocated onto the host's version), and the
/// review's base hash no longer matching is not a conflict by itself.
#[test]
fn accept_merges_a_host_edit_elsewhere_in_the_same_file() {
    if !usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let lines: Vec<String> = (1..=20).map(|i| format!("line {i}")).collect();
    std::fs::write(root.join("notes.txt"), lines.join("\n") + "\n").unwrap();
    let out = bin()
        .args(["run", "--json", "--root"])
        .arg(root)
        .args([
            "--",
            "sh",
            "-c",
            "sed -i 's/^line 2$/line two (sandbox)/' notes.txt",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let doc = json_of(&out);
    assert_eq!(doc["status"], "review", "{doc}");
    let sid = doc["sandboxId"].as_str().unwrap();

    // Meanwhile, on the host: line 19 changes.
    let mut host = lines.clone();
    host[18] = "line nineteen (host)".to_string();
    std::fs::write(root.join("notes.txt"), host.join("\n") + "\n").unwrap();

    let out = cli(root, &["accept", sid]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut expected = host;
    expected[1] = "line two (sandbox)".to_string();
    assert_eq!(read(root.join("notes.txt")), expected.join("\n") + "\n");
}

/// `run --workspace copy`: the step runs in a copy of the project, the review and accept work
/// as with the overlay, the bundle's log says the workspace was a copy and why; `doctor`
/// reports the copy as degraded (still usable) under `$SMITHERS_SANDBOX_WORKSPACE=copy`.
#[test]
fn copy_workspace_runs_end_to_end_and_is_reported() {
    if !usable() {
        return;
    }
    let dir = project();
    let root = dir.path();
    let doc = run_fix(root, &["--workspace", "copy"]);
    assert_eq!(doc["status"], "review", "{doc}");
    let mut paths: Vec<&str> = doc["patches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    paths.sort();
    assert_eq!(paths, ["NOTES.md", "app.py"]);
    assert!(read(root.join("app.py")).contains("Helo"), "host untouched");
    assert!(!root.join("NOTES.md").exists());
    let log = read(Path::new(doc["bundlePath"].as_str().unwrap()).join("logs/stream.ndjson"));
    let record: Value = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["type"] == "workspace")
        .expect("a workspace record in the bundle's log");
    assert_eq!(record["mode"], "copy");
    assert!(record["reason"].as_str().unwrap().contains("requested"));
    let sid = doc["sandboxId"].as_str().unwrap();
    let acc = json_of(&cli(root, &["accept", "--json", sid]));
    assert_eq!(acc["review"], "applied", "{acc}");
    assert!(read(root.join("app.py")).contains("\"Hello, \""));

    let out = bin()
        .args(["doctor", "--json"])
        .env("SMITHERS_SANDBOX_WORKSPACE", "copy")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "a copy workspace is usable");
    let report = json_of(&out);
    let row = report["protections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "workspace-cow")
        .unwrap();
    assert_eq!(row["status"], "degraded", "{row}");
    let bad = bin()
        .args(["doctor", "--json"])
        .env("SMITHERS_SANDBOX_WORKSPACE", "sideways")
        .output()
        .unwrap();
    assert_eq!(
        bad.status.code(),
        Some(2),
        "an unknown mode is a usage error"
    );
}
