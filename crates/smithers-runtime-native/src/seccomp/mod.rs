//! The seccomp policy: an allow-list, as Docker's default profile and firecracker have.
//!
//! Every syscall a build, test or agent workload makes is listed in [`allowed_syscalls`]
//! (checked by tracing shells, coreutils, git, Python with asyncio and multiprocessing, Node,
//! cargo and rustc, gcc and make: of what they call, only `clone3` and the NUMA placement calls
//! `ps` probes are refused, and both fall back), a few of them with their arguments checked:
//! `socket` and `socketpair` only for the families the network namespace scopes
//! ([`SOCKET_POLICY`]), `clone` without namespace flags, `ioctl` except the two terminal
//! requests that inject or read another session's input, `personality` with only harmless
//! flags. `clone3` returns ENOSYS: it passes its flags in memory, where a classic BPF filter
//! cannot read them, and libc falls back to `clone` on ENOSYS.
//!
//! What is not listed is refused, with one of two errors:
//! * **EPERM** for every number up to the newest syscall this list was written against
//!   ([`NEWEST_KNOWN`]): those are known and deliberately left out ([`denied_syscalls`] names
//!   the dangerous ones: the mount API, namespaces, ptrace, bpf, io_uring, keys, modules,
//!   kexec, clocks, ...). EPERM is what Docker returns, and what a caller without the
//!   privilege would get anyway.
//! * **ENOSYS** above it: a syscall added to the kernel later is refused as if the kernel were
//!   older than it. That is the answer libc and language runtimes probe for and fall back on
//!   (glibc's `clone3`, `faccessat2`, `close_range`; Go's and Rust's `statx`, `pidfd_open`);
//!   EPERM there is what broke containers when new glibc met old profiles, and is why runc
//!   returns ENOSYS for syscalls newer than its profile. Either way the call does not run.
//!
//! Another architecture's syscalls kill the process, and x86_64's x32 ABI numbers (which share
//! the x86_64 audit architecture) are refused with EPERM.
//!
//! Compiled here, in user space, to one classic BPF program whose syscall lookup is a binary
//! search, not a chain of comparisons: the sorted numbers are merged into runs of equal
//! verdict (most of the allowed numbers are contiguous), and the program searches the runs'
//! starts. Two reasons: every syscall of the step runs the filter, and at install the kernel
//! runs the filter once per syscall number and architecture to build its allow cache, so the
//! install cost grows with the path length: measured here, a 60-entry chain took ~220 µs to
//! install, a large share of the sandbox's whole setup, against ~40 µs for a search. The
//! allow-list (x86_64: 300 syscalls, 80 runs, a search 7 deep, 198 instructions) installs in
//! about the time the 53-entry deny list it replaced did (171 instructions): medians of 60 to
//! 103 µs against 77 to 102 µs on the same host (`installing_the_filter_is_fast` in
//! `tests/seccomp_kernel.rs`). A syscall allowed whatever its arguments does not run the
//! filter after install at all: the kernel's cache answers it.
//!
//! The init installs the program after everything else, with no_new_privs set.
//! `tests/seccomp_kernel.rs` loads it into the kernel in a forked child and checks real calls
//! against it (and the same calls without it, to show the answers are the filter's).

use crate::plan::BpfInstruction;

/// Syscall numbers the `libc` crate does not name (yet). Since Linux 5.1 every architecture
/// numbers its new syscalls alike, from 424 up, so one number serves x86_64 and aarch64.
#[allow(non_upper_case_globals)]
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code, unused_macros)
)]
mod nr {
    pub use libc::*;
    pub const SYS_fchmodat2: c_long = 452;
    pub const SYS_cachestat: c_long = 451;
    pub const SYS_map_shadow_stack: c_long = 453;
    pub const SYS_futex_wake: c_long = 454;
    pub const SYS_futex_wait: c_long = 455;
    pub const SYS_futex_requeue: c_long = 456;
    pub const SYS_statmount: c_long = 457;
    pub const SYS_listmount: c_long = 458;
    pub const SYS_lsm_get_self_attr: c_long = 459;
    pub const SYS_lsm_set_self_attr: c_long = 460;
    pub const SYS_lsm_list_modules: c_long = 461;
    pub const SYS_setxattrat: c_long = 463;
    pub const SYS_getxattrat: c_long = 464;
    pub const SYS_listxattrat: c_long = 465;
    pub const SYS_removexattrat: c_long = 466;
    pub const SYS_open_tree_attr: c_long = 467;
    pub const SYS_file_getattr: c_long = 468;
    pub const SYS_file_setattr: c_long = 469;
    pub const SYS_listns: c_long = 470;
    #[cfg(target_arch = "x86_64")]
    pub const SYS_io_pgetevents: c_long = 333;
    #[cfg(target_arch = "x86_64")]
    pub const SYS_uretprobe: c_long = 335;
    #[cfg(target_arch = "aarch64")]
    pub const SYS_io_pgetevents: c_long = 292;
}

