//! The seccomp policy: a deny list (EPERM) of syscalls a step never needs and that widen the
//! kernel attack surface or undo the isolation, plus `clone3` → ENOSYS so that libc falls back
//! to `clone`, whose flags a classic BPF filter can inspect (clone3 passes them in memory).
//!
//! Compiled here, in user space, to one classic BPF program whose syscall lookup is a binary
//! search over the sorted numbers rather than a chain of comparisons. Two reasons: every
//! syscall of the step runs the filter, and at install the kernel runs the filter once per
//! syscall number and architecture to build its allow cache, so the install cost grows with
//! the path length: measured here, a 60-entry chain took ~220 µs to install, a large share of
//! the sandbox's whole setup, against ~40 µs for a search. The init installs the program after
//! everything else, with no_new_privs set.

use crate::plan::BpfInstruction;

/// Syscalls denied outright with EPERM, by name (for the report) and number.
pub fn denied_syscalls() -> Vec<(&'static str, i64)> {
    let mut list: Vec<(&'static str, i64)> = vec![
        // Mount table and root changes: the view must stay what the plan built.
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("pivot_root", libc::SYS_pivot_root),
        ("chroot", libc::SYS_chroot),
        ("fsopen", libc::SYS_fsopen),
        ("fsconfig", libc::SYS_fsconfig),
        ("fsmount", libc::SYS_fsmount),
        ("fspick", libc::SYS_fspick),
        ("move_mount", libc::SYS_move_mount),
        ("open_tree", libc::SYS_open_tree),
        ("mount_setattr", libc::SYS_mount_setattr),
        // New namespaces or joining others.
        ("unshare", libc::SYS_unshare),
        ("setns", libc::SYS_setns),
        // Debugging / memory of other processes.
        ("ptrace", libc::SYS_ptrace),
        ("process_vm_readv", libc::SYS_process_vm_readv),
        ("process_vm_writev", libc::SYS_process_vm_writev),
        ("pidfd_getfd", libc::SYS_pidfd_getfd),
        ("kcmp", libc::SYS_kcmp),
        // Kernel attack surface.
        ("bpf", libc::SYS_bpf),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("io_uring_enter", libc::SYS_io_uring_enter),
        ("io_uring_register", libc::SYS_io_uring_register),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("name_to_handle_at", libc::SYS_name_to_handle_at),
        // Machine-wide state.
        ("kexec_load", libc::SYS_kexec_load),
        ("kexec_file_load", libc::SYS_kexec_file_load),
        ("init_module", libc::SYS_init_module),
        ("finit_module", libc::SYS_finit_module),
        ("delete_module", libc::SYS_delete_module),
        ("reboot", libc::SYS_reboot),
        ("swapon", libc::SYS_swapon),
        ("swapoff", libc::SYS_swapoff),
        ("acct", libc::SYS_acct),
        ("quotactl", libc::SYS_quotactl),
        ("syslog", libc::SYS_syslog),
        ("settimeofday", libc::SYS_settimeofday),
        ("clock_settime", libc::SYS_clock_settime),
        ("clock_adjtime", libc::SYS_clock_adjtime),
        ("adjtimex", libc::SYS_adjtimex),
        ("vhangup", libc::SYS_vhangup),
        ("fanotify_init", libc::SYS_fanotify_init),
        ("lookup_dcookie", libc::SYS_lookup_dcookie),
    ];
    #[cfg(target_arch = "x86_64")]
    list.extend([
        ("iopl", libc::SYS_iopl),
        ("ioperm", libc::SYS_ioperm),
        ("uselib", libc::SYS_uselib),
        ("ustat", libc::SYS_ustat),
        ("sysfs", libc::SYS_sysfs),
        ("_sysctl", libc::SYS__sysctl),
    ]);
    list
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
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_ALLOW: u32 = 0x7fff_0000;

/// Offsets in `struct seccomp_data`: nr, arch, then the six 64-bit arguments.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
/// The low 32 bits of argument `i` (the only part `clone` flags and `ioctl` requests use).
const fn arg_low(i: u32) -> u32 {
    16 + 8 * i + if cfg!(target_endian = "big") { 4 } else { 0 }
}

/// x86_64's x32 ABI numbers its syscalls from this bit up, under the same audit arch: a
/// deny list keyed by x86_64 numbers would not see them, so they are all denied.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

fn audit_arch() -> Result<u32, SeccompCompileError> {
    // AUDIT_ARCH_* of linux/audit.h: the machine, 64-bit, little-endian.
    match std::env::consts::ARCH {
        "x86_64" => Ok(0xc000_003e),
        "aarch64" => Ok(0xc000_00b7),
        "riscv64" => Ok(0xc000_00f3),
        other => Err(SeccompCompileError::Arch(other.to_string())),
    }
}

/// What the filter does with one syscall number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Eperm,
    Enosys,
    /// `clone` carrying a namespace flag: EPERM; else allowed.
    CloneWithoutNamespaces,
    /// `ioctl(TIOCSTI)`: EPERM; else allowed.
    IoctlWithoutTiocsti,
}

