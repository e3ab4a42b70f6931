//! The runtime's verbs: create, ship, execute, collect, cleanup (and probe).

use std::path::PathBuf;

use async_trait::async_trait;
use smithers_runtime::{
    CancellationToken, CollectReport, EnforcementReport, ExecOutcome, OutputSink, RequestBundle,
    Runtime, RuntimeError, RuntimeKind, SandboxConfig, SandboxHandle, ShipReport, StepCommand,
};

use crate::egress::{self, append_records, forward_egress};
use crate::enforcement::{probe_report, refuse_unsupported, unsupported};
use crate::engine::{is_not_found, remove_container, remove_volume, spawn_err, RUNTIME};
use crate::handle::{backend_state, check_labels, require_state, untrusted};
use crate::plan::{self, BackendState};
use crate::runtime::{DockerRuntime, Live};
use crate::{cgroup, collect, hostfs};

#[async_trait]
impl Runtime for DockerRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Docker
    }

    async fn probe(&self) -> EnforcementReport {
        probe_report(self).await
    }

    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
        config.refuse_layers("docker")?;
        config.refuse_home("docker")?;
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
                let started = egress::start_holder(
                    docker,
                    &state,
                    (policy, &live.controls),
                    bin,
                    labels,
                    &handle.request_path,
                )
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

    /// A sandbox whose maker died (a held session's holder): its layer is on the host, in
    /// the state directory derived from its ids and project (checked as cleanup checks it:
    /// names, directories, the engine objects' labels), so it is collected from there,
    /// without the maker's outcome (the bundle is `failed`). The project is the handle's
    /// (from which the names are derived); no link from `<project>/.smithers` down to the
    /// sandbox's `request` and `result`.
    async fn collect_stored(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError> {
        let root = handle.project_root()?;
        handle.check_project_dirs_real(&root)?;
        for dir in [&handle.request_path, &handle.result_path] {
            match std::fs::symlink_metadata(dir) {
                Ok(m) if !m.is_dir() => {
                    return Err(untrusted(format!(
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
        let state = require_state(handle, "collect")?;
        self.check_derived(handle, &root, &state)?;
        let docker = self.engine().await?;
        check_labels(docker, handle, &state).await?;
        match std::fs::symlink_metadata(&state.state_dir) {
            Ok(m) if m.is_dir() => {}
            _ => {
                return Err(RuntimeError::OutOfOrder {
                    verb: "collect",
                    reason: "the sandbox does not exist (cleaned up?)".into(),
                })
            }
        }
        let handle = handle.clone();
        blocking("collect the sandbox's bundle", move || {
            collect::collect(&handle, &state, &root, None, false, &[])
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
            // A sandbox started through the engine and cleaned up without a stop: its
            // container is gone now, so what it kept goes too.
            let started = self.started.lock().remove(&state.container_name);
            if let Some(started) = started {
                started.release().await;
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
pub(crate) fn remove_host_state(state: &BackendState, engine_ok: bool) -> Vec<RuntimeError> {
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
pub(crate) async fn blocking<T, F>(operation: &'static str, job: F) -> Result<T, RuntimeError>
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

pub(crate) fn not_live(verb: &'static str) -> RuntimeError {
    RuntimeError::OutOfOrder {
        verb,
        reason: "this sandbox was not created by this runtime instance (or was cleaned up); \
                 only cleanup works from another process"
            .to_string(),
    }
}

/// A stdin stream is not attached to a container's command (the engine's attach is not
/// wired here): refused, never dropped.
pub(crate) fn refuse_stdin(command: &StepCommand, runtime: &str) -> Result<(), RuntimeError> {
    if command.stdin.is_given() {
        return Err(RuntimeError::InvalidControl {
            control: "stdin",
            reason: format!("the {runtime} runtime does not pass a stdin stream to the command"),
        });
    }
    Ok(())
}