/// The newest syscall number this policy was written against (Linux 6.18's `listns`): every
/// number above it is a syscall added later, refused with ENOSYS.
pub const NEWEST_KNOWN: u32 = nr::SYS_listns as u32;

/// `(name, number)` pairs from `SYS_<name>` constants of [`nr`].
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code, unused_macros)
)]
macro_rules! syscalls {
    ($($sys:ident),* $(,)?) => {
        [$((&stringify!($sys)[4..], nr::$sys as i64)),*]
    };
}

/// Allowed whatever their arguments: files and directories, memory, processes and threads,
/// signals, time, IPC (the sandbox has its own IPC namespace), sockets once made, and the
/// calls a process uses to restrict itself further (seccomp, Landlock, prctl).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[rustfmt::skip] // a table: one name per line would hide its grouping
fn plain_allowed() -> Vec<(&'static str, i64)> {
    let mut list = syscalls![
        // Files and descriptors.
        SYS_read, SYS_write, SYS_readv, SYS_writev, SYS_pread64, SYS_pwrite64, SYS_preadv,
        SYS_pwritev, SYS_preadv2, SYS_pwritev2, SYS_lseek, SYS_openat, SYS_openat2, SYS_close,
        SYS_close_range, SYS_fstat, SYS_newfstatat, SYS_statx, SYS_statfs, SYS_fstatfs, SYS_fcntl,
        SYS_flock, SYS_fsync, SYS_fdatasync, SYS_sync, SYS_syncfs, SYS_sync_file_range,
        SYS_truncate, SYS_ftruncate, SYS_fallocate, SYS_fadvise64, SYS_readahead, SYS_getdents64,
        SYS_getcwd, SYS_chdir, SYS_fchdir, SYS_renameat2, SYS_mkdirat, SYS_mknodat, SYS_fchownat,
        SYS_fchown, SYS_fchmod, SYS_fchmodat, SYS_fchmodat2, SYS_unlinkat, SYS_linkat,
        SYS_symlinkat, SYS_readlinkat, SYS_faccessat, SYS_faccessat2, SYS_utimensat, SYS_umask,
        SYS_dup, SYS_dup3, SYS_pipe2, SYS_copy_file_range, SYS_splice, SYS_tee, SYS_vmsplice,
        SYS_sendfile, SYS_cachestat, SYS_file_getattr, SYS_file_setattr, SYS_memfd_create,
        SYS_memfd_secret, SYS_setxattr, SYS_lsetxattr, SYS_fsetxattr, SYS_getxattr, SYS_lgetxattr,
        SYS_fgetxattr, SYS_listxattr, SYS_llistxattr, SYS_flistxattr, SYS_removexattr,
        SYS_lremovexattr, SYS_fremovexattr, SYS_setxattrat, SYS_getxattrat, SYS_listxattrat,
        SYS_removexattrat,
        // Reading the caller's own mount table (what /proc/self/mountinfo shows).
        SYS_statmount, SYS_listmount,
        // Waiting on descriptors, events, asynchronous I/O (not io_uring).
        SYS_inotify_init1, SYS_inotify_add_watch, SYS_inotify_rm_watch, SYS_epoll_create1,
        SYS_epoll_ctl, SYS_epoll_pwait, SYS_epoll_pwait2, SYS_eventfd2, SYS_signalfd4, SYS_ppoll,
        SYS_pselect6, SYS_timerfd_create, SYS_timerfd_gettime, SYS_timerfd_settime, SYS_io_setup,
        SYS_io_destroy, SYS_io_submit, SYS_io_cancel, SYS_io_getevents, SYS_io_pgetevents,
        // Memory.
        SYS_brk, SYS_mmap, SYS_munmap, SYS_mprotect, SYS_mremap, SYS_msync, SYS_mincore,
        SYS_madvise, SYS_mlock, SYS_mlock2, SYS_mlockall, SYS_munlock, SYS_munlockall,
        SYS_remap_file_pages, SYS_pkey_alloc, SYS_pkey_free, SYS_pkey_mprotect, SYS_mseal,
        SYS_map_shadow_stack, SYS_membarrier,
        // Processes and threads (clone is checked, below).
        SYS_execve, SYS_execveat, SYS_exit, SYS_exit_group, SYS_wait4, SYS_waitid,
        SYS_set_tid_address, SYS_set_robust_list, SYS_get_robust_list, SYS_futex, SYS_futex_waitv,
        SYS_futex_wake, SYS_futex_wait, SYS_futex_requeue, SYS_rseq, SYS_getpid, SYS_getppid,
        SYS_gettid, SYS_getuid, SYS_geteuid, SYS_getgid, SYS_getegid, SYS_getresuid, SYS_getresgid,
        SYS_setuid, SYS_setgid, SYS_setreuid, SYS_setregid, SYS_setresuid, SYS_setresgid,
        SYS_setfsuid, SYS_setfsgid, SYS_getgroups, SYS_setgroups, SYS_getpgid, SYS_setpgid,
        SYS_getsid, SYS_setsid, SYS_capget, SYS_capset, SYS_prctl, SYS_getpriority,
        SYS_setpriority, SYS_sched_yield, SYS_sched_getaffinity, SYS_sched_setaffinity,
        SYS_sched_getparam, SYS_sched_setparam, SYS_sched_getscheduler, SYS_sched_setscheduler,
        SYS_sched_get_priority_max, SYS_sched_get_priority_min, SYS_sched_rr_get_interval,
        SYS_sched_getattr, SYS_sched_setattr, SYS_getcpu, SYS_ioprio_get, SYS_ioprio_set,
        SYS_getrlimit, SYS_setrlimit, SYS_prlimit64, SYS_getrusage, SYS_uname, SYS_sysinfo,
        SYS_getrandom, SYS_pidfd_open, SYS_pidfd_send_signal, SYS_process_mrelease,
        // Restricting oneself further: a nested filter or ruleset can only take away.
        SYS_seccomp, SYS_landlock_create_ruleset, SYS_landlock_add_rule,
        SYS_landlock_restrict_self,
        // Signals (the sandbox has its own pid namespace).
        SYS_kill, SYS_tkill, SYS_tgkill, SYS_rt_sigaction, SYS_rt_sigprocmask, SYS_rt_sigreturn,
        SYS_rt_sigpending, SYS_rt_sigsuspend, SYS_rt_sigtimedwait, SYS_rt_sigqueueinfo,
        SYS_rt_tgsigqueueinfo, SYS_sigaltstack, SYS_restart_syscall,
        // Time (reading it; setting clocks is not allowed).
        SYS_clock_gettime, SYS_clock_getres, SYS_clock_nanosleep, SYS_nanosleep, SYS_gettimeofday,
        SYS_times, SYS_getitimer, SYS_setitimer, SYS_timer_create, SYS_timer_delete,
        SYS_timer_gettime, SYS_timer_settime, SYS_timer_getoverrun,
        // System V and POSIX IPC (the sandbox has its own IPC namespace).
        SYS_shmget, SYS_shmat, SYS_shmdt, SYS_shmctl, SYS_msgget, SYS_msgsnd, SYS_msgrcv,
        SYS_msgctl, SYS_semget, SYS_semop, SYS_semctl, SYS_semtimedop, SYS_mq_open, SYS_mq_unlink,
        SYS_mq_timedsend, SYS_mq_timedreceive, SYS_mq_notify, SYS_mq_getsetattr,
        // Sockets once made (socket and socketpair are checked, below).
        SYS_bind, SYS_listen, SYS_accept, SYS_accept4, SYS_connect, SYS_getsockname,
        SYS_getpeername, SYS_sendto, SYS_recvfrom, SYS_sendmsg, SYS_recvmsg, SYS_sendmmsg,
        SYS_recvmmsg, SYS_shutdown, SYS_setsockopt, SYS_getsockopt,
    ]
    .to_vec();
    // The older calls x86_64 keeps beside their *at and *2 successors, which programs built
    // for it still make, and its thread-pointer calls.
    #[cfg(target_arch = "x86_64")]
    list.extend(syscalls![
        SYS_open, SYS_creat, SYS_stat, SYS_lstat, SYS_access, SYS_poll, SYS_select, SYS_pipe,
        SYS_dup2, SYS_pause, SYS_alarm, SYS_fork, SYS_vfork, SYS_getdents, SYS_rename,
        SYS_renameat, SYS_mkdir, SYS_rmdir, SYS_link, SYS_unlink, SYS_symlink, SYS_readlink,
        SYS_chmod, SYS_chown, SYS_lchown, SYS_mknod, SYS_utime, SYS_utimes, SYS_futimesat,
        SYS_getpgrp, SYS_time, SYS_epoll_create, SYS_epoll_wait, SYS_inotify_init, SYS_eventfd,
        SYS_signalfd, SYS_arch_prctl, SYS_set_thread_area, SYS_get_thread_area,
        // Entered by the kernel's own return-probe trampoline, never by a program.
        SYS_uretprobe,
    ]);
    #[cfg(target_arch = "aarch64")]
    list.extend(syscalls![SYS_renameat]);
    list
}

