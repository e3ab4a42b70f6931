//! Thin, checked wrappers over the raw syscalls the init and the runtime need. Each returns the
//! errno on failure so callers can name the failed operation.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A failed syscall: which operation, on what, and errno.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysError {
    pub op: String,
    pub errno: i32,
}

impl std::fmt::Display for SysError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {}",
            self.op,
            std::io::Error::from_raw_os_error(self.errno)
        )
    }
}

pub type SysResult<T> = Result<T, SysError>;

/// A rustix result as a [`SysResult`], naming the operation.
pub fn rx<T>(r: rustix::io::Result<T>, op: impl FnOnce() -> String) -> SysResult<T> {
    r.map_err(|e| SysError {
        op: op(),
        errno: e.raw_os_error(),
    })
}

pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

pub fn fail<T>(op: impl Into<String>) -> SysResult<T> {
    Err(SysError {
        op: op.into(),
        errno: errno(),
    })
}

pub fn check(ret: libc::c_int, op: impl FnOnce() -> String) -> SysResult<libc::c_int> {
    if ret < 0 {
        fail(op())
    } else {
        Ok(ret)
    }
}

pub fn check_long(ret: libc::c_long, op: impl FnOnce() -> String) -> SysResult<libc::c_long> {
    if ret < 0 {
        fail(op())
    } else {
        Ok(ret)
    }
}

pub fn cpath(path: &Path) -> CString {
    // Paths from the plan never contain NUL (they come from OsStr / validated JSON); a NUL
    // would be a bug, and truncating at it is the safe reading.
    let bytes = path.as_os_str().as_bytes();
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    CString::new(&bytes[..end]).unwrap_or_default()
}

/// Runs `body` in a child made by `fork`/`clone` and ends the child with its code, never
/// returning: a panic in the child must not unwind into the frames it shares (as copies) with
/// its parent and run the parent's code there, so it is caught and the child exits 101.
pub fn child_exit(body: impl FnOnce() -> i32) -> ! {
    let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(101);
    // SAFETY: _exit is always safe; the child must not run the parent's atexit handlers or
    // flush buffers that the parent also holds.
    unsafe { libc::_exit(code) }
}

/// How many threads this process has (`Threads:` of `/proc/self/status`); `None` when it
/// cannot be read.
/// `CLOCK_MONOTONIC` in nanoseconds: the sandbox has no time namespace of its own, so this
/// is the host's clock too (the runtime places the command's start on it).
pub fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

pub fn thread_count() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
}

pub fn cstring(s: &str) -> CString {
    let end = s.bytes().position(|b| b == 0).unwrap_or(s.len());
    CString::new(&s.as_bytes()[..end]).unwrap_or_default()
}

/// `mount(2)`.
pub fn mount(
    source: Option<&CStr>,
    target: &Path,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> SysResult<()> {
    let target_c = cpath(target);
    // SAFETY: every pointer is either null or a valid NUL-terminated string that outlives the
    // call; mount(2) does not retain them.
    let ret = unsafe {
        libc::mount(
            source.map_or(std::ptr::null(), CStr::as_ptr),
            target_c.as_ptr(),
            fstype.map_or(std::ptr::null(), CStr::as_ptr),
            flags,
            data.map_or(std::ptr::null(), |d| d.as_ptr().cast()),
        )
    };
    check(ret, || format!("mount {}", target.display())).map(|_| ())
}

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;

/// `mount_setattr(2)`: sets attributes on a mount (and its submounts when `recursive`).
/// Returns ENOSYS on kernels older than 5.12.
pub fn mount_setattr(path: &Path, attr_set: u64, recursive: bool) -> SysResult<()> {
    let c = cpath(path);
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { libc::AT_RECURSIVE } else { 0 };
    // SAFETY: `c` is a valid C string and `attr` a properly laid out struct mount_attr whose
    // size we pass; the kernel only reads them during the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            flags as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check_long(ret, || format!("mount_setattr {}", path.display())).map(|_| ())
}

/// `statvfs(3)` flags of the filesystem/mount at `path`.
/// True when `path` is on a tmpfs.
pub fn is_tmpfs(path: &Path) -> bool {
    const TMPFS_MAGIC: libc::c_long = 0x0102_1994;
    let c = cpath(path);
    // SAFETY: an all-zero statfs is a valid out-buffer for statfs(2).
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer.
    let ret = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    ret == 0 && st.f_type as libc::c_long == TMPFS_MAGIC
}

pub fn statvfs(path: &Path) -> SysResult<libc::statvfs> {
    let c = cpath(path);
    // SAFETY: statvfs is plain old data; an all-zero value is valid and the kernel fills it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a valid, writable statvfs.
    let ret = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    check(ret, || format!("statvfs {}", path.display()))?;
    Ok(st)
}

pub fn umount2(path: &Path, flags: libc::c_int) -> SysResult<()> {
    let flags = rustix::mount::UnmountFlags::from_bits_retain(flags as u32);
    rx(rustix::mount::unmount(path, flags), || {
        format!("umount {}", path.display())
    })
}

pub fn unshare(flags: libc::c_int, what: &str) -> SysResult<()> {
    // SAFETY: unshare(2) takes only flags; the process is single-threaded when this is called
    // for the user namespace (the init), as the kernel requires.
    let ret = unsafe { libc::unshare(flags) };
    check(ret, || format!("unshare {what}")).map(|_| ())
}

pub fn prctl(option: libc::c_int, arg2: libc::c_ulong, what: &str) -> SysResult<libc::c_int> {
    // SAFETY: the prctl options used here take integer arguments only (no pointers).
    let ret = unsafe { libc::prctl(option, arg2, 0 as libc::c_ulong, 0 as libc::c_ulong, 0) };
    check(ret, || format!("prctl {what}"))
}

/// Writes `data` to `fd` completely (retrying on EINTR and short writes).
pub fn write_all_fd(fd: libc::c_int, mut data: &[u8]) -> SysResult<()> {
    while !data.is_empty() {
        // SAFETY: `data` is a valid readable buffer of the given length.
        let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return fail("write");
        }
        data = &data[n as usize..];
    }
    Ok(())
}

