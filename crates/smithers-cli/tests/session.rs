//! Sessions through the real CLI on native sandboxes: `session start` holds a sandbox,
//! `session exec`, `read` and `write` drive it command by command, `session stop` ends it in
//! the same review as a run's, and `accept` applies exactly that.
//!
//! Each test has its own sessions directory (`SMITHERS_RESIDENT_DIR`) and project. Needs
//! native sandboxes; prints `SKIP <reason>` without them (fails under `CI=true`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod support;

use support::native::{bin, sandboxes_usable};

/// A project and a private sessions directory.
struct Env {
    _dir: tempfile::TempDir,
    root: PathBuf,
    sessions: PathBuf,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("project");
        let sessions = dir.path().join("sessions");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&sessions).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&sessions, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(root.join("a.txt"), "hello\n").unwrap();
        Env {
            _dir: dir,
            root,
            sessions,
        }
    }

    fn cli(&self) -> Command {
        let mut c = bin();
        c.env("SMITHERS_RESIDENT_DIR", &self.sessions)
            .env("SMITHERS_RESIDENT", "off")
            .current_dir(&self.root);
        c
    }

    fn start(&self, extra: &[&str]) -> String {
        let out = self
            .cli()
            .args(["session", "start", "--json"])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "session start: {}", text(&out));
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        doc["sessionId"].as_str().unwrap().to_string()
    }

    /// `session exec ID ARGS… -- CMD…` with `stdin` bytes.
    fn exec(&self, id: &str, opts: &[&str], cmd: &[&str], stdin: &[u8]) -> Output {
        let mut child = self
            .cli()
            .args(["session", "exec", id])
            .args(opts)
            .arg("--")
            .args(cmd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        let bytes = stdin.to_vec();
        let feeder = std::thread::spawn(move || {
            let _ = input.write_all(&bytes);
        });
        let out = child.wait_with_output().unwrap();
        feeder.join().unwrap();
        out
    }

    fn sh(&self, id: &str, script: &str) -> Output {
        self.exec(id, &[], &["sh", "-c", script], b"")
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.cli().args(args).arg("--json").output().unwrap();
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", text(&out)))
    }

    fn holder_pid(&self, id: &str) -> i32 {
        let list = self.json(&["session", "ls"]);
        let s = list
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["sessionId"] == id)
            .unwrap_or_else(|| panic!("{id} not listed: {list}"));
        s["pid"].as_i64().unwrap() as i32
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

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

/// Host processes whose command line holds `token`.
fn pids_with(token: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(token) && pid != std::process::id() {
            pids.push(pid);
        }
    }
    pids
}

fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let began = Instant::now();
    while began.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

