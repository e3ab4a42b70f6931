//! The policy's lists: the syscalls allowed whatever their arguments, those allowed with
//! their arguments checked, the dangerous ones named, and the argument rules.

/// Syscall numbers the `libc` crate does not name (yet). Since Linux 5.1 every architecture
/// numbers its new syscalls alike, from 424 up, so one number serves x86_64 and aarch64.
#[allow(non_upper_case_globals)]
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code, unused_macros)
)]
pub(super) mod nr {
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
pub(super) fn plain_allowed() -> Vec<(&'static str, i64)> {
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
pub(super) enum Verdict {
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
pub(super) fn checked() -> Vec<(&'static str, i64, Verdict)> {
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
pub(super) fn plain_allowed() -> Vec<(&'static str, i64)> {
    Vec::new()
}

/// See the other [`plain_allowed`]: nothing is listed here.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn denied_syscalls() -> Vec<(&'static str, i64)> {
    Vec::new()
}

/// Namespace flags a `clone` may not carry (all in the low 32 bits, the only ones the kernel
/// reads from `clone`'s flags).
pub(super) const CLONE_NS_FLAGS: u32 = (libc::CLONE_NEWNS
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
pub(super) const HARMLESS_PERSONALITY: u32 = 0x0008 | 0x0002_0000 | 0x0004_0000;
/// `personality(0xffffffff)` only reads the current value.
pub(super) const PERSONALITY_QUERY: u32 = 0xffff_ffff;

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

pub(super) const SOCK_TYPE_MASK: u32 = 0xf;
pub(super) const INET_PROTOCOLS: [i32; 5] = [
    0,
    libc::IPPROTO_TCP,
    libc::IPPROTO_UDP,
    libc::IPPROTO_ICMP,
    libc::IPPROTO_ICMPV6,
];
