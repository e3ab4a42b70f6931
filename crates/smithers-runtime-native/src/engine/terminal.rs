//! `exec` on a terminal: the command runs on a pseudo-terminal of the sandbox's own devpts
//! (the spawner opens it, starts the command on its slave as its controlling terminal and
//! sends us the master). The master is relayed here: what the terminal shows goes to the sink
//! as stdout, exactly as given (filtering it for a person's terminal is the caller's, who
//! knows where it goes); the request's stdin is typed into it; each size the caller's window
//! takes is set on it, which the kernel tells the command's foreground group (SIGWINCH).

use std::io::Read as _;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use smithers_runtime::{
    CancellationToken, ExecRequest, OutputEvent, OutputSink, OutputStream, RuntimeError,
    TerminalRequest, TerminalSize,
};
use smithers_sandbox_init::plan::{ExecSpec, SessionReport};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc::{Receiver, UnboundedReceiver};

use super::exec::{not_running_because, read_now, send_exec, wait_for_exit, Ends};
use crate::clock::now_ms;
use crate::live::channel::Channel;
use crate::live::Live;

/// One exec on a terminal, its parts as `exec` has them.
pub(super) struct Exec<'a> {
    pub(super) live: &'a Live,
    pub(super) channel: &'a Arc<Channel>,
    pub(super) id: u64,
    pub(super) spec: ExecSpec,
    pub(super) request: &'a ExecRequest,
    pub(super) cancel: &'a CancellationToken,
    pub(super) sink: &'a dyn OutputSink,
}

impl Exec<'_> {
    pub(super) async fn run(
        self,
        terminal: TerminalRequest,
        reports: &mut UnboundedReceiver<SessionReport>,
    ) -> Result<Ends, RuntimeError> {
        send_exec(self.live, self.channel, self.id, self.spec, &[]).await?;
        // The master comes first, then the start (or the exit of a command that could not
        // start, whose reason is on the terminal).
        let master = match reports.recv().await {
            Some(SessionReport::Terminal { .. }) => {
                self.channel.take_terminal(self.id).ok_or_else(|| {
                    not_running_because("its terminal came without its master".into())
                })?
            }
            Some(SessionReport::Refused { message, .. }) => {
                return Err(RuntimeError::InvalidControl {
                    control: "terminal",
                    reason: message,
                })
            }
            Some(other) => {
                return Err(not_running_because(format!(
                    "its init answered a terminal's command with {other:?}"
                )))
            }
            None => return Err(not_running_because("its init is gone".into())),
        };
        let master = checked_master(master)?;
        let input = self.request.stdin.take().map(typed_input);
        let exited = CancellationToken::new();
        let end = wait_for_exit(
            self.channel,
            self.id,
            reports,
            self.request.timeout,
            self.cancel,
            &exited,
        );
        let relay = relay(master, input, terminal.size, self.sink, &exited);
        let (shown, end) = tokio::join!(relay, end);
        let (termination, exit_code, signal) = end?;
        Ok((termination, exit_code, signal, shown, 0))
    }
}

/// The master as received, checked to be one (a pseudo-terminal master answers TIOCGPTN;
/// nothing else does) and made non-blocking for the reactor.
fn checked_master(fd: OwnedFd) -> Result<AsyncFd<OwnedFd>, RuntimeError> {
    let bad = |what: String| not_running_because(format!("its terminal {what}"));
    let mut number: libc::c_uint = 0;
    // SAFETY: TIOCGPTN writes an unsigned int through a valid pointer; on a descriptor that
    // is not a pseudo-terminal master it fails and writes nothing.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGPTN, &mut number) } < 0 {
        return Err(bad("is not a pseudo-terminal master".into()));
    }
    crate::live::channel::set_nonblocking(&fd).map_err(|e| bad(e.to_string()))?;
    // SAFETY: an OwnedFd's `as_raw_fd` is its one descriptor, open until the AsyncFd (which
    // owns it) is dropped.
    unsafe { AsyncFd::register(fd) }.map_err(|e| bad(e.to_string()))
}

