//! How a step, a review or a recovery ended, as the caller gets it.

use std::path::PathBuf;

use serde_json::Value;
use smithers_store::PatchRecord;

/// What is left of a step once its outcome is recorded (see
/// [`Orchestrator::execute_then_finish`]): its sandbox's cleanup and its lease's release.
///
/// [`Orchestrator::execute_then_finish`]: crate::Orchestrator::execute_then_finish
pub type Finish = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;

/// A sandbox that reached a final status.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletedSandbox {
    /// finished, failed or cancelled (the step's own status; a failed step is not an error).
    pub status: String,
    pub outputs: Option<Value>,
    pub bundle_path: PathBuf,
    /// Patches applied to the root directory.
    pub applied_patches: u64,
    /// Files written with conflict markers (an accept that asked for them), to resolve by hand.
    pub conflict_markers: Vec<String>,
    /// The bundle's patch files and change notes as this lifecycle inspected them: a caller
    /// that shows the outcome reads the bundle again only for patches to show.
    pub patch_files: Vec<String>,
    pub change_notes: smithers_bundle::ChangeNotes,
}

/// A sandbox whose patches wait for a decision.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingReview {
    pub status: String,
    pub outputs: Option<Value>,
    pub bundle_path: PathBuf,
    pub patch_count: u64,
    pub total_diff_lines: u64,
    pub patches: Vec<PatchRecord>,
}

/// A result bundle a caller collected itself (the Smithers provider, from a `serve` host),
/// to be held for a durable review in this store: see [`Orchestrator::hold_for_review`].
///
/// [`Orchestrator::hold_for_review`]: crate::Orchestrator::hold_for_review
#[derive(Debug, Clone)]
pub struct HeldBundle {
    pub run_id: String,
    pub sandbox_id: String,
    /// The project the bundle's changes are to (what `review` shows them against).
    pub root_dir: PathBuf,
    pub bundle_path: PathBuf,
    /// The caller's runtime name for the row (e.g. `smithers-sandbox`).
    pub runtime: String,
    /// The host's id of the sandbox that produced it.
    pub remote_run_id: Option<String>,
}

/// How [`Orchestrator::execute`] ended when it did not fail.
///
/// [`Orchestrator::execute`]: crate::Orchestrator::execute
// One value per step, moved once to its caller: boxing the large variant would add an
// allocation and a deref at every use for no gain.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum SandboxOutcome {
    Completed(CompletedSandbox),
    AwaitingReview(PendingReview),
    /// Cancelled through the [`StepContext::cancel`] token; the bundle, when one could still be
    /// collected, is kept for inspection and nothing was applied.
    ///
    /// [`StepContext::cancel`]: crate::StepContext::cancel
    Cancelled {
        bundle_path: Option<PathBuf>,
    },
}

/// One sandbox recovered at start.
#[derive(Debug, Clone, PartialEq)]
pub struct RecoveredSandbox {
    pub run_id: String,
    pub sandbox_id: String,
    pub runtime: String,
    /// Whether `runtime.cleanup` ran on the stored handle and succeeded.
    pub cleaned_up: bool,
    /// Why cleanup did not happen or failed (leftovers may remain).
    pub cleanup_error: Option<String>,
    /// Whether the row was marked `failed` (orphaned). False when the database is not ours
    /// to act on (owned by another user): then recovery only reports.
    pub marked_failed: bool,
    /// A held session whose holder died: its change was collected from its layer and waits
    /// for review (the row is `review`, not `failed`).
    pub review_opened: bool,
}
