//! Cases about the verbs' contract: cleanup complete and idempotent, a bundle for a failed
//! run, invalid controls refused, a second create an error.

use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode};
use std::path::{Path, PathBuf};

use smithers_runtime::SandboxHandle;

use crate::conformance::{
    assert_no_marker_processes, check_bundle, run_once, sh, start, unique, CaseResult, Project,
    SuiteEnv, TreeSnapshot, VERBOSE_ENV,
};

/// Absolute paths in the handle's backend state that belong to this sandbox: those containing
/// its id, and cgroup directories (other than this process's own): what a backend created on
/// the host for it.
fn backend_paths(handle: &SandboxHandle) -> Vec<PathBuf> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) => out.push(s.clone()),
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::Object(o) => o.values().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut strings = Vec::new();
    walk(&handle.backend, &mut strings);
    // Our own cgroups (a backend may record the parent it created its groups under).
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let own_cgroup = |s: &str| {
        Path::new(s)
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| own.contains(&format!("/{n}")))
    };
    strings
        .into_iter()
        .filter(|s| s.starts_with('/'))
        .filter(|s| {
            s.contains(&handle.sandbox_id)
                || (s.starts_with("/sys/fs/cgroup/")
                    && s.len() > "/sys/fs/cgroup/".len()
                    && !own_cgroup(s))
        })
        .map(PathBuf::from)
        .collect()
}

/// Everything under `dir` that is not inside `keep`.
fn leftovers(dir: &Path, keep: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.starts_with(keep) {
                continue;
            }
            if keep.starts_with(&path) {
                // An ancestor of the bundle: allowed, look inside.
                stack.push(path);
                continue;
            }
            out.push(path);
        }
    }
    out
}

/// Cleanup twice is fine, works from a handle read back from JSON (another process), leaves
/// no process and nothing of the sandbox on the host but the bundle.
pub async fn cleanup_idempotent_and_complete(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let marker = unique("smithers-suite-marker");
    let mut sandbox = start(env, &project, env.controls()).await?;
    sandbox.ship(json!({})).await;
    let exec = sandbox
        .exec(project.attack_argv(&[
            "daemonize",
            &marker,
            "600",
            "+",
            "write-file",
            &format!("/tmp/{marker}"),
            "x",
            "+",
            "write-file",
            &format!("{}/added.txt", env.workspace_dir()),
            "x",
        ]))
        .await;
    assert!(
        exec.outcome.succeeded(),
        "{:?}\n{}",
        exec.outcome,
        exec.output.dump()
    );
    if env.host_processes_visible() {
        assert_no_marker_processes(&marker, "cleanup: when execute returned");
    }
    let report = sandbox
        .collect()
        .await
        .unwrap_or_else(|e| panic!("collect failed: {}", e.report()));
    let paths = backend_paths(&sandbox.handle);
    if std::env::var_os(VERBOSE_ENV).is_some() {
        println!(
            "[{}] sandbox root {} and backend paths checked after cleanup: {paths:?}",
            env.test_name,
            sandbox.handle.sandbox_root.display()
        );
    }
    let json = serde_json::to_string(&sandbox.handle).expect("handle serialises");
    sandbox.cleanup().await;
    sandbox.cleanup().await;
    let reread: SandboxHandle = serde_json::from_str(&json).expect("handle deserialises");
    env.runtime()
        .cleanup(&reread)
        .await
        .unwrap_or_else(|e| panic!("cleanup from a re-read handle failed: {}", e.report()));
    check_bundle(&report.bundle_path);
    let left = leftovers(&sandbox.handle.sandbox_root, &report.bundle_path);
    assert!(
        left.is_empty(),
        "cleanup left host state of the sandbox behind: {left:?}"
    );
    let left: Vec<&PathBuf> = paths
        .iter()
        .filter(|p| !p.starts_with(&report.bundle_path) && !report.bundle_path.starts_with(p))
        .filter(|p| std::fs::symlink_metadata(p).is_ok())
        .collect();
    assert!(
        left.is_empty(),
        "backend paths still exist after cleanup: {left:?}"
    );
    Ok(())
}

