//! The warm pool (`NativeOptions::warm`): real sandboxes prepared ahead and claimed by steps.
//! A warm sandbox must be the cold one the same plan makes (same patches, output and
//! enforcement report), take the claiming step's limits, leave no process or cgroup when the
//! runtime goes, and never be used once its init died. The conformance and containment
//! suites also run against a warm runtime (`conformance_warm.rs`, `containment_warm.rs`).
//!
//! A test needing a kernel feature the host lacks prints `SKIP <reason>`; with `CI=true` the
//! missing feature fails the test instead.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use smithers_runtime::{
    CancellationToken, Controls, ExecOutcome, RequestBundle, Runtime, RuntimeKind, SandboxConfig,
    StepCommand, Termination,
};
use smithers_runtime_native::{InitCommand, NativeOptions, NativeRuntime};
use smithers_test_support::{skip_optional, skip_or_fail};

fn runtime(warm: usize) -> NativeRuntime {
    NativeRuntime::new(NativeOptions {
        init: Some(InitCommand::binary(env!(
            "CARGO_BIN_EXE_smithers-sandbox-init"
        ))),
        warm,
        ..NativeOptions::default()
    })
}

async fn usable(rt: &NativeRuntime) -> bool {
    let report = rt.probe().await;
    let missing: Vec<&str> = ["user-namespace", "mount-namespace", "pid-namespace"]
        .into_iter()
        .filter(|n| !report.is_enforced(n))
        .collect();
    missing.is_empty() || skip_or_fail(&format!("native sandboxes unavailable: {missing:?}"))
}

/// A runtime whose pool of `size` warm sandboxes is full; `None` (after a `SKIP` line) where
/// native sandboxes are unavailable.
async fn warm_runtime(size: usize) -> Option<NativeRuntime> {
    let rt = runtime(size);
    if !usable(&rt).await {
        return None;
    }
    warm_up(&rt).await;
    Some(rt)
}

/// Fills the pool, failing the test if it cannot.
async fn warm_up(rt: &NativeRuntime) {
    let status = rt
        .warm_up(Duration::from_secs(30))
        .await
        .expect("the runtime has a pool");
    assert_eq!(
        status.ready, status.size,
        "the pool fills: {:?}",
        status.last_error
    );
}

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/main.rs"), "fn main() {}\n").unwrap();
    std::fs::write(dir.path().join("README"), "a\nb\n").unwrap();
    dir
}

/// What one step left: its outcome, stdout, patches and bundle log.
struct Ran {
    outcome: ExecOutcome,
    stdout: String,
    patches: Vec<(String, String)>,
    log: Vec<Value>,
}

impl Ran {
    fn warm(&self) -> bool {
        self.log.iter().any(|r| r["type"] == "warmStart")
    }
}

/// A native sandbox's configuration for `root`.
fn config(run_id: String, sandbox_id: String, root: &Path, controls: Controls) -> SandboxConfig {
    SandboxConfig {
        run_id,
        sandbox_id,
        runtime: RuntimeKind::Bubblewrap,
        root_dir: root.to_path_buf(),
        image: None,
        controls,
        workspace_layers: Vec::new(),
    }
}

async fn run(rt: &NativeRuntime, root: &Path, controls: Controls, script: &str) -> Ran {
    run_created(rt, root, controls, script, async {}).await
}

