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

/// The lists (and the `syscalls!` macro that names their entries).
#[macro_use]
mod table;
/// The BPF program.
mod compile;
#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod tests;

pub use compile::{compile, SeccompCompileError};
pub use table::{allowed_syscalls, denied_syscalls, NEWEST_KNOWN, SOCKET_POLICY};

/// One line for the enforcement report and `doctor`: what the filter allows and refuses.
pub fn summary() -> String {
    format!(
        "allow-list of {} syscalls (any other: EPERM; syscalls newer than the list: ENOSYS); {SOCKET_POLICY}; clone without namespace flags, clone3 -> ENOSYS; TIOCSTI and TIOCLINUX denied; personality limited",
        allowed_syscalls().len()
    )
}
