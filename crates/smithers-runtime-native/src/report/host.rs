//! The host probe (`doctor`): the init run in probe mode, and what its findings say this host
//! can enforce; and whether overlayfs works here.

use serde_json::Value;
use smithers_runtime::{EnforcementReport, Protection, ProtectionStatus, RuntimeKind};

use crate::clock::now_ms;
use crate::files::remove_tree;
use crate::host::HostCaps;
use crate::init_command::InitCommand;
use crate::options::WorkspaceMode;

use super::rows::{copy_row, landlock_abi_detail, n, row, LANDLOCK_ABI_USED, LANDLOCK_FIX};

/// What the probe found about overlayfs in a user namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OverlayCheck {
    /// Mounted, a lower directory deleted through it, a write reached the upper layer.
    Usable,
    /// Tried and failed: why.
    Unusable(String),
    /// Not tried (the probe could not run, or an earlier step such as the user namespace
    /// failed): why.
    Unknown(String),
}

pub(crate) fn overlay_check(findings: &Result<Value, String>) -> OverlayCheck {
    match findings {
        Err(e) => OverlayCheck::Unknown(e.clone()),
        Ok(v) if v["overlay"].is_null() => {
            OverlayCheck::Unknown("not tried (an earlier probe step failed)".into())
        }
        Ok(v) if v["overlay"]["ok"] == Value::Bool(true) => OverlayCheck::Usable,
        Ok(v) => OverlayCheck::Unusable(
            v["overlay"]["detail"]
                .as_str()
                .unwrap_or("failed")
                .to_string(),
        ),
    }
}

/// Runs the init in probe mode (once per runtime; the caller caches). Leaves nothing
/// behind: the probe's mounts die with its namespaces and its scratch directory is removed.
pub(crate) async fn findings(caps: &HostCaps) -> Result<Value, String> {
    match &caps.init {
        Err(e) => Err(e.clone()),
        Ok(init) => run_probe(caps, init).await,
    }
}

/// What this host can enforce, from the probe's findings, for a runtime whose workspace
/// mode is `mode`.
pub(crate) fn probe(
    caps: &HostCaps,
    findings: &Result<Value, String>,
    mode: WorkspaceMode,
) -> EnforcementReport {
    use ProtectionStatus::*;
    let ok = |key: &str| found(findings, key);
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut p = probed_namespace_rows(caps, findings, &mountinfo);
    p.extend(probed_confinement_rows(caps, findings, &mountinfo));
    p.extend(probed_cgroup_rows(caps));
    p.push(if caps.host_mounts {
        row(n::DISK, Enforced, "size-capped tmpfs for the copy-on-write layer; /tmp capped", None)
    } else {
        row(n::DISK, Unavailable, "the copy-on-write layer cannot be size-capped without root (a disk limit is refused); /tmp is capped", Some("run the runtime as root to allow disk limits"))
    });
    p.push(row(
        n::TIMEOUT,
        Enforced,
        "the pid namespace's init is killed, taking every process with it",
        None,
    ));
    p.push(row(
        n::OUTPUT,
        Enforced,
        "per-stream caps on bytes (maxOutputBytes) and lines, truncation recorded with the cap named",
        None,
    ));
    let overlay_fix = "use a kernel >= 5.11 with overlayfs; keep the state root on a filesystem overlayfs accepts as upper layer (ext4, xfs, tmpfs)";
    p.push(match (ok("overlay"), mode) {
        (Ok(()), WorkspaceMode::Copy) => copy_row("copy mode requested (workspace = copy; overlayfs would work here)"),
        (Ok(()), _) => row(n::WORKSPACE_COW, Enforced, format!("overlayfs with userxattr, upper layer under {}", caps.layer_root.display()), None),
        (Err(e), WorkspaceMode::Overlay) => row(n::WORKSPACE_COW, Unavailable, format!("overlayfs in a user namespace failed: {e} (workspace mode overlay: sandboxes are refused)"), Some(overlay_fix)),
        (Err(e), WorkspaceMode::Auto) if matches!(overlay_check(findings), OverlayCheck::Unknown(_)) => row(n::WORKSPACE_COW, Unavailable, format!("overlayfs in a user namespace could not be tried: {e}"), Some(overlay_fix)),
        (Err(e), WorkspaceMode::Auto) => copy_row(&format!("overlayfs cannot be mounted in a user namespace here: {e}")),
        (Err(_), WorkspaceMode::Copy) => copy_row("copy mode requested (workspace = copy)"),
    });
    p.push(checkpoints_row(ok("overlay"), ok("layerFlip"), mode));
    EnforcementReport {
        runtime: Some(RuntimeKind::Bubblewrap),
        protections: p,
    }
}

