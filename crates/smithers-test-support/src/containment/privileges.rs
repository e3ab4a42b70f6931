//! Rows 7, 17: privileges (no gain of any) and devices (none reachable).

use super::{args, batch, words};
use crate::conformance::{
    assert_reported_not_enforced, breaches, run_once, CaseResult, Project, SuiteEnv,
};

/// Row 7: no capabilities, no_new_privs set (setuid binaries gain nothing), and mount,
/// unshare, setns, ptrace, bpf, keyctl, init_module and setuid(0) all denied.
pub async fn row07_privilege_gain_denied(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let attempts = [
        "status",
        "mount-tmpfs /tmp/smithers-attack-mnt",
        "unshare user",
        "unshare mount",
        "unshare net",
        "unshare pid",
        "setns /proc/1/ns/mnt",
        "ptrace-parent",
        "bpf",
        "keyctl",
        "init-module",
        "setuid-root",
    ]
    .map(words);
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
    assert_reported_not_enforced(
        env,
        "row 7",
        &["seccomp", "no-new-privs", "capabilities", "user-namespace"],
        Some(&exec.outcome),
        &breaches(&results),
    )
    .await;
    Ok(())
}

/// Row 17: block devices, /dev/mem, /dev/kmsg and friends are absent or denied, and a device
/// node cannot be made.
pub async fn row17_devices_denied(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let mut attempts: Vec<Vec<String>> = [
        "/dev/sda",
        "/dev/vda",
        "/dev/nvme0n1",
        "/dev/mem",
        "/dev/kmem",
        "/dev/port",
        "/dev/kmsg",
    ]
    .iter()
    .map(|d| vec!["open-device".into(), d.to_string()])
    .collect();
    attempts.push(words("mknod /tmp/smithers-sda 8 0"));
    attempts.push(words("mknod /tmp/smithers-vda 253 0"));
    attempts.push(words("open-device /dev/null"));
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
    let (hostile, null) = results.split_at(results.len() - 1);
    assert_eq!(null[0]["ok"], true, "/dev/null must be usable: {}", null[0]);
    assert_reported_not_enforced(
        env,
        "row 17",
        &["devices", "seccomp", "capabilities"],
        Some(&exec.outcome),
        &breaches(hostile),
    )
    .await;
    Ok(())
}
