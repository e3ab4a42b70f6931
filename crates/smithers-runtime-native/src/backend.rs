//! What a sandbox is on the host: the backend state its handle carries ([`Backend`]: where its
//! state, layer and cgroups are, and which workspace it got), and the config `create` kept.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use smithers_runtime::{RuntimeError, SandboxConfig, SandboxHandle};

use crate::cgroup::SandboxCgroups;

/// The workspace a sandbox got (decided at create, kept in the handle).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "mode")]
pub(crate) enum WorkspaceState {
    /// overlayfs, the project as the lower layer (handles from before copy mode have no
    /// field and are this).
    #[default]
    Overlay,
    /// A copy of the project in the state directory, bound at /workspace; `reason` says why
    /// (asked for, or overlayfs unavailable and why).
    Copy { reason: String },
}

impl WorkspaceState {
    pub(crate) fn copy_reason(&self) -> Option<&str> {
        match self {
            WorkspaceState::Overlay => None,
            WorkspaceState::Copy { reason } => Some(reason),
        }
    }
}

/// How a copy workspace chosen for other owners' files starts its reason.
pub(crate) const FOREIGN_OWNERS: &str = "files of other owners in the project";

/// Backend state stored in the handle (plain data, for cleanup from another process).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Backend {
    pub(crate) state_dir: PathBuf,
    pub(crate) root_dir: PathBuf,
    /// A tmpfs is mounted on `state_dir/layer` (disk limit).
    pub(crate) layer_tmpfs: bool,
    /// The workspace layer when it is not `state_dir/layer`: on the disk-backed layer root
    /// (no disk limit, state root elsewhere). Absent in older handles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) layer_dir: Option<PathBuf>,
    /// The disk-backed layer is the overlay's work directory itself, with the upper directory
    /// beside it (`<layer>.upper`) rather than both inside it: one directory level fewer to
    /// make and to remove, and removing a directory waits for a discard on this project's
    /// disks. False in older handles (`upper/` and `work/` inside the layer).
    #[serde(default)]
    pub(crate) flat_layer: bool,
    pub(crate) cgroups: SandboxCgroups,
    /// Overlay or copy (absent in handles from before copy mode: overlay).
    #[serde(default)]
    pub(crate) workspace: WorkspaceState,
}

