//! The `create` verb: refuse what this host cannot enforce, decide the workspace (overlay or
//! copy), then make the sandbox's state and layer directories, cgroups and config, with a
//! warm sandbox's init and cgroups when one is claimed (an armed one adopted whole).

use std::path::{Path, PathBuf};

use smithers_runtime::{RuntimeError, RuntimeKind, SandboxConfig, SandboxHandle};

use crate::armed;
use crate::backend::{Backend, StoredConfig, WorkspaceState, FOREIGN_OWNERS};
use crate::cgroup::{CgroupHost, SandboxCgroups};
use crate::cleanup::{cleanup_backend, cleanup_confined};
use crate::egress;
use crate::files::{io_err, is_mount_point, restrict_mode, write_private};
use crate::host::{Defaults, HostCaps};
use crate::init_command::INIT_BIN;
use crate::layer::{make_layer_subdirs, place_layer};
use crate::names::{self, project_dirs, RUNTIME};
use crate::options::{WorkspaceMode, WORKSPACE_ENV};
use crate::owned;
use crate::ownership;
use crate::report;
use crate::runtime::{NativeRuntime, PRESTART_PATIENCE};
use crate::threads::blocking;
use crate::warm;
use smithers_sandbox_init::sys;
use smithers_sandbox_init::INIT_ENV;

impl NativeRuntime {
    fn refuse(control: &'static str, reason: impl Into<String>) -> RuntimeError {
        RuntimeError::ControlUnsupported {
            runtime: RUNTIME,
            control,
            reason: reason.into(),
        }
    }

    /// Refuses what this runtime cannot enforce here (strict: never silently dropped).
    fn check_controls(&self, config: &SandboxConfig, caps: &HostCaps) -> Result<(), RuntimeError> {
        let c = &config.controls;
        if config.image.is_some() {
            return Err(Self::refuse(
                "image",
                "the native runtime runs on the host's own system directories; images need the docker runtime",
            ));
        }
        if let Some(port) = c.ports.iter().find(|p| p.host != p.container) {
            return Err(Self::refuse(
                "ports",
                format!(
                    "with allowNetwork the sandbox shares the host network, so a port cannot be remapped ({} -> {})",
                    port.host, port.container
                ),
            ));
        }
        if c.workspace.is_some() {
            return Err(Self::refuse(
                "workspace",
                "persistent workspaces are a feature of remote runtimes",
            ));
        }
        if c.egress.is_some() {
            return Err(Self::refuse(
                "egress",
                "egress proxying and secret bindings are not implemented by the native runtime",
            ));
        }
        // Parsed and linted here, so a bad policy fails at create, naming the problem.
        egress::policy(c)?;
        for (control, ctrl, wanted) in [
            ("memoryLimit", "memory", c.memory_limit_bytes.is_some()),
            ("pidsLimit", "pids", c.pids_limit.is_some()),
            ("cpuLimit", "cpu", c.cpu_limit.is_some()),
        ] {
            if wanted && caps.cgroups.source(ctrl).is_none() {
                let why = caps.cgroups.why_unusable(ctrl);
                return Err(Self::refuse(
                    control,
                    format!(
                        "no {ctrl} cgroup controller is available to this process: {}; fix: {}",
                        why.reason, why.fix
                    ),
                ));
            }
        }
        if c.disk_limit_bytes.is_some() && !caps.host_mounts {
            return Err(Self::refuse(
                "diskLimit",
                "capping the copy-on-write layer needs a size-limited tmpfs mounted on the host, which needs root",
            ));
        }
        Ok(())
    }

