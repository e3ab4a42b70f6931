//! The copy workspace (where overlayfs cannot be mounted, or when asked for): real sandboxes
//! whose /workspace is a copy of the project. The patches must be the ones the overlay
//! workspace gives for the same step, `git apply` of them onto the original must give the
//! sandbox's tree, the project must be untouched, and the result must say the workspace was
//! a copy and why.
//!
//! A test needing a kernel feature the host lacks prints `SKIP <reason>`; with `CI=true` the
//! missing feature fails the test instead.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode};
use smithers_runtime::{
    CancellationToken, Controls, ExecOutcome, ProtectionStatus, RequestBundle, Runtime,
    RuntimeKind, SandboxConfig, SandboxHandle, StepCommand, Termination,
};
use smithers_runtime_native::{InitCommand, NativeOptions, NativeRuntime, WorkspaceMode};
use smithers_test_support::skip_or_fail;

fn runtime(workspace: WorkspaceMode, state_root: Option<PathBuf>) -> NativeRuntime {
    NativeRuntime::new(NativeOptions {
        init: Some(InitCommand::binary(env!(
            "CARGO_BIN_EXE_smithers-sandbox-init"
        ))),
        state_root,
        workspace,
        ..NativeOptions::default()
    })
}

/// Namespaces work here (the workspace row is checked by each test).
async fn usable(rt: &NativeRuntime) -> bool {
    let report = rt.probe().await;
    let missing: Vec<&str> = ["user-namespace", "mount-namespace", "pid-namespace"]
        .into_iter()
        .filter(|n| !report.is_enforced(n))
        .collect();
    missing.is_empty() || skip_or_fail(&format!("native sandboxes unavailable: {missing:?}"))
}

fn sh(dir: &Path, script: &str) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The project before the step: every kind of entry a change can start from.
const PROJECT: &str = r#"set -e
mkdir -p src gone/sub recreated d2 .git/hooks .smithers/sandboxes
printf 'fn main() {\n    println!("hi");\n}\n' > src/main.rs
printf 'pub fn lib() {}\n' > src/lib.rs
printf '#!/bin/sh\necho run\n' > run.sh
printf 'BIN\000\001\002original' > data.bin
printf 'a\n' > gone/a.txt
printf 'b\n' > gone/sub/b.txt
printf 'x\n' > recreated/x.txt
printf 'y\n' > recreated/y.txt
printf 'f\n' > d2/f
printf 'file\n' > f2l
ln -s src/main.rs lnk
printf '*.log\n' > .gitignore
printf 'ref: refs/heads/main\n' > .git/HEAD
printf 'echo hook\n' > .git/hooks/pre-commit
printf 'secret state\n' > .smithers/sandbox.db
"#;

/// The step (deterministic, so that two runs write the same bytes). It also checks what it
/// must not be able to do, and says so on stdout.
const STEP: &str = r#"
printf 'fn main() {\n    println!("changed");\n}\n' > src/main.rs
: >> src/lib.rs
chmod +x run.sh
printf 'BIN\000\001\002changed!' > data.bin
printf 'new\n' > src/new.rs
rm -rf gone
rm -rf recreated && mkdir recreated && printf 'x\n' > recreated/x.txt && printf 'z\n' > recreated/z.txt
rm -rf d2 && printf 'file replacing a dir\n' > d2
rm f2l && ln -s /etc/passwd f2l
ln -sfn src/lib.rs lnk
printf 'ignored\n' > debug.log
if echo evil >> .git/hooks/pre-commit 2>/dev/null; then echo GIT-WRITABLE; else echo git-read-only; fi
if ls .smithers | grep -q .; then echo SMITHERS-VISIBLE; else echo smithers-hidden; fi
"#;

/// A snapshot of every non-directory below `root` (links not followed), paths for which
/// `skip` holds left out: (kind+mode, content or link target).
fn snapshot(root: &Path, skip: &dyn Fn(&str) -> bool) -> BTreeMap<String, (String, Vec<u8>)> {
    fn walk(
        root: &Path,
        dir: &Path,
        skip: &dyn Fn(&str) -> bool,
        out: &mut BTreeMap<String, (String, Vec<u8>)>,
    ) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_str().unwrap().to_string();
            if skip(&rel) {
                continue;
            }
            let md = std::fs::symlink_metadata(&p).unwrap();
            if md.is_dir() {
                walk(root, &p, skip, out);
            } else if md.file_type().is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.insert(
                    rel,
                    ("link".into(), t.into_os_string().into_encoded_bytes()),
                );
            } else {
                let exec = md.permissions().mode() & 0o100 != 0;
                out.insert(
                    rel,
                    (format!("file exec={exec}"), std::fs::read(&p).unwrap()),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, skip, &mut out);
    out
}

