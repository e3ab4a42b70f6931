//! Path strings of an apply: the file system path a patch path names, validation, errors.

use std::borrow::Cow;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use smithers_paths::PathError;

use crate::error::PatchError;
use crate::model::{path_from_bytes, path_to_bytes};

pub(super) const SMITHERS_DIR: &str = ".smithers";

/// The file system path a path string names: itself, or for a name held in git's quoted form
/// (not UTF-8, see [`path_from_bytes`]) the raw bytes it stands for. Every patch path is
/// checked by [`validate_path`] (which refuses a malformed quoted form) before it gets here.
pub(super) fn p(s: &str) -> Cow<'_, Path> {
    match raw(s) {
        Cow::Borrowed(_) => Cow::Borrowed(Path::new(s)),
        Cow::Owned(bytes) => Cow::Owned(PathBuf::from(OsString::from_vec(bytes))),
    }
}

/// The raw bytes a path string names (see [`p`]).
pub(super) fn raw(s: &str) -> Cow<'_, [u8]> {
    if s.starts_with('"') {
        if let Some(bytes) = path_to_bytes(s) {
            return Cow::Owned(bytes);
        }
    }
    Cow::Borrowed(s.as_bytes())
}

/// The path string of `dir/name` (`name` raw bytes).
pub(super) fn join_path(dir: &str, name: &[u8]) -> String {
    let mut bytes = raw(dir).into_owned();
    if !bytes.is_empty() {
        bytes.push(b'/');
    }
    bytes.extend_from_slice(name);
    path_from_bytes(&bytes)
}

pub(super) fn path_error(path: &str, operation: &'static str, e: PathError) -> PatchError {
    match e {
        PathError::Io { source, .. } => PatchError::ApplyIo {
            path: path.to_string(),
            operation,
            source,
        },
        other => PatchError::PathEscape {
            path: path.to_string(),
            reason: other.to_string(),
        },
    }
}

pub(super) fn io_error(path: &str, operation: &'static str, source: std::io::Error) -> PatchError {
    PatchError::ApplyIo {
        path: path.to_string(),
        operation,
        source,
    }
}

/// (parent path string, last name's raw bytes).
pub(super) fn split_parent(rel: &str) -> (String, OsString) {
    let bytes = raw(rel);
    let (dir, name) = match bytes.iter().rposition(|&c| c == b'/') {
        Some(i) => (path_from_bytes(&bytes[..i]), &bytes[i + 1..]),
        None => (String::new(), &bytes[..]),
    };
    (dir, OsString::from_vec(name.to_vec()))
}

/// Refuses anything that is not a plain downward POSIX path, and the protected directories.
/// Checked on the raw bytes the path string names (a quoted form, for a name that is not
/// UTF-8, must be exactly one well-formed token).
pub(super) fn validate_path(path: &str) -> Result<(), PatchError> {
    let bad = |reason: &str| {
        Err(PatchError::PathEscape {
            path: path.to_string(),
            reason: reason.to_string(),
        })
    };
    let Some(bytes) = path_to_bytes(path) else {
        return bad("malformed quoted path");
    };
    if bytes.is_empty() {
        return bad("empty path");
    }
    if bytes.contains(&0) {
        return bad("path contains a NUL byte");
    }
    if bytes.starts_with(b"/") {
        return bad("absolute path");
    }
    for c in bytes.split(|&b| b == b'/') {
        match c {
            b"" => return bad("empty path component"),
            b"." | b".." => return bad("'.' or '..' component"),
            // Case-insensitive like git's verify_path: `.GIT` is `.git` on some filesystems.
            c if c.eq_ignore_ascii_case(b".git") => return bad("path inside a .git directory"),
            // At any depth: a `.smithers` below the top is what a command started in that
            // subdirectory would take for its own state (database, bundles, journals).
            c if c.eq_ignore_ascii_case(SMITHERS_DIR.as_bytes()) => {
                return bad("path inside a .smithers directory")
            }
            _ => {}
        }
    }
    Ok(())
}

/// The path strings of `path`'s parent directories, top-down.
pub(super) fn ancestors(path: &str) -> Vec<String> {
    let bytes = raw(path);
    bytes
        .iter()
        .enumerate()
        .filter(|(_, &c)| c == b'/')
        .map(|(i, _)| path_from_bytes(&bytes[..i]))
        .collect()
}
