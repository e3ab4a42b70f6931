//! A sandbox's cgroups: made with their limits ([`CgroupHost::create`]), read, killed and
//! removed ([`SandboxCgroups`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::procs::kill_listed;
use super::{
    cg_err, CgroupDir, CgroupError, CgroupHost, CgroupLimits, CgroupStats, ControllerSource,
    SandboxCgroups,
};

impl CgroupHost {
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

pub(super) fn read_key(path: &Path, key: &str) -> Option<u64> {
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