/// What the filter does with one syscall number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Allow,
    Eperm,
    Enosys,
    /// `clone` carrying a namespace flag: EPERM; else allowed.
    Clone,
    /// `ioctl(TIOCSTI)` and `ioctl(TIOCLINUX)`: EPERM; else allowed.
    Ioctl,
    /// `socket`: see [`SOCKET_POLICY`].
    Socket,
    /// `socketpair`: AF_UNIX only (EAFNOSUPPORT).
    Socketpair,
    /// `personality`: a query, or only the [`HARMLESS_PERSONALITY`] flags; else EPERM.
    Personality,
}

/// The syscalls allowed with their arguments checked, and `clone3`.
fn checked() -> Vec<(&'static str, i64, Verdict)> {
    vec![
        ("clone", nr::SYS_clone, Verdict::Clone),
        ("ioctl", nr::SYS_ioctl, Verdict::Ioctl),
        ("socket", nr::SYS_socket, Verdict::Socket),
        ("socketpair", nr::SYS_socketpair, Verdict::Socketpair),
        ("personality", nr::SYS_personality, Verdict::Personality),
        ("clone3", nr::SYS_clone3, Verdict::Enosys),
    ]
}

/// Every syscall the filter lets through, with or without checking its arguments (`clone3`,
/// refused with ENOSYS, is not one of them).
pub fn allowed_syscalls() -> Vec<(&'static str, i64)> {
    let mut list = plain_allowed();
    list.extend(
        checked()
            .into_iter()
            .filter(|(_, _, v)| *v != Verdict::Enosys)
            .map(|(name, nr, _)| (name, nr)),
    );
    list
}

