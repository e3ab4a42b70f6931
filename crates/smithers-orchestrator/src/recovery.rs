//! Crash recovery: sandboxes whose owner process died are cleaned up through their stored
//! handle, when it may be acted on, and marked failed (orphaned).

use std::path::Path;

use serde_json::json;
use smithers_runtime::SandboxHandle;
use smithers_store::RunStatus;
use tracing::warn;

use crate::engine::Orchestrator;
use crate::error::{error_to_json, OrchestratorError};
use crate::outcome::RecoveredSandbox;
use crate::support::{now_ms, off_worker};

/// What became of a lost session.
enum Lost {
    /// Recovered (its review opened, or failed with the reason).
    Reviewable(RecoveredSandbox),
    /// Another process recovered it.
    ClaimedElsewhere,
    /// Its handle may not be acted on (why, when it says more than the orphan path will):
    /// recovered as any orphan.
    NotCollected(Option<String>),
}

/// Whether the orphan is a held session (its recorded config says so). The config comes from
/// the database too, so a crafted row can claim to be a session and get its handle collected:
/// harmless only because that collect is confined (`Runtime::collect_stored` recomputes every
/// directory from the ids under the runtime's own roots and refuses a handle naming others,
/// and the project's sandbox directories must hold no link), never through the handle's own
/// paths.
fn is_session(orphan: &smithers_store::Orphan) -> bool {
    serde_json::from_str::<serde_json::Value>(&orphan.sandbox.config_json)
        .is_ok_and(|c| c.get("session").is_some_and(|s| s.is_object()))
}

impl Orchestrator {
    /// Crash recovery, to run at start: every sandbox still active whose owner process is
    /// dead (gone, pid reused, host rebooted) has what is left of it cleaned up through its
    /// stored handle, is marked `failed` with reason `orphaned` (SandboxFailed), and so frees
    /// its gate slot. Reviews are never touched. Safe to run from several processes at once:
    /// one of them wins each sandbox.
    ///
    /// The database lives in the project tree, so it is not trusted to name host objects: a
    /// database file owned by another user is only reported on (nothing cleaned up, no row
    /// changed); a lease from another boot is marked failed but its handle is not acted on
    /// (its processes died with that boot, and what it names may not be ours); a handle whose
    /// ids or directories are not the ones derived for its row is refused. The runtimes check
    /// the rest (see their `cleanup`).
    pub async fn recover(&self) -> Result<Vec<RecoveredSandbox>, OrchestratorError> {
        let orphans = off_worker(|| self.store.orphaned_sandboxes())?;
        if orphans.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(why) = self.store.foreign_owner() {
            warn!(reason = %why, "database not ours: orphaned sandboxes only reported");
            return Ok(orphans
                .into_iter()
                .map(|o| RecoveredSandbox {
                    run_id: o.sandbox.run_id,
                    sandbox_id: o.sandbox.sandbox_id,
                    runtime: o.sandbox.runtime,
                    cleaned_up: false,
                    cleanup_error: Some(format!("not acted on: {why}")),
                    marked_failed: false,
                    review_opened: false,
                })
                .collect());
        }
        let mut out = Vec::new();
        for orphan in orphans {
            let mut not_collected = None;
            if is_session(&orphan) {
                match self.recover_lost_session(&orphan).await? {
                    Lost::Reviewable(recovered) => {
                        out.push(recovered);
                        continue;
                    }
                    Lost::ClaimedElsewhere => continue,
                    Lost::NotCollected(why) => not_collected = why,
                }
            }
            let run_id = orphan.sandbox.run_id.clone();
            let sandbox_id = orphan.sandbox.sandbox_id.clone();
            let runtime_name = orphan.sandbox.runtime.clone();
            // Kill what is left first (cleanup is idempotent), then free the slot.
            let (cleaned_up, mut cleanup_error) = self.clean_up_orphan(&orphan).await;
            if let Some(why) = not_collected {
                // The session's change was not collected: said first, whatever cleanup did.
                let why = format!("the lost session's change was not collected: {why}");
                cleanup_error = Some(match cleanup_error {
                    Some(e) => format!("{why}; {e}"),
                    None => why,
                });
            }
            if let Some(reason) = &cleanup_error {
                warn!(run_id = %run_id, sandbox_id = %sandbox_id, reason = %reason, "orphaned sandbox not cleaned up");
            }
            let now = now_ms();
            if !off_worker(|| self.store.mark_orphan_failed(&orphan, now))? {
                continue;
            }
            let report = smithers_errors::ErrorReport::new(
                smithers_errors::ErrorCode::SandboxExecutionFailed,
                "Sandbox owner process exited before the sandbox finished (orphaned).",
            )
            .with_details(json!({
                "reason": "orphaned",
                "ownerPid": orphan.lease.owner.pid,
                "ownerHost": orphan.lease.owner.host,
                "cleanedUp": cleaned_up,
                "cleanupError": cleanup_error,
            }));
            self.settle_cli_run(
                &run_id,
                RunStatus::Failed,
                now,
                Some(&error_to_json(&report)),
            );
            if let Err(e) = self.emit(
                "SandboxFailed",
                &run_id,
                &sandbox_id,
                vec![
                    ("runtime", json!(runtime_name)),
                    ("error", error_to_json(&report)),
                ],
                now,
            ) {
                warn!(run_id = %run_id, sandbox_id = %sandbox_id, error = %e, "orphan failure event emit failed");
            }
            self.metrics.sandbox_completed(&runtime_name, "failed");
            out.push(RecoveredSandbox {
                run_id,
                sandbox_id,
                runtime: runtime_name,
                cleaned_up,
                cleanup_error,
                marked_failed: true,
                review_opened: false,
            });
        }
        Ok(out)
    }

