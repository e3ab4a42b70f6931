//! The compiled seccomp program loaded into the real kernel: a forked child sets no_new_privs,
//! installs it, makes real calls and reports their results through a pipe. This is what keeps
//! the in-house BPF compiler honest (the unit tests in `seccomp.rs` run it on an interpreter).
//!
//! The test binary is multithreaded, so the child does only async-signal-safe work: raw
//! syscalls into a fixed-size array on its stack, one `write`, then `_exit` (it never returns
//! into the test harness). Everything it needs (the program, the descriptors) is made before
//! the fork.

use std::time::Duration;

use smithers_runtime_native::seccomp;

/// What the child writes back: the install's result and time, then each check's result (the
/// call's non-negative return value, or minus its errno).
#[repr(C)]
#[derive(Clone, Copy)]
struct Report<const N: usize> {
    install: i64,
    install_nanos: i64,
    results: [i64; N],
}

fn filter() -> Vec<libc::sock_filter> {
    seccomp::compile()
        .expect("compile the filter")
        .into_iter()
        .map(|(code, jt, jf, k)| libc::sock_filter { code, jt, jf, k })
        .collect()
}

/// A raw syscall's result: its return value, or minus errno.
fn ret(r: libc::c_long) -> i64 {
    if r < 0 {
        // SAFETY: reading this thread's errno (async-signal-safe).
        -i64::from(unsafe { *libc::__errno_location() })
    } else {
        r
    }
}