fn stmt(code: u16, k: u32) -> BpfInstruction {
    (code, 0, 0, k)
}

fn jump(code: u16, k: u32, jt: usize, jf: usize) -> Result<BpfInstruction, SeccompCompileError> {
    let off = |n: usize| {
        u8::try_from(n).map_err(|_| build(format!("a jump of {n} instructions (at most 255)")))
    };
    Ok((code, off(jt)?, off(jf)?, k))
}

fn build(e: impl std::fmt::Display) -> SeccompCompileError {
    SeccompCompileError::Build(e.to_string())
}

/// The code run once the syscall number matched (it always returns).
fn verdict_code(verdict: Verdict) -> Result<Vec<BpfInstruction>, SeccompCompileError> {
    let eperm = stmt(RET_K, RET_ERRNO | libc::EPERM as u32);
    Ok(match verdict {
        Verdict::Eperm => vec![eperm],
        Verdict::Enosys => vec![stmt(RET_K, RET_ERRNO | libc::ENOSYS as u32)],
        Verdict::CloneWithoutNamespaces => vec![
            stmt(LD_W_ABS, arg_low(0)),
            jump(JSET_K, CLONE_NS_FLAGS, 0, 1)?,
            eperm,
            stmt(RET_K, RET_ALLOW),
        ],
        Verdict::IoctlWithoutTiocsti => vec![
            stmt(LD_W_ABS, arg_low(1)),
            jump(JEQ_K, libc::TIOCSTI as u32, 0, 1)?,
            eperm,
            stmt(RET_K, RET_ALLOW),
        ],
    })
}

/// The search over `entries` (sorted by number) with the number in the accumulator: a
/// `jge` on the middle number splits the range until a few entries are left, which are
/// compared in turn; a number that matches none is allowed.
fn search(entries: &[(u32, Verdict)]) -> Result<Vec<BpfInstruction>, SeccompCompileError> {
    if entries.len() <= 3 {
        let mut out = Vec::new();
        for &(nr, verdict) in entries {
            let code = verdict_code(verdict)?;
            out.push(jump(JEQ_K, nr, 0, code.len())?);
            out.extend(code);
        }
        out.push(stmt(RET_K, RET_ALLOW));
        return Ok(out);
    }
    let (low, high) = entries.split_at(entries.len() / 2);
    let below = search(low)?;
    let mut out = vec![jump(JGE_K, high[0].0, below.len(), 0)?];
    out.extend(below);
    out.extend(search(high)?);
    Ok(out)
}