    /// A held session whose holder died (SIGKILL, a crash): its sandbox died with the holder
    /// (its init saw its control socket end), but its layer is on disk. Claimed as any
    /// orphan, then its change is collected and opened for review, as its stop would have
    /// (its bundle `failed`: the session did not end well); a `SessionLost` event says why.
    /// Nothing to review, or a handle that may not be acted on: the orphan path.
    ///
    /// The handle comes from the database, so it is collected only confined
    /// ([`smithers_runtime::Runtime::collect_stored`]: its directories recomputed from the
    /// ids and checked by the runtime), and only when no directory from `<project>/.smithers`
    /// down to the sandbox's is a link; a runtime's refusal fails the session saying why.
    async fn recover_lost_session(
        &self,
        orphan: &smithers_store::Orphan,
    ) -> Result<Lost, OrchestratorError> {
        let Some((handle, rt)) = self.actionable_handle(orphan) else {
            return Ok(Lost::NotCollected(None));
        };
        let real = handle
            .project_root()
            .and_then(|root| handle.check_project_dirs_real(&root));
        if let Err(e) = real {
            return Ok(Lost::NotCollected(Some(e.to_string())));
        }
        let now = now_ms();
        // The claim comes first (one recovering process wins the sandbox): its processes
        // are gone already, and only the winner may write its bundle.
        if !off_worker(|| self.store.mark_orphan_failed(orphan, now))? {
            return Ok(Lost::ClaimedElsewhere);
        }
        let (run_id, sid) = (&orphan.sandbox.run_id, &orphan.sandbox.sandbox_id);
        let opened = match self.timed(rt.collect_stored(&handle)).await {
            Ok(report) => self.open_lost_review(orphan, &handle, &report.bundle_path, now),
            Err(e) => Err(OrchestratorError::Runtime {
                verb: "collect",
                source: e,
            }),
        };
        let cleaned = self.timed(rt.cleanup(&handle)).await;
        let cleanup_error = cleaned.err().map(|e| e.to_string());
        match opened {
            Ok(true) => Ok(Lost::Reviewable(RecoveredSandbox {
                run_id: run_id.clone(),
                sandbox_id: sid.clone(),
                runtime: orphan.sandbox.runtime.clone(),
                cleaned_up: cleanup_error.is_none(),
                cleanup_error,
                marked_failed: false,
                review_opened: true,
            })),
            other => {
                let why = match other {
                    Err(e) => format!("its change could not be collected: {e}"),
                    _ => "it changed nothing".to_string(),
                };
                self.record_lost(orphan, &why, now);
                Ok(Lost::Reviewable(RecoveredSandbox {
                    run_id: run_id.clone(),
                    sandbox_id: sid.clone(),
                    runtime: orphan.sandbox.runtime.clone(),
                    cleaned_up: cleanup_error.is_none(),
                    cleanup_error,
                    marked_failed: true,
                    review_opened: false,
                }))
            }
        }
    }

