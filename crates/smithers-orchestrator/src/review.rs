//! Durable reviews: opening one (from a step's lifecycle or a bundle a caller holds), and
//! accepting or rejecting it later, from any process.

use std::path::Path;

use serde_json::json;
use smithers_store::{
    Field, NewReview, PatchRecord, RedactedConfig, ReviewState, RunStatus, SandboxStatus,
    SandboxUpsert, StoreError,
};
use tracing::{info, warn};

use crate::bundle::{bundle_digest, InspectedBundle};
use crate::engine::Orchestrator;
use crate::error::{error_to_json, OrchestratorError};
use crate::outcome::{CompletedSandbox, HeldBundle, PendingReview};
use crate::support::{now_ms, off_worker};

impl Orchestrator {
    pub(crate) fn pending_review(
        &self,
        run_id: &str,
        sandbox_id: &str,
    ) -> Result<smithers_store::ReviewRow, OrchestratorError> {
        match off_worker(|| self.store.get_review(run_id, sandbox_id))? {
            Some(r) if r.state == ReviewState::Pending => Ok(r),
            _ => Err(OrchestratorError::NoPendingReview {
                run_id: run_id.to_string(),
                sandbox_id: sandbox_id.to_string(),
            }),
        }
    }

    pub(crate) fn claim_review(
        &self,
        run_id: &str,
        sandbox_id: &str,
        to: ReviewState,
        reason: Option<&str>,
    ) -> Result<smithers_store::ReviewRow, OrchestratorError> {
        off_worker(|| {
            self.store.transition_review(
                run_id,
                sandbox_id,
                ReviewState::Pending,
                to,
                reason,
                now_ms(),
            )
        })
        .map_err(|e| match e {
            StoreError::ReviewTransition { .. } | StoreError::SandboxNotFound { .. } => {
                OrchestratorError::NoPendingReview {
                    run_id: run_id.to_string(),
                    sandbox_id: sandbox_id.to_string(),
                }
            }
            other => other.into(),
        })
    }

    /// Accepts a pending review: the bundle is validated again (it waited on disk) and must
    /// be byte for byte the one the review was opened on (its recorded digest), then its
    /// patches are applied to the recorded root directory (all or nothing), then
    /// SandboxDiffAccepted and SandboxCompleted. If the bundle changed or applying fails
    /// (a conflict, a read-only or full disk), nothing is applied, the review is `pending`
    /// again with the error recorded, and SandboxDiffApplyFailed {error} is emitted: the
    /// accept can be retried once the cause is fixed, or the review rejected. Once applied, a
    /// workspace layer the backend kept (changes left out for a size limit) is removed.
    pub async fn accept(
        &self,
        run_id: &str,
        sandbox_id: &str,
    ) -> Result<CompletedSandbox, OrchestratorError> {
        self.accept_with(run_id, sandbox_id, false).await
    }

    /// [`Orchestrator::accept`]; with `conflict_markers`, text conflicts (a host edit next to
    /// the step's, a file the host changed while the step ran) are written with conflict
    /// markers for a person to resolve instead of refusing the accept
    /// ([`CompletedSandbox::conflict_markers`] names them). Conflicts markers cannot express
    /// still refuse it, all or nothing.
    pub async fn accept_with(
        &self,
        run_id: &str,
        sandbox_id: &str,
        conflict_markers: bool,
    ) -> Result<CompletedSandbox, OrchestratorError> {
        self.accept_onto(run_id, sandbox_id, conflict_markers, None)
            .await
    }

