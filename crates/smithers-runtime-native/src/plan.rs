//! The sandbox policy compiled **purely** into a plan: the mount list, the environment, the
//! Landlock rules and the seccomp program. Nothing here touches the system, so every rule is
//! unit-tested without root; the in-sandbox init (`smithers-sandbox-init`, which owns the plan's
//! types, re-exported here) only executes the plan.
//!
//! The plan travels to the init as one line of JSON over its stdin socket.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use smithers_sandbox_init::plan::{
    BpfInstruction, CgroupJoin, ExecSpec, InitPlan, LandlockPlan, MountAttrs, MountOp, Prelude,
    ProbeInput, RootFs, TargetKind, WarmPlan, PLAN_VERSION, ROOT_TMPFS_BYTES,
};

/// Where the sandbox sees things. Part of the contract with steps.
pub mod paths {
    /// The copy-on-write view of the project (and the command's default cwd).
    pub const WORKSPACE: &str = "/workspace";
    /// Writable artifacts directory, collected into the bundle's `artifacts/`.
    pub const RESULT: &str = "/result";
    /// Read-only directory holding `request.json`.
    pub const REQUEST_DIR: &str = "/run/smithers/request";
    /// `$SMITHERS_SANDBOX_REQUEST_PATH`.
    pub const REQUEST_FILE: &str = "/run/smithers/request/request.json";
    /// Writable directory holding the step's `result.json`.
    pub const OUT_DIR: &str = "/run/smithers/out";
    /// `$SMITHERS_SANDBOX_RESULT_PATH`.
    pub const RESULT_FILE: &str = "/run/smithers/out/result.json";
    /// The FIFO the command's stdin is opened from when the caller gave one (in the
    /// read-only request directory; a FIFO's data is not a write to its file system).
    pub const STDIN_FIFO: &str = "/run/smithers/request/stdin";
    /// The step's `$HOME`: a writable tmpfs of its own, empty at every sandbox's start, where
    /// tools keep their caches and settings (`~/.cache`, `~/.cargo`, `~/.npm`).
    pub const HOME: &str = "/home/sandbox";
}

/// File name of the request JSON inside the handle's `request_path` (and of its copy in the
/// sandbox's request directory, which the sandbox sees at [`paths::REQUEST_DIR`]).
pub const REQUEST_FILE_NAME: &str = "request.json";
/// File name of the result JSON inside the host out directory.
pub const RESULT_FILE_NAME: &str = "result.json";

/// System directories bound read-only into the new root when they exist on the host.
pub const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32",
];

/// The `/etc` entries a step may need (users, name resolution, dynamic linker, TLS roots,
/// alternatives, time zone). Everything else in `/etc` (shadow, sudoers, ssh keys, machine
/// credentials) stays invisible.
pub const ETC_ALLOWLIST: &[&str] = &[
    "passwd",
    "group",
    "hosts",
    "host.conf",
    "resolv.conf",
    "nsswitch.conf",
    "gai.conf",
    "protocols",
    "services",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "crypto-policies",
    "alternatives",
    "localtime",
    "timezone",
    "os-release",
    "gitconfig",
];

/// Largest `/etc` file copied into the sandbox (ld.so.cache is the big one, ~100 KiB).
pub const ETC_COPY_MAX_BYTES: u64 = 4 << 20;

/// Host device nodes bound into the sandbox's `/dev`. No disks, no `/dev/mem`, no `kmsg`.
pub const DEV_NODES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Host environment variables that may pass into the sandbox (values copied when set).
pub const ENV_PASSTHROUGH: &[&str] = &["LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ"];

/// `PATH` when the step does not set one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Default size cap of the sandbox's `/tmp` (and `/dev/shm`) when no disk limit is given.
pub const DEFAULT_TMP_BYTES: u64 = 512 << 20;

/// Splits a plan compiled with [`PlanInput::prepared_root`] into what a prepared root holds
/// (the file operations) and what the init still does (the mounts, whose mount points the
/// prepared root holds too: see [`MountOp::mount_point`]).
pub fn split_prepared(ops: Vec<MountOp>) -> (Vec<MountOp>, Vec<MountOp>) {
    ops.into_iter().partition(MountOp::is_file_op)
}

