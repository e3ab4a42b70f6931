//! Persistent homes through the real CLI: `run --home NAME` gives the step's `$HOME` the
//! named home kept across runs (a session's too), never in the patches, never the host's own
//! home, named in the enforcement report; `home ls` and `home rm` see and remove it; a remote
//! runtime refuses it. Needs native sandboxes (`SKIP` without; fails under `CI=true`).

use std::process::{Command, Output, Stdio};

use serde_json::Value;

mod support;

use support::native::{bin, sandboxes_usable};

struct Env {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    homes: std::path::PathBuf,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("project");
        let homes = dir.path().join("homes");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("a.txt"), "a\n").unwrap();
        Env {
            _dir: dir,
            root,
            homes,
        }
    }

    fn cli(&self) -> Command {
        let mut c = bin();
        c.env("SMITHERS_HOMES_DIR", &self.homes)
            .env("SMITHERS_RESIDENT", "off")
            .env("SMITHERS_RESIDENT_DIR", self._dir.path().join("sessions"))
            .current_dir(&self.root)
            .stdin(Stdio::null());
        c
    }

    fn run_json(&self, args: &[&str]) -> Value {
        let out = self.cli().arg("--json").args(args).output().unwrap();
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", text(&out)))
    }
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout {}\nstderr {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

impl Env {
    /// `run ARGS` as a user runs it: the step's stdout is ours.
    fn run_out(&self, args: &[&str]) -> String {
        let out = self.cli().arg("run").args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

#[test]
fn a_home_is_kept_across_runs_and_sessions_and_never_in_the_patches() {
    if !sandboxes_usable() {
        return;
    }
    let env = Env::new();
    let first = env.run_json(&[
        "run",
        "--home",
        "agent",
        "--",
        "sh",
        "-c",
        "echo token > ~/.login && mkdir -p ~/.cache && echo c > ~/.cache/x && echo b > b.txt",
    ]);
    assert_eq!(first["exitCode"], 0, "{first}");
    let paths: Vec<&str> = first["patches"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["path"].as_str())
        .collect();
    assert_eq!(paths, ["b.txt"], "{first}");
    let fs_row = first["enforcement"]["protections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "filesystem")
        .unwrap()
        .clone();
    assert!(
        fs_row["detail"]
            .as_str()
            .unwrap()
            .contains("persistent home \"agent\""),
        "{fs_row}"
    );
    // The next run (and a session) finds what the first kept; a run without it does not.
    let second = env.run_out(&[
        "--home",
        "agent",
        "--",
        "sh",
        "-c",
        "cat ~/.login ~/.cache/x",
    ]);
    assert_eq!(second, "token\nc\n");
    let without = env.run_out(&["--", "sh", "-c", "ls -A ~ | wc -l"]);
    assert_eq!(without.trim(), "0");
    let started = env.run_json(&["session", "start", "--home", "agent"]);
    let id = started["sessionId"].as_str().unwrap().to_string();
    let out = env
        .cli()
        .args([
            "session",
            "exec",
            &id,
            "-n",
            "--",
            "cat",
            "/home/sandbox/.login",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "token\n",
        "{}",
        text(&out)
    );
    env.run_json(&["session", "stop", &id]);

    let homes = env.run_json(&["home", "ls"]);
    assert_eq!(homes[0]["name"], "agent", "{homes}");
    assert!(homes[0]["bytes"].as_u64().unwrap() >= 8, "{homes}");
    let removed = env.run_json(&["home", "rm", "agent"]);
    assert_eq!(removed["removed"], "agent");
    let again = env.run_out(&["--home", "agent", "--", "sh", "-c", "ls -A ~ | wc -l"]);
    assert_eq!(again.trim(), "0");
    let missing = env.run_json(&["home", "rm", "nobody"]);
    assert_eq!(missing["code"], "NOT_FOUND", "{missing}");
}

#[test]
fn a_home_name_is_a_name_and_a_remote_runtime_refuses_one() {
    let env = Env::new();
    for bad in ["../etc", "a/b", ".."] {
        let out = env.run_json(&["run", "--home", bad, "--", "true"]);
        assert_eq!(out["code"], "INVALID_INPUT", "{bad}: {out}");
    }
    let out = env.run_json(&[
        "run",
        "--runtime",
        "codeplane",
        "--home",
        "agent",
        "--",
        "true",
    ]);
    assert_eq!(out["code"], "INVALID_INPUT", "{out}");
    assert!(!env.homes.exists(), "a refused home was made");
}
