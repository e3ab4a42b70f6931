//! The handlers. Each parses its input fully before acting (a malformed request changes
//! nothing), and answers errors as [`ApiError`]s.

use std::collections::VecDeque;
use std::io;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use smithers_errors::ErrorCode;
use smithers_runtime::{CancellationToken, RequestBundle, SandboxConfig, StepCommand, Termination};
use smithers_wire::archive::{self, ArchiveError, ChannelWriter, PackOptions, UnpackLimits};
use smithers_wire::wire::{
    CreateSandbox, ExecuteAccepted, IfExists, SandboxState, Shipped, WireEvent, WorkspaceUploaded,
    IDEMPOTENCY_KEY_HEADER, IDEMPOTENCY_KEY_MAX_LENGTH,
};

use crate::config::{Limits, OPENAPI_YAML};
use crate::error::ApiError;
use crate::json::{json_response, read_json};
use crate::state::{lock, now_ms, AppState, Entry, EventLog, Inner, LogSink, Owner};

type St = State<Arc<AppState>>;

/// The caller's sandbox `id` (see [`AppState::owned`]).
fn entry(state: &AppState, id: &str, owner: &Owner) -> Result<Arc<Entry>, ApiError> {
    state.owned(id, owner)
}

pub(crate) fn random_hex(bytes: usize) -> Result<String, ApiError> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| ApiError::internal(format!("no randomness: {e}")))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

// ---------------------------------------------------------------------------------------------
// Middleware

/// Bearer-token check on `/v1/*` (constant-time, on SHA-256 digests so the length of the
/// token does not leak either); the token's name becomes the request's [`Owner`].
pub(crate) async fn auth(State(state): St, mut req: Request, next: Next) -> Response {
    let owner = if state.tokens.is_empty() {
        // Without a token the server listens on loopback only; a name that resolves there
        // (DNS rebinding: a web page's own name pointed at 127.0.0.1) must not reach it.
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok());
        if !host.is_some_and(is_loopback_host) {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                ErrorCode::InvalidInput,
                "a server without a token answers only requests addressed to a loopback name (localhost, 127.0.0.1, [::1])",
            )
            .into_response();
        }
        String::new()
    } else {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            // The scheme is case-insensitive (RFC 9110 §11.1).
            .and_then(|v| {
                v.get(..7)
                    .filter(|scheme| scheme.eq_ignore_ascii_case("bearer "))
                    .map(|_| &v[7..])
            });
        let Some(given) = given else {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                ErrorCode::InvalidInput,
                "missing bearer token",
            )
            .details(json!({ "auth": "missing" }))
            .into_response();
        };
        match state.tokens.authenticate(given) {
            Some(name) => name.to_string(),
            None => {
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    ErrorCode::InvalidInput,
                    "wrong bearer token",
                )
                .details(json!({ "auth": "invalid" }))
                .into_response()
            }
        }
    };
    req.extensions_mut().insert(Owner(owner));
    next.run(req).await
}

/// Whether a `Host` header names this machine's loopback: `localhost`, an address of
/// 127.0.0.0/8 or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Per-request deadline on producing a response (uploads get their own, longer one; streamed
/// bodies — events, bundle — are not cut once their headers are out), and response counting.
pub(crate) async fn deadline(State(state): St, req: Request, next: Next) -> Response {
    let upload =
        req.method() == axum::http::Method::PUT && req.uri().path().ends_with("/workspace");
    // An MCP tool call answers once its command ended: within the longest timeout a
    // command may have here, and the usual deadline past it.
    let mcp = req.uri().path() == "/v1/mcp";
    let limit = if upload {
        state.config.limits.upload_timeout
    } else if mcp {
        state.config.limits.request_timeout + state.config.limits.ceilings.max_timeout
    } else {
        state.config.limits.request_timeout
    };
    let resp = match tokio::time::timeout(limit, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            ErrorCode::ProcessTimeout,
            format!(
                "the request did not complete within {} ms",
                limit.as_millis()
            ),
        )
        .details(json!({ "timeoutMs": limit.as_millis() as u64 }))
        .into_response(),
    };
    state.metrics.http_response(resp.status().as_u16());
    resp
}

// ---------------------------------------------------------------------------------------------
// Unauthenticated

pub(crate) async fn health(State(state): St) -> Response {
    if state.draining.load(Ordering::Relaxed) {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({ "status": "draining" }),
        );
    }
    json_response(
        StatusCode::OK,
        &json!({ "status": "ok", "runtime": state.runtime.kind() }),
    )
}

pub(crate) async fn metrics(State(state): St) -> Response {
    let mut resp = state.metrics.render().into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    resp
}

pub(crate) async fn openapi() -> Response {
    let mut resp = OPENAPI_YAML.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/yaml"),
    );
    resp
}

// ---------------------------------------------------------------------------------------------
// Sandboxes

pub(crate) async fn probe(State(state): St) -> Response {
    json_response(StatusCode::OK, &state.runtime.probe().await)
}

