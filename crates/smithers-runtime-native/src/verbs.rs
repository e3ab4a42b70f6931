//! [`smithers_runtime::Runtime`] for [`NativeRuntime`]: each verb hands over to its module
//! (`probe`, `create`, `ship`, `exec`, `collect`, `cleanup`).

use async_trait::async_trait;
use smithers_runtime::{
    CancellationToken, CollectReport, EnforcementReport, ExecOutcome, OutputSink, RequestBundle,
    Runtime, RuntimeError, RuntimeKind, SandboxConfig, SandboxHandle, ShipReport, StepCommand,
};

use crate::backend::Backend;
use crate::runtime::NativeRuntime;
use crate::threads::blocking;
use crate::{collect, exec, ship};

#[async_trait]
impl Runtime for NativeRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Bubblewrap
    }

    async fn probe(&self) -> EnforcementReport {
        self.probe_host().await
    }

    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
        self.create_inner(config).await
    }

    async fn ship(
        &self,
        handle: &SandboxHandle,
        request: &RequestBundle,
    ) -> Result<ShipReport, RuntimeError> {
        ship::ship(handle, request).await
    }

    async fn execute(
        &self,
        handle: &SandboxHandle,
        command: &StepCommand,
        cancel: CancellationToken,
        output: &dyn OutputSink,
    ) -> Result<ExecOutcome, RuntimeError> {
        let backend = Backend::from_handle(handle, "execute")?;
        let caps = self.caps();
        let zygote = self.options.zygote.then_some(&self.zygote);
        let warm = self.take_attached(&backend);
        // A step that claimed a warm sandbox lets the pool refill once its command runs.
        let pool = match (&warm, self.warm_pool()) {
            (Some(_), Some(Ok(pool))) => Some(pool),
            _ => None,
        };
        let started = move |armed_served: bool| {
            if let Some(pool) = &pool {
                pool.step_started(armed_served);
            }
        };
        exec::execute(
            &caps, zygote, &backend, command, cancel, output, warm, &started,
        )
        .await
    }

    async fn collect(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError> {
        let backend = Backend::from_handle(handle, "collect")?;
        let live = self.live.lock().contains_key(&backend.state_dir);
        let handle = handle.clone();
        blocking("collect the sandbox's bundle", move || {
            collect::collect(&backend, &handle, live)
        })
        .await?
    }

    /// The backend is rebuilt from the ids under this runtime's own roots and checked (see
    /// `owned::confine_for_collect`) before collect reads or writes anything.
    async fn collect_stored(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError> {
        let stored = Backend::from_handle(handle, "collect")?;
        let caps = self.caps();
        let handle = handle.clone();
        blocking("collect the sandbox's bundle", move || {
            collect::collect_stored(
                &handle,
                &stored,
                &caps.state_root,
                &caps.layer_root,
                &caps.cgroups,
            )
        })
        .await?
    }

    async fn cleanup(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        self.cleanup_sandbox(handle).await
    }
}
