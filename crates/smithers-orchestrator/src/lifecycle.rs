//! Running one step: admission through the gate, create, place, ship, execute, collect and
//! validate, the review gate, completion, and the cleanup and lease release after.

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use smithers_runtime::{
    ExecOutcome, RequestBundle, Runtime, SandboxConfig, SandboxHandle, Termination,
};
use smithers_store::{
    AdmitRequest, Field, NewEvent, NewReview, PatchRecord, RedactedConfig, SandboxStatus,
    SandboxUpsert,
};
use tracing::warn;

use crate::bundle::InspectedBundle;
use crate::engine::Orchestrator;
use crate::error::OrchestratorError;
use crate::lifecycle_state::{ActiveGuard, Progress, Stop, Tail};
use crate::outcome::{CompletedSandbox, Finish, PendingReview, SandboxOutcome};
use crate::request::{SandboxRequest, StepContext};
use crate::settings::{ReviewMode, FAIL_CLOSED_REJECT_REASON};
use crate::support::{elapsed_ms, event_json, now_ms, off_worker};

/// Turns a fleet runtime's "still queued" into `SandboxQueued` events.
struct QueuedEvents<'a> {
    orchestrator: &'a Orchestrator,
    run_id: &'a str,
    sandbox_id: &'a str,
}

impl smithers_runtime::PlacementSink for QueuedEvents<'_> {
    fn queued(&self, reason: &str) {
        if let Err(e) = self.orchestrator.emit(
            "SandboxQueued",
            self.run_id,
            self.sandbox_id,
            vec![("reason", json!(reason))],
            now_ms(),
        ) {
            warn!(run_id = %self.run_id, sandbox_id = self.sandbox_id, error = %e, "queued event emit failed");
        }
    }
}

/// How the review gate let a step's patches through.
enum Gate {
    /// On to completion, with this many patches applied.
    Passed { applied: u64 },
    /// Held for a durable review: the step waits there.
    Held {
        patch_count: u64,
        total_diff_lines: u64,
        patches: Vec<PatchRecord>,
    },
}

impl Orchestrator {
    /// Runs one sandboxed step (spec section 5, steps 1–10). Returns the step's outcome — a
    /// step whose own status is `failed` is `Ok` — or the error that stopped the lifecycle,
    /// after recording it (row `failed`, SandboxFailed, heartbeat `failed`). Cleanup always
    /// runs; its failure is logged and never replaces the result.
    pub async fn execute(
        &self,
        req: &SandboxRequest,
        ctx: &StepContext,
    ) -> Result<SandboxOutcome, OrchestratorError> {
        let (result, tail) = self.execute_to_outcome(req, ctx, true).await;
        if let Some(tail) = tail {
            self.finish(req, tail).await;
        }
        result
    }

    /// [`Orchestrator::execute`] that returns as soon as the step's outcome is recorded, with
    /// the rest of it to run after: the sandbox's cleanup and the release of its lease. For a
    /// process that lives on after the step and answers its caller first (the resident
    /// service), which then runs the returned future (spawned, say) and must see it finish
    /// before it exits or reuses the sandbox's ids. Unlike `execute`, the cleanup does not
    /// start once the bundle is collected: it would take the CPU from the rest of the
    /// lifecycle that the answer waits for (a step's teardown is kernel work: its processes,
    /// mounts and cgroups). A cleanup failure is recorded as with `execute`
    /// (`SandboxCleanupFailed`, after the last event).
    pub async fn execute_then_finish(
        self: &Arc<Self>,
        req: &SandboxRequest,
        ctx: &StepContext,
    ) -> (Result<SandboxOutcome, OrchestratorError>, Finish) {
        let (result, tail) = self.execute_to_outcome(req, ctx, false).await;
        let me = self.clone();
        let req = req.clone();
        let finish: Finish = Box::pin(async move {
            if let Some(tail) = tail {
                me.finish(&req, tail).await;
            }
        });
        (result, finish)
    }

