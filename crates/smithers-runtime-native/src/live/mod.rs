//! Sandboxes started through the engine and not yet stopped: their init's control socket
//! and exec channel, their base command and egress engine, and how they are ended. Kept by
//! the runtime ([`crate::runtime::NativeRuntime`]), used by the engine's verbs.

pub(crate) mod channel;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use smithers_runtime::CancellationToken;
use smithers_sandbox_init::plan::{ExecSpec, SessionRequest};

use crate::backend::Backend;

use channel::Channel;

/// How long `stop` waits for the sandbox's processes to be gone before it kills harder.
const STOP_GRACE: Duration = Duration::from_secs(5);

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
        }
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
        if let Some(engine) = engine {
            let summary = engine.stop().await;
            self.append_to_log(&crate::egress::log_lines(&summary));
        }
        let child = self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut child) = child {
            let _ = child.wait().await;
        }
    }

    /// Adds `lines` to the sandbox's NDJSON log (what collect puts in the bundle), which a
    /// session's execs do not write: the egress decisions of its life go there at its end.
    fn append_to_log(&self, lines: &[String]) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        if lines.is_empty() {
            return;
        }
        let mut text = lines.join("\n");
        text.push('\n');
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.backend.log_file());
        // A log that cannot be written is the bundle's loss, not the stop's: collect then
        // has no decision records, and the denials file still holds the refusals.
        if let Ok(mut file) = file {
            let _ = file.write_all(text.as_bytes());
        }
    }
}
