//! `exec`: one command in a started sandbox. Its stdin, stdout and stderr are pipes of its
//! own, passed to P1 with the request; its output is relayed byte for byte as written; its
//! timeout and cancellation kill its group, and the sandbox goes on.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smithers_runtime::{
    CancellationToken, ExecExit, ExecRequest, OutputEvent, OutputSink, OutputStream, RuntimeError,
    Termination,
};
use smithers_sandbox_init::plan::{ExecSpec, SessionReport, SessionRequest};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::clock::now_ms;
use crate::launcher::output_pipe;

use super::check_env;
use crate::live::channel::Channel;
use crate::live::Live;

/// How long a killed command's exit may take to be reported before the exec fails.
const KILL_GRACE: Duration = Duration::from_secs(5);

pub(crate) async fn exec(
    live: &Live,
    mut request: ExecRequest,
    cancel: CancellationToken,
    sink: &dyn OutputSink,
) -> Result<ExecExit, RuntimeError> {
    let channel = live.channel().ok_or_else(not_running)?;
    let mut spec = command_spec(&live.base, &request)?;
    let terminal = request.terminal.take();
    if let Some(t) = &terminal {
        let size = *t.size.borrow();
        spec.terminal = Some(smithers_sandbox_init::plan::TerminalSize {
            rows: size.rows,
            cols: size.cols,
        });
    }
    let started = Instant::now();
    let id = live.next_id();
    let mut reports = channel.register(id);
    let ends = match terminal {
        None => {
            on_pipes(
                live,
                &channel,
                id,
                spec,
                &request,
                &cancel,
                sink,
                &mut reports,
            )
            .await
        }
        Some(terminal) => {
            let exec = super::terminal::Exec {
                live,
                channel: &channel,
                id,
                spec,
                request: &request,
                cancel: &cancel,
                sink,
            };
            exec.run(terminal, &mut reports).await
        }
    };
    channel.unregister(id);
    let (termination, exit_code, signal, stdout_bytes, stderr_bytes) = ends?;
    let exit = ExecExit {
        termination,
        exit_code,
        signal,
        duration: started.elapsed(),
        stdout_bytes,
        stderr_bytes,
    };
    if request.is_step {
        live.set_step_end(exit.clone());
    }
    Ok(exit)
}

/// How a command ended: why, its code or signal, the bytes of its stdout and stderr.
pub(super) type Ends = (Termination, Option<i32>, Option<i32>, u64, u64);

/// A command whose stdin, stdout and stderr are pipes of its own.
#[allow(clippy::too_many_arguments)] // one exec's parts, each used once
async fn on_pipes(
    live: &Live,
    channel: &Arc<Channel>,
    id: u64,
    spec: ExecSpec,
    request: &ExecRequest,
    cancel: &CancellationToken,
    sink: &dyn OutputSink,
    reports: &mut UnboundedReceiver<SessionReport>,
) -> Result<Ends, RuntimeError> {
    let (out_r, out_w) = output_pipe().map_err(pipe_err)?;
    let (err_r, err_w) = output_pipe().map_err(pipe_err)?;
    let (in_r, feeder) = stdin_of(request)?;
    let sent = send_exec(
        live,
        channel,
        id,
        spec,
        &[in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
    )
    .await;
    // P1 has its copies now (or nothing was sent): ours must go, so the pipes end with the
    // command.
    drop((in_r, out_w, err_w));
    sent?;
    if let Some(feed) = feeder {
        feed.start();
    }
    let exited = CancellationToken::new();
    let end = wait_for_exit(channel, id, reports, request.timeout, cancel, &exited);
    let (out_bytes, err_bytes, end) = tokio::join!(
        relay(out_r, OutputStream::Stdout, sink, &exited),
        relay(err_r, OutputStream::Stderr, sink, &exited),
        end
    );
    let (termination, exit_code, signal) = end?;
    Ok((termination, exit_code, signal, out_bytes, err_bytes))
}

/// Sends exec `id`'s request with `fds`, never while a layer flip has no spawner serving the
/// channel.
pub(super) async fn send_exec(
    live: &Live,
    channel: &Channel,
    id: u64,
    spec: ExecSpec,
    fds: &[std::os::fd::RawFd],
) -> Result<(), RuntimeError> {
    let gate = live.flip_gate.read().await;
    let sent = channel
        .send(&SessionRequest::Exec { id, exec: spec }, fds)
        .await;
    drop(gate);
    sent.map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput => RuntimeError::InvalidControl {
            control: "command",
            reason: e.to_string(),
        },
        _ => not_running_because(e.to_string()),
    })
}

