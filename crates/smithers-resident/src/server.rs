//! The service's end: the listening socket, who is admitted, and a served request's stdio.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::fs::{FlockOperation, Mode, OFlags};
use rustix::net::UCred;

use crate::place::Place;
use crate::wire::{self, Ask, RunRequest};

/// How long a connected client may take to send its request, or its go.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The namespaces a client must share with the service: a step served here sees this
/// service's file systems, network, users, processes and cgroups, so they must be the
/// client's own.
const NAMESPACES: &[&str] = &["mnt", "net", "user", "pid", "ipc", "uts", "cgroup"];

/// The listening socket of the one service of this build.
#[derive(Debug)]
pub struct Listener {
    listener: UnixListener,
    place: Place,
    /// Holds the lock for the service's life.
    _lock: File,
    /// What a client must share with the service, read once.
    own: Arc<Surroundings>,
}

/// A process's namespaces and root, as admission compares them.
#[derive(Debug, PartialEq, Eq)]
struct Surroundings {
    namespaces: Vec<std::path::PathBuf>,
    root: (u64, u64),
}

impl Surroundings {
    /// Those of `pid` (`"self"` for ours).
    fn of(pid: &str) -> Result<Surroundings, String> {
        let namespaces = NAMESPACES
            .iter()
            .map(|ns| {
                std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))
                    .map_err(|e| format!("the {ns} namespace of process {pid} cannot be read: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let root = std::fs::metadata(format!("/proc/{pid}/root"))
            .map(|m| (m.dev(), m.ino()))
            .map_err(|e| format!("the root of process {pid} cannot be read: {e}"))?;
        Ok(Surroundings { namespaces, root })
    }

    /// Why a client in `theirs` may not be served by a service in `self`.
    fn differences(&self, theirs: &Surroundings) -> Option<String> {
        for (i, ns) in NAMESPACES.iter().enumerate() {
            if self.namespaces[i] != theirs.namespaces[i] {
                return Some(format!("the client is in another {ns} namespace"));
            }
        }
        (self.root != theirs.root).then(|| "the client has another root directory".to_string())
    }
}

/// Why a service could not start.
#[derive(Debug)]
pub enum BindError {
    /// Another service of this build holds the lock.
    AlreadyRunning,
    Io(io::Error),
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BindError::AlreadyRunning => write!(f, "a service of this build is already running"),
            BindError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl Listener {
    /// Takes the build's lock and listens on its socket (a socket left by a service that
    /// died is replaced: the lock says nobody serves it).
    pub fn bind(place: &Place) -> Result<Listener, BindError> {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&place.lock)
            .map_err(BindError::Io)?;
        match rustix::fs::flock(&lock, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Err(BindError::AlreadyRunning),
            Err(e) => return Err(BindError::Io(e.into())),
        }
        match std::fs::remove_file(&place.socket) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(BindError::Io(e)),
        }
        let listener = UnixListener::bind(&place.socket).map_err(BindError::Io)?;
        // The directory already keeps others out; the socket says so too.
        std::fs::set_permissions(&place.socket, std::fs::Permissions::from_mode(0o600))
            .map_err(BindError::Io)?;
        let own = Surroundings::of("self").map_err(|e| BindError::Io(io::Error::other(e)))?;
        Ok(Listener {
            listener,
            place: place.clone(),
            _lock: lock,
            own: Arc::new(own),
        })
    }

    /// The next connection, or `None` when `timeout` passes without one. The peer's
    /// credentials are checked here: another user (root included) is turned away before a
    /// byte of its request is read.
    pub fn next(&self, timeout: Duration) -> io::Result<Option<Incoming>> {
        let mut fds = [rustix::event::PollFd::new(
            &self.listener,
            rustix::event::PollFlags::IN,
        )];
        let ts = rustix::event::Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let (stream, _) = self.listener.accept()?;
        let peer = rustix::net::sockopt::socket_peercred(&stream)?;
        Ok(Some(Incoming {
            stream,
            peer,
            build: self.place.build.clone(),
            own: self.own.clone(),
        }))
    }

    pub fn place(&self) -> &Place {
        &self.place
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Only our own socket: the lock is still held, so nobody else bound it since.
        let _ = std::fs::remove_file(&self.place.socket);
    }
}

/// A connection whose request is not read yet.
#[derive(Debug)]
pub struct Incoming {
    stream: UnixStream,
    peer: UCred,
    build: String,
    own: Arc<Surroundings>,
}

impl Incoming {
    /// The client's process (in the service's pid namespace; 0 when it is not visible).
    pub fn peer_pid(&self) -> i32 {
        self.peer.pid.as_raw_nonzero().get()
    }

