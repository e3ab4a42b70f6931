//! The enforcement report of a sandbox that ran, and the host probe (`doctor`).

use serde_json::Value;
use smithers_runtime::{Controls, EnforcementReport, Protection, ProtectionStatus, RuntimeKind};

use crate::backend::{StoredConfig, WorkspaceState, FOREIGN_OWNERS};
use crate::cgroup::SandboxCgroups;
use crate::clock::now_ms;
use crate::files::remove_tree;
use crate::host::HostCaps;
use crate::init_command::InitCommand;
use crate::options::WorkspaceMode;
use crate::plan::InitPlan;

/// The names of the protections in every report of this runtime.
pub mod protection_names {
    pub const USER_NAMESPACE: &str = "user-namespace";
    pub const MOUNT_NAMESPACE: &str = "mount-namespace";
    pub const PID_NAMESPACE: &str = "pid-namespace";
    pub const IPC_NAMESPACE: &str = "ipc-namespace";
    pub const UTS_NAMESPACE: &str = "uts-namespace";
    pub const CGROUP_NAMESPACE: &str = "cgroup-namespace";
    /// The network namespace (only loopback) or, with allowNetwork, disabled.
    pub const NETWORK: &str = "network";
    /// Read-only minimal root, filtered /etc, no home or /sys.
    pub const FILESYSTEM: &str = "filesystem";
    /// Minimal /dev.
    pub const DEVICES: &str = "devices";
    pub const SECCOMP: &str = "seccomp";
    pub const LANDLOCK: &str = "landlock";
    pub const NO_NEW_PRIVS: &str = "no-new-privs";
    pub const CAPABILITIES: &str = "capabilities";
    pub const MEMORY: &str = "memory";
    pub const PIDS: &str = "pids";
    pub const CPU: &str = "cpu";
    pub const DISK: &str = "disk";
    pub const TIMEOUT: &str = "timeout";
    pub const OUTPUT: &str = "output";
    pub const WORKSPACE_COW: &str = "workspace-cow";
    /// Host paths mounted by the caller (`volumes`), each with its mode.
    pub const HOST_MOUNTS: &str = smithers_runtime::mounts::HOST_MOUNTS;
}

use protection_names as n;

fn row(
    name: &str,
    status: ProtectionStatus,
    detail: impl Into<String>,
    fix: Option<&str>,
) -> Protection {
    Protection {
        name: name.to_string(),
        status,
        detail: detail.into(),
        fix: fix.map(str::to_string),
    }
}

fn human_bytes(b: u64) -> String {
    if b >= 1 << 30 && b % (1 << 30) == 0 {
        format!("{} GiB", b >> 30)
    } else if b >= 1 << 20 {
        format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
    } else {
        format!("{b} bytes")
    }
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

/// The newest Landlock ABI whose rights the init asks for (`privileges::apply_landlock`).
const LANDLOCK_ABI_USED: i64 = 6;

const LANDLOCK_FIX: &str =
    "use a kernel with Landlock ABI 6 or newer (Linux 6.12+) for every right the sandbox asks for";

/// Landlock rights by the ABI that brought them, and what their absence costs here, given
/// the layers that do not depend on Landlock (read-only mounts, the sandbox's own network,
/// pid and IPC namespaces, the seccomp filter).
const LANDLOCK_RIGHTS: &[(i64, &str, &str)] = &[
    (2, "refer (rename and link across directories)", "Landlock then refuses every rename or link across directories in the sandbox, /workspace included: build tools that move files between directories fail (EXDEV)"),
    (3, "truncate", "truncation is not checked by Landlock; every path outside the writable directories is on a read-only mount, so nothing outside them can be truncated anyway"),
    (4, "TCP bind and connect rules", "none: the sandbox's network namespace is the boundary (the runtime uses no TCP rules)"),
    (5, "ioctl on device files", "ioctls on the minimal /dev's devices are not checked by Landlock; the seccomp filter still denies TIOCSTI and TIOCLINUX"),
    (6, "scoping of abstract unix sockets and signals", "none beyond Landlock: abstract sockets are per network namespace and signals cannot cross the sandbox's pid namespace"),
];

/// "ABI n", and for each right the kernel lacks, what it costs.
pub(crate) fn landlock_abi_detail(abi: i64) -> String {
    let missing: Vec<String> = LANDLOCK_RIGHTS
        .iter()
        .filter(|(since, _, _)| *since > abi)
        .map(|(since, right, cost)| format!("no {right} (ABI {since}): {cost}"))
        .collect();
    if missing.is_empty() {
        format!("ABI {abi}")
    } else {
        format!("ABI {abi}; {}", missing.join("; "))
    }
}

/// The kernel's Landlock ABI (0 when Landlock is off).
pub(crate) fn landlock_abi() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_ulong = 1;
    // SAFETY: with a NULL attribute, size 0 and the VERSION flag the call only returns the
    // ABI version; it reads and writes no memory of ours.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    abi.max(0)
}

