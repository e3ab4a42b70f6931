//! Sandboxes started through the engine and not yet stopped: their init's control socket
//! and exec channel, their base command and egress engine, and how they are ended. Kept by
//! the runtime ([`crate::runtime::NativeRuntime`]), used by the engine's verbs.

pub(crate) mod channel;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use smithers_runtime::{CancellationToken, EnforcementReport, ExecOutcome, Termination};
use smithers_sandbox_init::plan::{ExecSpec, SessionRequest};

use crate::backend::Backend;

use channel::Channel;

/// How long `stop` waits for the sandbox's processes to be gone before it kills harder.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long a pause or a resume waits for the init's answer (a pause waits up to 4000 of its
/// rounds, each a millisecond's sleep and a look at `/proc`, for every process to stop).
const CONTROL_WAIT: Duration = Duration::from_secs(20);

/// The sandboxes this runtime has started and not stopped, by state directory.
#[derive(Debug, Default)]
pub(crate) struct LiveSandboxes(Mutex<HashMap<PathBuf, Arc<Live>>>);

impl LiveSandboxes {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Arc<Live>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A started sandbox.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) backend: Backend,
    /// Every command's base: the sandbox's environment, search path and working directory.
    pub(crate) base: ExecSpec,
    init_pid: Option<i32>,
    /// An executed (not forked) init, reaped at the end.
    child: Mutex<Option<tokio::process::Child>>,
    /// A second descriptor of our end of the init's control socket, to send `k` with.
    killer: Mutex<Option<std::os::unix::net::UnixStream>>,
    channel: OnceLock<Arc<Channel>>,
    egress: Mutex<Option<smithers_egress::Engine>>,
    /// The control socket ended: every process of the sandbox is gone.
    pub(crate) ended: CancellationToken,
    next_id: AtomicU64,
    /// What held for the sandbox's life, set once it was ready.
    enforcement: OnceLock<EnforcementReport>,
    started: Instant,
    /// Held (write) by a layer flip from the handover to the respawn, when no spawner serves
    /// the channel; every other request is sent holding it (read).
    pub(crate) flip_gate: tokio::sync::RwLock<()>,
    /// How the sandbox's step ended, when a command was exec'd as its step
    /// ([`smithers_runtime::ExecRequest::is_step`]): the life's end recorded at the stop.
    step_end: Mutex<Option<smithers_runtime::ExecExit>>,
}

impl Live {
    pub(crate) fn new(
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
            ended: CancellationToken::new(),
            next_id: AtomicU64::new(1),
            enforcement: OnceLock::new(),
            started: Instant::now(),
            flip_gate: tokio::sync::RwLock::new(()),
            step_end: Mutex::new(None),
        }
    }

    /// Records how the sandbox's step ended (see `step_end`).
    pub(crate) fn set_step_end(&self, exit: smithers_runtime::ExecExit) {
        *self.step_end.lock().unwrap_or_else(|e| e.into_inner()) = Some(exit);
    }

    /// The init's host pid (its namespaces are the sandbox's), when this process started it.
    pub(crate) fn init_pid(&self) -> Option<i32> {
        self.init_pid
    }

    pub(crate) fn channel(&self) -> Option<Arc<Channel>> {
        self.channel
            .get()
            .filter(|c| !c.closed.is_cancelled())
            .cloned()
    }

    pub(crate) fn set_channel(&self, channel: Arc<Channel>) {
        let _ = self.channel.set(channel);
    }

    pub(crate) fn set_egress(&self, engine: smithers_egress::Engine) {
        *self.egress.lock().unwrap_or_else(|e| e.into_inner()) = Some(engine);
    }

    pub(crate) fn set_enforcement(&self, report: EnforcementReport) {
        let _ = self.enforcement.set(report);
    }

    /// Sends the control request `make(id)` (a pause, a resume) and waits for its answer.
    pub(crate) async fn control(
        &self,
        verb: &'static str,
        make: impl FnOnce(u64) -> SessionRequest,
    ) -> Result<(), smithers_runtime::RuntimeError> {
        use smithers_runtime::RuntimeError;
        use smithers_sandbox_init::plan::SessionReport;
        let Some(channel) = self.channel() else {
            return Err(RuntimeError::OutOfOrder {
                verb,
                reason: "the sandbox is not running (stopped)".into(),
            });
        };
        let id = self.next_id();
        let mut answers = channel.register(id);
        let sent = channel.send(&make(id), &[]).await;
        // P1 answers within its own bound (see `CONTROL_WAIT`).
        let answer = match sent {
            Ok(()) => tokio::time::timeout(CONTROL_WAIT, answers.recv())
                .await
                .ok()
                .flatten(),
            Err(e) => {
                channel.unregister(id);
                return Err(RuntimeError::spawn(format!("{verb} the sandbox"), e));
            }
        };
        channel.unregister(id);
        match answer {
            Some(
                SessionReport::Paused { .. }
                | SessionReport::Resumed { .. }
                | SessionReport::HandedOver { .. }
                | SessionReport::Respawned { .. },
            ) => Ok(()),
            // A handover is refused while a command runs (or a process would not stop).
            Some(SessionReport::Refused { message, .. }) if verb == "checkpoint" => {
                Err(RuntimeError::Busy {
                    verb,
                    reason: message,
                })
            }
            Some(SessionReport::Refused { message, .. }) => {
                Err(RuntimeError::spawn(format!("{verb} the sandbox"), message))
            }
            _ => Err(RuntimeError::spawn(
                format!("{verb} the sandbox"),
                "the sandbox's init did not answer",
            )),
        }
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Ends the sandbox: `stop` on the channel (P1 kills everything and exits), then `k` to
    /// P0, then the init and the cgroups killed from here, each only if the one before did not
    /// end it within [`STOP_GRACE`]. Returns once every process is gone (the control socket
    /// ended), and stops the egress engine.
    pub(crate) async fn kill(&self) {
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
        let summary = match engine {
            Some(engine) => Some(engine.stop().await),
            None => None,
        };
        self.record_end(summary.as_ref());
        let child = self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut child) = child {
            let _ = child.wait().await;
        }
    }

    /// Writes how the sandbox's life ended for `collect`, as a step's execute does: its log
    /// (the egress decisions, the enforcement record, an exit record) and its outcome. A
    /// sandbox stopped by its caller ended well (exit 0): each of its commands' own ends
    /// were its caller's to see; one whose step was a command of its own ended as it did. One that never became ready records nothing (it had no
    /// life; `start` failed). A session's commands write no log of their own.
    fn record_end(&self, egress: Option<&smithers_egress::Summary>) {
        let Some(enforcement) = self.enforcement.get().cloned() else {
            return;
        };
        let lines = egress.map(crate::egress::log_lines).unwrap_or_default();
        let step = self
            .step_end
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let life = match &step {
            Some(exit) => ExecOutcome {
                signal: exit.signal,
                stdout_bytes: exit.stdout_bytes,
                stderr_bytes: exit.stderr_bytes,
                ..ExecOutcome::of_life(exit.termination, exit.exit_code, self.started.elapsed())
            },
            None => ExecOutcome::of_life(Termination::Exited, Some(0), self.started.elapsed()),
        };
        let outcome = ExecOutcome {
            enforcement,
            egress: egress.and_then(|s| serde_json::to_value(s).ok()),
            ..life
        };
        // A log that cannot be written is the bundle's loss, not the stop's: collect then
        // has no outcome and the bundle says the sandbox failed; the denials file still
        // holds the refusals.
        let _ = crate::exec::persist_outcome(&self.backend, &outcome, lines, None);
    }
}
