//! A step's output as the bundle's log keeps it: the record shapes, and [`Capture`], the one
//! bounded capture of a stream every backend's pump feeds.
//!
//! The step's stream itself is never cut: a pump relays every byte ([`OutputEvent::Output`])
//! and feeds a [`Capture`] with the same bytes. The capture keeps what the caps allow
//! (`maxOutputBytes` bytes and `maxOutputLines` records per stream) as log records, and past a
//! cap counts what it did not keep, for the `outputTruncated` record that ends the stream.
//!
//! Log records of output (`logs/stream.ndjson`, one JSON object a line):
//!
//! * `{"type":"stdout"|"stderr","timestampMs":n,"line":"text"}`: a line that was UTF-8, its
//!   newline left out;
//! * the same with `"b64":"..."` (standard base64) in place of `"line"`: a line that was not
//!   UTF-8, byte for byte;
//! * either with `"partial":true`: no newline followed those bytes (the stream's last bytes,
//!   a piece of a line over [`MAX_RECORD_BYTES`], or the part of a line kept before a cap).
//!
//! So the kept bytes of a stream are the concatenation of its records' bytes, each followed by
//! a newline unless partial ([`record_bytes`]).
//!
//! [`OutputEvent::Output`]: crate::OutputEvent::Output

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Which of the step's streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

impl OutputStream {
    /// `stdout` or `stderr` (the record's `type`, the event's `stream`).
    pub const fn as_str(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        }
    }
}

/// A line longer than this is kept in pieces of at most this many bytes, one record each, so
/// that one endless line cannot grow a buffer past it.
pub const MAX_RECORD_BYTES: usize = 64 * 1024;

/// Which cap a stream passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputCap {
    /// `maxOutputBytes`.
    Bytes,
    /// `maxOutputLines`.
    Lines,
}

impl OutputCap {
    /// The record's `cap`: `bytes` or `lines`.
    pub const fn as_str(self) -> &'static str {
        match self {
            OutputCap::Bytes => "bytes",
            OutputCap::Lines => "lines",
        }
    }

    /// The control that sets it.
    pub const fn control(self) -> &'static str {
        match self {
            OutputCap::Bytes => "maxOutputBytes",
            OutputCap::Lines => "maxOutputLines",
        }
    }
}