/// Whether a session's workspace can be checkpointed here: an overlay workspace whose frozen
/// layer can be stacked under a new one (the probe's `layerFlip`).
fn checkpoints_row(
    overlay: Result<(), String>,
    flip: Result<(), String>,
    mode: WorkspaceMode,
) -> smithers_runtime::Protection {
    use ProtectionStatus::*;
    let fix = "an overlay workspace on a kernel whose overlayfs passes the layer-flip probe (6.18 does; Debian's 6.1 answers EIO)";
    match (overlay, flip, mode) {
        (_, _, WorkspaceMode::Copy) | (Err(_), _, _) => row(n::CHECKPOINTS, Unavailable, "session checkpoint, restore and fork need an overlay workspace (a copy has no layers to freeze): refused", Some(fix)),
        (Ok(()), Ok(()), _) => row(n::CHECKPOINTS, Enforced, "session checkpoint, restore and fork by layer flips: the session's layer frozen in place (no file copied), a new one over it", None),
        (Ok(()), Err(e), _) => row(n::CHECKPOINTS, Unavailable, format!("this kernel's overlayfs cannot stack a frozen layer under a new one ({e}): session checkpoint, restore and fork are refused"), Some(fix)),
    }
}

/// What the probe found of `key`: it worked, or why not.
fn found(findings: &Result<Value, String>, key: &str) -> Result<(), String> {
    match findings {
        Err(e) => Err(e.clone()),
        Ok(v) if v[key]["ok"] == Value::Bool(true) => Ok(()),
        Ok(v) if v[key].is_null() => Err("not tried (an earlier step failed)".into()),
        Ok(v) => Err(v[key]["detail"].as_str().unwrap_or("failed").to_string()),
    }
}

/// The namespaces', network's, file system's and devices' rows of the host probe.
fn probed_namespace_rows(
    caps: &HostCaps,
    findings: &Result<Value, String>,
    mountinfo: &str,
) -> Vec<Protection> {
    use ProtectionStatus::*;
    let mut p = Vec::new();
    let ok = |key: &str| found(findings, key);
    let userns_fix = &crate::host_diag::userns_fix(caps.uid, mountinfo);
    let ns_row = |name: &str, key: &str, detail: &str| match ok(key) {
        Ok(()) => row(name, Enforced, detail, None),
        Err(e) => row(name, Unavailable, e, Some(userns_fix)),
    };
    p.push(ns_row(
        n::USER_NAMESPACE,
        "user",
        &format!("sandbox root maps to host uid {}", caps.uid),
    ));
    p.push(ns_row(
        n::MOUNT_NAMESPACE,
        "mount",
        "private mounts, pivot_root",
    ));
    p.push(ns_row(n::PID_NAMESPACE, "pid", "own pid namespace"));
    p.push(ns_row(n::IPC_NAMESPACE, "ipc", ""));
    p.push(ns_row(n::UTS_NAMESPACE, "uts", ""));
    p.push(ns_row(n::CGROUP_NAMESPACE, "cgroup", ""));
    p.push(match (ok("net"), ok("loopback")) {
        (Ok(()), Ok(())) => row(
            n::NETWORK,
            Enforced,
            "no network by default: the boundary is the sandbox's own network namespace (only its own loopback)",
            None,
        ),
        (Ok(()), Err(e)) => row(
            n::NETWORK,
            Degraded,
            format!("own namespace, loopback could not be brought up: {e}"),
            None,
        ),
        (Err(e), _) => row(n::NETWORK, Unavailable, e, Some(userns_fix)),
    });
    p.push(match ok("proc") {
        Ok(()) => row(
            n::FILESYSTEM,
            Enforced,
            "read-only minimal root; fresh /proc of the sandbox",
            None,
        ),
        Err(e) => row(
            n::FILESYSTEM,
            Unavailable,
            format!("cannot mount /proc in a new pid namespace: {e}"),
            Some(&crate::host_diag::proc_fix(mountinfo)),
        ),
    });
    p.push(match ok("mount") {
        Ok(()) => row(n::DEVICES, Enforced, "minimal /dev", None),
        Err(e) => row(n::DEVICES, Unavailable, e, None),
    });
    p
}