pub(crate) async fn list(State(state): St, Extension(owner): Extension<Owner>) -> Response {
    let kind = state.runtime.kind();
    let mut all: Vec<_> = lock(&state.sandboxes)
        .values()
        .filter(|e| e.owner == owner.0)
        .map(|e| e.info(kind))
        .collect();
    all.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
    json_response(StatusCode::OK, &all)
}

pub(crate) async fn get_one(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let e = entry(&state, &id, &owner)?;
    Ok(json_response(StatusCode::OK, &e.info(state.runtime.kind())))
}

/// Whether the create body's `controls` names `key` (serde fills in some defaults; a default
/// is not something the client asked for).
fn asks(body: &Value, key: &str) -> bool {
    body.get("controls")
        .and_then(Value::as_object)
        .is_some_and(|c| c.contains_key(key))
}

/// Refuses a sandbox beyond the operator's caps: in all, and per token. Called under the
/// sandboxes lock where it decides (the cheap early check is advisory).
fn check_caps(
    all: &std::collections::HashMap<String, Arc<Entry>>,
    limits: &Limits,
    owner: &Owner,
) -> Result<(), ApiError> {
    let refuse = |message: String, limit: &str, max: usize| {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::InvalidInput,
            message,
        )
        .details(
            json!({ "limit": limit, "max": max, "fix": "delete sandboxes you no longer need" }),
        )
    };
    if all.len() >= limits.max_sandboxes {
        return Err(refuse(
            format!(
                "this host holds its maximum of {} sandboxes (set by the operator with `serve --max-sandboxes`)",
                limits.max_sandboxes
            ),
            "sandboxes",
            limits.max_sandboxes,
        ));
    }
    let mine = all.values().filter(|e| e.owner == owner.0).count();
    if mine >= limits.max_sandboxes_per_token {
        return Err(refuse(
            format!(
                "this token holds its maximum of {} sandboxes (set by the operator with `serve --max-sandboxes-per-token`)",
                limits.max_sandboxes_per_token
            ),
            "sandboxesPerToken",
            limits.max_sandboxes_per_token,
        ));
    }
    Ok(())
}

/// The sandbox this token already holds under `runId:sandboxId`. Names are per token: another
/// token's sandbox of the same name neither conflicts nor is revealed.
fn existing(
    all: &std::collections::HashMap<String, Arc<Entry>>,
    owner: &Owner,
    run_id: &str,
    sandbox_id: &str,
) -> Option<Arc<Entry>> {
    all.values()
        .find(|e| e.owner == owner.0 && e.run_id == run_id && e.sandbox_id == sandbox_id)
        .cloned()
}

fn duplicate(
    all: &std::collections::HashMap<String, Arc<Entry>>,
    owner: &Owner,
    run_id: &str,
    sandbox_id: &str,
) -> Option<ApiError> {
    existing(all, owner, run_id, sandbox_id).map(|e| {
        ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::InvalidInput,
            format!(
                "sandbox {run_id}:{sandbox_id} already exists on this host (as {}, {})",
                e.id,
                e.state().as_str()
            ),
        )
        .details(json!({
            "runId": run_id,
            "sandboxId": sandbox_id,
            "id": e.id,
            "state": e.state(),
            "fix": "delete it, or create with \"ifExists\": \"replace\"",
        }))
    })
}

/// Paths on this host are not a client's to mount.
fn refuse_volumes(controls: &smithers_runtime::Controls) -> Result<(), ApiError> {
    if controls.volumes.is_empty() {
        return Ok(());
    }
    Err(ApiError::runtime(
        &smithers_runtime::RuntimeError::ControlUnsupported {
            runtime: "codeplane",
            control: "volumes",
            reason: "a remote client cannot mount paths of the sandbox host".into(),
        },
    ))
}

pub(crate) async fn create(
    State(state): St,
    Extension(owner): Extension<Owner>,
    body: Body,
) -> Result<Response, ApiError> {
    let raw: Value = read_json(body, state.config.limits.max_json_bytes).await?;
    let asked_output = asks(&raw, "maxOutputBytes");
    let asked_lines = asks(&raw, "maxOutputLines");
    let req: CreateSandbox = serde_json::from_value(raw)
        .map_err(|e| ApiError::malformed(format!("malformed JSON body: {e}")))?;
    let entry = create_entry(&state, &owner, req, (asked_output, asked_lines)).await?;
    Ok(json_response(
        StatusCode::CREATED,
        &entry.info(state.runtime.kind()),
    ))
}

