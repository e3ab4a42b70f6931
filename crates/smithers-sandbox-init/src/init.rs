//! The in-sandbox init: a small, single-threaded program (no tokio, no threads) that executes a
//! [`Prelude`] and an [`InitPlan`]. It runs as a separate process so that nothing is forked from the runtime's
//! multithreaded process. P0 is either executed from the binary or, by default, forked from
//! the runtime's zygote (the same binary in `--zygote` mode, see [`crate::zygote`]), which hands
//! it the same three descriptors: from there on both are identical.
//!
//! Process tree and protocol:
//!
//! ```text
//! runtime ──socket (fd 0)──► P0  init, host pid ns: reads the prelude, opens the cgroups,
//!                            │   unshares user (+maps) and the other namespaces but the
//!                            │   network one, reads the plan, forks P1 (into the v2 cgroup),
//!                            │   makes the network namespace and hands it to P1, then
//!                            │   only waits: a "k" byte or EOF on fd 0 (the runtime died) →
//!                            │   SIGKILL P1; once P1 is gone it closes its descriptors.
//!                            └► P1  pid 1 of the new pid ns: moves itself into the v1 cgroups
//!                               │   (see `CgroupJoin`), builds the root (binds the prepared
//!                               │   one and mounts), pivot_root, enters the network namespace,
//!                               │   drops privileges (caps, no_new_privs, Landlock, seccomp
//!                               │   last), reports `ready`, forks the command, reaps zombies,
//!                               │   reports `exit`, then exits, which kills whatever is left.
//!                               └► P2  the command (stdin /dev/null, stdout/stderr = runtime's pipes)
//! ```
//!
//! The runtime sends two JSON lines on fd 0: the prelude (what P0 needs, before P0 starts),
//! then the plan (what P1 needs, compiled while P0 makes its namespaces; P0 passes it on
//! unparsed). Status lines (JSON, one per line) go back over fd 0: `{"event":"ready",...}`,
//! `{"event":"exit","code":N}` / `{"event":"exit","signal":N}`, `{"event":"error",...}`.
//! P1 sends `exit` only after killing and reaping every other process of the sandbox
//! (double-forked, setsid'd, SIGTERM-ignoring ones too): from it on, only P1 is left, and
//! the runtime need not wait for P1's own exit. Because P1 is the pid namespace's init, its
//! death (a kill from P0, say) kills every process of the sandbox too, and P0's `waitpid` on
//! it returns only once all of them are gone. Only the sandbox holds the output pipes (P0 and
//! P1 close theirs), so they end with its processes.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::plan::{
    InitPlan, LandlockPlan, MountAttrs, MountOp, Prelude, ProbeInput, RootFs, TargetKind,
    PLAN_VERSION,
};
use crate::sys::{self, cpath, cstring, SysError, SysResult};

/// The control/status socket the runtime passes as stdin.
const CONTROL_FD: libc::c_int = 0;

/// Entry point of the `smithers-sandbox-init` binary (and of `smithers-sandbox __sandbox-init`).
pub fn main() -> ! {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(run(&args))
}

/// Runs the init with its arguments (without the program name); returns the exit code.
pub fn run(args: &[String]) -> i32 {
    // The init forks and then runs arbitrary Rust code in the children, which is sound only
    // in a single-threaded process (another thread could hold the allocator's lock, or any
    // other, at the fork). It is started as its own program (or dispatched before anything
    // else in the CLI), so a second thread here is a bug: refuse rather than risk it.
    match sys::thread_count() {
        Some(1) => {}
        n => {
            eprintln!(
                "smithers-sandbox-init: must run single-threaded, but this process has {} threads",
                n.map_or("an unknown number of".to_string(), |n| n.to_string())
            );
            return 2;
        }
    }
    match args.first().map(String::as_str) {
        None => run_sandbox(),
        Some("--zygote") => crate::zygote::serve(run_sandbox),
        Some("--probe") => match args.get(1) {
            Some(scratch) => run_probe(Path::new(scratch)),
            None => {
                eprintln!("smithers-sandbox-init: --probe needs a scratch directory");
                2
            }
        },
        Some(other) => {
            eprintln!("smithers-sandbox-init: unexpected argument {other:?} (this program is started by the smithers runtime)");
            2
        }
    }
}

fn report(value: Value) {
    let mut line = value.to_string();
    line.push('\n');
    // Nothing useful can be done if the runtime is gone; P0 notices EOF separately.
    let _ = sys::write_all_fd(CONTROL_FD, line.as_bytes());
}

fn report_error(stage: &str, err: &SysError) {
    report(json!({
        "event": "error",
        "stage": stage,
        "errno": err.errno,
        "message": err.to_string(),
    }));
}

/// Fd 0 read line by line: the prelude, then the plan; what follows the plan (control bytes
/// sent early) is kept for `supervise`.
#[derive(Default)]
struct ControlReader {
    buf: Vec<u8>,
}

impl ControlReader {
    /// The next line, without its newline.
    fn line(&mut self, what: &str) -> Result<Vec<u8>, String> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let rest = self.buf.split_off(pos + 1);
                let mut line = std::mem::replace(&mut self.buf, rest);
                line.pop();
                return Ok(line);
            }
            if self.buf.len() > 64 << 20 {
                return Err(format!("the {what} exceeds 64 MiB"));
            }
            // SAFETY: `chunk` is a valid writable buffer of the given length.
            let n = unsafe { libc::read(CONTROL_FD, chunk.as_mut_ptr().cast(), chunk.len()) };
            if n < 0 {
                if sys::errno() == libc::EINTR {
                    continue;
                }
                return Err(format!(
                    "reading the {what}: {}",
                    std::io::Error::last_os_error()
                ));
            }
            if n == 0 {
                return Err(format!(
                    "the runtime closed the control socket before sending the {what}"
                ));
            }
            self.buf.extend_from_slice(&chunk[..n as usize]);
        }
    }

    fn prelude(&mut self) -> Result<Prelude, String> {
        let line = self.line("prelude")?;
        // The version first: a prelude from another build may not parse as ours at all, and
        // "another build" is what the user needs to hear.
        #[derive(serde::Deserialize)]
        struct Version {
            version: u32,
        }
        let version = serde_json::from_slice::<Version>(&line)
            .map_err(|e| format!("the prelude is not valid: {e}"))?
            .version;
        if version != PLAN_VERSION {
            return Err(format!(
                "plan version {version} but this init speaks {PLAN_VERSION}: the init binary is from another build of smithers-sandbox than the runtime (rebuild it, or remove a stale smithers-sandbox-init next to the runtime, or point ${} at the right one)",
                crate::INIT_ENV
            ));
        }
        serde_json::from_slice(&line).map_err(|e| format!("the prelude is not valid: {e}"))
    }

    /// The plan's line, unparsed: P1 parses it (see `start`).
    fn plan(&mut self) -> Result<Vec<u8>, String> {
        self.line("plan")
    }
}

fn parse_plan(line: &[u8]) -> Result<InitPlan, String> {
    serde_json::from_slice(line).map_err(|e| format!("the plan is not valid: {e}"))
}

fn report_plan_error(message: String) -> i32 {
    report(json!({"event": "error", "stage": "plan", "errno": 0, "message": message}));
    1
}