    /// Reads the request, after checking that the peer is this user and group. An error
    /// has been said to the client (when it can still hear it) and the connection closed.
    pub fn read(self) -> Result<(Ask, Connection), String> {
        let me = (rustix::process::geteuid(), rustix::process::getegid());
        if (self.peer.uid, self.peer.gid) != me {
            let why = format!(
                "uid {} gid {} is not this service's user ({} {})",
                self.peer.uid.as_raw(),
                self.peer.gid.as_raw(),
                me.0.as_raw(),
                me.1.as_raw()
            );
            let _ = wire::write_line(&self.stream, &format!("no {why}"));
            return Err(why);
        }
        self.stream
            .set_read_timeout(Some(CLIENT_TIMEOUT))
            .map_err(|e| e.to_string())?;
        match wire::read_request(&self.stream, &self.build) {
            Ok(ask) => Ok((
                ask,
                Connection {
                    stream: self.stream,
                    peer_pid: self.peer.pid.as_raw_nonzero().get(),
                    own: self.own,
                },
            )),
            Err(why) => {
                let _ = wire::write_line(&self.stream, &format!("no {why}"));
                Err(why)
            }
        }
    }
}

/// A connection whose request has been read.
#[derive(Debug)]
pub struct Connection {
    stream: UnixStream,
    peer_pid: i32,
    own: Arc<Surroundings>,
}

impl Connection {
    /// Declines: the client runs the step itself (or, under `require`, says why).
    pub fn decline(self, why: &str) {
        let _ = wire::write_line(&self.stream, &format!("no {why}"));
    }

    /// Answers a control request.
    pub fn answer(self, text: &str) {
        let _ = wire::write_line(&self.stream, text);
    }

    /// Whether the client may be served here: the same namespaces and root as the service,
    /// the same environment (but [`crate::IGNORED_ENV`]), and a working directory that is a
    /// directory. The reason when not (names only: values may be secrets).
    pub fn admit(&self, request: &RunRequest) -> Result<(), String> {
        if self.peer_pid <= 0 {
            return Err("the client's process is not visible from the service".into());
        }
        let theirs = Surroundings::of(&self.peer_pid.to_string())?;
        if let Some(why) = self.own.differences(&theirs) {
            return Err(why);
        }
        let differing = env_differences(
            &request.env,
            std::env::vars_os().map(|(k, v)| {
                let mut e = k;
                e.push("=");
                e.push(v);
                e
            }),
        );
        if !differing.is_empty() {
            return Err(format!(
                "the client's environment differs from the service's in {}",
                differing.join(", ")
            ));
        }
        let cwd = rustix::fs::fstat(&request.fds[3]).map_err(|e| e.to_string())?;
        if rustix::fs::FileType::from_raw_mode(cwd.st_mode) != rustix::fs::FileType::Directory {
            return Err("the working directory sent is not a directory".into());
        }
        Ok(())
    }

    /// Admits the client: answers `ok` and waits for its go. The session then runs with the
    /// client's stdio and working directory ([`Session::redirect`]).
    pub fn start(self, request: RunRequest) -> io::Result<Session> {
        wire::write_line(&self.stream, "ok")?;
        let mut go = [0u8; 1];
        let n = io::Read::read(&mut &self.stream, &mut go)?;
        if n != 1 || go[0] != b'g' {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the client did not confirm its request",
            ));
        }
        self.stream.set_read_timeout(None)?;
        let interrupts = Interrupts::default();
        let reader = self.stream.try_clone()?;
        let latch = interrupts.clone();
        // The client's Ctrl-C (`i`), or its end (it died, or was killed): either cancels.
        std::thread::Builder::new()
            .name("resident-client".into())
            .spawn(move || {
                let mut byte = [0u8; 1];
                loop {
                    match io::Read::read(&mut &reader, &mut byte) {
                        Ok(1) if byte[0] == b'i' => latch.fire(),
                        Ok(1) => {}
                        Ok(_) | Err(_) => {
                            latch.fire();
                            return;
                        }
                    }
                }
            })?;
        Ok(Session {
            stream: self.stream,
            request,
            interrupts,
        })
    }
}

/// `KEY`s whose entries differ between `theirs` and `ours` (present in one only, or with
/// another value), but for [`crate::IGNORED_ENV`]; sorted, each shown escaped.
pub fn env_differences(
    theirs: &[std::ffi::OsString],
    ours: impl Iterator<Item = std::ffi::OsString>,
) -> Vec<String> {
    use std::collections::BTreeMap;
    let split = |e: &std::ffi::OsString| {
        let bytes = e.as_bytes();
        let at = bytes.iter().position(|b| *b == b'=').unwrap_or(bytes.len());
        (
            bytes[..at].to_vec(),
            bytes.get(at + 1..).unwrap_or(&[]).to_vec(),
        )
    };
    let keep = |k: &Vec<u8>| {
        !crate::IGNORED_ENV
            .iter()
            .any(|i| i.as_bytes() == k.as_slice())
    };
    let theirs: BTreeMap<_, _> = theirs.iter().map(split).filter(|(k, _)| keep(k)).collect();
    let ours: BTreeMap<_, _> = ours.map(|e| split(&e)).filter(|(k, _)| keep(k)).collect();
    let mut keys: Vec<&Vec<u8>> = theirs.keys().chain(ours.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| theirs.get(*k) != ours.get(*k))
        .map(|k| String::from_utf8_lossy(k).escape_debug().to_string())
        .collect()
}

