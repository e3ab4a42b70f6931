//! P1 of a sandbox that takes many commands ([`crate::plan::Prelude::session`]): once
//! `ready`, it serves [`SessionRequest`]s on the exec channel P0 made, one datagram each, and
//! answers with [`SessionReport`]s there, until a `stop` or the channel's end. The plan is the
//! sandbox; a command is a message.
//!
//! Each command starts in a session of its own with the three descriptors its request
//! carried; its exit is reported when its main process ends, after what is left of its
//! process group is killed (so nothing of it keeps its output open). A process that left its
//! group (`setsid`) lives on until the sandbox stops; orphans are reaped as they end. A stop,
//! or the runtime's end (the channel closes), kills every process of the sandbox: P1 is pid 1
//! of its pid namespace.
//!
//! The loop ([`serve`]) is written against [`ExecHost`], the few calls it makes: the libc
//! one ([`LibcHost`]) for the sandbox and a recording fake for its unit tests, so the
//! protocol is tested without namespaces (as youki tests its container set-up).

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::plan::{
    ExecSpec, SessionReport, SessionRequest, TerminalSize, MAX_SESSION_EXECS, MAX_SESSION_MESSAGE,
};
use crate::spawn::PreparedExec;
use crate::sys::{self, SysError, SysResult};

/// What woke the loop.
pub(crate) enum Wake {
    /// A request's bytes and the descriptors that came with it; `truncated` when the
    /// datagram did not fit [`MAX_SESSION_MESSAGE`].
    Request {
        bytes: Vec<u8>,
        fds: Vec<OwnedFd>,
        truncated: bool,
    },
    /// A child of P1 ended (one or more: reap until none is left).
    Children,
    /// The runtime closed the channel.
    Closed,
}