    /// Step 10 of a sandbox whose outcome is recorded: its cleanup, then its lease.
    pub(crate) async fn finish(&self, req: &SandboxRequest, tail: Tail) {
        let Tail {
            runtime,
            runtime_name,
            cleanup,
            handle,
            reason,
        } = tail;
        let sid = req.sandbox_id.as_str();
        // Step 10: always clean up (begun already once the bundle was collected, for
        // `execute`; here now for `execute_then_finish`, or for a step that got no bundle).
        let cleaned = match cleanup {
            Some(started) => match started.await {
                Ok((cleaned, ms)) => {
                    self.metrics.observe_transport_ms(ms);
                    Some(cleaned)
                }
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // The runtime is shutting down under us: cleaned up here, as below.
                Err(_) => None,
            },
            None => None,
        };
        let cleaned = match (cleaned, &handle) {
            (Some(cleaned), _) => cleaned,
            (None, Some(handle)) => self.timed(runtime.cleanup(handle)).await,
            (None, None) => Ok(()),
        };
        if let Err(e) = cleaned {
            self.cleanup_failed(req, runtime_name, &e);
        }
        if let Err(e) = off_worker(|| {
            self.store
                .release_lease(&req.run_id, sid, now_ms(), &reason)
        }) {
            warn!(run_id = %req.run_id, sandbox_id = sid, error = %e, "sandbox lease release failed");
        }
    }

    /// Steps 1–9; `None` for step 10 when the gate never admitted the sandbox.
    pub(crate) async fn execute_to_outcome(
        &self,
        req: &SandboxRequest,
        ctx: &StepContext,
        cleanup_at_collect: bool,
    ) -> (Result<SandboxOutcome, OrchestratorError>, Option<Tail>) {
        let sid = req.sandbox_id.as_str();
        Self::heartbeat(ctx, sid, "initializing", 0, vec![]);
        let kind = req.selected_runtime();
        let runtime_name = kind.as_str();
        let Some(runtime) = self.runtimes.get(&kind).cloned() else {
            let err = OrchestratorError::RuntimeNotRegistered {
                runtime: runtime_name.to_string(),
            };
            Self::heartbeat(
                ctx,
                sid,
                "failed",
                100,
                vec![("error", json!(err.to_string()))],
            );
            return (Err(err), None);
        };
        let config = RedactedConfig::new(&req.config_value());
        let created_at_ms = now_ms();

        // Step 2: the atomic gate, which also writes the `pending` row and our lease.
        // Step 3's event, SandboxCreated, is written by the gate's own transaction when (and
        // only when) it admits the sandbox.
        let created_event = event_json(
            "SandboxCreated",
            &req.run_id,
            sid,
            vec![
                ("runtime", json!(runtime_name)),
                ("configJson", json!(config.as_json())),
            ],
            created_at_ms,
        );
        let admitted = off_worker(|| {
            self.store.try_admit_with_event(
                &AdmitRequest {
                    run_id: req.run_id.clone(),
                    sandbox_id: req.sandbox_id.clone(),
                    runtime: runtime_name.to_string(),
                    config: config.clone(),
                    per_run_max: self.settings.per_run_max,
                    host_max: self.settings.host_max,
                    owner: self.owner.clone(),
                    now_ms: created_at_ms,
                },
                &NewEvent {
                    run_id: &req.run_id,
                    timestamp_ms: created_at_ms,
                    event_type: "SandboxCreated",
                    payload_json: &created_event,
                },
            )
        });
        if let Err(e) = admitted {
            return (Err(self.refused(req, ctx, runtime_name, &config, e)), None);
        }
        self.metrics.sandbox_created(runtime_name);
        self.metrics.active_add(runtime_name, 1);
        let active = ActiveGuard {
            metrics: self.metrics.clone(),
            runtime: runtime_name,
        };

        let mut progress = Progress {
            shipped_at_ms: None,
            handle: None,
            bundle_path: None,
            child_started: None,
            cleanup: None,
            cleanup_at_collect,
        };
        let result = self.lifecycle(req, ctx, &runtime, &mut progress).await;
        let result = match result {
            Ok(outcome) => Ok(outcome),
            Err(Stop::Cancelled) => Ok(self.record_cancelled(req, ctx, runtime_name, &progress)),
            Err(Stop::Failed(err)) => {
                self.record_failure(req, ctx, runtime_name, &progress, &err);
                Err(err)
            }
        };
        drop(active);

        let reason = match &result {
            Ok(SandboxOutcome::Completed(c)) => c.status.clone(),
            Ok(SandboxOutcome::AwaitingReview(_)) => "review".into(),
            Ok(SandboxOutcome::Cancelled { .. }) => "cancelled".into(),
            Err(_) => "failed".into(),
        };
        let tail = Tail {
            runtime,
            runtime_name,
            cleanup: progress.cleanup.take(),
            handle: progress.handle.take(),
            reason,
        };
        (result, Some(tail))
    }

