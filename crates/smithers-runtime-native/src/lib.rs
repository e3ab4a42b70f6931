//! The `bubblewrap` runtime without bubblewrap: a step runs in Linux namespaces on this host,
//! built and supervised by our own small init (no external binary).
//!
//! * [`plan`] compiles the policy purely (mount list, environment, Landlock rules); [`seccomp`]
//!   compiles the syscall filter. Both are unit-tested without root.
//! * The in-sandbox init, which executes the plan, is its own crate, [`smithers_sandbox_init`]
//!   (a separate, single-threaded executable: `smithers-sandbox-init`, built by this crate as a
//!   thin binary, or `smithers-sandbox __sandbox-init`); it owns the plan's types.
//! * [`cgroup`] is cgroups v1 and v2 behind one interface.
//! * [`NativeRuntime`] implements [`smithers_runtime::Runtime`].
//!
//! # Identity inside
//!
//! The sandbox's root (uid 0 inside) maps to the **runtime's own uid** on the host, one id
//! only. This is deliberate: the step must be able to modify the project through the overlay,
//! and the project is owned by the user running the runtime; mapping to any other host uid
//! would make the project read-only inside (unmapped owner). The consequence, when the runtime
//! runs as host root, is that DAC checks on bound host files use host root's identity. What
//! keeps that safe: nothing writable is bound but the workspace overlay, `/result`, the out
//! directory and `/tmp`; every other mount is read-only (mount flags, locked by dropping all
//! capabilities, and `mount`/`mount_setattr` are denied by seccomp); Landlock denies writes
//! outside the writable mounts again; `/etc` is filtered, no home directory, no `/sys`; all
//! capabilities are dropped from every set with no_new_privs. Running the runtime as an
//! unprivileged user makes the sandbox that user's, with nothing of root.
//!
//! # Host state of a sandbox
//!
//! `<state_root>/<runId>+<sandboxId>/` (outside the project; a tmpfs by default, see
//! [`default_state_root`]) holds the new root's mount point, `/result`'s artifacts, the step's
//! result file, the output log and the outcome; with a disk limit also the workspace layer,
//! `layer/`: a size-capped tmpfs with the overlay's `upper/` and `work/`, or in copy mode
//! ([`WorkspaceMode`]) the project's copy `copy/`. Without a disk limit the layer is on disk
//! (see `NativeOptions::layer_root`): `<layer_root>/<runId>+<sandboxId>/` is the overlay's work
//! directory (or holds `copy/`), with the upper directory beside it as its name plus
//! `.upper`. The handle's
//! `sandbox_root` is the spec's `<rootDir>/.smithers/sandboxes/<runId>/<sandboxId>/` with
//! `request/` and the bundle in `result/`. When collect had to leave changes of the step out
//! of the bundle for a size limit, it marks the layer kept (`keep-layer` in the state
//! directory) and cleanup moves the written layer (the upper directory, or the copy) to that
//! directory's `kept-layer/` instead of removing it; accepting or rejecting the review
//! removes it (see `smithers_runtime::kept_layer`).
//!
//! Cleanup from a stored handle (see `owned.rs`) trusts none of its paths: the state and
//! layer directories are recomputed from the ids, the cgroups killed and removed are those
//! recorded in the state directory's `cleanup.json`, and a sandbox whose recorded owner is
//! another live process is left alone.

mod armed;
pub mod cgroup;
mod collect;
mod copy;
mod egress;
mod exec;
pub mod host_diag;
mod owned;
mod ownership;
pub mod plan;
mod prepared_root;
mod report;
pub mod seccomp;
mod status;
mod stdin_feed;
mod warm;
mod zygote;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use smithers_runtime::{
    CancellationToken, CollectReport, EnforcementReport, ExecOutcome, OutputSink, RequestBundle,
    Runtime, RuntimeError, RuntimeKind, SandboxConfig, SandboxHandle, ShipReport, StepCommand,
};

use crate::cgroup::{CgroupHost, CgroupLimits, SandboxCgroups};
use crate::plan::{BpfInstruction, HostFacts};

/// Entries whose owner the runtime read for the overlay's ownership checks in this process
/// (see the `ownership` module): for tests that hold a run to costing what it changes.
#[doc(hidden)]
pub use ownership::entries_read as ownership_entries_read;
pub use plan::DEFAULT_PATH;
pub use report::protection_names;
pub use warm::WarmStatus;

const RUNTIME: &str = "bubblewrap";

/// The init's syscall wrappers, which the runtime uses too (mounts, statvfs).
pub(crate) use smithers_sandbox_init::sys;
/// Environment variable naming the init executable.
pub use smithers_sandbox_init::INIT_ENV;
/// File name of the init executable looked up next to the current executable.
pub const INIT_BIN: &str = "smithers-sandbox-init";
/// How long `create` waits for the warm sandbox [`NativeRuntime::prestart`] is making before
/// it starts a cold one: making one takes a few milliseconds, so a longer wait means the
/// making is stuck, and a cold start is no slower than that.
pub const PRESTART_PATIENCE: std::time::Duration = std::time::Duration::from_millis(500);

/// Hidden first argument with which `smithers-sandbox` runs as the init.
pub const INIT_SUBCOMMAND: &str = "__sandbox-init";

/// How to start the init: a program and the arguments before the init's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl InitCommand {
    /// A dedicated `smithers-sandbox-init` binary.
    pub fn binary(program: impl Into<PathBuf>) -> InitCommand {
        InitCommand {
            program: program.into(),
            args: vec![],
        }
    }

    /// The current executable run with [`INIT_SUBCOMMAND`] (for a CLI that dispatches to
    /// [`smithers_sandbox_init::run`]).
    pub fn current_exe_subcommand() -> std::io::Result<InitCommand> {
        Ok(InitCommand {
            program: std::env::current_exe()?,
            args: vec![INIT_SUBCOMMAND.to_string()],
        })
    }

    /// Whether this is [`InitCommand::current_exe_subcommand`]: the init is the code linked in
    /// this very process, which may then fork one itself (see [`NativeRuntime::prestart`]).
    pub fn is_current_exe_subcommand(&self) -> bool {
        self.args.len() == 1
            && self.args[0] == INIT_SUBCOMMAND
            && std::env::current_exe().is_ok_and(|exe| exe == self.program)
    }

    /// Finds the init: `$SMITHERS_SANDBOX_INIT`, then `smithers-sandbox-init` next to the
    /// current executable or in its parent directory (test binaries live in `target/*/deps`).
    pub fn locate() -> Result<InitCommand, String> {
        if let Some(path) = std::env::var_os(INIT_ENV) {
            let path = PathBuf::from(path);
            return if path.is_file() {
                Ok(InitCommand::binary(path))
            } else {
                Err(format!(
                    "${INIT_ENV} names {} which is not a file",
                    path.display()
                ))
            };
        }
        let exe = std::env::current_exe().map_err(|e| format!("current executable: {e}"))?;
        let mut tried = Vec::new();
        for dir in exe
            .parent()
            .into_iter()
            .chain(exe.parent().and_then(Path::parent))
        {
            let candidate = dir.join(INIT_BIN);
            if candidate.is_file() {
                return Ok(InitCommand::binary(candidate));
            }
            tried.push(candidate.display().to_string());
        }
        Err(format!(
            "no {INIT_BIN} found (tried {}); set ${INIT_ENV}",
            tried.join(", ")
        ))
    }
}

/// How `/workspace` presents the project.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceMode {
    /// overlayfs when this host can mount it in a user namespace (checked once per runtime
    /// by the probe), else a copy, recorded as a degradation in the enforcement report and
    /// the bundle's log.
    #[default]
    Auto,
    /// overlayfs only: a host where it cannot be mounted fails `create` (fail closed).
    Overlay,
    /// Always a copy of the project (ship copies it; collect compares it with the project).
    Copy,
}

impl WorkspaceMode {
    /// `auto`, `overlay` or `copy`.
    pub fn parse(s: &str) -> Option<WorkspaceMode> {
        match s {
            "auto" => Some(WorkspaceMode::Auto),
            "overlay" => Some(WorkspaceMode::Overlay),
            "copy" => Some(WorkspaceMode::Copy),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WorkspaceMode::Auto => "auto",
            WorkspaceMode::Overlay => "overlay",
            WorkspaceMode::Copy => "copy",
        }
    }
}

/// Environment variable the CLI reads for the default [`WorkspaceMode`] (`auto`, `overlay`
/// or `copy`).
pub const WORKSPACE_ENV: &str = "SMITHERS_SANDBOX_WORKSPACE";

/// Options of [`NativeRuntime`].
#[derive(Debug, Clone)]
pub struct NativeOptions {
    /// The init to run; `None` = [`InitCommand::locate`].
    pub init: Option<InitCommand>,
    /// Where per-sandbox host state lives (config, log, result file, artifacts, the new
    /// root's mount point); `None` = a tmpfs runtime directory ([`default_state_root`]).
    /// When set and `layer_root` is not, the workspace layer lives here too.
    pub state_root: Option<PathBuf>,
    /// Where the workspace layer (overlay upper/work, or the copy) lives when no disk limit
    /// is set; `None` = `state_root` when that is set, else `$TMPDIR/smithers-sandbox-<uid>`,
    /// a disk-backed place: what a step writes to `/workspace` must not take host memory.
    pub layer_root: Option<PathBuf>,
    /// The pids limit applied when the config sets none (fork bombs are contained by
    /// default). Applied only where the pids controller exists; reported either way.
    pub default_pids_limit: Option<u32>,
    /// The memory limit applied when the config sets none, so that a step that allocates
    /// without bound meets its own cgroup's OOM killer rather than the host's. Applied only
    /// where the memory controller exists; reported either way. Default
    /// [`default_memory_limit`]: half the host's RAM, at most 8 GiB.
    pub default_memory_limit: Option<u64>,
    /// Free space kept on the file system of a disk-backed workspace layer (a step without
    /// `--disk`): the step is killed (termination `disk`) once less than this is left, or
    /// less than half what was free when it started, whichever is smaller, so a step cannot
    /// fill the host's disk and its result still has room to be written. Default 1 GiB;
    /// `0` turns the guard off.
    pub disk_reserve_bytes: u64,
    /// How `/workspace` presents the project (default [`WorkspaceMode::Auto`]).
    pub workspace: WorkspaceMode,
    /// Fork each sandbox's init from a pre-started one (a "zygote", see the `zygote`
    /// module) instead of executing the init binary per sandbox. Default: true; the init is
    /// executed directly when no zygote can be had.
    pub zygote: bool,
    /// Bind a root prepared once per host configuration (the `/etc` copies, the symlinks and
    /// every mount point: see the `prepared_root` module) instead of building each sandbox's
    /// root on a fresh tmpfs. The sandbox sees the same tree either way, but for `/dev`
    /// being a read-only directory of the root rather than a read-only tmpfs of its own.
    /// Default: true.
    pub prepared_root: bool,
    /// Warm sandboxes kept ready (see the `warm` module): a sandbox that needs no network,
    /// egress policy, disk or CPU limit or volume claims one at `create`, and its first
    /// `execute` only does what depends on the step. The pool is refilled in the
    /// background. Worth it for a process that runs many steps (`serve`, a workflow through
    /// the library); 0 (the default) keeps none. Needs the zygote and the prepared root.
    pub warm: usize,
    /// Refill the warm pool only once a step is over ([`NativeRuntime::steps_over`]), not as
    /// soon as its command starts: making a sandbox takes a few milliseconds of CPU, which
    /// then never competes with a step a user is waiting for (the resident service, which
    /// serves one step at a time and says when each is over). Default `false` (`serve`'s
    /// concurrent steps would otherwise wait for one another's end).
    pub warm_refill_after_step: bool,
}

