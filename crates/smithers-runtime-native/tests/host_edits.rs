//! The host keeps working while a step runs (row 20 of security.md): accept must never revert
//! a host edit, in overlay mode (the project is the live lower layer) and in copy mode (the
//! project was copied at ship). The host edits happen while the step is provably between its
//! own edit and its exit: the step prints `edited` after writing, the host edits the project
//! from the output callback, and the step sleeps long enough before it exits.
//!
//! A test needing a kernel feature the host lacks prints `SKIP <reason>`; with `CI=true` the
//! missing feature fails the test instead.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use smithers_runtime::{
    CancellationToken, Controls, OutputEvent, OutputSink, RequestBundle, Runtime, RuntimeKind,
    SandboxConfig, StepCommand,
};
use smithers_runtime_native::{InitCommand, NativeOptions, NativeRuntime, WorkspaceMode};
use smithers_test_support::skip_or_fail;

fn runtime(workspace: WorkspaceMode) -> NativeRuntime {
    NativeRuntime::new(NativeOptions {
        init: Some(InitCommand::binary(env!(
            "CARGO_BIN_EXE_smithers-sandbox-init"
        ))),
        workspace,
        ..NativeOptions::default()
    })
}

async fn usable(rt: &NativeRuntime, mode: WorkspaceMode) -> bool {
    let report = rt.probe().await;
    let mut missing: Vec<&str> = ["user-namespace", "mount-namespace", "pid-namespace"]
        .into_iter()
        .filter(|n| !report.is_enforced(n))
        .collect();
    if mode == WorkspaceMode::Overlay && !report.is_enforced("workspace-cow") {
        missing.push("workspace-cow (overlayfs)");
    }
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

const PROJECT: &str = r#"set -e
for i in 1 2 3 4 5 6 7 8 9 10; do echo "line $i"; done > ten.txt
printf 'a\nb\nc\n' > untouched.txt
printf 'doomed\n' > host_del.txt
printf 'same\n' > both_same.txt
mkdir src hostdir
printf 'x\n' > src/x.txt
printf 'r\n' > rename_me.txt
printf 'h\n' > hostdir/h.txt
"#;

/// The step's edits, then `edited`, then a pause in which the host edits.
const STEP: &str = r#"set -e
sed -i 's/^line 1$/STEP ONE/' ten.txt
printf 'step changed it\n' > host_del.txt
printf 'agreed\n' > both_same.txt
printf 'mine\n' > step_new.txt
mv src lib
mv rename_me.txt renamed.txt
echo edited
sleep 2
"#;

/// What the host does to the project while the step sleeps.
fn host_edits(project: &Path) {
    sh(
        project,
        r#"set -e
sed -i 's/^line 9$/HOST NINE/' ten.txt
printf 'd\n' >> untouched.txt
printf 'created by the host\n' > host_new.txt
rm host_del.txt
printf 'agreed\n' > both_same.txt
mv hostdir hostmoved
"#,
    );
}

struct EditOnSignal {
    project: PathBuf,
    done: std::sync::atomic::AtomicBool,
}

impl OutputSink for EditOnSignal {
    fn event(&self, event: OutputEvent) {
        if let OutputEvent::Stdout { line, .. } = event {
            if line == "edited" && !self.done.swap(true, std::sync::atomic::Ordering::SeqCst) {
                host_edits(&self.project);
            }
        }
    }
}

struct Outcome {
    bundle: smithers_bundle::ValidatedBundle,
    patches: Vec<String>,
}

async fn run(mode: WorkspaceMode, project: &Path) -> Option<Outcome> {
    let rt = runtime(mode);
    if !usable(&rt, mode).await {
        return None;
    }
    let config = SandboxConfig {
        run_id: format!("host-edits-{}", std::process::id()),
        sandbox_id: format!("sb-{mode:?}").to_lowercase(),
        runtime: RuntimeKind::Bubblewrap,
        root_dir: project.to_path_buf(),
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
    let sink = EditOnSignal {
        project: project.to_path_buf(),
        done: Default::default(),
    };
    let outcome = rt
        .execute(
            &handle,
            &StepCommand {
                argv: vec!["/bin/sh".into(), "-c".into(), STEP.into()],
                cwd: None,
                stdin: Default::default(),
            },
            CancellationToken::new(),
            &sink,
        )
        .await
        .expect("execute");
    assert!(outcome.succeeded(), "{outcome:?}");
    assert!(
        sink.done.load(std::sync::atomic::Ordering::SeqCst),
        "the host edited"
    );
    let report = rt.collect(&handle).await.expect("collect");
    let bundle = smithers_bundle::validate_bundle(&report.bundle_path).expect("valid bundle");
    let patches = bundle
        .patch_files
        .iter()
        .map(|p| std::fs::read_to_string(report.bundle_path.join(p)).unwrap())
        .collect();
    // The bundle must outlive the sandbox for the apply below.
    let kept = tempfile::tempdir().unwrap().keep();
    sh(
        &kept,
        &format!("cp -a '{}' bundle", report.bundle_path.display()),
    );
    rt.cleanup(&handle).await.expect("cleanup");
    let bundle = smithers_bundle::validate_bundle(kept.join("bundle")).expect("valid copy");
    Some(Outcome { bundle, patches })
}

fn read(project: &Path, name: &str) -> String {
    std::fs::read_to_string(project.join(name)).unwrap_or_else(|e| format!("<{e}>"))
}

async fn host_edits_are_never_reverted(mode: WorkspaceMode) {
    let project = tempfile::tempdir().unwrap();
    sh(project.path(), PROJECT);
    let Some(out) = run(mode, project.path()).await else {
        return;
    };
    let notes = &out.bundle.change_notes;
    // ten.txt: both edited; its base is lost, so it is a host-changed path.
    assert!(
        notes.host_changed.iter().any(|p| p == "ten.txt"),
        "{notes:?}"
    );
    let all = out.patches.concat();
    // Files only the host changed are no change of the step's.
    assert!(!all.contains("untouched.txt"), "{all}");
    assert!(!all.contains("host_new.txt"), "{all}");
    // The host's edit never shows as the step's removal... unless flagged as host-changed.
    let texts: Vec<&str> = out.patches.iter().map(String::as_str).collect();
    let opts = smithers_patch::ApplyOptions {
        host_changed: notes.host_changed.iter().cloned().collect(),
        ..Default::default()
    };
    let before: Vec<String> = ["ten.txt", "untouched.txt", "host_new.txt", "both_same.txt"]
        .iter()
        .map(|f| read(project.path(), f))
        .collect();
    match smithers_patch::apply_patch_texts(project.path(), &texts, &opts) {
        Err(smithers_patch::PatchError::Conflicts { conflicts }) => {
            let names: Vec<&str> = conflicts.iter().map(|c| c.path.as_str()).collect();
            assert!(names.contains(&"ten.txt"), "{conflicts:?}");
            assert!(
                conflicts
                    .iter()
                    .any(|c| c.reason == smithers_patch::HOST_CHANGED),
                "{conflicts:?}"
            );
        }
        other => panic!("accept must refuse the host-changed file: {other:?}"),
    }
    let after: Vec<String> = ["ten.txt", "untouched.txt", "host_new.txt", "both_same.txt"]
        .iter()
        .map(|f| read(project.path(), f))
        .collect();
    assert_eq!(before, after, "a refused accept writes nothing");
    assert!(read(project.path(), "ten.txt").contains("HOST NINE"));
    assert!(read(project.path(), "untouched.txt").ends_with("c\nd\n"));

    // Without the host-changed files, the rest applies and keeps every host edit. (Copy
    // mode also knows host_del.txt: deleted on the host while the step changed it.)
    if mode == WorkspaceMode::Copy {
        assert!(
            notes.host_changed.iter().any(|p| p == "host_del.txt"),
            "{notes:?}"
        );
    }
    let rest: Vec<String> = out
        .patches
        .iter()
        .filter(|p| {
            !notes
                .host_changed
                .iter()
                .any(|h| p.contains(&format!("a/{h} ")))
        })
        .cloned()
        .collect();
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    smithers_patch::apply_patch_texts(project.path(), &rest, &opts).expect("the rest applies");
    assert!(read(project.path(), "untouched.txt").ends_with("c\nd\n"));
    assert_eq!(
        read(project.path(), "host_new.txt"),
        "created by the host\n"
    );
    assert_eq!(read(project.path(), "both_same.txt"), "agreed\n");
    assert_eq!(read(project.path(), "step_new.txt"), "mine\n");
    // The step's renames (a directory and a file) arrive whole; the host's rename stays.
    assert_eq!(read(project.path(), "lib/x.txt"), "x\n");
    assert!(!project.path().join("src").exists());
    assert_eq!(read(project.path(), "renamed.txt"), "r\n");
    assert!(!project.path().join("rename_me.txt").exists());
    assert_eq!(read(project.path(), "hostmoved/h.txt"), "h\n");
    assert!(!project.path().join("hostdir").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn overlay_mode_never_reverts_a_host_edit() {
    host_edits_are_never_reverted(WorkspaceMode::Overlay).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn copy_mode_never_reverts_a_host_edit() {
    host_edits_are_never_reverted(WorkspaceMode::Copy).await;
}
