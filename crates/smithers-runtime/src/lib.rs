//! The runtime contract: five verbs plus a capability probe, one object-safe async trait that
//! every backend (local namespaces, Docker, remote) implements, and that the orchestrator is the
//! only user of.
//!
//! # Semantics every backend guarantees
//!
//! * **create** validates the config ([`SandboxConfig::validate`]), checks the runtime is really
//!   usable (kernel features, daemon, API) and refuses any control it cannot enforce
//!   ([`RuntimeError::ControlUnsupported`]). It never falls back to another runtime. It prepares
//!   host state under the handle's `sandbox_root` and returns a handle that is plain data.
//!   Calling it twice for the same entity id is an error, not a reuse.
//! * **ship** makes the request JSON and the workspace available inside. The workspace is
//!   `rootDir` as a copy-on-write view (or, where a backend cannot make one, a copy, recorded
//!   as degraded in the enforcement report); the host tree is never written by the sandbox.
//! * **execute** runs the command for real. The backend owns the timeout
//!   (`controls.timeout_ms`) and the cancellation token: on either, *every* process of the
//!   sandbox is dead when `execute` returns. Non-zero exits, signals, limits, timeouts and
//!   cancellation are [`ExecOutcome`]s, not errors. Every byte of output goes to the sink as
//!   written ([`OutputEvent::Output`]); what is kept (the log, the line events) is capped at
//!   `controls.max_output_bytes` and `controls.max_output_lines` per stream, truncation
//!   recorded ([`output::Capture`]); a cap ends the step only with
//!   `controls.fail_on_output_cap`.
//! * **collect** writes a valid result bundle on the host (README.md last) for every outcome,
//!   including failed and cancelled runs, with patches describing the workspace changes.
//! * **cleanup** is idempotent, may be called in any state (also after a failed create, and
//!   from another process with a handle read from the database), and removes every host
//!   resource of the sandbox except the collected bundle. Its failure is reported to the
//!   caller, who logs it without masking the primary error.
//! * **probe** reports which protections this host can enforce for this runtime, with fixes.

#![forbid(unsafe_code)]

#[cfg(feature = "collect")]
pub mod collect;
pub mod config;
pub mod engine;
pub mod error;
pub mod git_ref;
pub mod kept_layer;
pub mod mount_row;
pub mod mounts;
pub mod output;
pub mod types;

use async_trait::async_trait;
pub use tokio_util::sync::CancellationToken;

pub use config::{
    parse_cpu_limit, parse_memory_limit, Controls, EgressConfig, PortMapping, ReadSecret,
    RuntimeKind, SandboxConfig, SecretBinding, VolumeMount, WorkspacePersistence, WorkspaceSpec,
    MAX_SECRETS,
};
pub use engine::{
    refuse_terminal, BackendName, Checkpoints, Engine, EngineCapabilities, ExecExit, ExecRequest,
    Snapshot, TerminalRequest, TerminalSize,
};
pub use error::RuntimeError;
pub use output::OutputStream;
pub use types::{
    check_result_fields, refused_result_field, CollectReport, EnforcementReport, ExecOutcome,
    NoPlacementEvents, NullSink, OutputEvent, OutputSink, Placement, PlacementSink, Protection,
    ProtectionStatus, RequestBundle, ResourceUsage, Room, SandboxHandle, ShipReport, StepCommand,
    StepStdin, Termination, REFUSED_RESULT_FIELDS,
};

/// A sandbox backend. Object safe: the orchestrator holds `Arc<dyn Runtime>`.
#[async_trait]
pub trait Runtime: Send + Sync + std::fmt::Debug {
    /// Which runtime this is.
    fn kind(&self) -> RuntimeKind;

    /// What this host can enforce for this runtime (no sandbox is left behind).
    async fn probe(&self) -> EnforcementReport;

    /// Checks usability, validates and refuses unsupported controls, prepares the sandbox.
    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError>;

    /// Makes the request (and the workspace view) available inside the sandbox.
    async fn ship(
        &self,
        handle: &SandboxHandle,
        request: &RequestBundle,
    ) -> Result<ShipReport, RuntimeError>;

    /// Runs `command` inside; returns when every process of the sandbox is gone.
    async fn execute(
        &self,
        handle: &SandboxHandle,
        command: &StepCommand,
        cancel: CancellationToken,
        output: &dyn OutputSink,
    ) -> Result<ExecOutcome, RuntimeError>;

    /// Waits until the sandbox has a place to run, after `create` and before `ship`. Only a
    /// fleet runtime queues: there `create` asks the engine for a lease and returns at once
    /// (so its handle is stored before any wait), and `place` waits for the engine to grant
    /// it, telling `sink` while it is queued. It may return an updated handle (stored in place
    /// of the old one). Local runtimes have nothing to wait for.
    async fn place(
        &self,
        handle: SandboxHandle,
        sink: &dyn PlacementSink,
    ) -> Result<(SandboxHandle, Option<Placement>), RuntimeError> {
        let _ = sink;
        Ok((handle, None))
    }

    /// Writes the result bundle on the host and returns where.
    async fn collect(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError>;

    /// `collect` from a handle that comes back from storage (the database in the project
    /// tree, so not trusted to name host objects), after the process that made the sandbox
    /// died: only with every directory it names recomputed from its ids under this runtime's
    /// own roots and checked, as cleanup from a stored handle confines it; anything else is
    /// refused and nothing is touched. A runtime that cannot confine a stored handle (or
    /// needs its maker's memory to collect) refuses.
    async fn collect_stored(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError> {
        let _ = handle;
        Err(RuntimeError::OutOfOrder {
            verb: "collect",
            reason: "this runtime cannot collect a sandbox from a stored handle".to_string(),
        })
    }

    /// Removes everything the sandbox holds on the host but the bundle. Idempotent.
    async fn cleanup(&self, handle: &SandboxHandle) -> Result<(), RuntimeError>;
}

/// The name of a project's state directory (`<root>/.smithers`: the database, the bundles).
pub const STATE_DIR_NAME: &str = ".smithers";

/// Creates `<root>/.smithers` when missing and, when this call created it, a `.gitignore` in
/// it that ignores everything, so that `git status` does not list the runtime's state and
/// `git add -A` cannot commit a database or a bundle. An existing directory is left as it is
/// (the user may have chosen to track part of it).
pub fn ensure_state_dir(root: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    let dir = root.join(STATE_DIR_NAME);
    match std::fs::create_dir(&dir) {
        Ok(()) => {
            let ignore = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(dir.join(".gitignore"));
            if let Ok(mut file) = ignore {
                use std::io::Write;
                file.write_all(
                    b"# smithers-sandbox state (database, bundles): not part of the project\n*\n",
                )?;
            }
            Ok(dir)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(dir),
        Err(e) => Err(e),
    }
}
