//! A step whose change cannot fit keeps everything else: a real sandbox (overlay and copy
//! workspace) makes one change over the content bound (lowered for the test through
//! `SMITHERS_SANDBOX_MAX_CHANGE_BYTES`) and one small text edit. The bundle validates and
//! carries the edit's patch; `changeNotes.leftOut` names the big change with its reason and
//! `changeNotes.keptLayer` where the layer is kept; after cleanup the kept layer holds the big
//! file; removing it the way reject and accept do leaves nothing behind.
//!
//! A test needing a kernel feature the host lacks prints `SKIP <reason>`; with `CI=true` the
//! missing feature fails the test instead.

use std::path::PathBuf;

use serde_json::json;
use smithers_runtime::collect::MAX_CHANGE_BYTES_ENV;
use smithers_runtime::kept_layer::{kept_layer_path, remove_kept_layer};
use smithers_runtime::{
    CancellationToken, Controls, RequestBundle, Runtime, RuntimeKind, SandboxConfig, StepCommand,
};
use smithers_runtime_native::{InitCommand, NativeOptions, NativeRuntime, WorkspaceMode};
use smithers_test_support::skip_or_fail;

/// The lowered bound: the big file (200 000 bytes) is over it, the edit far under it.
const LIMIT: &str = "100000";

const STEP: &str = "set -e; printf 'two\\n' > a.txt; yes x | head -c 200000 > big.txt";

fn runtime(workspace: WorkspaceMode) -> NativeRuntime {
    NativeRuntime::new(NativeOptions {
        init: Some(InitCommand::binary(env!(
            "CARGO_BIN_EXE_smithers-sandbox-init"
        ))),
        workspace,
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

struct Quiet;
impl smithers_runtime::OutputSink for Quiet {
    fn event(&self, _: smithers_runtime::OutputEvent) {}
}

async fn over_limit_change_is_kept(workspace: WorkspaceMode, tag: &str) {
    // Every test of this file sets the same value: parallel tests do not disturb each other.
    std::env::set_var(MAX_CHANGE_BYTES_ENV, LIMIT);
    let rt = runtime(workspace);
    if !usable(&rt).await {
        return;
    }
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("a.txt"), "one\n").unwrap();
    let config = SandboxConfig {
        run_id: format!("kept-{}", std::process::id()),
        sandbox_id: format!("sb-{tag}"),
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
    let outcome = rt
        .execute(
            &handle,
            &StepCommand {
                argv: vec!["/bin/sh".into(), "-c".into(), STEP.into()],
                cwd: None,
                stdin: Default::default(),
            },
            CancellationToken::new(),
            &Quiet,
        )
        .await
        .expect("execute");
    assert!(outcome.succeeded(), "{outcome:?}");
    let report = rt
        .collect(&handle)
        .await
        .expect("collect: nothing fails the step");
    let bundle = smithers_bundle::validate_bundle(&report.bundle_path).expect("valid bundle");
    // The small edit is patched...
    assert_eq!(bundle.patch_files.len(), 1, "{:?}", bundle.patch_files);
    let patch = std::fs::read_to_string(report.bundle_path.join(&bundle.patch_files[0])).unwrap();
    assert!(
        patch.contains("+two") && patch.contains("a/a.txt"),
        "{patch}"
    );
    // ...the big change is named with its reason, and where the layer is kept.
    let notes = &bundle.change_notes;
    let left: Vec<&str> = notes.left_out.iter().map(|l| l.path.as_str()).collect();
    assert_eq!(left, ["big.txt"], "{notes:?}");
    let reason = &notes.left_out[0].reason;
    assert!(
        reason.contains("200000 bytes") && reason.contains(LIMIT),
        "{reason}"
    );
    let kept = kept_layer_path(project.path(), &config.run_id, &config.sandbox_id).unwrap();
    assert_eq!(notes.kept_layer.as_deref(), Some(&*kept.to_string_lossy()));
    let log = std::fs::read_to_string(report.bundle_path.join("logs/stream.ndjson")).unwrap();
    assert!(log.contains("change left out: big.txt"), "{log}");
    // Cleanup keeps the layer, with the big file in it, and still removes the rest.
    rt.cleanup(&handle).await.expect("cleanup");
    let big = std::fs::read(kept.join("big.txt")).expect("the kept layer holds the big file");
    assert_eq!(big.len(), 200_000);
    let state_dir = PathBuf::from(handle.backend["stateDir"].as_str().unwrap());
    assert!(!state_dir.exists(), "the state directory is gone");
    assert!(
        !handle.request_path.exists(),
        "the request directory is gone"
    );
    assert!(
        report.bundle_path.join("README.md").is_file(),
        "the bundle stays for review"
    );
    // A second cleanup (recovery) leaves the kept layer alone.
    rt.cleanup(&handle).await.expect("second cleanup");
    assert!(kept.join("big.txt").is_file());
    // What reject and accept do: the kept layer, derived from the ids, goes.
    assert!(remove_kept_layer(project.path(), &config.run_id, &config.sandbox_id).unwrap());
    assert!(!kept.exists());
    assert_eq!(
        std::fs::read_to_string(project.path().join("a.txt")).unwrap(),
        "one\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn overlay_layer_with_a_change_over_the_limit_is_kept() {
    over_limit_change_is_kept(WorkspaceMode::Auto, "auto").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn copy_layer_with_a_change_over_the_limit_is_kept() {
    over_limit_change_is_kept(WorkspaceMode::Copy, "copy").await;
}
