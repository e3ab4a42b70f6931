//! `run -t`: the step on a terminal of its own, relayed to the user's.
//!
//! The step is run through the native engine (start, one exec on a pseudo-terminal made in
//! the sandbox, stop) instead of the one-shot path, as a session is: [`TerminalRuntime`] is
//! the backend's step verbs with that `execute`. What the step's terminal shows is passed
//! through [`smithers_terminal::vt::VtFilter`] to ours (what a full-screen program needs
//! passes; clipboard, title, report and device control sequences are kept out and counted,
//! and the count is said after); with `-i` our terminal is put in raw mode and every key goes
//! to the step's terminal, Ctrl-C and Ctrl-Z included (its line discipline makes them the
//! step's signals); each size our window takes is the step's terminal's.

use std::io::{IsTerminal as _, Write as _};
use std::os::fd::AsFd as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use smithers_runtime::{
    CancellationToken, CollectReport, EnforcementReport, Engine, ExecOutcome, ExecRequest,
    OutputEvent, OutputSink, RequestBundle, Runtime, RuntimeError, RuntimeKind, SandboxConfig,
    SandboxHandle, ShipReport, StepCommand, StepStdin, TerminalRequest, TerminalSize,
};
use smithers_terminal::escape_keys::EscapeKeys;
use smithers_terminal::vt::VtFilter;

use crate::output::say;

/// The native backend's step verbs, with an `execute` that gives the step a terminal.
pub struct TerminalRuntime {
    runtime: Arc<dyn Runtime>,
    engine: Arc<dyn Engine>,
    /// Our keys go to the step (`-i`).
    interactive: bool,
    /// The step's timeout, from its config at `create`.
    timeout: Mutex<Option<Duration>>,
}

impl TerminalRuntime {
    pub fn new(native: Arc<smithers_runtime_native::NativeRuntime>, interactive: bool) -> Self {
        TerminalRuntime {
            runtime: native.clone(),
            engine: native,
            interactive,
            timeout: Mutex::new(None),
        }
    }
}

impl std::fmt::Debug for TerminalRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TerminalRuntime").finish()
    }
}

#[async_trait]
impl Runtime for TerminalRuntime {
    fn kind(&self) -> RuntimeKind {
        self.runtime.kind()
    }

