//! [`BundleError`]: every way writing or validating a bundle can fail.
//!
//! Messages are the JavaScript package's messages, word for word, where it has one (callers
//! and tests match on them); codes are the stable codes of spec §9; details carry the JS
//! detail fields plus `limit`/`max`/`actual` naming the limit that was hit.

use std::io;
use std::path::PathBuf;

use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode};

use crate::limits::{
    Limit, SANDBOX_BUNDLE_OUTPUT_MAX_ARRAY_LENGTH, SANDBOX_BUNDLE_OUTPUT_MAX_DEPTH,
    SANDBOX_BUNDLE_OUTPUT_MAX_STRING_LENGTH, SANDBOX_MAX_BUNDLE_BYTES, SANDBOX_MAX_PATCH_FILES,
    SANDBOX_MAX_README_BYTES,
};
use smithers_paths::PathError;

/// The error of this crate. One variant per failed check or operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BundleError {
    /// README.md is absent or not a regular file.
    #[error("Sandbox bundle is missing README.md")]
    ReadmeMissing {
        /// The bundle directory as given.
        bundle_path: PathBuf,
    },
    /// README.md is a symbolic link (never followed).
    #[error("Sandbox bundle README.md may not be a symlink.")]
    ReadmeSymlink {
        /// The bundle directory as given.
        bundle_path: PathBuf,
    },
    /// README.md is larger than [`SANDBOX_MAX_README_BYTES`] (on disk, or the one we would write).
    #[error("Sandbox bundle README.md exceeds {SANDBOX_MAX_README_BYTES} bytes")]
    ReadmeTooLarge {
        /// The bundle directory as given.
        bundle_path: PathBuf,
        /// The size found (or that would be written).
        actual: u64,
    },
    /// README.md holds only whitespace.
    #[error("Sandbox bundle README.md is empty.")]
    ReadmeEmpty,
    /// README.md is not JSON (or JSON we cannot represent, see the crate docs).
    #[error("Sandbox bundle README.md must contain valid JSON.")]
    ReadmeInvalidJson {
        /// The parser's explanation (line and column).
        reason: String,
    },
    /// README.md's JSON is not an object (`null`, a number, a string, a boolean).
    #[error("Sandbox bundle README.md JSON must be an object.")]
    ReadmeNotObject,
    /// The manifest's `status` is not one of the three.
    #[error("Sandbox bundle README.md must include status: finished | failed | cancelled.")]
    ReadmeStatus,
    /// A symbolic link was found while walking the bundle.
    #[error("Sandbox bundle may not contain symlinks.")]
    ContainsSymlink {
        /// Bundle-relative path of the link.
        path: String,
    },
    /// The bundle (or the estimate of the bundle to write) exceeds [`SANDBOX_MAX_BUNDLE_BYTES`].
    #[error("Sandbox bundle exceeds {SANDBOX_MAX_BUNDLE_BYTES} bytes")]
    BundleTooLarge {
        /// The size found, or the estimated size when writing.
        actual: u64,
        /// True when `actual` is the write-time estimate.
        estimated: bool,
        /// The largest contributors (path, bytes), largest first; at most 5. Empty when
        /// validating (we do not keep per-file sizes there).
        largest: Vec<(String, u64)>,
    },
    /// More than [`SANDBOX_MAX_PATCH_FILES`] patch files under `patches/`.
    #[error("Sandbox bundle has too many patch files (max {SANDBOX_MAX_PATCH_FILES}).")]
    TooManyPatchFiles {
        /// How many were found.
        actual: usize,
    },
    /// A patch path resolves inside the bundle but not strictly inside `patches/`.
    #[error("Sandbox patch path escapes bundle root: {patch_path}")]
    PatchPathEscape {
        /// The path as given.
        patch_path: String,
    },
    /// A path (patch, artifact) is empty or leaves the bundle directory.
    #[error("{source}")]
    Path {
        /// The path as given.
        path: String,
        /// The confinement failure.
        #[source]
        source: PathError,
    },
    /// `logs/stream.ndjson` is a symbolic link (re-checked after the walk: it can appear late).
    #[error("Sandbox bundle logs may not be a symlink.")]
    LogsSymlink {
        /// The bundle directory as given.
        bundle_path: PathBuf,
    },
    /// A file or directory of the bundle could not be read.
    #[error("Sandbox bundle could not be read at {}: {source}", path.display())]
    ReadBundle {
        /// The path that failed.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A string field (bundlePath, runId, patch.path, artifact.path) is too long.
    #[error("{field} exceeds the maximum length of {max} characters.")]
    FieldTooLong {
        /// The field, in JS naming (`runId`, `patch.path`).
        field: &'static str,
        /// The limit that was hit.
        limit: Limit,
        /// Its value (UTF-16 code units).
        max: usize,
        /// The length found (UTF-16 code units).
        actual: usize,
    },
    /// `patches` or `artifacts` has more entries than allowed.
    #[error("{field} exceeds the maximum size of {max}.")]
    TooManyEntries {
        /// `patches` or `artifacts`.
        field: &'static str,
        /// How many are allowed.
        max: usize,
        /// How many were given.
        actual: usize,
    },
    /// The outputs nest deeper than [`SANDBOX_BUNDLE_OUTPUT_MAX_DEPTH`].
    #[error("{field} exceeds the maximum JSON depth of {SANDBOX_BUNDLE_OUTPUT_MAX_DEPTH}.")]
    OutputTooDeep {
        /// `output`.
        field: &'static str,
        /// JS-style path of the first value found too deep (`output.a[0]`).
        path: String,
    },
    /// A string value in the outputs is longer than [`SANDBOX_BUNDLE_OUTPUT_MAX_STRING_LENGTH`].
    #[error("{field} contains a string exceeding {SANDBOX_BUNDLE_OUTPUT_MAX_STRING_LENGTH} characters (at {path}: {actual} characters).")]
    OutputStringTooLong {
        /// `output`.
        field: &'static str,
        /// JS-style path of the string.
        path: String,
        /// Its length in UTF-16 code units.
        actual: usize,
    },
    /// An array in the outputs is longer than [`SANDBOX_BUNDLE_OUTPUT_MAX_ARRAY_LENGTH`].
    #[error("{field} contains an array exceeding {SANDBOX_BUNDLE_OUTPUT_MAX_ARRAY_LENGTH} items.")]
    OutputArrayTooLong {
        /// `output`.
        field: &'static str,
        /// JS-style path of the array.
        path: String,
        /// Its length.
        actual: usize,
    },
    /// A write spec (the JSON form of the write parameters) is malformed.
    #[error("{message}")]
    SpecInvalid {
        /// The offending field (`runId`, `patch.content`, `status`, ...).
        field: String,
        /// What is wrong, JS-style (`runId must be a string.`).
        message: String,
    },
    /// Two entries target the same file, or one entry's path is a directory of another,
    /// or an entry targets the bundle directory itself or README.md.
    #[error("Sandbox bundle write target conflicts: {path} ({reason})")]
    WriteTargetConflict {
        /// The path as given.
        path: String,
        /// Why.
        reason: &'static str,
    },
    /// The stream log to copy exists but is not a regular file.
    #[error("Sandbox stream log is not a regular file: {}", path.display())]
    StreamLogNotFile {
        /// The path given as streamLogPath.
        path: PathBuf,
    },
    /// Writing the bundle failed (I/O on our side, after validation passed). README.md is not
    /// written, so the directory is not a complete bundle.
    #[error("Sandbox bundle could not be written at {}: {source}", path.display())]
    WriteBundle {
        /// The path that failed.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

impl CodedError for BundleError {
    fn code(&self) -> ErrorCode {
        match self {
            BundleError::ReadmeSymlink { .. }
            | BundleError::ContainsSymlink { .. }
            | BundleError::PatchPathEscape { .. }
            | BundleError::LogsSymlink { .. } => ErrorCode::ToolPathEscape,
            BundleError::Path { source, .. } => source.code(),
            BundleError::ReadmeMissing { .. }
            | BundleError::ReadmeTooLarge { .. }
            | BundleError::ReadmeEmpty
            | BundleError::ReadmeInvalidJson { .. }
            | BundleError::ReadmeNotObject
            | BundleError::ReadmeStatus
            | BundleError::BundleTooLarge { .. }
            | BundleError::TooManyPatchFiles { .. }
            | BundleError::ReadBundle { .. }
            | BundleError::FieldTooLong { .. }
            | BundleError::TooManyEntries { .. }
            | BundleError::OutputTooDeep { .. }
            | BundleError::OutputStringTooLong { .. }
            | BundleError::OutputArrayTooLong { .. }
            | BundleError::SpecInvalid { .. }
            | BundleError::WriteTargetConflict { .. }
            | BundleError::StreamLogNotFile { .. } => ErrorCode::InvalidInput,
            BundleError::WriteBundle { .. } => ErrorCode::Internal,
        }
    }

    fn details(&self) -> Value {
        fn limit(l: Limit, actual: impl Into<Value>) -> serde_json::Map<String, Value> {
            let mut m = serde_json::Map::new();
            m.insert("limit".into(), l.name().into());
            m.insert("max".into(), l.value().into());
            m.insert("actual".into(), actual.into());
            m
        }
        let display = |p: &PathBuf| p.to_string_lossy().into_owned();
        match self {
            BundleError::ReadmeMissing { bundle_path }
            | BundleError::ReadmeSymlink { bundle_path }
            | BundleError::LogsSymlink { bundle_path } => {
                json!({ "bundlePath": display(bundle_path) })
            }
            BundleError::ReadmeTooLarge {
                bundle_path,
                actual,
            } => {
                let mut m = limit(Limit::MaxReadmeBytes, *actual);
                m.insert("bundlePath".into(), display(bundle_path).into());
                m.insert("maxBytes".into(), SANDBOX_MAX_README_BYTES.into());
                Value::Object(m)
            }
            BundleError::ReadmeEmpty | BundleError::ReadmeNotObject | BundleError::ReadmeStatus => {
                Value::Null
            }
            BundleError::ReadmeInvalidJson { reason } => json!({ "reason": reason }),
            BundleError::ContainsSymlink { path } => json!({ "path": path }),
            BundleError::BundleTooLarge {
                actual,
                estimated,
                largest,
            } => {
                let mut m = limit(Limit::MaxBundleBytes, *actual);
                m.insert("maxBytes".into(), SANDBOX_MAX_BUNDLE_BYTES.into());
                if *estimated {
                    m.insert("estimatedBytes".into(), (*actual).into());
                    m.insert(
                        "largest".into(),
                        largest
                            .iter()
                            .map(|(p, b)| json!({"path": p, "bytes": b}))
                            .collect::<Vec<_>>()
                            .into(),
                    );
                }
                Value::Object(m)
            }
            BundleError::TooManyPatchFiles { actual } => {
                let mut m = limit(Limit::MaxPatchFiles, *actual);
                m.insert("patchCount".into(), (*actual).into());
                m.insert("maxPatches".into(), SANDBOX_MAX_PATCH_FILES.into());
                Value::Object(m)
            }
            BundleError::PatchPathEscape { patch_path } => json!({ "patchPath": patch_path }),
            BundleError::Path { path, source } => json!({
                "path": path,
                "cause": { "code": source.code().as_str(), "message": source.to_string() },
            }),
            BundleError::ReadBundle { path, source }
            | BundleError::WriteBundle { path, source } => {
                json!({ "path": display(path), "os": source.to_string() })
            }
            BundleError::FieldTooLong {
                field,
                limit: l,
                max,
                actual,
            } => {
                let mut m = limit(*l, *actual);
                m.insert("field".into(), (*field).into());
                m.insert("maxLength".into(), (*max).into());
                m.insert("actualLength".into(), (*actual).into());
                Value::Object(m)
            }
            BundleError::TooManyEntries { field, max, actual } => {
                let mut m = limit(Limit::MaxPatchFiles, *actual);
                m.insert("field".into(), (*field).into());
                m.insert("maxLength".into(), (*max).into());
                m.insert("actualLength".into(), (*actual).into());
                Value::Object(m)
            }
            BundleError::OutputTooDeep { field, path } => {
                let mut m = serde_json::Map::new();
                m.insert("limit".into(), Limit::OutputMaxDepth.name().into());
                m.insert("max".into(), SANDBOX_BUNDLE_OUTPUT_MAX_DEPTH.into());
                m.insert("field".into(), (*field).into());
                m.insert("maxDepth".into(), SANDBOX_BUNDLE_OUTPUT_MAX_DEPTH.into());
                m.insert("path".into(), path.clone().into());
                Value::Object(m)
            }
            BundleError::OutputStringTooLong {
                field,
                path,
                actual,
            } => {
                let mut m = limit(Limit::OutputMaxStringLength, *actual);
                m.insert("field".into(), (*field).into());
                m.insert("path".into(), path.clone().into());
                m.insert(
                    "maxLength".into(),
                    SANDBOX_BUNDLE_OUTPUT_MAX_STRING_LENGTH.into(),
                );
                m.insert("actualLength".into(), (*actual).into());
                Value::Object(m)
            }
            BundleError::OutputArrayTooLong {
                field,
                path,
                actual,
            } => {
                let mut m = limit(Limit::OutputMaxArrayLength, *actual);
                m.insert("field".into(), (*field).into());
                m.insert("path".into(), path.clone().into());
                m.insert(
                    "maxLength".into(),
                    SANDBOX_BUNDLE_OUTPUT_MAX_ARRAY_LENGTH.into(),
                );
                m.insert("actualLength".into(), (*actual).into());
                Value::Object(m)
            }
            BundleError::SpecInvalid { field, .. } => json!({ "field": field }),
            BundleError::WriteTargetConflict { path, reason } => {
                json!({ "path": path, "reason": reason })
            }
            BundleError::StreamLogNotFile { path } => json!({ "path": display(path) }),
        }
    }
}
