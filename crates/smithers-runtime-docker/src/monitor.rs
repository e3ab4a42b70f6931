//! Usage and limit hits read from the container's cgroup on the host while it runs. The
//! engine's stats API samples once a second and says nothing about a pids limit being hit;
//! the cgroup files do (`pids.events`, `memory.failcnt` / `memory.events`), and reading them
//! costs microseconds. The engine is local (we bind host directories), so its cgroups are
//! ours to read; on v1 and on pure v2 hosts alike.

use std::path::PathBuf;

use smithers_runtime::ResourceUsage;

/// The container's cgroup directories, one per relevant controller.
#[derive(Debug, Clone, Default)]
pub(crate) struct CgroupPaths {
    /// cgroup v2 directory (all controllers), when the host is pure v2.
    v2: Option<PathBuf>,
    memory: Option<PathBuf>,
    pids: Option<PathBuf>,
    cpuacct: Option<PathBuf>,
}

/// What was observed so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Sample {
    pub cpu_time_ms: Option<u64>,
    pub peak_memory_bytes: Option<u64>,
    pub max_pids: Option<u64>,
    /// Forks refused by the pids limit.
    pub pids_limit_hits: u64,
    /// OOM kills in the container's cgroup.
    pub oom_kills: u64,
}

impl Sample {
    pub fn usage(&self) -> ResourceUsage {
        ResourceUsage {
            cpu_time_ms: self.cpu_time_ms,
            peak_memory_bytes: self.peak_memory_bytes,
            max_pids: self.max_pids,
            disk_bytes: None,
        }
    }

    fn merge(&mut self, other: Sample) {
        fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, None) => a,
                (None, b) => b,
            }
        }
        self.cpu_time_ms = max_opt(self.cpu_time_ms, other.cpu_time_ms);
        self.peak_memory_bytes = max_opt(self.peak_memory_bytes, other.peak_memory_bytes);
        self.max_pids = max_opt(self.max_pids, other.max_pids);
        self.pids_limit_hits = self.pids_limit_hits.max(other.pids_limit_hits);
        self.oom_kills = self.oom_kills.max(other.oom_kills);
    }
}

impl CgroupPaths {
    /// Resolves the cgroups of a host pid (the container's init). The paths must name the
    /// container: an init that already exited may have had its pid reused by a host process,
    /// whose cgroup (maybe the root's) must not be read as the sandbox's usage.
    pub fn of_pid(pid: i64, container_id: &str) -> Option<CgroupPaths> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        if container_id.is_empty() || !text.contains(container_id) {
            return None;
        }
        Some(Self::parse(&text))
    }

    fn parse(text: &str) -> CgroupPaths {
        let mut p = CgroupPaths::default();
        let mut v2_rel = None;
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let path = path.trim_start_matches('/');
            if id == "0" && ctrls.is_empty() {
                v2_rel = Some(path.to_string());
                continue;
            }
            for c in ctrls.split(',') {
                let dir = PathBuf::from("/sys/fs/cgroup").join(ctrls).join(path);
                match c {
                    "memory" => p.memory = Some(dir.clone()),
                    "pids" => p.pids = Some(dir.clone()),
                    "cpuacct" => p.cpuacct = Some(dir.clone()),
                    _ => {}
                }
            }
        }
        // Pure v2: no v1 controller lines, everything in the unified tree at /sys/fs/cgroup.
        if p.memory.is_none() && p.pids.is_none() {
            if let Some(rel) = v2_rel {
                p.v2 = Some(PathBuf::from("/sys/fs/cgroup").join(rel));
            }
        }
        p
    }

    /// Reads the counters now. Files that vanished (the container ended) give None.
    pub fn sample(&self) -> Sample {
        let mut s = Sample::default();
        if let Some(v2) = &self.v2 {
            s.peak_memory_bytes = read_u64(v2.join("memory.peak"));
            s.max_pids =
                read_u64(v2.join("pids.peak")).or_else(|| read_u64(v2.join("pids.current")));
            s.pids_limit_hits = read_key(v2.join("pids.events"), "max").unwrap_or(0);
            s.oom_kills = read_key(v2.join("memory.events"), "oom_kill").unwrap_or(0);
            s.cpu_time_ms = read_key(v2.join("cpu.stat"), "usage_usec").map(|u| u / 1000);
            return s;
        }
        if let Some(m) = &self.memory {
            s.peak_memory_bytes = read_u64(m.join("memory.max_usage_in_bytes"));
            s.oom_kills = read_key(m.join("memory.oom_control"), "oom_kill").unwrap_or(0);
        }
        if let Some(p) = &self.pids {
            s.max_pids = read_u64(p.join("pids.current"));
            s.pids_limit_hits = read_key(p.join("pids.events"), "max").unwrap_or(0);
        }
        if let Some(c) = &self.cpuacct {
            s.cpu_time_ms = read_u64(c.join("cpuacct.usage")).map(|ns| ns / 1_000_000);
        }
        s
    }
}

fn read_u64(path: PathBuf) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn read_key(path: PathBuf, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(key)).then(|| it.next()?.parse().ok())?
    })
}

/// Polls the cgroup until told to stop, keeping the maxima.
pub(crate) async fn watch(paths: CgroupPaths, stop: tokio_util::sync::CancellationToken) -> Sample {
    let mut acc = Sample::default();
    loop {
        acc.merge(paths.sample());
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v1_and_v2() {
        let v1 = "9:name=systemd:/docker/abc\n8:pids:/docker/abc\n4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/docker/abc\n";
        let p = CgroupPaths::parse(v1);
        assert_eq!(
            p.pids,
            Some(PathBuf::from("/sys/fs/cgroup/pids/docker/abc"))
        );
        assert_eq!(
            p.memory,
            Some(PathBuf::from("/sys/fs/cgroup/memory/docker/abc"))
        );
        assert_eq!(
            p.cpuacct,
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/docker/abc"))
        );
        assert!(p.v2.is_none());
        let p = CgroupPaths::parse("0::/system.slice/docker-abc.scope\n");
        assert_eq!(
            p.v2,
            Some(PathBuf::from(
                "/sys/fs/cgroup/system.slice/docker-abc.scope"
            ))
        );
    }
}