    pub(crate) async fn lifecycle(
        &self,
        req: &SandboxRequest,
        ctx: &StepContext,
        runtime: &Arc<dyn Runtime>,
        progress: &mut Progress,
    ) -> Result<SandboxOutcome, Stop> {
        let sid = req.sandbox_id.as_str();

        // Step 3 (its event was written with the admission).
        Self::heartbeat(ctx, sid, "created", 10, vec![]);

        let handle = self.create_and_place(req, ctx, runtime, progress).await?;
        self.ship(req, ctx, runtime, &handle, progress).await?;
        let (outcome, cancelled) = self
            .execute_in_sandbox(req, ctx, runtime, &handle, progress)
            .await?;
        let bundle = self
            .collect_bundle(req, ctx, runtime, &handle, progress, cancelled)
            .await?;
        // A step that did not exit 0 never counts as finished, whatever its bundle says
        // (0.16 ignored the exit code).
        let status = if bundle.status == "finished" && !outcome.succeeded() {
            "failed".to_string()
        } else {
            bundle.status.clone()
        };
        let duration_ms = progress.child_started.map_or(0.0, elapsed_ms);
        let applied = match self.review_gate(req, ctx, &bundle, &status, duration_ms)? {
            Gate::Passed { applied } => applied,
            Gate::Held {
                patch_count,
                total_diff_lines,
                patches,
            } => {
                return Ok(SandboxOutcome::AwaitingReview(PendingReview {
                    status,
                    outputs: bundle.outputs,
                    bundle_path: bundle.bundle_path,
                    patch_count,
                    total_diff_lines,
                    patches,
                }));
            }
        };
        self.complete(
            req,
            ctx,
            &handle,
            progress,
            bundle,
            status,
            duration_ms,
            applied,
        )
    }

    /// Step 4, first half: the sandbox is created (its handle stored at once) and placed.
    async fn create_and_place(
        &self,
        req: &SandboxRequest,
        ctx: &StepContext,
        runtime: &Arc<dyn Runtime>,
        progress: &mut Progress,
    ) -> Result<SandboxHandle, Stop> {
        let run_id = req.run_id.as_str();
        let sid = req.sandbox_id.as_str();
        let runtime_name = req.selected_runtime().as_str();

        // Step 4: create, ship.
        if ctx.cancel.is_cancelled() {
            return Err(Stop::Cancelled);
        }
        let sandbox_config = SandboxConfig {
            run_id: run_id.to_string(),
            sandbox_id: sid.to_string(),
            runtime: req.selected_runtime(),
            root_dir: req.root_dir.clone(),
            image: req.image.clone(),
            controls: req.controls.clone(),
            workspace_layers: Vec::new(),
        };
        let handle = self
            .timed(runtime.create(&sandbox_config))
            .await
            .map_err(|source| OrchestratorError::Runtime {
                verb: "create",
                source,
            })?;
        progress.handle = Some(handle.clone());
        // Stored at once, so a process that finds us dead can clean up what we created.
        self.store_handle(run_id, sid, &handle)?;
        if ctx.cancel.is_cancelled() {
            return Err(Stop::Cancelled);
        }
        // A fleet's lease waits here for a free slot (each wait a SandboxQueued event), then
        // says where it runs (SandboxPlaced). Local runtimes return at once.
        let queued = QueuedEvents {
            orchestrator: self,
            run_id,
            sandbox_id: sid,
        };
        let placed = tokio::select! {
            placed = runtime.place(handle.clone(), &queued) => placed,
            _ = ctx.cancel.cancelled() => return Err(Stop::Cancelled),
        };
        let (handle, placement) = placed.map_err(|source| OrchestratorError::Runtime {
            verb: "place",
            source,
        })?;
        if progress.handle.as_ref() != Some(&handle) {
            progress.handle = Some(handle.clone());
            self.store_handle(run_id, sid, &handle)?;
        }
        if let Some(placement) = &placement {
            self.emit(
                "SandboxPlaced",
                run_id,
                sid,
                vec![
                    ("runtime", json!(runtime_name)),
                    ("node", json!(placement.node)),
                    ("nodeId", json!(placement.node_id)),
                    ("lease", json!(placement.lease)),
                    ("queuedMs", json!(placement.queued_ms)),
                    ("warm", json!(placement.warm)),
                ],
                now_ms(),
            )?;
        }
        Ok(handle)
    }

