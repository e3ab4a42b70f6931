//! The pids limit on a parent cgroup this runtime owns (`/smithers-docker/<name>`), with the
//! container's own cgroup below it (`CgroupParent`). Why not just `PidsLimit` on the
//! container: the engine deletes the container's cgroup the moment it exits, taking
//! `pids.events` with it, so a short fork bomb would never be reported. A limit on our parent
//! is charged there (the kernel counts the event in the cgroup whose limit was hit), and the
//! parent outlives the container until `cleanup`. Works with the engine's `cgroupfs` driver,
//! on cgroup v1 and pure v2; elsewhere the caller falls back to `PidsLimit` plus sampling.

use std::path::{Path, PathBuf};
use std::time::Duration;

const ROOT: &str = "/sys/fs/cgroup";

/// Directory of the pids controller for `rel` (v1 `pids` hierarchy, else the v2 tree).
fn pids_dir(rel: &str) -> Option<PathBuf> {
    let v1 = Path::new(ROOT).join("pids");
    if v1.join("pids.max").exists() || v1.join("cgroup.procs").exists() {
        return Some(v1.join(rel));
    }
    if Path::new(ROOT).join("cgroup.controllers").exists() {
        return Some(Path::new(ROOT).join(rel));
    }
    None
}

/// Creates the parent with `pids.max = limit`. Err says why it cannot be used here.
pub(crate) fn prepare(rel: &str, limit: u32) -> Result<(), String> {
    let dir = pids_dir(rel).ok_or("no pids controller mounted under /sys/fs/cgroup")?;
    let v2 = !dir.starts_with(Path::new(ROOT).join("pids"));
    if v2 {
        // Each ancestor must delegate the pids controller to its children.
        let mut cur = PathBuf::from(ROOT);
        for comp in Path::new(rel).components() {
            let ctl = cur.join("cgroup.subtree_control");
            let _ = std::fs::write(&ctl, "+pids");
            cur = cur.join(comp);
            if !cur.exists() {
                std::fs::create_dir(&cur).map_err(|e| format!("mkdir {}: {e}", cur.display()))?;
            }
        }
    } else {
        std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    }
    let max = dir.join("pids.max");
    std::fs::write(&max, limit.to_string()).map_err(|e| format!("write {}: {e}", max.display()))
}

/// (forks refused by the limit, highest number of tasks seen) for the parent.
pub(crate) fn read(rel: &str) -> (u64, Option<u64>) {
    let Some(dir) = pids_dir(rel) else {
        return (0, None);
    };
    let hits = std::fs::read_to_string(dir.join("pids.events"))
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                let mut it = l.split_whitespace();
                (it.next() == Some("max")).then(|| it.next()?.parse().ok())?
            })
        })
        .unwrap_or(0);
    let peak = std::fs::read_to_string(dir.join("pids.peak"))
        .ok()
        .and_then(|t| t.trim().parse().ok());
    (hits, peak)
}

/// Removes the parent in every hierarchy (the engine's runc creates it in all of them).
/// Missing is success; a busy group (the container's cgroup not yet gone) is retried briefly.
pub(crate) fn remove(rel: &str) -> Result<(), String> {
    let mut dirs: Vec<PathBuf> = vec![Path::new(ROOT).join(rel)];
    if let Ok(entries) = std::fs::read_dir(ROOT) {
        for e in entries.flatten() {
            // Symlinked hierarchies (cpu -> cpu,cpuacct) are visited through their target.
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                dirs.push(e.path().join(rel));
            }
        }
    }
    let mut last_err = None;
    for dir in dirs {
        if !dir.exists() {
            continue;
        }
        let mut ok = false;
        for _ in 0..40 {
            match std::fs::remove_dir(&dir) {
                Ok(()) => {
                    ok = true;
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    ok = true;
                    break;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(25)),
            }
        }
        // The shared `smithers` parent stays: removing it could race another sandbox's
        // engine creating its group below it (scripts/docker-down.sh removes it).
        if !ok {
            last_err = Some(format!("rmdir {}: still busy", dir.display()));
        }
    }
    match last_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
