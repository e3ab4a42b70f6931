//! smithers-patch: turns a sandbox's overlayfs upper layer into git patches, renders them for
//! review, and applies them to the host tree atomically with conflict detection.
//!
//! Pipeline: [`detect_changes`] (walks only the upper layer) → [`build_patch_files`] (one
//! git-format patch file per changed file, grouped beyond 1000) → bundle → [`parse_patch`] →
//! [`apply_patches`] (all-or-nothing, journaled, [`recover_apply`] after a crash).
//!
//! This crate depends on no runtime: it sees two directories and a root.
#![forbid(unsafe_code)]

mod apply;
mod binary;
mod bundle;
mod detect;
mod error;
mod gitignore;
mod merge;
mod model;
mod overlay;
mod parse;
mod patch;
mod review;

pub use apply::{
    apply_patch_texts, apply_patches, recover_apply, AppliedAction, AppliedFile, ApplyOptions,
    ApplyReport, RecoveryReport,
};
pub use bundle::{build_patch_files, DiffBundleEntry, PatchFile, PatchFiles, MAX_PATCH_FILES};
pub use detect::{
    detect_changes, ChangeKind, ChangeSet, DetectOptions, FileChange, FileVersion, IgnoreReason,
    IgnoredPath, SkippedEntry,
};
pub use error::{Conflict, PatchError};
pub use model::{git_blob_oid, is_binary_content, GitMode, ZERO_OID};
pub use parse::parse_patch;
pub use patch::{
    file_patches, render_patches, text_hunks, FilePatch, Hunk, HunkLine, LineKind, Operation,
    PatchBody, CONTEXT_LINES,
};
pub use review::{diff_stats, render_review, total_diff_lines, FileStat, ReviewOptions};
