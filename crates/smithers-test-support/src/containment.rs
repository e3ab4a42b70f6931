//! The containment suite: the 17 rows of the threat model (security.md), each attempted from
//! INSIDE a real sandbox by the `smithers-attack` binary and checked on the host afterwards.
//!
//! ```ignore
//! // crates/<backend>/tests/containment.rs
//! smithers_test_support::containment_tests!(make_env);
//! ```
//!
//! A row the runtime cannot enforce on this host passes only when the runtime says so: a limit
//! refused by `create` ([`RuntimeError::ControlUnsupported`]), or a protection reported as
//! degraded/unavailable by the outcome's enforcement report or the probe. The tool never sends
//! traffic anywhere but loopback: reachability of the outside is checked with a UDP `connect`
//! (a route lookup, no packet) to TEST-NET addresses.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode};

use crate::conformance::{
    assert_no_marker_processes, assert_reported_not_enforced, breaches, check_bundle,
    create_or_refused, fork_bomb_case, host_marker_pids, host_secret, kill_host_pids,
    memory_hog_case, outlive_case, run_once, start, unique, CaseFn, CaseResult, Project, Skip,
    SuiteEnv, HELPER_ENV, HOST_SECRET_ENV,
};
use smithers_runtime::{RuntimeError, SandboxHandle, Termination};

/// Calls `$callback!` with the list of containment rows.
#[doc(hidden)]
#[macro_export]
macro_rules! __containment_case_list {
    ($callback:ident ! ( $($args:tt)* )) => {
        $crate::$callback! { $($args)* [
            row01_host_loopback_unreachable,
            row02_no_route_outside,
            row03_host_project_tree_untouched,
            row04_system_dirs_read_only,
            row05_host_secrets_invisible,
            row06_host_processes_invisible,
            row07_privilege_gain_denied,
            row08_fork_bomb_capped,
            row09_memory_hog_killed,
            row10_disk_fill_capped,
            row11_output_flood_capped,
            row12_outlive_timeout,
            row13_survive_host_kill,
            row14_symlink_to_host_file,
            row15_result_path_escapes_rejected,
            row16_bundle_bomb_rejected,
            row17_devices_denied,
        ] }
    };
}

/// Expands to one `#[test]` per containment row, each running against the runtime that
/// `$make_env` (a `fn() -> SuiteEnv` or `fn() -> Result<SuiteEnv, Skip>`) returns.
/// `known_failures = ["row16_..."]` records rows this runtime is known to fail (see
/// [`crate::conformance::run_case_with`]).
#[macro_export]
macro_rules! containment_tests {
    ($make_env:path) => {
        $crate::containment_tests!($make_env, known_failures = []);
    };
    ($make_env:path, known_failures = [$($known:literal),* $(,)?]) => {
        $crate::__containment_case_list!(__suite_tests!($make_env, containment, &[$($known),*],));
    };
}

/// Every row by name, for a backend that drives them itself.
pub const CASES: &[(&str, CaseFn)] = __containment_case_list!(__case_table!(containment,));

/// Runs every row in order; panics on the first failure, returns the skipped rows.
pub async fn run_all(env: &SuiteEnv) -> Vec<(&'static str, Skip)> {
    crate::conformance::run_table(env, CASES).await
}

fn args(parts: &[String]) -> Vec<&str> {
    parts.iter().map(String::as_str).collect()
}

