//! Recovery against a crafted database: the database lives in the project tree
//! (`<project>/.smithers/sandbox.db`), so a cloned repository can ship one, and recovery runs
//! before every command. A handle it holds names host objects only once it is checked; a
//! database owned by another user or a lease from another boot is never acted on through
//! its handles. The runtime is the host-process TEST DOUBLE in `support`, whose cleanup
//! removes the handle's `<sandboxRoot>/out` (and kills a group listed there): what a crafted
//! handle would get removed elsewhere is in a victim directory outside the project.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;
use smithers_orchestrator::*;
use smithers_store::{AdmitRequest, OwnerIdentity, RedactedConfig, SandboxStatus, Store};
use support::*;

const RUN: &str = "run-1";

struct Fixture {
    tmp: tempfile::TempDir,
    store: Arc<Store>,
    runtime: Arc<HostProcessTestRuntime>,
    orch: Orchestrator,
}

impl Fixture {
    /// A project with its database where the product keeps it, and a victim directory
    /// outside it holding `out/precious.txt`.
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("project/.smithers")).unwrap();
        std::fs::create_dir_all(tmp.path().join("victim/out")).unwrap();
        std::fs::write(tmp.path().join("victim/out/precious.txt"), "keep\n").unwrap();
        let store = Arc::new(Store::open(tmp.path().join("project/.smithers/sandbox.db")).unwrap());
        let runtime = Arc::new(HostProcessTestRuntime::default());
        let orch = Orchestrator::new(
            store.clone(),
            Arc::new(AtomicPatchApplier),
            Settings::default(),
        )
        .unwrap()
        .with_runtime(runtime.clone());
        Fixture {
            tmp,
            store,
            runtime,
            orch,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    /// An active row `sandbox` owned by `owner`, with `handle` stored as its lease's handle.
    fn orphan(&self, sandbox: &str, owner: OwnerIdentity, handle: serde_json::Value) {
        self.store
            .try_admit(&AdmitRequest {
                run_id: RUN.into(),
                sandbox_id: sandbox.into(),
                runtime: "bubblewrap".into(),
                config: RedactedConfig::new(&json!({})),
                per_run_max: 10,
                host_max: 10,
                owner,
                now_ms: 1,
            })
            .unwrap();
        self.store
            .set_handle(RUN, sandbox, &handle.to_string())
            .unwrap();
    }

    fn victim_intact(&self) {
        assert!(
            self.path("victim/out/precious.txt").exists(),
            "recovery removed a directory outside the project"
        );
    }

    fn status(&self, sandbox: &str) -> SandboxStatus {
        self.store
            .get_sandbox(RUN, sandbox)
            .unwrap()
            .unwrap()
            .status
    }
}

fn handle_at(sandbox_root: &Path, run: &str, sandbox: &str) -> serde_json::Value {
    json!({
        "runtime": "bubblewrap", "runId": run, "sandboxId": sandbox,
        "sandboxRoot": sandbox_root, "requestPath": sandbox_root.join("request"),
        "resultPath": sandbox_root.join("result")
    })
}

