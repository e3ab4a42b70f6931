//! The `docker` runtime: each sandbox is a container on a local Docker engine, reached over
//! its unix socket with `bollard` (the Engine API, never the docker CLI).
//!
//! # Model
//!
//! * `/workspace` is an **overlay** of the project: lower = the live host tree (`rootDir`),
//!   upper/work in a per-sandbox directory **outside** the project
//!   (`<state_root>/<name>/layer/{upper,work}`). The overlay is a Docker volume of the `local`
//!   driver with overlay options, so the engine mounts it when the container starts and this
//!   process needs no mount privilege. The changes the step made are exactly the upper layer,
//!   turned into patches by `smithers-patch` like the local runtime's: both runtimes produce
//!   the same patches for the same writes. The project's `.smithers/` is hidden under an
//!   empty read-only tmpfs.
//! * Same in-sandbox paths as the local runtime: the request JSON is bound read-only at
//!   `/run/smithers/request/request.json` (`$SMITHERS_SANDBOX_REQUEST_PATH`); the step writes
//!   its result JSON at `/run/smithers/out/result.json` (`$SMITHERS_SANDBOX_RESULT_PATH`) or
//!   prints it as stdout; every file under the writable `/result` becomes an artifact. Both
//!   are binds of directories in the state dir. `collect` writes the bundle at
//!   `<rootDir>/.smithers/sandboxes/<runId>/<sandboxId>/result`.
//! * One container per `execute`, created with the command itself (measured faster than a
//!   long-lived container plus `exec`: one create/start instead of create/start/exec/kill),
//!   attached before start so no output is lost.
//!
//! # Enforced, or refused
//!
//! | control | how |
//! |---|---|
//! | network | `NetworkMode=none` (only `lo`) unless `allowNetwork`; ports only with it, bound to 127.0.0.1 |
//! | memory | `Memory` = `MemorySwap` (no extra swap); OOM → [`Termination::Memory`] |
//! | cpu | `NanoCpus` |
//! | pids | default [`plan::DEFAULT_PIDS_LIMIT`]; `pids.max` on a parent cgroup we own (`CgroupParent=/smithers-docker/<name>`, cgroupfs driver, as root), else `PidsLimit`; the cap reached → [`Termination::Pids`] |
//! | disk | `/tmp` is a tmpfs of `diskLimit` (default 256 MiB); the workspace's upper layer is put on a tmpfs of `diskLimit` mounted by this process, which needs CAP_SYS_ADMIN: without it `diskLimit` is refused ([`RuntimeError::ControlUnsupported`]) |
//! | privileges | `CapDrop=ALL`, no `CapAdd`, `no-new-privileges`, a seccomp deny-list ([`plan::seccomp_profile`]: the engine default's denials plus `ptrace`/`process_vm_*`, namespace flags on `clone`), read-only root filesystem, private IPC |
//! | identity | the step runs as the **owner uid:gid of `rootDir`** so its files belong to the project's owner; when that is root, it is uid 0 with no capabilities (documented in the probe as degraded) |
//! | env | nothing from the host: PATH/HOME/TMPDIR set to in-container values, the step's `env`, the Smithers variables |
//! | processes | `Init=true` (reaps orphans); the container's pid namespace means every process dies with it; timeout and cancellation `SIGKILL` the container and wait for it; the `smithers-docker-watchdog` binary kills it if this process dies mid-execute |
//! | workspace (remote), egress proxy | refused: this runtime cannot honour them |
//!
//! The engine must be **local** (the overlay and the binds are host paths). An unreachable
//! engine, a missing image or an unenforceable control fail closed with
//! [`RuntimeError::Unavailable`] / [`RuntimeError::ControlUnsupported`], never a fallback.
//!
//! # Nothing leaks
//!
//! Containers and volumes carry the labels `smithers.managed=true`, `smithers.run_id`,
//! `smithers.sandbox_id`, the owner's pid and start time and the state directory;
//! [`DockerRuntime::cleanup_orphans`] removes those whose owner process is gone. `cleanup`
//! from a handle (which may come back from a crafted database in the project tree) removes
//! only objects named as `create` derives them from the ids and project root and labelled for
//! exactly that sandbox, after inspecting them.

#![forbid(unsafe_code)]

mod cgroup;
mod collect;
mod egress;
mod engine;
mod hostfs;
mod monitor;
pub mod plan;
mod pump;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::models::ContainerStateStatusEnum;
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, KillContainerOptions, ListContainersOptions,
    ListVolumesOptions, RemoveContainerOptions, RemoveVolumeOptions, WaitContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;
use serde_json::Value;
use smithers_runtime::{
    CancellationToken, CollectReport, Controls, EnforcementReport, ExecOutcome, OutputSink,
    Protection, ProtectionStatus, RequestBundle, Runtime, RuntimeError, RuntimeKind, SandboxConfig,
    SandboxHandle, ShipReport, StepCommand, Termination,
};
use tokio::sync::OnceCell;

pub use engine::{default_socket, MIN_API_VERSION};
use engine::{describe, is_not_found, spawn_err, RUNTIME};
pub use plan::BackendState;

/// Largest result JSON read from `/result/result.json` (the README limit of a bundle).
const MAX_RESULT_JSON_BYTES: u64 = 5 * 1024 * 1024;
/// File name of the watchdog binary.
pub const WATCHDOG_BIN: &str = "smithers-docker-watchdog";
/// How long to wait for a killed container to be reported stopped.
const KILL_WAIT: Duration = Duration::from_secs(30);

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
struct Live {
    controls: Controls,
    root_dir: PathBuf,
    outcome: Option<ExecOutcome>,
    /// The step left a result that could not be taken (named in the log): the bundle is
    /// `failed`, not a `finished` bundle without the step's outputs.
    result_rejected: bool,
    log_notes: Vec<String>,
}

/// The docker backend. Cheap to share (`Arc<dyn Runtime>`); one engine connection, made on
/// first use and kept.
#[derive(Debug)]
pub struct DockerRuntime {
    opts: DockerOptions,
    engine: OnceCell<(Docker, engine::EngineInfo)>,
    live: Mutex<HashMap<String, Live>>,
}

/// Which leftovers [`DockerRuntime::cleanup_orphans`] removes.
#[derive(Debug, Clone, Default)]
pub struct OrphanFilter {
    /// Only this run's objects.
    pub run_id: Option<String>,
    /// Only this sandbox's objects.
    pub sandbox_id: Option<String>,
    /// Also remove objects whose owner process is still alive (e.g. the caller knows they
    /// are abandoned). Default false: only dead owners' objects.
    pub include_live_owners: bool,
}

