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

/// Writes stdin into the file at `$1`, its parent directories made.
pub fn write() -> String {
    format!(
        "[ -d \"$1\" ] && exit {DIRECTORY}; d=$(dirname -- \"$1\") && mkdir -p -- \"$d\" && exec cat > \"$1\""
    )
}

/// Lists the directory `$1`: a NUL-ended record of type, size and name per entry.
pub const LIST_DIR: &str =
    "cd -- \"$1\" && find . -mindepth 1 -maxdepth 1 -printf '%y\\t%s\\t%f\\0'";

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
