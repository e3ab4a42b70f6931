//! The docker engine's in-container modes: this build's binary, bound read-only into a
//! long-lived sandbox container, run under Docker's own init (`Init: true`, pid 1, which
//! reaps). The container already is the isolation (its namespaces, capabilities, seccomp,
//! limits): nothing here adds or lowers any of it; these modes only give the runtime what the
//! Engine API lacks, a way to kill one exec.
//!
//! * `--container-wait`: the container's main process. It only waits for a signal (the
//!   container's end); every command comes as a `docker exec`.
//! * `--container-exec TOKEN --cwd DIR [--null-stdin] -- ARGV...`: one exec's wrapper. It forks
//!   the command into a process group of its own, writes that group's id to
//!   `EXEC_DIR/TOKEN.pid`, waits for the command, kills what is left of the group, and exits
//!   with the command's code, or 128 + the signal that ended it. Those two readings of a code
//!   in 129..=192 are told apart by `EXEC_DIR/TOKEN.status` (`exit N` or `signal N`), written
//!   only then (and not for a command the runtime had killed, whose end it knows) and read and
//!   removed by `--container-status`: nothing is left in `EXEC_DIR` once an exec is over.
//! * `--container-kill TOKEN`: kills that exec's group (SIGKILL), as a second exec: Docker has
//!   no call to kill an exec.
//! * `--container-status TOKEN`: prints and removes the status file.
//!
//! `EXEC_DIR` is a tmpfs of the container's own (no host path), writable by the step's uid:
//! the step can write anything there, so the kill trusts no pid file. It must name a group
//! leader whose parent is a wrapper with this very token on its command line, else (or when it
//! is missing) the group is looked for in `/proc` by that same test; and whatever it names,
//! the kill runs inside the container's pid namespace, where no process outside the sandbox
//! can be named at all. A forged file can at worst point the kill at the step's own
//! processes, which it can kill itself anyway; it never makes the kill fail.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use crate::sys;

/// The container-private directory of the wrappers' pid, kill and status files.
pub const EXEC_DIR: &str = "/run/smithers/exec";
/// The mode that makes the container's main process wait.
pub const WAIT: &str = "--container-wait";
/// The mode of one exec's wrapper.
pub const EXEC: &str = "--container-exec";
/// The mode that kills one exec's group.
pub const KILL: &str = "--container-kill";
/// The mode that reads one exec's status.
pub const STATUS: &str = "--container-status";

/// Exit code of a kill that refused the pid file it found.
pub const KILL_REFUSED: i32 = 3;
/// Largest pid or status file read (a pid, `signal 64`, with room to spare).
const SMALL_FILE: u64 = 64;

/// Whether `token` can name files in [`EXEC_DIR`]: 1 to 64 ASCII letters, digits or `-` (no
/// `/`, no `.`: never a path of its own).
pub fn token_ok(token: &str) -> bool {
    (1..=64).contains(&token.len())
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

fn file(token: &str, suffix: &str) -> String {
    format!("{EXEC_DIR}/{token}.{suffix}")
}

/// `--container-wait`: waits until a signal ends this process (the container's stop or kill;
/// Docker's init forwards a stop's SIGTERM here, and SIGTERM's default action ends us).
pub(crate) fn wait() -> i32 {
    loop {
        // SAFETY: pause(2) takes nothing and only returns when a handled signal arrives.
        unsafe { libc::pause() };
    }
}

/// A parsed `--container-exec` command line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ExecArgs<'a> {
    pub token: &'a str,
    pub cwd: &'a str,
    pub null_stdin: bool,
    pub argv: &'a [String],
}

/// Parses what follows `--container-exec` (the fixed order the runtime writes).
pub(crate) fn parse_exec(args: &[String]) -> Option<ExecArgs<'_>> {
    let token = args.first()?;
    if !token_ok(token) || args.get(1)?.as_str() != "--cwd" {
        return None;
    }
    let cwd = args.get(2)?;
    let mut rest = &args[3..];
    let null_stdin = rest.first().is_some_and(|a| a == "--null-stdin");
    if null_stdin {
        rest = &rest[1..];
    }
    if rest.first()?.as_str() != "--" || rest.len() < 2 {
        return None;
    }
    Some(ExecArgs {
        token,
        cwd,
        null_stdin,
        argv: &rest[1..],
    })
}