/// The dangerous syscalls, by name (for tests and documentation) and number. The allow-list
/// already refuses them with EPERM, like everything it does not name; listing them keeps any
/// of them from being allowed by mistake (`compile` fails if one is).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[rustfmt::skip] // a table: one name per line would hide its grouping
pub fn denied_syscalls() -> Vec<(&'static str, i64)> {
    // Only x86_64 adds to it.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut list = syscalls![
        // Mount table and root changes: the view must stay what the plan built.
        SYS_mount, SYS_umount2, SYS_pivot_root, SYS_chroot, SYS_fsopen, SYS_fsconfig, SYS_fsmount,
        SYS_fspick, SYS_move_mount, SYS_open_tree, SYS_open_tree_attr, SYS_mount_setattr,
        // New namespaces, joining others, or listing them.
        SYS_unshare, SYS_setns, SYS_listns,
        // Debugging / memory of other processes.
        SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev, SYS_process_madvise,
        SYS_pidfd_getfd, SYS_kcmp,
        // Kernel attack surface.
        SYS_bpf, SYS_perf_event_open, SYS_userfaultfd, SYS_io_uring_setup, SYS_io_uring_enter,
        SYS_io_uring_register, SYS_keyctl, SYS_add_key, SYS_request_key, SYS_open_by_handle_at,
        SYS_name_to_handle_at, SYS_fanotify_init, SYS_fanotify_mark, SYS_lookup_dcookie,
        SYS_lsm_get_self_attr, SYS_lsm_set_self_attr, SYS_lsm_list_modules,
        // Machine-wide state.
        SYS_kexec_load, SYS_kexec_file_load, SYS_init_module, SYS_finit_module, SYS_delete_module,
        SYS_reboot, SYS_swapon, SYS_swapoff, SYS_acct, SYS_quotactl, SYS_quotactl_fd, SYS_syslog,
        SYS_settimeofday, SYS_clock_settime, SYS_clock_adjtime, SYS_adjtimex, SYS_vhangup,
        SYS_sethostname, SYS_setdomainname,
        // NUMA placement (Docker reserves it for CAP_SYS_NICE too).
        SYS_mbind, SYS_set_mempolicy, SYS_set_mempolicy_home_node, SYS_migrate_pages,
        SYS_move_pages,
    ]
    .to_vec();
    #[cfg(target_arch = "x86_64")]
    list.extend(syscalls![
        SYS_iopl, SYS_ioperm, SYS_modify_ldt, SYS_uselib, SYS_ustat, SYS_sysfs, SYS__sysctl,
    ]);
    list
}

