//! The zygote's side of the pre-started init (`smithers-sandbox-init --zygote`): a loop that
//! receives, over a `SOCK_SEQPACKET` socket (its fd 0), the three descriptors a fresh init
//! would have been spawned with (control socket, stdout and stderr pipes), forks, and runs the
//! init's sandbox mode in the child with them as fds 0, 1 and 2; it answers with the child's
//! pid. The runtime's side (starting the zygote, sending requests) is in
//! `smithers-runtime-native`. The descriptor passing both sides use is `crate::fdpass`'s
//! (re-exported here).

use std::os::fd::{AsRawFd, RawFd};

pub use crate::fdpass::{recv_fds, send_fds, seqpacket_pair};

/// Forks an init from this very process, as the zygote would: the child installs `fds`
/// (control socket, stdout and stderr pipes) as its 0, 1 and 2, drops every other descriptor
/// and the environment (the zygote is started with an empty one), and runs the init's
/// sandbox mode. Returns the child's pid; the caller must reap it (it is our child, not the
/// zygote's).
///
/// For a process that runs one step and is still single-threaded when it knows the step
/// (the CLI's `run`): it saves the exec of a zygote (~2 ms) on the way to the sandbox.
/// Refused (`Unsupported`) when this process has more than one thread, since the child runs
/// arbitrary Rust code after the fork.
pub fn fork_here(fds: &[RawFd; 3]) -> std::io::Result<libc::pid_t> {
    match crate::sys::thread_count() {
        Some(1) => {}
        _ => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "an init is forked in-process only from a single-threaded process",
            ))
        }
    }
    // SAFETY: this process is single-threaded (checked above), so the child may run
    // arbitrary code: no other thread can hold a lock (the allocator's, stdio's) at the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid > 0 {
        return Ok(pid);
    }
    become_init(fds, Inherited::CallersMemory, crate::sandbox::run_sandbox)
}

/// What a freshly forked init inherited beyond its descriptors.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Inherited {
    /// The zygote's: executed with an empty environment and a command line of its own.
    ZygotesImage,
    /// Its caller's ([`fork_here`]): the caller's environment and command line.
    CallersMemory,
}

/// In a child just forked to be an init, by the zygote or by [`fork_here`]: installs `fds`
/// (control socket, stdout, stderr) as 0-2 and runs the init's sandbox mode, never
/// returning. What else it does depends on what it inherited (see [`Inherited`]).
fn become_init(fds: &[RawFd; 3], inherited: Inherited, run_sandbox: fn() -> i32) -> ! {
    // SAFETY: in the child, single-threaded. The descriptors are first moved above 2 (one of
    // them could itself be 0, 1 or 2 in a process started with those closed), then installed
    // as 0-2; everything else the parent had is dropped (best effort, Linux 5.9: a sandbox's
    // P1 marks every descriptor but 0-2 close-on-exec anyway); SIGCHLD is the default (P0
    // waits for P1; the zygote ignores it). A caller's environment goes, and the name says
    // what the process is in `ps` (its command line is the caller's until scrubbed below).
    unsafe {
        let mut moved = [0 as libc::c_int; 3];
        for (i, fd) in fds.iter().enumerate() {
            moved[i] = libc::fcntl(*fd, libc::F_DUPFD, 3);
            if moved[i] < 0 {
                libc::_exit(127);
            }
        }
        for (target, fd) in moved.iter().enumerate() {
            if libc::dup2(*fd, target as libc::c_int) < 0 {
                libc::_exit(127);
            }
        }
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
        if libc::signal(libc::SIGCHLD, libc::SIG_DFL) == libc::SIG_ERR {
            libc::_exit(127);
        }
        if inherited == Inherited::CallersMemory {
            if libc::clearenv() != 0 {
                libc::_exit(127);
            }
            libc::prctl(
                libc::PR_SET_NAME,
                c"smithers-init".as_ptr() as libc::c_ulong,
                0,
                0,
                0,
            );
        }
    }
    if inherited == Inherited::CallersMemory && scrub_inherited_strings().is_err() {
        // SAFETY: _exit is always safe; the child must not return into the caller's frames.
        unsafe { libc::_exit(127) };
    }
    crate::sys::child_exit(run_sandbox)
}

