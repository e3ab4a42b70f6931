//! Pure translation of a sandbox into Engine API objects: names, labels, the overlay volume and
//! the container's `ContainerCreateBody`. No I/O here, so every security-relevant field is
//! unit-tested without an engine.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bollard::models::{
    ContainerCreateBody, HostConfig, Mount, MountTmpfsOptions, MountType, MountVolumeOptions,
    PortBinding, VolumeCreateRequest,
};
use serde::{Deserialize, Serialize};
use smithers_runtime::Controls;

/// Label present on every engine object this runtime creates.
pub const LABEL_MANAGED: &str = "smithers.managed";
/// Label holding the run id.
pub const LABEL_RUN_ID: &str = "smithers.run_id";
/// Label holding the sandbox id.
pub const LABEL_SANDBOX_ID: &str = "smithers.sandbox_id";
/// Label holding the pid of the host process that created the object.
pub const LABEL_OWNER_PID: &str = "smithers.owner_pid";
/// Label holding that process's start time (clock ticks since boot, `/proc/<pid>/stat` field
/// 22), so a recycled pid is not mistaken for the live owner.
pub const LABEL_OWNER_START: &str = "smithers.owner_start";
/// Label holding the host directory with the sandbox's writable layer (for orphan cleanup).
pub const LABEL_STATE_DIR: &str = "smithers.state_dir";

/// Where the project appears inside the container.
pub const WORKSPACE: &str = "/workspace";
/// The step's writable artifacts directory inside the container (same paths as the local
/// runtime: part of the contract with steps).
pub const RESULT_DIR: &str = "/result";
/// The read-only request directory inside the container.
pub const REQUEST_DIR: &str = "/run/smithers/request";
/// The writable directory holding the step's result JSON inside the container.
pub const OUT_DIR: &str = "/run/smithers/out";
/// File name of the request JSON in the request directory.
pub const REQUEST_FILE: &str = "request.json";
/// File name of the step's result JSON in the out directory.
pub const RESULT_FILE: &str = "result.json";

/// Pids cap applied when the step sets none: a fork bomb must never reach the host's limit.
pub const DEFAULT_PIDS_LIMIT: u32 = 1024;
/// Size of the `/tmp` tmpfs when no disk limit is given.
pub const DEFAULT_TMP_BYTES: u64 = 256 << 20;
/// PATH inside the container. Never the host's: host paths mean nothing in the image.
pub const CONTAINER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Everything about one sandbox that later verbs, and another process cleaning up, need.
/// Stored in `SandboxHandle::backend`; holds no secrets (the env stays in memory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendState {
    /// Engine socket the objects live on.
    pub socket: String,
    /// Container name (`smithers-<run>-<sandbox>-<hash>`), also the key of in-memory state.
    pub container_name: String,
    /// Overlay volume name (same as the container name).
    pub volume_name: String,
    /// Image reference as given.
    pub image: String,
    /// `uid:gid` the step runs as.
    pub user: String,
    /// Host directory owned by this sandbox outside the project tree.
    pub state_dir: PathBuf,
    /// Overlay upper directory (the step's changes).
    pub upper: PathBuf,
    /// Overlay work directory.
    pub work: PathBuf,
    /// Whether `state_dir/layer` is a size-capped tmpfs this runtime mounted (disk limit).
    pub layer_tmpfs: bool,
    /// Host directory bound at `/run/smithers/out` (the step's `result.json`).
    pub out_dir: PathBuf,
    /// Host directory bound at `/result` (the step's artifacts).
    pub artifacts_dir: PathBuf,
    /// Whether the project has a `.smithers/` directory to hide.
    pub hide_smithers_dir: bool,
    /// Parent cgroup (relative, `smithers/<name>`) holding the pids limit, when the engine's
    /// cgroupfs driver lets us own one; None: `PidsLimit` on the container itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_cgroup: Option<String>,
}

