//! What a stored handle names, and whether it is trusted to name those host objects.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bollard::Docker;
use smithers_runtime::{RuntimeError, SandboxHandle};

use crate::engine::{is_not_found, spawn_err};
use crate::hostfs;
use crate::orphans::owner_alive;
use crate::plan::{self, BackendState};
use crate::runtime::DockerRuntime;

pub(crate) fn untrusted(reason: String) -> RuntimeError {
    RuntimeError::InvalidControl {
        control: "handle",
        reason: format!("the stored handle is not trusted to name host objects: {reason}"),
    }
}

impl DockerRuntime {
    /// Refuses a handle whose names and directories are not those `create` derives from its
    /// ids and project root (the container and volume name, the state directory under this
    /// runtime's state root and its parts, the pids cgroup).
    pub(crate) fn check_derived(
        &self,
        handle: &SandboxHandle,
        root: &Path,
        state: &BackendState,
    ) -> Result<(), RuntimeError> {
        let root: PathBuf = root.components().collect();
        let name = plan::object_name(&handle.run_id, &handle.sandbox_id, &root);
        let state_dir = self.opts.state_root.join(&name);
        let layer = state_dir.join("layer");
        let cgroup = format!("smithers-docker/{name}");
        let checks: [(&str, bool); 7] = [
            ("container name", state.container_name == name),
            ("volume name", state.volume_name == name),
            ("state directory", state.state_dir == state_dir),
            ("upper directory", state.upper == layer.join("upper")),
            ("work directory", state.work == layer.join("work")),
            (
                "output directories",
                state.out_dir == state_dir.join("out")
                    && state.artifacts_dir == state_dir.join("artifacts"),
            ),
            (
                "pids cgroup",
                state.pids_cgroup.as_ref().is_none_or(|c| *c == cgroup),
            ),
        ];
        match checks.iter().find(|(_, ok)| !ok) {
            None => Ok(()),
            Some((what, _)) => Err(untrusted(format!(
                "its {what} is not the one derived for {}/{} ({name})",
                handle.run_id, handle.sandbox_id
            ))),
        }
    }
}

/// Refuses unless the container and volume the state names, where they exist, carry our
/// labels for exactly this sandbox (managed, its run and sandbox ids, its state directory)
/// and are not another live process's. A missing object is fine: nothing to remove.
pub(crate) async fn check_labels(
    docker: &Docker,
    handle: &SandboxHandle,
    state: &BackendState,
) -> Result<(), RuntimeError> {
    let container = match docker.inspect_container(&state.container_name, None).await {
        Ok(c) => Some(c.config.and_then(|c| c.labels).unwrap_or_default()),
        Err(e) if is_not_found(&e) => None,
        Err(e) => {
            return Err(spawn_err(
                format!("inspect container {}", state.container_name),
                &e,
            ))
        }
    };
    let volume = match docker.inspect_volume(&state.volume_name).await {
        Ok(v) => Some(v.labels),
        Err(e) if is_not_found(&e) => None,
        Err(e) => {
            return Err(spawn_err(
                format!("inspect volume {}", state.volume_name),
                &e,
            ))
        }
    };
    for (kind, labels) in [("container", container), ("volume", volume)] {
        let Some(labels) = labels else { continue };
        if let Err(why) = labels_name_sandbox(&labels, handle, state) {
            return Err(untrusted(format!(
                "{kind} {} is not this sandbox's: {why}; left alone",
                state.container_name
            )));
        }
    }
    Ok(())
}

/// Whether an engine object's labels make it this sandbox's, ours to remove.
pub(crate) fn labels_name_sandbox(
    labels: &HashMap<String, String>,
    handle: &SandboxHandle,
    state: &BackendState,
) -> Result<(), String> {
    let state_dir = state.state_dir.to_string_lossy();
    let wanted = [
        (plan::LABEL_MANAGED, "true"),
        (plan::LABEL_RUN_ID, handle.run_id.as_str()),
        (plan::LABEL_SANDBOX_ID, handle.sandbox_id.as_str()),
        (plan::LABEL_STATE_DIR, state_dir.as_ref()),
    ];
    for (key, value) in wanted {
        if labels.get(key).map(String::as_str) != Some(value) {
            return Err(format!(
                "label {key} is {:?}, not {value:?}",
                labels.get(key)
            ));
        }
    }
    let me = hostfs::self_identity();
    let owner_is_me = labels.get(plan::LABEL_OWNER_PID) == Some(&me.0.to_string())
        && labels.get(plan::LABEL_OWNER_START) == Some(&me.1.to_string());
    if owner_alive(labels) && !owner_is_me {
        return Err("its owner process is still running".to_string());
    }
    Ok(())
}

pub(crate) fn backend_state(handle: &SandboxHandle) -> Result<Option<BackendState>, RuntimeError> {
    if handle.backend.is_null() {
        return Ok(None);
    }
    serde_json::from_value(handle.backend.clone())
        .map(Some)
        .map_err(|e| RuntimeError::InvalidControl {
            control: "handle",
            reason: format!("not a docker sandbox handle: {e}"),
        })
}

pub(crate) fn require_state(
    handle: &SandboxHandle,
    verb: &'static str,
) -> Result<BackendState, RuntimeError> {
    backend_state(handle)?.ok_or_else(|| RuntimeError::OutOfOrder {
        verb,
        reason: "the handle has no docker state (create did not complete)".to_string(),
    })
}