/// The calls the session loop makes: the sandbox's (libc) or a test's.
pub(crate) trait ExecHost {
    /// Waits for the next request, child exit or the channel's end.
    fn next(&mut self) -> SysResult<Wake>;
    /// Sends a report to the runtime (a runtime that is gone is seen by `next`).
    fn report(&mut self, report: &SessionReport);
    /// Sends a report with `fd` attached (a command's terminal).
    fn report_with(&mut self, report: &SessionReport, fd: &OwnedFd);
    /// Opens a terminal of the sandbox's own of `size`: its master and its slave's path.
    fn open_terminal(&mut self, size: TerminalSize) -> Result<(OwnedFd, CString), String>;
    /// Starts `exec` on `io`; the pid, or the exit code and message of a command that could
    /// not start (already written to its stderr).
    fn spawn(&mut self, exec: &ExecSpec, io: CommandIo<'_>) -> Result<libc::pid_t, i32>;
    /// One ended child and its wait status, without blocking; `None` when none is left.
    fn reap(&mut self) -> Option<(libc::pid_t, libc::c_int)>;
    /// Sends `signal` to process group `pgid` (gone already: nothing to do).
    fn signal_group(&mut self, pgid: libc::pid_t, signal: libc::c_int);
    /// Kills every process of the sandbox but P1 and waits until each has ended.
    fn kill_all_and_reap(&mut self);
    /// Sends `signal` to every process of the sandbox but P1 (`kill(-1)`).
    fn signal_all(&mut self, signal: libc::c_int);
    /// Whether every thread of every process but P1 is stopped (or gone).
    fn all_stopped(&mut self) -> bool;
    /// Which process the last `all_stopped` found running, and in what state (for the
    /// refusal's message).
    fn not_stopped(&self) -> String {
        String::new()
    }
    /// Waits `us` microseconds (between looks at `all_stopped`).
    fn wait_a_little(&mut self, us: u64);
    /// The monotonic clock, for `started`.
    fn now_ns(&mut self) -> u64;
}

/// What a command's 0, 1 and 2 are.
pub(crate) enum CommandIo<'a> {
    /// The three descriptors its request carried.
    Fds(&'a [OwnedFd; 3]),
    /// The slave of its terminal, by path (opened in the command's new session, so that it
    /// becomes its controlling terminal).
    Terminal(&'a CString),
}

/// The commands running, both ways, and those held back by a pause.
#[derive(Default)]
struct Running {
    by_pid: HashMap<libc::pid_t, u64>,
    by_id: HashMap<u64, libc::pid_t>,
    /// Set between a `pause` that held and its `resume`.
    paused: bool,
    /// Commands asked for while paused, started at the resume.
    held: Vec<(u64, ExecSpec, Vec<OwnedFd>)>,
}

/// How many milliseconds (at least: each is a sleep and a look at `/proc`) a pause waits for
/// every process to stop: a thread in uninterruptible sleep (a page read from a busy disk, an
/// overlayfs copy-up) stops only when it leaves it, which on a machine busy with I/O has taken
/// over 2 s. The runtime waits for the answer longer (its `CONTROL_WAIT`).
const PAUSE_WAIT_MS: u32 = 4000;

/// The first looks at whether every process stopped, this many microseconds apart.
const SHORT_LOOK_US: u64 = 20;
const SHORT_LOOKS: u32 = 50;

/// [`serve`]'s return after a `handover`: the spawner's exit code that tells P1 to wait for
/// the `respawn`.
pub(crate) const HANDED_OVER: i32 = 75;

pub(crate) mod spawner;

/// Serves the session until a stop or the channel's end. Returns P1's exit code.
pub(crate) fn serve(host: &mut impl ExecHost) -> i32 {
    let mut running = Running::default();
    loop {
        let wake = match host.next() {
            Ok(w) => w,
            Err(e) => {
                // Unable to hear the runtime: nothing may run on unwatched.
                host.report(&refused(None, format!("the exec channel failed: {e}")));
                stop(host, &mut running);
                return 1;
            }
        };
        match wake {
            Wake::Closed => {
                stop(host, &mut running);
                return 0;
            }
            Wake::Children => reap_ended(host, &mut running),
            Wake::Request {
                bytes,
                fds,
                truncated,
            } => {
                if truncated {
                    host.report(&refused(
                        None,
                        format!("a request over {MAX_SESSION_MESSAGE} bytes"),
                    ));
                    continue;
                }
                match serde_json::from_slice::<SessionRequest>(&bytes) {
                    Err(e) => {
                        host.report(&refused(None, format!("a request that is not valid: {e}")))
                    }
                    Ok(SessionRequest::Exec { id, exec }) if running.paused => {
                        hold_back(host, &mut running, id, exec, fds)
                    }
                    Ok(SessionRequest::Exec { id, exec }) => {
                        start(host, &mut running, id, &exec, fds)
                    }
                    Ok(SessionRequest::Pause { id }) => pause(host, &mut running, id),
                    Ok(SessionRequest::Resume { id }) => resume(host, &mut running, id),
                    Ok(SessionRequest::Handover { id }) => {
                        if hand_over(host, &mut running, id) {
                            return HANDED_OVER;
                        }
                    }
                    Ok(SessionRequest::Respawn { id }) => host.report(&refused(
                        Some(id),
                        "a spawner serves the session already".into(),
                    )),
                    Ok(SessionRequest::Signal { id, signal }) => {
                        signal_exec(host, &mut running, id, signal)
                    }
                    Ok(SessionRequest::Stop) => {
                        stop(host, &mut running);
                        host.report(&SessionReport::Stopped);
                        return 0;
                    }
                }
            }
        }
    }
}

/// Stops every process but P1 and waits until each thread is stopped; continues them and
/// refuses when that takes over [`PAUSE_WAIT_MS`] (a process in uninterruptible sleep).
/// Stopping every process at once is what holds: one that forks while the signal is on its
/// way has the fork restarted after it stops, so none is left running. A pause while paused
/// holds already.
fn pause(host: &mut impl ExecHost, running: &mut Running, id: u64) {
    match hold_still(host, running) {
        Ok(()) => host.report(&SessionReport::Paused { id }),
        Err(message) => host.report(&refused(Some(id), message)),
    }
}

/// [`pause`]'s work: every process stopped, or all continued again and why not.
fn hold_still(host: &mut impl ExecHost, running: &mut Running) -> Result<(), String> {
    if !running.paused {
        host.signal_all(libc::SIGSTOP);
        let (mut waited_us, mut rounds) = (0u64, 0u32);
        while !host.all_stopped() {
            if waited_us >= u64::from(PAUSE_WAIT_MS) * 1000 {
                let which = host.not_stopped();
                host.signal_all(libc::SIGCONT);
                return Err(format!(
                    "the sandbox's processes did not all stop within {PAUSE_WAIT_MS} ms ({which})"
                ));
            }
            // A stop lands at the process's next return to user space: tens of microseconds
            // for one that runs or sleeps interruptibly. Looked at closely for the first
            // millisecond (the pause is what the session's processes feel), then every one.
            let step = if rounds < SHORT_LOOKS {
                SHORT_LOOK_US
            } else {
                1000
            };
            host.wait_a_little(step);
            waited_us += step;
            rounds += 1;
            // Again now and then: a process that came to be as the first went out (in the
            // middle of an exec, say) is held by the next.
            if rounds % 100 == 0 {
                host.signal_all(libc::SIGSTOP);
            }
        }
        running.paused = true;
    }
    Ok(())
}

/// Ends this spawner's service for a layer flip, every process held still (P1 starts the
/// next spawner at the `respawn`, which continues them). Refused (false) while a command runs
/// or waits: its parent is this spawner, which must see it end.
fn hand_over(host: &mut impl ExecHost, running: &mut Running, id: u64) -> bool {
    if !running.by_id.is_empty() || !running.held.is_empty() {
        let message = format!(
            "{} commands are running or waiting",
            running.by_id.len() + running.held.len()
        );
        host.report(&refused(Some(id), message));
        return false;
    }
    if let Err(message) = hold_still(host, running) {
        host.report(&refused(Some(id), message));
        return false;
    }
    host.report(&SessionReport::HandedOver { id });
    true
}

/// Continues every process and starts the commands held back, in the order asked.
fn resume(host: &mut impl ExecHost, running: &mut Running, id: u64) {
    if running.paused {
        host.signal_all(libc::SIGCONT);
        running.paused = false;
    }
    host.report(&SessionReport::Resumed { id });
    for (held_id, exec, fds) in std::mem::take(&mut running.held) {
        start(host, running, held_id, &exec, fds);
    }
}

/// A command asked for while paused waits for the resume (within the commands' bound).
fn hold_back(
    host: &mut impl ExecHost,
    running: &mut Running,
    id: u64,
    exec: ExecSpec,
    fds: Vec<OwnedFd>,
) {
    if running.by_id.len() + running.held.len() >= MAX_SESSION_EXECS {
        let message = format!("{MAX_SESSION_EXECS} commands are running or waiting already");
        return host.report(&refused(Some(id), message));
    }
    running.held.push((id, exec, fds));
}

fn refused(id: Option<u64>, message: String) -> SessionReport {
    SessionReport::Refused { id, message }
}

/// Starts one command, or says why not. The request's descriptors are P1's only until the
/// spawn: closed here either way, so the command's output ends with the command.
fn start(
    host: &mut impl ExecHost,
    running: &mut Running,
    id: u64,
    exec: &ExecSpec,
    fds: Vec<OwnedFd>,
) {
    // A command on a terminal comes with no descriptor; any other with its three.
    let wanted = if exec.terminal.is_some() { 0 } else { 3 };
    if fds.len() != wanted {
        let message = format!(
            "exec {id} came with {} descriptors, not {wanted}",
            fds.len()
        );
        return host.report(&refused(Some(id), message));
    }
    let stdio: Option<[OwnedFd; 3]> = fds.try_into().ok();
    let why_not = if running.by_id.contains_key(&id) {
        Some(format!("exec {id} is already running"))
    } else if running.by_id.len() >= MAX_SESSION_EXECS {
        Some(format!("{MAX_SESSION_EXECS} commands are running already"))
    } else if exec.stdin.is_some() {
        Some(format!(
            "exec {id} names a stdin path; a session's stdin is a descriptor"
        ))
    } else {
        None
    };
    if let Some(message) = why_not {
        return host.report(&refused(Some(id), message));
    }
    let terminal = match exec.terminal.map(|size| host.open_terminal(size)) {
        Some(Ok(terminal)) => Some(terminal),
        Some(Err(message)) => return host.report(&refused(Some(id), message)),
        None => None,
    };
    let io = match (&terminal, &stdio) {
        (Some((master, slave)), _) => {
            // The master goes first: what the command writes, a start failure included, is
            // read from it.
            host.report_with(&SessionReport::Terminal { id }, master);
            CommandIo::Terminal(slave)
        }
        (None, Some(stdio)) => CommandIo::Fds(stdio),
        (None, None) => unreachable!("three descriptors were checked above"),
    };
    match host.spawn(exec, io) {
        Ok(pid) => {
            running.by_pid.insert(pid, id);
            running.by_id.insert(id, pid);
            let monotonic_ns = host.now_ns();
            host.report(&SessionReport::Started {
                id,
                pid,
                monotonic_ns,
            });
        }
        Err(code) => host.report(&SessionReport::Exit {
            id,
            code: Some(code),
            signal: None,
        }),
    }
    drop((stdio, terminal));
}

fn signal_exec(host: &mut impl ExecHost, running: &mut Running, id: u64, signal: i32) {
    if !(1..=64).contains(&signal) {
        return host.report(&refused(
            Some(id),
            format!("signal {signal} is not 1 to 64"),
        ));
    }
    // A command held back by a pause ends without having started (its timeout, a cancel).
    if let Some(at) = running.held.iter().position(|(held, _, _)| *held == id) {
        running.held.remove(at);
        return host.report(&SessionReport::Exit {
            id,
            code: None,
            signal: Some(signal),
        });
    }
    match running.by_id.get(&id) {
        Some(&pid) => host.signal_group(pid, signal),
        None => host.report(&refused(Some(id), format!("exec {id} is not running"))),
    }
}

/// Reaps every ended child; a command's main process ending ends the command: what is left
/// of its group is killed and its exit reported. Other children (orphans) are only reaped.
fn reap_ended(host: &mut impl ExecHost, running: &mut Running) {
    while let Some((pid, status)) = host.reap() {
        let Some(id) = running.by_pid.remove(&pid) else {
            continue;
        };
        running.by_id.remove(&id);
        // The group outlives its leader's pid only while a member lives, and a pid is not
        // reused while a group bears its number, so this reaches that group and no other.
        host.signal_group(pid, libc::SIGKILL);
        host.report(&exit_report(id, status));
    }
}

/// Ends every process of the sandbox and reports each running command's end.
fn stop(host: &mut impl ExecHost, running: &mut Running) {
    host.kill_all_and_reap();
    let mut ended: Vec<u64> = running.by_id.drain().map(|(id, _)| id).collect();
    running.by_pid.clear();
    // Commands held back by a pause never started: they end as killed, as the others.
    ended.extend(running.held.drain(..).map(|(id, _, _)| id));
    ended.sort_unstable();
    for id in ended {
        host.report(&SessionReport::Exit {
            id,
            code: None,
            signal: Some(libc::SIGKILL),
        });
    }
}

fn exit_report(id: u64, status: libc::c_int) -> SessionReport {
    let (code, signal) = if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None)
    };
    SessionReport::Exit { id, code, signal }
}

