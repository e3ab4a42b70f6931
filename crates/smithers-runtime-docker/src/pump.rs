//! The output pump: reads the container's multiplexed stdout/stderr from the attach stream,
//! keeps at most `max_output_bytes` of each (truncation recorded, the rest drained and
//! counted so the container never blocks on a full pipe), writes the NDJSON log and feeds
//! the live sink line by line.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use bollard::container::LogOutput;
use futures_util::{Stream, StreamExt};
use serde_json::json;
use smithers_runtime::{ExecOutcome, OutputEvent, OutputSink, RuntimeError};
use tokio_util::sync::CancellationToken;

use crate::now_ms;

/// A line longer than this is emitted in pieces, so one endless line cannot grow a buffer.
const MAX_LINE_BYTES: usize = 64 * 1024;

/// Most output events (lines) kept per stream, as the native runtime keeps: the byte cap
/// alone does not bound them (a megabyte of newlines is a million events, each a log record
/// and a message to every follower).
pub(crate) const MAX_OUTPUT_EVENTS: u64 = 100_000;

#[derive(Debug, Default)]
struct StreamState {
    total: u64,
    kept: u64,
    truncated: bool,
    /// Events emitted so far.
    events: u64,
    /// The event cap was hit (and said in the log).
    events_capped: bool,
    partial: Vec<u8>,
}

/// What the pump saw.
#[derive(Debug, Default, Clone)]
pub(crate) struct Pumped {
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// The kept stdout (at most the cap), for a result JSON printed on stdout.
    pub stdout: Vec<u8>,
}

#[derive(Debug)]
pub(crate) struct Pump {
    cap: u64,
    log: BufWriter<File>,
    log_path: std::path::PathBuf,
    out: StreamState,
    err: StreamState,
    stdout: Vec<u8>,
}

#[derive(Clone, Copy)]
enum Which {
    Out,
    Err,
}

impl Pump {
    pub fn new(log_path: &Path, cap: u64) -> Result<Pump, RuntimeError> {
        let file =
            File::create(log_path).map_err(|e| RuntimeError::io("create log", log_path, e))?;
        Ok(Pump {
            cap,
            log: BufWriter::new(file),
            log_path: log_path.to_path_buf(),
            out: StreamState::default(),
            err: StreamState::default(),
            stdout: Vec::new(),
        })
    }

    fn io(&self, e: std::io::Error) -> RuntimeError {
        RuntimeError::io("write log", &self.log_path, e)
    }

    fn emit(
        &mut self,
        which: Which,
        line: &[u8],
        sink: &dyn OutputSink,
    ) -> Result<(), RuntimeError> {
        let line = String::from_utf8_lossy(line).into_owned();
        let ts = now_ms();
        let event = match which {
            Which::Out => OutputEvent::Stdout {
                line,
                timestamp_ms: ts,
            },
            Which::Err => OutputEvent::Stderr {
                line,
                timestamp_ms: ts,
            },
        };
        // The local runtime's record shape: {"type", "timestampMs", "line"}.
        let (kind, line) = match &event {
            OutputEvent::Stdout { line, .. } => ("stdout", line),
            OutputEvent::Stderr { line, .. } => ("stderr", line),
            OutputEvent::Heartbeat { .. } => ("heartbeat", &String::new()),
            // Not made by this runtime (it refuses egress policies); named for what it is.
            OutputEvent::Egress { .. } => ("egress", &String::new()),
        };
        let rec = json!({"type": kind, "timestampMs": ts, "line": line});
        serde_json::to_writer(&mut self.log, &rec).map_err(|e| self.io(e.into()))?;
        self.log.write_all(b"\n").map_err(|e| self.io(e))?;
        sink.event(event);
        Ok(())
    }

    fn feed(
        &mut self,
        which: Which,
        bytes: &[u8],
        sink: &dyn OutputSink,
    ) -> Result<(), RuntimeError> {
        let cap = self.cap;
        let st = match which {
            Which::Out => &mut self.out,
            Which::Err => &mut self.err,
        };
        st.total += bytes.len() as u64;
        let room = cap.saturating_sub(st.kept) as usize;
        let keep = &bytes[..bytes.len().min(room)];
        if keep.len() < bytes.len() {
            st.truncated = true;
        }
        st.kept += keep.len() as u64;
        if matches!(which, Which::Out) {
            self.stdout.extend_from_slice(keep);
        }
        let st = match which {
            Which::Out => &mut self.out,
            Which::Err => &mut self.err,
        };
        st.partial.extend_from_slice(keep);
        // Complete lines are cut from the front in one pass (never a copy of the rest per
        // line, which made a chunk of newlines quadratic); endless lines in pieces.
        let pending = std::mem::take(&mut st.partial);
        let mut start = 0;
        let mut lines: Vec<&[u8]> = Vec::new();
        loop {
            let rest = &pending[start..];
            match rest.iter().position(|b| *b == b'\n') {
                Some(pos) if pos <= MAX_LINE_BYTES => {
                    lines.push(&rest[..pos]);
                    start += pos + 1;
                }
                _ if rest.len() >= MAX_LINE_BYTES => {
                    lines.push(&rest[..MAX_LINE_BYTES]);
                    start += MAX_LINE_BYTES;
                }
                _ => break,
            }
        }
        for line in lines {
            self.emit_counted(which, line, sink)?;
        }
        let st = match which {
            Which::Out => &mut self.out,
            Which::Err => &mut self.err,
        };
        st.partial = pending[start..].to_vec();
        Ok(())
    }

