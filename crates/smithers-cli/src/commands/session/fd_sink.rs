//! Where a session command's output goes: the client's own stdout and stderr (descriptors it
//! sent), byte for byte as the command wrote them; or, for what the holder reads itself (a
//! file command's error), a bounded capture.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};

use smithers_runtime::output::OutputStream;
use smithers_runtime::{CancellationToken, OutputEvent, OutputSink, Room};
use tokio::sync::Notify;

/// Output queued for one descriptor beyond which the command waits (its pipe fills), as it
/// would writing into a slow reader's pipe of its own.
const WINDOW_BYTES: usize = 1 << 20;

/// Writes each stream to its descriptor, byte for byte, on a thread of its own: a reader that
/// is slow slows the command down (`room`), and one that blocks for good never holds the
/// holder, whose commands are still cancelled (the client gone, the session ending). A
/// descriptor in non-blocking mode is waited on, never taken as gone. A reader that went away
/// (EPIPE, any write error) ends the command, as SIGPIPE would end it writing into its own
/// pipe.
pub struct FdSink {
    out: Writer,
    err: Writer,
    cancel: CancellationToken,
}

impl FdSink {
    /// `cancel`: the command's (cancelled here when a reader goes away).
    pub fn new(out: File, err: File, cancel: CancellationToken) -> FdSink {
        FdSink {
            out: Writer::start(out, cancel.clone()),
            err: Writer::start(err, cancel.clone()),
            cancel,
        }
    }

    /// Waits until everything queued is written (the command has ended): the answer then
    /// comes after its output. A writer stuck on a reader that never reads is left behind
    /// when the command was cancelled.
    pub fn finish(self) {
        let cancelled = self.cancel.is_cancelled();
        for writer in [self.out, self.err] {
            if let Some(thread) = writer.close() {
                if !cancelled {
                    let _ = thread.join();
                }
            }
        }
    }
}

impl OutputSink for FdSink {
    fn event(&self, event: OutputEvent) {
        let OutputEvent::Output { stream, bytes, .. } = event else {
            return;
        };
        match stream {
            OutputStream::Stdout => self.out.push(bytes),
            OutputStream::Stderr => self.err.push(bytes),
        }
    }

    fn room(&self) -> Room<'_> {
        Box::pin(async move {
            self.out.room(&self.cancel).await;
            self.err.room(&self.cancel).await;
        })
    }
}

#[derive(Default)]
struct Queue {
    chunks: VecDeque<Vec<u8>>,
    bytes: usize,
    closed: bool,
    /// The descriptor failed: what comes is dropped.
    gone: bool,
}

type Shared = Arc<(Mutex<Queue>, Condvar)>;

/// One descriptor's writer: its thread starts with the first bytes (a command that writes
/// nothing costs no thread).
struct Writer {
    queue: Shared,
    drained: Arc<Notify>,
    /// The descriptor until the thread takes it, then the thread.
    state: Mutex<WriterState>,
    cancel: CancellationToken,
}

enum WriterState {
    Idle(File),
    Writing(std::thread::JoinHandle<()>),
    Done,
}

impl Writer {
    fn start(file: File, cancel: CancellationToken) -> Writer {
        Writer {
            queue: Arc::default(),
            drained: Arc::new(Notify::new()),
            state: Mutex::new(WriterState::Idle(file)),
            cancel,
        }
    }

