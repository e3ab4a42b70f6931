//! The apply journal under `.smithers/apply/<id>/` and the lock that serialises applies.

use std::fs::File;
use std::path::Path;

use serde::{Deserialize, Serialize};
use smithers_paths::Beneath;

use super::fsops::{remove_if_exists, write_file_beneath, Durability, EEXIST};
use super::paths::{io_error, p, path_error, SMITHERS_DIR};
use crate::error::PatchError;

pub(super) const APPLY_DIR: &str = ".smithers/apply";
pub(super) const LOCK_FILE: &str = ".smithers/apply.lock";
pub(super) const JOURNAL: &str = "journal.json";
pub(super) const JOURNAL_VERSION: u32 = 1;
/// How long an apply waits for another one on the same root before failing with `Locked`.
pub(super) const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) enum JournalState {
    /// Staging files are being written; the host tree is untouched.
    Staging,
    /// Everything is staged; commit steps may have run.
    Prepared,
    /// Every commit step ran and was synced.
    Committed,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) enum OpKind {
    Write,
    Symlink,
    Delete,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) enum Backup {
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
pub(super) struct DirRecord {
    pub(super) path: String,
    pub(super) perms: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Op {
    pub(super) path: String,
    pub(super) kind: OpKind,
    /// Staged new entry (in the journal directory) for Write/Symlink.
    pub(super) staged: Option<String>,
    /// The host entry replaced or deleted (None: there was none, or it was a directory).
    pub(super) backup: Option<Backup>,
    /// Host directories (bottom-up) removed because a file replaces them.
    pub(super) removed_dirs: Vec<DirRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Journal {
    pub(super) version: u32,
    pub(super) id: String,
    pub(super) state: JournalState,
    pub(super) ops: Vec<Op>,
    /// Directories created at commit (top-down), removed again on rollback when empty.
    pub(super) created_dirs: Vec<String>,
}

pub(super) fn journal_dir(id: &str) -> String {
    format!("{APPLY_DIR}/{id}")
}

pub(super) fn write_journal(b: &Beneath, j: &Journal) -> Result<(), PatchError> {
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

pub(super) struct LockGuard {
    _file: File,
}

pub(super) fn lock(b: &Beneath, root: &Path) -> Result<LockGuard, PatchError> {
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