/// The seccomp, Landlock and privileges' rows of the host probe.
fn probed_confinement_rows(
    caps: &HostCaps,
    findings: &Result<Value, String>,
    mountinfo: &str,
) -> Vec<Protection> {
    use ProtectionStatus::*;
    let mut p = Vec::new();
    let ok = |key: &str| found(findings, key);
    let userns_fix = &crate::host_diag::userns_fix(caps.uid, mountinfo);
    p.push(match (&caps.seccomp, ok("seccomp")) {
        (Ok(_), Ok(())) => row(n::SECCOMP, Enforced, crate::seccomp::summary(), None),
        (Err(e), _) => row(n::SECCOMP, Unavailable, e.clone(), None),
        (_, Err(e)) => row(
            n::SECCOMP,
            Unavailable,
            e,
            Some("use a kernel built with CONFIG_SECCOMP_FILTER"),
        ),
    });
    let abi = findings
        .as_ref()
        .ok()
        .and_then(|v| v["landlockAbi"].as_i64());
    p.push(match (ok("landlock"), abi) {
        (Ok(()), Some(abi)) if abi >= LANDLOCK_ABI_USED => {
            row(n::LANDLOCK, Enforced, landlock_abi_detail(abi), None)
        }
        (_, Some(abi)) => row(
            n::LANDLOCK,
            Degraded,
            format!(
                "only part of the ruleset is enforced: {}",
                landlock_abi_detail(abi)
            ),
            Some(LANDLOCK_FIX),
        ),
        (_, None) => row(
            n::LANDLOCK,
            Unavailable,
            "Landlock is not enabled in this kernel",
            Some("boot with lsm=...,landlock (CONFIG_SECURITY_LANDLOCK=y)"),
        ),
    });
    p.push(match ok("noNewPrivs") {
        Ok(()) => row(n::NO_NEW_PRIVS, Enforced, "", None),
        Err(e) => row(n::NO_NEW_PRIVS, Unavailable, e, None),
    });
    p.push(match ok("user") {
        Ok(()) => row(
            n::CAPABILITIES,
            Enforced,
            "all capability sets dropped in the sandbox",
            None,
        ),
        Err(e) => row(n::CAPABILITIES, Unavailable, e, Some(userns_fix)),
    });
    p
}

/// The cgroup controllers' rows of the host probe, each tried.
fn probed_cgroup_rows(caps: &HostCaps) -> Vec<Protection> {
    use ProtectionStatus::*;
    let mut p = Vec::new();
    // Tried, not read: a sandbox's cgroups made with a limit of each kind, then removed.
    let trial = cgroup_trial(&caps.cgroups);
    for (name, ctrl) in [(n::MEMORY, "memory"), (n::PIDS, "pids"), (n::CPU, "cpu")] {
        if let (Some(_), Err(e)) = (caps.cgroups.source(ctrl), &trial) {
            p.push(row(
                name,
                Unavailable,
                format!("making a sandbox cgroup with {ctrl} limited failed: {e}"),
                Some(&crate::cgroup::delegate_fix()),
            ));
            continue;
        }
        p.push(match caps.cgroups.source(ctrl) {
            Some(crate::cgroup::ControllerSource::V1(path)) => row(
                name,
                Enforced,
                format!("cgroup v1 at {}", path.display()),
                None,
            ),
            Some(crate::cgroup::ControllerSource::V2(path)) => row(
                name,
                Enforced,
                format!("cgroup v2 at {}", path.display()),
                None,
            ),
            None => {
                let why = caps.cgroups.why_unusable(ctrl);
                row(
                    name,
                    Unavailable,
                    format!(
                        "no {ctrl} limit possible (a step asking for one is refused): {}",
                        why.reason
                    ),
                    Some(&why.fix),
                )
            }
        });
    }
    p
}

