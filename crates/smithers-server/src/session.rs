//! Hosted sessions: a shipped sandbox started through the host's engine (`POST …/start`),
//! sent commands (`POST …/exec`, each answered by a framed stream of its output and its end:
//! `smithers_wire::session`), and ended (`POST …/stop`), which collects its bundle as a step's
//! end does (`GET …/bundle` then serves it). A session belongs to its token as any sandbox;
//! the operator's ceilings were applied at create (its limits) and bound each command's
//! timeout; one idle past the idle expiry is stopped and collected, then expires as a
//! completed sandbox does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use smithers_errors::{CodedError, ErrorCode};
use smithers_runtime::{
    CancellationToken, Engine, ExecRequest, OutputEvent, OutputSink, OutputStream, Room, StepStdin,
};
use smithers_wire::session::{self as wire_session, ExecBody, MAX_STDIN_BYTES};
use smithers_wire::wire::{SandboxState, WireEvent};
use tokio::sync::{mpsc, Notify};

use crate::error::ApiError;
use crate::json::{json_response, read_json};
use crate::state::{lock, AppState, Entry, Owner};

type St = State<Arc<AppState>>;

/// Output queued for a client beyond which the command waits (its pipe fills).
const WINDOW_BYTES: u64 = 4 << 20;
/// The largest exec body (a 16 MiB stdin in base64, and the rest).
const MAX_EXEC_BODY: usize = MAX_STDIN_BYTES / 3 * 4 + (1 << 20);

pub(crate) fn engine(state: &AppState) -> Result<Arc<dyn Engine>, ApiError> {
    state.engine.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            ErrorCode::TaskRuntimeUnavailable,
            "this host runs no engine: sessions are unavailable",
        )
    })
}

/// `POST /v1/sandboxes/{id}/start`: a shipped sandbox becomes a live session.
pub(crate) async fn start(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let e = state.owned(&id, &owner)?;
    start_entry(&state, &e).await?;
    Ok(json_response(StatusCode::OK, &e.info(state.runtime.kind())))
}

/// Starts a shipped sandbox as a live session (for the route and the MCP endpoint).
pub(crate) async fn start_entry(state: &AppState, e: &Arc<Entry>) -> Result<(), ApiError> {
    let engine = engine(state)?;
    let _op = e.op.lock().await;
    {
        let inner = lock(&e.inner);
        if inner.state != SandboxState::Shipped {
            return Err(ApiError::conflict(
                format!(
                    "start needs a shipped sandbox (sandbox is {})",
                    inner.state.as_str()
                ),
                inner.state.as_str(),
            ));
        }
        if state.draining.load(Ordering::Relaxed) {
            return Err(ApiError::draining());
        }
    }
    engine
        .start(&e.handle)
        .await
        .map_err(|err| ApiError::runtime(&err))?;
    lock(&e.inner).state = SandboxState::Live;
    e.events.push(WireEvent::State {
        state: SandboxState::Live,
    });
    Ok(())
}

