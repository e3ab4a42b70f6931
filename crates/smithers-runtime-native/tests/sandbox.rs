//! Real sandboxes on this host: namespaces, overlay, seccomp, Landlock, cgroups.
//!
//! A test needing a kernel feature the host lacks prints `SKIP <reason>`; with `CI=true` the
//! missing feature fails the test instead.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use smithers_runtime::{
    CancellationToken, Controls, ExecOutcome, OutputEvent, OutputSink, ProtectionStatus,
    RequestBundle, Runtime, RuntimeKind, SandboxConfig, SandboxHandle, StepCommand, Termination,
};
use smithers_runtime_native::{InitCommand, NativeOptions, NativeRuntime};
use smithers_test_support::{skip_optional, skip_or_fail};

fn runtime() -> NativeRuntime {
    runtime_with(NativeOptions::default())
}

/// A runtime with `options`, running this build's init binary.
fn runtime_with(options: NativeOptions) -> NativeRuntime {
    NativeRuntime::new(NativeOptions {
        init: Some(InitCommand::binary(env!(
            "CARGO_BIN_EXE_smithers-sandbox-init"
        ))),
        ..options
    })
}

/// Checks the host can run sandboxes at all (user namespaces + overlay); SKIP otherwise.
async fn usable(rt: &NativeRuntime) -> bool {
    let report = rt.probe().await;
    let missing: Vec<String> = [
        "user-namespace",
        "mount-namespace",
        "pid-namespace",
        "workspace-cow",
    ]
    .iter()
    .filter(|n| !report.is_enforced(n))
    .map(|n| {
        format!(
            "{n}: {}",
            report.get(n).map(|p| p.detail.as_str()).unwrap_or("?")
        )
    })
    .collect();
    missing.is_empty() || skip_or_fail(&format!("native sandboxes unavailable: {missing:?}"))
}

/// `report_ok`, or a skip (a failure under CI=true) for want of `what`.
fn requires(report_ok: bool, what: &str) -> bool {
    report_ok || skip_or_fail(what)
}

#[derive(Default)]
struct Lines(Mutex<Vec<OutputEvent>>);

impl OutputSink for Lines {
    fn event(&self, event: OutputEvent) {
        self.0.lock().unwrap().push(event);
    }
}

impl Lines {
    fn stdout(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                OutputEvent::Stdout { line, .. } => Some(line.clone()),
                _ => None,
            })
            .collect()
    }
}

struct Sandbox {
    rt: Arc<NativeRuntime>,
    handle: SandboxHandle,
    project: tempfile::TempDir,
}

static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Sandbox {
    async fn new(rt: Arc<NativeRuntime>, controls: Controls) -> Sandbox {
        let project = tempfile::tempdir().unwrap();
        std::fs::write(project.path().join("hello.txt"), "hello from the host\n").unwrap();
        std::fs::create_dir(project.path().join("src")).unwrap();
        std::fs::write(project.path().join("src/lib.rs"), "fn main() {}\n").unwrap();
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let config = SandboxConfig {
            run_id: format!("run-{}-{n}", std::process::id()),
            sandbox_id: "sb".into(),
            runtime: RuntimeKind::Bubblewrap,
            root_dir: project.path().to_path_buf(),
            image: None,
            controls,
            workspace_layers: Vec::new(),
        };
        let handle = rt.create(&config).await.expect("create");
        rt.ship(
            &handle,
            &RequestBundle {
                request: json!({"status": "pending", "sandboxId": "sb", "runtime": "bubblewrap", "input": {"n": 1}}),
            },
        )
        .await
        .expect("ship");
        Sandbox {
            rt,
            handle,
            project,
        }
    }

    async fn run(&self, script: &str) -> (ExecOutcome, Lines) {
        let lines = Lines::default();
        let outcome = self
            .rt
            .execute(
                &self.handle,
                &StepCommand {
                    argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
                    cwd: None,
                    stdin: Default::default(),
                },
                CancellationToken::new(),
                &lines,
            )
            .await
            .expect("execute");
        (outcome, lines)
    }

    /// The overlay's upper layer: on the layer root (disk) by default, else in the state
    /// directory.
    fn upper(&self) -> PathBuf {
        let b = &self.handle.backend;
        match (
            b["layerDir"].as_str(),
            b["flatLayer"].as_bool() == Some(true),
        ) {
            // A flat layer has its upper directory beside it.
            (Some(layer), true) => PathBuf::from(format!("{layer}.upper")),
            (Some(layer), false) => PathBuf::from(layer).join("upper"),
            (None, _) => PathBuf::from(b["stateDir"].as_str().unwrap()).join("layer/upper"),
        }
    }

    /// Cleans up (twice: idempotent) and hands back the project directory.
    async fn done(self) -> tempfile::TempDir {
        self.rt.cleanup(&self.handle).await.expect("cleanup");
        self.rt
            .cleanup(&self.handle)
            .await
            .expect("cleanup is idempotent");
        self.project
    }
}

fn shared() -> Arc<NativeRuntime> {
    Arc::new(runtime())
}