/// What a successful container probe is remembered by: the build, the boot and kernel, and
/// what confines this process (its mount and user namespaces, its seccomp mode and filter
/// count, no_new_privs and capabilities, from `/proc/self/status`). Another container, or
/// the same one started with other flags, has another key.
fn container_probe_key() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let link = |p: &str| {
        std::fs::read_link(p)
            .map(|l| l.display().to_string())
            .unwrap_or_default()
    };
    let status = read("/proc/self/status");
    let confinement: Vec<&str> = status
        .lines()
        .filter(|l| {
            [
                "Seccomp:",
                "Seccomp_filters:",
                "NoNewPrivs:",
                "CapEff:",
                "CapBnd:",
            ]
            .iter()
            .any(|k| l.starts_with(k))
        })
        .collect();
    format!(
        "{} {} {} {} {} {}",
        env!("CARGO_PKG_VERSION"),
        read("/proc/sys/kernel/random/boot_id").trim(),
        read("/proc/sys/kernel/osrelease").trim(),
        link("/proc/self/ns/mnt"),
        link("/proc/self/ns/user"),
        confinement
            .join(" ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// The default of [`NativeOptions::disk_reserve_bytes`].
pub const DEFAULT_DISK_RESERVE_BYTES: u64 = 1 << 30;

/// Half the host's RAM (`MemTotal` of `/proc/meminfo`), at most 8 GiB: the memory limit of a
/// step that sets none. `None` when the host's RAM cannot be read.
pub fn default_memory_limit() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some((kib * 1024 / 2).min(8 << 30))
}

impl Default for NativeOptions {
    fn default() -> Self {
        NativeOptions {
            init: None,
            state_root: None,
            layer_root: None,
            default_pids_limit: Some(4096),
            default_memory_limit: default_memory_limit(),
            disk_reserve_bytes: DEFAULT_DISK_RESERVE_BYTES,
            workspace: WorkspaceMode::Auto,
            zygote: true,
            prepared_root: true,
            warm: 0,
            warm_refill_after_step: false,
        }
    }
}

/// What this host offers, computed once per runtime (cheap file reads, no process).
#[derive(Debug)]
struct HostCaps {
    init: Result<InitCommand, String>,
    facts: HostFacts,
    cgroups: CgroupHost,
    seccomp: Result<Vec<BpfInstruction>, String>,
    /// Why user namespaces are refused, and the fix.
    userns: Result<(), (String, String)>,
    uid: u32,
    gid: u32,
    /// Whether we may mount a size-capped tmpfs on the host for the upper layer.
    host_mounts: bool,
    /// `NativeOptions::prepared_root`.
    prepared_root: bool,
    state_root: PathBuf,
    /// Where workspace layers go without a disk limit (see `NativeOptions::layer_root`).
    layer_root: PathBuf,
    /// `NativeOptions::disk_reserve_bytes`.
    disk_reserve: u64,
    host_env: BTreeMap<String, String>,
    /// `host_diag::container_engine`, once per runtime (four file checks).
    container_engine: Option<&'static str>,
}

/// The native runtime. Cheap to clone through `Arc`; host facts are cached inside.
#[derive(Debug)]
pub struct NativeRuntime {
    options: NativeOptions,
    /// Shared with the thread [`NativeRuntime::prestart`] starts, which may detect them first.
    caps: Arc<OnceLock<Arc<HostCaps>>>,
    /// What the init found in probe mode (run once, on the first probe or create that needs
    /// it).
    findings: tokio::sync::OnceCell<Result<serde_json::Value, String>>,
    probe: tokio::sync::OnceCell<EnforcementReport>,
    /// Whether overlayfs works here, decided once per runtime (see `overlay_check`).
    overlay: tokio::sync::OnceCell<report::OverlayCheck>,
    /// The zygote, started at the first execute (with `NativeOptions::zygote`). Shared with
    /// the blocking thread that talks to it (see `exec::spawn_init`).
    zygote: exec::ZygoteSlot,
    /// The warm pool (`NativeOptions::warm`), started at the first create or `warm_up`;
    /// `Err` says why this host cannot have one.
    warm_pool: OnceLock<Result<Arc<warm::WarmPool>, String>>,
    /// The one warm sandbox [`NativeRuntime::prestart`] asked for, if it did.
    prestarted: OnceLock<Arc<warm::WarmPool>>,
    /// Set once this runtime found the container probe's success (remembered or run): a
    /// process's confinement only tightens, and a tighter one fails at execute, named.
    /// Checking the remembered key reads five files, ~0.1 ms of every create.
    container_probe_ok: OnceLock<()>,
    /// Warm inits claimed at create, by the claiming sandbox's state directory, until its
    /// first execute (or its cleanup).
    attached: Arc<std::sync::Mutex<std::collections::HashMap<PathBuf, warm::ClaimedWarm>>>,
}

/// The workspace a sandbox got (decided at create, kept in the handle).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "mode")]
pub(crate) enum WorkspaceState {
    /// overlayfs, the project as the lower layer (handles from before copy mode have no
    /// field and are this).
    #[default]
    Overlay,
    /// A copy of the project in the state directory, bound at /workspace; `reason` says why
    /// (asked for, or overlayfs unavailable and why).
    Copy { reason: String },
}

impl WorkspaceState {
    pub(crate) fn copy_reason(&self) -> Option<&str> {
        match self {
            WorkspaceState::Overlay => None,
            WorkspaceState::Copy { reason } => Some(reason),
        }
    }
}

/// The workspace of a new sandbox under `mode`, given what the probe found about overlayfs.
fn decide_workspace(
    mode: WorkspaceMode,
    overlay: report::OverlayCheck,
) -> Result<WorkspaceState, RuntimeError> {
    use report::OverlayCheck;
    match (mode, overlay) {
        (WorkspaceMode::Copy, _) => Ok(WorkspaceState::Copy {
            reason: "copy mode requested (workspace = copy)".into(),
        }),
        (WorkspaceMode::Auto, OverlayCheck::Unusable(why)) => Ok(WorkspaceState::Copy {
            reason: format!("overlayfs cannot be mounted in a user namespace here: {why}"),
        }),
        (WorkspaceMode::Overlay, OverlayCheck::Unusable(why)) => Err(RuntimeError::Unavailable {
            runtime: RUNTIME,
            reason: format!(
                "the overlay workspace was requested but overlayfs cannot be mounted in a user namespace here: {why}"
            ),
            fix: Some(format!(
                "use workspace mode auto or copy (--workspace, ${WORKSPACE_ENV}) to fall back to a copy of the project; or a kernel >= 5.11 with overlayfs and a state root on ext4, xfs or tmpfs"
            )),
        }),
        // Usable, or the probe did not get as far as trying (then execute reports what
        // really fails, as before this check existed).
        (_, OverlayCheck::Usable | OverlayCheck::Unknown(_)) => Ok(WorkspaceState::Overlay),
    }
}

/// How a copy workspace chosen for other owners' files starts its reason.
pub(crate) const FOREIGN_OWNERS: &str = "files of other owners in the project";

/// An overlay only over a project whose top directory is the runtime's (see [`ownership`],
/// which also says why nothing more is read here, and what collect checks instead):
/// otherwise `auto` takes a copy, saying why, and `overlay` is refused.
fn check_ownership(
    mode: WorkspaceMode,
    workspace: WorkspaceState,
    root: &Path,
    caps: &HostCaps,
) -> Result<WorkspaceState, RuntimeError> {
    if workspace != WorkspaceState::Overlay {
        return Ok(workspace);
    }
    let Some(foreign) = ownership::root_foreign(root, caps.uid, caps.gid) else {
        return Ok(workspace);
    };
    let why = foreign.describe(caps.uid, caps.gid);
    match mode {
        WorkspaceMode::Overlay => Err(RuntimeError::Unavailable {
            runtime: RUNTIME,
            reason: format!("the overlay workspace was requested but {why}"),
            fix: Some(format!(
                "use workspace mode auto or copy (--workspace, ${WORKSPACE_ENV}), which copies the project (the copy is the runtime's), or run the runtime as the tree's owner"
            )),
        }),
        _ => Ok(WorkspaceState::Copy {
            reason: format!("{FOREIGN_OWNERS}: {why}"),
        }),
    }
}

/// Backend state stored in the handle (plain data, for cleanup from another process).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Backend {
    state_dir: PathBuf,
    root_dir: PathBuf,
    /// A tmpfs is mounted on `state_dir/layer` (disk limit).
    layer_tmpfs: bool,
    /// The workspace layer when it is not `state_dir/layer`: on the disk-backed layer root
    /// (no disk limit, state root elsewhere). Absent in older handles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    layer_dir: Option<PathBuf>,
    /// The disk-backed layer is the overlay's work directory itself, with the upper directory
    /// beside it (`<layer>.upper`) rather than both inside it: one directory level fewer to
    /// make and to remove, and removing a directory waits for a discard on this project's
    /// disks. False in older handles (`upper/` and `work/` inside the layer).
    #[serde(default)]
    flat_layer: bool,
    cgroups: SandboxCgroups,
    /// Overlay or copy (absent in handles from before copy mode: overlay).
    #[serde(default)]
    workspace: WorkspaceState,
}

