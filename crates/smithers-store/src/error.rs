//! The one error type of the store.

use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode};

/// Which concurrency limit refused an admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateScope {
    /// The per-run limit (`SMITHERS_MAX_CONCURRENT_SANDBOXES`).
    Run,
    /// The limit over every run sharing this database (this host).
    Host,
}

impl GateScope {
    /// `"run"` or `"host"`, as it appears in error details.
    pub fn as_str(self) -> &'static str {
        match self {
            GateScope::Run => "run",
            GateScope::Host => "host",
        }
    }
}

/// Every way a store operation can fail.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database file could not be opened or configured (pragmas).
    #[error("cannot open sandbox store at {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    /// A schema migration failed; the transaction was rolled back so the file is unchanged.
    #[error("store migration {version} failed: {source}")]
    Migrate {
        version: u32,
        #[source]
        source: rusqlite::Error,
    },
    /// The file was migrated by a newer build; refusing to touch a schema we do not know.
    #[error("store schema version {found} is newer than this build supports ({supported})")]
    SchemaTooNew { found: u32, supported: u32 },
    /// A query or statement failed.
    #[error("store operation {operation} failed: {source}")]
    Query {
        operation: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    /// A stored JSON column could not be (de)serialised.
    #[error("store operation {operation} could not handle JSON: {source}")]
    Json {
        operation: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The concurrency gate refused a new sandbox. The run-scope message is the one of the
    /// JavaScript package, character for character.
    #[error("{}", concurrency_message(*scope, run_id, *max_concurrent))]
    ConcurrencyLimit {
        scope: GateScope,
        run_id: String,
        max_concurrent: u32,
        active_sandbox_count: u64,
    },
    /// A sandbox with this id is still active (or awaiting review) in this run.
    #[error("sandbox {sandbox_id} of run {run_id} is already {status}")]
    SandboxAlreadyActive {
        run_id: String,
        sandbox_id: String,
        status: String,
    },
    /// No row for this sandbox.
    #[error("sandbox {sandbox_id} of run {run_id} not found")]
    SandboxNotFound { run_id: String, sandbox_id: String },
    /// A review decision that the current review state does not allow (e.g. accepting twice).
    #[error("review of sandbox {sandbox_id} of run {run_id} cannot go from {from} to {to}")]
    ReviewTransition {
        run_id: String,
        sandbox_id: String,
        from: String,
        to: String,
    },
}

fn concurrency_message(scope: GateScope, run_id: &str, max: u32) -> String {
    match scope {
        GateScope::Run => format!("Sandbox concurrency limit reached for run {run_id} ({max})."),
        GateScope::Host => {
            format!(
                "Sandbox concurrency limit reached for host ({max}) while starting run {run_id}."
            )
        }
    }
}

impl StoreError {
    pub(crate) fn query(operation: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
        move |source| StoreError::Query { operation, source }
    }
}

impl CodedError for StoreError {
    fn code(&self) -> ErrorCode {
        match self {
            StoreError::Open { .. }
            | StoreError::Migrate { .. }
            | StoreError::SchemaTooNew { .. }
            | StoreError::Query { .. }
            | StoreError::Json { .. } => ErrorCode::Internal,
            StoreError::ConcurrencyLimit { .. } => ErrorCode::SandboxExecutionFailed,
            StoreError::SandboxAlreadyActive { .. }
            | StoreError::SandboxNotFound { .. }
            | StoreError::ReviewTransition { .. } => ErrorCode::InvalidInput,
        }
    }

    fn details(&self) -> Value {
        match self {
            StoreError::Open { path, .. } => json!({ "path": path }),
            StoreError::Migrate { version, .. } => json!({ "version": version }),
            StoreError::SchemaTooNew { found, supported } => {
                json!({ "found": found, "supported": supported })
            }
            StoreError::Query { operation, .. } | StoreError::Json { operation, .. } => {
                json!({ "operation": operation })
            }
            // Same keys as the JavaScript package; `scope` is ours and only added for host.
            StoreError::ConcurrencyLimit {
                scope,
                run_id,
                max_concurrent,
                active_sandbox_count,
            } => match scope {
                GateScope::Run => json!({
                    "runId": run_id,
                    "maxConcurrent": max_concurrent,
                    "activeSandboxCount": active_sandbox_count,
                }),
                GateScope::Host => json!({
                    "runId": run_id,
                    "maxConcurrent": max_concurrent,
                    "activeSandboxCount": active_sandbox_count,
                    "scope": scope.as_str(),
                }),
            },
            StoreError::SandboxAlreadyActive {
                run_id,
                sandbox_id,
                status,
            } => json!({ "runId": run_id, "sandboxId": sandbox_id, "status": status }),
            StoreError::SandboxNotFound { run_id, sandbox_id } => {
                json!({ "runId": run_id, "sandboxId": sandbox_id })
            }
            StoreError::ReviewTransition {
                run_id,
                sandbox_id,
                from,
                to,
            } => json!({ "runId": run_id, "sandboxId": sandbox_id, "from": from, "to": to }),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