/// `--container-exec`: runs the command in a group of its own and reports how it ended.
pub(crate) fn exec(args: &ExecArgs<'_>) -> i32 {
    // Everything the child needs is made before the fork: the child only makes syscalls.
    let Some(argv) = args
        .argv
        .iter()
        .map(|a| CString::new(a.as_bytes()).ok())
        .collect::<Option<Vec<CString>>>()
    else {
        eprintln!("smithers: an argument contains a NUL byte");
        return 126;
    };
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let cwd = sys::cstring(args.cwd);
    let null = args.null_stdin.then(|| sys::cstring("/dev/null"));
    let name = args.argv[0].clone();
    // SAFETY: the init is single-threaded (checked in `run`); the child runs only the
    // closure below and ends through `child_exit`.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        eprintln!("smithers: cannot start {name}: fork failed");
        return 126;
    }
    if pid == 0 {
        sys::child_exit(|| start_command(&ptrs, &cwd, null.as_ref(), &name));
    }
    // The group is made by both sides (whichever runs first), so it exists before the pid
    // file names it; the child's exec may already have made ours fail, harmlessly.
    // SAFETY: setpgid with plain integers.
    unsafe { libc::setpgid(pid, pid) };
    let pid_file = file(args.token, "pid");
    // Without a pid file (a tmpfs the step filled, say) the kill finds the group in /proc.
    let _ = write_small(&pid_file, &pid.to_string());
    // A kill that came before the pid file could be read left its marker: honoured here, so a
    // kill is never lost to that race (the kill writes its marker, then reads the pid file;
    // we write the pid file, then look for the marker).
    let kill_marker = file(args.token, "kill");
    if std::path::Path::new(&kill_marker).exists() {
        let _ = sys::kill(-pid, libc::SIGKILL);
    }
    let status = wait_then_kill_group(pid);
    let _ = std::fs::remove_file(&pid_file);
    // A command the runtime had killed (a timeout, a cancel) is reported as such, whatever its
    // status: no status file for it then, which nothing would read (and remove).
    let killed = std::fs::remove_file(&kill_marker).is_ok();
    let (code, status) = exit_code(status);
    if let (Some(status), false) = (status, killed) {
        let _ = write_small(&file(args.token, "status"), &status);
    }
    code
}

/// The child: its own group, the working directory, stdin, then the command (PATH searched).
fn start_command(
    argv: &[*const libc::c_char],
    cwd: &CString,
    null: Option<&CString>,
    name: &str,
) -> i32 {
    // SAFETY: setpgid with plain integers; signals back to their defaults is what a fresh
    // program expects (the wrapper changes none, but its parent may have ignored some).
    unsafe {
        libc::setpgid(0, 0);
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // SAFETY: `cwd` is a valid C string.
    if unsafe { libc::chdir(cwd.as_ptr()) } != 0 {
        let e = std::io::Error::last_os_error();
        eprintln!("smithers: cannot enter {}: {e}", cwd.to_string_lossy());
        return 126;
    }
    if let Some(null) = null {
        // SAFETY: a valid C string; the descriptor is made stdin and ours closed.
        let fd = unsafe { libc::open(null.as_ptr(), libc::O_RDONLY) };
        // SAFETY: dup2/close on the descriptor just opened.
        if fd < 0 || unsafe { libc::dup2(fd, 0) } < 0 {
            eprintln!("smithers: cannot open /dev/null as stdin");
            return 126;
        }
        if fd != 0 {
            // SAFETY: our own descriptor, closed once.
            unsafe { libc::close(fd) };
        }
    }
    // SAFETY: `argv` is a NULL-terminated array of valid C strings that outlive the call.
    unsafe { libc::execvp(argv[0], argv.as_ptr()) };
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOENT) => {
            eprintln!("smithers: {name}: not found");
            127
        }
        _ => {
            eprintln!("smithers: cannot run {name}: {e}");
            126
        }
    }
}

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    Exited(i32),
    Signaled(i32),
}

