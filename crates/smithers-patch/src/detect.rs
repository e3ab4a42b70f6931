//! Change detection: an overlayfs (lower, upper) pair → the list of file changes, walking only
//! the upper layer (plus the lower subtrees that the upper layer deletes or hides).
//!
//! What cannot be represented in a git patch is reported, never dropped silently:
//! empty directories (git tracks files only), special files (fifos, sockets, devices) and
//! symlinks whose target is not UTF-8 are listed in [`ChangeSet::skipped`]; ignored and
//! excluded paths in [`ChangeSet::ignored`]. Names that are not UTF-8 are changes like any
//! other, their path strings in git's quoted form ([`crate::path_from_bytes`]).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::Metadata;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::binary::{EncodedHunk, MAX_BINARY_BYTES};
use crate::error::PatchError;
use crate::gitignore::IgnoreRules;
use crate::limit::{leave_out_largest, DEFAULT_MAX_STREAMED_HUNK_BYTES, STREAM_THRESHOLD_BYTES};
use crate::manifest::CopyManifest;
use crate::model::{git_blob_oid, is_binary_content, path_from_bytes, path_to_bytes, GitMode};
use crate::overlay::{check_upper_entry, is_whiteout, lstat};

/// Options of [`detect_changes`].
#[derive(Debug, Clone)]
pub struct DetectOptions {
    /// Honour `.gitignore` files (default true).
    pub respect_gitignore: bool,
    /// Top-level names never turned into patches (default `.git`, `.smithers`). A `.git`
    /// entry at any depth is always excluded too.
    pub excluded_top_level: Vec<String>,
    /// Top-level names the sandbox never showed the step (default `.smithers`, the project's
    /// state: an overlay runtime whites it out in the upper layer before mounting, a copy does
    /// not hold it). That whiteout, or the name's absence from a copy, is the runtime's, not a
    /// change; an entry the step made under the name is its own, excluded and reported in
    /// [`ChangeSet::ignored`] like any other excluded change. Each should also be in
    /// `excluded_top_level`.
    pub hidden_top_level: Vec<String>,
    /// Bound on the changed content held in memory (old + new bytes of every change).
    /// Default 1 GiB. Past it the largest changes are left out, one by one, until the rest
    /// fits; each is named in [`ChangeSet::over_limit`] with its size and the limit. The rest
    /// of the change set is kept: one huge change never costs the step's other edits.
    pub max_content_bytes: u64,
    /// For [`detect_changes_by_compare`](crate::detect_changes_by_compare): what the copy
    /// held when it was complete ([`CopyManifest`]). A copy entry that
    /// still has the inode and ctime the copy gave it was not touched by the step, so a
    /// difference there is the host's edit made while the step ran, not a change; a project
    /// path the copy never had was made by the host. `None`: every difference counts (a host
    /// edit then shows as a change, which the stale-base check flags).
    pub copy_manifest: Option<std::sync::Arc<CopyManifest>>,
    /// Largest hunk (each direction) a file over [`STREAM_THRESHOLD_BYTES`] may become
    /// (default [`DEFAULT_MAX_STREAMED_HUNK_BYTES`], the spec's bundle size limit: a hunk over
    /// it can be in no bundle). Such a file is read in chunks, straight into its hunks; past
    /// the bound it is left out ([`ChangeSet::over_limit`]) having cost no more memory than
    /// this.
    pub max_streamed_hunk_bytes: u64,
}

impl Default for DetectOptions {
    fn default() -> Self {
        DetectOptions {
            respect_gitignore: true,
            excluded_top_level: vec![".git".to_string(), ".smithers".to_string()],
            hidden_top_level: vec![".smithers".to_string()],
            max_content_bytes: 1 << 30,
            copy_manifest: None,
            max_streamed_hunk_bytes: DEFAULT_MAX_STREAMED_HUNK_BYTES,
        }
    }
}

/// What happened to one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ChangeKind {
    /// New path.
    Added,
    /// Content changed (the mode may have changed too: see `old_mode`/`new_mode`).
    Modified,
    /// Path removed.
    Deleted,
    /// Only the executable bit changed.
    ModeChanged,
    /// Regular file ↔ symlink; rendered as a deletion plus an addition, like git.
    TypeChanged,
}

/// One side (before or after) of a change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileVersion {
    /// Git mode.
    pub mode: GitMode,
    /// Git blob id of the content (for a symlink: of its target).
    pub oid: String,
    /// Size in bytes of the content.
    pub size: u64,
    /// Symlink target (read with readlink, never followed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// Whether this side's content is binary (see [`is_binary_content`]).
    pub is_binary: bool,
    /// The content itself (for a symlink: the target's bytes). Kept for rendering so that the
    /// patch always matches the hashes above even if the live lower tree changes later.
    #[serde(skip)]
    pub content: Vec<u8>,
    /// For a file over [`STREAM_THRESHOLD_BYTES`] (or the other side of one): the hunk that
    /// makes this side, made while the files were read (so it matches `oid`): a `literal`, or
    /// a `delta` against the other side (the forward hunk on the new side, the reverse hunk
    /// on the old). `content` is then empty and `is_binary` true.
    #[serde(skip)]
    pub encoded: Option<EncodedHunk>,
}