impl Backend {
    fn from_handle(handle: &SandboxHandle, verb: &'static str) -> Result<Backend, RuntimeError> {
        serde_json::from_value(handle.backend.clone()).map_err(|e| RuntimeError::OutOfOrder {
            verb,
            reason: format!("the handle carries no native runtime state: {e}"),
        })
    }
    fn layer(&self) -> PathBuf {
        self.layer_dir
            .clone()
            .unwrap_or_else(|| self.state_dir.join("layer"))
    }
    fn upper(&self) -> PathBuf {
        match (&self.layer_dir, self.flat_layer) {
            (Some(layer), true) => {
                let mut name = layer.as_os_str().to_owned();
                name.push(".upper");
                PathBuf::from(name)
            }
            _ => self.layer().join("upper"),
        }
    }
    fn work(&self) -> PathBuf {
        match (&self.layer_dir, self.flat_layer) {
            (Some(layer), true) => layer.clone(),
            _ => self.layer().join("work"),
        }
    }
    /// When the project is a git worktree: the overlay layer (upper, work) over its
    /// repository's common directory, which the sandbox sees writable at its own path. Beside
    /// the workspace's upper directory, on the same file system (one overlayfs accepts).
    fn git_common_upper(&self) -> PathBuf {
        let mut name = self.upper().into_os_string();
        name.push(".git-common");
        PathBuf::from(name)
    }
    fn git_common_work(&self) -> PathBuf {
        let mut name = self.upper().into_os_string();
        name.push(".git-common-work");
        PathBuf::from(name)
    }
    /// The workspace copy (copy mode), in the layer so that a disk limit caps it too.
    fn copy(&self) -> PathBuf {
        self.layer().join("copy")
    }
    /// The new root's mount point: one empty directory of the state root for every sandbox
    /// (each init mounts on it in its own mount namespace only, so they never meet; the host
    /// sees it empty), which a warm sandbox can mount on before it knows its sandbox.
    fn new_root(&self) -> PathBuf {
        match self.state_dir.parent() {
            Some(state_root) => Backend::new_root_in(state_root),
            None => self.state_dir.join("root"),
        }
    }
    fn new_root_in(state_root: &Path) -> PathBuf {
        state_root.join(".mount-root")
    }
    /// `/result`, and below the output directory (the result file): in the size-capped layer
    /// when there is a disk limit, so that `--disk` caps what a step leaves there too (on the
    /// state root, a tmpfs without a size of its own, a step could fill the host's memory).
    fn artifacts(&self) -> PathBuf {
        self.capped_dir("artifacts")
    }
    fn out(&self) -> PathBuf {
        self.capped_dir("out")
    }
    /// The request directory the sandbox sees at `/run/smithers/request`: the runtime's own
    /// copy of the handle's `request_path` (ship writes `request.json` to both), beside
    /// `/result` and the output directory. Being the sandbox's and named by nothing of the
    /// project, it can be bound before the sandbox's ids are known (an armed warm sandbox,
    /// see warm.rs), and nothing in the project tree is ever bound into the sandbox but the
    /// project itself.
    fn request_dir(&self) -> PathBuf {
        self.capped_dir("request")
    }
    fn capped_dir(&self, name: &str) -> PathBuf {
        if self.layer_tmpfs {
            self.layer().join(name)
        } else {
            self.state_dir.join(name)
        }
    }
    fn config_file(&self) -> PathBuf {
        self.state_dir.join("config.json")
    }
    fn outcome_file(&self) -> PathBuf {
        self.state_dir.join("outcome.json")
    }
    fn result_problem_file(&self) -> PathBuf {
        self.state_dir.join("result-rejected.txt")
    }
    fn log_file(&self) -> PathBuf {
        self.state_dir.join("stream.ndjson")
    }
    /// Present when collect left changes of the step out for a size limit: cleanup then
    /// keeps the workspace layer (see [`keep_layer`]).
    fn keep_layer_marker(&self) -> PathBuf {
        self.state_dir.join("keep-layer")
    }
    /// The tree holding the step's writes: the overlay's upper directory, or the copy.
    fn written_layer(&self) -> PathBuf {
        match self.workspace {
            WorkspaceState::Overlay => self.upper(),
            WorkspaceState::Copy { .. } => self.copy(),
        }
    }
    /// What ship's copy copied (copy mode), for the log's workspace record.
    fn copy_report_file(&self) -> PathBuf {
        self.state_dir.join("copy-report.json")
    }
    /// What the copy held when complete (`smithers_patch::CopyManifest`), for collect to
    /// tell the host's edits from the step's.
    fn copy_manifest_file(&self) -> PathBuf {
        self.state_dir.join("copy-manifest.bin")
    }
}

/// What this host has for the native runtime with these options (see [`HostCaps`]).
fn detect(options: &NativeOptions) -> HostCaps {
    // SAFETY: geteuid/getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let init = match &options.init {
        Some(i) => Ok(i.clone()),
        None => InitCommand::locate(),
    };
    let state_root = options
        .state_root
        .clone()
        .unwrap_or_else(|| default_state_root(uid));
    let layer_root = match (&options.layer_root, &options.state_root) {
        (Some(layers), _) => layers.clone(),
        (None, Some(state)) => state.clone(),
        (None, None) => std::env::temp_dir().join(format!("smithers-sandbox-{uid}")),
    };
    HostCaps {
        init,
        facts: HostFacts::gather(),
        cgroups: CgroupHost::detect(),
        seccomp: seccomp::compile().map_err(|e| e.to_string()),
        userns: report::userns_available(uid),
        uid,
        gid,
        host_mounts: uid == 0,
        prepared_root: options.prepared_root,
        state_root,
        layer_root,
        disk_reserve: options.disk_reserve_bytes,
        host_env: std::env::vars().collect(),
        container_engine: host_diag::container_engine(),
    }
}

fn io_err<'a>(
    operation: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> RuntimeError + 'a {
    move |e| RuntimeError::io(operation, path, e)
}

impl Default for NativeRuntime {
    fn default() -> Self {
        NativeRuntime::new(NativeOptions::default())
    }
}

impl NativeRuntime {
    pub fn new(options: NativeOptions) -> NativeRuntime {
        NativeRuntime {
            options,
            caps: Arc::new(OnceLock::new()),
            findings: tokio::sync::OnceCell::new(),
            probe: tokio::sync::OnceCell::new(),
            overlay: tokio::sync::OnceCell::new(),
            zygote: exec::ZygoteSlot::default(),
            warm_pool: OnceLock::new(),
            prestarted: OnceLock::new(),
            container_probe_ok: OnceLock::new(),
            attached: Default::default(),
        }
    }

    /// The warm pool, started on first use; `None` without `NativeOptions::warm`.
    fn warm_pool(&self) -> Option<Result<Arc<warm::WarmPool>, String>> {
        if self.options.warm == 0 {
            return None;
        }
        Some(
            self.warm_pool
                .get_or_init(|| {
                    let caps = self.caps();
                    if !self.options.zygote || !self.options.prepared_root {
                        return Err("a warm pool needs the zygote and the prepared root".into());
                    }
                    caps.init.as_ref().map_err(Clone::clone)?;
                    caps.seccomp.as_ref().map_err(Clone::clone)?;
                    caps.userns.as_ref().map_err(|(reason, _)| reason.clone())?;
                    let limits = self
                        .defaults()
                        .limits(&caps, &smithers_runtime::Controls::default());
                    let pool = warm::WarmPool::start(
                        self.options.warm,
                        caps,
                        self.zygote.clone(),
                        limits,
                        self.defaults(),
                    );
                    if self.options.warm_refill_after_step {
                        pool.refill_when_steps_end();
                    }
                    Ok(Arc::new(pool))
                })
                .clone(),
        )
    }

    /// The steps that claimed warm sandboxes are over: with
    /// [`NativeOptions::warm_refill_after_step`], the pool refills now.
    pub fn steps_over(&self) {
        if let Some(Ok(pool)) = self.warm_pool.get() {
            pool.step_over();
        }
    }

    /// Starts making one warm sandbox now, on a thread of its own, for the next `create` of
    /// a sandbox with these controls (one a warm sandbox can serve: no network, egress
    /// policy, disk or CPU limit, or volumes; otherwise nothing is started). Never refilled.
    /// For a process that runs one step, such as the CLI's `run`: the sandbox's init, its
    /// namespaces, cgroups and step-independent mounts are made on the other core while the
    /// process opens its store and records the step, and `create` waits for it (up to
    /// [`PRESTART_PATIENCE`]) instead of starting cold. Does nothing where the host cannot
    /// have warm sandboxes (`create` then starts cold, as without it), or when already asked.
    pub fn prestart(&self, controls: &smithers_runtime::Controls) {
        if !warm::eligible_controls(controls)
            || !self.options.zygote
            || !self.options.prepared_root
            || self.prestarted.get().is_some()
        {
            return;
        }
        // What this host has is found on the pool's thread too (the first of the two to
        // ask detects it; `create` finds it done).
        let (cell, options, defaults) = (self.caps.clone(), self.options.clone(), self.defaults());
        let setup = move || {
            let caps = cell.get_or_init(|| Arc::new(detect(&options))).clone();
            caps.init.as_ref().map_err(Clone::clone)?;
            caps.seccomp.as_ref().map_err(Clone::clone)?;
            caps.userns.as_ref().map_err(|(reason, _)| reason.clone())?;
            let limits = defaults.limits(&caps, &smithers_runtime::Controls::default());
            // The step's bundle will be written durably: its fsync threads start here, on
            // this thread, rather than on the step's critical path at collect.
            smithers_bundle::start_sync_threads();
            Ok((caps, limits))
        };
        // When the init is this very binary and this process is still single-threaded (the
        // CLI asks before its async runtime or store exist), the init is forked from here at
        // once, before the host is even looked at: no zygote is executed (~2 ms) and the
        // init waits for its prelude while the pool's thread detects the host. Otherwise the
        // zygote forks it, as for any warm sandbox.
        let preforked = self
            .options
            .init
            .as_ref()
            .filter(|init| init.is_current_exe_subcommand())
            .and_then(|_| warm::PreForked::fork().ok());
        let _ = self.prestarted.set(Arc::new(warm::WarmPool::start_once(
            Box::new(setup),
            self.zygote.clone(),
            preforked,
        )));
    }

