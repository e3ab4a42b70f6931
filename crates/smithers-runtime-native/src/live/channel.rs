//! The runtime's end of a session's exec channel (see `smithers_sandbox_init::channel`):
//! requests go out with their descriptors; one reader task takes every report and hands it to
//! the exec it names.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use smithers_sandbox_init::channel;
use smithers_sandbox_init::plan::{SessionReport, SessionRequest, MAX_SESSION_MESSAGE};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;

/// A live sandbox's exec channel.
#[derive(Debug)]
pub(crate) struct Channel {
    fd: AsyncFd<OwnedFd>,
    /// The running execs' report queues, by id.
    waiters: Mutex<HashMap<u64, UnboundedSender<SessionReport>>>,
    /// The masters of commands' terminals, by exec id, from their `terminal` report until
    /// the exec takes them.
    terminals: Mutex<HashMap<u64, OwnedFd>>,
    /// The channel ended: P1 is gone (stopped, killed, or the sandbox died).
    pub(crate) closed: CancellationToken,
}

impl Channel {
    /// Takes the runtime's end of the channel (made non-blocking) and starts its reader.
    pub(crate) fn start(fd: OwnedFd) -> std::io::Result<Arc<Channel>> {
        set_nonblocking(&fd)?;
        let channel = Arc::new(Channel {
            // SAFETY: an OwnedFd's `as_raw_fd` is its one descriptor, open until the AsyncFd
            // (which owns it) is dropped.
            fd: unsafe { AsyncFd::register(fd) }.map_err(std::io::Error::from)?,
            waiters: Mutex::new(HashMap::new()),
            terminals: Mutex::new(HashMap::new()),
            closed: CancellationToken::new(),
        });
        tokio::spawn(channel.clone().read_reports());
        Ok(channel)
    }

    /// The queue of exec `id`'s reports, made before its request is sent. It ends (`None`)
    /// when the channel does.
    pub(crate) fn register(&self, id: u64) -> UnboundedReceiver<SessionReport> {
        let (tx, rx) = unbounded_channel();
        if !self.closed.is_cancelled() {
            self.lock().insert(id, tx);
        }
        rx
    }

    pub(crate) fn unregister(&self, id: u64) {
        self.lock().remove(&id);
        self.lock_terminals().remove(&id);
    }

    /// The master of exec `id`'s terminal, once its `terminal` report came.
    pub(crate) fn take_terminal(&self, id: u64) -> Option<OwnedFd> {
        self.lock_terminals().remove(&id)
    }

    fn lock_terminals(&self) -> std::sync::MutexGuard<'_, HashMap<u64, OwnedFd>> {
        self.terminals.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, UnboundedSender<SessionReport>>> {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends one request with `fds` attached.
    pub(crate) async fn send(
        &self,
        request: &SessionRequest,
        fds: &[RawFd],
    ) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(request).map_err(std::io::Error::other)?;
        if bytes.len() > MAX_SESSION_MESSAGE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "the command and its environment take {} bytes, over the {MAX_SESSION_MESSAGE} a session's command may",
                    bytes.len()
                ),
            ));
        }
        loop {
            let mut ready = self.fd.writable().await?;
            let sent =
                ready.try_io(|fd| channel::send(fd.as_raw_fd(), &bytes, fds, libc::MSG_DONTWAIT));
            match sent {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// Reads reports until the channel ends, handing each to its exec; at the end every
    /// waiter's queue is closed.
    async fn read_reports(self: Arc<Self>) {
        let mut buf = vec![0u8; MAX_SESSION_MESSAGE];
        loop {
            let datagram = match self.fd.readable().await {
                Ok(mut ready) => match ready
                    .try_io(|fd| channel::recv(fd.as_raw_fd(), &mut buf, libc::MSG_DONTWAIT))
                {
                    Ok(result) => result,
                    Err(_would_block) => continue,
                },
                Err(e) => Err(e),
            };
            let Ok(Some(datagram)) = datagram else {
                break;
            };
            // P1 sends a descriptor only with a `terminal` report (its master, kept for a
            // running exec that waits for it); any other is closed with the datagram.
            let Ok(report) = serde_json::from_slice::<SessionReport>(&datagram.bytes) else {
                continue;
            };
            if let (SessionReport::Terminal { id }, [_]) = (&report, &datagram.fds[..]) {
                if self.lock().contains_key(id) {
                    let mut fds = datagram.fds;
                    self.lock_terminals().insert(*id, fds.remove(0));
                }
            }
            self.dispatch(report);
        }
        self.lock().clear();
        self.closed.cancel();
    }

    fn dispatch(&self, report: SessionReport) {
        let id = match &report {
            SessionReport::Started { id, .. }
            | SessionReport::Terminal { id }
            | SessionReport::Exit { id, .. }
            | SessionReport::Paused { id }
            | SessionReport::Resumed { id }
            | SessionReport::HandedOver { id }
            | SessionReport::Respawned { id } => Some(*id),
            SessionReport::Refused { id, .. } => *id,
            // `stop`'s end is the channel's and the control socket's (see `Live::kill`).
            SessionReport::Stopped => return,
        };
        // A report that names no exec waiting for it answers a request this runtime did not
        // make (P1 refuses only malformed ones, which it never sends) or one whose exec
        // already gave up (a refusal of a signal sent after its exit): nobody is waiting for
        // it, so it goes.
        let waiter = id.and_then(|id| self.lock().get(&id).cloned());
        if let Some(tx) = waiter {
            let _ = tx.send(report);
        }
    }
}

pub(crate) fn set_nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor we own, reading its status flags.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fcntl on a descriptor we own, setting its status flags.
    let set = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) };
    if set < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
