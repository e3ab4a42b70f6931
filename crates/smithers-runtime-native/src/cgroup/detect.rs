//! What this process may use of the host's cgroup hierarchies ([`CgroupHost::detect`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::procs::{enable, enter_leaf, move_into};
use super::{
    busy_fix_for, delegate_fix, euid_is_root, systemd, systemd_runs, CgroupHost, ControllerSource,
    Unusable, CONTROLLERS, NO_SYSTEMD_SCOPE_ENV, SUPERVISOR_LEAF, TOP_LEVEL_DIR,
};

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
pub(super) fn top_level_parent(
    mount: &Path,
    wanted: &[&str],
) -> Result<(PathBuf, BTreeSet<String>), String> {
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