    pub(crate) async fn create_inner(
        &self,
        config: &SandboxConfig,
    ) -> Result<SandboxHandle, RuntimeError> {
        config.validate()?;
        if config.runtime != RuntimeKind::Bubblewrap {
            return Err(RuntimeError::InvalidControl {
                control: "runtime",
                reason: format!(
                    "the native runtime serves \"bubblewrap\", not {:?}",
                    config.runtime.as_str()
                ),
            });
        }
        let caps = self.caps();
        if let Err(reason) = &caps.init {
            return Err(RuntimeError::Unavailable {
                runtime: RUNTIME,
                reason: reason.clone(),
                fix: Some(format!(
                    "build the {INIT_BIN} binary (cargo build -p smithers-runtime-native) or set ${INIT_ENV}"
                )),
            });
        }
        if let Err((reason, fix)) = &caps.userns {
            return Err(RuntimeError::Unavailable {
                runtime: RUNTIME,
                reason: reason.clone(),
                fix: Some(fix.clone()),
            });
        }
        // In a container the engine's default confinement (seccomp, masked /proc) refuses
        // what the sandbox needs, and nothing cheap shows it: the init's probe tries (once
        // per runtime), and a refusal names the engine's flags instead of failing at execute.
        if caps.container_engine.is_some() && self.container_probe_ok.get().is_none() {
            self.refuse_unless_probe_succeeded(&caps).await?;
            let _ = self.container_probe_ok.set(());
        }
        if let Err(reason) = &caps.seccomp {
            return Err(RuntimeError::Unavailable {
                runtime: RUNTIME,
                reason: reason.clone(),
                fix: None,
            });
        }
        self.check_controls(config, &caps)?;
        let workspace = match self.options.workspace {
            WorkspaceMode::Copy => {
                decide_workspace(WorkspaceMode::Copy, report::OverlayCheck::Usable)?
            }
            mode => {
                let check = self
                    .overlay
                    .get_or_init(|| self.overlay_check(&caps))
                    .await
                    .clone();
                decide_workspace(mode, check)?
            }
        };
        // The rest is file system work (directories, cgroups, a tmpfs mount): on a blocking
        // thread, so that no async worker waits on the disk.
        let config = config.clone();
        let defaults = self.defaults();
        let mode = self.options.workspace;
        let pool = match self.warm_pool() {
            Some(Ok(pool)) if warm::eligible(&config) => Some(pool),
            _ => None,
        };
        let prestarted = self
            .prestarted
            .get()
            .filter(|_| warm::eligible(&config))
            .cloned();
        let (handle, warm) = blocking("create the sandbox", move || {
            let workspace = check_ownership(mode, workspace, &config.root_dir, &caps)?;
            let key = armed::ArmKey::of(&config, &workspace);
            let warm = pool
                .as_ref()
                .and_then(|pool| pool.claim(Some(&key)))
                .or_else(|| prestarted.and_then(|pool| pool.claim_waiting(PRESTART_PATIENCE)));
            // An armed sandbox that could not be adopted is given up and the step starts cold;
            // the pool's status says why.
            let given_up = |why: String| {
                if let Some(pool) = &pool {
                    pool.adopt_failed(why);
                }
            };
            create_on_disk(&config, &caps, workspace, defaults, warm, given_up)
        })
        .await??;
        if let (Some(warm), Ok(backend)) = (warm, Backend::from_handle(&handle, "create")) {
            self.attached
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(backend.state_dir, warm);
        }
        Ok(handle)
    }
}

/// The workspace of a new sandbox under `mode`, given what the probe found about overlayfs.
fn decide_workspace(
    mode: WorkspaceMode,
    overlay: report::OverlayCheck,
) -> Result<WorkspaceState, RuntimeError> {
    use report::OverlayCheck;
    match (mode, overlay) {
        (WorkspaceMode::Copy, _) => Ok(WorkspaceState::Copy {
            reason: "copy mode requested (workspace = copy)".into(),
        }),
        (WorkspaceMode::Auto, OverlayCheck::Unusable(why)) => Ok(WorkspaceState::Copy {
            reason: format!("overlayfs cannot be mounted in a user namespace here: {why}"),
        }),
        (WorkspaceMode::Overlay, OverlayCheck::Unusable(why)) => Err(RuntimeError::Unavailable {
            runtime: RUNTIME,
            reason: format!(
                "the overlay workspace was requested but overlayfs cannot be mounted in a user namespace here: {why}"
            ),
            fix: Some(format!(
                "use workspace mode auto or copy (--workspace, ${WORKSPACE_ENV}) to fall back to a copy of the project; or a kernel >= 5.11 with overlayfs and a state root on ext4, xfs or tmpfs"
            )),
        }),
        // Usable, or the probe did not get as far as trying (then execute reports what
        // really fails, as before this check existed).
        (_, OverlayCheck::Usable | OverlayCheck::Unknown(_)) => Ok(WorkspaceState::Overlay),
    }
}