/// Cleanup right after create (nothing ran) works twice and leaves nothing.
pub async fn cleanup_after_create_only(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let before = project.snapshot();
    let mut sandbox = start(env, &project, env.controls()).await?;
    let paths = backend_paths(&sandbox.handle);
    sandbox.cleanup().await;
    sandbox.cleanup().await;
    let left: Vec<&PathBuf> = paths
        .iter()
        .filter(|p| std::fs::symlink_metadata(p).is_ok())
        .collect();
    assert!(
        left.is_empty(),
        "backend paths still exist after cleanup: {left:?}"
    );
    let left = leftovers(&sandbox.handle.sandbox_root, &sandbox.handle.result_path);
    assert!(left.is_empty(), "cleanup left: {left:?}");
    before.assert_same(&project.snapshot(), "create + cleanup changed the project");
    Ok(())
}

/// A failed run still produces a valid bundle with status `failed`.
pub async fn bundle_for_failed_run(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let (exec, collected) = run_once(
        env,
        &project,
        env.controls(),
        sh("echo partial > partial.txt; exit 3"),
    )
    .await?;
    assert_eq!(exec.outcome.exit_code, Some(3));
    let report = collected.unwrap_or_else(|e| panic!("collect of a failed run: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    assert_eq!(bundle.manifest["status"], "failed", "{}", bundle.manifest);
    assert!(bundle.patch_text.contains("partial.txt"));
    Ok(())
}

/// `create` refuses invalid controls with INVALID_INPUT before touching anything.
pub async fn create_refuses_invalid_controls(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let before = TreeSnapshot::of(&project.root, &[]);
    let mut bad_env = env.controls();
    bad_env.env.insert("1BAD-KEY".into(), "x".into());
    let mut bad_volume = env.controls();
    bad_volume.volumes.push(smithers_runtime::VolumeMount {
        host: project.outside.clone(),
        container: "/workspace/shadow".into(),
        readonly: true,
    });
    let mut bad_memory = env.controls();
    bad_memory.memory_limit_bytes = Some(0);
    let mut bad_ports = env.controls();
    bad_ports.ports.push(smithers_runtime::PortMapping {
        host: 8080,
        container: 80,
    });
    let cases = [
        (
            "env key",
            env.config(&project.root, &unique("sbx"), bad_env),
        ),
        (
            "volume over /workspace",
            env.config(&project.root, &unique("sbx"), bad_volume),
        ),
        (
            "zero memory",
            env.config(&project.root, &unique("sbx"), bad_memory),
        ),
        (
            "ports without network",
            env.config(&project.root, &unique("sbx"), bad_ports),
        ),
        (
            "sandbox id",
            env.config(&project.root, "../escape", env.controls()),
        ),
    ];
    for (what, config) in cases {
        match env.runtime().create(&config).await {
            Ok(handle) => {
                let _ = env.runtime().cleanup(&handle).await;
                panic!("create accepted an invalid {what}");
            }
            Err(e) => assert_eq!(
                e.code(),
                ErrorCode::InvalidInput,
                "invalid {what}: expected INVALID_INPUT, got {}",
                e.report()
            ),
        }
    }
    before.assert_same(
        &TreeSnapshot::of(&project.root, &[]),
        "create wrote to the project before refusing",
    );
    Ok(())
}

/// `create` twice for the same entity id is an error, not a reuse.
pub async fn create_twice_is_an_error(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let mut sandbox = start(env, &project, env.controls()).await?;
    let again = env.runtime().create(&sandbox.config).await;
    if let Ok(handle) = &again {
        if handle.sandbox_root != sandbox.handle.sandbox_root {
            let _ = env.runtime().cleanup(handle).await;
        }
    }
    assert!(again.is_err(), "create accepted the same entity id twice");
    sandbox.cleanup().await;
    Ok(())
}
