//! Host-side checks shared by both suites: surviving processes, result bundles, protections
//! reported as not enforced, and limits enforced or refused.

use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode};
use std::path::{Component, Path, PathBuf};

use smithers_runtime::{
    CollectReport, Controls, EnforcementReport, ExecOutcome, ProtectionStatus, RuntimeError,
};

use super::{say, start, unavailable_or_panic, Exec, Project, Sandbox, Skip, SuiteEnv};

/// Host pids whose command line contains `marker` (zombies have none and are not counted).
pub fn host_marker_pids(marker: &str) -> Vec<u32> {
    let me = std::process::id();
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if cmdline
            .windows(marker.len())
            .any(|w| w == marker.as_bytes())
        {
            pids.push(pid);
        }
    }
    pids
}

/// Kills leftovers after a failed check so one failing case does not poison the host.
pub fn kill_host_pids(pids: &[u32]) {
    for pid in pids {
        let _ = std::process::Command::new("kill")
            .arg("-9")
            .arg(pid.to_string())
            .status();
    }
}

/// Asserts no process carrying `marker` survives, killing any survivors after failing.
pub fn assert_no_marker_processes(marker: &str, when: &str) {
    let pids = host_marker_pids(marker);
    if !pids.is_empty() {
        let cmdlines: Vec<String> = pids
            .iter()
            .map(|p| {
                let raw = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                format!("{p}: {}", String::from_utf8_lossy(&raw).replace('\0', " "))
            })
            .collect();
        kill_host_pids(&pids);
        panic!("{when}: sandbox processes still alive on the host: {cmdlines:?}");
    }
}

/// A validated bundle: the manifest and the concatenated text of its patch files.
#[derive(Debug, Clone)]
pub struct BundleCheck {
    pub manifest: Value,
    pub patch_text: String,
    pub files: Vec<PathBuf>,
}

/// Checks a bundle directory against spec section 2 (independently of the bundle crate, so a
/// bug there cannot hide here): README.md a regular file ≤ 5 MiB holding a JSON object with a
/// valid status and a `patches` array; every patch path strictly inside `patches/`; no symlink
/// anywhere; total ≤ 100 MiB.
pub fn check_bundle(bundle: &Path) -> BundleCheck {
    let readme = bundle.join("README.md");
    let meta = std::fs::symlink_metadata(&readme)
        .unwrap_or_else(|e| panic!("bundle {} has no README.md: {e}", bundle.display()));
    assert!(
        meta.file_type().is_file(),
        "README.md must be a regular file"
    );
    assert!(meta.len() <= 5 * 1024 * 1024, "README.md exceeds 5 MiB");
    let text = std::fs::read_to_string(&readme).expect("read README.md");
    let manifest: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("README.md is not JSON: {e}\n{text}"));
    assert!(
        manifest.is_object(),
        "manifest must be an object: {manifest}"
    );
    let status = manifest["status"].as_str().unwrap_or_default();
    assert!(
        matches!(status, "finished" | "failed" | "cancelled"),
        "manifest status must be finished|failed|cancelled: {manifest}"
    );
    let patches = manifest["patches"]
        .as_array()
        .unwrap_or_else(|| panic!("manifest must have a patches array: {manifest}"));
    let mut files = Vec::new();
    let mut total = 0u64;
    let mut stack = vec![bundle.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read bundle dir") {
            let entry = entry.expect("bundle entry");
            let ft = entry.file_type().expect("file type");
            assert!(
                !ft.is_symlink(),
                "bundle contains a symlink: {}",
                entry.path().display()
            );
            if ft.is_dir() {
                stack.push(entry.path());
            } else {
                total += entry.metadata().map(|m| m.len()).unwrap_or(0);
                files.push(
                    entry
                        .path()
                        .strip_prefix(bundle)
                        .unwrap_or(&entry.path())
                        .to_path_buf(),
                );
            }
        }
    }
    assert!(total <= 100 * 1024 * 1024, "bundle exceeds 100 MiB");
    let mut patch_text = String::new();
    for p in patches {
        let p = p
            .as_str()
            .unwrap_or_else(|| panic!("patch entry not a string: {p}"));
        let rel = Path::new(p);
        let mut comps = rel.components();
        assert!(
            comps.next() == Some(Component::Normal("patches".as_ref()))
                && rel.components().count() > 1
                && rel.components().all(|c| matches!(c, Component::Normal(_))),
            "manifest patch path escapes patches/: {p}"
        );
        let text = std::fs::read(bundle.join(rel))
            .unwrap_or_else(|e| panic!("manifest names patch {p} that cannot be read: {e}"));
        patch_text.push_str(&String::from_utf8_lossy(&text));
        patch_text.push('\n');
    }
    files.sort();
    BundleCheck {
        manifest,
        patch_text,
        files,
    }
}

