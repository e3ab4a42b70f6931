//! The engine itself: its parts (store, runtimes, bundle inspector, patch applier, metrics),
//! and the row, event and heartbeat writes every stage shares.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use smithers_runtime::{Runtime, RuntimeKind, SandboxHandle};
use smithers_store::{NewEvent, OwnerIdentity, RunStatus, Store, StoreError};
use tracing::warn;

use crate::bundle::{BundleInspector, BundleValidator, PatchApplier};
use crate::error::OrchestratorError;
use crate::metrics::Metrics;
use crate::request::{Heartbeat, StepContext};
use crate::settings::Settings;
use crate::support::{elapsed_ms, event_json, off_worker};

/// The sandbox lifecycle engine. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Orchestrator {
    pub(crate) store: Arc<Store>,
    pub(crate) runtimes: HashMap<RuntimeKind, Arc<dyn Runtime>>,
    pub(crate) inspector: Arc<dyn BundleInspector>,
    pub(crate) applier: Arc<dyn PatchApplier>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) settings: Settings,
    pub(crate) owner: OwnerIdentity,
}

impl Orchestrator {
    /// An orchestrator with no runtime registered yet, validating bundles with
    /// [`BundleValidator`] and applying accepted patches with `applier`.
    pub fn new(
        store: Arc<Store>,
        applier: Arc<dyn PatchApplier>,
        settings: Settings,
    ) -> Result<Self, OrchestratorError> {
        Self::with_inspector(store, Arc::new(BundleValidator), applier, settings)
    }

    /// Like [`Orchestrator::new`] with another bundle inspector (one that adds checks).
    pub fn with_inspector(
        store: Arc<Store>,
        inspector: Arc<dyn BundleInspector>,
        applier: Arc<dyn PatchApplier>,
        settings: Settings,
    ) -> Result<Self, OrchestratorError> {
        let owner = OwnerIdentity::current().ok_or_else(|| OrchestratorError::Io {
            operation: "read process identity from",
            path: "/proc/self/stat".into(),
            source: std::io::Error::other("process identity unavailable"),
        })?;
        Ok(Orchestrator {
            store,
            runtimes: HashMap::new(),
            inspector,
            applier,
            metrics: Arc::new(Metrics::new()),
            settings,
            owner,
        })
    }

    /// Registers a backend under its [`Runtime::kind`].
    pub fn with_runtime(mut self, runtime: Arc<dyn Runtime>) -> Self {
        self.runtimes.insert(runtime.kind(), runtime);
        self
    }

    /// The metrics of this process.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Records an event of a sandbox its caller holds, stamped now: a held session's
    /// commands (`SessionExec`), which the lifecycle does not see. The payload is `extra`
    /// beside the event's type, ids and time, as every event's.
    pub fn record_event(
        &self,
        event_type: &str,
        run_id: &str,
        sandbox_id: &str,
        extra: Vec<(&str, Value)>,
    ) -> Result<i64, StoreError> {
        self.emit(
            event_type,
            run_id,
            sandbox_id,
            extra,
            crate::support::now_ms(),
        )
    }

    pub(crate) fn emit(
        &self,
        event_type: &str,
        run_id: &str,
        sandbox_id: &str,
        extra: Vec<(&str, Value)>,
        timestamp_ms: i64,
    ) -> Result<i64, StoreError> {
        let payload = event_json(event_type, run_id, sandbox_id, extra, timestamp_ms);
        off_worker(|| {
            self.store.insert_event(&NewEvent {
                run_id,
                timestamp_ms,
                event_type,
                payload_json: &payload,
            })
        })
    }

    pub(crate) fn heartbeat(
        ctx: &StepContext,
        sandbox_id: &str,
        stage: &'static str,
        progress: u8,
        data: Vec<(&str, Value)>,
    ) {
        if let Some(hb) = &ctx.heartbeat {
            hb(&Heartbeat {
                sandbox_id: sandbox_id.to_string(),
                stage,
                progress,
                data: data.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            });
        }
    }

    /// Writes the sandbox's handle to its row (what recovery cleans up from).
    pub(crate) fn store_handle(
        &self,
        run_id: &str,
        sandbox_id: &str,
        handle: &SandboxHandle,
    ) -> Result<(), OrchestratorError> {
        let handle_json =
            serde_json::to_string(handle).map_err(|source| OrchestratorError::Handle {
                sandbox_id: sandbox_id.to_string(),
                source,
            })?;
        off_worker(|| self.store.set_handle(run_id, sandbox_id, &handle_json))?;
        Ok(())
    }

    pub(crate) async fn timed<T>(&self, fut: impl std::future::Future<Output = T>) -> T {
        let started = Instant::now();
        let out = fut.await;
        self.metrics.observe_transport_ms(elapsed_ms(started));
        out
    }

    /// Moves the `_smithers_runs` row of a run our CLI started (none for a workflow's run or
    /// a library caller's: see `Store::settle_cli_run`). A failure is logged: the decision
    /// it follows stands.
    pub(crate) fn settle_cli_run(
        &self,
        run_id: &str,
        status: RunStatus,
        at_ms: i64,
        error: Option<&Value>,
    ) {
        let error = error.map(Value::to_string);
        if let Err(e) = off_worker(|| {
            self.store
                .settle_cli_run(run_id, status, at_ms, error.as_deref())
        }) {
            warn!(run_id, error = %e, "updating the run's _smithers_runs row failed");
        }
    }

    /// The project whose `.smithers/` holds this database, when it is there.
    pub(crate) fn database_project(&self) -> Option<&Path> {
        self.store
            .path()
            .parent()
            .filter(|d| d.file_name() == Some(std::ffi::OsStr::new(".smithers")))
            .and_then(Path::parent)
    }
}