impl Backend {
    pub(crate) fn from_handle(
        handle: &SandboxHandle,
        verb: &'static str,
    ) -> Result<Backend, RuntimeError> {
        serde_json::from_value(handle.backend.clone()).map_err(|e| RuntimeError::OutOfOrder {
            verb,
            reason: format!("the handle carries no native runtime state: {e}"),
        })
    }
    pub(crate) fn layer(&self) -> PathBuf {
        self.layer_dir
            .clone()
            .unwrap_or_else(|| self.state_dir.join("layer"))
    }
    pub(crate) fn upper(&self) -> PathBuf {
        match (&self.layer_dir, self.flat_layer) {
            (Some(layer), true) => {
                let mut name = layer.as_os_str().to_owned();
                name.push(".upper");
                PathBuf::from(name)
            }
            _ => self.layer().join("upper"),
        }
    }
    pub(crate) fn work(&self) -> PathBuf {
        match (&self.layer_dir, self.flat_layer) {
            (Some(layer), true) => layer.clone(),
            _ => self.layer().join("work"),
        }
    }
    /// When the project is a git worktree: the overlay layer (upper, work) over its
    /// repository's common directory, which the sandbox sees writable at its own path. Beside
    /// the workspace's upper directory, on the same file system (one overlayfs accepts).
    pub(crate) fn git_common_upper(&self) -> PathBuf {
        let mut name = self.upper().into_os_string();
        name.push(".git-common");
        PathBuf::from(name)
    }
    pub(crate) fn git_common_work(&self) -> PathBuf {
        let mut name = self.upper().into_os_string();
        name.push(".git-common-work");
        PathBuf::from(name)
    }
    /// The workspace copy (copy mode), in the layer so that a disk limit caps it too.
    pub(crate) fn copy(&self) -> PathBuf {
        self.layer().join("copy")
    }
    /// The new root's mount point: one empty directory of the state root for every sandbox
    /// (each init mounts on it in its own mount namespace only, so they never meet; the host
    /// sees it empty), which a warm sandbox can mount on before it knows its sandbox.
    pub(crate) fn new_root(&self) -> PathBuf {
        match self.state_dir.parent() {
            Some(state_root) => Backend::new_root_in(state_root),
            None => self.state_dir.join("root"),
        }
    }
    pub(crate) fn new_root_in(state_root: &Path) -> PathBuf {
        state_root.join(".mount-root")
    }
    /// `/result`, and below the output directory (the result file): in the size-capped layer
    /// when there is a disk limit, so that `--disk` caps what a step leaves there too (on the
    /// state root, a tmpfs without a size of its own, a step could fill the host's memory).
    pub(crate) fn artifacts(&self) -> PathBuf {
        self.capped_dir("artifacts")
    }
    pub(crate) fn out(&self) -> PathBuf {
        self.capped_dir("out")
    }
    /// The request directory the sandbox sees at `/run/smithers/request`: the runtime's own
    /// copy of the handle's `request_path` (ship writes `request.json` to both), beside
    /// `/result` and the output directory. Being the sandbox's and named by nothing of the
    /// project, it can be bound before the sandbox's ids are known (an armed warm sandbox,
    /// see warm.rs), and nothing in the project tree is ever bound into the sandbox but the
    /// project itself.
    pub(crate) fn request_dir(&self) -> PathBuf {
        self.capped_dir("request")
    }
    pub(crate) fn capped_dir(&self, name: &str) -> PathBuf {
        if self.layer_tmpfs {
            self.layer().join(name)
        } else {
            self.state_dir.join(name)
        }
    }
    pub(crate) fn config_file(&self) -> PathBuf {
        self.state_dir.join("config.json")
    }
    pub(crate) fn outcome_file(&self) -> PathBuf {
        self.state_dir.join("outcome.json")
    }
    pub(crate) fn result_problem_file(&self) -> PathBuf {
        self.state_dir.join("result-rejected.txt")
    }
    pub(crate) fn log_file(&self) -> PathBuf {
        self.state_dir.join("stream.ndjson")
    }
    /// Present when collect left changes of the step out for a size limit: cleanup then
    /// keeps the workspace layer (see `cleanup::keep_layer`).
    pub(crate) fn keep_layer_marker(&self) -> PathBuf {
        self.state_dir.join("keep-layer")
    }
    /// The tree holding the step's writes: the overlay's upper directory, or the copy.
    pub(crate) fn written_layer(&self) -> PathBuf {
        match self.workspace {
            WorkspaceState::Overlay => self.upper(),
            WorkspaceState::Copy { .. } => self.copy(),
        }
    }
    /// What ship's copy copied (copy mode), for the log's workspace record.
    pub(crate) fn copy_report_file(&self) -> PathBuf {
        self.state_dir.join("copy-report.json")
    }
    /// What the copy held when complete (`smithers_patch::CopyManifest`), for collect to
    /// tell the host's edits from the step's.
    pub(crate) fn copy_manifest_file(&self) -> PathBuf {
        self.state_dir.join("copy-manifest.bin")
    }
}

/// The config as `create` accepted it, kept in the state dir (it may hold env secrets, so it
/// is not put in the handle, which goes to the database).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StoredConfig {
    pub(crate) config: SandboxConfig,
    pub(crate) effective_pids_limit: Option<u32>,
    /// The memory limit in force: the config's, or the runtime's default
    /// ([`crate::NativeOptions::default_memory_limit`]) where the memory controller exists.
    #[serde(default)]
    pub(crate) effective_memory_limit: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_without_a_workspace_field_are_overlay() {
        let old = serde_json::json!({
            "stateDir": "/s", "rootDir": "/p", "layerTmpfs": false,
            "cgroups": serde_json::to_value(SandboxCgroups::default()).unwrap(),
        });
        let b: Backend = serde_json::from_value(old).unwrap();
        assert_eq!(b.workspace, WorkspaceState::Overlay);
        let copy = Backend {
            workspace: WorkspaceState::Copy {
                reason: "why".into(),
            },
            ..b
        };
        let v = serde_json::to_value(&copy).unwrap();
        assert_eq!(
            v["workspace"],
            serde_json::json!({"mode": "copy", "reason": "why"})
        );
        assert_eq!(serde_json::from_value::<Backend>(v).unwrap(), copy);
    }
}
