//! The seccomp policy: a deny list (EPERM) of syscalls a step never needs and that widen the
//! kernel attack surface or undo the isolation, plus `clone3` → ENOSYS so that libc falls back
//! to `clone`, whose flags a classic BPF filter can inspect (clone3 passes them in memory).
//!
//! Compilation is pure (seccompiler builds the BPF in user space); the init installs the
//! resulting programs after everything else, with no_new_privs set.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

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

/// Namespace flags a `clone` may not carry.
const CLONE_NS_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
    0x80, // CLONE_NEWTIME
];

/// Errors while compiling the filter (a bug or an unsupported architecture).
#[derive(Debug, thiserror::Error)]
pub enum SeccompCompileError {
    #[error("seccomp is not supported on architecture {0}")]
    Arch(String),
    #[error("building the seccomp filter: {0}")]
    Build(String),
}

fn arch() -> Result<TargetArch, SeccompCompileError> {
    TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| SeccompCompileError::Arch(std::env::consts::ARCH.to_string()))
}

fn build(e: impl std::fmt::Display) -> SeccompCompileError {
    SeccompCompileError::Build(e.to_string())
}

/// Compiles the programs the init installs, in order: the EPERM deny list (including clone
/// with namespace flags and the TIOCSTI terminal injection ioctl), then clone3 → ENOSYS.
pub fn compile() -> Result<Vec<Vec<BpfInstruction>>, SeccompCompileError> {
    let arch = arch()?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (_, nr) in denied_syscalls() {
        rules.insert(nr, vec![]);
    }
    let clone_rules = CLONE_NS_FLAGS
        .iter()
        .map(|flag| {
            SeccompRule::new(vec![SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(*flag),
                *flag,
            )
            .map_err(build)?])
            .map_err(build)
        })
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone, clone_rules);
    // Pushing characters into the controlling terminal's input queue escapes any sandbox that
    // shares a terminal.
    rules.insert(
        libc::SYS_ioctl,
        vec![SeccompRule::new(vec![SeccompCondition::new(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            libc::TIOCSTI,
        )
        .map_err(build)?])
        .map_err(build)?],
    );
    let deny = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(build)?;

    let mut clone3 = BTreeMap::new();
    clone3.insert(libc::SYS_clone3, vec![]);
    let clone3 = SeccompFilter::new(
        clone3,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(build)?;

    [deny, clone3]
        .into_iter()
        .map(|f| {
            let prog: BpfProgram = f.try_into().map_err(build)?;
            Ok(prog.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect())
        })
        .collect()
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

    #[test]
    fn compiles_to_two_nonempty_programs() {
        let progs = compile().expect("compile");
        assert_eq!(progs.len(), 2);
        assert!(progs.iter().all(|p| !p.is_empty() && p.len() < 4096));
        // The deny program returns EPERM somewhere: SECCOMP_RET_ERRNO | EPERM.
        let ret_eperm = 0x0005_0000u32 | libc::EPERM as u32;
        assert!(progs[0].iter().any(|i| i.3 == ret_eperm));
        let ret_enosys = 0x0005_0000u32 | libc::ENOSYS as u32;
        assert!(progs[1].iter().any(|i| i.3 == ret_enosys));
    }
}