#[tokio::test(flavor = "multi_thread")]
async fn echo_and_exit_codes() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    let sb = Sandbox::new(rt.clone(), Controls::default()).await;
    let (outcome, lines) = sb.run("echo hello; echo oops >&2").await;
    assert_eq!(lines.stdout(), vec!["hello".to_string()]);
    assert_eq!(outcome.termination, Termination::Exited);
    assert_eq!(outcome.exit_code, Some(0));
    assert!(outcome.enforcement.is_enforced("network"));
    assert!(outcome.enforcement.is_enforced("seccomp"));

    // Sandbox processes are the OOM killer's first choice.
    let (_, lines) = sb.run("cat /proc/self/oom_score_adj").await;
    assert_eq!(lines.stdout(), ["1000"]);

    let (outcome, _) = sb.run("exit 3").await;
    assert_eq!(outcome.termination, Termination::Exited);
    assert_eq!(outcome.exit_code, Some(3));

    let (outcome, _) = sb
        .run("pwd; id -u; hostname; cat \"$SMITHERS_SANDBOX_REQUEST_PATH\"")
        .await;
    assert_eq!(outcome.exit_code, Some(0));
    sb.done().await;
}

/// The command starts the way a shell would start it: no signal ignored or blocked (the init,
/// a Rust program, ignores SIGPIPE), stdin `/dev/null`, nothing open beyond 0-2, its own
/// session.
#[tokio::test(flavor = "multi_thread")]
async fn the_command_starts_with_a_clean_process_state() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    let sb = Sandbox::new(rt.clone(), Controls::default()).await;
    let (outcome, lines) = sb
        .run(
            "grep -E '^(SigIgn|SigBlk)' /proc/self/status; ls /proc/self/fd; \
             readlink /proc/self/fd/0; ps -o sid= -p $$; echo pid=$$; \
             yes | head -c 1 >/dev/null",
        )
        .await;
    assert_eq!(outcome.exit_code, Some(0), "{:?}", lines.0.lock().unwrap());
    let out = lines.stdout();
    for mask in out.iter().filter(|l| l.starts_with("Sig")) {
        let bits = u64::from_str_radix(mask.split_whitespace().last().unwrap(), 16).unwrap();
        // SIGPIPE is signal 13: bit 12. (glibc keeps its two internal signals, 32 and 33.)
        assert_eq!(bits & !(3 << 31), 0, "{mask}");
    }
    // ls's own directory descriptor is the only one beyond 0-2.
    let fds: Vec<&String> = out
        .iter()
        .filter(|l| l.chars().all(|c| c.is_ascii_digit()))
        .collect();
    assert!(fds.len() <= 5, "open descriptors: {fds:?}");
    assert!(out.contains(&"/dev/null".to_string()), "{out:?}");
    let pid = out
        .iter()
        .find_map(|l| l.strip_prefix("pid="))
        .expect("pid");
    assert!(
        out.iter().any(|l| l.trim() == pid),
        "the command leads its own session: {out:?}"
    );
    // Not found, and not executable: the exit codes and message a shell would give.
    for (argv0, code) in [("no-such-command-here", 127), ("/etc/passwd", 126)] {
        let lines = Lines::default();
        let outcome = sb
            .rt
            .execute(
                &sb.handle,
                &StepCommand {
                    argv: vec![argv0.into()],
                    cwd: None,
                    stdin: Default::default(),
                },
                CancellationToken::new(),
                &lines,
            )
            .await
            .unwrap();
        assert_eq!(outcome.exit_code, Some(code), "{argv0}");
        let said = lines.0.lock().unwrap().clone();
        assert!(
            format!("{said:?}").contains(&format!("cannot execute {argv0}")),
            "{said:?}"
        );
    }
    sb.done().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn environment_cwd_request_and_result() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    let mut controls = Controls::default();
    controls.env.insert("STEP_VAR".into(), "step value".into());
    let sb = Sandbox::new(rt.clone(), controls).await;
    let (outcome, lines) = sb
        .run(
            "pwd; echo \"$STEP_VAR\"; env | sort | cut -d= -f1 | tr '\\n' ' '; echo; \
             cat \"$SMITHERS_SANDBOX_REQUEST_PATH\" | tr -d ' \\n'; echo; \
             echo '{\"status\":\"finished\",\"outputs\":{\"answer\":42}}' > \"$SMITHERS_SANDBOX_RESULT_PATH\"",
        )
        .await;
    let out = lines.stdout();
    assert_eq!(out[0], "/workspace");
    assert_eq!(out[1], "step value");
    let keys: Vec<&str> = out[2].split_whitespace().collect();
    for key in keys.iter() {
        assert!(
            [
                "HOME",
                "XDG_CACHE_HOME",
                "LANG",
                "PATH",
                "PWD",
                "SHLVL",
                "SMITHERS_SANDBOX",
                "SMITHERS_SANDBOX_REQUEST_PATH",
                "SMITHERS_SANDBOX_RESULT_PATH",
                "STEP_VAR",
                "TMPDIR",
                "USER",
                "TERM",
                "TZ",
                "LC_ALL",
                "LC_CTYPE",
                "_",
                "OLDPWD"
            ]
            .contains(key),
            "unexpected variable {key} leaked into the sandbox"
        );
    }
    assert!(out[3].contains("\"input\":{\"n\":1}"), "{}", out[3]);
    assert_eq!(
        outcome.result,
        Some(json!({"status": "finished", "outputs": {"answer": 42}}))
    );
    let report = sb.rt.collect(&sb.handle).await.expect("collect");
    let readme: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report.bundle_path.join("README.md")).unwrap())
            .unwrap();
    assert_eq!(readme["status"], "finished");
    assert_eq!(readme["outputs"], json!({"answer": 42}));
    sb.done().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn workspace_is_copy_on_write_and_collected_as_patches() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    let sb = Sandbox::new(rt.clone(), Controls::default()).await;
    std::fs::create_dir_all(sb.project.path().join(".smithers/secret")).unwrap();
    std::fs::write(sb.project.path().join(".smithers/secret/db"), "state").unwrap();
    let (outcome, lines) = sb
        .run(
            "echo changed > hello.txt && echo new > added.txt && rm src/lib.rs && \
             mkdir -p /result/sub && echo art > /result/sub/a.txt && \
             ls -A /workspace && if [ -e /workspace/.smithers ]; then echo STATE-SHOWN; fi",
        )
        .await;
    assert_eq!(outcome.exit_code, Some(0), "{:?}", lines.0.lock().unwrap());
    // `.smithers` is absent from the view, not masked: not listed, not there.
    let listed = lines.stdout();
    assert!(
        listed.contains(&"hello.txt".to_string())
            && !listed
                .iter()
                .any(|l| l == ".smithers" || l == "STATE-SHOWN"),
        ".smithers must be absent: {listed:?}"
    );
    // The host tree is untouched; the change is in the upper layer.
    assert_eq!(
        std::fs::read_to_string(sb.project.path().join("hello.txt")).unwrap(),
        "hello from the host\n"
    );
    assert!(sb.project.path().join("src/lib.rs").exists());
    assert!(!sb.project.path().join("added.txt").exists());
    assert_eq!(
        std::fs::read_to_string(sb.upper().join("hello.txt")).unwrap(),
        "changed\n"
    );

    let report = sb.rt.collect(&sb.handle).await.expect("collect");
    assert_eq!(report.patch_count, 3);
    let bundle = &report.bundle_path;
    let readme: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("README.md")).unwrap()).unwrap();
    assert_eq!(readme["status"], "finished");
    assert_eq!(readme["patches"].as_array().unwrap().len(), 3);
    assert_eq!(
        std::fs::read_to_string(bundle.join("artifacts/sub/a.txt")).unwrap(),
        "art\n"
    );
    let log = std::fs::read_to_string(bundle.join("logs/stream.ndjson")).unwrap();
    let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert_eq!(last["type"], "exit");
    assert_eq!(last["exitCode"], 0);
    let all_patches: String = std::fs::read_dir(bundle.join("patches"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    assert!(all_patches.contains("+changed"));
    assert!(all_patches.contains("deleted file mode"));
    smithers_bundle::validate_bundle(bundle).expect("the bundle validates");
    let state_dir = PathBuf::from(sb.handle.backend["stateDir"].as_str().unwrap());
    let bundle = bundle.clone();
    let _project = sb.done().await;
    assert!(!state_dir.exists(), "cleanup removes the state");
    assert!(
        bundle.join("README.md").exists(),
        "cleanup keeps the bundle"
    );
}

/// The workspace overlay is mounted `volatile` where the kernel has the option (Linux 5.10):
/// its unmount, when the sandbox's last process exits, must not sync the host file system the
/// upper layer is on. Older kernels get the overlay without it (the init falls back).
#[tokio::test(flavor = "multi_thread")]
async fn the_workspace_overlay_is_never_synced() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    let sb = Sandbox::new(rt.clone(), Controls::default()).await;
    let (outcome, lines) = sb.run("grep ' /workspace ' /proc/mounts").await;
    assert_eq!(outcome.exit_code, Some(0), "{:?}", lines.0.lock().unwrap());
    let mount = lines.stdout().join("\n");
    println!("the workspace: {mount}");
    if requires(mount.contains(" overlay "), "an overlay workspace") {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut parts = release.trim().split(['.', '-']);
        let major: u32 = parts.next().unwrap().parse().unwrap();
        let minor: u32 = parts.next().unwrap().parse().unwrap();
        assert_eq!(
            mount.contains("volatile"),
            (major, minor) >= (5, 10),
            "kernel {release}: {mount}"
        );
    }
    sb.done().await;
}