    /// Opens the review of a lost session's bundle at `bundle_path`: `false` when it holds no
    /// change.
    fn open_lost_review(
        &self,
        orphan: &smithers_store::Orphan,
        handle: &SandboxHandle,
        bundle_path: &Path,
        now: i64,
    ) -> Result<bool, OrchestratorError> {
        let (run_id, sid) = (&orphan.sandbox.run_id, &orphan.sandbox.sandbox_id);
        let bundle_error = |report| OrchestratorError::Bundle {
            report: Box::new(report),
        };
        let bundle = off_worker(|| self.inspector.inspect(bundle_path)).map_err(bundle_error)?;
        let patch_count = bundle.patch_count();
        if patch_count == 0 {
            return Ok(false);
        }
        let total_diff_lines = bundle.total_diff_lines().map_err(bundle_error)?;
        let path_text = bundle.bundle_path.to_string_lossy().into_owned();
        off_worker(|| {
            self.store.upsert_sandbox(&smithers_store::SandboxUpsert {
                status: Some(smithers_store::SandboxStatus::Review),
                heartbeat_at_ms: smithers_store::Field::Value(now),
                bundle_path: smithers_store::Field::Value(path_text.clone()),
                ..smithers_store::SandboxUpsert::key(run_id, sid)
            })
        })?;
        self.emit(
            "SessionLost",
            run_id,
            sid,
            vec![
                (
                    "reason",
                    json!("the session's holder exited before the session was stopped"),
                ),
                ("ownerPid", json!(orphan.lease.owner.pid)),
            ],
            now,
        )?;
        self.emit_bundle_received(run_id, sid, &bundle, now)?;
        self.emit_review_requested(run_id, sid, patch_count, total_diff_lines, now)?;
        let root = handle
            .project_root()
            .map_err(|e| OrchestratorError::Runtime {
                verb: "collect",
                source: e,
            })?;
        self.open_pending_review(
            &bundle,
            smithers_store::NewReview {
                run_id: run_id.clone(),
                sandbox_id: sid.clone(),
                root_dir: root.to_string_lossy().into_owned(),
                bundle_path: path_text,
                bundle_status: bundle.status.clone(),
                remote_run_id: None,
                patch_count,
                total_diff_lines,
                duration_ms: 0.0,
                requested_at_ms: now,
                bundle_digest: String::new(),
                applied_by: None,
            },
        )?;
        Ok(true)
    }

    /// A lost session with nothing to review: failed, as an orphan is, saying why.
    fn record_lost(&self, orphan: &smithers_store::Orphan, why: &str, now: i64) {
        let (run_id, sid) = (&orphan.sandbox.run_id, &orphan.sandbox.sandbox_id);
        let report = smithers_errors::ErrorReport::new(
            smithers_errors::ErrorCode::SandboxExecutionFailed,
            format!("The session's holder exited before the session was stopped (lost); {why}."),
        )
        .with_details(json!({ "reason": "lost", "ownerPid": orphan.lease.owner.pid }));
        self.settle_cli_run(
            run_id,
            RunStatus::Failed,
            now,
            Some(&error_to_json(&report)),
        );
        let event = vec![
            ("runtime", json!(orphan.sandbox.runtime)),
            ("error", error_to_json(&report)),
        ];
        if let Err(e) = self.emit("SandboxFailed", run_id, sid, event, now) {
            warn!(run_id = %run_id, sandbox_id = %sid, error = %e, "lost session failure event emit failed");
        }
        self.metrics
            .sandbox_completed(&orphan.sandbox.runtime, "failed");
    }