    /// What became of the warm sandbox [`NativeRuntime::prestart`] started: `None` when none
    /// was started (not asked, or a step it could not serve).
    pub fn prestart_status(&self) -> Option<WarmStatus> {
        self.prestarted.get().map(|pool| pool.status())
    }

    /// Starts the warm pool (if `NativeOptions::warm` asks for one) and waits until it is
    /// full or `timeout` passes. `None` without a pool; a status with `last_error` when the
    /// pool cannot fill (or this host cannot have one).
    pub async fn warm_up(&self, timeout: std::time::Duration) -> Option<WarmStatus> {
        let pool = match self.warm_pool()? {
            Ok(pool) => pool,
            Err(reason) => return Some(self.unavailable_pool(reason)),
        };
        blocking("wait for the warm pool", move || pool.wait_full(timeout))
            .await
            .ok()
    }

    /// [`NativeRuntime::warm_up`] for a caller that is not async (it blocks its thread).
    pub fn wait_until_warm(&self, timeout: std::time::Duration) -> Option<WarmStatus> {
        match self.warm_pool()? {
            Ok(pool) => Some(pool.wait_full(timeout)),
            Err(reason) => Some(self.unavailable_pool(reason)),
        }
    }

    /// What the warm pool holds now; `None` without `NativeOptions::warm`.
    pub fn warm_status(&self) -> Option<WarmStatus> {
        match self.warm_pool()? {
            Ok(pool) => Some(pool.status()),
            Err(reason) => Some(self.unavailable_pool(reason)),
        }
    }

    fn unavailable_pool(&self, reason: String) -> WarmStatus {
        WarmStatus {
            size: self.options.warm,
            ready: 0,
            made: 0,
            claimed: 0,
            last_error: Some(reason),
            armed: 0,
            claimed_armed: 0,
            served_armed: 0,
            last_arm_error: None,
            last_adopt_error: None,
            waiting: vec![],
        }
    }

    fn defaults(&self) -> Defaults {
        Defaults {
            pids: self.options.default_pids_limit,
            memory: self.options.default_memory_limit,
        }
    }

    fn take_attached(&self, backend: &Backend) -> Option<warm::ClaimedWarm> {
        self.attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&backend.state_dir)
    }

    fn caps(&self) -> Arc<HostCaps> {
        self.caps
            .get_or_init(|| Arc::new(detect(&self.options)))
            .clone()
    }

    /// What the init's probe mode found on this host (run once per runtime).
    async fn findings(&self) -> &Result<serde_json::Value, String> {
        let caps = self.caps();
        self.findings
            .get_or_init(|| async move { report::findings(&caps).await })
            .await
    }

    /// Whether overlayfs works here for the layer root: the probe's answer, remembered in the
    /// state root per boot, kernel, layer root and version (read once per runtime: `create`
    /// keeps the answer in `self.overlay`). The probe starts a process and
    /// mounts (about 30 ms), which every `smithers-sandbox run` would otherwise pay at its
    /// first create; the answer cannot change without one of those changing.
    async fn overlay_check(&self, caps: &HostCaps) -> report::OverlayCheck {
        use report::OverlayCheck;
        use std::os::unix::fs::MetadataExt;
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let key = format!(
            "{} {} {} {} {}",
            env!("CARGO_PKG_VERSION"),
            read("/proc/sys/kernel/random/boot_id").trim(),
            read("/proc/sys/kernel/osrelease").trim(),
            caps.layer_root.display(),
            std::fs::metadata(&caps.layer_root)
                .map(|m| m.dev())
                .unwrap_or(0),
        );
        let cache = caps.state_root.join("overlay-check.json");
        let cached: Option<serde_json::Value> = std::fs::read(&cache)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .filter(|v: &serde_json::Value| v["key"] == key.as_str());
        if let Some(v) = cached {
            match v["unusable"].as_str() {
                None => return OverlayCheck::Usable,
                Some(why) => return OverlayCheck::Unusable(why.to_string()),
            }
        }
        let check = report::overlay_check(self.findings().await);
        let remember = match &check {
            OverlayCheck::Usable => Some(serde_json::json!({"key": key})),
            OverlayCheck::Unusable(why) => Some(serde_json::json!({"key": key, "unusable": why})),
            // Not tried: ask again next time.
            OverlayCheck::Unknown(_) => None,
        };
        if let Some(v) = remember {
            // Best effort, written aside and renamed: a reader sees the old answer or the new.
            let tmp = caps
                .state_root
                .join(format!("overlay-check.{}.tmp", std::process::id()));
            if std::fs::create_dir_all(&caps.state_root).is_ok()
                && restrict_mode(&caps.state_root).is_ok()
                && write_private(&tmp, v.to_string().as_bytes()).is_ok()
            {
                let _ = std::fs::rename(&tmp, &cache);
            }
        }
        check
    }

    /// The workspace mode of this runtime (`NativeOptions::workspace`).
    pub fn workspace_mode(&self) -> WorkspaceMode {
        self.options.workspace
    }

    /// Refuses, with the probe's failure and the fix for this host, when the init's probe
    /// could not make the user namespace or a fresh `/proc`.
    async fn refuse_unless_probe_succeeded(&self, caps: &HostCaps) -> Result<(), RuntimeError> {
        // A success is remembered (a probe is a process and two namespaces, ~10 ms of every
        // `run`), per boot, kernel, build, and what confines this process: its mount and
        // user namespaces, seccomp mode and capabilities. A failure is never remembered.
        let cache = caps.state_root.join("container-probe.json");
        let key = container_probe_key();
        let remembered = std::fs::read(&cache)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| v["key"] == key.as_str());
        if remembered {
            return Ok(());
        }
        let findings = self.findings().await;
        let failed = |key: &str| -> Option<String> {
            match findings {
                Err(e) => Some(e.clone()),
                Ok(v) if v[key]["ok"] == serde_json::Value::Bool(true) => None,
                Ok(v) => Some(v[key]["detail"].as_str().unwrap_or("failed").to_string()),
            }
        };
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        if let Some(why) = failed("user") {
            return Err(RuntimeError::Unavailable {
                runtime: RUNTIME,
                reason: format!("the user namespace could not be created: {why}"),
                fix: Some(host_diag::userns_fix(caps.uid, &mountinfo)),
            });
        }
        if let Some(why) = failed("proc") {
            return Err(RuntimeError::Unavailable {
                runtime: RUNTIME,
                reason: format!(
                    "a fresh /proc could not be mounted in the sandbox's pid namespace: {why}"
                ),
                fix: Some(host_diag::proc_fix(&mountinfo)),
            });
        }
        // Best effort, written aside and renamed, as the overlay check's answer is.
        let tmp = caps
            .state_root
            .join(format!("container-probe.{}.tmp", std::process::id()));
        if std::fs::create_dir_all(&caps.state_root).is_ok()
            && restrict_mode(&caps.state_root).is_ok()
            && write_private(&tmp, serde_json::json!({"key": key}).to_string().as_bytes()).is_ok()
        {
            let _ = std::fs::rename(&tmp, &cache);
        }
        Ok(())
    }

    fn refuse(control: &'static str, reason: impl Into<String>) -> RuntimeError {
        RuntimeError::ControlUnsupported {
            runtime: RUNTIME,
            control,
            reason: reason.into(),
        }
    }

    /// Refuses what this runtime cannot enforce here (strict: never silently dropped).
    fn check_controls(&self, config: &SandboxConfig, caps: &HostCaps) -> Result<(), RuntimeError> {
        let c = &config.controls;
        if config.image.is_some() {
            return Err(Self::refuse(
                "image",
                "the native runtime runs on the host's own system directories; images need the docker runtime",
            ));
        }
        if let Some(port) = c.ports.iter().find(|p| p.host != p.container) {
            return Err(Self::refuse(
                "ports",
                format!(
                    "with allowNetwork the sandbox shares the host network, so a port cannot be remapped ({} -> {})",
                    port.host, port.container
                ),
            ));
        }
        if c.workspace.is_some() {
            return Err(Self::refuse(
                "workspace",
                "persistent workspaces are a feature of remote runtimes",
            ));
        }
        if c.egress.is_some() {
            return Err(Self::refuse(
                "egress",
                "egress proxying and secret bindings are not implemented by the native runtime",
            ));
        }
        // Parsed and linted here, so a bad policy fails at create, naming the problem.
        egress::policy(c)?;
        for (control, ctrl, wanted) in [
            ("memoryLimit", "memory", c.memory_limit_bytes.is_some()),
            ("pidsLimit", "pids", c.pids_limit.is_some()),
            ("cpuLimit", "cpu", c.cpu_limit.is_some()),
        ] {
            if wanted && caps.cgroups.source(ctrl).is_none() {
                let why = caps.cgroups.why_unusable(ctrl);
                return Err(Self::refuse(
                    control,
                    format!(
                        "no {ctrl} cgroup controller is available to this process: {}; fix: {}",
                        why.reason, why.fix
                    ),
                ));
            }
        }
        if c.disk_limit_bytes.is_some() && !caps.host_mounts {
            return Err(Self::refuse(
                "diskLimit",
                "capping the copy-on-write layer needs a size-limited tmpfs mounted on the host, which needs root",
            ));
        }
        Ok(())
    }

    /// A sandbox's directory name under the state and layer roots: `<runId>+<sandboxId>`. Ids
    /// are `[A-Za-z0-9._-]`, so the `+` makes the name unambiguous; one flat level, so that no
    /// per-run directory is left behind once a run's last sandbox is cleaned up.
    fn dir_name(config: &SandboxConfig) -> String {
        format!("{}+{}", config.run_id, config.sandbox_id)
    }

    /// A warm sandbox's cgroup name, of the same shape as [`NativeRuntime::cgroup_name`].
    fn warm_cgroup_name() -> String {
        use std::hash::{Hash, Hasher};
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        "warm".hash(&mut h);
        MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .hash(&mut h);
        std::process::id().hash(&mut h);
        std::time::SystemTime::now().hash(&mut h);
        format!("smithers-{:016x}", h.finish())
    }

    fn cgroup_name(config: &SandboxConfig) -> String {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        config.entity_id().hash(&mut h);
        std::process::id().hash(&mut h);
        std::time::SystemTime::now().hash(&mut h);
        format!("smithers-{:016x}", h.finish())
    }

    async fn create_inner(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
        config.validate()?;
        if config.runtime != RuntimeKind::Bubblewrap {
            return Err(RuntimeError::InvalidControl {
                control: "runtime",
                reason: format!(
                    "the native runtime serves \"bubblewrap\", not {:?}",
                    config.runtime.as_str()
                ),
            });
        }
        let caps = self.caps();
        if let Err(reason) = &caps.init {
            return Err(RuntimeError::Unavailable {
                runtime: RUNTIME,
                reason: reason.clone(),
                fix: Some(format!(
                    "build the {INIT_BIN} binary (cargo build -p smithers-runtime-native) or set ${INIT_ENV}"
                )),
            });
        }
        if let Err((reason, fix)) = &caps.userns {
            return Err(RuntimeError::Unavailable {
                runtime: RUNTIME,
                reason: reason.clone(),
                fix: Some(fix.clone()),
            });
        }
        // In a container the engine's default confinement (seccomp, masked /proc) refuses
        // what the sandbox needs, and nothing cheap shows it: the init's probe tries (once
        // per runtime), and a refusal names the engine's flags instead of failing at execute.
        if caps.container_engine.is_some() && self.container_probe_ok.get().is_none() {
            self.refuse_unless_probe_succeeded(&caps).await?;
            let _ = self.container_probe_ok.set(());
        }
        if let Err(reason) = &caps.seccomp {
            return Err(RuntimeError::Unavailable {
                runtime: RUNTIME,
                reason: reason.clone(),
                fix: None,
            });
        }
        self.check_controls(config, &caps)?;
        let workspace = match self.options.workspace {
            WorkspaceMode::Copy => {
                decide_workspace(WorkspaceMode::Copy, report::OverlayCheck::Usable)?
            }
            mode => {
                let check = self
                    .overlay
                    .get_or_init(|| self.overlay_check(&caps))
                    .await
                    .clone();
                decide_workspace(mode, check)?
            }
        };
        // The rest is file system work (directories, cgroups, a tmpfs mount): on a blocking
        // thread, so that no async worker waits on the disk.
        let config = config.clone();
        let defaults = self.defaults();
        let mode = self.options.workspace;
        let pool = match self.warm_pool() {
            Some(Ok(pool)) if warm::eligible(&config) => Some(pool),
            _ => None,
        };
        let prestarted = self
            .prestarted
            .get()
            .filter(|_| warm::eligible(&config))
            .cloned();
        let (handle, warm) = blocking("create the sandbox", move || {
            let workspace = check_ownership(mode, workspace, &config.root_dir, &caps)?;
            let key = armed::ArmKey::of(&config, &workspace);
            let warm = pool
                .as_ref()
                .and_then(|pool| pool.claim(Some(&key)))
                .or_else(|| prestarted.and_then(|pool| pool.claim_waiting(PRESTART_PATIENCE)));
            // An armed sandbox that could not be adopted is given up and the step starts cold;
            // the pool's status says why.
            let given_up = |why: String| {
                if let Some(pool) = &pool {
                    pool.adopt_failed(why);
                }
            };
            create_on_disk(&config, &caps, workspace, defaults, warm, given_up)
        })
        .await??;
        if let (Some(warm), Ok(backend)) = (warm, Backend::from_handle(&handle, "create")) {
            self.attached
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(backend.state_dir, warm);
        }
        Ok(handle)
    }
}

