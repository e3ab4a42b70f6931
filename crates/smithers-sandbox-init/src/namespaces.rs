//! P0's namespaces: the user namespace (with its one-line maps) and every other one but the
//! network namespace, which P0 makes after forking P1 (see [`crate::network`]).

use std::path::Path;

use crate::cgroups::{open_cgroups, CgroupFds};
use crate::control::{stage, StageResult};
use crate::plan::Prelude;
use crate::sys;

/// P0 with the prelude: opens the cgroups, makes the namespaces.
pub(crate) fn enter_namespaces(plan: &Prelude) -> StageResult<CgroupFds> {
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
