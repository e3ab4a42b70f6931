//! The connection to the engine and the translation of its failures into [`RuntimeError`]s
//! that name what is missing and how to fix it; the removal of its objects.

use std::path::Path;
use std::time::Duration;

use bollard::errors::Error as BollardError;
use bollard::query_parameters::{RemoveContainerOptions, RemoveVolumeOptions};
use bollard::{ClientVersion, Docker};
use smithers_runtime::RuntimeError;

pub(crate) const RUNTIME: &str = "docker";

/// The oldest Engine API this runtime speaks. 1.41 (Docker 20.10) has every field we set
/// (Init, NanoCpus, PidsLimit, Mounts with tmpfs sizes, no-new-privileges).
pub const MIN_API_VERSION: ClientVersion = ClientVersion {
    major_version: 1,
    minor_version: 41,
};

/// Seconds a single API request may take before the client gives up. Long operations
/// (waiting for the container) are streams and are bounded by the caller instead.
const REQUEST_TIMEOUT_SECS: u64 = 120;

/// The socket to use: `DOCKER_HOST` when it names a unix socket, else the default path.
pub fn default_socket() -> String {
    match std::env::var("DOCKER_HOST") {
        Ok(h) if h.starts_with("unix://") => h.trim_start_matches("unix://").to_string(),
        _ => "/var/run/docker.sock".to_string(),
    }
}

pub(crate) fn fix_for_socket(socket: &str) -> String {
    format!(
        "start the Docker engine so that {socket} answers (e.g. `dockerd &`, \
         `systemctl start docker`, or this project's scripts/docker-up.sh), or point \
         DOCKER_HOST=unix:///path/to/docker.sock at a running engine"
    )
}

/// Connects and negotiates the API version down to what the engine speaks (one `/version`
/// round trip). Any failure means the engine is not usable: `Unavailable` with the fix.
/// What the runtime learns about the engine once, at connection.
#[derive(Debug, Clone)]
pub(crate) struct EngineInfo {
    pub version: String,
    /// `cgroupfs`, `systemd`, ... (lowercase), when the engine says.
    pub cgroup_driver: Option<String>,
}

pub(crate) async fn connect(socket: &str) -> Result<(Docker, EngineInfo), RuntimeError> {
    let unavailable = |reason: String| RuntimeError::Unavailable {
        runtime: RUNTIME,
        reason,
        fix: Some(fix_for_socket(socket)),
    };
    if !Path::new(socket).exists() {
        return Err(unavailable(format!(
            "the Docker engine socket {socket} does not exist"
        )));
    }
    // Start high and let negotiation lower it: newer engines get their own version, older
    // ones (down to MIN_API_VERSION) theirs.
    let docker =
        Docker::connect_with_unix(socket, REQUEST_TIMEOUT_SECS, bollard::API_DEFAULT_VERSION)
            .map_err(|e| {
                unavailable(format!(
                    "cannot open the Docker engine socket {socket}: {e}"
                ))
            })?;
    let docker = docker.negotiate_version().await.map_err(|e| {
        unavailable(format!(
            "the Docker engine at {socket} does not answer: {}",
            describe(&e)
        ))
    })?;
    let v = docker.client_version();
    if (v.major_version, v.minor_version)
        < (MIN_API_VERSION.major_version, MIN_API_VERSION.minor_version)
    {
        return Err(RuntimeError::Unavailable {
            runtime: RUNTIME,
            reason: format!(
                "the Docker engine at {socket} speaks API {}.{}, this runtime needs at least {}.{}",
                v.major_version,
                v.minor_version,
                MIN_API_VERSION.major_version,
                MIN_API_VERSION.minor_version
            ),
            fix: Some("upgrade the Docker engine to 20.10 or later".to_string()),
        });
    }
    let version = docker
        .version()
        .await
        .ok()
        .and_then(|v| v.version)
        .unwrap_or_else(|| "unknown".to_string());
    let cgroup_driver = docker
        .info()
        .await
        .ok()
        .and_then(|i| i.cgroup_driver)
        .map(|d| d.to_string());
    Ok((
        docker,
        EngineInfo {
            version,
            cgroup_driver,
        },
    ))
}

/// A short description of an engine error (the server's message when there is one).
pub(crate) fn describe(e: &BollardError) -> String {
    match e {
        BollardError::DockerResponseServerError {
            status_code,
            message,
        } => format!("engine answered {status_code}: {message}"),
        other => other.to_string(),
    }
}

/// The HTTP status of an engine error, if it came from the engine.
pub(crate) fn status(e: &BollardError) -> Option<u16> {
    match e {
        BollardError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// Whether the error says the object does not exist (already removed, never created).
pub(crate) fn is_not_found(e: &BollardError) -> bool {
    status(e) == Some(404)
}

/// An engine call that failed while setting up or running the sandbox.
pub(crate) fn spawn_err(operation: impl Into<String>, e: &BollardError) -> RuntimeError {
    RuntimeError::Spawn {
        operation: operation.into(),
        reason: describe(e),
    }
}

pub(crate) async fn remove_container(docker: &Docker, name: &str) -> Result<(), RuntimeError> {
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
        Err(e) if status(&e) == Some(409) => {
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

pub(crate) async fn remove_volume(docker: &Docker, name: &str) -> Result<(), RuntimeError> {
    match docker
        .remove_volume(name, Some(RemoveVolumeOptions { force: true }))
        .await
    {
        Ok(()) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(spawn_err(format!("remove volume {name}"), &e)),
    }
}