/// The container name for an entity. The hash of the project root keeps two projects with
/// the same run/sandbox ids apart on one engine. Ids are `[A-Za-z0-9._-]` (validated), which
/// is within Docker's name alphabet.
pub fn object_name(run_id: &str, sandbox_id: &str, root_dir: &Path) -> String {
    format!(
        "smithers-{run_id}-{sandbox_id}-{:08x}",
        fnv1a(root_dir.as_os_str().as_encoded_bytes()) as u32
    )
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Labels of every object of one sandbox.
pub fn labels(
    run_id: &str,
    sandbox_id: &str,
    owner: (u32, u64),
    state_dir: &Path,
) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (LABEL_RUN_ID.to_string(), run_id.to_string()),
        (LABEL_SANDBOX_ID.to_string(), sandbox_id.to_string()),
        (LABEL_OWNER_PID.to_string(), owner.0.to_string()),
        (LABEL_OWNER_START.to_string(), owner.1.to_string()),
        (
            LABEL_STATE_DIR.to_string(),
            state_dir.to_string_lossy().into_owned(),
        ),
    ])
}

/// The local-driver overlay volume: lower = the live project tree, upper/work in the
/// sandbox's state directory outside it. The engine mounts it when the container starts and
/// unmounts it when the container stops, so the host process needs no mount privilege.
///
/// Overlay options are comma separated: a path containing a comma (or a colon, the lowerdir
/// separator) cannot be expressed and is refused by the caller with [`overlay_path_ok`].
pub fn volume_request(
    name: &str,
    lower: &Path,
    upper: &Path,
    work: &Path,
    labels: HashMap<String, String>,
) -> VolumeCreateRequest {
    let o = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    VolumeCreateRequest {
        name: Some(name.to_string()),
        driver: Some("local".to_string()),
        driver_opts: Some(HashMap::from([
            ("type".to_string(), "overlay".to_string()),
            ("device".to_string(), "overlay".to_string()),
            ("o".to_string(), o),
        ])),
        labels: Some(labels),
        ..Default::default()
    }
}

/// Whether a path can appear in overlay mount options.
pub fn overlay_path_ok(p: &Path) -> bool {
    let s = p.as_os_str().as_encoded_bytes();
    !s.iter().any(|b| matches!(b, b',' | b':' | b'\\' | b'\n'))
}

/// Inputs of [`container_body`] besides the controls.
#[derive(Debug, Clone)]
pub struct ContainerPlan<'a> {
    pub state: &'a BackendState,
    pub controls: &'a Controls,
    pub labels: HashMap<String, String>,
    pub argv: &'a [String],
    pub cwd: Option<&'a str>,
    /// Host directory holding the request JSON (bound read-only at `/request`).
    pub request_dir: &'a Path,
    pub run_id: &'a str,
    pub sandbox_id: &'a str,
    /// With an egress policy: the holder container whose network namespace the step joins,
    /// and the directory of the `/etc` files naming our resolver.
    pub egress: Option<EgressPlan<'a>>,
}

/// See [`ContainerPlan::egress`] and the `egress` module.
#[derive(Debug, Clone, Copy)]
pub struct EgressPlan<'a> {
    pub holder: &'a str,
    pub etc_dir: &'a Path,
    /// The secrets' placeholders and the variables naming the run's authority.
    pub secret_env: &'a [(String, String)],
}