/// A sandbox left by a process that died before its handle was stored (simulated: its
/// cleanup record names an owner that is not running) does not block its ids: the next create
/// of the same ids cleans it up (the step's layer with what it wrote, its cgroups) and makes
/// the sandbox anew. A sandbox whose owner runs (here, this process) still blocks them.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_owners_leftover_is_taken_over_by_a_create_of_its_ids() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    let sb = Sandbox::new(rt.clone(), Controls::default()).await;
    let (outcome, _) = sb.run("echo left > left-behind.txt").await;
    assert_eq!(outcome.exit_code, Some(0));
    let left = sb.upper().join("left-behind.txt");
    assert!(left.exists());
    let config = SandboxConfig {
        run_id: sb.handle.run_id.clone(),
        sandbox_id: sb.handle.sandbox_id.clone(),
        runtime: RuntimeKind::Bubblewrap,
        root_dir: sb.project.path().to_path_buf(),
        image: None,
        controls: Controls::default(),
        workspace_layers: Vec::new(),
    };
    let err = rt.create(&config).await.unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");

    let state_dir = PathBuf::from(sb.handle.backend["stateDir"].as_str().unwrap());
    let record_path = state_dir.join("cleanup.json");
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record_path).unwrap()).unwrap();
    // No process of this boot started at tick 1 with this pid: the owner is gone.
    record["ownerStart"] = json!(1);
    std::fs::write(&record_path, serde_json::to_vec(&record).unwrap()).unwrap();
    let cgroups: Vec<PathBuf> = record["cgroups"]["dirs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| PathBuf::from(d["path"].as_str().unwrap()))
        .collect();

    let handle = rt
        .create(&config)
        .await
        .expect("the leftover is taken over");
    assert!(!left.exists(), "the leftover's layer was removed");
    for dir in &cgroups {
        // Made anew for the new sandbox when its name is the same: then empty and fresh.
        assert!(
            !dir.join("cgroup.procs").exists()
                || std::fs::read_to_string(dir.join("cgroup.procs"))
                    .unwrap()
                    .trim()
                    .is_empty(),
            "{}",
            dir.display()
        );
    }
    let fresh: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record_path).unwrap()).unwrap();
    assert_eq!(fresh["ownerPid"], json!(std::process::id()));
    assert_ne!(fresh["ownerStart"], json!(1));
    rt.cleanup(&handle).await.expect("cleanup");
    assert!(!state_dir.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn system_is_read_only_and_secrets_invisible() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    let sb = Sandbox::new(rt.clone(), Controls::default()).await;
    for (script, what) in [
        ("echo x > /etc/passwd", "write /etc/passwd"),
        ("touch /etc/new", "create in /etc"),
        ("touch /usr/bin/evil", "write /usr"),
        ("touch /evil", "write /"),
        ("test -e /etc/shadow", "see /etc/shadow"),
        ("test -e /root/.bashrc || test -d /root", "see /root"),
        // /home holds only the step's own $HOME (/home/sandbox), never the host's homes.
        ("ls -A /home | grep -qvx sandbox", "see the host's /home"),
        (
            "test -e /dev/sda || test -e /dev/vda || test -e /dev/mem || test -e /dev/kmsg",
            "see disks",
        ),
        ("test -e /sys/kernel", "see /sys"),
        ("echo 1 > /proc/sys/kernel/panic", "write /proc/sys"),
        ("mount -t tmpfs none /tmp", "mount"),
        ("unshare -U true", "unshare"),
        (
            &format!("kill -0 {}", std::process::id()),
            "signal a host pid",
        ),
    ] {
        let (outcome, _) = sb.run(script).await;
        assert_ne!(outcome.exit_code, Some(0), "the sandbox could {what}");
    }
    let (outcome, _) = sb
        .run("echo ok > /tmp/x && cat /tmp/x && echo ok > /workspace/y")
        .await;
    assert_eq!(outcome.exit_code, Some(0));
    sb.done().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn network_is_off_by_default() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let sb = Sandbox::new(rt.clone(), Controls::default()).await;
    // bash's /dev/tcp needs no network tool in the image.
    let script = format!(
        "if command -v bash >/dev/null; then bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}'; else exit 1; fi"
    );
    let (outcome, _) = sb.run(&script).await;
    assert_ne!(outcome.exit_code, Some(0));
    assert!(
        listener.accept().is_err(),
        "a connection reached the host listener"
    );
    sb.done().await;
}

