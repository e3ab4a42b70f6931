//! `start`: the sandbox's long-lived container. The same body a step's container gets (every
//! control as `create` planned it: capabilities dropped, no-new-privileges, read-only root,
//! limits, user, seccomp, labels, the overlay at `/workspace`), whose command is this build's
//! binary in `--container-wait` mode under Docker's init, with the binary bound read-only and a
//! small tmpfs of the container's own for the exec wrappers' files. With an egress policy, the
//! holder first, as for a step, kept until `stop`.

use std::path::Path;

use bollard::models::{Mount, MountTmpfsOptions, MountType};
use bollard::query_parameters::CreateContainerOptions;
use bollard::Docker;
use smithers_runtime::{RuntimeError, SandboxHandle};
use smithers_sandbox_init::container as init;

use crate::egress::{self, Holder};
use crate::enforcement::unsupported;
use crate::engine::{remove_container, spawn_err, RUNTIME};
use crate::handle::require_state;
use crate::hostfs;
use crate::plan::{self, BackendState};
use crate::runtime::{DockerRuntime, Live};
use crate::started::Started;
use crate::verbs::not_live;
use crate::watchdog::spawn_watchdog;

/// Size of the exec wrappers' tmpfs: a few bytes per running exec.
const EXEC_DIR_BYTES: u64 = 1 << 20;

/// This build's binary, which the container runs (its waiting init, each exec's wrapper):
/// `DockerOptions::egress_holder`, the same binary that holds a step's network namespace.
pub(super) fn binary(rt: &DockerRuntime) -> Result<&Path, RuntimeError> {
    let bin = rt.opts.egress_holder.as_deref();
    match (bin, egress::unavailable(bin)) {
        (Some(bin), None) => Ok(bin),
        (_, why) => Err(RuntimeError::Unavailable {
            runtime: RUNTIME,
            reason: format!(
                "the docker engine cannot start a sandbox here: {}",
                why.unwrap_or_default()
            ),
            fix: Some(
                "give the runtime this build's smithers-sandbox binary (DockerOptions::egress_holder)"
                    .into(),
            ),
        }),
    }
}

/// Starts the sandbox's container; returns what the sandbox keeps while it runs.
pub(super) async fn start(
    rt: &DockerRuntime,
    handle: &SandboxHandle,
) -> Result<Started, RuntimeError> {
    let state = require_state(handle, "start")?;
    let live = rt
        .live_get(&state.container_name)
        .ok_or_else(|| not_live("start"))?;
    if !handle.request_path.join(plan::REQUEST_FILE).is_file() {
        return Err(RuntimeError::OutOfOrder {
            verb: "start",
            reason: "ship has not written the request yet: call ship before start".into(),
        });
    }
    let (prefix, mounts) = egress::bound_binary(binary(rt)?)?;
    let docker = rt.engine().await?;
    let mut holder = start_holder(rt, docker, handle, &state, &live).await?;
    let started = run_container(rt, docker, handle, &state, &live, &prefix, mounts, &holder).await;
    match started {
        Ok((id, watchdog)) => {
            if let Some(h) = holder.as_mut() {
                // A sandbox has no step to relay decisions to as they happen: each is in the
                // engine's summary, which goes to the sandbox's log at `stop`.
                let mut records =
                    std::mem::replace(&mut h.live, tokio::sync::mpsc::unbounded_channel().1);
                tokio::spawn(async move { while records.recv().await.is_some() {} });
            }
            Ok(Started::new(id, prefix, holder, watchdog))
        }
        Err(e) => {
            let _ = remove_container(docker, &state.container_name).await;
            if let Some(h) = holder {
                let name = h.name.clone();
                let _ = h.stop().await;
                let _ = remove_container(docker, &name).await;
            }
            Err(e)
        }
    }
}