/// Standard base64 of `bytes`.
pub fn base64_encode(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The bytes of standard base64 `text`, or `None` when it is not base64. Decodes at most
/// `max` bytes' worth (a longer text is refused before it is decoded).
pub fn base64_decode(text: &str, max: usize) -> Option<Vec<u8>> {
    if text.len() / 4 * 3 > max.saturating_add(3) {
        return None;
    }
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

/// The log record of `bytes` of `stream` (see the module's documentation): `line` when they
/// are UTF-8, else `b64`; `partial` when no newline followed them.
pub fn line_record(stream: OutputStream, bytes: &[u8], newline: bool, timestamp_ms: u64) -> Value {
    let mut record = json!({"type": stream.as_str(), "timestampMs": timestamp_ms});
    match std::str::from_utf8(bytes) {
        Ok(text) => record["line"] = json!(text),
        Err(_) => record["b64"] = json!(base64_encode(bytes)),
    }
    if !newline {
        record["partial"] = json!(true);
    }
    record
}

/// The exact bytes an output record of the log holds, its newline included unless it is
/// partial; `None` for a record of another type or one that is not well formed.
pub fn record_bytes(record: &Value) -> Option<(OutputStream, Vec<u8>)> {
    let stream = match record["type"].as_str()? {
        "stdout" => OutputStream::Stdout,
        "stderr" => OutputStream::Stderr,
        _ => return None,
    };
    let mut bytes = match (record["line"].as_str(), record["b64"].as_str()) {
        (Some(text), None) => text.as_bytes().to_vec(),
        // A record holds at most one piece of a line.
        (None, Some(b64)) => base64_decode(b64, MAX_RECORD_BYTES)?,
        _ => return None,
    };
    if record["partial"] != json!(true) {
        bytes.push(b'\n');
    }
    Some((stream, bytes))
}

/// One piece of a stream the capture kept: its log record, and its text for a live line
/// event (U+FFFD for what is not UTF-8).
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    pub record: Value,
    pub line: String,
}

/// The bounded capture of one stream: what the log keeps of it (see the module's
/// documentation). Memory is bounded by the caps: at most `max_bytes` kept, and a pending
/// line of at most [`MAX_RECORD_BYTES`].
#[derive(Debug)]
pub struct Capture {
    stream: OutputStream,
    max_bytes: u64,
    max_lines: u64,
    /// Bytes the step wrote.
    total: u64,
    /// Bytes accepted under the byte cap (in records or pending).
    accepted: u64,
    /// Bytes in records.
    recorded: u64,
    records: u64,
    pending: Vec<u8>,
    cap: Option<OutputCap>,
    /// Newlines among the bytes not kept, whether any was not kept, and whether the last one
    /// not kept was not a newline (a last line without one).
    dropped_newlines: u64,
    dropped_any: bool,
    dropped_tail: bool,
    /// A copy of the accepted bytes (stdout: a result JSON printed as output).
    copy: Option<Vec<u8>>,
}

impl Capture {
    /// A capture of `stream` under `max_bytes` and `max_lines`; `keep_copy` keeps the accepted
    /// bytes as well (at most `max_bytes`), for [`Capture::copy`].
    pub fn new(stream: OutputStream, max_bytes: u64, max_lines: u64, keep_copy: bool) -> Capture {
        Capture {
            stream,
            max_bytes,
            max_lines,
            total: 0,
            accepted: 0,
            recorded: 0,
            records: 0,
            pending: Vec::new(),
            cap: None,
            dropped_newlines: 0,
            dropped_any: false,
            dropped_tail: false,
            copy: keep_copy.then(Vec::new),
        }
    }

    /// Takes bytes the step wrote; appends what is kept to `kept`. True when these bytes made
    /// the stream pass a cap (once per stream).
    pub fn feed(&mut self, chunk: &[u8], timestamp_ms: u64, kept: &mut Vec<Kept>) -> bool {
        self.total += chunk.len() as u64;
        if self.cap.is_some() {
            self.drop_bytes(chunk);
            return false;
        }
        let room = self.max_bytes.saturating_sub(self.accepted);
        let take = (chunk.len() as u64).min(room) as usize;
        let (accepted, rest) = chunk.split_at(take);
        self.accepted += take as u64;
        if let Some(copy) = &mut self.copy {
            copy.extend_from_slice(accepted);
        }
        self.pending.extend_from_slice(accepted);
        self.records_from_pending(timestamp_ms, kept);
        if self.cap.is_none() && !rest.is_empty() {
            self.cap = Some(OutputCap::Bytes);
        }
        self.drop_bytes(rest);
        self.cap.is_some()
    }

    /// Turns the complete lines of `pending` (and pieces of an over-long one) into records,
    /// until the line cap; past it, what is pending is not kept.
    fn records_from_pending(&mut self, timestamp_ms: u64, kept: &mut Vec<Kept>) {
        let pending = std::mem::take(&mut self.pending);
        let mut start = 0;
        while start < pending.len() {
            let rest = &pending[start..];
            let (len, newline) = match rest.iter().position(|b| *b == b'\n') {
                Some(pos) if pos <= MAX_RECORD_BYTES => (pos, true),
                _ if rest.len() > MAX_RECORD_BYTES => (piece_len(rest), false),
                _ => break,
            };
            if !self.push_record(&rest[..len], newline, timestamp_ms, kept) {
                self.drop_bytes(rest);
                return;
            }
            start += len + usize::from(newline);
        }
        self.pending = pending[start..].to_vec();
    }

    /// One record, unless the line cap is reached (then the cap is set and false returned).
    fn push_record(
        &mut self,
        bytes: &[u8],
        newline: bool,
        timestamp_ms: u64,
        kept: &mut Vec<Kept>,
    ) -> bool {
        if self.records >= self.max_lines {
            self.cap.get_or_insert(OutputCap::Lines);
            return false;
        }
        self.records += 1;
        self.recorded += bytes.len() as u64 + u64::from(newline);
        kept.push(Kept {
            record: line_record(self.stream, bytes, newline, timestamp_ms),
            line: String::from_utf8_lossy(bytes).into_owned(),
        });
        true
    }

    /// Counts `bytes`, the next of the stream, as not kept.
    fn drop_bytes(&mut self, bytes: &[u8]) {
        if let Some(last) = bytes.last() {
            self.dropped_newlines += bytes.iter().filter(|b| **b == b'\n').count() as u64;
            self.dropped_any = true;
            self.dropped_tail = *last != b'\n';
        }
    }

    /// The end of the stream: the pending bytes become a last (partial) record if the line
    /// cap allows, appended to `kept`; then, for a stream that passed a cap, the
    /// `outputTruncated` record that says which cap and how much was not kept.
    pub fn finish(&mut self, timestamp_ms: u64, kept: &mut Vec<Kept>) -> Option<Value> {
        let pending = std::mem::take(&mut self.pending);
        if !pending.is_empty() && !self.push_record(&pending, false, timestamp_ms, kept) {
            if self.dropped_any {
                // Bytes after these were not kept already: only their newlines count here.
                self.dropped_newlines += pending.iter().filter(|b| **b == b'\n').count() as u64;
            } else {
                self.drop_bytes(&pending);
            }
        }
        let cap = self.cap?;
        let stream = self.stream.as_str();
        let (limit, unit) = match cap {
            OutputCap::Bytes => (self.max_bytes, "bytes"),
            OutputCap::Lines => (self.max_lines, "lines"),
        };
        let not_kept_bytes = self.total - self.recorded;
        let not_kept_lines = self.dropped_newlines + u64::from(self.dropped_tail);
        Some(json!({
            "type": "outputTruncated",
            "timestampMs": timestamp_ms,
            "stream": stream,
            "cap": cap.as_str(),
            "limit": limit,
            "totalBytes": self.total,
            "keptBytes": self.recorded,
            "keptLines": self.records,
            "notKeptBytes": not_kept_bytes,
            "notKeptLines": not_kept_lines,
            "message": format!("{stream} cut off at {} ({limit} {unit})", cap.control()),
        }))
    }

    /// Bytes the step wrote to the stream.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Whether the stream passed a cap (so the log does not hold all of it).
    pub fn truncated(&self) -> bool {
        self.cap.is_some()
    }

    /// The cap the stream passed.
    pub fn cap(&self) -> Option<OutputCap> {
        self.cap
    }

    /// The accepted bytes (at most `max_bytes`), when kept.
    pub fn copy(&self) -> &[u8] {
        self.copy.as_deref().unwrap_or_default()
    }
}

/// Most bytes of a log the bundle carries: a bundle holds 100 MiB in all, and the step's
/// patches must not be squeezed out by its output (`--max-output 64m` on both streams, base64
/// for what is not UTF-8, would be more than the whole bundle).
pub const MAX_BUNDLE_LOG_BYTES: u64 = 48 << 20;

/// Room kept at the end of a cut log for its last records (the enforcement report, the exit,
/// the egress decisions).
const LOG_TAIL_BYTES: usize = 1 << 20;

/// A log line longer than this is dropped when a log is cut (no record is near it).
const MAX_LOG_LINE_BYTES: usize = 8 << 20;

/// Cuts the NDJSON log at `path` to at most `max` bytes when it is longer: its first records
/// and its last ones (up to 1 MiB: how the step ended) are kept, and between them a
/// `logCut` record says how many records and bytes were left out. Reads the log once, holding
/// at most the tail; the file is replaced whole (a sibling, renamed over it). Returns the
/// `logCut` record, or `None` when the log fitted.
pub fn fit_log(path: &std::path::Path, max: u64) -> std::io::Result<Option<Value>> {
    use std::io::{BufRead, BufWriter, Read, Write};
    let len = std::fs::metadata(path)?.len();
    if len <= max {
        return Ok(None);
    }
    let head_budget = max.saturating_sub(LOG_TAIL_BYTES as u64 + 1024);
    let mut reader = std::io::BufReader::new(std::fs::File::open(path)?);
    let tmp = path.with_extension("cut");
    let mut out = BufWriter::new(std::fs::File::create(&tmp)?);
    let (mut head, mut dropped_records, mut dropped_bytes) = (0u64, 0u64, 0u64);
    let mut tail: std::collections::VecDeque<Vec<u8>> = Default::default();
    let mut tail_bytes = 0usize;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut reader)
            .take(MAX_LOG_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        if line.len() > MAX_LOG_LINE_BYTES {
            // The rest of an endless line, skipped.
            let mut rest = Vec::new();
            while reader.read_until(b'\n', &mut rest)? > 0 && rest.last() != Some(&b'\n') {
                dropped_bytes += rest.len() as u64;
                rest.clear();
            }
            dropped_records += 1;
            dropped_bytes += (line.len() + rest.len()) as u64;
            continue;
        }
        if tail.is_empty() && head + line.len() as u64 <= head_budget {
            head += line.len() as u64;
            out.write_all(&line)?;
            continue;
        }
        tail_bytes += line.len();
        tail.push_back(std::mem::take(&mut line));
        while tail_bytes > LOG_TAIL_BYTES {
            let Some(old) = tail.pop_front() else { break };
            tail_bytes -= old.len();
            dropped_records += 1;
            dropped_bytes += old.len() as u64;
        }
    }
    let record = json!({
        "type": "logCut",
        "droppedRecords": dropped_records,
        "droppedBytes": dropped_bytes,
        "message": format!(
            "the log ({len} bytes) is cut to fit the bundle ({max} bytes): {dropped_records} records ({dropped_bytes} bytes) between its start and its end are left out; lower --max-output or --max-output-lines to keep a whole log"
        ),
    });
    writeln!(out, "{record}")?;
    for l in &tail {
        out.write_all(l)?;
        if l.last() != Some(&b'\n') {
            out.write_all(b"\n")?;
        }
    }
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(Some(record))
}