/// An overlay only over a project whose top directory is the runtime's (see [`ownership`],
/// which also says why nothing more is read here, and what collect checks instead):
/// otherwise `auto` takes a copy, saying why, and `overlay` is refused.
fn check_ownership(
    mode: WorkspaceMode,
    workspace: WorkspaceState,
    root: &Path,
    caps: &HostCaps,
) -> Result<WorkspaceState, RuntimeError> {
    if workspace != WorkspaceState::Overlay {
        return Ok(workspace);
    }
    let Some(foreign) = ownership::root_foreign(root, caps.uid, caps.gid) else {
        return Ok(workspace);
    };
    let why = foreign.describe(caps.uid, caps.gid);
    match mode {
        WorkspaceMode::Overlay => Err(RuntimeError::Unavailable {
            runtime: RUNTIME,
            reason: format!("the overlay workspace was requested but {why}"),
            fix: Some(format!(
                "use workspace mode auto or copy (--workspace, ${WORKSPACE_ENV}), which copies the project (the copy is the runtime's), or run the runtime as the tree's owner"
            )),
        }),
        _ => Ok(WorkspaceState::Copy {
            reason: format!("{FOREIGN_OWNERS}: {why}"),
        }),
    }
}

/// What `create` does once the controls and the workspace mode are decided: the state and
/// layer directories, the cgroups, the config; undone when any of it fails.
fn create_on_disk(
    config: &SandboxConfig,
    caps: &HostCaps,
    workspace: WorkspaceState,
    defaults: Defaults,
    warm: Option<warm::WarmSandbox>,
    armed_given_up: impl FnOnce(String),
) -> Result<(SandboxHandle, Option<warm::ClaimedWarm>), RuntimeError> {
    let root_dir = &config.root_dir;
    match std::fs::metadata(root_dir) {
        Ok(m) if m.is_dir() => {}
        _ => {
            return Err(RuntimeError::InvalidControl {
                control: "rootDir",
                reason: format!("{} is not a directory", root_dir.display()),
            })
        }
    }
    let (sandbox_root, request_path, result_path) = project_dirs(root_dir, config);

    std::fs::create_dir_all(&caps.state_root)
        .map_err(io_err("create state directory", &caps.state_root))?;
    restrict_mode(&caps.state_root)?;
    let state_dir = caps.state_root.join(names::dir_name(config));
    let warm = match warm {
        Some(w) if w.armed.is_some() => {
            match adopt_armed(config, caps, &workspace, defaults, w, &state_dir) {
                Ok(adopted) => return Ok(adopted),
                Err(why) => {
                    armed_given_up(why);
                    None
                }
            }
        }
        other => other,
    };
    match std::fs::create_dir(&state_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if !take_over_leftover(config, caps, &state_dir)? {
                return Err(RuntimeError::OutOfOrder {
                    verb: "create",
                    reason: format!(
                        "sandbox {} already exists (state at {}); clean it up first",
                        config.entity_id(),
                        state_dir.display()
                    ),
                });
            }
            std::fs::create_dir(&state_dir)
                .map_err(|e| RuntimeError::io("create state directory", &state_dir, e))?;
        }
        Err(e) => return Err(RuntimeError::io("create state directory", &state_dir, e)),
    }
    let mut backend = Backend {
        state_dir,
        root_dir: root_dir.clone(),
        layer_tmpfs: false,
        layer_dir: None,
        flat_layer: false,
        cgroups: SandboxCgroups::default(),
        workspace,
    };
    let warm = match prepare(config, caps, &mut backend, &request_path, defaults, warm) {
        Ok(warm) => warm,
        Err(e) => {
            let _ = cleanup_backend(&backend, &[], None);
            return Err(e);
        }
    };
    let handle = handle_of(config, &backend, (sandbox_root, request_path, result_path));
    Ok((handle, warm))
}

/// Create with an armed warm sandbox (see [`armed`]): its directories renamed to this
/// sandbox's, its cgroups (already at this configuration's limits) and its init the
/// sandbox's. An error (why) when its directories could not take this sandbox's names (a
/// leftover of these ids is there, say): it is then given up, and create goes on without it.
fn adopt_armed(
    config: &SandboxConfig,
    caps: &HostCaps,
    workspace: &WorkspaceState,
    defaults: Defaults,
    warm: warm::WarmSandbox,
    state_dir: &Path,
) -> Result<(SandboxHandle, Option<warm::ClaimedWarm>), String> {
    let mut backend = Backend {
        state_dir: state_dir.to_path_buf(),
        root_dir: config.root_dir.clone(),
        layer_tmpfs: false,
        layer_dir: None,
        flat_layer: false,
        cgroups: warm.cgroups.clone(),
        workspace: workspace.clone(),
    };
    let name = names::dir_name(config);
    let adopted = place_layer(caps, &config.controls, &mut backend, &name)
        .map_err(|e| format!("its layer: {e}"))
        .and_then(|()| match warm.armed.as_ref() {
            Some(armed) => armed
                .adopt(&backend)
                .map_err(|e| format!("its directories: {e}")),
            None => Err("it is not armed".into()),
        });
    if let Err(why) = adopted {
        warm.discard();
        return Err(why);
    }
    let (claimed, _cgroups) = warm.claim();
    let (sandbox_root, request_path, result_path) = project_dirs(&config.root_dir, config);
    let limits = defaults.limits(caps, &config.controls);
    let written = write_cleanup_record(config, &backend).and_then(|()| {
        finish_on_disk(
            config,
            &backend,
            &request_path,
            limits.pids,
            limits.memory_bytes,
        )
    });
    let handle = handle_of(config, &backend, (sandbox_root, request_path, result_path));
    match written {
        Ok(()) => Ok((handle, Some(claimed))),
        // The sandbox is ours now: undone as a failed create is.
        Err(e) => {
            drop(claimed);
            let _ = cleanup_backend(&backend, &[], None);
            Err(format!("its records: {e}"))
        }
    }
}