/// With an egress policy: the holder of the network namespace and its engine, as a step's.
async fn start_holder(
    rt: &DockerRuntime,
    docker: &Docker,
    handle: &SandboxHandle,
    state: &BackendState,
    live: &Live,
) -> Result<Option<Holder>, RuntimeError> {
    let Some(policy) = egress::policy(&live.controls)? else {
        return Ok(None);
    };
    let bin = rt.opts.egress_holder.as_deref().ok_or_else(|| {
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
    match egress::start_holder(
        docker,
        state,
        (policy, &live.controls),
        bin,
        labels,
        &handle.request_path,
    )
    .await
    {
        Ok(h) => Ok(Some(h)),
        Err(e) => {
            let _ = remove_container(docker, &egress::holder_name(state)).await;
            Err(e)
        }
    }
}

/// The container's command: the bound binary's init, waiting.
pub(crate) fn wait_argv(prefix: &[String]) -> Vec<String> {
    let mut argv = prefix.to_vec();
    argv.push(init::WAIT.to_string());
    argv
}

/// The tmpfs of the exec wrappers' pid, kill and status files: the container's own (no host
/// path, gone with it), writable by the step's uid, whatever it is (sticky, like `/tmp`).
pub(crate) fn exec_dir_mount() -> Mount {
    Mount {
        target: Some(init::EXEC_DIR.to_string()),
        typ: Some(MountType::TMPFS),
        read_only: Some(false),
        tmpfs_options: Some(MountTmpfsOptions {
            size_bytes: Some(EXEC_DIR_BYTES as i64),
            mode: Some(0o1777),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Creates and starts the container (a previous one of the sandbox removed first), under a
/// watchdog from before its start; returns its id once it runs.
#[allow(clippy::too_many_arguments)]
async fn run_container(
    rt: &DockerRuntime,
    docker: &Docker,
    handle: &SandboxHandle,
    state: &BackendState,
    live: &Live,
    prefix: &[String],
    mounts: Vec<Mount>,
    holder: &Option<Holder>,
) -> Result<(String, Option<crate::watchdog::Watchdog>), RuntimeError> {
    let name = &state.container_name;
    remove_container(docker, name).await?;
    let mut st = state.clone();
    st.hide_smithers_dir = live.root_dir.join(".smithers").is_dir();
    let labels = plan::labels(
        &handle.run_id,
        &handle.sandbox_id,
        hostfs::self_identity(),
        &state.state_dir,
    );
    let argv = wait_argv(prefix);
    let mut body = plan::container_body(&plan::ContainerPlan {
        state: &st,
        controls: &live.controls,
        labels,
        argv: &argv,
        cwd: None,
        request_dir: &handle.request_path,
        run_id: &handle.run_id,
        sandbox_id: &handle.sandbox_id,
        egress: holder.as_ref().map(|h| plan::EgressPlan {
            holder: &h.name,
            etc_dir: &h.etc_dir,
            secret_env: &h.secret_env,
        }),
    });
    // Nothing is attached to the waiting init: its output would be nobody's.
    body.attach_stdout = Some(false);
    body.attach_stderr = Some(false);
    if let Some(hc) = body.host_config.as_mut() {
        let all = hc.mounts.get_or_insert_with(Vec::new);
        all.extend(mounts);
        all.push(exec_dir_mount());
    }
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
    let watchdog = match &rt.opts.watchdog {
        Some(bin) => Some(spawn_watchdog(bin, &state.socket, &created.id)?),
        None => None,
    };
    docker
        .start_container(name, None)
        .await
        .map_err(|e| spawn_err(format!("start container {name}"), &e))?;
    let info = docker
        .inspect_container(name, None)
        .await
        .map_err(|e| spawn_err(format!("inspect container {name}"), &e))?;
    let cstate = info.state.unwrap_or_default();
    if cstate.running != Some(true) {
        return Err(RuntimeError::Spawn {
            operation: format!("start container {name}"),
            reason: format!(
                "its init ended at once (exit code {:?}, error {:?})",
                cstate.exit_code, cstate.error
            ),
        });
    }
    Ok((created.id, watchdog))
}