fn now_nanos() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; clock_gettime is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// Forks a child that installs `program` (with no_new_privs; none when it is `None`) and then
/// runs `checks`; returns what the child reported.
fn in_filtered_child<const N: usize>(
    program: Option<&[libc::sock_filter]>,
    checks: fn(results: &mut [i64; N]),
) -> Report<N> {
    let program = program.unwrap_or(&[]);
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid out-array of two descriptors.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (read_end, write_end) = (fds[0], fds[1]);
    let fprog = libc::sock_fprog {
        len: program.len() as libc::c_ushort,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: the child only makes raw syscalls on memory prepared before the fork and ends
    // with `_exit`; the parent only waits for it.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: in the child: see `child`.
        unsafe { child(write_end, &fprog, checks) }
    }
    // SAFETY: closing our copy of the write end, so the read sees end of file if the child dies.
    unsafe { libc::close(write_end) };
    let mut buf = vec![0u8; std::mem::size_of::<Report<N>>()];
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reading into the unfilled rest of `buf`.
        let n = unsafe { libc::read(read_end, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        if n <= 0 {
            break;
        }
        got += n as usize;
    }
    let mut status = 0;
    // SAFETY: waiting for our own child; closing our read end.
    unsafe {
        libc::waitpid(pid, &mut status, 0);
        libc::close(read_end);
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the filtered child did not exit cleanly (status {status:#x}); it wrote {got} of {} bytes",
        buf.len()
    );
    assert_eq!(got, buf.len(), "short report from the child");
    // SAFETY: `buf` holds exactly one `Report<N>` (plain integers), written by the child.
    unsafe { std::ptr::read_unaligned(buf.as_ptr().cast::<Report<N>>()) }
}

/// The child's whole life: install, check, report, `_exit`.
///
/// # Safety
/// Only in a freshly forked child, with `fprog` valid.
unsafe fn child<const N: usize>(
    fd: libc::c_int,
    fprog: &libc::sock_fprog,
    checks: fn(&mut [i64; N]),
) -> ! {
    let mut report = Report::<N> {
        install: 0,
        install_nanos: 0,
        results: [0; N],
    };
    // SAFETY: raw prctl calls on a valid program, a write of a plain struct; no allocation,
    // no unwinding.
    unsafe {
        report.install = ret(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as libc::c_long);
        if report.install == 0 && fprog.len == 0 {
            checks(&mut report.results);
        } else if report.install == 0 {
            let start = now_nanos();
            report.install = ret(libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER as libc::c_ulong,
                fprog as *const libc::sock_fprog,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            ) as libc::c_long);
            report.install_nanos = now_nanos() - start;
            if report.install == 0 {
                checks(&mut report.results);
            }
        }
        let bytes = std::slice::from_raw_parts(
            (&report as *const Report<N>).cast::<u8>(),
            std::mem::size_of::<Report<N>>(),
        );
        libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(0)
    }
}

/// What a check must give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// Success: any non-negative result.
    Ok,
    /// Exactly this result.
    Is(i64),
    /// Failure with this errno.
    Errno(i32),
}

const CHECKS: [(&str, Want); 37] = [
    ("getpid", Want::Ok),
    ("write to a pipe", Want::Is(1)),
    ("prctl(PR_GET_SECCOMP) says a filter is on", Want::Is(2)),
    ("ioctl(pipe, FIONREAD)", Want::Is(0)),
    ("ioctl(pipe, TIOCSTI)", Want::Errno(libc::EPERM)),
    ("ioctl(pipe, TIOCLINUX)", Want::Errno(libc::EPERM)),
    ("fork (clone with SIGCHLD)", Want::Ok),
    ("clone with CLONE_NEWUSER", Want::Errno(libc::EPERM)),
    ("clone with CLONE_NEWNET", Want::Errno(libc::EPERM)),
    ("clone3", Want::Errno(libc::ENOSYS)),
    ("unshare(CLONE_NEWUSER)", Want::Errno(libc::EPERM)),
    ("mount", Want::Errno(libc::EPERM)),
    ("bpf", Want::Errno(libc::EPERM)),
    ("userfaultfd", Want::Errno(libc::EPERM)),
    ("kexec_load", Want::Errno(libc::EPERM)),
    ("io_uring_setup", Want::Errno(libc::EPERM)),
    ("ptrace(PTRACE_PEEKUSER, pid 0)", Want::Errno(libc::EPERM)),
    // Named in no list: refused because it is not allowed.
    ("get_mempolicy (unlisted)", Want::Errno(libc::EPERM)),
    ("syscall 1000 (unknown)", Want::Errno(libc::ENOSYS)),
    (
        "the number after the newest known",
        Want::Errno(libc::ENOSYS),
    ),
    ("socket(AF_UNIX, SOCK_STREAM)", Want::Ok),
    (
        "socket(AF_INET, SOCK_STREAM|SOCK_NONBLOCK|SOCK_CLOEXEC)",
        Want::Ok,
    ),
    ("socket(AF_INET, SOCK_DGRAM, IPPROTO_UDP)", Want::Ok),
    ("socket(AF_INET, SOCK_STREAM, IPPROTO_TCP)", Want::Ok),
    ("socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE)", Want::Ok),
    ("socketpair(AF_UNIX, SOCK_STREAM)", Want::Is(0)),
    (
        "socket(AF_PACKET, SOCK_RAW)",
        Want::Errno(libc::EAFNOSUPPORT),
    ),
    (
        "socket(AF_VSOCK, SOCK_STREAM)",
        Want::Errno(libc::EAFNOSUPPORT),
    ),
    (
        "socket(AF_ALG, SOCK_SEQPACKET)",
        Want::Errno(libc::EAFNOSUPPORT),
    ),
    ("socket(AF_XDP, SOCK_RAW)", Want::Errno(libc::EAFNOSUPPORT)),
    (
        "socket(AF_INET, SOCK_RAW, IPPROTO_ICMP)",
        Want::Errno(libc::EPERM),
    ),
    (
        "socket(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6)",
        Want::Errno(libc::EPERM),
    ),
    (
        "socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP)",
        Want::Errno(libc::EPROTONOSUPPORT),
    ),
    (
        "socket(AF_NETLINK, SOCK_RAW, NETLINK_AUDIT)",
        Want::Errno(libc::EPROTONOSUPPORT),
    ),
    (
        "socketpair(AF_INET, SOCK_STREAM)",
        Want::Errno(libc::EAFNOSUPPORT),
    ),
    ("personality(query)", Want::Ok),
    ("personality(READ_IMPLIES_EXEC)", Want::Errno(libc::EPERM)),
];

/// A socket call's result, the descriptor closed again.
///
/// # Safety
/// Async-signal-safe; any arguments.
unsafe fn try_socket(domain: i32, ty: i32, protocol: i32) -> i64 {
    // SAFETY: raw syscalls; a descriptor we made is closed.
    unsafe {
        let r = ret(libc::syscall(libc::SYS_socket, domain, ty, protocol));
        if r >= 0 {
            libc::close(r as libc::c_int);
        }
        r
    }
}

/// Runs `clone` with `flags` and no new stack (as fork does); a child made exits at once.
///
/// # Safety
/// Async-signal-safe; the child made only calls `_exit`.
unsafe fn try_clone(flags: libc::c_long) -> i64 {
    // SAFETY: without CLONE_VM the child runs on a copy of this stack and `_exit`s at once.
    unsafe {
        let r = ret(libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0));
        if r == 0 {
            libc::_exit(0);
        }
        if r > 0 {
            libc::waitpid(r as libc::pid_t, std::ptr::null_mut(), 0);
        }
        r
    }
}

