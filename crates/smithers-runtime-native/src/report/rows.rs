//! What both reports are made of: the protections' names, a row, sizes in words, what the
//! kernel's Landlock ABI lacks, and the row of a copy workspace.

use smithers_runtime::{Protection, ProtectionStatus};

use crate::backend::FOREIGN_OWNERS;

/// The names of the protections in every report of this runtime.
pub mod protection_names {
    pub const USER_NAMESPACE: &str = "user-namespace";
    pub const MOUNT_NAMESPACE: &str = "mount-namespace";
    pub const PID_NAMESPACE: &str = "pid-namespace";
    pub const IPC_NAMESPACE: &str = "ipc-namespace";
    pub const UTS_NAMESPACE: &str = "uts-namespace";
    pub const CGROUP_NAMESPACE: &str = "cgroup-namespace";
    /// The network namespace (only loopback) or, with allowNetwork, disabled.
    pub const NETWORK: &str = "network";
    /// Read-only minimal root, filtered /etc, no home or /sys.
    pub const FILESYSTEM: &str = "filesystem";
    /// Minimal /dev.
    pub const DEVICES: &str = "devices";
    pub const SECCOMP: &str = "seccomp";
    pub const LANDLOCK: &str = "landlock";
    pub const NO_NEW_PRIVS: &str = "no-new-privs";
    pub const CAPABILITIES: &str = "capabilities";
    pub const MEMORY: &str = "memory";
    pub const PIDS: &str = "pids";
    pub const CPU: &str = "cpu";
    pub const DISK: &str = "disk";
    pub const TIMEOUT: &str = "timeout";
    pub const OUTPUT: &str = "output";
    pub const WORKSPACE_COW: &str = "workspace-cow";
    /// A session's checkpoints, restores and forks (layer flips): the host probe's row only
    /// (a capability, not a protection; never required).
    pub const CHECKPOINTS: &str = "checkpoints";
    /// Host paths mounted by the caller (`volumes`), each with its mode.
    pub const HOST_MOUNTS: &str = smithers_runtime::mounts::HOST_MOUNTS;
}

pub(super) use protection_names as n;

pub(super) fn row(
    name: &str,
    status: ProtectionStatus,
    detail: impl Into<String>,
    fix: Option<&str>,
) -> Protection {
    Protection {
        name: name.to_string(),
        status,
        detail: detail.into(),
        fix: fix.map(str::to_string),
    }
}

pub(super) fn human_bytes(b: u64) -> String {
    if b >= 1 << 30 && b % (1 << 30) == 0 {
        format!("{} GiB", b >> 30)
    } else if b >= 1 << 20 {
        format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
    } else {
        format!("{b} bytes")
    }
}

/// The newest Landlock ABI whose rights the init asks for (`privileges::apply_landlock`).
pub(super) const LANDLOCK_ABI_USED: i64 = 6;

pub(super) const LANDLOCK_FIX: &str =
    "use a kernel with Landlock ABI 6 or newer (Linux 6.12+) for every right the sandbox asks for";

/// Landlock rights by the ABI that brought them, and what their absence costs here, given
/// the layers that do not depend on Landlock (read-only mounts, the sandbox's own network,
/// pid and IPC namespaces, the seccomp filter).
const LANDLOCK_RIGHTS: &[(i64, &str, &str)] = &[
    (2, "refer (rename and link across directories)", "Landlock then refuses every rename or link across directories in the sandbox, /workspace included: build tools that move files between directories fail (EXDEV)"),
    (3, "truncate", "truncation is not checked by Landlock; every path outside the writable directories is on a read-only mount, so nothing outside them can be truncated anyway"),
    (4, "TCP bind and connect rules", "none: the sandbox's network namespace is the boundary (the runtime uses no TCP rules)"),
    (5, "ioctl on device files", "ioctls on the minimal /dev's devices are not checked by Landlock; the seccomp filter still denies TIOCSTI and TIOCLINUX"),
    (6, "scoping of abstract unix sockets and signals", "none beyond Landlock: abstract sockets are per network namespace and signals cannot cross the sandbox's pid namespace"),
];

/// "ABI n", and for each right the kernel lacks, what it costs.
pub(crate) fn landlock_abi_detail(abi: i64) -> String {
    let missing: Vec<String> = LANDLOCK_RIGHTS
        .iter()
        .filter(|(since, _, _)| *since > abi)
        .map(|(since, right, cost)| format!("no {right} (ABI {since}): {cost}"))
        .collect();
    if missing.is_empty() {
        format!("ABI {abi}")
    } else {
        format!("ABI {abi}; {}", missing.join("; "))
    }
}

/// The kernel's Landlock ABI (0 when Landlock is off).
pub(crate) fn landlock_abi() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_ulong = 1;
    // SAFETY: with a NULL attribute, size 0 and the VERSION flag the call only returns the
    // ABI version; it reads and writes no memory of ours.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    abi.max(0)
}

/// The `workspace-cow` row of a sandbox that got a copy.
pub(super) fn copy_row(reason: &str) -> Protection {
    row(
        n::WORKSPACE_COW,
        ProtectionStatus::Degraded,
        format!(
            "workspace mode copy: {reason}; the project was copied into the sandbox's state directory at ship and is compared with the untouched project at collect (the project is never written; .smithers hidden, .git bound read-only: the step cannot commit in copy mode)"
        ),
        Some(if reason.starts_with(FOREIGN_OWNERS) {
            "for copy-on-write (no copy, ship cost independent of the project size): run the runtime as the tree's owner, or give the tree to the runtime's user (chown -R)"
        } else {
            "for copy-on-write (no copy, ship cost independent of the project size): a kernel >= 5.11 with overlayfs in user namespaces, a state root on ext4, xfs or tmpfs, workspace mode auto or overlay"
        }),
    )
}

#[cfg(test)]
mod landlock_tests {
    use super::*;

    #[test]
    fn each_missing_landlock_right_is_named_with_its_cost() {
        // Debian 12's 6.1 kernel has ABI 2.
        let detail = landlock_abi_detail(2);
        assert!(detail.starts_with("ABI 2;"), "{detail}");
        assert!(detail.contains("no truncate (ABI 3)"), "{detail}");
        assert!(
            detail.contains("no TCP bind and connect rules (ABI 4)"),
            "{detail}"
        );
        assert!(!detail.contains("refer"), "ABI 2 has refer: {detail}");
        assert_eq!(landlock_abi_detail(7), "ABI 7");
    }
}
