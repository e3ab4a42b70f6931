//! Which backend runs a step, and building it: the runtime choice of `run` and `doctor`
//! (native as `bubblewrap`, docker, codeplane, ray), the native runtime with the options the
//! environment sets, and the orchestrator with every runtime this binary has.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use clap::ValueEnum;
use serde_json::Value;
use smithers_errors::ErrorCode;
use smithers_orchestrator::{AtomicPatchApplier, Orchestrator, Settings};
use smithers_runtime::{parse_memory_limit, RuntimeKind};
use smithers_runtime_docker::{DockerOptions, DockerRuntime};
use smithers_runtime_native::{
    InitCommand, NativeOptions, NativeRuntime, WorkspaceMode, WORKSPACE_ENV,
};
use smithers_store::Store;

use crate::output::{coded_error, Coded};

/// Which runtime runs the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuntimeChoice {
    /// The native namespace sandbox (named after the original's bubblewrap backend).
    Bubblewrap,
    /// A container through the Docker Engine API (needs --image and a running engine).
    Docker,
    /// A remote sandbox host (`smithers-sandbox serve`) at $CODEPLANE_API_URL with the token
    /// $CODEPLANE_API_KEY; the project is uploaded, its changes come back as patches.
    Codeplane,
    /// A fleet on Ray: the step's lease (a Ray job holding a `sandbox_slot`) runs
    /// `smithers-sandbox serve` on the node Ray chose, at $RAY_ADDRESS (the Jobs API) with
    /// $RAY_AUTH_TOKEN; $SMITHERS_RAY_POOL picks a pool of nodes.
    Ray,
}

impl RuntimeChoice {
    /// A runtime that runs the step on another machine (paths of this one mean nothing there).
    pub(crate) fn is_remote(self) -> bool {
        matches!(self, RuntimeChoice::Codeplane | RuntimeChoice::Ray)
    }

    pub(crate) fn kind(self) -> RuntimeKind {
        match self {
            RuntimeChoice::Bubblewrap => RuntimeKind::Bubblewrap,
            RuntimeChoice::Docker => RuntimeKind::Docker,
            RuntimeChoice::Codeplane => RuntimeKind::Codeplane,
            RuntimeChoice::Ray => RuntimeKind::Ray,
        }
    }
}

/// How the native runtime presents the project at /workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkspaceChoice {
    /// overlayfs where this host can mount it in a user namespace, else a copy (recorded as
    /// degraded in the enforcement report and the bundle's log).
    Auto,
    /// overlayfs only (copy-on-write); refused where it cannot be mounted.
    Overlay,
    /// A copy of the project, made at ship and compared with the project at collect.
    Copy,
}

impl WorkspaceChoice {
    pub fn mode(self) -> WorkspaceMode {
        match self {
            WorkspaceChoice::Auto => WorkspaceMode::Auto,
            WorkspaceChoice::Overlay => WorkspaceMode::Overlay,
            WorkspaceChoice::Copy => WorkspaceMode::Copy,
        }
    }
}

/// Says, before anything is created, where a remote runtime's host or cluster is missing
/// from the environment (what to set).
pub fn check_configured(runtime: RuntimeChoice) -> anyhow::Result<()> {
    match runtime {
        RuntimeChoice::Codeplane => {
            smithers_runtime_remote::RemoteOptions::from_env().coded()?;
        }
        RuntimeChoice::Ray => {
            smithers_runtime_ray::RayOptions::from_env().coded()?;
        }
        RuntimeChoice::Bubblewrap | RuntimeChoice::Docker => {}
    }
    Ok(())
}

fn invalid(message: String) -> anyhow::Error {
    coded_error(ErrorCode::InvalidInput, message, Value::Null)
}

/// The runtime the CLI uses: this very executable with the hidden init subcommand, so the
/// init is always of the same build as the runtime that sends it a plan (a
/// `smithers-sandbox-init` left next to us by an older build would not understand it), unless
/// `$SMITHERS_SANDBOX_INIT` names another. The init's start costs little either way: each
/// sandbox's init is forked from the runtime's zygote. `warm`: sandboxes kept prepared ahead
/// (`serve --warm`; 0, for `run`'s one step, keeps none).
pub fn native_runtime_warm(warm: usize) -> anyhow::Result<NativeRuntime> {
    native_runtime_options(workspace_from_env()?, warm)
}

/// The workspace mode `$SMITHERS_SANDBOX_WORKSPACE` names (`auto` when unset).
pub fn workspace_from_env() -> anyhow::Result<WorkspaceMode> {
    match std::env::var(WORKSPACE_ENV) {
        Err(_) => Ok(WorkspaceMode::Auto),
        Ok(v) => WorkspaceMode::parse(v.trim()).ok_or_else(|| {
            invalid(format!(
                "${WORKSPACE_ENV} must be auto, overlay or copy, not {v:?}"
            ))
        }),
    }
}

/// The runtime of a project the resident service keeps open: `warm` sandboxes prepared, and
/// refilled once each step is over (the service says so after answering its client), so
/// that preparing the next never takes CPU from the step a user is waiting for.
pub fn native_runtime_resident(
    workspace: WorkspaceMode,
    warm: usize,
) -> anyhow::Result<NativeRuntime> {
    native_runtime_built(workspace, warm, true)
}

