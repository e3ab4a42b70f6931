//! [`Engine`] for the ray runtime: a session held on a lease. The sandbox is created and
//! placed as a step's is (`create` waits for Ray: the contract has no `place`), shipped to the node's
//! `serve`, then started there as a session; its commands go to the node as the codeplane
//! engine sends them, each raced against the lease's watch, so a node lost under a session
//! ends its commands with `NODE_LOST`. The lease lives until `destroy` (the runtime's
//! cleanup, which ends its job).

use async_trait::async_trait;
use smithers_runtime::{
    BackendName, CancellationToken, EnforcementReport, Engine, EngineCapabilities, ExecExit,
    ExecRequest, NoPlacementEvents, OutputSink, RequestBundle, Runtime, RuntimeError,
    SandboxConfig, SandboxHandle, ShipReport,
};

use crate::runtime::RayRuntime;

#[async_trait]
impl Engine for RayRuntime {
    fn backend(&self) -> BackendName {
        BackendName::RAY
    }

    fn capabilities(&self) -> EngineCapabilities {
        EngineCapabilities {
            concurrent_execs: true,
            exec_stdin: true,
            pause: false,
            snapshot: false,
            fork: false,
            terminal: false,
        }
    }

    async fn probe(&self) -> EnforcementReport {
        Runtime::probe(self).await
    }

    /// A sandbox of the engine is placed at once: its lease waits here for a node (a step's
    /// waits in `place`, which the engine contract does not have).
    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
        let handle = Runtime::create(self, config).await?;
        match Runtime::place(self, handle.clone(), &NoPlacementEvents).await {
            Ok((placed, _)) => Ok(placed),
            Err(e) => {
                let _ = Runtime::cleanup(self, &handle).await;
                Err(e)
            }
        }
    }

    async fn ship(
        &self,
        handle: &SandboxHandle,
        request: &RequestBundle,
    ) -> Result<ShipReport, RuntimeError> {
        Runtime::ship(self, handle, request).await
    }

    async fn start(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        let a = self.attach(handle).await?;
        self.guarded(handle, Engine::start(&a.remote, &a.inner))
            .await
    }

    async fn exec(
        &self,
        handle: &SandboxHandle,
        request: ExecRequest,
        cancel: CancellationToken,
        output: &dyn OutputSink,
    ) -> Result<ExecExit, RuntimeError> {
        let a = self.attach(handle).await?;
        let run = Engine::exec(&a.remote, &a.inner, request, cancel, output);
        self.guarded(handle, run).await
    }

    async fn stop(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        let a = self.attach(handle).await?;
        self.guarded(handle, Engine::stop(&a.remote, &a.inner))
            .await
    }

    async fn destroy(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        Runtime::cleanup(self, handle).await
    }
}
