//! Joining the sandbox's cgroups without the cost of a migration (see
//! [`crate::plan::CgroupJoin`]): P0 opens them with its host credentials, clones P1 straight
//! into the v2 one (or moves it there), and P1 moves itself into the v1 ones.

use std::path::Path;

use crate::control::{report_error, stage, StageResult};
use crate::plan::Prelude;
use crate::sys::{self, cpath, SysError, SysResult};

/// File descriptors of the sandbox's cgroups, opened by P0 with its host credentials.
pub(crate) struct CgroupFds {
    /// v1 `tasks` files, written `0` by P1 itself.
    pub(crate) v1_tasks: Vec<libc::c_int>,
    /// The v2 directory (for `clone3(CLONE_INTO_CGROUP)`) and its `cgroup.procs` (fallback).
    pub(crate) v2_dir: Option<libc::c_int>,
    pub(crate) v2_procs: Option<libc::c_int>,
}

pub(crate) fn open_cgroups(plan: &Prelude) -> StageResult<CgroupFds> {
    fn open(path: &Path, flags: libc::c_int) -> StageResult<libc::c_int> {
        let c = cpath(path);
        // SAFETY: valid C string; the fd is closed by whichever process stops needing it.
        let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
        stage(
            "cgroup",
            sys::check(fd, || format!("open {}", path.display())),
        )
    }
    let join = &plan.cgroups;
    let mut fds = CgroupFds {
        v1_tasks: Vec::with_capacity(join.v1_tasks.len()),
        v2_dir: None,
        v2_procs: None,
    };
    for tasks in &join.v1_tasks {
        fds.v1_tasks.push(open(tasks, libc::O_WRONLY)?);
    }
    if let Some(dir) = &join.v2_dir {
        fds.v2_dir = Some(open(dir, libc::O_RDONLY | libc::O_DIRECTORY)?);
        fds.v2_procs = Some(open(&dir.join("cgroup.procs"), libc::O_WRONLY)?);
    }
    Ok(fds)
}

pub(crate) fn close_opt(fd: Option<libc::c_int>) {
    if let Some(fd) = fd {
        // SAFETY: an fd this process owns and no longer uses.
        unsafe { libc::close(fd) };
    }
}

/// `struct clone_args` of clone3(2), up to `cgroup` (CLONE_ARGS_SIZE_VER2).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Forks P1, straight into the v2 cgroup when one is given and the kernel has
/// `clone3(CLONE_INTO_CGROUP)`. Returns the pid (0 in the child) and whether the child was
/// placed in the v2 cgroup.
pub(crate) fn fork_into(v2_dir: Option<libc::c_int>) -> SysResult<(libc::pid_t, bool)> {
    if let Some(dir) = v2_dir {
        let args = CloneArgs {
            flags: CLONE_INTO_CGROUP,
            exit_signal: libc::SIGCHLD as u64,
            cgroup: dir as u64,
            ..CloneArgs::default()
        };
        // SAFETY: clone3 without CLONE_VM and without a stack behaves like fork(2): the child
        // gets a copy of this single-threaded process and returns here with 0. `args` is a
        // valid clone_args of the size passed.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &args as *const CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        if ret >= 0 {
            return Ok((ret as libc::pid_t, true));
        }
        // Only a kernel without clone3 or its cgroup field (ENOSYS, E2BIG, EINVAL) falls back
        // to fork and a `cgroup.procs` write. A refusal to place the child comes after the
        // kernel allocated its pid: for the first process of a new pid namespace that failure
        // leaves the namespace unable to take any process (the fallback fork would fail with
        // a misleading ENOMEM), so the refusal itself is the error.
        let errno = sys::errno();
        if !matches!(errno, libc::ENOSYS | libc::E2BIG | libc::EINVAL) {
            return sys::fail("clone into the sandbox's cgroup");
        }
    }
    // SAFETY: the init is single-threaded, so the child may keep running arbitrary Rust code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return sys::fail("fork");
    }
    Ok((pid, false))
}

/// P0: moves P1 into the v2 cgroup when `clone3` could not place it (the slow migration, done
/// while P1 builds its root), then lets P1 go on. P1 starts the command only after the `j`
/// byte, so every sandbox process is born inside.
pub(crate) fn join_v2_and_release(
    child: libc::pid_t,
    procs: Option<libc::c_int>,
    joined: libc::c_int,
) {
    if let Some(fd) = procs {
        let result = sys::write_all_fd(fd, child.to_string().as_bytes());
        // SAFETY: our fd, no longer needed.
        unsafe { libc::close(fd) };
        if let Err(e) = result {
            report_error(
                "cgroup",
                &SysError {
                    op: "join the sandbox cgroup".into(),
                    errno: e.errno,
                },
            );
            let _ = sys::kill(child, libc::SIGKILL);
            // SAFETY: our fd.
            unsafe { libc::close(joined) };
            return;
        }
    }
    let _ = sys::write_all_fd(joined, b"j");
    // SAFETY: our fd.
    unsafe { libc::close(joined) };
}

/// In P1, first thing: moves itself into the v1 cgroups. A single-threaded process writing
/// `0` (itself) to `tasks` is the one migration the kernel does without its global lock.
pub(crate) fn join_v1(tasks: &[libc::c_int]) -> SysResult<()> {
    for fd in tasks {
        let result = sys::write_all_fd(*fd, b"0");
        // SAFETY: our fd, no longer needed.
        unsafe { libc::close(*fd) };
        result.map_err(|e| SysError {
            op: "join the sandbox cgroup (v1 tasks)".into(),
            errno: e.errno,
        })?;
    }
    Ok(())
}

/// In P1: waits until P0 has placed us in the v2 cgroup, then gives the sandbox its own cgroup
/// namespace rooted there.
pub(crate) fn await_cgroups(joined: libc::c_int) -> SysResult<()> {
    let mut byte = [0u8; 1];
    loop {
        // SAFETY: valid one-byte buffer.
        let n = unsafe { libc::read(joined, byte.as_mut_ptr().cast(), 1) };
        if n < 0 && sys::errno() == libc::EINTR {
            continue;
        }
        // SAFETY: our fd.
        unsafe { libc::close(joined) };
        if n != 1 || byte[0] != b'j' {
            return Err(SysError {
                op: "joining the sandbox cgroups failed".into(),
                errno: libc::ECHILD,
            });
        }
        break;
    }
    sys::unshare(libc::CLONE_NEWCGROUP, "cgroup namespace")
}
