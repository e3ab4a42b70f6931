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
use std::time::Duration;

use serde::{Deserialize, Serialize};

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

impl CgroupHost {
    /// Reads `/proc/self/mountinfo` and `/proc/self/cgroup`, then keeps what this process
    /// can use (see the module docs): on pure v2 this may move the process into
    /// [`SUPERVISOR_LEAF`] (or a systemd scope) and enable controllers in its own cgroup.
    ///
    /// Once per process: moving the process is process-wide, and two runtimes of one process
    /// (the tests make many) moving it at once would race each other's forks, which inherit
    /// the cgroup the process is in at that instant.
    pub fn detect() -> CgroupHost {
        static HOST: std::sync::OnceLock<CgroupHost> = std::sync::OnceLock::new();
        HOST.get_or_init(CgroupHost::detect_now).clone()
    }

    fn detect_now() -> CgroupHost {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mut host = CgroupHost::parse(&mountinfo, &own);
        host.keep_usable(&own);
        if host.wants_systemd_scope() {
            match systemd::enter_delegated_scope() {
                Ok(()) => {
                    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
                    let mut scoped = CgroupHost::parse(&mountinfo, &own);
                    scoped.keep_usable(&own);
                    return scoped;
                }
                Err(why) => {
                    for u in host.unusable.values_mut() {
                        u.reason
                            .push_str(&format!("; no delegated systemd scope either: {why}"));
                    }
                }
            }
        }
        host
    }

    /// On pure v2, when this process may not make its sandboxes' cgroups where it is (an
    /// ordinary user in a login session, root among other processes) and systemd runs the
    /// host, a transient scope with `Delegate=yes` is the way (see [`systemd`]).
    fn wants_systemd_scope(&self) -> bool {
        self.v1.is_empty()
            && std::env::var_os(NO_SYSTEMD_SCOPE_ENV).is_none()
            && ["memory", "pids"]
                .iter()
                .any(|c| self.unusable.contains_key(*c))
            && std::path::Path::new("/run/systemd/system").is_dir()
    }

    /// Drops the hierarchies this process cannot create cgroups in, recording why.
    fn keep_usable(&mut self, own_cgroup: &str) {
        let v1: Vec<(String, PathBuf)> = std::mem::take(&mut self.v1).into_iter().collect();
        for (ctrl, dir) in v1 {
            match writable(&dir, &["tasks"]) {
                Ok(()) => {
                    self.v1.insert(ctrl, dir);
                }
                Err(why) => {
                    self.unusable.insert(
                        ctrl.clone(),
                        Unusable {
                            reason: format!("the v1 {ctrl} cgroup {}: {why}", dir.display()),
                            fix: fix_for(&why),
                        },
                    );
                }
            }
        }
        self.keep_usable_v2(own_cgroup);
        if self.v1.is_empty() && euid_is_root() && !systemd_runs() {
            self.use_top_level_if_better();
        }
    }