    /// Step 4, second half: the request is shipped; the row becomes `shipped`.
    async fn ship(
        &self,
        req: &SandboxRequest,
        ctx: &StepContext,
        runtime: &Arc<dyn Runtime>,
        handle: &SandboxHandle,
        progress: &mut Progress,
    ) -> Result<(), Stop> {
        let run_id = req.run_id.as_str();
        let sid = req.sandbox_id.as_str();
        let runtime_name = req.selected_runtime().as_str();
        let request = RequestBundle {
            request: json!({
                "status": "pending",
                "sandboxId": sid,
                "runtime": req.runtime.unwrap_or(req.selected_runtime()).as_str(),
                "input": req.input,
            }),
        };
        let shipped = self
            .timed(runtime.ship(handle, &request))
            .await
            .map_err(|source| OrchestratorError::Runtime {
                verb: "ship",
                source,
            })?;
        // The event and the row's state change in one transaction.
        let shipped_at = now_ms();
        let shipped_event = event_json(
            "SandboxShipped",
            run_id,
            sid,
            vec![
                ("runtime", json!(runtime_name)),
                ("bundleSizeBytes", json!(shipped.bundle_size_bytes)),
            ],
            shipped_at,
        );
        off_worker(|| {
            self.store.upsert_sandbox_with_event(
                &SandboxUpsert {
                    runtime: Some(runtime_name.to_string()),
                    remote_run_id: Field::Null,
                    workspace_id: Field::from_option(handle.workspace_id.clone()),
                    container_id: Field::from_option(handle.container_id.clone()),
                    status: Some(SandboxStatus::Shipped),
                    shipped_at_ms: Field::Value(shipped_at),
                    heartbeat_at_ms: Field::Value(shipped_at),
                    completed_at_ms: Field::Null,
                    bundle_path: Field::Null,
                    ..SandboxUpsert::key(run_id, sid)
                },
                &NewEvent {
                    run_id,
                    timestamp_ms: shipped_at,
                    event_type: "SandboxShipped",
                    payload_json: &shipped_event,
                },
            )
        })?;
        Self::heartbeat(ctx, sid, "shipped", 25, vec![]);
        progress.shipped_at_ms = Some(shipped_at);
        Ok(())
    }

    /// Step 5: the step runs; its outcome, and whether it ended cancelled.
    async fn execute_in_sandbox(
        &self,
        req: &SandboxRequest,
        ctx: &StepContext,
        runtime: &Arc<dyn Runtime>,
        handle: &SandboxHandle,
        progress: &mut Progress,
    ) -> Result<(ExecOutcome, bool), Stop> {
        let run_id = req.run_id.as_str();
        let sid = req.sandbox_id.as_str();

        // Step 5: execute.
        if ctx.cancel.is_cancelled() {
            return Err(Stop::Cancelled);
        }
        Self::heartbeat(ctx, sid, "executing", 40, vec![]);
        let outcome = self
            .run_step(req, ctx, runtime.as_ref(), handle, progress)
            .await?;
        Self::heartbeat(
            ctx,
            sid,
            "child-finished",
            70,
            vec![
                ("termination", json!(outcome.termination.as_str())),
                ("exitCode", json!(outcome.exit_code)),
                // What held for this step (a limit this host could not give is named here).
                ("enforcement", json!(outcome.enforcement)),
                // What the egress engine decided (absent without a policy).
                ("egress", json!(outcome.egress)),
            ],
        );
        let hb_at = now_ms();
        let hb_event = event_json(
            "SandboxHeartbeat",
            run_id,
            sid,
            vec![("progress", json!(1))],
            hb_at,
        );
        off_worker(|| {
            self.store.heartbeat_sandbox_with_event(
                run_id,
                sid,
                hb_at,
                &NewEvent {
                    run_id,
                    timestamp_ms: hb_at,
                    event_type: "SandboxHeartbeat",
                    payload_json: &hb_event,
                },
            )
        })?;
        let cancelled = outcome.termination == Termination::Cancelled || ctx.cancel.is_cancelled();
        Ok((outcome, cancelled))
    }

