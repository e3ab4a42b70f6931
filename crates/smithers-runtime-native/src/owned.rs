//! What cleanup from a stored handle may touch. A handle comes back from the database, which
//! lives in the project tree (`<project>/.smithers/sandbox.db`): a cloned repository can ship
//! a crafted one, and recovery runs before every command. So nothing in the handle names a
//! host object by itself:
//!
//! - the state and layer directories are recomputed from the (validated) ids under this
//!   runtime's own roots; a handle whose stored paths differ is refused outright;
//! - cgroups (and so the processes killed through them) are only those `create` recorded in
//!   the sandbox's own state directory ([`CleanupRecord`], in our private state root), below
//!   one of this process's own cgroup parents;
//! - a sandbox whose recorded owner is another live process is not ours to clean up (a
//!   crafted database naming a live sandbox's ids from another project);
//! - the request directory in the project is removed only when it is where the record's
//!   project root puts it, through no symlink.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use smithers_runtime::{RuntimeError, SandboxHandle};

use crate::backend::Backend;
use crate::cgroup::{CgroupHost, SandboxCgroups};

/// Name of the record in a sandbox's state directory.
pub(crate) const CLEANUP_RECORD: &str = "cleanup.json";

/// Written by `create` into the sandbox's state directory (mode 0600 in a 0700 root owned by
/// us), read back by cleanup from any process: the only source of what may be killed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CleanupRecord {
    pub owner_pid: u32,
    /// `/proc/<pid>/stat` field 22, so a reused pid is not taken for the owner.
    pub owner_start: u64,
    pub boot_id: String,
    pub root_dir: PathBuf,
    pub cgroups: SandboxCgroups,
}

impl CleanupRecord {
    pub(crate) fn for_self(root_dir: &Path, cgroups: &SandboxCgroups) -> CleanupRecord {
        // Read once per process (two /proc reads were a sixth of a create): neither the
        // process's start time nor the boot changes while it runs.
        static OWNER: std::sync::OnceLock<(u32, u64, String)> = std::sync::OnceLock::new();
        let pid = std::process::id();
        let (owner_pid, owner_start, boot) = OWNER
            .get_or_init(|| {
                (
                    pid,
                    process_start(pid).unwrap_or(0),
                    boot_id().unwrap_or_default(),
                )
            })
            .clone();
        // A forked child (none of ours keeps running the runtime, but be exact) reads again.
        let (owner_start, boot) = if owner_pid == pid {
            (owner_start, boot)
        } else {
            (
                process_start(pid).unwrap_or(0),
                boot_id().unwrap_or_default(),
            )
        };
        CleanupRecord {
            owner_pid: pid,
            owner_start,
            boot_id: boot,
            root_dir: root_dir.to_path_buf(),
            cgroups: cgroups.clone(),
        }
    }

    /// The owner is not running any more: another boot, or no process with its pid and start
    /// time (never this process).
    pub(crate) fn owner_is_gone(&self) -> bool {
        let me = std::process::id();
        if self.owner_pid == me && process_start(me) == Some(self.owner_start) {
            return false;
        }
        !self.owned_by_another_live_process()
    }

