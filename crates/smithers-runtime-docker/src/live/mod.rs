//! The docker engine ([`smithers_runtime::Engine`]): a sandbox that lives across many
//! commands. `create` and `ship` are the step's own; `start` runs a long-lived container made
//! from the same plan as a step's (`start`), whose main process only waits; each `exec` is a
//! `docker exec` of this build's binary as the command's wrapper (`exec`), killed on a timeout
//! or a cancel by a second exec; `stop` kills the container and waits for it (`stop`), the
//! workspace layer staying for `collect`; `destroy` is `stop` and then the runtime's cleanup.
//! The step's `Runtime` verbs are untouched by this: `execute` still runs one command in a
//! container of its own.
//!
//! A started sandbox belongs to the process that started it (its watchdog kills the container
//! when this process dies). From another process, `destroy` with a stored handle works as
//! `cleanup` does.

mod exec;
mod start;
mod stop;

use std::sync::Arc;

use async_trait::async_trait;
use smithers_runtime::{
    BackendName, CancellationToken, EnforcementReport, Engine, EngineCapabilities, ExecExit,
    ExecRequest, OutputSink, RequestBundle, Runtime, RuntimeError, SandboxConfig, SandboxHandle,
    ShipReport,
};

use crate::handle::require_state;
use crate::runtime::DockerRuntime;
use crate::started::Started;

impl DockerRuntime {
    /// The started sandbox of `handle`, if this runtime started it and it is not stopped.
    fn started_of(
        &self,
        handle: &SandboxHandle,
        verb: &'static str,
    ) -> Result<Option<Arc<Started>>, RuntimeError> {
        let state = require_state(handle, verb)?;
        Ok(self.started.lock().get(&state.container_name).cloned())
    }
}

fn not_running(verb: &'static str) -> RuntimeError {
    RuntimeError::OutOfOrder {
        verb,
        reason: "the sandbox is not running (not started, or stopped)".into(),
    }
}

#[async_trait]
impl Engine for DockerRuntime {
    fn backend(&self) -> BackendName {
        BackendName::DOCKER
    }

    fn capabilities(&self) -> EngineCapabilities {
        EngineCapabilities {
            concurrent_execs: true,
            exec_stdin: true,
            pause: true,
            snapshot: false,
            fork: false,
            terminal: false,
        }
    }

    async fn probe(&self) -> EnforcementReport {
        Runtime::probe(self).await
    }

    /// The step's `create`, and a refusal up front when `start` could not run here (this
    /// build's binary, which waits in the container and wraps each exec, is not there).
    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
        start::binary(self)?;
        Runtime::create(self, config).await
    }

    async fn ship(
        &self,
        handle: &SandboxHandle,
        request: &RequestBundle,
    ) -> Result<ShipReport, RuntimeError> {
        Runtime::ship(self, handle, request).await
    }

    async fn start(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        let name = require_state(handle, "start")?.container_name;
        if !self.started.begin(&name) {
            return Err(RuntimeError::OutOfOrder {
                verb: "start",
                reason: "the sandbox is running already (or being started)".into(),
            });
        }
        // The name is released whatever comes of the start.
        let result = start::start(self, handle).await;
        match result {
            Ok(started) => {
                self.started.finish(&name, Some(Arc::new(started)));
                Ok(())
            }
            Err(e) => {
                self.started.finish(&name, None);
                Err(e)
            }
        }
    }

    async fn exec(
        &self,
        handle: &SandboxHandle,
        request: ExecRequest,
        cancel: CancellationToken,
        output: &dyn OutputSink,
    ) -> Result<ExecExit, RuntimeError> {
        smithers_runtime::refuse_terminal(&Engine::backend(self), &request)?;
        let Some(started) = self.started_of(handle, "exec")? else {
            return Err(not_running("exec"));
        };
        let docker = self.engine().await?;
        exec::exec(docker, &started, request, cancel, output).await
    }

    /// The container paused (the cgroup freezer: every process held, none told).
    async fn pause(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        let Some(started) = self.started_of(handle, "pause")? else {
            return Err(not_running("pause"));
        };
        let docker = self.engine().await?;
        started.set_paused(true);
        if let Err(e) = docker.pause_container(&started.id).await {
            started.set_paused(false);
            return Err(crate::engine::spawn_err("pause the container", &e));
        }
        Ok(())
    }

    async fn resume(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        let Some(started) = self.started_of(handle, "resume")? else {
            return Err(not_running("resume"));
        };
        let docker = self.engine().await?;
        let resumed = docker.unpause_container(&started.id).await;
        started.set_paused(false);
        resumed.map_err(|e| crate::engine::spawn_err("resume the container", &e))
    }

    async fn stop(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        stop::stop(self, handle).await
    }

    async fn destroy(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        Engine::stop(self, handle).await?;
        Runtime::cleanup(self, handle).await
    }
}
