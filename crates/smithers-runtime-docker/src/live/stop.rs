//! `stop`: every process of the sandbox killed (its container's init SIGKILLed takes its pid
//! namespace with it) and waited for; the watchdog dismissed; with a policy, the egress engine
//! stopped, its decisions added to the sandbox's log (what `collect` puts in the bundle) and
//! the holder removed. The container and its overlay layer stay, for `collect`, until
//! `destroy`.

use std::time::Duration;

use bollard::models::ContainerStateStatusEnum;
use bollard::query_parameters::KillContainerOptions;
use bollard::Docker;
use smithers_runtime::{RuntimeError, SandboxHandle};

use crate::egress::append_records;
use crate::engine::{self, remove_container, spawn_err};
use crate::handle::backend_state;
use crate::runtime::DockerRuntime;
use crate::started::Started;

/// How long a killed container may take to be reported stopped.
const KILL_WAIT: Duration = Duration::from_secs(30);

pub(super) async fn stop(rt: &DockerRuntime, handle: &SandboxHandle) -> Result<(), RuntimeError> {
    // A handle without docker state (create did not complete) has nothing running.
    let Some(state) = backend_state(handle)? else {
        return Ok(());
    };
    let started = rt.started.lock().remove(&state.container_name);
    let Some(started) = started else {
        return Ok(());
    };
    let docker = rt.engine().await?;
    let killed = end(docker, &started).await;
    if killed.is_ok() {
        // The log exists once the sandbox has stopped, with or without decisions in it.
        let log = state.state_dir.join("stream.ndjson");
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log);
        if let Some(summary) = stopped_egress(docker, &started).await {
            append_records(&log, &summary);
        }
    }
    killed
}

/// The container killed and waited for, then the watchdog dismissed (not before: until the
/// container is seen stopped, our death must still take it down).
async fn end(docker: &Docker, started: &Started) -> Result<(), RuntimeError> {
    let killed = kill_and_wait(docker, &started.id).await;
    if killed.is_ok() {
        if let Some(w) = started.take_watchdog() {
            w.dismiss().await;
        }
    }
    killed
}

/// The egress engine stopped (every connection ended) and its holder removed; its summary.
async fn stopped_egress(docker: &Docker, started: &Started) -> Option<smithers_egress::Summary> {
    let holder = started.take_holder()?;
    let name = holder.name.clone();
    let (summary, _) = holder.stop().await;
    let _ = remove_container(docker, &name).await;
    Some(summary)
}

/// SIGKILL to the container and a wait until the engine reports it not running.
async fn kill_and_wait(docker: &Docker, id: &str) -> Result<(), RuntimeError> {
    match docker
        .kill_container(
            id,
            Some(KillContainerOptions {
                signal: "KILL".into(),
            }),
        )
        .await
    {
        Ok(()) => {}
        // Not there, or not running: nothing to kill.
        Err(e) if matches!(engine::status(&e), Some(404 | 409)) => {}
        Err(e) => return Err(spawn_err(format!("kill container {id}"), &e)),
    }
    let deadline = tokio::time::Instant::now() + KILL_WAIT;
    loop {
        match docker.inspect_container(id, None).await {
            Err(e) if engine::is_not_found(&e) => return Ok(()),
            Err(e) => return Err(spawn_err(format!("inspect container {id}"), &e)),
            Ok(info) => {
                let status = info.state.and_then(|s| s.status);
                if !matches!(
                    status,
                    Some(ContainerStateStatusEnum::RUNNING | ContainerStateStatusEnum::PAUSED)
                ) {
                    return Ok(());
                }
            }
        }
        if tokio::time::Instant::now() > deadline {
            return Err(RuntimeError::Spawn {
                operation: format!("stop container {id}"),
                reason: format!("still running {}s after SIGKILL", KILL_WAIT.as_secs()),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