/// What `create` does once the controls and the workspace mode are decided: the state and
/// layer directories, the cgroups, the config; undone when any of it fails.
fn create_on_disk(
    config: &SandboxConfig,
    caps: &HostCaps,
    workspace: WorkspaceState,
    defaults: Defaults,
    warm: Option<warm::WarmSandbox>,
    armed_given_up: impl FnOnce(String),
) -> Result<(SandboxHandle, Option<warm::ClaimedWarm>), RuntimeError> {
    let root_dir = &config.root_dir;
    match std::fs::metadata(root_dir) {
        Ok(m) if m.is_dir() => {}
        _ => {
            return Err(RuntimeError::InvalidControl {
                control: "rootDir",
                reason: format!("{} is not a directory", root_dir.display()),
            })
        }
    }
    let (sandbox_root, request_path, result_path) = project_dirs(root_dir, config);

    std::fs::create_dir_all(&caps.state_root)
        .map_err(io_err("create state directory", &caps.state_root))?;
    restrict_mode(&caps.state_root)?;
    let state_dir = caps.state_root.join(NativeRuntime::dir_name(config));
    let warm = match warm {
        Some(w) if w.armed.is_some() => {
            match adopt_armed(config, caps, &workspace, defaults, w, &state_dir) {
                Ok(adopted) => return Ok(adopted),
                Err(why) => {
                    armed_given_up(why);
                    None
                }
            }
        }
        other => other,
    };
    match std::fs::create_dir(&state_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if !take_over_leftover(config, caps, &state_dir)? {
                return Err(RuntimeError::OutOfOrder {
                    verb: "create",
                    reason: format!(
                        "sandbox {} already exists (state at {}); clean it up first",
                        config.entity_id(),
                        state_dir.display()
                    ),
                });
            }
            std::fs::create_dir(&state_dir)
                .map_err(|e| RuntimeError::io("create state directory", &state_dir, e))?;
        }
        Err(e) => return Err(RuntimeError::io("create state directory", &state_dir, e)),
    }
    let mut backend = Backend {
        state_dir,
        root_dir: root_dir.clone(),
        layer_tmpfs: false,
        layer_dir: None,
        flat_layer: false,
        cgroups: SandboxCgroups::default(),
        workspace,
    };
    let warm = match prepare(config, caps, &mut backend, &request_path, defaults, warm) {
        Ok(warm) => warm,
        Err(e) => {
            let _ = cleanup_backend(&backend, &[], None);
            return Err(e);
        }
    };
    let handle = SandboxHandle {
        runtime: RuntimeKind::Bubblewrap,
        run_id: config.run_id.clone(),
        sandbox_id: config.sandbox_id.clone(),
        sandbox_root,
        request_path,
        result_path,
        container_id: None,
        workspace_id: None,
        backend: serde_json::to_value(&backend).unwrap_or_default(),
    };
    Ok((handle, warm))
}

/// Create with an armed warm sandbox (see [`armed`]): its directories renamed to this
/// sandbox's, its cgroups (already at this configuration's limits) and its init the
/// sandbox's. An error (why) when its directories could not take this sandbox's names (a
/// leftover of these ids is there, say): it is then given up, and create goes on without it.
fn adopt_armed(
    config: &SandboxConfig,
    caps: &HostCaps,
    workspace: &WorkspaceState,
    defaults: Defaults,
    warm: warm::WarmSandbox,
    state_dir: &Path,
) -> Result<(SandboxHandle, Option<warm::ClaimedWarm>), String> {
    let mut backend = Backend {
        state_dir: state_dir.to_path_buf(),
        root_dir: config.root_dir.clone(),
        layer_tmpfs: false,
        layer_dir: None,
        flat_layer: false,
        cgroups: warm.cgroups.clone(),
        workspace: workspace.clone(),
    };
    let name = NativeRuntime::dir_name(config);
    let adopted = place_layer(caps, &config.controls, &mut backend, &name)
        .map_err(|e| format!("its layer: {e}"))
        .and_then(|()| match warm.armed.as_ref() {
            Some(armed) => armed
                .adopt(&backend)
                .map_err(|e| format!("its directories: {e}")),
            None => Err("it is not armed".into()),
        });
    if let Err(why) = adopted {
        warm.discard();
        return Err(why);
    }
    let (claimed, _cgroups) = warm.claim();
    let (sandbox_root, request_path, result_path) = project_dirs(&config.root_dir, config);
    let limits = defaults.limits(caps, &config.controls);
    let written = write_cleanup_record(config, &backend).and_then(|()| {
        finish_on_disk(
            config,
            &backend,
            &request_path,
            limits.pids,
            limits.memory_bytes,
        )
    });
    let handle = SandboxHandle {
        runtime: RuntimeKind::Bubblewrap,
        run_id: config.run_id.clone(),
        sandbox_id: config.sandbox_id.clone(),
        sandbox_root,
        request_path,
        result_path,
        container_id: None,
        workspace_id: None,
        backend: serde_json::to_value(&backend).unwrap_or_default(),
    };
    match written {
        Ok(()) => Ok((handle, Some(claimed))),
        // The sandbox is ours now: undone as a failed create is.
        Err(e) => {
            drop(claimed);
            let _ = cleanup_backend(&backend, &[], None);
            Err(format!("its records: {e}"))
        }
    }
}

/// A sandbox's directories in its project: its root
/// (`<root>/.smithers/sandboxes/<runId>/<sandboxId>`), the request and the result directories.
fn project_dirs(root_dir: &Path, config: &SandboxConfig) -> (PathBuf, PathBuf, PathBuf) {
    let sandbox_root = root_dir
        .join(".smithers")
        .join("sandboxes")
        .join(&config.run_id)
        .join(&config.sandbox_id);
    let request = sandbox_root.join("request");
    let result = sandbox_root.join("result");
    (sandbox_root, request, result)
}

/// A sandbox of these ids that a process left when it died between making it and storing
/// its handle (its row then holds nothing to clean up with, so recovery cannot): cleaned up
/// here as its own cleanup would, through the same confinement (the record's cgroups under
/// our parents, the request directory of the record's project through no link, a kept layer
/// moved into that project), so that the ids can be used again. Only when its cleanup record
/// names an owner that is not running any more; a sandbox without a record, our own, or
/// another live process's is left alone (`false`: create refuses, as before).
fn take_over_leftover(
    config: &SandboxConfig,
    caps: &HostCaps,
    state_dir: &Path,
) -> Result<bool, RuntimeError> {
    let Some(record) = owned::read_record(state_dir)? else {
        return Ok(false);
    };
    if !record.owner_is_gone() {
        return Ok(false);
    }
    let name = NativeRuntime::dir_name(config);
    let layer_dir = caps.layer_root.join(&name);
    let flat_upper = caps.layer_root.join(format!("{name}.upper"));
    let layer_exists = std::fs::symlink_metadata(&layer_dir).is_ok();
    let backend = Backend {
        state_dir: state_dir.to_path_buf(),
        root_dir: record.root_dir.clone(),
        layer_tmpfs: is_mount_point(&state_dir.join("layer")),
        layer_dir: layer_exists.then(|| layer_dir.clone()),
        flat_layer: std::fs::symlink_metadata(&flat_upper).is_ok()
            || (layer_exists && std::fs::symlink_metadata(layer_dir.join("upper")).is_err()),
        cgroups: record.cgroups.clone(),
        workspace: WorkspaceState::Overlay,
    };
    let (sandbox_root, request_path, result_path) = project_dirs(&record.root_dir, config);
    let handle = SandboxHandle {
        runtime: RuntimeKind::Bubblewrap,
        run_id: config.run_id.clone(),
        sandbox_id: config.sandbox_id.clone(),
        sandbox_root,
        request_path,
        result_path,
        container_id: None,
        workspace_id: None,
        backend: serde_json::to_value(&backend).unwrap_or_default(),
    };
    cleanup_confined(&handle, &backend, caps)?;
    Ok(true)
}