/// Waits for the command without reaping it, kills what is left of its group while the
/// zombie still holds the group's id (no other group can have it then), then reaps it.
fn wait_then_kill_group(pid: libc::pid_t) -> Ended {
    loop {
        // SAFETY: siginfo_t is plain old data; all-zero is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid out-pointer; waitid only writes it.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 || sys::errno() != libc::EINTR {
            break;
        }
    }
    let _ = sys::kill(-pid, libc::SIGKILL);
    match sys::wait_child(pid, 0) {
        Ok((_, status)) if libc::WIFSIGNALED(status) => Ended::Signaled(libc::WTERMSIG(status)),
        Ok((_, status)) => Ended::Exited(libc::WEXITSTATUS(status)),
        // Not our child any more (cannot happen): say it was killed.
        Err(_) => Ended::Signaled(libc::SIGKILL),
    }
}

/// The wrapper's exit code for `ended`, and the status file when the code alone is ambiguous.
pub(crate) fn exit_code(ended: Ended) -> (i32, Option<String>) {
    match ended {
        Ended::Exited(c) if (129..=192).contains(&c) => (c, Some(format!("exit {c}"))),
        Ended::Exited(c) => (c, None),
        Ended::Signaled(s) => (128 + s, Some(format!("signal {s}"))),
    }
}

/// Writes a small file anew, never through a symlink the step may have put there.
fn write_small(path: &str, text: &str) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    f.write_all(text.as_bytes())
}

/// Reads a small file the step may have written: no symlink followed, at most a few bytes.
fn read_small(path: &str) -> Option<String> {
    use std::io::Read;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    f.take(SMALL_FILE).read_to_string(&mut text).ok()?;
    Some(text)
}

/// `--container-kill TOKEN`: the exec's group killed. The pid file is the quick way to it;
/// when it is missing or refused (the step may have removed or forged it), the group is
/// looked for in `/proc`, so neither blocks the kill.
pub(crate) fn kill(token: &str) -> i32 {
    if !token_ok(token) {
        eprintln!("smithers: not an exec token");
        return 2;
    }
    // The marker first (see `exec`): a wrapper that has not written its pid file yet sees it.
    let _ = write_small(&file(token, "kill"), "");
    let stat = |p: i32| read_small(&format!("/proc/{p}/stat"));
    let cmdline = |p: i32| std::fs::read(format!("/proc/{p}/cmdline")).ok();
    let mut refused = false;
    let group = match read_small(&file(token, "pid")) {
        Some(text) => match checked_group(token, &text, &stat, &cmdline) {
            Ok(g) => Some(g),
            Err(why) => {
                eprintln!("smithers: the pid file of exec {token} is refused: {why}");
                refused = true;
                None
            }
        },
        None => None,
    };
    let group = group.or_else(|| find_group(token, stat, cmdline));
    let Some(group) = group else {
        // No wrapper yet (it will see the marker) or none any more (nothing to kill).
        return if refused { KILL_REFUSED } else { 0 };
    };
    // This process runs in the container's pid namespace: whatever `group` is, no process
    // outside the sandbox has a number here to be reached by it.
    match sys::kill(-group, libc::SIGKILL) {
        // Gone already: the command ended on its own meanwhile.
        Ok(()) => 0,
        Err(e) if e.errno == libc::ESRCH => 0,
        Err(e) => {
            eprintln!("smithers: {e}");
            1
        }
    }
}

/// The exec's group found in `/proc`: the first process that passes [`checked_group`].
fn find_group(
    token: &str,
    stat: impl Fn(i32) -> Option<String>,
    cmdline: impl Fn(i32) -> Option<Vec<u8>>,
) -> Option<i32> {
    let dir = std::fs::read_dir("/proc").ok()?;
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|p| checked_group(token, &p.to_string(), &stat, &cmdline).is_ok())
}