/// Elsewhere the lists were not checked against the syscall table: nothing is listed, and
/// [`compile`] refuses the architecture (the runtime then refuses to run sandboxes).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn plain_allowed() -> Vec<(&'static str, i64)> {
    Vec::new()
}

/// See the other [`plain_allowed`]: nothing is listed here.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn denied_syscalls() -> Vec<(&'static str, i64)> {
    Vec::new()
}

/// Namespace flags a `clone` may not carry (all in the low 32 bits, the only ones the kernel
/// reads from `clone`'s flags).
const CLONE_NS_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u32
    | 0x80; // CLONE_NEWTIME

/// `personality` flags a process may set on itself: PER_LINUX32 and UNAME26 (Docker allows
/// these), and ADDR_NO_RANDOMIZE, which the sanitizers (TSan, ASan) and `setarch -R` use and
/// which changes only the caller's own address space. Not READ_IMPLIES_EXEC, MMAP_PAGE_ZERO or
/// another execution domain.
const HARMLESS_PERSONALITY: u32 = 0x0008 | 0x0002_0000 | 0x0004_0000;
/// `personality(0xffffffff)` only reads the current value.
const PERSONALITY_QUERY: u32 = 0xffff_ffff;

/// `socket` is allowed for the families the sandbox's network namespace scopes, and refused as
/// a kernel without the family would refuse it (EAFNOSUPPORT), so libraries fall back:
/// * AF_UNIX: any type;
/// * AF_INET and AF_INET6: stream and datagram sockets (the type's SOCK_NONBLOCK and
///   SOCK_CLOEXEC flags masked off) of the default protocol, TCP, UDP, ICMP or ICMPv6 (an
///   unprivileged ping socket); a raw or packet socket is refused with EPERM (the kernel's own
///   answer without CAP_NET_RAW), another protocol (SCTP, MPTCP, UDP-Lite, ...) with
///   EPROTONOSUPPORT, the answer of a kernel without it (Go probes MPTCP and falls back);
/// * AF_NETLINK: NETLINK_ROUTE only (glibc's `getaddrinfo` and `getifaddrs`, `ip`); another
///   netlink protocol (audit, uevents, netfilter, generic, sock_diag, ...) EPROTONOSUPPORT.
///
/// Every other family (AF_PACKET, AF_VSOCK, AF_ALG, AF_KEY, AF_BLUETOOTH, AF_XDP, AF_RDS, ...,
/// including ones the kernel adds later): EAFNOSUPPORT. Only the low 32 bits of each argument
/// are checked: the kernel reads each as an `int`.
pub const SOCKET_POLICY: &str = "socket families unix, inet and inet6 (stream and datagram: TCP, UDP, ICMP; no raw sockets) and netlink route only";

