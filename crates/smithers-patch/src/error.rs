//! The one error type of this crate and its mapping to the stable error codes.

use std::io;
use std::path::PathBuf;

use serde::Serialize;
use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode};

/// One file that could not be applied because the host changed it in a way the sandbox's
/// change cannot be merged with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Conflict {
    /// POSIX path relative to the apply root.
    pub path: String,
    /// Why it conflicts, e.g. `"hunk 2 does not apply"` or `"file was deleted on the host"`.
    pub reason: String,
}

/// Every failure of change detection, patch rendering/parsing and apply.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// Reading the lower or upper layer (or one of its entries) failed.
    #[error("reading overlay layer entry {path}: {source}")]
    ReadLayer {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The upper layer uses an overlayfs feature whose on-disk form this crate cannot turn
    /// into correct patches (redirect_dir, metacopy). Refused instead of guessing.
    #[error("unsupported overlayfs feature at {path}: xattr {xattr} is set (redirect_dir/metacopy layers cannot be turned into patches safely; mount with redirect_dir=off,metacopy=off)")]
    UnsupportedOverlayFeature { path: PathBuf, xattr: String },
    /// The changed content exceeds the configured memory/size bound.
    #[error("change set too large: {total_bytes} bytes of changed content exceeds the limit of {limit_bytes} bytes")]
    ChangeSetTooLarge {
        total_bytes: u64,
        limit_bytes: u64,
        /// The largest contributors (path, bytes), biggest first.
        largest: Vec<(String, u64)>,
    },
    /// A patch text is malformed or uses a form this crate does not accept.
    #[error("malformed patch at line {line}: {reason}")]
    ParsePatch { line: usize, reason: String },
    /// A path in a patch or journal leaves the apply root, goes through a symlink, or targets
    /// a protected directory (`.git/`, `.smithers/`).
    #[error("path escapes apply root: {path}: {reason}")]
    PathEscape { path: String, reason: String },
    /// One or more files conflict with host changes; nothing was written.
    #[error("{} file(s) conflict with changes on the host; nothing was written: {}", conflicts.len(), conflicts.iter().map(|c| c.path.as_str()).collect::<Vec<_>>().join(", "))]
    Conflicts { conflicts: Vec<Conflict> },
    /// A patch is internally inconsistent with the base it claims (its base hash matches but
    /// its hunks do not, or the result's hash differs from the recorded one).
    #[error("patch for {path} is inconsistent: {reason}")]
    InconsistentPatch { path: String, reason: String },
    /// An I/O operation of the apply failed; the apply was rolled back.
    #[error("apply failed at {path} during {operation}: {source}")]
    ApplyIo {
        path: String,
        operation: &'static str,
        #[source]
        source: io::Error,
    },
    /// Rolling back after a failure failed too; the journal is kept for `recover_apply`.
    #[error("apply failed ({primary}) and rollback failed at {path}: {source}; run recover_apply")]
    RollbackFailed {
        primary: String,
        path: String,
        #[source]
        source: io::Error,
    },
    /// The apply journal is unreadable or malformed.
    #[error("apply journal {path}: {reason}")]
    Journal { path: PathBuf, reason: String },
    /// Another apply holds the lock on this root.
    #[error("another apply is in progress on {root}")]
    Locked { root: PathBuf },
    /// A test hook simulated a crash after this many renames; the journal is left for
    /// `recover_apply`, exactly as a real crash would leave it.
    #[error("simulated crash after {renames} rename(s) (test hook)")]
    SimulatedCrash { renames: usize },
}

impl CodedError for PatchError {
    fn code(&self) -> ErrorCode {
        match self {
            PatchError::ReadLayer { .. } => ErrorCode::Internal,
            PatchError::UnsupportedOverlayFeature { .. } => ErrorCode::ToolPatchFailed,
            PatchError::ChangeSetTooLarge { .. } => ErrorCode::InvalidInput,
            PatchError::ParsePatch { .. } => ErrorCode::InvalidInput,
            PatchError::PathEscape { .. } => ErrorCode::ToolPathEscape,
            PatchError::Conflicts { .. } => ErrorCode::ToolPatchFailed,
            PatchError::InconsistentPatch { .. } => ErrorCode::InvalidInput,
            PatchError::ApplyIo { .. } => ErrorCode::ToolPatchFailed,
            PatchError::RollbackFailed { .. } => ErrorCode::ToolPatchFailed,
            PatchError::Journal { .. } => ErrorCode::ToolPatchFailed,
            PatchError::Locked { .. } => ErrorCode::ToolPatchFailed,
            PatchError::SimulatedCrash { .. } => ErrorCode::ToolPatchFailed,
        }
    }

    fn details(&self) -> Value {
        match self {
            PatchError::ReadLayer { path, .. } => json!({"path": path}),
            PatchError::UnsupportedOverlayFeature { path, xattr } => {
                json!({"path": path, "xattr": xattr})
            }
            PatchError::ChangeSetTooLarge {
                total_bytes,
                limit_bytes,
                largest,
            } => json!({
                "totalBytes": total_bytes,
                "limitBytes": limit_bytes,
                "largest": largest.iter().map(|(p, b)| json!({"path": p, "bytes": b})).collect::<Vec<_>>(),
            }),
            PatchError::ParsePatch { line, reason } => json!({"line": line, "reason": reason}),
            PatchError::PathEscape { path, reason } => json!({"path": path, "reason": reason}),
            PatchError::Conflicts { conflicts } => json!({
                "files": conflicts.iter().map(|c| c.path.clone()).collect::<Vec<_>>(),
                "conflicts": conflicts,
            }),
            PatchError::InconsistentPatch { path, reason } => {
                json!({"path": path, "reason": reason})
            }
            PatchError::ApplyIo {
                path, operation, ..
            } => json!({"path": path, "operation": operation}),
            PatchError::RollbackFailed { primary, path, .. } => {
                json!({"path": path, "primary": primary})
            }
            PatchError::Journal { path, reason } => json!({"path": path, "reason": reason}),
            PatchError::Locked { root } => json!({"root": root}),
            PatchError::SimulatedCrash { renames } => json!({"renames": renames}),
        }
    }
}