/// Makes a sandbox of `owner` as `req` asks, within the operator's ceilings (for the route and
/// the MCP endpoint). `asked` says whether the client asked for an output cap in bytes and
/// in lines (an unasked one gets the ceiling).
pub(crate) async fn create_entry(
    state: &AppState,
    owner: &Owner,
    mut req: CreateSandbox,
    asked: (bool, bool),
) -> Result<Arc<Entry>, ApiError> {
    let (asked_output, asked_lines) = asked;
    if state.draining.load(Ordering::Relaxed) {
        return Err(ApiError::draining());
    }
    refuse_volumes(&req.controls)?;
    state
        .config
        .limits
        .ceilings
        .apply(&mut req.controls, asked_output)?;
    state
        .config
        .limits
        .ceilings
        .apply_output_lines(&mut req.controls, asked_lines)?;
    // Each secret's value, sent by the client, held in a sealed memory file of this process
    // (never on disk) that its binding names; closed with the entry.
    let secret_files =
        crate::secrets::take(&mut req.controls, std::mem::take(&mut req.secret_values))?;
    let id = format!("sbx-{}", random_hex(16)?);
    let dir = state.config.data_dir.join("sandboxes").join(&id);
    let workspace = dir.join("workspace");
    let config = SandboxConfig {
        run_id: req.run_id.clone(),
        sandbox_id: req.sandbox_id.clone(),
        runtime: state.runtime.kind(),
        root_dir: workspace.clone(),
        image: req.image,
        controls: req.controls,
        workspace_layers: Vec::new(),
    };
    config.validate().map_err(|e| ApiError::runtime(&e))?;
    // A home kept on this host would be every client's: not a client's to ask for.
    config
        .refuse_home("codeplane")
        .map_err(|e| ApiError::runtime(&e))?;
    if req.if_exists == IfExists::Replace {
        // A resumed run whose earlier client died before cleanup: its sandbox (running or
        // not) is cancelled and removed, as a DELETE would, before the new one is made.
        let old = existing(&lock(&state.sandboxes), owner, &req.run_id, &req.sandbox_id);
        if let Some(old) = old {
            remove(state, &old).await?;
            eprintln!(
                "smithers-server: sandbox {} ({}:{}) of token {:?} replaced by a new create",
                old.id, old.run_id, old.sandbox_id, old.owner
            );
        }
    }
    tokio::fs::create_dir_all(&workspace)
        .await
        .map_err(|e| ApiError::internal(format!("create {}: {e}", workspace.display())))?;
    let project = Arc::new(crate::state::Project { dir: dir.clone() });
    let new = NewSandbox {
        id,
        dir,
        project,
        config,
        secret_files,
    };
    register(state, owner, new).await
}

/// A sandbox about to be made: its id, its directory, the workspace it runs over and its
/// config, admitted by the operator's ceilings.
pub(crate) struct NewSandbox {
    pub id: String,
    /// `<data>/sandboxes/<id>`, made by the caller.
    pub dir: PathBuf,
    pub project: Arc<crate::state::Project>,
    pub config: SandboxConfig,
    pub secret_files: crate::secrets::SecretFiles,
}

/// Makes `new` in the runtime and holds it for `owner`, within the caps of sandboxes held
/// (decided before and again under the lock it is inserted with). On a refusal nothing is
/// left: neither the runtime's sandbox nor the directory.
pub(crate) async fn register(
    state: &AppState,
    owner: &Owner,
    new: NewSandbox,
) -> Result<Arc<Entry>, ApiError> {
    let NewSandbox {
        id,
        dir,
        project,
        config,
        secret_files,
    } = new;
    let admitted = {
        let all = lock(&state.sandboxes);
        duplicate(&all, owner, &config.run_id, &config.sandbox_id)
            .map(Err)
            .unwrap_or_else(|| check_caps(&all, &state.config.limits, owner))
    };
    let made = match admitted {
        Ok(()) => state
            .runtime
            .create(&config)
            .await
            .map_err(|e| ApiError::runtime(&e)),
        Err(e) => Err(e),
    };
    let handle = match made {
        Ok(h) => h,
        Err(e) => {
            remove_own_dir(&dir, &project).await;
            return Err(e);
        }
    };
    // Written before anyone can use the sandbox: a server that dies (SIGKILL, power) leaves
    // it behind, and the next one cleans up what the handle names (`crate::recovery`).
    if let Err(e) = crate::recovery::record_handle(&dir, &handle).await {
        let _ = state.runtime.cleanup(&handle).await;
        remove_own_dir(&dir, &project).await;
        return Err(ApiError::internal(format!(
            "record the sandbox's handle in {}: {e}",
            dir.display()
        )));
    }
    let entry = Arc::new(Entry {
        id: id.clone(),
        run_id: config.run_id.clone(),
        sandbox_id: config.sandbox_id.clone(),
        created_at_ms: now_ms(),
        owner: owner.0.clone(),
        last_active_ms: AtomicU64::new(now_ms()),
        dir,
        workspace: config.root_dir.clone(),
        project,
        config,
        handle,
        op: tokio::sync::Mutex::new(()),
        swap: std::sync::Mutex::new(()),
        inner: std::sync::Mutex::new(Inner {
            state: SandboxState::Created,
            exec_key: None,
            cancel: CancellationToken::new(),
            request: None,
            result: None,
            bundle_path: None,
        }),
        events: EventLog::new(state.config.limits.output_window_bytes),
        followers: std::sync::atomic::AtomicUsize::new(0),
        unfollowed_since_ms: AtomicU64::new(now_ms()),
        checkpoints: Default::default(),
        secret_files,
    });
    entry.events.push(WireEvent::State {
        state: SandboxState::Created,
    });
    // Decided again under the lock we insert with: a concurrent create may have taken the
    // name or the last slot meanwhile; then ours is undone.
    let refused = {
        let mut all = lock(&state.sandboxes);
        let refused = duplicate(&all, owner, &entry.run_id, &entry.sandbox_id)
            .map(Err)
            .unwrap_or_else(|| check_caps(&all, &state.config.limits, owner))
            .err();
        if refused.is_none() {
            all.insert(id, entry.clone());
        }
        refused
    };
    if let Some(err) = refused {
        let _ = state.runtime.cleanup(&entry.handle).await;
        remove_own_dir(&entry.dir, &entry.project).await;
        return Err(err);
    }
    state.metrics.sandbox_created(state.runtime.kind().as_str());
    Ok(entry)
}

