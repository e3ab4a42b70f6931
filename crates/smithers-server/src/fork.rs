//! `POST /v1/sandboxes/{id}/fork`: a new live session of the same token whose workspace starts
//! from one of a live session's checkpoints (made now when none is named). It runs over the
//! same shipped workspace with the checkpoint's frozen layers under its own upper layer (the
//! engine's fork: nothing is copied), with its parent's controls and request; from then on
//! the two change apart. Processes are not carried over. The parent is held still only for
//! the checkpoint (none when it names an existing one).
//!
//! The shipped workspace is then shared: it goes with the last sandbox over it
//! ([`crate::state::Project`]). A session holding secrets is not forked: their values stay
//! with the sandbox the client gave them to.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use smithers_errors::ErrorCode;
use smithers_runtime::Snapshot;
use smithers_wire::session::{ForkBody, Forked};

use crate::error::ApiError;
use crate::json::{json_response, read_json};
use crate::routes::{random_hex, register, remove, ship_entry, NewSandbox};
use crate::session::{engine, live_or_conflict, make_checkpoint, named_checkpoint, start_entry};
use crate::state::{AppState, Entry, Owner};

/// `POST /v1/sandboxes/{id}/fork`.
pub(crate) async fn fork(
    State(state): State<Arc<AppState>>,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let parent = state.owned(&id, &owner)?;
    let body: ForkBody = read_json(body, 4096).await?;
    let (child, checkpoint) =
        fork_entry(&state, &owner, &parent, body.checkpoint.as_deref()).await?;
    let answer = Forked {
        sandbox: child.info(state.runtime.kind()),
        checkpoint,
    };
    Ok(json_response(StatusCode::CREATED, &answer))
}

/// Forks the live session `parent` from its checkpoint `name` (one made now when `None`):
/// the new live session, and the checkpoint's name.
pub(crate) async fn fork_entry(
    state: &AppState,
    owner: &Owner,
    parent: &Arc<Entry>,
    name: Option<&str>,
) -> Result<(Arc<Entry>, String), ApiError> {
    let engine = engine(state)?;
    if !engine.capabilities().fork {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            ErrorCode::TaskRuntimeUnavailable,
            format!(
                "the {} engine cannot start a session from a checkpoint",
                engine.backend()
            ),
        ));
    }
    if !parent.config.controls.secrets.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::InvalidInput,
            "a session holding secrets is not forked on a host: their values stay with the sandbox they were given to",
        ));
    }
    if state.draining.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(ApiError::draining());
    }
    // The parent's operations wait until the fork is registered: its removal (a DELETE, the
    // idle expiry) would otherwise take the shared workspace and collect the checkpoint's
    // layers before the fork's own record names them.
    let parent_op = parent.op.lock().await;
    let (name, snapshot, request) = checkpoint_of(state, parent, name).await?;
    let id = format!("sbx-{}", random_hex(16)?);
    let dir = state.config.data_dir.join("sandboxes").join(&id);
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| ApiError::internal(format!("create {}: {e}", dir.display())))?;
    let mut config = parent.config.clone();
    config.sandbox_id = format!("fork-{}", random_hex(8)?);
    config.workspace_layers = snapshot.layers;
    let new = NewSandbox {
        id,
        dir,
        project: parent.project.clone(),
        config,
        secret_files: Default::default(),
    };
    let child = register(state, owner, new).await?;
    drop(parent_op);
    let started = async {
        {
            let _op = child.op.lock().await;
            ship_entry(state, &child, request).await?;
        }
        start_entry(state, &child).await
    };
    if let Err(err) = started.await {
        let _ = remove(state, &child).await;
        return Err(err);
    }
    Ok((child, name))
}

/// The parent's checkpoint `name` (made now when `None`), and the request it was shipped
/// with. The caller holds the parent's operation lock: a fork never sees a half-made
/// checkpoint.
async fn checkpoint_of(
    state: &AppState,
    parent: &Arc<Entry>,
    name: Option<&str>,
) -> Result<(String, Snapshot, serde_json::Value), ApiError> {
    live_or_conflict(parent, "fork")?;
    let request = crate::state::lock(&parent.inner)
        .request
        .clone()
        .unwrap_or_default();
    let made = match name {
        Some(name) => (name.to_string(), named_checkpoint(parent, name)?),
        None => make_checkpoint(state, parent).await?,
    };
    parent.touch();
    Ok((made.0, made.1, request))
}
