//! A pre-started init ("zygote") that forks a fresh init (P0) for each sandbox, so that a
//! runtime starting many sandboxes pays the exec of the init binary once instead of per
//! sandbox (measured here: 1.7 ms of a 6.8 ms `execute`, spawn to the init's `main`).
//!
//! The zygote is the init binary in `--zygote` mode: single-threaded, with no state of its
//! own. It receives, over a `SOCK_SEQPACKET` socket (its fd 0), the three descriptors a fresh
//! init would have been spawned with (control socket, stdout and stderr pipes), forks, and
//! the child installs them as fds 0, 1 and 2 and runs exactly what a freshly executed init
//! runs (`smithers_sandbox_init`'s sandbox mode, whose `zygote` module is the zygote's side;
//! this one is the runtime's). The zygote answers with the child's pid. Children
//! are reaped by the kernel (SIGCHLD ignored in the zygote, restored in the child).
//!
//! Lifetimes: the zygote exits when the runtime's end of its socket closes (the runtime was
//! dropped or died). A sandbox never depends on the zygote after its fork: its init watches
//! its own control socket, as before. A zygote that fails is replaced; when none can be had,
//! the runtime spawns the init directly.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use smithers_sandbox_init::zygote::{send_fds, seqpacket_pair};

use crate::init_command::InitCommand;

/// How long the runtime waits for the zygote's answer before giving up on it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The runtime's handle on its zygote.
#[derive(Debug)]
pub(crate) struct Zygote {
    sock: Option<OwnedFd>,
    child: Child,
}

impl Zygote {
    /// Starts the zygote from the init binary.
    pub(crate) fn start(init: &InitCommand) -> std::io::Result<Zygote> {
        let (ours, theirs) = seqpacket_pair()?;
        let timeout = libc::timeval {
            tv_sec: ANSWER_TIMEOUT.as_secs() as libc::time_t,
            tv_usec: 0,
        };
        // SAFETY: setsockopt on our socket with a valid timeval of the given size.
        unsafe {
            libc::setsockopt(
                ours.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        let child = Command::new(&init.program)
            .args(&init.args)
            .arg("--zygote")
            .env_clear()
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        Ok(Zygote {
            sock: Some(ours),
            child,
        })
    }

    /// Forks an init whose fds 0, 1 and 2 are `fds`; returns its pid.
    pub(crate) fn fork(&self, fds: &[RawFd; 3]) -> std::io::Result<libc::pid_t> {
        let sock = self
            .sock
            .as_ref()
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotConnected))?
            .as_raw_fd();
        send_fds(sock, fds.as_slice())?;
        let mut bytes = [0u8; 4];
        let n = loop {
            // SAFETY: `bytes` is a valid writable buffer of its length.
            let n = unsafe { libc::recv(sock, bytes.as_mut_ptr().cast(), bytes.len(), 0) };
            if n >= 0 {
                break n;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        if n != 4 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the zygote did not answer",
            ));
        }
        let pid = i32::from_ne_bytes(bytes);
        if pid <= 0 {
            return Err(std::io::Error::from_raw_os_error(-pid));
        }
        Ok(pid)
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        // Closing our end makes the zygote exit; reap it (bounded), else kill it.
        self.sock.take();
        // It exits within tens of microseconds of seeing EOF: its pidfd says when, at once.
        match exited_within(self.child.id(), Duration::from_millis(100)) {
            Some(true) => {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
            }
            Some(false) => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            None => {}
        }
        // No pidfd (Linux before 5.3): wait in short steps growing to 2 ms (a flat 2 ms sleep
        // was a tenth of a whole `run -- true`), ~100 ms in all.
        let mut pause = Duration::from_micros(25);
        let mut waited = Duration::ZERO;
        while waited < Duration::from_millis(100) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(pause);
            waited += pause;
            pause = (pause * 2).min(Duration::from_millis(2));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether our child `pid` exits within `timeout`, woken by its pidfd the moment it does (a
/// sleep-and-check loop oversleeps each round by the timer slack). `None` when this kernel
/// has no pidfd.
fn exited_within(pid: u32, timeout: Duration) -> Option<bool> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut fds = [libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: `fds` is a valid array of one pollfd.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, left.as_millis().max(1) as libc::c_int) };
        if n > 0 {
            return Some(true);
        }
        if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Some(false);
        }
    }
}