/// One changed path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileChange {
    /// POSIX path relative to the project root; a name that is not UTF-8 (or begins with
    /// `"`) is held in git's quoted form (see [`crate::path_from_bytes`]).
    pub path: String,
    pub kind: ChangeKind,
    /// Before (absent for `Added`).
    pub old: Option<FileVersion>,
    /// After (absent for `Deleted`).
    pub new: Option<FileVersion>,
}

impl FileChange {
    /// Mode before.
    pub fn old_mode(&self) -> Option<GitMode> {
        self.old.as_ref().map(|v| v.mode)
    }
    /// Mode after.
    pub fn new_mode(&self) -> Option<GitMode> {
        self.new.as_ref().map(|v| v.mode)
    }
    /// Git blob id before (the content the change was made against).
    pub fn old_oid(&self) -> Option<&str> {
        self.old.as_ref().map(|v| v.oid.as_str())
    }
    /// Git blob id after.
    pub fn new_oid(&self) -> Option<&str> {
        self.new.as_ref().map(|v| v.oid.as_str())
    }
    /// Either side is binary.
    pub fn is_binary(&self) -> bool {
        self.old.as_ref().is_some_and(|v| v.is_binary)
            || self.new.as_ref().is_some_and(|v| v.is_binary)
    }
    /// Bytes held in memory for this change (contents, or the hunks of streamed files).
    pub fn content_bytes(&self) -> u64 {
        let held = |v: &FileVersion| {
            v.content.len() as u64 + v.encoded.as_ref().map_or(0, |e| e.lines.len() as u64)
        };
        self.old.as_ref().map_or(0, held) + self.new.as_ref().map_or(0, held)
    }
}

/// Why a path is not in the patches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum IgnoreReason {
    /// Matched by a `.gitignore` (or `.git/info/exclude`).
    Gitignore,
    /// Always excluded (`.git/`, `.smithers/`).
    Excluded,
}

/// A changed path (a directory ends with `/`) left out of the patches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IgnoredPath {
    pub path: String,
    pub reason: IgnoreReason,
}

/// An upper-layer entry that git patches cannot represent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SkippedEntry {
    pub path: String,
    pub reason: String,
}

/// The result of [`detect_changes`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeSet {
    /// Changes, sorted by path (byte order).
    pub changes: Vec<FileChange>,
    /// Changed paths left out because ignored or excluded.
    pub ignored: Vec<IgnoredPath>,
    /// Entries that cannot be represented in a patch (empty directories, special files,
    /// symlink targets that are not UTF-8).
    pub skipped: Vec<SkippedEntry>,
    /// Modified paths whose lower (host) file changed after the step copied it up: the lower
    /// layer is the live host tree, so such a patch's base is the host's newer version and
    /// applying it would silently undo the host's edit. Callers should show these to the
    /// reviewer or refuse. Found by comparing the lower file's ctime with the upper copy's
    /// birth time ([`detect_changes`]), or, for a full copy ([`detect_changes_by_compare`]),
    /// with the copy root's birth time, for every change with a lower side (deletions too).
    pub stale_base: Vec<String>,
    /// False when the upper filesystem reports no birth times, so `stale_base` could not be
    /// computed (it is then empty, not "all clear").
    pub stale_base_checked: bool,
    /// Changes left out because keeping them would pass a size limit
    /// ([`DetectOptions::max_content_bytes`] here; the bundle writer adds those over the
    /// bundle size limit), each with a reason naming the limit and the sizes. Unlike
    /// `skipped`, these are the step's real edits that a patch could carry: a caller should
    /// keep the step's workspace layer so that they are not lost.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub over_limit: Vec<SkippedEntry>,
    /// What a reviewer should know about how the changes were found (for example that the
    /// git index could not be read, so tracked files matching `.gitignore` were ignored).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl ChangeSet {
    /// Total bytes of content held by the changes.
    pub fn content_bytes(&self) -> u64 {
        self.changes.iter().map(FileChange::content_bytes).sum()
    }
}

/// Where one side of a candidate lives on disk.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    File { path: PathBuf, mode: GitMode },
    Symlink { path: PathBuf },
}

/// A path that may have changed: its lower (`old`) and post-step (`new`) entries.
#[derive(Debug, Default)]
pub(crate) struct Candidate {
    pub(crate) old: Option<Node>,
    pub(crate) new: Option<Node>,
}

/// The state of one detection walk (the overlay walk here, the full-tree comparison in
/// `compare.rs`): candidates found so far, and what was ignored or skipped.
pub(crate) struct Walker<'a> {
    /// The upper layer, or the copy.
    pub(crate) upper_root: &'a Path,
    pub(crate) opts: &'a DetectOptions,
    pub(crate) rules: IgnoreRules<'a>,
    pub(crate) cands: BTreeMap<String, Candidate>,
    pub(crate) out: ChangeSet,
}

