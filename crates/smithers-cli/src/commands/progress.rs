//! What `run` shows while its step runs: a progress display on a terminal (stage, elapsed
//! time, the latest output line, with the output scrolling above), plain lines otherwise,
//! and the step's output relayed to ours (inert on a terminal, as is to a pipe or file).

use crate::output::say;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::Value;
use smithers_orchestrator::Heartbeat;
use smithers_runtime::{OutputEvent, OutputSink, OutputStream};

use crate::output::{color_allowed, inert};

/// Set once a write to our stdout failed (the reader went away: `run ... | head`).
pub(crate) static STDOUT_GONE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// One line to our stdout (see [`bytes_to_stdout`]).
pub(crate) fn to_stdout(line: &str) {
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    bytes_to_stdout(&bytes);
}

/// Bytes to our stdout, as they are. A reader that went away (EPIPE) does not end the run:
/// the step goes on to its bundle and review (which a killed CLI would lose), later output is
/// dropped, and the end of the run says so on stderr.
fn bytes_to_stdout(bytes: &[u8]) {
    use std::sync::atomic::Ordering;
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if out.write_all(bytes).and_then(|()| out.flush()).is_err() {
        STDOUT_GONE.store(true, Ordering::Relaxed);
    }
}

/// Bytes to our stderr, as they are.
fn bytes_to_stderr(bytes: &[u8]) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(bytes).and_then(|()| err.flush());
}

/// Says, on stderr, that our stdout's reader went away before the end (see
/// [`bytes_to_stdout`]).
pub(crate) fn note_stdout_gone() {
    if STDOUT_GONE.load(std::sync::atomic::Ordering::Relaxed) {
        say!(
            "note: stdout was closed by its reader; what the bundle's log kept of the step's output is in it (logs/stream.ndjson)"
        );
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Nothing while running (the final JSON document only).
    Quiet,
    /// Stage changes as lines on stderr; the step's stdout/stderr to ours.
    Plain,
    /// A status line redrawn at the bottom of the terminal (stderr), output scrolling above.
    Tty,
}

#[derive(Debug, Default)]
pub(crate) struct DisplayState {
    stage: String,
    last_line: String,
    pub(crate) termination: Option<String>,
    pub(crate) exit_code: Option<i64>,
    /// The step's enforcement report, from the `child-finished` heartbeat.
    pub(crate) enforcement: Option<Value>,
    /// What the egress engine decided, from the same heartbeat (with a policy only).
    pub(crate) egress: Option<Value>,
    cancelling: bool,
    status_drawn: bool,
    done: bool,
    /// The step's output on its way to a terminal: the line not yet ended, per stream.
    partial: [Vec<u8>; 2],
    /// Bytes of each stream a remote host could not relay (gaps in what we wrote).
    lost: [u64; 2],
}

/// The live view of one step.
pub(crate) struct Display {
    mode: Mode,
    /// Where each relayed line goes and how it is written.
    relay: Relay,
    started: Instant,
    state: Mutex<DisplayState>,
}

/// How one relayed stream is written: raw or inert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineOut {
    /// Written as the step wrote it (a pipe or a file: the user wants the bytes).
    Raw,
    /// Made inert a line at a time (a terminal), escapes marked in reverse video when
    /// `marked`.
    Inert { marked: bool },
}

/// Which of our streams are terminals, decided once at start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Relay {
    stdout_tty: bool,
    stderr_tty: bool,
    marked: bool,
}

impl Relay {
    pub(crate) fn detect() -> Relay {
        Relay {
            stdout_tty: std::io::stdout().is_terminal(),
            stderr_tty: std::io::stderr().is_terminal(),
            marked: color_allowed(),
        }
    }

    fn for_tty(&self, tty: bool) -> LineOut {
        if tty {
            LineOut::Inert {
                marked: self.marked,
            }
        } else {
            LineOut::Raw
        }
    }
}