    /// Emits `line` unless the stream's event cap is reached; the first line over it is
    /// recorded as an `outputTruncated` log record (the native runtime's shape) and marks the
    /// stream truncated.
    fn emit_counted(
        &mut self,
        which: Which,
        line: &[u8],
        sink: &dyn OutputSink,
    ) -> Result<(), RuntimeError> {
        let st = match which {
            Which::Out => &mut self.out,
            Which::Err => &mut self.err,
        };
        if st.events < MAX_OUTPUT_EVENTS {
            st.events += 1;
            return self.emit(which, line, sink);
        }
        if st.events_capped {
            return Ok(());
        }
        st.events_capped = true;
        st.truncated = true;
        let stream = match which {
            Which::Out => "stdout",
            Which::Err => "stderr",
        };
        let rec = json!({
            "type": "outputTruncated",
            "timestampMs": now_ms(),
            "stream": stream,
            "cap": "events",
            "limit": MAX_OUTPUT_EVENTS,
            "message": format!("{stream} cut off at the per-stream line limit ({MAX_OUTPUT_EVENTS} events)"),
        });
        serde_json::to_writer(&mut self.log, &rec).map_err(|e| self.io(e.into()))?;
        self.log.write_all(b"\n").map_err(|e| self.io(e))
    }

    /// Adds a runtime note to stderr (e.g. the engine's reason a command could not start).
    pub fn note_stderr(&mut self, sink: &dyn OutputSink, text: &str) {
        let mut bytes = text.as_bytes().to_vec();
        bytes.push(b'\n');
        let _ = self.feed(Which::Err, &bytes, sink);
    }

    /// Reads until the stream ends or `stop` fires, then flushes partial lines.
    pub async fn run(
        &mut self,
        mut stream: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
        sink: &dyn OutputSink,
        stop: CancellationToken,
    ) -> Result<Pumped, RuntimeError> {
        loop {
            let item = tokio::select! {
                item = stream.next() => item,
                _ = stop.cancelled() => break,
            };
            match item {
                None => break,
                Some(Ok(LogOutput::StdOut { message }))
                | Some(Ok(LogOutput::Console { message })) => {
                    self.feed(Which::Out, &message, sink)?
                }
                Some(Ok(LogOutput::StdErr { message })) => self.feed(Which::Err, &message, sink)?,
                Some(Ok(LogOutput::StdIn { .. })) => {}
                // A broken attach stream loses output but not the run: the outcome still comes
                // from the engine. Say so in the log.
                Some(Err(e)) => {
                    self.note_stderr(sink, &format!("[smithers] output stream error: {e}"));
                    break;
                }
            }
        }
        // Give a last chunk that raced the stop a moment (non-blocking otherwise).
        if let Ok(Some(Ok(item))) =
            tokio::time::timeout(Duration::from_millis(1), stream.next()).await
        {
            match item {
                LogOutput::StdOut { message } | LogOutput::Console { message } => {
                    self.feed(Which::Out, &message, sink)?
                }
                LogOutput::StdErr { message } => self.feed(Which::Err, &message, sink)?,
                LogOutput::StdIn { .. } => {}
            }
        }
        self.finish(sink)
    }

    /// Flushes partial lines and the log file; returns the counts.
    pub fn finish(&mut self, sink: &dyn OutputSink) -> Result<Pumped, RuntimeError> {
        for which in [Which::Out, Which::Err] {
            let st = match which {
                Which::Out => &mut self.out,
                Which::Err => &mut self.err,
            };
            if !st.partial.is_empty() {
                let line = std::mem::take(&mut st.partial);
                self.emit_counted(which, &line, sink)?;
            }
        }
        self.log.flush().map_err(|e| self.io(e))?;
        Ok(Pumped {
            stdout_bytes: self.out.total,
            stderr_bytes: self.err.total,
            stdout_truncated: self.out.truncated,
            stderr_truncated: self.err.truncated,
            stdout: std::mem::take(&mut self.stdout),
        })
    }

