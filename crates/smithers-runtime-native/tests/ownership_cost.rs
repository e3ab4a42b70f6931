//! What the overlay's ownership checks read per run grows with what the step changed, not
//! with the project: the same one-file change, run through create, ship, execute, collect and
//! cleanup on a 200-file and a 20,000-file tree, reads the owners of about as many entries
//! (the runtime's own count, `ownership_entries_read`). The walk these checks replaced read
//! every entry: 20,000 against 200.
//!
//! A test needing a kernel feature the host lacks prints `SKIP <reason>`; with `CI=true` the
//! missing feature fails the test instead.

use serde_json::json;
use smithers_runtime::{
    CancellationToken, Controls, NullSink, RequestBundle, Runtime, RuntimeKind, SandboxConfig,
    StepCommand,
};
use smithers_runtime_native::{
    ownership_entries_read, InitCommand, NativeOptions, NativeRuntime, WorkspaceMode,
};
use smithers_test_support::skip_or_fail;

/// A tree of `files` small files in directories of 100 (`src/dNNNN/fNNNNNN.rs`).
fn tree(files: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..files {
        let d = dir.path().join(format!("src/d{:04}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&d).unwrap();
        }
        std::fs::write(d.join(format!("f{i:06}.rs")), format!("// {i}\n")).unwrap();
    }
    dir
}

/// Entries whose owner one round trip read, and the patches it gave.
async fn entries_per_run(rt: &NativeRuntime, project: &std::path::Path, id: &str) -> (u64, usize) {
    let config = SandboxConfig {
        run_id: format!("cost-{}", std::process::id()),
        sandbox_id: id.into(),
        runtime: RuntimeKind::Bubblewrap,
        root_dir: project.to_path_buf(),
        image: None,
        controls: Controls::default(),
        workspace_layers: Vec::new(),
    };
    let before = ownership_entries_read();
    let handle = rt.create(&config).await.expect("create");
    rt.ship(
        &handle,
        &RequestBundle {
            request: json!({"status": "pending", "sandboxId": id, "runtime": "bubblewrap", "input": {}}),
        },
    )
    .await
    .expect("ship");
    let outcome = rt
        .execute(
            &handle,
            &StepCommand {
                argv: vec![
                    "sh".into(),
                    "-c".into(),
                    "echo changed >> src/d0000/f000000.rs".into(),
                ],
                cwd: None,
                stdin: Default::default(),
            },
            CancellationToken::new(),
            &NullSink,
        )
        .await
        .expect("execute");
    assert_eq!(outcome.exit_code, Some(0), "{outcome:?}");
    let report = rt.collect(&handle).await.expect("collect");
    rt.cleanup(&handle).await.expect("cleanup");
    (ownership_entries_read() - before, report.patch_count)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_reads_the_owners_of_what_it_changed_not_of_the_tree() {
    let rt = NativeRuntime::new(NativeOptions {
        init: Some(InitCommand::binary(env!(
            "CARGO_BIN_EXE_smithers-sandbox-init"
        ))),
        workspace: WorkspaceMode::Overlay,
        ..NativeOptions::default()
    });
    let report = rt.probe().await;
    let missing: Vec<&str> = ["user-namespace", "mount-namespace", "workspace-cow"]
        .into_iter()
        .filter(|n| !report.is_enforced(n))
        .collect();
    if !missing.is_empty() {
        skip_or_fail(&format!("overlay sandboxes unavailable: {missing:?}"));
        return;
    }
    let (small, big) = (tree(200), tree(20_000));
    let (small_read, small_patches) = entries_per_run(&rt, small.path(), "small").await;
    let (big_read, big_patches) = entries_per_run(&rt, big.path(), "big").await;
    println!("entries read per run: 200 files {small_read}, 20,000 files {big_read}");
    assert_eq!((small_patches, big_patches), (1, 1));
    // What is read: the top directory, and the entries of the directories the change is in
    // (the project's top, src/ with its 2 or 200 directories, src/d0000 with its 100 files).
    assert!(
        small_read >= 100,
        "the changed directory's entries: {small_read}"
    );
    assert!(
        big_read <= 4 * small_read && big_read < 1_000,
        "20,000 files: {big_read} entries read; 200 files: {small_read}"
    );
}
