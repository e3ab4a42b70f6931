//! The lifecycle of one sandboxed step: the Rust counterpart of the JavaScript
//! `executeSandbox` (spec section 5), plus what the original lacked: an atomic concurrency
//! gate, durable reviews, cancellation, crash recovery and metrics that do not leak.
//!
//! The orchestrator sees runtimes only through [`smithers_runtime::Runtime`]; it writes rows
//! and events through [`smithers_store::Store`]. Store calls are synchronous SQLite calls,
//! usually of a few milliseconds but up to the store's busy timeout while another writer
//! holds the lock; they, bundle validation and patch apply run through `off_worker`, which
//! on a multi-threaded tokio runtime hands the calling worker's other tasks to another
//! thread meanwhile (`block_in_place`), so none of them stalls other tasks.
//!
//! # Events of one sandbox, in order
//!
//! - finished / failed step: Created, Shipped, Heartbeat, BundleReceived, Completed
//! - with patches and auto-accept: … BundleReceived, DiffReviewRequested, DiffAccepted, Completed
//! - `reviewDiffs: false`: patches applied without review events, then Completed
//! - durable review: … BundleReceived, DiffReviewRequested (row `review`, runtime cleaned up);
//!   later, from any process, [`Orchestrator::accept`]: (apply) DiffAccepted, Completed — or
//!   Failed when the patches conflict (nothing applied) — or [`Orchestrator::reject`]:
//!   DiffRejected, Failed
//! - fail-closed review (0.16, [`ReviewMode::FailClosed`]): … DiffReviewRequested,
//!   DiffRejected, Failed
//! - runtime error or invalid bundle after admission: Created, …, Failed
//! - concurrency limit: Failed only (the refused sandbox's row is written as `failed`, as in
//!   0.16, unless that sandbox id is in use by another execution)
//! - cancelled: Created, [Shipped, Heartbeat, BundleReceived], Completed{status: cancelled}
//! - orphan found by [`Orchestrator::recover`]: Failed{error.details.reason: "orphaned"}
//! - a cleanup failure adds SandboxCleanupFailed (ours) after the last event; it never changes
//!   the result.
//!
//! Cancellation is the [`StepContext::cancel`] token. Dropping the future of
//! [`Orchestrator::execute`] is not cancellation: the metrics stay right (the active gauge is
//! a drop guard) but the row stays active until this process exits and a later
//! [`Orchestrator::recover`] finds it.
#![forbid(unsafe_code)]

mod bundle;
mod error;
mod metrics;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};
use smithers_errors::CodedError;
use smithers_runtime::{
    CancellationToken, Controls, ExecOutcome, OutputEvent, OutputSink, RequestBundle, Runtime,
    RuntimeKind, SandboxConfig, SandboxHandle, StepCommand, Termination,
};
use smithers_store::{
    parse_limit, parse_max_concurrent, AdmitRequest, Field, NewEvent, NewReview, OwnerIdentity,
    PatchRecord, RedactedConfig, ReviewState, RunStatus, SandboxStatus, SandboxUpsert, Store,
    StoreError,
};
use tracing::{info, warn};

pub use bundle::{
    bundle_digest, describe_patch_text, diff_line_count, AtomicPatchApplier, BundleInspector,
    BundleValidator, InspectedBundle, PatchApplier,
};
pub use error::{error_to_json, OrchestratorError};

/// Runs a blocking call (SQLite, bundle validation, patch apply) without holding an async
/// worker: on a multi-threaded runtime (the CLI's and `serve`'s) through
/// `tokio::task::block_in_place`, which hands this worker's other tasks to another thread
/// while `call` runs, so a store call waiting for another writer's lock, or an apply
/// writing a large tree, stalls no other task (HTTP handlers, event streams, heartbeats). On
/// a current-thread runtime (where `block_in_place` panics) or outside any runtime it runs
/// inline: there nothing else could run on another thread anyway.
fn off_worker<T>(call: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(call),
        _ => call(),
    }
}
pub use metrics::{HistogramSnapshot, Metrics};

/// An event as the store keeps it: `{type, runId, sandboxId, ...extra, timestampMs}` (a
/// `null` extra is left out, as `JSON.stringify` leaves out `undefined`).
fn event_json(
    event_type: &str,
    run_id: &str,
    sandbox_id: &str,
    extra: Vec<(&str, Value)>,
    timestamp_ms: i64,
) -> String {
    let mut m = Map::new();
    m.insert("type".into(), json!(event_type));
    m.insert("runId".into(), json!(run_id));
    m.insert("sandboxId".into(), json!(sandbox_id));
    for (k, v) in extra {
        // `undefined` fields are dropped by JSON.stringify; `None` plays that role here.
        if !v.is_null() {
            m.insert(k.to_string(), v);
        }
    }
    m.insert("timestampMs".into(), json!(timestamp_ms));
    Value::Object(m).to_string()
}

