//! The output pump: reads the container's multiplexed stdout/stderr from the attach stream,
//! relays every byte to the live sink as written ([`OutputEvent::Output`]), and keeps what
//! the caps allow of each stream in the NDJSON log with the line events
//! ([`smithers_runtime::output::Capture`], the native runtime's records); past a cap the rest
//! is counted, not kept, and the container never blocks on a full pipe.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use bollard::container::LogOutput;
use futures_util::{Stream, StreamExt};
use serde_json::json;
use smithers_runtime::output::{Capture, Kept};
use smithers_runtime::{ExecOutcome, OutputEvent, OutputSink, OutputStream, RuntimeError};
use tokio_util::sync::CancellationToken;

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

/// The caps of what the log keeps, per stream.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caps {
    pub bytes: u64,
    pub lines: u64,
}

#[derive(Debug)]
pub(crate) struct Pump {
    log: BufWriter<File>,
    log_path: std::path::PathBuf,
    out: Capture,
    err: Capture,
    /// Fired when a stream passes a cap, for a step that fails on it (`failOnOutputCap`).
    over: Option<CancellationToken>,
}

impl Pump {
    pub fn new(
        log_path: &Path,
        caps: Caps,
        over: Option<CancellationToken>,
    ) -> Result<Pump, RuntimeError> {
        let file =
            File::create(log_path).map_err(|e| RuntimeError::io("create log", log_path, e))?;
        Ok(Pump {
            log: BufWriter::new(file),
            log_path: log_path.to_path_buf(),
            out: Capture::new(OutputStream::Stdout, caps.bytes, caps.lines, true),
            err: Capture::new(OutputStream::Stderr, caps.bytes, caps.lines, false),
            over,
        })
    }

    fn io(&self, e: std::io::Error) -> RuntimeError {
        RuntimeError::io("write log", &self.log_path, e)
    }

    fn write_record(&mut self, record: &serde_json::Value) -> Result<(), RuntimeError> {
        serde_json::to_writer(&mut self.log, record).map_err(|e| self.io(e.into()))?;
        self.log.write_all(b"\n").map_err(|e| self.io(e))
    }

    /// Writes the kept pieces to the log and tells the sink their lines.
    fn keep(
        &mut self,
        stream: OutputStream,
        kept: Vec<Kept>,
        sink: &dyn OutputSink,
    ) -> Result<(), RuntimeError> {
        for k in kept {
            self.write_record(&k.record)?;
            let timestamp_ms = k.record["timestampMs"].as_u64().unwrap_or(0);
            let line = k.line;
            sink.event(match stream {
                OutputStream::Stdout => OutputEvent::Stdout { line, timestamp_ms },
                OutputStream::Stderr => OutputEvent::Stderr { line, timestamp_ms },
            });
        }
        Ok(())
    }

    fn feed(
        &mut self,
        stream: OutputStream,
        bytes: &[u8],
        sink: &dyn OutputSink,
    ) -> Result<(), RuntimeError> {
        let ts = now_ms();
        // Every byte, past the caps too: the caps bound what is kept, not the step.
        sink.event(OutputEvent::Output {
            stream,
            bytes: bytes.to_vec(),
            timestamp_ms: ts,
        });
        let capture = match stream {
            OutputStream::Stdout => &mut self.out,
            OutputStream::Stderr => &mut self.err,
        };
        let mut kept = Vec::new();
        if capture.feed(bytes, ts, &mut kept) {
            if let Some(over) = &self.over {
                over.cancel();
            }
        }
        self.keep(stream, kept, sink)
    }

    /// Adds a runtime note to stderr (e.g. the engine's reason a command could not start).
    pub fn note_stderr(&mut self, sink: &dyn OutputSink, text: &str) {
        let mut bytes = text.as_bytes().to_vec();
        bytes.push(b'\n');
        let _ = self.feed(OutputStream::Stderr, &bytes, sink);
    }

    fn feed_item(&mut self, item: LogOutput, sink: &dyn OutputSink) -> Result<(), RuntimeError> {
        match item {
            LogOutput::StdOut { message } | LogOutput::Console { message } => {
                self.feed(OutputStream::Stdout, &message, sink)
            }
            LogOutput::StdErr { message } => self.feed(OutputStream::Stderr, &message, sink),
            LogOutput::StdIn { .. } => Ok(()),
        }
    }