/// The sandbox's [`ExecHost`]: the exec channel, and a signalfd for SIGCHLD (blocked in P1,
/// reset for each command by `posix_spawn`).
pub(crate) struct LibcHost {
    channel: OwnedFd,
    sigchld: OwnedFd,
    /// Every request is received here ([`MAX_SESSION_MESSAGE`], made once).
    buf: Vec<u8>,
    /// What the last look at the processes found running.
    running: String,
}

impl LibcHost {
    /// Blocks SIGCHLD and opens its signalfd; makes P1's own 1 and 2 copies of its control
    /// socket (0), so that they no longer hold the runtime's first output pipes and so that a
    /// request's descriptors, received as the lowest free numbers, are never 0-2 (a `dup2`
    /// of one onto another's number would lose it).
    pub(crate) fn new(channel: OwnedFd) -> SysResult<LibcHost> {
        // A stop is `kill(-1)`, which only pid 1 of the sandbox's own pid namespace may send:
        // anywhere else it would reach every process of the user.
        // A session's spawner is P1's child (see `spawner`), in the same pid namespace.
        let pid = rustix::process::getpid().as_raw_nonzero().get();
        let parent = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get());
        if pid != 1 && parent != 1 {
            return Err(SysError {
                op: "serve a session outside its own pid namespace".into(),
                errno: libc::EPERM,
            });
        }
        for fd in [1, 2] {
            // SAFETY: dup2 of our own descriptor 0 onto 1 and 2, which nothing here uses.
            let ret = unsafe { libc::dup2(crate::control::CONTROL_FD, fd) };
            sys::check(ret, || format!("dup2 onto {fd}"))?;
        }
        // SAFETY: sigset_t is plain data, filled by sigemptyset/sigaddset before use.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid set pointer; SIGCHLD is a valid signal; a null old-set pointer.
        let ret = unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGCHLD);
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
        };
        sys::check(ret, || "block SIGCHLD".to_string())?;
        // SAFETY: signalfd on a valid set, a new descriptor we own from here on.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
        sys::check(fd, || "signalfd".to_string())?;
        // SAFETY: signalfd returned a new descriptor nothing else owns.
        let sigchld = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(LibcHost {
            channel,
            sigchld,
            buf: vec![0; MAX_SESSION_MESSAGE],
            running: String::new(),
        })
    }

    fn drain_sigchld(&self) {
        let mut info = [0u8; 128];
        // SAFETY: reads into a valid buffer of signalfd_siginfo's size; non-blocking.
        while unsafe { libc::read(self.sigchld.as_raw_fd(), info.as_mut_ptr().cast(), 128) } > 0 {}
    }
}