/// Splits a prepared root's mounts (see [`split_prepared`]) into what a warm sandbox builds
/// before any step is known (everything up to the workspace: system directories, `/etc`,
/// `/proc`, `/dev`, `/tmp`, `$HOME`) and the rest, the step's own (the workspace and what
/// follows it). See [`smithers_sandbox_init::plan::WarmPlan`]. The split is by position: the
/// mount list puts every op that depends on the step after the workspace (a test holds it to
/// that).
pub fn split_warm(mut mounts: Vec<MountOp>) -> (Vec<MountOp>, Vec<MountOp>) {
    let at = mounts
        .iter()
        .position(|op| match op {
            MountOp::Overlay { path, .. } | MountOp::Bind { path, .. } => {
                path == Path::new(paths::WORKSPACE)
            }
            _ => false,
        })
        .unwrap_or(mounts.len());
    let rest = mounts.split_off(at);
    (mounts, rest)
}

/// What the host looks like at a path, as far as the plan cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEntry {
    Dir,
    File,
    Symlink(PathBuf),
}

/// The host facts the plan depends on, gathered once per runtime (see [`HostFacts::gather`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// System directories and `/etc` entries that exist, by absolute host path.
    pub entries: BTreeMap<PathBuf, HostEntry>,
}

impl HostFacts {
    /// lstat()s the system directories, the `/etc` allowlist and the device nodes.
    pub fn gather() -> HostFacts {
        let mut entries = BTreeMap::new();
        let candidates = SYSTEM_DIRS
            .iter()
            .map(PathBuf::from)
            .chain(ETC_ALLOWLIST.iter().map(|e| Path::new("/etc").join(e)))
            .chain(DEV_NODES.iter().map(|d| Path::new("/dev").join(d)));
        for path in candidates {
            if let Some(entry) = host_entry(&path) {
                entries.insert(path, entry);
            }
        }
        HostFacts { entries }
    }
}

/// lstat() one path into a [`HostEntry`] (None when missing or of another kind).
pub fn host_entry(path: &Path) -> Option<HostEntry> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        std::fs::read_link(path).ok().map(HostEntry::Symlink)
    } else if ft.is_dir() {
        Some(HostEntry::Dir)
    } else {
        // Regular files and device nodes are both bound onto an empty file.
        Some(HostEntry::File)
    }
}

/// Host directories of one sandbox (all outside the project tree).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLayout {
    /// The project: the overlay's lower layer (or, in copy mode, what the copy is compared
    /// with; its `.git` is bound read-only into the copy).
    pub root_dir: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    /// Copy mode: the copy of the project bound read-write at /workspace instead of the
    /// overlay.
    pub workspace_copy: Option<PathBuf>,
    /// Mount point of the new root's tmpfs.
    pub new_root: PathBuf,
    /// Bound writable at `/result`.
    pub artifacts: PathBuf,
    /// Bound writable at `/run/smithers/out`.
    pub out: PathBuf,
    /// Bound read-only at `/run/smithers/request`.
    pub request: PathBuf,
}

/// The overlay over a worktree's common git directory (see [`PlanInput::git_common`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitCommonLayer {
    pub common: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    /// A project below its repository's top: the project's host path, where the workspace
    /// is shown a second time (and the step starts), so that its git finds the repository
    /// above it (`<top>/.git`, the layer above). `None` for a worktree.
    pub workspace_at: Option<PathBuf>,
}

/// What the project looks like at its top (decided at execute time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkspaceFacts {
    pub has_git_dir: bool,
}

/// The top-level names of the project the step never sees: its `.smithers/` (the runtime's
/// and the CLI's state: the store, other sandboxes' requests and bundles). Absent from
/// `/workspace`, not read-only there, so that `ls -a` does not list it and `git clean -fdx`
/// has nothing it cannot remove: an overlay whiteout in the upper layer
/// ([`MountOp::Overlay`]'s `hide`), and a copy workspace does not copy it (`copy.rs`). What a
/// step makes under that name is its own, and collect leaves it out of the patches, named.
pub const HIDDEN_TOP_LEVEL: &[&str] = &[".smithers"];