fn limit_row(
    name: &str,
    requested: Option<String>,
    in_force: bool,
    unlimited_detail: &str,
) -> Protection {
    match (requested, in_force) {
        (Some(detail), true) => row(name, ProtectionStatus::Enforced, detail, None),
        (Some(detail), false) => row(
            name,
            ProtectionStatus::Unavailable,
            format!("{detail} requested but no controller"),
            Some("run under a cgroup with the controller delegated"),
        ),
        (None, _) => row(name, ProtectionStatus::Disabled, unlimited_detail, None),
    }
}

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

/// The `workspace-cow` row of a sandbox that got a copy.
fn copy_row(reason: &str) -> Protection {
    row(
        n::WORKSPACE_COW,
        ProtectionStatus::Degraded,
        format!(
            "workspace mode copy: {reason}; the project was copied into the sandbox's state directory at ship and is compared with the untouched project at collect (the project is never written; .smithers hidden, .git bound read-only: the step cannot commit in copy mode)"
        ),
        Some(if reason.starts_with(FOREIGN_OWNERS) {
            "for copy-on-write (no copy, ship cost independent of the project size): run the runtime as the tree's owner, or give the tree to the runtime's user (chown -R)"
        } else {
            "for copy-on-write (no copy, ship cost independent of the project size): a kernel >= 5.11 with overlayfs in user namespaces, a state root on ext4, xfs or tmpfs, workspace mode auto or overlay"
        }),
    )
}

/// The report of one execution: what the plan put in force and what the init confirmed.
pub(crate) fn enforcement(
    caps: &HostCaps,
    stored: &StoredConfig,
    plan: &InitPlan,
    cgroups: &SandboxCgroups,
    ready: Option<&Value>,
    workspace: &WorkspaceState,
) -> EnforcementReport {
    let c = &stored.config.controls;
    let mut p = namespace_rows(caps, plan);
    p.extend(network_rows(c));
    p.extend(filesystem_rows(c, workspace));
    p.extend(confinement_rows(ready));
    p.extend(limit_rows(caps, stored, cgroups));
    p.extend(stream_rows(c, workspace));
    EnforcementReport {
        runtime: Some(RuntimeKind::Bubblewrap),
        protections: p,
    }
}

/// The namespaces' rows of a step's report.
fn namespace_rows(caps: &HostCaps, plan: &InitPlan) -> Vec<Protection> {
    use ProtectionStatus::*;
    vec![
        row(
            n::USER_NAMESPACE,
            Enforced,
            format!(
                "sandbox root = host uid {} only; setgroups denied",
                caps.uid
            ),
            None,
        ),
        row(
            n::MOUNT_NAMESPACE,
            Enforced,
            "private mount namespace, pivot_root into a fresh tmpfs root",
            None,
        ),
        row(
            n::PID_NAMESPACE,
            Enforced,
            "own pid namespace; its init's death kills every sandbox process",
            None,
        ),
        row(n::IPC_NAMESPACE, Enforced, "", None),
        row(
            n::UTS_NAMESPACE,
            Enforced,
            format!("hostname {}", plan.hostname),
            None,
        ),
        row(n::CGROUP_NAMESPACE, Enforced, "", None),
    ]
}

