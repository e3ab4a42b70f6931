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

mod bookkeeping;
mod bundle;
mod engine;
mod error;
mod lifecycle;
mod lifecycle_state;
mod metrics;
mod outcome;
mod recovery;
mod request;
mod review;
mod settings;
mod step;
mod support;

pub use bundle::{
    bundle_digest, describe_patch_text, diff_line_count, AtomicPatchApplier, BundleInspector,
    BundleValidator, InspectedBundle, PatchApplier,
};
pub use engine::Orchestrator;
pub use error::{error_to_json, OrchestratorError};
pub use metrics::{HistogramSnapshot, Metrics};
pub use outcome::{
    CompletedSandbox, Finish, HeldBundle, PendingReview, RecoveredSandbox, SandboxOutcome,
};
pub use request::{Heartbeat, HeartbeatFn, SandboxRequest, StepContext, DEFAULT_SANDBOX_COMMAND};
pub use settings::{ReviewMode, Settings, DEFAULT_MAX_HOST_SANDBOXES, FAIL_CLOSED_REJECT_REASON};
