//! What an apply is asked to do and what it reports.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The conflict of a path in [`ApplyOptions::host_changed`].
pub const HOST_CHANGED: &str = "changed on the host while the step ran: the base the step saw is lost, so applying its version would undo the host's edit";

/// Options of [`apply_patches`](super::apply_patches).
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

/// The result of a successful [`apply_patches`](super::apply_patches).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplyReport {
    pub applied: Vec<AppliedFile>,
    /// Paths already in the patched state on the host (nothing to do).
    pub already_applied: Vec<String>,
    /// Interrupted applies found and recovered before this one (journal ids).
    pub recovered: Vec<String>,
}

/// The result of [`recover_apply`](super::recover_apply).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryReport {
    /// Journals that had not committed: their changes were undone.
    pub rolled_back: Vec<String>,
    /// Journals that had committed: their leftovers were cleaned up.
    pub rolled_forward: Vec<String>,
}
