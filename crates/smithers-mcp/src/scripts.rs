//! The commands a session's file tools run inside the sandbox (a shell and `cat`/`find`), so
//! a path means what it means to the session's own commands (relative to `/workspace`;
//! symlinks, mounts and read-only parts as they are there) and nothing outside the sandbox is
//! ever opened for it. The path is always `$1`, never part of the script.

/// The shell's exit code when the file is not there.
pub const MISSING: i32 = 66;
/// The shell's exit code when the path is a directory.
pub const DIRECTORY: i32 = 67;

/// Sends the file at `$1` to stdout.
pub fn read() -> String {
    format!(
        "[ -e \"$1\" ] || exit {MISSING}; [ -d \"$1\" ] && exit {DIRECTORY}; exec cat -- \"$1\""
    )
}

/// Writes stdin into the file at `$1`, its parent directories made. The parent is cut from
/// the path by the shell itself (`dirname` in `$(…)` would lose a name's trailing newlines).
pub fn write() -> String {
    format!(
        "[ -d \"$1\" ] && exit {DIRECTORY}; case \"$1\" in */*) d=\"${{1%/*}}\"; [ -n \"$d\" ] || d=/ ;; *) d=. ;; esac; mkdir -p -- \"$d\" && exec cat > \"$1\""
    )
}

/// Lists the directory `$1`: a NUL-ended record of type, size and name per entry.
pub fn list_dir() -> String {
    format!(
        "[ -e \"$1\" ] || exit {MISSING}; [ -d \"$1\" ] || exit {DIRECTORY}; cd -- \"$1\" && exec find . -mindepth 1 -maxdepth 1 -printf '%y\\t%s\\t%f\\0'"
    )
}

/// Why a file command failed, from how it ended (`exited` with `code`, else killed:
/// `ended` says how) and its stderr: the error's code and message, or `None` when it did
/// not. `what` names the path's expected kind for the message of [`DIRECTORY`] ("is a
/// directory" for a file's read or write, "is not a directory" for a listing).
pub fn failure(
    path: &str,
    exited: Option<i64>,
    ended: &str,
    stderr: &[u8],
    listing: bool,
) -> Option<(&'static str, String)> {
    let shown = smithers_terminal::line(path);
    match exited {
        Some(0) => None,
        Some(code) if code == i64::from(MISSING) => Some((
            "NOT_FOUND",
            format!("{shown} does not exist in the session"),
        )),
        Some(code) if code == i64::from(DIRECTORY) => Some((
            "INVALID_INPUT",
            match listing {
                true => format!("{shown} is not a directory"),
                false => format!("{shown} is a directory"),
            },
        )),
        _ => Some((
            "SANDBOX_EXECUTION_FAILED",
            format!(
                "{shown}: {} ({ended})",
                smithers_terminal::line(String::from_utf8_lossy(stderr).trim())
            ),
        )),
    }
}

/// The argv running `script` with `path` as its `$1`.
pub fn argv(script: &str, path: &str) -> Vec<String> {
    vec![
        "/bin/sh".into(),
        "-c".into(),
        script.into(),
        "sh".into(),
        path.into(),
    ]
}