    /// [`Orchestrator::accept_with`]; with `branch`, the step's commits go onto that new
    /// branch of the host's repository and nothing else is applied (the host's HEAD, index
    /// and working tree stay as they are): refused, all or nothing, when the step made no
    /// commits, left changes it did not commit, or the branch exists.
    pub async fn accept_onto(
        &self,
        run_id: &str,
        sandbox_id: &str,
        conflict_markers: bool,
        branch: Option<&str>,
    ) -> Result<CompletedSandbox, OrchestratorError> {
        self.pending_review(run_id, sandbox_id)?;
        // Compare-and-set: of two people accepting at once, one proceeds.
        let review = self.claim_review(run_id, sandbox_id, ReviewState::Accepted, None)?;
        let runtime_name = off_worker(|| self.store.get_sandbox(run_id, sandbox_id))?
            .map(|r| r.runtime)
            .unwrap_or_default();
        // Validating the bundle again and applying it (file reads, writes and fsyncs of the
        // project) is blocking work: off the async workers.
        let applied =
            off_worker(|| self.verify_and_apply(&review, sandbox_id, conflict_markers, branch));
        let (bundle, marked) = match applied {
            Ok(b) => b,
            Err(err) => {
                self.reopen_review(run_id, sandbox_id, &err);
                return Err(err);
            }
        };
        // A caller-applied review stays `accepted`: the caller applies it, not us.
        if !review.applied_by_caller() {
            off_worker(|| {
                self.store.transition_review(
                    run_id,
                    sandbox_id,
                    ReviewState::Accepted,
                    ReviewState::Applied,
                    None,
                    now_ms(),
                )
            })?;
        }
        let mut accepted = vec![("patchCount", json!(review.patch_count))];
        if !marked.is_empty() {
            accepted.push(("conflictMarkers", json!(marked)));
        }
        self.emit(
            "SandboxDiffAccepted",
            run_id,
            sandbox_id,
            accepted,
            now_ms(),
        )?;
        let completed_at = now_ms();
        off_worker(|| {
            self.store.upsert_sandbox(&SandboxUpsert {
                status: Some(SandboxStatus::parse(&review.bundle_status)),
                heartbeat_at_ms: Field::Value(completed_at),
                completed_at_ms: Field::Value(completed_at),
                ..SandboxUpsert::key(run_id, sandbox_id)
            })
        })?;
        self.emit(
            "SandboxCompleted",
            run_id,
            sandbox_id,
            vec![
                ("remoteRunId", json!(review.remote_run_id)),
                ("runtime", json!(runtime_name)),
                ("status", json!(review.bundle_status)),
                ("durationMs", json!(review.duration_ms)),
            ],
            completed_at,
        )?;
        self.metrics
            .sandbox_completed(&runtime_name, &review.bundle_status);
        self.metrics.observe_duration_ms(review.duration_ms);
        self.settle_cli_run(
            run_id,
            RunStatus::of_bundle_status(&review.bundle_status),
            completed_at,
            None,
        );
        // A kept layer holds the changes the patches left out: accepting applied none of
        // them, so it stays (named in changeNotes.keptLayer) until the sandbox is rejected
        // or cleaned up; deleting it here would lose the step's only copy.
        let applied_patches = if review.applied_by_caller() {
            0
        } else {
            review.patch_count
        };
        Ok(CompletedSandbox {
            status: review.bundle_status,
            outputs: bundle.outputs,
            bundle_path: bundle.bundle_path,
            applied_patches,
            conflict_markers: marked,
            patch_files: bundle.patch_files,
            change_notes: bundle.change_notes,
        })
    }

    /// The accept's blocking half: the bundle validated again and checked against the
    /// reviewed bytes (its recorded digest), then applied (to the working tree, or as a new
    /// branch), or nothing applied when its caller applies it. The bundle, and the files
    /// written with conflict markers.
    fn verify_and_apply(
        &self,
        review: &smithers_store::ReviewRow,
        sandbox_id: &str,
        conflict_markers: bool,
        branch: Option<&str>,
    ) -> Result<(InspectedBundle, Vec<String>), OrchestratorError> {
        self.inspector
            .inspect(std::path::Path::new(&review.bundle_path))
            .map_err(|report| OrchestratorError::Bundle {
                report: Box::new(report),
            })
            .and_then(|bundle| {
                let found = bundle_digest(&bundle).map_err(|report| OrchestratorError::Bundle {
                    report: Box::new(report),
                })?;
                let recorded = review.bundle_digest.clone().unwrap_or_default();
                if found != recorded {
                    return Err(OrchestratorError::BundleChanged {
                        sandbox_id: sandbox_id.to_string(),
                        recorded: if recorded.is_empty() {
                            "none".into()
                        } else {
                            recorded
                        },
                        found,
                    });
                }
                Ok((bundle, recorded))
            })
            .and_then(|(bundle, recorded)| {
                let root = std::path::Path::new(&review.root_dir);
                if review.applied_by_caller() {
                    // Held by a caller that applies it itself (the Smithers provider):
                    // accepting is the decision, checked against the reviewed bytes
                    // above; nothing is applied here.
                    if branch.is_some() {
                        return Err(OrchestratorError::CallerApplies {
                            sandbox_id: sandbox_id.to_string(),
                        });
                    }
                    return Ok((bundle, Vec::new()));
                }
                // The applier checks the digest again on the bytes it applies: a file swapped
                // between the check above and the apply is never applied.
                let applied = match branch {
                    None => self
                        .applier
                        .apply_reviewed(root, &bundle, &recorded, conflict_markers),
                    Some(b) => self
                        .applier
                        .apply_reviewed_onto_branch(root, &bundle, &recorded, b)
                        .map(|()| Vec::new()),
                };
                applied
                    .map_err(|report| OrchestratorError::Apply {
                        sandbox_id: sandbox_id.to_string(),
                        report: Box::new(report),
                    })
                    .map(|marked| (bundle, marked))
            })
    }

