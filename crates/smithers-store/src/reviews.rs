//! `_smithers_sandbox_reviews` and `_smithers_sandbox_patches`: durable reviews and the
//! patches they decide on.

use rusqlite::{params, OptionalExtension, Row, TransactionBehavior};
use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};
use crate::store::{CachedSql, Store};

/// State of a durable review.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReviewState {
    /// Waiting for a person.
    Pending,
    /// Accepted; the patches are being (or failed to be) applied.
    Accepted,
    /// Rejected; nothing was applied.
    Rejected,
    /// Accepted and applied to the root directory.
    Applied,
}

impl ReviewState {
    /// The stored string.
    pub fn as_str(self) -> &'static str {
        match self {
            ReviewState::Pending => "pending",
            ReviewState::Accepted => "accepted",
            ReviewState::Rejected => "rejected",
            ReviewState::Applied => "applied",
        }
    }

    fn parse(s: &str) -> ReviewState {
        match s {
            "accepted" => ReviewState::Accepted,
            "rejected" => ReviewState::Rejected,
            "applied" => ReviewState::Applied,
            // The CHECK constraint admits nothing else.
            _ => ReviewState::Pending,
        }
    }
}

/// A review to open (the sandbox row moves to `review` in the same transaction).
#[derive(Debug, Clone, PartialEq)]
pub struct NewReview {
    pub run_id: String,
    pub sandbox_id: String,
    /// Where accepted patches are applied.
    pub root_dir: String,
    pub bundle_path: String,
    /// The step's own status from the bundle manifest (finished/failed/cancelled).
    pub bundle_status: String,
    pub remote_run_id: Option<String>,
    pub patch_count: u64,
    pub total_diff_lines: u64,
    /// Execution duration, reported by SandboxCompleted once the review is decided.
    pub duration_ms: f64,
    pub requested_at_ms: i64,
    /// The digest of the bundle's README.md and patch files as they were when the review was
    /// opened; accept refuses a bundle whose digest differs.
    pub bundle_digest: String,
    /// Who applies the bundle once accepted: `None`, our accept; [`APPLIED_BY_CALLER`], the
    /// caller that held it for review (accept then records the decision and applies nothing).
    pub applied_by: Option<String>,
}

/// [`NewReview::applied_by`] of a bundle the caller applies itself (the Smithers provider's
/// durable review: Smithers applies the diffBundle a person accepted here).
pub const APPLIED_BY_CALLER: &str = "caller";

/// A stored review.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewRow {
    pub run_id: String,
    pub sandbox_id: String,
    pub state: ReviewState,
    pub reason: Option<String>,
    pub root_dir: String,
    pub bundle_path: String,
    pub bundle_status: String,
    pub remote_run_id: Option<String>,
    pub patch_count: u64,
    pub total_diff_lines: u64,
    pub duration_ms: f64,
    pub requested_at_ms: i64,
    pub decided_at_ms: Option<i64>,
    pub applied_at_ms: Option<i64>,
    /// Why the last accept could not apply the patches (the review is then `pending` again,
    /// so the accept can be retried once the cause is fixed, or the review rejected).
    pub apply_error: Option<String>,
    /// See [`NewReview::bundle_digest`]; `None` for a review opened by an older version.
    pub bundle_digest: Option<String>,
    /// See [`NewReview::applied_by`].
    pub applied_by: Option<String>,
}

impl ReviewRow {
    /// True when the caller that held the bundle applies it, not our accept.
    pub fn applied_by_caller(&self) -> bool {
        self.applied_by.as_deref() == Some(APPLIED_BY_CALLER)
    }
}

pub(crate) const REVIEW_COLUMNS: &str =
    "run_id, sandbox_id, state, reason, root_dir, bundle_path, \
     bundle_status, remote_run_id, patch_count, total_diff_lines, duration_ms, requested_at_ms, \
     decided_at_ms, applied_at_ms, apply_error, bundle_digest, applied_by";

pub(crate) fn review_row(r: &Row<'_>) -> rusqlite::Result<ReviewRow> {
    Ok(ReviewRow {
        run_id: r.get(0)?,
        sandbox_id: r.get(1)?,
        state: ReviewState::parse(&r.get::<_, String>(2)?),
        reason: r.get(3)?,
        root_dir: r.get(4)?,
        bundle_path: r.get(5)?,
        bundle_status: r.get(6)?,
        remote_run_id: r.get(7)?,
        patch_count: r.get(8)?,
        total_diff_lines: r.get(9)?,
        duration_ms: r.get(10)?,
        requested_at_ms: r.get(11)?,
        decided_at_ms: r.get(12)?,
        applied_at_ms: r.get(13)?,
        apply_error: r.get(14)?,
        bundle_digest: r.get(15)?,
        applied_by: r.get(16)?,
    })
}