/// Where the workspace layer of a sandbox whose directories are named `name` goes: on the
/// disk-backed layer root, flat, when it has no disk limit and that root is not the state
/// root (else in the state directory, the default of [`Backend::layer`]).
fn place_layer(
    caps: &HostCaps,
    c: &smithers_runtime::Controls,
    backend: &mut Backend,
    name: &str,
) -> Result<(), RuntimeError> {
    if c.disk_limit_bytes.is_none() && caps.layer_root != caps.state_root {
        std::fs::create_dir_all(&caps.layer_root)
            .map_err(io_err("create layer directory", &caps.layer_root))?;
        restrict_mode(&caps.layer_root)?;
        backend.layer_dir = Some(caps.layer_root.join(name));
        backend.flat_layer = true;
    }
    Ok(())
}

/// What a sandbox's layer holds, made once the layer is (and its tmpfs mounted): the overlay's
/// upper and work directories (the copy of copy mode is made by ship), `/result`, the output
/// and request directories; and the new root's mount point, shared by every sandbox.
fn make_layer_subdirs(backend: &Backend) -> Result<(), RuntimeError> {
    let layer = backend.layer();
    let overlay_dirs = match backend.workspace {
        // (A flat layer is the work directory itself.)
        WorkspaceState::Overlay => [backend.upper(), backend.work()]
            .into_iter()
            .filter(|d| *d != layer)
            .collect(),
        WorkspaceState::Copy { .. } => vec![],
    };
    for dir in
        overlay_dirs
            .into_iter()
            .chain([backend.artifacts(), backend.out(), backend.request_dir()])
    {
        std::fs::create_dir(&dir).map_err(io_err("create", &dir))?;
    }
    let new_root = backend.new_root();
    match std::fs::create_dir(&new_root) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            Err(RuntimeError::io("create", &new_root, e))
        }
        _ => Ok(()),
    }
}

/// The sandbox's directories, cgroups and config; with a warm sandbox, its cgroups (given the
/// sandbox's limits) rather than new ones, and its init returned to stay attached.
fn prepare(
    config: &SandboxConfig,
    caps: &HostCaps,
    backend: &mut Backend,
    request_path: &Path,
    defaults: Defaults,
    warm: Option<warm::WarmSandbox>,
) -> Result<Option<warm::ClaimedWarm>, RuntimeError> {
    let c = &config.controls;
    place_layer(caps, c, backend, &NativeRuntime::dir_name(config))?;
    let limits = defaults.limits(caps, c);
    let (pids, memory) = (limits.pids, limits.memory_bytes);
    // A warm sandbox's cgroups take this one's limits (a memory limit below what its init
    // already uses is refused by the kernel: then it is given up for new cgroups).
    let warm = warm.and_then(|w| match CgroupHost::set_limits(&w.cgroups, &limits) {
        Ok(()) => Some(w.claim()),
        Err(_) => {
            w.discard();
            None
        }
    });
    let warm = match warm {
        Some((init, cgroups)) => {
            backend.cgroups = cgroups;
            Some(init)
        }
        None => {
            backend.cgroups = caps
                .cgroups
                .create(&NativeRuntime::cgroup_name(config), &limits)
                .map_err(|e| RuntimeError::spawn("create the sandbox cgroups", e))?;
            None
        }
    };
    // Before anything can join the cgroups: the one record cleanup from another process
    // trusts about what it may kill (the handle comes back from the project's database).
    write_cleanup_record(config, backend)?;
    let layer = backend.layer();
    std::fs::create_dir(&layer).map_err(io_err("create", &layer))?;
    if let Some(bytes) = c.disk_limit_bytes {
        let data = sys::cstring(&format!("size={bytes},mode=0700"));
        sys::mount(
            Some(c"tmpfs"),
            &layer,
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&data),
        )
        .map_err(|e| RuntimeError::spawn("mount the size-capped upper layer", e))?;
        backend.layer_tmpfs = true;
    }
    make_layer_subdirs(backend)?;
    finish_on_disk(config, backend, request_path, pids, memory)?;
    Ok(warm)
}

/// The record cleanup from another process trusts about what it may kill (see
/// [`owned::CleanupRecord`]).
fn write_cleanup_record(config: &SandboxConfig, backend: &Backend) -> Result<(), RuntimeError> {
    let record = owned::CleanupRecord::for_self(&config.root_dir, &backend.cgroups);
    write_private(
        &backend.state_dir.join(owned::CLEANUP_RECORD),
        &serde_json::to_vec(&record).unwrap_or_default(),
    )
}

/// Create's last writes: the project's state and request directories, and the config.
fn finish_on_disk(
    config: &SandboxConfig,
    backend: &Backend,
    request_path: &Path,
    pids: Option<u32>,
    memory: Option<u64>,
) -> Result<(), RuntimeError> {
    // The project's state directory, ignored by git when we make it.
    smithers_runtime::ensure_state_dir(&config.root_dir)
        .map_err(io_err("create", &config.root_dir.join(".smithers")))?;
    std::fs::create_dir_all(request_path).map_err(io_err("create", request_path))?;
    let stored = StoredConfig {
        config: config.clone(),
        effective_pids_limit: pids,
        effective_memory_limit: memory,
    };
    write_private(
        &backend.config_file(),
        &serde_json::to_vec(&stored).unwrap_or_default(),
    )
}

/// Makes the workspace copy of copy mode (in a blocking task: it reads the whole project)
/// and records what it copied in `copy-report.json` for the log. Copies into a scratch name
/// and renames, so an interrupted ship never leaves a partial copy that a later one would
/// take for complete.
async fn ship_copy(backend: &Backend) -> Result<(), RuntimeError> {
    let copy = backend.copy();
    if copy.is_dir() {
        return Ok(());
    }
    let partial = backend.layer().join("copy.partial");
    let root = backend.root_dir.clone();
    let manifest_file = backend.copy_manifest_file();
    let task = tokio::task::spawn_blocking(move || {
        remove_tree(&partial).map_err(io_err("remove a partial workspace copy", &partial))?;
        let mut manifest = smithers_patch::CopyManifestWriter::create(&manifest_file)
            .map_err(io_err("write the copy manifest", &manifest_file))?;
        let report = copy::copy_project(&root, &partial, Some(&mut manifest))?;
        manifest
            .finish()
            .map_err(io_err("write the copy manifest", &manifest_file))?;
        std::fs::rename(&partial, &copy).map_err(io_err("finish the workspace copy", &copy))?;
        Ok::<_, RuntimeError>(report)
    });
    let report = task
        .await
        .map_err(|e| RuntimeError::spawn("copy the project into the sandbox", e))??;
    let record = serde_json::json!({
        "copiedFiles": report.files,
        "copiedBytes": report.bytes,
        "leftOut": report.left_out,
    });
    write_private(&backend.copy_report_file(), record.to_string().as_bytes())
}

/// The config as `create` accepted it, kept in the state dir (it may hold env secrets, so it
/// is not put in the handle, which goes to the database).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredConfig {
    config: SandboxConfig,
    effective_pids_limit: Option<u32>,
    /// The memory limit in force: the config's, or the runtime's default
    /// ([`NativeOptions::default_memory_limit`]) where the memory controller exists.
    #[serde(default)]
    effective_memory_limit: Option<u64>,
}

/// The limits a sandbox gets when its config sets none.
#[derive(Debug, Clone, Copy)]
struct Defaults {
    pids: Option<u32>,
    memory: Option<u64>,
}

impl Defaults {
    /// The cgroup limits of a sandbox with these controls: its own, else the defaults where
    /// the controller exists (a warm sandbox's are those of a sandbox that sets none).
    fn limits(&self, caps: &HostCaps, c: &smithers_runtime::Controls) -> CgroupLimits {
        let pids = c
            .pids_limit
            .or(self.pids.filter(|_| caps.cgroups.source("pids").is_some()));
        let memory = c.memory_limit_bytes.or(self
            .memory
            .filter(|_| caps.cgroups.source("memory").is_some()));
        CgroupLimits {
            memory_bytes: memory,
            pids,
            cpus: c.cpu_limit,
        }
    }
}

fn write_private(path: &Path, data: &[u8]) -> Result<(), RuntimeError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_err("write", path))?;
    f.write_all(data).map_err(io_err("write", path))
}

fn restrict_mode(dir: &Path) -> Result<(), RuntimeError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::symlink_metadata(dir).map_err(io_err("inspect state root", dir))?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != euid {
        return Err(RuntimeError::spawn(
            "use the state root",
            format!(
                "{} is not a directory owned by uid {euid} (refusing a planted path)",
                dir.display()
            ),
        ));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io_err("restrict state root", dir))?;
    }
    Ok(())
}

/// Removes a tree we own, making directories writable where the overlay's work dir left
/// them mode 000.
pub(crate) fn remove_tree(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            use std::os::unix::fs::PermissionsExt;
            fn open_up(p: &Path) {
                if let Ok(meta) = std::fs::symlink_metadata(p) {
                    if meta.is_dir() {
                        let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
                        if let Ok(rd) = std::fs::read_dir(p) {
                            for entry in rd.flatten() {
                                open_up(&entry.path());
                            }
                        }
                    }
                }
            }
            open_up(path);
            std::fs::remove_dir_all(path)
        }
        Err(e) => Err(e),
    }
}

/// Jobs started by [`beside`]; `wait` returns their results in order.
struct Beside<T> {
    results: Vec<std::sync::mpsc::Receiver<T>>,
}

impl<T> Beside<T> {
    fn wait(self) -> Vec<Option<T>> {
        self.results.into_iter().map(|r| r.recv().ok()).collect()
    }
}