    fn push(&self, bytes: Vec<u8>) {
        {
            let (lock, ready) = &*self.queue;
            let mut q = lock.lock().unwrap_or_else(|p| p.into_inner());
            if q.gone {
                return;
            }
            q.bytes += bytes.len();
            q.chunks.push_back(bytes);
            ready.notify_one();
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(*state, WriterState::Idle(_)) {
            let WriterState::Idle(file) = std::mem::replace(&mut *state, WriterState::Done) else {
                unreachable!("matched above")
            };
            let (q, d, c) = (
                self.queue.clone(),
                self.drained.clone(),
                self.cancel.clone(),
            );
            *state =
                WriterState::Writing(std::thread::spawn(move || write_queue(file, &q, &d, &c)));
        }
    }

    async fn room(&self, cancel: &CancellationToken) {
        loop {
            let notified = self.drained.notified();
            {
                let q = self.queue.0.lock().unwrap_or_else(|p| p.into_inner());
                if q.bytes <= WINDOW_BYTES || q.gone || cancel.is_cancelled() {
                    return;
                }
            }
            tokio::select! {
                _ = notified => {}
                _ = cancel.cancelled() => return,
            }
        }
    }

    /// Closes the queue; the thread, if one started, to join.
    fn close(&self) -> Option<std::thread::JoinHandle<()>> {
        let (lock, ready) = &*self.queue;
        lock.lock().unwrap_or_else(|p| p.into_inner()).closed = true;
        ready.notify_one();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *state, WriterState::Done) {
            WriterState::Writing(thread) => Some(thread),
            _ => None,
        }
    }
}

/// The writer thread: each chunk written whole, in order, until the queue is closed and
/// empty.
fn write_queue(mut file: File, queue: &Shared, drained: &Notify, cancel: &CancellationToken) {
    let (lock, ready) = &**queue;
    loop {
        let chunk = {
            let mut q = lock.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(chunk) = q.chunks.pop_front() {
                    break chunk;
                }
                if q.closed {
                    return;
                }
                q = ready.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        let written = write_whole(&mut file, &chunk, cancel);
        let mut q = lock.lock().unwrap_or_else(|p| p.into_inner());
        q.bytes -= chunk.len();
        if !written {
            q.gone = true;
            q.chunks.clear();
            q.bytes = 0;
            cancel.cancel();
        }
        drop(q);
        drained.notify_waiters();
    }
}

/// Writes `bytes` whole; a descriptor in non-blocking mode is waited on (until the command is
/// cancelled). False when the descriptor failed.
fn write_whole(file: &mut File, mut bytes: &[u8], cancel: &CancellationToken) -> bool {
    while !bytes.is_empty() {
        match file.write(bytes) {
            Ok(0) => return false,
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if cancel.is_cancelled() {
                    return false;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(_) => return false,
        }
    }
    true
}

/// The largest part of a stream a [`Capture`] keeps.
pub const CAPTURE_LIMIT: usize = 4096;

/// Stdout to a descriptor, stderr kept (its first [`CAPTURE_LIMIT`] bytes), for a command
/// whose errors the holder reports itself.
pub struct Capture {
    out: Option<FdSink>,
    err: Mutex<Vec<u8>>,
}

impl Capture {
    /// `out`: where stdout goes (`None`: nowhere); `cancel`: the command's.
    pub fn new(out: Option<File>, cancel: CancellationToken) -> Capture {
        let devnull = || File::options().write(true).open("/dev/null").ok();
        Capture {
            out: out.and_then(|o| Some(FdSink::new(o, devnull()?, cancel))),
            err: Mutex::new(Vec::new()),
        }
    }

    /// Waits until stdout is written (see [`FdSink::finish`]).
    pub fn finish(&mut self) {
        if let Some(out) = self.out.take() {
            out.finish();
        }
    }

    /// What the command wrote to stderr (bounded), as text with its controls escaped.
    pub fn stderr_text(&self) -> String {
        let err = self.err.lock().unwrap_or_else(|p| p.into_inner());
        crate::output::inert(String::from_utf8_lossy(&err).trim_end())
    }
}

impl OutputSink for Capture {
    fn event(&self, event: OutputEvent) {
        match event {
            OutputEvent::Output {
                stream: OutputStream::Stderr,
                bytes,
                ..
            } => {
                let mut err = self.err.lock().unwrap_or_else(|p| p.into_inner());
                let room = CAPTURE_LIMIT.saturating_sub(err.len());
                err.extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
            other => {
                if let Some(out) = &self.out {
                    out.event(other);
                }
            }
        }
    }

    fn room(&self) -> Room<'_> {
        match &self.out {
            Some(out) => out.room(),
            None => Box::pin(std::future::ready(())),
        }
    }
}
