//! Durable review over HTTP: list reviews, read one with its patches, accept (apply) or reject.
//! These sit on the [`smithers_orchestrator::Orchestrator`] of this host (the one that ran the
//! steps and recorded their reviews), attached with [`crate::SandboxServer::with_orchestrator`];
//! without one they answer 503.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;
use smithers_errors::{CodedError, ErrorCode};
use smithers_orchestrator::{Orchestrator, OrchestratorError};
use smithers_store::ReviewState;

use crate::error::ApiError;
use crate::routes::{json_response, read_json};
use crate::state::{AppState, Owner};

type St = State<Arc<AppState>>;

/// The reviews are of the steps this host's orchestrator ran, not of a client's hosted
/// sandboxes, so they are the operator's: only the `default` token (or anyone on a server
/// without tokens) may read or decide them. A named client token gets 404, as for a route
/// it cannot see.
fn operator_only(owner: &Owner) -> Result<(), ApiError> {
    if owner.0.is_empty() || owner.0 == crate::DEFAULT_TOKEN_NAME {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorCode::InvalidInput,
        "no such route",
    ))
}

fn orchestrator(state: &AppState) -> Result<&Arc<Orchestrator>, ApiError> {
    state.orchestrator.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::TaskRuntimeUnavailable,
            "no orchestrator is attached to this host: reviews are not served here",
        )
        .details(json!({ "fix": "start the host with its orchestrator (smithers-sandbox serve)" }))
    })
}

fn orchestrator_error(err: &OrchestratorError) -> ApiError {
    let status = match err {
        OrchestratorError::NoPendingReview { .. } => StatusCode::CONFLICT,
        _ => match err.code() {
            // Applying failed against the tree as it is now (conflict): nothing was applied.
            ErrorCode::ToolPatchFailed => StatusCode::CONFLICT,
            ErrorCode::InvalidInput | ErrorCode::ToolPathEscape | ErrorCode::ToolPathInvalid => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            ErrorCode::TaskRuntimeUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        },
    };
    ApiError {
        status,
        report: err.report(),
    }
}

fn store_error(err: &smithers_store::StoreError) -> ApiError {
    ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        report: err.report(),
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    state: Option<String>,
}

pub(crate) async fn list(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    operator_only(&owner)?;
    let orch = orchestrator(&state)?;
    let filter = match q.state.as_deref() {
        None => None,
        Some(s) => Some(
            serde_json::from_value::<ReviewState>(json!(s)).map_err(|_| {
                ApiError::malformed(format!(
                    "state must be pending, accepted, rejected or applied, got {s:?}"
                ))
            })?,
        ),
    };
    let rows = orch
        .store()
        .list_reviews(filter)
        .map_err(|e| store_error(&e))?;
    Ok(json_response(StatusCode::OK, &rows))
}

pub(crate) async fn get_one(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Path((run_id, sandbox_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    operator_only(&owner)?;
    let orch = orchestrator(&state)?;
    let review = orch
        .store()
        .get_review(&run_id, &sandbox_id)
        .map_err(|e| store_error(&e))?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                ErrorCode::InvalidInput,
                format!("no review for {run_id}:{sandbox_id}"),
            )
            .details(json!({ "runId": run_id, "sandboxId": sandbox_id }))
        })?;
    let patches = orch
        .store()
        .patches(&run_id, &sandbox_id)
        .map_err(|e| store_error(&e))?;
    Ok(json_response(
        StatusCode::OK,
        &json!({ "review": review, "patches": patches }),
    ))
}

/// The query of an accept: `?conflictMarkers=true` resolves text conflicts with markers.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct AcceptQuery {
    #[serde(default)]
    conflict_markers: bool,
}

pub(crate) async fn accept(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Path((run_id, sandbox_id)): Path<(String, String)>,
    Query(query): Query<AcceptQuery>,
) -> Result<Response, ApiError> {
    operator_only(&owner)?;
    let orch = orchestrator(&state)?;
    let done = orch
        .accept_with(&run_id, &sandbox_id, query.conflict_markers)
        .await
        .map_err(|e| orchestrator_error(&e))?;
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "status": done.status,
            "outputs": done.outputs,
            "bundlePath": done.bundle_path,
            "appliedPatches": done.applied_patches,
            "conflictMarkers": done.conflict_markers,
        }),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RejectBody {
    #[serde(default)]
    reason: Option<String>,
}

pub(crate) async fn reject(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Path((run_id, sandbox_id)): Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    operator_only(&owner)?;
    let body: RejectBody = read_json(body, state.config.limits.max_json_bytes).await?;
    let orch = orchestrator(&state)?;
    let reason = body
        .reason
        .unwrap_or_else(|| "rejected over HTTP".to_string());
    orch.reject(&run_id, &sandbox_id, &reason)
        .await
        .map_err(|e| orchestrator_error(&e))?;
    Ok(json_response(
        StatusCode::OK,
        &json!({ "runId": run_id, "sandboxId": sandbox_id, "state": "rejected", "reason": reason }),
    ))
}
