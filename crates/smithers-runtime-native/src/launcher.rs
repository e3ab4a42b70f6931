//! Starting a sandbox's init, for `execute` and for the warm sandboxes alike: forked by the
//! runtime's zygote where there is one, else executed from the binary; its prelude and plan
//! sent as lines on its control socket, and its reports read back.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

use smithers_runtime::RuntimeError;
use tokio::io::AsyncRead;

use crate::backend::Backend;
use crate::host::HostCaps;
use crate::init_command::InitCommand;
use crate::plan;
use crate::threads::blocking;
use crate::zygote::Zygote;

/// How long a warm init may take to report `warm` before it is given up.
const WARM_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) fn spawn_err(reason: impl ToString) -> RuntimeError {
    RuntimeError::spawn("start the sandbox init", reason)
}

/// A started init: its pid, its output pipes and, when spawned directly, the child to reap.
pub(crate) struct SpawnedInit {
    pub(crate) pid: Option<i32>,
    pub(crate) stdout: std::pin::Pin<Box<dyn AsyncRead + Send>>,
    pub(crate) stderr: std::pin::Pin<Box<dyn AsyncRead + Send>>,
    pub(crate) child: Option<tokio::process::Child>,
}

/// An init forked from the zygote: its pid and the read ends of its stdout and stderr pipes
/// (plain descriptors, made async only where they are read).
#[derive(Debug)]
pub(crate) struct ForkedInit {
    pub(crate) pid: i32,
    pub(crate) stdout: OwnedFd,
    pub(crate) stderr: OwnedFd,
}

impl ForkedInit {
    pub(crate) fn into_spawned(self) -> Result<SpawnedInit, RuntimeError> {
        let pipe = |fd| tokio::net::unix::pipe::Receiver::from_owned_fd(fd).map_err(spawn_err);
        Ok(SpawnedInit {
            pid: Some(self.pid),
            stdout: Box::pin(pipe(self.stdout)?),
            stderr: Box::pin(pipe(self.stderr)?),
            child: None,
        })
    }
}

/// The runtime's zygote, if started: shared with the blocking thread that waits for its
/// answer (the lock is held across that wait, so one thread talks to it at a time).
pub(crate) type ZygoteSlot = std::sync::Arc<std::sync::Mutex<Option<Zygote>>>;

/// Starts the init with `control` as its fd 0 and fresh pipes as its stdout and stderr:
/// forked by the runtime's zygote where there is one (replaced once if it failed), else
/// spawned from the binary. The zygote is asked on a blocking thread: its answer is a
/// blocking receive (up to its timeout, and a replacement zygote's start) under its lock.
pub(crate) async fn spawn_init(
    zygote: Option<&ZygoteSlot>,
    init: &InitCommand,
    control: std::os::unix::net::UnixStream,
) -> Result<SpawnedInit, RuntimeError> {
    let control = match zygote {
        Some(zygote) => {
            let (zygote, program) = (zygote.clone(), init.clone());
            let (forked, control) = blocking("start the sandbox init", move || {
                let forked = fork_from_zygote(&zygote, &program, &control);
                (forked, control)
            })
            .await?;
            if let Some(forked) = forked {
                // The init has its own copy now; ours must go so that EOF means "init gone".
                drop(control);
                return forked.into_spawned();
            }
            control
        }
        None => control,
    };
    let mut cmd = tokio::process::Command::new(&init.program);
    cmd.args(&init.args)
        .env_clear()
        .stdin(Stdio::from(OwnedFd::from(control)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| spawn_err(format!("{}: {e}", init.program.display())))?;
    // The Command still owns the init's end of the socket: drop it so EOF means "init gone".
    drop(cmd);
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| spawn_err("no stdout pipe"))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| spawn_err("no stderr pipe"))?;
    Ok(SpawnedInit {
        pid: child.id().map(|p| p as i32),
        stdout: Box::pin(stdout),
        stderr: Box::pin(stderr),
        child: Some(child),
    })
}

/// A close-on-exec pipe: (read end, write end).
pub(crate) fn output_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two new descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub(crate) fn fork_from_zygote(
    zygote: &std::sync::Mutex<Option<Zygote>>,
    init: &InitCommand,
    control: &std::os::unix::net::UnixStream,
) -> Option<ForkedInit> {
    use std::os::fd::AsRawFd;
    let (out_r, out_w) = output_pipe().ok()?;
    let (err_r, err_w) = output_pipe().ok()?;
    let mut slot = zygote.lock().unwrap_or_else(|p| p.into_inner());
    for _attempt in 0..2 {
        if slot.is_none() {
            *slot = Zygote::start(init).ok();
        }
        let z = slot.as_ref()?;
        match z.fork(&[control.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()]) {
            Ok(pid) => {
                return Some(ForkedInit {
                    pid,
                    stdout: out_r,
                    stderr: err_r,
                })
            }
            // A zygote that failed is replaced (dropping it ends it).
            Err(_) => *slot = None,
        }
    }
    None
}

/// Starts a cold init: the prelude into a fresh control socket, then the init (see
/// [`spawn_init`]). Returns our end of the socket and the init.
pub(crate) async fn start_cold(
    zygote: Option<&ZygoteSlot>,
    init: &InitCommand,
    prelude_line: &[u8],
) -> Result<(std::os::unix::net::UnixStream, SpawnedInit), RuntimeError> {
    use std::io::Write;
    let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(spawn_err)?;
    ours.write_all(prelude_line)
        .map_err(|e| spawn_err(format!("sending the prelude: {e}")))?;
    let spawned = spawn_init(zygote, init, theirs).await?;
    Ok((ours, spawned))
}

pub(crate) fn json_line(value: &impl serde::Serialize) -> Result<Vec<u8>, RuntimeError> {
    let mut line = serde_json::to_vec(value).map_err(spawn_err)?;
    line.push(b'\n');
    Ok(line)
}

/// The prelude of this sandbox's init (see [`plan::Prelude`]).
pub(crate) fn prelude(caps: &HostCaps, backend: &Backend, allow_network: bool) -> plan::Prelude {
    plan::Prelude::new(
        caps.uid,
        caps.gid,
        backend.cgroups.join_plan(),
        allow_network,
    )
}

/// Reads the init's next report, which must be an `event` one (`warm`, or `ready` of an armed
/// one), and the last it sent (bounded in time and size).
pub(crate) fn await_report(control: &UnixStream, event: &str) -> Result<serde_json::Value, String> {
    let deadline = Instant::now() + WARM_TIMEOUT;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let v: serde_json::Value = serde_json::from_slice(&line)
                .map_err(|e| format!("the warm init sent what is not a report: {e}"))?;
            match v["event"].as_str() {
                Some(e) if e == event && buf.is_empty() => return Ok(v),
                Some("error") => {
                    return Err(format!(
                        "the warm init failed ({}): {}",
                        v["stage"].as_str().unwrap_or("init"),
                        v["message"].as_str().unwrap_or("unknown")
                    ))
                }
                _ => return Err(format!("the warm init reported {v}, not {event}")),
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || buf.len() > 64 << 10 {
            return Err(format!("the warm init did not report {event} within 10 s"));
        }
        control
            .set_read_timeout(Some(left))
            .map_err(|e| e.to_string())?;
        let n = (&*control)
            .read(&mut chunk)
            .map_err(|e| format!("reading the warm init's report: {e}"))?;
        if n == 0 {
            return Err(format!("the warm init ended before it reported {event}"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}