/// The caller's stream, read on a thread of its own (it may block for as long as it likes),
/// in chunks as they come; the thread ends at the stream's end or once nobody takes them.
fn typed_input(mut reader: smithers_runtime::types::StdinReader) -> Receiver<Vec<u8>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    });
    rx
}

/// Relays the master until the command has exited (then what it still holds is read): its
/// output to the sink, the input typed into it, its size set as it changes. Returns the bytes
/// relayed out.
async fn relay(
    master: AsyncFd<OwnedFd>,
    mut input: Option<Receiver<Vec<u8>>>,
    mut size: tokio::sync::watch::Receiver<TerminalSize>,
    sink: &dyn OutputSink,
    exited: &CancellationToken,
) -> u64 {
    let fd = master.as_raw_fd();
    let mut shown = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    let mut typed: Vec<u8> = Vec::new();
    // The slave side closed (no process has it open): nothing more to read, and a master
    // then polls readable for ever.
    let mut open = true;
    let mut watching = true;
    let emit = |bytes: &[u8], shown: &mut u64| {
        *shown += bytes.len() as u64;
        sink.event(OutputEvent::Output {
            stream: OutputStream::Stdout,
            bytes: bytes.to_vec(),
            timestamp_ms: now_ms(),
        });
    };
    loop {
        tokio::select! {
            biased;
            _ = exited.cancelled() => break,
            r = master.readable(), if open => {
                let Ok(mut ready) = r else { break };
                match read_now(fd, &mut buf) {
                    Ok(0) => open = false,
                    Ok(n) => {
                        emit(&buf[..n], &mut shown);
                        sink.room().await;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => ready.clear_ready(),
                    // EIO: no slave is open any more.
                    Err(_) => open = false,
                }
            }
            w = master.writable(), if !typed.is_empty() => {
                let Ok(mut ready) = w else { break };
                // SAFETY: writes from a valid buffer of its own length.
                let n = unsafe { libc::write(fd, typed.as_ptr().cast(), typed.len()) };
                if n > 0 {
                    typed.drain(..n as usize);
                } else if std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock {
                    ready.clear_ready();
                } else {
                    // The terminal takes no more input (it is closing): what was typed goes.
                    typed.clear();
                    input = None;
                }
            }
            chunk = recv(&mut input), if typed.is_empty() && input.is_some() => match chunk {
                Some(bytes) => typed = bytes,
                // The caller's stream ended: a terminal has no end of input to pass on
                // (Ctrl-D is the user's to type), so nothing more is typed.
                None => input = None,
            },
            changed = size.changed(), if watching => match changed {
                Ok(()) => {
                    let now = *size.borrow_and_update();
                    let _ = set_size(fd, now);
                }
                Err(_) => watching = false,
            },
        }
    }
    // What the command wrote before it ended is on its way: a terminal passes it on to the
    // master from a kernel worker, so it may come a moment after the exit. Read until the
    // terminal has no writer left (EIO), or is quiet for `QUIET`: what a process that
    // outlived the command writes later is not the command's.
    if open {
        loop {
            match read_now(fd, &mut buf) {
                Ok(n) if n > 0 => emit(&buf[..n], &mut shown),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    match tokio::time::timeout(QUIET, master.readable()).await {
                        Ok(Ok(mut ready)) => ready.clear_ready(),
                        _ => break,
                    }
                }
                _ => break,
            }
        }
    }
    shown
}

/// How long a terminal stays quiet after its command's exit before its relay ends.
const QUIET: std::time::Duration = std::time::Duration::from_millis(25);

async fn recv(input: &mut Option<Receiver<Vec<u8>>>) -> Option<Vec<u8>> {
    match input {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Sets the terminal's size on its master.
fn set_size(fd: std::os::fd::RawFd, size: TerminalSize) -> std::io::Result<()> {
    let ws = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize through a valid pointer.
    if unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
