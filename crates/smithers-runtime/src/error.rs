//! Errors a runtime verb may return. A command that exits non-zero, is killed by a limit or
//! times out is an [`crate::ExecOutcome`], not an error: an error means the runtime itself failed.

use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode, ErrorReport};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A control or config field breaks a rule (spec section 4).
    #[error("invalid {control}: {reason}")]
    InvalidControl {
        control: &'static str,
        reason: String,
    },

    /// The runtime cannot enforce a requested control on this host. Never silently ignored.
    #[error("the {runtime} runtime cannot enforce {control}: {reason}")]
    ControlUnsupported {
        runtime: &'static str,
        control: &'static str,
        reason: String,
    },

    /// The runtime is not usable here (missing kernel feature, daemon down, API unreachable).
    /// `fix` tells the user what to do about it.
    #[error("the {runtime} runtime is unavailable: {reason}")]
    Unavailable {
        runtime: &'static str,
        reason: String,
        fix: Option<String>,
    },

    /// Setting up or starting the sandbox failed.
    #[error("failed to {operation}: {reason}")]
    Spawn { operation: String, reason: String },

    /// An I/O failure on the runtime's own state on the host.
    #[error("{operation} {path}: {source}")]
    Io {
        operation: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// A verb was called on a handle in the wrong state (execute before ship, ...).
    #[error("{verb} called out of order: {reason}")]
    OutOfOrder { verb: &'static str, reason: String },

    /// The sandbox cannot do `verb` now (a command holds what it needs); nothing changed.
    #[error("cannot {verb} now: {reason}")]
    Busy { verb: &'static str, reason: String },

    /// The fleet node holding the sandbox's lease was lost (died, partitioned, or the lease
    /// ended under the step). The step's result is unknown; nothing from it is kept.
    #[error("the {runtime} runtime lost the node of lease {lease}: {reason}")]
    NodeLost {
        runtime: &'static str,
        lease: String,
        /// The node the lease ran on, when the engine said.
        node: Option<String>,
        /// The engine's own words (its job status and message).
        reason: String,
    },

    /// A coded error from a lower layer (bundle writing, patch generation), code kept.
    #[error("{context}: {inner}")]
    Inner {
        context: String,
        /// Boxed: a report carries a JSON value, and errors travel in every `Result`.
        inner: Box<ErrorReport>,
    },
}

impl RuntimeError {
    pub fn io(
        operation: &'static str,
        path: impl AsRef<std::path::Path>,
        source: std::io::Error,
    ) -> Self {
        RuntimeError::Io {
            operation,
            path: path.as_ref().display().to_string(),
            source,
        }
    }

    pub fn spawn(operation: impl Into<String>, reason: impl ToString) -> Self {
        RuntimeError::Spawn {
            operation: operation.into(),
            reason: reason.to_string(),
        }
    }

    /// Wraps a coded error from another crate, keeping its code.
    pub fn inner(context: impl Into<String>, err: &dyn CodedError) -> Self {
        RuntimeError::Inner {
            context: context.into(),
            inner: Box::new(err.report()),
        }
    }
}

impl CodedError for RuntimeError {
    fn code(&self) -> ErrorCode {
        match self {
            RuntimeError::InvalidControl { .. } => ErrorCode::InvalidInput,
            RuntimeError::ControlUnsupported { .. } => ErrorCode::TaskRuntimeUnavailable,
            RuntimeError::Unavailable { .. } => ErrorCode::TaskRuntimeUnavailable,
            RuntimeError::Spawn { .. } => ErrorCode::ProcessSpawnFailed,
            RuntimeError::Io { .. } => ErrorCode::SandboxExecutionFailed,
            RuntimeError::OutOfOrder { .. } => ErrorCode::SandboxExecutionFailed,
            RuntimeError::NodeLost { .. } => ErrorCode::NodeLost,
            RuntimeError::Busy { .. } => ErrorCode::Busy,
            RuntimeError::Inner { inner, .. } => inner.code,
        }
    }

    fn details(&self) -> Value {
        match self {
            RuntimeError::InvalidControl { control, .. } => json!({ "control": control }),
            RuntimeError::ControlUnsupported {
                runtime, control, ..
            } => {
                json!({ "runtime": runtime, "control": control })
            }
            RuntimeError::Unavailable { runtime, fix, .. } => {
                json!({ "runtime": runtime, "fix": fix })
            }
            RuntimeError::Spawn { operation, .. } => json!({ "operation": operation }),
            RuntimeError::Io {
                operation,
                path,
                source,
            } => {
                json!({ "operation": operation, "path": path, "os_error": source.raw_os_error() })
            }
            RuntimeError::OutOfOrder { verb, .. } | RuntimeError::Busy { verb, .. } => {
                json!({ "verb": verb })
            }
            RuntimeError::NodeLost {
                runtime,
                lease,
                node,
                reason,
            } => json!({ "runtime": runtime, "lease": lease, "node": node, "reason": reason }),
            RuntimeError::Inner { inner, .. } => json!({ "cause": inner.to_json() }),
        }
    }
}
