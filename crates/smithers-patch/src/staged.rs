//! Which changes the step staged in git (`git add`, `git rm`) without committing, so that
//! accept can stage them on the host as the step did. It reads the two indexes with the
//! reader of [`crate::gitindex`] and compares them with the change set that detection made.
//!
//! Kept out of the reader's module: change detection uses the reader (the tracked paths that
//! `.gitignore` needs), while this takes a change set, so it sits above detection and the
//! reader below it, with no module cycle.

use std::path::Path;

use crate::detect::{ChangeKind, ChangeSet};
use crate::gitindex::{object_id_len, read_entries};
use crate::model::GitMode;

/// The paths of `changes` the step staged (`git add`, `git rm`) without committing: its
/// index (`step_index`, the layer's) holds exactly the change's result (same mode and blob,
/// or no entry for a deletion) where the host's index (`<host_root>/.git/index`) does not.
/// Accept then stages them as the step did; a file staged at other content than the
/// working tree's (`git add` then another edit) is not staged, since that content was never
/// reviewed. Only a plain repository at the project's top is read (not a worktree or a
/// project below its repository's top: their index is elsewhere).
pub fn staged_paths(changes: &ChangeSet, host_root: &Path, step_index: &Path) -> Vec<String> {
    let git = host_root.join(".git");
    if !std::fs::symlink_metadata(&git).is_ok_and(|m| m.is_dir()) {
        return Vec::new();
    }
    let id_len = object_id_len(&git);
    let Some(step) = read_entries(step_index, id_len) else {
        return Vec::new();
    };
    let host = read_entries(&git.join("index"), id_len).unwrap_or_default();
    let mode_of = |m: GitMode| u32::from_str_radix(m.as_str(), 8).unwrap_or(0);
    changes
        .changes
        .iter()
        // A mode-only change's patch names no content (no `index` line), so accept could
        // not check what it stages: left unstaged.
        .filter(|c| c.kind != ChangeKind::ModeChanged)
        .filter(|c| {
            let want = c.new.as_ref().map(|v| (mode_of(v.mode), v.oid.as_str()));
            let in_step = step.get(&c.path).map(|e| (e.mode, e.oid.as_str()));
            let in_host = host.get(&c.path).map(|e| (e.mode, e.oid.as_str()));
            in_step == want && in_host != want
        })
        .map(|c| c.path.clone())
        .collect()
}