/// The environment of the step: nothing from the host but a fixed allowlist of values that
/// make sense inside (PATH, HOME, TMPDIR), the Smithers variables, then the step's own env
/// (which may override PATH/HOME/TMPDIR but not the Smithers paths).
pub fn container_env(plan: &ContainerPlan<'_>) -> Vec<String> {
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), CONTAINER_PATH.into()),
        ("HOME".into(), "/tmp".into()),
        ("TMPDIR".into(), "/tmp".into()),
    ];
    if let Some(egress) = &plan.egress {
        // The proxies' variables and the secrets', under the step's own (which win).
        env.extend(smithers_egress::sandbox::proxy_env(&format!(
            "{REQUEST_DIR}/{}",
            smithers_egress::sandbox::DENIALS_FILE
        )));
        env.extend(egress.secret_env.iter().cloned());
    }
    for (k, v) in &plan.controls.env {
        if let Some(slot) = env.iter_mut().find(|(ek, _)| ek == k) {
            slot.1 = v.clone();
        } else {
            env.push((k.clone(), v.clone()));
        }
    }
    let fixed = [
        (
            "SMITHERS_SANDBOX_REQUEST_PATH",
            format!("{REQUEST_DIR}/{REQUEST_FILE}"),
        ),
        (
            "SMITHERS_SANDBOX_RESULT_PATH",
            format!("{OUT_DIR}/{RESULT_FILE}"),
        ),
        ("SMITHERS_SANDBOX_ID", plan.sandbox_id.to_string()),
        ("SMITHERS_RUN_ID", plan.run_id.to_string()),
        ("SMITHERS_RUNTIME", "docker".to_string()),
    ];
    env.retain(|(k, _)| !fixed.iter().any(|(f, _)| f == k));
    env.extend(fixed.into_iter().map(|(k, v)| (k.to_string(), v)));
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