    async fn probe(&self) -> EnforcementReport {
        self.runtime.probe().await
    }

    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
        *self.timeout.lock().unwrap_or_else(|p| p.into_inner()) = config.controls.timeout();
        self.runtime.create(config).await
    }

    async fn ship(
        &self,
        handle: &SandboxHandle,
        request: &RequestBundle,
    ) -> Result<ShipReport, RuntimeError> {
        self.runtime.ship(handle, request).await
    }

    /// Started, the one command on its terminal, stopped: the sandbox's life is the step's,
    /// and how the command ended is how the step did (the engine records it for collect).
    async fn execute(
        &self,
        handle: &SandboxHandle,
        command: &StepCommand,
        cancel: CancellationToken,
        output: &dyn OutputSink,
    ) -> Result<ExecOutcome, RuntimeError> {
        let began = Instant::now();
        self.engine.start(handle).await?;
        let (size_tx, size) = tokio::sync::watch::channel(window_size());
        let resizes = tokio::spawn(follow_window(size_tx));
        let typing = Arc::new(AtomicBool::new(true));
        let keys = self.interactive && std::io::stdin().is_terminal();
        let (stdin, raw) = if keys {
            let escaped = cancel.clone();
            let reader = Keys::new(typing.clone(), move || escaped.cancel());
            (StepStdin::from_reader(reader), RawMode::enter())
        } else {
            (StepStdin::default(), None)
        };
        let request = ExecRequest {
            argv: command.argv.clone(),
            cwd: command.cwd.clone(),
            env: terminal_env(),
            stdin,
            timeout: *self.timeout.lock().unwrap_or_else(|p| p.into_inner()),
            terminal: Some(TerminalRequest { size }),
            is_step: true,
        };
        // Without our keys, the terminal's answers would go to our shell, not the step.
        let filter = match keys {
            true => VtFilter::new(),
            false => VtFilter::without_answers(),
        };
        let shown = Shown {
            filter: Mutex::new(filter),
            forward: output,
        };
        let exit = self.engine.exec(handle, request, cancel, &shown).await;
        typing.store(false, Ordering::SeqCst);
        resizes.abort();
        shown.restore_terminal();
        drop(raw);
        let stopped = self.engine.stop(handle).await;
        shown.say_what_was_kept_out();
        let exit = exit?;
        stopped?;
        Ok(ExecOutcome {
            signal: exit.signal,
            stdout_bytes: exit.stdout_bytes,
            ..ExecOutcome::of_life(exit.termination, exit.exit_code, began.elapsed())
        })
    }

    async fn place(
        &self,
        handle: SandboxHandle,
        sink: &dyn smithers_runtime::PlacementSink,
    ) -> Result<(SandboxHandle, Option<smithers_runtime::Placement>), RuntimeError> {
        self.runtime.place(handle, sink).await
    }

    async fn collect(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError> {
        self.runtime.collect(handle).await
    }

    async fn collect_stored(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError> {
        self.runtime.collect_stored(handle).await
    }

    async fn cleanup(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        self.engine.destroy(handle).await
    }
}

/// `TERM` (and `COLORTERM`) as ours says, so that the step's programs speak our terminal's
/// language; a value that is not a plain name is not passed (xterm-256color then).
fn terminal_env() -> Vec<(String, String)> {
    let plain = |v: &str| {
        !v.is_empty()
            && v.len() <= 64
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.+".contains(&b))
    };
    let term = std::env::var("TERM")
        .ok()
        .filter(|t| plain(t) && t != "dumb");
    let mut env = vec![(
        "TERM".to_string(),
        term.unwrap_or_else(|| "xterm-256color".into()),
    )];
    if let Some(c) = std::env::var("COLORTERM").ok().filter(|c| plain(c)) {
        env.push(("COLORTERM".into(), c));
    }
    env
}

/// Our window's size (stdout's terminal, else stdin's), or the VT100's.
pub(crate) fn window_size() -> TerminalSize {
    let of = |fd: std::os::fd::BorrowedFd<'_>| {
        rustix::termios::tcgetwinsize(fd)
            .ok()
            .filter(|w| w.ws_row > 0 && w.ws_col > 0)
            .map(|w| TerminalSize {
                rows: w.ws_row,
                cols: w.ws_col,
            })
    };
    of(std::io::stdout().as_fd())
        .or_else(|| of(std::io::stdin().as_fd()))
        .unwrap_or_default()
}

/// Passes each size our window takes (SIGWINCH) on to the step's terminal.
async fn follow_window(size: tokio::sync::watch::Sender<TerminalSize>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut changes) = signal(SignalKind::window_change()) else {
        return;
    };
    while changes.recv().await.is_some() {
        let now = window_size();
        size.send_if_modified(|s| std::mem::replace(s, now) != now);
    }
}

/// Our terminal in raw mode until dropped (every key is the step's; nothing is echoed here:
/// the step's terminal echoes), then as it was.
pub(crate) struct RawMode {
    saved: rustix::termios::Termios,
}

/// The terminal's settings before raw mode, while it is on: what an exit that cannot wait
/// for the step (a second interrupt) puts back ([`put_terminal_back`]).
static SAVED: Mutex<Option<rustix::termios::Termios>> = Mutex::new(None);

