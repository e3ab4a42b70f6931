//! Where a session command's output goes: the client's own stdout and stderr (descriptors it
//! sent), byte for byte as the command wrote them; or, for what the holder reads itself (a
//! file command's error), a bounded capture.

use std::fs::File;
use std::io::Write;
use std::sync::Mutex;

use smithers_runtime::output::OutputStream;
use smithers_runtime::{OutputEvent, OutputSink};

/// Writes each stream to its descriptor. A reader that went away (EPIPE) takes nothing more
/// of that stream; the command goes on, as it would writing into a closed pipe of its own.
pub struct FdSink {
    out: Mutex<Option<File>>,
    err: Mutex<Option<File>>,
}

impl FdSink {
    pub fn new(out: File, err: File) -> FdSink {
        FdSink {
            out: Mutex::new(Some(out)),
            err: Mutex::new(Some(err)),
        }
    }
}

impl OutputSink for FdSink {
    fn event(&self, event: OutputEvent) {
        let OutputEvent::Output { stream, bytes, .. } = event else {
            return;
        };
        let target = match stream {
            OutputStream::Stdout => &self.out,
            OutputStream::Stderr => &self.err,
        };
        let mut target = target.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(file) = target.as_mut() {
            if file.write_all(&bytes).is_err() {
                *target = None;
            }
        }
    }
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
    /// `out`: where stdout goes (`None`: nowhere).
    pub fn new(out: Option<File>) -> Capture {
        let devnull = || File::open("/dev/null").ok();
        Capture {
            out: out.and_then(|o| Some(FdSink::new(o, devnull()?))),
            err: Mutex::new(Vec::new()),
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
}