/// Starts each job on another thread: the tokio runtime's blocking pool when called within
/// one (its threads are already started; a new thread took 0.1–0.3 ms to get going here),
/// else a thread of its own.
fn beside<T, F>(jobs: impl IntoIterator<Item = F>) -> Beside<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let pool = tokio::runtime::Handle::try_current().ok();
    let results = jobs
        .into_iter()
        .map(|job| {
            let (tx, rx) = std::sync::mpsc::channel();
            let run = move || {
                let _ = tx.send(job());
            };
            match &pool {
                Some(pool) => drop(pool.spawn_blocking(run)),
                None => drop(std::thread::spawn(run)),
            }
            rx
        })
        .collect();
    Beside { results }
}

/// Everything `cleanup` does, also used to roll back a failed `create`; `handle_dirs` are the
/// handle's directories in the project that go too.
fn cleanup_backend(
    backend: &Backend,
    handle_dirs: &[&Path],
    kept_layer: Option<&Path>,
) -> Result<(), RuntimeError> {
    let mut problems = Vec::new();
    // Nothing may be removed from under a live sandbox.
    if backend.cgroups.populated() {
        backend
            .cgroups
            .kill_and_wait(std::time::Duration::from_secs(5));
    }
    // Before the layer's tmpfs goes: the step's writes that the bundle could not carry.
    if backend.keep_layer_marker().exists() {
        keep_layer(backend, kept_layer)?;
    }
    // Only our own sandbox's mounts: the layer tmpfs (and, defensively, a root left mounted by
    // a crashed init would be in its own mount namespace, gone with it).
    if backend.layer_tmpfs {
        let layer = backend.layer();
        if is_mount_point(&layer) {
            if let Err(e) = sys::umount2(&layer, libc::MNT_DETACH) {
                problems.push(e.to_string());
            }
        }
    }
    // Then everything side by side: on a disk mounted with `discard` (this project's machines)
    // each removed directory or data file waits for its blocks' discard, ~0.1 ms apiece. The
    // layer's `upper/` and `work/` and each of the handle's directories in the project are
    // removed on other threads; this one removes the cgroups and the state directory (a
    // tmpfs, by default), then (older handles) the emptied layer directory.
    let mut trees: Vec<PathBuf> = handle_dirs.iter().map(|d| d.to_path_buf()).collect();
    // A worktree's git layer, beside the upper directory (absent for every other project).
    trees.extend(
        [backend.git_common_upper(), backend.git_common_work()]
            .into_iter()
            .filter(|d| std::fs::symlink_metadata(d).is_ok()),
    );
    let emptied_layer = match (&backend.layer_dir, backend.flat_layer) {
        // The layer (the work directory, or the copy's parent) and the upper beside it.
        (Some(layer), true) => {
            trees.extend([layer.clone(), backend.upper()]);
            None
        }
        (Some(layer), false) => {
            trees.extend([backend.upper(), backend.work(), backend.copy()]);
            Some(layer)
        }
        (None, _) => None,
    };
    let removals = beside(trees.into_iter().map(|tree| {
        move || {
            remove_tree(&tree)
                .err()
                .map(|e| format!("remove {}: {e}", tree.display()))
        }
    }));
    let left = backend.cgroups.remove(std::time::Duration::from_secs(5));
    if !left.is_empty() {
        problems.push(format!(
            "cgroups still busy: {}",
            left.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if let Err(e) = remove_tree(&backend.state_dir) {
        problems.push(format!("remove {}: {e}", backend.state_dir.display()));
    }
    for removal in removals.wait() {
        match removal {
            Some(problem) => problems.extend(problem),
            None => problems.push("a removal failed without a report (it panicked)".into()),
        }
    }
    if let Some(layer) = emptied_layer {
        if let Err(e) = remove_tree(layer) {
            problems.push(format!("remove {}: {e}", layer.display()));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(RuntimeError::spawn(
            "clean up the sandbox",
            problems.join("; "),
        ))
    }
}

/// Moves the step's written layer (the overlay's upper directory, or the copy) to
/// `kept_layer`, the sandbox's `kept-layer` directory that cleanup derived from the ids, so
/// that the changes collect left out for a size limit are not lost: a rename where both are
/// on one file system, else a copy (modes, times and links kept; what a copy cannot make,
/// such as the overlay's whiteouts, is listed in `kept-layer.txt` beside it) and then the
/// layer is removed with the rest. Fails closed: with no trusted place to keep it, or when
/// the copy fails, cleanup stops before anything is removed.
fn keep_layer(backend: &Backend, kept_layer: Option<&Path>) -> Result<(), RuntimeError> {
    let Some(dest) = kept_layer else {
        return Err(RuntimeError::spawn(
            "keep the workspace layer",
            "changes were left out of the bundle for a size limit, and the sandbox's project directory is not one cleanup may write (see the other problems); the layer is left where it is",
        ));
    };
    let src = backend.written_layer();
    let marker = backend.keep_layer_marker();
    if std::fs::symlink_metadata(&src).is_err() {
        // Moved already (a cleanup stopped after the move): the kept layer is in place.
        return std::fs::remove_file(&marker).map_err(io_err("remove", &marker));
    }
    // An earlier kept layer of these ids (a second collect and cleanup) is replaced.
    if std::fs::symlink_metadata(dest).is_ok() {
        remove_tree(dest).map_err(|e| RuntimeError::io("replace the kept layer", dest, e))?;
    }
    let list = dest.with_file_name(smithers_runtime::kept_layer::KEPT_LAYER_NOTES);
    if let Err(e) = std::fs::remove_file(&list) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(RuntimeError::io("replace the kept layer", &list, e));
        }
    }
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(io_err("create", parent))?;
    }
    match std::fs::rename(&src, dest) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            let report = copy::copy_project(&src, dest, None)?;
            if !report.left_out.is_empty() {
                let text = format!(
                    "not copied from the workspace layer (not regular files, links or directories):\n{}\n",
                    report.left_out.join("\n")
                );
                std::fs::write(&list, text).map_err(io_err("write", &list))?;
            }
        }
        Err(e) => return Err(RuntimeError::io("keep the workspace layer", &src, e)),
    }
    std::fs::remove_file(&marker).map_err(io_err("remove", &marker))
}

/// The default state root: a directory on a tmpfs, so that the few small files and
/// directories of each sandbox cost no journal commits to create and remove (on this
/// project's machines, removing a sandbox's state on ext4 took 1–11 ms; on tmpfs, well under
/// one). In order: `$XDG_RUNTIME_DIR/smithers-sandbox`, `/run/smithers-sandbox` (root),
/// `/dev/shm/smithers-sandbox-<uid>`, each only where it is a tmpfs and not taken by another
/// user; else `$TMPDIR/smithers-sandbox-<uid>`.
pub fn default_state_root(uid: u32) -> PathBuf {
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        if dir.is_absolute() {
            candidates.push(dir.join("smithers-sandbox"));
        }
    }
    if uid == 0 {
        candidates.push(PathBuf::from("/run/smithers-sandbox"));
    }
    candidates.push(PathBuf::from(format!("/dev/shm/smithers-sandbox-{uid}")));
    candidates
        .into_iter()
        .find(|c| {
            use std::os::unix::fs::MetadataExt;
            let on_tmpfs = c.parent().is_some_and(sys::is_tmpfs);
            let usable = match std::fs::symlink_metadata(c) {
                Ok(m) => m.is_dir() && m.uid() == uid,
                Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            };
            on_tmpfs && usable
        })
        .unwrap_or_else(|| std::env::temp_dir().join(format!("smithers-sandbox-{uid}")))
}

fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (
        std::fs::metadata(path),
        path.parent().map(std::fs::metadata),
    ) {
        (Ok(a), Some(Ok(b))) => a.dev() != b.dev(),
        _ => false,
    }
}

#[async_trait]
impl Runtime for NativeRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Bubblewrap
    }

    async fn probe(&self) -> EnforcementReport {
        let caps = self.caps();
        let findings = self.findings().await;
        let mode = self.options.workspace;
        self.probe
            .get_or_init(|| async move { report::probe(&caps, findings, mode) })
            .await
            .clone()
    }

    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
        self.create_inner(config).await
    }

    async fn ship(
        &self,
        handle: &SandboxHandle,
        request: &RequestBundle,
    ) -> Result<ShipReport, RuntimeError> {
        let backend = Backend::from_handle(handle, "ship")?;
        if !backend.state_dir.is_dir() {
            return Err(RuntimeError::OutOfOrder {
                verb: "ship",
                reason: "the sandbox does not exist (cleaned up?)".into(),
            });
        }
        let bytes =
            serde_json::to_vec(&request.request).map_err(|e| RuntimeError::InvalidControl {
                control: "request",
                reason: e.to_string(),
            })?;
        std::fs::create_dir_all(&handle.request_path)
            .map_err(io_err("create", &handle.request_path))?;
        let path = handle.request_path.join(plan::REQUEST_FILE_NAME);
        write_private(&path, &bytes)?;
        // The copy the sandbox reads (`Backend::request_dir`); made here too for a handle
        // from before it existed.
        let shown = backend.request_dir();
        std::fs::create_dir_all(&shown).map_err(io_err("create", &shown))?;
        write_private(&shown.join(plan::REQUEST_FILE_NAME), &bytes)?;
        // An overlay needs no shipping: its lower layer is the project itself. A copy is made
        // now (once: a second ship keeps the copy the step may already have changed). The
        // reported size stays the request's (the spec's bundleSizeBytes); what the copy cost
        // is in the workspace record of the log.
        if backend.workspace.copy_reason().is_some() {
            ship_copy(&backend).await?;
        }
        Ok(ShipReport {
            bundle_size_bytes: bytes.len() as u64,
        })
    }

    async fn execute(
        &self,
        handle: &SandboxHandle,
        command: &StepCommand,
        cancel: CancellationToken,
        output: &dyn OutputSink,
    ) -> Result<ExecOutcome, RuntimeError> {
        let backend = Backend::from_handle(handle, "execute")?;
        let caps = self.caps();
        let zygote = self.options.zygote.then_some(&self.zygote);
        let warm = self.take_attached(&backend);
        // A step that claimed a warm sandbox lets the pool refill once its command runs.
        let pool = match (&warm, self.warm_pool()) {
            (Some(_), Some(Ok(pool))) => Some(pool),
            _ => None,
        };
        let started = move |armed_served: bool| {
            if let Some(pool) = &pool {
                pool.step_started(armed_served);
            }
        };
        exec::execute(
            &caps, zygote, &backend, command, cancel, output, warm, &started,
        )
        .await
    }

    async fn collect(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError> {
        let backend = Backend::from_handle(handle, "collect")?;
        let handle = handle.clone();
        blocking("collect the sandbox's bundle", move || {
            collect::collect(&backend, &handle)
        })
        .await?
    }

    async fn cleanup(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        let backend = match Backend::from_handle(handle, "cleanup") {
            Ok(b) => b,
            // A handle without state (create failed before producing one) holds nothing.
            Err(_) if handle.backend.is_null() => return Ok(()),
            Err(e) => return Err(e),
        };
        // A warm init never executed ends first (its cgroups are the sandbox's).
        drop(self.take_attached(&backend));
        let caps = self.caps();
        let handle = handle.clone();
        // Kills that wait for the cgroups to empty, removals that retry while they are busy,
        // whole trees removed: on a blocking thread (see `blocking`).
        blocking("clean up the sandbox", move || {
            cleanup_confined(&handle, &backend, &caps)
        })
        .await?
    }
}