/// What a shipped step runs when no command is given (the JavaScript default).
pub const DEFAULT_SANDBOX_COMMAND: &str = "smithers up bundle.tsx";

/// Default limit over every run sharing one database, when `SMITHERS_MAX_HOST_SANDBOXES` is
/// unset or invalid (parsed like `SMITHERS_MAX_CONCURRENT_SANDBOXES`).
pub const DEFAULT_MAX_HOST_SANDBOXES: u32 = 64;

/// The reason recorded by the fail-closed review mode (the JavaScript text).
pub const FAIL_CLOSED_REJECT_REASON: &str =
    "Diff review approval is required before applying sandbox patches.";

/// What happens to patches that need review and are not auto-accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReviewMode {
    /// The sandbox waits in a durable review (row `review`); [`Orchestrator::accept`] or
    /// [`Orchestrator::reject`] decide later, from any process.
    Durable,
    /// 0.16: SandboxDiffRejected, then INVALID_INPUT "Sandbox produced patches that require
    /// review approval.".
    FailClosed,
}

/// Process-wide settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Active sandboxes per run (`SMITHERS_MAX_CONCURRENT_SANDBOXES`).
    pub per_run_max: u32,
    /// Active sandboxes over every run in the database (`SMITHERS_MAX_HOST_SANDBOXES`).
    pub host_max: u32,
    pub review_mode: ReviewMode,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            per_run_max: parse_max_concurrent(None),
            host_max: DEFAULT_MAX_HOST_SANDBOXES,
            review_mode: ReviewMode::Durable,
        }
    }
}

impl Settings {
    /// Reads the limits from the environment, parsed like the JavaScript package.
    pub fn from_env() -> Self {
        let per_run = std::env::var("SMITHERS_MAX_CONCURRENT_SANDBOXES").ok();
        let host = std::env::var("SMITHERS_MAX_HOST_SANDBOXES").ok();
        Settings {
            per_run_max: parse_max_concurrent(per_run.as_deref()),
            host_max: parse_limit(host.as_deref(), DEFAULT_MAX_HOST_SANDBOXES),
            review_mode: ReviewMode::Durable,
        }
    }
}

/// One sandboxed step to run.
#[derive(Debug, Clone)]
pub struct SandboxRequest {
    pub run_id: String,
    pub sandbox_id: String,
    /// The requested runtime; `None` means bubblewrap (recorded as requested in config_json).
    pub runtime: Option<RuntimeKind>,
    /// The project; becomes `/workspace` inside, and where accepted patches are applied.
    pub root_dir: PathBuf,
    /// `None`: [`DEFAULT_SANDBOX_COMMAND`].
    pub command: Option<StepCommand>,
    /// The step's input (`{}` by default), shipped in the request document.
    pub input: Value,
    pub image: Option<String>,
    pub controls: Controls,
    /// Default true.
    pub review_diffs: bool,
    /// Default false.
    pub auto_accept_diffs: bool,
    /// The step's config as written (for `config_json`; redacted before it is stored). When
    /// null, the controls are recorded instead.
    pub config: Value,
}

impl SandboxRequest {
    /// A request with the documented defaults.
    pub fn new(
        run_id: impl Into<String>,
        sandbox_id: impl Into<String>,
        root_dir: impl Into<PathBuf>,
    ) -> Self {
        SandboxRequest {
            run_id: run_id.into(),
            sandbox_id: sandbox_id.into(),
            runtime: None,
            root_dir: root_dir.into(),
            command: None,
            input: json!({}),
            image: None,
            controls: Controls::default(),
            review_diffs: true,
            auto_accept_diffs: false,
            config: Value::Null,
        }
    }

    fn selected_runtime(&self) -> RuntimeKind {
        self.runtime.unwrap_or(RuntimeKind::Bubblewrap)
    }

    fn step_command(&self) -> StepCommand {
        self.command.clone().unwrap_or_else(|| StepCommand {
            argv: DEFAULT_SANDBOX_COMMAND
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            cwd: None,
            stdin: Default::default(),
        })
    }

