//! Atomic, conflict-checked apply of file patches to a host tree, with a crash-safe journal.
//!
//! 1. **Check, write nothing.** Every path is validated (plain downward path, nothing in a
//!    `.git` or `.smithers` directory at any depth), every host file is read through
//!    [`smithers_paths::Beneath`] (openat2 `RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS`, or an
//!    `O_NOFOLLOW` walk: a symlinked parent is never traversed) and compared with the blob id
//!    the change was made against.
//!    A text file the host changed meanwhile is merged (hunks relocated, see `merge.rs`);
//!    anything that cannot be merged is a conflict. Any conflict: nothing is written and
//!    every conflicting file is reported.
//! 2. **Stage.** A journal `<root>/.smithers/apply/<id>/journal.json` lists every operation;
//!    new contents and backups of replaced/deleted files are written and fsynced next to it.
//! 3. **Commit.** Deletions, then renames of staged files into place (atomic replacement), then
//!    directory fsyncs, then the journal is marked committed.
//! 4. **Recover.** [`recover_apply`] rolls an uncommitted journal back (restoring backups,
//!    removing what was added) and finishes a committed one. [`apply_patches`] runs it first.
//!
//! Staged files live under `<root>/.smithers/`, so they are renamed into place within one
//! filesystem; a project subdirectory that is a separate mount fails at commit (EXDEV) and
//! the whole apply is rolled back.
//!
//! Memory: a host file over [`crate::STREAM_THRESHOLD_BYTES`] is never held, nor is what a
//! binary patch makes of it (see `content.rs`): it is hashed where it lies, the patch's result
//! is made once into a hash to check it and once into its staged file, and a backup is a hard
//! link (or a copy streamed from the file). What an apply holds is its small files and the
//! patches themselves. A text patch on a host file that large reads the file whole.

mod content;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use smithers_paths::{Beneath, EntryKind, PathError};

use self::content::{Content, WriteError};
use crate::error::{Conflict, PatchError};
use crate::merge::apply_hunks;
use crate::model::{git_blob_oid, path_from_bytes, path_to_bytes, GitMode};
use crate::parse::parse_patch;
use crate::patch::{FilePatch, PatchBody};

const SMITHERS_DIR: &str = ".smithers";
const APPLY_DIR: &str = ".smithers/apply";
const LOCK_FILE: &str = ".smithers/apply.lock";
const JOURNAL: &str = "journal.json";
const JOURNAL_VERSION: u32 = 1;
/// How long an apply waits for another one on the same root before failing with `Locked`.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The conflict of a path in [`ApplyOptions::host_changed`].
pub const HOST_CHANGED: &str = "changed on the host while the step ran: the base the step saw is lost, so applying its version would undo the host's edit";

const ENOTDIR: i32 = 20;
const EEXIST: i32 = 17;

/// Options of [`apply_patches`].
#[derive(Debug, Clone, Default)]
pub struct ApplyOptions {
    /// Paths whose host file changed while the step ran (the bundle's
    /// `changeNotes.hostChanged`): their patches were made against the host's newer version,
    /// not against what the step saw, so applying them would undo the host's edit. Each is a
    /// conflict unless the host already holds the patched result.
    pub host_changed: BTreeSet<String>,
    /// Resolve text conflicts by writing conflict markers instead of refusing: a modified text
    /// file whose hunks do not apply to the host's version gets a `<<<<<<< host` /
    /// `=======` / `>>>>>>> sandbox` block where each failing hunk was expected, and a
    /// host-changed file gets a block for each difference between the host's version and the
    /// step's. Conflicts that markers cannot express (binary files, symlinks, files deleted
    /// or created on one side, directories) still refuse the whole apply.
    pub conflict_markers: bool,
    /// Test hook: stop (as a crash would: no rollback, journal left behind) after this many
    /// commit steps (deletions, directory removals/creations, renames).
    #[doc(hidden)]
    pub crash_after_steps: Option<usize>,
    /// Test hook: stop after the journal is marked committed, before cleaning up.
    #[doc(hidden)]
    pub crash_before_cleanup: bool,
    /// Test hook: back up by copying even where a hard link would work (the fallback used on
    /// filesystems without hard links).
    #[doc(hidden)]
    pub force_copy_backups: bool,
}

/// What happened to one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AppliedAction {
    Created,
    Modified,
    Deleted,
    ModeChanged,
    TypeChanged,
}

/// One path written by an apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedFile {
    pub path: String,
    pub action: AppliedAction,
    /// The host had changed the file; the sandbox's hunks were merged onto the host version.
    pub merged: bool,
    /// Written with conflict markers (`<<<<<<< host` / `=======` / `>>>>>>> sandbox`, as
    /// asked for with [`ApplyOptions::conflict_markers`]): a person resolves the blocks.
    #[serde(default, skip_serializing_if = "is_false")]
    pub conflict_markers: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The result of a successful [`apply_patches`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplyReport {
    pub applied: Vec<AppliedFile>,
    /// Paths already in the patched state on the host (nothing to do).
    pub already_applied: Vec<String>,
    /// Interrupted applies found and recovered before this one (journal ids).
    pub recovered: Vec<String>,
}

/// The result of [`recover_apply`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryReport {
    /// Journals that had not committed: their changes were undone.
    pub rolled_back: Vec<String>,
    /// Journals that had committed: their leftovers were cleaned up.
    pub rolled_forward: Vec<String>,
}

