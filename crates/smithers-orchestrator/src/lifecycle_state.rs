//! What one execution carries between its stages: the active gauge's guard, how it stopped,
//! its progress so far and what is left of it once its outcome is recorded.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use smithers_runtime::{Runtime, SandboxHandle};
use smithers_store::StoreError;

use crate::error::OrchestratorError;
use crate::metrics::Metrics;

/// Decrements the active gauge when dropped: whatever path ends a sandbox (success, error,
/// review, cancellation, even a dropped future), the gauge goes down exactly once.
pub(crate) struct ActiveGuard {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) runtime: &'static str,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.metrics.active_add(self.runtime, -1);
    }
}

/// How the inner lifecycle stopped when it did not return an outcome.
pub(crate) enum Stop {
    Failed(OrchestratorError),
    Cancelled,
}

impl From<OrchestratorError> for Stop {
    fn from(e: OrchestratorError) -> Self {
        Stop::Failed(e)
    }
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        Stop::Failed(e.into())
    }
}

/// What is left of a sandbox once its outcome is recorded (see [`Orchestrator::finish`]).
pub(crate) struct Tail {
    pub(crate) runtime: Arc<dyn Runtime>,
    pub(crate) runtime_name: &'static str,
    pub(crate) cleanup:
        Option<tokio::task::JoinHandle<(Result<(), smithers_runtime::RuntimeError>, f64)>>,
    pub(crate) handle: Option<SandboxHandle>,
    pub(crate) reason: String,
}

/// Mutable state of one execution, read by the failure/cancel bookkeeping.
pub(crate) struct Progress {
    pub(crate) shipped_at_ms: Option<i64>,
    pub(crate) handle: Option<SandboxHandle>,
    pub(crate) bundle_path: Option<PathBuf>,
    pub(crate) child_started: Option<Instant>,
    /// The sandbox's cleanup, started as soon as its bundle is collected when
    /// `cleanup_at_collect` (see `lifecycle`): its result and how long it took.
    pub(crate) cleanup:
        Option<tokio::task::JoinHandle<(Result<(), smithers_runtime::RuntimeError>, f64)>>,
    /// Whether the cleanup starts once the bundle is collected (`execute`), or is left to
    /// the finish (`execute_then_finish`: after the caller's answer).
    pub(crate) cleanup_at_collect: bool,
}