/// The network row of a step's report: its egress policy, its own namespace, or the host's.
fn network_rows(c: &Controls) -> Vec<Protection> {
    use ProtectionStatus::*;
    let mut p = Vec::new();
    let egress = crate::egress::policy(c).ok().flatten();
    p.push(if let Some(policy) = &egress {
        row(
            n::NETWORK,
            if policy.mode == smithers_egress::Mode::Audit {
                Degraded
            } else {
                Enforced
            },
            crate::egress::report_detail(policy),
            None,
        )
    } else if !c.allow_network {
        row(
            n::NETWORK,
            Enforced,
            "the boundary is the sandbox's own network namespace: only its own loopback (TCP and UDP work on it), the host's loopback and every outside address unreachable",
            None,
        )
    } else {
        row(
            n::NETWORK,
            Disabled,
            "allowNetwork: the sandbox shares the host network",
            None,
        )
    });
    p
}

/// The file system's rows of a step's report (its mounts and devices too).
fn filesystem_rows(c: &Controls, workspace: &WorkspaceState) -> Vec<Protection> {
    use ProtectionStatus::*;
    let mut p = Vec::new();
    p.push(row(
        n::FILESYSTEM,
        Enforced,
        format!(
            "read-only root of /usr, /bin, /lib*, /sbin and a filtered /etc; writable: /workspace ({}), /result, /tmp, $HOME ({}, empty at start)",
            match workspace {
                WorkspaceState::Overlay => "copy-on-write",
                WorkspaceState::Copy { .. } => "a copy of the project",
            },
            crate::plan::paths::HOME,
        ),
        None,
    ));
    p.push(smithers_runtime::mounts::report_row(c));
    p.push(row(
        n::DEVICES,
        Enforced,
        "/dev holds null, zero, full, random, urandom, tty, pts, shm only",
        None,
    ));
    p
}

/// What the init confirmed in its `ready` report: seccomp, Landlock; and the privileges dropped.
fn confinement_rows(ready: Option<&Value>) -> Vec<Protection> {
    use ProtectionStatus::*;
    let mut p = Vec::new();
    let confirmed = |key: &str| ready.map(|r| r[key].clone());
    p.push(match confirmed("seccomp") {
        Some(Value::Bool(true)) => row(n::SECCOMP, Enforced, crate::seccomp::summary(), None),
        Some(_) => row(n::SECCOMP, Unavailable, "no filter was installed", None),
        None => row(
            n::SECCOMP,
            Enforced,
            "installed before the command starts (the run ended before the init confirmed)",
            None,
        ),
    });
    let landlock = ready
        .and_then(|r| r["landlock"].as_str())
        .map(str::to_string);
    let landlock_detail = ready
        .and_then(|r| r["landlockDetail"].as_str())
        .unwrap_or_default()
        .to_string();
    p.push(match landlock.as_deref() {
        Some("enforced") => row(n::LANDLOCK, Enforced, "writes only below /workspace, /result, /tmp and the out dir; signals and abstract sockets scoped", None),
        Some("degraded") => row(n::LANDLOCK, Degraded, format!("the kernel enforces only part of the ruleset: {}", landlock_abi_detail(landlock_abi())), Some(LANDLOCK_FIX)),
        Some(_) => row(n::LANDLOCK, Unavailable, format!("not enforced by this kernel {landlock_detail}").trim().to_string(), Some("boot with lsm=...,landlock")),
        None => row(n::LANDLOCK, Degraded, "the run ended before the init confirmed Landlock", None),
    });
    p.push(row(n::NO_NEW_PRIVS, Enforced, "", None));
    p.push(row(
        n::CAPABILITIES,
        Enforced,
        "bounding, ambient, effective, permitted and inheritable sets empty; securebits locked",
        None,
    ));
    p
}

