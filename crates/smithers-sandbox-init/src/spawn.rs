//! Starting the command (P2) from P1 with `posix_spawn`, every set-up call checked.

use std::ffi::CString;

use crate::plan::InitPlan;
use crate::sys::{self, cpath, cstring};

/// The command, prepared in P1.
pub(crate) struct PreparedExec {
    candidates: Vec<CString>,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: CString,
    argv0: String,
}

impl PreparedExec {
    pub(crate) fn new(plan: &InitPlan) -> PreparedExec {
        let argv0 = plan.exec.argv.first().cloned().unwrap_or_default();
        let candidates = if argv0.contains('/') {
            vec![cstring(&argv0)]
        } else {
            plan.exec
                .search_path
                .split(':')
                .filter(|d| !d.is_empty())
                .map(|d| cstring(&format!("{}/{argv0}", d.trim_end_matches('/'))))
                .collect()
        };
        PreparedExec {
            candidates,
            argv: plan.exec.argv.iter().map(|a| cstring(a)).collect(),
            env: plan.exec.env.iter().map(|e| cstring(e)).collect(),
            cwd: cpath(&plan.exec.cwd),
            argv0,
        }
    }

    /// The message and exit code of a command that could not start, as a shell gives them.
    fn failure(&self, code: i32, what: &str, errno: i32) -> (i32, String) {
        let message = format!(
            "smithers-sandbox: {what} {}: {}\n",
            self.argv0,
            std::io::Error::from_raw_os_error(errno)
        );
        (code, message)
    }

    /// Starts the command (P2) with `posix_spawn`, which clones without copying P1's page
    /// tables (glibc's CLONE_VM|CLONE_VFORK): in its own session, stdin `/dev/null`, stdout
    /// and stderr the runtime's pipes, no other descriptor, every signal at its default
    /// disposition and none blocked (P1 is a Rust program, which ignores SIGPIPE; a command
    /// must not inherit that, or `yes | head` reports EPIPE instead of ending quietly). The
    /// working directory is P1's own, set first. No death signal is needed: P1 is pid 1 of the
    /// sandbox's pid namespace, whose death kills every process in it. Returns the pid, or the
    /// exit code and message of a command that could not start (126, 127 for not found).
    pub(crate) fn spawn(&self) -> Result<libc::pid_t, (i32, String)> {
        // SAFETY: valid C string.
        if unsafe { libc::chdir(self.cwd.as_ptr()) } < 0 {
            return Err(self.failure(126, "cannot enter the working directory for", sys::errno()));
        }
        if self.argv.is_empty() {
            return Err(self.failure(127, "empty command", libc::ENOENT));
        }
        // Everything P1 holds beyond 0-2 (none of which it needs after the spawn) ends at the
        // command's exec. CLOSE_RANGE_CLOEXEC: Linux 5.11; before it, one fd at a time.
        // SAFETY: close_range on our own descriptor table, only setting flags.
        let marked = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 4u32) };
        if marked < 0 {
            if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
                for fd in dir
                    .flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse().ok())
                {
                    if fd > 2 {
                        // SAFETY: fcntl on a descriptor number; a stale one fails harmlessly.
                        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
                    }
                }
            }
        }
        let mut argv: Vec<*mut libc::c_char> =
            self.argv.iter().map(|a| a.as_ptr().cast_mut()).collect();
        argv.push(std::ptr::null_mut());
        let mut envp: Vec<*mut libc::c_char> =
            self.env.iter().map(|e| e.as_ptr().cast_mut()).collect();
        envp.push(std::ptr::null_mut());
        // SAFETY: the attribute and file-action objects are initialised before use and
        // destroyed after; every pointer passed to posix_spawn (path, argv, envp, the objects)
        // is valid for the call, and argv/envp are NULL-terminated arrays of C strings.
        unsafe {
            let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
            let mut actions: libc::posix_spawn_file_actions_t = std::mem::zeroed();
            // Each set-up call's result is checked: a failed one (ENOMEM, EINVAL) would start
            // the command with P1's own stdin, signal state or session, so it is refused.
            let e = libc::posix_spawnattr_init(&mut attr);
            if e != 0 {
                return Err(self.failure(126, "cannot prepare the start of", e));
            }
            let e = libc::posix_spawn_file_actions_init(&mut actions);
            if e != 0 {
                libc::posix_spawnattr_destroy(&mut attr);
                return Err(self.failure(126, "cannot prepare the start of", e));
            }
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut none: libc::sigset_t = std::mem::zeroed();
            let flags = libc::POSIX_SPAWN_SETSID
                | libc::POSIX_SPAWN_SETSIGDEF as libc::c_short
                | libc::POSIX_SPAWN_SETSIGMASK as libc::c_short;
            let setup = [
                // sigfillset/sigemptyset return -1 (errno), the posix_spawn calls an error number.
                if libc::sigfillset(&mut all) < 0 {
                    sys::errno()
                } else {
                    0
                },
                if libc::sigemptyset(&mut none) < 0 {
                    sys::errno()
                } else {
                    0
                },
                libc::posix_spawnattr_setsigdefault(&mut attr, &all),
                libc::posix_spawnattr_setsigmask(&mut attr, &none),
                libc::posix_spawnattr_setflags(&mut attr, flags),
                libc::posix_spawn_file_actions_addopen(
                    &mut actions,
                    0,
                    c"/dev/null".as_ptr(),
                    libc::O_RDWR,
                    0,
                ),
            ];
            if let Some(&e) = setup.iter().find(|&&e| e != 0) {
                libc::posix_spawn_file_actions_destroy(&mut actions);
                libc::posix_spawnattr_destroy(&mut attr);
                return Err(self.failure(126, "cannot prepare the start of", e));
            }
            // The PATH search of execvp: a candidate that is not there is skipped, one that
            // cannot be executed is remembered; the last such error decides 126 over 127.
            let mut last = libc::ENOENT;
            let mut result = None;
            for candidate in &self.candidates {
                if libc::access(candidate.as_ptr(), libc::X_OK) < 0 {
                    let e = sys::errno();
                    if e != libc::ENOENT && e != libc::ENOTDIR {
                        last = e;
                    }
                    continue;
                }
                let mut pid: libc::pid_t = 0;
                let e = libc::posix_spawn(
                    &mut pid,
                    candidate.as_ptr(),
                    &actions,
                    &attr,
                    argv.as_ptr(),
                    envp.as_ptr(),
                );
                if e == 0 {
                    result = Some(pid);
                    break;
                }
                if e != libc::ENOENT && e != libc::ENOTDIR {
                    last = e;
                }
            }
            libc::posix_spawn_file_actions_destroy(&mut actions);
            libc::posix_spawnattr_destroy(&mut attr);
            match result {
                Some(pid) => Ok(pid),
                None => {
                    let code = if last == libc::ENOENT { 127 } else { 126 };
                    Err(self.failure(code, "cannot execute", last))
                }
            }
        }
    }
}
