//! Rollback of an apply that did not commit, and recovery of interrupted applies.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use smithers_paths::{Beneath, EntryKind};

use super::fsops::{
    exists, list_dir, read_file_beneath, remove_if_exists, write_content_beneath, Durability,
    EEXIST,
};
use super::journal::{
    journal_dir, lock, Backup, Journal, JournalState, Op, OpKind, APPLY_DIR, JOURNAL,
    JOURNAL_VERSION,
};
use super::paths::{ancestors, join_path, p, path_error, split_parent, validate_path};
use super::report::RecoveryReport;
use crate::error::PatchError;

/// Removes directories that deletions left empty, deepest first, like `git apply` does.
/// Best effort: a directory that is not empty (or already gone) simply stays.
pub(super) fn remove_emptied_dirs(b: &Beneath, journal: &Journal) {
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
pub(super) fn rollback_after(b: &Beneath, journal: &Journal, primary: PatchError) -> PatchError {
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

pub(super) fn restore_backup(
    b: &Beneath,
    journal: &Journal,
    op: &Op,
    n: usize,
) -> Result<(), PatchError> {
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
pub(super) fn rollback(b: &Beneath, journal: &Journal) -> Result<(), PatchError> {
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

pub(super) fn remove_journal_dir(b: &Beneath, id: &str) -> Result<(), PatchError> {
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

pub(super) fn recover_locked(b: &Beneath) -> Result<Vec<String>, PatchError> {
    let r = recover_inner(b)?;
    Ok(r.rolled_back.into_iter().chain(r.rolled_forward).collect())
}

pub(super) fn recover_inner(b: &Beneath) -> Result<RecoveryReport, PatchError> {
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
