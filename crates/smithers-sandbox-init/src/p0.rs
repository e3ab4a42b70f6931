//! P0, in the host's pid namespace: forks P1 into the cgroups, makes the network namespace,
//! then only supervises P1 (a `k` byte or EOF on the control socket kills it).

use rustix::fs::{Mode, OFlags};

use serde_json::json;

use crate::cgroups::{close_opt, fork_into, join_v2_and_release, CgroupFds};
use std::os::fd::{AsRawFd, OwnedFd};

use crate::control::{
    parse_plan, parse_warm_plan, report, report_plan_error, stage, StageResult, CONTROL_FD,
};
use crate::network::send_network_namespace;
use crate::p1::{pid1, pid1_warm};
use crate::plan::Prelude;
use crate::sys::{self, SysError};

/// P1 as [`start`] forked it: its pid and, for a warm sandbox, the read end of the pipe P1
/// closes once it has read its step's plan (see [`await_step_taken`]).
pub(crate) struct Started {
    pub(crate) pid: libc::pid_t,
    pub(crate) step_taken: Option<OwnedFd>,
}

/// P0 with the plan: forks P1 into the cgroups. Returns P1's pid. P1 parses the plan (~0.15 ms
/// for its ~5 KB here, in a freshly forked process) while P0 makes the network namespace.
/// For a warm sandbox the plan is a [`crate::plan::WarmPlan`].
pub(crate) fn start(prelude: &Prelude, cgroups: CgroupFds, plan: &[u8]) -> StageResult<Started> {
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
        let pair = crate::fdpass::seqpacket_pair().map_err(|e| SysError {
            op: "socketpair for the network namespace".into(),
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        });
        let pair = stage("network", pair)?;
        let proc_self = rustix::fs::open(
            "/proc/self",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        );
        let proc_self = stage(
            "network",
            sys::rx(proc_self, || "open /proc/self".to_string()),
        )?;
        Some((pair, proc_self))
    } else {
        None
    };
    // A warm P1 reads its step's plan from fd 0 itself (P0 leaves fd 0 alone until then),
    // and closes its end of this pipe once it has.
    let taken_pipe = if prelude.warm {
        let pipe = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC);
        Some(stage("fork", sys::rx(pipe, || "pipe".to_string()))?)
    } else {
        None
    };
    // A session's exec channel: P1 keeps one end, the runtime gets the other (see
    // `send_exec_channel`); P0 keeps neither.
    let exec_pair = if prelude.session {
        if prelude.warm {
            return Err((
                "plan",
                SysError {
                    op: "a warm sandbox cannot be a session".into(),
                    errno: libc::EINVAL,
                },
            ));
        }
        let pair = crate::fdpass::seqpacket_pair().map_err(|e| SysError {
            op: "socketpair for the exec channel".into(),
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        });
        Some(stage("fork", pair)?)
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
        let exec_channel = exec_pair.map(|(_, theirs)| theirs);
        // P0's end is P0's alone.
        let taken = taken_pipe.map(|(read, write)| {
            drop(read);
            write
        });
        sys::child_exit(|| match taken {
            None => match parse_plan(plan) {
                Ok(plan) => pid1(&plan, &cgroups.v1_tasks, joined[0], netns, exec_channel),
                Err(message) => report_plan_error(message),
            },
            Some(taken) => match parse_warm_plan(plan) {
                Ok(warm) => pid1_warm(&warm, &cgroups.v1_tasks, joined[0], netns, taken),
                Err(message) => report_plan_error(message),
            },
        });
    }
    let step_taken = taken_pipe.map(|(read, _write)| read);
    // Before the network namespace, whose making P1's `ready` waits for: the runtime has the
    // channel before it hears `ready` (without a network namespace, it waits for both).
    if let Some((ours, theirs)) = exec_pair {
        drop(theirs);
        send_exec_channel(ours);
    }
    if let Some(((ours, theirs), proc_self)) = netns_pair {
        drop(theirs);
        send_network_namespace(&ours, &proc_self, prelude.egress.as_ref());
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
    Ok(Started { pid, step_taken })
}

/// Sends the runtime its end of a session's exec channel with an `execChannel` status line,
/// and closes P0's copy. Failing that, P1 is left with a channel nobody holds: it sees its
/// end at once and stops the sandbox, and the runtime hears why.
fn send_exec_channel(ours: OwnedFd) {
    let line = b"{\"event\":\"execChannel\"}\n";
    let sent = crate::network::send_with_fds(CONTROL_FD, line, &[ours.as_raw_fd()]);
    drop(ours);
    if let Err(e) = sent {
        crate::control::report_error(
            "session",
            &SysError {
                op: "send the exec channel to the runtime".into(),
                errno: e.raw_os_error().unwrap_or(libc::EIO),
            },
        );
    }
}

/// A warm sandbox's P0 between [`start`] and [`supervise`]: leaves fd 0 to P1, which reads
/// its step's plan there when the runtime sends it, and waits until P1 closes its end of
/// `taken` (it has the plan) or ends. From then on fd 0 is P0's again, for [`supervise`]:
/// P1 reads nothing past its plan's line. If the runtime goes away meanwhile, P1 sees the
/// end of fd 0 and exits, which `supervise` then sees too.
pub(crate) fn await_step_taken(child: libc::pid_t, taken: OwnedFd) {
    // SAFETY: pidfd_open takes a pid and flags.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, child, 0) } as libc::c_int;
    let timeout = if pidfd >= 0 { -1 } else { 50 };
    loop {
        let mut fds = [
            libc::pollfd {
                fd: taken.as_raw_fd(),
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
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        if n < 0 && sys::errno() == libc::EINTR {
            continue;
        }
        if n < 0 || fds[0].revents != 0 || fds[1].revents != 0 {
            break;
        }
        if pidfd < 0 && sys::child_ended(child) {
            break;
        }
    }
    close_opt((pidfd >= 0).then_some(pidfd));
}

/// P0 after the fork: wait for P1, kill it on request or when the runtime goes away.
pub(crate) fn supervise(child: libc::pid_t, pending: &[u8]) -> i32 {
    if pending.contains(&b'k') {
        let _ = sys::kill(child, libc::SIGKILL);
    }
    // SAFETY: pidfd_open takes a pid and flags.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, child, 0) } as libc::c_int;
    // Without a pidfd (Linux before 5.3) P1's end is polled for instead: the control socket
    // is watched either way, so the runtime's death still kills the sandbox.
    let timeout = if pidfd >= 0 { -1 } else { 50 };
    let mut control_open = true;
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
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        if n < 0 {
            if sys::errno() == libc::EINTR {
                continue;
            }
            // Unable to watch the runtime: the sandbox must not run on unwatched.
            let _ = sys::kill(child, libc::SIGKILL);
            break;
        }
        if fds[1].revents != 0 || (pidfd < 0 && sys::child_ended(child)) {
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
    // An error here (ECHILD) leaves status 0: no `initExit` to report.
    let status = sys::wait_child(child, libc::__WALL).map_or(0, |(_, status)| status);
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
    // Lowering our own priority needs no privilege; should it fail, the exit is only slower.
    let _ = rustix::process::setpriority_process(None, 19);
    0
}