/// The limits' rows of a step's report: memory, pids, CPU, disk, timeout.
fn limit_rows(caps: &HostCaps, stored: &StoredConfig, cgroups: &SandboxCgroups) -> Vec<Protection> {
    use ProtectionStatus::*;
    let mut p = Vec::new();
    let c = &stored.config.controls;
    p.push(
        match (stored.effective_memory_limit, cgroups.has("memory")) {
            (Some(max), true) if c.memory_limit_bytes.is_none() => row(
                n::MEMORY,
                Enforced,
                format!("{} (runtime default)", human_bytes(max)),
                None,
            ),
            // Without a controller not even the runtime's default holds: unavailable, not
            // merely "not asked for".
            (_, false) if c.memory_limit_bytes.is_none() => row(
                n::MEMORY,
                Unavailable,
                "no memory controller: no limit, not even the runtime's default",
                Some("see `smithers-sandbox doctor` for why and the fix"),
            ),
            (_, has_memory) => limit_row(
                n::MEMORY,
                c.memory_limit_bytes.map(human_bytes),
                has_memory,
                "no memory limit set",
            ),
        },
    );
    p.push(match (stored.effective_pids_limit, cgroups.has("pids")) {
        (Some(max), true) if c.pids_limit.is_none() => {
            row(n::PIDS, Enforced, format!("{max} (runtime default)"), None)
        }
        (Some(max), true) => row(n::PIDS, Enforced, max.to_string(), None),
        (_, false) => row(
            n::PIDS,
            Unavailable,
            "no pids controller: fork bombs are not capped",
            Some("see `smithers-sandbox doctor` for why and the fix"),
        ),
        (None, true) => row(n::PIDS, Disabled, "no pids limit set", None),
    });
    p.push(limit_row(
        n::CPU,
        c.cpu_limit.map(|cpus| format!("{cpus} cores")),
        cgroups.has("cpu"),
        "no CPU limit set",
    ));
    let tmp = c.disk_limit_bytes.unwrap_or(crate::plan::DEFAULT_TMP_BYTES);
    p.push(match c.disk_limit_bytes {
        Some(b) => row(
            n::DISK,
            Enforced,
            format!(
                "upper layer on a {} tmpfs; /tmp and /dev/shm capped at {}",
                human_bytes(b),
                human_bytes(tmp)
            ),
            None,
        ),
        None => row(
            n::DISK,
            Disabled,
            match caps.disk_reserve {
                0 => format!(
                    "no disk limit set: the upper layer is on host disk, unguarded; /tmp capped at {}",
                    human_bytes(tmp)
                ),
                reserve => format!(
                    "no disk limit set: the upper layer is on host disk, the step killed when less than {} (or half what was free at its start) is left there; /tmp capped at {}",
                    human_bytes(reserve),
                    human_bytes(tmp)
                ),
            },
            None,
        ),
    });
    p.push(match c.timeout_ms {
        Some(ms) => row(n::TIMEOUT, Enforced, format!("{ms} ms wall clock"), None),
        None => row(n::TIMEOUT, Disabled, "no timeout set", None),
    });
    p
}

/// The output caps' row and the workspace's of a step's report.
fn stream_rows(c: &Controls, workspace: &WorkspaceState) -> Vec<Protection> {
    use ProtectionStatus::*;
    let mut p = Vec::new();
    p.push(row(
        n::OUTPUT,
        Enforced,
        format!(
            "{} and {} lines per stream kept in the log, truncation recorded{}; the step's output is relayed whole",
            human_bytes(c.max_output_bytes),
            c.max_output_lines,
            if c.fail_on_output_cap {
                " (a cap ends the step)"
            } else {
                ""
            }
        ),
        None,
    ));
    p.push(match workspace {
        WorkspaceState::Overlay => row(
            n::WORKSPACE_COW,
            Enforced,
            "overlayfs (userxattr): the project is the lower layer, never written; upper layer outside the project; .smithers hidden; the project's .git is part of the view (the step may commit: its commits come back as a series for review, never its hooks or config)",
            None,
        ),
        WorkspaceState::Copy { reason } => copy_row(reason),
    });
    p
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
    EnforcementReport {
        runtime: Some(RuntimeKind::Bubblewrap),
        protections: p,
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

#[cfg(test)]
mod landlock_tests {
    use super::*;

    #[test]
    fn each_missing_landlock_right_is_named_with_its_cost() {
        // Debian 12's 6.1 kernel has ABI 2.
        let detail = landlock_abi_detail(2);
        assert!(detail.starts_with("ABI 2;"), "{detail}");
        assert!(detail.contains("no truncate (ABI 3)"), "{detail}");
        assert!(
            detail.contains("no TCP bind and connect rules (ABI 4)"),
            "{detail}"
        );
        assert!(!detail.contains("refer"), "ABI 2 has refer: {detail}");
        assert_eq!(landlock_abi_detail(7), "ABI 7");
    }
}