    /// The JavaScript `configJson` shape (before redaction): the execution options, then the
    /// step's own config spread over them.
    fn config_value(&self) -> Value {
        let selected = self.selected_runtime();
        let mut m = Map::new();
        m.insert(
            "runtime".into(),
            json!(self.runtime.unwrap_or(selected).as_str()),
        );
        m.insert("selectedRuntime".into(), json!(selected.as_str()));
        m.insert("allowNetwork".into(), json!(self.controls.allow_network));
        m.insert(
            "maxOutputBytes".into(),
            json!(self.controls.max_output_bytes),
        );
        if let Some(t) = self.controls.timeout_ms {
            m.insert("toolTimeoutMs".into(), json!(t));
        }
        m.insert("reviewDiffs".into(), json!(self.review_diffs));
        m.insert("autoAcceptDiffs".into(), json!(self.auto_accept_diffs));
        let own = match &self.config {
            Value::Null => serde_json::to_value(&self.controls).unwrap_or(Value::Null),
            other => other.clone(),
        };
        if let Value::Object(own) = own {
            m.extend(own);
        }
        Value::Object(m)
    }
}

/// A progress report (`runtime.heartbeat` in the JavaScript package).
#[derive(Debug, Clone, PartialEq)]
pub struct Heartbeat {
    pub sandbox_id: String,
    /// initializing, created, shipped, executing, child-finished, bundle-collected, review,
    /// completed, cancelled, failed.
    pub stage: &'static str,
    /// 0..=100.
    pub progress: u8,
    /// Extra fields (status, patchCount, error, ...).
    pub data: Map<String, Value>,
}

/// Receives heartbeats. Called inline: keep it quick (send to a channel).
pub type HeartbeatFn = Arc<dyn Fn(&Heartbeat) + Send + Sync>;

/// What the surrounding run provides: heartbeats, cancellation and live output.
#[derive(Clone, Default)]
pub struct StepContext {
    pub heartbeat: Option<HeartbeatFn>,
    /// Cancelling kills every process of the sandbox; the sandbox ends as `cancelled`.
    pub cancel: CancellationToken,
    pub output: Option<Arc<dyn OutputSink>>,
}

impl std::fmt::Debug for StepContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepContext")
            .field("heartbeat", &self.heartbeat.is_some())
            .field("cancel", &self.cancel)
            .field("output", &self.output.is_some())
            .finish()
    }
}

/// What is left of a step once its outcome is recorded (see
/// [`Orchestrator::execute_then_finish`]): its sandbox's cleanup and its lease's release.
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
// One value per step, moved once to its caller: boxing the large variant would add an
// allocation and a deref at every use for no gain.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum SandboxOutcome {
    Completed(CompletedSandbox),
    AwaitingReview(PendingReview),
    /// Cancelled through the [`StepContext::cancel`] token; the bundle, when one could still be
    /// collected, is kept for inspection and nothing was applied.
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
}

/// The sandbox lifecycle engine. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Orchestrator {
    store: Arc<Store>,
    runtimes: HashMap<RuntimeKind, Arc<dyn Runtime>>,
    inspector: Arc<dyn BundleInspector>,
    applier: Arc<dyn PatchApplier>,
    metrics: Arc<Metrics>,
    settings: Settings,
    owner: OwnerIdentity,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn elapsed_ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// Decrements the active gauge when dropped: whatever path ends a sandbox (success, error,
/// review, cancellation, even a dropped future), the gauge goes down exactly once.
struct ActiveGuard {
    metrics: Arc<Metrics>,
    runtime: &'static str,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.metrics.active_add(self.runtime, -1);
    }
}

/// How the inner lifecycle stopped when it did not return an outcome.
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

enum Stop {
    Failed(OrchestratorError),
    Cancelled,
}

impl From<OrchestratorError> for Stop {
    fn from(e: OrchestratorError) -> Self {
        Stop::Failed(e)
    }
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        Stop::Failed(e.into())
    }
}

/// Mutable state of one execution, read by the failure/cancel bookkeeping.
/// What is left of a sandbox once its outcome is recorded (see [`Orchestrator::finish`]).
struct Tail {
    runtime: Arc<dyn Runtime>,
    runtime_name: &'static str,
    cleanup: Option<tokio::task::JoinHandle<(Result<(), smithers_runtime::RuntimeError>, f64)>>,
    handle: Option<SandboxHandle>,
    reason: String,
}