fn pids_of_marker(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmdline).contains(marker) {
                found.push(pid);
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_kills_daemonised_children_that_ignore_term() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    let controls = Controls {
        timeout_ms: Some(1500),
        ..Controls::default()
    };
    let sb = Sandbox::new(rt.clone(), controls).await;
    let marker = format!("smithers-marker-{}", std::process::id());
    // A double-forked, setsid'd child ignoring TERM, plus a foreground sleep.
    let script = format!(
        "trap '' TERM; (setsid sh -c 'trap \"\" TERM; exec -a {marker} sleep 1000' &) ; \
         exec -a {marker}-fg sleep 1000"
    );
    let (outcome, _) = sb.run(&format!("exec bash -c \"{script}\"")).await;
    assert_eq!(outcome.termination, Termination::Timeout);
    assert!(
        pids_of_marker(&marker).is_empty(),
        "sandbox processes survived the timeout"
    );
    sb.done().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cancellation_kills_everything() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    let sb = Sandbox::new(rt.clone(), Controls::default()).await;
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        c2.cancel();
    });
    let marker = format!("smithers-cancel-{}", std::process::id());
    let outcome = rt
        .execute(
            &sb.handle,
            &StepCommand {
                argv: vec![
                    "bash".into(),
                    "-c".into(),
                    format!("(sleep 1000 &) ; exec -a {marker} sleep 1000"),
                ],
                cwd: None,
                stdin: Default::default(),
            },
            cancel,
            &Lines::default(),
        )
        .await
        .unwrap();
    assert_eq!(outcome.termination, Termination::Cancelled);
    assert!(pids_of_marker(&marker).is_empty());
    let report = rt.collect(&sb.handle).await.unwrap();
    let readme: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report.bundle_path.join("README.md")).unwrap())
            .unwrap();
    assert_eq!(readme["status"], "cancelled");
    sb.done().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_hog_is_killed_by_the_memory_limit() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    if !requires(
        rt.probe().await.is_enforced("memory"),
        "no memory cgroup controller",
    ) {
        return;
    }
    let controls = Controls {
        memory_limit_bytes: Some(64 << 20),
        ..Controls::default()
    };
    let sb = Sandbox::new(rt.clone(), controls).await;
    // /dev/shm counts against the memory cgroup; tail buffers an endless line in memory.
    let (outcome, _) = sb
        .run("head -c 1000000000 /dev/zero | tail -c 500000000 > /dev/null")
        .await;
    assert_eq!(outcome.termination, Termination::Memory, "{outcome:?}");
    assert!(outcome.usage.peak_memory_bytes.unwrap_or(0) > 32 << 20);
    sb.done().await;
}