/// The runtime's own request/result directories under `.smithers/sandboxes` are the only
/// thing a run adds to the project.
fn not_runtime_state(rel: &str) -> bool {
    rel.starts_with(".smithers/sandboxes/")
}

struct Ran {
    project: tempfile::TempDir,
    handle: SandboxHandle,
    outcome: ExecOutcome,
    stdout: String,
    /// The patch files of the bundle, in order.
    patches: Vec<(String, String)>,
    /// The bundle's log, one JSON value a line.
    log: Vec<Value>,
    /// The sandbox's /workspace as the step left it (copy mode: the copy itself).
    tree: Option<BTreeMap<String, (String, Vec<u8>)>>,
}

/// Creates a project from `PROJECT`, runs `STEP` in a sandbox of `rt`, collects, snapshots
/// the copy (copy mode), cleans up.
async fn run_step(rt: &NativeRuntime, project: tempfile::TempDir) -> Ran {
    run_script(rt, project, STEP).await
}

/// [`run_step`] with another step.
async fn run_script(rt: &NativeRuntime, project: tempfile::TempDir, script: &str) -> Ran {
    let config = SandboxConfig {
        run_id: format!("copy-{}", std::process::id()),
        sandbox_id: format!(
            "sb-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ),
        runtime: RuntimeKind::Bubblewrap,
        root_dir: project.path().to_path_buf(),
        image: None,
        controls: Controls::default(),
        workspace_layers: Vec::new(),
    };
    let handle = rt.create(&config).await.expect("create");
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
    assert_eq!(report.patch_count, patches.len());
    let log = std::fs::read_to_string(report.bundle_path.join("logs/stream.ndjson"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The layer is on the layer root (disk) by default, else in the state directory.
    let layer = match handle.backend["layerDir"].as_str() {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(handle.backend["stateDir"].as_str().unwrap()).join("layer"),
    };
    let copy = layer.join("copy");
    let tree = copy.is_dir().then(|| {
        snapshot(&copy, &|r| {
            r == ".git" || r.starts_with(".git/") || r == ".smithers" || r == "debug.log"
        })
    });
    rt.cleanup(&handle).await.expect("cleanup");
    assert!(
        !copy.exists(),
        "cleanup removes the copy with the state directory"
    );
    Ran {
        project,
        handle,
        outcome,
        stdout: sink.text(),
        patches,
        log,
        tree,
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

impl Collect {
    fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }
}

fn new_project() -> tempfile::TempDir {
    let project = tempfile::tempdir().unwrap();
    sh(project.path(), PROJECT);
    project
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Copy mode asked for: the step runs in a copy; the project is untouched; the patches are
/// byte for byte those of the overlay workspace for the same step; `git apply` of them onto
/// the original gives the sandbox's tree; the report, the probe and the bundle's log say
/// "copy" and why.
#[tokio::test(flavor = "multi_thread")]
async fn forced_copy_mode_gives_the_overlay_patches_and_says_so() {
    let copy_rt = runtime(WorkspaceMode::Copy, None);
    if !usable(&copy_rt).await {
        return;
    }
    let probe = copy_rt.probe().await;
    let row = probe.get("workspace-cow").expect("workspace row");
    assert_eq!(row.status, ProtectionStatus::Degraded, "{row:?}");
    assert!(row.detail.contains("copy mode requested"), "{row:?}");

    let project = new_project();
    let before = snapshot(project.path(), &not_runtime_state);
    let ran = run_step(&copy_rt, project).await;
    assert_eq!(ran.handle.backend["workspace"]["mode"], "copy");
    assert_eq!(
        ran.outcome.termination,
        Termination::Exited,
        "{}",
        ran.stdout
    );
    assert_eq!(ran.outcome.exit_code, Some(0), "{}", ran.stdout);
    assert!(ran.stdout.contains("git-read-only"), "{}", ran.stdout);
    assert!(ran.stdout.contains("smithers-hidden"), "{}", ran.stdout);

    // Said in the result: the enforcement report and the bundle's log.
    let row = ran.outcome.enforcement.get("workspace-cow").unwrap();
    assert_eq!(row.status, ProtectionStatus::Degraded);
    assert!(
        row.detail.contains("workspace mode copy") && row.detail.contains("requested"),
        "{row:?}"
    );
    let record = ran
        .log
        .iter()
        .find(|r| r["type"] == "workspace")
        .expect("a workspace record in the bundle's log");
    assert_eq!(record["mode"], "copy");
    assert!(record["reason"].as_str().unwrap().contains("requested"));
    // What ship copied: the project's files but .git's and .smithers' (stand-ins).
    assert_eq!(record["copiedFiles"], 11, "{record}");
    assert!(record["copiedBytes"].as_u64().unwrap() > 0, "{record}");
    assert_eq!(record["leftOut"], json!([]));

    // The project is untouched (the step wrote only its copy).
    let after = snapshot(ran.project.path(), &not_runtime_state);
    assert_eq!(before, after, "the host tree changed");

    // The overlay workspace, same project, same step: the same patches, byte for byte.
    let overlay_rt = runtime(WorkspaceMode::Overlay, None);
    let overlay_row = overlay_rt.probe().await;
    if overlay_row.is_enforced("workspace-cow") {
        let overlay = run_step(&overlay_rt, new_project()).await;
        assert_eq!(overlay.handle.backend["workspace"]["mode"], "overlay");
        assert!(overlay.log.iter().all(|r| r["type"] != "workspace"));
        assert_eq!(
            overlay
                .outcome
                .enforcement
                .get("workspace-cow")
                .unwrap()
                .status,
            ProtectionStatus::Enforced
        );
        assert_eq!(ran.patches, overlay.patches);
    } else {
        skip_or_fail("overlayfs unavailable: copy-vs-overlay patch equality not checked");
    }

    // git apply onto a fresh copy of the original project reproduces the sandbox's tree.
    let names: Vec<&str> = ran.patches.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.len() >= 10, "{names:?}");
    let fresh = new_project();
    git(fresh.path(), &["init", "-q"]);
    let pdir = tempfile::tempdir().unwrap();
    let mut args = vec!["apply".to_string()];
    for (name, text) in &ran.patches {
        let p = pdir.path().join(name);
        std::fs::write(&p, text).unwrap();
        args.push(p.to_str().unwrap().to_string());
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    git(fresh.path(), &argv);
    let applied = snapshot(fresh.path(), &|r| {
        r == ".git" || r.starts_with(".git/") || r == ".smithers" || r.starts_with(".smithers/")
    });
    assert_eq!(applied, ran.tree.expect("the copy was snapshotted"));
}

/// A mount point that unmounts (lazily) when dropped, also when the test fails.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// `auto` on a host where overlayfs cannot be mounted falls back to a copy and records why;
/// `overlay` there is refused at create. The host: a state root on an overlayfs mount (an
/// overlay cannot use another overlay as its upper layer), which needs root to set up.
#[tokio::test(flavor = "multi_thread")]
async fn auto_falls_back_to_a_copy_where_overlay_cannot_be_mounted() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip_or_fail("setting up a state root on overlayfs needs root (mount -t overlay)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dirs = ["l", "u", "w", "m"].map(|d| tmp.path().join(d));
    for d in &dirs {
        std::fs::create_dir(d).unwrap();
    }
    let status = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o"])
        .arg(format!(
            "lowerdir={},upperdir={},workdir={}",
            dirs[0].display(),
            dirs[1].display(),
            dirs[2].display()
        ))
        .arg(&dirs[3])
        .status()
        .unwrap();
    if !status.success() {
        skip_or_fail("overlayfs cannot be mounted here at all");
        return;
    }
    let _mounted = Mounted(dirs[3].clone());
    let state_root = dirs[3].join("state");

    let auto = runtime(WorkspaceMode::Auto, Some(state_root.clone()));
    if !usable(&auto).await {
        return;
    }
    let probe = auto.probe().await;
    let row = probe.get("workspace-cow").unwrap();
    assert_eq!(row.status, ProtectionStatus::Degraded, "{row:?}");
    assert!(
        row.detail.contains("overlayfs cannot be mounted"),
        "{row:?}"
    );

    let project = new_project();
    let before = snapshot(project.path(), &not_runtime_state);
    let ran = run_step(&auto, project).await;
    assert_eq!(ran.handle.backend["workspace"]["mode"], "copy");
    assert_eq!(ran.outcome.exit_code, Some(0), "{}", ran.stdout);
    let row = ran.outcome.enforcement.get("workspace-cow").unwrap();
    assert_eq!(row.status, ProtectionStatus::Degraded);
    assert!(
        row.detail.contains("overlayfs cannot be mounted"),
        "{row:?}"
    );
    assert!(row.fix.is_some());
    let record = ran.log.iter().find(|r| r["type"] == "workspace").unwrap();
    assert!(record["reason"]
        .as_str()
        .unwrap()
        .contains("overlayfs cannot be mounted"));
    assert!(ran.patches.iter().any(|(_, t)| t.contains("src/new.rs")));
    assert_eq!(before, snapshot(ran.project.path(), &not_runtime_state));

    // Overlay explicitly asked for on this host: refused at create, naming the fallback.
    let strict = runtime(WorkspaceMode::Overlay, Some(state_root));
    let project = new_project();
    let err = strict
        .create(&SandboxConfig {
            run_id: "strict".into(),
            sandbox_id: "sb".into(),
            runtime: RuntimeKind::Bubblewrap,
            root_dir: project.path().to_path_buf(),
            image: None,
            controls: Controls::default(),
            workspace_layers: Vec::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::TaskRuntimeUnavailable, "{err}");
    assert!(err.to_string().contains("overlay"), "{err}");
    let fix = format!("{:?}", err.report());
    assert!(fix.contains("copy"), "{fix}");
    let row = strict.probe().await;
    assert_eq!(
        row.get("workspace-cow").unwrap().status,
        ProtectionStatus::Unavailable
    );
}

/// The overlay check is remembered in the state root (so a CLI run does not pay the probe
/// at every create), and a remembered answer is what `auto` goes by: a cache saying overlay is
/// unusable, for this very host key, makes the next runtime fall back to a copy with that
/// reason. A cache for another key is ignored.
#[tokio::test]
async fn auto_goes_by_the_remembered_overlay_check() {
    let state = tempfile::tempdir().unwrap();
    let state_root = state.path().join("state");
    let first = runtime(WorkspaceMode::Auto, Some(state_root.clone()));
    if !usable(&first).await {
        return;
    }
    let ran = run_step(&first, new_project()).await;
    assert!(ran.outcome.enforcement.get("workspace-cow").is_some());
    let cache = state_root.join("overlay-check.json");
    let remembered: Value =
        serde_json::from_slice(&std::fs::read(&cache).expect("remembered")).expect("JSON");
    let key = remembered["key"].as_str().expect("key").to_string();

    std::fs::write(
        &cache,
        json!({"key": key, "unusable": "remembered: mount overlay: EINVAL"}).to_string(),
    )
    .unwrap();
    let second = runtime(WorkspaceMode::Auto, Some(state_root.clone()));
    let ran = run_step(&second, new_project()).await;
    let row = ran.outcome.enforcement.get("workspace-cow").unwrap();
    assert_eq!(row.status, ProtectionStatus::Degraded, "{row:?}");
    assert!(row.detail.contains("remembered: mount overlay"), "{row:?}");

    std::fs::write(
        &cache,
        json!({"key": format!("{key} (another boot)"), "unusable": "stale"}).to_string(),
    )
    .unwrap();
    let third = runtime(WorkspaceMode::Auto, Some(state_root));
    let ran = run_step(&third, new_project()).await;
    let row = ran.outcome.enforcement.get("workspace-cow").unwrap();
    assert_eq!(row.status, ProtectionStatus::Enforced, "{row:?}");
}

/// A tree another uid owns (root on a user's checkout): an overlay could not copy its files
/// up for writing inside the user namespace, so `auto` takes a copy and says why, the step's
/// writes all come back as patches, and an explicit `overlay` is refused naming the reason.
/// What decides it is the project's top directory alone (one `lstat`, whatever the tree's
/// size; see the `ownership` module).
#[tokio::test(flavor = "multi_thread")]
async fn a_tree_of_another_owner_switches_auto_to_a_copy_and_is_written() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid != 0 {
        // As an ordinary user the tree is one's own (chown to another uid needs root).
        skip_or_fail("giving files to another uid needs root");
        return;
    }
    let auto_rt = runtime(WorkspaceMode::Auto, None);
    if !usable(&auto_rt).await {
        return;
    }
    let project = new_project();
    sh(project.path(), "chown -R 1234:1234 .");

    let overlay_rt = runtime(WorkspaceMode::Overlay, None);
    let config = SandboxConfig {
        run_id: format!("owners-{}", std::process::id()),
        sandbox_id: "sb-overlay".into(),
        runtime: RuntimeKind::Bubblewrap,
        root_dir: project.path().to_path_buf(),
        image: None,
        controls: Controls::default(),
        workspace_layers: Vec::new(),
    };
    let refused = overlay_rt
        .create(&config)
        .await
        .expect_err("overlay refused");
    let text = format!("{refused}");
    assert!(text.contains("top directory belongs to uid 1234"), "{text}");

    let ran = run_step(&auto_rt, project).await;
    assert_eq!(
        ran.outcome.termination,
        Termination::Exited,
        "{:?}",
        ran.outcome
    );
    assert_eq!(ran.outcome.exit_code, Some(0), "{}", ran.stdout);
    let row = ran.outcome.enforcement.get("workspace-cow").unwrap();
    assert_eq!(row.status, ProtectionStatus::Degraded, "{row:?}");
    assert!(row.detail.contains("files of other owners"), "{row:?}");
    assert!(row.detail.contains("uid 1234"), "{row:?}");
    let all: String = ran.patches.iter().map(|(_, p)| p.as_str()).collect();
    for path in ["src/main.rs", "data.bin", "src/new.rs"] {
        assert!(
            all.contains(&format!("b/{path}")),
            "the write to {path} came back: {all}"
        );
    }
    assert!(all.contains("changed"), "{all}");
}

/// Files of another owner inside a tree that is the runtime's: the overlay is kept (nothing
/// walks the tree before the step), the step's writes to them fail as the kernel refuses them
/// (EACCES: the step has no capability over files it does not own), and collect names them in
/// the bundle's log with the fix, because they sit beside what the step changed, so that a
/// lost change is never silent. The step's other changes come back.
#[tokio::test(flavor = "multi_thread")]
async fn files_of_another_owner_in_an_overlay_are_named_beside_the_changes() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid != 0 {
        skip_or_fail("giving files to another uid needs root");
        return;
    }
    let auto_rt = runtime(WorkspaceMode::Auto, None);
    if !usable(&auto_rt).await {
        return;
    }
    let project = new_project();
    sh(project.path(), "chown -R 1234:1234 src data.bin");
    let step = "printf 'changed' > data.bin; printf 'new\\n' > src/new.rs; chmod +x run.sh; \
                if printf x >> src/lib.rs; then echo lib-written; fi";
    let ran = run_script(&auto_rt, project, step).await;
    assert_eq!(ran.outcome.exit_code, Some(0), "{}", ran.stdout);
    assert!(!ran.stdout.contains("lib-written"), "{}", ran.stdout);
    assert_eq!(ran.handle.backend["workspace"]["mode"], "overlay");
    let row = ran.outcome.enforcement.get("workspace-cow").unwrap();
    assert_eq!(row.status, ProtectionStatus::Enforced, "{row:?}");
    let notes: Vec<&str> = ran
        .log
        .iter()
        .filter(|r| r["kind"] == "note")
        .filter_map(|r| r["message"].as_str())
        .collect();
    let all = notes.join("\n");
    assert!(
        all.contains("files of other owners beside the step's changes (2)")
            && all.contains("--workspace copy"),
        "{all}"
    );
    for path in ["data.bin", "src"] {
        assert!(
            all.contains(&format!("{path} belongs to uid 1234 gid 1234")),
            "{path} named: {all}"
        );
    }
    // What the step could change came back; what it could not is missing, as the log says.
    let patched: String = ran.patches.iter().map(|(_, p)| p.as_str()).collect();
    assert!(patched.contains("b/run.sh"), "{patched}");
    assert!(
        !patched.contains("b/data.bin") && !patched.contains("b/src/"),
        "{patched}"
    );
}
