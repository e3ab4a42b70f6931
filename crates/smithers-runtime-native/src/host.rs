//! What this host offers the runtime ([`HostCaps`], found once per runtime), where sandboxes'
//! state goes by default, and the limits a sandbox gets when its config sets none.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::cgroup::{CgroupHost, CgroupLimits};
use crate::init_command::InitCommand;
use crate::options::NativeOptions;
use crate::plan::{BpfInstruction, HostFacts};
use crate::{host_diag, seccomp};
use smithers_sandbox_init::sys;

/// What this host offers, computed once per runtime (cheap file reads, no process).
#[derive(Debug)]
pub(crate) struct HostCaps {
    pub(crate) init: Result<InitCommand, String>,
    pub(crate) facts: HostFacts,
    pub(crate) cgroups: CgroupHost,
    pub(crate) seccomp: Result<Vec<BpfInstruction>, String>,
    /// Why user namespaces are refused, and the fix.
    pub(crate) userns: Result<(), (String, String)>,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    /// Whether we may mount a size-capped tmpfs on the host for the upper layer.
    pub(crate) host_mounts: bool,
    /// `NativeOptions::prepared_root`.
    pub(crate) prepared_root: bool,
    pub(crate) state_root: PathBuf,
    /// Where workspace layers go without a disk limit (see `NativeOptions::layer_root`).
    pub(crate) layer_root: PathBuf,
    /// `NativeOptions::disk_reserve_bytes`.
    pub(crate) disk_reserve: u64,
    pub(crate) host_env: BTreeMap<String, String>,
    /// `host_diag::container_engine`, once per runtime (four file checks).
    pub(crate) container_engine: Option<&'static str>,
}

/// What this host has for the native runtime with these options (see [`HostCaps`]).
pub(crate) fn detect(options: &NativeOptions) -> HostCaps {
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
        userns: userns_available(uid),
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

/// Cheap check that user namespaces are allowed (sysctls only; the probe really tries).
/// Why user namespaces are refused here before anything is tried, and the fix (see
/// [`crate::host_diag::userns_refusal`]).
pub(crate) fn userns_available(uid: u32) -> Result<(), (String, String)> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    match crate::host_diag::userns_refusal(uid, &mountinfo) {
        Some(refusal) => Err(refusal),
        None => Ok(()),
    }
}

/// The limits a sandbox gets when its config sets none.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Defaults {
    pub(crate) pids: Option<u32>,
    pub(crate) memory: Option<u64>,
}

impl Defaults {
    /// The cgroup limits of a sandbox with these controls: its own, else the defaults where
    /// the controller exists (a warm sandbox's are those of a sandbox that sets none).
    pub(crate) fn limits(&self, caps: &HostCaps, c: &smithers_runtime::Controls) -> CgroupLimits {
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
