//! Recording how a step ended when it did not complete: refused by the gate, failed, cancelled,
//! or left resources behind at cleanup. Best effort: a secondary failure is logged.

use serde_json::json;
use smithers_errors::CodedError;
use smithers_store::{Field, RedactedConfig, SandboxStatus, SandboxUpsert, StoreError};
use tracing::warn;

use crate::engine::Orchestrator;
use crate::error::{error_to_json, OrchestratorError};
use crate::lifecycle_state::Progress;
use crate::outcome::SandboxOutcome;
use crate::request::{SandboxRequest, StepContext};
use crate::support::{elapsed_ms, now_ms, off_worker};

impl Orchestrator {
    /// The gate refused: record it like 0.16 (row `failed` when the id is not in use,
    /// SandboxFailed, heartbeat `failed`) without touching another execution's row.
    pub(crate) fn refused(
        &self,
        req: &SandboxRequest,
        ctx: &StepContext,
        runtime_name: &str,
        config: &RedactedConfig,
        e: StoreError,
    ) -> OrchestratorError {
        let sid = req.sandbox_id.as_str();
        let err = OrchestratorError::from(e);
        let ours_to_record = !matches!(
            err,
            OrchestratorError::Store {
                source: StoreError::SandboxAlreadyActive { .. }
            }
        );
        if ours_to_record {
            let now = now_ms();
            if let Err(be) = off_worker(|| {
                self.store
                    .record_refused(&req.run_id, sid, runtime_name, config, now)
            }) {
                warn!(run_id = %req.run_id, sandbox_id = sid, error = %be, "sandbox failure upsert failed");
            }
            if let Err(be) = self.emit(
                "SandboxFailed",
                &req.run_id,
                sid,
                vec![
                    ("runtime", json!(runtime_name)),
                    ("error", error_to_json(&err)),
                ],
                now,
            ) {
                warn!(run_id = %req.run_id, sandbox_id = sid, error = %be, "sandbox failure event emit failed");
            }
            self.metrics.sandbox_completed(runtime_name, "failed");
        }
        Self::heartbeat(
            ctx,
            sid,
            "failed",
            100,
            vec![("error", json!(err.to_string()))],
        );
        err
    }

    /// Step 9: best-effort failure bookkeeping; every secondary failure is logged, the
    /// original error is what the caller gets.
    pub(crate) fn record_failure(
        &self,
        req: &SandboxRequest,
        ctx: &StepContext,
        runtime_name: &str,
        progress: &Progress,
        err: &OrchestratorError,
    ) {
        let sid = req.sandbox_id.as_str();
        let now = now_ms();
        let handle = progress.handle.as_ref();
        if let Err(e) = off_worker(|| {
            self.store.upsert_sandbox(&SandboxUpsert {
                runtime: Some(runtime_name.to_string()),
                workspace_id: Field::from_option(handle.and_then(|h| h.workspace_id.clone())),
                container_id: Field::from_option(handle.and_then(|h| h.container_id.clone())),
                status: Some(SandboxStatus::Failed),
                heartbeat_at_ms: Field::Value(now),
                // The real ship time, or none (0.16 wrote the creation time here).
                shipped_at_ms: Field::from_option(progress.shipped_at_ms),
                completed_at_ms: Field::Value(now),
                bundle_path: Field::from_option(
                    progress
                        .bundle_path
                        .as_ref()
                        .map(|p| p.to_string_lossy().into_owned()),
                ),
                ..SandboxUpsert::key(&req.run_id, sid)
            })
        }) {
            warn!(run_id = %req.run_id, sandbox_id = sid, error = %e, "sandbox failure upsert failed");
        }
        if let Err(e) = self.emit(
            "SandboxFailed",
            &req.run_id,
            sid,
            vec![
                ("runtime", json!(runtime_name)),
                ("error", error_to_json(err)),
            ],
            now,
        ) {
            warn!(run_id = %req.run_id, sandbox_id = sid, error = %e, "sandbox failure event emit failed");
        }
        Self::heartbeat(
            ctx,
            sid,
            "failed",
            100,
            vec![("error", json!(err.to_string()))],
        );
        self.metrics.sandbox_completed(runtime_name, "failed");
    }

    pub(crate) fn record_cancelled(
        &self,
        req: &SandboxRequest,
        ctx: &StepContext,
        runtime_name: &str,
        progress: &Progress,
    ) -> SandboxOutcome {
        let sid = req.sandbox_id.as_str();
        let now = now_ms();
        let bundle_path = progress.bundle_path.clone();
        if let Err(e) = off_worker(|| {
            self.store.upsert_sandbox(&SandboxUpsert {
                status: Some(SandboxStatus::Cancelled),
                heartbeat_at_ms: Field::Value(now),
                shipped_at_ms: Field::from_option(progress.shipped_at_ms),
                completed_at_ms: Field::Value(now),
                bundle_path: Field::from_option(
                    bundle_path
                        .as_ref()
                        .map(|p| p.to_string_lossy().into_owned()),
                ),
                ..SandboxUpsert::key(&req.run_id, sid)
            })
        }) {
            warn!(run_id = %req.run_id, sandbox_id = sid, error = %e, "sandbox cancel upsert failed");
        }
        let duration_ms = progress.child_started.map_or(0.0, elapsed_ms);
        if let Err(e) = self.emit(
            "SandboxCompleted",
            &req.run_id,
            sid,
            vec![
                ("runtime", json!(runtime_name)),
                ("status", json!("cancelled")),
                ("durationMs", json!(duration_ms)),
            ],
            now,
        ) {
            warn!(run_id = %req.run_id, sandbox_id = sid, error = %e, "sandbox cancel event emit failed");
        }
        Self::heartbeat(
            ctx,
            sid,
            "cancelled",
            100,
            vec![("status", json!("cancelled"))],
        );
        self.metrics.sandbox_completed(runtime_name, "cancelled");
        self.metrics.observe_duration_ms(duration_ms);
        SandboxOutcome::Cancelled { bundle_path }
    }

    pub(crate) fn cleanup_failed(
        &self,
        req: &SandboxRequest,
        runtime_name: &str,
        e: &dyn CodedError,
    ) {
        warn!(run_id = %req.run_id, sandbox_id = %req.sandbox_id, runtime = runtime_name, error = %e, "sandbox transport cleanup failed");
        // An event of our own, so leaked resources are visible in the run's history too.
        if let Err(be) = self.emit(
            "SandboxCleanupFailed",
            &req.run_id,
            &req.sandbox_id,
            vec![
                ("runtime", json!(runtime_name)),
                ("error", error_to_json(e)),
            ],
            now_ms(),
        ) {
            warn!(run_id = %req.run_id, sandbox_id = %req.sandbox_id, error = %be, "sandbox cleanup event emit failed");
        }
    }
}
