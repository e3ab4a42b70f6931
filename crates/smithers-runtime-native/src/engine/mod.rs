//! The native engine ([`smithers_runtime::Engine`]): a sandbox that lives across many
//! commands. `start` brings one up with a session prelude (`start`); each `exec` is a message
//! on its exec channel with the command's own pipes (`exec`, `channel`); `stop` kills every
//! process of it and waits until they are gone; `destroy` is `stop` and then the runtime's
//! cleanup. The step's `Runtime` verbs are untouched by this: `execute` still runs one
//! command in a sandbox of its own.
//!
//! A live sandbox belongs to the process that started it (its init's control socket and exec
//! channel are this process's descriptors): when this process ends, the init sees the
//! socket's end and kills the sandbox. From another process, `destroy` with a stored handle
//! works as `cleanup` does (the cgroups killed, the directories removed).

mod exec;
mod snapshot;
mod start;
mod terminal;

use std::sync::Arc;

use async_trait::async_trait;
use smithers_runtime::{
    BackendName, CancellationToken, EnforcementReport, Engine, EngineCapabilities, ExecExit,
    ExecRequest, OutputSink, RequestBundle, Runtime, RuntimeError, SandboxConfig, SandboxHandle,
    ShipReport, Snapshot,
};

use smithers_sandbox_init::plan::SessionRequest;

use crate::backend::Backend;
use crate::live::Live;
use crate::runtime::NativeRuntime;

/// Refuses variables the init could not set as given: a NUL or `=` in a name, a NUL in a
/// value (a C string would end there, and the variable with it).
pub(crate) fn check_env<'a>(
    mut env: impl Iterator<Item = (&'a String, &'a String)>,
) -> Result<(), RuntimeError> {
    match env.find(|(k, v)| k.is_empty() || k.contains('\0') || v.contains('\0') || k.contains('=')) {
        Some((k, _)) => Err(RuntimeError::InvalidControl {
            control: "env",
            reason: format!(
                "variable {:?} is empty, has a NUL byte or '=' in its name, or a NUL byte in its value",
                k.replace('\0', "\\0")
            ),
        }),
        None => Ok(()),
    }
}

fn not_running(verb: &'static str) -> RuntimeError {
    RuntimeError::OutOfOrder {
        verb,
        reason: "the sandbox is not running (not started, or stopped)".into(),
    }
}

impl NativeRuntime {
    fn live_of(
        &self,
        handle: &SandboxHandle,
        verb: &'static str,
    ) -> Result<Option<Arc<Live>>, RuntimeError> {
        let backend = Backend::from_handle(handle, verb)?;
        Ok(self.live.lock().get(&backend.state_dir).cloned())
    }
}

#[async_trait]
impl Engine for NativeRuntime {
    fn backend(&self) -> BackendName {
        BackendName::NATIVE
    }

    fn capabilities(&self) -> EngineCapabilities {
        EngineCapabilities {
            concurrent_execs: true,
            exec_stdin: true,
            pause: true,
            snapshot: true,
            fork: true,
            terminal: true,
        }
    }

    async fn probe(&self) -> EnforcementReport {
        Runtime::probe(self).await
    }

    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
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
        if self.live_of(handle, "start")?.is_some() {
            return Err(RuntimeError::OutOfOrder {
                verb: "start",
                reason: "the sandbox is running already".into(),
            });
        }
        let live = start::start(self, handle).await?;
        let raced = {
            let mut map = self.live.lock();
            match map.contains_key(&live.backend.state_dir) {
                true => true,
                false => {
                    map.insert(live.backend.state_dir.clone(), live.clone());
                    false
                }
            }
        };
        if raced {
            live.kill().await;
            return Err(RuntimeError::OutOfOrder {
                verb: "start",
                reason: "the sandbox was started at the same time by another call".into(),
            });
        }
        Ok(())
    }

    async fn exec(
        &self,
        handle: &SandboxHandle,
        request: ExecRequest,
        cancel: CancellationToken,
        output: &dyn OutputSink,
    ) -> Result<ExecExit, RuntimeError> {
        let Some(live) = self.live_of(handle, "exec")? else {
            return Err(not_running("exec"));
        };
        exec::exec(&live, request, cancel, output).await
    }

    /// Every process but the init stopped (its P1 sends `SIGSTOP` to all and waits until
    /// each thread is stopped); commands asked for meanwhile start at the resume.
    async fn pause(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        match self.live_of(handle, "pause")? {
            Some(live) => {
                let _gate = live.flip_gate.read().await;
                live.control("pause", |id| SessionRequest::Pause { id })
                    .await
            }
            None => Err(not_running("pause")),
        }
    }

    async fn resume(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        match self.live_of(handle, "resume")? {
            Some(live) => {
                let _gate = live.flip_gate.read().await;
                live.control("resume", |id| SessionRequest::Resume { id })
                    .await
            }
            None => Err(not_running("resume")),
        }
    }

    async fn snapshot(&self, handle: &SandboxHandle) -> Result<Snapshot, RuntimeError> {
        match self.live_of(handle, "snapshot")? {
            Some(live) => snapshot::snapshot(self, &live).await,
            None => Err(not_running("snapshot")),
        }
    }

    async fn restore(&self, handle: &SandboxHandle, to: &Snapshot) -> Result<(), RuntimeError> {
        match self.live_of(handle, "restore")? {
            Some(live) => snapshot::restore(self, &live, to).await,
            None => Err(not_running("restore")),
        }
    }

    async fn stop(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        let backend = Backend::from_handle(handle, "stop")?;
        let live = self.live.lock().remove(&backend.state_dir);
        if let Some(live) = live {
            // Not in the middle of a flip: its directories and record settle first.
            let _gate = live.flip_gate.write().await;
            live.kill().await;
        }
        Ok(())
    }

    async fn destroy(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        Engine::stop(self, handle).await?;
        Runtime::cleanup(self, handle).await
    }
}