fn run_sandbox() -> i32 {
    // The sandbox, not the host's own processes, is what the OOM killer should take first
    // when memory runs out (with or without a memory limit): every sandbox process inherits
    // this. Raising one's own score needs no privilege; if /proc is not there it stays as is.
    let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
    let mut control = ControlReader::default();
    let prelude = match control.prelude() {
        Ok(p) => p,
        Err(message) => return report_plan_error(message),
    };
    let cgroups = match enter_namespaces(&prelude) {
        Ok(c) => c,
        Err((stage, err)) => {
            report_error(stage, &err);
            return 1;
        }
    };
    let plan = match control.plan() {
        Ok(p) => p,
        Err(message) => return report_plan_error(message),
    };
    match start(&prelude, cgroups, &plan) {
        Ok(child) => supervise(child, &control.buf),
        Err((stage, err)) => {
            report_error(stage, &err);
            1
        }
    }
}

type StageResult<T> = Result<T, (&'static str, SysError)>;

fn stage<T>(name: &'static str, r: SysResult<T>) -> StageResult<T> {
    r.map_err(|e| (name, e))
}

/// P0 with the prelude: opens the cgroups, makes the namespaces.
fn enter_namespaces(plan: &Prelude) -> StageResult<CgroupFds> {
    // Own session: a Ctrl-C aimed at the runtime's terminal is the runtime's to handle (it
    // cancels), it must not hit the init directly.
    // SAFETY: setsid has no memory-safety preconditions; failure (already a leader) is harmless.
    unsafe { libc::setsid() };
    // No PR_SET_PDEATHSIG here on purpose: it fires when the *thread* that spawned us exits,
    // and the runtime spawns from whichever async worker thread polls `execute` (blocking-pool
    // threads retire when idle), which would kill a healthy sandbox. Runtime death is detected
    // exactly instead: the kernel closes the runtime's end of the control socket when the
    // process dies, and `supervise` answers that EOF with SIGKILL to pid 1. P1 and the command
    // do use PDEATHSIG: their parents are single-threaded.
    // Opened now, used after the fork: the open checks our host credentials before we enter
    // the user namespace (and the kernel checks a cgroup write against the opener's).
    let cgroups = open_cgroups(plan)?;
    stage(
        "userns",
        sys::unshare(libc::CLONE_NEWUSER, "user namespace"),
    )?;
    stage(
        "userns",
        sys::write_file(Path::new("/proc/self/setgroups"), b"deny"),
    )?;
    stage(
        "userns",
        sys::write_file(
            Path::new("/proc/self/uid_map"),
            format!("{} {} 1\n", plan.sandbox_uid, plan.host_uid).as_bytes(),
        ),
    )?;
    stage(
        "userns",
        sys::write_file(
            Path::new("/proc/self/gid_map"),
            format!("{} {} 1\n", plan.sandbox_gid, plan.host_gid).as_bytes(),
        ),
    )?;
    // The network namespace comes later, from `start` (see there).
    let flags = libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
    stage("namespaces", sys::unshare(flags, "namespaces"))?;
    Ok(cgroups)
}

/// P0 with the plan: forks P1 into the cgroups. Returns P1's pid. P1 parses the plan (~0.15 ms
/// for its ~5 KB here, in a freshly forked process) while P0 makes the network namespace.
fn start(prelude: &Prelude, cgroups: CgroupFds, plan: &[u8]) -> StageResult<libc::pid_t> {
    let mut joined = [0 as libc::c_int; 2];
    // SAFETY: `joined` is a valid array of two fds for pipe2 to fill.
    let ret = unsafe { libc::pipe2(joined.as_mut_ptr(), libc::O_CLOEXEC) };
    stage("fork", sys::check(ret, || "pipe".to_string()))?;
    // Making a network namespace is the costliest namespace by far (~0.5 ms here, `lo` up
    // included) and P1 needs it only once its root is built and entered: P0 makes it after
    // the fork, at the same time, and hands it to P1 over this pair.
    // P1 shares our mount namespace, and its pivot_root gives us its root (and its /proc, of
    // a pid namespace we are not in) while we may still be making the network namespace:
    // our /proc entry is opened now, by the host's /proc.
    let netns_pair = if prelude.unshare_net {
        let pair = crate::zygote::seqpacket_pair().map_err(|e| SysError {
            op: "socketpair for the network namespace".into(),
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        });
        let pair = stage("network", pair)?;
        // SAFETY: open(2) of a constant path; the descriptor is owned below.
        let fd = unsafe {
            libc::open(
                c"/proc/self".as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        stage("network", sys::check(fd, || "open /proc/self".to_string()))?;
        // SAFETY: a descriptor open(2) just returned, owned by nothing else.
        let proc_self = unsafe { OwnedFd::from_raw_fd(fd) };
        Some((pair, proc_self))
    } else {
        None
    };
    let (pid, placed) = stage("fork", fork_into(cgroups.v2_dir))?;
    if pid == 0 {
        // SAFETY: closing our copy of the pipe's write end and of the v2 fds, P0's business.
        unsafe {
            libc::close(joined[1]);
            close_opt(cgroups.v2_dir);
            close_opt(cgroups.v2_procs);
        }
        let netns = netns_pair.map(|((_, theirs), _)| theirs);
        sys::child_exit(|| match parse_plan(plan) {
            Ok(plan) => pid1(&plan, &cgroups.v1_tasks, joined[0], netns),
            Err(message) => report_plan_error(message),
        });
    }
    if let Some(((ours, theirs), proc_self)) = netns_pair {
        drop(theirs);
        send_network_namespace(&ours, &proc_self);
    }
    // SAFETY: P0 does not read the pipe, nor use the v1 fds (P1 does), nor write to the
    // output pipes (its reports go over fd 0): only the sandbox holds those now, so they end
    // when its processes do.
    unsafe {
        libc::close(1);
        libc::close(2);
        libc::close(joined[0]);
        for fd in &cgroups.v1_tasks {
            libc::close(*fd);
        }
        close_opt(cgroups.v2_dir);
    }
    let procs = if placed { None } else { cgroups.v2_procs };
    if placed {
        close_opt(cgroups.v2_procs);
    }
    join_v2_and_release(pid, procs, joined[1]);
    Ok(pid)
}

/// P0: makes the network namespace (P0 enters it) and sends it to P1; on failure reports why
/// and sends nothing, which P1 takes as the end of the sandbox.
fn send_network_namespace(sock: &OwnedFd, proc_self: &OwnedFd) {
    // `lo` comes up here too, while P1 is still building the root: it is the only device of
    // the namespace, and P0 (root of the sandbox's user namespace) may configure it.
    let made = sys::unshare(libc::CLONE_NEWNET, "network namespace").and_then(|()| {
        lo_up()?;
        // SAFETY: openat(2) below our own /proc entry; the fd is closed below.
        let fd = unsafe {
            libc::openat(
                proc_self.as_raw_fd(),
                c"ns/net".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        sys::check(fd, || "open /proc/self/ns/net".to_string())
    });
    match made {
        Ok(fd) => {
            let sent = crate::zygote::send_fds(sock.as_raw_fd(), &[fd]);
            // SAFETY: our descriptor; P1 has its own copy once sent.
            unsafe { libc::close(fd) };
            // P1 gone (EPIPE: it failed first, and reported why) is not news.
            let failed = sent.err().filter(|e| e.raw_os_error() != Some(libc::EPIPE));
            if let Some(e) = failed {
                report_error(
                    "network",
                    &SysError {
                        op: "send the network namespace to pid 1".into(),
                        errno: e.raw_os_error().unwrap_or(libc::EIO),
                    },
                );
            }
        }
        Err(e) => report_error("network", &e),
    }
}

/// P1: enters the network namespace P0 made (see `start`).
fn enter_network_namespace(sock: &OwnedFd) -> SysResult<()> {
    let fds = crate::zygote::recv_fds(sock.as_raw_fd()).map_err(|e| SysError {
        op: "receive the network namespace".into(),
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    })?;
    let Some(fd) = fds.and_then(|mut fds| fds.pop()) else {
        return Err(SysError {
            op: "receive the network namespace (P0 could not make it)".into(),
            errno: libc::ECHILD,
        });
    };
    // SAFETY: setns(2) on a namespace descriptor we own.
    let ret = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
    sys::check(ret, || "setns into the network namespace".to_string()).map(|_| ())
}

/// File descriptors of the sandbox's cgroups, opened by P0 with its host credentials.
struct CgroupFds {
    /// v1 `tasks` files, written `0` by P1 itself.
    v1_tasks: Vec<libc::c_int>,
    /// The v2 directory (for `clone3(CLONE_INTO_CGROUP)`) and its `cgroup.procs` (fallback).
    v2_dir: Option<libc::c_int>,
    v2_procs: Option<libc::c_int>,
}

fn open_cgroups(plan: &Prelude) -> StageResult<CgroupFds> {
    fn open(path: &Path, flags: libc::c_int) -> StageResult<libc::c_int> {
        let c = cpath(path);
        // SAFETY: valid C string; the fd is closed by whichever process stops needing it.
        let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
        stage(
            "cgroup",
            sys::check(fd, || format!("open {}", path.display())),
        )
    }
    let join = &plan.cgroups;
    let mut fds = CgroupFds {
        v1_tasks: Vec::with_capacity(join.v1_tasks.len()),
        v2_dir: None,
        v2_procs: None,
    };
    for tasks in &join.v1_tasks {
        fds.v1_tasks.push(open(tasks, libc::O_WRONLY)?);
    }
    if let Some(dir) = &join.v2_dir {
        fds.v2_dir = Some(open(dir, libc::O_RDONLY | libc::O_DIRECTORY)?);
        fds.v2_procs = Some(open(&dir.join("cgroup.procs"), libc::O_WRONLY)?);
    }
    Ok(fds)
}

fn close_opt(fd: Option<libc::c_int>) {
    if let Some(fd) = fd {
        // SAFETY: an fd this process owns and no longer uses.
        unsafe { libc::close(fd) };
    }
}

/// `struct clone_args` of clone3(2), up to `cgroup` (CLONE_ARGS_SIZE_VER2).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Forks P1, straight into the v2 cgroup when one is given and the kernel has
/// `clone3(CLONE_INTO_CGROUP)`. Returns the pid (0 in the child) and whether the child was
/// placed in the v2 cgroup.
fn fork_into(v2_dir: Option<libc::c_int>) -> SysResult<(libc::pid_t, bool)> {
    if let Some(dir) = v2_dir {
        let args = CloneArgs {
            flags: CLONE_INTO_CGROUP,
            exit_signal: libc::SIGCHLD as u64,
            cgroup: dir as u64,
            ..CloneArgs::default()
        };
        // SAFETY: clone3 without CLONE_VM and without a stack behaves like fork(2): the child
        // gets a copy of this single-threaded process and returns here with 0. `args` is a
        // valid clone_args of the size passed.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &args as *const CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        if ret >= 0 {
            return Ok((ret as libc::pid_t, true));
        }
        // ENOSYS/E2BIG (no clone3 or no cgroup field) and any refusal to place the child: fall
        // back to fork and a `cgroup.procs` write, which reports its own error if it fails.
    }
    // SAFETY: the init is single-threaded, so the child may keep running arbitrary Rust code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return sys::fail("fork");
    }
    Ok((pid, false))
}

/// P0: moves P1 into the v2 cgroup when `clone3` could not place it (the slow migration, done
/// while P1 builds its root), then lets P1 go on. P1 starts the command only after the `j`
/// byte, so every sandbox process is born inside.
fn join_v2_and_release(child: libc::pid_t, procs: Option<libc::c_int>, joined: libc::c_int) {
    if let Some(fd) = procs {
        let result = sys::write_all_fd(fd, child.to_string().as_bytes());
        // SAFETY: our fd, no longer needed.
        unsafe { libc::close(fd) };
        if let Err(e) = result {
            report_error(
                "cgroup",
                &SysError {
                    op: "join the sandbox cgroup".into(),
                    errno: e.errno,
                },
            );
            let _ = sys::kill(child, libc::SIGKILL);
            // SAFETY: our fd.
            unsafe { libc::close(joined) };
            return;
        }
    }
    let _ = sys::write_all_fd(joined, b"j");
    // SAFETY: our fd.
    unsafe { libc::close(joined) };
}

/// In P1, first thing: moves itself into the v1 cgroups. A single-threaded process writing
/// `0` (itself) to `tasks` is the one migration the kernel does without its global lock.
fn join_v1(tasks: &[libc::c_int]) -> SysResult<()> {
    for fd in tasks {
        let result = sys::write_all_fd(*fd, b"0");
        // SAFETY: our fd, no longer needed.
        unsafe { libc::close(*fd) };
        result.map_err(|e| SysError {
            op: "join the sandbox cgroup (v1 tasks)".into(),
            errno: e.errno,
        })?;
    }
    Ok(())
}

/// In P1: waits until P0 has placed us in the v2 cgroup, then gives the sandbox its own cgroup
/// namespace rooted there.
fn await_cgroups(joined: libc::c_int) -> SysResult<()> {
    let mut byte = [0u8; 1];
    loop {
        // SAFETY: valid one-byte buffer.
        let n = unsafe { libc::read(joined, byte.as_mut_ptr().cast(), 1) };
        if n < 0 && sys::errno() == libc::EINTR {
            continue;
        }
        // SAFETY: our fd.
        unsafe { libc::close(joined) };
        if n != 1 || byte[0] != b'j' {
            return Err(SysError {
                op: "joining the sandbox cgroups failed".into(),
                errno: libc::ECHILD,
            });
        }
        break;
    }
    sys::unshare(libc::CLONE_NEWCGROUP, "cgroup namespace")
}

/// P0 after the fork: wait for P1, kill it on request or when the runtime goes away.
fn supervise(child: libc::pid_t, pending: &[u8]) -> i32 {
    if pending.contains(&b'k') {
        let _ = sys::kill(child, libc::SIGKILL);
    }
    // SAFETY: pidfd_open takes a pid and flags.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, child, 0) } as libc::c_int;
    let mut control_open = true;
    if pidfd >= 0 {
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: if control_open { CONTROL_FD } else { -1 },
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: pidfd,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: `fds` is a valid array of two pollfd structs.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if n < 0 {
                if sys::errno() == libc::EINTR {
                    continue;
                }
                break;
            }
            if fds[1].revents != 0 {
                break;
            }
            if fds[0].revents != 0 {
                let mut buf = [0u8; 64];
                // SAFETY: `buf` is a valid writable buffer.
                let r = unsafe { libc::read(CONTROL_FD, buf.as_mut_ptr().cast(), buf.len()) };
                if r <= 0 {
                    if r < 0 && sys::errno() == libc::EINTR {
                        continue;
                    }
                    // The runtime is gone (or closed its end): the sandbox must not outlive it.
                    control_open = false;
                    let _ = sys::kill(child, libc::SIGKILL);
                } else if buf[..r as usize].contains(&b'k') {
                    let _ = sys::kill(child, libc::SIGKILL);
                }
            }
        }
    }
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out-pointer; `child` is our child.
        let r = unsafe { libc::waitpid(child, &mut status, libc::__WALL) };
        if r >= 0 || sys::errno() != libc::EINTR {
            break;
        }
    }
    if libc::WIFSIGNALED(status) {
        report(json!({"event": "initExit", "signal": libc::WTERMSIG(status)}));
    }
    // Every sandbox process is gone. Close the runtime's socket and pipes now rather than at
    // exit: the kernel releases a dying process's files only after tearing down the
    // namespaces it was the last member of (mounts, network), and the runtime need not wait
    // for that.
    // SAFETY: close_range on our own descriptor table; nothing below uses a descriptor.
    unsafe { libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) };
    // What is left is our own exit, and with it the teardown of the sandbox's mount
    // namespace: work nobody waits for, which must not hold up the runtime just woken by the
    // EOF (measured here: the runtime saw it 0.25–0.3 ms after the close at normal priority,
    // 0.04 ms after it at the lowest).
    // SAFETY: setpriority on ourselves; lowering our own priority needs no privilege.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
    0
}