/// In a child forked by [`fork_here`]: zeroes this process's copy of the caller's command
/// line and environment strings (the kernel's `arg_start..arg_end` and `env_start..env_end`,
/// on the initial stack), and writes `smithers-init` where the command line was. An exec'd
/// zygote never had them; a forked init keeps a copy of its caller's memory, and its
/// command line, unlike its memory, is readable from inside the sandbox (`/proc/1/cmdline`:
/// the host's project path, the caller's flags). Its environment was never readable there
/// (the init is not dumpable), but a copy it does not need is better gone.
fn scrub_inherited_strings() -> std::io::Result<()> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // The fields after the command name (in parentheses, which may hold anything): the
    // third field of the line is the first here; arg_start is the 48th.
    let after_name = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| std::io::Error::other("/proc/self/stat has no command name"))?;
    let fields: Vec<usize> = after_name
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let field = |n: usize| fields.get(n - 3).copied().unwrap_or(0);
    let (arg_start, arg_end, env_start, env_end) = (field(48), field(49), field(50), field(51));
    if arg_start == 0 || arg_end < arg_start || env_end < env_start {
        return Err(std::io::Error::other(
            "/proc/self/stat has no argument area",
        ));
    }
    let name = b"smithers-init\0";
    // SAFETY: the kernel reports these ranges of this process's own initial stack, which is
    // mapped and writable for the life of the process; this child is single-threaded and
    // nothing in it reads the strings again (the environment was cleared, and the init reads
    // no arguments). The name is written only if the argument area can hold it.
    unsafe {
        std::ptr::write_bytes(env_start as *mut u8, 0, env_end - env_start);
        std::ptr::write_bytes(arg_start as *mut u8, 0, arg_end - arg_start);
        if arg_end - arg_start >= name.len() {
            std::ptr::copy_nonoverlapping(name.as_ptr(), arg_start as *mut u8, name.len());
        }
    }
    Ok(())
}

/// The zygote's loop (`smithers-sandbox-init --zygote`); `run_sandbox` is what a fresh init
/// runs. Returns the exit code.
pub fn serve(run_sandbox: fn() -> i32) -> i32 {
    // SAFETY: plain signal disposition change; the zygote's children are reaped by the
    // kernel, so none is left a zombie. Without it they would be: refuse to serve.
    if unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) } == libc::SIG_ERR {
        return 1;
    }
    // SAFETY: close_range drops whatever inheritable descriptors the runtime's process had (a
    // jobserver pipe, say): the zygote outlives many sandboxes and must not keep someone
    // else's pipe open. Best effort (Linux 5.9): a sandbox's P1 marks every descriptor but
    // 0-2 close-on-exec before the command starts, whatever it inherited.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    loop {
        let fds = match recv_fds(0) {
            Ok(None) => return 0,
            Ok(Some(fds)) => fds,
            Err(_) => return 1,
        };
        let reply: i32 = if fds.len() != 3 {
            -libc::EINVAL
        } else {
            // SAFETY: the zygote is single-threaded, so the child may run arbitrary code.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // The three descriptors as 0-2, everything else the zygote had (its socket
                // among them) dropped, then the init as if freshly executed.
                let raw = [fds[0].as_raw_fd(), fds[1].as_raw_fd(), fds[2].as_raw_fd()];
                become_init(&raw, Inherited::ZygotesImage, run_sandbox);
            }
            if pid < 0 {
                -std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EAGAIN)
            } else {
                pid
            }
        };
        drop(fds);
        let bytes = reply.to_ne_bytes();
        // SAFETY: `bytes` is a valid buffer of its length.
        let sent = unsafe { libc::send(0, bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
        if sent < 0 {
            return 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test binary runs its tests on threads: an in-process fork is refused there, before
    /// any fork happens.
    #[test]
    fn fork_here_refuses_a_multithreaded_process() {
        let second = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_secs(1)));
        let err = fork_here(&[0, 1, 2]).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::Unsupported, "{err}");
        second.join().unwrap();
    }
}
