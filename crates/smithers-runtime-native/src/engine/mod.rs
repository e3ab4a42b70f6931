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

mod channel;
mod exec;
mod start;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use smithers_runtime::{
    BackendName, CancellationToken, EnforcementReport, Engine, EngineCapabilities, ExecExit,
    ExecRequest, OutputSink, RequestBundle, Runtime, RuntimeError, SandboxConfig, SandboxHandle,
    ShipReport,
};
use smithers_sandbox_init::plan::{ExecSpec, SessionRequest};

use crate::backend::Backend;
use crate::runtime::NativeRuntime;

use channel::Channel;

/// How long `stop` waits for the sandbox's processes to be gone before it kills harder.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The sandboxes this runtime has started and not stopped, by state directory.
#[derive(Debug, Default)]
pub(crate) struct LiveSandboxes(Mutex<HashMap<PathBuf, Arc<Live>>>);

impl LiveSandboxes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Arc<Live>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A started sandbox.
#[derive(Debug)]
pub(crate) struct Live {
    backend: Backend,
    /// Every command's base: the sandbox's environment, search path and working directory.
    base: ExecSpec,
    init_pid: Option<i32>,
    /// An executed (not forked) init, reaped at the end.
    child: Mutex<Option<tokio::process::Child>>,
    /// A second descriptor of our end of the init's control socket, to send `k` with.
    killer: Mutex<Option<std::os::unix::net::UnixStream>>,
    channel: OnceLock<Arc<Channel>>,
    egress: Mutex<Option<smithers_egress::Engine>>,
    ready_report: Mutex<Option<Value>>,
    /// The control socket ended: every process of the sandbox is gone.
    ended: CancellationToken,
    next_id: AtomicU64,
}

impl Live {
    fn new(
        backend: Backend,
        base: ExecSpec,
        init_pid: Option<i32>,
        child: Option<tokio::process::Child>,
        killer: std::os::unix::net::UnixStream,
    ) -> Live {
        Live {
            backend,
            base,
            init_pid,
            child: Mutex::new(child),
            killer: Mutex::new(Some(killer)),
            channel: OnceLock::new(),
            egress: Mutex::new(None),
            ready_report: Mutex::new(None),
            ended: CancellationToken::new(),
            next_id: AtomicU64::new(1),
        }
    }

    fn channel(&self) -> Option<Arc<Channel>> {
        self.channel
            .get()
            .filter(|c| !c.closed.is_cancelled())
            .cloned()
    }

    fn set_channel(&self, channel: Arc<Channel>) {
        let _ = self.channel.set(channel);
    }

    fn set_egress(&self, engine: smithers_egress::Engine) {
        *self.egress.lock().unwrap_or_else(|e| e.into_inner()) = Some(engine);
    }

    fn set_ready_report(&self, ready: Value) {
        *self.ready_report.lock().unwrap_or_else(|e| e.into_inner()) = Some(ready);
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Ends the sandbox: `stop` on the channel (P1 kills everything and exits), then `k` to
    /// P0, then the init and the cgroups killed from here, each only if the one before did not
    /// end it within [`STOP_GRACE`]. Returns once every process is gone (the control socket
    /// ended), and stops the egress engine.
    async fn kill(&self) {
        if let Some(channel) = self.channel() {
            let _ = channel.send(&SessionRequest::Stop, &[]).await;
        }
        if tokio::time::timeout(STOP_GRACE, self.ended.cancelled())
            .await
            .is_err()
        {
            let killer = self.killer.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(mut k) = killer {
                use std::io::Write;
                let _ = k.write_all(b"k\n");
            }
            if tokio::time::timeout(STOP_GRACE, self.ended.cancelled())
                .await
                .is_err()
            {
                if let Some(pid) = self.init_pid {
                    let _ = smithers_sandbox_init::sys::kill(pid, libc::SIGKILL);
                }
                let cgroups = self.backend.cgroups.clone();
                let _ = crate::threads::blocking("kill what is left of the sandbox", move || {
                    cgroups.kill_and_wait(STOP_GRACE)
                })
                .await;
            }
        }
        self.killer.lock().unwrap_or_else(|e| e.into_inner()).take();
        let engine = self.egress.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(engine) = engine {
            engine.stop().await;
        }
        let child = self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut child) = child {
            let _ = child.wait().await;
        }
    }
}

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
            return Err(RuntimeError::OutOfOrder {
                verb: "exec",
                reason: "the sandbox is not running (not started, or stopped)".into(),
            });
        };
        exec::exec(&live, request, cancel, output).await
    }

    async fn stop(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        let backend = Backend::from_handle(handle, "stop")?;
        let live = self.live.lock().remove(&backend.state_dir);
        if let Some(live) = live {
            live.kill().await;
        }
        Ok(())
    }

    async fn destroy(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        Engine::stop(self, handle).await?;
        Runtime::cleanup(self, handle).await
    }
}