/// Removes a sandbox's directory, unless it holds a workspace a fork still runs over (then
/// the last of them removes it: [`crate::state::Project`]).
async fn remove_own_dir(dir: &std::path::Path, project: &Arc<crate::state::Project>) {
    if project.dir == dir && Arc::strong_count(project) > 1 {
        return;
    }
    let _ = tokio::fs::remove_dir_all(dir).await;
}

pub(crate) async fn upload_workspace(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let e = entry(&state, &id, &owner)?;
    let limits = &state.config.limits;
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > limits.max_upload_bytes {
            state.metrics.upload_rejected("uploadBytes");
            return Err(ApiError::too_large("uploadBytes", limits.max_upload_bytes));
        }
    }
    let _op = e.op.lock().await;
    let current = e.state();
    if current != SandboxState::Created {
        return Err(ApiError::conflict(
            format!(
                "the workspace can only be uploaded before the request is shipped (sandbox is {})",
                current.as_str()
            ),
            current.as_str(),
        ));
    }
    let started = Instant::now();
    let staging = e.dir.join(format!("staging-{}", random_hex(8)?));
    tokio::fs::create_dir(&staging)
        .await
        .map_err(|err| ApiError::internal(format!("create {}: {err}", staging.display())))?;

    // Bytes on the wire, counted and capped before the decoder sees them.
    let received = Arc::new(AtomicU64::new(0));
    let counter = received.clone();
    let max_upload = limits.max_upload_bytes;
    let stream = body.into_data_stream().map(move |chunk| {
        let chunk: Bytes = chunk.map_err(io::Error::other)?;
        let total = counter.fetch_add(chunk.len() as u64, Ordering::Relaxed) + chunk.len() as u64;
        if total > max_upload {
            Err(io::Error::other("upload limit exceeded"))
        } else {
            Ok(chunk)
        }
    });
    let mut reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(stream));
    let unpack_limits = UnpackLimits {
        max_total_bytes: limits.max_workspace_bytes,
        max_entries: limits.max_workspace_entries,
        max_path_bytes: limits.max_path_bytes,
        allow_symlinks: true,
        reserved_names: vec![".smithers".into()],
    };
    // If this handler is dropped (deadline, client gone), the blocking side stops between
    // chunks and cleans up its staging directory; it never swaps a half-wanted tree in.
    let cancel = CancellationToken::new();
    let _guard = cancel.clone().drop_guard();
    let entry_for_task = e.clone();
    let staging_for_task = staging.clone();
    let result = tokio::task::spawn_blocking(move || {
        let is_cancelled = || cancel.is_cancelled();
        let outcome = archive::unpack(
            &mut reader,
            &staging_for_task,
            &unpack_limits,
            &is_cancelled,
        )
        .and_then(|stats| {
            swap_into_place(&entry_for_task, &staging_for_task, &is_cancelled)?;
            Ok(stats)
        });
        if let Err(err) = &outcome {
            let _ = std::fs::remove_dir_all(&staging_for_task);
            // Read (and discard) the rest of a refused upload, still bounded by the upload
            // limit and the deadline, so the client gets our answer instead of a reset
            // connection it would take for a network failure.
            if err.is_client_fault() && !cancel.is_cancelled() {
                let _ = std::io::copy(&mut reader, &mut std::io::sink());
            }
        }
        outcome
    })
    .await
    .map_err(|err| ApiError::internal(format!("unpack task failed: {err}")))?;
    let received = received.load(Ordering::Relaxed);
    match result {
        Ok(stats) => {
            state
                .metrics
                .transport_duration_ms(started.elapsed().as_millis() as f64);
            Ok(json_response(
                StatusCode::OK,
                &WorkspaceUploaded {
                    entries: stats.entries,
                    bytes: stats.bytes,
                    received_bytes: received,
                },
            ))
        }
        Err(err) => {
            let api = if received > max_upload {
                ApiError::too_large("uploadBytes", max_upload)
            } else {
                ApiError::archive(&err)
            };
            state.metrics.upload_rejected(api.report.code.as_str());
            Err(api)
        }
    }
}