    /// A runtime note (a rejected result, a skipped artifact): never silently dropped.
    pub fn write_note(&mut self, message: &str) -> Result<(), RuntimeError> {
        let rec = json!({"type": "note", "timestampMs": now_ms(), "message": message});
        serde_json::to_writer(&mut self.log, &rec).map_err(|e| self.io(e.into()))?;
        self.log.write_all(b"\n").map_err(|e| self.io(e))
    }

    /// The last log records: what held (the enforcement report), then how the command ended
    /// (the local runtime's shape).
    pub fn write_exit(&mut self, o: &ExecOutcome) -> Result<(), RuntimeError> {
        let report =
            json!({"type": "enforcement", "timestampMs": now_ms(), "report": o.enforcement});
        serde_json::to_writer(&mut self.log, &report).map_err(|e| self.io(e.into()))?;
        self.log.write_all(b"\n").map_err(|e| self.io(e))?;
        let rec = json!({
            "type": "exit",
            "timestampMs": now_ms(),
            "termination": o.termination.as_str(),
            "exitCode": o.exit_code,
            "signal": o.signal,
            "durationMs": o.duration.as_millis() as u64,
            "stdoutBytes": o.stdout_bytes,
            "stderrBytes": o.stderr_bytes,
            "stdoutTruncated": o.stdout_truncated,
            "stderrTruncated": o.stderr_truncated,
            "usage": o.usage,
        });
        serde_json::to_writer(&mut self.log, &rec).map_err(|e| self.io(e.into()))?;
        self.log.write_all(b"\n").map_err(|e| self.io(e))?;
        self.log.flush().map_err(|e| self.io(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Collect(Mutex<Vec<OutputEvent>>);
    impl OutputSink for Collect {
        fn event(&self, e: OutputEvent) {
            self.0.lock().unwrap().push(e);
        }
    }

    #[test]
    fn caps_and_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log.ndjson");
        let sink = Collect::default();
        let mut p = Pump::new(&log, 10).unwrap();
        p.feed(Which::Out, b"abc\nde", &sink).unwrap();
        p.feed(Which::Out, b"f\n0123456789", &sink).unwrap();
        p.feed(Which::Err, b"err\n", &sink).unwrap();
        let r = p.finish(&sink).unwrap();
        assert_eq!(r.stdout_bytes, 18);
        assert!(r.stdout_truncated);
        assert!(!r.stderr_truncated);
        assert_eq!(r.stdout, b"abc\ndef\n01");
        let lines: Vec<String> = sink
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|e| match e {
                OutputEvent::Stdout { line, .. } => format!("o:{line}"),
                OutputEvent::Stderr { line, .. } => format!("e:{line}"),
                _ => String::new(),
            })
            .collect();
        assert_eq!(lines, vec!["o:abc", "o:def", "e:err", "o:01"]);
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text.lines().count(), 4);
        for l in text.lines() {
            serde_json::from_str::<serde_json::Value>(l).unwrap();
        }
    }

    /// A flood of newlines under the byte cap is cut at the event cap, said once in the log,
    /// in one linear pass (the old splitting copied the rest of the chunk per line).
    #[test]
    fn a_newline_flood_is_capped_in_events() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log.ndjson");
        let sink = Collect::default();
        let mut p = Pump::new(&log, 10 << 20).unwrap();
        let flood = vec![b'\n'; 1_000_000];
        for chunk in flood.chunks(256 << 10) {
            p.feed(Which::Out, chunk, &sink).unwrap();
        }
        p.feed(Which::Err, b"still here\n", &sink).unwrap();
        let r = p.finish(&sink).unwrap();
        assert_eq!(r.stdout_bytes, 1_000_000);
        assert!(r.stdout_truncated && !r.stderr_truncated);
        let events = sink.0.lock().unwrap();
        let out = events
            .iter()
            .filter(|e| matches!(e, OutputEvent::Stdout { .. }))
            .count();
        assert_eq!(out as u64, MAX_OUTPUT_EVENTS);
        assert!(events
            .iter()
            .any(|e| matches!(e, OutputEvent::Stderr { line, .. } if line == "still here")));
        let text = std::fs::read_to_string(&log).unwrap();
        let cut: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("outputTruncated"))
            .collect();
        assert_eq!(cut.len(), 1, "{cut:?}");
        assert_eq!(text.lines().count() as u64, MAX_OUTPUT_EVENTS + 2);
    }
}