fn not_running() -> RuntimeError {
    RuntimeError::OutOfOrder {
        verb: "exec",
        reason: "the sandbox is not running (not started, or stopped)".into(),
    }
}

pub(super) fn not_running_because(reason: String) -> RuntimeError {
    RuntimeError::spawn("run the command", format!("the sandbox ended: {reason}"))
}

fn pipe_err(e: std::io::Error) -> RuntimeError {
    RuntimeError::spawn("make the command's pipes", e)
}

/// The command as P1 runs it: the sandbox's base environment with the request's variables
/// over it, the working directory under `/workspace` unless absolute, `PATH` searched as set.
fn command_spec(base: &ExecSpec, request: &ExecRequest) -> Result<ExecSpec, RuntimeError> {
    if request.argv.first().is_none_or(|a| a.is_empty()) {
        return Err(RuntimeError::InvalidControl {
            control: "command",
            reason: "the command is empty".into(),
        });
    }
    // A C string ends at its first NUL: refused whole, never run shorter.
    if let Some(i) = request.argv.iter().position(|a| a.contains('\0')) {
        return Err(RuntimeError::InvalidControl {
            control: "command",
            reason: format!("argument {i} contains a NUL byte, which a command line cannot carry"),
        });
    }
    check_env(request.env.iter().map(|(k, v)| (k, v)))?;
    let mut env = base.env.clone();
    let mut search_path = base.search_path.clone();
    for (key, value) in &request.env {
        let prefix = format!("{key}=");
        env.retain(|e| !e.starts_with(&prefix));
        env.push(format!("{key}={value}"));
        if key == "PATH" {
            search_path = value.clone();
        }
    }
    let cwd = match request.cwd.as_deref() {
        None => base.cwd.clone(),
        Some(c) if c.contains('\0') => {
            return Err(RuntimeError::InvalidControl {
                control: "cwd",
                reason: "contains a NUL byte".into(),
            })
        }
        Some(c) if c.starts_with('/') => c.into(),
        Some(c) => std::path::Path::new(crate::plan::paths::WORKSPACE).join(c),
    };
    Ok(ExecSpec {
        argv: request.argv.clone(),
        env,
        cwd,
        search_path,
        stdin: None,
        terminal: None,
    })
}

/// The command's stdin: the read end of a pipe fed from the request's stream, or
/// `/dev/null`.
fn stdin_of(request: &ExecRequest) -> Result<(OwnedFd, Option<Feeder>), RuntimeError> {
    match request.stdin.take() {
        Some(reader) => {
            let (read, write) = output_pipe().map_err(pipe_err)?;
            Ok((read, Some(Feeder { reader, write })))
        }
        None => {
            let null = std::fs::File::open("/dev/null")
                .map_err(|e| RuntimeError::io("open", std::path::Path::new("/dev/null"), e))?;
            Ok((null.into(), None))
        }
    }
}

/// Copies the caller's stream into the command's stdin on a thread of its own (a stream may
/// block for as long as it likes); it ends at the stream's end or when the command stops
/// reading (EPIPE).
struct Feeder {
    reader: smithers_runtime::types::StdinReader,
    write: OwnedFd,
}

impl Feeder {
    fn start(self) {
        let Feeder { mut reader, write } = self;
        std::thread::spawn(move || {
            let mut pipe = std::fs::File::from(write);
            let _ = std::io::copy(&mut reader, &mut pipe);
        });
    }
}