/// P1, pid 1 of the sandbox. Returns the exit code of P1 itself.
fn pid1(
    plan: &InitPlan,
    v1_tasks: &[libc::c_int],
    joined: libc::c_int,
    netns: Option<OwnedFd>,
) -> i32 {
    if let Err(e) = sys::prctl(
        libc::PR_SET_PDEATHSIG,
        libc::SIGKILL as libc::c_ulong,
        "PR_SET_PDEATHSIG",
    ) {
        report_error("pdeathsig", &e);
        return 1;
    }
    if let Err(e) = join_v1(v1_tasks) {
        report_error("cgroup", &e);
        return 1;
    }
    let ready = match setup(plan, netns, joined) {
        Ok(r) => r,
        Err((stage, err)) => {
            report_error(stage, &err);
            return 1;
        }
    };
    report(ready);
    let pid = match PreparedExec::new(plan).spawn() {
        Ok(pid) => pid,
        // The command could not start: what a shell would print and exit with.
        Err((code, message)) => {
            let _ = sys::write_all_fd(2, message.as_bytes());
            report(json!({"event": "exit", "code": code}));
            return 0;
        }
    };
    // The output pipes are the command's now: once it and whatever it started are gone,
    // the runtime reads their end without waiting for us.
    // SAFETY: closing our own stdout and stderr, which nothing here writes to again.
    unsafe {
        libc::close(1);
        libc::close(2);
    }
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
        if r == pid {
            break;
        }
        if r < 0 && sys::errno() != libc::EINTR {
            report_error(
                "wait",
                &SysError {
                    op: "wait command".into(),
                    errno: sys::errno(),
                },
            );
            return 1;
        }
        // Another pid: an orphan reparented to us and now reaped. Keep waiting.
    }
    // Whatever the command left behind ends now, before the report: the `exit` event means
    // no process of the sandbox but this one is left, so the runtime can go on without
    // waiting for our own exit and the teardown of the namespaces (~0.3 ms here). We have no
    // capabilities, but every sandbox process has our uid, which is all kill(2) asks.
    // SAFETY: kill(-1) from pid 1 of the pid namespace reaches every other process in it.
    unsafe { libc::kill(-1, libc::SIGKILL) };
    loop {
        // SAFETY: waitpid with a null status pointer.
        let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::__WALL) };
        if r < 0 && sys::errno() != libc::EINTR {
            break; // ECHILD: none left.
        }
    }
    if libc::WIFEXITED(status) {
        report(json!({"event": "exit", "code": libc::WEXITSTATUS(status)}));
    } else if libc::WIFSIGNALED(status) {
        report(json!({"event": "exit", "signal": libc::WTERMSIG(status)}));
    }
    // Returning ends pid 1, which would also make the kernel kill every remaining process of
    // the sandbox (there are none left).
    0
}