    /// The v2 part of [`Self::keep_usable`]: this process's own cgroup, moved into its leaf
    /// and given the controllers where it can be.
    fn keep_usable_v2(&mut self, own_cgroup: &str) {
        let Some(mut dir) = self.v2.take() else {
            return;
        };
        // A runtime (ours, or the process that started us) already moved into the leaf:
        // sandboxes go beside it, under its parent.
        let in_leaf = dir.file_name().is_some_and(|n| n == SUPERVISOR_LEAF);
        if in_leaf {
            dir.pop();
        }
        if let Err(why) = writable(&dir, &["cgroup.procs", "cgroup.subtree_control"]) {
            let unusable = Unusable {
                reason: format!("the v2 cgroup {}: {why}", dir.display()),
                fix: fix_for(&why),
            };
            self.unusable.insert("core".into(), unusable.clone());
            for ctrl in ["memory", "pids", "cpu"] {
                self.unusable
                    .entry(ctrl.into())
                    .or_insert_with(|| unusable.clone());
            }
            return;
        }
        let read_set = |file: &str| -> BTreeSet<String> {
            std::fs::read_to_string(dir.join(file))
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect()
        };
        let available = read_set("cgroup.controllers");
        let mut enabled = read_set("cgroup.subtree_control");
        let wanted: Vec<&str> = ["memory", "pids", "cpu"]
            .into_iter()
            .filter(|c| !self.v1.contains_key(*c) && !self.unusable.contains_key(*c))
            .collect();
        for ctrl in &wanted {
            if !available.contains(*ctrl) {
                self.unusable.insert(
                    ctrl.to_string(),
                    Unusable {
                        reason: format!(
                            "the {ctrl} controller is not delegated to the v2 cgroup {} (its parent's cgroup.subtree_control lacks it)",
                            dir.display()
                        ),
                        fix: delegate_fix(),
                    },
                );
            }
        }
        let missing: Vec<&str> = wanted
            .iter()
            .copied()
            .filter(|c| available.contains(*c) && !enabled.contains(*c))
            .collect();
        if !missing.is_empty() {
            // The root cgroup (of the hierarchy or of our cgroup namespace) may hold processes
            // and still have controllers enabled; any other cgroup must be emptied first.
            let at_root = own_cgroup.lines().any(|l| l == "0::/");
            // Moved now, by this call (and so to be undone if nothing is gained).
            let entered = !at_root && !in_leaf && enter_leaf(&dir).is_ok();
            for ctrl in missing {
                match enable(&dir, ctrl) {
                    Ok(()) => {
                        enabled.insert(ctrl.to_string());
                    }
                    Err(e) => {
                        let busy = e.raw_os_error() == Some(libc::EBUSY);
                        self.unusable.insert(
                            ctrl.to_string(),
                            Unusable {
                                reason: if busy {
                                    format!(
                                        "enabling {ctrl} in {}/cgroup.subtree_control: the cgroup holds other processes (the kernel's no-internal-processes rule){}",
                                        dir.display(),
                                        if entered || in_leaf { ", after this process moved into its own leaf" } else { "" }
                                    )
                                } else {
                                    format!(
                                        "enabling {ctrl} in {}/cgroup.subtree_control: {e}",
                                        dir.display()
                                    )
                                },
                                fix: if busy {
                                    busy_fix_for(systemd_runs(), euid_is_root(), &dir)
                                } else {
                                    delegate_fix()
                                },
                            },
                        );
                    }
                }
            }
            if entered && !wanted.iter().any(|c| enabled.contains(*c)) {
                // Nothing gained: leave the process where it was.
                let _ = move_into(&dir);
            }
        }
        self.v2_controllers = enabled
            .into_iter()
            .filter(|c| available.contains(c))
            .collect();
        self.v2 = Some(dir);
    }

    /// Root outside systemd on pure v2 (see the module docs): when its own cgroup lacks
    /// controllers, the sandboxes' parent becomes [`TOP_LEVEL_DIR`] at the top of the
    /// hierarchy if that gives more of them; else the reasons say what the top refused.
    fn use_top_level_if_better(&mut self) {
        let (Some(own), Some(mount)) = (self.v2.clone(), self.v2_mount.clone()) else {
            return;
        };
        // Only controllers the top has (a kernel without one has it nowhere), so that
        // nothing is made at the top for a controller it cannot give either.
        let at_top = std::fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
        let lacking: Vec<&str> = ["memory", "pids", "cpu"]
            .into_iter()
            .filter(|c| !self.v2_controllers.contains(*c))
            .filter(|c| at_top.split_whitespace().any(|t| t == *c))
            .collect();
        if lacking.is_empty() || own == mount.join(TOP_LEVEL_DIR) {
            return;
        }
        match top_level_parent(&mount, &["memory", "pids", "cpu"]) {
            Ok((parent, enabled))
                if enabled.is_superset(&self.v2_controllers)
                    && enabled.len() > self.v2_controllers.len() =>
            {
                for ctrl in &enabled {
                    self.unusable.remove(ctrl);
                }
                self.v2 = Some(parent);
                self.v2_controllers = enabled;
            }
            Ok((parent, _)) => {
                for ctrl in lacking {
                    if let Some(u) = self.unusable.get_mut(ctrl) {
                        u.reason.push_str(&format!(
                            "; {} at the top of the hierarchy gives fewer controllers",
                            parent.display()
                        ));
                    }
                }
            }
            Err(why) => {
                for ctrl in lacking {
                    if let Some(u) = self.unusable.get_mut(ctrl) {
                        u.reason
                            .push_str(&format!("; the top of the hierarchy neither: {why}"));
                    }
                }
            }
        }
    }

