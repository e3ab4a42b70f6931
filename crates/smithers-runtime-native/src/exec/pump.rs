//! A step's output stream, pumped: every byte relayed to the sink as it is read, what the caps
//! allow kept in the log.

use std::sync::Mutex;

use smithers_runtime::output::{Capture, Kept};
use smithers_runtime::{CancellationToken, OutputEvent, OutputSink, OutputStream};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::Notify;

use crate::clock::now_ms;

/// One stream's pump: relays every byte to the sink as it is read, and keeps what the caps
/// allow in the log ([`Capture`]).
pub(super) struct Pump<'a> {
    pub(super) sink: &'a dyn OutputSink,
    pub(super) log: &'a Mutex<Vec<String>>,
    /// Told when a stream passes a cap and the step is to be stopped for it.
    pub(super) over: &'a Notify,
    pub(super) max: u64,
    pub(super) max_lines: u64,
    /// `failOnOutputCap`: a cap ends the step.
    pub(super) fail_on_cap: bool,
    /// Fired once the step is over or being ended: the pump no longer waits for the sink's
    /// room (what is left is at most a pipe's buffer).
    pub(super) released: &'a CancellationToken,
}

impl Pump<'_> {
    fn keep(&self, kept: &mut Vec<Kept>, stream: OutputStream) {
        if kept.is_empty() {
            return;
        }
        if let Ok(mut log) = self.log.lock() {
            log.extend(kept.iter().map(|k| k.record.to_string()));
        }
        for k in kept.drain(..) {
            let timestamp_ms = k.record["timestampMs"].as_u64().unwrap_or(0);
            let line = k.line;
            self.sink.event(match stream {
                OutputStream::Stdout => OutputEvent::Stdout { line, timestamp_ms },
                OutputStream::Stderr => OutputEvent::Stderr { line, timestamp_ms },
            });
        }
    }

    pub(super) async fn run<R: AsyncRead + Unpin>(
        &self,
        mut reader: R,
        stream: OutputStream,
    ) -> Capture {
        let mut cap = Capture::new(
            stream,
            self.max,
            self.max_lines,
            stream == OutputStream::Stdout,
        );
        let mut kept = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // A sink whose reader is behind holds the step back, as a full pipe would.
            if !self.released.is_cancelled() {
                tokio::select! {
                    _ = self.sink.room() => {}
                    _ = self.released.cancelled() => {}
                }
            }
            let n = match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let ts = now_ms();
            // Every byte, past the caps too: the caps bound what is kept, not the step.
            self.sink.event(OutputEvent::Output {
                stream,
                bytes: buf[..n].to_vec(),
                timestamp_ms: ts,
            });
            if cap.feed(&buf[..n], ts, &mut kept) && self.fail_on_cap {
                self.over.notify_one();
            }
            self.keep(&mut kept, stream);
        }
        let truncated = cap.finish(now_ms(), &mut kept);
        self.keep(&mut kept, stream);
        if let (Some(record), Ok(mut log)) = (truncated, self.log.lock()) {
            log.push(record.to_string());
        }
        cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use smithers_runtime::output::OutputCap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    /// Counts line events, and the bytes relayed as written.
    #[derive(Default)]
    struct Count {
        lines: AtomicU64,
        relayed: Mutex<Vec<u8>>,
    }

    impl OutputSink for Count {
        fn event(&self, event: OutputEvent) {
            match event {
                OutputEvent::Output { bytes, .. } => {
                    self.relayed.lock().unwrap().extend_from_slice(&bytes)
                }
                _ => {
                    self.lines.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    struct Pumped {
        cap: Capture,
        lines: u64,
        relayed: Vec<u8>,
        log: Vec<Value>,
        over: bool,
    }

    /// Pumps `input` as stdout under caps of `max` bytes and `max_lines` lines.
    async fn pump_with(input: &[u8], max: u64, max_lines: u64, fail_on_cap: bool) -> Pumped {
        let sink = Count::default();
        let log = Mutex::new(Vec::new());
        let over = Notify::new();
        let released = CancellationToken::new();
        let pump = Pump {
            sink: &sink,
            log: &log,
            over: &over,
            max,
            max_lines,
            fail_on_cap,
            released: &released,
        };
        let cap = pump.run(input, OutputStream::Stdout).await;
        let told = tokio::time::timeout(Duration::from_millis(1), over.notified())
            .await
            .is_ok();
        Pumped {
            cap,
            lines: sink.lines.load(Ordering::Relaxed),
            relayed: sink.relayed.into_inner().unwrap(),
            log: log
                .into_inner()
                .unwrap()
                .iter()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect(),
            over: told,
        }
    }

    async fn pump(input: &[u8], max: u64) -> Pumped {
        pump_with(input, max, 100_000, false).await
    }

    fn truncation_records(log: &[Value]) -> Vec<&Value> {
        log.iter()
            .filter(|r| r["type"] == "outputTruncated")
            .collect()
    }

    #[tokio::test]
    async fn a_million_newlines_are_capped_in_the_log_and_relayed_whole() {
        let flood = vec![b'\n'; 1_000_000];
        // Under the byte cap: only the line cap can cut it.
        let p = pump(&flood, 2 << 20).await;
        assert!(p.cap.truncated());
        assert_eq!(p.cap.cap(), Some(OutputCap::Lines));
        assert_eq!(p.cap.total(), 1_000_000, "every byte is still read");
        assert_eq!(p.relayed, flood, "and relayed");
        assert_eq!(p.lines, 100_000);
        let lines = p.log.iter().filter(|r| r["type"] == "stdout").count();
        assert_eq!(lines, 100_000);
        let records = truncation_records(&p.log);
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(records[0]["cap"], "lines");
        assert_eq!(records[0]["stream"], "stdout");
        assert_eq!(records[0]["limit"], 100_000);
        assert_eq!(records[0]["notKeptLines"], 900_000);
        assert_eq!(records[0]["notKeptBytes"], 900_000);
        assert!(!p.over, "without failOnOutputCap the step goes on");
    }

    #[tokio::test]
    async fn the_byte_cap_is_named_as_bytes_and_stops_the_step_only_when_asked() {
        let flood = vec![b'x'; 10_000];
        let p = pump(&flood, 1000).await;
        assert!(p.cap.truncated());
        assert_eq!(p.cap.cap(), Some(OutputCap::Bytes));
        assert_eq!(p.relayed, flood);
        // The cut-off line is still one event.
        assert_eq!(p.lines, 1);
        let records = truncation_records(&p.log);
        assert_eq!(records.len(), 1);
        assert_eq!(records[0]["cap"], "bytes");
        assert_eq!(records[0]["limit"], 1000);
        assert_eq!(records[0]["notKeptBytes"], 9000);
        assert!(!p.over);
        assert!(pump_with(&flood, 1000, 100_000, true).await.over);
        assert!(pump_with(b"a\nb\nc\n", 1 << 20, 2, true).await.over);
    }

    #[tokio::test]
    async fn output_under_both_caps_is_unaffected() {
        let mut input = Vec::new();
        for i in 0..1000 {
            input.extend_from_slice(format!("{}\n", i % 10).as_bytes());
        }
        let p = pump_with(&input, 1 << 20, 1000, true).await;
        assert!(!p.cap.truncated(), "{:?}", p.cap.cap());
        assert_eq!(p.lines, 1000);
        assert!(truncation_records(&p.log).is_empty());
        assert_eq!(p.cap.copy(), input);
        assert!(!p.over);

        let p = pump(b"hello\nworld", 1 << 20).await;
        assert!(!p.cap.truncated());
        assert_eq!(p.lines, 2);
        assert_eq!(p.log[1]["partial"], true);
    }

    #[tokio::test]
    async fn bytes_that_are_not_utf8_are_relayed_and_logged_exactly() {
        let input = b"\xff\xfex";
        let p = pump(input, 1 << 20).await;
        assert_eq!(p.relayed, input);
        let mut replayed = Vec::new();
        for r in &p.log {
            replayed.extend(smithers_runtime::output::record_bytes(r).unwrap().1);
        }
        assert_eq!(replayed, input);
    }
}