fn join(root: &Path, inner: &Path) -> PathBuf {
    root.join(inner.strip_prefix("/").unwrap_or(inner))
}

/// `mkdir -p`, mkdir first: the root is a fresh tmpfs that only we write, where most paths
/// are new and their parents already made, so one syscall is the common case (a stat before
/// each mkdir cost about a hundred syscalls per sandbox). EEXIST is taken as done: something
/// else in the way fails the mount or file operation that follows, with its own error.
fn mkdir_p(path: &Path, mode: u32) -> SysResult<()> {
    let c = cpath(path);
    // SAFETY: `c` is a valid C string.
    let ret = unsafe { libc::mkdir(c.as_ptr(), mode) };
    if ret == 0 {
        return Ok(());
    }
    match sys::errno() {
        libc::EEXIST => Ok(()),
        libc::ENOENT => {
            if let Some(parent) = path.parent() {
                mkdir_p(parent, 0o755)?;
            }
            // SAFETY: as above.
            let ret = unsafe { libc::mkdir(c.as_ptr(), mode) };
            if ret < 0 && sys::errno() != libc::EEXIST {
                return sys::fail(format!("mkdir {}", path.display()));
            }
            Ok(())
        }
        _ => sys::fail(format!("mkdir {}", path.display())),
    }
}

fn touch(path: &Path) -> SysResult<()> {
    if let Some(parent) = path.parent() {
        mkdir_p(parent, 0o755)?;
    }
    let c = cpath(path);
    // SAFETY: `c` is a valid C string; the fd is closed right away.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0o644,
        )
    };
    sys::check(fd, || format!("create {}", path.display()))?;
    // SAFETY: fd was just opened and is owned here.
    unsafe { libc::close(fd) };
    Ok(())
}

fn attr_bits(a: MountAttrs) -> u64 {
    let mut bits = 0;
    if a.readonly {
        bits |= sys::MOUNT_ATTR_RDONLY;
    }
    if a.nosuid {
        bits |= sys::MOUNT_ATTR_NOSUID;
    }
    if a.nodev {
        bits |= sys::MOUNT_ATTR_NODEV;
    }
    if a.noexec {
        bits |= sys::MOUNT_ATTR_NOEXEC;
    }
    bits
}

