//! Patch files for a result bundle: deterministic, safe names; one file per changed file, or
//! grouped when there are more than [`MAX_PATCH_FILES`] changes (never truncated).

use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::detect::{ChangeKind, ChangeSet, FileChange};
use crate::patch::{file_patches, render_patches, Operation};
use crate::review::total_diff_lines;

/// SANDBOX_MAX_PATCH_FILES of the spec.
pub const MAX_PATCH_FILES: usize = 1000;

/// Longest slug taken from a changed path into a patch file name; keeps names far below the
/// 1024-character bundle path limit whatever the changed path's length.
const MAX_SLUG_CHARS: usize = 120;

/// Largest new binary content carried base64 in a `diffBundle` entry's `binaryContent`.
/// Above it the entry has none (the patch file and the entry's `diff` still carry the change,
/// as a git binary patch) and [`PatchFiles::binary_content_left_out`] names it: README.md,
/// where the `diffBundle` lives, must stay within its 5 MiB limit, and a whole large file as
/// base64 would take it over (then the whole `diffBundle` would be dropped).
pub const MAX_BINARY_CONTENT_BYTES: u64 = 1 << 20;

/// One patch file of the bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PatchFile {
    /// Bundle-relative POSIX path, e.g. `patches/0001-src_main.rs.patch`.
    pub bundle_path: String,
    /// Git-format patch text (one or more `diff --git` sections).
    pub content: String,
    /// The changed paths this file covers.
    pub paths: Vec<String>,
}

/// One entry of the manifest's `diffBundle.patches` (spec section 2, Smithers 0.32).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiffBundleEntry {
    pub path: String,
    /// add / modify / delete (a type change is `modify`).
    pub operation: Operation,
    /// The git-format diff of this path.
    pub diff: String,
    /// Base64 of the new content, for binary files that are added or modified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binary_content: Option<String>,
}

/// The rendered patches of a change set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PatchFiles {
    /// At most [`MAX_PATCH_FILES`], sorted by name.
    pub files: Vec<PatchFile>,
    /// One entry per changed path.
    pub diff_bundle: Vec<DiffBundleEntry>,
    /// Binary files whose `binaryContent` was left out of their `diffBundle` entry (path,
    /// new size in bytes), being over [`MAX_BINARY_CONTENT_BYTES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub binary_content_left_out: Vec<(String, u64)>,
}

impl PatchFiles {
    /// Bytes of all patch files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.content.len() as u64).sum()
    }

    /// The `n` largest patch files (bundle path, bytes), biggest first: what an error about the
    /// bundle size limit should name.
    pub fn largest(&self, n: usize) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .files
            .iter()
            .map(|f| (f.bundle_path.clone(), f.content.len() as u64))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }

    /// `totalDiffLines` over all patch files.
    pub fn total_diff_lines(&self) -> usize {
        self.files
            .iter()
            .map(|f| total_diff_lines(&f.content))
            .sum()
    }
}

/// A file-name-safe slug of a path: `[A-Za-z0-9._-]` kept, everything else (including `/`
/// and non-ASCII) becomes `_`; bounded length.
fn slug(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(MAX_SLUG_CHARS)
        .collect();
    if out.is_empty() {
        out.push('_');
    }
    out
}

/// Deletions first, then everything else (each in path order). Patch files are applied one
/// after another (`git apply a.patch b.patch` applies each file separately), so a directory
/// that becomes a file (or the reverse) needs the old entries gone before the new one comes.
fn apply_order(changes: &[FileChange]) -> Vec<&FileChange> {
    let mut v: Vec<&FileChange> = changes.iter().collect();
    v.sort_by(|a, b| {
        let pa = a.kind != ChangeKind::Deleted;
        let pb = b.kind != ChangeKind::Deleted;
        pa.cmp(&pb).then_with(|| a.path.cmp(&b.path))
    });
    v
}

fn group_changes(changes: &[FileChange]) -> Vec<(String, Vec<&FileChange>)> {
    let ordered = apply_order(changes);
    if ordered.len() <= MAX_PATCH_FILES {
        return ordered
            .into_iter()
            .map(|c| (c.path.clone(), vec![c]))
            .collect();
    }
    // By top-level name first: a root file `x` and the directory `x/` share a group, so a
    // file↔directory replacement lands in one patch file (git applies deletions first
    // within a file)...
    let mut groups: Vec<(String, Vec<&FileChange>)> = Vec::new();
    let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for c in &ordered {
        let key = c.path.split('/').next().unwrap_or("");
        match index.get(key) {
            Some(&i) => groups[i].1.push(c),
            None => {
                index.insert(key, groups.len());
                groups.push((key.to_string(), vec![c]));
            }
        }
    }
    if groups.len() <= MAX_PATCH_FILES {
        return groups;
    }
    // ...else contiguous runs of the deletion-first order.
    let per = ordered.len().div_ceil(MAX_PATCH_FILES);
    ordered
        .chunks(per)
        .map(|chunk| (chunk[0].path.clone(), chunk.to_vec()))
        .collect()
}