/// The client's interrupts: a latch that calls the handler set for it, or remembers an
/// interrupt that came before the handler.
#[derive(Clone, Default)]
pub struct Interrupts(Arc<Mutex<Latch>>);

#[derive(Default)]
struct Latch {
    pending: bool,
    over: bool,
    handler: Option<Box<dyn Fn() + Send>>,
}

impl std::fmt::Debug for Interrupts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Interrupts")
    }
}

impl Interrupts {
    /// Calls `handler` at each interrupt from now on (at once for one already received).
    pub fn on_interrupt(&self, handler: impl Fn() + Send + 'static) {
        let mut latch = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if latch.over {
            return;
        }
        if std::mem::take(&mut latch.pending) {
            handler();
        }
        latch.handler = Some(Box::new(handler));
    }

    fn fire(&self) {
        let mut latch = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if latch.over {
            return;
        }
        match &latch.handler {
            Some(h) => h(),
            None => latch.pending = true,
        }
    }

    /// No handler is called after this (the request is over: the client's end of the
    /// connection closing then is no cancellation).
    fn end(&self) {
        let mut latch = self.0.lock().unwrap_or_else(|p| p.into_inner());
        latch.over = true;
        latch.handler = None;
    }
}

/// A request being served.
#[derive(Debug)]
pub struct Session {
    stream: UnixStream,
    request: RunRequest,
    interrupts: Interrupts,
}

impl Session {
    pub fn argv(&self) -> &[std::ffi::OsString] {
        &self.request.argv
    }

    pub fn interrupts(&self) -> Interrupts {
        self.interrupts.clone()
    }

    /// Puts the client's stdin, stdout, stderr, working directory and umask in place of the
    /// service's, until the guard is dropped. The process is the client's for that time:
    /// requests are served one at a time, and what other threads write to stderr meanwhile
    /// reaches the client.
    pub fn redirect(&self) -> io::Result<Redirected> {
        let saved = Redirected {
            stdio: [
                rustix::io::dup(std::io::stdin().as_fd())?,
                rustix::io::dup(std::io::stdout().as_fd())?,
                rustix::io::dup(std::io::stderr().as_fd())?,
            ],
            cwd: rustix::fs::open(
                ".",
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?,
            umask: rustix::process::umask(Mode::from_raw_mode(self.request.umask)),
        };
        let fds = &self.request.fds;
        rustix::stdio::dup2_stdin(&fds[0])?;
        rustix::stdio::dup2_stdout(&fds[1])?;
        rustix::stdio::dup2_stderr(&fds[2])?;
        rustix::process::fchdir(&fds[3])?;
        Ok(saved)
    }

    /// Says the step is over with `code`, and closes the connection.
    pub fn finish(self, code: u8) {
        self.interrupts.end();
        let _ = wire::write_line(&self.stream, &format!("exit {code}"));
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// The service's own stdio, working directory and umask, put back when dropped.
#[derive(Debug)]
pub struct Redirected {
    stdio: [OwnedFd; 3],
    cwd: OwnedFd,
    umask: Mode,
}

impl Drop for Redirected {
    fn drop(&mut self) {
        let _ = rustix::stdio::dup2_stdin(&self.stdio[0]);
        let _ = rustix::stdio::dup2_stdout(&self.stdio[1]);
        let _ = rustix::stdio::dup2_stderr(&self.stdio[2]);
        let _ = rustix::process::fchdir(&self.cwd);
        rustix::process::umask(self.umask);
    }
}

/// Whether a directory entry is a live service's socket: something answers on it.
pub fn answers(socket: &Path) -> bool {
    UnixStream::connect(socket).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn environment_differences_are_named_not_shown() {
        let theirs = vec![
            OsString::from("A=1"),
            OsString::from("SECRET=new"),
            OsString::from("PWD=/x"),
            OsString::from("ONLY_THEIRS=1"),
        ];
        let ours = vec![
            OsString::from("A=1"),
            OsString::from("SECRET=old"),
            OsString::from("PWD=/y"),
            OsString::from("ONLY_OURS=\x1b[31m"),
        ];
        let d = env_differences(&theirs, ours.into_iter());
        assert_eq!(d, vec!["ONLY_OURS", "ONLY_THEIRS", "SECRET"]);
        assert!(!d.join(" ").contains("new") && !d.join(" ").contains("old"));
    }

    #[test]
    fn an_interrupt_before_the_handler_is_kept_and_none_after_the_end() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let i = Interrupts::default();
        i.fire();
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        i.on_interrupt(move || {
            m.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(n.load(Ordering::SeqCst), 1);
        i.fire();
        assert_eq!(n.load(Ordering::SeqCst), 2);
        i.end();
        i.fire();
        assert_eq!(n.load(Ordering::SeqCst), 2);
    }
}
