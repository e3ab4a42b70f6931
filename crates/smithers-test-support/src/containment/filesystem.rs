//! Rows 3-5, 14-15: the host's files (the project tree, system directories, secrets, a
//! symlink to a host file, result paths escaping the bundle).

use std::path::Path;

use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode};

use super::{args, batch};
use crate::conformance::{
    assert_reported_not_enforced, breaches, check_bundle, host_secret, run_once, unique,
    CaseResult, Project, SuiteEnv, HOST_SECRET_ENV,
};

/// Row 3: the host project cannot be written through its host path (or /proc tricks); the
/// host tree is byte-identical after the run.
pub async fn row03_host_project_tree_untouched(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let before = project.snapshot();
    let root = project.root.display().to_string();
    let attempts = vec![
        vec!["write-file".into(), format!("{root}/pwned"), "x".into()],
        vec![
            "append-file".into(),
            format!("{root}/README.txt"),
            "pwned".into(),
        ],
        vec![
            "write-file".into(),
            format!("{root}/.smithers/pwned"),
            "x".into(),
        ],
        vec![
            "write-file".into(),
            format!("/proc/1/root{root}/pwned"),
            "x".into(),
        ],
        vec![
            "write-file".into(),
            "/proc/self/cwd/legit.txt".into(),
            "legit".into(),
        ],
    ];
    let argv = batch(&attempts);
    let (exec, collected) = run_once(
        env,
        &project,
        env.controls(),
        project.attack_argv(&args(&argv)),
    )
    .await?;
    let results = exec.output.attempts();
    assert_eq!(results.len(), 5, "{}", exec.output.dump());
    assert_eq!(
        results[4]["ok"], true,
        "writing /workspace must work: {}",
        results[4]
    );
    before.assert_same(
        &project.snapshot(),
        "row 3: the host project changed during the run",
    );
    for p in ["pwned", ".smithers/pwned"] {
        assert!(
            !project.root.join(p).exists(),
            "row 3: {p} written on the host"
        );
    }
    let report = collected.unwrap_or_else(|e| panic!("collect failed: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    assert!(
        bundle.patch_text.contains("legit.txt"),
        "{}",
        bundle.patch_text
    );
    assert_reported_not_enforced(
        env,
        "row 3",
        &["filesystem", "mount-namespace", "landlock"],
        Some(&exec.outcome),
        &breaches(&results[..4]),
    )
    .await;
    Ok(())
}

/// Row 4: /etc, /usr, /, $HOME, /var, /opt are not writable, and nothing appears on the host.
pub async fn row04_system_dirs_read_only(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let name = unique("smithers-suite-row4");
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let mut dirs = vec![
        "/etc".to_string(),
        "/usr".into(),
        "/usr/bin".into(),
        "/var".into(),
        "/opt".into(),
        "/root".into(),
        String::new(), // "/" itself
    ];
    // A $HOME under /tmp (a test harness's, an ordinary user's without a home) is inside the
    // sandbox's own private, writable /tmp: the write there may succeed and is no breach, but
    // it still must not appear on the host (the "appeared" check below).
    let mut private_home = None;
    if !dirs.contains(&home) {
        if Path::new(&home).starts_with("/tmp") {
            private_home = Some(dirs.len());
        }
        dirs.push(home.clone());
    }
    let targets: Vec<String> = dirs.iter().map(|d| format!("{d}/{name}")).collect();
    let mut attempts: Vec<Vec<String>> = targets
        .iter()
        .map(|t| vec!["write-file".into(), t.clone(), "x".into()])
        .collect();
    // Existing system files, opened for writing (nothing is written, so a broken runtime does
    // no damage to the host).
    for f in ["/etc/passwd", "/usr/bin/env", "/bin/sh"] {
        attempts.push(vec!["open-write".into(), f.into()]);
    }
    let passwd = std::fs::read("/etc/passwd").unwrap_or_default();
    let argv = batch(&attempts);
    let (exec, _) = run_once(
        env,
        &project,
        env.controls(),
        project.attack_argv(&args(&argv)),
    )
    .await?;
    let results = exec.output.attempts();
    assert_eq!(results.len(), attempts.len(), "{}", exec.output.dump());
    let appeared: Vec<&String> = targets.iter().filter(|t| Path::new(t).exists()).collect();
    for t in &appeared {
        let _ = std::fs::remove_file(t);
    }
    assert!(
        appeared.is_empty(),
        "row 4: files appeared on the host: {appeared:?}"
    );
    assert_eq!(
        std::fs::read("/etc/passwd").unwrap_or_default(),
        passwd,
        "row 4: the host /etc/passwd changed"
    );
    let mut counted = results.clone();
    if let Some(at) = private_home {
        counted.remove(at);
    }
    assert_reported_not_enforced(
        env,
        "row 4",
        &["filesystem", "mount-namespace", "landlock"],
        Some(&exec.outcome),
        &breaches(&counted),
    )
    .await;
    Ok(())
}

/// Row 5: host secrets are not visible: a secret file in the host user's home, a file next to
/// the project, /etc/shadow, ~/.ssh, /root, and a secret environment variable.
pub async fn row05_host_secrets_invisible(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let secret = host_secret();
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let home_secret = Path::new(&home).join(format!(".{}", unique("smithers-suite-secret")));
    let wrote_home = std::fs::write(&home_secret, &secret).is_ok();
    let beside = project.outside.join("secret.txt");
    std::fs::write(&beside, &secret).expect("write secret beside the project");
    let _guard = RemoveOnDrop(home_secret.clone());
    let mut attempts = vec![
        vec![
            "read-file".into(),
            beside.display().to_string(),
            secret.clone(),
        ],
        vec!["read-file".into(), "/etc/shadow".into()],
        vec!["list-dir".into(), format!("{home}/.ssh")],
        vec!["list-dir".into(), home.clone()],
        vec!["list-dir".into(), "/root".into()],
        vec!["env".into()],
    ];
    if wrote_home {
        attempts.push(vec![
            "read-file".into(),
            home_secret.display().to_string(),
            secret.clone(),
        ]);
    }
    let argv = batch(&attempts);
    let (exec, _) = run_once(
        env,
        &project,
        env.controls(),
        project.attack_argv(&args(&argv)),
    )
    .await?;
    let results = exec.output.attempts();
    assert_eq!(results.len(), attempts.len(), "{}", exec.output.dump());
    let mut leaks = Vec::new();
    for r in &results {
        match r["attempt"].as_str() {
            Some("read-file") if r["ok"] == true => leaks.push(r.clone()),
            Some("list-dir") if r["ok"] == true => {
                // A directory may exist inside (an empty home); the host's entries must not.
                let host_dir = r["path"].as_str().unwrap_or_default();
                let host_entries: Vec<String> = std::fs::read_dir(host_dir)
                    .map(|d| {
                        d.filter_map(Result::ok)
                            .map(|e| e.file_name().to_string_lossy().into_owned())
                            .collect()
                    })
                    .unwrap_or_default();
                let seen: Vec<&str> = r["entries"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let common: Vec<&&str> = seen
                    .iter()
                    .filter(|e| host_entries.iter().any(|h| h == *e))
                    .collect();
                if !common.is_empty() {
                    leaks.push(json!({"attempt": "list-dir", "ok": true, "path": host_dir,
                                      "host_entries_visible": common}));
                }
            }
            Some("env") => {
                let env_inside = &r["env"];
                let visible = env_inside
                    .as_object()
                    .map(|m| {
                        m.contains_key(HOST_SECRET_ENV)
                            || m.values().any(|v| v.as_str() == Some(secret.as_str()))
                    })
                    .unwrap_or(false);
                assert!(
                    !visible,
                    "row 5: the host secret variable is visible inside"
                );
            }
            _ => {}
        }
    }
    assert_reported_not_enforced(
        env,
        "row 5",
        &["filesystem", "mount-namespace", "landlock"],
        Some(&exec.outcome),
        &leaks,
    )
    .await;
    Ok(())
}

struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Row 14: `ln -s /etc/passwd x` then editing x: the host /etc/passwd is untouched, the host
/// project unchanged, and the patch describes a symlink (mode 120000).
pub async fn row14_symlink_to_host_file(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let before = project.snapshot();
    let passwd = std::fs::read("/etc/passwd").unwrap_or_default();
    let (exec, collected) = run_once(
        env,
        &project,
        env.controls(),
        vec![
            "/bin/sh".into(),
            "-c".into(),
            // `true >> x` opens the link target for appending and writes nothing, so a broken
            // runtime cannot damage the host's /etc/passwd. (`true`, not `:`: a failed
            // redirection on a special builtin would end the shell.)
            "ln -s /etc/passwd x; true >> x; \
             ln -s /etc etcdir; true > etcdir/smithers-suite-row14; true"
                .into(),
        ],
    )
    .await?;
    assert!(
        exec.outcome.succeeded(),
        "{:?}\n{}",
        exec.outcome,
        exec.output.dump()
    );
    assert_eq!(
        std::fs::read("/etc/passwd").unwrap_or_default(),
        passwd,
        "row 14: host /etc/passwd changed"
    );
    let through = Path::new("/etc/smithers-suite-row14");
    if through.exists() {
        let _ = std::fs::remove_file(through);
        panic!("row 14: created /etc/smithers-suite-row14 through a symlinked parent");
    }
    before.assert_same(&project.snapshot(), "row 14: host project changed");
    let report = collected.unwrap_or_else(|e| panic!("collect failed: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    assert!(
        bundle.patch_text.contains("120000"),
        "row 14: the patch must describe x as a symlink (mode 120000):\n{}",
        bundle.patch_text
    );
    assert!(
        bundle.patch_text.contains("/etc/passwd"),
        "{}",
        bundle.patch_text
    );
    assert!(
        !bundle.patch_text.contains("root:x:0:0"),
        "row 14: the patch carries the content of /etc/passwd instead of a link"
    );
    Ok(())
}

/// Row 15: artifacts and patch paths that escape (symlinks in /result pointing at host files or
/// directories, `..` and absolute patch names in the result JSON) never reach the bundle or the
/// host: collect rejects them (TOOL_PATH_ESCAPE) or leaves them out.
pub async fn row15_result_path_escapes_rejected(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let evil = unique("smithers-suite-row15");
    let evil_abs = format!("/tmp/{evil}.patch");
    let result_json = json!({
        "status": "finished",
        "outputs": {},
        "patches": [format!("../../../../../../tmp/{evil}.patch"), evil_abs.clone(),
                    "patches/../../escape.patch"],
    })
    .to_string();
    let script = format!(
        "mkdir -p /result/artifacts /result/patches; \
         ln -s /etc/passwd /result/artifacts/leak; \
         ln -s / /result/artifacts/rootdir; \
         ln -s /etc /result/patches/etc; \
         ln -s /etc/passwd /result/patches/p.patch; \
         printf '%s' '{result_json}' > \"$SMITHERS_SANDBOX_RESULT_PATH\"; true"
    );
    let (exec, collected) = run_once(
        env,
        &project,
        env.controls(),
        vec!["/bin/sh".into(), "-c".into(), script],
    )
    .await?;
    assert!(
        exec.outcome.succeeded(),
        "{:?}\n{}",
        exec.outcome,
        exec.output.dump()
    );
    assert!(
        !Path::new(&evil_abs).exists(),
        "row 15: {evil_abs} written on the host"
    );
    match collected {
        Err(e) => {
            let r = e.report();
            assert!(
                matches!(r.code, ErrorCode::ToolPathEscape | ErrorCode::InvalidInput)
                    || r.to_json().to_string().contains("TOOL_PATH_ESCAPE"),
                "row 15: collect must reject with TOOL_PATH_ESCAPE: {r}"
            );
        }
        Ok(report) => {
            // check_bundle rejects symlinks and patch paths outside patches/.
            let bundle = check_bundle(&report.bundle_path);
            let passwd = std::fs::read("/etc/passwd").unwrap_or_default();
            for f in &bundle.files {
                let content = std::fs::read(report.bundle_path.join(f)).unwrap_or_default();
                assert!(
                    passwd.is_empty() || content != passwd,
                    "row 15: the host /etc/passwd was copied into the bundle as {}",
                    f.display()
                );
            }
            let parent = report.bundle_path.parent().map(Path::to_path_buf);
            if let Some(parent) = parent {
                assert!(
                    !parent.join("escape.patch").exists(),
                    "row 15: escape.patch written"
                );
            }
        }
    }
    Ok(())
}
