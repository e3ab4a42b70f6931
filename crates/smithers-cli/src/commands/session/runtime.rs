//! A held session as a step of the orchestrator's: the backend's `Runtime` verbs as they are
//! (create, ship, collect, cleanup), but `execute` brings the sandbox up through the
//! backend's `Engine`, hands it to the holder to serve commands, and stops it when the
//! holder says the session is over. So a session has a run's rows, events, bundle and review
//! without a second lifecycle.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use smithers_runtime::{
    CancellationToken, CollectReport, EnforcementReport, Engine, ExecOutcome, OutputSink,
    RequestBundle, Runtime, RuntimeError, RuntimeKind, SandboxConfig, SandboxHandle, ShipReport,
    StepCommand, Termination,
};
use tokio::sync::oneshot;

/// The started sandbox, handed to the holder; it answers through `done` once the session is
/// to end.
pub struct Started {
    pub handle: SandboxHandle,
    pub engine: Arc<dyn Engine>,
    /// The same backend's step verbs (`collect`, for the change so far).
    pub runtime: Arc<dyn Runtime>,
    /// Fired by the holder: the session is over (stop, idle, its time bound).
    pub done: CancellationToken,
}

/// The backend, and where its started sandbox goes.
pub struct SessionRuntime {
    pub runtime: Arc<dyn Runtime>,
    pub engine: Arc<dyn Engine>,
    /// Taken by the one `execute`: the holder's end.
    pub started: Mutex<Option<oneshot::Sender<Started>>>,
    /// A fork's: the frozen layers its workspace starts from (empty for any other session).
    pub layers: Vec<String>,
}

impl std::fmt::Debug for SessionRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionRuntime")
            .field("runtime", &self.runtime.kind())
            .finish()
    }
}

#[async_trait]
impl Runtime for SessionRuntime {
    fn kind(&self) -> RuntimeKind {
        self.runtime.kind()
    }

    async fn probe(&self) -> EnforcementReport {
        self.runtime.probe().await
    }

    // The step's verbs up to the start (create, place, ship) are the backend's own: a
    // fleet's lease is placed between create and ship, with its events.
    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
        if self.layers.is_empty() {
            return self.runtime.create(config).await;
        }
        // A fork: its workspace starts from the checkpoint's layers.
        let mut config = config.clone();
        config.workspace_layers = self.layers.clone();
        self.runtime.create(&config).await
    }

    async fn ship(
        &self,
        handle: &SandboxHandle,
        request: &RequestBundle,
    ) -> Result<ShipReport, RuntimeError> {
        self.runtime.ship(handle, request).await
    }

    /// The session's life: started, served by the holder until it is over or `cancel`
    /// (the holder was told to end: SIGTERM), then stopped. A session that was stopped ended
    /// well; what each of its commands did is in its events.
    async fn execute(
        &self,
        handle: &SandboxHandle,
        _command: &StepCommand,
        cancel: CancellationToken,
        _output: &dyn OutputSink,
    ) -> Result<ExecOutcome, RuntimeError> {
        let began = Instant::now();
        let to_holder = self
            .started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| RuntimeError::OutOfOrder {
                verb: "execute",
                reason: "a session's sandbox is started once".into(),
            })?;
        self.engine.start(handle).await?;
        let done = CancellationToken::new();
        let started = Started {
            handle: handle.clone(),
            engine: self.engine.clone(),
            runtime: self.runtime.clone(),
            done: done.clone(),
        };
        if to_holder.send(started).is_ok() {
            tokio::select! {
                _ = done.cancelled() => {}
                _ = cancel.cancelled() => {}
            }
        }
        self.engine.stop(handle).await?;
        let cancelled = cancel.is_cancelled() && !done.is_cancelled();
        Ok(if cancelled {
            ExecOutcome::of_life(Termination::Cancelled, None, began.elapsed())
        } else {
            ExecOutcome::of_life(Termination::Exited, Some(0), began.elapsed())
        })
    }

    /// A fleet's lease waits here for its node, as a step's does.
    async fn place(
        &self,
        handle: SandboxHandle,
        sink: &dyn smithers_runtime::PlacementSink,
    ) -> Result<(SandboxHandle, Option<smithers_runtime::Placement>), RuntimeError> {
        self.runtime.place(handle, sink).await
    }

    async fn collect(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError> {
        self.runtime.collect(handle).await
    }

    async fn collect_stored(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError> {
        self.runtime.collect_stored(handle).await
    }

    async fn cleanup(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        self.engine.destroy(handle).await
    }
}