/// Copies a regular file of at most `max` bytes, keeping its permission bits (without
/// setuid/setgid/sticky); anything else (gone, not a regular file, too big) is skipped. Raw
/// syscalls on one descriptor each, about half of what `std::fs` spends on a copy: P1 makes
/// a dozen of these for `/etc` on the path to the step's start.
fn copy_small_file(source: &Path, dest: &Path, max: u64) -> SysResult<()> {
    let fail = |op: &str| SysError {
        op: format!("{op} {}", dest.display()),
        errno: sys::errno(),
    };
    let src_c = cpath(source);
    // SAFETY: valid C string; the descriptor is closed before returning.
    let src = unsafe { libc::open(src_c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if src < 0 {
        return Ok(());
    }
    let content = (|| {
        // SAFETY: `stat` is plain old data; zeroed is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid out-pointer for fstat on our descriptor.
        let stat = unsafe { libc::fstat(src, &mut st) };
        if stat < 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size as u64 > max {
            return None;
        }
        let mut buf = vec![0u8; st.st_size as usize + 1];
        let mut len = 0;
        loop {
            // SAFETY: reading into the unused tail of `buf`.
            let n = unsafe { libc::read(src, buf[len..].as_mut_ptr().cast(), buf.len() - len) };
            if n < 0 && sys::errno() == libc::EINTR {
                continue;
            }
            if n <= 0 {
                break;
            }
            len += n as usize;
            if len == buf.len() {
                // Grew past its size since the fstat: over the limit, skip it.
                return None;
            }
        }
        buf.truncate(len);
        Some((buf, st.st_mode & 0o755))
    })();
    // SAFETY: our descriptor.
    unsafe { libc::close(src) };
    let Some((content, mode)) = content else {
        return Ok(());
    };
    let dst_c = cpath(dest);
    // SAFETY: valid C string; the descriptor is closed below.
    let dst = unsafe {
        libc::open(
            dst_c.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            mode,
        )
    };
    if dst < 0 {
        return Err(fail("create"));
    }
    let written = sys::write_all_fd(dst, &content);
    // The umask may have narrowed the mode at creation; say it exactly.
    // SAFETY: fchmod on our descriptor.
    let moded = unsafe { libc::fchmod(dst, mode) };
    // SAFETY: our descriptor, not used after.
    unsafe { libc::close(dst) };
    written?;
    if moded < 0 {
        return Err(fail("chmod"));
    }
    Ok(())
}

fn mount_flags(a: MountAttrs) -> libc::c_ulong {
    let mut f = 0;
    if a.readonly {
        f |= libc::MS_RDONLY;
    }
    if a.nosuid {
        f |= libc::MS_NOSUID;
    }
    if a.nodev {
        f |= libc::MS_NODEV;
    }
    if a.noexec {
        f |= libc::MS_NOEXEC;
    }
    f
}

/// Applies attributes to a mount. mount_setattr only adds flags, so flags the kernel locked
/// on a mount inherited from the host are kept; the remount fallback has to repeat them.
fn set_attrs(path: &Path, attrs: MountAttrs, recursive: bool) -> SysResult<()> {
    let bits = attr_bits(attrs);
    if bits == 0 {
        return Ok(());
    }
    match sys::mount_setattr(path, bits, recursive) {
        Err(e) if e.errno == libc::ENOSYS => {
            let st = sys::statvfs(path)?;
            let mut locked: libc::c_ulong = 0;
            for (st_flag, ms_flag) in [
                (libc::ST_NOSUID, libc::MS_NOSUID),
                (libc::ST_NODEV, libc::MS_NODEV),
                (libc::ST_NOEXEC, libc::MS_NOEXEC),
                (libc::ST_NOATIME, libc::MS_NOATIME),
                (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
                (libc::ST_RELATIME, libc::MS_RELATIME),
            ] {
                if st.f_flag & st_flag != 0 {
                    locked |= ms_flag;
                }
            }
            sys::mount(
                None,
                path,
                None,
                libc::MS_REMOUNT | libc::MS_BIND | mount_flags(attrs) | locked,
                None,
            )
        }
        other => other,
    }
}

/// Escapes a path for overlayfs' option parser (`,` separates options, `:` lower layers).
fn overlay_escape(path: &Path) -> String {
    let s = path.to_string_lossy();
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | ',' | ':') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Makes the mount point of a mount op in the root being built (see
/// [`MountOp::mount_point`]); nothing for other ops.
pub fn make_mount_point(op: &MountOp, root: &Path) -> SysResult<()> {
    match op.mount_point() {
        Some((path, TargetKind::Dir, mode)) => mkdir_p(&join(root, path), mode),
        Some((path, TargetKind::File, _)) => touch(&join(root, path)),
        None => Ok(()),
    }
}

/// Carries out one op of the plan in the root being built at `root`. `prepared`: the root is
/// a prepared one ([`crate::plan::RootFs::Prepared`]), whose mount points exist. Also used by
/// the runtime to make a prepared root's files (its `prepared_root`).
pub fn apply(op: &MountOp, root: &Path, prepared: bool) -> SysResult<()> {
    if let MountOp::Bind {
        source,
        optional: true,
        ..
    } = op
    {
        if std::fs::symlink_metadata(source).is_err() {
            return Ok(());
        }
    }
    if !prepared {
        make_mount_point(op, root)?;
    }
    match op {
        MountOp::Dir { path, mode } => mkdir_p(&join(root, path), *mode),
        MountOp::Symlink { path, target } => {
            let at = join(root, path);
            if let Some(parent) = at.parent() {
                mkdir_p(parent, 0o755)?;
            }
            std::os::unix::fs::symlink(target, &at).map_err(|e| SysError {
                op: format!("symlink {}", at.display()),
                errno: e.raw_os_error().unwrap_or(0),
            })
        }
        MountOp::Tmpfs {
            path,
            size_bytes,
            mode,
            attrs,
        } => {
            let at = join(root, path);
            let data = cstring(&format!("mode={mode:o},size={size_bytes}"));
            sys::mount(
                Some(c"tmpfs"),
                &at,
                Some(c"tmpfs"),
                mount_flags(*attrs),
                Some(&data),
            )
        }
        MountOp::Bind {
            source,
            path,
            attrs,
            ..
        } => {
            let at = join(root, path);
            let src = cpath(source);
            sys::mount(Some(&src), &at, None, libc::MS_BIND | libc::MS_REC, None)?;
            set_attrs(&at, *attrs, true)
        }
        MountOp::CopyFile {
            source,
            path,
            max_bytes,
        } => {
            let at = join(root, path);
            if let Some(parent) = at.parent() {
                mkdir_p(parent, 0o755)?;
            }
            copy_small_file(source, &at, *max_bytes)
        }
        MountOp::Rebind {
            path,
            attrs,
            optional,
        } => {
            let at = join(root, path);
            if *optional && std::fs::symlink_metadata(&at).is_err() {
                return Ok(());
            }
            let src = cpath(&at);
            sys::mount(Some(&src), &at, None, libc::MS_BIND | libc::MS_REC, None)?;
            set_attrs(&at, *attrs, true)
        }
        MountOp::Overlay {
            lower,
            upper,
            work,
            path,
            attrs,
        } => {
            let at = join(root, path);
            let data = cstring(&format!(
                "lowerdir={},upperdir={},workdir={},userxattr",
                overlay_escape(lower),
                overlay_escape(upper),
                overlay_escape(work)
            ));
            sys::mount(
                Some(c"overlay"),
                &at,
                Some(c"overlay"),
                mount_flags(*attrs),
                Some(&data),
            )?;
            // A workdir the kernel cannot use makes overlayfs fall back to read-only silently.
            let st = sys::statvfs(&at)?;
            if !attrs.readonly && st.f_flag & libc::ST_RDONLY != 0 {
                return Err(SysError {
                    op: format!(
                        "overlay at {} was mounted read-only (workdir {} unusable)",
                        path.display(),
                        work.display()
                    ),
                    errno: libc::EROFS,
                });
            }
            Ok(())
        }
        MountOp::MaskDir { path } => {
            let at = join(root, path);
            if !at.is_dir() {
                return Ok(());
            }
            sys::mount(
                Some(c"tmpfs"),
                &at,
                Some(c"tmpfs"),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                Some(c"size=4k,mode=0555"),
            )
        }
        MountOp::Proc { path } => {
            let at = join(root, path);
            sys::mount(
                Some(c"proc"),
                &at,
                Some(c"proc"),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                None,
            )
        }
        MountOp::Devpts { path } => {
            let at = join(root, path);
            sys::mount(
                Some(c"devpts"),
                &at,
                Some(c"devpts"),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                Some(c"newinstance,ptmxmode=0666,mode=0620"),
            )
        }
        MountOp::Setattr { path, attrs } => set_attrs(&join(root, path), *attrs, false),
    }
}

fn lo_up() -> SysResult<()> {
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    sys::check(fd, || "socket for lo".to_string())?;
    // SAFETY: ifreq is plain old data; zeroed is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `ifr` is a valid ifreq for SIOCGIFFLAGS/SIOCSIFFLAGS on our own socket.
    let result = unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr) < 0 {
            sys::fail("SIOCGIFFLAGS lo")
        } else {
            ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            if libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr) < 0 {
                sys::fail("SIOCSIFFLAGS lo")
            } else {
                Ok(())
            }
        }
    };
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    result
}

fn read_cap_last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// P1: build the root, pivot, drop privileges. Returns the `ready` report.
fn setup(plan: &InitPlan, netns: Option<OwnedFd>, joined: libc::c_int) -> StageResult<Value> {
    let last_cap = read_cap_last_cap();
    // Nothing we mount may propagate back to the host.
    stage(
        "mount",
        sys::mount(
            None,
            Path::new("/"),
            None,
            libc::MS_REC | libc::MS_PRIVATE,
            None,
        ),
    )?;
    let root = &plan.new_root;
    let prepared = match &plan.root {
        RootFs::Tmpfs => {
            let data = cstring(&format!("mode=0755,size={}", crate::plan::ROOT_TMPFS_BYTES));
            stage(
                "mount",
                sys::mount(
                    Some(c"tmpfs"),
                    root,
                    Some(c"tmpfs"),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    Some(&data),
                ),
            )?;
            false
        }
        // Not recursive: the prepared directory holds no mounts, and nothing of the host
        // below it may come along. Read-only with the plan's last op, like the tmpfs root.
        RootFs::Prepared { source } => {
            stage(
                "mount",
                sys::mount(Some(&cpath(source)), root, None, libc::MS_BIND, None),
            )?;
            true
        }
    };
    for op in &plan.mounts {
        stage("mount", apply(op, root, prepared))?;
    }
    let hostname = cstring(&plan.hostname);
    // SAFETY: `hostname` is valid for the given length.
    let ret = unsafe { libc::sethostname(hostname.as_ptr(), plan.hostname.len()) };
    stage("hostname", sys::check(ret, || "sethostname".to_string()))?;
    stage("pivot_root", pivot(root))?;
    stage("cgroup", await_cgroups(joined))?;
    // As late as can be, still with the capabilities setns needs: P0 makes the namespace
    // while we build the root (its ~0.5 ms took longer than the prepared root's mounts).
    if let Some(sock) = netns {
        stage("network", enter_network_namespace(&sock))?;
    }
    restrict(plan, last_cap)
}

fn pivot(root: &Path) -> SysResult<()> {
    let c = cpath(root);
    // SAFETY: valid C string.
    sys::check(unsafe { libc::chdir(c.as_ptr()) }, || {
        format!("chdir {}", root.display())
    })?;
    // SAFETY: pivot_root(".", ".") stacks the old root on the new one; both are valid strings.
    let ret = unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) };
    sys::check_long(ret, || "pivot_root".to_string())?;
    sys::umount2(Path::new("."), libc::MNT_DETACH)?;
    // SAFETY: valid C string.
    sys::check(unsafe { libc::chdir(c"/".as_ptr()) }, || {
        "chdir /".to_string()
    })?;
    Ok(())
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
// securebits: NOROOT, NO_SETUID_FIXUP, KEEP_CAPS (off) and NO_CAP_AMBIENT_RAISE, all locked.
// (bits 0-7 set except KEEP_CAPS, bit 4).
const SECUREBITS: libc::c_ulong = 0xef;