const SOCK_TYPE_MASK: u32 = 0xf;
const INET_PROTOCOLS: [i32; 5] = [
    0,
    libc::IPPROTO_TCP,
    libc::IPPROTO_UDP,
    libc::IPPROTO_ICMP,
    libc::IPPROTO_ICMPV6,
];

/// One line for the enforcement report and `doctor`: what the filter allows and refuses.
pub fn summary() -> String {
    format!(
        "allow-list of {} syscalls (any other: EPERM; syscalls newer than the list: ENOSYS); {SOCKET_POLICY}; clone without namespace flags, clone3 -> ENOSYS; TIOCSTI and TIOCLINUX denied; personality limited",
        allowed_syscalls().len()
    )
}

/// Errors while compiling the filter (an unsupported architecture, or a bug).
#[derive(Debug, thiserror::Error)]
pub enum SeccompCompileError {
    #[error("seccomp is not supported on architecture {0}")]
    Arch(String),
    #[error("building the seccomp filter: {0}")]
    Build(String),
}

// Classic BPF opcodes (linux/bpf_common.h) and seccomp return values (linux/seccomp.h).
const LD_W_ABS: u16 = 0x20;
const AND_K: u16 = 0x54;
const JA: u16 = 0x05;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_ALLOW: u32 = 0x7fff_0000;

const fn errno(e: i32) -> u32 {
    RET_ERRNO | e as u32
}

/// Offsets in `struct seccomp_data`: nr, arch, then the six 64-bit arguments.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
/// The low 32 bits of argument `i` (the only part the checked arguments use).
const fn arg_low(i: u32) -> u32 {
    16 + 8 * i + if cfg!(target_endian = "big") { 4 } else { 0 }
}

/// x86_64's x32 ABI numbers its syscalls from this bit up, under the same audit arch: the
/// x86_64 numbers of the list do not describe them, so they are all refused.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

fn audit_arch() -> Result<u32, SeccompCompileError> {
    // AUDIT_ARCH_* of linux/audit.h: the machine, 64-bit, little-endian. Only the
    // architectures whose syscall tables the lists above were checked against.
    match std::env::consts::ARCH {
        "x86_64" => Ok(0xc000_003e),
        "aarch64" => Ok(0xc000_00b7),
        other => Err(SeccompCompileError::Arch(other.to_string())),
    }
}

fn build(e: impl std::fmt::Display) -> SeccompCompileError {
    SeccompCompileError::Build(e.to_string())
}