/// The text written to a terminal for one relayed line (without its newline): inert, with
/// bytes that are not UTF-8 as `\xNN`.
fn relayed(line: &[u8], marked: bool) -> String {
    smithers_terminal::escape_bytes(line, smithers_terminal::Inert::BODY.marked(marked))
}

/// Longest line held back for a terminal: a longer one is shown in pieces.
const MAX_HELD_LINE: usize = 64 * 1024;

/// The complete lines of `pending` after `bytes` are added (each without its newline), the
/// rest left in `pending`; at `end`, the rest too.
fn complete_lines(pending: &mut Vec<u8>, bytes: &[u8], end: bool) -> Vec<Vec<u8>> {
    pending.extend_from_slice(bytes);
    let mut lines = Vec::new();
    let mut start = 0;
    loop {
        let rest = &pending[start..];
        match rest.iter().position(|b| *b == b'\n') {
            Some(pos) if pos <= MAX_HELD_LINE => {
                lines.push(rest[..pos].to_vec());
                start += pos + 1;
            }
            _ if rest.len() > MAX_HELD_LINE => {
                lines.push(rest[..MAX_HELD_LINE].to_vec());
                start += MAX_HELD_LINE;
            }
            _ => break,
        }
    }
    pending.drain(..start);
    if end && !pending.is_empty() {
        lines.push(std::mem::take(pending));
    }
    lines
}

/// Copies `from` to the terminal `to` made inert a line at a time, as a step's output is
/// shown on a terminal (for a command whose bytes would otherwise reach the terminal as they
/// are: a session's). Ends at `from`'s end; a terminal that cannot be written ends it too.
pub(crate) fn inert_copy(mut from: impl std::io::Read, mut to: impl Write) {
    let marked = color_allowed();
    let mut pending = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let (n, end) = match from.read(&mut buf) {
            Ok(0) => (0, true),
            Ok(n) => (n, false),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => (0, true),
        };
        for line in complete_lines(&mut pending, &buf[..n], end) {
            if writeln!(to, "{}", relayed(&line, marked)).is_err() {
                return;
            }
        }
        let _ = to.flush();
        if end {
            return;
        }
    }
}