    /// Step 6: the bundle is collected and validated.
    async fn collect_bundle(
        &self,
        req: &SandboxRequest,
        ctx: &StepContext,
        runtime: &Arc<dyn Runtime>,
        handle: &SandboxHandle,
        progress: &mut Progress,
        cancelled: bool,
    ) -> Result<InspectedBundle, Stop> {
        let run_id = req.run_id.as_str();
        let sid = req.sandbox_id.as_str();

        // Step 6: collect + validate.
        let collected = self.timed(runtime.collect(handle)).await;
        let collected = match collected {
            Ok(c) => c,
            // A cancelled sandbox that cannot even produce a bundle still ends as cancelled.
            Err(e) if cancelled => {
                warn!(run_id, sandbox_id = sid, error = %e, "collect after cancellation failed");
                return Err(Stop::Cancelled);
            }
            Err(source) => {
                return Err(OrchestratorError::Runtime {
                    verb: "collect",
                    source,
                }
                .into())
            }
        };
        progress.bundle_path = Some(collected.bundle_path.clone());
        // Everything the step left is in its bundle now: for `execute`, the sandbox itself
        // (its processes, layer, cgroups) is cleaned up beside the rest of the lifecycle
        // (validation, rows, events, an apply), which reads only the bundle, and `execute`
        // waits for it. `execute_then_finish` leaves it to its Finish: should the lifecycle
        // panic from here, no tail is returned and the sandbox, whose owner is then the
        // resident service that stops after a panic, is recovered as a dead owner's.
        if progress.cleanup_at_collect {
            let (cleaner, cleaned) = (runtime.clone(), handle.clone());
            progress.cleanup = Some(tokio::spawn(async move {
                let started = Instant::now();
                let result = cleaner.cleanup(&cleaned).await;
                (result, elapsed_ms(started))
            }));
        }
        let bundle =
            off_worker(|| self.inspector.inspect(&collected.bundle_path)).map_err(|report| {
                OrchestratorError::Bundle {
                    report: Box::new(report),
                }
            })?;
        let patch_count = bundle.patch_count();
        Self::heartbeat(
            ctx,
            sid,
            "bundle-collected",
            85,
            vec![
                ("bundlePath", json!(bundle.bundle_path.to_string_lossy())),
                ("patchCount", json!(patch_count)),
            ],
        );
        self.emit_bundle_received(run_id, sid, &bundle, now_ms())?;
        self.metrics.observe_bundle_size(bundle.bundle_size_bytes);
        self.metrics.observe_patch_count(patch_count);
        if cancelled {
            return Err(Stop::Cancelled);
        }
        Ok(bundle)
    }