/// `POST /v1/sandboxes/{id}/exec`: one command in the live session, answered by a framed
/// stream. A client that goes away (the stream dropped) cancels it: its group is killed.
pub(crate) async fn exec(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let engine = engine(&state)?;
    let e = state.owned(&id, &owner)?;
    let body: ExecBody = read_json(body, MAX_EXEC_BODY).await?;
    let request = exec_request(&state, body)?;
    live_or_conflict(&e, "exec")?;
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    let queued = Arc::new(AtomicU64::new(0));
    let drained = Arc::new(Notify::new());
    let sink = FrameSink {
        tx: tx.clone(),
        queued: queued.clone(),
        drained: drained.clone(),
    };
    let cancel = CancellationToken::new();
    let guard = cancel.clone().drop_guard();
    let handle = e.handle.clone();
    let entry = e.clone();
    state.tasks.spawn(async move {
        let last = match engine.exec(&handle, request, cancel, &sink).await {
            Ok(exit) => wire_session::frame(
                wire_session::EXIT,
                &serde_json::to_vec(&exit).unwrap_or_default(),
            ),
            Err(err) => wire_session::frame(
                wire_session::FAILED,
                &serde_json::to_vec(&err.report()).unwrap_or_default(),
            ),
        };
        entry.touch();
        let _ = tx.send(Bytes::from(last));
    });
    let stream = futures_util::stream::unfold((rx, guard, queued, drained), |mut s| async move {
        let chunk = s.0.recv().await?;
        s.2.fetch_sub(chunk.len() as u64, Ordering::SeqCst);
        s.3.notify_waiters();
        Some((Ok::<_, std::io::Error>(chunk), s))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/vnd.smithers.exec-stream")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// The engine's request from the client's body, checked; its timeout within the ceiling.
pub(crate) fn exec_request(state: &AppState, body: ExecBody) -> Result<ExecRequest, ApiError> {
    let invalid =
        |m: String| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::InvalidInput, m);
    if body.argv.first().is_none_or(String::is_empty) {
        return Err(invalid("argv must name a program".into()));
    }
    let stdin = match &body.stdin_base64 {
        None => StepStdin::default(),
        Some(b64) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| invalid(format!("stdinBase64 is not base64: {e}")))?;
            if bytes.len() > MAX_STDIN_BYTES {
                return Err(ApiError::too_large("stdin", MAX_STDIN_BYTES as u64));
            }
            StepStdin::from_reader(std::io::Cursor::new(bytes))
        }
    };
    let ceiling = state.config.limits.ceilings.max_timeout;
    let timeout = body
        .timeout_ms
        .map_or(ceiling, |ms| Duration::from_millis(ms).min(ceiling));
    Ok(ExecRequest {
        argv: body.argv,
        cwd: body.cwd,
        env: body.env,
        stdin,
        timeout: Some(timeout),
        // A client over HTTP gets no terminal (yet): its frames carry stdout and stderr.
        ..ExecRequest::default()
    })
}

/// Frames of a command's output for the client, with room for [`WINDOW_BYTES`] of them.
struct FrameSink {
    tx: mpsc::UnboundedSender<Bytes>,
    queued: Arc<AtomicU64>,
    drained: Arc<Notify>,
}

impl OutputSink for FrameSink {
    fn event(&self, event: OutputEvent) {
        let OutputEvent::Output { stream, bytes, .. } = event else {
            return;
        };
        let kind = match stream {
            OutputStream::Stdout => wire_session::STDOUT,
            OutputStream::Stderr => wire_session::STDERR,
        };
        for part in bytes.chunks(wire_session::MAX_FRAME) {
            let frame = wire_session::frame(kind, part);
            self.queued.fetch_add(frame.len() as u64, Ordering::SeqCst);
            let _ = self.tx.send(Bytes::from(frame));
        }
    }

    fn room(&self) -> Room<'_> {
        Box::pin(async move {
            loop {
                let notified = self.drained.notified();
                if self.queued.load(Ordering::SeqCst) <= WINDOW_BYTES || self.tx.is_closed() {
                    return;
                }
                notified.await;
            }
        })
    }
}

/// `POST /v1/sandboxes/{id}/stop`: the session ends; its bundle is collected.
pub(crate) async fn stop(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let e = state.owned(&id, &owner)?;
    stop_and_collect(&state, &e).await?;
    Ok(json_response(StatusCode::OK, &e.info(state.runtime.kind())))
}

/// Stops a live session and collects its bundle (completed), or says why not. A session
/// stopped already is left as it is.
pub(crate) async fn stop_and_collect(state: &AppState, e: &Arc<Entry>) -> Result<(), ApiError> {
    let _op = e.op.lock().await;
    if e.state() == SandboxState::Completed {
        return Ok(());
    }
    live_or_conflict(e, "stop")?;
    let engine = engine(state)?;
    engine
        .stop(&e.handle)
        .await
        .map_err(|err| ApiError::runtime(&err))?;
    match state.runtime.collect(&e.handle).await {
        Ok(report) => {
            let size = crate::state::bundle_size(&report.bundle_path).await;
            // The session's end closes its event log, as a step's end does.
            state.record_completed(e, session_outcome(e), &report, size, "finished");
            e.touch();
            Ok(())
        }
        Err(err) => {
            state.record_failed(e, &err);
            Err(ApiError::runtime(&err))
        }
    }
}