    /// The orphan's stored handle and its runtime, when the handle may be acted on (the
    /// checks of [`Orchestrator::clean_up_orphan`]).
    fn actionable_handle(
        &self,
        orphan: &smithers_store::Orphan,
    ) -> Option<(SandboxHandle, std::sync::Arc<dyn smithers_runtime::Runtime>)> {
        let text = orphan.lease.handle_json.as_ref()?;
        if orphan.lease.owner.boot_id != self.owner.boot_id {
            return None;
        }
        let handle = serde_json::from_str::<SandboxHandle>(text).ok()?;
        self.check_orphan_handle(orphan, &handle).ok()?;
        let rt = self.runtimes.get(&handle.runtime)?.clone();
        Some((handle, rt))
    }

    /// Cleans up one orphan through its stored handle, when the handle may be acted on:
    /// (cleaned up, why not).
    pub(crate) async fn clean_up_orphan(
        &self,
        orphan: &smithers_store::Orphan,
    ) -> (bool, Option<String>) {
        let Some(json_text) = &orphan.lease.handle_json else {
            return (
                false,
                Some("no handle was stored (died before create)".to_string()),
            );
        };
        if orphan.lease.owner.boot_id != self.owner.boot_id {
            return (
                false,
                Some(format!(
                    "the lease was taken under another boot ({}), so its processes are gone and what its handle names is not acted on",
                    orphan.lease.owner.boot_id
                )),
            );
        }
        let handle = match serde_json::from_str::<SandboxHandle>(json_text) {
            Ok(handle) => handle,
            Err(e) => return (false, Some(format!("stored handle unreadable: {e}"))),
        };
        if let Err(why) = self.check_orphan_handle(orphan, &handle) {
            return (false, Some(format!("stored handle not acted on: {why}")));
        }
        let Some(rt) = self.runtimes.get(&handle.runtime) else {
            return (
                false,
                Some(format!("the {} runtime is not registered", handle.runtime)),
            );
        };
        match self.timed(rt.cleanup(&handle)).await {
            Ok(()) => (true, None),
            Err(e) => (false, Some(e.to_string())),
        }
    }

    /// The handle must be the row's (same ids, same runtime) and its directories those
    /// derived for it in this database's project (`<project>/.smithers/sandbox.db`).
    pub(crate) fn check_orphan_handle(
        &self,
        orphan: &smithers_store::Orphan,
        handle: &SandboxHandle,
    ) -> Result<(), String> {
        let row = &orphan.sandbox;
        if handle.run_id != row.run_id || handle.sandbox_id != row.sandbox_id {
            return Err(format!(
                "it names sandbox {}/{}, not the row's {}/{}",
                handle.run_id, handle.sandbox_id, row.run_id, row.sandbox_id
            ));
        }
        if handle.runtime.as_str() != row.runtime {
            return Err(format!(
                "it is a {} handle on a {} row",
                handle.runtime, row.runtime
            ));
        }
        let root = handle.project_root().map_err(|e| e.to_string())?;
        let db_dir = self.store.path().parent();
        if let Some(project) = db_dir
            .filter(|d| d.file_name() == Some(std::ffi::OsStr::new(".smithers")))
            .and_then(Path::parent)
        {
            if root != project {
                return Err(format!(
                    "its directories are in {}, not in this database's project {}",
                    root.display(),
                    project.display()
                ));
            }
        }
        Ok(())
    }
}