impl ExecHost for LibcHost {
    fn next(&mut self) -> SysResult<Wake> {
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: self.sigchld.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.channel.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: `fds` is a valid array of two pollfd structs; no timeout, no sigmask.
            let n = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, std::ptr::null(), std::ptr::null()) };
            if n < 0 {
                if sys::errno() == libc::EINTR {
                    continue;
                }
                return sys::fail("poll the exec channel");
            }
            if fds[0].revents != 0 {
                self.drain_sigchld();
                return Ok(Wake::Children);
            }
            if fds[1].revents != 0 {
                return receive(self.channel.as_raw_fd(), &mut self.buf);
            }
        }
    }

    fn report(&mut self, report: &SessionReport) {
        let bytes = serde_json::to_vec(report).unwrap_or_default();
        // SAFETY: sends a valid buffer; MSG_NOSIGNAL: a runtime that is gone is an EPIPE, seen
        // next by `next` as the channel's end.
        let _ = unsafe {
            libc::send(
                self.channel.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_NOSIGNAL,
            )
        };
    }

    fn report_with(&mut self, report: &SessionReport, fd: &OwnedFd) {
        let bytes = serde_json::to_vec(report).unwrap_or_default();
        // A runtime that is gone is seen by `next` as the channel's end.
        let _ = crate::channel::send(
            self.channel.as_raw_fd(),
            &bytes,
            &[fd.as_raw_fd()],
            libc::MSG_NOSIGNAL,
        );
    }

    fn open_terminal(&mut self, size: TerminalSize) -> Result<(OwnedFd, CString), String> {
        crate::terminal::open(size)
    }

    fn spawn(&mut self, exec: &ExecSpec, io: CommandIo<'_>) -> Result<libc::pid_t, i32> {
        let prepared = PreparedExec::new(exec).map(|p| match &io {
            CommandIo::Fds(stdio) => p.with_stdio([0, 1, 2].map(|i| stdio[i].as_raw_fd())),
            CommandIo::Terminal(slave) => p.with_terminal((*slave).clone()),
        });
        let spawned = prepared.and_then(|p| p.spawn());
        // The spawn entered the command's directory first: P1 leaves it, or its working
        // directory alone would hold the workspace's mount (a layer flip needs it unheld).
        // SAFETY: a valid C string; "/" always exists.
        unsafe { libc::chdir(c"/".as_ptr()) };
        match spawned {
            Ok(pid) => Ok(pid),
            Err((code, message)) => {
                match io {
                    CommandIo::Fds(stdio) => {
                        let _ = sys::write_all_fd(stdio[2].as_raw_fd(), message.as_bytes());
                    }
                    CommandIo::Terminal(slave) => crate::terminal::tell(slave, &message),
                }
                Err(code)
            }
        }
    }

    fn reap(&mut self) -> Option<(libc::pid_t, libc::c_int)> {
        loop {
            let mut status = 0;
            // SAFETY: `status` is a valid out-pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
            if pid > 0 {
                return Some((pid, status));
            }
            if pid < 0 && sys::errno() == libc::EINTR {
                continue;
            }
            return None; // 0: none ended yet; ECHILD: none left.
        }
    }

    fn signal_group(&mut self, pgid: libc::pid_t, signal: libc::c_int) {
        if pgid > 1 {
            // ESRCH (the group is gone) is the expected answer after a command's end.
            let _ = sys::kill(-pgid, signal);
        }
    }

    fn kill_all_and_reap(&mut self) {
        // SAFETY: kill(-1) from pid 1 of the pid namespace reaches every other process in it
        // (all have our uid; we have no capabilities and need none).
        unsafe { libc::kill(-1, libc::SIGKILL) };
        loop {
            // SAFETY: waitpid with a null status pointer.
            let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::__WALL) };
            if r < 0 && sys::errno() != libc::EINTR {
                break; // ECHILD: none left.
            }
        }
    }

    fn signal_all(&mut self, signal: libc::c_int) {
        // SAFETY: kill(-1) from pid 1 of the pid namespace reaches every other process in it
        // (all have our uid; checked at `new`).
        unsafe { libc::kill(-1, signal) };
    }

    fn all_stopped(&mut self) -> bool {
        let me = rustix::process::getpid().as_raw_nonzero().get() as u32;
        match first_running(std::path::Path::new("/proc"), me) {
            None => true,
            Some(which) => {
                self.running = which;
                false
            }
        }
    }

    fn not_stopped(&self) -> String {
        self.running.clone()
    }

    fn wait_a_little(&mut self, us: u64) {
        std::thread::sleep(std::time::Duration::from_micros(us));
    }

    fn now_ns(&mut self) -> u64 {
        sys::monotonic_ns()
    }
}