/// Joins attempts (each a list of words) with `+`.
fn batch(attempts: &[Vec<String>]) -> Vec<String> {
    let mut out = Vec::new();
    for a in attempts {
        if !out.is_empty() {
            out.push("+".to_string());
        }
        out.extend(a.iter().cloned());
    }
    out
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

/// Row 1: a TCP server on the host's 127.0.0.1 is unreachable.
pub async fn row01_host_loopback_unreachable(env: &SuiteEnv) -> CaseResult {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind host listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port().to_string();
    let project = Project::new(env);
    let (exec, _) = run_once(
        env,
        &project,
        env.controls(),
        project.attack_argv(&[
            "connect-tcp",
            "127.0.0.1",
            &port,
            "+",
            "connect-tcp",
            "[::1]",
            &port,
        ]),
    )
    .await?;
    let results = exec.attempts("connect-tcp");
    assert_eq!(results.len(), 2, "{}", exec.output.dump());
    assert!(
        listener.accept().is_err(),
        "row 1: the host listener accepted a connection from inside the sandbox"
    );
    assert_reported_not_enforced(
        env,
        "row 1",
        &["network"],
        Some(&exec.outcome),
        &breaches(&results),
    )
    .await;
    Ok(())
}

/// Row 2: no way out: only loopback, no routes, no route to TEST-NET addresses (v4 and v6),
/// and the resolver's nameservers unreachable. Nothing is sent: UDP connect is a route lookup.
pub async fn row02_no_route_outside(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let mut attempts = vec![
        words("net-info"),
        // Runs only when the sandbox has no route (the tool checks), so no query can leave.
        words("resolve example.com"),
        words("udp-route 192.0.2.1 53"),
        words("udp-route 198.51.100.7 443"),
        words("udp-route [2001:db8::1] 53"),
    ];
    // The host's nameservers, as the sandbox would try to reach them to resolve a name.
    let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    for ns in resolv
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .map(str::trim)
        .filter(|ns| {
            ns.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| !ip.is_loopback())
        })
        .take(3)
    {
        let target = if ns.contains(':') {
            format!("[{ns}]")
        } else {
            ns.to_string()
        };
        attempts.push(vec!["udp-route".into(), target, "53".into()]);
    }
    let argv = batch(&attempts);
    let (exec, _) = run_once(
        env,
        &project,
        env.controls(),
        project.attack_argv(&args(&argv)),
    )
    .await?;
    let results = exec.output.attempts();
    assert_eq!(results.len(), attempts.len(), "{}", exec.output.dump());
    let info = exec.attempt("net-info");
    assert_reported_not_enforced(
        env,
        "row 2",
        &["network"],
        Some(&exec.outcome),
        &breaches(&results),
    )
    .await;
    if info["ok"] == false {
        let ifs: Vec<&str> = info["interfaces"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert!(ifs.iter().all(|i| *i == "lo"), "{info}");
    }
    Ok(())
}

/// Row 3: the host project cannot be written through its host path (or /proc tricks); the
/// host tree is byte-identical after the run.
pub async fn row03_host_project_tree_untouched(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let before = project.snapshot();
    let root = project.root.display().to_string();
    let attempts = vec![
        vec!["write-file".into(), format!("{root}/pwned"), "x".into()],
        vec![
            "append-file".into(),
            format!("{root}/README.txt"),
            "pwned".into(),
        ],
        vec![
            "write-file".into(),
            format!("{root}/.smithers/pwned"),
            "x".into(),
        ],
        vec![
            "write-file".into(),
            format!("/proc/1/root{root}/pwned"),
            "x".into(),
        ],
        vec![
            "write-file".into(),
            "/proc/self/cwd/legit.txt".into(),
            "legit".into(),
        ],
    ];
    let argv = batch(&attempts);
    let (exec, collected) = run_once(
        env,
        &project,
        env.controls(),
        project.attack_argv(&args(&argv)),
    )
    .await?;
    let results = exec.output.attempts();
    assert_eq!(results.len(), 5, "{}", exec.output.dump());
    assert_eq!(
        results[4]["ok"], true,
        "writing /workspace must work: {}",
        results[4]
    );
    before.assert_same(
        &project.snapshot(),
        "row 3: the host project changed during the run",
    );
    for p in ["pwned", ".smithers/pwned"] {
        assert!(
            !project.root.join(p).exists(),
            "row 3: {p} written on the host"
        );
    }
    let report = collected.unwrap_or_else(|e| panic!("collect failed: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    assert!(
        bundle.patch_text.contains("legit.txt"),
        "{}",
        bundle.patch_text
    );
    assert_reported_not_enforced(
        env,
        "row 3",
        &["filesystem", "mount-namespace", "landlock"],
        Some(&exec.outcome),
        &breaches(&results[..4]),
    )
    .await;
    Ok(())
}

/// Row 4: /etc, /usr, /, $HOME, /var, /opt are not writable, and nothing appears on the host.
pub async fn row04_system_dirs_read_only(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let name = unique("smithers-suite-row4");
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let mut dirs = vec![
        "/etc".to_string(),
        "/usr".into(),
        "/usr/bin".into(),
        "/var".into(),
        "/opt".into(),
        "/root".into(),
        String::new(), // "/" itself
    ];
    // A $HOME under /tmp (a test harness's, an ordinary user's without a home) is inside the
    // sandbox's own private, writable /tmp: the write there may succeed and is no breach, but
    // it still must not appear on the host (the "appeared" check below).
    let mut private_home = None;
    if !dirs.contains(&home) {
        if Path::new(&home).starts_with("/tmp") {
            private_home = Some(dirs.len());
        }
        dirs.push(home.clone());
    }
    let targets: Vec<String> = dirs.iter().map(|d| format!("{d}/{name}")).collect();
    let mut attempts: Vec<Vec<String>> = targets
        .iter()
        .map(|t| vec!["write-file".into(), t.clone(), "x".into()])
        .collect();
    // Existing system files, opened for writing (nothing is written, so a broken runtime does
    // no damage to the host).
    for f in ["/etc/passwd", "/usr/bin/env", "/bin/sh"] {
        attempts.push(vec!["open-write".into(), f.into()]);
    }
    let passwd = std::fs::read("/etc/passwd").unwrap_or_default();
    let argv = batch(&attempts);
    let (exec, _) = run_once(
        env,
        &project,
        env.controls(),
        project.attack_argv(&args(&argv)),
    )
    .await?;
    let results = exec.output.attempts();
    assert_eq!(results.len(), attempts.len(), "{}", exec.output.dump());
    let appeared: Vec<&String> = targets.iter().filter(|t| Path::new(t).exists()).collect();
    for t in &appeared {
        let _ = std::fs::remove_file(t);
    }
    assert!(
        appeared.is_empty(),
        "row 4: files appeared on the host: {appeared:?}"
    );
    assert_eq!(
        std::fs::read("/etc/passwd").unwrap_or_default(),
        passwd,
        "row 4: the host /etc/passwd changed"
    );
    let mut counted = results.clone();
    if let Some(at) = private_home {
        counted.remove(at);
    }
    assert_reported_not_enforced(
        env,
        "row 4",
        &["filesystem", "mount-namespace", "landlock"],
        Some(&exec.outcome),
        &breaches(&counted),
    )
    .await;
    Ok(())
}

/// Row 5: host secrets are not visible: a secret file in the host user's home, a file next to
/// the project, /etc/shadow, ~/.ssh, /root, and a secret environment variable.
pub async fn row05_host_secrets_invisible(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let secret = host_secret();
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let home_secret = Path::new(&home).join(format!(".{}", unique("smithers-suite-secret")));
    let wrote_home = std::fs::write(&home_secret, &secret).is_ok();
    let beside = project.outside.join("secret.txt");
    std::fs::write(&beside, &secret).expect("write secret beside the project");
    let _guard = RemoveOnDrop(home_secret.clone());
    let mut attempts = vec![
        vec![
            "read-file".into(),
            beside.display().to_string(),
            secret.clone(),
        ],
        vec!["read-file".into(), "/etc/shadow".into()],
        vec!["list-dir".into(), format!("{home}/.ssh")],
        vec!["list-dir".into(), home.clone()],
        vec!["list-dir".into(), "/root".into()],
        vec!["env".into()],
    ];
    if wrote_home {
        attempts.push(vec![
            "read-file".into(),
            home_secret.display().to_string(),
            secret.clone(),
        ]);
    }
    let argv = batch(&attempts);
    let (exec, _) = run_once(
        env,
        &project,
        env.controls(),
        project.attack_argv(&args(&argv)),
    )
    .await?;
    let results = exec.output.attempts();
    assert_eq!(results.len(), attempts.len(), "{}", exec.output.dump());
    let mut leaks = Vec::new();
    for r in &results {
        match r["attempt"].as_str() {
            Some("read-file") if r["ok"] == true => leaks.push(r.clone()),
            Some("list-dir") if r["ok"] == true => {
                // A directory may exist inside (an empty home); the host's entries must not.
                let host_dir = r["path"].as_str().unwrap_or_default();
                let host_entries: Vec<String> = std::fs::read_dir(host_dir)
                    .map(|d| {
                        d.filter_map(Result::ok)
                            .map(|e| e.file_name().to_string_lossy().into_owned())
                            .collect()
                    })
                    .unwrap_or_default();
                let seen: Vec<&str> = r["entries"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let common: Vec<&&str> = seen
                    .iter()
                    .filter(|e| host_entries.iter().any(|h| h == *e))
                    .collect();
                if !common.is_empty() {
                    leaks.push(json!({"attempt": "list-dir", "ok": true, "path": host_dir,
                                      "host_entries_visible": common}));
                }
            }
            Some("env") => {
                let env_inside = &r["env"];
                let visible = env_inside
                    .as_object()
                    .map(|m| {
                        m.contains_key(HOST_SECRET_ENV)
                            || m.values().any(|v| v.as_str() == Some(secret.as_str()))
                    })
                    .unwrap_or(false);
                assert!(
                    !visible,
                    "row 5: the host secret variable is visible inside"
                );
            }
            _ => {}
        }
    }
    assert_reported_not_enforced(
        env,
        "row 5",
        &["filesystem", "mount-namespace", "landlock"],
        Some(&exec.outcome),
        &leaks,
    )
    .await;
    Ok(())
}

struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Row 6: a host process (carrying a marker) is neither visible nor signalable from inside.
pub async fn row06_host_processes_invisible(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let marker = unique("smithers-suite-victim");
    let mut victim = Command::new(env.attack_bin())
        .args(["sleep", &marker, "600"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the host victim");
    let pid = victim.id().to_string();
    // Reversed, so the marker is not in the argv of anything inside the sandbox.
    let hidden = format!("rev:{}", marker.chars().rev().collect::<String>());
    let argv = batch(&[
        vec!["find-proc".into(), hidden.clone()],
        vec!["read-file".into(), format!("/proc/{pid}/cmdline"), hidden],
        vec!["kill".into(), pid.clone(), "9".into()],
        vec!["list-dir".into(), "/proc/1/root/proc".into()],
    ]);
    let result = run_once(
        env,
        &project,
        env.controls(),
        project.attack_argv(&args(&argv)),
    )
    .await;
    let alive = victim.try_wait().expect("try_wait").is_none();
    let _ = victim.kill();
    let _ = victim.wait();
    let (exec, _) = result?;
    assert!(
        alive,
        "row 6: the host victim process was killed from inside the sandbox"
    );
    let found = exec.attempt("find-proc");
    let read = exec.attempt("read-file");
    let mut leaks = Vec::new();
    if found["ok"] == true {
        leaks.push(found.clone());
    }
    if read["contains_needle"] == true {
        leaks.push(read.clone());
    }
    assert_reported_not_enforced(
        env,
        "row 6",
        &["pid-namespace"],
        Some(&exec.outcome),
        &leaks,
    )
    .await;
    Ok(())
}

/// Row 7: no capabilities, no_new_privs set (setuid binaries gain nothing), and mount,
/// unshare, setns, ptrace, bpf, keyctl, init_module and setuid(0) all denied.
pub async fn row07_privilege_gain_denied(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let attempts = [
        "status",
        "mount-tmpfs /tmp/smithers-attack-mnt",
        "unshare user",
        "unshare mount",
        "unshare net",
        "unshare pid",
        "setns /proc/1/ns/mnt",
        "ptrace-parent",
        "bpf",
        "keyctl",
        "init-module",
        "setuid-root",
    ]
    .map(words);
    let argv = batch(&attempts);
    let (exec, _) = run_once(
        env,
        &project,
        env.controls(),
        project.attack_argv(&args(&argv)),
    )
    .await?;
    let results = exec.output.attempts();
    assert_eq!(results.len(), attempts.len(), "{}", exec.output.dump());
    assert_reported_not_enforced(
        env,
        "row 7",
        &["seccomp", "no-new-privs", "capabilities", "user-namespace"],
        Some(&exec.outcome),
        &breaches(&results),
    )
    .await;
    Ok(())
}

/// Row 8: a fork bomb is capped by the pids limit and reported as such.
pub async fn row08_fork_bomb_capped(env: &SuiteEnv) -> CaseResult {
    fork_bomb_case(env, "row 8").await
}

/// Row 9: a memory hog is killed by the memory limit and reported as `Memory`.
pub async fn row09_memory_hog_killed(env: &SuiteEnv) -> CaseResult {
    memory_hog_case(env, "row 9").await
}

/// Row 10: filling the disk through /workspace or /tmp is capped and reported.
pub async fn row10_disk_fill_capped(env: &SuiteEnv) -> CaseResult {
    for dir in [env.workspace_dir().to_string(), "/tmp".to_string()] {
        let project = Project::new(env);
        let fill = format!("{}.bin", unique("smithers-suite-fill"));
        let mut controls = env.controls();
        let limit: u64 = 32 << 20;
        controls.disk_limit_bytes = Some(limit);
        let Some(mut sandbox) = create_or_refused(env, &project, controls, "disk").await? else {
            return Ok(());
        };
        sandbox.ship(json!({})).await;
        let exec = sandbox
            .exec(project.attack_argv(&["fill-disk", &format!("{dir}/{fill}"), "512"]))
            .await;
        // On the host, /tmp/<fill> exists only if the sandbox's /tmp was the host's.
        let leaked = Path::new("/tmp").join(&fill);
        let leaked_tmp = leaked.exists();
        let _ = std::fs::remove_file(&leaked);
        assert!(!leaked_tmp, "row 10: the sandbox's /tmp is the host's /tmp");
        sandbox.cleanup().await;
        let fill = exec.attempts("fill-disk").into_iter().next();
        let written = fill
            .as_ref()
            .and_then(|f| f["written"].as_u64())
            .unwrap_or(0);
        assert!(
            fill.as_ref().is_none_or(|f| f["ok"] == false),
            "row 10: wrote 512 MiB into {dir} under a 32 MiB disk limit: {fill:?}"
        );
        assert!(
            written <= limit + (8 << 20),
            "row 10: {written} bytes written into {dir} under a {limit}-byte limit"
        );
        let enospc = fill.as_ref().is_some_and(|f| {
            matches!(f["errno"].as_i64(), Some(28) | Some(122)) // ENOSPC, EDQUOT
        });
        assert!(
            exec.outcome.termination == Termination::Disk || enospc,
            "row 10: filling {dir} must end as Disk or ENOSPC: {:?}\n{}",
            exec.outcome,
            exec.output.dump()
        );
    }
    Ok(())
}

/// Peak resident memory (`VmHWM`) of `pid`, or of this process.
fn peak_rss_bytes(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    let status = std::fs::read_to_string(path).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Row 11: what is kept of a stdout/stderr flood is capped at maxOutputBytes with truncation
/// recorded, the relay (where a backend relays) gets all of it, and the host process does not
/// buffer it (its peak RSS stays below the flood size). The host is this
/// process, or the one named by [`SuiteEnv::with_host_pid`] (a sandbox server); its peak must
/// be readable then, or the row would check nothing.
pub async fn row11_output_flood_capped(env: &SuiteEnv) -> CaseResult {
    let flood: u64 = 256 << 20;
    let cap: u64 = 1 << 20;
    for stream in ["stdout", "stderr"] {
        let project = Project::new(env);
        let mut controls = env.controls();
        controls.max_output_bytes = cap;
        let (exec, collected) = run_once(
            env,
            &project,
            controls,
            project.attack_argv(&["flood", &flood.to_string(), stream]),
        )
        .await?;
        let o = &exec.outcome;
        let (truncated, captured) = if stream == "stdout" {
            (o.stdout_truncated, exec.output.bytes(true))
        } else {
            (o.stderr_truncated, exec.output.bytes(false))
        };
        assert!(
            truncated,
            "row 11: {stream} flood not recorded as truncated: {o:?}"
        );
        assert!(
            captured <= cap + (64 << 10),
            "row 11: {captured} bytes of {stream} delivered under a cap of {cap}"
        );
        assert!(
            matches!(o.termination, Termination::Exited | Termination::Output),
            "row 11: {o:?}"
        );
        // What is relayed is the step's stream, not what is kept: whole, where a backend
        // relays it (streamed through, never held).
        let relayed = exec.output.relayed(stream == "stdout");
        assert!(
            relayed == 0 || o.termination != Termination::Exited || relayed >= flood,
            "row 11: {relayed} bytes of a {flood}-byte {stream} flood relayed: {o:?}"
        );
        if let Ok(report) = collected {
            check_bundle(&report.bundle_path);
        }
    }
    let host = env.host_pid();
    if std::env::var_os(crate::conformance::VERBOSE_ENV).is_some() {
        println!(
            "[{}] peak RSS of the host ({}): {:?} bytes; flood {flood} bytes",
            env.test_name(),
            host.map_or("this process".to_string(), |p| format!("pid {p}")),
            peak_rss_bytes(host)
        );
    }
    match (peak_rss_bytes(host), host) {
        (Some(peak), _) => assert!(
            peak < flood,
            "row 11: the host process ({}) peaked at {peak} bytes: output was buffered on the host",
            host.map_or("this test process".to_string(), |p| format!("pid {p}"))
        ),
        (None, Some(pid)) => panic!("row 11: cannot read the peak memory of host pid {pid}"),
        (None, None) => {}
    }
    Ok(())
}

/// Row 12: background, double-forked, setsid'd, SIGTERM-ignoring children are all gone when
/// execute returns: after a timeout, and after the main command exits on its own.
pub async fn row12_outlive_timeout(env: &SuiteEnv) -> CaseResult {
    outlive_case(env, "row 12 (timeout)", true).await?;
    outlive_case(env, "row 12 (main exits)", false).await
}

/// Row 13: when the orchestrating process is SIGKILLed, its sandbox processes die with it,
/// and another process can clean up from the stored handle.
///
/// The test re-executes its own binary (this test only, `HELPER_ENV` set) as the orchestrator,
/// which starts a sandbox running a marked `sleep`; the parent waits for the marker to show in
/// `/proc`, SIGKILLs the child, and checks (bounded, generous wait for the kernel) that no
/// marked process survives.
pub async fn row13_survive_host_kill(env: &SuiteEnv) -> CaseResult {
    if std::env::var(HELPER_ENV).as_deref() == Ok("row13") {
        return row13_helper(env).await;
    }
    if !env.host_processes_visible() {
        return Err(Skip::new(
            "sandbox processes are not visible in this host's /proc",
        ));
    }
    let project = Project::new(env);
    let marker = unique("smithers-suite-orphan");
    let handle_file = project.outside.join("handle.json");
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(&exe)
        .args([
            env.test_name(),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_ENV, "row13")
        .envs(env.helper_env().iter().map(|(k, v)| (k, v)))
        .env("SMITHERS_SUITE_ROW13_PROJECT", &project.root)
        .env("SMITHERS_SUITE_ROW13_HANDLE", &handle_file)
        .env("SMITHERS_SUITE_ROW13_MARKER", &marker)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("re-exec the test binary as the orchestrator");
    let started = wait_until(Duration::from_secs(60), || {
        !host_marker_pids(&marker).is_empty()
    })
    .await;
    if !started {
        let _ = child.kill();
        let out = child.wait_with_output().expect("wait helper");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if stderr.contains("SKIP") {
            return Err(Skip::new(format!("helper skipped: {stderr}")));
        }
        panic!(
            "row 13: the helper never started its sandbox ({}):\n{stderr}",
            out.status
        );
    }
    if std::env::var_os(crate::conformance::VERBOSE_ENV).is_some() {
        println!(
            "[{}] sandbox processes before SIGKILL of the orchestrator: {:?}",
            env.test_name(),
            host_marker_pids(&marker)
        );
    }
    child.kill().expect("SIGKILL the orchestrator");
    let _ = child.wait();
    // The kernel needs a moment to deliver the deaths; a generous bound, not a timing claim.
    let gone = wait_until(Duration::from_secs(30), || {
        host_marker_pids(&marker).is_empty()
    })
    .await;
    let survivors = host_marker_pids(&marker);
    // Recovery: another process cleans up from the stored handle.
    let cleanup = match std::fs::read_to_string(&handle_file)
        .ok()
        .and_then(|t| serde_json::from_str::<SandboxHandle>(&t).ok())
    {
        Some(handle) => Some(env.runtime().cleanup(&handle).await),
        None => None,
    };
    if !gone {
        kill_host_pids(&survivors);
        assert_reported_not_enforced(
            env,
            "row 13",
            &["parent-death", "process-cleanup"],
            None,
            &[json!({"attempt": "survive-host-kill", "ok": true, "pids": survivors})],
        )
        .await;
    }
    match cleanup {
        Some(Ok(())) => {}
        Some(Err(e)) => panic!(
            "row 13: cleanup from the stored handle failed: {}",
            e.report()
        ),
        None => panic!("row 13: the helper did not store its handle"),
    }
    assert_no_marker_processes(&marker, "row 13: after cleanup from the stored handle");
    Ok(())
}

async fn row13_helper(env: &SuiteEnv) -> CaseResult {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("helper needs {k}"));
    let root = std::path::PathBuf::from(var("SMITHERS_SUITE_ROW13_PROJECT"));
    let marker = var("SMITHERS_SUITE_ROW13_MARKER");
    let config = env.config(&root, &unique("orphan"), env.controls());
    let handle = match crate::conformance::create_placed(env, &config).await {
        Ok(h) => h,
        Err(e) => {
            eprintln!("SKIP helper: {}", e.report());
            return Err(crate::conformance::unavailable_or_panic(e));
        }
    };
    std::fs::write(
        var("SMITHERS_SUITE_ROW13_HANDLE"),
        serde_json::to_vec(&handle).expect("handle json"),
    )
    .expect("store the handle");
    let request = smithers_runtime::RequestBundle {
        request: json!({"status": "pending", "sandboxId": config.sandbox_id,
                        "runtime": config.runtime.as_str(), "input": {}}),
    };
    env.runtime().ship(&handle, &request).await.expect("ship");
    let command = smithers_runtime::StepCommand {
        argv: vec![
            "/workspace/smithers-attack".into(),
            "daemonize".into(),
            marker.clone(),
            "600".into(),
            "+".into(),
            "sleep".into(),
            marker,
            "600".into(),
        ],
        cwd: None,
        stdin: Default::default(),
    };
    // Runs until the parent SIGKILLs this process.
    let _ = env
        .runtime()
        .execute(
            &handle,
            &command,
            smithers_runtime::CancellationToken::new(),
            &smithers_runtime::NullSink,
        )
        .await;
    Ok(())
}

async fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    f()
}

/// Row 14: `ln -s /etc/passwd x` then editing x: the host /etc/passwd is untouched, the host
/// project unchanged, and the patch describes a symlink (mode 120000).
pub async fn row14_symlink_to_host_file(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let before = project.snapshot();
    let passwd = std::fs::read("/etc/passwd").unwrap_or_default();
    let (exec, collected) = run_once(
        env,
        &project,
        env.controls(),
        vec![
            "/bin/sh".into(),
            "-c".into(),
            // `true >> x` opens the link target for appending and writes nothing, so a broken
            // runtime cannot damage the host's /etc/passwd. (`true`, not `:`: a failed
            // redirection on a special builtin would end the shell.)
            "ln -s /etc/passwd x; true >> x; \
             ln -s /etc etcdir; true > etcdir/smithers-suite-row14; true"
                .into(),
        ],
    )
    .await?;
    assert!(
        exec.outcome.succeeded(),
        "{:?}\n{}",
        exec.outcome,
        exec.output.dump()
    );
    assert_eq!(
        std::fs::read("/etc/passwd").unwrap_or_default(),
        passwd,
        "row 14: host /etc/passwd changed"
    );
    let through = Path::new("/etc/smithers-suite-row14");
    if through.exists() {
        let _ = std::fs::remove_file(through);
        panic!("row 14: created /etc/smithers-suite-row14 through a symlinked parent");
    }
    before.assert_same(&project.snapshot(), "row 14: host project changed");
    let report = collected.unwrap_or_else(|e| panic!("collect failed: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    assert!(
        bundle.patch_text.contains("120000"),
        "row 14: the patch must describe x as a symlink (mode 120000):\n{}",
        bundle.patch_text
    );
    assert!(
        bundle.patch_text.contains("/etc/passwd"),
        "{}",
        bundle.patch_text
    );
    assert!(
        !bundle.patch_text.contains("root:x:0:0"),
        "row 14: the patch carries the content of /etc/passwd instead of a link"
    );
    Ok(())
}

/// Row 15: artifacts and patch paths that escape (symlinks in /result pointing at host files or
/// directories, `..` and absolute patch names in the result JSON) never reach the bundle or the
/// host: collect rejects them (TOOL_PATH_ESCAPE) or leaves them out.
pub async fn row15_result_path_escapes_rejected(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let evil = unique("smithers-suite-row15");
    let evil_abs = format!("/tmp/{evil}.patch");
    let result_json = json!({
        "status": "finished",
        "outputs": {},
        "patches": [format!("../../../../../../tmp/{evil}.patch"), evil_abs.clone(),
                    "patches/../../escape.patch"],
    })
    .to_string();
    let script = format!(
        "mkdir -p /result/artifacts /result/patches; \
         ln -s /etc/passwd /result/artifacts/leak; \
         ln -s / /result/artifacts/rootdir; \
         ln -s /etc /result/patches/etc; \
         ln -s /etc/passwd /result/patches/p.patch; \
         printf '%s' '{result_json}' > \"$SMITHERS_SANDBOX_RESULT_PATH\"; true"
    );
    let (exec, collected) = run_once(
        env,
        &project,
        env.controls(),
        vec!["/bin/sh".into(), "-c".into(), script],
    )
    .await?;
    assert!(
        exec.outcome.succeeded(),
        "{:?}\n{}",
        exec.outcome,
        exec.output.dump()
    );
    assert!(
        !Path::new(&evil_abs).exists(),
        "row 15: {evil_abs} written on the host"
    );
    match collected {
        Err(e) => {
            let r = e.report();
            assert!(
                matches!(r.code, ErrorCode::ToolPathEscape | ErrorCode::InvalidInput)
                    || r.to_json().to_string().contains("TOOL_PATH_ESCAPE"),
                "row 15: collect must reject with TOOL_PATH_ESCAPE: {r}"
            );
        }
        Ok(report) => {
            // check_bundle rejects symlinks and patch paths outside patches/.
            let bundle = check_bundle(&report.bundle_path);
            let passwd = std::fs::read("/etc/passwd").unwrap_or_default();
            for f in &bundle.files {
                let content = std::fs::read(report.bundle_path.join(f)).unwrap_or_default();
                assert!(
                    passwd.is_empty() || content != passwd,
                    "row 15: the host /etc/passwd was copied into the bundle as {}",
                    f.display()
                );
            }
            let parent = report.bundle_path.parent().map(Path::to_path_buf);
            if let Some(parent) = parent {
                assert!(
                    !parent.join("escape.patch").exists(),
                    "row 15: escape.patch written"
                );
            }
        }
    }
    Ok(())
}

fn names_a_limit(e: &RuntimeError) -> bool {
    let text = e.report().to_json().to_string().to_ascii_lowercase();
    LIMIT_WORDS.iter().any(|w| text.contains(w))
}

/// Row 16: bundle bombs (deep result JSON, a huge result JSON, deep JSON on stdout, outputs
/// just past the depth and string bounds, 10k files in /result) are rejected naming the limit,
/// or cut to the contract's bounds with the cut recorded; the bundle that is written stays
/// valid. A result silently dropped (a `finished` bundle without the step's outputs and no word
/// of why) fails the row.
pub async fn row16_bundle_bomb_rejected(env: &SuiteEnv) -> CaseResult {
    // (what, attack, whether the bomb is the step's result)
    let bombs: [(&str, Vec<&str>, bool); 6] = [
        (
            "deep result JSON (100000)",
            vec!["deep-json", "$RESULT", "100000"],
            true,
        ),
        (
            "result outputs 20 deep",
            vec!["deep-json", "$RESULT", "20"],
            true,
        ),
        (
            "huge result JSON (8 MiB)",
            vec!["big-result", "$RESULT", "8388608"],
            true,
        ),
        (
            "result string of 100000",
            vec!["big-result", "$RESULT", "100000"],
            true,
        ),
        (
            "deep JSON on stdout",
            vec!["deep-json", "-", "100000"],
            true,
        ),
        (
            "10k files in /result",
            vec!["many-files", "/result/artifacts/bomb", "10000"],
            false,
        ),
    ];
    let mut failures = Vec::new();
    for (what, attack, is_result) in bombs {
        let project = Project::new(env);
        // The attack takes the result path literally; let the shell expand it.
        let line = format!(
            "exec {} {}",
            project.attack,
            attack
                .iter()
                .map(|a| if *a == "$RESULT" {
                    "\"$SMITHERS_SANDBOX_RESULT_PATH\"".to_string()
                } else {
                    (*a).to_string()
                })
                .collect::<Vec<_>>()
                .join(" ")
        );
        let mut sandbox = start(env, &project, env.controls()).await?;
        sandbox.ship(json!({})).await;
        let exec = sandbox
            .exec_with(
                vec!["/bin/sh".into(), "-c".into(), line],
                smithers_runtime::CancellationToken::new(),
            )
            .await;
        let exec = match exec {
            Ok(exec) => exec,
            Err(e) => {
                if !names_a_limit(&e) {
                    failures.push(format!(
                        "{what}: execute failed without naming a limit: {}",
                        e.report()
                    ));
                }
                sandbox.cleanup().await;
                continue;
            }
        };
        if let Some(result) = &exec.outcome.result {
            let size = result.to_string().len();
            // Depth is the bundle writer's business; the host-memory bound is the size.
            if size > 5 << 20 {
                failures.push(format!(
                    "{what}: the outcome carries a result beyond the bundle bounds ({size} bytes)"
                ));
            }
        }
        match sandbox.collect().await {
            Err(e) => {
                if !names_a_limit(&e) {
                    failures.push(format!(
                        "{what}: collect failed without naming the limit: {}",
                        e.report()
                    ));
                }
            }
            Ok(report) => {
                let bundle = check_bundle(&report.bundle_path);
                let outputs = &bundle.manifest["outputs"];
                if json_depth(outputs) > 16 {
                    failures.push(format!("{what}: outputs deeper than 16 in the bundle"));
                }
                let artifacts = bundle
                    .files
                    .iter()
                    .filter(|f| f.starts_with("artifacts"))
                    .count();
                if artifacts > 1000 {
                    failures.push(format!("{what}: {artifacts} artifacts in the bundle"));
                }
                if outputs["big"].as_str().is_some_and(|s| s.len() > 65536) {
                    failures.push(format!("{what}: a string beyond 65536 in the outputs"));
                }
                let dropped = is_result && outputs.is_null();
                if dropped
                    && (bundle.manifest["status"] == "finished"
                        || !bundle_mentions_limit(&report.bundle_path))
                {
                    failures.push(format!(
                        "{what}: the step's result was dropped silently (bundle status {}, no \
                         outputs, no limit named in the bundle or an error)",
                        bundle.manifest["status"]
                    ));
                }
            }
        }
        sandbox.cleanup().await;
    }
    assert!(failures.is_empty(), "row 16: {failures:#?}");
    Ok(())
}

/// Whether the bundle's README or log names a limit (a cut recorded for the reader).
fn bundle_mentions_limit(bundle: &Path) -> bool {
    ["README.md", "logs/stream.ndjson"].iter().any(|f| {
        let mut text = Vec::new();
        if let Ok(file) = std::fs::File::open(bundle.join(f)) {
            use std::io::Read;
            let _ = file.take(8 << 20).read_to_end(&mut text);
        }
        let text = String::from_utf8_lossy(&text).to_ascii_lowercase();
        LIMIT_WORDS.iter().any(|w| text.contains(w))
    })
}

const LIMIT_WORDS: &[&str] = &[
    "limit",
    "exceed",
    "max",
    "too many",
    "depth",
    "too large",
    "too big",
];

fn json_depth(v: &Value) -> usize {
    // Iterative: the value under test may be deep enough to overflow a recursive walk.
    let mut max = 0;
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        max = max.max(d);
        match v {
            Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            Value::Object(o) => stack.extend(o.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    max
}

/// Row 17: block devices, /dev/mem, /dev/kmsg and friends are absent or denied, and a device
/// node cannot be made.
pub async fn row17_devices_denied(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let mut attempts: Vec<Vec<String>> = [
        "/dev/sda",
        "/dev/vda",
        "/dev/nvme0n1",
        "/dev/mem",
        "/dev/kmem",
        "/dev/port",
        "/dev/kmsg",
    ]
    .iter()
    .map(|d| vec!["open-device".into(), d.to_string()])
    .collect();
    attempts.push(words("mknod /tmp/smithers-sda 8 0"));
    attempts.push(words("mknod /tmp/smithers-vda 253 0"));
    attempts.push(words("open-device /dev/null"));
    let argv = batch(&attempts);
    let (exec, _) = run_once(
        env,
        &project,
        env.controls(),
        project.attack_argv(&args(&argv)),
    )
    .await?;
    let results = exec.output.attempts();
    assert_eq!(results.len(), attempts.len(), "{}", exec.output.dump());
    let (hostile, null) = results.split_at(results.len() - 1);
    assert_eq!(null[0]["ok"], true, "/dev/null must be usable: {}", null[0]);
    assert_reported_not_enforced(
        env,
        "row 17",
        &["devices", "seccomp", "capabilities"],
        Some(&exec.outcome),
        &breaches(hostile),
    )
    .await;
    Ok(())
}