/// The checks of [`CHECKS`], in order. Each denied call is made with arguments the kernel
/// would refuse anyway or that harm nothing in this throwaway child, in case the filter
/// let it through.
fn probe(r: &mut [i64; CHECKS.len()]) {
    use libc::*;
    let sigchld = SIGCHLD as c_long;
    // SAFETY: raw syscalls with valid or deliberately invalid (null, zero) arguments; every
    // descriptor made is closed; nothing allocates.
    unsafe {
        let mut n: c_int = 0;
        let c: u8 = b'x';
        let mut pair = [0; 2];
        // A pipe of its own (the report's pipe carries only the report).
        let mut fds = [-1; 2];
        syscall(SYS_pipe2, fds.as_mut_ptr(), O_CLOEXEC);
        let fd = fds[1];
        r[0] = ret(syscall(SYS_getpid));
        r[1] = ret(syscall(SYS_write, fd, &c as *const u8, 1));
        r[2] = ret(syscall(SYS_prctl, PR_GET_SECCOMP, 0, 0, 0, 0));
        // FIONREAD on the write end of a pipe reads what is buffered.
        r[3] = ret(syscall(SYS_ioctl, fd, FIONREAD, &mut n as *mut c_int));
        r[4] = ret(syscall(SYS_ioctl, fd, TIOCSTI, &c as *const u8));
        r[5] = ret(syscall(SYS_ioctl, fd, TIOCLINUX, &mut n as *mut c_int));
        r[6] = try_clone(sigchld);
        r[7] = try_clone(CLONE_NEWUSER as c_long | sigchld);
        r[8] = try_clone(CLONE_NEWNET as c_long | sigchld);
        r[9] = ret(syscall(SYS_clone3, std::ptr::null::<u8>(), 0));
        r[11] = ret(syscall(
            SYS_mount,
            std::ptr::null::<u8>(),
            std::ptr::null::<u8>(),
            std::ptr::null::<u8>(),
            0,
            0,
        ));
        r[12] = ret(syscall(SYS_bpf, -1, 0, 0));
        r[13] = ret(syscall(SYS_userfaultfd, O_CLOEXEC));
        if r[13] >= 0 {
            close(r[13] as c_int);
        }
        // An architecture field no kernel accepts (KEXEC_ARCH_MASK all ones): EINVAL unfiltered.
        r[14] = ret(syscall(SYS_kexec_load, 0, 0, 0, 0xffff_0000u32));
        r[15] = ret(syscall(SYS_io_uring_setup, 0, std::ptr::null::<u8>()));
        // Pid 0 is no process: ESRCH unfiltered.
        r[16] = ret(syscall(SYS_ptrace, PTRACE_PEEKUSER, 0, 0, 0));
        r[17] = ret(syscall(SYS_get_mempolicy, 0, 0, 0, 0, 0));
        r[18] = ret(syscall(1000));
        r[19] = ret(syscall(seccomp::NEWEST_KNOWN as c_long + 1));
        r[20] = try_socket(AF_UNIX, SOCK_STREAM, 0);
        r[21] = try_socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        r[22] = try_socket(AF_INET, SOCK_DGRAM, IPPROTO_UDP);
        r[23] = try_socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
        r[24] = try_socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
        r[25] = ret(syscall(
            SYS_socketpair,
            AF_UNIX,
            SOCK_STREAM,
            0,
            pair.as_mut_ptr(),
        ));
        if r[25] == 0 {
            close(pair[0]);
            close(pair[1]);
        }
        r[26] = try_socket(AF_PACKET, SOCK_RAW, 0);
        r[27] = try_socket(AF_VSOCK, SOCK_STREAM, 0);
        r[28] = try_socket(AF_ALG, SOCK_SEQPACKET, 0);
        r[29] = try_socket(AF_XDP, SOCK_RAW, 0);
        r[30] = try_socket(AF_INET, SOCK_RAW, IPPROTO_ICMP);
        r[31] = try_socket(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6);
        r[32] = try_socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP);
        r[33] = try_socket(AF_NETLINK, SOCK_RAW, NETLINK_AUDIT);
        r[34] = ret(syscall(
            SYS_socketpair,
            AF_INET,
            SOCK_STREAM,
            0,
            pair.as_mut_ptr(),
        ));
        r[35] = ret(syscall(SYS_personality, 0xffff_ffffu32));
        r[36] = ret(syscall(SYS_personality, 0x0040_0000));
        close(fds[0]);
        close(fds[1]);
        // Last: unfiltered, it moves the child into a user namespace of its own, where the
        // calls above would no longer show what root gets.
        r[10] = ret(syscall(SYS_unshare, CLONE_NEWUSER));
    }
}