struct Progress {
    shipped_at_ms: Option<i64>,
    handle: Option<SandboxHandle>,
    bundle_path: Option<PathBuf>,
    child_started: Option<Instant>,
    /// The sandbox's cleanup, started as soon as its bundle is collected when
    /// `cleanup_at_collect` (see `lifecycle`): its result and how long it took.
    cleanup: Option<tokio::task::JoinHandle<(Result<(), smithers_runtime::RuntimeError>, f64)>>,
    /// Whether the cleanup starts once the bundle is collected (`execute`), or is left to
    /// the finish (`execute_then_finish`: after the caller's answer).
    cleanup_at_collect: bool,
}

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
    /// An orchestrator with no runtime registered yet, validating bundles with
    /// [`BundleValidator`] and applying accepted patches with `applier`.
    pub fn new(
        store: Arc<Store>,
        applier: Arc<dyn PatchApplier>,
        settings: Settings,
    ) -> Result<Self, OrchestratorError> {
        Self::with_inspector(store, Arc::new(BundleValidator), applier, settings)
    }

    /// Like [`Orchestrator::new`] with another bundle inspector (one that adds checks).
    pub fn with_inspector(
        store: Arc<Store>,
        inspector: Arc<dyn BundleInspector>,
        applier: Arc<dyn PatchApplier>,
        settings: Settings,
    ) -> Result<Self, OrchestratorError> {
        let owner = OwnerIdentity::current().ok_or_else(|| OrchestratorError::Io {
            operation: "read process identity from",
            path: "/proc/self/stat".into(),
            source: std::io::Error::other("process identity unavailable"),
        })?;
        Ok(Orchestrator {
            store,
            runtimes: HashMap::new(),
            inspector,
            applier,
            metrics: Arc::new(Metrics::new()),
            settings,
            owner,
        })
    }

    /// Registers a backend under its [`Runtime::kind`].
    pub fn with_runtime(mut self, runtime: Arc<dyn Runtime>) -> Self {
        self.runtimes.insert(runtime.kind(), runtime);
        self
    }

    /// The metrics of this process.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    fn emit(
        &self,
        event_type: &str,
        run_id: &str,
        sandbox_id: &str,
        extra: Vec<(&str, Value)>,
        timestamp_ms: i64,
    ) -> Result<i64, StoreError> {
        let payload = event_json(event_type, run_id, sandbox_id, extra, timestamp_ms);
        off_worker(|| {
            self.store.insert_event(&NewEvent {
                run_id,
                timestamp_ms,
                event_type,
                payload_json: &payload,
            })
        })
    }

    fn heartbeat(
        ctx: &StepContext,
        sandbox_id: &str,
        stage: &'static str,
        progress: u8,
        data: Vec<(&str, Value)>,
    ) {
        if let Some(hb) = &ctx.heartbeat {
            hb(&Heartbeat {
                sandbox_id: sandbox_id.to_string(),
                stage,
                progress,
                data: data.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            });
        }
    }

    /// Writes the sandbox's handle to its row (what recovery cleans up from).
    fn store_handle(
        &self,
        run_id: &str,
        sandbox_id: &str,
        handle: &SandboxHandle,
    ) -> Result<(), OrchestratorError> {
        let handle_json =
            serde_json::to_string(handle).map_err(|source| OrchestratorError::Handle {
                sandbox_id: sandbox_id.to_string(),
                source,
            })?;
        off_worker(|| self.store.set_handle(run_id, sandbox_id, &handle_json))?;
        Ok(())
    }

    async fn timed<T>(&self, fut: impl std::future::Future<Output = T>) -> T {
        let started = Instant::now();
        let out = fut.await;
        self.metrics.observe_transport_ms(elapsed_ms(started));
        out
    }

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
    async fn finish(&self, req: &SandboxRequest, tail: Tail) {
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
    async fn execute_to_outcome(
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

    /// The gate refused: record it like 0.16 (row `failed` when the id is not in use,
    /// SandboxFailed, heartbeat `failed`) without touching another execution's row.
    fn refused(
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

    async fn lifecycle(
        &self,
        req: &SandboxRequest,
        ctx: &StepContext,
        runtime: &Arc<dyn Runtime>,
        progress: &mut Progress,
    ) -> Result<SandboxOutcome, Stop> {
        let run_id = req.run_id.as_str();
        let sid = req.sandbox_id.as_str();
        let runtime_name = req.selected_runtime().as_str();

        // Step 3 (its event was written with the admission).
        Self::heartbeat(ctx, sid, "created", 10, vec![]);

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
        let request = RequestBundle {
            request: json!({
                "status": "pending",
                "sandboxId": sid,
                "runtime": req.runtime.unwrap_or(req.selected_runtime()).as_str(),
                "input": req.input,
            }),
        };
        let shipped = self
            .timed(runtime.ship(&handle, &request))
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

        // Step 5: execute.
        if ctx.cancel.is_cancelled() {
            return Err(Stop::Cancelled);
        }
        Self::heartbeat(ctx, sid, "executing", 40, vec![]);
        let outcome = self
            .run_step(req, ctx, runtime.as_ref(), &handle, progress)
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

        // Step 6: collect + validate.
        let collected = self.timed(runtime.collect(&handle)).await;
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
        // A step that did not exit 0 never counts as finished, whatever its bundle says
        // (0.16 ignored the exit code).
        let status = if bundle.status == "finished" && !outcome.succeeded() {
            "failed".to_string()
        } else {
            bundle.status.clone()
        };
        let duration_ms = progress.child_started.map_or(0.0, elapsed_ms);

        // Step 7: the review gate.
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
                self.apply(req, &bundle)?;
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
                    &bundle,
                    NewReview {
                        run_id: run_id.to_string(),
                        sandbox_id: sid.to_string(),
                        root_dir: req.root_dir.to_string_lossy().into_owned(),
                        bundle_path: bundle.bundle_path.to_string_lossy().into_owned(),
                        bundle_status: status.clone(),
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
                return Ok(SandboxOutcome::AwaitingReview(PendingReview {
                    status,
                    outputs: bundle.outputs,
                    bundle_path: bundle.bundle_path,
                    patch_count,
                    total_diff_lines,
                    patches,
                }));
            }
        } else if patch_count > 0 {
            // reviewDiffs: false applies without asking, as 0.32 does.
            self.apply(req, &bundle)?;
            applied = patch_count;
        }

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

    /// Runs `execute` with live output and step heartbeats (which move the row's
    /// `heartbeat_at_ms`, as the JavaScript provider heartbeat does).
    async fn run_step(
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

    fn apply(
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

    /// Step 9: best-effort failure bookkeeping; every secondary failure is logged, the
    /// original error is what the caller gets.
    fn record_failure(
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

    fn record_cancelled(
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

    fn cleanup_failed(&self, req: &SandboxRequest, runtime_name: &str, e: &dyn CodedError) {
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

    fn pending_review(
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

    fn claim_review(
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
        let applied = off_worker(|| {
            self.inspector
                .inspect(std::path::Path::new(&review.bundle_path))
                .map_err(|report| OrchestratorError::Bundle {
                    report: Box::new(report),
                })
                .and_then(|bundle| {
                    let found =
                        bundle_digest(&bundle).map_err(|report| OrchestratorError::Bundle {
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
                        None => {
                            self.applier
                                .apply_reviewed(root, &bundle, &recorded, conflict_markers)
                        }
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
        });
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

    fn emit_bundle_received(
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

    fn emit_review_requested(
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
    fn open_pending_review(
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

    /// Moves the `_smithers_runs` row of a run our CLI started (none for a workflow's run or
    /// a library caller's: see `Store::settle_cli_run`). A failure is logged: the decision
    /// it follows stands.
    fn settle_cli_run(&self, run_id: &str, status: RunStatus, at_ms: i64, error: Option<&Value>) {
        let error = error.map(Value::to_string);
        if let Err(e) = off_worker(|| {
            self.store
                .settle_cli_run(run_id, status, at_ms, error.as_deref())
        }) {
            warn!(run_id, error = %e, "updating the run's _smithers_runs row failed");
        }
    }

    /// Once a review is decided, the workspace layer a backend kept for changes left out for
    /// a size limit (`<root>/.smithers/sandboxes/<runId>/<sandboxId>/kept-layer`) has served
    /// its purpose: it is removed. The path is derived from the ids, and the root is the
    /// review's only when it is this database's project (a database in a project names no
    /// other); a failure is logged, the decision stands.
    fn remove_kept_layer(&self, run_id: &str, sandbox_id: &str, root_dir: &str) {
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

    /// The project whose `.smithers/` holds this database, when it is there.
    fn database_project(&self) -> Option<&Path> {
        self.store
            .path()
            .parent()
            .filter(|d| d.file_name() == Some(std::ffi::OsStr::new(".smithers")))
            .and_then(Path::parent)
    }

    /// After a failed accept: the error is recorded, the review is `pending` again (nothing
    /// was applied) and SandboxDiffApplyFailed says why. Failures to record are logged: the
    /// apply error is what the caller gets.
    fn reopen_review(&self, run_id: &str, sandbox_id: &str, err: &OrchestratorError) {
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

    fn fail_reviewed(
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
    async fn clean_up_orphan(&self, orphan: &smithers_store::Orphan) -> (bool, Option<String>) {
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
    fn check_orphan_handle(
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