/// Replaces the (empty or previously uploaded) workspace with the staged tree. The runtime's
/// own state under `.smithers/` moves along, so the handle stays valid. Two renames: the
/// workspace is never a mix of old and new files.
fn swap_into_place(
    e: &Entry,
    staging: &FsPath,
    cancelled: &dyn Fn() -> bool,
) -> Result<(), ArchiveError> {
    let _swap = lock(&e.swap);
    if cancelled() {
        return Err(ArchiveError::Cancelled);
    }
    let io_err = |operation: &'static str, path: &FsPath| {
        let path = path.display().to_string();
        move |source| ArchiveError::Io {
            operation,
            path,
            source,
        }
    };
    let state_dir = e.workspace.join(".smithers");
    let staged_state = staging.join(".smithers");
    let had_state = std::fs::symlink_metadata(&state_dir).is_ok();
    if had_state {
        std::fs::rename(&state_dir, &staged_state)
            .map_err(io_err("move runtime state", &state_dir))?;
    }
    let trash = e.dir.join(format!(
        "trash-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    if let Err(err) = std::fs::rename(&e.workspace, &trash) {
        if had_state {
            let _ = std::fs::rename(&staged_state, &state_dir);
        }
        return Err(io_err("move old workspace", &e.workspace)(err));
    }
    if let Err(err) = std::fs::rename(staging, &e.workspace) {
        let _ = std::fs::rename(&trash, &e.workspace);
        if had_state {
            let _ = std::fs::rename(&staged_state, &state_dir);
        }
        return Err(io_err("move new workspace", &e.workspace)(err));
    }
    let _ = std::fs::remove_dir_all(&trash);
    Ok(())
}

pub(crate) async fn put_request(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let e = entry(&state, &id, &owner)?;
    let request: Value = read_json(body, state.config.limits.max_json_bytes).await?;
    let _op = e.op.lock().await;
    let (current, previous) = {
        let inner = lock(&e.inner);
        (inner.state, inner.request.clone())
    };
    match current {
        SandboxState::Created => {}
        // A retried identical PUT is answered again, not refused.
        _ if previous.as_ref() == Some(&request) => {
            let size = serde_json::to_vec(&request).map(|v| v.len()).unwrap_or(0) as u64;
            return Ok(json_response(
                StatusCode::OK,
                &Shipped {
                    bundle_size_bytes: size,
                },
            ));
        }
        other => {
            return Err(ApiError::conflict(
                format!(
                    "the request was already shipped (sandbox is {})",
                    other.as_str()
                ),
                other.as_str(),
            ))
        }
    }
    let report = ship_entry(&state, &e, request).await?;
    Ok(json_response(
        StatusCode::OK,
        &Shipped {
            bundle_size_bytes: report.bundle_size_bytes,
        },
    ))
}

/// Ships `request` into a created sandbox, which becomes shipped (the caller holds its
/// operation lock and checked its state).
pub(crate) async fn ship_entry(
    state: &AppState,
    e: &Entry,
    request: Value,
) -> Result<smithers_runtime::ShipReport, ApiError> {
    let report = state
        .runtime
        .ship(
            &e.handle,
            &RequestBundle {
                request: request.clone(),
            },
        )
        .await
        .map_err(|err| ApiError::runtime(&err))?;
    {
        let mut inner = lock(&e.inner);
        inner.state = SandboxState::Shipped;
        inner.request = Some(request);
    }
    e.events.push(WireEvent::State {
        state: SandboxState::Shipped,
    });
    Ok(report)
}

pub(crate) async fn execute(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let e = entry(&state, &id, &owner)?;
    let command: StepCommand = read_json(body, state.config.limits.max_json_bytes).await?;
    let key = match headers.get(IDEMPOTENCY_KEY_HEADER) {
        None => None,
        Some(v) => {
            let k = v
                .to_str()
                .ok()
                .filter(|k| {
                    !k.is_empty()
                        && k.len() <= IDEMPOTENCY_KEY_MAX_LENGTH
                        && k.bytes().all(|b| b.is_ascii_graphic())
                })
                .ok_or_else(|| {
                    ApiError::malformed(format!(
                        "Idempotency-Key must be 1-{IDEMPOTENCY_KEY_MAX_LENGTH} visible ASCII characters"
                    ))
                })?;
            Some(k.to_string())
        }
    };
    if command.argv.is_empty() || command.argv[0].is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::InvalidInput,
            "argv must name a program",
        ));
    }
    let cancel = {
        let mut inner = lock(&e.inner);
        // A retry of the request that started the step: report it, never start it again.
        if key.is_some() && inner.exec_key == key {
            return Ok(json_response(
                StatusCode::OK,
                &ExecuteAccepted {
                    id: e.id.clone(),
                    state: inner.state,
                    idempotency_key: key,
                    started: false,
                },
            ));
        }
        if inner.state != SandboxState::Shipped {
            return Err(ApiError::conflict(
                format!(
                    "execute needs a shipped sandbox that has not run (sandbox is {})",
                    inner.state.as_str()
                ),
                inner.state.as_str(),
            ));
        }
        if state.draining.load(Ordering::Relaxed) {
            return Err(ApiError::draining());
        }
        inner.state = SandboxState::Running;
        inner.exec_key = key.clone();
        inner.cancel.clone()
    };
    e.unfollowed_since_ms.store(now_ms(), Ordering::SeqCst);
    e.events.push(WireEvent::State {
        state: SandboxState::Running,
    });
    let task_state = state.clone();
    let task_entry = e.clone();
    state
        .tasks
        .spawn(run_step(task_state, task_entry, command, cancel));
    Ok(json_response(
        StatusCode::ACCEPTED,
        &ExecuteAccepted {
            id: e.id.clone(),
            state: SandboxState::Running,
            idempotency_key: key,
            started: true,
        },
    ))
}

