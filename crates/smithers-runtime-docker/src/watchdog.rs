//! The watchdog process of a running container: the `smithers-docker-watchdog` binary,
//! which kills the container if this process dies while it runs (a step's `execute`, or a
//! started sandbox from `start` to `stop`).

use std::path::Path;
use std::time::Duration;

use smithers_runtime::RuntimeError;

/// A running watchdog process; dropping it without [`Watchdog::dismiss`] closes its stdin,
/// which makes it kill the container (right on every error path: the step must not outlive
/// a failed execute).
#[derive(Debug)]
pub(crate) struct Watchdog {
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
}

impl Watchdog {
    /// The container is stopped: tell the watchdog to exit without killing, and reap it.
    pub(crate) async fn dismiss(mut self) {
        use tokio::io::AsyncWriteExt;
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"done\n").await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

pub(crate) fn spawn_watchdog(bin: &Path, socket: &str, id: &str) -> Result<Watchdog, RuntimeError> {
    let mut child = tokio::process::Command::new(bin)
        .arg(socket)
        .arg(id)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        // Its own process group: a signal to the orchestrator's group must not reach it.
        .process_group(0)
        .kill_on_drop(false)
        .spawn()
        .map_err(|e| RuntimeError::spawn(format!("start the watchdog {}", bin.display()), e))?;
    let stdin = child.stdin.take();
    Ok(Watchdog { child, stdin })
}