/// One step of a small piece of code with forward jumps to labels (resolved by [`assemble`]).
#[derive(Debug, Clone, Copy)]
enum Op {
    Load(u32),
    And(u32),
    Ret(u32),
    /// Jump to the label when the comparison holds, else go on.
    JumpIf(u16, u32, Label),
    /// Where the label's jumps land.
    At(Label),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Label {
    Allow,
    Deny,
    Inet,
    Protocol,
    Netlink,
}

fn jump_offset(n: usize) -> Result<u8, SeccompCompileError> {
    u8::try_from(n).map_err(|_| build(format!("a jump of {n} instructions (at most 255)")))
}

/// Lays out `ops`, resolving each jump to its label, which must come after it.
fn assemble(ops: &[Op]) -> Result<Vec<BpfInstruction>, SeccompCompileError> {
    let mut labels: Vec<(Label, usize)> = Vec::new();
    let mut at = 0;
    for op in ops {
        match op {
            Op::At(l) => labels.push((*l, at)),
            _ => at += 1,
        }
    }
    let mut out = Vec::with_capacity(at);
    for op in ops {
        let here = out.len();
        match *op {
            Op::Load(k) => out.push((LD_W_ABS, 0, 0, k)),
            Op::And(k) => out.push((AND_K, 0, 0, k)),
            Op::Ret(k) => out.push((RET_K, 0, 0, k)),
            Op::JumpIf(code, k, label) => {
                let &(_, target) = labels
                    .iter()
                    .find(|(l, _)| *l == label)
                    .ok_or_else(|| build(format!("label {label:?} is missing")))?;
                let skip = target
                    .checked_sub(here + 1)
                    .ok_or_else(|| build(format!("label {label:?} is behind its jump")))?;
                out.push((code, jump_offset(skip)?, 0, k));
            }
            Op::At(_) => {}
        }
    }
    Ok(out)
}

/// The code run once the syscall number is known to have `verdict` (it always returns).
#[allow(clippy::unnecessary_cast)] // the ioctl request constants are u64 on some targets
fn verdict_code(verdict: Verdict) -> Result<Vec<BpfInstruction>, SeccompCompileError> {
    use Label::*;
    use Op::*;
    let ops: Vec<Op> = match verdict {
        Verdict::Allow => vec![Ret(RET_ALLOW)],
        Verdict::Eperm => vec![Ret(errno(libc::EPERM))],
        Verdict::Enosys => vec![Ret(errno(libc::ENOSYS))],
        Verdict::Clone => vec![
            Load(arg_low(0)),
            JumpIf(JSET_K, CLONE_NS_FLAGS, Deny),
            Ret(RET_ALLOW),
            At(Deny),
            Ret(errno(libc::EPERM)),
        ],
        // Pushing characters into a terminal's input queue (TIOCSTI), or reading and pasting
        // a virtual console's selection (TIOCLINUX), reaches past the sandbox on a terminal
        // it shares.
        Verdict::Ioctl => vec![
            Load(arg_low(1)),
            JumpIf(JEQ_K, libc::TIOCSTI as u32, Deny),
            JumpIf(JEQ_K, libc::TIOCLINUX as u32, Deny),
            Ret(RET_ALLOW),
            At(Deny),
            Ret(errno(libc::EPERM)),
        ],
        Verdict::Socketpair => vec![
            Load(arg_low(0)),
            JumpIf(JEQ_K, libc::AF_UNIX as u32, Allow),
            Ret(errno(libc::EAFNOSUPPORT)),
            At(Allow),
            Ret(RET_ALLOW),
        ],
        Verdict::Personality => vec![
            Load(arg_low(0)),
            JumpIf(JEQ_K, PERSONALITY_QUERY, Allow),
            JumpIf(JSET_K, !HARMLESS_PERSONALITY, Deny),
            At(Allow),
            Ret(RET_ALLOW),
            At(Deny),
            Ret(errno(libc::EPERM)),
        ],
        Verdict::Socket => {
            let mut ops = vec![
                Load(arg_low(0)),
                JumpIf(JEQ_K, libc::AF_UNIX as u32, Allow),
                JumpIf(JEQ_K, libc::AF_INET as u32, Inet),
                JumpIf(JEQ_K, libc::AF_INET6 as u32, Inet),
                JumpIf(JEQ_K, libc::AF_NETLINK as u32, Netlink),
                Ret(errno(libc::EAFNOSUPPORT)),
                At(Inet),
                Load(arg_low(1)),
                And(SOCK_TYPE_MASK),
                JumpIf(JEQ_K, libc::SOCK_STREAM as u32, Protocol),
                JumpIf(JEQ_K, libc::SOCK_DGRAM as u32, Protocol),
                Ret(errno(libc::EPERM)),
                At(Protocol),
                Load(arg_low(2)),
            ];
            ops.extend(INET_PROTOCOLS.map(|p| JumpIf(JEQ_K, p as u32, Allow)));
            ops.extend([
                Ret(errno(libc::EPROTONOSUPPORT)),
                At(Netlink),
                Load(arg_low(2)),
                JumpIf(JEQ_K, libc::NETLINK_ROUTE as u32, Allow),
                Ret(errno(libc::EPROTONOSUPPORT)),
                At(Allow),
                Ret(RET_ALLOW),
            ]);
            ops
        }
    };
    assemble(&ops)
}

/// The sorted, checked table of every number the lists name, with its verdict.
fn table() -> Result<Vec<(u32, Verdict)>, SeccompCompileError> {
    let mut entries: Vec<(u32, Verdict)> = plain_allowed()
        .into_iter()
        .map(|(_, nr)| (nr as u32, Verdict::Allow))
        .collect();
    entries.extend(checked().into_iter().map(|(_, nr, v)| (nr as u32, v)));
    entries.extend(
        denied_syscalls()
            .into_iter()
            .map(|(_, nr)| (nr as u32, Verdict::Eperm)),
    );
    entries.sort_by_key(|e| e.0);
    if let Some(pair) = entries.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(build(format!(
            "syscall {} is listed twice (allowed and denied, or twice in one list)",
            pair[0].0
        )));
    }
    if let Some(&(nr, _)) = entries.iter().find(|e| e.0 > NEWEST_KNOWN) {
        return Err(build(format!(
            "syscall {nr} is newer than NEWEST_KNOWN ({NEWEST_KNOWN})"
        )));
    }
    Ok(entries)
}

