//! The service's end: the listening socket, who is admitted, and a served request's stdio.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::fs::{FlockOperation, Mode, OFlags};

use crate::peer::{Challenge, Identity};
use crate::place::Place;
use crate::wire::{self, Ask, RunRequest};

/// How long a connected client may take to send its request, or its go.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The listening socket of the one service of this build.
#[derive(Debug)]
pub struct Listener {
    listener: UnixListener,
    place: Place,
    /// Holds the lock for the service's life.
    _lock: File,
    /// The service itself, as clients are compared with it (read once).
    own: Arc<Identity>,
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
        let own = Identity::of_self().map_err(|e| BindError::Io(io::Error::other(e)))?;
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
        // Read at once, while the process that connected is the one at its pid (it waits
        // for our answer); checked again before its step starts.
        let peer = Identity::of_peer(&stream);
        Ok(Some(Incoming {
            stream,
            peer,
            build: self.place.build.clone(),
            own: self.own.clone(),
        }))
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
    peer: Result<Identity, String>,
    build: String,
    own: Arc<Identity>,
}

impl Incoming {
    /// Reads the request, after checking that the peer is this user and group, in the
    /// service's namespaces and root, with its groups, capabilities and confinement: anyone
    /// else is turned away before a byte of its request is read. Then the peer must answer
    /// the service's [`Challenge`] (it may inspect the service, so no Landlock domain narrower
    /// than the service's confines it), or it is turned away with its request unused. An
    /// error has been said to the client (when it can still hear it) and the connection closed.
    pub fn read(self) -> Result<(Ask, Connection), String> {
        let stream = self.stream;
        let decline = |why: String| {
            let _ = wire::write_line(&stream, &format!("no {why}"));
            Err(why)
        };
        let peer = self.peer.and_then(|p| match self.own.differences(&p) {
            None => Ok(p),
            Some(why) => Err(why),
        });
        let peer = match peer {
            Ok(p) => p,
            Err(why) => return decline(why),
        };
        // Asked before the request is read: the client sends its request without waiting,
        // and finds the question when it has.
        let challenge = match Challenge::new() {
            Ok(c) => c,
            Err(e) => return decline(format!("the service could not make a challenge: {e}")),
        };
        wire::write_line(
            &stream,
            &format!("{} {}", wire::PROVE, challenge.descriptor()),
        )
        .map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(CLIENT_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let ask = match wire::read_request(&stream, &self.build) {
            Ok(ask) => ask,
            Err(why) => return decline(why),
        };
        let mut proof = [0u8; wire::PROOF_LEN];
        if let Err(e) = io::Read::read_exact(&mut &stream, &mut proof) {
            return decline(format!("the client sent no answer to the challenge: {e}"));
        }
        if !challenge.verify(&proof) {
            return decline(format!(
                "the client did not show it may inspect the service (by reading its \
                 /proc/{}/fd/{}): it is confined where the service is not (a Landlock domain \
                 of its own?), and a step served here would run outside that confinement",
                std::process::id(),
                challenge.descriptor()
            ));
        }
        // Answered: its descriptor goes now, not with the connection.
        drop(challenge);
        Ok((ask, Connection { stream, peer }))
    }
}

/// A connection whose request has been read.
#[derive(Debug)]
pub struct Connection {
    stream: UnixStream,
    peer: Identity,
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
    /// the same environment (but [`crate::vars::IGNORED_ENV`]), and a working directory that is a
    /// directory. The reason when not (names only: values may be secrets).
    pub fn admit(&self, request: &RunRequest) -> Result<(), String> {
        if let Some(why) = self.peer.confined() {
            return Err(why);
        }
        if !self.peer.still_there() {
            return Err("the process that connected is gone".into());
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
                        Ok(1) if byte[0] == b'i' => latch.fire(false),
                        Ok(1) => {}
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Ok(_) | Err(_) => {
                            latch.fire(true);
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
/// another value), but for [`crate::vars::IGNORED_ENV`]; sorted, each shown escaped.
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
        !crate::vars::IGNORED_ENV
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
    handler: Option<Arc<dyn Fn() + Send + Sync>>,
    /// The client's stdio is in place of the service's ([`Session::redirect`]).
    redirected: bool,
}

impl std::fmt::Debug for Interrupts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Interrupts")
    }
}

impl Interrupts {
    /// Calls `handler` at each interrupt from now on (at once for one already received).
    pub fn on_interrupt(&self, handler: impl Fn() + Send + Sync + 'static) {
        let handler: Arc<dyn Fn() + Send + Sync> = Arc::new(handler);
        let call_now = {
            let mut latch = self.lock();
            if latch.over {
                return;
            }
            latch.handler = Some(handler.clone());
            std::mem::take(&mut latch.pending)
        };
        if call_now {
            handler();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Latch> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An interrupt: a Ctrl-C, or (`gone`) the client's end. A client that is gone gets
    /// nothing more written to its terminal or pipes: the rest of the step's output and its
    /// summary go to /dev/null (the bundle's log keeps the output), so that a user's prompt
    /// is not written over and a pipe nobody reads cannot block the service.
    fn fire(&self, gone: bool) {
        let handler = {
            let mut latch = self.lock();
            if latch.over {
                return;
            }
            if gone && latch.redirected {
                silence_stdio();
            }
            match &latch.handler {
                Some(h) => Some(h.clone()),
                None => {
                    latch.pending = true;
                    None
                }
            }
        };
        // Called without the lock: a handler that writes may block, and the restore of the
        // service's stdio takes the lock.
        if let Some(handler) = handler {
            handler();
        }
    }

    /// No handler is called after this (the request is over: the client's end of the
    /// connection closing then is no cancellation).
    fn end(&self) {
        let mut latch = self.lock();
        latch.over = true;
        latch.handler = None;
    }
}

/// /dev/null over stdin, stdout and stderr (best effort: they stay as they were otherwise).
fn silence_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        let _ = rustix::stdio::dup2_stdin(&null);
        let _ = rustix::stdio::dup2_stdout(&null);
        let _ = rustix::stdio::dup2_stderr(&null);
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
    pub fn interrupts(&self) -> Interrupts {
        self.interrupts.clone()
    }

    /// Puts the client's stdin, stdout, stderr, working directory and umask in place of the
    /// service's, until the guard is dropped. The process is the client's for that time:
    /// requests are served one at a time, and what other threads write to stderr meanwhile
    /// reaches the client.
    pub fn redirect(&self) -> io::Result<Redirected> {
        let mut latch = self.interrupts.lock();
        let saved = Redirected {
            // Close-on-exec: what the step's own processes start (git, an init) must not
            // inherit the service's stdio.
            stdio: [
                rustix::io::fcntl_dupfd_cloexec(std::io::stdin(), 3)?,
                rustix::io::fcntl_dupfd_cloexec(std::io::stdout(), 3)?,
                rustix::io::fcntl_dupfd_cloexec(std::io::stderr(), 3)?,
            ],
            cwd: rustix::fs::open(
                ".",
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?,
            umask: rustix::process::umask(Mode::from_raw_mode(self.request.umask)),
            interrupts: self.interrupts.clone(),
        };
        let fds = &self.request.fds;
        // From here a failure restores what was saved (the guard's drop).
        latch.redirected = true;
        drop(latch);
        rustix::stdio::dup2_stdin(&fds[0])?;
        rustix::stdio::dup2_stdout(&fds[1])?;
        rustix::stdio::dup2_stderr(&fds[2])?;
        rustix::process::fchdir(&fds[3])?;
        Ok(saved)
    }

    /// Writes `message` to the client's stderr directly (for what goes wrong before its
    /// stdio is in place).
    pub fn tell_client(&self, message: &str) {
        let _ = rustix::io::write(&self.request.fds[2], message.as_bytes());
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
    interrupts: Interrupts,
}

impl Redirected {
    /// Flushes std's buffered stdout to the client. When that fails (the client's reader is
    /// gone), what is left in the buffer is discarded, never written to the next client.
    pub fn flush_stdout(&self) {
        use std::io::Write as _;
        if std::io::stdout().flush().is_err() {
            if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
                if rustix::stdio::dup2_stdout(&null).is_ok() {
                    let _ = std::io::stdout().flush();
                }
            }
        }
    }
}

impl Drop for Redirected {
    fn drop(&mut self) {
        // Under the latch's lock, so that a client going away now cannot silence the
        // service's own stdio once restored.
        let mut latch = self.interrupts.lock();
        latch.redirected = false;
        let _ = rustix::stdio::dup2_stdin(&self.stdio[0]);
        let _ = rustix::stdio::dup2_stdout(&self.stdio[1]);
        let _ = rustix::stdio::dup2_stderr(&self.stdio[2]);
        let _ = rustix::process::fchdir(&self.cwd);
        rustix::process::umask(self.umask);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;
    use std::io::Write as _;

    /// A connection from this process, as the listener hands it over.
    fn accepted() -> (Incoming, UnixStream) {
        let (service_end, client_end) = UnixStream::pair().unwrap();
        let incoming = Incoming {
            peer: Identity::of_peer(&service_end),
            stream: service_end,
            build: "b1".into(),
            own: Arc::new(Identity::of_self().unwrap()),
        };
        (incoming, client_end)
    }

    #[test]
    fn a_client_that_answers_the_challenge_is_read_and_one_that_does_not_is_declined() {
        let me = std::process::id() as i32;
        let (incoming, client) = accepted();
        let honest = std::thread::spawn(move || {
            wire::Frame::control("b1", "status")
                .send(&client, &[])
                .unwrap();
            assert_eq!(crate::client::prove(&client, me).unwrap(), None);
            client
        });
        let (ask, _connection) = incoming.read().unwrap();
        assert!(matches!(ask, Ask::Status));
        drop(honest.join().unwrap());

        // A proof it could not read (or a guess): declined, with the reason, and the request
        // it sent is not used.
        let (incoming, client) = accepted();
        let guessing = std::thread::spawn(move || {
            wire::Frame::control("b1", "stop")
                .send(&client, &[])
                .unwrap();
            let line = wire::read_line(&client).unwrap().unwrap();
            assert!(line.starts_with("prove "), "{line}");
            (&client).write_all(&[b'0'; wire::PROOF_LEN]).unwrap();
            wire::read_line(&client).unwrap().unwrap()
        });
        let why = incoming.read().unwrap_err();
        assert!(why.contains("inspect the service"), "{why}");
        assert_eq!(guessing.join().unwrap(), format!("no {why}"));
    }

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
        i.fire(false);
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        i.on_interrupt(move || {
            m.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(n.load(Ordering::SeqCst), 1);
        i.fire(false);
        assert_eq!(n.load(Ordering::SeqCst), 2);
        i.end();
        i.fire(true);
        assert_eq!(n.load(Ordering::SeqCst), 2);
    }
}
