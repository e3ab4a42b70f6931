//! Moving this process (and its companions) between cgroups, and killing a cgroup's members.

use std::path::Path;

use super::SUPERVISOR_LEAF;

/// Children of this process that must go wherever it goes when it moves into its leaf: an
/// init forked before the host was detected (`warm::PreForked`) is still in the cgroup this
/// process started in, where it would keep the controllers from being enabled (the
/// no-internal-processes rule) and stay outside the cgroups its sandbox is made under.
static COMPANIONS: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// SIGKILLs each process listed in the cgroup directory `dir`.
pub(super) fn kill_listed(dir: &Path) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        // A member outside this process's pid namespace is listed as 0, and kill(0) would
        // kill our own process group: only positive pids are signalled.
        for pid in text
            .lines()
            .filter_map(|l| l.trim().parse::<i32>().ok())
            .filter(|pid| *pid > 0)
        {
            let _ = smithers_sandbox_init::sys::kill(pid, libc::SIGKILL);
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
pub(super) fn move_into(dir: &Path) -> std::io::Result<()> {
    // "0" names the writing process: the whole thread group moves.
    std::fs::write(dir.join("cgroup.procs"), "0")?;
    for pid in COMPANIONS.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        let _ = std::fs::write(dir.join("cgroup.procs"), pid.to_string());
    }
    Ok(())
}

/// Moves this process (all its threads) and its companions into `dir/SUPERVISOR_LEAF`.
pub(super) fn enter_leaf(dir: &Path) -> std::io::Result<()> {
    let leaf = dir.join(SUPERVISOR_LEAF);
    match std::fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    move_into(&leaf)
}

pub(super) fn enable(dir: &Path, ctrl: &str) -> std::io::Result<()> {
    std::fs::write(dir.join("cgroup.subtree_control"), format!("+{ctrl}"))
}