impl Walker<'_> {
    /// Says in the change set's notes when the git index could not be read.
    pub(crate) fn note_index_problem(&mut self) {
        if let Some(p) = self.rules.index_problem() {
            let note = format!(
                "{p}: tracked files could not be told from untracked ones, so every path matching .gitignore was treated as ignored"
            );
            self.out.notes.push(note);
        }
    }
}

/// Whether an entry named `name` is never content at any depth: `.git` (a nested repository,
/// `cargo new`'s fresh repo, a submodule's gitfile: git's own state) and `.smithers` (what a
/// command run from that directory would take for its own state). ASCII case is ignored, as
/// apply refuses these names in any case (`.GIT` is `.git` on a case-insensitive filesystem):
/// a patch for one would make the whole accept fail.
pub(crate) fn is_protected_name(name: &str) -> bool {
    name.eq_ignore_ascii_case(".git") || name.eq_ignore_ascii_case(".smithers")
}

/// The path string of `rel/name`. A name that is not UTF-8 (or a path below one) is held in
/// git's quoted form ([`path_from_bytes`]), so such files travel in patches like any other.
pub(crate) fn join_rel(rel: &str, name: &OsStr) -> String {
    let plain = !rel.starts_with('"');
    match name.to_str() {
        Some(n) if plain && !(rel.is_empty() && n.starts_with('"')) => {
            if rel.is_empty() {
                n.to_string()
            } else {
                format!("{rel}/{n}")
            }
        }
        _ => {
            let mut bytes = path_to_bytes(rel).unwrap_or_else(|| rel.as_bytes().to_vec());
            if !bytes.is_empty() {
                bytes.push(b'/');
            }
            bytes.extend_from_slice(name.as_bytes());
            path_from_bytes(&bytes)
        }
    }
}

/// The file system path of path string `rel` below `root`.
pub(crate) fn rel_path(root: &Path, rel: &str) -> PathBuf {
    match path_to_bytes(rel) {
        Some(bytes) if rel.starts_with('"') => root.join(OsStr::from_bytes(&bytes)),
        _ => root.join(rel),
    }
}

/// The key `.gitignore` rules are matched with: the path itself, or for a name that is not
/// UTF-8 its lossy form (each invalid byte one U+FFFD). Patterns are UTF-8 text, so a
/// wildcard still matches such a name; a `.gitignore` inside a directory whose name is not
/// UTF-8 is not read (its files are then patched, which the review shows, not dropped).
pub(crate) fn rules_key(rel: &str) -> std::borrow::Cow<'_, str> {
    match path_to_bytes(rel) {
        Some(bytes) if rel.starts_with('"') => String::from_utf8_lossy(&bytes).into_owned().into(),
        _ => rel.into(),
    }
}

