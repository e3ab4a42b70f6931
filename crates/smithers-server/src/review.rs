//! Durable review over HTTP: list reviews, read one with its patches, accept (apply) or reject.
//! These sit on the [`smithers_orchestrator::Orchestrator`] of this host (the one that ran the
//! steps and recorded their reviews), attached with `SandboxServer::with_orchestrator`;
//! without one they answer 503. Each runs on a blocking thread (see `off_workers`): applying
//! a bundle reads, writes and fsyncs the project, and a store call may wait for another
//! writer's lock.

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
use crate::json::{json_response, read_json};
use crate::policy::DEFAULT_TOKEN_NAME;
use crate::state::{AppState, Owner};

type St = State<Arc<AppState>>;

/// The reviews are of the steps this host's orchestrator ran, not of a client's hosted
/// sandboxes, so they are the operator's: only the `default` token (or anyone on a server
/// without tokens) may read or decide them. A named client token gets 404, as for a route
/// it cannot see.
fn operator_only(owner: &Owner) -> Result<(), ApiError> {
    if owner.0.is_empty() || owner.0 == DEFAULT_TOKEN_NAME {
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

/// Runs `job` (the orchestrator's part of a review request) on tokio's blocking pool, so the
/// HTTP workers go on serving every other request (`/health`, event streams) while a bundle
/// is validated and applied or a store call waits for a lock. Async orchestrator calls are
/// driven there with `Handle::block_on`. A panic stays a panic of the handler.
async fn off_workers<T, F>(job: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&tokio::runtime::Handle) -> T + Send + 'static,
{
    let handle = tokio::runtime::Handle::current();
    match tokio::task::spawn_blocking(move || job(&handle)).await {
        Ok(value) => Ok(value),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(ApiError::internal(format!(
            "the review job did not run: {e}"
        ))),
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
    let orch = orch.clone();
    let rows = off_workers(move |_| orch.store().list_reviews(filter))
        .await?
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
    let (review, patches) = {
        let (orch, run_id, sandbox_id) = (orch.clone(), run_id.clone(), sandbox_id.clone());
        off_workers(move |_| {
            let review = orch.store().get_review(&run_id, &sandbox_id)?;
            let patches = match review {
                Some(_) => orch.store().patches(&run_id, &sandbox_id)?,
                None => Vec::new(),
            };
            Ok::<_, smithers_store::StoreError>((review, patches))
        })
        .await?
        .map_err(|e| store_error(&e))?
    };
    let review = review.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::InvalidInput,
            format!("no review for {run_id}:{sandbox_id}"),
        )
        .details(json!({ "runId": run_id, "sandboxId": sandbox_id }))
    })?;
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
    let orch = orch.clone();
    let markers = query.conflict_markers;
    let done = off_workers(move |rt| rt.block_on(orch.accept_with(&run_id, &sandbox_id, markers)))
        .await?
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
    {
        let (orch, run_id, sandbox_id, reason) = (
            orch.clone(),
            run_id.clone(),
            sandbox_id.clone(),
            reason.clone(),
        );
        off_workers(move |rt| rt.block_on(orch.reject(&run_id, &sandbox_id, &reason)))
            .await?
            .map_err(|e| orchestrator_error(&e))?;
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({ "runId": run_id, "sandboxId": sandbox_id, "state": "rejected", "reason": reason }),
    ))
}