/// Waits for the command's exit report, killing its group on the timeout or a cancel.
/// Cancels `exited` once the command's exit is known (the relays then read what is left).
pub(super) async fn wait_for_exit(
    channel: &Arc<Channel>,
    id: u64,
    reports: &mut UnboundedReceiver<SessionReport>,
    timeout: Option<Duration>,
    cancel: &CancellationToken,
    exited: &CancellationToken,
) -> Result<(Termination, Option<i32>, Option<i32>), RuntimeError> {
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut ended_by = None;
    let result = loop {
        let report = tokio::select! {
            r = reports.recv() => r,
            _ = sleep_until(deadline), if ended_by.is_none() => {
                ended_by = Some(Termination::Timeout);
                kill(channel, id).await;
                continue;
            }
            _ = cancel.cancelled(), if ended_by.is_none() => {
                ended_by = Some(Termination::Cancelled);
                kill(channel, id).await;
                continue;
            }
            _ = tokio::time::sleep(KILL_GRACE), if ended_by.is_some() => {
                break Err(RuntimeError::spawn(
                    "end the command",
                    format!("its exit was not reported {} s after it was killed", KILL_GRACE.as_secs()),
                ));
            }
        };
        match report {
            None => break Err(not_running_because("its init is gone".into())),
            Some(SessionReport::Started { .. } | SessionReport::Terminal { .. }) => continue,
            Some(SessionReport::Refused { message, .. }) => {
                break Err(RuntimeError::InvalidControl {
                    control: "command",
                    reason: message,
                })
            }
            Some(SessionReport::Exit { code, signal, .. }) => {
                let termination = match (ended_by, signal) {
                    (Some(by), _) => by,
                    (None, Some(_)) => Termination::Signaled,
                    (None, None) => Termination::Exited,
                };
                break Ok((termination, code, signal));
            }
            Some(
                SessionReport::Stopped
                | SessionReport::Paused { .. }
                | SessionReport::Resumed { .. }
                | SessionReport::HandedOver { .. }
                | SessionReport::Respawned { .. },
            ) => continue,
        }
    };
    exited.cancel();
    result
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn kill(channel: &Channel, id: u64) {
    let _ = channel
        .send(
            &SessionRequest::Signal {
                id,
                signal: libc::SIGKILL,
            },
            &[],
        )
        .await;
}

/// Relays one output pipe to the sink as it is written, until its end, or, once the command
/// has exited, until what is in it has been read (a process that left the command's group
/// may hold the pipe open: its later output is not the command's). Returns the bytes relayed.
async fn relay(
    read: OwnedFd,
    stream: OutputStream,
    sink: &dyn OutputSink,
    exited: &CancellationToken,
) -> u64 {
    let Ok(pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(read) else {
        return 0;
    };
    let mut total = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    let emit = |bytes: &[u8], total: &mut u64| {
        *total += bytes.len() as u64;
        sink.event(OutputEvent::Output {
            stream,
            bytes: bytes.to_vec(),
            timestamp_ms: now_ms(),
        });
    };
    loop {
        tokio::select! {
            biased;
            r = pipe.readable() => {
                if r.is_err() {
                    break;
                }
                match pipe.try_read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        emit(&buf[..n], &mut total);
                        sink.room().await;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => break,
                }
            }
            _ = exited.cancelled() => {
                // Everything the command wrote is in the pipe by now. Read with the
                // syscall itself: tokio's `try_read` answers WouldBlock, without reading, while
                // the reactor has not yet seen the pipe ready, and that data would be lost.
                while let Ok(n) = read_now(pipe.as_raw_fd(), &mut buf) {
                    if n == 0 {
                        break;
                    }
                    emit(&buf[..n], &mut total);
                }
                break;
            }
        }
    }
    total
}

/// One non-blocking `read(2)` of a pipe (its descriptor is non-blocking: tokio made it so).
pub(super) fn read_now(fd: std::os::fd::RawFd, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        // SAFETY: reads into a valid buffer of its own length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
