//! Cleanup from a handle read back from a crafted database (it lives in the project tree):
//! nothing the handle names outside this runtime's own roots, derived from the ids, is
//! touched. These need no sandbox: the handles are written by hand, as an attacker would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use serde_json::{json, Value};
use smithers_runtime::{Runtime, RuntimeKind, SandboxHandle};
use smithers_runtime_native::{NativeOptions, NativeRuntime};

struct Fixture {
    tmp: tempfile::TempDir,
    rt: NativeRuntime,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        for d in ["state", "layers", "project", "victim"] {
            std::fs::create_dir(tmp.path().join(d)).unwrap();
        }
        std::fs::write(tmp.path().join("victim/precious.txt"), "keep me\n").unwrap();
        let rt = NativeRuntime::new(NativeOptions {
            state_root: Some(tmp.path().join("state")),
            layer_root: Some(tmp.path().join("layers")),
            ..NativeOptions::default()
        });
        Fixture { tmp, rt }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    /// The derived state directory of `r1`/`s1`.
    fn state_dir(&self) -> PathBuf {
        self.path("state/r1+s1")
    }

    /// A handle for `r1`/`s1` in the project whose backend state is `backend`.
    fn handle(&self, backend: Value) -> SandboxHandle {
        let sandbox_root = self.path("project/.smithers/sandboxes/r1/s1");
        SandboxHandle {
            runtime: RuntimeKind::Bubblewrap,
            run_id: "r1".into(),
            sandbox_id: "s1".into(),
            request_path: sandbox_root.join("request"),
            result_path: sandbox_root.join("result"),
            sandbox_root,
            container_id: None,
            workspace_id: None,
            backend,
        }
    }

    fn backend(&self, state_dir: &Path, cgroups: Value) -> Value {
        json!({
            "stateDir": state_dir,
            "rootDir": self.path("project"),
            "layerTmpfs": false,
            "cgroups": {"dirs": cgroups},
        })
    }
}

fn victim_intact(f: &Fixture) {
    assert_eq!(
        std::fs::read_to_string(f.path("victim/precious.txt")).unwrap(),
        "keep me\n",
        "a directory outside the runtime's roots was touched"
    );
}

#[tokio::test]
async fn a_state_dir_outside_the_roots_is_not_removed() {
    let f = Fixture::new();
    let handle = f.handle(f.backend(&f.path("victim"), json!([])));
    let err = f.rt.cleanup(&handle).await.expect_err("refused");
    assert!(err.to_string().contains("not trusted"), "{err}");
    victim_intact(&f);
}

#[tokio::test]
async fn a_layer_dir_outside_the_roots_is_not_removed() {
    let f = Fixture::new();
    let mut backend = f.backend(&f.state_dir(), json!([]));
    backend["layerDir"] = json!(f.path("victim"));
    backend["flatLayer"] = json!(true);
    let err = f.rt.cleanup(&f.handle(backend)).await.expect_err("refused");
    assert!(err.to_string().contains("layer directory"), "{err}");
    victim_intact(&f);
}

#[tokio::test]
async fn a_request_path_outside_the_project_layout_is_not_removed() {
    let f = Fixture::new();
    let mut handle = f.handle(f.backend(&f.state_dir(), json!([])));
    handle.request_path = f.path("victim");
    f.rt.cleanup(&handle).await.expect_err("refused");
    victim_intact(&f);
}

#[tokio::test]
async fn a_request_dir_through_a_linked_smithers_dir_is_not_removed() {
    let f = Fixture::new();
    // The project's `.smithers` is a link to elsewhere: its "request directory" is the victim.
    std::fs::create_dir_all(f.path("victim/sandboxes/r1/s1/request")).unwrap();
    std::fs::write(f.path("victim/sandboxes/r1/s1/request/x"), "x").unwrap();
    std::os::unix::fs::symlink(f.path("victim"), f.path("project/.smithers")).unwrap();
    // A genuine record (as create writes it) so only the link stands in the way.
    std::fs::create_dir(f.state_dir()).unwrap();
    write_record(&f, std::process::id(), &json!([]));
    let handle = f.handle(f.backend(&f.state_dir(), json!([])));
    let err = f.rt.cleanup(&handle).await.expect_err("reported");
    assert!(err.to_string().contains("left alone"), "{err}");
    assert!(f.path("victim/sandboxes/r1/s1/request/x").exists());
    assert!(
        !f.state_dir().exists(),
        "the derived state directory still goes"
    );
}