/// The first thread of a process under `proc` (the sandbox's own procfs: its pid namespace)
/// but pid 1 and `me` that is neither stopped, traced, a zombie, dead nor held by a vfork
/// (`pid N (comm) in state S`), or none. A process whose entries vanish while read has ended.
fn first_running(proc: &std::path::Path, me: u32) -> Option<String> {
    let Ok(processes) = std::fs::read_dir(proc) else {
        return Some("/proc cannot be read".into());
    };
    for process in processes.flatten() {
        let name = process.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == 1 || pid == me {
            continue;
        }
        let Ok(threads) = std::fs::read_dir(process.path().join("task")) else {
            continue;
        };
        for thread in threads.flatten() {
            if let Ok(stat) = std::fs::read(thread.path().join("stat")) {
                if !stopped_state(&stat) && !held_by_vfork(&stat, &thread.path()) {
                    let text = String::from_utf8_lossy(&stat);
                    let comm = text.split(['(', ')']).nth(1).unwrap_or("?").to_string();
                    let state = state_letter(&stat).map_or('?', char::from);
                    return Some(format!(
                        "pid {pid} ({}) in state {state}",
                        comm.escape_default()
                    ));
                }
            }
        }
    }
    None
}

/// A thread in uninterruptible sleep inside a process-making call (`clone`, `clone3`, `vfork`,
/// `fork`): the parent of a `vfork` (`posix_spawn`, a shell's `vfork`) waits there for its
/// child to exec or exit, and never stops while that child is stopped; it runs nothing until
/// then, and the call changes no file, so it is as held as a stopped thread. Known by the
/// call it is in (`/proc/<pid>/task/<tid>/syscall`, readable by P1, whose descendants all
/// sandbox processes are); a thread asleep in any other call is not taken as held.
fn held_by_vfork(stat: &[u8], thread: &std::path::Path) -> bool {
    if state_letter(stat) != Some(b'D') {
        return false;
    }
    let Ok(text) = std::fs::read(thread.join("syscall")) else {
        return false;
    };
    let number = text
        .split(|b| *b == b' ' || *b == b'\n')
        .next()
        .and_then(|n| std::str::from_utf8(n).ok())
        .and_then(|n| n.parse::<libc::c_long>().ok());
    number.is_some_and(process_making_call)
}