// ---------------------------------------------------------------------------------------
// Journal

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum JournalState {
    /// Staging files are being written; the host tree is untouched.
    Staging,
    /// Everything is staged; commit steps may have run.
    Prepared,
    /// Every commit step ran and was synced.
    Committed,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum OpKind {
    Write,
    Symlink,
    Delete,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Backup {
    File {
        /// Name of the backup file in the journal directory.
        file: String,
        /// A hard link to the original inode (restored by rename), not a copy.
        linked: bool,
        perms: u32,
        uid: u32,
        gid: u32,
    },
    Symlink {
        target: Vec<u8>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DirRecord {
    path: String,
    perms: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Op {
    path: String,
    kind: OpKind,
    /// Staged new entry (in the journal directory) for Write/Symlink.
    staged: Option<String>,
    /// The host entry replaced or deleted (None: there was none, or it was a directory).
    backup: Option<Backup>,
    /// Host directories (bottom-up) removed because a file replaces them.
    removed_dirs: Vec<DirRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Journal {
    version: u32,
    id: String,
    state: JournalState,
    ops: Vec<Op>,
    /// Directories created at commit (top-down), removed again on rollback when empty.
    created_dirs: Vec<String>,
}

fn journal_dir(id: &str) -> String {
    format!("{APPLY_DIR}/{id}")
}

/// The file system path a path string names: itself, or for a name held in git's quoted form
/// (not UTF-8, see [`path_from_bytes`]) the raw bytes it stands for. Every patch path is
/// checked by [`validate_path`] (which refuses a malformed quoted form) before it gets here.
fn p(s: &str) -> Cow<'_, Path> {
    match raw(s) {
        Cow::Borrowed(_) => Cow::Borrowed(Path::new(s)),
        Cow::Owned(bytes) => Cow::Owned(PathBuf::from(OsString::from_vec(bytes))),
    }
}

/// The raw bytes a path string names (see [`p`]).
fn raw(s: &str) -> Cow<'_, [u8]> {
    if s.starts_with('"') {
        if let Some(bytes) = path_to_bytes(s) {
            return Cow::Owned(bytes);
        }
    }
    Cow::Borrowed(s.as_bytes())
}

/// The path string of `dir/name` (`name` raw bytes).
fn join_path(dir: &str, name: &[u8]) -> String {
    let mut bytes = raw(dir).into_owned();
    if !bytes.is_empty() {
        bytes.push(b'/');
    }
    bytes.extend_from_slice(name);
    path_from_bytes(&bytes)
}

fn path_error(path: &str, operation: &'static str, e: PathError) -> PatchError {
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

fn io_error(path: &str, operation: &'static str, source: std::io::Error) -> PatchError {
    PatchError::ApplyIo {
        path: path.to_string(),
        operation,
        source,
    }
}

/// Whether a write is flushed on its own (`fsync`) or by a later [`sync_fs`] of the batch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Durability {
    Fsync,
    Batched,
}

fn write_file_beneath(
    b: &Beneath,
    rel: &str,
    content: &[u8],
    perms: u32,
    owner: Option<(u32, u32)>,
    durability: Durability,
) -> Result<(), PatchError> {
    let held = Content::Held(content.to_vec());
    write_content_beneath(b, rel, &held, perms, owner, durability)
}

/// Creates `rel` with `content` (a large one written as it is made, and checked: one that is
/// no longer what was planned is a conflict).
fn write_content_beneath(
    b: &Beneath,
    rel: &str,
    content: &Content,
    perms: u32,
    owner: Option<(u32, u32)>,
    durability: Durability,
) -> Result<(), PatchError> {
    let mut f = b
        .create_new(&p(rel), 0o600)
        .map_err(|e| path_error(rel, "create", e))?;
    content.write_to(&mut f).map_err(|e| match e {
        WriteError::Io(e) => io_error(rel, "write", e),
        WriteError::Changed(reason) => PatchError::Conflicts {
            conflicts: vec![Conflict {
                path: rel.to_string(),
                reason,
            }],
        },
    })?;
    if let Some((uid, gid)) = owner {
        let me = (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        );
        if me.0 == 0 && me != (uid, gid) {
            // Best effort: keep the file's owner when root applies into a user's tree.
            let _ = rustix::fs::fchown(
                &f,
                Some(rustix::process::Uid::from_raw(uid)),
                Some(rustix::process::Gid::from_raw(gid)),
            );
        }
    }
    // Explicit chmod after creation: the create mode is filtered by the umask.
    f.set_permissions(std::fs::Permissions::from_mode(perms))
        .map_err(|e| io_error(rel, "chmod", e))?;
    if durability == Durability::Fsync {
        f.sync_all().map_err(|e| io_error(rel, "fsync", e))?;
    }
    Ok(())
}

/// (parent path string, last name's raw bytes).
fn split_parent(rel: &str) -> (String, OsString) {
    let bytes = raw(rel);
    let (dir, name) = match bytes.iter().rposition(|&c| c == b'/') {
        Some(i) => (path_from_bytes(&bytes[..i]), &bytes[i + 1..]),
        None => (String::new(), &bytes[..]),
    };
    (dir, OsString::from_vec(name.to_vec()))
}

/// A directory descriptor for `*at` calls: the (trusted) root itself, or a directory reached
/// beneath it without following any symlink.
fn dir_fd(b: &Beneath, root: &Path, dir: &str) -> Result<File, PatchError> {
    if dir.is_empty() {
        File::open(root).map_err(|e| io_error(".", "open root", e))
    } else {
        b.open_read(&p(dir))
            .map_err(|e| path_error(dir, "open directory", e))
    }
}

/// Hard-links `src` to `dst` (both beneath the root; the final name is not followed). Returns
/// false when the filesystem cannot (other device, no hard links): the caller then copies.
fn try_link(b: &Beneath, root: &Path, src: &str, dst: &str) -> Result<bool, PatchError> {
    let (sd, sn) = split_parent(src);
    let (dd, dn) = split_parent(dst);
    let s = dir_fd(b, root, &sd)?;
    let d = dir_fd(b, root, &dd)?;
    match rustix::fs::linkat(&s, &sn, &d, &dn, rustix::fs::AtFlags::empty()) {
        Ok(()) => Ok(true),
        Err(
            rustix::io::Errno::XDEV
            | rustix::io::Errno::PERM
            | rustix::io::Errno::MLINK
            | rustix::io::Errno::OPNOTSUPP,
        ) => Ok(false),
        Err(e) => Err(io_error(src, "link backup", e.into())),
    }
}

/// Flushes the whole filesystem holding `dir` (`syncfs`): one barrier for a batch of staged
/// files or renames instead of one `fsync` per file and directory. Every entry an apply
/// touches is on this filesystem: staged files are renamed into place, which only succeeds
/// within one filesystem.
fn sync_fs(b: &Beneath, dir: &str) -> Result<(), PatchError> {
    let f = b
        .open_read(&p(dir))
        .map_err(|e| path_error(dir, "open directory", e))?;
    rustix::fs::syncfs(&f).map_err(|e| io_error(dir, "syncfs", e.into()))
}

/// A host file's content (a large one hashed where it lies, kept open) and its metadata.
fn read_file_beneath(b: &Beneath, rel: &str) -> Result<(Content, std::fs::Metadata), PatchError> {
    let f = b
        .open_read(&p(rel))
        .map_err(|e| path_error(rel, "open", e))?;
    let md = f.metadata().map_err(|e| io_error(rel, "stat", e))?;
    let content = Content::of_host_file(f).map_err(|e| io_error(rel, "read", e))?;
    Ok((content, md))
}

fn write_journal(b: &Beneath, j: &Journal) -> Result<(), PatchError> {
    let dir = journal_dir(&j.id);
    let tmp = format!("{dir}/{JOURNAL}.tmp");
    let fin = format!("{dir}/{JOURNAL}");
    let text = serde_json::to_vec_pretty(j).expect("journal serialises");
    remove_if_exists(b, &tmp)?;
    write_file_beneath(b, &tmp, &text, 0o600, None, Durability::Fsync)?;
    b.rename(&p(&tmp), &p(&fin))
        .map_err(|e| path_error(&fin, "rename journal", e))?;
    b.sync_parent(&p(&fin))
        .map_err(|e| path_error(&fin, "fsync journal directory", e))
}

/// Lists a directory beneath the root (raw names only, without `.`/`..`), sorted.
fn list_dir(b: &Beneath, rel: &str) -> Result<Vec<(Vec<u8>, rustix::fs::FileType)>, PatchError> {
    let f = b
        .open_read(&p(rel))
        .map_err(|e| path_error(rel, "open directory", e))?;
    let dir =
        rustix::fs::Dir::read_from(&f).map_err(|e| io_error(rel, "read directory", e.into()))?;
    let mut out = Vec::new();
    for entry in dir {
        let entry = entry.map_err(|e| io_error(rel, "read directory", e.into()))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        out.push((name.to_vec(), entry.file_type()));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Host state and planning

#[derive(Debug, Clone)]
enum Host {
    Absent,
    File {
        content: Content,
        perms: u32,
        uid: u32,
        gid: u32,
    },
    Symlink(Vec<u8>),
    Dir,
    Other,
    /// A parent component is a non-directory (`symlink`: a symlink) on the host.
    Blocked {
        symlink: bool,
    },
}

fn read_host(b: &Beneath, rel: &str) -> Result<Host, PatchError> {
    match b.metadata(&p(rel)) {
        Ok(None) => Ok(Host::Absent),
        Ok(Some(m)) => match m.kind {
            EntryKind::File => {
                let (content, md) = read_file_beneath(b, rel)?;
                Ok(Host::File {
                    content,
                    perms: m.mode & 0o7777,
                    uid: md.uid(),
                    gid: md.gid(),
                })
            }
            EntryKind::Symlink => {
                let t = b
                    .read_link(&p(rel))
                    .map_err(|e| path_error(rel, "readlink", e))?;
                Ok(Host::Symlink(t.as_os_str().as_bytes().to_vec()))
            }
            EntryKind::Dir => Ok(Host::Dir),
            EntryKind::Other => Ok(Host::Other),
        },
        Err(PathError::EscapeViaSymlink { .. }) => Ok(Host::Blocked { symlink: true }),
        Err(e) if e.raw_os_error() == Some(ENOTDIR) => Ok(Host::Blocked { symlink: false }),
        Err(e) => Err(path_error(rel, "stat", e)),
    }
}

/// The state of a path in memory while patches are applied to it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Absent,
    File { content: Content, mode: GitMode },
    Symlink(Vec<u8>),
}

impl State {
    fn oid(&self) -> Option<String> {
        match self {
            State::Absent => None,
            State::File { content, .. } => Some(content.oid()),
            State::Symlink(target) => Some(git_blob_oid(target)),
        }
    }
    /// What a patch's body applies to (a symlink's target as bytes, nothing for a new path).
    fn content(&self) -> Cow<'_, Content> {
        match self {
            State::Absent => Cow::Owned(Content::Held(Vec::new())),
            State::File { content, .. } => Cow::Borrowed(content),
            State::Symlink(target) => Cow::Owned(Content::Held(target.clone())),
        }
    }
}

enum StepError {
    /// The state does not match the patch's base: a conflict unless it can be merged.
    Mismatch(String),
    /// The patch contradicts itself (base matched, hunks or result hash did not).
    Inconsistent(String),
}

/// Applies one patch to a state. `exact`: the base must match the recorded blob id.
fn step(state: &State, fp: &FilePatch, exact: bool) -> Result<State, StepError> {
    match (fp.old_mode, state) {
        (None, State::Absent) => {}
        (None, _) => return Err(StepError::Mismatch("already exists on the host".into())),
        (Some(_), State::Absent) => {
            return Err(StepError::Mismatch("was deleted on the host".into()))
        }
        (Some(GitMode::Symlink), State::File { .. }) => {
            return Err(StepError::Mismatch(
                "is a regular file on the host, the patch expects a symlink".into(),
            ))
        }
        (Some(GitMode::File | GitMode::Executable), State::Symlink(_)) => {
            return Err(StepError::Mismatch(
                "is a symlink on the host, the patch expects a regular file".into(),
            ))
        }
        (Some(_), _) => {
            if let Some(o) = &fp.old_oid {
                let found = state.oid().unwrap_or_default();
                if exact && *o != found {
                    return Err(StepError::Mismatch(format!(
                        "changed on the host (patch made against {o}, host has {found})"
                    )));
                }
            }
        }
    }
    let Some(new_mode) = fp.new_mode else {
        return Ok(State::Absent);
    };
    let content = match &fp.body {
        PatchBody::Empty => state.content().into_owned(),
        PatchBody::Binary { forward, .. } => {
            if !exact && fp.old_mode.is_some() {
                return Err(StepError::Mismatch(
                    "binary file changed on the host".into(),
                ));
            }
            // The base matched the patch's old id: a delta that does not apply to it, or a
            // result that does not hash to the new id (checked below), is the patch's fault.
            state
                .content()
                .apply(forward)
                .map_err(|e| StepError::Inconsistent(format!("binary delta does not apply: {e}")))?
        }
        PatchBody::Text(hunks) => {
            let content = state.content();
            let bytes = content.held().map_err(StepError::Mismatch)?;
            let Ok(text) = std::str::from_utf8(&bytes) else {
                return Err(StepError::Mismatch(
                    "host file is not UTF-8 text; cannot merge".into(),
                ));
            };
            match apply_hunks(text, hunks, exact) {
                Ok(t) => Content::Held(t.into_bytes()),
                Err(f) if exact => {
                    return Err(StepError::Inconsistent(format!(
                        "hunk {} does not match the base the patch names",
                        f.hunk
                    )))
                }
                Err(f) if f.ambiguous => {
                    return Err(StepError::Mismatch(format!(
                        "changed on the host and hunk {}'s context occurs more than once in the \
                         host version (which one the change belongs to cannot be known)",
                        f.hunk
                    )))
                }
                Err(f) => {
                    return Err(StepError::Mismatch(format!(
                        "changed on the host and hunk {} does not apply to the host version",
                        f.hunk
                    )))
                }
            }
        }
    };
    if exact {
        if let Some(n) = &fp.new_oid {
            let got = content.oid();
            if *n != got {
                return Err(StepError::Inconsistent(format!(
                    "result has blob id {got}, the patch says {n}"
                )));
            }
        }
    }
    Ok(match new_mode {
        GitMode::Symlink => State::Symlink(
            content
                .held()
                .map_err(StepError::Inconsistent)?
                .into_owned(),
        ),
        m => {
            // Three-way on the mode too: keep a host chmod unless the sandbox changed the mode.
            let mode = match (fp.old_mode, state) {
                (Some(om), State::File { mode: hm, .. }) if om == m => *hm,
                _ => m,
            };
            State::File { content, mode }
        }
    })
}

/// Refuses anything that is not a plain downward POSIX path, and the protected directories.
/// Checked on the raw bytes the path string names (a quoted form, for a name that is not
/// UTF-8, must be exactly one well-formed token).
fn validate_path(path: &str) -> Result<(), PatchError> {
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

struct Planned {
    host: Host,
    want: State,
    merged: bool,
    action: AppliedAction,
    /// Written with conflict markers.
    marked: bool,
}

fn host_state(h: &Host) -> State {
    match h {
        Host::File { content, perms, .. } => State::File {
            content: content.clone(),
            mode: GitMode::from_regular_permissions(*perms),
        },
        Host::Symlink(t) => State::Symlink(t.clone()),
        // Directories and blocked paths count as "absent" here; whether they can really be
        // made room for is checked against the whole plan afterwards.
        Host::Absent | Host::Dir | Host::Blocked { .. } | Host::Other => State::Absent,
    }
}

fn plan_path(
    path: &str,
    host: Host,
    patches: &[&FilePatch],
) -> Result<Result<Planned, String>, PatchError> {
    if matches!(host, Host::Other) {
        return Ok(Err(
            "is a special file (fifo, socket, device) on the host".into()
        ));
    }
    let start = host_state(&host);
    if let (Host::Dir, Some(first), Some(last)) = (&host, patches.first(), patches.last()) {
        if last.new_mode.is_none() {
            // Deleting a file where a directory stands: nothing of ours to delete.
            return Ok(Ok(Planned {
                host,
                want: State::Absent,
                merged: false,
                action: AppliedAction::Deleted,
                marked: false,
            }));
        }
        if first.old_mode.is_some() {
            return Ok(Err("is a directory on the host".into()));
        }
    }
    let mut merged = false;
    let mut state = start.clone();
    for (i, fp) in patches.iter().enumerate() {
        state = match step(&state, fp, true) {
            Ok(s) => s,
            Err(StepError::Inconsistent(r)) => {
                return Err(PatchError::InconsistentPatch {
                    path: path.to_string(),
                    reason: r,
                })
            }
            Err(StepError::Mismatch(reason)) => {
                // Already in the patched state on the host (the same change made twice)?
                let last = patches.last().unwrap_or(fp);
                if i == 0 && already_applied(&start, last) {
                    return Ok(Ok(Planned {
                        want: start.clone(),
                        host,
                        merged: false,
                        action: AppliedAction::Modified,
                        marked: false,
                    }));
                }
                if i != 0 {
                    return Ok(Err(reason));
                }
                match step(&state, fp, false) {
                    Ok(s) => {
                        merged = true;
                        s
                    }
                    // Why the merge failed too (e.g. an ambiguous hunk), when it says more.
                    Err(StepError::Mismatch(why)) if why != reason => {
                        return Ok(Err(format!("{reason}; {why}")))
                    }
                    Err(StepError::Mismatch(_)) | Err(StepError::Inconsistent(_)) => {
                        return Ok(Err(reason))
                    }
                }
            }
        };
    }
    let action = match (&start, &state) {
        (State::Absent, _) => AppliedAction::Created,
        (_, State::Absent) => AppliedAction::Deleted,
        (State::File { .. }, State::Symlink(_)) | (State::Symlink(_), State::File { .. }) => {
            AppliedAction::TypeChanged
        }
        (State::File { content: a, .. }, State::File { content: b, .. }) if a == b => {
            AppliedAction::ModeChanged
        }
        _ => AppliedAction::Modified,
    };
    Ok(Ok(Planned {
        host,
        want: state,
        merged,
        action,
        marked: false,
    }))
}

/// The plan of a conflicting text file written with conflict markers, when markers can say
/// it: one patch modifying a regular UTF-8 text file that is a regular UTF-8 text file on the
/// host. `host_changed`: the patch's base is the host's version as of collect, not what the
/// step saw, so the step's whole version is set against the host's, difference by
/// difference; otherwise the hunks that fit are applied and each one that does not becomes a
/// block. `None`: markers cannot express this conflict (the caller refuses it).
fn plan_with_markers(host: &Host, patches: &[&FilePatch], host_changed: bool) -> Option<Planned> {
    let [fp] = patches else { return None };
    let (Some(om), Some(nm)) = (fp.old_mode, fp.new_mode) else {
        return None;
    };
    if om.is_symlink() || nm.is_symlink() {
        return None;
    }
    let PatchBody::Text(hunks) = &fp.body else {
        return None;
    };
    let Host::File {
        content: Content::Held(content),
        perms,
        ..
    } = host
    else {
        return None;
    };
    let text = std::str::from_utf8(content).ok()?;
    let (marked, blocks) = if host_changed {
        // The hunks were made against the host's version as of collect: relocated onto a
        // newer one they would put back what the host had edited. Only when the host still
        // holds that version is the step's whole version known, and set against it; else it
        // stays a conflict.
        match step(&host_state(host), fp, true).ok()? {
            State::File {
                content: Content::Held(theirs),
                ..
            } => crate::merge::mark_differences(text, &String::from_utf8(theirs).ok()?),
            _ => return None,
        }
    } else {
        crate::merge::apply_hunks_marking(text, hunks)?
    };
    Some(Planned {
        host: host.clone(),
        want: State::File {
            content: Content::Held(marked.into_bytes()),
            // The host's mode: which side's mode wins is part of what the person resolves.
            mode: GitMode::from_regular_permissions(*perms),
        },
        merged: true,
        action: AppliedAction::Modified,
        marked: blocks > 0,
    })
}

/// Whether the host already holds what the patch produces.
fn already_applied(host: &State, fp: &FilePatch) -> bool {
    match (fp.new_mode, host) {
        (None, State::Absent) => true,
        (Some(GitMode::Symlink), State::Symlink(t)) => {
            fp.new_oid.as_deref() == Some(git_blob_oid(t).as_str())
        }
        (Some(m), State::File { content, mode }) if !m.is_symlink() => {
            *mode == m
                && match &fp.new_oid {
                    Some(n) => *n == content.oid(),
                    // Mode-only patch: the mode is what matters.
                    None => matches!(fp.body, PatchBody::Empty),
                }
        }
        _ => false,
    }
}

/// The path strings of `path`'s parent directories, top-down.
fn ancestors(path: &str) -> Vec<String> {
    let bytes = raw(path);
    bytes
        .iter()
        .enumerate()
        .filter(|(_, &c)| c == b'/')
        .map(|(i, _)| path_from_bytes(&bytes[..i]))
        .collect()
}

/// Collects a host directory's subtree: (non-directories, directories bottom-up).
fn host_subtree(
    b: &Beneath,
    dir: &str,
    files: &mut Vec<String>,
    dirs: &mut Vec<DirRecord>,
) -> Result<(), PatchError> {
    for (name, ft) in list_dir(b, dir)? {
        let child = join_path(dir, &name);
        if ft == rustix::fs::FileType::Directory {
            host_subtree(b, &child, files, dirs)?;
        } else {
            files.push(child);
        }
    }
    let perms = b
        .metadata(&p(dir))
        .map_err(|e| path_error(dir, "stat", e))?
        .map_or(0o755, |m| m.mode);
    dirs.push(DirRecord {
        path: dir.to_string(),
        perms,
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Lock

struct LockGuard {
    _file: File,
}

fn lock(b: &Beneath, root: &Path) -> Result<LockGuard, PatchError> {
    b.create_dir_all(&p(SMITHERS_DIR), 0o755)
        .map_err(|e| path_error(SMITHERS_DIR, "create directory", e))?;
    let file = match b.create_new(&p(LOCK_FILE), 0o644) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(EEXIST) => b
            .open_read(&p(LOCK_FILE))
            .map_err(|e| path_error(LOCK_FILE, "open lock", e))?,
        Err(e) => return Err(path_error(LOCK_FILE, "create lock", e)),
    };
    // Wait a little before giving up: a lock can outlive its holder briefly when a child
    // forked by any thread still has the descriptor between fork and exec.
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(LockGuard { _file: file }),
            Err(rustix::io::Errno::WOULDBLOCK) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(PatchError::Locked {
                    root: root.to_path_buf(),
                })
            }
            Err(e) => return Err(io_error(LOCK_FILE, "lock", e.into())),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Apply

/// New content to stage: the file's content (or a symlink's target), permission bits, owner
/// (uid, gid).
type StagedContent = (Content, u32, Option<(u32, u32)>);

fn new_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}-{}", std::process::id())
}

fn perms_for(want_mode: GitMode, host: &Host) -> u32 {
    match host {
        Host::File { perms, .. } => {
            let base = perms & 0o7777;
            match want_mode {
                // Executable where readable, like `chmod +x` under a 022 umask.
                GitMode::Executable => base | ((base & 0o444) >> 2),
                _ => base & !0o111,
            }
        }
        _ => match want_mode {
            GitMode::Executable => 0o755,
            _ => 0o644,
        },
    }
}

/// Parses every patch text and applies them all as one atomic change.
pub fn apply_patch_texts(
    root: &Path,
    texts: &[&str],
    opts: &ApplyOptions,
) -> Result<ApplyReport, PatchError> {
    let mut all = Vec::new();
    for t in texts {
        all.extend(parse_patch(t)?);
    }
    apply_patches(root, &all, opts)
}

/// Applies `patches` to the tree at `root`, all or nothing (see the module docs).
///
/// Conflicts fail with [`PatchError::Conflicts`] listing every conflicting file, before
/// anything is written. Paths outside the root, through symlinks, or into `.git/` or
/// `.smithers/` (at any depth) fail with [`PatchError::PathEscape`].
pub fn apply_patches(
    root: &Path,
    patches: &[FilePatch],
    opts: &ApplyOptions,
) -> Result<ApplyReport, PatchError> {
    for fp in patches {
        validate_path(&fp.path)?;
    }
    let b = Beneath::open(root).map_err(|e| path_error(".", "open root", e))?;
    let _lock = lock(&b, root)?;
    let recovered = recover_locked(&b)?;

    let mut by_path: BTreeMap<&str, Vec<&FilePatch>> = BTreeMap::new();
    for fp in patches {
        by_path.entry(fp.path.as_str()).or_default().push(fp);
    }

    // 1. Check everything; collect every conflict.
    let mut conflicts = Vec::new();
    let mut plans: BTreeMap<String, Planned> = BTreeMap::new();
    for (path, list) in &by_path {
        let host = read_host(&b, path)?;
        if opts.host_changed.contains(*path) {
            let done = list
                .last()
                .is_some_and(|last| already_applied(&host_state(&host), last));
            if !done {
                match opts
                    .conflict_markers
                    .then(|| plan_with_markers(&host, list, true))
                    .flatten()
                {
                    Some(pl) => {
                        plans.insert(path.to_string(), pl);
                    }
                    None => conflicts.push(Conflict {
                        path: path.to_string(),
                        reason: HOST_CHANGED.into(),
                    }),
                }
                continue;
            }
        }
        match plan_path(path, host, list)? {
            Ok(pl) => {
                plans.insert(path.to_string(), pl);
            }
            Err(reason) => {
                let marked = if opts.conflict_markers {
                    plan_with_markers(&read_host(&b, path)?, list, false)
                } else {
                    None
                };
                match marked {
                    Some(pl) => {
                        plans.insert(path.to_string(), pl);
                    }
                    None => conflicts.push(Conflict {
                        path: path.to_string(),
                        reason,
                    }),
                }
            }
        }
    }
    let deleted: BTreeSet<&str> = plans
        .iter()
        .filter(|(_, pl)| {
            pl.want == State::Absent && matches!(pl.host, Host::File { .. } | Host::Symlink(_))
        })
        .map(|(k, _)| k.as_str())
        .collect();
    let mut removed_dirs: BTreeMap<String, Vec<DirRecord>> = BTreeMap::new();
    for (path, pl) in &plans {
        match (&pl.host, &pl.want) {
            // A parent is a file or symlink on the host: fine only if this apply deletes it.
            (Host::Blocked { symlink }, want)
                if *want != State::Absent
                    && !ancestors(path).iter().any(|a| deleted.contains(a.as_str())) =>
            {
                if *symlink {
                    return Err(PatchError::PathEscape {
                        path: path.clone(),
                        reason: "a parent directory is a symlink on the host".into(),
                    });
                }
                conflicts.push(Conflict {
                    path: path.clone(),
                    reason: "a parent directory is a file on the host".into(),
                });
            }
            (Host::Dir, want) if *want != State::Absent => {
                let (mut files, mut dirs) = (Vec::new(), Vec::new());
                host_subtree(&b, path, &mut files, &mut dirs)?;
                let kept: Vec<&String> = files
                    .iter()
                    .filter(|f| !deleted.contains(f.as_str()))
                    .collect();
                if kept.is_empty() {
                    removed_dirs.insert(path.clone(), dirs);
                } else {
                    conflicts.push(Conflict {
                        path: path.clone(),
                        reason: format!(
                            "is a directory on the host holding files the patch does not delete: {}",
                            kept.iter().take(5).map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                        ),
                    });
                }
            }
            _ => {}
        }
    }
    if !conflicts.is_empty() {
        conflicts.sort_by(|a, b| a.path.cmp(&b.path));
        return Err(PatchError::Conflicts { conflicts });
    }

    // 2. Build the journal.
    let id = new_id();
    let jdir = journal_dir(&id);
    let mut report = ApplyReport {
        recovered,
        ..Default::default()
    };
    let mut ops = Vec::new();
    let mut created: BTreeSet<String> = BTreeSet::new();
    let mut contents: Vec<Option<StagedContent>> = Vec::new();
    let mut backups: Vec<Option<Content>> = Vec::new();
    let root_owner = std::fs::metadata(root).ok().map(|m| (m.uid(), m.gid()));
    for (n, (path, pl)) in plans.iter().enumerate() {
        let nothing_to_do = match (&pl.host, &pl.want) {
            // A file deletion where a directory now stands (made by this same patch set in an
            // earlier apply): the file is gone already; directories are never deleted.
            (Host::Dir, State::Absent) => true,
            (Host::Dir, _) => false,
            (h, w) => host_state(h) == *w,
        };
        if nothing_to_do {
            report.already_applied.push(path.clone());
            continue;
        }
        report.applied.push(AppliedFile {
            path: path.clone(),
            action: pl.action,
            merged: pl.merged,
            conflict_markers: pl.marked,
        });
        let (backup, backup_bytes) = match &pl.host {
            Host::File {
                content,
                perms,
                uid,
                gid,
            } => (
                Some(Backup::File {
                    file: format!("b{n}"),
                    linked: false,
                    perms: *perms,
                    uid: *uid,
                    gid: *gid,
                }),
                Some(content.clone()),
            ),
            Host::Symlink(t) => (Some(Backup::Symlink { target: t.clone() }), None),
            _ => (None, None),
        };
        let (kind, staged, content) = match &pl.want {
            State::Absent => (OpKind::Delete, None, None),
            State::File { content, mode } => {
                let owner = match &pl.host {
                    Host::File { uid, gid, .. } => Some((*uid, *gid)),
                    _ => root_owner,
                };
                (
                    OpKind::Write,
                    Some(format!("s{n}")),
                    Some((content.clone(), perms_for(*mode, &pl.host), owner)),
                )
            }
            State::Symlink(t) => (
                OpKind::Symlink,
                Some(format!("s{n}")),
                Some((Content::Held(t.clone()), 0, None)),
            ),
        };
        if !matches!(kind, OpKind::Delete) {
            for a in ancestors(path) {
                let is_dir = matches!(
                    b.metadata(&p(&a)),
                    Ok(Some(m)) if m.kind == EntryKind::Dir
                );
                if !is_dir {
                    created.insert(a);
                }
            }
        }
        ops.push(Op {
            path: path.clone(),
            kind,
            staged,
            backup,
            removed_dirs: removed_dirs.remove(path).unwrap_or_default(),
        });
        contents.push(content);
        backups.push(backup_bytes);
    }
    if ops.is_empty() {
        return Ok(report);
    }
    // Top-down: BTreeSet order puts "a" before "a/b".
    let mut journal = Journal {
        version: JOURNAL_VERSION,
        id: id.clone(),
        state: JournalState::Staging,
        ops,
        created_dirs: created.into_iter().collect(),
    };

    // 3. Stage.
    b.create_dir_all(&p(&jdir), 0o700)
        .map_err(|e| path_error(&jdir, "create journal directory", e))?;
    // No journal is written until everything is staged: a crash before that leaves only a
    // journal-less directory under .smithers/apply, which recovery simply removes (the host
    // tree has not been touched yet).
    let staged = (|| {
        for ((op, content), backup) in journal.ops.iter_mut().zip(&contents).zip(&backups) {
            if let (
                Some(Backup::File {
                    file,
                    linked,
                    perms,
                    ..
                }),
                Some(bytes),
            ) = (&mut op.backup, backup)
            {
                // A hard link keeps the original inode for free; copy where links fail.
                let dst = format!("{jdir}/{file}");
                *linked = !opts.force_copy_backups && try_link(&b, root, &op.path, &dst)?;
                if !*linked {
                    write_content_beneath(
                        &b,
                        &dst,
                        bytes,
                        *perms & 0o777,
                        None,
                        Durability::Batched,
                    )?;
                }
            }
            if let (Some(name), Some((bytes, perms, owner))) = (&op.staged, content) {
                let rel = format!("{jdir}/{name}");
                match (op.kind.clone(), bytes) {
                    (OpKind::Symlink, Content::Held(target)) => {
                        let target = std::ffi::OsStr::from_bytes(target);
                        b.symlink(Path::new(target), &p(&rel))
                            .map_err(|e| path_error(&rel, "create symlink", e))?;
                    }
                    _ => {
                        write_content_beneath(&b, &rel, bytes, *perms, *owner, Durability::Batched)?
                    }
                }
            }
        }
        // Every staged file and backup is durable before the journal says "prepared".
        sync_fs(&b, &jdir)?;
        journal.state = JournalState::Prepared;
        write_journal(&b, &journal)
    })();
    if let Err(e) = staged {
        return Err(rollback_after(&b, &journal, e));
    }

    // 4. Commit.
    let mut steps = 0usize;
    let committed = (|| {
        let mut tick = || -> Result<(), PatchError> {
            steps += 1;
            match opts.crash_after_steps {
                Some(n) if steps > n => Err(PatchError::SimulatedCrash { renames: n }),
                _ => Ok(()),
            }
        };
        for op in journal
            .ops
            .iter()
            .filter(|o| matches!(o.kind, OpKind::Delete))
        {
            tick()?;
            b.remove_file(&p(&op.path))
                .map_err(|e| path_error(&op.path, "delete", e))?;
        }
        // Directories emptied by the deletions above that a file now replaces.
        for op in &journal.ops {
            for d in &op.removed_dirs {
                tick()?;
                b.remove_dir(&p(&d.path))
                    .map_err(|e| path_error(&d.path, "remove directory", e))?;
            }
        }
        for d in &journal.created_dirs {
            tick()?;
            b.create_dir_all(&p(d), 0o755)
                .map_err(|e| path_error(d, "create directory", e))?;
        }
        for op in &journal.ops {
            if let Some(name) = &op.staged {
                tick()?;
                b.rename(&p(&format!("{jdir}/{name}")), &p(&op.path))
                    .map_err(|e| path_error(&op.path, "rename into place", e))?;
            }
        }
        // Every deletion, directory change and rename is durable before "committed".
        sync_fs(&b, &jdir)?;
        Ok(())
    })();
    match committed {
        Ok(()) => {}
        Err(e @ PatchError::SimulatedCrash { .. }) => return Err(e),
        Err(e) => return Err(rollback_after(&b, &journal, e)),
    }
    journal.state = JournalState::Committed;
    write_journal(&b, &journal)?;
    if opts.crash_before_cleanup {
        return Err(PatchError::SimulatedCrash { renames: steps });
    }

    // 5. Clean up: like git, remove directories left empty by deletions; drop the journal.
    remove_emptied_dirs(&b, &journal);
    remove_journal_dir(&b, &id)?;
    Ok(report)
}

/// Removes directories that deletions left empty, deepest first, like `git apply` does.
/// Best effort: a directory that is not empty (or already gone) simply stays.
fn remove_emptied_dirs(b: &Beneath, journal: &Journal) {
    for op in journal
        .ops
        .iter()
        .filter(|o| matches!(o.kind, OpKind::Delete))
    {
        let mut parents = ancestors(&op.path);
        parents.reverse();
        for d in parents {
            if b.remove_dir(&p(&d)).is_err() {
                break;
            }
        }
    }
}

/// Rolls back after a failure during staging or commit; the original error wins unless the
/// rollback itself fails.
fn rollback_after(b: &Beneath, journal: &Journal, primary: PatchError) -> PatchError {
    match rollback(b, journal) {
        Ok(()) => primary,
        Err(e) => {
            let (path, source) = match e {
                PatchError::ApplyIo { path, source, .. } => (path, source),
                other => (journal.id.clone(), std::io::Error::other(other.to_string())),
            };
            PatchError::RollbackFailed {
                primary: primary.to_string(),
                path,
                source,
            }
        }
    }
}

fn exists(b: &Beneath, rel: &str) -> bool {
    matches!(b.metadata(&p(rel)), Ok(Some(_)))
}

fn remove_if_exists(b: &Beneath, rel: &str) -> Result<(), PatchError> {
    match b.metadata(&p(rel)) {
        Ok(Some(m)) if m.kind == EntryKind::Dir => Ok(()),
        Ok(Some(_)) => b
            .remove_file(&p(rel))
            .map_err(|e| path_error(rel, "remove", e)),
        Ok(None) => Ok(()),
        Err(e) => Err(path_error(rel, "stat", e)),
    }
}

fn restore_backup(b: &Beneath, journal: &Journal, op: &Op, n: usize) -> Result<(), PatchError> {
    let jdir = journal_dir(&journal.id);
    let (parent, _) = split_parent(&op.path);
    if !parent.is_empty() {
        b.create_dir_all(&p(&parent), 0o755)
            .map_err(|e| path_error(&parent, "create directory", e))?;
    }
    let tmp = format!("{jdir}/r{n}");
    match &op.backup {
        Some(Backup::File {
            file, linked: true, ..
        }) => {
            // The original inode goes back under its name. Already gone: restored by an
            // earlier, interrupted recovery.
            let backup = format!("{jdir}/{file}");
            if !exists(b, &backup) {
                return Ok(());
            }
            return b
                .rename(&p(&backup), &p(&op.path))
                .map_err(|e| path_error(&op.path, "restore", e));
        }
        Some(Backup::File {
            file,
            linked: false,
            perms,
            uid,
            gid,
        }) => {
            let (bytes, _) = read_file_beneath(b, &format!("{jdir}/{file}"))?;
            remove_if_exists(b, &tmp)?;
            write_content_beneath(
                b,
                &tmp,
                &bytes,
                *perms,
                Some((*uid, *gid)),
                Durability::Fsync,
            )?;
        }
        Some(Backup::Symlink { target }) => {
            remove_if_exists(b, &tmp)?;
            b.symlink(Path::new(std::ffi::OsStr::from_bytes(target)), &p(&tmp))
                .map_err(|e| path_error(&tmp, "create symlink", e))?;
        }
        None => return Ok(()),
    }
    b.rename(&p(&tmp), &p(&op.path))
        .map_err(|e| path_error(&op.path, "restore", e))
}

/// Undoes a journal that did not commit. Idempotent: safe to run again after a crash in it.
fn rollback(b: &Beneath, journal: &Journal) -> Result<(), PatchError> {
    let jdir = journal_dir(&journal.id);
    let prepared = journal.state == JournalState::Prepared;
    // A. Entries renamed into place: restore the backup, or remove what was added. (A staged
    //    file still in the journal directory was never renamed.)
    for (n, op) in journal.ops.iter().enumerate() {
        let Some(name) = &op.staged else { continue };
        if exists(b, &format!("{jdir}/{name}")) || !prepared {
            continue;
        }
        match &op.backup {
            Some(_) => restore_backup(b, journal, op, n)?,
            None => remove_if_exists(b, &op.path)?,
        }
    }
    // B. Directories the commit created (emptied by A), deepest first. Before C: a file that
    //    was deleted may have been replaced by one of these directories.
    for d in journal.created_dirs.iter().rev() {
        // Not empty (the host put something there) or already gone: leave it; C then fails
        // loudly if it blocks a restore.
        let _ = b.remove_dir(&p(d));
    }
    if prepared {
        // C. Directories removed to make room for a file (top-down).
        for op in &journal.ops {
            for d in op.removed_dirs.iter().rev() {
                if !exists(b, &d.path) {
                    b.create_dir_all(&p(&d.path), 0o755)
                        .map_err(|e| path_error(&d.path, "recreate directory", e))?;
                    b.set_mode(&p(&d.path), d.perms)
                        .map_err(|e| path_error(&d.path, "chmod", e))?;
                }
            }
        }
        // D. Deleted entries.
        for (n, op) in journal.ops.iter().enumerate() {
            if !matches!(op.kind, OpKind::Delete) {
                continue;
            }
            match b.metadata(&p(&op.path)) {
                Ok(None) => restore_backup(b, journal, op, n)?,
                Ok(Some(m)) if m.kind == EntryKind::Dir => {
                    return Err(PatchError::ApplyIo {
                        path: op.path.clone(),
                        operation: "restore (a directory now stands in the way)",
                        source: std::io::Error::from_raw_os_error(EEXIST),
                    })
                }
                Ok(Some(_)) => {}
                // A parent is (still) a file or symlink: cannot restore beneath it.
                Err(e) => return Err(path_error(&op.path, "restore", e)),
            }
        }
    }
    remove_journal_dir(b, &journal.id)
}

fn remove_journal_dir(b: &Beneath, id: &str) -> Result<(), PatchError> {
    let jdir = journal_dir(id);
    if !exists(b, &jdir) {
        return Ok(());
    }
    // The journal itself goes last: until then a crash leaves a recoverable state.
    for (name, _) in list_dir(b, &jdir)? {
        if name != JOURNAL.as_bytes() {
            remove_if_exists(b, &join_path(&jdir, &name))?;
        }
    }
    remove_if_exists(b, &format!("{jdir}/{JOURNAL}"))?;
    b.remove_dir(&p(&jdir))
        .map_err(|e| path_error(&jdir, "remove journal directory", e))
}

fn recover_locked(b: &Beneath) -> Result<Vec<String>, PatchError> {
    let r = recover_inner(b)?;
    Ok(r.rolled_back.into_iter().chain(r.rolled_forward).collect())
}

fn recover_inner(b: &Beneath) -> Result<RecoveryReport, PatchError> {
    let mut report = RecoveryReport::default();
    if !exists(b, APPLY_DIR) {
        return Ok(report);
    }
    for (id, ft) in list_dir(b, APPLY_DIR)? {
        if ft != rustix::fs::FileType::Directory {
            continue;
        }
        // Journal ids are ASCII (`new_id`); anything else there is not ours to act on.
        let Ok(id) = String::from_utf8(id) else {
            return Err(PatchError::Journal {
                path: PathBuf::from(APPLY_DIR),
                reason: "a directory with a non-UTF-8 name is not an apply journal".into(),
            });
        };
        let jpath = format!("{APPLY_DIR}/{id}/{JOURNAL}");
        if !exists(b, &jpath) {
            // Crashed before the first journal write: only staging leftovers, no host change.
            remove_journal_dir(b, &id)?;
            report.rolled_back.push(id);
            continue;
        }
        let (content, _) = read_file_beneath(b, &jpath)?;
        let bytes = content.held().map_err(|reason| PatchError::Journal {
            path: PathBuf::from(&jpath),
            reason,
        })?;
        let journal: Journal = serde_json::from_slice(&bytes).map_err(|e| PatchError::Journal {
            path: PathBuf::from(&jpath),
            reason: e.to_string(),
        })?;
        if journal.version != JOURNAL_VERSION || journal.id != id {
            return Err(PatchError::Journal {
                path: PathBuf::from(&jpath),
                reason: format!("unknown journal version {} or id mismatch", journal.version),
            });
        }
        for op in &journal.ops {
            validate_path(&op.path)?;
        }
        if journal.state == JournalState::Committed {
            remove_emptied_dirs(b, &journal);
            remove_journal_dir(b, &id)?;
            report.rolled_forward.push(id);
        } else {
            rollback(b, &journal)?;
            report.rolled_back.push(id);
        }
    }
    Ok(report)
}

/// Finishes or undoes applies interrupted by a crash under `root`: an apply whose journal is
/// committed is cleaned up (its changes stay); any other is rolled back completely.
pub fn recover_apply(root: &Path) -> Result<RecoveryReport, PatchError> {
    let b = Beneath::open(root).map_err(|e| path_error(".", "open root", e))?;
    let _lock = lock(&b, root)?;
    recover_inner(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_validation() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "./a",
            ".git/config",
            "sub/.GIT/hooks/x",
            ".smithers/db",
            "x/.smithers/db",
            "x/y/.Smithers",
            "a\0b",
        ] {
            assert!(validate_path(bad).is_err(), "{bad:?} must be refused");
        }
        for ok in ["a", "a/b.rs", "x/.smithersrc", ".gitignore", "..x", "a b/ü"] {
            validate_path(ok).unwrap();
        }
    }

    #[test]
    fn exec_bits() {
        let host = Host::File {
            content: Content::Held(vec![]),
            perms: 0o640,
            uid: 0,
            gid: 0,
        };
        assert_eq!(perms_for(GitMode::Executable, &host), 0o750);
        assert_eq!(perms_for(GitMode::File, &Host::Absent), 0o644);
    }
}