/// The policy inputs of one execution.
#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    pub layout: &'a HostLayout,
    pub workspace: WorkspaceFacts,
    pub host: &'a HostFacts,
    pub allow_network: bool,
    /// Size cap of `/tmp` and `/dev/shm`.
    pub tmp_bytes: u64,
    /// Extra binds from the config (already validated: never over /workspace or /result).
    pub volumes: &'a [smithers_runtime::VolumeMount],
    pub argv: &'a [String],
    pub cwd: Option<&'a str>,
    /// The command reads its stdin from [`paths::STDIN_FIFO`] (else `/dev/null`).
    pub stdin: bool,
    /// The project is a git worktree: its repository's common directory (objects, refs),
    /// shown writable at its own path through an overlay with this upper and work directory,
    /// so the step's git can commit there without writing the host's repository.
    pub git_common: Option<GitCommonLayer>,
    /// The step's validated environment.
    pub step_env: &'a BTreeMap<String, String>,
    /// The host's environment, from which only [`ENV_PASSTHROUGH`] is taken.
    pub host_env: &'a BTreeMap<String, String>,
    /// With an egress policy: a directory whose `resolv.conf` and `hosts` are copied to
    /// `/etc` instead of the host's (the runtime's resolver inside the sandbox's namespace,
    /// and no host names that would bypass it).
    pub egress_etc: Option<&'a Path>,
    pub seccomp: Vec<BpfInstruction>,
    /// Plan for a prepared root ([`RootFs::Prepared`]): `/dev` is a directory of the root
    /// (read-only with it) rather than a tmpfs of its own, so that everything but the mounts
    /// can be made once, ahead. The file operations stay in the plan; [`split_prepared`]
    /// takes them out.
    pub prepared_root: bool,
}

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