/// The group a pid file names, if it is an exec wrapper's command: a number over 1, a group
/// leader (`/proc/N/stat`'s pgrp is N), whose parent's command line is `--container-exec
/// TOKEN`. `stat` and `cmdline` read those files (parameters so the checks are testable).
pub(crate) fn checked_group(
    token: &str,
    pid_text: &str,
    stat: &impl Fn(i32) -> Option<String>,
    cmdline: &impl Fn(i32) -> Option<Vec<u8>>,
) -> Result<i32, String> {
    let pid: i32 = pid_text
        .trim()
        .parse()
        .map_err(|_| "not a process id".to_string())?;
    if pid <= 1 {
        return Err(format!("{pid} is not a command's group"));
    }
    let stat = stat(pid).ok_or("no such process")?;
    // The fields after the command name, which may itself hold spaces and parentheses.
    let after = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or("an unreadable stat")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let (ppid, pgrp) = match (fields.get(1), fields.get(2)) {
        (Some(a), Some(b)) => (a.parse::<i32>(), b.parse::<i32>()),
        _ => return Err("an unreadable stat".into()),
    };
    let (Ok(ppid), Ok(pgrp)) = (ppid, pgrp) else {
        return Err("an unreadable stat".into());
    };
    if pgrp != pid {
        return Err(format!("process {pid} leads no group"));
    }
    let wanted = format!("{EXEC}\0{token}\0");
    let parent = cmdline(ppid).unwrap_or_default();
    if !parent.windows(wanted.len()).any(|w| w == wanted.as_bytes()) {
        return Err(format!("process {pid} is not this exec's command"));
    }
    Ok(pid)
}

/// `--container-status TOKEN`: prints the status file (`exit N` or `signal N`), removes it.
pub(crate) fn status(token: &str) -> i32 {
    if !token_ok(token) {
        return 2;
    }
    let path = file(token, "status");
    let text = read_small(&path).unwrap_or_default();
    let _ = std::fs::remove_file(&path);
    print!("{}", text.trim());
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn exec_arguments_are_read_in_their_fixed_order() {
        let args = strings(&[
            "t-1",
            "--cwd",
            "/workspace",
            "--null-stdin",
            "--",
            "sh",
            "-c",
            "x",
        ]);
        let parsed = parse_exec(&args).unwrap();
        assert_eq!(parsed.token, "t-1");
        assert_eq!(parsed.cwd, "/workspace");
        assert!(parsed.null_stdin);
        assert_eq!(parsed.argv, &strings(&["sh", "-c", "x"])[..]);
        let args = strings(&["t", "--cwd", "/", "--", "--null-stdin"]);
        let parsed = parse_exec(&args).unwrap();
        assert!(!parsed.null_stdin);
        assert_eq!(parsed.argv, &strings(&["--null-stdin"])[..]);
        for bad in [
            &["../x", "--cwd", "/", "--", "true"][..],
            &["t", "--cwd", "/", "--"],
            &["t", "/", "--", "true"],
            &["t", "--cwd", "/", "true"],
            &[],
        ] {
            assert!(parse_exec(&strings(bad)).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn tokens_never_make_a_path() {
        assert!(token_ok("abc-0123"));
        for bad in ["", "a/b", "..", "a.b", "a b", &"a".repeat(65)] {
            assert!(!token_ok(bad), "{bad:?}");
        }
    }

    #[test]
    fn exit_and_signal_are_told_apart_only_where_the_code_is_ambiguous() {
        assert_eq!(exit_code(Ended::Exited(0)), (0, None));
        assert_eq!(exit_code(Ended::Exited(128)), (128, None));
        assert_eq!(exit_code(Ended::Exited(193)), (193, None));
        assert_eq!(
            exit_code(Ended::Exited(143)),
            (143, Some("exit 143".into()))
        );
        assert_eq!(
            exit_code(Ended::Signaled(15)),
            (143, Some("signal 15".into()))
        );
    }

    #[test]
    fn a_forged_pid_file_names_no_group() {
        let wrapper = |p: i32| (p == 10).then(|| b"/bin\0--container-exec\0tok\0--cwd\0".to_vec());
        let stat = |p: i32| match p {
            11 => Some("11 (sh) S 10 11 11 0".to_string()),
            12 => Some("12 (a) b) S 10 11 11 0".to_string()),
            13 => Some("13 (sh) S 1 13 13 0".to_string()),
            _ => None,
        };
        assert_eq!(checked_group("tok", "11\n", &stat, &wrapper), Ok(11));
        // Another exec's token, not a leader, a parent that is no wrapper, pid 1 or -1 (every
        // process), garbage, a process that is not there.
        assert!(checked_group("other", "11", &stat, &wrapper).is_err());
        assert!(checked_group("tok", "12", &stat, &wrapper).is_err());
        assert!(checked_group("tok", "13", &stat, &wrapper).is_err());
        for bad in ["1", "-1", "0", "", "x", "99999999999", "14"] {
            assert!(
                checked_group("tok", bad, &stat, &wrapper).is_err(),
                "{bad:?}"
            );
        }
    }
}