fn dead_owner() -> OwnerIdentity {
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let owner = OwnerIdentity::of_pid(child.id()).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    owner
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_pointing_outside_the_project_is_not_cleaned_up() {
    let f = Fixture::new();
    f.orphan("sb", dead_owner(), handle_at(&f.path("victim"), RUN, "sb"));
    let recovered = f.orch.recover().await.unwrap();
    assert_eq!(recovered.len(), 1);
    assert!(!recovered[0].cleaned_up);
    assert!(recovered[0].marked_failed, "the slot is still freed");
    let why = recovered[0].cleanup_error.as_deref().unwrap();
    assert!(why.contains("not acted on"), "{why}");
    assert_eq!(
        f.runtime.cleanup_count(),
        0,
        "the runtime never saw the handle"
    );
    assert_eq!(f.status("sb"), SandboxStatus::Failed);
    f.victim_intact();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_of_another_project_is_not_cleaned_up() {
    let f = Fixture::new();
    // Laid out like a sandbox's directories, but in another project.
    let elsewhere = f.path("victim/.smithers/sandboxes/run-1/sb");
    std::fs::create_dir_all(elsewhere.join("out")).unwrap();
    f.orphan("sb", dead_owner(), handle_at(&elsewhere, RUN, "sb"));
    let recovered = f.orch.recover().await.unwrap();
    let why = recovered[0].cleanup_error.as_deref().unwrap();
    assert!(why.contains("not in this database's project"), "{why}");
    assert_eq!(f.runtime.cleanup_count(), 0);
    assert!(elsewhere.join("out").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_naming_another_sandbox_is_not_cleaned_up() {
    let f = Fixture::new();
    let other = f.path("project/.smithers/sandboxes/run-1/other");
    std::fs::create_dir_all(other.join("out")).unwrap();
    f.orphan("sb", dead_owner(), handle_at(&other, RUN, "other"));
    let recovered = f.orch.recover().await.unwrap();
    let why = recovered[0].cleanup_error.as_deref().unwrap();
    assert!(why.contains("not the row's"), "{why}");
    assert_eq!(f.runtime.cleanup_count(), 0);
    assert!(other.join("out").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_genuine_orphan_is_still_cleaned_up() {
    let f = Fixture::new();
    let root = f.path("project/.smithers/sandboxes/run-1/sb");
    std::fs::create_dir_all(root.join("out")).unwrap();
    f.orphan("sb", dead_owner(), handle_at(&root, RUN, "sb"));
    let recovered = f.orch.recover().await.unwrap();
    assert!(recovered[0].cleaned_up, "{:?}", recovered[0].cleanup_error);
    assert_eq!(f.runtime.cleanup_count(), 1);
    assert!(!root.join("out").exists());
}

/// A lease from another boot (a database made elsewhere, or before a reboot): its row is
/// marked failed, its handle is not acted on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_from_another_boot_is_not_acted_on() {
    let f = Fixture::new();
    let root = f.path("project/.smithers/sandboxes/run-1/sb");
    std::fs::create_dir_all(root.join("out")).unwrap();
    let owner = OwnerIdentity {
        boot_id: "00000000-0000-0000-0000-000000000000".into(),
        ..OwnerIdentity::current().unwrap()
    };
    f.orphan("sb", owner, handle_at(&root, RUN, "sb"));
    let recovered = f.orch.recover().await.unwrap();
    assert_eq!(recovered.len(), 1);
    let why = recovered[0].cleanup_error.as_deref().unwrap();
    assert!(why.contains("another boot"), "{why}");
    assert!(recovered[0].marked_failed);
    assert_eq!(f.runtime.cleanup_count(), 0);
    assert!(root.join("out").exists());
}

/// A database file owned by another uid was not made by us: recovery only reports, it
/// neither cleans up nor changes a row. Needs root to give the file away; SKIP otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_owned_by_another_user_is_only_reported() {
    let f = Fixture::new();
    let root = f.path("project/.smithers/sandboxes/run-1/sb");
    std::fs::create_dir_all(root.join("out")).unwrap();
    f.orphan("sb", dead_owner(), handle_at(&root, RUN, "sb"));
    let db = f.store.path().to_path_buf();
    if std::os::unix::fs::chown(&db, Some(4242), None).is_err() {
        smithers_test_support::skip_or_fail("giving a file to another uid needs root");
        return;
    }
    let recovered = f.orch.recover().await.unwrap();
    assert_eq!(recovered.len(), 1);
    assert!(!recovered[0].cleaned_up);
    assert!(!recovered[0].marked_failed);
    let why = recovered[0].cleanup_error.as_deref().unwrap();
    assert!(why.contains("uid 4242"), "{why}");
    assert_eq!(f.runtime.cleanup_count(), 0);
    assert!(root.join("out").exists());
    assert_eq!(f.status("sb"), SandboxStatus::Pending, "no row changed");
}