/// When an attack got through, the runtime must have said the protection was not in force:
/// in the outcome's enforcement report or in its probe. Returns the names found not enforced;
/// panics (naming the attempts) when the runtime claimed everything was enforced.
pub async fn assert_reported_not_enforced(
    env: &SuiteEnv,
    row: &str,
    protections: &[&str],
    outcome: Option<&ExecOutcome>,
    breaches: &[Value],
) {
    if breaches.is_empty() {
        return;
    }
    let probe = env.runtime().probe().await;
    let empty = EnforcementReport::default();
    let reports = [outcome.map(|o| &o.enforcement).unwrap_or(&empty), &probe];
    let admitted: Vec<String> = reports
        .iter()
        .flat_map(|r| r.protections.iter())
        .filter(|p| protections.contains(&p.name.as_str()))
        .filter(|p| p.status != ProtectionStatus::Enforced)
        .map(|p| format!("{}={:?} ({})", p.name, p.status, p.detail))
        .collect();
    if admitted.is_empty() {
        panic!(
            "{row}: the attack got through and the runtime did not report any of {protections:?} \
             as degraded/unavailable.\nbreaches: {}\nprobe: {}",
            serde_json::to_string_pretty(breaches).unwrap_or_default(),
            serde_json::to_string(&probe).unwrap_or_default()
        );
    }
    say(&format!(
        "{row}: not enforced on this host, and reported as such: {admitted:?}"
    ));
}

/// The attempts among `results` that got through (`"ok": true`).
pub fn breaches(results: &[Value]) -> Vec<Value> {
    results
        .iter()
        .filter(|v| v["ok"] == Value::Bool(true))
        .cloned()
        .collect()
}

/// Runs `argv` in a fresh sandbox with default controls, then collects and cleans up.
/// Returns the exec and the collect result.
pub async fn run_once(
    env: &SuiteEnv,
    project: &Project,
    controls: Controls,
    argv: Vec<String>,
) -> Result<(Exec, Result<CollectReport, RuntimeError>), Skip> {
    let mut sandbox = start(env, project, controls).await?;
    sandbox.ship(json!({})).await;
    let exec = sandbox.exec(argv).await;
    let collected = sandbox.collect().await;
    sandbox.cleanup().await;
    Ok((exec, collected))
}

/// A limit control was either refused up front with `ControlUnsupported` naming it (returns
/// `None`), or accepted (returns the sandbox). Any other create error fails the case.
pub async fn create_or_refused<'e>(
    env: &'e SuiteEnv,
    project: &Project,
    controls: Controls,
    control: &str,
) -> Result<Option<Sandbox<'e>>, Skip> {
    match Sandbox::create(env, project, controls).await {
        Ok(s) => Ok(Some(s)),
        Err(RuntimeError::ControlUnsupported {
            runtime,
            control: named,
            reason,
        }) => {
            let e = RuntimeError::ControlUnsupported {
                runtime,
                control: named,
                reason: reason.clone(),
            };
            assert_eq!(e.code(), ErrorCode::TaskRuntimeUnavailable);
            assert!(
                named
                    .to_ascii_lowercase()
                    .contains(&control.to_ascii_lowercase()),
                "refusal must name the control {control:?}, named {named:?}"
            );
            say(&format!(
                "{control}: refused by the runtime on this host: {reason}"
            ));
            Ok(None)
        }
        Err(e) => Err(unavailable_or_panic(e)),
    }
}

pub(crate) fn sh(script: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), script.into()]
}

// The cases

/// Names of protections each kind of breach must be reported under when not enforced.
pub const PROTECTION_NAMES: &[(&str, &[&str])] = &[
    ("network", &["network"]),
    ("filesystem", &["filesystem", "landlock", "mount-namespace"]),
    ("processes", &["pid-namespace"]),
    (
        "privileges",
        &["seccomp", "no-new-privs", "capabilities", "user-namespace"],
    ),
    ("devices", &["devices"]),
];
