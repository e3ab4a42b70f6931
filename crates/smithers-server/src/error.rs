//! Errors: [`ServerError`] for starting and running the service, [`ApiError`] for one request
//! (an HTTP status plus the `{code, message, details}` body every error response carries).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode, ErrorReport};
use smithers_runtime::RuntimeError;
use smithers_wire::archive::ArchiveError;

/// Failure to start or run the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// No token was configured and the address is not loopback: the API would be open to
    /// anyone who can reach the port.
    #[error("refusing to listen on {addr} without a token: set SMITHERS_SANDBOX_TOKEN or bind to 127.0.0.1/::1")]
    NoTokenOnPublicAddress { addr: String },

    /// The configured token is unusable (empty, too short).
    #[error("invalid token: {reason}")]
    InvalidToken { reason: String },

    /// The data directory could not be prepared.
    #[error("{operation} {path}: {source}")]
    DataDir {
        operation: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// Accepting or serving connections failed.
    #[error("serve: {source}")]
    Serve {
        #[source]
        source: std::io::Error,
    },
}

impl CodedError for ServerError {
    fn code(&self) -> ErrorCode {
        match self {
            ServerError::NoTokenOnPublicAddress { .. } | ServerError::InvalidToken { .. } => {
                ErrorCode::InvalidInput
            }
            ServerError::DataDir { .. } | ServerError::Serve { .. } => ErrorCode::Internal,
        }
    }

    fn details(&self) -> Value {
        match self {
            ServerError::NoTokenOnPublicAddress { addr } => json!({ "addr": addr }),
            ServerError::InvalidToken { .. } => Value::Null,
            ServerError::DataDir {
                operation, path, ..
            } => json!({ "operation": operation, "path": path }),
            ServerError::Serve { .. } => Value::Null,
        }
    }
}

/// An error answer: a documented status and the coded report.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub report: ErrorReport,
}

impl ApiError {
    pub fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            report: ErrorReport::new(code, message),
        }
    }

    pub fn details(mut self, details: Value) -> Self {
        self.report.details = details;
        self
    }

    pub fn malformed(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, message)
    }

    pub fn not_found(id: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::InvalidInput,
            format!("no sandbox with id {id:?}"),
        )
        .details(json!({ "id": id }))
    }

    pub fn conflict(message: impl Into<String>, state: &str) -> Self {
        ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::SandboxExecutionFailed,
            message,
        )
        .details(json!({ "state": state }))
    }

    pub fn too_large(limit: &'static str, max: u64) -> Self {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::InvalidInput,
            format!("request exceeds the {limit} limit of {max}"),
        )
        .details(json!({ "limit": limit, "max": max }))
    }

    pub fn draining() -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::TaskRuntimeUnavailable,
            "the sandbox host is shutting down and accepts no new work",
        )
        .details(json!({ "fix": "retry against another host or after the restart" }))
    }

    /// Maps a runtime error to its documented status, keeping its code and details.
    pub fn runtime(err: &RuntimeError) -> Self {
        let status = match err {
            RuntimeError::InvalidControl { .. } | RuntimeError::ControlUnsupported { .. } => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            RuntimeError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            RuntimeError::OutOfOrder { .. } | RuntimeError::Busy { .. } => StatusCode::CONFLICT,
            // Not 502/503: the client retries those, and would lose the stable code.
            RuntimeError::Spawn { .. }
            | RuntimeError::Io { .. }
            | RuntimeError::Inner { .. }
            | RuntimeError::NodeLost { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError {
            status,
            report: err.report(),
        }
    }

    /// Maps an archive error: limits 413, path tricks and forbidden entry types 422, a stream
    /// that is not a (compressed) tar 400, our own I/O 500.
    pub fn archive(err: &ArchiveError) -> Self {
        let status = match err {
            ArchiveError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ArchiveError::PathEscape { .. }
            | ArchiveError::SymlinkEscape { .. }
            | ArchiveError::SymlinkRefused { .. }
            | ArchiveError::HardLink { .. }
            | ArchiveError::UnsupportedEntry { .. }
            | ArchiveError::Reserved { .. }
            | ArchiveError::Duplicate { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ArchiveError::Malformed { .. } | ArchiveError::Stream { .. } => StatusCode::BAD_REQUEST,
            ArchiveError::Cancelled => StatusCode::GATEWAY_TIMEOUT,
            ArchiveError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError {
            status,
            report: err.report(),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            message,
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.report.to_json()).unwrap_or_default();
        let mut resp = (self.status, body).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"smithers-sandbox\""),
            );
        }
        resp
    }
}
