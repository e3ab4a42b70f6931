//! The resident service (`smithers-sandbox daemon`), through the real binary and real native
//! sandboxes: a served `run` is the same run (output, stdin, exit status, working
//! directory, bundle and review); a client the service must not serve (another environment,
//! another user, the service busy, a Landlock domain of its own even without no_new_privs)
//! is declined with the reason and runs its step itself; Ctrl-C and a killed client cancel
//! the served step; a project's database removed between two steps is opened anew.
//!
//! Each test runs its own service in a private directory (`SMITHERS_RESIDENT_DIR`), which it
//! stops at its end.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::native::{bin, bin_path, sandboxes_usable};

/// A service of the binary under test, in a directory of its own; stopped when dropped.
struct Service {
    dir: tempfile::TempDir,
    child: Child,
}

impl Service {
    fn start() -> Service {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // The service refuses a directory others can enter.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let child = bin()
            .env("SMITHERS_RESIDENT_DIR", dir.path())
            .args(["daemon", "serve", "--idle", "5m"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let s = Service { dir, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while s.status().is_none() {
            assert!(Instant::now() < deadline, "the service did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    /// The binary as a client of this service (same environment as the service's).
    fn client(&self) -> Command {
        let mut c = bin();
        c.env("SMITHERS_RESIDENT_DIR", self.dir.path());
        c
    }

    /// `run ARGS` (or any command line) in `dir` as a client that must be served.
    fn run_in(&self, dir: &Path, args: &[&str]) -> Output {
        self.required()
            .current_dir(dir)
            .args(args)
            .output()
            .unwrap()
    }

    /// The binary as a client that must be served.
    fn required(&self) -> Command {
        let mut c = self.client();
        c.env("SMITHERS_RESIDENT", "require");
        c
    }

    fn status(&self) -> Option<Value> {
        let out = self
            .client()
            .args(["--json", "daemon", "status"])
            .output()
            .unwrap();
        let doc: Value = serde_json::from_slice(&out.stdout).ok()?;
        (doc["running"] == true).then(|| doc["status"].clone())
    }

    fn served(&self) -> u64 {
        self.status().unwrap()["served"].as_u64().unwrap()
    }

    /// Waits until no step is being served (its cancellation and cleanup are over).
    fn wait_idle(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while self.status().unwrap()["busy"] == true {
            assert!(Instant::now() < deadline, "the service stayed busy");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.client().args(["daemon", "stop"]).output();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README"), "hello\n").unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    // Marks the project's top, so that a run from `sub` is a run of this project.
    std::fs::create_dir(dir.path().join(".smithers")).unwrap();
    dir
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `cmd` with `input` on its stdin.
fn with_stdin(mut cmd: Command, input: &str) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn a_served_run_is_the_same_run() {
    if !sandboxes_usable() {
        return;
    }
    let service = Service::start();
    let proj = project();

    // Output to our stdout and stderr, our stdin, the step's exit status, from a
    // subdirectory (the step starts in the same place in /workspace).
    let mut cmd = service.required();
    cmd.current_dir(proj.path().join("sub")).args([
        "run",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; pwd; cat; exit 3",
    ]);
    let out = with_stdin(cmd, "from stdin\n");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("out\n/workspace/sub\nfrom stdin\n"),
        "{stdout}"
    );
    assert!(
        stderr.contains("err") && stderr.contains("status   failed (exit 3)"),
        "{stderr}"
    );
    assert_eq!(service.served(), 1);

    // A change comes back for review, exactly as without the service.
    let out = service.run_in(
        proj.path(),
        &["--json", "run", "--", "sh", "-c", "echo new > made.txt"],
    );
    assert!(out.status.success(), "{out:?}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["status"], "review", "{doc}");
    assert_eq!(doc["patches"][0]["path"], "made.txt", "{doc}");
    assert!(
        !proj.path().join("made.txt").exists(),
        "nothing is applied before review"
    );
    let sandbox = doc["sandboxId"].as_str().unwrap();
    let out = bin()
        .args(["accept", sandbox, "--root"])
        .arg(proj.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(proj.path().join("made.txt")).unwrap(),
        "new\n"
    );
    assert_eq!(service.served(), 2);

    // The third step of one configuration in a row gets an armed sandbox; its output is the
    // same.
    for _ in 0..2 {
        let out = service.run_in(proj.path(), &["run", "--", "cat", "README"]);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(text(&out.stdout), "hello\n");
    }
    // The project is kept open, and its rows are in its database like any other run's.
    let status = service.status().unwrap();
    let db = proj.path().join(".smithers/sandbox.db");
    let db = std::fs::canonicalize(db).unwrap();
    assert_eq!(
        status["projects"][0]["db"],
        db.display().to_string(),
        "{status}"
    );
    let out = bin()
        .args(["--json", "ls", "--root"])
        .arg(proj.path())
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(4), "{listed}");
}

#[test]
fn a_client_with_another_environment_is_declined_and_runs_itself() {
    if !sandboxes_usable() {
        return;
    }
    let service = Service::start();
    let proj = project();
    let out = service
        .required()
        .env("SOME_TOKEN", "s3cret-value")
        .current_dir(proj.path())
        .args(["run", "--", "true"])
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("did not serve") && stderr.contains("SOME_TOKEN"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("s3cret"),
        "a value is never shown: {stderr}"
    );

    // Without `require` the client runs its step itself.
    let out = service
        .client()
        .env("SOME_TOKEN", "s3cret-value")
        .current_dir(proj.path())
        .args(["run", "--", "sh", "-c", "echo ran"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), "ran\n");
    let status = service.status().unwrap();
    assert_eq!(status["served"], 0, "{status}");
    assert_eq!(status["declined"], 2, "{status}");

    // `off` does not even ask.
    let out = service
        .client()
        .env("SMITHERS_RESIDENT", "off")
        .current_dir(proj.path())
        .args(["run", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(service.status().unwrap()["declined"], 2);
    // And a typo in the mode is an error, not a silent `auto`.
    let out = service
        .client()
        .env("SMITHERS_RESIDENT", "of")
        .current_dir(proj.path())
        .args(["run", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

#[test]
fn a_busy_service_declines_and_the_second_client_runs_itself() {
    if !sandboxes_usable() {
        return;
    }
    let service = Service::start();
    let proj = project();
    let mut first = service
        .required()
        .current_dir(proj.path())
        .args(["run", "--", "sleep", "4"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while service.status().unwrap()["busy"] != true {
        assert!(Instant::now() < deadline, "the first step was not served");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = service.run_in(proj.path(), &["run", "--", "true"]);
    assert!(text(&out.stderr).contains("busy"), "{out:?}");
    let out = service
        .client()
        .current_dir(proj.path())
        .args(["run", "--", "sh", "-c", "echo second"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), "second\n");
    assert!(first.wait().unwrap().success());
}

/// Starts `run -- sleep 60` through the service and waits until its sandbox is shipped (the
/// step starts then).
fn sleeping_client(service: &Service, dir: &Path) -> Child {
    sleeping_client_with(dir, service.required())
}

/// [`sleeping_client`] from `command` (the binary as a client that must be served).
fn sleeping_client_with(dir: &Path, mut command: Command) -> Child {
    // Returned to the caller, which waits for it (the lint cannot see past the return).
    #[allow(clippy::zombie_processes)]
    let mut child = command
        .current_dir(dir)
        .args(["run", "--", "sleep", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = bin()
            .args(["--json", "ls", "--root"])
            .arg(dir)
            .output()
            .unwrap();
        let rows: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if rows
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["status"] == "shipped")
        {
            return child;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the step did not start: {rows}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn statuses(dir: &Path) -> Vec<String> {
    let out = bin()
        .args(["--json", "ls", "--root"])
        .arg(dir)
        .output()
        .unwrap();
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn ctrl_c_of_the_client_cancels_the_served_step() {
    if !sandboxes_usable() {
        return;
    }
    let service = Service::start();
    let proj = project();
    let child = sleeping_client(&service, proj.path());
    let started = Instant::now();
    // SAFETY: kill(2) on the child we spawned and have not waited for.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the step was not cancelled"
    );
    assert!(text(&out.stderr).contains("status   cancelled"), "{out:?}");
    assert_eq!(statuses(proj.path()), vec!["cancelled"]);
}

/// A shell without job control starts what it puts in the background with SIGINT ignored;
/// `run` on its own still cancels at a SIGINT (its handler replaces the disposition), and so
/// must a served one.
#[test]
fn ctrl_c_reaches_a_client_started_with_sigint_ignored() {
    if !sandboxes_usable() {
        return;
    }
    let service = Service::start();
    let proj = project();
    let mut command = service.required();
    // SAFETY: signal(2) is async-signal-safe; the closure runs in the forked child before
    // exec and allocates nothing.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        });
    }
    let child = sleeping_client_with(proj.path(), command);
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let ignored = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap();
    assert_ne!(
        ignored & (1 << (libc::SIGINT - 1)),
        0,
        "SIGINT is not ignored"
    );
    // SAFETY: kill(2) on the child we spawned and have not waited for.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    assert!(text(&out.stderr).contains("status   cancelled"), "{out:?}");
    assert_eq!(statuses(proj.path()), vec!["cancelled"]);
}

#[test]
fn a_killed_client_makes_the_service_cancel_its_step() {
    if !sandboxes_usable() {
        return;
    }
    let service = Service::start();
    let proj = project();
    let mut child = sleeping_client(&service, proj.path());
    child.kill().unwrap();
    child.wait().unwrap();
    service.wait_idle(Duration::from_secs(30));
    assert_eq!(statuses(proj.path()), vec!["cancelled"]);
    // The service is whole after it: the next client gets its own output.
    let out = service.run_in(proj.path(), &["run", "--", "echo", "next"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), "next\n");
}

#[test]
fn a_reader_that_went_away_is_the_last_clients_not_the_next_ones() {
    if !sandboxes_usable() {
        return;
    }
    use std::io::BufRead;
    let service = Service::start();
    let proj = project();
    // `run ... | head -1`: the reader goes after one line.
    let mut first = service
        .required()
        .current_dir(proj.path())
        .args(["run", "--", "sh", "-c", "seq 1 50000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(first.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "1\n");
    assert!(first.wait().unwrap().success());
    // The next client's stdout is its own: nothing of the first's, nothing missing.
    let out = service.run_in(proj.path(), &["run", "--", "echo", "second"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), "second\n");
    assert_eq!(service.served(), 2);
}

#[test]
fn a_database_removed_between_steps_is_opened_anew() {
    if !sandboxes_usable() {
        return;
    }
    let service = Service::start();
    let proj = project();
    let run = |script: &str| {
        let out = service.run_in(
            proj.path(),
            &["--json", "run", "--no-review", "--", "sh", "-c", script],
        );
        assert!(out.status.success(), "{out:?}");
    };
    run("true");
    std::fs::remove_dir_all(proj.path().join(".smithers")).unwrap();
    run("echo again > again.txt");
    // The second step's row is in the database that is there now, and its change applied.
    assert_eq!(statuses(proj.path()), vec!["finished"]);
    assert!(proj.path().join("again.txt").exists());
}

#[test]
fn another_user_cannot_reach_the_service() {
    if !sandboxes_usable() {
        return;
    }
    let other = "smithers-ordinary";
    let is_root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    if !is_root {
        smithers_test_support::skip_or_fail("needs root (to run a client as another user)");
        return;
    }
    let has_user = |user: &str| {
        Command::new("id")
            .arg(user)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !has_user(other) {
        // As tests/ordinary_user.rs makes it.
        let made = Command::new("useradd")
            .args(["--no-create-home", "--shell", "/usr/sbin/nologin", other])
            .status()
            .unwrap();
        assert!(made.success() || has_user(other), "useradd {other} failed");
    }
    let service = Service::start();
    // Even given the service's directory, the other user's client finds it is not theirs.
    let binary = copy_readable_binary();
    let out = Command::new("runuser")
        .args([
            "-u",
            other,
            "--",
            "env",
            "SMITHERS_RESIDENT=require",
            "NO_COLOR=1",
        ])
        .arg(format!(
            "SMITHERS_RESIDENT_DIR={}",
            service.dir.path().display()
        ))
        .arg(&binary)
        .args(["run", "--root", "/tmp", "--", "true"])
        .current_dir("/tmp")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&binary);
    // The directory too, once no other test's copy is in it.
    if let Some(dir) = binary.parent() {
        let _ = std::fs::remove_dir(dir);
    }
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("did not serve") && stderr.contains("owned by uid 0"),
        "{stderr}"
    );
    assert_eq!(service.status().unwrap()["served"], 0);
}

/// The binary where another user can execute it (the build directory may not be).
fn copy_readable_binary() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = Path::new("/tmp/smithers-resident-test-bin");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let to = dir.join(format!("smithers-sandbox-{}", std::process::id()));
    std::fs::copy(bin_path(), &to).unwrap();
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
    to
}

#[test]
fn a_command_line_the_service_cannot_parse_is_parsed_by_the_client() {
    if !sandboxes_usable() {
        return;
    }
    let service = Service::start();
    // Help and usage errors are clap's, printed by the client, as without a service.
    let out = service.required().args(["run", "--help"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out.stdout).contains("Usage:"), "{out:?}");
    let out = service
        .required()
        .args(["run", "--no-such-flag", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(text(&out.stderr).contains("--no-such-flag"), "{out:?}");
    assert_eq!(service.served(), 0);
    // And where no service runs at all.
    let out = bin()
        .env("SMITHERS_RESIDENT", "require")
        .env("SMITHERS_RESIDENT_DIR", "/nonexistent")
        .args(["run", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn a_confined_client_runs_its_step_itself() {
    if !sandboxes_usable() {
        return;
    }
    let has_setpriv = Command::new("setpriv")
        .arg("--help")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_setpriv {
        smithers_test_support::skip_or_fail("setpriv (util-linux) is not installed");
        return;
    }
    let service = Service::start();
    let proj = project();
    // no_new_privs, as every Landlock-confined agent but root's has: the service would act
    // outside the agent's confinement, so it declines.
    let out = Command::new("setpriv")
        .arg("--no-new-privs")
        .arg(bin_path())
        .env("SMITHERS_RESIDENT_DIR", service.dir.path())
        .env("SMITHERS_RESIDENT", "require")
        .env_remove("SMITHERS_DB")
        .env("NO_COLOR", "1")
        .current_dir(proj.path())
        .args(["run", "--", "true"])
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("NoNewPrivs"), "{stderr}");
    assert_eq!(service.served(), 0);
}

/// Whether this process runs as root (uid 0).
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

/// A Landlock ruleset that allows everything beneath `allowed` (the directories that exist)
/// and no other file access; `Err` when the kernel has no Landlock. Made here, applied in a
/// child by [`landlocked`].
fn landlock_ruleset(allowed: &[&Path]) -> Result<std::os::fd::OwnedFd, String> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    #[repr(C)]
    struct RulesetAttr {
        handled_access_fs: u64,
    }
    #[repr(C, packed)]
    struct PathBeneathAttr {
        allowed_access: u64,
        parent_fd: i32,
    }
    const CREATE_RULESET_VERSION: u32 = 1;
    const RULE_PATH_BENEATH: u32 = 1;
    // SAFETY: a null attribute of size 0 with the version flag only asks for the ABI version.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if abi < 1 {
        return Err(format!("no Landlock: {}", std::io::Error::last_os_error()));
    }
    // Every file-system right this ABI has: execute .. make_sym (1), refer (2), truncate (3),
    // ioctl on devices (5).
    let mut all = (1u64 << 13) - 1;
    for (since, right) in [(2, 1u64 << 13), (3, 1 << 14), (5, 1 << 15)] {
        if abi >= since {
            all |= right;
        }
    }
    let attr = RulesetAttr {
        handled_access_fs: all,
    };
    // SAFETY: `attr` is a valid ruleset attribute of the size given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if fd < 0 {
        return Err(format!(
            "landlock_create_ruleset: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: a fresh descriptor returned by the kernel, owned by nobody else.
    let ruleset = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    for dir in allowed.iter().filter(|d| d.is_dir()) {
        use std::os::unix::fs::OpenOptionsExt;
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(dir)
            .unwrap();
        let rule = PathBeneathAttr {
            allowed_access: all,
            parent_fd: opened.as_raw_fd(),
        };
        // SAFETY: the ruleset and a path-beneath rule naming an open directory, both valid
        // for the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                ruleset.as_raw_fd(),
                RULE_PATH_BENEATH,
                &rule as *const PathBeneathAttr,
                0u32,
            )
        };
        assert_eq!(
            r,
            0,
            "landlock_add_rule {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(ruleset)
}

/// Makes `command`'s process enter `ruleset`'s Landlock domain before it execs, *without*
/// no_new_privs: root (`CAP_SYS_ADMIN`) may, and then nothing in `/proc/<pid>/status` shows
/// that it is confined.
fn landlocked(command: &mut Command, ruleset: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let fd = ruleset.as_raw_fd();
    // SAFETY: the closure runs between fork and exec and makes one system call (no
    // allocation); the ruleset's descriptor is open in the child until its exec.
    unsafe {
        command.pre_exec(move || {
            if libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The directories a confined client here may use: the system's, the build's, `project`
/// and the service's; not the rest of /tmp, where the secret is.
fn landlock_for_client(service: &Service, project: &Path) -> Option<std::os::fd::OwnedFd> {
    let build = Path::new(bin_path()).parent().unwrap();
    let mut allowed: Vec<&Path> = [
        "/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/proc", "/dev", "/sys", "/run",
    ]
    .iter()
    .map(Path::new)
    .collect();
    allowed.extend([build, project, service.dir.path()]);
    match landlock_ruleset(&allowed) {
        Ok(ruleset) => Some(ruleset),
        Err(why) => {
            smithers_test_support::skip_or_fail(&why);
            None
        }
    }
}

/// A secret the client may not read: a file in a directory of its own in /tmp.
fn secret_dir() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let secret = format!("secret-{}-{:?}", std::process::id(), Instant::now());
    std::fs::write(dir.path().join("secret"), &secret).unwrap();
    (dir, secret)
}

/// `run --mount <secret dir>:/mnt/s:ro -- cat /mnt/s/secret` in `project`.
fn cat_secret_args(project: &Path, secret: &Path) -> Vec<String> {
    vec![
        "run".into(),
        "--root".into(),
        project.display().to_string(),
        "--mount".into(),
        format!("{}:/mnt/s:ro", secret.display()),
        "--".into(),
        "cat".into(),
        "/mnt/s/secret".into(),
    ]
}

#[test]
fn a_landlocked_root_client_gets_nothing_through_the_service() {
    if !sandboxes_usable() {
        return;
    }
    if !running_as_root() {
        smithers_test_support::skip_or_fail("needs root (to enter Landlock without no_new_privs)");
        return;
    }
    let service = Service::start();
    let proj = project();
    let (secret_dir, secret) = secret_dir();
    let Some(ruleset) = landlock_for_client(&service, proj.path()) else {
        return;
    };
    let args = cat_secret_args(proj.path(), secret_dir.path());
    // The client itself may not read the secret: confined, `run` is not served (under
    // `require` it says so; `run`'s own check of the service already needs the access the
    // challenge asks for), and on its own it cannot make its sandbox (its domain keeps it
    // from the sandboxes' directory, and from mounting anything at all).
    for mode in ["require", "auto"] {
        let mut cmd = service.client();
        cmd.env("SMITHERS_RESIDENT", mode)
            .current_dir(proj.path())
            .args(&args);
        landlocked(&mut cmd, &ruleset);
        let out = cmd.output().unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(!stdout.contains(&secret), "{mode}: {stdout}");
        assert!(!out.status.success(), "{mode}: {stdout} {stderr}");
        if mode == "require" {
            assert!(stderr.contains("did not serve"), "{stderr}");
        }
        assert_eq!(service.served(), 0, "{mode}: {stderr}");
    }
    // Unconfined, the same command is served, and reads it.
    let out = service.run_in(
        proj.path(),
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&secret), "{out:?}");
    assert_eq!(service.served(), 1);
}

/// Where [`landlocked_client_speaking_the_protocol_itself`] finds what it needs.
const ATTACK_ENV: &[&str] = &[
    "SMITHERS_TEST_ATTACK_SOCKET",
    "SMITHERS_TEST_ATTACK_SERVICE_PID",
    "SMITHERS_TEST_ATTACK_ARGS",
];

/// The test binary as a client that speaks to the service's socket itself, as a process in
/// its own Landlock domain (any program it runs is) may: no check of the service first, and
/// the best answer to its challenge it can give. Its stdout is the step's; what the service
/// said goes to its stderr.
fn attacker(service: &Service, proj: &Path, args: &[String]) -> Command {
    let socket = std::fs::read_dir(service.dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "sock"))
        .unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "landlocked_client_speaking_the_protocol_itself",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    // The service's own environment: it declines any other.
    .env_remove("SMITHERS_DB")
    .env("NO_COLOR", "1")
    .env("SMITHERS_RESIDENT_DIR", service.dir.path())
    .env(ATTACK_ENV[0], socket)
    .env(ATTACK_ENV[1], service.child.id().to_string())
    .env(ATTACK_ENV[2], args.join("\n"))
    .current_dir(proj)
    .stdin(Stdio::null());
    cmd
}

#[test]
#[ignore = "a client of a_landlocked_process_speaking_to_the_socket_is_refused, which runs it"]
fn landlocked_client_speaking_the_protocol_itself() {
    use smithers_resident::wire::{self, Frame};
    use std::io::Write;
    use std::os::fd::AsFd;
    const PROOF_LEN: usize = 32;
    let Ok(socket) = std::env::var(ATTACK_ENV[0]) else {
        return;
    };
    let pid = std::env::var(ATTACK_ENV[1]).unwrap();
    let mut argv = vec![bin_path().to_string()];
    argv.extend(
        std::env::var(ATTACK_ENV[2])
            .unwrap()
            .lines()
            .map(String::from),
    );
    let env: Vec<std::ffi::OsString> = std::env::vars_os()
        .filter(|(k, _)| !ATTACK_ENV.iter().any(|a| k == a))
        .map(|(k, v)| {
            let mut e = k;
            e.push("=");
            e.push(v);
            e
        })
        .collect();
    let build = socket
        .rsplit_once("run-")
        .unwrap()
        .1
        .trim_end_matches(".sock");
    let sock = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let cwd = std::fs::File::open(".").unwrap();
    let (i, o, e) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let fds = [i.as_fd(), o.as_fd(), e.as_fd(), cwd.as_fd()];
    Frame::run(build, &argv, &env, 0o022)
        .send(&sock, &fds)
        .unwrap();
    loop {
        let Some(line) = wire::read_line(&sock).unwrap() else {
            eprintln!("attacker: the service closed the connection");
            return;
        };
        if let Some(fd) = line.strip_prefix("prove ") {
            // The nonce ends the name of the service's descriptor: read it if we may.
            let proof = std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
                .ok()
                .and_then(|l| {
                    let l = l.to_string_lossy().replace(" (deleted)", "");
                    l.get(l.len().checked_sub(PROOF_LEN)?..).map(String::from)
                })
                .unwrap_or_else(|| "-".repeat(PROOF_LEN));
            (&sock).write_all(proof.as_bytes()).unwrap();
        } else if line == "ok" {
            (&sock).write_all(b"g").unwrap();
        } else {
            eprintln!("attacker: the service said: {line}");
            if !line.starts_with("exit ") {
                return;
            }
        }
    }
}

#[test]
fn a_landlocked_process_speaking_to_the_socket_is_refused() {
    if !sandboxes_usable() {
        return;
    }
    if !running_as_root() {
        smithers_test_support::skip_or_fail("needs root (to enter Landlock without no_new_privs)");
        return;
    }
    let service = Service::start();
    let proj = project();
    let (secret_dir, secret) = secret_dir();
    let Some(ruleset) = landlock_for_client(&service, proj.path()) else {
        return;
    };
    let args = cat_secret_args(proj.path(), secret_dir.path());
    // Confined: it cannot answer the challenge, and nothing is run for it.
    let mut cmd = attacker(&service, proj.path(), &args);
    landlocked(&mut cmd, &ruleset);
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(!stdout.contains(&secret), "{stdout}");
    assert!(
        stderr.contains("attacker: the service said: no ")
            && stderr.contains("inspect the service"),
        "{stderr}"
    );
    assert_eq!(service.served(), 0);
    // The same client unconfined answers it, and is served: what stopped it was its domain.
    let out = attacker(&service, proj.path(), &args).output().unwrap();
    assert!(text(&out.stdout).contains(&secret), "{out:?}");
    assert!(
        text(&out.stderr).contains("attacker: the service said: exit 0"),
        "{out:?}"
    );
    assert_eq!(service.served(), 1);
}