/// What [`DockerRuntime::cleanup_orphans`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrphanReport {
    pub containers: Vec<String>,
    pub volumes: Vec<String>,
    pub state_dirs: Vec<PathBuf>,
}

impl DockerRuntime {
    /// A runtime with the given options. No engine call is made until a verb needs one.
    pub fn new(opts: DockerOptions) -> Self {
        DockerRuntime {
            opts,
            engine: OnceCell::new(),
            live: Mutex::new(HashMap::new()),
        }
    }

    /// The options in force.
    pub fn options(&self) -> &DockerOptions {
        &self.opts
    }

    async fn engine(&self) -> Result<&Docker, RuntimeError> {
        let (docker, _) = self
            .engine
            .get_or_try_init(|| engine::connect(&self.opts.socket))
            .await?;
        Ok(docker)
    }

    fn live_get(&self, name: &str) -> Option<Live> {
        self.live.lock().ok()?.get(name).cloned()
    }

    fn live_update(&self, name: &str, f: impl FnOnce(&mut Live)) {
        if let Ok(mut map) = self.live.lock() {
            if let Some(l) = map.get_mut(name) {
                f(l);
            }
        }
    }

    /// Removes labelled containers, volumes and state directories of sandboxes whose owner
    /// process is gone (pid absent, or reused by a process with another start time). The
    /// orchestrator's recovery calls it at start-up. Idempotent.
    pub async fn cleanup_orphans(
        &self,
        filter: &OrphanFilter,
    ) -> Result<OrphanReport, RuntimeError> {
        let docker = self.engine().await?;
        let mut labels = vec![format!("{}=true", plan::LABEL_MANAGED)];
        if let Some(r) = &filter.run_id {
            labels.push(format!("{}={r}", plan::LABEL_RUN_ID));
        }
        if let Some(s) = &filter.sandbox_id {
            labels.push(format!("{}={s}", plan::LABEL_SANDBOX_ID));
        }
        let filters = HashMap::from([("label".to_string(), labels)]);
        let abandoned = |l: &HashMap<String, String>| filter.include_live_owners || !owner_alive(l);
        let mut report = OrphanReport::default();

        let containers = docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters.clone()),
                ..Default::default()
            }))
            .await
            .map_err(|e| spawn_err("list labelled containers", &e))?;
        for c in containers {
            let l = c.labels.unwrap_or_default();
            if !abandoned(&l) {
                continue;
            }
            let Some(id) = c.id else { continue };
            remove_container(docker, &id).await?;
            report
                .containers
                .push(c.names.and_then(|n| n.into_iter().next()).unwrap_or(id));
        }

        let volumes = docker
            .list_volumes(Some(ListVolumesOptions {
                filters: Some(filters),
            }))
            .await
            .map_err(|e| spawn_err("list labelled volumes", &e))?;
        for v in volumes.volumes.unwrap_or_default() {
            if !abandoned(&v.labels) {
                continue;
            }
            remove_volume(docker, &v.name).await?;
            report.volumes.push(v.name.clone());
            if v.name.starts_with("smithers-") {
                cgroup::remove(&format!("smithers-docker/{}", v.name))
                    .map_err(|e| RuntimeError::spawn("remove cgroup", e))?;
            }
            if let Some(dir) = v.labels.get(plan::LABEL_STATE_DIR) {
                let dir = PathBuf::from(dir);
                // Only directories under our state root: a label is data from the engine,
                // never a licence to delete an arbitrary host path.
                if dir.starts_with(&self.opts.state_root) && dir != self.opts.state_root {
                    hostfs::unmount(&dir.join("layer"))?;
                    hostfs::remove_tree(&dir)?;
                    report.state_dirs.push(dir);
                }
            }
        }
        Ok(report)
    }
}

fn owner_alive(labels: &HashMap<String, String>) -> bool {
    let pid: Option<u32> = labels
        .get(plan::LABEL_OWNER_PID)
        .and_then(|p| p.parse().ok());
    let start: Option<u64> = labels
        .get(plan::LABEL_OWNER_START)
        .and_then(|p| p.parse().ok());
    match (pid, start) {
        (Some(pid), Some(start)) => hostfs::process_start(pid) == Some(start),
        _ => false,
    }
}

async fn remove_container(docker: &Docker, name: &str) -> Result<(), RuntimeError> {
    match docker
        .remove_container(
            name,
            Some(RemoveContainerOptions {
                force: true,
                v: true,
                link: false,
            }),
        )
        .await
    {
        Ok(()) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        // 409: removal already in progress (a concurrent cleanup): wait for it to finish.
        Err(e) if engine::status(&e) == Some(409) => {
            for _ in 0..100 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                match docker.inspect_container(name, None).await {
                    Err(e) if is_not_found(&e) => return Ok(()),
                    _ => {}
                }
            }
            Err(spawn_err(format!("remove container {name}"), &e))
        }
        Err(e) => Err(spawn_err(format!("remove container {name}"), &e)),
    }
}

async fn remove_volume(docker: &Docker, name: &str) -> Result<(), RuntimeError> {
    match docker
        .remove_volume(name, Some(RemoveVolumeOptions { force: true }))
        .await
    {
        Ok(()) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(spawn_err(format!("remove volume {name}"), &e)),
    }
}

fn untrusted(reason: String) -> RuntimeError {
    RuntimeError::InvalidControl {
        control: "handle",
        reason: format!("the stored handle is not trusted to name host objects: {reason}"),
    }
}