/// Every syscall number's verdict as runs: `(first number, verdict)`, sorted, the first run
/// starting at 0 and each lasting until the next. Numbers the table does not name are EPERM
/// up to [`NEWEST_KNOWN`] and ENOSYS above it (x86_64's x32 numbers: EPERM).
fn runs(table: &[(u32, Verdict)]) -> Vec<(u32, Verdict)> {
    let mut out: Vec<(u32, Verdict)> = Vec::new();
    let mut push = |start: u32, verdict: Verdict| {
        if out.last().map(|r| r.1) != Some(verdict) {
            out.push((start, verdict));
        }
    };
    let mut next = 0;
    for &(nr, verdict) in table {
        if nr > next {
            push(next, Verdict::Eperm);
        }
        push(nr, verdict);
        next = nr + 1;
    }
    push(NEWEST_KNOWN + 1, Verdict::Enosys);
    #[cfg(target_arch = "x86_64")]
    push(X32_SYSCALL_BIT, Verdict::Eperm);
    out
}

/// The search over `runs` with the number in the accumulator: a `jge` on the middle run's
/// start splits them until one run is left, whose verdict code follows.
fn search(runs: &[(u32, Verdict)]) -> Result<Vec<BpfInstruction>, SeccompCompileError> {
    match runs {
        [] => Err(build("an empty range of syscalls")),
        [(_, verdict)] => verdict_code(*verdict),
        _ => {
            let (low, high) = runs.split_at(runs.len() / 2);
            let below = search(low)?;
            let above = search(high)?;
            let mut out = Vec::with_capacity(below.len() + above.len() + 2);
            match u8::try_from(below.len()) {
                Ok(skip) => out.push((JGE_K, skip, 0, high[0].0)),
                // Farther than a conditional jump reaches: it falls through to an
                // unconditional one (a 32-bit offset) instead.
                Err(_) => out.extend([(JGE_K, 0, 1, high[0].0), (JA, 0, 0, below.len() as u32)]),
            }
            out.extend(below);
            out.extend(above);
            Ok(out)
        }
    }
}

/// Compiles the program the init installs: the allow-list with its argument checks, every
/// other known syscall EPERM, newer ones ENOSYS; any other architecture's syscalls kill the
/// process.
pub fn compile() -> Result<Vec<BpfInstruction>, SeccompCompileError> {
    let arch = audit_arch()?;
    let table = table()?;
    let mut program = vec![
        (LD_W_ABS, 0, 0, DATA_ARCH),
        (JEQ_K, 1, 0, arch),
        (RET_K, 0, 0, RET_KILL_PROCESS),
        (LD_W_ABS, 0, 0, DATA_NR),
    ];
    program.extend(search(&runs(&table))?);
    // BPF_MAXINSNS; the kernel also counts every filter a process stacks against 32768.
    if program.len() > 4096 {
        return Err(build(format!(
            "{} instructions (at most 4096)",
            program.len()
        )));
    }
    Ok(program)
}

#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod tests;
