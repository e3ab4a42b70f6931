//! smithers-patch: turns a sandbox's overlayfs upper layer into git patches, renders them for
//! review, and applies them to the host tree atomically with conflict detection.
//!
//! Pipeline: [`detect_changes`] (walks only the upper layer; or [`detect_changes_by_compare`]
//! for a full copy of the project, when no overlay could be mounted) → [`build_patch_files`] (one
//! git-format patch file per changed file, grouped beyond 1000; past the changed-content
//! bound the largest changes are left out, named in [`ChangeSet::over_limit`], and the rest
//! kept: [`leave_out_largest`]) → bundle → [`parse_patch`] →
//! [`apply_patches`] / [`apply_patch_texts`] (all-or-nothing, journaled; [`recover_apply`]
//! after a crash). [`render_review`] and [`total_diff_lines`] serve the review gate; the
//! review is inert (`smithers_terminal`: names quoted as git quotes them, control characters
//! shown escaped) and [`review_findings`] names the files with control characters and the
//! files the host runs by itself (hooks, `core.hooksPath`, editor tasks, CI, `.envrc`).
//!
//! This crate depends on no runtime: it sees two directories (or a root) and nothing else.
//!
//! # Decisions worth knowing
//!
//! - **Only upper is walked.** Lower is looked up entry by entry, and walked only below a
//!   directory the upper layer deletes (whiteout) or replaces (opaque / type change), to list
//!   the deleted files. Copied-up files equal to lower (content and executable bit) are not
//!   changes. Both xattr flavours (`trusted.overlay.*`, `user.overlay.*` with `userxattr`)
//!   are understood; `redirect`, `metacopy` and xattr-whiteout markers are refused.
//! - **Full copies** ([`detect_changes_by_compare`], for a runtime that could not mount an
//!   overlay and copied the project instead) give the same [`ChangeSet`] for the same
//!   post-step tree: both trees are walked, entries compared by type, executable bit, size and
//!   then streamed content; only changed files are loaded. An ignored directory present on
//!   both sides is not walked. Stale bases are lower entries changed after the copy root's
//!   birth.
//! - **Live lower layer**: the host can edit a file the step has copied up; such paths are
//!   listed in [`ChangeSet::stale_base`] (lower ctime ≥ upper birth time), because their
//!   patch's base is the host's newer version and applying it would undo the host's edit;
//!   [`ApplyOptions::host_changed`] makes apply refuse them as conflicts (or, with
//!   [`ApplyOptions::conflict_markers`], write both versions between markers). For a full
//!   copy, [`DetectOptions::copy_manifest`] tells the host's own edits (a copy entry with the
//!   inode and ctime the copy gave it was not touched by the step) from the step's.
//! - **`.gitignore`** is read from the merged (post-step) view plus the lower
//!   `.git/info/exclude`, and applies to untracked paths only (the lower tree's git index is
//!   read: a tracked file matching a rule is still a change); ignored paths are reported in
//!   [`ChangeSet::ignored`]. `.git` and
//!   `.smithers` (anywhere, any ASCII case) are always excluded, and reported there too.
//! - **Not representable in git patches** (reported in [`ChangeSet::skipped`], never silently
//!   dropped): empty directories, fifos/sockets/devices, symlink targets that are not UTF-8.
//! - **Every name travels**: a name that is not UTF-8 (or begins with `"`) is held in path
//!   strings in git's C-quoted form ([`path_from_bytes`] / [`path_to_bytes`]: one string per
//!   byte sequence, always valid UTF-8), rendered and parsed as git quotes it
//!   (core.quotePath), and applied to exactly those bytes. `.gitignore` rules see such a name
//!   in its lossy form.
//! - **Binary** in transport = NUL in the first 8000 bytes (git's rule) *or* not valid UTF-8, so
//!   every patch is valid UTF-8 text (bundle patches and `diffBundle.diff` are strings). The
//!   review goes by git's rule alone (plus the host's top-level `.gitattributes`): a file
//!   carried binary only for not being UTF-8 is decoded and shown as text ([`PatchReview`]),
//!   with its `+`/`-` counts and its warnings, while accept applies the exact binary patch.
//!   Binary patches
//!   are git binary patches (zlib + base85) with both directions, as
//!   `git diff --binary --full-index` writes: each direction is a `delta` hunk (a git pack
//!   delta against the other side, from a linear-time encoder) when that deflates smaller,
//!   else a `literal`, so a small edit of a large file is a small patch. Parsed hunks are
//!   checked before anything is sized by them (declared sizes capped by [`MAX_BINARY_BYTES`]
//!   and by what the data can really produce; every delta op within its source and data);
//!   apply checks a delta's result against the `index` line's new id before writing.
//! - **Text rendering** is byte-identical to `git diff --full-index` for unambiguous diffs
//!   (headers, quoting of special names, tab after names with spaces, function-context
//!   headings, `\ No newline at end of file`); hunks come from `similar`'s Myers diff over
//!   lines split at `\n` only, as git splits them (a lone `\r` is part of its line), so every
//!   byte sequence round-trips.
//! - **Patch order**: deletions first, then the rest, each by path, because patch files are
//!   applied one after another and a directory may become a file (or the reverse).
//! - **Apply** checks every file against the blob id the change was made against; a changed
//!   text file is merged by relocating hunks (exact context, no fuzz, and only where the
//!   context fits at exactly one place: an ambiguous one is a conflict); any conflict writes
//!   nothing and names every conflicting file. Paths are confined with
//!   `smithers_paths::Beneath` (openat2 `RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS`), never into
//!   a `.git` or `.smithers` directory at any depth.
#![forbid(unsafe_code)]