/// Compiles the mount list (order matters: parents before children, binds before the
/// read-only remount of their parent).
pub fn mount_plan(input: &PlanInput<'_>) -> Vec<MountOp> {
    let mut ops = Vec::new();
    let host = input.host;

    // System directories: merged-/usr hosts have /bin -> usr/bin; a symlink is recreated,
    // never bound, so the link resolves inside the sandbox.
    for dir in SYSTEM_DIRS {
        match host.entries.get(Path::new(dir)) {
            Some(HostEntry::Dir) => ops.push(MountOp::Bind {
                source: p(dir),
                path: p(dir),
                kind: TargetKind::Dir,
                attrs: MountAttrs::RO,
                optional: true,
            }),
            Some(HostEntry::Symlink(target)) => ops.push(MountOp::Symlink {
                path: p(dir),
                target: target.clone(),
            }),
            _ => {}
        }
    }

    // A filtered /etc: a directory on the (later read-only) root tmpfs with selected binds.
    ops.push(MountOp::Dir {
        path: p("/etc"),
        mode: 0o755,
    });
    for name in ETC_ALLOWLIST {
        let host_path = Path::new("/etc").join(name);
        if let (true, Some(ours)) = (*name == "resolv.conf" || *name == "hosts", input.egress_etc) {
            ops.push(MountOp::CopyFile {
                source: ours.join(name),
                path: host_path,
                max_bytes: ETC_COPY_MAX_BYTES,
            });
            continue;
        }
        match host.entries.get(&host_path) {
            Some(HostEntry::Dir) => ops.push(MountOp::Bind {
                source: host_path.clone(),
                path: host_path,
                kind: TargetKind::Dir,
                attrs: MountAttrs::RO,
                optional: true,
            }),
            // Small configuration files are copied: a mount per file costs more than the copy,
            // and the copy lands on the root tmpfs, which becomes read-only.
            Some(HostEntry::File) => ops.push(MountOp::CopyFile {
                source: host_path.clone(),
                path: host_path,
                max_bytes: ETC_COPY_MAX_BYTES,
            }),
            Some(HostEntry::Symlink(target)) => ops.push(MountOp::Symlink {
                path: host_path,
                target: target.clone(),
            }),
            None => {}
        }
    }

    // /proc of the new pid namespace, with the kernel-tunable parts read-only.
    ops.push(MountOp::Proc { path: p("/proc") });
    ops.push(MountOp::Rebind {
        path: p("/proc/sys"),
        attrs: MountAttrs::RO,
        optional: true,
    });
    ops.push(MountOp::Rebind {
        path: p("/proc/sysrq-trigger"),
        attrs: MountAttrs::RO,
        optional: true,
    });

    // A minimal /dev: a tmpfs of its own, read-only once filled, or (prepared root) a
    // directory of the root, read-only with it.
    if !input.prepared_root {
        ops.push(MountOp::Tmpfs {
            path: p("/dev"),
            size_bytes: 64 << 10,
            mode: 0o755,
            attrs: MountAttrs {
                readonly: false,
                nosuid: true,
                nodev: false,
                noexec: true,
            },
        });
    }
    for node in DEV_NODES {
        let host_path = Path::new("/dev").join(node);
        if host.entries.contains_key(&host_path) {
            ops.push(MountOp::Bind {
                source: host_path.clone(),
                path: host_path,
                kind: TargetKind::File,
                attrs: MountAttrs::DEVICE,
                optional: true,
            });
        }
    }
    ops.push(MountOp::Devpts {
        path: p("/dev/pts"),
    });
    ops.push(MountOp::Symlink {
        path: p("/dev/ptmx"),
        target: p("pts/ptmx"),
    });
    ops.push(MountOp::Tmpfs {
        path: p("/dev/shm"),
        size_bytes: input.tmp_bytes,
        mode: 0o1777,
        attrs: MountAttrs::RW,
    });
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        ops.push(MountOp::Symlink {
            path: Path::new("/dev").join(name),
            target: p(target),
        });
    }
    if !input.prepared_root {
        ops.push(MountOp::Setattr {
            path: p("/dev"),
            attrs: MountAttrs {
                readonly: true,
                nosuid: true,
                nodev: false,
                noexec: true,
            },
        });
    }

    // Private /tmp, and a private $HOME (each as large as the disk limit allows, charged
    // to the sandbox's memory cgroup like every tmpfs page it writes).
    ops.push(MountOp::Tmpfs {
        path: p("/tmp"),
        size_bytes: input.tmp_bytes,
        mode: 0o1777,
        attrs: MountAttrs::RW,
    });
    ops.push(MountOp::Tmpfs {
        path: p(paths::HOME),
        size_bytes: input.tmp_bytes,
        mode: 0o700,
        attrs: MountAttrs::RW,
    });

    // The copy-on-write workspace, with the project's own state absent (HIDDEN_TOP_LEVEL).
    // In copy mode the copy is bound instead (it holds no `.smithers`), with a stand-in
    // directory for `.git`: the host's is bound read-only on it (never copied, never
    // writable).
    let layout = input.layout;
    ops.push(match &layout.workspace_copy {
        None => MountOp::Overlay {
            lower: layout.root_dir.clone(),
            upper: layout.upper.clone(),
            work: layout.work.clone(),
            path: p(paths::WORKSPACE),
            attrs: MountAttrs::RW,
            hide: HIDDEN_TOP_LEVEL.iter().map(|n| n.to_string()).collect(),
        },
        Some(copy) => MountOp::Bind {
            source: copy.clone(),
            path: p(paths::WORKSPACE),
            kind: TargetKind::Dir,
            attrs: MountAttrs::RW,
            optional: false,
        },
    });
    if let Some(g) = &input.git_common {
        ops.push(MountOp::Overlay {
            lower: g.common.clone(),
            upper: g.upper.clone(),
            work: g.work.clone(),
            path: g.common.clone(),
            attrs: MountAttrs::RW,
            hide: Vec::new(),
        });
    }
    // The workspace again at the project's host path, below the repository's `.git` layer.
    if let Some(at) = input
        .git_common
        .as_ref()
        .and_then(|g| g.workspace_at.as_ref())
    {
        ops.push(MountOp::Bind {
            source: layout
                .new_root
                .join(paths::WORKSPACE.trim_start_matches('/')),
            path: at.clone(),
            kind: TargetKind::Dir,
            attrs: MountAttrs::RW,
            optional: false,
        });
    }
    // The project's `.git`: in overlay mode part of the copy-on-write view, so the step can
    // stage, commit, branch and stash; what its git writes stays in the layer, is never
    // applied as files (collect leaves `.git` out of the patches) and comes back only as the
    // commits `smithers-git` reads (no hook or config of the step's ever reaches the host).
    // A copy workspace does not copy it: the host's is bound read-only there.
    if input.workspace.has_git_dir && layout.workspace_copy.is_some() {
        ops.push(MountOp::Bind {
            source: layout.root_dir.join(".git"),
            path: Path::new(paths::WORKSPACE).join(".git"),
            kind: TargetKind::Dir,
            attrs: MountAttrs::RO,
            optional: true,
        });
    }

    ops.push(MountOp::Bind {
        source: layout.artifacts.clone(),
        path: p(paths::RESULT),
        kind: TargetKind::Dir,
        attrs: MountAttrs::RW,
        optional: false,
    });
    ops.push(MountOp::Bind {
        source: layout.request.clone(),
        path: p(paths::REQUEST_DIR),
        kind: TargetKind::Dir,
        attrs: MountAttrs::RO,
        optional: false,
    });
    ops.push(MountOp::Bind {
        source: layout.out.clone(),
        path: p(paths::OUT_DIR),
        kind: TargetKind::Dir,
        attrs: MountAttrs::RW,
        optional: false,
    });

    for volume in input.volumes {
        ops.push(MountOp::Bind {
            source: volume.host.clone(),
            path: volume.container.clone(),
            kind: if volume.host.is_dir() {
                TargetKind::Dir
            } else {
                TargetKind::File
            },
            attrs: if volume.readonly {
                MountAttrs::RO
            } else {
                MountAttrs::RW
            },
            optional: false,
        });
    }

    // Last: the root itself read-only, so nothing outside the writable mounts can be created.
    ops.push(MountOp::Setattr {
        path: p("/"),
        attrs: MountAttrs::RO,
    });
    ops
}