/// What a patch does to its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PatchOperation {
    Add,
    Modify,
    Delete,
}

impl PatchOperation {
    /// `add`, `modify` or `delete` (the DiffBundle vocabulary).
    pub fn as_str(self) -> &'static str {
        match self {
            PatchOperation::Add => "add",
            PatchOperation::Modify => "modify",
            PatchOperation::Delete => "delete",
        }
    }

    fn parse(s: &str) -> PatchOperation {
        match s {
            "add" => PatchOperation::Add,
            "delete" => PatchOperation::Delete,
            _ => PatchOperation::Modify,
        }
    }
}

/// One recorded patch of a review, per file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PatchRecord {
    /// File path relative to the root directory.
    pub path: String,
    pub operation: PatchOperation,
    /// Hash of the file the patch expects (None for `add`).
    pub base_hash: Option<String>,
    /// Hash of the file after the patch (None for `delete`).
    pub new_hash: Option<String>,
    /// The patch file, relative to the bundle (`patches/...`).
    pub patch_path: String,
}

impl Store {
    /// Opens a durable review: in one transaction the review row (`pending`), its patches and
    /// the sandbox row's status `review` (bundle path set) are written.
    pub fn open_review(&self, review: &NewReview, patches: &[PatchRecord]) -> Result<()> {
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::query("open_review"))?;
        let n = tx
            .exec(
                "UPDATE _smithers_sandboxes SET status = 'review', bundle_path = ?3
                 WHERE run_id = ?1 AND sandbox_id = ?2",
                params![review.run_id, review.sandbox_id, review.bundle_path],
            )
            .map_err(StoreError::query("open_review"))?;
        if n == 0 {
            return Err(StoreError::SandboxNotFound {
                run_id: review.run_id.clone(),
                sandbox_id: review.sandbox_id.clone(),
            });
        }
        tx.exec(
            &format!(
                "INSERT OR REPLACE INTO _smithers_sandbox_reviews ({REVIEW_COLUMNS})
                 VALUES (?1, ?2, 'pending', NULL, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, NULL, NULL, NULL, ?11, ?12)"
            ),
            params![
                review.run_id,
                review.sandbox_id,
                review.root_dir,
                review.bundle_path,
                review.bundle_status,
                review.remote_run_id,
                review.patch_count as i64,
                review.total_diff_lines as i64,
                review.duration_ms,
                review.requested_at_ms,
                review.bundle_digest,
                review.applied_by
            ],
        )
        .map_err(StoreError::query("open_review"))?;
        tx.exec(
            "DELETE FROM _smithers_sandbox_patches WHERE run_id = ?1 AND sandbox_id = ?2",
            params![review.run_id, review.sandbox_id],
        )
        .map_err(StoreError::query("open_review"))?;
        for (idx, p) in patches.iter().enumerate() {
            tx.exec(
                "INSERT INTO _smithers_sandbox_patches
                    (run_id, sandbox_id, idx, path, operation, base_hash, new_hash, patch_path)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    review.run_id,
                    review.sandbox_id,
                    idx as i64,
                    p.path,
                    p.operation.as_str(),
                    p.base_hash,
                    p.new_hash,
                    p.patch_path
                ],
            )
            .map_err(StoreError::query("open_review"))?;
        }
        tx.commit().map_err(StoreError::query("open_review"))
    }

    /// The review of a sandbox.
    pub fn get_review(&self, run_id: &str, sandbox_id: &str) -> Result<Option<ReviewRow>> {
        self.conn()?
            .row(
                &format!(
                    "SELECT {REVIEW_COLUMNS} FROM _smithers_sandbox_reviews WHERE run_id = ?1 AND sandbox_id = ?2"
                ),
                params![run_id, sandbox_id],
                review_row,
            )
            .optional()
            .map_err(StoreError::query("get_review"))
    }

    /// Reviews, optionally only those in one state, oldest request first.
    pub fn list_reviews(&self, state: Option<ReviewState>) -> Result<Vec<ReviewRow>> {
        let conn = self.conn()?;
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {REVIEW_COLUMNS} FROM _smithers_sandbox_reviews
                 WHERE ?1 IS NULL OR state = ?1 ORDER BY requested_at_ms, run_id, sandbox_id"
            ))
            .map_err(StoreError::query("list_reviews"))?;
        let rows = stmt
            .query_map([state.map(ReviewState::as_str)], review_row)
            .and_then(|r| r.collect())
            .map_err(StoreError::query("list_reviews"));
        rows
    }

    /// The recorded patches of a sandbox, in bundle order.
    pub fn patches(&self, run_id: &str, sandbox_id: &str) -> Result<Vec<PatchRecord>> {
        let conn = self.conn()?;
        let mut stmt = conn
            .prepare_cached(
                "SELECT path, operation, base_hash, new_hash, patch_path
                 FROM _smithers_sandbox_patches WHERE run_id = ?1 AND sandbox_id = ?2 ORDER BY idx",
            )
            .map_err(StoreError::query("patches"))?;
        let rows = stmt
            .query_map(params![run_id, sandbox_id], |r| {
                Ok(PatchRecord {
                    path: r.get(0)?,
                    operation: PatchOperation::parse(&r.get::<_, String>(1)?),
                    base_hash: r.get(2)?,
                    new_hash: r.get(3)?,
                    patch_path: r.get(4)?,
                })
            })
            .and_then(|r| r.collect())
            .map_err(StoreError::query("patches"));
        rows
    }

    /// Moves a review from `from` to `to` (compare-and-set: two people deciding at once, only
    /// one wins; the other gets [`StoreError::ReviewTransition`]). Allowed moves: pending →
    /// accepted | rejected, accepted → applied, and accepted → pending when the patches could
    /// not be applied (the accept can then be retried). `reason` and `apply_error` are written when
    /// given; the decision / apply time is `at_ms`.
    pub fn transition_review(
        &self,
        run_id: &str,
        sandbox_id: &str,
        from: ReviewState,
        to: ReviewState,
        reason: Option<&str>,
        at_ms: i64,
    ) -> Result<ReviewRow> {
        let allowed = matches!(
            (from, to),
            (ReviewState::Pending, ReviewState::Accepted)
                | (ReviewState::Pending, ReviewState::Rejected)
                | (ReviewState::Accepted, ReviewState::Applied)
                | (ReviewState::Accepted, ReviewState::Pending)
        );
        let current =
            self.get_review(run_id, sandbox_id)?
                .ok_or_else(|| StoreError::SandboxNotFound {
                    run_id: run_id.to_string(),
                    sandbox_id: sandbox_id.to_string(),
                })?;
        let refuse = |from: ReviewState| StoreError::ReviewTransition {
            run_id: run_id.to_string(),
            sandbox_id: sandbox_id.to_string(),
            from: from.as_str().to_string(),
            to: to.as_str().to_string(),
        };
        if !allowed {
            return Err(refuse(from));
        }
        let time_column = if to == ReviewState::Applied {
            "applied_at_ms"
        } else {
            "decided_at_ms"
        };
        let n = self
            .conn()?
            .exec(
                &format!(
                    "UPDATE _smithers_sandbox_reviews
                     SET state = ?4, {time_column} = ?5, reason = COALESCE(?6, reason)
                     WHERE run_id = ?1 AND sandbox_id = ?2 AND state = ?3"
                ),
                params![
                    run_id,
                    sandbox_id,
                    from.as_str(),
                    to.as_str(),
                    at_ms,
                    reason
                ],
            )
            .map_err(StoreError::query("transition_review"))?;
        if n == 0 {
            let now = self
                .get_review(run_id, sandbox_id)?
                .map(|r| r.state)
                .unwrap_or(current.state);
            return Err(refuse(now));
        }
        self.get_review(run_id, sandbox_id)?
            .ok_or_else(|| StoreError::SandboxNotFound {
                run_id: run_id.to_string(),
                sandbox_id: sandbox_id.to_string(),
            })
    }

    /// Records why applying an accepted review failed.
    pub fn record_apply_error(&self, run_id: &str, sandbox_id: &str, error: &str) -> Result<()> {
        self.conn()?
            .exec(
                "UPDATE _smithers_sandbox_reviews SET apply_error = ?3
                 WHERE run_id = ?1 AND sandbox_id = ?2",
                params![run_id, sandbox_id, error],
            )
            .map_err(StoreError::query("record_apply_error"))?;
        Ok(())
    }
}