/// A step that sets no memory limit gets the runtime's default, and the report says so.
#[tokio::test(flavor = "multi_thread")]
async fn a_step_without_a_memory_limit_gets_the_default() {
    let rt = Arc::new(runtime_with(NativeOptions {
        default_memory_limit: Some(64 << 20),
        ..NativeOptions::default()
    }));
    if !usable(&rt).await {
        return;
    }
    if !requires(
        rt.probe().await.is_enforced("memory"),
        "no memory cgroup controller",
    ) {
        return;
    }
    let sb = Sandbox::new(rt.clone(), Controls::default()).await;
    let (outcome, _) = sb
        .run("head -c 1000000000 /dev/zero | tail -c 500000000 > /dev/null")
        .await;
    assert_eq!(outcome.termination, Termination::Memory, "{outcome:?}");
    let memory = outcome.enforcement.get("memory").unwrap();
    assert_eq!(memory.status, ProtectionStatus::Enforced, "{memory:?}");
    assert!(memory.detail.contains("runtime default"), "{memory:?}");
    sb.done().await;
    // The default is half the host's RAM, at most 8 GiB.
    let default = smithers_runtime_native::default_memory_limit().unwrap();
    assert!(default > 0 && default <= 8 << 30, "{default}");
}

#[tokio::test(flavor = "multi_thread")]
async fn fork_bomb_is_capped_by_the_pids_limit() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    if !requires(
        rt.probe().await.is_enforced("pids"),
        "no pids cgroup controller",
    ) {
        return;
    }
    let controls = Controls {
        pids_limit: Some(32),
        timeout_ms: Some(20_000),
        ..Controls::default()
    };
    let sb = Sandbox::new(rt.clone(), controls).await;
    let (outcome, _) = sb
        .run("for i in $(seq 1 200); do sleep 5 & done 2>/dev/null; wait; true")
        .await;
    assert_eq!(outcome.termination, Termination::Pids, "{outcome:?}");
    assert_eq!(
        outcome.enforcement.get("pids").unwrap().status,
        ProtectionStatus::Enforced
    );
    sb.done().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn output_flood_is_truncated() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    // The cap bounds what is kept; the step runs on, its output relayed whole.
    let controls = Controls {
        max_output_bytes: 64 * 1024,
        timeout_ms: Some(30_000),
        ..Controls::default()
    };
    let sb = Sandbox::new(rt.clone(), controls).await;
    let (outcome, lines) = sb.run("yes flood | head -c 2000000").await;
    assert_eq!(outcome.termination, Termination::Exited, "{outcome:?}");
    assert_eq!(outcome.exit_code, Some(0));
    assert!(outcome.stdout_truncated);
    assert_eq!(outcome.stdout_bytes, 2_000_000);
    let kept: usize = lines.stdout().iter().map(|l| l.len() + 1).sum();
    // +1: the last, cut-off line has no newline.
    assert!(kept <= 64 * 1024 + 1, "kept {kept} bytes");
    sb.done().await;
    // failOnOutputCap: a cap ends the step.
    let controls = Controls {
        max_output_bytes: 64 * 1024,
        fail_on_output_cap: true,
        timeout_ms: Some(30_000),
        ..Controls::default()
    };
    let sb = Sandbox::new(rt.clone(), controls).await;
    let (outcome, lines) = sb.run("yes flood").await;
    assert_eq!(outcome.termination, Termination::Output);
    assert!(outcome.stdout_truncated);
    let kept: usize = lines.stdout().iter().map(|l| l.len() + 1).sum();
    assert!(kept <= 64 * 1024 + 1, "kept {kept} bytes");
    sb.done().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn disk_limit_caps_the_upper_layer() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    if !requires(
        rt.probe().await.is_enforced("disk"),
        "disk limits need root",
    ) {
        return;
    }
    let controls = Controls {
        disk_limit_bytes: Some(8 << 20),
        ..Controls::default()
    };
    let sb = Sandbox::new(rt.clone(), controls.clone()).await;
    let (outcome, _) = sb.run("head -c 20000000 /dev/zero > /workspace/big").await;
    assert_eq!(outcome.termination, Termination::Disk, "{outcome:?}");
    sb.done().await;
    // /result and the output directory count against the same limit (they used to sit on
    // the state root's tmpfs, where a step could write gigabytes whatever --disk said).
    for target in ["/result/big", "/run/smithers/out/big"] {
        let sb = Sandbox::new(rt.clone(), controls.clone()).await;
        let (outcome, _) = sb
            .run(&format!("head -c 20000000 /dev/zero > {target}"))
            .await;
        assert!(
            outcome.usage.disk_bytes.unwrap_or(0) <= 8 << 20,
            "{target}: {:?}",
            outcome.usage
        );
        assert_eq!(
            outcome.termination,
            Termination::Disk,
            "{target}: {outcome:?}"
        );
        sb.done().await;
    }
}

