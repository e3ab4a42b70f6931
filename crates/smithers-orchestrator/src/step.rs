//! The step's own run inside its sandbox: live output to the caller, step heartbeats to the
//! row.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use smithers_runtime::{ExecOutcome, OutputEvent, OutputSink, Runtime, SandboxHandle};
use tracing::warn;

use crate::engine::Orchestrator;
use crate::error::OrchestratorError;
use crate::lifecycle_state::{Progress, Stop};
use crate::request::{SandboxRequest, StepContext};
use crate::support::{now_ms, off_worker};

/// Forwards live output to the caller and step heartbeats to a channel (a sink must not block).
struct Forward {
    output: Option<Arc<dyn OutputSink>>,
    heartbeats: tokio::sync::mpsc::UnboundedSender<Option<f64>>,
    /// Heartbeats sent to the pump that persists them.
    sent: Arc<AtomicU64>,
}

impl OutputSink for Forward {
    fn event(&self, event: OutputEvent) {
        if let OutputEvent::Heartbeat { progress, .. } = &event {
            if self.heartbeats.send(*progress).is_ok() {
                self.sent.fetch_add(1, Ordering::SeqCst);
            }
        }
        if let Some(out) = &self.output {
            out.event(event);
        }
    }
}

impl Orchestrator {
    /// Runs `execute` with live output and step heartbeats (which move the row's
    /// `heartbeat_at_ms`, as the JavaScript provider heartbeat does).
    pub(crate) async fn run_step(
        &self,
        req: &SandboxRequest,
        ctx: &StepContext,
        runtime: &dyn Runtime,
        handle: &SandboxHandle,
        progress: &mut Progress,
    ) -> Result<ExecOutcome, Stop> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Option<f64>>();
        let (sent, persisted) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let forward = Forward {
            output: ctx.output.clone(),
            heartbeats: tx,
            sent: sent.clone(),
        };
        let store = self.store.clone();
        let run_id = req.run_id.clone();
        let sid = req.sandbox_id.clone();
        let hb_ctx = ctx.clone();
        let pumped = persisted.clone();
        let pump = tokio::spawn(async move {
            while let Some(step_progress) = rx.recv().await {
                if let Err(e) = off_worker(|| store.heartbeat_sandbox(&run_id, &sid, now_ms())) {
                    warn!(run_id = %run_id, sandbox_id = %sid, error = %e, "sandbox heartbeat persistence failed");
                }
                Orchestrator::heartbeat(
                    &hb_ctx,
                    &sid,
                    "executing",
                    40,
                    vec![("stepProgress", json!(step_progress))],
                );
                // Counted once its row and its heartbeat are done (see below).
                pumped.fetch_add(1, Ordering::SeqCst);
            }
        });
        progress.child_started = Some(Instant::now());
        let command = req.step_command();
        let result = self
            .timed(runtime.execute(handle, &command, ctx.cancel.clone(), &forward))
            .await;
        drop(forward);
        // The pump ends once the sink (its only sender) is gone; wait so every step heartbeat
        // is persisted before the lifecycle moves on. With all of them persisted already (no
        // step sends any, usually), it ends on its own: waiting for that was two thread
        // wake-ups, ~0.15 ms of a short step.
        if persisted.load(Ordering::SeqCst) != sent.load(Ordering::SeqCst) {
            let _ = pump.await;
        }
        result.map_err(|source| {
            Stop::Failed(OrchestratorError::Runtime {
                verb: "execute",
                source,
            })
        })
    }
}