/// Runs the step, then collects its bundle; records the terminal event either way.
async fn run_step(
    state: Arc<AppState>,
    e: Arc<Entry>,
    command: StepCommand,
    cancel: CancellationToken,
) {
    let started = Instant::now();
    let sink = Arc::new(LogSink::new(e.clone()));
    // Output gathered in the sink goes into the log at least this often.
    let ticker = {
        let sink = sink.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                sink.flush_if_due();
            }
        })
    };
    let watchdog = state
        .config
        .limits
        .orphan_timeout
        .map(|limit| tokio::spawn(orphan_watchdog(e.clone(), cancel.clone(), limit)));
    let executed = state
        .runtime
        .execute(&e.handle, &command, cancel, sink.as_ref())
        .await;
    ticker.abort();
    // Every byte of output is in the log before the terminal event.
    sink.flush();
    if let Some(w) = watchdog {
        w.abort();
    }
    state
        .metrics
        .duration_ms(started.elapsed().as_millis() as f64);
    let finished = match executed {
        Ok(outcome) => match state.runtime.collect(&e.handle).await {
            Ok(report) => {
                let size = crate::state::bundle_size(&report.bundle_path).await;
                Ok((outcome, report, size))
            }
            Err(err) => Err(err),
        },
        Err(err) => Err(err),
    };
    // The idle expiry of a finished sandbox counts from its end, not from its execute.
    e.touch();
    match finished {
        Ok((outcome, report, size)) => {
            let status = match outcome.termination {
                Termination::Cancelled => "cancelled",
                _ if outcome.succeeded() => "finished",
                _ => "failed",
            };
            state.record_completed(&e, outcome, &report, size, status);
        }
        Err(err) => state.record_failed(&e, &err),
    }
}

/// Cancels the step once nobody followed its events for `limit` (see `Limits::orphan_timeout`).
async fn orphan_watchdog(e: Arc<Entry>, cancel: CancellationToken, limit: Duration) {
    let tick = (limit / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        tokio::time::sleep(tick).await;
        if cancel.is_cancelled() || e.events.is_closed() {
            return;
        }
        let idle_ms = now_ms().saturating_sub(e.unfollowed_since_ms.load(Ordering::SeqCst));
        if e.followers.load(Ordering::SeqCst) == 0 && idle_ms >= limit.as_millis() as u64 {
            e.events.push(WireEvent::Stderr {
                line: format!(
                    "smithers-server: no client followed this step for {} ms; cancelling it",
                    limit.as_millis()
                ),
                timestamp_ms: now_ms(),
            });
            cancel.cancel();
            return;
        }
    }
}

pub(crate) async fn cancel(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let e = entry(&state, &id, &owner)?;
    let status = {
        let mut inner = lock(&e.inner);
        match inner.state {
            SandboxState::Running => {
                inner.cancel.cancel();
                StatusCode::ACCEPTED
            }
            SandboxState::Created | SandboxState::Shipped => {
                inner.state = SandboxState::Cancelled;
                drop(inner);
                state
                    .metrics
                    .sandbox_completed(state.runtime.kind().as_str(), "cancelled");
                e.events.push(WireEvent::Cancelled);
                StatusCode::OK
            }
            // Already over: cancelling is a no-op.
            _ => StatusCode::OK,
        }
    };
    Ok(json_response(status, &e.info(state.runtime.kind())))
}

#[derive(Debug, Deserialize)]
pub(crate) struct EventsQuery {
    since: Option<String>,
}

pub(crate) async fn events(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
    Query(query): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let e = entry(&state, &id, &owner)?;
    let parse = |what: &str, v: &str| {
        v.trim().parse::<u64>().map_err(|_| {
            ApiError::malformed(format!("{what} must be a non-negative integer, got {v:?}"))
        })
    };
    let from = match (&query.since, headers.get("last-event-id")) {
        (Some(since), _) => parse("since", since)?,
        (None, Some(last)) => {
            let last = last
                .to_str()
                .map_err(|_| ApiError::malformed("Last-Event-ID must be ASCII"))?;
            parse("Last-Event-ID", last)?.saturating_add(1)
        }
        (None, None) => 0,
    };
    let keepalive = state.config.limits.sse_keepalive;
    struct Follow {
        entry: Arc<Entry>,
        follower: Follower,
        rx: tokio::sync::watch::Receiver<u64>,
        cursor: u64,
        queue: VecDeque<(Bytes, Option<u64>)>,
        finished: bool,
        end: CancellationToken,
        keepalive: Duration,
    }
    let follow = Follow {
        follower: Follower::new(e.clone(), from),
        rx: e.events.subscribe(),
        entry: e,
        cursor: from,
        queue: VecDeque::new(),
        finished: false,
        end: state.streams_end.clone(),
        keepalive,
    };
    let stream = futures_util::stream::unfold(follow, |mut f| async move {
        loop {
            if let Some((frame, sent)) = f.queue.pop_front() {
                // Taken by the connection one frame at a time, as it drains: the step's
                // output waits for the slowest follower (`EventLog::room`).
                if let Some(cursor) = sent {
                    f.follower.sent(cursor);
                }
                return Some((Ok::<Bytes, io::Error>(frame), f));
            }
            if f.finished {
                return None;
            }
            f.rx.borrow_and_update();
            let (events, closed) = f.entry.events.read_from(f.cursor);
            if !events.is_empty() {
                for ev in events {
                    f.cursor = ev.seq + 1;
                    let data = serde_json::to_string(&ev.event).unwrap_or_default();
                    f.queue.push_back((
                        Bytes::from(format!(
                            "id: {}\nevent: {}\ndata: {}\n\n",
                            ev.seq,
                            ev.event.name(),
                            data
                        )),
                        Some(ev.seq + 1),
                    ));
                }
                continue;
            }
            if closed {
                f.finished = true;
                continue;
            }
            tokio::select! {
                changed = f.rx.changed() => {
                    if changed.is_err() {
                        f.finished = true;
                    }
                }
                _ = tokio::time::sleep(f.keepalive) => {
                    f.queue.push_back((Bytes::from_static(b": keepalive\n\n"), None));
                }
                _ = f.end.cancelled() => {
                    f.finished = true;
                }
            }
        }
    });
    let mut resp = Body::from_stream(stream).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(resp)
}

