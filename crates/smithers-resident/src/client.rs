//! The client's end: hand a `run` to the service, relay Ctrl-C, and exit as the step did.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::peer::Identity;
use crate::place::Place;
use crate::wire::{self, Frame};

/// How long the client waits for the service to admit or decline it. A service that does not
/// answer in that time is not used (and, as the client never confirms, never runs the step).
const ADMISSION_TIMEOUT: Duration = Duration::from_secs(5);

/// The outcome of asking the service to run a command line.
#[derive(Debug)]
pub enum Served {
    /// The service ran it; exit with this.
    Exit(u8),
    /// Not served, and nothing was run: the reason (none running, declined, busy...).
    NotServed(String),
}

/// Asks the service of this build to run `argv` (the whole command line) with this process's
/// environment, umask, stdio and working directory.
pub fn run(argv: &[OsString]) -> Served {
    match try_run(argv) {
        Ok(served) => served,
        Err(e) => Served::NotServed(e.to_string()),
    }
}

fn try_run(argv: &[OsString]) -> io::Result<Served> {
    let place = Place::of_this_build(false)?;
    let sock = match UnixStream::connect(&place.socket) {
        Ok(s) => s,
        Err(e) => {
            return Ok(Served::NotServed(format!(
                "no service is running ({}: {e})",
                place.socket.display()
            )))
        }
    };
    // Nothing is sent to a service that is not ours: the same user, namespaces, root and
    // confinement (a process of ours in a container sharing this directory could have bound
    // the name, to receive our environment and descriptors).
    let server = Identity::of_peer(&sock).map_err(io::Error::other)?;
    let me = Identity::of_self().map_err(io::Error::other)?;
    if let Some(why) = me.differences(&server) {
        return Ok(Served::NotServed(format!(
            "the process listening on {} is not a service of ours: {why}",
            place.socket.display()
        )));
    }
    let env: Vec<OsString> = std::env::vars_os()
        .map(|(k, v)| {
            let mut e = k;
            e.push("=");
            e.push(v);
            e
        })
        .collect();
    let cwd = rustix::fs::open(
        ".",
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let fds = [stdin.as_fd(), stdout.as_fd(), stderr.as_fd(), cwd.as_fd()];
    let umask = me
        .umask
        .ok_or_else(|| io::Error::other("no Umask in /proc/self/status"))?;
    sock.set_read_timeout(Some(ADMISSION_TIMEOUT))?;
    Frame::run(&place.build, argv, &env, umask).send(&sock, &fds)?;
    if let Some(why) = prove(&sock, server.pid)? {
        return Ok(Served::NotServed(why));
    }
    match wire::read_line(&sock)? {
        Some(line) if line == "ok" => {}
        Some(line) => {
            return Ok(Served::NotServed(
                line.strip_prefix("no ").unwrap_or(&line).to_string(),
            ))
        }
        None => {
            return Ok(Served::NotServed(
                "the service closed the connection".into(),
            ))
        }
    }
    sock.set_read_timeout(None)?;
    // From the go on the step is the service's: our signals become messages to it.
    let signals = Signals::take()?;
    if let Err(e) = (&sock).write_all_nosignal(b"g") {
        drop(signals);
        return Ok(Served::NotServed(format!("confirming the request: {e}")));
    }
    Ok(Served::Exit(wait(&sock, &signals, &place)))
}

/// Answers the service's challenge (its `prove <n>` line, which comes first; see
/// [`crate::peer::Challenge`]), once the request is sent. `Some(reason)` when the service
/// declined instead. A client that cannot read the challenge sends a proof that fails: the
/// service declines it with the reason, and counts it.
pub fn prove(sock: &UnixStream, service_pid: i32) -> io::Result<Option<String>> {
    let Some(line) = wire::read_line(sock)? else {
        return Ok(Some("the service closed the connection".into()));
    };
    let Some(fd) = line
        .strip_prefix(wire::PROVE)
        .and_then(|rest| rest.strip_prefix(' '))
    else {
        return Ok(Some(line.strip_prefix("no ").unwrap_or(&line).to_string()));
    };
    let fd: i32 = fd.parse().map_err(|_| {
        io::Error::other(format!(
            "the service said {:?}",
            line.escape_debug().to_string()
        ))
    })?;
    let proof = crate::peer::answer_challenge(service_pid, fd).unwrap_or(wire::NO_PROOF);
    sock.write_all_nosignal(&proof)?;
    Ok(None)
}

/// Waits for the step's end, relaying Ctrl-C: the first cancels the step (the service says
/// so), the second exits at once, as `run` does on its own. SIGTERM, SIGHUP and SIGQUIT end
/// this process as they would have ended `run`, and the service cancels the step.
fn wait(sock: &UnixStream, signals: &Signals, place: &Place) -> u8 {
    let mut interrupts = 0;
    loop {
        let mut fds = [
            rustix::event::PollFd::new(sock, rustix::event::PollFlags::IN),
            rustix::event::PollFd::new(&signals.fd, rustix::event::PollFlags::IN),
        ];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                eprintln!("error: waiting for the resident service: {e}");
                return 1;
            }
        }
        let (sock_ready, signal_ready) =
            (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
        if signal_ready {
            match signals.read() {
                Some(libc::SIGINT) => {
                    interrupts += 1;
                    if interrupts == 1 {
                        let _ = sock.write_all_nosignal(b"i");
                    } else {
                        eprintln!("interrupted again: exiting without waiting for cleanup");
                        return 130;
                    }
                }
                Some(sig) => signals.die_of(sig),
                None => {}
            }
        }
        if sock_ready {
            return match wire::read_line(sock) {
                Ok(Some(line)) => match line.strip_prefix("exit ").and_then(|c| c.parse().ok()) {
                    Some(code) => code,
                    None => {
                        eprintln!(
                            "error: the resident service said {:?}",
                            line.escape_debug().to_string()
                        );
                        1
                    }
                },
                Ok(None) | Err(_) => {
                    eprintln!(
                        "error: the resident service ended before the step did (its log: {})",
                        place.log.display()
                    );
                    1
                }
            };
        }
    }
}

