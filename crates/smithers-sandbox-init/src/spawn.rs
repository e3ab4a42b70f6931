//! Starting the command (P2) from P1 with `posix_spawn`, every set-up call checked.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

use crate::plan::ExecSpec;
use crate::sys;

/// The command, prepared in P1.
pub(crate) struct PreparedExec {
    candidates: Vec<CString>,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: CString,
    /// Opened as the command's stdin: the plan's path read-only, else `/dev/null`.
    stdin: (CString, libc::c_int),
    /// A session's command: its stdin, stdout and stderr, given with its request (these
    /// replace `stdin` and P1's own 1 and 2).
    stdio: Option<[libc::c_int; 3]>,
    /// A session's command on a terminal: the slave's path, opened as its 0 (which makes it
    /// the controlling terminal of the command's new session) and copied to 1 and 2.
    terminal: Option<CString>,
    argv0: String,
}

impl PreparedExec {
    /// The command of `plan`, or the exit code and message of one that cannot be carried: a
    /// NUL byte in an argument, a variable, the working directory or the search path would
    /// end its C string early and start another command than the plan's (the runtime refuses
    /// those before; the init does not rely on it).
    pub(crate) fn new(exec: &ExecSpec) -> Result<PreparedExec, (i32, String)> {
        let argv0 = exec.argv.first().cloned().unwrap_or_default();
        let refuse = |what: String| {
            let message =
                format!("smithers-sandbox: cannot start {argv0}: {what} contains a NUL byte\n");
            (126, message)
        };
        let c = |s: &[u8], what: &dyn Fn() -> String| CString::new(s).map_err(|_| refuse(what()));
        let argv = (exec.argv.iter().enumerate())
            .map(|(i, a)| c(a.as_bytes(), &|| format!("argument {i}")))
            .collect::<Result<Vec<_>, _>>()?;
        let env = (exec.env.iter())
            .map(|e| c(e.as_bytes(), &|| "an environment variable".to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        let cwd = c(exec.cwd.as_os_str().as_bytes(), &|| {
            "the working directory".to_string()
        })?;
        let stdin = match &exec.stdin {
            Some(path) => (
                c(path.as_os_str().as_bytes(), &|| {
                    "the stdin path".to_string()
                })?,
                libc::O_RDONLY,
            ),
            None => (c"/dev/null".to_owned(), libc::O_RDWR),
        };
        let candidates = if argv0.contains('/') {
            vec![argv[0].clone()]
        } else {
            (exec.search_path.split(':'))
                .filter(|d| !d.is_empty())
                .map(|d| format!("{}/{argv0}", d.trim_end_matches('/')))
                .map(|p| c(p.as_bytes(), &|| "the search path".to_string()))
                .collect::<Result<Vec<_>, _>>()?
        };
        Ok(PreparedExec {
            candidates,
            argv,
            env,
            cwd,
            stdin,
            stdio: None,
            terminal: None,
            argv0,
        })
    }

    /// The command started with `stdio` as its descriptors 0, 1 and 2 (a session's command;
    /// the caller keeps them open until [`PreparedExec::spawn`] returns, and closes them
    /// after).
    pub(crate) fn with_stdio(mut self, stdio: [libc::c_int; 3]) -> PreparedExec {
        self.stdio = Some(stdio);
        self
    }

    /// The command started on the terminal whose slave is at `slave` (a session's command):
    /// opened in the new process after its `setsid`, without `O_NOCTTY`, so the terminal
    /// becomes its controlling one (job control, Ctrl-C, window size changes reach it).
    pub(crate) fn with_terminal(mut self, slave: CString) -> PreparedExec {
        self.terminal = Some(slave);
        self
    }

    /// Adds the file actions that make the command's 0, 1 and 2 (its terminal, its
    /// request's descriptors, or the plan's stdin with P1's own 1 and 2); each call's result.
    fn stdio_actions(&self, actions: &mut libc::posix_spawn_file_actions_t) -> [libc::c_int; 3] {
        // SAFETY: `actions` was initialised by the caller; every path is a valid C string
        // that outlives the spawn (it is ours).
        unsafe {
            match (&self.terminal, self.stdio) {
                // glibc runs the file actions after the setsid: the open makes the slave the
                // new session's controlling terminal.
                (Some(slave), _) => [
                    libc::posix_spawn_file_actions_addopen(
                        actions,
                        0,
                        slave.as_ptr(),
                        libc::O_RDWR,
                        0,
                    ),
                    libc::posix_spawn_file_actions_adddup2(actions, 0, 1),
                    libc::posix_spawn_file_actions_adddup2(actions, 0, 2),
                ],
                // dup2 clears close-on-exec on the copy (the originals, like every descriptor
                // of P1 from 3 up, are close-on-exec). P1's own 0-2 are taken (see
                // `session`), so none of these is a 0-2 a dup2 before it would overwrite.
                (None, Some(fds)) => [0, 1, 2].map(|i| {
                    libc::posix_spawn_file_actions_adddup2(actions, fds[i], i as libc::c_int)
                }),
                (None, None) => [
                    libc::posix_spawn_file_actions_addopen(
                        actions,
                        0,
                        self.stdin.0.as_ptr(),
                        self.stdin.1,
                        0,
                    ),
                    0,
                    0,
                ],
            }
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
    /// tables (glibc's CLONE_VM|CLONE_VFORK): in its own session, stdin `/dev/null` or the plan's FIFO, stdout
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
            // One at a time: a descriptor left open would reach the command, so a failure to
            // list or mark them refuses the start.
            let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
                return Err(self.failure(126, "cannot close the descriptors for", sys::errno()));
            };
            let fds: Vec<libc::c_int> = dir
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .filter(|fd| *fd > 2)
                .collect();
            for fd in fds {
                // SAFETY: fcntl on a descriptor number; the listing's own, closed since,
                // fails with EBADF.
                let ret = unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
                if ret < 0 && sys::errno() != libc::EBADF {
                    return Err(self.failure(
                        126,
                        "cannot close the descriptors for",
                        sys::errno(),
                    ));
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
            ];
            let stdio = self.stdio_actions(&mut actions);
            if let Some(&e) = setup.iter().chain(&stdio).find(|&&e| e != 0) {
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::PreparedExec;
    use crate::plan::{ExecSpec, InitPlan, LandlockPlan, RootFs};

    fn plan(argv: &[&str], env: &[&str], cwd: &str) -> InitPlan {
        InitPlan {
            version: crate::plan::PLAN_VERSION,
            hostname: "h".into(),
            new_root: PathBuf::from("/nowhere"),
            root: RootFs::Tmpfs,
            mounts: vec![],
            landlock: LandlockPlan {
                read_dirs: vec![],
                write_dirs: vec![],
                write_files: vec![],
                scope: false,
            },
            seccomp: vec![],
            exec: ExecSpec {
                argv: argv.iter().map(|s| s.to_string()).collect(),
                env: env.iter().map(|s| s.to_string()).collect(),
                cwd: PathBuf::from(cwd),
                search_path: "/usr/bin:/bin".into(),
                stdin: None,
                terminal: None,
            },
            exec_follows: false,
        }
    }

    /// A NUL would end the C string early: `rm -rf /\0tmp` must not become `rm -rf /`.
    #[test]
    fn a_nul_anywhere_in_the_command_is_refused_not_truncated() {
        for (argv, env, cwd, what) in [
            (&["rm", "-rf", "/\0tmp"][..], &[][..], "/w", "argument 2"),
            (&["tr\0ue"][..], &[][..], "/w", "argument 0"),
            (&["true"][..], &["A=1\0B"][..], "/w", "environment variable"),
            (&["true"][..], &[][..], "/w\0x", "working directory"),
        ] {
            let Err((code, message)) = PreparedExec::new(&plan(argv, env, cwd).exec) else {
                panic!("{argv:?} {env:?} {cwd:?} was accepted");
            };
            assert_eq!(code, 126);
            assert!(message.contains(what), "{message}");
        }
    }

    #[test]
    fn a_plain_command_is_prepared_with_its_search_path() {
        let exec = PreparedExec::new(&plan(&["ls", "-l"], &["A=1"], "/w").exec).unwrap();
        assert_eq!(exec.argv.len(), 2);
        assert_eq!(exec.candidates.len(), 2);
        assert_eq!(exec.candidates[0].to_str().unwrap(), "/usr/bin/ls");
    }
}