fn tmpfs(target: &str, size: u64, mode: i64, read_only: bool) -> Mount {
    Mount {
        target: Some(target.to_string()),
        typ: Some(MountType::TMPFS),
        read_only: Some(read_only),
        tmpfs_options: Some(MountTmpfsOptions {
            size_bytes: Some(size as i64),
            mode: Some(mode),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn bind(source: &Path, target: &str, read_only: bool) -> Mount {
    Mount {
        target: Some(target.to_string()),
        source: Some(source.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(read_only),
        ..Default::default()
    }
}

/// The container for one `execute`. Security posture, each field deliberate:
/// no network unless allowed, every capability dropped, `no-new-privileges`, read-only root
/// filesystem, a size-capped `/tmp`, an init as pid 1 (reaps orphans, forwards signals), a
/// pids cap always, memory without extra swap, the host env never copied.
pub fn container_body(plan: &ContainerPlan<'_>) -> ContainerCreateBody {
    let c = plan.controls;
    let st = plan.state;
    let mut mounts = vec![
        Mount {
            target: Some(WORKSPACE.to_string()),
            source: Some(st.volume_name.clone()),
            typ: Some(MountType::VOLUME),
            read_only: Some(false),
            volume_options: Some(MountVolumeOptions {
                // Never copy the image's /workspace into the volume: that would land in the
                // upper layer and come back as patches the step never made.
                no_copy: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        },
        bind(&st.artifacts_dir, RESULT_DIR, false),
        bind(&st.out_dir, OUT_DIR, false),
        bind(plan.request_dir, REQUEST_DIR, true),
        tmpfs(
            "/tmp",
            c.disk_limit_bytes.unwrap_or(DEFAULT_TMP_BYTES),
            0o1777,
            false,
        ),
    ];
    if st.hide_smithers_dir {
        // The project's own state (database, other sandboxes' bundles) must not be visible:
        // an empty read-only tmpfs covers it.
        mounts.push(tmpfs(&format!("{WORKSPACE}/.smithers"), 4096, 0o555, true));
    }
    for v in &c.volumes {
        mounts.push(bind(&v.host, &v.container.to_string_lossy(), v.readonly));
    }
    if let Some(e) = &plan.egress {
        for name in ["resolv.conf", "hosts"] {
            mounts.push(bind(&e.etc_dir.join(name), &format!("/etc/{name}"), true));
        }
    }

    let mut port_bindings: HashMap<String, Option<Vec<PortBinding>>> = HashMap::new();
    let mut exposed: Vec<String> = Vec::new();
    for p in &c.ports {
        let key = format!("{}/tcp", p.container);
        exposed.push(key.clone());
        port_bindings
            .entry(key)
            .or_insert_with(|| Some(Vec::new()))
            .get_or_insert_with(Vec::new)
            .push(PortBinding {
                host_ip: Some("127.0.0.1".to_string()),
                host_port: Some(p.host.to_string()),
            });
    }

    let memory = c.memory_limit_bytes.map(|m| m.min(i64::MAX as u64) as i64);
    let host_config = HostConfig {
        network_mode: Some(match (&plan.egress, c.allow_network) {
            (Some(e), _) => format!("container:{}", e.holder),
            (None, true) => "bridge".to_string(),
            (None, false) => "none".to_string(),
        }),
        port_bindings: (!port_bindings.is_empty()).then_some(port_bindings),
        memory,
        // Swap equal to memory = no swap on top: the limit is the limit.
        memory_swap: memory,
        nano_cpus: c.cpu_limit.map(|cpu| (cpu * 1e9).round() as i64),
        // With our own parent cgroup the limit lives there (see cgroup.rs); otherwise here.
        cgroup_parent: st.pids_cgroup.as_ref().map(|p| format!("/{p}")),
        pids_limit: match st.pids_cgroup {
            Some(_) => None,
            None => Some(i64::from(c.pids_limit.unwrap_or(DEFAULT_PIDS_LIMIT))),
        },
        cap_drop: Some(vec!["ALL".to_string()]),
        cap_add: None,
        security_opt: Some(vec![
            "no-new-privileges:true".to_string(),
            format!("seccomp={}", seccomp_profile()),
        ]),
        readonly_rootfs: Some(true),
        init: Some(true),
        privileged: Some(false),
        ipc_mode: Some("private".to_string()),
        mounts: Some(mounts),
        auto_remove: Some(false),
        // The log driver would duplicate the output we already stream and cap.
        log_config: Some(bollard::models::HostConfigLogConfig {
            typ: Some("none".to_string()),
            config: None,
        }),
        ..Default::default()
    };

    let (entrypoint, cmd) = match plan.argv.split_first() {
        Some((first, rest)) => (vec![first.clone()], rest.to_vec()),
        None => (Vec::new(), Vec::new()),
    };
    ContainerCreateBody {
        image: Some(st.image.clone()),
        // The argv is run as given: the image's entrypoint must not wrap it.
        entrypoint: Some(entrypoint),
        cmd: Some(cmd),
        env: Some(container_env(plan)),
        user: Some(st.user.clone()),
        working_dir: Some(plan.cwd.unwrap_or(WORKSPACE).to_string()),
        labels: Some(plan.labels.clone()),
        attach_stdin: Some(false),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        open_stdin: Some(false),
        tty: Some(false),
        // Disabled networking gives a container a fresh empty namespace whatever its mode:
        // a step joining its holder's namespace must not have it.
        network_disabled: Some(!c.allow_network && plan.egress.is_none()),
        exposed_ports: (!exposed.is_empty()).then_some(exposed),
        host_config: Some(host_config),
        ..Default::default()
    }
}

/// Syscalls refused with EPERM. The engine's default profile allows `ptrace` and
/// `process_vm_*` within the container (kernel >= 4.8), which lets the step inspect and steer
/// the container's init; ours refuses those too. Everything else follows the engine default's
/// deny set (kernel modules, mounts, namespaces, keyrings, bpf, perf, clock, reboot, ...).
/// Unknown names (newer than the engine's libseccomp) are skipped by the engine.
pub const SECCOMP_DENY: &[&str] = &[
    "acct",
    "add_key",
    "bpf",
    "chroot",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "fanotify_init",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "init_module",
    "io_uring_enter",
    "io_uring_register",
    "io_uring_setup",
    "ioperm",
    "iopl",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "mount_setattr",
    "move_mount",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    "query_module",
    "quotactl",
    "quotactl_fd",
    "reboot",
    "request_key",
    "setns",
    "settimeofday",
    "stime",
    "swapoff",
    "swapon",
    "syslog",
    "sysfs",
    "_sysctl",
    "umount",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "ustat",
    "vm86",
    "vm86old",
];

/// Namespace flags `clone` may not carry (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER,
/// NEWPID, NEWNET): an unprivileged user namespace would hand the step a fresh set of
/// capabilities to attack the kernel with.
const CLONE_NS_FLAGS: &[u64] = &[
    0x0002_0000,
    0x0200_0000,
    0x0400_0000,
    0x0800_0000,
    0x1000_0000,
    0x2000_0000,
    0x4000_0000,
];

/// The seccomp profile (the engine's JSON format): allow by default, refuse [`SECCOMP_DENY`],
/// namespace flags on `clone`, and `clone3` with ENOSYS so libc falls back to `clone`, whose
/// flags a filter can see.
pub fn seccomp_profile() -> String {
    let mut rules = vec![
        serde_json::json!({"names": SECCOMP_DENY, "action": "SCMP_ACT_ERRNO", "errnoRet": 1}),
        serde_json::json!({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}),
    ];
    for flag in CLONE_NS_FLAGS {
        rules.push(serde_json::json!({
            "names": ["clone"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": 1,
            "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}],
        }));
    }
    serde_json::json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": rules,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use smithers_runtime::{PortMapping, VolumeMount};

    fn state() -> BackendState {
        BackendState {
            socket: "/var/run/docker.sock".into(),
            container_name: "smithers-r-s-0".into(),
            volume_name: "smithers-r-s-0".into(),
            image: "img".into(),
            user: "1000:1000".into(),
            state_dir: "/state".into(),
            upper: "/state/layer/upper".into(),
            work: "/state/layer/work".into(),
            layer_tmpfs: false,
            out_dir: "/state/out".into(),
            artifacts_dir: "/state/artifacts".into(),
            hide_smithers_dir: true,
            pids_cgroup: None,
        }
    }

    fn body(c: &Controls) -> ContainerCreateBody {
        let st = state();
        let argv = vec!["sh".to_string(), "-c".to_string(), "true".to_string()];
        let plan = ContainerPlan {
            egress: None,
            state: &st,
            controls: c,
            labels: labels("r", "s", (1, 2), Path::new("/state")),
            argv: &argv,
            cwd: None,
            request_dir: Path::new("/p/.smithers/sandboxes/r/s/request"),
            run_id: "r",
            sandbox_id: "s",
        };
        container_body(&plan)
    }

    #[test]
    fn default_posture_is_closed() {
        let b = body(&Controls::default());
        let h = b.host_config.unwrap();
        assert_eq!(h.network_mode.as_deref(), Some("none"));
        assert_eq!(b.network_disabled, Some(true));
        assert_eq!(h.cap_drop, Some(vec!["ALL".to_string()]));
        assert!(h.cap_add.is_none());
        let sec = h.security_opt.unwrap();
        assert_eq!(sec[0], "no-new-privileges:true");
        let profile: serde_json::Value =
            serde_json::from_str(sec[1].strip_prefix("seccomp=").unwrap()).unwrap();
        assert!(profile["syscalls"][0]["names"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("ptrace")));
        assert_eq!(h.readonly_rootfs, Some(true));
        assert_eq!(h.init, Some(true));
        assert_eq!(h.pids_limit, Some(i64::from(DEFAULT_PIDS_LIMIT)));
        assert!(h.port_bindings.is_none());
        let mounts = h.mounts.unwrap();
        let ws = mounts
            .iter()
            .find(|m| m.target.as_deref() == Some(WORKSPACE))
            .unwrap();
        assert_eq!(ws.typ, Some(MountType::VOLUME));
        assert_eq!(ws.volume_options.as_ref().unwrap().no_copy, Some(true));
        let req = mounts
            .iter()
            .find(|m| m.target.as_deref() == Some(REQUEST_DIR))
            .unwrap();
        assert_eq!(req.read_only, Some(true));
        let hidden = mounts
            .iter()
            .find(|m| m.target.as_deref() == Some("/workspace/.smithers"))
            .unwrap();
        assert_eq!(hidden.typ, Some(MountType::TMPFS));
        assert_eq!(b.entrypoint, Some(vec!["sh".to_string()]));
        assert_eq!(b.cmd, Some(vec!["-c".to_string(), "true".to_string()]));
        assert_eq!(b.working_dir.as_deref(), Some(WORKSPACE));
    }

    #[test]
    fn env_has_no_host_leak_and_fixed_paths_win() {
        // SAFETY-free check: a host variable must not appear, whatever the host has.
        let mut c = Controls::default();
        c.env.insert("FOO".into(), "bar".into());
        c.env.insert("PATH".into(), "/custom".into());
        c.env
            .insert("SMITHERS_SANDBOX_RESULT_PATH".into(), "/etc/x".into());
        let env = body(&c).env.unwrap();
        assert!(env.contains(&"FOO=bar".to_string()));
        assert!(env.contains(&"PATH=/custom".to_string()));
        assert!(
            env.contains(&"SMITHERS_SANDBOX_RESULT_PATH=/run/smithers/out/result.json".to_string())
        );
        assert!(!env
            .iter()
            .any(|e| e == "SMITHERS_SANDBOX_RESULT_PATH=/etc/x"));
        let names: Vec<&str> = env.iter().map(|e| e.split('=').next().unwrap()).collect();
        for n in &names {
            assert!(
                matches!(
                    *n,
                    "PATH"
                        | "HOME"
                        | "TMPDIR"
                        | "FOO"
                        | "SMITHERS_SANDBOX_REQUEST_PATH"
                        | "SMITHERS_SANDBOX_RESULT_PATH"
                        | "SMITHERS_SANDBOX_ID"
                        | "SMITHERS_RUN_ID"
                        | "SMITHERS_RUNTIME"
                ),
                "unexpected variable {n}"
            );
        }
    }

    #[test]
    fn limits_translate() {
        let c = Controls {
            memory_limit_bytes: Some(64 << 20),
            cpu_limit: Some(0.5),
            pids_limit: Some(20),
            disk_limit_bytes: Some(8 << 20),
            allow_network: true,
            ports: vec![PortMapping {
                host: 18080,
                container: 80,
            }],
            volumes: vec![VolumeMount {
                host: "/data".into(),
                container: "/data".into(),
                readonly: true,
            }],
            ..Controls::default()
        };
        let b = body(&c);
        let h = b.host_config.unwrap();
        assert_eq!(h.memory, Some(64 << 20));
        assert_eq!(h.memory_swap, Some(64 << 20));
        assert_eq!(h.nano_cpus, Some(500_000_000));
        assert_eq!(h.pids_limit, Some(20));
        assert_eq!(h.network_mode.as_deref(), Some("bridge"));
        let pb = h.port_bindings.unwrap();
        let binding = &pb["80/tcp"].as_ref().unwrap()[0];
        assert_eq!(binding.host_port.as_deref(), Some("18080"));
        assert_eq!(binding.host_ip.as_deref(), Some("127.0.0.1"));
        let mounts = h.mounts.unwrap();
        let tmp = mounts
            .iter()
            .find(|m| m.target.as_deref() == Some("/tmp"))
            .unwrap();
        assert_eq!(
            tmp.tmpfs_options.as_ref().unwrap().size_bytes,
            Some(8 << 20)
        );
        let data = mounts
            .iter()
            .find(|m| m.target.as_deref() == Some("/data"))
            .unwrap();
        assert_eq!(data.read_only, Some(true));
    }

    #[test]
    fn names_and_overlay_paths() {
        let a = object_name("r", "s", Path::new("/p1"));
        let b = object_name("r", "s", Path::new("/p2"));
        assert_ne!(a, b);
        assert!(a.starts_with("smithers-r-s-"));
        assert!(overlay_path_ok(Path::new("/tmp/x y")));
        assert!(!overlay_path_ok(Path::new("/tmp/a,b")));
        assert!(!overlay_path_ok(Path::new("/tmp/a:b")));
        let v = volume_request(
            "n",
            Path::new("/l"),
            Path::new("/u"),
            Path::new("/w"),
            HashMap::new(),
        );
        assert_eq!(
            v.driver_opts.unwrap()["o"],
            "lowerdir=/l,upperdir=/u,workdir=/w"
        );
    }
}