/// `clone`, `clone3`, and where the architecture has them, `fork` and `vfork`.
fn process_making_call(number: libc::c_long) -> bool {
    #[cfg(target_arch = "x86_64")]
    let legacy = [libc::SYS_fork, libc::SYS_vfork];
    #[cfg(not(target_arch = "x86_64"))]
    let legacy: [libc::c_long; 0] = [];
    number == libc::SYS_clone || number == libc::SYS_clone3 || legacy.contains(&number)
}

/// The state letter of a `stat` line (after the command's closing parenthesis, which may
/// itself hold any byte).
fn state_letter(stat: &[u8]) -> Option<u8> {
    let close = stat.iter().rposition(|b| *b == b')')?;
    stat.get(close + 2).copied()
}

/// The state letter of a `stat` line (after the command's closing parenthesis, which may
/// itself hold any byte): stopped (`T`, `t`), zombie (`Z`) or dead (`X`).
fn stopped_state(stat: &[u8]) -> bool {
    matches!(state_letter(stat), Some(b'T' | b't' | b'Z' | b'X'))
}

/// One datagram of the channel with its descriptors (close-on-exec: none may reach a command
/// but as its 0-2).
fn receive(sock: RawFd, buf: &mut [u8]) -> SysResult<Wake> {
    match crate::channel::recv(sock, buf, 0) {
        Ok(None) => Ok(Wake::Closed),
        Ok(Some(d)) => Ok(Wake::Request {
            bytes: d.bytes,
            fds: d.fds,
            truncated: d.truncated,
        }),
        Err(e) => Err(SysError {
            op: "receive a request".into(),
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        }),
    }
}

#[cfg(test)]
mod tests;