    /// Pure part of [`CgroupHost::detect`].
    pub fn parse(mountinfo: &str, own_cgroup: &str) -> CgroupHost {
        // hierarchy key ("memory" / "cpu,cpuacct" / "" for v2) → own path
        let mut own: BTreeMap<String, String> = BTreeMap::new();
        for line in own_cgroup.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            own.insert(ctrls.to_string(), path.to_string());
        }
        let mut host = CgroupHost::default();
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let left: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            if left.len() < 5 || right.len() < 3 {
                continue;
            }
            let (mount_root, mount_point) = (left[3], unescape(left[4]));
            let (fstype, super_opts) = (right[0], right[2]);
            let rel = |own_path: &str| -> Option<PathBuf> {
                // Our cgroup must be visible through this mount (below its root).
                let rest = Path::new(own_path).strip_prefix(mount_root).ok()?;
                Some(Path::new(&mount_point).join(rest))
            };
            if fstype == "cgroup2" {
                if host.v2.is_none() {
                    if let Some(path) = own.get("").and_then(|p| rel(p)) {
                        host.v2 = Some(path);
                        host.v2_mount = Some(PathBuf::from(&mount_point));
                    }
                }
            } else if fstype == "cgroup" {
                let ctrls: Vec<&str> = super_opts
                    .split(',')
                    .filter(|o| CONTROLLERS.contains(o))
                    .collect();
                if ctrls.is_empty() {
                    continue;
                }
                // /proc/self/cgroup names the hierarchy by its controller list in any order.
                let key = own.keys().find(|k| {
                    let mut a: Vec<&str> =
                        k.split(',').filter(|c| CONTROLLERS.contains(c)).collect();
                    let mut b = ctrls.clone();
                    a.sort_unstable();
                    b.sort_unstable();
                    a == b && !a.is_empty()
                });
                if let Some(path) = key.and_then(|k| own.get(k)).and_then(|p| rel(p)) {
                    for c in ctrls {
                        host.v1.entry(c.to_string()).or_insert_with(|| path.clone());
                    }
                }
            }
        }
        host
    }

    /// Where a controller comes from, or None when this host has it nowhere.
    pub fn source(&self, controller: &str) -> Option<ControllerSource> {
        if let Some(path) = self.v1.get(controller) {
            return Some(ControllerSource::V1(path.clone()));
        }
        // v2's cpu controller also provides accounting (cpu.stat); cpu.stat exists without it.
        let v2_name = if controller == "cpuacct" {
            "cpu"
        } else {
            controller
        };
        match &self.v2 {
            Some(v2) if self.v2_controllers.contains(v2_name) => {
                Some(ControllerSource::V2(v2.clone()))
            }
            _ => None,
        }
    }

    /// Why `controller` is not available to this process, and the fix.
    pub fn why_unusable(&self, controller: &str) -> Unusable {
        let key = if controller == "cpuacct" {
            "cpu"
        } else {
            controller
        };
        self.unusable.get(key).cloned().unwrap_or_else(|| Unusable {
            reason: format!("this kernel offers no {key} cgroup controller to this process"),
            fix: "use a kernel with the controller (CONFIG_MEMCG, CONFIG_CGROUP_PIDS, CONFIG_CGROUP_SCHED) and a cgroup hierarchy that has it".into(),
        })
    }

    /// Creates the sandbox's cgroups, applies the limits, returns the directories (the init
    /// joins them through their `cgroup.procs`). On failure nothing is left behind.
    pub fn create(&self, name: &str, limits: &CgroupLimits) -> Result<SandboxCgroups, CgroupError> {
        let mut wanted: Vec<&str> = vec!["memory", "pids"];
        // CPU time: every v2 cgroup has `cpu.stat` (see `stats`), and the sandbox always has a
        // v2 directory where the host has a v2 hierarchy; a v1 `cpuacct` cgroup is one more
        // directory to make, join and remove per sandbox only where it has not.
        if self.v2.is_none() {
            wanted.push("cpuacct");
        }
        if limits.cpus.is_some() {
            wanted.push("cpu");
        }
        let mut dirs: BTreeMap<PathBuf, CgroupDir> = BTreeMap::new();
        for ctrl in wanted {
            match self.source(ctrl) {
                Some(ControllerSource::V1(parent)) => {
                    let path = parent.join(name);
                    dirs.entry(path.clone())
                        .or_insert_with(|| CgroupDir {
                            path,
                            v2: false,
                            controllers: vec![],
                        })
                        .controllers
                        .push(ctrl.to_string());
                }
                Some(ControllerSource::V2(parent)) => {
                    let path = parent.join(name);
                    dirs.entry(path.clone())
                        .or_insert_with(|| CgroupDir {
                            path,
                            v2: true,
                            controllers: vec!["core".to_string()],
                        })
                        .controllers
                        .push(ctrl.to_string());
                }
                None => {}
            }
        }
        if let Some(v2) = &self.v2 {
            let path = v2.join(name);
            dirs.entry(path.clone()).or_insert_with(|| CgroupDir {
                path,
                v2: true,
                controllers: vec!["core".to_string()],
            });
        }
        let cgroups = SandboxCgroups {
            dirs: dirs.into_values().collect(),
        };
        if let Err(e) = self.create_dirs(&cgroups, limits) {
            cgroups.remove(Duration::from_millis(200));
            return Err(e);
        }
        Ok(cgroups)
    }

    fn create_dirs(
        &self,
        cgroups: &SandboxCgroups,
        limits: &CgroupLimits,
    ) -> Result<(), CgroupError> {
        for dir in &cgroups.dirs {
            // v2 controllers were enabled in the parent's subtree_control by `detect`.
            std::fs::create_dir(&dir.path).map_err(|e| cg_err("create cgroup", &dir.path, e))?;
        }
        Self::set_limits(cgroups, limits)
    }

    /// Writes `limits` into existing cgroups (a warm sandbox's, claimed by a step: see the
    /// `warm` module). A CPU limit needs the `cpu` controller, which only cgroups created
    /// with one have.
    pub fn set_limits(cgroups: &SandboxCgroups, limits: &CgroupLimits) -> Result<(), CgroupError> {
        for dir in &cgroups.dirs {
            let has = |c: &str| dir.controllers.iter().any(|x| x == c);
            let write = |file: &str, value: String| -> Result<(), CgroupError> {
                let path = dir.path.join(file);
                std::fs::write(&path, value).map_err(|e| cg_err("write", &path, e))
            };
            if let Some(mem) = limits.memory_bytes.filter(|_| has("memory")) {
                if dir.v2 {
                    write("memory.max", mem.to_string())?;
                    if dir.path.join("memory.swap.max").exists() {
                        write("memory.swap.max", "0".to_string())?;
                    }
                } else {
                    write("memory.limit_in_bytes", mem.to_string())?;
                    // With swap accounting, memory+swap gets the same cap so the hog cannot
                    // escape into swap.
                    if dir.path.join("memory.memsw.limit_in_bytes").exists() {
                        write("memory.memsw.limit_in_bytes", mem.to_string())?;
                    }
                }
            }
            if let Some(pids) = limits.pids.filter(|_| has("pids")) {
                write("pids.max", pids.to_string())?;
            }
            if let Some(cpus) = limits.cpus.filter(|_| has("cpu")) {
                let period: u64 = 100_000;
                let quota = ((cpus * period as f64).round() as u64).max(1000);
                if dir.v2 {
                    write("cpu.max", format!("{quota} {period}"))?;
                } else {
                    write("cpu.cfs_period_us", period.to_string())?;
                    write("cpu.cfs_quota_us", quota.to_string())?;
                }
            }
        }
        Ok(())
    }
}

