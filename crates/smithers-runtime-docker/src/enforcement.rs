//! What the docker runtime enforces: controls it refuses, the probe, and the report of one
//! sandbox's protections.

use smithers_runtime::{
    Controls, EnforcementReport, Protection, ProtectionStatus, RuntimeError, RuntimeKind,
};

use crate::egress;
use crate::engine::{self, RUNTIME};
use crate::plan::{self, BackendState};
use crate::runtime::{DockerRuntime, WATCHDOG_BIN};

pub(crate) fn unsupported(control: &'static str, reason: &str) -> RuntimeError {
    RuntimeError::ControlUnsupported {
        runtime: RUNTIME,
        control,
        reason: reason.to_string(),
    }
}

/// Controls this runtime cannot honour, refused before anything is created.
pub(crate) fn refuse_unsupported(controls: &Controls) -> Result<(), RuntimeError> {
    if controls.workspace.is_some() {
        return Err(unsupported(
            "workspace",
            "persistent named workspaces belong to remote runtimes; the docker runtime's \
             workspace is always an ephemeral copy-on-write view of rootDir",
        ));
    }
    if let Some(egress) = &controls.egress {
        if egress.proxy_url.is_some()
            || egress.ca_certificate.is_some()
            || !egress.secret_bindings.is_empty()
        {
            return Err(unsupported(
                "egress",
                "routing a container's traffic through an egress proxy with secret \
                 injection is not implemented by the docker runtime",
            ));
        }
    }
    Ok(())
}

pub(crate) fn parent_death(watchdog: bool) -> Protection {
    if watchdog {
        protection(
            "parent-death",
            ProtectionStatus::Enforced,
            "a watchdog process kills the container if the orchestrator dies",
        )
    } else {
        Protection {
            name: "parent-death".into(),
            status: ProtectionStatus::Unavailable,
            detail: "the engine keeps a container running when its client dies".into(),
            fix: Some(format!(
                "install {WATCHDOG_BIN} next to the executable or set DockerOptions::watchdog"
            )),
        }
    }
}

pub(crate) fn protection(
    name: &str,
    status: ProtectionStatus,
    detail: impl Into<String>,
) -> Protection {
    Protection {
        name: name.to_string(),
        status,
        detail: detail.into(),
        fix: None,
    }
}

/// What was in force for one sandbox.
pub(crate) fn enforcement_for(
    c: &Controls,
    state: &BackendState,
    watchdog: bool,
) -> EnforcementReport {
    use ProtectionStatus::*;
    let mut p = vec![
        parent_death(watchdog),
        smithers_runtime::mount_row::report_row(c),
        match egress::policy(c).ok().flatten() {
            Some(policy) => protection(
                "network",
                if policy.mode == smithers_egress::Mode::Audit {
                    Degraded
                } else {
                    Enforced
                },
                format!(
                    "the network namespace of a NetworkMode=none holder container, joined by the step's: {}{}",
                    smithers_egress::sandbox::report_detail(&policy),
                    smithers_egress::sandbox::secrets_detail(
                        (c.secrets.iter()).map(|s| (s.name.as_str(), s.hosts.as_slice()))
                    ),
                ),
            ),
            None if c.allow_network => {
                protection("network", Disabled, "allowNetwork: bridge network")
            }
            None => protection("network", Enforced, "NetworkMode=none"),
        },
        protection("capabilities", Enforced, "CapDrop=ALL"),
        protection("no_new_privileges", Enforced, "no-new-privileges"),
        protection(
            "seccomp",
            Enforced,
            "deny-list profile: engine defaults plus ptrace and process_vm_*",
        ),
        protection("readonly_root", Enforced, "ReadonlyRootfs"),
        protection("host_env", Enforced, "environment built from an allowlist"),
        protection(
            "workspace_cow",
            Enforced,
            "overlay volume, upper outside the project",
        ),
        protection("init", Enforced, "Init=true, pid namespace"),
        protection(
            "pids",
            Enforced,
            format!(
                "PidsLimit={}",
                c.pids_limit.unwrap_or(plan::DEFAULT_PIDS_LIMIT)
            ),
        ),
    ];
    p.push(match c.memory_limit_bytes {
        Some(m) => protection("memory", Enforced, format!("Memory={m}")),
        None => protection("memory", Disabled, "no memoryLimit given"),
    });
    p.push(match c.cpu_limit {
        Some(cpu) => protection("cpu", Enforced, format!("NanoCpus={}", (cpu * 1e9).round())),
        None => protection("cpu", Disabled, "no cpuLimit given"),
    });
    p.push(match c.disk_limit_bytes {
        Some(d) if state.layer_tmpfs => protection(
            "disk",
            Enforced,
            format!("/tmp and the workspace layer are tmpfs of {d} bytes"),
        ),
        _ => protection(
            "disk",
            Degraded,
            format!(
                "/tmp capped at {} bytes; workspace layer uncapped (no diskLimit)",
                plan::DEFAULT_TMP_BYTES
            ),
        ),
    });
    p.push(if state.user.starts_with("0:") {
        protection(
            "user",
            Degraded,
            "uid 0 (owner of rootDir) without capabilities",
        )
    } else {
        protection("user", Enforced, format!("uid:gid {}", state.user))
    });
    EnforcementReport {
        runtime: Some(RuntimeKind::Docker),
        protections: p,
    }
}