mod apply;
mod attributes;
mod binary;
mod bundle;
mod compare;
mod delta;
mod detect;
mod error;
mod findings;
mod gitignore;
mod gitindex;
mod limit;
mod manifest;
mod merge;
mod model;
mod overlay;
mod parse;
mod patch;
mod review;
mod reviewtext;
mod staged;

pub use apply::{
    apply_patch_texts, apply_patches, recover_apply, AppliedAction, AppliedFile, ApplyOptions,
    ApplyReport, RecoveryReport, HOST_CHANGED,
};
pub use binary::{BinaryHunk, EncodedHunk, MAX_BINARY_BYTES};
pub use bundle::{
    build_patch_files, DiffBundleEntry, PatchFile, PatchFiles, MAX_BINARY_CONTENT_BYTES,
    MAX_PATCH_FILES,
};
pub use compare::detect_changes_by_compare;
pub use delta::DeltaSizes;
pub use detect::{
    detect_changes, ChangeKind, ChangeSet, DetectOptions, FileChange, FileVersion, IgnoreReason,
    IgnoredPath, SkippedEntry,
};
pub use error::{Conflict, PatchError};
pub use findings::{ReviewFindings, RiskyPath};
pub use limit::{leave_out_largest, DEFAULT_MAX_STREAMED_HUNK_BYTES, STREAM_THRESHOLD_BYTES};
pub use staged::staged_paths;

/// The paths a `.git/index` file's bytes list (SHA-256 ids when `sha256`): the reader change
/// detection uses, public for its fuzz target (`fuzz/fuzz_targets/git_index.rs`).
pub fn parse_git_index(bytes: &[u8], sha256: bool) -> Result<Vec<String>, String> {
    gitindex::parse_index(bytes, if sha256 { 32 } else { 20 })
}
pub use manifest::{CopyIdentity, CopyManifest, CopyManifestWriter, MAX_MANIFEST_BYTES};
pub use model::{
    git_blob_oid, git_sniffs_binary, is_binary_content, path_from_bytes, path_to_bytes,
    quote_git_path, quote_git_path_bytes, GitMode, ZERO_OID,
};
pub use parse::parse_patch;
pub use patch::{
    file_patches, render_patches, text_hunks, FilePatch, Hunk, HunkLine, LineKind, Operation,
    PatchBody, CONTEXT_LINES,
};
pub use review::{
    diff_stats, hooks_paths_in_config, host_hooks_dirs, render_findings, render_review,
    render_review_with, review_findings, runs_on_host, shown_path, total_diff_lines,
    tree_relative_hooks_dir, FileStat, ReviewOptions,
};
pub use reviewtext::{PatchReview, MAX_REVIEW_DECODED_BYTES};