/// A sandbox of these ids that a process left when it died between making it and storing
/// its handle (its row then holds nothing to clean up with, so recovery cannot): cleaned up
/// here as its own cleanup would, through the same confinement (the record's cgroups under
/// our parents, the request directory of the record's project through no link, a kept layer
/// moved into that project), so that the ids can be used again. Only when its cleanup record
/// names an owner that is not running any more; a sandbox without a record, our own, or
/// another live process's is left alone (`false`: create refuses, as before).
fn take_over_leftover(
    config: &SandboxConfig,
    caps: &HostCaps,
    state_dir: &Path,
) -> Result<bool, RuntimeError> {
    let Some(record) = owned::read_record(state_dir)? else {
        return Ok(false);
    };
    if !record.owner_is_gone() {
        return Ok(false);
    }
    let name = names::dir_name(config);
    let layer_dir = caps.layer_root.join(&name);
    let flat_upper = caps.layer_root.join(format!("{name}.upper"));
    let layer_exists = std::fs::symlink_metadata(&layer_dir).is_ok();
    let backend = Backend {
        state_dir: state_dir.to_path_buf(),
        root_dir: record.root_dir.clone(),
        layer_tmpfs: is_mount_point(&state_dir.join("layer")),
        layer_dir: layer_exists.then(|| layer_dir.clone()),
        flat_layer: std::fs::symlink_metadata(&flat_upper).is_ok()
            || (layer_exists && std::fs::symlink_metadata(layer_dir.join("upper")).is_err()),
        cgroups: record.cgroups.clone(),
        workspace: WorkspaceState::Overlay,
    };
    let handle = handle_of(config, &backend, project_dirs(&record.root_dir, config));
    cleanup_confined(&handle, &backend, caps)?;
    Ok(true)
}

/// The sandbox's directories, cgroups and config; with a warm sandbox, its cgroups (given the
/// sandbox's limits) rather than new ones, and its init returned to stay attached.
fn prepare(
    config: &SandboxConfig,
    caps: &HostCaps,
    backend: &mut Backend,
    request_path: &Path,
    defaults: Defaults,
    warm: Option<warm::WarmSandbox>,
) -> Result<Option<warm::ClaimedWarm>, RuntimeError> {
    let c = &config.controls;
    place_layer(caps, c, backend, &names::dir_name(config))?;
    let limits = defaults.limits(caps, c);
    let (pids, memory) = (limits.pids, limits.memory_bytes);
    // A warm sandbox's cgroups take this one's limits (a memory limit below what its init
    // already uses is refused by the kernel: then it is given up for new cgroups).
    let warm = warm.and_then(|w| match CgroupHost::set_limits(&w.cgroups, &limits) {
        Ok(()) => Some(w.claim()),
        Err(_) => {
            w.discard();
            None
        }
    });
    let warm = match warm {
        Some((init, cgroups)) => {
            backend.cgroups = cgroups;
            Some(init)
        }
        None => {
            backend.cgroups = caps
                .cgroups
                .create(&names::cgroup_name(config), &limits)
                .map_err(|e| RuntimeError::spawn("create the sandbox cgroups", e))?;
            None
        }
    };
    // Before anything can join the cgroups: the one record cleanup from another process
    // trusts about what it may kill (the handle comes back from the project's database).
    write_cleanup_record(config, backend)?;
    let layer = backend.layer();
    std::fs::create_dir(&layer).map_err(io_err("create", &layer))?;
    if let Some(bytes) = c.disk_limit_bytes {
        let data = sys::cstring(&format!("size={bytes},mode=0700"));
        sys::mount(
            Some(c"tmpfs"),
            &layer,
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&data),
        )
        .map_err(|e| RuntimeError::spawn("mount the size-capped upper layer", e))?;
        backend.layer_tmpfs = true;
    }
    make_layer_subdirs(backend)?;
    crate::layers::adopt(backend, &config.workspace_layers)?;
    finish_on_disk(config, backend, request_path, pids, memory)?;
    Ok(warm)
}