/// A transient systemd scope with `Delegate=yes` holding this process, as rootless podman
/// makes one: systemd's user instance (root: the system instance) owns a subtree it may hand
/// over, and does so for a scope asked for over D-Bus. `busctl` (part of systemd, so present
/// wherever this applies) makes the call, which keeps a D-Bus client out of the runtime.
mod systemd {
    use std::process::Command;
    use std::time::{Duration, Instant};

    pub(super) fn enter_delegated_scope() -> Result<(), String> {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        let pid = std::process::id();
        let unit = format!("smithers-sandbox-{pid}.scope");
        let mut cmd = Command::new("busctl");
        if uid != 0 {
            let runtime_dir = std::env::var_os("XDG_RUNTIME_DIR").ok_or(
                "XDG_RUNTIME_DIR is not set, so the user's systemd instance cannot be reached",
            )?;
            if !std::path::Path::new(&runtime_dir).join("bus").exists() {
                return Err(format!(
                    "no user bus at {}/bus (is the user's systemd instance running? loginctl enable-linger {uid})",
                    std::path::Path::new(&runtime_dir).display()
                ));
            }
            cmd.arg("--user");
        }
        cmd.args([
            "call",
            "--quiet",
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            "StartTransientUnit",
            "ssa(sv)a(sa(sv))",
            &unit,
            "fail",
            "2",
            "PIDs",
            "au",
            "1",
            &pid.to_string(),
            "Delegate",
            "b",
            "true",
            "0",
        ]);
        let out = cmd
            .output()
            .map_err(|e| format!("busctl (asking systemd for a delegated scope): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "systemd refused a delegated scope: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        // The job moves us asynchronously: wait until our cgroup is the scope.
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
            if own
                .lines()
                .any(|l| l.starts_with("0::") && l.ends_with(&unit))
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "systemd did not move this process into {unit} within 3 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Whether this process may create a cgroup in `dir` and write the named files of it (what
/// systemd's `Delegate=yes` hands over: the directory and these files, chowned).
fn writable(dir: &Path, files: &[&str]) -> Result<(), std::io::Error> {
    access_write(dir)?;
    for file in files {
        access_write(&dir.join(file))?;
    }
    Ok(())
}

fn access_write(path: &Path) -> Result<(), std::io::Error> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated path; faccessat only reads it.
    let rc = unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK, libc::AT_EACCESS) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The fix for a cgroup directory this process cannot write.
fn fix_for(why: &std::io::Error) -> String {
    if why.raw_os_error() == Some(libc::EROFS) {
        "the cgroup file system is mounted read-only (a container?): give the container a writable cgroup of its own (docker run --cgroupns=private with a read-write /sys/fs/cgroup, or --privileged)".into()
    } else {
        delegate_fix()
    }
}

/// Makes `mount/TOP_LEVEL_DIR` the parent of sandbox cgroups: enables the `wanted`
/// controllers the hierarchy has in the root's `cgroup.subtree_control` (the root cgroup is
/// exempt from the no-internal-processes rule; any other cgroup is not, which is why this only
/// works at the real top), makes the directory (it holds no process, ever) and enables them in
/// its own. Idempotent: runtimes started side by side share the directory. Returns it and the
/// controllers its children get.
fn top_level_parent(mount: &Path, wanted: &[&str]) -> Result<(PathBuf, BTreeSet<String>), String> {
    let read_set = |dir: &Path, file: &str| -> BTreeSet<String> {
        std::fs::read_to_string(dir.join(file))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let available = read_set(mount, "cgroup.controllers");
    let top_enabled = read_set(mount, "cgroup.subtree_control");
    for ctrl in wanted {
        if available.contains(*ctrl) && !top_enabled.contains(*ctrl) {
            enable(mount, ctrl).map_err(|e| {
                format!(
                    "enabling {ctrl} in {}/cgroup.subtree_control: {e}",
                    mount.display()
                )
            })?;
        }
    }
    let parent = mount.join(TOP_LEVEL_DIR);
    match std::fs::create_dir(&parent) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("create {}: {e}", parent.display())),
    }
    let offered = read_set(&parent, "cgroup.controllers");
    let enabled = read_set(&parent, "cgroup.subtree_control");
    for ctrl in wanted {
        if offered.contains(*ctrl) && !enabled.contains(*ctrl) {
            enable(&parent, ctrl).map_err(|e| {
                format!(
                    "enabling {ctrl} in {}/cgroup.subtree_control: {e}",
                    parent.display()
                )
            })?;
        }
    }
    let enabled = read_set(&parent, "cgroup.subtree_control")
        .into_iter()
        .filter(|c| wanted.contains(&c.as_str()))
        .collect();
    Ok((parent, enabled))
}

/// Children of this process that must go wherever it goes when it moves into its leaf: an
/// init forked before the host was detected (`warm::PreForked`) is still in the cgroup this
/// process started in, where it would keep the controllers from being enabled (the
/// no-internal-processes rule) and stay outside the cgroups its sandbox is made under.
static COMPANIONS: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// SIGKILLs each process listed in the cgroup directory `dir`.
fn kill_listed(dir: &Path) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        // A member outside this process's pid namespace is listed as 0, and kill(0) would
        // kill our own process group: only positive pids are signalled.
        for pid in text
            .lines()
            .filter_map(|l| l.trim().parse::<i32>().ok())
            .filter(|pid| *pid > 0)
        {
            let _ = crate::sys::kill(pid, libc::SIGKILL);
        }
    }
}

