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
                })
                .collect());
        }
        let mut out = Vec::new();
        for orphan in orphans {
            let run_id = orphan.sandbox.run_id.clone();
            let sandbox_id = orphan.sandbox.sandbox_id.clone();
            let runtime_name = orphan.sandbox.runtime.clone();
            // Kill what is left first (cleanup is idempotent), then free the slot.
            let (cleaned_up, cleanup_error) = self.clean_up_orphan(&orphan).await;
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
            });
        }
        Ok(out)
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