/// Makes (and removes) a sandbox's cgroups with a memory, pids and cpu limit wherever this
/// host has the controller: what `doctor` reports is what a step with limits then gets.
fn cgroup_trial(host: &crate::cgroup::CgroupHost) -> Result<(), String> {
    let limits = crate::cgroup::CgroupLimits {
        memory_bytes: host.source("memory").map(|_| 1 << 30),
        pids: host.source("pids").map(|_| 4096),
        cpus: host.source("cpu").map(|_| 1.0),
    };
    // Unique per trial, not only per process: two runtimes of one process (the tests make
    // many, in parallel) trying the same name at once made one fail with EEXIST, and its
    // report then called every controller unusable.
    static TRIALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let trial = TRIALS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) & 0xfff;
    let name = format!(
        "smithers-{:016x}",
        u64::from(std::process::id()) << 24 | 0xd0c << 12 | trial
    );
    let made = host.create(&name, &limits).map_err(|e| e.to_string())?;
    let left = made.remove(std::time::Duration::from_secs(1));
    if left.is_empty() {
        Ok(())
    } else {
        Err(format!("made, but could not be removed: {left:?}"))
    }
}

async fn run_probe(caps: &HostCaps, init: &InitCommand) -> Result<Value, String> {
    // The overlay check runs where upper layers will live.
    std::fs::create_dir_all(&caps.layer_root).map_err(|e| format!("layer root: {e}"))?;
    // Unique per call: several runtimes in one process may probe in the same millisecond.
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let scratch = caps.layer_root.join(format!(
        "probe-{}-{}-{}",
        std::process::id(),
        now_ms(),
        PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir(&scratch).map_err(|e| format!("probe scratch: {e}"))?;
    let result = probe_process(init, &scratch, &probe_input(caps)).await;
    let _ = remove_tree(&scratch);
    let output = result.map_err(|e| format!("running {}: {e}", init.program.display()))?;
    let mut findings: Value = serde_json::from_slice(&output.stdout).map_err(|e| {
        format!(
            "the probe printed no report ({e}); stderr: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )
    })?;
    // The probe could not try a program the runtime does not have: say why there is none.
    if let (Err(e), Some(map)) = (&caps.seccomp, findings.as_object_mut()) {
        map.insert(
            "seccomp".into(),
            serde_json::json!({"ok": false, "detail": e}),
        );
    }
    Ok(findings)
}

/// The probe's stdin: the runtime's own seccomp program, which the probe tries to install
/// (the init has no compiler).
fn probe_input(caps: &HostCaps) -> Vec<u8> {
    let input = crate::plan::ProbeInput {
        version: crate::plan::PLAN_VERSION,
        seccomp: caps.seccomp.as_ref().ok().cloned(),
    };
    serde_json::to_vec(&input).unwrap_or_default()
}

/// Runs `init --probe scratch` with `input` on its stdin; its output.
async fn probe_process(
    init: &InitCommand,
    scratch: &std::path::Path,
    input: &[u8],
) -> std::io::Result<std::process::Output> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(&init.program)
        .args(&init.args)
        .arg("--probe")
        .arg(scratch)
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdin = child.stdin.take();
    // Written while the output is read: neither side can fill a pipe and wait on the other.
    let write = async move {
        if let Some(stdin) = stdin.as_mut() {
            // A probe that exits without reading says why on stdout or stderr.
            let _ = stdin.write_all(input).await;
        }
        drop(stdin);
    };
    let ((), output) = tokio::join!(write, child.wait_with_output());
    output
}
