//! An ordinary user with nothing set up by root (issue 14): `doctor` tells that user the truth,
//! a step runs, is reviewed and accepted, and `--memory` does what `doctor` said it would.
//! Then the same user in a cgroup delegated to it (what systemd's `Delegate=yes` does: the
//! directory and its `cgroup.procs`/`tasks` chowned): the limit is enforced.
//!
//! Needs root to create the user (CI runs as root); elsewhere it prints SKIP.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use smithers_test_support::skip_or_fail;
use support::native::bin_path;

const USER: &str = "smithers-ordinary";

/// The user's uid and gid, created with `useradd` when missing.
fn ordinary_user() -> Option<(u32, u32)> {
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, USER]).output().ok()?;
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    if id("-u").is_none() {
        let made = Command::new("useradd")
            .args(["--no-create-home", "--shell", "/usr/sbin/nologin", USER])
            .status()
            .ok()?;
        assert!(made.success(), "useradd {USER} failed");
    }
    Some((id("-u")?, id("-g")?))
}

/// A directory the user owns, below a world-traversable one (`tempfile`'s are 0700 root).
struct UserDir(PathBuf);

impl UserDir {
    fn new(uid: u32, gid: u32, name: &str) -> UserDir {
        let path = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
        UserDir(path)
    }
}

impl Drop for UserDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The CLI as the user (no supplementary groups), optionally entering `cgroup_procs` first
/// (as root, before dropping to the user, the way a delegating manager puts a process in its
/// delegated cgroup).
fn as_user(
    uid: u32,
    gid: u32,
    home: &Path,
    project: &Path,
    cgroup_procs: &[PathBuf],
    args: &[&str],
) -> Output {
    let mut script = String::new();
    for procs in cgroup_procs {
        script.push_str(&format!("echo $$ > '{}' && ", procs.display()));
    }
    script.push_str(&format!(
        "exec setpriv --reuid={uid} --regid={gid} --clear-groups \"$@\""
    ));
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .arg(bin_path())
        .args(args)
        .current_dir(project)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", home)
        .env("TMPDIR", home)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    println!(
        "$ {} (as {USER})\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn git(project: &Path, args: &[&str]) {
    let ok = Command::new("git")
        .args(["-c", "user.email=t@example.com", "-c", "user.name=t"])
        .args(args)
        .current_dir(project)
        .status()
        .unwrap();
    assert!(ok.success());
}

fn protection<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["protections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no {name} row in {report}"))
}

struct World {
    uid: u32,
    gid: u32,
    home: UserDir,
    project: PathBuf,
}

fn world(name: &str) -> Option<World> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip_or_fail("creating an ordinary user needs root");
        return None;
    }
    let (uid, gid) = ordinary_user()?;
    let home = UserDir::new(uid, gid, name);
    let project = home.0.join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("a.txt"), "one\n").unwrap();
    git(&project, &["init", "-q"]);
    git(&project, &["add", "."]);
    git(&project, &["commit", "-qm", "base"]);
    let chown = Command::new("chown")
        .args(["-R", &format!("{uid}:{gid}")])
        .arg(&home.0)
        .status()
        .unwrap();
    assert!(chown.success());
    Some(World {
        uid,
        gid,
        home,
        project,
    })
}

impl World {
    fn cli(&self, cgroups: &[PathBuf], args: &[&str]) -> Output {
        as_user(
            self.uid,
            self.gid,
            &self.home.0,
            &self.project,
            cgroups,
            args,
        )
    }

    fn doctor(&self, cgroups: &[PathBuf]) -> Value {
        let out = self.cli(cgroups, &["doctor", "--json"]);
        serde_json::from_slice(&out.stdout).expect("doctor --json prints JSON")
    }
}

