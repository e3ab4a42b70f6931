//! The runtime's options ([`NativeOptions`]) and the workspace mode they choose.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::init_command::InitCommand;

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

/// Options of [`crate::NativeRuntime`].
#[derive(Debug, Clone)]
pub struct NativeOptions {
    /// The init to run; `None` = [`InitCommand::locate`].
    pub init: Option<InitCommand>,
    /// Where per-sandbox host state lives (config, log, result file, artifacts, the new
    /// root's mount point); `None` = a tmpfs runtime directory ([`crate::default_state_root`]).
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
    /// Refill the warm pool only once a step is over ([`crate::NativeRuntime::steps_over`]), not as
    /// soon as its command starts: making a sandbox takes a few milliseconds of CPU, which
    /// then never competes with a step a user is waiting for (the resident service, which
    /// serves one step at a time and says when each is over). Default `false` (`serve`'s
    /// concurrent steps would otherwise wait for one another's end).
    pub warm_refill_after_step: bool,
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