/// The record cleanup from another process trusts about what it may kill (see
/// [`owned::CleanupRecord`]).
fn write_cleanup_record(config: &SandboxConfig, backend: &Backend) -> Result<(), RuntimeError> {
    let record = owned::CleanupRecord::for_self(&config.root_dir, &backend.cgroups);
    write_private(
        &backend.state_dir.join(owned::CLEANUP_RECORD),
        &serde_json::to_vec(&record).unwrap_or_default(),
    )
}

/// Create's last writes: the project's state and request directories, and the config.
fn finish_on_disk(
    config: &SandboxConfig,
    backend: &Backend,
    request_path: &Path,
    pids: Option<u32>,
    memory: Option<u64>,
) -> Result<(), RuntimeError> {
    // The project's state directory, ignored by git when we make it.
    smithers_runtime::ensure_state_dir(&config.root_dir)
        .map_err(io_err("create", &config.root_dir.join(".smithers")))?;
    std::fs::create_dir_all(request_path).map_err(io_err("create", request_path))?;
    let stored = StoredConfig {
        config: config.clone(),
        effective_pids_limit: pids,
        effective_memory_limit: memory,
    };
    write_private(
        &backend.config_file(),
        &serde_json::to_vec(&stored).unwrap_or_default(),
    )
}

/// The handle of a sandbox made for `config`: plain data (ids, its directories in the
/// project, the backend's state to clean up from another process).
fn handle_of(
    config: &SandboxConfig,
    backend: &Backend,
    (sandbox_root, request_path, result_path): (PathBuf, PathBuf, PathBuf),
) -> SandboxHandle {
    SandboxHandle {
        runtime: RuntimeKind::Bubblewrap,
        run_id: config.run_id.clone(),
        sandbox_id: config.sandbox_id.clone(),
        sandbox_root,
        request_path,
        result_path,
        container_id: None,
        workspace_id: None,
        backend: serde_json::to_value(backend).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use report::OverlayCheck;

    #[test]
    fn workspace_mode_decision() {
        let unusable = || OverlayCheck::Unusable("mount overlay: EINVAL".into());
        assert_eq!(
            decide_workspace(WorkspaceMode::Auto, OverlayCheck::Usable).unwrap(),
            WorkspaceState::Overlay
        );
        let auto = decide_workspace(WorkspaceMode::Auto, unusable()).unwrap();
        assert!(
            auto.copy_reason()
                .is_some_and(|r| r.contains("overlayfs cannot be mounted")
                    && r.contains("mount overlay: EINVAL")),
            "{auto:?}"
        );
        // Explicitly asked for overlay: fail closed, naming the way out.
        let err = decide_workspace(WorkspaceMode::Overlay, unusable()).unwrap_err();
        assert!(matches!(err, RuntimeError::Unavailable { .. }), "{err}");
        assert!(err.to_string().contains("mount overlay: EINVAL"), "{err}");
        assert_eq!(
            decide_workspace(WorkspaceMode::Overlay, OverlayCheck::Usable).unwrap(),
            WorkspaceState::Overlay
        );
        for check in [OverlayCheck::Usable, unusable()] {
            let copy = decide_workspace(WorkspaceMode::Copy, check).unwrap();
            assert!(copy.copy_reason().is_some_and(|r| r.contains("requested")));
        }
        // The probe never got to overlayfs: no fallback (execute reports the real problem).
        let unknown = || OverlayCheck::Unknown("no user namespaces".into());
        for mode in [WorkspaceMode::Auto, WorkspaceMode::Overlay] {
            assert_eq!(
                decide_workspace(mode, unknown()).unwrap(),
                WorkspaceState::Overlay
            );
        }
        for mode in [
            WorkspaceMode::Auto,
            WorkspaceMode::Overlay,
            WorkspaceMode::Copy,
        ] {
            assert_eq!(WorkspaceMode::parse(mode.as_str()), Some(mode));
        }
        assert_eq!(WorkspaceMode::parse("Copy"), None);
    }
}