const SPINNER: &[char] = &['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

impl Display {
    pub(crate) fn new(mode: Mode, relay: Relay) -> Self {
        Display {
            mode,
            relay,
            started: Instant::now(),
            state: Mutex::new(DisplayState {
                stage: "initializing".into(),
                ..DisplayState::default()
            }),
        }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, DisplayState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn width() -> usize {
        std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse::<usize>().ok())
            .filter(|w| *w >= 20)
            .unwrap_or(80)
    }

    /// Redraws the status line (TTY mode; the caller holds the lock).
    fn draw(&self, st: &mut DisplayState, err: &mut impl Write) {
        if st.done {
            return;
        }
        let tick = (self.started.elapsed().as_millis() / 100) as usize % SPINNER.len();
        let stage = if st.cancelling {
            "cancelling (Ctrl-C again to exit now)".to_string()
        } else {
            inert(&st.stage)
        };
        let mut line = format!(
            "{} {stage} · {:.1}s",
            SPINNER[tick],
            self.started.elapsed().as_secs_f64()
        );
        if !st.last_line.is_empty() {
            line.push_str(" · ");
            line.push_str(&st.last_line);
        }
        let line: String = line.chars().take(Self::width() - 1).collect();
        let _ = write!(err, "\r\x1b[2K\x1b[2m{line}\x1b[m");
        let _ = err.flush();
        st.status_drawn = true;
    }

    fn clear(st: &mut DisplayState, err: &mut impl Write) {
        if st.status_drawn {
            let _ = write!(err, "\r\x1b[2K");
            st.status_drawn = false;
        }
    }

    pub(crate) fn heartbeat(&self, hb: &Heartbeat) {
        let mut st = self.lock();
        if hb.stage == "child-finished" {
            st.termination = hb
                .data
                .get("termination")
                .and_then(Value::as_str)
                .map(str::to_string);
            st.exit_code = hb.data.get("exitCode").and_then(Value::as_i64);
            st.enforcement = hb.data.get("enforcement").cloned();
            st.egress = hb.data.get("egress").filter(|v| !v.is_null()).cloned();
        }
        if st.stage == hb.stage {
            return;
        }
        st.stage = hb.stage.to_string();
        match self.mode {
            Mode::Quiet => {}
            Mode::Plain => say!("[{:>7.2}s] {}", self.elapsed(), inert(hb.stage)),
            Mode::Tty => {
                let mut err = std::io::stderr().lock();
                self.draw(&mut st, &mut err);
            }
        }
    }

    /// Relays bytes of the step's output (see [`OUTPUT_HELP`]).
    fn output(&self, stream: OutputStream, bytes: &[u8]) {
        let mut st = self.lock();
        let is_err = stream == OutputStream::Stderr;
        let tty = if is_err {
            self.relay.stderr_tty
        } else {
            self.relay.stdout_tty
        };
        match (self.mode, self.relay.for_tty(tty)) {
            (Mode::Quiet, _) => {}
            (_, LineOut::Raw) if is_err => bytes_to_stderr(bytes),
            (Mode::Plain, LineOut::Raw) => bytes_to_stdout(bytes),
            (Mode::Tty, LineOut::Raw) => {
                // Our stdout is redirected: it gets the step's stdout as written.
                bytes_to_stdout(bytes);
                if let Some(last) = last_line(bytes) {
                    st.last_line = last;
                }
                let mut err = std::io::stderr().lock();
                self.draw(&mut st, &mut err);
            }
            (mode, LineOut::Inert { marked }) => {
                let lines = complete_lines(&mut st.partial[stream as usize], bytes, false);
                self.show_lines(&mut st, mode, is_err, &lines, marked);
            }
        }
    }

    /// Shows complete lines of a stream on a terminal, inert: the step's stderr (and, with
    /// the progress line, its stdout too) on our stderr, above the progress line.
    fn show_lines(
        &self,
        st: &mut DisplayState,
        mode: Mode,
        is_err: bool,
        lines: &[Vec<u8>],
        marked: bool,
    ) {
        if lines.is_empty() {
            return;
        }
        let mut text = String::new();
        for line in lines {
            text.push_str(&relayed(line, marked));
            text.push('\n');
        }
        if mode == Mode::Plain {
            if is_err {
                bytes_to_stderr(text.as_bytes());
            } else {
                bytes_to_stdout(text.as_bytes());
            }
            return;
        }
        // The status line shows the last one too: one line, nothing kept, no marks (it is dim).
        if let Some(last) = lines.iter().rev().find_map(|l| last_line(l)) {
            st.last_line = last;
        }
        let mut err = std::io::stderr().lock();
        Self::clear(st, &mut err);
        let _ = err.write_all(text.as_bytes());
        self.draw(st, &mut err);
    }

    /// A remote host could not relay `bytes` of `stream`: said at the end.
    fn lost(&self, stream: OutputStream, bytes: u64) {
        self.lock().lost[stream as usize] += bytes;
    }

    pub(crate) fn tick(&self) {
        if self.mode == Mode::Tty {
            let mut st = self.lock();
            let mut err = std::io::stderr().lock();
            self.draw(&mut st, &mut err);
        }
    }

    pub(crate) fn cancelling(&self) {
        let mut st = self.lock();
        st.cancelling = true;
        match self.mode {
            Mode::Quiet => {}
            Mode::Plain => say!(
                "[{:>7.2}s] cancelling (Ctrl-C again to exit now)",
                self.elapsed()
            ),
            Mode::Tty => {
                let mut err = std::io::stderr().lock();
                self.draw(&mut st, &mut err);
            }
        }
    }

    pub(crate) fn finish(&self) {
        let mut st = self.lock();
        // The last line of a stream shown on a terminal, if the step did not end it.
        for (stream, is_err) in [(OutputStream::Stdout, false), (OutputStream::Stderr, true)] {
            let lines = complete_lines(&mut st.partial[stream as usize], &[], true);
            let tty = if is_err {
                self.relay.stderr_tty
            } else {
                self.relay.stdout_tty
            };
            if let (false, LineOut::Inert { marked }) =
                (self.mode == Mode::Quiet, self.relay.for_tty(tty))
            {
                self.show_lines(&mut st, self.mode, is_err, &lines, marked);
            }
        }
        let mut err = std::io::stderr().lock();
        Self::clear(&mut st, &mut err);
        st.done = true;
        let _ = err.flush();
        drop(err);
        for stream in [OutputStream::Stdout, OutputStream::Stderr] {
            let lost = st.lost[stream as usize];
            if lost > 0 {
                say!(
                    "note: {lost} bytes of the step's {} did not reach us (the host no longer held them); what its log kept is in the bundle",
                    stream.as_str()
                );
            }
        }
    }
}

/// The last non-empty line of `bytes`, inert and trimmed, for the progress line.
fn last_line(bytes: &[u8]) -> Option<String> {
    let line = bytes
        .split(|b| *b == b'\n')
        .rev()
        .find(|l| l.iter().any(|b| !b.is_ascii_whitespace()))?;
    let text = String::from_utf8_lossy(&line[..line.len().min(512)]);
    Some(inert(text.trim()))
}

pub(crate) struct Sink(pub(crate) Arc<Display>);

impl OutputSink for Sink {
    fn event(&self, event: OutputEvent) {
        match event {
            // Every byte the step wrote: relayed.
            OutputEvent::Output { stream, bytes, .. } => self.0.output(stream, &bytes),
            OutputEvent::OutputLost { stream, bytes, .. } => self.0.lost(stream, bytes),
            // The lines the log keeps: the bytes above are what we relay.
            OutputEvent::Stdout { .. } | OutputEvent::Stderr { .. } => {}
            // Summarised after the step; each is in the bundle's log.
            OutputEvent::Heartbeat { .. } | OutputEvent::Egress { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a terminal a relayed line is inert; to a pipe the bytes go as written.
    #[test]
    fn relayed_lines_are_inert_on_a_terminal_only() {
        let line = "progress\x1b[2K\r\x1b]52;c;ZXZpbA==\x07\tdone \u{9b}1m";
        assert_eq!(
            relayed(line.as_bytes(), false),
            "progress^[[2K^M^[]52;c;ZXZpbA==^G\tdone \\u{9b}1m"
        );
        assert_eq!(relayed(b"a\xffb", false), "a\\xffb");
        let marked = relayed(line.as_bytes(), true);
        let stripped = marked
            .replace(smithers_terminal::MARK_ON, "")
            .replace(smithers_terminal::MARK_OFF, "");
        assert!(!stripped.contains('\x1b'), "{marked:?}");
        let relay = Relay {
            stdout_tty: false,
            stderr_tty: true,
            marked: true,
        };
        assert_eq!(relay.for_tty(relay.stdout_tty), LineOut::Raw);
        assert_eq!(
            relay.for_tty(relay.stderr_tty),
            LineOut::Inert { marked: true }
        );
    }

    /// A terminal is written whole lines: a character split between two chunks is shown
    /// once, and a line the step did not end is shown at the end.
    #[test]
    fn lines_for_a_terminal_are_whole() {
        let mut pending = Vec::new();
        assert!(complete_lines(&mut pending, b"ab\xc3", false).is_empty());
        assert_eq!(
            complete_lines(&mut pending, b"\xa9\ncd", false),
            vec!["ab\u{e9}".as_bytes().to_vec()]
        );
        assert_eq!(
            complete_lines(&mut pending, b"", true),
            vec![b"cd".to_vec()]
        );
        assert!(pending.is_empty());
        let long = vec![b'x'; MAX_HELD_LINE * 2 + 1];
        assert_eq!(complete_lines(&mut pending, &long, false).len(), 2);
    }
}
