use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode};

/// Why an untrusted path was refused, or why an operation beneath a root failed.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// Empty, NUL-containing or otherwise unusable path. The message is the JavaScript one for
    /// the empty case ("Path must be a string").
    #[error("{message}")]
    Invalid { message: String, path: String },

    /// The path leaves its root lexically (`..`, an absolute path elsewhere).
    #[error("Path escapes sandbox root")]
    Escape { path: String, root: String },

    /// The path leaves its root, or would be redirected, through a symlink.
    #[error("Path escapes sandbox root (via symlink)")]
    EscapeViaSymlink { path: String, root: String },

    /// A filesystem operation beneath the root failed for another reason.
    #[error("{operation} {path}: {source}")]
    Io {
        operation: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl PathError {
    pub(crate) fn io(
        operation: &'static str,
        path: impl Into<String>,
        source: std::io::Error,
    ) -> Self {
        PathError::Io {
            operation,
            path: path.into(),
            source,
        }
    }

    /// The OS error number, for callers that treat e.g. ENOENT specially.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            PathError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// True when the failure is "no such file or directory".
    pub fn is_not_found(&self) -> bool {
        matches!(self, PathError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

impl CodedError for PathError {
    fn code(&self) -> ErrorCode {
        match self {
            PathError::Invalid { .. } => ErrorCode::ToolPathInvalid,
            PathError::Escape { .. } | PathError::EscapeViaSymlink { .. } => {
                ErrorCode::ToolPathEscape
            }
            PathError::Io { .. } => ErrorCode::Internal,
        }
    }

    fn details(&self) -> Value {
        match self {
            PathError::Invalid { path, .. } => json!({ "path": path }),
            PathError::Escape { path, root } => json!({ "path": path, "root": root }),
            PathError::EscapeViaSymlink { path, root } => {
                json!({ "path": path, "root": root, "viaSymlink": true })
            }
            PathError::Io {
                operation,
                path,
                source,
            } => json!({ "operation": operation, "path": path, "osError": source.raw_os_error() }),
        }
    }
}