impl DockerRuntime {
    /// Refuses a handle whose names and directories are not those `create` derives from its
    /// ids and project root (the container and volume name, the state directory under this
    /// runtime's state root and its parts, the pids cgroup).
    fn check_derived(
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
async fn check_labels(
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
fn labels_name_sandbox(
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

fn backend_state(handle: &SandboxHandle) -> Result<Option<BackendState>, RuntimeError> {
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

fn require_state(handle: &SandboxHandle, verb: &'static str) -> Result<BackendState, RuntimeError> {
    backend_state(handle)?.ok_or_else(|| RuntimeError::OutOfOrder {
        verb,
        reason: "the handle has no docker state (create did not complete)".to_string(),
    })
}

fn unsupported(control: &'static str, reason: &str) -> RuntimeError {
    RuntimeError::ControlUnsupported {
        runtime: RUNTIME,
        control,
        reason: reason.to_string(),
    }
}

/// Controls this runtime cannot honour, refused before anything is created.
fn refuse_unsupported(controls: &Controls) -> Result<(), RuntimeError> {
    if controls.workspace.is_some() {
        return Err(unsupported(
            "workspace",
            "persistent named workspaces belong to remote runtimes; the docker runtime's \
             workspace is always an ephemeral copy-on-write view of rootDir",
        ));
    }
    if let Some(egress) = &controls.egress {
        if egress.proxy_url.is_some()
            || egress.ca_certificate.is_some()
            || !egress.secret_bindings.is_empty()
        {
            return Err(unsupported(
                "egress",
                "routing a container's traffic through an egress proxy with secret \
                 injection is not implemented by the docker runtime",
            ));
        }
    }
    Ok(())
}

/// An egress record, as a live event.
fn forward_egress(output: &dyn OutputSink, r: smithers_egress::EgressRecord) {
    if let Ok(record) = serde_json::to_value(&r) {
        output.event(smithers_runtime::OutputEvent::Egress {
            record,
            timestamp_ms: r.timestamp_ms,
        });
    }
}

/// The engine's records, after the step's own, in the log that becomes the bundle's.
fn append_records(log: &Path, summary: &smithers_egress::Summary) {
    use std::io::Write;
    let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(log) else {
        return;
    };
    for r in &summary.records {
        if let Ok(line) = serde_json::to_string(r) {
            let _ = writeln!(f, "{line}");
        }
    }
    if summary.records_dropped > 0 {
        let _ = writeln!(
            f,
            "{}",
            serde_json::json!({"type": "egressRecordsDropped", "timestampMs": now_ms(), "count": summary.records_dropped})
        );
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[async_trait]
impl Runtime for DockerRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Docker
    }

    async fn probe(&self) -> EnforcementReport {
        probe_report(self).await
    }

    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
        config.validate()?;
        if config.runtime != RuntimeKind::Docker {
            return Err(RuntimeError::InvalidControl {
                control: "runtime",
                reason: format!(
                    "the docker runtime was asked to create a {} sandbox",
                    config.runtime
                ),
            });
        }
        refuse_unsupported(&config.controls)?;
        if egress::policy(&config.controls)?.is_some() {
            if let Some(why) = egress::unavailable(self.opts.egress_holder.as_deref()) {
                return Err(unsupported(
                    "egressPolicy",
                    &format!("the docker runtime cannot enforce an egress policy here: {why}"),
                ));
            }
        }
        let image = config
            .image
            .clone()
            .or_else(|| self.opts.default_image.clone())
            .ok_or_else(|| RuntimeError::InvalidControl {
                control: "image",
                reason: "the docker runtime needs an image (config.image)".to_string(),
            })?;
        let root_dir = &config.root_dir;
        let (uid, gid) = hostfs::owner_of(root_dir)?;
        let docker = self.engine().await?;

        // Fail closed on a missing image: no pull (no registry may be reachable, and a
        // silent pull would run something nobody vetted).
        if let Err(e) = docker.inspect_image(&image).await {
            return Err(if is_not_found(&e) {
                RuntimeError::Unavailable {
                    runtime: RUNTIME,
                    reason: format!(
                        "image {image:?} is not present in the Docker engine (no pull is attempted)"
                    ),
                    fix: Some(format!(
                        "build or import it locally, e.g. `tar -C ROOTFS -c . | docker import - {image}` \
                         or `docker load -i IMAGE.tar` (scripts/docker-up.sh builds smithers-test:busybox)"
                    )),
                }
            } else {
                spawn_err(format!("inspect image {image}"), &e)
            });
        }

        // Named from the root's components (no trailing `/`, no `.`), as cleanup from a
        // stored handle derives it again.
        let name = plan::object_name(
            &config.run_id,
            &config.sandbox_id,
            &root_dir.components().collect::<PathBuf>(),
        );
        let sandbox_root = root_dir
            .join(".smithers")
            .join("sandboxes")
            .join(&config.run_id)
            .join(&config.sandbox_id);
        let state_dir = self.opts.state_root.join(&name);
        let layer = state_dir.join("layer");
        let state = BackendState {
            socket: self.opts.socket.clone(),
            container_name: name.clone(),
            volume_name: name.clone(),
            image: image.clone(),
            user: format!("{uid}:{gid}"),
            upper: layer.join("upper"),
            work: layer.join("work"),
            state_dir: state_dir.clone(),
            layer_tmpfs: config.controls.disk_limit_bytes.is_some(),
            out_dir: state_dir.join("out"),
            artifacts_dir: state_dir.join("artifacts"),
            hide_smithers_dir: true,
            pids_cgroup: None,
        };
        let mut state = state;
        for p in [root_dir.as_path(), &state.upper, &state.work] {
            if !plan::overlay_path_ok(p) {
                return Err(RuntimeError::InvalidControl {
                    control: "rootDir",
                    reason: format!(
                        "{} contains ',', ':' or '\\', which overlayfs mount options cannot express",
                        p.display()
                    ),
                });
            }
        }
        if state_dir.exists() || sandbox_root.join("request").exists() {
            return Err(RuntimeError::Spawn {
                operation: format!("create sandbox {}", config.entity_id()),
                reason: format!(
                    "it already exists ({} or {}); call cleanup on the old handle first",
                    state_dir.display(),
                    sandbox_root.display()
                ),
            });
        }
        // The pids limit on a parent cgroup we own, when the engine's driver allows it; a
        // failure here is not fatal: `PidsLimit` on the container still enforces the limit.
        let driver = self.engine.get().and_then(|(_, i)| i.cgroup_driver.clone());
        if driver.as_deref() == Some("cgroupfs") && rustix::process::geteuid().is_root() {
            let rel = format!("smithers-docker/{name}");
            let limit = config
                .controls
                .pids_limit
                .unwrap_or(plan::DEFAULT_PIDS_LIMIT);
            if cgroup::prepare(&rel, limit).is_ok() {
                state.pids_cgroup = Some(rel);
            } else {
                let _ = cgroup::remove(&rel);
            }
        }
        let handle = SandboxHandle {
            runtime: RuntimeKind::Docker,
            run_id: config.run_id.clone(),
            sandbox_id: config.sandbox_id.clone(),
            sandbox_root: sandbox_root.clone(),
            request_path: sandbox_root.join("request"),
            result_path: sandbox_root.join("result"),
            container_id: None,
            workspace_id: Some(name.clone()),
            backend: serde_json::to_value(&state)
                .map_err(|e| RuntimeError::spawn("encode handle", e))?,
        };
        if let Err(e) = self.prepare(docker, config, &state, &handle).await {
            // Undo what was made; the primary error wins over a cleanup failure.
            let _ = self.cleanup(&handle).await;
            return Err(e);
        }
        if let Ok(mut map) = self.live.lock() {
            map.insert(
                name,
                Live {
                    controls: config.controls.clone(),
                    root_dir: root_dir.clone(),
                    outcome: None,
                    result_rejected: false,
                    log_notes: Vec::new(),
                },
            );
        }
        Ok(handle)
    }

    async fn ship(
        &self,
        handle: &SandboxHandle,
        request: &RequestBundle,
    ) -> Result<ShipReport, RuntimeError> {
        let state = require_state(handle, "ship")?;
        if self.live_get(&state.container_name).is_none() {
            return Err(not_live("ship"));
        }
        let bytes = serde_json::to_vec(&request.request)
            .map_err(|e| RuntimeError::spawn("encode request JSON", e))?;
        let dir = &handle.request_path;
        let tmp = dir.join(".request.json.tmp");
        let dest = dir.join(plan::REQUEST_FILE);
        std::fs::write(&tmp, &bytes).map_err(|e| RuntimeError::io("write request", &tmp, e))?;
        std::fs::rename(&tmp, &dest).map_err(|e| RuntimeError::io("rename request", &dest, e))?;
        // The workspace needs no shipping: the overlay's lower layer is the live project.
        Ok(ShipReport {
            bundle_size_bytes: bytes.len() as u64,
        })
    }

    async fn execute(
        &self,
        handle: &SandboxHandle,
        command: &StepCommand,
        cancel: CancellationToken,
        output: &dyn OutputSink,
    ) -> Result<ExecOutcome, RuntimeError> {
        refuse_stdin(command, "docker")?;
        let state = require_state(handle, "execute")?;
        let live = self
            .live_get(&state.container_name)
            .ok_or_else(|| not_live("execute"))?;
        if !handle.request_path.join(plan::REQUEST_FILE).is_file() {
            return Err(RuntimeError::OutOfOrder {
                verb: "execute",
                reason: "ship has not written the request yet".to_string(),
            });
        }
        if command.argv.is_empty() {
            return Err(RuntimeError::InvalidControl {
                control: "command",
                reason: "argv is empty".to_string(),
            });
        }
        let docker = self.engine().await?;
        // With a policy, the holder and its engine first; stopped (and the holder removed)
        // whatever the step's run came to.
        let mut holder = match egress::policy(&live.controls)? {
            None => None,
            Some(policy) => {
                let bin = self.opts.egress_holder.as_deref().ok_or_else(|| {
                    unsupported(
                        "egressPolicy",
                        "no holder binary (DockerOptions::egress_holder)",
                    )
                })?;
                let labels = plan::labels(
                    &handle.run_id,
                    &handle.sandbox_id,
                    hostfs::self_identity(),
                    &state.state_dir,
                );
                let started =
                    egress::start_holder(docker, &state, policy, bin, labels, &handle.request_path)
                        .await;
                match started {
                    Ok(h) => Some(h),
                    Err(e) => {
                        let _ = remove_container(docker, &egress::holder_name(&state)).await;
                        return Err(e);
                    }
                }
            }
        };
        let ran = self
            .run_container(
                docker,
                handle,
                &state,
                &live,
                command,
                cancel,
                output,
                holder.as_mut(),
            )
            .await;
        let ran = match holder {
            None => ran,
            Some(h) => {
                let name = h.name.clone();
                let (summary, rest) = h.stop().await;
                for r in rest {
                    forward_egress(output, r);
                }
                let _ = remove_container(docker, &name).await;
                ran.map(|(mut outcome, rejected)| {
                    append_records(&state.state_dir.join("stream.ndjson"), &summary);
                    outcome.egress = serde_json::to_value(&summary).ok();
                    (outcome, rejected)
                })
            }
        };
        let (outcome, rejected) = ran?;
        self.live_update(&state.container_name, |l| {
            l.outcome = Some(outcome.clone());
            l.result_rejected = rejected;
        });
        Ok(outcome)
    }

    async fn collect(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError> {
        let state = require_state(handle, "collect")?;
        let live = self
            .live_get(&state.container_name)
            .ok_or_else(|| not_live("collect"))?;
        // The bundle is written from the host side (the layer walked, patches made, files
        // fsync'd): on a blocking thread, not an async worker.
        let handle = handle.clone();
        blocking("collect the sandbox's bundle", move || {
            collect::collect(
                &handle,
                &state,
                &live.root_dir,
                live.outcome.as_ref(),
                live.result_rejected,
                &live.log_notes,
            )
        })
        .await?
    }

    async fn cleanup(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        // The handle may come back from a crafted database in the project tree: every
        // object it names must be the one derived for its ids, and the engine objects must
        // carry our labels for exactly those ids, before anything is removed.
        let root = handle.project_root()?;
        handle.check_project_dirs_real(&root)?;
        let state = backend_state(handle)?;
        if let Some(state) = &state {
            self.check_derived(handle, &root, state)?;
            let docker = self.engine().await?;
            check_labels(docker, handle, state).await?;
        }
        let mut errors: Vec<RuntimeError> = Vec::new();
        let keep = |r: Result<(), RuntimeError>, errors: &mut Vec<RuntimeError>| {
            if let Err(e) = r {
                errors.push(e);
            }
        };
        if let Some(state) = &state {
            // Engine objects first: the volume's mount must be gone before its layer is.
            match self.engine().await {
                Ok(docker) => {
                    keep(
                        remove_container(docker, &state.container_name).await,
                        &mut errors,
                    );
                    keep(
                        remove_container(docker, &egress::holder_name(state)).await,
                        &mut errors,
                    );
                    keep(remove_volume(docker, &state.volume_name).await, &mut errors);
                }
                Err(e) => errors.push(e),
            }
            // The host side (an unmount, whole trees removed, the cgroup) on a blocking thread.
            let (owned, engine_ok) = (state.clone(), errors.is_empty());
            let host_errors = blocking("clean up the sandbox", move || {
                remove_host_state(&owned, engine_ok)
            })
            .await?;
            errors.extend(host_errors);
            if let Ok(mut map) = self.live.lock() {
                map.remove(&state.container_name);
            }
        }
        let (request, sandbox_root) = (handle.request_path.clone(), handle.sandbox_root.clone());
        let removed = blocking("clean up the sandbox", move || {
            let removed = hostfs::remove_tree(&request);
            // The sandbox root itself goes when only the bundle (or nothing) is left in it.
            let _ = std::fs::remove_dir(&sandbox_root);
            removed
        })
        .await?;
        keep(removed, &mut errors);
        match errors.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// What cleanup removes on the host once the engine objects are handled: with them gone
/// (`engine_ok`), the layer (unmounted first when a tmpfs), the state directory and the pids
/// cgroup; in any case the output directory. Returns the failures, in that order.
fn remove_host_state(state: &BackendState, engine_ok: bool) -> Vec<RuntimeError> {
    let mut errors = Vec::new();
    // Only touch the layer when the engine objects are gone: an overlay still mounted over
    // it must not lose its upper layer under a running step.
    if engine_ok {
        if state.layer_tmpfs {
            errors.extend(hostfs::unmount(&state.state_dir.join("layer")).err());
        }
        errors.extend(hostfs::remove_tree(&state.state_dir).err());
        if let Some(rel) = &state.pids_cgroup {
            errors.extend(
                cgroup::remove(rel)
                    .map_err(|e| RuntimeError::spawn("remove cgroup", e))
                    .err(),
            );
        }
    }
    errors.extend(hostfs::remove_tree(&state.out_dir).err());
    errors
}

/// Runs blocking host work of a verb on tokio's blocking pool, so that no async worker waits
/// on the disk. A panic there stays a panic of the verb; `operation` names the failure when
/// the runtime is shutting down and the job cannot run.
async fn blocking<T, F>(operation: &'static str, job: F) -> Result<T, RuntimeError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    match tokio::task::spawn_blocking(job).await {
        Ok(value) => Ok(value),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(RuntimeError::spawn(operation, e)),
    }
}

fn not_live(verb: &'static str) -> RuntimeError {
    RuntimeError::OutOfOrder {
        verb,
        reason: "this sandbox was not created by this runtime instance (or was cleaned up); \
                 only cleanup works from another process"
            .to_string(),
    }
}

impl DockerRuntime {
    async fn prepare(
        &self,
        docker: &Docker,
        config: &SandboxConfig,
        state: &BackendState,
        handle: &SandboxHandle,
    ) -> Result<(), RuntimeError> {
        let (uid, gid) = hostfs::owner_of(&config.root_dir)?;
        hostfs::mkdir(&state.state_dir, 0o700)?;
        let layer = state.state_dir.join("layer");
        hostfs::mkdir(&layer, 0o755)?;
        if let Some(limit) = config.controls.disk_limit_bytes {
            hostfs::mount_layer_tmpfs(&layer, limit)?;
        }
        hostfs::mkdir(&state.upper, 0o755)?;
        hostfs::mkdir(&state.work, 0o700)?;
        // The upper root's owner becomes /workspace's owner: keep it the project's.
        chown(&state.upper, uid, gid)?;
        hostfs::mkdir(&handle.request_path, 0o755)?;
        for dir in [&state.out_dir, &state.artifacts_dir] {
            hostfs::mkdir(dir, 0o755)?;
            chown(dir, uid, gid)?;
        }

        let labels = plan::labels(
            &config.run_id,
            &config.sandbox_id,
            hostfs::self_identity(),
            &state.state_dir,
        );
        docker
            .create_volume(plan::volume_request(
                &state.volume_name,
                &config.root_dir,
                &state.upper,
                &state.work,
                labels,
            ))
            .await
            .map_err(|e| spawn_err(format!("create overlay volume {}", state.volume_name), &e))?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_container(
        &self,
        docker: &Docker,
        handle: &SandboxHandle,
        state: &BackendState,
        live: &Live,
        command: &StepCommand,
        cancel: CancellationToken,
        output: &dyn OutputSink,
        mut holder: Option<&mut egress::Holder>,
    ) -> Result<(ExecOutcome, bool), RuntimeError> {
        let name = &state.container_name;
        // A previous execute's container (a second execute on one sandbox) goes first.
        remove_container(docker, name).await?;
        let mut st = state.clone();
        st.hide_smithers_dir = live.root_dir.join(".smithers").is_dir();
        let labels = plan::labels(
            &handle.run_id,
            &handle.sandbox_id,
            hostfs::self_identity(),
            &state.state_dir,
        );
        let body = plan::container_body(&plan::ContainerPlan {
            state: &st,
            controls: &live.controls,
            labels,
            argv: &command.argv,
            cwd: command.cwd.as_deref(),
            request_dir: &handle.request_path,
            run_id: &handle.run_id,
            sandbox_id: &handle.sandbox_id,
            egress: holder.as_ref().map(|h| plan::EgressPlan {
                holder: &h.name,
                etc_dir: &h.etc_dir,
            }),
        });
        let created = docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name.clone()),
                    platform: String::new(),
                }),
                body,
            )
            .await
            .map_err(|e| spawn_err(format!("create container {name}"), &e))?;
        // From here until the container is seen stopped, our death must take it down.
        let mut watchdog = match &self.opts.watchdog {
            Some(bin) => Some(spawn_watchdog(bin, &state.socket, &created.id)?),
            None => None,
        };

        let log_path = state.state_dir.join("stream.ndjson");
        let attach = docker
            .attach_container(
                name,
                Some(AttachContainerOptions {
                    stream: true,
                    stdout: true,
                    stderr: true,
                    stdin: false,
                    logs: false,
                    detach_keys: None,
                }),
            )
            .await
            .map_err(|e| spawn_err(format!("attach to container {name}"), &e))?;

        let started_at = Instant::now();
        // Fired by the pump when a stream passes a cap of a step that fails on it.
        let over = CancellationToken::new();
        let caps = pump::Caps {
            bytes: live.controls.max_output_bytes,
            lines: live.controls.max_output_lines,
        };
        let mut pump = pump::Pump::new(
            &log_path,
            caps,
            live.controls.fail_on_output_cap.then(|| over.clone()),
        )?;
        if let Err(e) = docker.start_container(name, None).await {
            // The engine refuses to start a command that does not exist in the image; that is
            // the step's failure (exit 127/126 like a shell), not the runtime's.
            let msg = describe(&e);
            let info = docker.inspect_container(name, None).await.ok();
            let code = info
                .as_ref()
                .and_then(|i| i.state.as_ref())
                .and_then(|s| s.exit_code)
                .filter(|c| *c != 0);
            let Some(code) = code else {
                return Err(spawn_err(format!("start container {name}"), &e));
            };
            pump.note_stderr(output, &msg);
            let pumped = pump.finish(output)?;
            return Ok((
                ExecOutcome {
                    termination: Termination::Exited,
                    exit_code: Some(code as i32),
                    signal: None,
                    duration: started_at.elapsed(),
                    stdout_bytes: pumped.stdout_bytes,
                    stderr_bytes: pumped.stderr_bytes,
                    stdout_truncated: pumped.stdout_truncated,
                    stderr_truncated: pumped.stderr_truncated,
                    usage: Default::default(),
                    enforcement: enforcement_for(
                        &live.controls,
                        state,
                        self.opts.watchdog.is_some(),
                    ),
                    result: None,
                    egress: None,
                    command_started_after_us: None,
                },
                false,
            ));
        }

        // Usage and limit hits from the container's cgroup while it runs.
        let monitor_stop = CancellationToken::new();
        let monitor = match docker.inspect_container(name, None).await {
            Ok(info) => info
                .state
                .and_then(|s| s.pid)
                .filter(|p| *p > 0)
                .and_then(|pid| monitor::CgroupPaths::of_pid(pid, &created.id))
                .map(|paths| tokio::spawn(monitor::watch(paths, monitor_stop.clone()))),
            Err(_) => None,
        };

        let timeout = live.controls.timeout();
        let pump_stop = CancellationToken::new();
        // Fired once the step is over or being ended: the pump stops waiting for the sink.
        let released = CancellationToken::new();
        let waiter = async {
            let reason = {
                let wait = first_exit(docker, name);
                tokio::pin!(wait);
                let sleep = async {
                    match timeout {
                        Some(t) => tokio::time::sleep(t.saturating_sub(started_at.elapsed())).await,
                        None => std::future::pending::<()>().await,
                    }
                };
                let reason = tokio::select! {
                    r = &mut wait => { r?; None }
                    _ = sleep => Some(Termination::Timeout),
                    _ = cancel.cancelled() => Some(Termination::Cancelled),
                    _ = over.cancelled() => Some(Termination::Output),
                };
                released.cancel();
                reason
            };
            if reason.is_some() {
                // SIGKILL to the container's init kills its pid namespace: every process.
                match docker
                    .kill_container(
                        name,
                        Some(KillContainerOptions {
                            signal: "KILL".into(),
                        }),
                    )
                    .await
                {
                    Ok(()) => {}
                    Err(e) if matches!(engine::status(&e), Some(404 | 409)) => {}
                    Err(e) => return Err(spawn_err(format!("kill container {name}"), &e)),
                }
                tokio::time::timeout(KILL_WAIT, first_exit(docker, name))
                    .await
                    .map_err(|_| RuntimeError::Spawn {
                        operation: format!("stop container {name}"),
                        reason: format!("still running {}s after SIGKILL", KILL_WAIT.as_secs()),
                    })??;
            }
            let elapsed = started_at.elapsed();
            // The attach stream ends when the container's last writer is gone; give it a
            // moment to drain, then stop reading.
            let stop = pump_stop.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                stop.cancel();
            });
            Ok::<_, RuntimeError>((reason, elapsed))
        };
        // The engine's decisions, live to the caller while the step runs.
        let live_egress = async {
            let Some(h) = holder.as_mut() else { return };
            loop {
                tokio::select! {
                    r = h.live.recv() => match r {
                        Some(r) => forward_egress(output, r),
                        None => break,
                    },
                    _ = pump_stop.cancelled() => break,
                }
            }
        };
        let (pumped, waited, ()) = tokio::join!(
            pump.run(attach.output, output, pump_stop.clone(), released.clone()),
            waiter,
            live_egress
        );
        pump_stop.cancel();
        monitor_stop.cancel();
        let mut sample = match monitor {
            Some(h) => h.await.unwrap_or_default(),
            None => monitor::Sample::default(),
        };
        if let Some(rel) = &state.pids_cgroup {
            let (hits, peak) = cgroup::read(rel);
            sample.pids_limit_hits = sample.pids_limit_hits.max(hits);
            sample.max_pids = sample.max_pids.max(peak);
            // On cgroup v1 the kernel counts a refused fork in the forking (container's)
            // group, which the engine deletes at exit; the parent's peak survives. Reaching
            // the cap is reported as hitting it.
            let limit = u64::from(live.controls.pids_limit.unwrap_or(plan::DEFAULT_PIDS_LIMIT));
            if peak.is_some_and(|p| p >= limit) {
                sample.pids_limit_hits = sample.pids_limit_hits.max(1);
            }
        }
        let (reason, duration) = waited?;
        let pumped = pumped?;
        if let Some(w) = watchdog.take() {
            w.dismiss().await;
        }

        let info = docker
            .inspect_container(name, None)
            .await
            .map_err(|e| spawn_err(format!("inspect container {name}"), &e))?;
        let cstate = info.state.unwrap_or_default();
        if cstate.status == Some(ContainerStateStatusEnum::RUNNING) {
            return Err(RuntimeError::Spawn {
                operation: format!("wait for container {name}"),
                reason: "the engine reports it still running".to_string(),
            });
        }
        let code = cstate.exit_code.unwrap_or(-1) as i32;
        let oom = cstate.oom_killed == Some(true) || (sample.oom_kills > 0 && code != 0);
        let disk_full =
            state.layer_tmpfs && code != 0 && layer_full(&state.state_dir.join("layer"));
        let (termination, exit_code, signal) = match reason {
            Some(t) => (t, None, Some(9)),
            None if oom => (Termination::Memory, None, Some(9)),
            // Exited before the kill for a cap landed: asked to fail on a cap, it fails.
            None if over.is_cancelled() => (Termination::Output, Some(code), None),
            None if sample.pids_limit_hits > 0 => (Termination::Pids, Some(code), None),
            None if disk_full => (Termination::Disk, Some(code), None),
            // docker-init (tini) exits 128+n when its child died of signal n.
            None if (129..=128 + 64).contains(&code) => {
                (Termination::Signaled, None, Some(code - 128))
            }
            None => (Termination::Exited, Some(code), None),
        };
        let mut usage = sample.usage();
        if state.layer_tmpfs {
            usage.disk_bytes = layer_used(&state.state_dir.join("layer"));
        }
        let (result, note) =
            smithers_runtime::check_result_fields(read_result(&state.out_dir, &pumped));
        let rejected = note.is_some();
        if let Some(note) = note {
            pump.write_note(&note)?;
        }
        let outcome = ExecOutcome {
            termination,
            exit_code,
            signal,
            duration,
            stdout_bytes: pumped.stdout_bytes,
            stderr_bytes: pumped.stderr_bytes,
            stdout_truncated: pumped.stdout_truncated,
            stderr_truncated: pumped.stderr_truncated,
            usage,
            enforcement: enforcement_for(&live.controls, state, self.opts.watchdog.is_some()),
            result,
            egress: None,
            command_started_after_us: None,
        };
        pump.write_exit(&outcome)?;
        Ok((outcome, rejected))
    }
}

/// A running watchdog process; dropping it without [`Watchdog::dismiss`] closes its stdin,
/// which makes it kill the container (right on every error path: the step must not outlive
/// a failed execute).
struct Watchdog {
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
}

impl Watchdog {
    /// The container is stopped: tell the watchdog to exit without killing, and reap it.
    async fn dismiss(mut self) {
        use tokio::io::AsyncWriteExt;
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"done\n").await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

fn spawn_watchdog(bin: &Path, socket: &str, id: &str) -> Result<Watchdog, RuntimeError> {
    let mut child = tokio::process::Command::new(bin)
        .arg(socket)
        .arg(id)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        // Its own process group: a signal to the orchestrator's group must not reach it.
        .process_group(0)
        .kill_on_drop(false)
        .spawn()
        .map_err(|e| RuntimeError::spawn(format!("start the watchdog {}", bin.display()), e))?;
    let stdin = child.stdin.take();
    Ok(Watchdog { child, stdin })
}

/// Waits until the container is not running (returns at once if it already stopped).
async fn first_exit(docker: &Docker, name: &str) -> Result<(), RuntimeError> {
    let mut stream = docker.wait_container(
        name,
        Some(WaitContainerOptions {
            condition: "not-running".to_string(),
        }),
    );
    match stream.next().await {
        None | Some(Ok(_)) => Ok(()),
        // bollard reports a non-zero exit status as an error; it is an outcome here.
        Some(Err(bollard::errors::Error::DockerContainerWaitError { .. })) => Ok(()),
        Some(Err(e)) => Err(spawn_err(format!("wait for container {name}"), &e)),
    }
}

fn layer_stat(layer: &Path) -> Option<(u64, u64)> {
    let st = rustix::fs::statvfs(layer).ok()?;
    let total = st.f_blocks * st.f_frsize;
    let free = st.f_bavail * st.f_frsize;
    Some((total, free))
}

fn layer_full(layer: &Path) -> bool {
    // A tmpfs has no reserve: a write that failed with ENOSPC leaves less than a page or so.
    layer_stat(layer).is_some_and(|(_, free)| free < 64 * 1024)
}

fn layer_used(layer: &Path) -> Option<u64> {
    layer_stat(layer).map(|(total, free)| total.saturating_sub(free))
}

/// The step's result JSON: `result.json` if it is a regular file holding a JSON object, else
/// its stdout if that is one (and was not truncated). A result that was there but cannot be
/// taken (too large, too deep, not an object) comes back as a note naming the limit, so it is
/// never dropped silently.
fn read_result(out_dir: &Path, pumped: &pump::Pumped) -> (Option<Value>, Option<String>) {
    fn parse(bytes: &[u8], what: &str) -> Result<Option<Value>, String> {
        let text = String::from_utf8_lossy(bytes);
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        match serde_json::from_str::<Value>(text) {
            Ok(v @ Value::Object(_)) => Ok(Some(v)),
            Ok(_) => Err(format!("{what} ignored: not a JSON object")),
            Err(e) if e.to_string().contains("recursion limit") => Err(format!(
                "{what} ignored: JSON nesting depth exceeds the limit of 128 levels"
            )),
            Err(e) => Err(format!("{what} ignored: not valid JSON ({e})")),
        }
    }
    let mut note = None;
    match hostfs::read_untrusted_file(out_dir, plan::RESULT_FILE, MAX_RESULT_JSON_BYTES) {
        Some(bytes) => match parse(&bytes, "result.json") {
            Ok(Some(v)) => return (Some(v), None),
            Ok(None) => {}
            Err(n) => note = Some(n),
        },
        None => {
            if let Ok(md) = std::fs::symlink_metadata(out_dir.join(plan::RESULT_FILE)) {
                note = Some(if md.len() > MAX_RESULT_JSON_BYTES && md.is_file() {
                    format!(
                        "result.json ignored: {} bytes exceeds the limit of {MAX_RESULT_JSON_BYTES} bytes",
                        md.len()
                    )
                } else {
                    "result.json ignored: not a regular file (symlinks are never followed)"
                        .to_string()
                });
            }
        }
    }
    if note.is_some() || pumped.stdout_truncated {
        return (None, note);
    }
    // Stdout that is not JSON at all is ordinary output, not a rejected result.
    let looks_json = pumped
        .stdout
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{');
    match parse(&pumped.stdout, "result JSON on stdout") {
        Ok(v) => (v, None),
        Err(n) if looks_json => (None, Some(n)),
        Err(_) => (None, None),
    }
}

fn parent_death(watchdog: bool) -> Protection {
    if watchdog {
        protection(
            "parent-death",
            ProtectionStatus::Enforced,
            "a watchdog process kills the container if the orchestrator dies",
        )
    } else {
        Protection {
            name: "parent-death".into(),
            status: ProtectionStatus::Unavailable,
            detail: "the engine keeps a container running when its client dies".into(),
            fix: Some(format!(
                "install {WATCHDOG_BIN} next to the executable or set DockerOptions::watchdog"
            )),
        }
    }
}

fn protection(name: &str, status: ProtectionStatus, detail: impl Into<String>) -> Protection {
    Protection {
        name: name.to_string(),
        status,
        detail: detail.into(),
        fix: None,
    }
}

/// What was in force for one sandbox.
/// A stdin stream is not attached to a container's command (the engine's attach is not
/// wired here): refused, never dropped.
fn refuse_stdin(command: &StepCommand, runtime: &str) -> Result<(), RuntimeError> {
    if command.stdin.is_given() {
        return Err(RuntimeError::InvalidControl {
            control: "stdin",
            reason: format!("the {runtime} runtime does not pass a stdin stream to the command"),
        });
    }
    Ok(())
}

fn enforcement_for(c: &Controls, state: &BackendState, watchdog: bool) -> EnforcementReport {
    use ProtectionStatus::*;
    let mut p = vec![
        parent_death(watchdog),
        smithers_runtime::mount_row::report_row(c),
        match egress::policy(c).ok().flatten() {
            Some(policy) => protection(
                "network",
                if policy.mode == smithers_egress::Mode::Audit {
                    Degraded
                } else {
                    Enforced
                },
                format!(
                    "the network namespace of a NetworkMode=none holder container, joined by the step's: {}",
                    smithers_egress::sandbox::report_detail(&policy)
                ),
            ),
            None if c.allow_network => {
                protection("network", Disabled, "allowNetwork: bridge network")
            }
            None => protection("network", Enforced, "NetworkMode=none"),
        },
        protection("capabilities", Enforced, "CapDrop=ALL"),
        protection("no_new_privileges", Enforced, "no-new-privileges"),
        protection(
            "seccomp",
            Enforced,
            "deny-list profile: engine defaults plus ptrace and process_vm_*",
        ),
        protection("readonly_root", Enforced, "ReadonlyRootfs"),
        protection("host_env", Enforced, "environment built from an allowlist"),
        protection(
            "workspace_cow",
            Enforced,
            "overlay volume, upper outside the project",
        ),
        protection("init", Enforced, "Init=true, pid namespace"),
        protection(
            "pids",
            Enforced,
            format!(
                "PidsLimit={}",
                c.pids_limit.unwrap_or(plan::DEFAULT_PIDS_LIMIT)
            ),
        ),
    ];
    p.push(match c.memory_limit_bytes {
        Some(m) => protection("memory", Enforced, format!("Memory={m}")),
        None => protection("memory", Disabled, "no memoryLimit given"),
    });
    p.push(match c.cpu_limit {
        Some(cpu) => protection("cpu", Enforced, format!("NanoCpus={}", (cpu * 1e9).round())),
        None => protection("cpu", Disabled, "no cpuLimit given"),
    });
    p.push(match c.disk_limit_bytes {
        Some(d) if state.layer_tmpfs => protection(
            "disk",
            Enforced,
            format!("/tmp and the workspace layer are tmpfs of {d} bytes"),
        ),
        _ => protection(
            "disk",
            Degraded,
            format!(
                "/tmp capped at {} bytes; workspace layer uncapped (no diskLimit)",
                plan::DEFAULT_TMP_BYTES
            ),
        ),
    });
    p.push(if state.user.starts_with("0:") {
        protection(
            "user",
            Degraded,
            "uid 0 (owner of rootDir) without capabilities",
        )
    } else {
        protection("user", Enforced, format!("uid:gid {}", state.user))
    });
    EnforcementReport {
        runtime: Some(RuntimeKind::Docker),
        protections: p,
    }
}

async fn probe_report(rt: &DockerRuntime) -> EnforcementReport {
    use ProtectionStatus::*;
    let socket = &rt.opts.socket;
    let docker = match rt.engine().await {
        Ok(d) => d,
        Err(e) => {
            let fix = match &e {
                RuntimeError::Unavailable { fix, .. } => fix.clone(),
                _ => None,
            };
            return EnforcementReport {
                runtime: Some(RuntimeKind::Docker),
                protections: vec![Protection {
                    name: "engine".to_string(),
                    status: Unavailable,
                    detail: e.to_string(),
                    fix: fix.or_else(|| Some(engine::fix_for_socket(socket))),
                }],
            };
        }
    };
    let version = rt
        .engine
        .get()
        .map(|(_, v)| v.version.clone())
        .unwrap_or_default();
    let api = docker.client_version();
    let info = docker.info().await.ok().unwrap_or_default();
    let driver = info
        .cgroup_driver
        .map(|d| d.to_string())
        .unwrap_or_else(|| "unknown".into());
    let cgv = info
        .cgroup_version
        .map(|d| d.to_string())
        .unwrap_or_else(|| "unknown".into());
    let sec = info.security_options.unwrap_or_default();
    let flag = |ok: Option<bool>, name: &str, what: &str| {
        if ok == Some(false) {
            Protection {
                name: name.to_string(),
                status: Unavailable,
                detail: format!("the engine reports no {what} support"),
                fix: Some("enable the cgroup controller in the kernel / engine".to_string()),
            }
        } else {
            protection(name, Enforced, what.to_string())
        }
    };
    let root = rustix::process::geteuid().is_root();
    let mut p = vec![
        protection(
            "engine",
            Enforced,
            format!(
                "Docker {version}, API {}.{}, cgroup driver {driver}, cgroup {cgv}, socket {socket}",
                api.major_version, api.minor_version
            ),
        ),
        protection("network", Enforced, "NetworkMode=none unless allowNetwork"),
        flag(info.memory_limit, "memory", "memory limit"),
        flag(info.pids_limit, "pids", "pids limit"),
        flag(info.cpu_cfs_quota, "cpu", "CPU quota (NanoCpus)"),
        protection("capabilities", Enforced, "CapDrop=ALL"),
        protection("no_new_privileges", Enforced, "no-new-privileges"),
        if sec.iter().any(|s| s.contains("name=seccomp")) {
            protection(
                "seccomp",
                Enforced,
                "deny-list profile: engine defaults plus ptrace and process_vm_*",
            )
        } else {
            Protection {
                name: "seccomp".into(),
                status: Unavailable,
                detail: "the engine reports no seccomp support".into(),
                fix: Some("use an engine built with seccomp".into()),
            }
        },
        protection("readonly_root", Enforced, "ReadonlyRootfs"),
        protection("host_env", Enforced, "environment built from an allowlist"),
        protection("init", Enforced, "Init=true, pid namespace"),
        parent_death(rt.opts.watchdog.is_some()),
    ];
    let overlay = std::fs::read_to_string("/proc/filesystems")
        .map(|f| f.contains("\toverlay"))
        .unwrap_or(false);
    p.push(if overlay {
        protection("workspace_cow", Enforced, "overlay volume (local driver)")
    } else {
        Protection {
            name: "workspace_cow".into(),
            status: Unavailable,
            detail: "overlayfs is not available in this kernel".into(),
            fix: Some("modprobe overlay".into()),
        }
    });
    p.push(if root {
        protection(
            "disk",
            Enforced,
            "tmpfs /tmp and a tmpfs-backed workspace layer of diskLimit",
        )
    } else {
        Protection {
            name: "disk".into(),
            status: Degraded,
            detail: "/tmp is capped; the workspace layer cannot be (diskLimit is refused)".into(),
            fix: Some("run as root (CAP_SYS_ADMIN) to cap the workspace layer".into()),
        }
    });
    EnforcementReport {
        runtime: Some(RuntimeKind::Docker),
        protections: p,
    }
}

fn chown(path: &Path, uid: u32, gid: u32) -> Result<(), RuntimeError> {
    match std::os::unix::fs::chown(path, Some(uid), Some(gid)) {
        Ok(()) => Ok(()),
        // Not root: the directory is already ours, which is the project owner's when the
        // caller owns the project. Anything else surfaces when the step writes.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Ok(()),
        Err(e) => Err(RuntimeError::io("chown", path, e)),
    }
}