/// Writes a whole file (no O_CREAT: used for /proc and cgroup control files).
pub fn write_file(path: &Path, data: &[u8]) -> SysResult<()> {
    use rustix::fs::{Mode, OFlags};
    use std::os::fd::AsRawFd;
    let fd = rx(
        rustix::fs::open(path, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty()),
        || format!("open {}", path.display()),
    )?;
    write_all_fd(fd.as_raw_fd(), data).map_err(|e| SysError {
        op: format!("write {}", path.display()),
        errno: e.errno,
    })
}

/// `waitpid(pid, flags)` retried on EINTR: the pid it reaped and its status.
pub fn wait_child(pid: libc::pid_t, flags: libc::c_int) -> SysResult<(libc::pid_t, libc::c_int)> {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out-pointer for the call.
        let r = unsafe { libc::waitpid(pid, &mut status, flags) };
        if r >= 0 {
            return Ok((r, status));
        }
        if errno() != libc::EINTR {
            return fail(format!("wait for {pid}"));
        }
    }
}

/// Whether the child `pid` has ended, without reaping it (`waitid` with `WNOWAIT`); an error
/// (no such child) counts as ended.
pub fn child_ended(pid: libc::pid_t) -> bool {
    // SAFETY: siginfo_t is plain old data; all-zero is valid and means "no child changed".
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT | libc::__WALL;
    // SAFETY: `info` is a valid out-pointer; waitid only writes it.
    let ret = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) };
    // SAFETY: si_pid reads the union field waitid fills (zero when nothing ended).
    ret < 0 || unsafe { info.si_pid() } != 0
}

pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> SysResult<()> {
    // SAFETY: kill(2) takes plain integers (rustix's kill wants a positive pid and one of its
    // own signal values; the init kills pids it got from fork and only with SIGKILL, but -1
    // and raw numbers must stay expressible).
    let ret = unsafe { libc::kill(pid, sig) };
    check(ret, || format!("kill {pid}")).map(|_| ())
}

#[cfg(test)]
mod tests {
    /// The init's single-thread check reads a real count: a second thread is seen.
    #[test]
    fn thread_count_sees_a_second_thread() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || rx.recv());
        // This thread and the one just started, at least (the harness may run others).
        assert!(super::thread_count().expect("readable /proc/self/status") >= 2);
        tx.send(()).unwrap();
        t.join().unwrap().unwrap();
    }

    /// P0's fallback without a pidfd: a running child is not ended, an exited one is, and
    /// the check does not reap it (the real wait that follows still gets its status).
    #[test]
    // The child is reaped by `wait_child`, which is what is tested, not by `Child::wait`.
    #[allow(clippy::zombie_processes)]
    fn child_ended_sees_the_end_without_reaping() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as libc::pid_t;
        assert!(!super::child_ended(pid));
        child.kill().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !super::child_ended(pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "the killed child never ended"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (reaped, status) = super::wait_child(pid, 0).expect("still reapable");
        assert_eq!(reaped, pid);
        assert!(libc::WIFSIGNALED(status));
        assert_eq!(libc::WTERMSIG(status), libc::SIGKILL);
    }

    /// A failed wait is an error, never a status of 0 (which reads as "exited 0").
    #[test]
    fn wait_child_fails_for_no_child() {
        assert_eq!(
            super::wait_child(1, libc::WNOHANG).unwrap_err().errno,
            libc::ECHILD
        );
    }
}