fn sleeper() -> Child {
    Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("spawn sleep")
}

fn alive(child: &mut Child) -> bool {
    child.try_wait().expect("try_wait").is_none()
}

fn start_time(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

fn write_record(f: &Fixture, owner: u32, cgroups: &Value) {
    let record = json!({
        "ownerPid": owner,
        "ownerStart": start_time(owner),
        "bootId": std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap().trim(),
        "rootDir": f.path("project"),
        "cgroups": {"dirs": cgroups},
    });
    std::fs::write(f.state_dir().join("cleanup.json"), record.to_string()).unwrap();
}

/// A "cgroup" the handle names (v1 style: its `cgroup.procs` lists an unrelated process) is
/// neither killed through nor removed: only cgroups the runtime recorded itself are.
#[tokio::test]
async fn a_foreign_cgroup_in_the_handle_is_not_touched() {
    let f = Fixture::new();
    let mut bystander = sleeper();
    let foreign = f.path("victim/cg");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(
        foreign.join("cgroup.procs"),
        format!("{}\n", bystander.id()),
    )
    .unwrap();
    let cgroups = json!([{"path": foreign, "v2": false, "controllers": ["pids"]}]);
    let handle = f.handle(f.backend(&f.state_dir(), cgroups));
    let err = f.rt.cleanup(&handle).await.expect_err("reported");
    assert!(err.to_string().contains("left alone"), "{err}");
    assert!(
        alive(&mut bystander),
        "a process outside our cgroups was killed"
    );
    assert!(foreign.join("cgroup.procs").exists());
    bystander.kill().unwrap();
    bystander.wait().unwrap();
    victim_intact(&f);
}

/// A crafted database naming the ids of a sandbox another live process owns (another
/// project's, say) does not get it cleaned up under that process.
#[tokio::test]
async fn a_sandbox_of_another_live_owner_is_not_cleaned_up() {
    let f = Fixture::new();
    let mut owner = sleeper();
    std::fs::create_dir(f.state_dir()).unwrap();
    write_record(&f, owner.id(), &json!([]));
    let handle = f.handle(f.backend(&f.state_dir(), json!([])));
    let err = f.rt.cleanup(&handle).await.expect_err("refused");
    assert!(err.to_string().contains("another running process"), "{err}");
    assert!(f.state_dir().join("cleanup.json").exists());
    owner.kill().unwrap();
    owner.wait().unwrap();
    // Once that owner is dead, the sandbox is an orphan and goes.
    f.rt.cleanup(&handle).await.expect("orphan cleaned up");
    assert!(!f.state_dir().exists());
}

/// The legitimate case keeps working: the derived directories and the request directory of
/// a sandbox this process recorded go, and a second cleanup is a no-op.
#[tokio::test]
async fn a_genuine_handle_is_cleaned_up() {
    let f = Fixture::new();
    std::fs::create_dir(f.state_dir()).unwrap();
    write_record(&f, std::process::id(), &json!([]));
    std::fs::create_dir_all(f.path("layers/r1+s1")).unwrap();
    std::fs::create_dir_all(f.path("layers/r1+s1.upper/x")).unwrap();
    std::fs::create_dir_all(f.path("project/.smithers/sandboxes/r1/s1/request")).unwrap();
    let mut backend = f.backend(&f.state_dir(), json!([]));
    backend["layerDir"] = json!(f.path("layers/r1+s1"));
    backend["flatLayer"] = json!(true);
    let handle = f.handle(backend);
    f.rt.cleanup(&handle).await.expect("cleanup");
    for gone in [
        "state/r1+s1",
        "layers/r1+s1",
        "layers/r1+s1.upper",
        "project/.smithers/sandboxes/r1/s1/request",
    ] {
        assert!(!f.path(gone).exists(), "{gone} left behind");
    }
    f.rt.cleanup(&handle).await.expect("idempotent");
}
