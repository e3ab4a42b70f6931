//! The error vocabulary shared by every smithers-sandbox crate.
//!
//! Each library crate has its own error type (named after the operation that failed, with
//! context in fields). What they share is this: every error maps to exactly one stable
//! [`ErrorCode`] (section 9 of the spec), and renders as the JSON object
//! `{"code", "message", "details"}` that the CLI prints under `--json`, the HTTP API returns
//! and the JavaScript package uses. Codes are part of the public contract: never rename one.
#![forbid(unsafe_code)]

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A stable, machine-readable error code. The string forms are the contract; the enum is
/// exhaustive so that every `match` over it is checked by the compiler when a code is added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// Input (a bundle, a config, a request) breaks a documented rule or limit.
    InvalidInput,
    /// A path is empty or not a string.
    ToolPathInvalid,
    /// A path leaves its root, lexically or through a symlink.
    ToolPathEscape,
    /// A patch could not be applied (conflict, corrupt patch, I/O failure during apply).
    ToolPatchFailed,
    /// The sandbox lifecycle failed (concurrency limit, runtime failure wrapped by the orchestrator).
    SandboxExecutionFailed,
    /// A process or sandbox could not be started.
    ProcessSpawnFailed,
    /// A process ran past its timeout.
    ProcessTimeout,
    /// A process was cancelled.
    ProcessAborted,
    /// The requested runtime (or one of its controls) cannot be used on this host.
    TaskRuntimeUnavailable,
    /// An unexpected internal failure (I/O on our own state, a bug). Not in the original
    /// vocabulary; used only where none of the above describes the failure.
    Internal,
    /// The fleet node a step ran on was lost (died, cut off, or its lease stopped) while the
    /// step held it: the step's result is unknown and nothing from it is kept. Never retried
    /// by us; running it elsewhere is the caller's choice. Not in the original vocabulary.
    NodeLost,
    /// What was asked for does not exist: a session's file, or a session that is not held
    /// (any more). Not in the original vocabulary.
    NotFound,
    /// The sandbox cannot do it now: a command it is running holds what the operation needs
    /// (a checkpoint while a command works in the workspace). Nothing changed; retry between
    /// commands. Not in the original vocabulary.
    Busy,
}

impl ErrorCode {
    /// Every code, in declaration order (for documentation and exhaustive tests).
    pub const ALL: [ErrorCode; 13] = [
        ErrorCode::InvalidInput,
        ErrorCode::ToolPathInvalid,
        ErrorCode::ToolPathEscape,
        ErrorCode::ToolPatchFailed,
        ErrorCode::SandboxExecutionFailed,
        ErrorCode::ProcessSpawnFailed,
        ErrorCode::ProcessTimeout,
        ErrorCode::ProcessAborted,
        ErrorCode::TaskRuntimeUnavailable,
        ErrorCode::Internal,
        ErrorCode::NodeLost,
        ErrorCode::NotFound,
        ErrorCode::Busy,
    ];

    /// The stable string form, e.g. `"TOOL_PATH_ESCAPE"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidInput => "INVALID_INPUT",
            ErrorCode::ToolPathInvalid => "TOOL_PATH_INVALID",
            ErrorCode::ToolPathEscape => "TOOL_PATH_ESCAPE",
            ErrorCode::ToolPatchFailed => "TOOL_PATCH_FAILED",
            ErrorCode::SandboxExecutionFailed => "SANDBOX_EXECUTION_FAILED",
            ErrorCode::ProcessSpawnFailed => "PROCESS_SPAWN_FAILED",
            ErrorCode::ProcessTimeout => "PROCESS_TIMEOUT",
            ErrorCode::ProcessAborted => "PROCESS_ABORTED",
            ErrorCode::TaskRuntimeUnavailable => "TASK_RUNTIME_UNAVAILABLE",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::NodeLost => "NODE_LOST",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::Busy => "BUSY",
        }
    }

    /// Parses the stable string form.
    pub fn parse(s: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The rendered form of any error: what `--json`, the HTTP API and the event payloads carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorReport {
    pub code: ErrorCode,
    pub message: String,
    /// Structured context (the limit that was hit, the offending path, the inner code of a
    /// wrapped error). `null` when there is none.
    #[serde(default)]
    pub details: Value,
}

impl ErrorReport {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorReport {
            code,
            message: message.into(),
            details: Value::Null,
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    /// `{"code": ..., "message": ..., "details": ...}` as a JSON value.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl fmt::Display for ErrorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.code, self.message)
    }
}

impl std::error::Error for ErrorReport {}

/// Implemented by every library error type: the one place that maps a failure to its code.
///
/// Implementations use an exhaustive `match` on their own variants so a new variant cannot be
/// added without choosing its code. When an error wraps another coded error, `details` keeps
/// the inner code (`{"cause": {"code": ...}}`) instead of replacing it.
pub trait CodedError: std::error::Error {
    fn code(&self) -> ErrorCode;

    /// Structured context for the report; `null` by default.
    fn details(&self) -> Value {
        Value::Null
    }

    /// The full `{code, message, details}` rendering. The message is the `Display` text.
    fn report(&self) -> ErrorReport {
        ErrorReport {
            code: self.code(),
            message: self.to_string(),
            details: self.details(),
        }
    }
}

impl CodedError for ErrorReport {
    fn code(&self) -> ErrorCode {
        self.code
    }
    fn details(&self) -> Value {
        self.details.clone()
    }
    fn report(&self) -> ErrorReport {
        self.clone()
    }
}

/// An error and its chain of causes, `: `-joined (HTTP clients hide the useful part, "connection
/// refused", several sources down).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_forms_round_trip_and_match_serde() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            let json = serde_json::to_value(code).unwrap();
            assert_eq!(json, Value::String(code.as_str().to_string()));
        }
        assert_eq!(ErrorCode::parse("NOPE"), None);
    }

    #[test]
    fn report_renders_code_message_details() {
        let r = ErrorReport::new(ErrorCode::ToolPathEscape, "Path escapes sandbox root")
            .with_details(serde_json::json!({"path": "../x"}));
        assert_eq!(
            r.to_json(),
            serde_json::json!({"code": "TOOL_PATH_ESCAPE", "message": "Path escapes sandbox root", "details": {"path": "../x"}})
        );
        assert_eq!(
            r.to_string(),
            "[TOOL_PATH_ESCAPE] Path escapes sandbox root"
        );
    }
}