/// Compiles the program the init installs: the EPERM deny list, `clone` with namespace flags and the TIOCSTI terminal injection `ioctl` denied,
/// `clone3` → ENOSYS; any other architecture's syscalls kill the process.
pub fn compile() -> Result<Vec<BpfInstruction>, SeccompCompileError> {
    let arch = audit_arch()?;
    let mut entries: Vec<(u32, Verdict)> = denied_syscalls()
        .into_iter()
        .map(|(_, nr)| (nr as u32, Verdict::Eperm))
        .collect();
    entries.push((libc::SYS_clone as u32, Verdict::CloneWithoutNamespaces));
    // Pushing characters into the controlling terminal's input queue escapes any sandbox that
    // shares a terminal.
    entries.push((libc::SYS_ioctl as u32, Verdict::IoctlWithoutTiocsti));
    entries.push((libc::SYS_clone3 as u32, Verdict::Enosys));
    entries.sort_by_key(|e| e.0);
    if let Some(pair) = entries.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(build(format!("syscall {} is listed twice", pair[0].0)));
    }
    let mut program = vec![
        stmt(LD_W_ABS, DATA_ARCH),
        jump(JEQ_K, arch, 1, 0)?,
        stmt(RET_K, RET_KILL_PROCESS),
        stmt(LD_W_ABS, DATA_NR),
    ];
    #[cfg(target_arch = "x86_64")]
    program.extend([
        jump(JGE_K, X32_SYSCALL_BIT, 0, 1)?,
        stmt(RET_K, RET_ERRNO | libc::EPERM as u32),
    ]);
    program.extend(search(&entries)?);
    Ok(program)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deny_list_covers_the_required_syscalls() {
        let names: Vec<&str> = denied_syscalls().iter().map(|(n, _)| *n).collect();
        for required in [
            "mount",
            "umount2",
            "pivot_root",
            "ptrace",
            "bpf",
            "keyctl",
            "add_key",
            "request_key",
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "unshare",
            "setns",
            "perf_event_open",
            "userfaultfd",
            "open_by_handle_at",
            "reboot",
            "swapon",
            "swapoff",
            "acct",
            "quotactl",
            "fsopen",
            "open_tree",
            "move_mount",
            "io_uring_setup",
        ] {
            assert!(names.contains(&required), "{required} missing");
        }
        // Never deny what every program needs.
        for essential in ["read", "write", "execve", "exit_group", "clone", "wait4"] {
            assert!(!names.contains(&essential));
        }
    }

    /// Runs the classic BPF subset `compile` emits on one `seccomp_data`.
    fn run(program: &[BpfInstruction], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let mut data = Vec::new();
        data.extend(nr.to_ne_bytes());
        data.extend(arch.to_ne_bytes());
        data.extend(0u64.to_ne_bytes()); // instruction pointer
        for a in args {
            data.extend(a.to_ne_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let (code, jt, jf, k) = program[pc];
            pc += 1;
            let jump = |taken: bool| if taken { jt as usize } else { jf as usize };
            match code {
                LD_W_ABS => {
                    let at = k as usize;
                    acc = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                }
                JEQ_K => pc += jump(acc == k),
                JGE_K => pc += jump(acc >= k),
                JSET_K => pc += jump(acc & k != 0),
                RET_K => return k,
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    #[test]
    fn the_program_denies_exactly_the_list() {
        let prog = &compile().expect("compile");
        assert!(!prog.is_empty() && prog.len() < 4096);
        let arch = audit_arch().unwrap();
        let denied: Vec<u32> = denied_syscalls().iter().map(|(_, nr)| *nr as u32).collect();
        let eperm = RET_ERRNO | libc::EPERM as u32;
        for nr in 0..1024u32 {
            let got = run(prog, arch, nr, [0; 6]);
            let want = if denied.contains(&nr) {
                eperm
            } else if nr == libc::SYS_clone3 as u32 {
                RET_ERRNO | libc::ENOSYS as u32
            } else {
                RET_ALLOW
            };
            assert_eq!(got, want, "syscall {nr}");
        }
        // Another architecture's calls kill the process.
        assert_eq!(run(prog, 0x4000_0003, 0, [0; 6]), RET_KILL_PROCESS);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(run(prog, arch, X32_SYSCALL_BIT, [0; 6]), eperm);
    }

    #[test]
    // The ioctl request constants are u64 on some targets and not on others.
    #[allow(clippy::unnecessary_cast)]
    fn clone_and_ioctl_are_judged_by_their_arguments() {
        let prog = &compile().unwrap();
        let arch = audit_arch().unwrap();
        let clone = libc::SYS_clone as u32;
        // What fork and pthread_create pass is allowed; any namespace flag is not.
        let thread_flags = (libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES) as u64;
        assert_eq!(
            run(prog, arch, clone, [thread_flags, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            run(prog, arch, clone, [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        for flag in [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWCGROUP,
            0x80,
        ] {
            let flags = thread_flags | flag as u64;
            assert_eq!(
                run(prog, arch, clone, [flags, 0, 0, 0, 0, 0]),
                RET_ERRNO | libc::EPERM as u32,
                "clone with {flag:#x}"
            );
        }
        let ioctl = libc::SYS_ioctl as u32;
        let tiocsti = libc::TIOCSTI as u64;
        assert_eq!(
            run(prog, arch, ioctl, [0, tiocsti, 0, 0, 0, 0]),
            RET_ERRNO | libc::EPERM as u32
        );
        assert_eq!(
            run(prog, arch, ioctl, [0, libc::TIOCGWINSZ as u64, 0, 0, 0, 0]),
            RET_ALLOW
        );
    }
}