/// Without `--disk` the layer is on the host's disk: a step that fills it is stopped while a
/// reserve is left (here a 96 MiB tmpfs stands for the host's disk, a 32 MiB reserve).
#[tokio::test(flavor = "multi_thread")]
async fn a_step_cannot_fill_the_host_disk_without_a_disk_limit() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !requires(
        root,
        "mounting the small file system that stands for the host's disk needs root",
    ) {
        return;
    }
    let disk = tempfile::tempdir().unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=96m", "smithers-test-disk"])
        .arg(disk.path())
        .status()
        .unwrap();
    assert!(mounted.success());
    let rt = Arc::new(runtime_with(NativeOptions {
        layer_root: Some(disk.path().join("layers")),
        disk_reserve_bytes: 32 << 20,
        ..NativeOptions::default()
    }));
    let outcome = if usable(&rt).await {
        let sb = Sandbox::new(rt.clone(), Controls::default()).await;
        // Writes past the floor, then waits: only the guard can end it as `disk`.
        let (outcome, _) = sb
            .run("head -c 200000000 /dev/zero > /workspace/big; sleep 60")
            .await;
        sb.done().await;
        Some(outcome)
    } else {
        None
    };
    let _ = std::process::Command::new("umount")
        .arg(disk.path())
        .status();
    let Some(outcome) = outcome else { return };
    assert_eq!(outcome.termination, Termination::Disk, "{outcome:?}");
    assert!(outcome.duration < Duration::from_secs(30), "{outcome:?}");
    let disk_row = outcome.enforcement.get("disk").unwrap();
    assert!(
        disk_row.detail.contains("killed when less than"),
        "{disk_row:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unsupported_controls_are_refused() {
    let rt = shared();
    let project = tempfile::tempdir().unwrap();
    let config = SandboxConfig {
        run_id: "refuse".into(),
        sandbox_id: "sb".into(),
        runtime: RuntimeKind::Bubblewrap,
        root_dir: project.path().to_path_buf(),
        image: Some("alpine".into()),
        controls: Controls::default(),
        workspace_layers: Vec::new(),
    };
    let err = rt.create(&config).await.unwrap_err();
    assert!(err.to_string().contains("image"), "{err}");
    assert!(!Path::new(&project.path().join(".smithers")).exists());
}

/// Pids of this process's children running the init in zygote mode.
fn zygotes() -> Vec<i32> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if !cmdline.split(|b| *b == 0).any(|arg| arg == b"--zygote") {
            continue;
        }
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        let parent = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .map(str::trim);
        if parent == Some(me.as_str()) {
            found.push(pid);
        }
    }
    found
}

/// Sandboxes' inits are forked from the runtime's zygote; a zygote that dies (here: killed)
/// is replaced at the next execute, which still runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_zygote_is_replaced() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    let sb = Sandbox::new(rt.clone(), Controls::default()).await;
    let (outcome, lines) = sb.run("echo one").await;
    assert_eq!(outcome.exit_code, Some(0));
    assert_eq!(lines.stdout(), vec!["one".to_string()]);
    let before = zygotes();
    assert!(
        !before.is_empty(),
        "no zygote is running: the init was not forked from one"
    );
    for pid in &before {
        // SAFETY: kill(2) on the pid of a child of this process.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    let (outcome, lines) = sb.run("echo two").await;
    assert_eq!(outcome.exit_code, Some(0), "{:?}", lines.0.lock().unwrap());
    assert_eq!(lines.stdout(), vec!["two".to_string()]);
    assert!(
        zygotes().iter().any(|pid| !before.contains(pid)),
        "no new zygote was started"
    );
    sb.done().await;
}

/// With the zygote turned off the init binary is executed for every sandbox, as it was.
#[tokio::test(flavor = "multi_thread")]
async fn without_a_zygote_the_init_is_executed() {
    let rt = Arc::new(runtime_with(NativeOptions {
        zygote: false,
        ..NativeOptions::default()
    }));
    if !usable(&rt).await {
        return;
    }
    let sb = Sandbox::new(rt.clone(), Controls::default()).await;
    let (outcome, lines) = sb.run("echo direct; exit 4").await;
    assert_eq!(outcome.exit_code, Some(4));
    assert_eq!(lines.stdout(), vec!["direct".to_string()]);
    sb.done().await;
}

