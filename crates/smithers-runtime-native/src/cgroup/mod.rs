//! cgroups v1 and v2 behind one interface: limits (memory, pids, cpu), accounting (cpu time,
//! peak memory, peak pids, OOM kills, pids-limit hits), killing a whole tree and removal.
//!
//! Sandbox cgroups are created **under the process's own cgroup** (from `/proc/self/cgroup`),
//! never at a hierarchy's root: the runtime may itself be confined (a systemd scope, a
//! container, a CI job) and may only have delegation below its own node.
//!
//! Hybrid hosts (v1 controllers plus a v2 tree with only core files, like this project's
//! machines) use the v1 controllers for limits and the v2 tree for `cgroup.kill` and
//! `cgroup.events`. Pure v2 hosts use one directory for everything.
//!
//! What exists is not what this process may use: [`CgroupHost::detect`] keeps only the
//! hierarchies this process can create cgroups in (an ordinary user's cgroup belongs to root
//! unless it was delegated, a container's cgroup file system is read-only) and records, for
//! every controller it drops, why and the fix ([`CgroupHost::unusable`]). A sandbox then runs
//! without that controller: the pid namespace, not a cgroup, kills its tree, and a limit that
//! needs it is refused.
//!
//! On v2 a cgroup's controllers reach its children only through its `cgroup.subtree_control`,
//! which the kernel refuses to change while the cgroup holds processes (the
//! no-internal-processes rule; every systemd service and scope holds its own). So, as container
//! engines do, the runtime first moves itself into a leaf of its own cgroup
//! ([`SUPERVISOR_LEAF`]) and then enables the controllers; sandboxes are created beside that
//! leaf. When other processes stay behind in the cgroup, the controllers are unusable and the
//! fix says how to give the runtime a cgroup of its own.
//!
//! One exception to "under the process's own cgroup": root on a pure v2 host that systemd does
//! not run (a container's init, a root shell on a host with another init), whose own cgroup
//! cannot have the controllers (shared with other processes, or not given them), makes its
//! sandboxes' cgroups at the top of the hierarchy, in [`TOP_LEVEL_DIR`], as runc's and
//! podman's cgroupfs drivers do: the root cgroup may enable controllers while it holds
//! processes, and no manager owns the tree there. Under systemd the tree is systemd's, and
//! the runtime asks it for a delegated scope instead.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What this process may use of the host's hierarchies ([`CgroupHost::detect`]).
mod detect;
/// Moving this process and its companions between cgroups (see `warm::PreForked`).
pub(crate) mod procs;
/// A sandbox's cgroups: made, read, killed, removed.
mod sandbox;
/// A delegated scope asked of systemd.
mod systemd;
#[cfg(test)]
mod tests;

/// The limits a sandbox asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CgroupLimits {
    pub memory_bytes: Option<u64>,
    pub pids: Option<u32>,
    /// Cores (0.5 = half of one core).
    pub cpus: Option<f64>,
}

/// The cgroup layout of this host as seen from this process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupHost {
    /// v1 controller → this process's cgroup directory in that hierarchy.
    pub v1: BTreeMap<String, PathBuf>,
    /// This process's directory in the v2 hierarchy, if one is mounted.
    pub v2: Option<PathBuf>,
    /// Controllers available in the v2 tree at our node (from `cgroup.controllers`).
    pub v2_controllers: BTreeSet<String>,
    /// Controllers (and `core`, the v2 kill and events files) that this host has or might
    /// have but this process cannot use, with why and the fix. Filled by `detect`.
    pub unusable: BTreeMap<String, Unusable>,
    /// Where the v2 hierarchy is mounted (its top as this process sees it), if one is.
    pub v2_mount: Option<PathBuf>,
}

/// Why a controller cannot be used by this process, and what would make it usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unusable {
    pub reason: String,
    pub fix: String,
}

/// The v2 leaf the runtime moves itself into before enabling controllers in its own cgroup
/// (see the module docs). A process already in a leaf of this name uses the leaf's parent.
pub const SUPERVISOR_LEAF: &str = "smithers-supervisor";

/// Set (to anything) to keep the runtime from asking systemd for a delegated scope.
pub const NO_SYSTEMD_SCOPE_ENV: &str = "SMITHERS_SANDBOX_NO_SYSTEMD_SCOPE";

/// The fix for a cgroup this process may not write, on a host systemd runs: a delegated one
/// from systemd (see [`delegate_fix`] for the one that fits the host).
pub const DELEGATE_FIX: &str = "run the runtime in a delegated cgroup: systemd-run --user --scope -p Delegate=yes smithers-sandbox ... (as root: systemd-run --scope -p Delegate=yes ...)";