pub(crate) fn read_dir_sorted(
    dir: &Path,
) -> Result<Vec<(std::ffi::OsString, PathBuf)>, PatchError> {
    let rd = std::fs::read_dir(dir).map_err(|source| PatchError::ReadLayer {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut v = Vec::new();
    for e in rd {
        let e = e.map_err(|source| PatchError::ReadLayer {
            path: dir.to_path_buf(),
            source,
        })?;
        v.push((e.file_name(), e.path()));
    }
    v.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(v)
}

pub(crate) fn node_of(path: PathBuf, md: &Metadata) -> Option<Node> {
    if md.file_type().is_symlink() {
        Some(Node::Symlink { path })
    } else if md.is_file() {
        Some(Node::File {
            path,
            mode: GitMode::from_regular_permissions(md.mode()),
        })
    } else {
        None
    }
}

impl<'a> Walker<'a> {
    pub(crate) fn skip(&mut self, path: String, reason: &str) {
        self.out.skipped.push(SkippedEntry {
            path,
            reason: reason.to_string(),
        });
    }

    pub(crate) fn ignore(&mut self, path: String, reason: IgnoreReason) {
        self.out.ignored.push(IgnoredPath { path, reason });
    }

    /// The sorted entries of directory `rel` below the walked root (the upper layer, or the
    /// copy); a new directory (no lower one beneath) that is empty is noted as skipped.
    pub(crate) fn entries_of(
        &mut self,
        rel: &str,
        has_lower: bool,
    ) -> Result<Vec<(std::ffi::OsString, PathBuf)>, PatchError> {
        let dir = if rel.is_empty() {
            self.upper_root.to_path_buf()
        } else {
            rel_path(self.upper_root, rel)
        };
        let entries = read_dir_sorted(&dir)?;
        if entries.is_empty() && !has_lower && !rel.is_empty() {
            self.skip(
                format!("{rel}/"),
                "empty directory (git patches cannot represent directories)",
            );
        }
        Ok(entries)
    }

    /// Walks upper directory `rel`. `lower_dir` is the lower directory visible beneath it
    /// (`None` when the upper directory is opaque or new).
    fn walk_upper(&mut self, rel: &str, lower_dir: Option<PathBuf>) -> Result<(), PatchError> {
        let entries = self.entries_of(rel, lower_dir.is_some())?;
        for (name, upath) in entries {
            let child = join_rel(rel, &name);
            // `.git` and `.smithers` anywhere are never content: excluded like the top-level
            // ones (see `is_protected_name`).
            let utf8 = name.to_str().unwrap_or("");
            if (rel.is_empty() && self.opts.excluded_top_level.iter().any(|e| e == utf8))
                || is_protected_name(utf8)
            {
                let hidden = rel.is_empty() && self.opts.hidden_top_level.iter().any(|e| e == utf8);
                // The runtime's own whiteout over a hidden name: the step never saw the name,
                // so it deleted nothing there.
                if !(hidden && lstat(&upath)?.is_some_and(|md| is_whiteout(&md))) {
                    self.ignore(format!("{child}/"), IgnoreReason::Excluded);
                }
                continue;
            }
            let Some(umd) = lstat(&upath)? else { continue };
            let lower_child = match &lower_dir {
                Some(l) => {
                    let p = l.join(&name);
                    lstat(&p)?.map(|md| (p, md))
                }
                None => None,
            };
            if is_whiteout(&umd) {
                if let Some((lp, lmd)) = lower_child {
                    self.delete_lower(&child, lp, &lmd)?;
                }
                continue;
            }
            if umd.is_dir() {
                let opaque = check_upper_entry(&upath)?;
                if self.rules.is_dir_ignored(&rules_key(&child))? {
                    self.ignore(format!("{child}/"), IgnoreReason::Gitignore);
                    continue;
                }
                match lower_child {
                    Some((lp, lmd)) if lmd.is_dir() && !opaque => {
                        self.walk_upper(&child, Some(lp))?;
                    }
                    Some((lp, lmd)) => {
                        // Opaque directory, or a directory replacing a lower non-directory:
                        // everything below in lower is gone, upper holds the whole new tree.
                        self.delete_lower(&child, lp, &lmd)?;
                        self.walk_upper(&child, None)?;
                    }
                    None => self.walk_upper(&child, None)?,
                }
                continue;
            }
            let Some(new) = node_of(upath.clone(), &umd) else {
                self.skip(
                    child,
                    "special file (fifo, socket or device) is not representable in a git patch",
                );
                continue;
            };
            // Metacopy/redirect markers live on files too.
            check_upper_entry(&upath)?;
            if let Some((lp, lmd)) = &lower_child {
                if lmd.is_dir() {
                    // A file replacing a lower directory: the directory's files are deleted.
                    self.delete_lower(&child, lp.clone(), lmd)?;
                }
            }
            if self.rules.is_file_ignored(&rules_key(&child))? {
                self.ignore(child, IgnoreReason::Gitignore);
                continue;
            }
            let old = lower_child.and_then(|(lp, lmd)| node_of(lp, &lmd));
            let c = self.cands.entry(child).or_default();
            c.new = Some(new);
            if old.is_some() {
                c.old = old;
            }
        }
        Ok(())
    }

    /// Records the deletion of lower entry `rel` (recursively for a directory).
    pub(crate) fn delete_lower(
        &mut self,
        rel: &str,
        path: PathBuf,
        md: &Metadata,
    ) -> Result<(), PatchError> {
        if md.is_dir() {
            if self.rules.is_dir_ignored(&rules_key(rel))? {
                self.ignore(format!("{rel}/"), IgnoreReason::Gitignore);
                return Ok(());
            }
            for (name, p) in read_dir_sorted(&path)? {
                let child = join_rel(rel, &name);
                if is_protected_name(name.to_str().unwrap_or("")) {
                    self.ignore(format!("{child}/"), IgnoreReason::Excluded);
                    continue;
                }
                if let Some(cmd) = lstat(&p)? {
                    self.delete_lower(&child, p, &cmd)?;
                }
            }
            return Ok(());
        }
        let Some(old) = node_of(path, md) else {
            self.skip(
                rel.to_string(),
                "special file (fifo, socket or device) deleted; not representable in a git patch",
            );
            return Ok(());
        };
        if self.rules.is_file_ignored(&rules_key(rel))? {
            self.ignore(rel.to_string(), IgnoreReason::Gitignore);
            return Ok(());
        }
        self.cands.entry(rel.to_string()).or_default().old = Some(old);
        Ok(())
    }
}

fn read_err(path: &Path) -> impl Fn(std::io::Error) -> PatchError + '_ {
    move |source| PatchError::ReadLayer {
        path: path.to_path_buf(),
        source,
    }
}

/// Opens a regular file for reading, never through a symlink at the last component.
fn open_regular(path: &Path) -> Result<std::fs::File, PatchError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(read_err(path))
}