/// [`native_runtime`] with an explicit workspace mode.
pub fn native_runtime_with(workspace: WorkspaceMode) -> anyhow::Result<NativeRuntime> {
    native_runtime_options(workspace, 0)
}

fn native_runtime_options(workspace: WorkspaceMode, warm: usize) -> anyhow::Result<NativeRuntime> {
    native_runtime_built(workspace, warm, false)
}

fn native_runtime_built(
    workspace: WorkspaceMode,
    warm: usize,
    warm_refill_after_step: bool,
) -> anyhow::Result<NativeRuntime> {
    let init = if std::env::var_os(smithers_runtime_native::INIT_ENV).is_some() {
        InitCommand::locate().map_err(|e| anyhow::anyhow!(e))?
    } else {
        InitCommand::current_exe_subcommand().context("locating the current executable")?
    };
    Ok(NativeRuntime::new(NativeOptions {
        init: Some(init),
        workspace,
        default_memory_limit: default_memory_from_env()?,
        disk_reserve_bytes: disk_reserve_from_env()?,
        warm,
        warm_refill_after_step,
        ..NativeOptions::default()
    }))
}

/// Environment variable by which a host's operator sets the free space a step without
/// `--disk` must leave on the disk of its workspace layer (`2g`; `0` turns the guard off):
/// 1 GiB by default.
pub const DISK_RESERVE_ENV: &str = "SMITHERS_SANDBOX_DISK_RESERVE";

fn disk_reserve_from_env() -> anyhow::Result<u64> {
    match std::env::var(DISK_RESERVE_ENV) {
        Err(_) => Ok(smithers_runtime_native::DEFAULT_DISK_RESERVE_BYTES),
        Ok(v) if v.trim() == "0" => Ok(0),
        Ok(v) => parse_memory_limit(v.trim())
            .map_err(|e| invalid(format!("${DISK_RESERVE_ENV} must be a size or 0: {e}"))),
    }
}

/// Environment variable by which a host's operator sets the memory limit of a step that
/// asks for none (`4g`, `512m`; `none` for no default): by default half the host's RAM, at
/// most 8 GiB.
pub const DEFAULT_MEMORY_ENV: &str = "SMITHERS_SANDBOX_DEFAULT_MEMORY";

fn default_memory_from_env() -> anyhow::Result<Option<u64>> {
    match std::env::var(DEFAULT_MEMORY_ENV) {
        Err(_) => Ok(smithers_runtime_native::default_memory_limit()),
        Ok(v) if v.trim() == "none" => Ok(None),
        Ok(v) => Ok(Some(parse_memory_limit(v.trim()).map_err(|e| {
            invalid(format!("${DEFAULT_MEMORY_ENV} must be a size or none: {e}"))
        })?)),
    }
}

/// Builds the orchestrator over the store at `db_path` with every runtime this binary has
/// (native as `bubblewrap`, docker), with the limits from the environment.
pub fn orchestrator(db_path: &Path) -> anyhow::Result<Orchestrator> {
    orchestrator_with(db_path, workspace_from_env()?, None)
}

/// [`orchestrator`] whose native runtime uses `workspace`.
///
/// `prestart`: the controls of the one native step this process is about to run: its
/// sandbox is started before the store is opened, so that the two proceed side by side
/// (`NativeRuntime::prestart`).
pub fn orchestrator_with(
    db_path: &Path,
    workspace: smithers_runtime_native::WorkspaceMode,
    prestart: Option<&smithers_runtime::Controls>,
) -> anyhow::Result<Orchestrator> {
    let native = native_runtime_with(workspace)?;
    if let Some(controls) = prestart {
        native.prestart(controls);
    }
    orchestrator_over(db_path, Arc::new(native))
}

/// The docker runtime the CLI uses: this very binary holds a container's network namespace
/// for an egress policy, and is a live container's waiting init.
pub(crate) fn docker_runtime() -> DockerRuntime {
    DockerRuntime::new(DockerOptions {
        egress_holder: std::env::current_exe().ok(),
        ..DockerOptions::default()
    })
}

/// The orchestrator over the store at `db_path` with `native` as its native runtime (and
/// docker, codeplane and ray as the environment configures them).
pub(crate) fn orchestrator_over(
    db_path: &Path,
    native: Arc<smithers_runtime_native::NativeRuntime>,
) -> anyhow::Result<Orchestrator> {
    let store = Arc::new(Store::open(db_path).coded()?);
    let docker = docker_runtime();
    let orchestrator = Orchestrator::new(store, Arc::new(AtomicPatchApplier), Settings::from_env())
        .coded()?
        .with_runtime(native)
        .with_runtime(Arc::new(docker));
    // The codeplane runtime (a `smithers-sandbox serve` host) where its URL and token are
    // set; `run --runtime codeplane` says what is missing otherwise.
    let orchestrator = match smithers_runtime_remote::RemoteRuntime::from_env() {
        Ok(remote) => orchestrator.with_runtime(Arc::new(remote)),
        Err(_) => orchestrator,
    };
    // The ray runtime (a fleet) where RAY_ADDRESS is set; `run --runtime ray` says what is
    // missing otherwise.
    Ok(match smithers_runtime_ray::RayRuntime::from_env() {
        Ok(ray) => orchestrator.with_runtime(Arc::new(ray)),
        Err(_) => orchestrator,
    })
}