/// The directory at the top of the v2 hierarchy under which root outside systemd makes its
/// sandboxes' cgroups when its own cgroup cannot have them (see the module docs).
pub const TOP_LEVEL_DIR: &str = "smithers-sandbox";

/// Whether systemd runs this host (what `sd_booted(3)` checks): only then can a fix ask it
/// for a scope, and only then does it own the cgroup tree.
pub fn systemd_runs() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

fn euid_is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The fix for a cgroup this process may not write or that lacks a controller, fitting this
/// host: systemd's delegation where systemd runs, else what root (or the user's
/// administrator) does by hand.
pub fn delegate_fix() -> String {
    delegate_fix_for(systemd_runs(), euid_is_root())
}

fn delegate_fix_for(systemd: bool, root: bool) -> String {
    match (systemd, root) {
        (true, _) => DELEGATE_FIX.into(),
        (false, true) => format!(
            "this host has no systemd to delegate a cgroup: give the runtime a writable cgroup v2 hierarchy whose top has the controller (it then makes its sandboxes' cgroups in /sys/fs/cgroup/{TOP_LEVEL_DIR}), or start it in a cgroup of its own whose parents enable the controller in cgroup.subtree_control"
        ),
        (false, false) => "this host has no systemd to delegate a cgroup: have root make one for you (mkdir /sys/fs/cgroup/<name>, enable memory pids cpu in each parent's cgroup.subtree_control, chown the directory and its cgroup.procs, cgroup.subtree_control and cgroup.threads to your user) and start the runtime in it (echo $$ > /sys/fs/cgroup/<name>/cgroup.procs), or run it as root".into(),
    }
}

/// The fix for a cgroup whose other processes keep controllers from its children, fitting
/// this host.
fn busy_fix_for(systemd: bool, root: bool, dir: &Path) -> String {
    match (systemd, root) {
        (true, _) => "give the runtime a cgroup of its own: systemd-run --scope -p Delegate=yes smithers-sandbox ... (as an ordinary user: systemd-run --user --scope -p Delegate=yes ...), or a systemd service of its own".into(),
        (false, true) => format!(
            "this host has no systemd: give the runtime a writable cgroup v2 hierarchy (it then makes its sandboxes' cgroups in /sys/fs/cgroup/{TOP_LEVEL_DIR}), or start it in a cgroup of its own (mkdir /sys/fs/cgroup/<name>; echo $$ > /sys/fs/cgroup/<name>/cgroup.procs)"
        ),
        (false, false) => format!(
            "this host has no systemd: move the other processes out of {} into a cgroup of their own, or start the runtime in a delegated cgroup of its own",
            dir.display()
        ),
    }
}

/// Which mechanism provides a controller on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControllerSource {
    V1(PathBuf),
    V2(PathBuf),
}

/// One directory of a sandbox's cgroups, with the controllers it serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CgroupDir {
    pub path: PathBuf,
    pub v2: bool,
    /// `memory`, `pids`, `cpu`, `cpuacct` for v1; for v2 also `core` (kill/events).
    pub controllers: Vec<String>,
}

/// The cgroups of one sandbox. Plain data: stored in the handle for cleanup from elsewhere.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxCgroups {
    pub dirs: Vec<CgroupDir>,
}

/// Counters read after a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupStats {
    pub cpu_time_ns: Option<u64>,
    pub peak_memory_bytes: Option<u64>,
    pub peak_pids: Option<u64>,
    pub oom_kills: u64,
    pub pids_limit_hits: u64,
}

/// A cgroup operation that failed.
#[derive(Debug, thiserror::Error)]
#[error("{operation} {path}: {source}")]
pub struct CgroupError {
    pub operation: &'static str,
    pub path: String,
    #[source]
    pub source: std::io::Error,
}

fn cg_err(operation: &'static str, path: &Path, source: std::io::Error) -> CgroupError {
    CgroupError {
        operation,
        path: path.display().to_string(),
        source,
    }
}

/// Whether `name` is one [`crate::NativeRuntime`] gives a sandbox's cgroup:
/// `smithers-<16 lowercase hex digits>`. Cleanup from a stored handle touches no other.
pub fn is_sandbox_cgroup_name(name: &str) -> bool {
    name.strip_prefix("smithers-").is_some_and(|hex| {
        hex.len() == 16 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// Controllers we may use for limits and accounting.
pub const CONTROLLERS: &[&str] = &["memory", "pids", "cpu", "cpuacct"];