#[test]
fn an_ordinary_user_runs_reviews_and_accepts_without_any_setup() {
    let Some(w) = world("smithers-ordinary-plain") else {
        return;
    };
    let doctor = w.doctor(&[]);
    for name in ["user-namespace", "mount-namespace", "pid-namespace"] {
        assert_eq!(protection(&doctor, name)["status"], "enforced", "{name}");
    }
    let memory = protection(&doctor, "memory");

    let out = w.cli(
        &[],
        &["run", "--json", "--", "sh", "-c", "echo two > b.txt"],
    );
    assert!(out.status.success(), "the step runs as an ordinary user");
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(run["status"], "review", "{run}");
    assert_eq!(run["stepStatus"], "finished", "{run}");
    let sandbox = run["sandboxId"].as_str().unwrap().to_string();
    // The step's own report (run --json, and the bundle's log) says what held, memory
    // included: the same as doctor said.
    let in_run = &protection(&run["enforcement"], "memory")["status"];
    if memory["status"] == "enforced" {
        assert_eq!(*in_run, "enforced", "the runtime's default memory limit");
    } else {
        assert_eq!(*in_run, "unavailable", "doctor said {memory}");
        let log = std::fs::read_to_string(
            Path::new(run["bundlePath"].as_str().unwrap()).join("logs/stream.ndjson"),
        )
        .unwrap();
        assert!(log.contains("\"type\":\"enforcement\""), "{log}");
    }
    assert!(w.cli(&[], &["review", &sandbox]).status.success());
    assert!(w.cli(&[], &["accept", &sandbox]).status.success());
    assert_eq!(
        std::fs::read_to_string(w.project.join("b.txt")).unwrap(),
        "two\n"
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(w.project.join("b.txt")).unwrap().uid(),
        w.uid,
        "the accepted file belongs to the user"
    );

    // --memory does what doctor said.
    let limited = w.cli(&[], &["run", "--memory", "64m", "--", "true"]);
    if memory["status"] == "enforced" {
        assert!(limited.status.success(), "doctor said memory is enforced");
    } else {
        assert!(
            !limited.status.success(),
            "doctor said memory is unavailable"
        );
        let stderr = String::from_utf8_lossy(&limited.stderr);
        assert!(stderr.contains("memoryLimit"), "{stderr}");
        let fix = memory["fix"].as_str().unwrap();
        assert!(
            stderr.contains(fix),
            "the refusal names doctor's fix: {stderr}"
        );
    }
}

/// The v1 memory hierarchy's cgroup of this process, where the host has one (this project's
/// hybrid machines); pure v2 hosts are covered by the VM matrix.
fn own_v1_memory_cgroup() -> Option<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own
        .lines()
        .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()))?;
    let base = Path::new("/sys/fs/cgroup/memory");
    let dir = base.join(rel.trim_start_matches('/'));
    dir.join("memory.limit_in_bytes").exists().then_some(dir)
}

#[test]
fn an_ordinary_user_in_a_delegated_cgroup_gets_memory_limits() {
    let Some(w) = world("smithers-ordinary-delegated") else {
        return;
    };
    let Some(parent) = own_v1_memory_cgroup() else {
        smithers_test_support::skip_optional(
            "no v1 memory hierarchy here (pure v2 delegation runs in the VM matrix)",
        );
        return;
    };
    // What a delegating manager does: a cgroup of the user's, the process put into it.
    let delegated = parent.join(format!("smithers-test-delegated-{}", std::process::id()));
    std::fs::create_dir(&delegated).unwrap();
    for entry in ["", "tasks", "cgroup.procs"] {
        std::os::unix::fs::chown(delegated.join(entry), Some(w.uid), Some(w.gid)).unwrap();
    }
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            for _ in 0..50 {
                if std::fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
    let _remove = Remove(delegated.clone());
    let enter = [delegated.join("cgroup.procs")];

    let doctor = w.doctor(&enter);
    let memory = protection(&doctor, "memory");
    assert_eq!(memory["status"], "enforced", "{memory}");
    assert!(
        memory["detail"]
            .as_str()
            .unwrap()
            .contains(&delegated.display().to_string()),
        "{memory}"
    );
    // A hog under 32 MiB is killed by its own limit; the user's step ran.
    let out = w.cli(
        &enter,
        &[
            "run",
            "--json",
            "--memory",
            "32m",
            "--",
            "awk",
            "BEGIN { s = \"a\"; while (1) s = s s }",
        ],
    );
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        run["termination"], "memory",
        "the hog meets its limit: {run}"
    );
    assert_eq!(
        protection(&run["enforcement"], "memory")["status"],
        "enforced"
    );
}