/// `cleanup` once the handle is read: confines it to what is ours (see `owned::confine`),
/// then removes everything the sandbox had.
fn cleanup_confined(
    handle: &SandboxHandle,
    backend: &Backend,
    caps: &HostCaps,
) -> Result<(), RuntimeError> {
    test_stall::cleanup(&handle.sandbox_id);
    let confined = owned::confine(
        handle,
        backend,
        &caps.state_root,
        &caps.layer_root,
        &caps.cgroups,
    )?;
    let dirs: Vec<&Path> = confined.request_dir.iter().map(PathBuf::as_path).collect();
    let cleaned = cleanup_backend(&confined.backend, &dirs, confined.kept_layer.as_deref());
    if confined.left_alone.is_empty() {
        return cleaned;
    }
    let left = format!("left alone: {}", confined.left_alone.join("; "));
    Err(match cleaned {
        Ok(()) => RuntimeError::spawn("clean up the sandbox", left),
        Err(e) => RuntimeError::spawn("clean up the sandbox", format!("{e}; {left}")),
    })
}

/// Runs the blocking part of a verb (file system walks, fsyncs, the zygote's answer, the
/// sleep loops of cgroup kills and busy removals) so that no async worker waits on it: in
/// `serve`, one slow sandbox must not stall the HTTP, event and watchdog tasks of every
/// other. On a multi-thread runtime that is `block_in_place`: on a worker, tokio first hands
/// the worker's other tasks to another thread; on the thread of a `block_on` (the CLI's `run`
/// and the resident service drive their one step there, and no task waits on that thread)
/// the job simply runs, without the two thread hand-offs of the blocking pool (~0.15 ms of a
/// served step). A current-thread runtime has no other thread to hand its tasks to: the job
/// goes to the blocking pool. A panic there is a panic of the verb, as it was inline;
/// `operation` names the failure when the runtime is shutting down and a job sent to the
/// blocking pool cannot run.
pub(crate) async fn blocking<T, F>(operation: &'static str, job: F) -> Result<T, RuntimeError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    use tokio::runtime::{Handle, RuntimeFlavor};
    if Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread) {
        return Ok(tokio::task::block_in_place(job));
    }
    match tokio::task::spawn_blocking(job).await {
        Ok(value) => Ok(value),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(RuntimeError::spawn(operation, e)),
    }
}

/// A test hook, compiled into debug builds only: `SMITHERS_SANDBOX_TEST_CLEANUP_STALL=
/// <prefix>:<ms>` makes the cleanup of every sandbox whose id starts with `<prefix>` sleep
/// `<ms>` first, in the blocking part, as a cleanup waiting on a busy cgroup or mount does.
/// The load test uses it to hold cleanups stuck while it checks that `serve` still answers
/// (nothing the kernel offers keeps a cleanup waiting that long on demand: SIGKILL and
/// lazy unmounts win within milliseconds). Release builds ignore the variable.
mod test_stall {
    #[cfg(debug_assertions)]
    pub(crate) fn cleanup(sandbox_id: &str) {
        let Ok(spec) = std::env::var("SMITHERS_SANDBOX_TEST_CLEANUP_STALL") else {
            return;
        };
        let Some((prefix, ms)) = spec.rsplit_once(':') else {
            return;
        };
        if let (false, Ok(ms)) = (prefix.is_empty(), ms.parse::<u64>()) {
            if sandbox_id.starts_with(prefix) {
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
        }
    }

    #[cfg(not(debug_assertions))]
    pub(crate) fn cleanup(_: &str) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use report::OverlayCheck;

    #[test]
    fn workspace_mode_decision() {
        let unusable = || OverlayCheck::Unusable("mount overlay: EINVAL".into());
        assert_eq!(
            decide_workspace(WorkspaceMode::Auto, OverlayCheck::Usable).unwrap(),
            WorkspaceState::Overlay
        );
        let auto = decide_workspace(WorkspaceMode::Auto, unusable()).unwrap();
        assert!(
            auto.copy_reason()
                .is_some_and(|r| r.contains("overlayfs cannot be mounted")
                    && r.contains("mount overlay: EINVAL")),
            "{auto:?}"
        );
        // Explicitly asked for overlay: fail closed, naming the way out.
        let err = decide_workspace(WorkspaceMode::Overlay, unusable()).unwrap_err();
        assert!(matches!(err, RuntimeError::Unavailable { .. }), "{err}");
        assert!(err.to_string().contains("mount overlay: EINVAL"), "{err}");
        assert_eq!(
            decide_workspace(WorkspaceMode::Overlay, OverlayCheck::Usable).unwrap(),
            WorkspaceState::Overlay
        );
        for check in [OverlayCheck::Usable, unusable()] {
            let copy = decide_workspace(WorkspaceMode::Copy, check).unwrap();
            assert!(copy.copy_reason().is_some_and(|r| r.contains("requested")));
        }
        // The probe never got to overlayfs: no fallback (execute reports the real problem).
        let unknown = || OverlayCheck::Unknown("no user namespaces".into());
        for mode in [WorkspaceMode::Auto, WorkspaceMode::Overlay] {
            assert_eq!(
                decide_workspace(mode, unknown()).unwrap(),
                WorkspaceState::Overlay
            );
        }
        for mode in [
            WorkspaceMode::Auto,
            WorkspaceMode::Overlay,
            WorkspaceMode::Copy,
        ] {
            assert_eq!(WorkspaceMode::parse(mode.as_str()), Some(mode));
        }
        assert_eq!(WorkspaceMode::parse("Copy"), None);
    }

    #[test]
    fn handles_without_a_workspace_field_are_overlay() {
        let old = serde_json::json!({
            "stateDir": "/s", "rootDir": "/p", "layerTmpfs": false,
            "cgroups": serde_json::to_value(SandboxCgroups::default()).unwrap(),
        });
        let b: Backend = serde_json::from_value(old).unwrap();
        assert_eq!(b.workspace, WorkspaceState::Overlay);
        let copy = Backend {
            workspace: WorkspaceState::Copy {
                reason: "why".into(),
            },
            ..b
        };
        let v = serde_json::to_value(&copy).unwrap();
        assert_eq!(
            v["workspace"],
            serde_json::json!({"mode": "copy", "reason": "why"})
        );
        assert_eq!(serde_json::from_value::<Backend>(v).unwrap(), copy);
    }

    /// Cleanup keeps a layer marked kept: moved across file systems (the state directory on
    /// /dev/shm, the project on another) by a copy that keeps contents, links and fifos, then
    /// the rest is removed; without a trusted place it fails before removing anything.
    #[test]
    fn cleanup_keeps_a_marked_layer_across_file_systems() {
        let shm = Path::new("/dev/shm");
        let project = tempfile::tempdir().unwrap();
        if !sys::is_tmpfs(shm) || sys::is_tmpfs(project.path()) {
            println!("SKIP no tmpfs at /dev/shm beside a disk-backed $TMPDIR");
            return;
        }
        let state = tempfile::tempdir_in(shm).unwrap();
        let backend = Backend {
            state_dir: state.path().join("r+s"),
            root_dir: project.path().to_path_buf(),
            layer_tmpfs: false,
            layer_dir: None,
            flat_layer: false,
            cgroups: SandboxCgroups::default(),
            workspace: WorkspaceState::Overlay,
        };
        let upper = backend.upper();
        std::fs::create_dir_all(upper.join("d")).unwrap();
        std::fs::write(upper.join("d/big.bin"), vec![7u8; 5000]).unwrap();
        std::os::unix::fs::symlink("d/big.bin", upper.join("link")).unwrap();
        let fifo = upper.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        std::fs::write(backend.keep_layer_marker(), b"").unwrap();
        // No trusted place: nothing is removed.
        let err = cleanup_backend(&backend, &[], None).unwrap_err();
        assert!(err.to_string().contains("left where it is"), "{err}");
        assert!(upper.join("d/big.bin").is_file() && backend.state_dir.is_dir());
        let kept = smithers_runtime::kept_layer::kept_layer_path(project.path(), "r", "s").unwrap();
        cleanup_backend(&backend, &[], Some(&kept)).unwrap();
        assert_eq!(
            std::fs::read(kept.join("d/big.bin")).unwrap(),
            vec![7u8; 5000]
        );
        assert_eq!(
            std::fs::read_link(kept.join("link")).unwrap(),
            Path::new("d/big.bin")
        );
        // A fifo is made again; only device nodes (the overlay's whiteouts), which need
        // privilege, would be listed beside the kept layer.
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(kept.join("fifo"))
            .unwrap()
            .file_type()
            .is_fifo());
        assert!(!kept
            .with_file_name(smithers_runtime::kept_layer::KEPT_LAYER_NOTES)
            .exists());
        assert!(!backend.state_dir.exists() && !upper.exists());
        // Without the marker, the layer is removed as before.
        std::fs::create_dir_all(upper.join("d")).unwrap();
        std::fs::write(upper.join("d/x"), b"x").unwrap();
        cleanup_backend(&backend, &[], Some(&kept)).unwrap();
        assert!(!upper.exists());
        assert!(
            kept.join("d/big.bin").is_file(),
            "an unmarked cleanup leaves it alone"
        );
    }
}