enum Loaded {
    Version(FileVersion),
    /// Not representable; the reason.
    Skip(&'static str),
    /// A real edit that a size limit keeps out of the patches; the reason.
    OverLimit(String),
}

fn load(node: &Node, opts: &DetectOptions) -> Result<Loaded, PatchError> {
    match node {
        Node::File { path, mode } => {
            let mut f = open_regular(path)?;
            let size = f.metadata().map_err(read_err(path))?.len();
            if size > STREAM_THRESHOLD_BYTES {
                return load_streamed(f, path, *mode, size, opts.max_streamed_hunk_bytes);
            }
            // The size bounds the read too: a file that grew since its fstat is read no
            // further than the threshold allows, and then taken as changed meanwhile.
            let mut content = Vec::with_capacity(size as usize);
            (&mut f)
                .take(STREAM_THRESHOLD_BYTES + 1)
                .read_to_end(&mut content)
                .map_err(read_err(path))?;
            if content.len() as u64 > STREAM_THRESHOLD_BYTES {
                return Ok(Loaded::OverLimit(changed_while_read(
                    size,
                    content.len() as u64,
                )));
            }
            Ok(Loaded::Version(FileVersion {
                mode: *mode,
                oid: git_blob_oid(&content),
                size: content.len() as u64,
                symlink_target: None,
                is_binary: is_binary_content(&content),
                content,
                encoded: None,
            }))
        }
        Node::Symlink { path } => {
            let target = std::fs::read_link(path).map_err(|source| PatchError::ReadLayer {
                path: path.clone(),
                source,
            })?;
            let Some(t) = target.to_str() else {
                return Ok(Loaded::Skip(
                    "symlink target is not UTF-8 (not representable in a text patch)",
                ));
            };
            let content = t.as_bytes().to_vec();
            Ok(Loaded::Version(FileVersion {
                mode: GitMode::Symlink,
                oid: git_blob_oid(&content),
                size: content.len() as u64,
                symlink_target: Some(t.to_string()),
                is_binary: false,
                content,
                encoded: None,
            }))
        }
    }
}

fn changed_while_read(size: u64, read: u64) -> String {
    format!(
        "changed while it was read ({size} bytes when looked at, {read} or more when read); left out, as a size limit would, so that the rest of the change is kept"
    )
}

/// Why a candidate is not in the patches.
enum LeftOut {
    /// Not representable.
    Skip(&'static str),
    /// A real edit a size limit keeps out (or that changed while it was read).
    OverLimit(String),
}

/// Loads a candidate's two sides: a regular file on both sides, one of them over
/// [`STREAM_THRESHOLD_BYTES`], by [`load_pair`] (deltas made reading both in place); anything
/// else side by side.
fn load_sides(
    c: &Candidate,
    opts: &DetectOptions,
) -> Result<Result<[Option<FileVersion>; 2], LeftOut>, PatchError> {
    if let (Some(Node::File { path: op, mode: om }), Some(Node::File { path: np, mode: nm })) =
        (&c.old, &c.new)
    {
        if let Some(loaded) = load_pair((op, *om), (np, *nm), opts)? {
            return Ok(loaded.map(|(o, n)| [Some(o), Some(n)]));
        }
    }
    let mut sides = [None, None];
    for (side, node) in sides.iter_mut().zip([&c.old, &c.new]) {
        let Some(node) = node else { continue };
        match load(node, opts)? {
            Loaded::Version(v) => *side = Some(v),
            Loaded::Skip(r) => return Ok(Err(LeftOut::Skip(r))),
            Loaded::OverLimit(reason) => return Ok(Err(LeftOut::OverLimit(reason))),
        }
    }
    Ok(Ok(sides))
}

/// What says a file changed: device, inode, size, mtime and ctime (seconds, nanoseconds).
type Stamp = (u64, u64, u64, i64, i64, i64, i64);

fn stamp(md: &Metadata) -> Stamp {
    (
        md.dev(),
        md.ino(),
        md.len(),
        md.mtime(),
        md.mtime_nsec(),
        md.ctime(),
        md.ctime_nsec(),
    )
}

/// The two sides of a pair, or why it is left out.
type PairLoaded = Result<(FileVersion, FileVersion), LeftOut>;

/// Both sides of a regular file one of which is over [`STREAM_THRESHOLD_BYTES`] (`None`: both
/// are small, loaded whole as usual), neither ever held: the old side is indexed (and hashed)
/// in one read, the new one read once into the forward hunk (a delta against the old side
/// read in place, or a literal when that deflates smaller: [`crate::binary::best_streamed`]),
/// and the same the other way for the reverse hunk. Each side keeps the hunk that makes it
/// (`encoded`: forward on the new side, reverse on the old). Memory: the index (≤ 32 MiB),
/// a few chunks, and the hunks (each at most `max_streamed_hunk_bytes`, else left out).
fn load_pair(
    (old, old_mode): (&Path, GitMode),
    (new, new_mode): (&Path, GitMode),
    opts: &DetectOptions,
) -> Result<Option<PairLoaded>, PatchError> {
    use crate::binary::{best_streamed, index_and_oid, Streamed};
    use crate::delta::FileSource;
    let (of, nf) = (open_regular(old)?, open_regular(new)?);
    let (om, nm) = (
        of.metadata().map_err(read_err(old))?,
        nf.metadata().map_err(read_err(new))?,
    );
    if om.len() <= STREAM_THRESHOLD_BYTES && nm.len() <= STREAM_THRESHOLD_BYTES {
        return Ok(None);
    }
    // A binary patch declares and makes at most MAX_BINARY_BYTES (what copy ops address):
    // apply would refuse a larger side, so it is left out, named, before it is read.
    let largest = om.len().max(nm.len());
    if largest > MAX_BINARY_BYTES {
        return Ok(Some(Err(LeftOut::OverLimit(format!(
            "over a size limit: a side of {largest} bytes is past the {} bytes a binary patch may carry (a delta's copies address 4 GiB); left out so that the rest of the change is kept",
            MAX_BINARY_BYTES
        )))));
    }
    let cap = opts.max_streamed_hunk_bytes;
    let (os, ns) = (
        FileSource {
            file: &of,
            len: om.len(),
        },
        FileSource {
            file: &nf,
            len: nm.len(),
        },
    );
    let left_out = |s: Streamed, size: u64| match s {
        Streamed::OverCap { read } => LeftOut::OverLimit(over_cap_reason(cap, read, size)),
        Streamed::SizeChanged { read } => LeftOut::OverLimit(changed_while_read(size, read)),
        Streamed::Done { .. } => LeftOut::OverLimit(changed_while_read(size, size)),
    };
    // The old side is the host's (live) file: a short read means it changed meanwhile.
    let shrunk = |len: u64| Ok(Some(Err(LeftOut::OverLimit(changed_while_read(len, 0)))));
    let (index, old_oid) = match index_and_oid(&os) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return shrunk(os.len),
        Err(e) => return Err(read_err(old)(e)),
    };
    let made = best_streamed(&os, &index, &ns, cap, None).map_err(read_err(new))?;
    let (new_oid, forward) = match made {
        Streamed::Done { oid, hunk } => (oid, hunk),
        s => return Ok(Some(Err(left_out(s, ns.len)))),
    };
    drop(index);
    let changed = new_oid != old_oid;
    let reverse = if changed {
        let index = match crate::delta::Index::build(&ns, &mut |_| {}) {
            Ok(index) => index,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return shrunk(ns.len),
            Err(e) => return Err(read_err(new)(e)),
        };
        // The old side's id is known from the read that indexed it; the stat check below says
        // whether it changed since.
        match best_streamed(&ns, &index, &os, cap, Some(&old_oid)).map_err(read_err(old))? {
            Streamed::Done { oid, hunk } if oid == old_oid => Some(hunk),
            s => return Ok(Some(Err(left_out(s, os.len)))),
        }
    } else {
        None
    };
    // Each hunk was made from its own reads: a file that changed in between (the host's
    // side is live) may have hunks that disagree with its id.
    for (f, md, path) in [(&of, &om, old), (&nf, &nm, new)] {
        let now = f.metadata().map_err(read_err(path))?;
        if stamp(&now) != stamp(md) {
            return Ok(Some(Err(LeftOut::OverLimit(changed_while_read(
                md.len(),
                now.len(),
            )))));
        }
    }
    let version = |mode, oid, size, encoded| FileVersion {
        mode,
        oid,
        size,
        symlink_target: None,
        is_binary: true,
        content: Vec::new(),
        encoded,
    };
    Ok(Some(Ok((
        version(old_mode, old_oid, os.len, reverse),
        version(new_mode, new_oid, ns.len, changed.then_some(forward)),
    ))))
}

fn over_cap_reason(cap: u64, read: u64, size: u64) -> String {
    format!(
        "over a size limit: its binary patch passed {cap} bytes (the most a patch may be; SANDBOX_MAX_BUNDLE_BYTES) after {read} of its {size} bytes were read; left out so that the rest of the change is kept"
    )
}

/// A file over [`STREAM_THRESHOLD_BYTES`]: hashed and turned into its literal hunk in one
/// read, holding no more than `cap` bytes.
fn load_streamed(
    file: std::fs::File,
    path: &Path,
    mode: GitMode,
    size: u64,
    cap: u64,
) -> Result<Loaded, PatchError> {
    use crate::binary::{encode_streamed, Streamed};
    Ok(
        match encode_streamed(file, size, cap).map_err(read_err(path))? {
            Streamed::Done { oid, hunk } => Loaded::Version(FileVersion {
                mode,
                oid,
                size,
                symlink_target: None,
                is_binary: true,
                content: Vec::new(),
                encoded: Some(hunk),
            }),
            Streamed::OverCap { read } => Loaded::OverLimit(over_cap_reason(cap, read, size)),
            Streamed::SizeChanged { read } => Loaded::OverLimit(changed_while_read(size, read)),
        },
    )
}

/// Whether the lower entry changed (ctime) after the upper entry was created (birth time).
/// `None` when the upper filesystem does not report birth times.
fn changed_after_copy_up(lower: &Path, upper: &Path) -> Option<bool> {
    use rustix::fs::{statx, AtFlags, StatxFlags, CWD};
    let u = statx(CWD, upper, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::BTIME).ok()?;
    if u.stx_mask & StatxFlags::BTIME.bits() == 0 {
        return None;
    }
    let l = statx(CWD, lower, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::CTIME).ok()?;
    // `>=`: file timestamps come from the coarse clock (one tick is several ms), so an edit in
    // the same tick as the copy-up cannot be ordered; flag it rather than miss it.
    Some((l.stx_ctime.tv_sec, l.stx_ctime.tv_nsec) >= (u.stx_btime.tv_sec, u.stx_btime.tv_nsec))
}

/// Whether `path`'s ctime is at or after `since` (unknown counts as changed: flag rather
/// than miss).
pub(crate) fn changed_since(path: &Path, since: (i64, u32)) -> bool {
    use rustix::fs::{statx, AtFlags, StatxFlags, CWD};
    match statx(CWD, path, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::CTIME) {
        Ok(l) => (l.stx_ctime.tv_sec, l.stx_ctime.tv_nsec) >= since,
        Err(_) => true,
    }
}

/// The birth time of `path`, when its filesystem reports one.
pub(crate) fn birth_time(path: &Path) -> Option<(i64, u32)> {
    use rustix::fs::{statx, AtFlags, StatxFlags, CWD};
    let st = statx(CWD, path, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::BTIME).ok()?;
    (st.stx_mask & StatxFlags::BTIME.bits() != 0)
        .then_some((st.stx_btime.tv_sec, st.stx_btime.tv_nsec))
}

fn node_path(n: &Node) -> &Path {
    match n {
        Node::File { path, .. } | Node::Symlink { path } => path,
    }
}

/// Turns an overlayfs (lower, upper) pair into the list of changes the step made.
///
/// Only `upper` is walked; `lower` is looked up path by path, and walked only below
/// directories the upper layer deletes or makes opaque (their files become deletions).
/// A copied-up file whose content and executable bit equal the lower file is not a change.
/// Symlinks are read with readlink and never followed. Both xattr flavours (`trusted.overlay.*`
/// as root, `user.overlay.*` with `-o userxattr`) are understood; redirect/metacopy layers are
/// refused with [`PatchError::UnsupportedOverlayFeature`].
///
/// Privilege: an upper layer mounted without `userxattr` keeps its opaque markers in
/// `trusted.overlay.*`, which only a process with CAP_SYS_ADMIN can read; call this from the
/// same (root) side that mounted the layer, or mount with `userxattr`.
pub fn detect_changes(
    lower: &Path,
    upper: &Path,
    opts: &DetectOptions,
) -> Result<ChangeSet, PatchError> {
    require_dirs(&[lower, upper], "layer root is not a directory")?;
    let mut w = Walker {
        upper_root: upper,
        opts,
        rules: IgnoreRules::new(lower, upper, opts.respect_gitignore),
        cands: BTreeMap::new(),
        out: ChangeSet::default(),
    };
    // The upper root itself may be opaque only in exotic setups; honour it anyway.
    let root_opaque = check_upper_entry(upper)?;
    if root_opaque {
        for (name, p) in read_dir_sorted(lower)? {
            let utf8 = name.to_str().unwrap_or("");
            if opts.excluded_top_level.iter().any(|e| e == utf8) {
                continue;
            }
            if let Some(md) = lstat(&p)? {
                w.delete_lower(&join_rel("", &name), p, &md)?;
            }
        }
        w.walk_upper("", None)?;
    } else {
        w.walk_upper("", Some(lower.to_path_buf()))?;
    }

    let cands = std::mem::take(&mut w.cands);
    w.note_index_problem();
    finish(cands, w.out, opts, StaleCheck::CopyUp)
}

/// Refuses a tree root that is not a directory (`what` says which kind of root).
pub(crate) fn require_dirs(roots: &[&Path], what: &'static str) -> Result<(), PatchError> {
    for root in roots {
        match lstat(root)? {
            Some(md) if md.is_dir() => {}
            _ => {
                return Err(PatchError::ReadLayer {
                    path: root.to_path_buf(),
                    source: std::io::Error::new(std::io::ErrorKind::NotFound, what),
                })
            }
        }
    }
    Ok(())
}

/// How [`finish`] decides that a change's base is stale (the host edited the lower file
/// after the step's side was made).
#[derive(Debug, Clone, Copy)]
pub(crate) enum StaleCheck {
    /// Overlay: the lower file's ctime against the upper copy's birth time (copy-up), for
    /// changes whose both sides exist.
    CopyUp,
    /// Full copy: the lower entry's ctime against one instant, when the copy was begun (the
    /// copy root's birth time; `None` when the filesystem reports none), for every change
    /// with a lower side (deletions too: the host may have edited a file the step deleted).
    Since(Option<(i64, u32)>),
}

/// Loads the candidates' contents, classifies them and fills `out` (sorted, bounded by
/// `opts.max_content_bytes`): the part of change detection both walks share.
pub(crate) fn finish(
    cands: BTreeMap<String, Candidate>,
    mut out: ChangeSet,
    opts: &DetectOptions,
    stale: StaleCheck,
) -> Result<ChangeSet, PatchError> {
    out.stale_base_checked = match stale {
        StaleCheck::CopyUp => true,
        StaleCheck::Since(since) => since.is_some(),
    };
    let too_large = over_content_limit(&cands, opts);
    let mut total: u64 = 0;
    for (path, c) in cands {
        if let Some(bytes) = too_large.get(&path) {
            out.over_limit.push(SkippedEntry {
                reason: content_limit_reason(*bytes, opts.max_content_bytes),
                path,
            });
            continue;
        }
        let [old, new] = match load_sides(&c, opts)? {
            Ok(sides) => sides,
            Err(LeftOut::Skip(r)) => {
                out.skipped.push(SkippedEntry {
                    path,
                    reason: r.to_string(),
                });
                continue;
            }
            Err(LeftOut::OverLimit(reason)) => {
                out.over_limit.push(SkippedEntry { path, reason });
                continue;
            }
        };
        let kind = match (&old, &new) {
            (None, None) => continue,
            (None, Some(_)) => ChangeKind::Added,
            (Some(_), None) => ChangeKind::Deleted,
            (Some(o), Some(n)) => {
                if o.mode.is_symlink() != n.mode.is_symlink() {
                    ChangeKind::TypeChanged
                } else if o.oid != n.oid {
                    ChangeKind::Modified
                } else if o.mode != n.mode {
                    ChangeKind::ModeChanged
                } else {
                    continue;
                }
            }
        };
        match (stale, &c.old, &c.new) {
            (StaleCheck::CopyUp, Some(o), Some(n)) => {
                match changed_after_copy_up(node_path(o), node_path(n)) {
                    Some(true) => out.stale_base.push(path.clone()),
                    Some(false) => {}
                    None => out.stale_base_checked = false,
                }
            }
            (StaleCheck::Since(Some(since)), Some(o), _) if changed_since(node_path(o), since) => {
                out.stale_base.push(path.clone());
            }
            _ => {}
        }
        let change = FileChange {
            path,
            kind,
            old,
            new,
        };
        let bytes = change.content_bytes();
        // The sizes were taken before the contents were read: a file that grew since (the
        // host's side is live) is left out here rather than passing the bound.
        if total.saturating_add(bytes) > opts.max_content_bytes {
            out.stale_base.retain(|p| p != &change.path);
            out.over_limit.push(SkippedEntry {
                reason: content_limit_reason(bytes, opts.max_content_bytes),
                path: change.path,
            });
            continue;
        }
        total += bytes;
        out.changes.push(change);
    }
    out.ignored.sort_by(|a, b| a.path.cmp(&b.path));
    out.skipped.sort_by(|a, b| a.path.cmp(&b.path));
    out.over_limit.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The candidates to leave out so that the changed content fits `limit`, with their sizes
/// (old + new bytes, from `lstat`, before anything is read): largest first, no more than
/// needed ([`crate::leave_out_largest`]).
fn over_content_limit(
    cands: &BTreeMap<String, Candidate>,
    opts: &DetectOptions,
) -> BTreeMap<String, u64> {
    let limit = opts.max_content_bytes;
    let sized: Vec<(&String, u64)> = cands
        .iter()
        .map(|(path, c)| {
            let side = |n: &Option<Node>| {
                n.as_ref()
                    .and_then(|n| std::fs::symlink_metadata(node_path(n)).ok())
                    .map_or(0, |m| m.len())
            };
            let (old, new) = (side(&c.old), side(&c.new));
            let pair = matches!(
                (&c.old, &c.new),
                (Some(Node::File { .. }), Some(Node::File { .. }))
            ) && old.max(new) > STREAM_THRESHOLD_BYTES;
            // A pair with a large side is never held: what it costs is its two hunks, each
            // at most the cap on a streamed hunk (a small edit costs far less).
            let bytes = if pair {
                let cap = opts.max_streamed_hunk_bytes;
                old.min(cap).saturating_add(new.min(cap))
            } else {
                old.saturating_add(new)
            };
            (path, bytes)
        })
        .collect();
    let sizes: Vec<u64> = sized.iter().map(|(_, n)| *n).collect();
    leave_out_largest(&sizes, limit)
        .into_iter()
        .map(|i| (sized[i].0.clone(), sized[i].1))
        .collect()
}

fn content_limit_reason(bytes: u64, limit: u64) -> String {
    format!(
        "over a size limit: its {bytes} bytes of content (before and after) do not fit the {limit}-byte bound on changed content (max_content_bytes); left out, largest first, so that the rest of the change is kept"
    )
}