fn drop_capabilities(last_cap: u32) -> SysResult<()> {
    sys::prctl(libc::PR_SET_SECUREBITS, SECUREBITS, "PR_SET_SECUREBITS")?;
    for cap in 0..=last_cap {
        match sys::prctl(
            libc::PR_CAPBSET_DROP,
            cap as libc::c_ulong,
            "PR_CAPBSET_DROP",
        ) {
            Err(e) if e.errno == libc::EINVAL => {}
            other => {
                other?;
            }
        }
    }
    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL takes no pointers.
    let ret = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    sys::check(ret, || "clear ambient capabilities".to_string())?;
    Ok(())
}

fn capset_zero() -> SysResult<()> {
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: header and a two-element data array, as capset(2) version 3 requires.
    let ret =
        unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) };
    sys::check_long(ret, || "capset".to_string()).map(|_| ())
}

fn apply_landlock(plan: &LandlockPlan) -> Result<&'static str, String> {
    use landlock::{
        Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
        RulesetCreatedAttr, RulesetStatus, Scope, ABI,
    };
    let abi = ABI::V6;
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| err(&e))?;
    // No AccessNet is handled: the network namespace is the boundary (see LandlockPlan).
    if plan.scope {
        ruleset = ruleset
            .scope(Scope::AbstractUnixSocket | Scope::Signal)
            .map_err(|e| err(&e))?;
    }
    let mut created = ruleset.create().map_err(|e| err(&e))?;
    let rules = plan
        .read_dirs
        .iter()
        .map(|p| (p, AccessFs::from_read(abi)))
        .chain(plan.write_dirs.iter().map(|p| (p, AccessFs::from_all(abi))))
        .chain(
            plan.write_files
                .iter()
                .map(|p| (p, AccessFs::from_file(abi))),
        );
    for (path, access) in rules {
        // A rule for a path that does not exist in this sandbox (an optional device) is
        // simply not needed.
        let Ok(fd) = PathFd::new(path) else { continue };
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| err(&e))?;
    }
    let status = created.restrict_self().map_err(|e| err(&e))?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => "enforced",
        RulesetStatus::PartiallyEnforced => "degraded",
        RulesetStatus::NotEnforced => "unavailable",
    })
}