/// How a stopped session ended, for its event log: stopped by its client, so well (each
/// command's own end was that command's answer).
fn session_outcome(e: &Entry) -> smithers_runtime::ExecOutcome {
    let lived = crate::state::now_ms().saturating_sub(e.created_at_ms);
    smithers_runtime::ExecOutcome::of_life(
        smithers_runtime::Termination::Exited,
        Some(0),
        Duration::from_millis(lived),
    )
}

/// `POST /v1/sandboxes/{id}/checkpoint`: the live session's workspace frozen as it is now
/// (the engine's snapshot; refused with `BUSY` while a command works in it); answered with
/// its name.
pub(crate) async fn checkpoint(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let e = state.owned(&id, &owner)?;
    let body = checkpoint_entry(&state, &e).await?;
    Ok(json_response(StatusCode::OK, &body))
}

/// Makes a checkpoint of a live session (for the route and the MCP endpoint).
pub(crate) async fn checkpoint_entry(
    state: &AppState,
    e: &Arc<Entry>,
) -> Result<wire_session::CheckpointBody, ApiError> {
    let _op = e.op.lock().await;
    live_or_conflict(e, "checkpoint")?;
    let (name, snapshot) = make_checkpoint(state, e).await?;
    Ok(wire_session::CheckpointBody {
        checkpoint: name,
        held_us: Some(snapshot.held_us),
    })
}

/// The session's checkpoint `name`, or 404.
pub(crate) fn named_checkpoint(
    e: &Entry,
    name: &str,
) -> Result<smithers_runtime::Snapshot, ApiError> {
    e.checkpoints.named(name).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            "the session has no such checkpoint",
        )
    })
}

/// A new checkpoint of the live session `e` (the caller holds its operation lock and checked
/// it is live): its name and the engine's snapshot.
pub(crate) async fn make_checkpoint(
    state: &AppState,
    e: &Entry,
) -> Result<(String, smithers_runtime::Snapshot), ApiError> {
    let engine = engine(state)?;
    e.checkpoints
        .room()
        .map_err(|err| ApiError::runtime(&err))?;
    let snapshot = engine
        .snapshot(&e.handle)
        .await
        .map_err(|err| ApiError::runtime(&err))?;
    let name = e
        .checkpoints
        .add(snapshot.clone())
        .map_err(|err| ApiError::runtime(&err))?;
    e.touch();
    Ok((name, snapshot))
}

/// `POST /v1/sandboxes/{id}/restore`: the live session's workspace put back to one of its
/// checkpoints (by name; what was written since is dropped).
pub(crate) async fn restore(
    State(state): St,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let e = state.owned(&id, &owner)?;
    let body: wire_session::CheckpointBody = read_json(body, 4096).await?;
    restore_entry(&state, &e, &body.checkpoint).await?;
    Ok(json_response(StatusCode::OK, &body))
}

/// Puts a live session's workspace back to its checkpoint `name` (for the route and the MCP
/// endpoint).
pub(crate) async fn restore_entry(
    state: &AppState,
    e: &Arc<Entry>,
    name: &str,
) -> Result<(), ApiError> {
    let engine = engine(state)?;
    let _op = e.op.lock().await;
    live_or_conflict(e, "restore")?;
    let snapshot = named_checkpoint(e, name)?;
    engine
        .restore(&e.handle, &snapshot)
        .await
        .map_err(|err| ApiError::runtime(&err))?;
    e.touch();
    Ok(())
}

pub(crate) fn live_or_conflict(e: &Entry, verb: &str) -> Result<(), ApiError> {
    match e.state() {
        SandboxState::Live => Ok(()),
        other => Err(ApiError::conflict(
            format!(
                "{verb} needs a live session (sandbox is {})",
                other.as_str()
            ),
            other.as_str(),
        )),
    }
}