/// Counts an open event stream for the orphan watchdog, and tells the event log how far it
/// was sent (the step's output waits for the slowest one), for as long as the stream lives.
struct Follower(Arc<Entry>, u64);

impl Follower {
    fn new(entry: Arc<Entry>, cursor: u64) -> Self {
        entry.followers.fetch_add(1, Ordering::SeqCst);
        let id = entry.events.follow(cursor);
        Follower(entry, id)
    }

    /// Everything before `cursor` was handed to the connection.
    fn sent(&self, cursor: u64) {
        self.0.events.advance(self.1, cursor);
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.0.events.unfollow(self.1);
        self.0.unfollowed_since_ms.store(now_ms(), Ordering::SeqCst);
        self.0.followers.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(crate) async fn bundle(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let e = entry(&state, &id, &owner)?;
    let (current, path) = {
        let inner = lock(&e.inner);
        (inner.state, inner.bundle_path.clone())
    };
    let path: PathBuf = match (current, path) {
        (SandboxState::Completed, Some(p)) => p,
        (other, _) => {
            return Err(ApiError::conflict(
                format!("no bundle: the sandbox is {}", other.as_str()),
                other.as_str(),
            ))
        }
    };
    confined_bundle_path(&e, &path)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, io::Error>>(8);
    let fail_tx = tx.clone();
    tokio::task::spawn_blocking(move || {
        // Read through no link, within the bundle format's size (see `archive::pack`).
        let options = PackOptions {
            refuse_symlinks: true,
            max_total_bytes: Some(UnpackLimits::bundle().max_total_bytes),
            ..PackOptions::default()
        };
        match archive::pack(&path, ChannelWriter::new(tx), &options) {
            Ok((mut writer, _)) => {
                let _ = io::Write::flush(&mut writer);
            }
            // An error mid-stream must reach the client as a failed body, not a clean end.
            Err(err) => {
                let _ = fail_tx.blocking_send(Err(io::Error::other(err.to_string())));
            }
        }
    });
    let body_stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let mut resp = Body::from_stream(body_stream).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-tar"),
    );
    Ok(resp)
}

/// The bundle the server streams is the one at the handle's own result path, reached from
/// the sandbox's workspace through real directories only: the workspace holds a client's
/// upload, and a link on the way would make the server pack some other host directory.
fn confined_bundle_path(e: &Entry, path: &std::path::Path) -> Result<(), ApiError> {
    let refuse = |why: String| ApiError::internal(format!("bundle not served: {why}"));
    if path != e.handle.result_path {
        return Err(refuse(format!(
            "{} is not the sandbox's result path {}",
            path.display(),
            e.handle.result_path.display()
        )));
    }
    let root = e
        .handle
        .project_root()
        .map_err(|err| refuse(err.to_string()))?;
    if root != e.workspace {
        return Err(refuse(format!(
            "the handle's project {} is not the sandbox's workspace",
            root.display()
        )));
    }
    e.handle
        .check_project_dirs_real(&root)
        .map_err(|err| refuse(err.to_string()))?;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(refuse(format!("{} is not a directory", path.display()))),
        Err(err) => Err(refuse(format!("{}: {err}", path.display()))),
    }
}