trait WriteNoSignal {
    fn write_all_nosignal(self, bytes: &[u8]) -> io::Result<()>;
}

impl WriteNoSignal for &UnixStream {
    /// A write that gives EPIPE rather than SIGPIPE when the service is gone.
    fn write_all_nosignal(self, bytes: &[u8]) -> io::Result<()> {
        let n = rustix::net::send(self, bytes, rustix::net::SendFlags::NOSIGNAL)?;
        if n == bytes.len() {
            Ok(())
        } else {
            Err(io::ErrorKind::WriteZero.into())
        }
    }
}

/// SIGINT, SIGTERM, SIGHUP and SIGQUIT, blocked and read from a signalfd while the service
/// runs the step; unblocked again when dropped.
struct Signals {
    fd: OwnedFd,
    set: libc::sigset_t,
}

const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

impl Signals {
    fn take() -> io::Result<Signals> {
        // SAFETY: sigemptyset/sigaddset write only into the local set, which is a plain C
        // struct and fully initialised by sigemptyset before it is read; sigaction with a
        // null new action only reads the current one into `old`.
        let set = unsafe {
            let mut set = std::mem::zeroed::<libc::sigset_t>();
            libc::sigemptyset(&mut set);
            for sig in FORWARDED {
                // A signal this process ignores (`nohup` ignores SIGHUP) is left alone: it
                // would not have ended `run` either. But for SIGINT: `run` on its own cancels
                // at a Ctrl-C even when started with SIGINT ignored (as a shell without job
                // control starts what it puts in the background), and so does a served one.
                let mut old = std::mem::zeroed::<libc::sigaction>();
                let ignored = sig != libc::SIGINT
                    && libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                    && old.sa_sigaction == libc::SIG_IGN;
                if !ignored {
                    libc::sigaddset(&mut set, sig);
                }
            }
            set
        };
        // SAFETY: `set` is a valid, initialised signal set; the old mask is not asked for.
        // The client is single-threaded here, so blocking in this thread blocks delivery to
        // the process.
        if unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `set` is valid; -1 asks for a new descriptor, which we own from here.
        let raw = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC) };
        if raw < 0 {
            let e = io::Error::last_os_error();
            // SAFETY: as above: unblocks what we just blocked.
            unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
            return Err(e);
        }
        // SAFETY: `raw` is a fresh descriptor returned by signalfd, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Signals { fd, set })
    }

    /// The next signal received, if one is there.
    fn read(&self) -> Option<libc::c_int> {
        // SAFETY: signalfd_siginfo is a plain C struct for which all-zero bytes are valid.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: `info` is a writable buffer of exactly `size` bytes; the fd is ours.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                size,
            )
        };
        (n as usize == size).then_some(info.ssi_signo as libc::c_int)
    }

    /// Ends this process as `sig` would have ended it without the service (its default
    /// action): the connection closes with it, and the service cancels the step.
    fn die_of(&self, sig: libc::c_int) -> ! {
        // SAFETY: raise queues `sig` (blocked, so pending); unblocking it delivers it with
        // its default action, which for these four signals ends the process.
        unsafe {
            libc::raise(sig);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &self.set, std::ptr::null_mut());
        }
        std::process::exit(128 + sig)
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        // SAFETY: unblocks the set blocked by `take`.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &self.set, std::ptr::null_mut()) };
    }
}