    /// The owner is another process still running (same boot, same pid and start time).
    fn owned_by_another_live_process(&self) -> bool {
        let me = std::process::id();
        if self.owner_pid == me && process_start(me) == Some(self.owner_start) {
            return false;
        }
        boot_id().as_deref() == Some(self.boot_id.as_str())
            && process_start(self.owner_pid) == Some(self.owner_start)
    }
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// Field 22 of `/proc/<pid>/stat`, counted from the last `)` (the command may hold any byte);
/// `None` for a process that exited and is not reaped yet (a zombie runs nothing, as the
/// store's owner check says too).
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    if matches!(fields.next(), Some("Z" | "X")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// What cleanup from a handle may do: the backend with every path recomputed, the request
/// directory when it may go, and what was left alone (named, so nothing is dropped silently).
#[derive(Debug)]
pub(crate) struct Confined {
    pub backend: Backend,
    pub request_dir: Option<PathBuf>,
    /// Where a kept workspace layer goes: the sandbox's `kept-layer` in the project, derived
    /// from the ids, and only when the request directory may be removed (same checks: the
    /// record names this project, no link on the way); else `None`.
    pub kept_layer: Option<PathBuf>,
    pub left_alone: Vec<String>,
}

fn refuse(reason: String) -> RuntimeError {
    RuntimeError::InvalidControl {
        control: "handle",
        reason: format!("the stored handle is not trusted to name host objects: {reason}"),
    }
}

/// Rebuilds the backend of `handle` from what this runtime derives and recorded itself.
pub(crate) fn confine(
    handle: &SandboxHandle,
    stored: &Backend,
    state_root: &Path,
    layer_root: &Path,
    host: &CgroupHost,
) -> Result<Confined, RuntimeError> {
    // Validates the ids and the project-side layout (request/result under .smithers).
    let handle_root = handle.project_root()?;
    let name = format!("{}+{}", handle.run_id, handle.sandbox_id);
    let state_dir = state_root.join(&name);
    if stored.state_dir != state_dir {
        return Err(refuse(format!(
            "state directory {} is not {}",
            stored.state_dir.display(),
            state_dir.display()
        )));
    }
    let layer_dir = layer_root.join(&name);
    if stored.layer_dir.as_ref().is_some_and(|l| *l != layer_dir) {
        return Err(refuse(format!(
            "layer directory {} is not {}",
            stored
                .layer_dir
                .as_deref()
                .unwrap_or(Path::new(""))
                .display(),
            layer_dir.display()
        )));
    }
    let record = read_record(&state_dir)?;
    if record
        .as_ref()
        .is_some_and(CleanupRecord::owned_by_another_live_process)
    {
        return Err(refuse(format!(
            "sandbox {name} belongs to another running process (pid {})",
            record.as_ref().map_or(0, |r| r.owner_pid)
        )));
    }
    let mut left_alone = Vec::new();
    let cgroups = confined_cgroups(stored, record.as_ref(), host, &mut left_alone);
    let request_dir = confined_request_dir(handle, &handle_root, record.as_ref(), &mut left_alone);
    let backend = Backend {
        state_dir,
        root_dir: record
            .as_ref()
            .map_or(stored.root_dir.clone(), |r| r.root_dir.clone()),
        cgroups,
        layer_dir: stored.layer_dir.as_ref().map(|_| layer_dir),
        ..stored.clone()
    };
    let kept_layer = request_dir.as_ref().and_then(|_| {
        smithers_runtime::kept_layer::kept_layer_path(
            &handle_root,
            &handle.run_id,
            &handle.sandbox_id,
        )
        .ok()
    });
    Ok(Confined {
        backend,
        request_dir,
        kept_layer,
        left_alone,
    })
}

/// What collect from a stored handle may read and write (see `Runtime::collect_stored`):
/// the backend confined as cleanup's is (state and layer directories recomputed from the ids
/// and checked, a sandbox of another live process refused), made for this very project (its
/// `rootDir`, and the root its record names, are the handle's project root), with no link from
/// `<project>/.smithers` down to the sandbox's `request` and `result` (collect replaces the
/// result directory). Anything else is refused before anything is touched.
pub(crate) fn confine_for_collect(
    handle: &SandboxHandle,
    stored: &Backend,
    state_root: &Path,
    layer_root: &Path,
    host: &CgroupHost,
) -> Result<Backend, RuntimeError> {
    let root = handle.project_root()?;
    handle
        .check_project_dirs_real(&root)
        .map_err(|e| refuse(e.to_string()))?;
    for dir in [&handle.request_path, &handle.result_path] {
        match std::fs::symlink_metadata(dir) {
            Ok(m) if !m.is_dir() => {
                return Err(refuse(format!(
                    "{} is not a directory (a link?)",
                    dir.display()
                )))
            }
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(RuntimeError::io("inspect", dir, e))
            }
            _ => {}
        }
    }
    if stored.root_dir != root {
        return Err(refuse(format!(
            "its project directory {} is not the handle's project {}",
            stored.root_dir.display(),
            root.display()
        )));
    }
    let confined = confine(handle, stored, state_root, layer_root, host)?;
    match read_record(&confined.backend.state_dir)? {
        None => Err(refuse(format!(
            "no record of sandbox {}/{} in this runtime's state",
            handle.run_id, handle.sandbox_id
        ))),
        Some(record) if record.root_dir != root => Err(refuse(format!(
            "the sandbox was made for {}, not {}",
            record.root_dir.display(),
            root.display()
        ))),
        Some(_) => Ok(confined.backend),
    }
}

/// The record, read without following a link and size-capped; `None` when the state
/// directory or the record is gone (then nothing recorded may be killed).
pub(crate) fn read_record(state_dir: &Path) -> Result<Option<CleanupRecord>, RuntimeError> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    match std::fs::symlink_metadata(state_dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(RuntimeError::io("inspect", state_dir, e)),
        Ok(m) if !m.is_dir() || m.uid() != rustix_euid() => {
            return Err(refuse(format!(
                "{} is not a directory of ours",
                state_dir.display()
            )))
        }
        Ok(_) => {}
    }
    let path = state_dir.join(CLEANUP_RECORD);
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(RuntimeError::io("read", &path, e)),
    };
    let mut text = Vec::new();
    file.take(64 * 1024)
        .read_to_end(&mut text)
        .map_err(|e| RuntimeError::io("read", &path, e))?;
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|e| refuse(format!("{}: {e}", path.display())))
}

