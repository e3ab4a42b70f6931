//! The runtime value: its options, its engine connection (made on first use) and what it keeps
//! in memory between verbs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use bollard::Docker;
use smithers_runtime::{Controls, ExecOutcome, RuntimeError};
use tokio::sync::OnceCell;

use crate::engine::{self, default_socket};
use crate::started::StartedSandboxes;

/// File name of the watchdog binary.
pub const WATCHDOG_BIN: &str = "smithers-docker-watchdog";

/// Settings of a [`DockerRuntime`].
#[derive(Debug, Clone)]
pub struct DockerOptions {
    /// Engine socket path (default: `DOCKER_HOST` if `unix://`, else `/var/run/docker.sock`).
    pub socket: String,
    /// Where per-sandbox writable layers live: must be outside every project tree and on a
    /// filesystem that can be an overlay upper (not overlayfs itself).
    /// Default: `<temp dir>/smithers-docker`.
    pub state_root: PathBuf,
    /// Image used when the config names none. None: a config without `image` is refused.
    pub default_image: Option<String>,
    /// The `smithers-docker-watchdog` binary, which kills the container if this process dies
    /// mid-execute. Default: next to the running executable, when it is there. Without it the
    /// probe and every outcome report `parent-death` as unavailable.
    pub watchdog: Option<PathBuf>,
    /// The smithers-sandbox binary whose init holds a sandbox's network namespace for an
    /// egress policy (see the `egress` module). None: a policy is refused.
    pub egress_holder: Option<PathBuf>,
}

impl Default for DockerOptions {
    fn default() -> Self {
        DockerOptions {
            socket: default_socket(),
            state_root: std::env::temp_dir().join("smithers-docker"),
            default_image: None,
            watchdog: std::env::current_exe()
                .ok()
                .and_then(|e| Some(e.parent()?.join(WATCHDOG_BIN)))
                .filter(|p| p.is_file()),
            egress_holder: None,
        }
    }
}

/// What the runtime keeps in memory between verbs: the controls (the env may hold secrets,
/// so it never goes into the handle) and the outcome for `collect`.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    pub(crate) controls: Controls,
    pub(crate) root_dir: PathBuf,
    pub(crate) outcome: Option<ExecOutcome>,
    /// The step left a result that could not be taken (named in the log): the bundle is
    /// `failed`, not a `finished` bundle without the step's outputs.
    pub(crate) result_rejected: bool,
    pub(crate) log_notes: Vec<String>,
}

/// The docker backend. Cheap to share (`Arc<dyn Runtime>`); one engine connection, made on
/// first use and kept.
#[derive(Debug)]
pub struct DockerRuntime {
    pub(crate) opts: DockerOptions,
    pub(crate) engine: OnceCell<(Docker, engine::EngineInfo)>,
    pub(crate) live: Mutex<HashMap<String, Live>>,
    /// The sandboxes started through the engine and not stopped.
    pub(crate) started: StartedSandboxes,
}

impl DockerRuntime {
    /// A runtime with the given options. No engine call is made until a verb needs one.
    pub fn new(opts: DockerOptions) -> Self {
        DockerRuntime {
            opts,
            engine: OnceCell::new(),
            live: Mutex::new(HashMap::new()),
            started: StartedSandboxes::default(),
        }
    }

    /// The options in force.
    pub fn options(&self) -> &DockerOptions {
        &self.opts
    }

    pub(crate) async fn engine(&self) -> Result<&Docker, RuntimeError> {
        let (docker, _) = self
            .engine
            .get_or_try_init(|| engine::connect(&self.opts.socket))
            .await?;
        Ok(docker)
    }

    pub(crate) fn live_get(&self, name: &str) -> Option<Live> {
        self.live.lock().ok()?.get(name).cloned()
    }

    pub(crate) fn live_update(&self, name: &str, f: impl FnOnce(&mut Live)) {
        if let Ok(mut map) = self.live.lock() {
            if let Some(l) = map.get_mut(name) {
                f(l);
            }
        }
    }
}