/// A prepared root (the default) and a root built on a tmpfs per sandbox show the step the
/// same tree: same names, kinds and link targets at the top, in `/etc`, `/dev` and
/// `/run/smithers`, the same `/etc` contents, and nothing writable outside the writable
/// mounts. Two sandboxes side by side share a prepared root without seeing each other.
#[tokio::test(flavor = "multi_thread")]
async fn a_prepared_root_looks_like_a_root_built_per_sandbox() {
    let per_sandbox = Arc::new(runtime_with(NativeOptions {
        prepared_root: false,
        ..NativeOptions::default()
    }));
    let prepared = shared();
    if !usable(&prepared).await {
        return;
    }
    let script = "find / /etc /dev /run /run/smithers -mindepth 1 -maxdepth 1 \
                  -printf '%p %y %l\\n' | sort; \
                  cat /etc/passwd /etc/hosts | sha256sum; \
                  for p in /x /etc/x /dev/x /usr/x /proc/x; do \
                    ( : > $p ) 2>/dev/null && echo \"wrote $p\"; \
                  done; \
                  echo mine > /tmp/mine; echo written > /workspace/written; echo done";
    let a = Sandbox::new(prepared.clone(), Controls::default()).await;
    let b = Sandbox::new(prepared, Controls::default()).await;
    let c = Sandbox::new(per_sandbox, Controls::default()).await;
    let (a_out, a_lines) = a.run(script).await;
    let (b_out, b_lines) = b.run("ls /tmp; cat /workspace/written 2>&1 || true").await;
    let (c_out, c_lines) = c.run(script).await;
    for outcome in [&a_out, &b_out, &c_out] {
        assert_eq!(outcome.exit_code, Some(0), "{outcome:?}");
    }
    let (a_tree, c_tree) = (a_lines.stdout(), c_lines.stdout());
    assert_eq!(a_tree, c_tree);
    for entry in [
        "/etc/passwd f ",
        "/dev/null c ",
        "/dev/pts d ",
        "/dev/fd l /proc/self/fd",
        "/run/smithers/request d ",
        "/workspace d ",
    ] {
        assert!(
            a_tree.iter().any(|l| l == entry),
            "{entry:?} in {a_tree:#?}"
        );
    }
    assert_eq!(a_tree.last().map(String::as_str), Some("done"));
    assert!(
        !a_tree.iter().any(|l| l.starts_with("wrote")),
        "{a_tree:#?}"
    );
    // And the two roots really are of the two kinds: a bind of a prepared root, where /dev
    // is a directory of it, against a tmpfs with a /dev tmpfs of its own.
    let kinds = "awk '$5 == \"/\" {print \"root\", $4, $9} $5 == \"/dev\" {print \"dev\", $9}' \
                 /proc/self/mountinfo";
    let (_, a_kinds) = a.run(kinds).await;
    let (_, c_kinds) = c.run(kinds).await;
    let (a_kinds, c_kinds) = (a_kinds.stdout(), c_kinds.stdout());
    assert!(
        a_kinds.len() == 1 && a_kinds[0].starts_with("root /") && a_kinds[0].contains("/.root-"),
        "{a_kinds:?}"
    );
    assert_eq!(c_kinds, vec!["root / tmpfs", "dev tmpfs"], "{c_kinds:?}");
    // The other sandbox on the same prepared root saw neither /tmp nor the workspace of the
    // first.
    let b_seen = b_lines.stdout();
    assert!(
        !b_seen.iter().any(|l| l.contains("mine") || l == "written"),
        "{b_seen:?}"
    );
    for sb in [a, b, c] {
        sb.done().await;
    }
}

/// Inside the sandbox: a TCP server and a UDP socket on its own 127.0.0.1, each reached by a
/// client in the same step; and a connection to `host_port` on 127.0.0.1, which from inside
/// is the sandbox's own loopback, where nothing listens. One JSON line of results.
const LOOPBACK_PROBE: &str = r#"
import json, socket, sys
res = {}
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
try:
    srv.bind(("127.0.0.1", 0)); srv.listen(1)
    cli = socket.create_connection(srv.getsockname(), timeout=5)
    conn, _ = srv.accept()
    cli.sendall(b"ping-tcp"); res["tcp"] = conn.recv(64).decode()
except OSError as e:
    res["tcp"] = "error: %s" % e
try:
    u1 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u1.bind(("127.0.0.1", 0))
    u2 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u2.settimeout(5)
    u2.sendto(b"ping-udp", u1.getsockname()); u1.settimeout(5)
    res["udp"] = u1.recv(64).decode()
except OSError as e:
    res["udp"] = "error: %s" % e
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
    res["host"] = "connected"
except OSError as e:
    res["host"] = "refused" if isinstance(e, ConnectionRefusedError) else "error: %s" % e
print(json.dumps(res))
"#;

/// Deliverable 3 of issue 13: without allowNetwork, loopback inside works for TCP and UDP (a
/// test suite may start a local server), while a server on the host's 127.0.0.1 stays
/// unreachable; the network row says the namespace is the boundary and claims no TCP rule.
#[tokio::test(flavor = "multi_thread")]
async fn loopback_inside_works_and_the_hosts_stays_unreachable() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    let python = Path::new("/usr/bin/python3");
    if !requires(python.exists(), "/usr/bin/python3 (for the socket probe)") {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let sb = Sandbox::new(rt.clone(), Controls::default()).await;
    let (outcome, lines) = sb
        .run(&format!(
            "cat > /tmp/probe.py <<'PROBE'\n{LOOPBACK_PROBE}\nPROBE\n/usr/bin/python3 /tmp/probe.py {port}"
        ))
        .await;
    assert_eq!(outcome.exit_code, Some(0), "{outcome:?}");
    let stdout = lines.stdout();
    let res: serde_json::Value =
        serde_json::from_str(stdout.last().expect("probe output")).unwrap();
    assert_eq!(
        res["tcp"], "ping-tcp",
        "TCP on the sandbox's loopback: {res}"
    );
    assert_eq!(
        res["udp"], "ping-udp",
        "UDP on the sandbox's loopback: {res}"
    );
    assert_eq!(res["host"], "refused", "the host's loopback: {res}");
    assert!(
        listener.accept().is_err(),
        "a connection from inside the sandbox reached the host listener"
    );
    let network = outcome.enforcement.get("network").expect("network row");
    assert_eq!(network.status, ProtectionStatus::Enforced, "{network:?}");
    assert!(network.detail.contains("network namespace"), "{network:?}");
    for row in ["network", "landlock"] {
        let detail = &outcome.enforcement.get(row).expect("row").detail;
        assert!(!detail.contains("TCP bind"), "{row}: {detail}");
    }
    sb.done().await;
}