pub(crate) async fn probe_report(rt: &DockerRuntime) -> EnforcementReport {
    use ProtectionStatus::*;
    let socket = &rt.opts.socket;
    let docker = match rt.engine().await {
        Ok(d) => d,
        Err(e) => {
            let fix = match &e {
                RuntimeError::Unavailable { fix, .. } => fix.clone(),
                _ => None,
            };
            return EnforcementReport {
                runtime: Some(RuntimeKind::Docker),
                protections: vec![Protection {
                    name: "engine".to_string(),
                    status: Unavailable,
                    detail: e.to_string(),
                    fix: fix.or_else(|| Some(engine::fix_for_socket(socket))),
                }],
            };
        }
    };
    let version = rt
        .engine
        .get()
        .map(|(_, v)| v.version.clone())
        .unwrap_or_default();
    let api = docker.client_version();
    let info = docker.info().await.ok().unwrap_or_default();
    let driver = info
        .cgroup_driver
        .map(|d| d.to_string())
        .unwrap_or_else(|| "unknown".into());
    let cgv = info
        .cgroup_version
        .map(|d| d.to_string())
        .unwrap_or_else(|| "unknown".into());
    let sec = info.security_options.unwrap_or_default();
    let flag = |ok: Option<bool>, name: &str, what: &str| {
        if ok == Some(false) {
            Protection {
                name: name.to_string(),
                status: Unavailable,
                detail: format!("the engine reports no {what} support"),
                fix: Some("enable the cgroup controller in the kernel / engine".to_string()),
            }
        } else {
            protection(name, Enforced, what.to_string())
        }
    };
    let root = rustix::process::geteuid().is_root();
    let mut p = vec![
        protection(
            "engine",
            Enforced,
            format!(
                "Docker {version}, API {}.{}, cgroup driver {driver}, cgroup {cgv}, socket {socket}",
                api.major_version, api.minor_version
            ),
        ),
        protection("network", Enforced, "NetworkMode=none unless allowNetwork"),
        flag(info.memory_limit, "memory", "memory limit"),
        flag(info.pids_limit, "pids", "pids limit"),
        flag(info.cpu_cfs_quota, "cpu", "CPU quota (NanoCpus)"),
        protection("capabilities", Enforced, "CapDrop=ALL"),
        protection("no_new_privileges", Enforced, "no-new-privileges"),
        if sec.iter().any(|s| s.contains("name=seccomp")) {
            protection(
                "seccomp",
                Enforced,
                "deny-list profile: engine defaults plus ptrace and process_vm_*",
            )
        } else {
            Protection {
                name: "seccomp".into(),
                status: Unavailable,
                detail: "the engine reports no seccomp support".into(),
                fix: Some("use an engine built with seccomp".into()),
            }
        },
        protection("readonly_root", Enforced, "ReadonlyRootfs"),
        protection("host_env", Enforced, "environment built from an allowlist"),
        protection("init", Enforced, "Init=true, pid namespace"),
        parent_death(rt.opts.watchdog.is_some()),
    ];
    let overlay = std::fs::read_to_string("/proc/filesystems")
        .map(|f| f.contains("\toverlay"))
        .unwrap_or(false);
    p.push(if overlay {
        protection("workspace_cow", Enforced, "overlay volume (local driver)")
    } else {
        Protection {
            name: "workspace_cow".into(),
            status: Unavailable,
            detail: "overlayfs is not available in this kernel".into(),
            fix: Some("modprobe overlay".into()),
        }
    });
    p.push(if root {
        protection(
            "disk",
            Enforced,
            "tmpfs /tmp and a tmpfs-backed workspace layer of diskLimit",
        )
    } else {
        Protection {
            name: "disk".into(),
            status: Degraded,
            detail: "/tmp is capped; the workspace layer cannot be (diskLimit is refused)".into(),
            fix: Some("run as root (CAP_SYS_ADMIN) to cap the workspace layer".into()),
        }
    });
    EnforcementReport {
        runtime: Some(RuntimeKind::Docker),
        protections: p,
    }
}