    pub(crate) fn emit_bundle_received(
        &self,
        run_id: &str,
        sid: &str,
        bundle: &InspectedBundle,
        at_ms: i64,
    ) -> Result<i64, StoreError> {
        self.emit(
            "SandboxBundleReceived",
            run_id,
            sid,
            vec![
                ("bundleSizeBytes", json!(bundle.bundle_size_bytes)),
                ("patchCount", json!(bundle.patch_count())),
                ("hasOutputs", json!(bundle.outputs.is_some())),
            ],
            at_ms,
        )
    }

    pub(crate) fn emit_review_requested(
        &self,
        run_id: &str,
        sid: &str,
        patch_count: u64,
        total_diff_lines: u64,
        at_ms: i64,
    ) -> Result<i64, StoreError> {
        self.emit(
            "SandboxDiffReviewRequested",
            run_id,
            sid,
            vec![
                ("patchCount", json!(patch_count)),
                ("totalDiffLines", json!(total_diff_lines)),
            ],
            at_ms,
        )
    }

    /// Opens `review` (pending) on `bundle`: its patches described and the digest the accept
    /// must find again (it reads the whole bundle) filled in. The patches, for the caller.
    pub(crate) fn open_pending_review(
        &self,
        bundle: &InspectedBundle,
        mut review: NewReview,
    ) -> Result<Vec<PatchRecord>, OrchestratorError> {
        let bundle_error = |report| OrchestratorError::Bundle {
            report: Box::new(report),
        };
        let patches = off_worker(|| self.applier.describe(bundle)).map_err(bundle_error)?;
        review.bundle_digest = off_worker(|| bundle_digest(bundle)).map_err(bundle_error)?;
        off_worker(|| self.store.open_review(&review, &patches))?;
        Ok(patches)
    }

    /// Holds a bundle a caller collected for a durable review here, as if a step of this
    /// orchestrator had produced it: the bundle is validated (it came from another host and is
    /// untrusted), the sandbox row is written (status `review`), SandboxBundleReceived and
    /// SandboxDiffReviewRequested are emitted and the review is opened `pending`, with the
    /// digest accept checks. [`Orchestrator::accept`] then records the decision and applies
    /// nothing (the caller applies the bundle); [`Orchestrator::reject`] as for any review.
    /// Holding again (a resumed or retried run) replaces an earlier review of the same ids.
    pub async fn hold_for_review(
        &self,
        held: &HeldBundle,
    ) -> Result<PendingReview, OrchestratorError> {
        let (run_id, sid) = (held.run_id.as_str(), held.sandbox_id.as_str());
        let bundle =
            off_worker(|| self.inspector.inspect(&held.bundle_path)).map_err(|report| {
                OrchestratorError::Bundle {
                    report: Box::new(report),
                }
            })?;
        let patch_count = bundle.patch_count();
        if patch_count == 0 {
            return Err(OrchestratorError::NothingToReview {
                sandbox_id: sid.to_string(),
            });
        }
        let total_diff_lines =
            bundle
                .total_diff_lines()
                .map_err(|report| OrchestratorError::Bundle {
                    report: Box::new(report),
                })?;
        let now = now_ms();
        let bundle_path = bundle.bundle_path.to_string_lossy().into_owned();
        off_worker(|| {
            self.store.upsert_sandbox(&SandboxUpsert {
                runtime: Some(held.runtime.clone()),
                remote_run_id: Field::from_option(held.remote_run_id.clone()),
                config: Some(RedactedConfig::new(&json!({
                    "provider": held.runtime,
                    "heldForReview": true,
                }))),
                // Never an active row: it holds no runtime resources and no gate slot.
                status: Some(SandboxStatus::Review),
                heartbeat_at_ms: Field::Value(now),
                bundle_path: Field::Value(bundle_path.clone()),
                ..SandboxUpsert::key(run_id, sid)
            })
        })?;
        self.emit_bundle_received(run_id, sid, &bundle, now)?;
        self.emit_review_requested(run_id, sid, patch_count, total_diff_lines, now)?;
        let patches = self.open_pending_review(
            &bundle,
            NewReview {
                run_id: run_id.to_string(),
                sandbox_id: sid.to_string(),
                root_dir: held.root_dir.to_string_lossy().into_owned(),
                bundle_path: bundle_path.clone(),
                bundle_status: bundle.status.clone(),
                remote_run_id: held.remote_run_id.clone(),
                patch_count,
                total_diff_lines,
                duration_ms: 0.0,
                requested_at_ms: now,
                bundle_digest: String::new(),
                applied_by: Some(smithers_store::APPLIED_BY_CALLER.to_string()),
            },
        )?;
        Ok(PendingReview {
            status: bundle.status,
            outputs: bundle.outputs,
            bundle_path: bundle.bundle_path,
            patch_count,
            total_diff_lines,
            patches,
        })
    }

