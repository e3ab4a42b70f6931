//! Lexical path confinement, as the lead's `smithers-paths` crate specifies it (spec §3).
//!
//! TEMPORARY private copy until `crates/smithers-paths` lands; the signatures are the same so
//! switching is a `use` change. Only what this crate needs is here.

use std::path::{Component, Path, PathBuf};

use smithers_errors::{CodedError, ErrorCode};

/// A path that is empty or leaves its root.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The input path is empty.
    #[error("Path must be a string")]
    Invalid,
    /// The input resolves outside the root.
    #[error("Path escapes sandbox root")]
    Escape {
        /// The root the path was resolved against.
        root: PathBuf,
        /// The input as given.
        input: String,
    },
    /// The path's nearest existing ancestor resolves, through symlinks, outside the root.
    #[error("Path escapes sandbox root (via symlink)")]
    EscapeViaSymlink {
        /// The path checked.
        path: PathBuf,
    },
}

impl CodedError for PathError {
    fn code(&self) -> ErrorCode {
        match self {
            PathError::Invalid => ErrorCode::ToolPathInvalid,
            PathError::Escape { .. } | PathError::EscapeViaSymlink { .. } => {
                ErrorCode::ToolPathEscape
            }
        }
    }
}

/// Removes `.` and resolves `..` without touching the file system (`..` at `/` stays `/`).
pub fn normalize_lexically(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Prefix(_) | Component::RootDir => out.push(c.as_os_str()),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() && !out.has_root() {
                    out.push("..");
                }
            }
            Component::Normal(n) => out.push(n),
        }
    }
    out
}

/// Component-wise: `p` is `root` or beneath it. Both must already be normalised.
pub fn is_within(root: &Path, p: &Path) -> bool {
    p.starts_with(root)
}

/// `root` made absolute (against the current directory) and normalised.
fn absolute_root(root: &Path) -> PathBuf {
    let abs = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
    normalize_lexically(&abs)
}

/// Resolves `input` against `root` lexically, like JS `resolveSandboxPath`.
pub fn resolve(root: &Path, input: &str) -> Result<PathBuf, PathError> {
    if input.is_empty() {
        return Err(PathError::Invalid);
    }
    let root = absolute_root(root);
    let candidate = Path::new(input);
    let joined = if candidate.is_absolute() {
        candidate.to_path_buf()
    } else {
        root.join(candidate)
    };
    let resolved = normalize_lexically(&joined);
    if !is_within(&root, &resolved) {
        return Err(PathError::Escape {
            root,
            input: input.to_string(),
        });
    }
    Ok(resolved)
}

/// Symlink-aware confinement: the real path of the nearest existing ancestor of `resolved`
/// must lie under the real path of `root`. "Does not exist"/"not a directory" walk up; other
/// errors propagate.
pub fn assert_within_root(root: &Path, resolved: &Path) -> std::io::Result<bool> {
    let real_root = std::fs::canonicalize(root)?;
    let mut current = resolved.to_path_buf();
    loop {
        match std::fs::canonicalize(&current) {
            Ok(real) => return Ok(real.starts_with(&real_root)),
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                if !current.pop() {
                    return Ok(false);
                }
            }
            Err(e) => return Err(e),
        }
    }
}