/// The environment: cleared, then the allowlist, then the step's env, then ours (which wins).
pub fn environment(
    step_env: &BTreeMap<String, String>,
    host_env: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert("PATH".to_string(), DEFAULT_PATH.to_string());
    env.insert("HOME".to_string(), paths::HOME.to_string());
    env.insert(
        "XDG_CACHE_HOME".to_string(),
        format!("{}/.cache", paths::HOME),
    );
    env.insert("TMPDIR".to_string(), "/tmp".to_string());
    env.insert("LANG".to_string(), "C.UTF-8".to_string());
    env.insert("USER".to_string(), "root".to_string());
    for key in ENV_PASSTHROUGH {
        if let Some(value) = host_env.get(*key) {
            env.insert((*key).to_string(), value.clone());
        }
    }
    for (key, value) in step_env {
        env.insert(key.clone(), value.clone());
    }
    env.insert("SMITHERS_SANDBOX".to_string(), "1".to_string());
    env.insert(
        "SMITHERS_SANDBOX_REQUEST_PATH".to_string(),
        paths::REQUEST_FILE.to_string(),
    );
    env.insert(
        "SMITHERS_SANDBOX_RESULT_PATH".to_string(),
        paths::RESULT_FILE.to_string(),
    );
    env
}

/// Landlock: everything visible is readable; writes only where the step is meant to write.
pub fn landlock_plan(
    volumes: &[smithers_runtime::VolumeMount],
    git_common: Option<&GitCommonLayer>,
) -> LandlockPlan {
    let mut write_dirs = vec![
        p(paths::WORKSPACE),
        p(paths::RESULT),
        p(paths::OUT_DIR),
        p("/tmp"),
        p(paths::HOME),
        p("/dev/shm"),
        p("/dev/pts"),
    ];
    write_dirs.extend(
        volumes
            .iter()
            .filter(|v| !v.readonly)
            .map(|v| v.container.clone()),
    );
    write_dirs.extend(git_common.map(|g| g.common.clone()));
    write_dirs.extend(git_common.and_then(|g| g.workspace_at.clone()));
    LandlockPlan {
        read_dirs: vec![p("/")],
        write_dirs,
        write_files: DEV_NODES
            .iter()
            .map(|d| Path::new("/dev").join(d))
            .collect(),
        scope: true,
    }
}

/// The command's working directory: the caller's, else `/workspace`; for a project below
/// its repository's top, the same place under the project's host path (where its git finds
/// the repository).
fn step_cwd(input: &PlanInput<'_>) -> PathBuf {
    let cwd = input.cwd.map_or_else(|| p(paths::WORKSPACE), PathBuf::from);
    match input
        .git_common
        .as_ref()
        .and_then(|g| g.workspace_at.as_ref())
    {
        Some(at) => match cwd.strip_prefix(paths::WORKSPACE) {
            Ok(rest) => at.join(rest),
            Err(_) => cwd,
        },
        None => cwd,
    }
}