impl RawMode {
    pub(crate) fn enter() -> Option<RawMode> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        *SAVED.lock().unwrap_or_else(|p| p.into_inner()) = Some(saved.clone());
        rustix::termios::tcsetattr(stdin.as_fd(), rustix::termios::OptionalActions::Now, &raw)
            .ok()?;
        Some(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // Input not read yet is dropped with the raw mode: an answer of the terminal to a
        // request the step made as it ended would otherwise be typed into our shell.
        let _ = rustix::termios::tcsetattr(
            std::io::stdin().as_fd(),
            rustix::termios::OptionalActions::Flush,
            &self.saved,
        );
        *SAVED.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// Puts our terminal's settings back if raw mode is on (before an exit that skips the
/// ordinary way out).
pub(crate) fn put_terminal_back() {
    if let Some(saved) = SAVED.lock().unwrap_or_else(|p| p.into_inner()).take() {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin().as_fd(),
            rustix::termios::OptionalActions::Flush,
            &saved,
        );
    }
}

/// Our keys, read while the step runs: a read that waits at most a tenth of a second at a
/// time, so that it ends with the step and leaves nothing of ours reading the terminal.
/// `~.` at the start of a line (`smithers_terminal::escape_keys`) ends the step whatever it did to
/// its own terminal's signals: `on_escape` is called and the step's input ends.
pub(crate) struct Keys {
    typing: Arc<AtomicBool>,
    escape: EscapeKeys,
    on_escape: Box<dyn Fn() + Send>,
    /// Keys for the step not yet read (a `~` held back comes out with the key after it).
    pending: Vec<u8>,
}

impl Keys {
    pub(crate) fn new(typing: Arc<AtomicBool>, on_escape: impl Fn() + Send + 'static) -> Keys {
        Keys {
            typing,
            escape: EscapeKeys::default(),
            on_escape: Box::new(on_escape),
            pending: Vec::new(),
        }
    }

    /// Bytes from our terminal as they come, or 0 once typing is over.
    fn read_typed(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let stdin = std::io::stdin();
        let tenth = Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        while self.typing.load(Ordering::SeqCst) {
            let fd = stdin.as_fd();
            let mut fds = [PollFd::new(&fd, PollFlags::IN)];
            match poll(&mut fds, Some(&tenth)) {
                Ok(0) => continue,
                Ok(_) => {
                    if fds[0].revents().intersects(PollFlags::IN) {
                        return rustix::io::read(fd, buf).map_err(std::io::Error::from);
                    }
                    // Hung up or closed: no more keys.
                    return Ok(0);
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(0)
    }
}

impl std::io::Read for Keys {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if !self.pending.is_empty() {
                let n = buf.len().min(self.pending.len());
                buf[..n].copy_from_slice(&self.pending[..n]);
                self.pending.drain(..n);
                return Ok(n);
            }
            let mut typed = [0u8; 4096];
            let n = self.read_typed(&mut typed)?;
            if n == 0 {
                return Ok(0);
            }
            if self.escape.feed(&typed[..n], &mut self.pending) {
                self.pending.clear();
                self.typing.store(false, Ordering::SeqCst);
                (self.on_escape)();
                return Ok(0);
            }
        }
    }
}

/// The step's terminal, shown on ours through the filter.
struct Shown<'a> {
    filter: Mutex<VtFilter>,
    forward: &'a dyn OutputSink,
}

impl Shown<'_> {
    /// Sets back what the step's sequences left set on our terminal.
    fn restore_terminal(&self) {
        restore_terminal(&self.filter.lock().unwrap_or_else(|p| p.into_inner()));
    }

    fn say_what_was_kept_out(&self) {
        say_kept(&self.filter.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

/// Writes what sets back the modes, screen and keyboard protocols the sequences `filter` let
/// through left set, before anything of ours is shown after the step.
pub(crate) fn restore_terminal(filter: &VtFilter) {
    let restore = filter.restore();
    if !restore.is_empty() {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(&restore);
        let _ = out.flush();
    }
}

/// One line on stderr naming what `filter` kept from the terminal, if anything.
pub(crate) fn say_kept(filter: &VtFilter) {
    let kept: Vec<String> = (filter.blocked().iter())
        .map(|(kind, n)| format!("{n} {}", kind.describe()))
        .collect();
    if !kept.is_empty() {
        say!(
            "smithers-sandbox: kept from your terminal: {}",
            kept.join(", ")
        );
    }
}

impl OutputSink for Shown<'_> {
    fn event(&self, event: OutputEvent) {
        match event {
            OutputEvent::Output { bytes, .. } => {
                let mut shown = Vec::with_capacity(bytes.len());
                (self.filter.lock().unwrap_or_else(|p| p.into_inner())).feed(&bytes, &mut shown);
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(&shown);
                let _ = out.flush();
            }
            other => self.forward.event(other),
        }
    }
}