fn matches(want: Want, got: i64) -> bool {
    match want {
        Want::Ok => got >= 0,
        Want::Is(v) => got == v,
        Want::Errno(e) => got == -i64::from(e),
    }
}

#[test]
fn the_loaded_filter_allows_the_list_and_refuses_the_rest() {
    let report = in_filtered_child(Some(&filter()), probe);
    assert_eq!(report.install, 0, "installing the filter failed");
    let wrong: Vec<String> = CHECKS
        .iter()
        .zip(report.results)
        .filter(|((_, want), got)| !matches(*want, *got))
        .map(|((name, want), got)| format!("{name}: want {want:?}, got {got}"))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The same calls in a child without the filter: the refusals only a filter gives must come
/// out differently there, or the test above would prove nothing about the filter.
#[test]
fn the_refused_calls_fail_differently_without_the_filter() {
    let filtered = in_filtered_child(Some(&filter()), probe);
    let unfiltered = in_filtered_child(None, probe);
    for (i, (name, _)) in CHECKS.iter().enumerate() {
        println!(
            "{name:<58} filtered {:>6}  unfiltered {:>6}",
            filtered.results[i], unfiltered.results[i]
        );
    }
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let as_root: &[usize] = if root { &DISTINGUISHING_AS_ROOT } else { &[] };
    let same: Vec<&str> = DISTINGUISHING
        .iter()
        .chain(as_root)
        .filter(|&&at| matches(CHECKS[at].1, unfiltered.results[at]))
        .map(|&at| CHECKS[at].0)
        .collect();
    assert!(
        same.is_empty(),
        "answered as if filtered without the filter: {same:?}"
    );
}

/// Indices in [`CHECKS`] whose filtered answer no kernel gives by itself, root or not:
/// TIOCSTI and TIOCLINUX on a pipe (ENOTTY), clone3 with a null argument (EINVAL or EFAULT),
/// ptrace of pid 0 (ESRCH), get_mempolicy (succeeds), socketpair(AF_INET) (EOPNOTSUPP),
/// personality(READ_IMPLIES_EXEC) (succeeds). The kernel itself answers ENOSYS for a number it
/// does not know.
const DISTINGUISHING: [usize; 7] = [4, 5, 9, 16, 17, 34, 36];
/// And those whose filtered answer root does not get without the filter: namespaces made
/// (clone, unshare), mount with null arguments (EFAULT), bpf with a bad command (EINVAL),
/// packet and raw sockets made.
const DISTINGUISHING_AS_ROOT: [usize; 8] = [7, 8, 10, 11, 12, 26, 30, 31];

/// Installing the program costs the kernel one run of the filter per syscall number (its allow
/// cache), so it grows with the search's depth; measured in a child each time, median of 21.
#[test]
fn installing_the_filter_is_fast() {
    let program = filter();
    let mut nanos: Vec<i64> = (0..21)
        .map(|_| {
            let r = in_filtered_child::<0>(Some(&program), |_| {});
            assert_eq!(r.install, 0);
            r.install_nanos
        })
        .collect();
    nanos.sort_unstable();
    let median = Duration::from_nanos(nanos[nanos.len() / 2] as u64);
    println!(
        "seccomp install: {} instructions, median {median:?} (min {:?}, max {:?})",
        program.len(),
        Duration::from_nanos(nanos[0] as u64),
        Duration::from_nanos(nanos[nanos.len() - 1] as u64)
    );
    // A chain of comparisons this long would take milliseconds; the search, tens of µs.
    assert!(median < Duration::from_millis(2), "median {median:?}");
}