/// Registers `pid` (our child) to move with this process (see [`COMPANIONS`]).
pub(crate) fn move_with_this_process(pid: u32) {
    COMPANIONS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(pid);
}

/// Forgets `pid` (it ended).
pub(crate) fn forget_companion(pid: u32) {
    COMPANIONS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|p| *p != pid);
}

/// Moves this process (all its threads) and its companions into `dir`'s `cgroup.procs`. A
/// companion that ended meanwhile is no error.
fn move_into(dir: &Path) -> std::io::Result<()> {
    // "0" names the writing process: the whole thread group moves.
    std::fs::write(dir.join("cgroup.procs"), "0")?;
    for pid in COMPANIONS.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        let _ = std::fs::write(dir.join("cgroup.procs"), pid.to_string());
    }
    Ok(())
}

/// Moves this process (all its threads) and its companions into `dir/SUPERVISOR_LEAF`.
fn enter_leaf(dir: &Path) -> std::io::Result<()> {
    let leaf = dir.join(SUPERVISOR_LEAF);
    match std::fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    move_into(&leaf)
}

fn enable(dir: &Path, ctrl: &str) -> std::io::Result<()> {
    std::fs::write(dir.join("cgroup.subtree_control"), format!("+{ctrl}"))
}

fn unescape(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && b.len() - i > 3 {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|d| (b'0'..=b'7').contains(d)) {
                out.push((oct[0] - b'0') * 64 + (oct[1] - b'0') * 8 + (oct[2] - b'0'));
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A small cgroup file's text: one open, one read, one close (`read_to_string` adds a stat
/// and a second read, and the runtime reads half a dozen of these as each step ends).
/// Files longer than the buffer (none read here are) are cut at its end.
fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut buf = [0u8; 1024];
    let mut file = std::fs::File::open(path).ok()?;
    let n = file.read(&mut buf).ok()?;
    String::from_utf8(buf[..n].to_vec()).ok()
}

fn read_u64(path: &Path) -> Option<u64> {
    read_small(path)?.trim().parse().ok()
}

fn read_key(path: &Path, key: &str) -> Option<u64> {
    let text = read_small(path)?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

impl SandboxCgroups {
    /// How the init enters these cgroups (see [`crate::plan::CgroupJoin`]).
    pub fn join_plan(&self) -> crate::plan::CgroupJoin {
        crate::plan::CgroupJoin {
            v1_tasks: self
                .dirs
                .iter()
                .filter(|d| !d.v2)
                .map(|d| d.path.join("tasks"))
                .collect(),
            v2_dir: self.dirs.iter().find(|d| d.v2).map(|d| d.path.clone()),
        }
    }

    fn dir_for(&self, controller: &str) -> Option<&CgroupDir> {
        self.dirs
            .iter()
            .find(|d| d.controllers.iter().any(|c| c == controller))
    }

    /// True when the controller is in force for this sandbox.
    pub fn has(&self, controller: &str) -> bool {
        self.dir_for(controller).is_some()
    }

    /// Reads the counters (missing files give None / 0).
    pub fn stats(&self) -> CgroupStats {
        let mut s = CgroupStats::default();
        if let Some(d) = self.dir_for("memory") {
            if d.v2 {
                s.peak_memory_bytes = read_u64(&d.path.join("memory.peak"));
                s.oom_kills = read_key(&d.path.join("memory.events"), "oom_kill").unwrap_or(0);
            } else {
                s.peak_memory_bytes = read_u64(&d.path.join("memory.max_usage_in_bytes"));
                s.oom_kills = read_key(&d.path.join("memory.oom_control"), "oom_kill").unwrap_or(0);
            }
        }
        if let Some(d) = self.dir_for("pids") {
            s.peak_pids = read_u64(&d.path.join("pids.peak"));
            s.pids_limit_hits = read_key(&d.path.join("pids.events"), "max").unwrap_or(0);
        }
        if let Some(d) = self.dir_for("cpuacct") {
            s.cpu_time_ns = if d.v2 {
                read_key(&d.path.join("cpu.stat"), "usage_usec").map(|us| us * 1000)
            } else {
                read_u64(&d.path.join("cpuacct.usage"))
            };
        } else if let Some(d) = self.dirs.iter().find(|d| d.v2) {
            // cpu.stat's usage is a core file of every v2 cgroup.
            s.cpu_time_ns = read_key(&d.path.join("cpu.stat"), "usage_usec").map(|us| us * 1000);
        }
        s
    }

    /// True while any process is in the sandbox's cgroups. Every sandbox process is in all of
    /// them (born into the v2 one, and into the v1 ones through P1), so one v2
    /// `cgroup.events`, where there is one, answers for all: one small read on the path of
    /// every cleanup.
    pub fn populated(&self) -> bool {
        match self.dirs.iter().find(|d| d.v2) {
            Some(d) => read_key(&d.path.join("cgroup.events"), "populated").is_some_and(|v| v != 0),
            None => self.dirs.iter().any(|d| {
                std::fs::read_to_string(d.path.join("cgroup.procs"))
                    .is_ok_and(|t| !t.trim().is_empty())
            }),
        }
    }

    /// Kills every process in the sandbox's cgroups for good: `cgroup.kill` where the kernel
    /// has it, else SIGKILL to each listed pid. Only for cgroups about to be removed: see
    /// [`Self::kill_each`] for the cgroups of a sandbox that may start another init.
    pub fn kill_all(&self) {
        for d in &self.dirs {
            if d.v2 && std::fs::write(d.path.join("cgroup.kill"), "1").is_ok() {
                continue;
            }
            kill_listed(&d.path);
        }
    }

    /// SIGKILLs each process listed in the sandbox's cgroups, leaving them fit for another
    /// init. Not `cgroup.kill`: on Linux 6.18 (seen here, `cgroup_css_set_fork`) a process
    /// cloned with `CLONE_INTO_CGROUP` into a v2 cgroup that was ever written `cgroup.kill`
    /// is SIGKILLed at birth (the fork samples the kill sequence of its parent's cgroup, not of
    /// the target's, and the two differ from then on), and the init clones P1 that way. One
    /// by one is enough here: every sandbox process is in the pid namespace whose pid 1 is
    /// listed, and that namespace dies with its pid 1.
    pub fn kill_each(&self) {
        for d in &self.dirs {
            kill_listed(&d.path);
        }
    }

    /// Waits (bounded) until no process is left; kills again while waiting ([`Self::kill_each`],
    /// so the cgroups may serve another init). Whether they are empty.
    pub fn kill_and_wait(&self, budget: Duration) -> bool {
        let deadline = std::time::Instant::now() + budget;
        let mut pause = Duration::from_millis(1);
        loop {
            if !self.populated() {
                return true;
            }
            self.kill_each();
            if std::time::Instant::now() >= deadline {
                return !self.populated();
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// Removes the directories, retrying EBUSY (a cgroup may stay busy briefly after its last
    /// process exited). Missing directories count as removed. Returns the ones left.
    pub fn remove(&self, budget: Duration) -> Vec<PathBuf> {
        let deadline = std::time::Instant::now() + budget;
        let mut left = Vec::new();
        for d in &self.dirs {
            let mut pause = Duration::from_millis(1);
            loop {
                match std::fs::remove_dir(&d.path) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY)
                            && std::time::Instant::now() < deadline =>
                    {
                        self.kill_all();
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(Duration::from_millis(50));
                    }
                    Err(_) => {
                        left.push(d.path.clone());
                        break;
                    }
                }
            }
        }
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_OWN: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/process_api/abc
2:cpuacct:/
1:cpu:/
0::/
";

    #[test]
    fn hybrid_host_uses_v1_controllers_under_own_cgroup() {
        let host = CgroupHost::parse(HYBRID_MOUNTINFO, HYBRID_OWN);
        assert_eq!(
            host.v1.get("memory"),
            Some(&PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"))
        );
        assert_eq!(
            host.v1.get("pids"),
            Some(&PathBuf::from("/sys/fs/cgroup/pids/"))
        );
        assert_eq!(host.v2, Some(PathBuf::from("/sys/fs/cgroup/unified/")));
        assert!(matches!(host.source("cpu"), Some(ControllerSource::V1(_))));
    }

    #[test]
    fn comounted_cpu_cpuacct() {
        let mi = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
        let own = "3:cpuacct,cpu:/user.slice\n";
        let host = CgroupHost::parse(mi, own);
        assert_eq!(
            host.v1.get("cpu"),
            Some(&PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/user.slice"))
        );
        assert_eq!(host.v1.get("cpu"), host.v1.get("cpuacct"));
    }

    #[test]
    fn pure_v2_host() {
        let mi = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let own = "0::/user.slice/user-1000.slice/session-2.scope\n";
        let mut host = CgroupHost::parse(mi, own);
        assert!(host.v1.is_empty());
        assert_eq!(
            host.v2,
            Some(PathBuf::from(
                "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope"
            ))
        );
        assert_eq!(host.source("memory"), None);
        host.v2_controllers = ["memory", "pids", "cpu"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert!(matches!(
            host.source("memory"),
            Some(ControllerSource::V2(_))
        ));
        assert!(matches!(
            host.source("cpuacct"),
            Some(ControllerSource::V2(_))
        ));
    }

    #[test]
    fn cgroup_namespace_root_hides_own_path() {
        // Inside a container the mount root is our own cgroup.
        let mi = "30 23 0:26 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let own = "4:memory:/docker/abc/sub\n";
        let host = CgroupHost::parse(mi, own);
        assert_eq!(
            host.v1.get("memory"),
            Some(&PathBuf::from("/sys/fs/cgroup/memory/sub"))
        );
    }

    #[test]
    fn the_v2_mount_is_kept_for_the_top_level_parent() {
        let mi = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let own = "0::/system.slice/shared.service\n";
        let host = CgroupHost::parse(mi, own);
        assert_eq!(host.v2_mount, Some(PathBuf::from("/sys/fs/cgroup")));
        // A hybrid host's v2 tree is found too (where it is mounted).
        let host = CgroupHost::parse(HYBRID_MOUNTINFO, HYBRID_OWN);
        assert_eq!(host.v2_mount, Some(PathBuf::from("/sys/fs/cgroup/unified")));
    }

    #[test]
    fn fixes_name_systemd_only_where_it_runs() {
        for root in [true, false] {
            assert!(delegate_fix_for(true, root).contains("systemd-run"));
            assert!(busy_fix_for(true, root, Path::new("/x")).contains("systemd-run"));
            let fix = delegate_fix_for(false, root);
            assert!(
                !fix.contains("systemd-run") && fix.contains("no systemd"),
                "{fix}"
            );
            let busy = busy_fix_for(false, root, Path::new("/sys/fs/cgroup/a.service"));
            assert!(
                !busy.contains("systemd-run") && busy.contains("no systemd"),
                "{busy}"
            );
        }
        assert!(delegate_fix_for(false, true).contains(TOP_LEVEL_DIR));
        assert!(delegate_fix_for(false, false).contains("chown"));
    }

    /// On a directory tree standing in for the hierarchy (plain files: the kernel's own
    /// semantics, a write of `+memory` adding to the set, are not there), the parent is made
    /// at the top and what its `cgroup.subtree_control` holds is what its children get.
    #[test]
    fn the_top_level_parent_is_made_at_the_top() {
        let top = tempfile::tempdir().unwrap();
        std::fs::write(
            top.path().join("cgroup.controllers"),
            "cpu memory pids io\n",
        )
        .unwrap();
        std::fs::write(
            top.path().join("cgroup.subtree_control"),
            "cpu memory pids\n",
        )
        .unwrap();
        let parent = top.path().join(TOP_LEVEL_DIR);
        std::fs::create_dir(&parent).unwrap();
        std::fs::write(parent.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        std::fs::write(parent.join("cgroup.subtree_control"), "memory pids cpu\n").unwrap();
        let (made, enabled) = top_level_parent(top.path(), &["memory", "pids", "cpu"]).unwrap();
        assert_eq!(made, parent);
        assert_eq!(
            enabled.into_iter().collect::<Vec<_>>(),
            ["cpu", "memory", "pids"]
        );
        // Idempotent: a second runtime shares the directory.
        assert!(top_level_parent(top.path(), &["memory"]).is_ok());
    }

    #[test]
    fn key_value_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("memory.oom_control");
        std::fs::write(&f, "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n").unwrap();
        assert_eq!(read_key(&f, "oom_kill"), Some(2));
        assert_eq!(read_key(&f, "missing"), None);
    }
}