#[test]
fn a_session_runs_many_commands_byte_exact_and_ends_in_the_review_accept_applies() {
    if !sandboxes_usable() {
        return;
    }
    let env = Env::new();
    let id = env.start(&[]);

    // stdin, stdout and stderr byte for byte; the exit code is exec's own.
    let all: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let out = env.exec(
        &id,
        &[],
        &["sh", "-c", "cat; printf 'e\\000rr' >&2; exit 7"],
        &all,
    );
    assert_eq!(code(&out), 7, "{}", text(&out));
    assert!(
        out.stdout == all,
        "stdout differs ({} bytes)",
        out.stdout.len()
    );
    assert_eq!(out.stderr, b"e\0rr");
    // A signal is 128 + its number, as a shell says.
    assert_eq!(code(&env.sh(&id, "kill -9 $$")), 137);

    // Each exec's env and cwd are its own; the workspace is shared.
    env.sh(&id, "mkdir -p sub && echo one > sub/f");
    let out = env.exec(
        &id,
        &["--cwd", "sub", "--env", "K=v1"],
        &["sh", "-c", "echo $K; cat f; pwd"],
        b"",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "v1\none\n/workspace/sub\n",
        "{}",
        text(&out)
    );
    let out = env.sh(&id, "echo \"[$K]\"; pwd");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[]\n/workspace\n");

    // A timed-out command is killed (124) and the session goes on.
    let out = env.exec(&id, &["--timeout", "300ms"], &["sleep", "30"], b"");
    assert_eq!(code(&out), 124, "{}", text(&out));

    // Files: bytes in, the same bytes out, parents made; absence is NOT_FOUND.
    let mut bin_bytes = all[..70_000].to_vec();
    bin_bytes.extend_from_slice(b"\r\n\x1b[2J\xff\xfe");
    let mut w = env
        .cli()
        .args(["session", "write", &id, "deep/er/blob.bin"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    w.stdin.take().unwrap().write_all(&bin_bytes).unwrap();
    assert!(w.wait().unwrap().success());
    let out = env
        .cli()
        .args(["session", "read", &id, "deep/er/blob.bin"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        out.stdout == bin_bytes,
        "read back {} bytes",
        out.stdout.len()
    );
    let missing = env
        .cli()
        .args(["--json", "session", "read", &id, "no/such"])
        .output()
        .unwrap();
    assert_eq!(code(&missing), 1);
    let err: Value = serde_json::from_slice(&missing.stdout).unwrap();
    assert_eq!(err["code"], "NOT_FOUND", "{err}");

    // A hundred commands in the one sandbox.
    for i in 0..100 {
        let out = env.exec(&id, &["-n"], &["true"], b"");
        assert_eq!(code(&out), 0, "exec {i}: {}", text(&out));
    }

    // The change so far, as review shows it, while the session goes on.
    let diff = env.json(&["session", "diff", &id]);
    let paths: Vec<&str> = diff["patches"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["path"].as_str())
        .collect();
    assert!(
        paths.contains(&"deep/er/blob.bin") && paths.contains(&"sub/f"),
        "{diff}"
    );

    // Nothing reached the project yet.
    assert_eq!(
        std::fs::read_to_string(env.root.join("a.txt")).unwrap(),
        "hello\n"
    );
    env.sh(&id, "echo more >> a.txt");
    let stop = env.json(&["session", "stop", &id]);
    assert_eq!(stop["status"], "review", "{stop}");
    assert!(
        !env.root.join("deep").exists(),
        "the project changed before accept"
    );
    let shown = env.json(&["review", &id]);
    let files: Vec<String> = shown["patches"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .filter_map(|f| f["path"].as_str().map(str::to_string))
        .collect();
    assert!(files.iter().any(|f| f == "a.txt"), "{shown}");
    let accepted = env.cli().args(["accept", &id]).output().unwrap();
    assert!(accepted.status.success(), "{}", text(&accepted));
    assert_eq!(
        std::fs::read_to_string(env.root.join("a.txt")).unwrap(),
        "hello\nmore\n"
    );
    assert_eq!(
        std::fs::read(env.root.join("deep/er/blob.bin")).unwrap(),
        bin_bytes
    );
    assert_eq!(
        std::fs::read_to_string(env.root.join("sub/f")).unwrap(),
        "one\n"
    );
    // Every command is an event of the session.
    let events = env.cli().args(["events", &id, "--json"]).output().unwrap();
    let execs = String::from_utf8_lossy(&events.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == "SessionExec")
        .count();
    assert!(execs >= 100, "{execs} SessionExec events");
}

#[test]
fn commands_run_at_once_and_a_client_that_goes_away_kills_its_command() {
    if !sandboxes_usable() {
        return;
    }
    let env = Env::new();
    let id = env.start(&[]);
    // The first waits for what the second writes: both must run at once.
    let waiter = {
        let mut c = env.cli();
        c.args(["session", "exec", &id, "-n", "--timeout", "20s", "--"])
            .args([
                "sh",
                "-c",
                "while [ ! -e flag ]; do sleep 0.02; done; echo seen",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(code(&env.sh(&id, "touch flag")), 0);
    let out = waiter.wait_with_output().unwrap();
    assert_eq!(
        (code(&out), out.stdout.as_slice()),
        (0, &b"seen\n"[..]),
        "{}",
        text(&out)
    );

    // A client killed mid-command: the command is killed too, the session stays.
    let token = format!("sess-hangup-{}", std::process::id());
    let mut client = env
        .cli()
        .args([
            "session",
            "exec",
            &id,
            "-n",
            "--",
            "sh",
            "-c",
            &format!("sleep 1000 # {token}"),
        ])
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || !pids_with(&token).is_empty()));
    client.kill().unwrap();
    client.wait().unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || pids_with(&token).is_empty()),
        "the command outlived its client: {:?}",
        pids_with(&token)
    );
    assert_eq!(code(&env.sh(&id, "true")), 0);
    let stop = env.json(&["session", "stop", &id]);
    assert_eq!(stop["ok"], true, "{stop}");
}

#[test]
fn an_idle_session_ends_itself_in_a_review() {
    if !sandboxes_usable() {
        return;
    }
    let env = Env::new();
    let id = env.start(&["--idle-timeout", "1s"]);
    assert_eq!(code(&env.sh(&id, "echo idle > idle.txt")), 0);
    assert!(
        wait_until(Duration::from_secs(30), || {
            env.json(&["session", "ls"])
                .as_array()
                .is_some_and(|l| l.is_empty())
        }),
        "the session is still held: {}",
        env.json(&["session", "ls"])
    );
    let row = env.json(&["show", &id]);
    assert_eq!(row["status"], "review", "{row}");
    let out = env.sh(&id, "true");
    assert_eq!(code(&out), 1);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no such session"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_killed_holder_takes_its_sandbox_with_it_and_is_recovered() {
    if !sandboxes_usable() {
        return;
    }
    let env = Env::new();
    let id = env.start(&[]);
    // A change frozen by a checkpoint and one made after it: both are the session's.
    assert_eq!(code(&env.sh(&id, "echo kept > lost.txt")), 0);
    let cp = env.json(&["session", "checkpoint", &id]);
    assert_eq!(cp["checkpoint"], "cp-1", "{cp}");
    assert_eq!(code(&env.sh(&id, "echo after > after.txt")), 0);
    let token = format!("sess-killed-{}", std::process::id());
    let mut bg = env
        .cli()
        .args([
            "session",
            "exec",
            &id,
            "-n",
            "--",
            "sh",
            "-c",
            &format!("sleep 1000 # {token}"),
        ])
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || !pids_with(&token).is_empty()));
    let pid = env.holder_pid(&id);
    // SAFETY-free: kill(1) as a process.
    assert!(Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let _ = bg.wait();
    assert!(
        wait_until(Duration::from_secs(15), || pids_with(&token).is_empty()),
        "the sandbox outlived its holder: {:?}",
        pids_with(&token)
    );
    let out = env.sh(&id, "true");
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("holder is gone"),
        "{}",
        text(&out)
    );
    // The next command in the project finds the session lost, and its change (made before
    // the holder died) waiting for review; accept applies it.
    let row = env.json(&["show", &id]);
    assert_eq!(row["status"], "review", "{row}");
    let events: Vec<&str> = row["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["type"].as_str())
        .collect();
    assert!(events.contains(&"SessionLost"), "{events:?}");
    assert!(!env.root.join("lost.txt").exists());
    let accepted = env.cli().args(["accept", &id]).output().unwrap();
    assert!(accepted.status.success(), "{}", text(&accepted));
    assert_eq!(
        std::fs::read_to_string(env.root.join("lost.txt")).unwrap(),
        "kept\n"
    );
    assert_eq!(
        std::fs::read_to_string(env.root.join("after.txt")).unwrap(),
        "after\n"
    );
}

#[test]
fn a_lost_session_that_changed_nothing_is_failed_as_lost() {
    if !sandboxes_usable() {
        return;
    }
    let env = Env::new();
    let id = env.start(&[]);
    let pid = env.holder_pid(&id);
    assert!(Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    assert!(wait_until(Duration::from_secs(10), || {
        !Path::new(&format!("/proc/{pid}")).exists()
    }));
    let row = env.json(&["show", &id]);
    assert_eq!(row["status"], "failed", "{row}");
    assert!(row.to_string().contains("lost"), "{row}");
}

/// Kills a session's holder and waits until it is gone.
fn kill_holder(env: &Env, id: &str) {
    let pid = env.holder_pid(id);
    assert!(Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    assert!(wait_until(Duration::from_secs(10), || {
        !Path::new(&format!("/proc/{pid}")).exists()
    }));
}

/// The project's database, and the one stored handle in it (the session's).
fn stored_handle(env: &Env) -> (rusqlite::Connection, Value) {
    let conn = rusqlite::Connection::open(env.root.join(".smithers/sandbox.db")).unwrap();
    let text: String = conn
        .query_row(
            "SELECT handle_json FROM _smithers_sandbox_leases WHERE handle_json IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    (conn, serde_json::from_str(&text).unwrap())
}

/// A crafted database (the project is not trusted) whose stored handle names another state
/// directory and project: recovery of the lost session collects nothing through them (the
/// victim's files stay as they were, none of their content reaches a review) and fails it.
#[test]
fn a_lost_session_whose_stored_handle_names_other_directories_is_not_collected_through_them() {
    if !sandboxes_usable() {
        return;
    }
    let env = Env::new();
    let id = env.start(&[]);
    assert_eq!(code(&env.sh(&id, "echo change > changed.txt")), 0);
    kill_holder(&env, &id);
    let victim = env._dir.path().join("victim");
    let secret = env._dir.path().join("secret");
    std::fs::create_dir_all(victim.join("artifacts")).unwrap();
    std::fs::create_dir_all(secret.join("artifacts")).unwrap();
    std::fs::write(victim.join("keep-layer"), b"").unwrap();
    std::fs::write(victim.join("stream.ndjson"), b"{\"victim\":1}\n").unwrap();
    std::fs::write(secret.join("secret.txt"), "host-secret-content\n").unwrap();
    std::fs::write(secret.join("artifacts/a.txt"), "host-artifact-content\n").unwrap();
    let (conn, mut handle) = stored_handle(&env);
    handle["backend"]["stateDir"] = Value::from(victim.to_str().unwrap());
    handle["backend"]["rootDir"] = Value::from(secret.to_str().unwrap());
    conn.execute(
        "UPDATE _smithers_sandbox_leases SET handle_json = ?1 WHERE handle_json IS NOT NULL",
        [handle.to_string()],
    )
    .unwrap();
    drop(conn);
    let out = env.cli().arg("ls").output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        victim.join("keep-layer").exists(),
        "the victim's file is gone"
    );
    assert_eq!(
        std::fs::read(victim.join("stream.ndjson")).unwrap(),
        b"{\"victim\":1}\n"
    );
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 3);
    let row = env.json(&["show", &id]);
    assert_eq!(row["status"], "failed", "{row}");
    assert!(row.to_string().contains("not trusted"), "{row}");
    let all = format!(
        "{row}{}",
        text(&env.cli().args(["show", &id]).output().unwrap())
    );
    assert!(!all.contains("host-secret-content") && !all.contains("host-artifact-content"));
    let result = Path::new(handle["resultPath"].as_str().unwrap());
    assert!(!result.join("README.md").exists(), "a bundle was written");
}

/// The session's directory in the project replaced by a link to a host directory after its
/// holder died: recovery neither removes nor writes anything there, and fails the session.
#[test]
fn a_lost_session_whose_sandbox_directory_is_a_link_is_not_collected() {
    if !sandboxes_usable() {
        return;
    }
    let env = Env::new();
    let id = env.start(&[]);
    assert_eq!(code(&env.sh(&id, "echo change > changed.txt")), 0);
    kill_holder(&env, &id);
    let host = env._dir.path().join("host");
    std::fs::create_dir_all(host.join("result")).unwrap();
    std::fs::write(host.join("result/precious.txt"), "precious\n").unwrap();
    let (conn, handle) = stored_handle(&env);
    drop(conn);
    let sandbox_root = PathBuf::from(handle["sandboxRoot"].as_str().unwrap());
    std::fs::rename(&sandbox_root, env._dir.path().join("moved")).unwrap();
    std::os::unix::fs::symlink(&host, &sandbox_root).unwrap();
    let out = env.cli().arg("ls").output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(host.join("result/precious.txt")).unwrap(),
        "precious\n"
    );
    assert_eq!(std::fs::read_dir(host.join("result")).unwrap().count(), 1);
    assert_eq!(std::fs::read_dir(&host).unwrap().count(), 1);
    let row = env.json(&["show", &id]);
    assert_eq!(row["status"], "failed", "{row}");
    assert!(row.to_string().contains("a link?"), "{row}");
}

fn docker_ready() -> bool {
    let ok = Command::new("docker")
        .args(["image", "inspect", "smithers-test:busybox"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok || smithers_test_support::skip_or_fail(
        "no Docker engine with smithers-test:busybox (scripts/docker-up.sh makes both)",
    )
}

/// The same verbs on a container: one long-lived container, each command a Docker exec.
#[test]
fn a_docker_session_runs_many_commands_and_ends_in_the_review() {
    if !docker_ready() {
        return;
    }
    let env = Env::new();
    let id = env.start(&["--runtime", "docker", "--image", "smithers-test:busybox"]);
    let all: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let out = env.exec(&id, &[], &["sh", "-c", "cat; echo err >&2; exit 4"], &all);
    assert_eq!(code(&out), 4, "{}", text(&out));
    assert!(
        out.stdout == all,
        "stdout differs ({} bytes)",
        out.stdout.len()
    );
    assert_eq!(out.stderr, b"err\n");
    assert_eq!(code(&env.sh(&id, "kill -9 $$")), 137);
    assert_eq!(code(&env.sh(&id, "mkdir sub")), 0);
    let out = env.exec(
        &id,
        &["--cwd", "sub", "--env", "K=v"],
        &["sh", "-c", "echo $K; pwd"],
        b"",
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "v\n/workspace/sub\n");
    for i in 0..100 {
        let out = env.exec(&id, &["-n"], &["true"], b"");
        assert_eq!(code(&out), 0, "exec {i}: {}", text(&out));
    }
    let mut w = env
        .cli()
        .args(["session", "write", &id, "d/blob.bin"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    w.stdin.take().unwrap().write_all(&all[..5000]).unwrap();
    assert!(w.wait().unwrap().success());
    let read = env
        .cli()
        .args(["session", "read", &id, "d/blob.bin"])
        .output()
        .unwrap();
    assert!(read.stdout == all[..5000], "{}", text(&read));
    // The diff holds the container still (paused) while it reads; a command asked for
    // meanwhile starts at the resume.
    let diff = env.json(&["session", "diff", &id]);
    assert!(diff.to_string().contains("d/blob.bin"), "{diff}");
    assert_eq!(code(&env.sh(&id, "true")), 0);
    // A container's workspace is not frozen in place: refused, never faked.
    let refused = env.json(&["session", "checkpoint", &id]);
    assert_eq!(refused["code"], "TASK_RUNTIME_UNAVAILABLE", "{refused}");
    let stop = env.json(&["session", "stop", &id]);
    assert_eq!(stop["status"], "review", "{stop}");
    let accepted = env.cli().args(["accept", &id]).output().unwrap();
    assert!(accepted.status.success(), "{}", text(&accepted));
    assert_eq!(
        std::fs::read(env.root.join("d/blob.bin")).unwrap(),
        &all[..5000]
    );
}

/// A docker session whose holder died: its layer is collected from the state directory
/// derived for it (the dead holder's memory is not needed) and opened for review.
#[test]
fn a_lost_docker_session_is_collected_for_review() {
    if !docker_ready() {
        return;
    }
    let env = Env::new();
    let id = env.start(&["--runtime", "docker", "--image", "smithers-test:busybox"]);
    assert_eq!(code(&env.sh(&id, "echo kept > lost.txt")), 0);
    kill_holder(&env, &id);
    let row = env.json(&["show", &id]);
    assert_eq!(row["status"], "review", "{row}");
    assert!(!env.root.join("lost.txt").exists());
    let accepted = env.cli().args(["accept", &id]).output().unwrap();
    assert!(accepted.status.success(), "{}", text(&accepted));
    assert_eq!(
        std::fs::read_to_string(env.root.join("lost.txt")).unwrap(),
        "kept\n"
    );
}

/// A session held on a sandbox host (`serve`): the holder is the host's client; the commands
/// run there, their bytes stream back; the change comes back for review here.
#[test]
fn a_session_on_a_sandbox_host_runs_there_and_its_change_comes_back_for_review() {
    if !sandboxes_usable() {
        return;
    }
    const TOKEN: &str = "session-host-token-0123456789";
    let env = Env::new();
    let data = support::serve::data_dir(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        "session-host",
    );
    let (addr, _pid) = support::serve::keep_for_process(support::serve::ServeOptions {
        token: TOKEN.into(),
        data_dir: data,
        ..Default::default()
    })
    .unwrap();
    let url = format!("http://{addr}");
    let cli = || {
        let mut c = env.cli();
        c.env("CODEPLANE_API_URL", &url)
            .env("CODEPLANE_API_KEY", TOKEN);
        c
    };
    let out = cli()
        .args(["--json", "session", "start", "--runtime", "codeplane"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let all: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
    let mut child = cli()
        .args([
            "session",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "cat; cat a.txt >&2; exit 6",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let bytes = all.clone();
    let feeder = std::thread::spawn(move || input.write_all(&bytes));
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap().unwrap();
    assert_eq!(code(&out), 6, "{}", text(&out));
    assert!(
        out.stdout == all,
        "stdout differs ({} bytes)",
        out.stdout.len()
    );
    assert_eq!(out.stderr, b"hello\n");
    let w = cli()
        .args([
            "session",
            "exec",
            &id,
            "-n",
            "--",
            "sh",
            "-c",
            "echo remote > r.txt",
        ])
        .output()
        .unwrap();
    assert_eq!(code(&w), 0, "{}", text(&w));
    // A checkpoint and a restore on the host, over HTTP; a fork is not (said, not faked).
    let json = |args: &[&str]| -> Value {
        let out = cli().arg("--json").args(args).output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)))
    };
    let cp = json(&["session", "checkpoint", &id]);
    assert_eq!(cp["checkpoint"], "cp-1", "{cp}");
    let later = cli()
        .args([
            "session",
            "exec",
            &id,
            "-n",
            "--",
            "sh",
            "-c",
            "echo later > r.txt",
        ])
        .output()
        .unwrap();
    assert_eq!(code(&later), 0, "{}", text(&later));
    let back = json(&["session", "restore", &id, "cp-1"]);
    assert_eq!(back["checkpoint"], "cp-1", "{back}");
    let fork = json(&["session", "fork", &id, "cp-1"]);
    assert_eq!(fork["code"], "TASK_RUNTIME_UNAVAILABLE", "{fork}");
    let stop = cli()
        .args(["--json", "session", "stop", &id])
        .output()
        .unwrap();
    let stop: Value = serde_json::from_slice(&stop.stdout).unwrap();
    assert_eq!(stop["status"], "review", "{stop}");
    assert!(!env.root.join("r.txt").exists());
    let accepted = cli().args(["accept", &id]).output().unwrap();
    assert!(accepted.status.success(), "{}", text(&accepted));
    assert_eq!(
        std::fs::read_to_string(env.root.join("r.txt")).unwrap(),
        "remote\n"
    );
}

/// On a terminal, what a session's command writes (and a file read) is shown inert, as a
/// step's output is: its escapes never reach the terminal. To a pipe the bytes are as written.
#[test]
fn a_session_commands_output_on_a_terminal_is_inert() {
    if !sandboxes_usable() {
        return;
    }
    if !Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        smithers_test_support::skip_or_fail("util-linux `script` not found");
        return;
    }
    let env = Env::new();
    let id = env.start(&[]);
    let evil =
        r"printf 'a\033]52;c;aGk=\007b\n\033[2Jc\n' | tee evil.txt; printf '\033]0;title\007' >&2";
    let on_tty = |args: &str| {
        let out = Command::new("script")
            .args([
                "-qec",
                &format!("{} {args}", support::native::bin_path()),
                "/dev/null",
            ])
            .env("SMITHERS_RESIDENT_DIR", &env.sessions)
            .env_remove("SMITHERS_DB")
            .current_dir(&env.root)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        out.stdout
    };
    let shown = on_tty(&format!(
        "session exec {id} -n -- sh -c \"{}\"",
        evil.replace('"', "\\\"")
    ));
    let read = on_tty(&format!("session read {id} evil.txt"));
    for bytes in [&shown, &read] {
        assert!(
            !contains(bytes, b"\x1b]52"),
            "an OSC 52 reached the terminal: {bytes:?}"
        );
        assert!(
            !contains(bytes, b"\x1b[2J") && !contains(bytes, b"\x07"),
            "{bytes:?}"
        );
        assert!(
            contains(bytes, b"]52;c;aGk="),
            "the text is still shown: {bytes:?}"
        );
    }
    assert!(
        !contains(&shown, b"\x1b]0;"),
        "a title escape reached the terminal"
    );
    let piped = env.sh(&id, "cat evil.txt");
    assert!(
        contains(&piped.stdout, b"\x1b]52;c;aGk=\x07"),
        "to a pipe the bytes are as written"
    );
    let _ = env.json(&["session", "stop", &id]);
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A process of the session swaps a directory and a link to a host directory back and forth
/// as fast as it can while `session diff` reads the workspace: the diff holds the sandbox
/// still first, so the host file never reaches the diff (before: within a few dozen diffs).
#[test]
fn a_diff_never_reads_through_a_link_swapped_in_while_it_reads() {
    if !sandboxes_usable() {
        return;
    }
    let env = Env::new();
    let secret_dir = tempfile::tempdir().unwrap();
    let secret = format!("HOST-SECRET-{}", std::process::id());
    std::fs::write(secret_dir.path().join("secret.txt"), &secret).unwrap();
    let id = env.start(&[]);
    let racer = format!(
        r#"import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
os.mkdir("x"); open("x/secret.txt", "w").write("decoy\n")
os.symlink("{}", "y")
end = time.time() + 60
while time.time() < end and not os.path.exists("stop"):
    libc.renameat2(-100, b"x", -100, b"y", 2)
"#,
        secret_dir.path().display()
    );
    let mut w = env
        .cli()
        .args(["session", "write", &id, "racer.py"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    w.stdin.take().unwrap().write_all(racer.as_bytes()).unwrap();
    assert!(w.wait().unwrap().success());
    let started = env.sh(
        &id,
        "(setsid python3 racer.py </dev/null >/dev/null 2>&1 &); sleep 0.2; ls",
    );
    assert!(
        String::from_utf8_lossy(&started.stdout).contains('y'),
        "{}",
        text(&started)
    );
    for i in 0..40 {
        let out = env
            .cli()
            .args(["--json", "session", "diff", &id])
            .output()
            .unwrap();
        assert!(out.status.success(), "diff {i}: {}", text(&out));
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains(&secret),
            "diff {i} read the host file through the swapped link"
        );
    }
    env.sh(&id, "touch stop");
    let _ = env.json(&["session", "stop", &id]);
}

/// A client killed while its command's stdout is a pipe nobody reads: the command is still
/// killed (the holder never blocks on that pipe), and the session goes on.
#[test]
fn a_client_gone_while_its_output_is_stuck_still_ends_its_command() {
    if !sandboxes_usable() {
        return;
    }
    let env = Env::new();
    let id = env.start(&[]);
    let token = format!("stuck-token-{}", std::process::id());
    // Our end of the pipe is kept, and never read.
    let mut client = env
        .cli()
        .args(["session", "exec", &id, "-n", "--", "yes", &token])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let _unread = client.stdout.take();
    assert!(wait_until(Duration::from_secs(10), || !pids_with(&token).is_empty()));
    client.kill().unwrap();
    client.wait().unwrap();
    assert!(
        wait_until(Duration::from_secs(15), || pids_with(&token).is_empty()),
        "the command outlived its client: {:?}",
        pids_with(&token)
    );
    assert_eq!(code(&env.sh(&id, "true")), 0);
    let _ = env.json(&["session", "stop", &id]);
}

/// Output to a descriptor in non-blocking mode (a reader that set O_NONBLOCK on its pipe) is
/// waited on, never cut: every byte arrives.
#[test]
fn output_to_a_non_blocking_pipe_arrives_whole() {
    if !sandboxes_usable() {
        return;
    }
    let env = Env::new();
    let id = env.start(&[]);
    let mut client = env
        .cli()
        .args([
            "session",
            "exec",
            &id,
            "-n",
            "--",
            "head",
            "-c",
            "5000000",
            "/dev/zero",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = client.stdout.take().unwrap();
    {
        use std::os::fd::AsRawFd;
        let fd = out.as_raw_fd();
        // SAFETY: fcntl on a descriptor we own, setting O_NONBLOCK on the pipe's file
        // description (shared with the client's, and so with what the holder writes to).
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
    let mut got = 0usize;
    let mut buf = vec![0u8; 4096];
    loop {
        use std::io::Read;
        match out.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => panic!("{e}"),
        }
    }
    let status = client.wait().unwrap();
    assert_eq!((status.code(), got), (Some(0), 5_000_000));
    let _ = env.json(&["session", "stop", &id]);
}

/// A second start of a held session's id is refused before anything is made; `session ls`
/// does not hang on a socket nobody answers.
#[test]
fn a_held_id_is_not_started_twice_and_ls_does_not_hang_on_a_mute_socket() {
    if !sandboxes_usable() {
        return;
    }
    let env = Env::new();
    let id = env.start(&["--sandbox-id", "twice-1"]);
    let again = env
        .cli()
        .args(["--json", "session", "start", "--sandbox-id", "twice-1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(code(&again), 1, "{}", text(&again));
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("held already"),
        "{}",
        text(&again)
    );
    // A socket that accepts and never answers (a stopped holder looks so).
    let sessions = env.sessions.join("sessions");
    let _mute = std::os::unix::net::UnixListener::bind(sessions.join("mute.sock")).unwrap();
    let list = env.json(&["session", "ls"]);
    let list = list.as_array().unwrap();
    assert!(
        list.iter()
            .any(|s| s["sessionId"] == "mute" && s["held"] == false),
        "{list:?}"
    );
    assert!(
        list.iter().any(|s| s["sessionId"] == id.as_str()),
        "{list:?}"
    );
    let _ = env.json(&["session", "stop", &id]);
}

fn stdout(out: &Output) -> String {
    assert_eq!(code(out), 0, "{}", text(out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Checkpoints, restore and forks through the CLI: a fork starts from its parent's state
/// (now, or a checkpoint), its writes are its own and its siblings' and parent's theirs; a
/// restore drops what came after; a checkpoint while a command works in the workspace is
/// refused (BUSY) and changes nothing; each session ends in its own review, and accepting a
/// fork applies exactly the fork's state.
#[test]
fn checkpoints_restore_and_forks_each_keep_their_own_writes() {
    if !sandboxes_usable() {
        return;
    }
    let env = Env::new();
    let id = env.start(&[]);
    stdout(&env.sh(&id, "echo one > a.txt; mkdir d; echo x > d/x"));
    let cp = env.json(&["session", "checkpoint", &id]);
    let cp = cp["checkpoint"]
        .as_str()
        .unwrap_or_else(|| panic!("{cp}"))
        .to_string();
    stdout(&env.sh(&id, "echo two > a.txt; rm -r d; echo new > n"));
    let fork = |from: Option<&str>| {
        let mut args = vec!["session", "fork", &id];
        args.extend(from);
        let doc = env.json(&args);
        doc["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("{doc}"))
            .to_string()
    };
    let now = fork(None);
    let old = fork(Some(&cp));
    assert_eq!(stdout(&env.sh(&now, "cat a.txt; ls")), "two\na.txt\nn\n");
    assert_eq!(
        stdout(&env.sh(&old, "cat a.txt d/x; ls")),
        "one\nx\na.txt\nd\n"
    );
    stdout(&env.sh(&old, "echo from-old > a.txt; rm d/x"));
    stdout(&env.sh(&now, "echo from-now > n"));
    assert_eq!(stdout(&env.sh(&id, "cat a.txt n")), "two\nnew\n");
    assert_eq!(stdout(&env.sh(&now, "cat a.txt n")), "two\nfrom-now\n");

    let back = env.json(&["session", "restore", &id, &cp]);
    assert_eq!(back["checkpoint"], json!(cp), "{back}");
    assert_eq!(
        stdout(&env.sh(&id, "cat a.txt d/x; ls")),
        "one\nx\na.txt\nd\n"
    );
    let unknown = env.json(&["session", "restore", &id, "cp-99"]);
    assert_eq!(unknown["code"], "NOT_FOUND", "{unknown}");

    // Checkpoints asked for at once, with a diff: one after another, none lost.
    stdout(&env.sh(&id, "echo three > a.txt"));
    let at_once: Vec<_> = (0..3)
        .map(|i| {
            let args: Vec<&str> = match i {
                2 => vec!["--json", "session", "diff", &id],
                _ => vec!["--json", "session", "checkpoint", &id],
            };
            env.cli()
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in at_once {
        let out = child.wait_with_output().unwrap();
        assert_eq!(code(&out), 0, "{}", text(&out));
    }
    assert_eq!(stdout(&env.sh(&id, "cat a.txt d/x")), "three\nx\n");

    // A command at work in the workspace holds it: the checkpoint waits for its end.
    let mut busy = env
        .cli()
        .args([
            "session",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo z > z; exec sleep 60",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(20), || {
        env.cli()
            .args(["session", "read", &id, "z"])
            .output()
            .unwrap()
            .status
            .success()
    }));
    let refused = env.json(&["session", "checkpoint", &id]);
    assert_eq!(refused["code"], "BUSY", "{refused}");
    let _ = busy.kill();
    let _ = busy.wait();
    assert_eq!(stdout(&env.sh(&id, "cat a.txt")), "three\n");

    for s in [&id, &now, &old] {
        let stop = env.json(&["session", "stop", s]);
        assert_eq!(stop["status"], "review", "{stop}");
    }
    let accepted = env.cli().args(["accept", &old]).output().unwrap();
    assert!(accepted.status.success(), "{}", text(&accepted));
    assert_eq!(
        std::fs::read_to_string(env.root.join("a.txt")).unwrap(),
        "from-old\n"
    );
    // (An emptied directory is not a patch: the file's absence is what is applied.)
    assert!(!env.root.join("d/x").exists());
    assert!(
        !env.root.join("n").exists(),
        "a sibling's file reached the project"
    );
    for s in [&id, &now] {
        let rejected = env.cli().args(["reject", s]).output().unwrap();
        assert!(rejected.status.success(), "{}", text(&rejected));
    }
}

/// A user holds at most `SMITHERS_SESSIONS_MAX` sessions at once: one more is refused
/// (BUSY) until one ends.
#[test]
fn a_user_holds_no_more_sessions_than_the_bound() {
    if !sandboxes_usable() {
        return;
    }
    let env = Env::new();
    let start = || {
        env.cli()
            .env("SMITHERS_SESSIONS_MAX", "1")
            .args(["--json", "session", "start"])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let first = start();
    assert!(first.status.success(), "{}", text(&first));
    let id: Value = serde_json::from_slice(&first.stdout).unwrap();
    let id = id["sessionId"].as_str().unwrap().to_string();
    let refused = start();
    assert_eq!(code(&refused), 1, "{}", text(&refused));
    let err: Value = serde_json::from_slice(&refused.stdout).unwrap();
    assert_eq!(err["code"], "BUSY", "{err}");
    let stop = env.json(&["session", "stop", &id]);
    assert_eq!(stop["status"], "finished", "{stop}");
    let again = start();
    assert!(again.status.success(), "{}", text(&again));
    let id: Value = serde_json::from_slice(&again.stdout).unwrap();
    env.json(&["session", "stop", id["sessionId"].as_str().unwrap()]);
}

/// A session started for a process (`--owner-pid`, what the MCP server passes) ends when
/// that process does, killed outright too: its change opens a review instead of waiting for
/// the idle timeout.
#[test]
fn a_session_ends_with_the_process_that_owns_it() {
    if !sandboxes_usable() {
        return;
    }
    let env = Env::new();
    let mut owner = Command::new("sleep").arg("1000").spawn().unwrap();
    let pid = owner.id().to_string();
    let id = env.start(&["--owner-pid", &pid]);
    assert_eq!(code(&env.sh(&id, "echo kept > owned.txt")), 0);
    owner.kill().unwrap();
    owner.wait().unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || {
            env.json(&["show", &id])["status"] == "review"
        }),
        "the session outlived its owner"
    );
    let accepted = env.cli().args(["accept", &id]).output().unwrap();
    assert!(accepted.status.success(), "{}", text(&accepted));
    assert_eq!(
        std::fs::read_to_string(env.root.join("owned.txt")).unwrap(),
        "kept\n"
    );
    // An owner that is not running is refused at the start.
    let out = env
        .cli()
        .args(["--json", "session", "start", "--owner-pid", &pid])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(code(&out), 1, "{}", text(&out));
}