/// Installs `program` (nothing when it is empty).
fn install_seccomp(program: &[crate::plan::BpfInstruction]) -> SysResult<()> {
    if program.is_empty() {
        return Ok(());
    }
    let filter: Vec<libc::sock_filter> = program
        .iter()
        .map(|&(code, jt, jf, k)| libc::sock_filter { code, jt, jf, k })
        .collect();
    let fprog = libc::sock_fprog {
        len: filter.len() as libc::c_ushort,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points at `filter`, which outlives the call; the kernel copies it.
    let ret = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &fprog as *const libc::sock_fprog,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    sys::check(ret, || "install seccomp filter".to_string()).map(|_| ())
}

/// Privileges go in this order: capabilities (while we still may change securebits), then
/// no_new_privs, Landlock (needs no_new_privs), the remaining capability sets, and seccomp last
/// so that nothing above is blocked by it.
fn restrict(plan: &InitPlan, last_cap: u32) -> StageResult<Value> {
    stage("capabilities", drop_capabilities(last_cap))?;
    stage(
        "no_new_privs",
        sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS"),
    )?;
    let (landlock, landlock_detail) = match apply_landlock(&plan.landlock) {
        Ok(status) => (status, String::new()),
        Err(e) => ("unavailable", e),
    };
    stage("capabilities", capset_zero())?;
    // No process of the sandbox may ptrace or read the memory of pid 1.
    stage(
        "dumpable",
        sys::prctl(libc::PR_SET_DUMPABLE, 0, "PR_SET_DUMPABLE"),
    )?;
    stage("seccomp", install_seccomp(&plan.seccomp))?;
    Ok(json!({
        "event": "ready",
        "landlock": landlock,
        "landlockDetail": landlock_detail,
        "seccomp": !plan.seccomp.is_empty(),
    }))
}

/// The command, prepared in P1.
struct PreparedExec {
    candidates: Vec<CString>,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: CString,
    argv0: String,
}

impl PreparedExec {
    fn new(plan: &InitPlan) -> PreparedExec {
        let argv0 = plan.exec.argv.first().cloned().unwrap_or_default();
        let candidates = if argv0.contains('/') {
            vec![cstring(&argv0)]
        } else {
            plan.exec
                .search_path
                .split(':')
                .filter(|d| !d.is_empty())
                .map(|d| cstring(&format!("{}/{argv0}", d.trim_end_matches('/'))))
                .collect()
        };
        PreparedExec {
            candidates,
            argv: plan.exec.argv.iter().map(|a| cstring(a)).collect(),
            env: plan.exec.env.iter().map(|e| cstring(e)).collect(),
            cwd: cpath(&plan.exec.cwd),
            argv0,
        }
    }

    /// The message and exit code of a command that could not start, as a shell gives them.
    fn failure(&self, code: i32, what: &str, errno: i32) -> (i32, String) {
        let message = format!(
            "smithers-sandbox: {what} {}: {}\n",
            self.argv0,
            std::io::Error::from_raw_os_error(errno)
        );
        (code, message)
    }

    /// Starts the command (P2) with `posix_spawn`, which clones without copying P1's page
    /// tables (glibc's CLONE_VM|CLONE_VFORK): in its own session, stdin `/dev/null`, stdout
    /// and stderr the runtime's pipes, no other descriptor, every signal at its default
    /// disposition and none blocked (P1 is a Rust program, which ignores SIGPIPE; a command
    /// must not inherit that, or `yes | head` reports EPIPE instead of ending quietly). The
    /// working directory is P1's own, set first. No death signal is needed: P1 is pid 1 of the
    /// sandbox's pid namespace, whose death kills every process in it. Returns the pid, or the
    /// exit code and message of a command that could not start (126, 127 for not found).
    fn spawn(&self) -> Result<libc::pid_t, (i32, String)> {
        // SAFETY: valid C string.
        if unsafe { libc::chdir(self.cwd.as_ptr()) } < 0 {
            return Err(self.failure(126, "cannot enter the working directory for", sys::errno()));
        }
        if self.argv.is_empty() {
            return Err(self.failure(127, "empty command", libc::ENOENT));
        }
        // Everything P1 holds beyond 0-2 (none of which it needs after the spawn) ends at the
        // command's exec. CLOSE_RANGE_CLOEXEC: Linux 5.11; before it, one fd at a time.
        // SAFETY: close_range on our own descriptor table, only setting flags.
        let marked = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 4u32) };
        if marked < 0 {
            if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
                for fd in dir
                    .flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse().ok())
                {
                    if fd > 2 {
                        // SAFETY: fcntl on a descriptor number; a stale one fails harmlessly.
                        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
                    }
                }
            }
        }
        let mut argv: Vec<*mut libc::c_char> =
            self.argv.iter().map(|a| a.as_ptr().cast_mut()).collect();
        argv.push(std::ptr::null_mut());
        let mut envp: Vec<*mut libc::c_char> =
            self.env.iter().map(|e| e.as_ptr().cast_mut()).collect();
        envp.push(std::ptr::null_mut());
        // SAFETY: the attribute and file-action objects are initialised before use and
        // destroyed after; every pointer passed to posix_spawn (path, argv, envp, the objects)
        // is valid for the call, and argv/envp are NULL-terminated arrays of C strings.
        unsafe {
            let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
            let mut actions: libc::posix_spawn_file_actions_t = std::mem::zeroed();
            // Each set-up call's result is checked: a failed one (ENOMEM, EINVAL) would start
            // the command with P1's own stdin, signal state or session, so it is refused.
            let e = libc::posix_spawnattr_init(&mut attr);
            if e != 0 {
                return Err(self.failure(126, "cannot prepare the start of", e));
            }
            let e = libc::posix_spawn_file_actions_init(&mut actions);
            if e != 0 {
                libc::posix_spawnattr_destroy(&mut attr);
                return Err(self.failure(126, "cannot prepare the start of", e));
            }
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut none: libc::sigset_t = std::mem::zeroed();
            let flags = libc::POSIX_SPAWN_SETSID
                | libc::POSIX_SPAWN_SETSIGDEF as libc::c_short
                | libc::POSIX_SPAWN_SETSIGMASK as libc::c_short;
            let setup = [
                // sigfillset/sigemptyset return -1 (errno), the posix_spawn calls an error number.
                if libc::sigfillset(&mut all) < 0 {
                    sys::errno()
                } else {
                    0
                },
                if libc::sigemptyset(&mut none) < 0 {
                    sys::errno()
                } else {
                    0
                },
                libc::posix_spawnattr_setsigdefault(&mut attr, &all),
                libc::posix_spawnattr_setsigmask(&mut attr, &none),
                libc::posix_spawnattr_setflags(&mut attr, flags),
                libc::posix_spawn_file_actions_addopen(
                    &mut actions,
                    0,
                    c"/dev/null".as_ptr(),
                    libc::O_RDWR,
                    0,
                ),
            ];
            if let Some(&e) = setup.iter().find(|&&e| e != 0) {
                libc::posix_spawn_file_actions_destroy(&mut actions);
                libc::posix_spawnattr_destroy(&mut attr);
                return Err(self.failure(126, "cannot prepare the start of", e));
            }
            // The PATH search of execvp: a candidate that is not there is skipped, one that
            // cannot be executed is remembered; the last such error decides 126 over 127.
            let mut last = libc::ENOENT;
            let mut result = None;
            for candidate in &self.candidates {
                if libc::access(candidate.as_ptr(), libc::X_OK) < 0 {
                    let e = sys::errno();
                    if e != libc::ENOENT && e != libc::ENOTDIR {
                        last = e;
                    }
                    continue;
                }
                let mut pid: libc::pid_t = 0;
                let e = libc::posix_spawn(
                    &mut pid,
                    candidate.as_ptr(),
                    &actions,
                    &attr,
                    argv.as_ptr(),
                    envp.as_ptr(),
                );
                if e == 0 {
                    result = Some(pid);
                    break;
                }
                if e != libc::ENOENT && e != libc::ENOTDIR {
                    last = e;
                }
            }
            libc::posix_spawn_file_actions_destroy(&mut actions);
            libc::posix_spawnattr_destroy(&mut attr);
            match result {
                Some(pid) => Ok(pid),
                None => {
                    let code = if last == libc::ENOENT { 127 } else { 126 };
                    Err(self.failure(code, "cannot execute", last))
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Probe mode

fn outcome(r: SysResult<()>) -> Value {
    match r {
        Ok(()) => json!({"ok": true}),
        Err(e) => json!({"ok": false, "detail": e.to_string(), "errno": e.errno}),
    }
}

/// Tries every mechanism once in throwaway namespaces and prints the findings as JSON on stdout;
/// the seccomp program it tries is the runtime's, read from stdin ([`ProbeInput`]).
/// Everything it mounts lives in its own mount namespace and vanishes with it; the scratch
/// directory is the caller's to remove.
fn run_probe(scratch: &Path) -> i32 {
    let mut out = serde_json::Map::new();
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let user = sys::unshare(libc::CLONE_NEWUSER, "user namespace").and_then(|()| {
        sys::write_file(Path::new("/proc/self/setgroups"), b"deny")?;
        sys::write_file(
            Path::new("/proc/self/uid_map"),
            format!("0 {uid} 1\n").as_bytes(),
        )?;
        sys::write_file(
            Path::new("/proc/self/gid_map"),
            format!("0 {gid} 1\n").as_bytes(),
        )
    });
    let user_ok = user.is_ok();
    out.insert("user".into(), outcome(user));
    if user_ok {
        for (name, flag) in [
            ("mount", libc::CLONE_NEWNS),
            ("ipc", libc::CLONE_NEWIPC),
            ("uts", libc::CLONE_NEWUTS),
            ("net", libc::CLONE_NEWNET),
            ("cgroup", libc::CLONE_NEWCGROUP),
            ("pid", libc::CLONE_NEWPID),
        ] {
            out.insert(name.into(), outcome(sys::unshare(flag, name)));
        }
        let mount_ok = out["mount"]["ok"] == json!(true);
        if mount_ok {
            out.insert("overlay".into(), outcome(probe_overlay(scratch)));
        }
        if out["pid"]["ok"] == json!(true) && mount_ok {
            out.insert("proc".into(), outcome(probe_proc(scratch)));
        }
        if out["net"]["ok"] == json!(true) {
            out.insert("loopback".into(), outcome(lo_up()));
        }
    }
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only queries.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    out.insert(
        "landlockAbi".into(),
        if abi > 0 {
            json!(abi)
        } else {
            json!({"ok": false, "errno": sys::errno()})
        },
    );
    let nnp = sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS").map(|_| ());
    out.insert("noNewPrivs".into(), outcome(nnp));
    let landlock = apply_landlock(&LandlockPlan {
        read_dirs: vec![PathBuf::from("/")],
        write_dirs: vec![PathBuf::from("/tmp")],
        write_files: vec![],
        scope: true,
    });
    out.insert(
        "landlock".into(),
        match landlock {
            Ok(status) => json!({"ok": status == "enforced", "status": status}),
            Err(e) => json!({"ok": false, "detail": e}),
        },
    );
    let seccomp = match probe_input() {
        Ok(ProbeInput {
            seccomp: Some(program),
            ..
        }) => outcome(install_seccomp(&program)),
        Ok(ProbeInput { seccomp: None, .. }) => {
            json!({"ok": false, "detail": "not tried: the runtime has no seccomp program"})
        }
        Err(detail) => json!({"ok": false, "detail": detail}),
    };
    out.insert("seccomp".into(), seccomp);
    println!("{}", Value::Object(out));
    0
}

/// The probe's input (see [`ProbeInput`]), read from stdin to its end.
fn probe_input() -> Result<ProbeInput, String> {
    use std::io::Read;
    let mut text = Vec::new();
    std::io::stdin()
        .lock()
        .take(64 << 20)
        .read_to_end(&mut text)
        .map_err(|e| format!("reading the probe's input: {e}"))?;
    let input: ProbeInput = serde_json::from_slice(&text)
        .map_err(|e| format!("the probe's input is not valid: {e}"))?;
    if input.version != PLAN_VERSION {
        return Err(format!(
            "probe input version {} but this init speaks {PLAN_VERSION} (another build)",
            input.version
        ));
    }
    Ok(input)
}

fn probe_overlay(scratch: &Path) -> SysResult<()> {
    sys::mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    let dirs = ["lower", "upper", "work", "merged"].map(|d| scratch.join(d));
    for d in &dirs {
        mkdir_p(d, 0o755)?;
    }
    mkdir_p(&dirs[0].join("sub"), 0o755)?;
    apply(
        &MountOp::Overlay {
            lower: dirs[0].clone(),
            upper: dirs[1].clone(),
            work: dirs[2].clone(),
            path: PathBuf::from("/"),
            attrs: MountAttrs::RW,
        },
        &dirs[3],
        false,
    )?;
    // Deleting a lower directory is what fails (EIO) without userxattr.
    let sub = cpath(&dirs[3].join("sub"));
    // SAFETY: valid C string.
    sys::check(unsafe { libc::rmdir(sub.as_ptr()) }, || {
        "rmdir through overlay".to_string()
    })?;
    touch(&dirs[3].join("written"))?;
    if !dirs[1].join("written").exists() {
        return Err(SysError {
            op: "overlay write did not reach the upper layer".into(),
            errno: libc::EIO,
        });
    }
    Ok(())
}

fn probe_proc(scratch: &Path) -> SysResult<()> {
    let target = scratch.join("proc");
    mkdir_p(&target, 0o755)?;
    // SAFETY: the probe is single-threaded.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return sys::fail("fork");
    }
    if pid == 0 {
        sys::child_exit(|| {
            let ok = sys::mount(
                Some(c"proc"),
                &target,
                Some(c"proc"),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                None,
            )
            .is_ok();
            if ok {
                0
            } else {
                1
            }
        });
    }
    let mut status = 0;
    // SAFETY: valid out-pointer, our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        Err(SysError {
            op: "mount proc in a new pid namespace".into(),
            errno: libc::EPERM,
        })
    }
}