    /// Rejects a pending review: nothing is applied; SandboxDiffRejected {reason}, then the
    /// sandbox fails (row `failed`, SandboxFailed with INVALID_INPUT) since its changes were
    /// refused. The bundle stays on disk; a kept workspace layer goes (see
    /// `remove_kept_layer`).
    pub async fn reject(
        &self,
        run_id: &str,
        sandbox_id: &str,
        reason: &str,
    ) -> Result<(), OrchestratorError> {
        self.pending_review(run_id, sandbox_id)?;
        let review = self.claim_review(run_id, sandbox_id, ReviewState::Rejected, Some(reason))?;
        let runtime_name = off_worker(|| self.store.get_sandbox(run_id, sandbox_id))?
            .map(|r| r.runtime)
            .unwrap_or_default();
        self.emit(
            "SandboxDiffRejected",
            run_id,
            sandbox_id,
            vec![("reason", json!(reason))],
            now_ms(),
        )?;
        let err = OrchestratorError::ReviewRejected {
            sandbox_id: sandbox_id.to_string(),
            patch_count: review.patch_count,
            reason: reason.to_string(),
        };
        self.fail_reviewed(run_id, sandbox_id, &runtime_name, &err);
        self.settle_cli_run(
            run_id,
            RunStatus::Failed,
            now_ms(),
            Some(&error_to_json(&err)),
        );
        self.remove_kept_layer(run_id, sandbox_id, &review.root_dir);
        Ok(())
    }

    /// Once a review is decided, the workspace layer a backend kept for changes left out for
    /// a size limit (`<root>/.smithers/sandboxes/<runId>/<sandboxId>/kept-layer`) has served
    /// its purpose: it is removed. The path is derived from the ids, and the root is the
    /// review's only when it is this database's project (a database in a project names no
    /// other); a failure is logged, the decision stands.
    pub(crate) fn remove_kept_layer(&self, run_id: &str, sandbox_id: &str, root_dir: &str) {
        let root = Path::new(root_dir);
        if let Some(project) = self.database_project() {
            if project != root {
                warn!(run_id, sandbox_id, root_dir, "the review names another project than this database's; its kept layer, if any, is left alone");
                return;
            }
        }
        match off_worker(|| {
            smithers_runtime::kept_layer::remove_kept_layer(root, run_id, sandbox_id)
        }) {
            Ok(true) => info!(run_id, sandbox_id, "kept workspace layer removed"),
            Ok(false) => {}
            Err(e) => {
                warn!(run_id, sandbox_id, error = %e, "removing the kept workspace layer failed")
            }
        }
    }

    /// After a failed accept: the error is recorded, the review is `pending` again (nothing
    /// was applied) and SandboxDiffApplyFailed says why. Failures to record are logged: the
    /// apply error is what the caller gets.
    pub(crate) fn reopen_review(&self, run_id: &str, sandbox_id: &str, err: &OrchestratorError) {
        if let Err(e) = off_worker(|| {
            self.store
                .record_apply_error(run_id, sandbox_id, &err.to_string())
        }) {
            warn!(run_id, sandbox_id, error = %e, "recording the apply error failed");
        }
        if let Err(e) = off_worker(|| {
            self.store.transition_review(
                run_id,
                sandbox_id,
                ReviewState::Accepted,
                ReviewState::Pending,
                None,
                now_ms(),
            )
        }) {
            warn!(run_id, sandbox_id, error = %e, "reopening the review failed");
        }
        if let Err(e) = self.emit(
            "SandboxDiffApplyFailed",
            run_id,
            sandbox_id,
            vec![("error", error_to_json(err))],
            now_ms(),
        ) {
            warn!(run_id, sandbox_id, error = %e, "apply failure event emit failed");
        }
    }

    pub(crate) fn fail_reviewed(
        &self,
        run_id: &str,
        sandbox_id: &str,
        runtime_name: &str,
        err: &OrchestratorError,
    ) {
        let now = now_ms();
        if let Err(e) = off_worker(|| {
            self.store.upsert_sandbox(&SandboxUpsert {
                status: Some(SandboxStatus::Failed),
                heartbeat_at_ms: Field::Value(now),
                completed_at_ms: Field::Value(now),
                ..SandboxUpsert::key(run_id, sandbox_id)
            })
        }) {
            warn!(run_id, sandbox_id, error = %e, "sandbox failure upsert failed");
        }
        if let Err(e) = self.emit(
            "SandboxFailed",
            run_id,
            sandbox_id,
            vec![
                ("runtime", json!(runtime_name)),
                ("error", error_to_json(err)),
            ],
            now,
        ) {
            warn!(run_id, sandbox_id, error = %e, "sandbox failure event emit failed");
        }
        self.metrics.sandbox_completed(runtime_name, "failed");
    }
}