    /// Step 7: the review gate. Patches are applied (auto-accept, or no review asked for),
    /// refused (fail-closed), or held for a durable review.
    fn review_gate(
        &self,
        req: &SandboxRequest,
        ctx: &StepContext,
        bundle: &InspectedBundle,
        status: &str,
        duration_ms: f64,
    ) -> Result<Gate, Stop> {
        let run_id = req.run_id.as_str();
        let sid = req.sandbox_id.as_str();
        let patch_count = bundle.patch_count();
        let mut applied = 0;
        if req.review_diffs && patch_count > 0 {
            let total_diff_lines =
                bundle
                    .total_diff_lines()
                    .map_err(|report| OrchestratorError::Bundle {
                        report: Box::new(report),
                    })?;
            self.emit_review_requested(run_id, sid, patch_count, total_diff_lines, now_ms())?;
            if req.auto_accept_diffs {
                self.emit(
                    "SandboxDiffAccepted",
                    run_id,
                    sid,
                    vec![("patchCount", json!(patch_count))],
                    now_ms(),
                )?;
                self.apply(req, bundle)?;
                applied = patch_count;
            } else if self.settings.review_mode == ReviewMode::FailClosed {
                self.emit(
                    "SandboxDiffRejected",
                    run_id,
                    sid,
                    vec![("reason", json!(FAIL_CLOSED_REJECT_REASON))],
                    now_ms(),
                )?;
                return Err(OrchestratorError::ReviewRequired {
                    sandbox_id: sid.to_string(),
                    patch_count,
                }
                .into());
            } else {
                let patches = self.open_pending_review(
                    bundle,
                    NewReview {
                        run_id: run_id.to_string(),
                        sandbox_id: sid.to_string(),
                        root_dir: req.root_dir.to_string_lossy().into_owned(),
                        bundle_path: bundle.bundle_path.to_string_lossy().into_owned(),
                        bundle_status: status.to_string(),
                        remote_run_id: bundle.run_id.clone(),
                        patch_count,
                        total_diff_lines,
                        duration_ms,
                        requested_at_ms: now_ms(),
                        bundle_digest: String::new(),
                        applied_by: None,
                    },
                )?;
                Self::heartbeat(
                    ctx,
                    sid,
                    "review",
                    90,
                    vec![
                        ("patchCount", json!(patch_count)),
                        ("totalDiffLines", json!(total_diff_lines)),
                    ],
                );
                return Ok(Gate::Held {
                    patch_count,
                    total_diff_lines,
                    patches,
                });
            }
        } else if patch_count > 0 {
            // reviewDiffs: false applies without asking, as 0.32 does.
            self.apply(req, bundle)?;
            applied = patch_count;
        }
        Ok(Gate::Passed { applied })
    }

    /// Step 8: the row and SandboxCompleted, in one transaction.
    #[allow(clippy::too_many_arguments)]
    fn complete(
        &self,
        req: &SandboxRequest,
        ctx: &StepContext,
        handle: &SandboxHandle,
        progress: &Progress,
        bundle: InspectedBundle,
        status: String,
        duration_ms: f64,
        applied: u64,
    ) -> Result<SandboxOutcome, Stop> {
        let run_id = req.run_id.as_str();
        let sid = req.sandbox_id.as_str();
        let runtime_name = req.selected_runtime().as_str();

        // Step 8.
        let completed_at = now_ms();
        let completed_event = event_json(
            "SandboxCompleted",
            run_id,
            sid,
            vec![
                ("remoteRunId", json!(bundle.run_id)),
                ("runtime", json!(runtime_name)),
                ("status", json!(status)),
                ("durationMs", json!(duration_ms)),
            ],
            completed_at,
        );
        off_worker(|| {
            self.store.upsert_sandbox_with_event(
                &SandboxUpsert {
                    runtime: Some(runtime_name.to_string()),
                    remote_run_id: Field::from_option(bundle.run_id.clone()),
                    workspace_id: Field::from_option(handle.workspace_id.clone()),
                    container_id: Field::from_option(handle.container_id.clone()),
                    status: Some(SandboxStatus::parse(&status)),
                    heartbeat_at_ms: Field::Value(completed_at),
                    shipped_at_ms: Field::from_option(progress.shipped_at_ms),
                    completed_at_ms: Field::Value(completed_at),
                    bundle_path: Field::Value(bundle.bundle_path.to_string_lossy().into_owned()),
                    ..SandboxUpsert::key(run_id, sid)
                },
                &NewEvent {
                    run_id,
                    timestamp_ms: completed_at,
                    event_type: "SandboxCompleted",
                    payload_json: &completed_event,
                },
            )
        })?;
        Self::heartbeat(ctx, sid, "completed", 100, vec![("status", json!(status))]);
        self.metrics.sandbox_completed(runtime_name, &status);
        self.metrics.observe_duration_ms(duration_ms);
        Ok(SandboxOutcome::Completed(CompletedSandbox {
            status,
            outputs: bundle.outputs,
            bundle_path: bundle.bundle_path,
            applied_patches: applied,
            conflict_markers: Vec::new(),
            patch_files: bundle.patch_files,
            change_notes: bundle.change_notes,
        }))
    }

    pub(crate) fn apply(
        &self,
        req: &SandboxRequest,
        bundle: &InspectedBundle,
    ) -> Result<(), OrchestratorError> {
        off_worker(|| self.applier.apply(&req.root_dir, bundle)).map_err(|report| {
            OrchestratorError::Apply {
                sandbox_id: req.sandbox_id.clone(),
                report: Box::new(report),
            }
        })
    }
}
