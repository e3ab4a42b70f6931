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
    /// A session forked from a checkpoint: the frozen layers over the project, top first.
    pub layers: Vec<PathBuf>,
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
    /// A persistent home bound at `$HOME` (else a tmpfs).
    pub home: Option<&'a Path>,
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
    system_dir_ops(&mut ops, input);
    etc_ops(&mut ops, input);
    proc_ops(&mut ops);
    dev_ops(&mut ops, input);
    tmp_ops(&mut ops, input);
    workspace_ops(&mut ops, input);
    step_dir_ops(&mut ops, input);

    // Last: the root itself read-only, so nothing outside the writable mounts can be created.
    ops.push(MountOp::Setattr {
        path: p("/"),
        attrs: MountAttrs::RO,
    });
    ops
}

/// The system directories, bound read-only (or their symlinks made again).
fn system_dir_ops(ops: &mut Vec<MountOp>, input: &PlanInput<'_>) {
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
}

/// The filtered `/etc`.
fn etc_ops(ops: &mut Vec<MountOp>, input: &PlanInput<'_>) {
    let host = input.host;
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
}

/// `/proc`, with its kernel-tunable parts read-only.
fn proc_ops(ops: &mut Vec<MountOp>) {
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
}

/// The minimal `/dev`.
fn dev_ops(ops: &mut Vec<MountOp>, input: &PlanInput<'_>) {
    let host = input.host;
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
}

/// `/tmp` and `$HOME`.
fn tmp_ops(ops: &mut Vec<MountOp>, input: &PlanInput<'_>) {
    // Private /tmp, and a private $HOME (each as large as the disk limit allows, charged
    // to the sandbox's memory cgroup like every tmpfs page it writes).
    ops.push(MountOp::Tmpfs {
        path: p("/tmp"),
        size_bytes: input.tmp_bytes,
        mode: 0o1777,
        attrs: MountAttrs::RW,
    });
    if let Some(home) = input.home {
        // A persistent home (`--home NAME`), kept by the runtime outside every project.
        ops.push(MountOp::Bind {
            source: home.to_path_buf(),
            path: p(paths::HOME),
            kind: TargetKind::Dir,
            attrs: MountAttrs::RW,
            optional: false,
        });
        return;
    }
    ops.push(MountOp::Tmpfs {
        path: p(paths::HOME),
        size_bytes: input.tmp_bytes,
        mode: 0o700,
        attrs: MountAttrs::RW,
    });
}

/// `/workspace`: the overlay (or the copy), the git layer and the project's `.git`.
fn workspace_ops(ops: &mut Vec<MountOp>, input: &PlanInput<'_>) {
    // The copy-on-write workspace, with the project's own state absent (HIDDEN_TOP_LEVEL).
    // In copy mode the copy is bound instead (it holds no `.smithers`), with a stand-in
    // directory for `.git`: the host's is bound read-only on it (never copied, never
    // writable).
    let layout = input.layout;
    ops.push(match &layout.workspace_copy {
        None => MountOp::Overlay {
            lower: layout.root_dir.clone(),
            layers: layout.layers.clone(),
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
            layers: Vec::new(),
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
}

/// The step's own directories (`/result`, the request and output directories) and the
/// caller's volumes.
fn step_dir_ops(ops: &mut Vec<MountOp>, input: &PlanInput<'_>) {
    let layout = input.layout;
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
            terminal: None,
        },
        exec_follows: false,
    }
}

#[cfg(test)]
mod tests;
