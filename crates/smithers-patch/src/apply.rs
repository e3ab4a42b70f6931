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
mod fsops;
mod journal;
mod paths;
mod plan;
mod recover;
mod report;
#[cfg(test)]
mod streamed_tests;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use smithers_paths::{Beneath, EntryKind};

use self::content::Content;
use self::fsops::{sync_fs, try_link, write_content_beneath, Durability};
use self::journal::{
    journal_dir, lock, write_journal, Backup, DirRecord, Journal, JournalState, Op, OpKind,
    JOURNAL_VERSION,
};
use self::paths::{ancestors, p, path_error, validate_path};
use self::plan::{check_plans, host_state, Host, Planned, State};
pub use self::recover::recover_apply;
use self::recover::{recover_locked, remove_emptied_dirs, remove_journal_dir, rollback_after};
pub use self::report::{
    AppliedAction, AppliedFile, ApplyOptions, ApplyReport, RecoveryReport, HOST_CHANGED,
};
use crate::error::PatchError;
use crate::model::GitMode;
use crate::parse::parse_patch;
use crate::patch::FilePatch;

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
    let (plans, removed_dirs) = check_plans(&b, &by_path, opts)?;

    // 2. Build the journal.
    let id = new_id();
    let jdir = journal_dir(&id);
    let mut report = ApplyReport {
        recovered,
        ..Default::default()
    };
    let staging = journal_ops(&b, root, &plans, removed_dirs, &mut report);
    if staging.ops.is_empty() {
        return Ok(report);
    }
    // Top-down: BTreeSet order puts "a" before "a/b".
    let mut journal = Journal {
        version: JOURNAL_VERSION,
        id: id.clone(),
        state: JournalState::Staging,
        ops: staging.ops,
        created_dirs: staging.created.into_iter().collect(),
    };

    // 3. Stage.
    b.create_dir_all(&p(&jdir), 0o700)
        .map_err(|e| path_error(&jdir, "create journal directory", e))?;
    // No journal is written until everything is staged: a crash before that leaves only a
    // journal-less directory under .smithers/apply, which recovery simply removes (the host
    // tree has not been touched yet).
    let staged = stage(
        &b,
        root,
        opts,
        &jdir,
        &mut journal,
        &staging.contents,
        &staging.backups,
    );
    if let Err(e) = staged {
        return Err(rollback_after(&b, &journal, e));
    }

    // 4. Commit.
    let mut steps = 0usize;
    let committed = commit(&b, opts, &jdir, &journal, &mut steps);
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

/// The journal's operations, in plan order, with what each stages: its new content and the
/// backup of what it replaces (index for index), and the directories the commit creates.
struct Staging {
    ops: Vec<Op>,
    created: BTreeSet<String>,
    contents: Vec<Option<StagedContent>>,
    backups: Vec<Option<Content>>,
}

/// One operation per planned path that is not in its wanted state yet; the others are
/// reported as already applied.
fn journal_ops(
    b: &Beneath,
    root: &Path,
    plans: &BTreeMap<String, Planned>,
    mut removed_dirs: BTreeMap<String, Vec<DirRecord>>,
    report: &mut ApplyReport,
) -> Staging {
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
    Staging {
        ops,
        created,
        contents,
        backups,
    }
}

/// Writes every backup and staged entry into the journal directory, syncs them, and marks the
/// journal prepared.
fn stage(
    b: &Beneath,
    root: &Path,
    opts: &ApplyOptions,
    jdir: &str,
    journal: &mut Journal,
    contents: &[Option<StagedContent>],
    backups: &[Option<Content>],
) -> Result<(), PatchError> {
    for ((op, content), backup) in journal.ops.iter_mut().zip(contents).zip(backups) {
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
            *linked = !opts.force_copy_backups && try_link(b, root, &op.path, &dst)?;
            if !*linked {
                write_content_beneath(b, &dst, bytes, *perms & 0o777, None, Durability::Batched)?;
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
                _ => write_content_beneath(b, &rel, bytes, *perms, *owner, Durability::Batched)?,
            }
        }
    }
    // Every staged file and backup is durable before the journal says "prepared".
    sync_fs(b, jdir)?;
    journal.state = JournalState::Prepared;
    write_journal(b, journal)
}

/// Runs the commit steps: deletions, removal of directories a file replaces, new directories,
/// renames of staged entries into place; then syncs. `steps` counts the steps run (the test
/// hook `crash_after_steps` stops after that many).
fn commit(
    b: &Beneath,
    opts: &ApplyOptions,
    jdir: &str,
    journal: &Journal,
    steps: &mut usize,
) -> Result<(), PatchError> {
    let mut tick = || -> Result<(), PatchError> {
        *steps += 1;
        match opts.crash_after_steps {
            Some(n) if *steps > n => Err(PatchError::SimulatedCrash { renames: n }),
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
    sync_fs(b, jdir)?;
    Ok(())
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