fn rustix_euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The recorded cgroups that sit directly below one of our own cgroup parents with a name
/// we make; the handle's own list is never used. A cgroup the handle names beyond those is
/// named in `left_alone` when it exists.
fn confined_cgroups(
    stored: &Backend,
    record: Option<&CleanupRecord>,
    host: &CgroupHost,
    left_alone: &mut Vec<String>,
) -> SandboxCgroups {
    let parents: Vec<&Path> = host
        .v1
        .values()
        .map(PathBuf::as_path)
        .chain(host.v2.as_deref())
        .collect();
    let ours = |p: &Path| {
        p.parent().is_some_and(|parent| parents.contains(&parent))
            && p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(crate::cgroup::is_sandbox_cgroup_name)
    };
    let recorded = record.map(|r| r.cgroups.dirs.clone()).unwrap_or_default();
    let dirs = recorded.iter().filter(|d| ours(&d.path)).cloned().collect();
    for d in &stored.cgroups.dirs {
        let confirmed = recorded.iter().any(|r| r.path == d.path) && ours(&d.path);
        if !confirmed && d.path.exists() {
            left_alone.push(format!(
                "cgroup {} (not one this runtime recorded for the sandbox under its own cgroup)",
                d.path.display()
            ));
        }
    }
    SandboxCgroups { dirs }
}

/// The request directory, when the record's project root and the handle agree on it and no
/// directory on the way is a link.
fn confined_request_dir(
    handle: &SandboxHandle,
    handle_root: &Path,
    record: Option<&CleanupRecord>,
    left_alone: &mut Vec<String>,
) -> Option<PathBuf> {
    let exists = std::fs::symlink_metadata(&handle.request_path).is_ok();
    let Some(record) = record else {
        if exists {
            left_alone.push(format!(
                "{} (no record of the sandbox in this runtime's state)",
                handle.request_path.display()
            ));
        }
        return None;
    };
    if record.root_dir != handle_root {
        if exists {
            left_alone.push(format!(
                "{} (the sandbox was made for {})",
                handle.request_path.display(),
                record.root_dir.display()
            ));
        }
        return None;
    }
    if let Err(e) = handle.check_project_dirs_real(handle_root) {
        left_alone.push(e.to_string());
        return None;
    }
    Some(handle.request_path.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An owner that exited but is not reaped yet (a zombie) is not running: its sandbox is
    /// not "another live process's".
    #[test]
    fn a_zombie_owner_is_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while process_start(pid).is_some() {
            assert!(std::time::Instant::now() < deadline, "never a zombie");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "reaped early"
        );
        child.wait().unwrap();
        assert!(process_start(std::process::id()).is_some());
    }
}