/// Output caps count lines too. A million empty lines (under the default maxOutputBytes of
/// 1 MiB) become a bounded number of events and log records, recorded as a truncation that
/// names the line cap and what was not kept; the step is not stopped for it; a normal step
/// next to it is unaffected.
#[tokio::test(flavor = "multi_thread")]
async fn a_million_newlines_are_capped_in_events() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    let controls = Controls {
        timeout_ms: Some(60_000),
        ..Controls::default()
    };
    assert!(
        controls.max_output_bytes > 1_000_000,
        "the byte cap must not be what stops it"
    );
    let sb = Sandbox::new(rt.clone(), controls).await;
    let (outcome, lines) = sb
        .run("head -c 1000000 /dev/zero | tr '\\0' '\\n'; echo done >&2")
        .await;
    assert_eq!(outcome.termination, Termination::Exited, "{outcome:?}");
    assert_eq!(outcome.stdout_bytes, 1_000_000);
    assert!(outcome.stdout_truncated);
    assert!(!outcome.stderr_truncated);
    let row = outcome.enforcement.get("output").expect("output row");
    assert!(row.detail.contains("100000 lines per stream"), "{row:?}");
    let events = lines.stdout().len();
    assert!(
        events > 0 && events <= 100_000,
        "{events} stdout events from a million newlines"
    );
    let report = sb.rt.collect(&sb.handle).await.expect("collect");
    let log = std::fs::read_to_string(report.bundle_path.join("logs/stream.ndjson")).unwrap();
    let records: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let cut: Vec<_> = records
        .iter()
        .filter(|r| r["type"] == "outputTruncated")
        .collect();
    assert_eq!(cut.len(), 1, "{cut:?}");
    assert_eq!(cut[0]["stream"], "stdout");
    assert_eq!(cut[0]["cap"], "lines");
    assert_eq!(cut[0]["notKeptLines"], 900_000);
    let exit = records.last().unwrap();
    assert_eq!(exit["termination"], "exited");
    assert_eq!(exit["stdoutTruncated"], true);

    let (outcome, lines) = sb.run("seq 1 1000").await;
    assert_eq!(outcome.termination, Termination::Exited);
    assert!(!outcome.stdout_truncated);
    assert_eq!(lines.stdout().len(), 1000);
    sb.done().await;
}

/// A NUL byte cannot travel in a C string: the init would run a shorter command than asked
/// (`rm -rf /workspace/x\0` ends at the NUL). Such a command is refused whole, before anything
/// starts.
#[tokio::test(flavor = "multi_thread")]
async fn a_command_with_a_nul_byte_is_refused() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    let sb = Sandbox::new(rt.clone(), Controls::default()).await;
    let lines = Lines::default();
    let err = sb
        .rt
        .execute(
            &sb.handle,
            &StepCommand {
                argv: vec!["/bin/echo".into(), "visible\0hidden".into()],
                cwd: None,
                stdin: Default::default(),
            },
            CancellationToken::new(),
            &lines,
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("NUL"), "{err}");
    assert!(lines.stdout().is_empty(), "nothing ran");
    let (outcome, out) = sb.run("echo still fine").await;
    assert_eq!(outcome.exit_code, Some(0));
    assert_eq!(out.stdout(), ["still fine"]);
    sb.done().await;
}

/// The seccomp allow-list inside a real sandbox: what a test suite does works (threads,
/// subprocesses, asyncio, a TCP server and client on the sandbox's loopback, a UNIX socket
/// pair, netlink route for getaddrinfo), what the filter refuses is refused with its errno,
/// and the report says it is an allow-list.
#[tokio::test(flavor = "multi_thread")]
async fn the_seccomp_allow_list_holds_inside_a_sandbox() {
    let rt = shared();
    if !usable(&rt).await {
        return;
    }
    if !Path::new("/usr/bin/python3").exists() {
        skip_optional("/usr/bin/python3 is not installed");
        return;
    }
    let sb = Sandbox::new(rt.clone(), Controls::default()).await;
    let script = r#"
import asyncio, ctypes, errno, socket, subprocess, threading
def tryit(name, f):
    try:
        f()
        print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))
def tcp():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0)); srv.listen(1)
    cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept(); cli.sendall(b"x"); assert conn.recv(1) == b"x"
def thread():
    t = threading.Thread(target=lambda: None); t.start(); t.join()
async def main():
    p = await asyncio.create_subprocess_exec("/bin/true"); await p.wait()
tryit("thread", thread)
tryit("subprocess", lambda: subprocess.run(["/bin/sh", "-c", "exit 0"], check=True))
tryit("asyncio", lambda: asyncio.run(main()))
tryit("tcp", tcp)
tryit("socketpair", lambda: socket.socketpair())
tryit("netlink_route", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close())
tryit("getaddrinfo", lambda: socket.getaddrinfo("localhost", 80))
tryit("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
tryit("vsock", lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM))
tryit("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
tryit("netlink_audit", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9))
libc = ctypes.CDLL(None, use_errno=True)
def unshare():
    if libc.unshare(0x10000000) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
tryit("unshare", unshare)
"#;
    let (outcome, lines) = sb.run(&format!("/usr/bin/python3 -c '{script}'")).await;
    assert_eq!(outcome.exit_code, Some(0), "{:?}", lines.0.lock().unwrap());
    let want = [
        "thread ok",
        "subprocess ok",
        "asyncio ok",
        "tcp ok",
        "socketpair ok",
        "netlink_route ok",
        "getaddrinfo ok",
        "packet EAFNOSUPPORT",
        "vsock EAFNOSUPPORT",
        "raw EPERM",
        "netlink_audit EPROTONOSUPPORT",
        "unshare EPERM",
    ];
    assert_eq!(lines.stdout(), want);
    let seccomp = outcome.enforcement.get("seccomp").expect("a seccomp row");
    assert!(
        seccomp.detail.starts_with("allow-list of"),
        "{}",
        seccomp.detail
    );
    sb.done().await;
}
