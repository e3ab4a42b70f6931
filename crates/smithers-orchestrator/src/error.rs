//! The one error type of the orchestrator.

use serde_json::{json, Map, Value};
use smithers_errors::{CodedError, ErrorCode, ErrorReport};
use smithers_runtime::RuntimeError;
use smithers_store::StoreError;

/// Every way a sandbox lifecycle (or a review decision, or recovery) can fail.
#[derive(Debug, thiserror::Error)]
pub enum OrchestratorError {
    /// No backend is registered for the requested runtime. Never falls back to another one.
    #[error("the {runtime} runtime is not available in this process")]
    RuntimeNotRegistered { runtime: String },
    /// A store operation failed. The concurrency-limit error keeps its exact message and code.
    #[error("{source}")]
    Store {
        #[source]
        source: StoreError,
    },
    /// A runtime verb failed (the runtime itself, not the step: step failures are outcomes).
    #[error("sandbox {verb} failed: {source}")]
    Runtime {
        verb: &'static str,
        #[source]
        source: RuntimeError,
    },
    /// The collected bundle is invalid (its own code kept: INVALID_INPUT, TOOL_PATH_ESCAPE...).
    #[error("invalid result bundle: {report}")]
    Bundle { report: Box<ErrorReport> },
    /// 0.16 compatibility (fail-closed review): patches exist and nobody may approve them.
    #[error("Sandbox produced patches that require review approval.")]
    ReviewRequired {
        sandbox_id: String,
        patch_count: u64,
    },
    /// A person rejected the patches of a durable review.
    #[error("Sandbox patches were rejected in review: {reason}")]
    ReviewRejected {
        sandbox_id: String,
        patch_count: u64,
        reason: String,
    },
    /// A bundle held for review that changes nothing.
    #[error("the bundle of sandbox {sandbox_id} changes nothing: there is nothing to review")]
    NothingToReview { sandbox_id: String },
    /// An option that applies changes here was asked of a review its caller applies itself.
    #[error("sandbox {sandbox_id} was held for review by a caller that applies it itself (the Smithers provider): accept records the decision only, so --branch cannot be honoured")]
    CallerApplies { sandbox_id: String },
    /// Applying accepted patches failed; nothing was applied (the applier is all-or-nothing).
    #[error("applying the patches of sandbox {sandbox_id} failed: {report}")]
    Apply {
        sandbox_id: String,
        report: Box<ErrorReport>,
    },
    /// Writing or reading our own files (request document) failed.
    #[error("{operation} {path}: {source}")]
    Io {
        operation: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A stored handle could not be read back (crash recovery).
    #[error("stored handle of sandbox {sandbox_id} is unreadable: {source}")]
    Handle {
        sandbox_id: String,
        #[source]
        source: serde_json::Error,
    },
    /// The bundle on disk is not the one the review was opened on (edited, swapped, or a
    /// review without a recorded digest): accepting it would apply bytes nobody reviewed.
    #[error("the bundle of sandbox {sandbox_id} changed since it was reviewed (recorded {recorded}, now {found}); review it again or reject it")]
    BundleChanged {
        sandbox_id: String,
        recorded: String,
        found: String,
    },
    /// The sandbox has no review, or it is not in the state the request needs.
    #[error("sandbox {sandbox_id} of run {run_id} has no pending review")]
    NoPendingReview { run_id: String, sandbox_id: String },
}

impl From<StoreError> for OrchestratorError {
    fn from(source: StoreError) -> Self {
        OrchestratorError::Store { source }
    }
}

impl CodedError for OrchestratorError {
    fn code(&self) -> ErrorCode {
        match self {
            OrchestratorError::RuntimeNotRegistered { .. } => ErrorCode::TaskRuntimeUnavailable,
            OrchestratorError::Store { source } => source.code(),
            OrchestratorError::Runtime { source, .. } => source.code(),
            OrchestratorError::Bundle { report } => report.code,
            OrchestratorError::ReviewRequired { .. } => ErrorCode::InvalidInput,
            OrchestratorError::ReviewRejected { .. } => ErrorCode::InvalidInput,
            OrchestratorError::Apply { report, .. } => match report.code {
                // A conflict keeps TOOL_PATCH_FAILED; an escaping path keeps its path code.
                ErrorCode::Internal => ErrorCode::ToolPatchFailed,
                code => code,
            },
            OrchestratorError::Io { .. } => ErrorCode::SandboxExecutionFailed,
            OrchestratorError::Handle { .. } => ErrorCode::SandboxExecutionFailed,
            OrchestratorError::NoPendingReview { .. } => ErrorCode::InvalidInput,
            OrchestratorError::BundleChanged { .. } => ErrorCode::ToolPatchFailed,
            OrchestratorError::NothingToReview { .. } => ErrorCode::InvalidInput,
            OrchestratorError::CallerApplies { .. } => ErrorCode::InvalidInput,
        }
    }

    fn details(&self) -> Value {
        match self {
            OrchestratorError::RuntimeNotRegistered { runtime } => json!({ "runtime": runtime }),
            OrchestratorError::Store { source } => source.details(),
            OrchestratorError::Runtime { verb, source } => {
                let mut d = match source.details() {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                d.insert("verb".into(), json!(verb));
                Value::Object(d)
            }
            OrchestratorError::Bundle { report } => report.details.clone(),
            OrchestratorError::ReviewRequired {
                sandbox_id,
                patch_count,
            } => json!({ "sandboxId": sandbox_id, "patchCount": patch_count }),
            OrchestratorError::ReviewRejected {
                sandbox_id,
                patch_count,
                reason,
            } => json!({ "sandboxId": sandbox_id, "patchCount": patch_count, "reason": reason }),
            OrchestratorError::Apply { sandbox_id, report } => {
                json!({ "sandboxId": sandbox_id, "cause": report.to_json() })
            }
            OrchestratorError::Io {
                operation, path, ..
            } => json!({ "operation": operation, "path": path }),
            OrchestratorError::Handle { sandbox_id, .. } => json!({ "sandboxId": sandbox_id }),
            OrchestratorError::NoPendingReview { run_id, sandbox_id } => {
                json!({ "runId": run_id, "sandboxId": sandbox_id })
            }
            OrchestratorError::BundleChanged {
                sandbox_id,
                recorded,
                found,
            } => {
                json!({ "sandboxId": sandbox_id, "recordedDigest": recorded, "foundDigest": found })
            }
            OrchestratorError::NothingToReview { sandbox_id }
            | OrchestratorError::CallerApplies { sandbox_id } => {
                json!({ "sandboxId": sandbox_id })
            }
        }
    }
}

/// The `error` object of a SandboxFailed event, shaped like the JavaScript `errorToJson` of a
/// `SmithersError`: `{name, code, message, summary, details}`.
pub fn error_to_json(err: &dyn CodedError) -> Value {
    let report = err.report();
    json!({
        "name": "SmithersError",
        "code": report.code.as_str(),
        "message": report.message,
        "summary": report.message,
        "details": report.details,
    })
}