/// Renders a change set into bundle patch files and DiffBundle entries.
pub fn build_patch_files(set: &ChangeSet) -> PatchFiles {
    let mut out = PatchFiles::default();
    for (i, (label, members)) in group_changes(&set.changes).into_iter().enumerate() {
        let mut content = String::new();
        let mut paths = Vec::new();
        for c in members {
            let fps = file_patches(c);
            let diff = render_patches(&fps);
            content.push_str(&diff);
            paths.push(c.path.clone());
            let operation = match c.kind {
                ChangeKind::Added => Operation::Add,
                ChangeKind::Deleted => Operation::Delete,
                _ => Operation::Modify,
            };
            let binary = c.new.as_ref().filter(|v| v.is_binary);
            let binary_content = match binary {
                // A streamed file (never held) is over the bound by construction.
                Some(v) if v.size > MAX_BINARY_CONTENT_BYTES || v.encoded.is_some() => {
                    out.binary_content_left_out.push((c.path.clone(), v.size));
                    None
                }
                Some(v) => Some(base64::engine::general_purpose::STANDARD.encode(&v.content)),
                None => None,
            };
            out.diff_bundle.push(DiffBundleEntry {
                path: c.path.clone(),
                operation,
                diff,
                binary_content,
            });
        }
        out.files.push(PatchFile {
            bundle_path: format!("patches/{:04}-{}.patch", i + 1, slug(&label)),
            content,
            paths,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::FileVersion;
    use crate::model::{git_blob_oid, GitMode};

    fn added(path: &str) -> FileChange {
        let content = format!("{path}\n").into_bytes();
        FileChange {
            path: path.into(),
            kind: ChangeKind::Added,
            old: None,
            new: Some(FileVersion {
                mode: GitMode::File,
                oid: git_blob_oid(&content),
                size: content.len() as u64,
                symlink_target: None,
                is_binary: false,
                content,
                encoded: None,
            }),
        }
    }

    #[test]
    fn names_are_safe_and_deterministic() {
        assert_eq!(slug("src/main.rs"), "src_main.rs");
        assert_eq!(slug("../x y/é"), ".._x_y__");
        assert_eq!(slug(&"a".repeat(5000)).len(), MAX_SLUG_CHARS);
        let set = ChangeSet {
            changes: vec![added("src/main.rs"), added("a b/ü.txt")],
            ..Default::default()
        };
        let p = build_patch_files(&set);
        assert_eq!(p.files[0].bundle_path, "patches/0001-a_b__.txt.patch");
        assert_eq!(p.files[1].bundle_path, "patches/0002-src_main.rs.patch");
        assert_eq!(p, build_patch_files(&set));
    }

    fn binary_added(path: &str, len: usize) -> FileChange {
        let content = vec![0u8; len];
        FileChange {
            path: path.into(),
            kind: ChangeKind::Added,
            old: None,
            new: Some(FileVersion {
                mode: GitMode::File,
                oid: git_blob_oid(&content),
                size: len as u64,
                symlink_target: None,
                is_binary: true,
                content,
                encoded: None,
            }),
        }
    }

    /// binaryContent (the whole new file as base64, in README.md) is carried up to the bound
    /// and left out, named, above it; the patch file carries the change either way.
    #[test]
    fn binary_content_is_bounded() {
        let at = MAX_BINARY_CONTENT_BYTES as usize;
        let set = ChangeSet {
            changes: vec![binary_added("at.bin", at), binary_added("over.bin", at + 1)],
            ..Default::default()
        };
        let p = build_patch_files(&set);
        assert_eq!(p.diff_bundle.len(), 2);
        let at_entry = &p.diff_bundle[0];
        assert_eq!(at_entry.path, "at.bin");
        let b64 = at_entry.binary_content.as_deref().expect("carried");
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap()
                .len(),
            at
        );
        let over = &p.diff_bundle[1];
        assert_eq!(over.path, "over.bin");
        assert!(over.binary_content.is_none());
        assert!(
            over.diff.contains("GIT binary patch"),
            "{}",
            &over.diff[..200]
        );
        assert_eq!(
            p.binary_content_left_out,
            [("over.bin".to_string(), at as u64 + 1)]
        );
        assert_eq!(p.files.len(), 2);
    }

    #[test]
    fn grouping_keeps_every_change() {
        let mut changes: Vec<FileChange> = (0..1500)
            .map(|i| added(&format!("d{}/f{i:05}", i % 7)))
            .collect();
        changes.sort_by(|a, b| a.path.cmp(&b.path));
        let set = ChangeSet {
            changes,
            ..Default::default()
        };
        let p = build_patch_files(&set);
        assert_eq!(p.files.len(), 7);
        assert_eq!(p.files[0].bundle_path, "patches/0001-d0.patch");
        assert_eq!(p.files.iter().map(|f| f.paths.len()).sum::<usize>(), 1500);
        assert_eq!(p.diff_bundle.len(), 1500);
        // More top-level groups than the limit: contiguous chunks.
        let mut changes: Vec<FileChange> =
            (0..2500).map(|i| added(&format!("f{i:05}/x"))).collect();
        changes.sort_by(|a, b| a.path.cmp(&b.path));
        let set = ChangeSet {
            changes,
            ..Default::default()
        };
        let p = build_patch_files(&set);
        assert!(p.files.len() <= MAX_PATCH_FILES);
        assert_eq!(p.files.iter().map(|f| f.paths.len()).sum::<usize>(), 2500);
        assert_eq!(p.total_diff_lines(), 2500);
    }
}