/// How many bytes of `rest` (longer than [`MAX_RECORD_BYTES`]) go into one piece: the limit,
/// moved back to the start of a UTF-8 character it would split, so that the pieces of a text
/// line stay text.
fn piece_len(rest: &[u8]) -> usize {
    let mut len = MAX_RECORD_BYTES;
    while len > MAX_RECORD_BYTES - 4 && rest[len] & 0xc0 == 0x80 {
        len -= 1;
    }
    if rest[len] & 0xc0 == 0x80 {
        MAX_RECORD_BYTES
    } else {
        len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(input: &[&[u8]], max_bytes: u64, max_lines: u64) -> (Vec<Kept>, Option<Value>) {
        let mut c = Capture::new(OutputStream::Stdout, max_bytes, max_lines, true);
        let mut kept = Vec::new();
        for chunk in input {
            c.feed(chunk, 1, &mut kept);
        }
        let truncated = c.finish(2, &mut kept);
        (kept, truncated)
    }

    fn replay(kept: &[Kept]) -> Vec<u8> {
        let mut out = Vec::new();
        for k in kept {
            // Through the log's text form, as a reader gets it.
            let record: Value = serde_json::from_str(&k.record.to_string()).unwrap();
            out.extend(record_bytes(&record).unwrap().1);
        }
        out
    }

    #[test]
    fn records_round_trip_bytes_that_are_not_utf8_and_a_missing_newline() {
        let input: &[&[u8]] = &[b"ok\n\xff\xfe", b"x\nlast \xe2\x9c", b"\x93 no newline"];
        let (kept, truncated) = capture(input, 1 << 20, 100);
        assert!(truncated.is_none());
        assert_eq!(replay(&kept), input.concat());
        assert_eq!(kept[0].record["line"], "ok");
        assert!(kept[1].record.get("line").is_none(), "{:?}", kept[1].record);
        assert_eq!(kept[1].record["b64"], base64_encode(b"\xff\xfex"));
        assert_eq!(kept[2].record["line"], "last \u{2713} no newline");
        assert_eq!(kept[2].record["partial"], true);
        assert_eq!(kept[1].line, "\u{fffd}\u{fffd}x");
    }

    #[test]
    fn an_endless_line_is_kept_in_pieces_split_between_characters() {
        let mut input = vec![b'a'; MAX_RECORD_BYTES - 1];
        input.extend("é".repeat(MAX_RECORD_BYTES).as_bytes());
        input.push(b'\n');
        let (kept, _) = capture(&[&input], 1 << 30, 100);
        assert!(kept.len() >= 3);
        assert!(kept.iter().all(|k| k.record.get("line").is_some()));
        assert_eq!(replay(&kept), input);
    }

    #[test]
    fn the_byte_cap_keeps_a_prefix_and_counts_the_rest() {
        let (kept, truncated) = capture(&[b"one\ntwo\nthree\nfour\n"], 10, 100);
        assert_eq!(replay(&kept), b"one\ntwo\nth");
        let t = truncated.unwrap();
        assert_eq!(t["cap"], "bytes");
        assert_eq!(t["limit"], 10);
        assert_eq!(t["totalBytes"], 19);
        assert_eq!(t["keptBytes"], 10);
        assert_eq!(t["notKeptBytes"], 9);
        assert_eq!(t["notKeptLines"], 2);
        assert_eq!(t["message"], "stdout cut off at maxOutputBytes (10 bytes)");
    }

    #[test]
    fn the_line_cap_keeps_the_first_lines_and_counts_the_rest() {
        let input = "x\n".repeat(250);
        let (kept, truncated) = capture(&[input.as_bytes(), b"tail"], 1 << 20, 100);
        assert_eq!(kept.len(), 100);
        let t = truncated.unwrap();
        assert_eq!(t["cap"], "lines");
        assert_eq!(t["keptLines"], 100);
        assert_eq!(t["notKeptLines"], 151);
        assert_eq!(t["notKeptBytes"], 304);
        assert_eq!(t["message"], "stdout cut off at maxOutputLines (100 lines)");
    }

    #[test]
    fn exactly_at_the_caps_is_not_truncated() {
        let input = "x\n".repeat(100);
        let (kept, truncated) = capture(&[input.as_bytes()], 200, 100);
        assert_eq!(kept.len(), 100);
        assert!(truncated.is_none());
        // One more line without its newline is one record too many.
        let (_, truncated) = capture(&[input.as_bytes(), b"y"], 1 << 20, 100);
        assert_eq!(truncated.unwrap()["cap"], "lines");
    }

    #[test]
    fn feed_says_when_a_cap_is_first_passed() {
        let mut c = Capture::new(OutputStream::Stderr, 4, 100, false);
        let mut kept = Vec::new();
        assert!(!c.feed(b"abc", 0, &mut kept));
        assert!(c.feed(b"def", 0, &mut kept));
        assert!(!c.feed(b"ghi", 0, &mut kept));
        assert_eq!(c.total(), 9);
        assert!(c.truncated());
        assert_eq!(c.cap(), Some(OutputCap::Bytes));
        assert!(c.copy().is_empty());
    }

    #[test]
    fn a_log_over_the_bundle_keeps_its_start_and_its_end_and_says_what_it_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("stream.ndjson");
        let mut text = String::new();
        for i in 0..200_000 {
            text.push_str(&format!("{{\"type\":\"stdout\",\"line\":\"line {i}\"}}\n"));
        }
        text.push_str("{\"type\":\"exit\",\"exitCode\":0}\n");
        std::fs::write(&log, &text).unwrap();
        assert!(fit_log(&log, text.len() as u64).unwrap().is_none());
        let max = 2 << 20;
        let cut = fit_log(&log, max).unwrap().expect("cut");
        let after = std::fs::read_to_string(&log).unwrap();
        assert!(after.len() as u64 <= max, "{}", after.len());
        let records: Vec<Value> = after
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(records[0]["line"], "line 0");
        assert_eq!(records.last().unwrap()["type"], "exit");
        assert_eq!(records.iter().filter(|r| r["type"] == "logCut").count(), 1);
        let kept = records.len() as u64 - 1;
        assert_eq!(kept + cut["droppedRecords"].as_u64().unwrap(), 200_001);
        assert_eq!(
            after.len() as u64 - cut.to_string().len() as u64 - 1
                + cut["droppedBytes"].as_u64().unwrap(),
            text.len() as u64
        );
    }

    #[test]
    fn malformed_records_are_not_output() {
        for r in [
            json!({"type": "stdout"}),
            json!({"type": "stdout", "line": "a", "b64": "YQ=="}),
            json!({"type": "stdout", "b64": "not base64!"}),
            json!({"type": "exit", "line": "a"}),
        ] {
            assert!(record_bytes(&r).is_none(), "{r}");
        }
        let big = base64_encode(&vec![0u8; MAX_RECORD_BYTES + 10]);
        assert!(record_bytes(&json!({"type": "stderr", "b64": big})).is_none());
    }
}