pub(crate) async fn delete(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    // Idempotent: already gone, never here or another token's (which must look the same)
    // is success, and another token's sandbox is left alone.
    if let Some(e) = state.get(&id, &owner) {
        remove(&state, &e).await?;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Cancels what still runs of the sandbox, waits for it, cleans it up in the runtime and
/// removes its directory and its entry.
pub(crate) async fn remove(state: &AppState, e: &Arc<Entry>) -> Result<(), ApiError> {
    let _op = e.op.lock().await;
    let mut live = false;
    let running = {
        let mut inner = lock(&e.inner);
        match inner.state {
            SandboxState::Running => {
                inner.cancel.cancel();
                true
            }
            SandboxState::Live => {
                inner.state = SandboxState::Cancelled;
                live = true;
                false
            }
            SandboxState::Created | SandboxState::Shipped => {
                inner.state = SandboxState::Cancelled;
                drop(inner);
                state
                    .metrics
                    .sandbox_completed(state.runtime.kind().as_str(), "cancelled");
                e.events.push(WireEvent::Cancelled);
                false
            }
            _ => false,
        }
    };
    if live {
        // Every process of the session ends before its files go.
        if let Some(engine) = &state.engine {
            engine
                .stop(&e.handle)
                .await
                .map_err(|err| ApiError::runtime(&err))?;
        }
        state
            .metrics
            .sandbox_completed(state.runtime.kind().as_str(), "cancelled");
        e.events.push(WireEvent::Cancelled);
    }
    if running {
        // The runtime guarantees every process is gone when execute returns; wait for that
        // (and for collect) before removing what they used.
        let mut rx = e.events.subscribe();
        while !e.events.is_closed() {
            if rx.changed().await.is_err() {
                break;
            }
        }
    }
    state
        .runtime
        .cleanup(&e.handle)
        .await
        .map_err(|err| ApiError::runtime(&err))?;
    let dir = e.dir.clone();
    if e.project.dir == dir && Arc::strong_count(&e.project) > 1 {
        // A fork still runs over this workspace: the directory goes with the last of them.
        lock(&state.sandboxes).remove(&e.id);
        return Ok(());
    }
    tokio::fs::remove_dir_all(&dir)
        .await
        .or_else(|err| {
            if err.kind() == io::ErrorKind::NotFound {
                Ok(())
            } else {
                Err(err)
            }
        })
        .map_err(|err| ApiError::internal(format!("remove {}: {err}", dir.display())))?;
    lock(&state.sandboxes).remove(&e.id);
    Ok(())
}

/// At shutdown, once no request is in flight: every sandbox still held is removed (its
/// processes were stopped by the drain; nobody could reach it once this server is gone, and
/// its runtime state would otherwise outlive it). A failure is logged; the next server on this
/// data directory cleans up what is left (`crate::recovery`).
pub(crate) async fn remove_all(state: &AppState) {
    let entries: Vec<Arc<Entry>> = lock(&state.sandboxes).values().cloned().collect();
    for e in entries {
        if let Err(err) = remove(state, &e).await {
            eprintln!(
                "smithers-server: removing sandbox {} at shutdown: {}",
                e.id, err.report.message
            );
        }
    }
}

/// Removes the sandboxes idle for `expiry` (see `Limits::idle_expiry`): not running, no
/// request for that long. Running steps are bounded by their timeout and the orphan watchdog
/// instead. A removal that fails is retried on the next round.
pub(crate) async fn expire_idle(state: Arc<AppState>, expiry: Duration) {
    let tick = (expiry / 4).clamp(Duration::from_millis(10), Duration::from_secs(5));
    loop {
        tokio::time::sleep(tick).await;
        let expiry_ms = expiry.as_millis() as u64;
        let idle: Vec<Arc<Entry>> = lock(&state.sandboxes)
            .values()
            .filter(|e| {
                e.state() != SandboxState::Running
                    && now_ms().saturating_sub(e.last_active_ms.load(Ordering::SeqCst)) >= expiry_ms
            })
            .cloned()
            .collect();
        for e in idle {
            // Touched (or started) while we were collecting: not idle any more.
            let idle_ms = now_ms().saturating_sub(e.last_active_ms.load(Ordering::SeqCst));
            if e.state() == SandboxState::Running || idle_ms < expiry_ms {
                continue;
            }
            // An idle session is stopped and collected first: its bundle then waits for its
            // client as a finished step's does, and expires as one.
            if e.state() == SandboxState::Live {
                if let Err(err) = crate::session::stop_and_collect(&state, &e).await {
                    eprintln!(
                        "smithers-server: stopping idle session {}: {}",
                        e.id, err.report.message
                    );
                }
                continue;
            }
            match remove(&state, &e).await {
                Ok(()) => eprintln!(
                    "smithers-server: sandbox {} ({}:{}) of token {:?} expired after {} ms idle; removed",
                    e.id,
                    e.run_id,
                    e.sandbox_id,
                    e.owner,
                    expiry.as_millis()
                ),
                Err(err) => eprintln!(
                    "smithers-server: expiring idle sandbox {}: {}",
                    e.id, err.report.message
                ),
            }
        }
    }
}

/// Any other path: a JSON 404, like every other error.
pub(crate) async fn fallback() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorCode::InvalidInput,
        "no such route",
    )
}

#[cfg(test)]
mod tests {
    use super::is_loopback_host;

    #[test]
    fn only_loopback_names_are_loopback_hosts() {
        for ok in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1",
            "127.0.0.1:9",
            "127.8.9.1:80",
            "[::1]",
            "[::1]:8080",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for no in [
            "evil.example:8080",
            "localhost.evil.example",
            "10.0.0.1:80",
            "[::2]:80",
            "0.0.0.0",
            "",
            "127.0.0.1.nip.io",
        ] {
            assert!(!is_loopback_host(no), "{no}");
        }
    }
}