/// [`run`], awaiting `between` after the sandbox's create and before its execute.
async fn run_created(
    rt: &NativeRuntime,
    root: &Path,
    controls: Controls,
    script: &str,
    between: impl std::future::Future<Output = ()>,
) -> Ran {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let config = config(
        format!("warm-{}", std::process::id()),
        format!(
            "sb-{}",
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ),
        root,
        controls,
    );
    let handle = rt.create(&config).await.expect("create");
    between.await;
    rt.ship(
        &handle,
        &RequestBundle {
            request: json!({"status": "pending", "sandboxId": config.sandbox_id, "runtime": "bubblewrap", "input": {}}),
        },
    )
    .await
    .expect("ship");
    let sink = Collect::default();
    let outcome = rt
        .execute(
            &handle,
            &StepCommand {
                argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
                cwd: None,
                stdin: Default::default(),
            },
            CancellationToken::new(),
            &sink,
        )
        .await
        .expect("execute");
    let report = rt.collect(&handle).await.expect("collect");
    let mut patches = Vec::new();
    let pdir = report.bundle_path.join("patches");
    if pdir.is_dir() {
        let mut names: Vec<PathBuf> = std::fs::read_dir(&pdir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            patches.push((name, std::fs::read_to_string(&p).unwrap()));
        }
    }
    let log = std::fs::read_to_string(report.bundle_path.join("logs/stream.ndjson"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    rt.cleanup(&handle).await.expect("cleanup");
    Ran {
        outcome,
        stdout: sink.0.into_inner().unwrap(),
        patches,
        log,
    }
}

#[derive(Default)]
struct Collect(std::sync::Mutex<String>);

impl smithers_runtime::OutputSink for Collect {
    fn event(&self, event: smithers_runtime::OutputEvent) {
        if let smithers_runtime::OutputEvent::Stdout { line, .. } = event {
            let mut s = self.0.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    }
}

/// What the step reports of its sandbox: who it is, what it sees, what it may do.
const PROBE_STEP: &str = r#"
echo "id=$(id -u):$(id -g) host=$(hostname) pid=$$ cwd=$(pwd)"
echo "nnp=$(grep NoNewPrivs /proc/self/status | tr -d '[:space:]')"
echo "caps=$(grep CapEff /proc/self/status | tr -d '[:space:]')"
echo "seccomp=$(grep '^Seccomp:' /proc/self/status | tr -d '[:space:]')"
echo "net=$(ls /sys/class/net 2>/dev/null | tr '\n' ' ')$(cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' | tr '\n' ' ')"
echo "tmp=$(ls -A /tmp | wc -l) home=$(ls -A $HOME | wc -l)"
if touch /etc/x 2>/dev/null; then echo etc-writable; else echo etc-read-only; fi
if ls /workspace/.smithers 2>/dev/null | grep -q .; then echo smithers-visible; else echo smithers-hidden; fi
printf 'c\n' >> README
mkdir -p new && printf 'new\n' > new/file.txt
rm src/main.rs
echo done
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_sandbox_is_the_cold_one_the_same_plan_makes() {
    let Some(warm_rt) = warm_runtime(1).await else {
        return;
    };
    let cold_rt = runtime(0);
    let (a, b) = (project(), project());
    let warm = run(&warm_rt, a.path(), Controls::default(), PROBE_STEP).await;
    let cold = run(&cold_rt, b.path(), Controls::default(), PROBE_STEP).await;
    assert!(
        warm.warm(),
        "the step claimed the warm sandbox: {:?}",
        warm.log
    );
    assert!(!cold.warm());
    assert_eq!(warm.outcome.termination, Termination::Exited);
    assert_eq!(warm.outcome.exit_code, Some(0), "{}", warm.stdout);
    assert_eq!(warm.stdout, cold.stdout, "the step sees the same sandbox");
    assert!(warm.stdout.contains("nnp=NoNewPrivs:1"), "{}", warm.stdout);
    assert!(warm.stdout.contains("caps=CapEff:0000000000000000"));
    assert!(warm.stdout.contains("seccomp=Seccomp:2"));
    assert!(warm.stdout.contains("etc-read-only"));
    assert!(warm.stdout.contains("tmp=0 home=0"), "{}", warm.stdout);
    assert_eq!(warm.patches, cold.patches, "identical patches");
    assert_eq!(warm.patches.len(), 3, "{:?}", warm.patches);
    assert_eq!(
        serde_json::to_value(&warm.outcome.enforcement).unwrap(),
        serde_json::to_value(&cold.outcome.enforcement).unwrap(),
        "the same enforcement report"
    );
    // The project was not touched by either.
    assert_eq!(
        std::fs::read_to_string(a.path().join("README")).unwrap(),
        "a\nb\n"
    );
    // The pool refills after the claim.
    let status = warm_rt.warm_up(Duration::from_secs(30)).await.unwrap();
    assert_eq!((status.ready, status.claimed), (1, 1), "{status:?}");
}

/// A project that is a git repository of one commit, made with fixed dates and names.
fn git_project() -> tempfile::TempDir {
    let dir = project();
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(dir.path())
            .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
            .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
            .output()
            .expect("git");
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["add", "-A"]);
    git(&[
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-qm",
        "first",
    ]);
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_sandbox_for_a_git_project_is_the_cold_one() {
    let Some(warm_rt) = warm_runtime(1).await else {
        return;
    };
    let cold_rt = runtime(0);
    let (a, b) = (git_project(), git_project());
    // The step edits, commits through the sandbox's git layer, and edits again.
    let step =
        "export GIT_AUTHOR_DATE=2026-01-02T00:00:00Z GIT_COMMITTER_DATE=2026-01-02T00:00:00Z; \
                echo c >> README && git add README && \
                git -c user.name=s -c user.email=s@s commit -qm second && \
                echo new > added && git log --format=%s | tr '\\n' ' '";
    let warm = run(&warm_rt, a.path(), Controls::default(), step).await;
    let cold = run(&cold_rt, b.path(), Controls::default(), step).await;
    assert!(
        warm.warm(),
        "the step claimed the warm sandbox: {:?}",
        warm.log
    );
    assert!(!cold.warm());
    assert_eq!(
        warm.outcome.exit_code,
        Some(0),
        "{:?} {}",
        warm.outcome,
        warm.stdout
    );
    assert_eq!(warm.stdout, "second first \n");
    assert_eq!(warm.stdout, cold.stdout);
    assert_eq!(warm.patches, cold.patches, "identical patches");
    assert_eq!(warm.patches.len(), 2, "{:?}", warm.patches);
    // The host's repository and tree are untouched.
    assert_eq!(
        std::fs::read_to_string(a.path().join("README")).unwrap(),
        "a\nb\n"
    );
    assert!(!a.path().join("added").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_warm_sandbox_takes_the_steps_limits() {
    let rt = runtime(1);
    if !usable(&rt).await {
        return;
    }
    let report = rt.probe().await;
    if !report.is_enforced("pids") {
        skip_or_fail("no pids controller");
        return;
    }
    warm_up(&rt).await;
    let root = project();
    let controls = Controls {
        pids_limit: Some(16),
        ..Controls::default()
    };
    let ran = run(
        &rt,
        root.path(),
        controls,
        "for i in $(seq 1 64); do sleep 5 & done; wait",
    )
    .await;
    assert!(ran.warm(), "{:?}", ran.log);
    assert_eq!(
        ran.outcome.termination,
        Termination::Pids,
        "{ran:?}",
        ran = ran.stdout
    );
    if report.is_enforced("memory") {
        warm_up(&rt).await;
        let controls = Controls {
            memory_limit_bytes: Some(32 << 20),
            ..Controls::default()
        };
        let ran = run(
            &rt,
            root.path(),
            controls,
            "head -c 200000000 /dev/zero | tail > /dev/null; echo survived",
        )
        .await;
        assert!(ran.warm(), "{:?}", ran.log);
        assert_eq!(
            ran.outcome.termination,
            Termination::Memory,
            "{}",
            ran.stdout
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_a_warm_sandbox_cannot_serve_starts_cold() {
    let Some(rt) = warm_runtime(1).await else {
        return;
    };
    let root = project();
    let volume = tempfile::tempdir().unwrap();
    std::fs::write(volume.path().join("v.txt"), "volume\n").unwrap();
    let with_volume = Controls {
        volumes: vec![smithers_runtime::VolumeMount {
            host: volume.path().to_path_buf(),
            container: PathBuf::from("/data"),
            readonly: true,
        }],
        ..Controls::default()
    };
    let with_disk = Controls {
        disk_limit_bytes: Some(64 << 20),
        ..Controls::default()
    };
    let mut cases = vec![with_volume];
    // A disk limit is a tmpfs mounted on the host: root only (an ordinary user's create
    // refuses it, as it must).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cases.push(with_disk);
    } else {
        skip_optional(
            "the disk-limit case: a disk limit needs root, this test runs as an ordinary user",
        );
    }
    for controls in cases {
        let ran = run(
            &rt,
            root.path(),
            controls,
            "cat /data/v.txt 2>/dev/null; echo ok",
        )
        .await;
        assert!(!ran.warm(), "{:?}", ran.log);
        assert_eq!(ran.outcome.exit_code, Some(0));
        assert!(ran.stdout.contains("ok"));
    }
    let status = rt.warm_status().unwrap();
    assert_eq!((status.ready, status.claimed), (1, 0), "{status:?}");
}

fn alive(pid: i32) -> bool {
    // Gone once reaped or a zombie: an exiting process's files (its control socket) are
    // released before it becomes a zombie, but after its namespaces are (so a missing
    // `ns/mnt` link does not yet mean the pool can see it gone).
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

/// SIGKILLs a warm init this test's runtime started and waits (bounded) until it is gone.
async fn kill_and_wait(pid: i32) {
    // SAFETY: kill with a pid of a process this test's runtime started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(gone(pid).await, "the warm init {pid} died");
}

async fn gone(pid: i32) -> bool {
    for _ in 0..200 {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_sandbox_whose_init_died_is_never_claimed() {
    let Some(rt) = warm_runtime(1).await else {
        return;
    };
    let status = rt.warm_status().unwrap();
    let (pid, _) = status.waiting[0].clone();
    kill_and_wait(pid).await;
    let root = project();
    let ran = run(&rt, root.path(), Controls::default(), "echo fine").await;
    assert_eq!(ran.outcome.exit_code, Some(0));
    assert_eq!(ran.stdout, "fine\n");
    assert!(!ran.warm(), "the dead one was not used: {:?}", ran.log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_init_that_dies_after_its_claim_is_replaced_by_a_cold_one() {
    let Some(rt) = warm_runtime(1).await else {
        return;
    };
    let (pid, _) = rt.warm_status().unwrap().waiting[0].clone();
    let root = project();
    // Claimed by the create (it was alive then), killed before the execute sends it the plan.
    let ran = run_created(&rt, root.path(), Controls::default(), "echo fine", async {
        kill_and_wait(pid).await;
        // Past the kernel's closing of its files, which follows the namespaces' release.
        tokio::time::sleep(Duration::from_millis(50)).await;
    })
    .await;
    assert_eq!(ran.outcome.exit_code, Some(0), "{:?}", ran.outcome);
    assert_eq!(ran.stdout, "fine\n");
    assert!(!ran.warm(), "the dead one was not used: {:?}", ran.log);
    assert!(
        ran.log.iter().any(|r| r["type"] == "warmStartLost"
            && r["reason"]
                .as_str()
                .is_some_and(|m| m.contains("a cold one served the step"))),
        "the lost warm sandbox is named in the log: {:?}",
        ran.log
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_runtime_ends_its_warm_sandboxes() {
    let Some(rt) = warm_runtime(2).await else {
        return;
    };
    let waiting = rt.warm_status().unwrap().waiting;
    assert_eq!(waiting.len(), 2);
    // One claimed by a sandbox that is created and cleaned up without ever running.
    let root = project();
    let config = config(
        format!("warm-drop-{}", std::process::id()),
        "never-run".into(),
        root.path(),
        Controls::default(),
    );
    let handle = rt.create(&config).await.expect("create");
    rt.cleanup(&handle).await.expect("cleanup");
    drop(rt);
    for (pid, cgroups) in waiting {
        assert!(gone(pid).await, "warm init {pid} ended with the runtime");
        for dir in cgroups {
            assert!(!dir.exists(), "{} removed", dir.display());
        }
    }
}

/// Waits (bounded) until the prestarted sandbox is ready or its making failed.
async fn prestarted(rt: &NativeRuntime) -> smithers_runtime_native::WarmStatus {
    for _ in 0..1000 {
        let status = rt.prestart_status().expect("a sandbox was prestarted");
        if status.ready == 1 || status.last_error.is_some() {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the prestarted sandbox was not ready within 10 s");
}

/// `prestart` (the CLI's `run`): one warm sandbox made at once for the next step, which waits
/// for it if it is still being made, and none after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prestarted_sandbox_serves_the_next_step_and_is_not_refilled() {
    let rt = runtime(0);
    if !usable(&rt).await {
        return;
    }
    let root = project();
    rt.prestart(&Controls::default());
    // At once: create waits for the sandbox being made rather than starting cold.
    let first = run(
        &rt,
        root.path(),
        Controls::default(),
        "echo first > new.txt; echo hi",
    )
    .await;
    assert!(
        first.warm(),
        "the prestarted sandbox served it: {:?}",
        first.log
    );
    assert_eq!(first.outcome.exit_code, Some(0));
    assert_eq!(first.stdout, "hi\n");
    assert_eq!(first.patches.len(), 1, "{:?}", first.patches);
    let second = run(&rt, root.path(), Controls::default(), "echo again").await;
    assert!(!second.warm(), "nothing was refilled: {:?}", second.log);
    assert_eq!(second.stdout, "again\n");
    let status = rt.prestart_status().unwrap();
    assert_eq!(
        (status.made, status.claimed, status.ready),
        (1, 1, 0),
        "{status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prestart_starts_nothing_for_a_step_a_warm_sandbox_cannot_serve() {
    let rt = runtime(0);
    if !usable(&rt).await {
        return;
    }
    for controls in [
        Controls {
            allow_network: true,
            ..Controls::default()
        },
        Controls {
            disk_limit_bytes: Some(64 << 20),
            ..Controls::default()
        },
    ] {
        rt.prestart(&controls);
        assert!(rt.prestart_status().is_none(), "{controls:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unclaimed_prestarted_sandbox_ends_with_the_runtime() {
    let rt = runtime(0);
    if !usable(&rt).await {
        return;
    }
    rt.prestart(&Controls::default());
    let status = prestarted(&rt).await;
    assert_eq!(status.ready, 1, "{:?}", status.last_error);
    let waiting = status.waiting;
    drop(rt);
    for (pid, cgroups) in waiting {
        assert!(
            gone(pid).await,
            "prestarted init {pid} ended with the runtime"
        );
        for dir in cgroups {
            assert!(!dir.exists(), "{} removed", dir.display());
        }
    }
}

/// Whether the step's sandbox was a warm one armed for its configuration.
fn armed(ran: &Ran) -> bool {
    ran.log
        .iter()
        .any(|r| r["type"] == "warmStart" && r["armed"] == true)
}

/// A runtime with a pool of one whose sandbox is armed for `root` with default controls: two
/// steps of that configuration teach it, and the refill after the second is armed.
async fn armed_runtime(root: &Path) -> Option<NativeRuntime> {
    let rt = warm_runtime(1).await?;
    for _ in 0..2 {
        // The refill after the first is waited for: a step that finds the pool empty is cold.
        warm_up(&rt).await;
        let ran = run(&rt, root, Controls::default(), "true").await;
        assert!(ran.warm() && !armed(&ran), "{:?}", ran.log);
    }
    let status = rt.warm_up(Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        (status.ready, status.armed),
        (1, 1),
        "the refill is armed: {status:?}"
    );
    Some(rt)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_armed_sandbox_is_the_cold_one_the_same_plan_makes() {
    let (a, b) = (project(), project());
    let Some(rt) = armed_runtime(a.path()).await else {
        return;
    };
    // The cold one's project had the same two steps (its `.smithers` is made by the first).
    let cold_rt = runtime(0);
    run(&cold_rt, b.path(), Controls::default(), "true").await;
    let warm = run(&rt, a.path(), Controls::default(), PROBE_STEP).await;
    let cold = run(&cold_rt, b.path(), Controls::default(), PROBE_STEP).await;
    assert!(
        armed(&warm),
        "the step claimed the armed sandbox: {:?}",
        warm.log
    );
    assert_eq!(warm.outcome.exit_code, Some(0), "{}", warm.stdout);
    assert_eq!(warm.stdout, cold.stdout, "the step sees the same sandbox");
    assert!(warm.stdout.contains("seccomp=Seccomp:2"), "{}", warm.stdout);
    assert!(warm.stdout.contains("smithers-hidden"), "{}", warm.stdout);
    assert_eq!(warm.patches, cold.patches, "identical patches");
    assert_eq!(warm.patches.len(), 3, "{:?}", warm.patches);
    assert_eq!(
        serde_json::to_value(&warm.outcome.enforcement).unwrap(),
        serde_json::to_value(&cold.outcome.enforcement).unwrap(),
        "the same enforcement report"
    );
    assert_eq!(
        std::fs::read_to_string(a.path().join("README")).unwrap(),
        "a\nb\n"
    );
    let status = rt.warm_up(Duration::from_secs(30)).await.unwrap();
    assert_eq!(status.claimed_armed, 1, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_armed_sandbox_sees_the_project_as_it_is_when_its_step_runs() {
    let a = project();
    let Some(rt) = armed_runtime(a.path()).await else {
        return;
    };
    // Written on the host after the workspace was mounted in the armed sandbox.
    std::fs::write(a.path().join("README"), "changed\n").unwrap();
    std::fs::write(a.path().join("late.txt"), "late\n").unwrap();
    let ran = run(
        &rt,
        a.path(),
        Controls::default(),
        "cat README late.txt && echo more >> late.txt",
    )
    .await;
    assert!(armed(&ran), "{:?}", ran.log);
    assert_eq!(ran.stdout, "changed\nlate\n");
    assert_eq!(ran.patches.len(), 1, "{:?}", ran.patches);
    assert!(ran.patches[0].1.contains("+more"), "{:?}", ran.patches);
    assert_eq!(
        std::fs::read_to_string(a.path().join("late.txt")).unwrap(),
        "late\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_replaced_since_arming_is_not_served_by_the_armed_sandbox() {
    let parent = tempfile::tempdir().unwrap();
    let root = parent.path().join("project");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("README"), "old\n").unwrap();
    let Some(rt) = armed_runtime(&root).await else {
        return;
    };
    // A fresh checkout at the same path: another directory than the one the armed
    // sandbox's workspace is over.
    std::fs::rename(&root, parent.path().join("old")).unwrap();
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("README"), "new\n").unwrap();
    let ran = run(&rt, &root, Controls::default(), "cat README").await;
    assert!(!armed(&ran), "{:?}", ran.log);
    assert_eq!(ran.outcome.exit_code, Some(0));
    assert_eq!(ran.stdout, "new\n");
}

/// An armed sandbox whose directories cannot take the step's names (a leftover state directory
/// of the same ids, not this runtime's) is given up: create refuses as a cold one would, the
/// armed init is gone, and the pool says why instead of starting cold in silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_armed_sandbox_that_cannot_be_adopted_is_given_up_and_said() {
    let a = project();
    let Some(rt) = armed_runtime(a.path()).await else {
        return;
    };
    let armed_pid = rt.warm_up(Duration::from_secs(30)).await.unwrap().waiting[0].0;
    let config = config(
        format!("leftover-{}", std::process::id()),
        "sb".into(),
        a.path(),
        Controls::default(),
    );
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
    let state_root = smithers_runtime_native::default_state_root(uid);
    let leftover = state_root.join(format!("{}+{}", config.run_id, config.sandbox_id));
    std::fs::create_dir_all(&leftover).unwrap();
    let created = rt.create(&config).await;
    let _ = std::fs::remove_dir_all(&leftover);
    let err = created.expect_err("a leftover of the same ids is refused");
    assert!(err.to_string().contains("already exists"), "{err}");
    let status = rt.warm_up(Duration::from_secs(30)).await.unwrap();
    let why = status.last_adopt_error.clone().unwrap_or_default();
    assert!(why.contains("its directories"), "{status:?}");
    assert!(
        gone(armed_pid).await,
        "the given-up armed init {armed_pid} ended"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_with_stdin_is_served_by_the_armed_sandbox() {
    let a = project();
    let Some(rt) = armed_runtime(a.path()).await else {
        return;
    };
    // The stdin FIFO is made at execute in the request directory, bound since arming.
    let config = config(
        format!("warm-{}", std::process::id()),
        "sb-stdin".into(),
        a.path(),
        Controls::default(),
    );
    let handle = rt.create(&config).await.expect("create");
    rt.ship(
        &handle,
        &RequestBundle {
            request: json!({"status": "pending"}),
        },
    )
    .await
    .expect("ship");
    let sink = Collect::default();
    let outcome = rt
        .execute(
            &handle,
            &StepCommand {
                argv: vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    "cat; echo x >> README".into(),
                ],
                cwd: None,
                stdin: smithers_runtime::StepStdin::from_reader(std::io::Cursor::new(
                    b"from stdin\n".to_vec(),
                )),
            },
            CancellationToken::new(),
            &sink,
        )
        .await
        .expect("execute");
    assert_eq!(outcome.exit_code, Some(0), "{outcome:?}");
    assert_eq!(sink.0.into_inner().unwrap(), "from stdin\n");
    let report = rt.collect(&handle).await.expect("collect");
    let log = std::fs::read_to_string(report.bundle_path.join("logs/stream.ndjson")).unwrap();
    assert!(log.contains("\"armed\":true"), "{log}");
    let patch = std::fs::read_dir(report.bundle_path.join("patches"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect::<String>();
    assert!(patch.contains("+x"), "{patch}");
    rt.cleanup(&handle).await.expect("cleanup");
}

/// `git` in `dir`, failing the test if it fails.
fn git_in(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git");
    assert!(out.status.success(), "git {args:?}: {out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_that_became_a_repository_since_arming_is_served_by_it() {
    let a = project();
    let Some(rt) = armed_runtime(a.path()).await else {
        return;
    };
    // Its `.git` is part of the workspace (the overlay's lower layer, read live): the plan is
    // the one the sandbox was armed with.
    git_in(a.path(), &["init", "-q", "-b", "main"]);
    git_in(a.path(), &["add", "README", "src"]);
    git_in(
        a.path(),
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "first",
        ],
    );
    let ran = run(
        &rt,
        a.path(),
        Controls::default(),
        "git log --format=%s && echo c >> README",
    )
    .await;
    assert!(armed(&ran), "{:?}", ran.log);
    assert_eq!(ran.outcome.exit_code, Some(0), "{}", ran.stdout);
    assert_eq!(ran.stdout, "first\n");
    assert!(
        ran.patches.iter().any(|(_, p)| p.contains("+c")),
        "{:?}",
        ran.patches
    );
    assert_eq!(
        std::fs::read_to_string(a.path().join("README")).unwrap(),
        "a\nb\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_now_below_a_repositorys_top_is_served_cold() {
    let parent = tempfile::tempdir().unwrap();
    let root = parent.path().join("project");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("README"), "a\n").unwrap();
    let Some(rt) = armed_runtime(&root).await else {
        return;
    };
    // Its plan now has a git layer over the parent's repository, which the armed sandbox was
    // set up without: given up at execute, after its claim, and a cold init mounts the
    // same layers.
    git_in(parent.path(), &["init", "-q", "-b", "main"]);
    git_in(parent.path(), &["add", "project/README"]);
    git_in(
        parent.path(),
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "first",
        ],
    );
    let ran = run(
        &rt,
        &root,
        Controls::default(),
        "git log --format=%s && echo c >> README",
    )
    .await;
    assert!(!ran.warm() && !armed(&ran), "{:?}", ran.log);
    assert!(
        ran.log.iter().any(|r| r["type"] == "warmStartGivenUp"),
        "the log names it: {:?}",
        ran.log
    );
    assert_eq!(ran.outcome.exit_code, Some(0), "{}", ran.stdout);
    assert_eq!(ran.stdout, "first\n");
    assert!(
        ran.patches.iter().any(|(_, p)| p.contains("+c")),
        "{:?}",
        ran.patches
    );
    assert_eq!(std::fs::read_to_string(root.join("README")).unwrap(), "a\n");
}

#[tokio::test]
async fn a_pool_that_refills_after_the_step_waits_to_be_told_the_step_is_over() {
    // The resident service's pools: preparing the next sandbox must not take CPU from the
    // step a user waits for, so the refill waits for `steps_over` (not the command's start).
    let rt = NativeRuntime::new(NativeOptions {
        init: Some(InitCommand::binary(env!(
            "CARGO_BIN_EXE_smithers-sandbox-init"
        ))),
        warm: 1,
        warm_refill_after_step: true,
        ..NativeOptions::default()
    });
    if !usable(&rt).await {
        return;
    }
    warm_up(&rt).await;
    let dir = project();
    let ran = run(&rt, dir.path(), Controls::default(), "true").await;
    assert!(
        ran.warm(),
        "the step claimed the warm sandbox: {:?}",
        ran.log
    );
    // Well past the 250 ms a pool otherwise waits once a step's command has started.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let status = rt.warm_status().unwrap();
    assert_eq!((status.ready, status.claimed), (0, 1), "{status:?}");
    rt.steps_over();
    let status = rt.warm_up(Duration::from_secs(30)).await.unwrap();
    assert_eq!((status.ready, status.claimed), (1, 1), "{status:?}");
}