    /// Reads until the stream ends or `stop` fires, then flushes partial lines. `released`
    /// fires once the step is over or being ended: until then each read waits for the sink's
    /// room (a follower behind holds the step back, as a full pipe would).
    pub async fn run(
        &mut self,
        mut stream: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
        sink: &dyn OutputSink,
        stop: CancellationToken,
        released: CancellationToken,
    ) -> Result<Pumped, RuntimeError> {
        loop {
            if !released.is_cancelled() {
                tokio::select! {
                    _ = sink.room() => {}
                    _ = released.cancelled() => {}
                    _ = stop.cancelled() => {}
                }
            }
            let item = tokio::select! {
                item = stream.next() => item,
                _ = stop.cancelled() => break,
            };
            match item {
                None => break,
                Some(Ok(item)) => self.feed_item(item, sink)?,
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
            self.feed_item(item, sink)?;
        }
        self.finish(sink)
    }

    /// Flushes partial lines, the truncation records and the log file; returns the counts.
    pub fn finish(&mut self, sink: &dyn OutputSink) -> Result<Pumped, RuntimeError> {
        for stream in [OutputStream::Stdout, OutputStream::Stderr] {
            let capture = match stream {
                OutputStream::Stdout => &mut self.out,
                OutputStream::Stderr => &mut self.err,
            };
            let mut kept = Vec::new();
            let truncated = capture.finish(now_ms(), &mut kept);
            self.keep(stream, kept, sink)?;
            if let Some(record) = truncated {
                self.write_record(&record)?;
            }
        }
        self.log.flush().map_err(|e| self.io(e))?;
        Ok(Pumped {
            stdout_bytes: self.out.total(),
            stderr_bytes: self.err.total(),
            stdout_truncated: self.out.truncated(),
            stderr_truncated: self.err.truncated(),
            stdout: self.out.copy().to_vec(),
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

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
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

    impl Collect {
        fn relayed(&self, which: OutputStream) -> Vec<u8> {
            let mut out = Vec::new();
            for e in self.0.lock().unwrap().iter() {
                if let OutputEvent::Output { stream, bytes, .. } = e {
                    if *stream == which {
                        out.extend_from_slice(bytes);
                    }
                }
            }
            out
        }
    }

    fn caps(bytes: u64) -> Caps {
        Caps {
            bytes,
            lines: 100_000,
        }
    }

    #[test]
    fn caps_and_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log.ndjson");
        let sink = Collect::default();
        let mut p = Pump::new(&log, caps(10), None).unwrap();
        p.feed(OutputStream::Stdout, b"abc\nde", &sink).unwrap();
        p.feed(OutputStream::Stdout, b"f\n0123456789", &sink)
            .unwrap();
        p.feed(OutputStream::Stderr, b"err\n", &sink).unwrap();
        let r = p.finish(&sink).unwrap();
        assert_eq!(r.stdout_bytes, 18);
        assert!(r.stdout_truncated);
        assert!(!r.stderr_truncated);
        assert_eq!(r.stdout, b"abc\ndef\n01");
        assert_eq!(sink.relayed(OutputStream::Stdout), b"abc\ndef\n0123456789");
        let lines: Vec<String> = sink
            .0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                OutputEvent::Stdout { line, .. } => Some(format!("o:{line}")),
                OutputEvent::Stderr { line, .. } => Some(format!("e:{line}")),
                _ => None,
            })
            .collect();
        assert_eq!(lines, vec!["o:abc", "o:def", "e:err", "o:01"]);
        let text = std::fs::read_to_string(&log).unwrap();
        // Four lines, and the truncation record of stdout.
        assert_eq!(text.lines().count(), 5);
        for l in text.lines() {
            serde_json::from_str::<serde_json::Value>(l).unwrap();
        }
        assert!(text.contains(r#""notKeptBytes":8"#), "{text}");
    }

    /// A flood of newlines under the byte cap is cut at the line cap in the log, said once,
    /// in one linear pass, and relayed whole.
    #[test]
    fn a_newline_flood_is_capped_in_the_log_and_relayed_whole() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log.ndjson");
        let sink = Collect::default();
        let over = CancellationToken::new();
        let mut p = Pump::new(&log, caps(10 << 20), Some(over.clone())).unwrap();
        let flood = vec![b'\n'; 1_000_000];
        for chunk in flood.chunks(256 << 10) {
            p.feed(OutputStream::Stdout, chunk, &sink).unwrap();
        }
        p.feed(OutputStream::Stderr, b"still here\n", &sink)
            .unwrap();
        let r = p.finish(&sink).unwrap();
        assert!(over.is_cancelled(), "told, for failOnOutputCap");
        assert_eq!(r.stdout_bytes, 1_000_000);
        assert!(r.stdout_truncated && !r.stderr_truncated);
        assert_eq!(sink.relayed(OutputStream::Stdout), flood);
        let events = sink.0.lock().unwrap();
        let out = events
            .iter()
            .filter(|e| matches!(e, OutputEvent::Stdout { .. }))
            .count();
        assert_eq!(out, 100_000);
        assert!(events
            .iter()
            .any(|e| matches!(e, OutputEvent::Stderr { line, .. } if line == "still here")));
        let text = std::fs::read_to_string(&log).unwrap();
        let cut: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("outputTruncated"))
            .collect();
        assert_eq!(cut.len(), 1, "{cut:?}");
        assert!(cut[0].contains(r#""notKeptLines":900000"#), "{cut:?}");
        assert_eq!(text.lines().count(), 100_000 + 2);
    }
}
