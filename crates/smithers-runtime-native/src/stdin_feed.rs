//! The command's stdin from the caller's stream (`echo x | smithers-sandbox run -- wc`): a
//! FIFO in the sandbox's request directory, which the init opens as the command's stdin
//! (read-only, the plan's `exec.stdin`), fed by a thread that copies the caller's reader into
//! it as the command reads. The command gets a pipe and nothing else: no descriptor of the
//! caller's file or terminal crosses into the sandbox (a file's descriptor could be reopened
//! for writing through `/proc/self/fd`).

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The FIFO's name in the host's request directory (bound at `plan::paths::STDIN_FIFO`).
pub(crate) const FIFO_NAME: &str = "stdin";

/// A running feed; dropping it (when `execute` returns) stops a feeder still waiting for the
/// command to open its end.
pub(crate) struct StdinFeed {
    done: Arc<AtomicBool>,
    fifo: PathBuf,
}

impl Drop for StdinFeed {
    /// Also removes the FIFO: a node left in the sandbox's request directory would block
    /// whatever opened it later (a second execute's step, say).
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        let _ = std::fs::remove_file(&self.fifo);
    }
}

fn mkfifo(path: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid C string; mkfifo only creates a file system node.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the FIFO in `request_dir` and starts copying `reader` into it.
pub(crate) fn start(
    request_dir: &Path,
    mut reader: Box<dyn Read + Send>,
) -> std::io::Result<StdinFeed> {
    let fifo: PathBuf = request_dir.join(FIFO_NAME);
    match std::fs::remove_file(&fifo) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    mkfifo(&fifo)?;
    let done = Arc::new(AtomicBool::new(false));
    let stop = done.clone();
    let path = fifo.clone();
    std::thread::Builder::new()
        .name("stdin-feed".into())
        .spawn(move || {
            // Opening a FIFO for writing blocks until a reader opens it; a non-blocking open
            // instead fails (ENXIO) until then, so the wait can end when execute does.
            let file = loop {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                match std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                    .open(&path)
                {
                    Ok(f) => break f,
                    Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(_) => return,
                }
            };
            // Blocking writes from here: the command reads at its pace.
            // SAFETY: fcntl on our own open descriptor, clearing O_NONBLOCK.
            unsafe {
                let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
                if flags >= 0 {
                    libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
                }
            }
            let mut file = file;
            // Ends at the caller's EOF (closing our end: the command reads EOF), or at EPIPE
            // when every reader is gone (the command closed stdin, or the sandbox ended).
            let _ = std::io::copy(&mut reader, &mut file);
        })?;
    Ok(StdinFeed { done, fifo })
}
