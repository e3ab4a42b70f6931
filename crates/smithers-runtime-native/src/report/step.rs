//! The enforcement report of one execution: what the plan put in force and what the init
//! confirmed.

use serde_json::Value;
use smithers_runtime::{Controls, EnforcementReport, Protection, ProtectionStatus, RuntimeKind};

use crate::backend::{StoredConfig, WorkspaceState};
use crate::cgroup::SandboxCgroups;
use crate::host::HostCaps;
use crate::plan::InitPlan;

use super::rows::{copy_row, human_bytes, landlock_abi, landlock_abi_detail, n, row, LANDLOCK_FIX};

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
            crate::egress::report_detail(policy) + &secrets_detail(c),
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

/// What the network row says of the step's secrets (names and hosts, never a value).
fn secrets_detail(c: &Controls) -> String {
    smithers_egress::sandbox::secrets_detail(
        (c.secrets.iter()).map(|s| (s.name.as_str(), s.hosts.as_slice())),
    )
}

/// The file system's rows of a step's report (its mounts and devices too).
fn filesystem_rows(c: &Controls, workspace: &WorkspaceState) -> Vec<Protection> {
    use ProtectionStatus::*;
    let mut p = Vec::new();
    p.push(row(
        n::FILESYSTEM,
        Enforced,
        format!(
            "read-only root of /usr, /bin, /lib*, /sbin and a filtered /etc; writable: /workspace ({}), /result, /tmp, $HOME ({}, {})",
            match workspace {
                WorkspaceState::Overlay => "copy-on-write",
                WorkspaceState::Copy { .. } => "a copy of the project",
            },
            crate::plan::paths::HOME,
            match &c.home {
                Some(name) => format!(
                    "the persistent home {name:?} kept across runs outside every project, never in the patches (`home rm {name}`)"
                ),
                None => "empty at start".to_string(),
            },
        ),
        None,
    ));
    p.push(smithers_runtime::mount_row::report_row(c));
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