/// The whole plan for one execution.
pub fn compile(input: &PlanInput<'_>) -> InitPlan {
    let mut env = environment(input.step_env, input.host_env);
    if input
        .git_common
        .as_ref()
        .is_some_and(|g| g.workspace_at.is_some())
    {
        // The project's host path is a mount of its own, below the repository's `.git`
        // layer: git's discovery must cross that boundary to find it.
        env.entry("GIT_DISCOVERY_ACROSS_FILESYSTEM".to_string())
            .or_insert_with(|| "1".to_string());
    }
    let search_path = env
        .get("PATH")
        .cloned()
        .unwrap_or_else(|| DEFAULT_PATH.to_string());
    InitPlan {
        version: PLAN_VERSION,
        hostname: "smithers-sandbox".to_string(),
        new_root: input.layout.new_root.clone(),
        root: RootFs::Tmpfs,
        mounts: mount_plan(input),
        landlock: landlock_plan(input.volumes, input.git_common.as_ref()),
        seccomp: input.seccomp.clone(),
        exec: ExecSpec {
            argv: input.argv.to_vec(),
            env: env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            cwd: step_cwd(input),
            search_path,
            stdin: input.stdin.then(|| p(paths::STDIN_FIFO)),
        },
        exec_follows: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> HostFacts {
        let mut entries = BTreeMap::new();
        entries.insert(p("/usr"), HostEntry::Dir);
        entries.insert(p("/bin"), HostEntry::Symlink(p("usr/bin")));
        entries.insert(p("/lib64"), HostEntry::Dir);
        entries.insert(p("/etc/passwd"), HostEntry::File);
        entries.insert(p("/etc/ssl"), HostEntry::Dir);
        entries.insert(
            p("/etc/localtime"),
            HostEntry::Symlink(p("/usr/share/zoneinfo/UTC")),
        );
        entries.insert(p("/dev/null"), HostEntry::File);
        entries.insert(p("/dev/urandom"), HostEntry::File);
        HostFacts { entries }
    }

    fn layout() -> HostLayout {
        HostLayout {
            root_dir: p("/home/u/project"),
            upper: p("/state/s1/layer/upper"),
            work: p("/state/s1/layer/work"),
            workspace_copy: None,
            new_root: p("/state/s1/root"),
            artifacts: p("/state/s1/artifacts"),
            out: p("/state/s1/out"),
            request: p("/home/u/project/.smithers/sandboxes/r/s/request"),
        }
    }

    fn plan_with(workspace: WorkspaceFacts, allow_network: bool) -> InitPlan {
        plan_with_layout(layout(), workspace, allow_network)
    }

    fn plan_with_layout(
        layout: HostLayout,
        workspace: WorkspaceFacts,
        allow_network: bool,
    ) -> InitPlan {
        plan_for_root(layout, workspace, allow_network, false)
    }

    fn plan_for_root(
        layout: HostLayout,
        workspace: WorkspaceFacts,
        allow_network: bool,
        prepared_root: bool,
    ) -> InitPlan {
        let host = facts();
        let step_env: BTreeMap<String, String> = [
            ("FOO".to_string(), "bar".to_string()),
            ("PATH".to_string(), "/x".to_string()),
        ]
        .into();
        let host_env: BTreeMap<String, String> = [
            ("TERM".to_string(), "xterm".to_string()),
            ("AWS_SECRET_ACCESS_KEY".to_string(), "s3cr3t".to_string()),
            ("HOME".to_string(), "/root".to_string()),
        ]
        .into();
        let argv = vec!["echo".to_string(), "hi".to_string()];
        compile(&PlanInput {
            stdin: false,
            git_common: None,
            layout: &layout,
            workspace,
            host: &host,
            allow_network,
            tmp_bytes: 1 << 20,
            volumes: &[],
            argv: &argv,
            cwd: None,
            step_env: &step_env,
            host_env: &host_env,
            egress_etc: None,
            seccomp: vec![],
            prepared_root,
        })
    }

    fn binds(plan: &InitPlan) -> Vec<(&Path, &Path, MountAttrs)> {
        plan.mounts
            .iter()
            .filter_map(|m| match m {
                MountOp::Bind {
                    source,
                    path,
                    attrs,
                    ..
                } => Some((source.as_path(), path.as_path(), *attrs)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn system_dirs_are_read_only_and_symlinks_recreated() {
        let plan = plan_with(WorkspaceFacts::default(), false);
        let b = binds(&plan);
        assert!(b.contains(&(Path::new("/usr"), Path::new("/usr"), MountAttrs::RO)));
        assert!(b.contains(&(Path::new("/lib64"), Path::new("/lib64"), MountAttrs::RO)));
        assert!(!b.iter().any(|(s, _, _)| *s == Path::new("/bin")));
        assert!(plan.mounts.contains(&MountOp::Symlink {
            path: p("/bin"),
            target: p("usr/bin")
        }));
    }

    #[test]
    fn etc_is_filtered_and_secrets_never_bound() {
        let plan = plan_with(WorkspaceFacts::default(), false);
        let mut sources: Vec<&Path> = binds(&plan).iter().map(|(s, _, _)| *s).collect();
        sources.extend(plan.mounts.iter().filter_map(|m| match m {
            MountOp::CopyFile { source, .. } => Some(source.as_path()),
            _ => None,
        }));
        assert!(sources.contains(&Path::new("/etc/passwd")));
        assert!(sources.contains(&Path::new("/etc/ssl")));
        for secret in [
            "/etc/shadow",
            "/etc",
            "/root",
            "/home",
            "/home/u",
            "/",
            "/etc/sudoers",
        ] {
            assert!(!sources.contains(&Path::new(secret)), "{secret} bound");
        }
        assert!(!ETC_ALLOWLIST.contains(&"shadow"));
        assert!(!ETC_ALLOWLIST.contains(&"gshadow"));
        // Only the project (as overlay lower layer), the request dir and our state are
        // visible from the project's tree.
        assert!(!sources.iter().any(|s| s.starts_with("/home/u/project")
            && !s.starts_with("/home/u/project/.smithers/sandboxes/r/s/request")));
    }

    #[test]
    fn dev_is_minimal() {
        let plan = plan_with(WorkspaceFacts::default(), false);
        let dev: Vec<&Path> = binds(&plan)
            .iter()
            .filter(|(_, t, _)| t.starts_with("/dev"))
            .map(|(_, t, _)| *t)
            .collect();
        assert_eq!(dev, vec![Path::new("/dev/null"), Path::new("/dev/urandom")]);
        for (_, t, attrs) in binds(&plan) {
            if t.starts_with("/dev") {
                assert!(!attrs.nodev);
            } else {
                assert!(attrs.nodev, "{} allows devices", t.display());
            }
        }
    }

    #[test]
    fn workspace_is_an_overlay_with_state_hidden_and_git_writable_in_it() {
        let plan = plan_with(WorkspaceFacts { has_git_dir: true }, false);
        let overlay = plan
            .mounts
            .iter()
            .position(
                |m| matches!(m, MountOp::Overlay { path, .. } if path == Path::new("/workspace")),
            )
            .expect("overlay");
        // `.git` is part of the copy-on-write view (the step may commit): no mount over it,
        // and none over `.smithers` either (absent from the view, not masked).
        assert!(!plan.mounts.iter().any(|m| matches!(m,
            MountOp::Rebind { path, .. } | MountOp::Bind { path, .. } | MountOp::Tmpfs { path, .. }
                if path.starts_with("/workspace/.git") || path.starts_with("/workspace/.smithers"))));
        // upper/work are not inside the project; `.smithers` is whited out in the upper.
        let MountOp::Overlay {
            lower,
            upper,
            work,
            hide,
            ..
        } = &plan.mounts[overlay]
        else {
            unreachable!()
        };
        assert!(!upper.starts_with(lower) && !work.starts_with(lower));
        assert_eq!(hide, &vec![".smithers".to_string()]);
    }

    #[test]
    fn copy_mode_binds_the_copy_and_the_host_git_read_only() {
        let copy = p("/state/s1/layer/copy");
        let plan = plan_with_layout(
            HostLayout {
                workspace_copy: Some(copy.clone()),
                ..layout()
            },
            WorkspaceFacts { has_git_dir: true },
            false,
        );
        assert!(!plan
            .mounts
            .iter()
            .any(|m| matches!(m, MountOp::Overlay { .. })));
        let ws = plan
            .mounts
            .iter()
            .position(|m| {
                matches!(m, MountOp::Bind { source, path, attrs, optional: false, .. }
                    if source == &copy && path == Path::new("/workspace") && !attrs.readonly && attrs.nosuid && attrs.nodev)
            })
            .expect("the copy bound read-write at /workspace");
        // The copy holds no `.smithers`: nothing is mounted for it.
        assert!(!plan.mounts.iter().any(|m| matches!(m,
            MountOp::Rebind { path, .. } | MountOp::Bind { path, .. } | MountOp::Tmpfs { path, .. }
                if path.starts_with("/workspace/.smithers"))));
        let git = plan
            .mounts
            .iter()
            .position(|m| {
                matches!(m, MountOp::Bind { source, path, attrs, .. }
                    if source == Path::new("/home/u/project/.git") && path == Path::new("/workspace/.git") && attrs.readonly)
            })
            .expect("the host's .git bound read-only");
        assert!(ws < git);
    }

    #[test]
    fn root_is_made_read_only_last() {
        let plan = plan_with(WorkspaceFacts::default(), false);
        assert_eq!(
            plan.mounts.last(),
            Some(&MountOp::Setattr {
                path: p("/"),
                attrs: MountAttrs::RO
            })
        );
    }

    #[test]
    fn a_prepared_root_holds_what_the_tmpfs_root_is_built_with() {
        let tmpfs = plan_with(WorkspaceFacts::default(), false);
        let prepared = plan_for_root(layout(), WorkspaceFacts::default(), false, true);
        // The only difference: /dev is no tmpfs of its own (and so needs no read-only
        // remount); it is read-only with the root.
        let without_dev_mount: Vec<MountOp> = tmpfs
            .mounts
            .iter()
            .filter(|m| {
                !matches!(m, MountOp::Tmpfs { path, .. } | MountOp::Setattr { path, .. }
                    if path == Path::new("/dev"))
            })
            .cloned()
            .collect();
        assert_eq!(prepared.mounts, without_dev_mount);
        assert_eq!(prepared.mounts.last(), tmpfs.mounts.last());

        let (files, mounts) = split_prepared(prepared.mounts.clone());
        assert!(files.iter().any(
            |m| matches!(m, MountOp::CopyFile { path, .. } if path == Path::new("/etc/passwd"))
        ));
        assert!(mounts.iter().any(|m| matches!(m, MountOp::Overlay { .. })));
        // Nothing the init mounts lies at or below a symlink or a copied file of the prepared
        // root: making its mount point would fail there, or go through the link.
        let leaves: Vec<&Path> = files
            .iter()
            .filter_map(|m| match m {
                MountOp::Symlink { path, .. } | MountOp::CopyFile { path, .. } => Some(&**path),
                _ => None,
            })
            .collect();
        assert!(leaves.contains(&Path::new("/bin")), "{leaves:?}");
        for m in &mounts {
            if let Some((path, kind, _)) = m.mount_point() {
                assert!(
                    !leaves.iter().any(|leaf| path.starts_with(leaf)),
                    "{} is at or below a link or a copied file",
                    path.display()
                );
                assert!(path.is_absolute() && path != Path::new("/"));
                if path.starts_with("/dev") {
                    assert!(
                        kind == TargetKind::File
                            || path == Path::new("/dev/pts")
                            || path == Path::new("/dev/shm")
                    );
                }
            }
        }
    }

    #[test]
    fn environment_is_an_allowlist() {
        let plan = plan_with(WorkspaceFacts::default(), false);
        let env = &plan.exec.env;
        assert!(env.contains(&"FOO=bar".to_string()));
        assert!(env.contains(&"TERM=xterm".to_string()));
        assert!(env.contains(&"HOME=/home/sandbox".to_string()));
        assert!(env.contains(&"PATH=/x".to_string()));
        assert_eq!(plan.exec.search_path, "/x");
        assert!(env.contains(&format!(
            "SMITHERS_SANDBOX_REQUEST_PATH={}",
            paths::REQUEST_FILE
        )));
        assert!(!env
            .iter()
            .any(|e| e.contains("s3cr3t") || e == "HOME=/root"));
        assert_eq!(plan.exec.cwd, p("/workspace"));
    }

    #[test]
    fn step_env_cannot_override_sandbox_paths() {
        let mut step_env = BTreeMap::new();
        step_env.insert(
            "SMITHERS_SANDBOX_RESULT_PATH".to_string(),
            "/etc/passwd".to_string(),
        );
        let env = environment(&step_env, &BTreeMap::new());
        assert_eq!(env["SMITHERS_SANDBOX_RESULT_PATH"], paths::RESULT_FILE);
    }

    #[test]
    fn network_is_the_namespace_and_landlock_scopes_only_files() {
        let closed = plan_with(WorkspaceFacts::default(), false);
        assert!(Prelude::new(1000, 1000, CgroupJoin::default(), false).unshare_net);
        let open = plan_with(WorkspaceFacts::default(), true);
        assert!(!Prelude::new(1000, 1000, CgroupJoin::default(), true).unshare_net);
        // Without the network the boundary is the namespace: no Landlock network rule, which
        // would deny TCP on the sandbox's own loopback.
        for plan in [&closed, &open] {
            let ruleset = serde_json::to_value(&plan.landlock).unwrap().to_string();
            assert!(!ruleset.to_ascii_lowercase().contains("tcp"), "{ruleset}");
        }
        assert_eq!(closed.landlock, open.landlock);
        for dir in ["/workspace", "/result", "/tmp"] {
            assert!(closed.landlock.write_dirs.contains(&p(dir)));
        }
        assert!(!closed.landlock.write_dirs.contains(&p("/etc")));
        assert!(!closed.landlock.write_dirs.contains(&p("/")));
    }

    #[test]
    fn plan_round_trips_as_json() {
        let plan = plan_with(WorkspaceFacts::default(), false);
        let text = serde_json::to_string(&plan).unwrap();
        assert!(!text.contains('\n'), "the plan travels as one line");
        let back: InitPlan = serde_json::from_str(&text).unwrap();
        assert_eq!(back, plan);
    }
}
