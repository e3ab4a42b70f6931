//! The endpoint's tools over this host's sessions: each checks its arguments (the shared
//! `smithers_mcp::args`) before anything is done, reaches only its token's sandboxes, and
//! does what the matching HTTP route does (the same functions: start, exec through the
//! engine, checkpoint, restore, stop and collect), so MCP and HTTP are one truth. Files are
//! read, written and listed by commands inside the sandbox (`smithers_mcp::scripts`), as the
//! stdio server and `session read`/`write` do: a path means what it means to the session.

use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use serde_json::{json, Value};
use smithers_errors::ErrorCode;
use smithers_mcp::args::{
    argv_arg, bad, env_arg, failed, limit_arg, required, result, stdin_arg, str_arg, u64_arg,
    CallResult, MAX_OUTPUT,
};
use smithers_mcp::bytes::{take_bytes, Captured};
use smithers_mcp::results::{exec_result, listing_result, read_result};
use smithers_mcp::scripts;
use smithers_runtime::{
    CancellationToken, ExecExit, ExecRequest, OutputEvent, OutputSink, OutputStream, StepStdin,
    Termination,
};
use smithers_wire::session::ExecBody;
use smithers_wire::wire::{CreateSandbox, SandboxState};

use crate::error::ApiError;
use crate::session;
use crate::state::{lock, AppState, Entry, Owner};

/// How a tool fails: a malformed call (a JSON-RPC error) or a refusal of the host (the
/// tool's result, with the code and message the HTTP route would have answered).
enum Failure {
    Call((i64, String)),
    Host(ApiError),
}

impl From<(i64, String)> for Failure {
    fn from(e: (i64, String)) -> Self {
        Failure::Call(e)
    }
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        Failure::Host(e)
    }
}

type Outcome = Result<Value, Failure>;

/// Listing a directory is bounded in time as well as in bytes.
const LIST_TIMEOUT_MS: u64 = 30_000;

pub(super) async fn call(
    state: &Arc<AppState>,
    owner: &Owner,
    name: &str,
    args: &Value,
) -> CallResult {
    let outcome = match name {
        "session_start" => start(state, owner, args).await,
        "session_list" => Ok(list(state, owner)),
        "session_exec" => exec(state, owner, args).await,
        "session_read" => read(state, owner, args).await,
        "session_write" => write(state, owner, args).await,
        "session_list_dir" => list_dir(state, owner, args).await,
        "session_checkpoint" => checkpoint(state, owner, args).await,
        "session_restore" => restore(state, owner, args).await,
        "session_fork" => fork(state, owner, args).await,
        "session_stop" => stop(state, owner, args).await,
        other => Err(Failure::Call(bad(format!(
            "no tool {} on this host",
            smithers_terminal::line(other)
        )))),
    };
    match outcome {
        Ok(v) => Ok(v),
        Err(Failure::Call(e)) => Err(e),
        Err(Failure::Host(e)) => {
            // The HTTP API answers an unknown (or another token's) sandbox with 404 and
            // `INVALID_INPUT`; a tool says `NOT_FOUND`, as the stdio server's do.
            let code = match e.status {
                StatusCode::NOT_FOUND => ErrorCode::NotFound.to_string(),
                _ => e.report.code.to_string(),
            };
            Ok(failed(&code, &e.report.message))
        }
    }
}

/// The sandbox the call names, if it is this token's.
fn session(state: &AppState, owner: &Owner, args: &Value) -> Result<Arc<Entry>, Failure> {
    let id = required(args, "sessionId")?;
    Ok(state.owned(id, owner)?)
}

async fn start(state: &Arc<AppState>, owner: &Owner, args: &Value) -> Outcome {
    let (e, made_here) = match str_arg(args, "sandboxId")? {
        Some(id) => (state.owned(id, owner)?, false),
        None => (empty_sandbox(state, owner).await?, true),
    };
    if let Err(err) = session::start_entry(state, &e).await {
        if made_here {
            let _ = crate::routes::remove(state, &e).await;
        }
        return Err(err.into());
    }
    Ok(result(
        format!("session {} started", e.id),
        json!({ "sessionId": e.id, "sandbox": e.info(state.runtime.kind()) }),
        false,
    ))
}

/// A new sandbox of this token with an empty workspace and the operator's ceilings, shipped.
async fn empty_sandbox(state: &Arc<AppState>, owner: &Owner) -> Result<Arc<Entry>, ApiError> {
    let name = format!("mcp-{}", crate::routes::random_hex(8)?);
    let req: CreateSandbox = serde_json::from_value(json!({ "runId": "mcp", "sandboxId": name }))
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let e = crate::routes::create_entry(state, owner, req, (false, false)).await?;
    let shipped = {
        let _op = e.op.lock().await;
        crate::routes::ship_entry(state, &e, json!({ "startedBy": "mcp" })).await
    };
    if let Err(err) = shipped {
        let _ = crate::routes::remove(state, &e).await;
        return Err(err);
    }
    Ok(e)
}

/// The token's live sessions.
fn list(state: &AppState, owner: &Owner) -> Value {
    let sessions: Vec<Value> = lock(&state.sandboxes)
        .values()
        .filter(|e| e.owner == owner.0 && e.state() == SandboxState::Live)
        .map(|e| {
            json!({
                "sessionId": e.id,
                "runId": e.run_id,
                "sandboxId": e.sandbox_id,
                "createdAtMs": e.created_at_ms,
            })
        })
        .collect();
    result(
        format!("{} live session(s)", sessions.len()),
        json!({ "sessions": sessions }),
        false,
    )
}

async fn exec(state: &Arc<AppState>, owner: &Owner, args: &Value) -> Outcome {
    let e = session(state, owner, args)?;
    let body = ExecBody {
        argv: argv_arg(args)?,
        cwd: str_arg(args, "cwd")?.map(str::to_string),
        env: env_arg(args)?,
        timeout_ms: u64_arg(args, "timeoutMs")?,
        stdin_base64: None,
    };
    let stdin = stdin_arg(args)?;
    let limit = limit_arg(args, "maxOutputBytes")?;
    let mut request = session::exec_request(state, body)?;
    if let Some(bytes) = stdin {
        request.stdin = bounded_stdin(bytes)?;
    }
    let (exit, out, err) = run(state, &e, request, limit, false).await?;
    Ok(exec_result(exit_json(&exit), &out, &err, limit))
}

async fn read(state: &Arc<AppState>, owner: &Owner, args: &Value) -> Outcome {
    let e = session(state, owner, args)?;
    let path = required(args, "path")?;
    let limit = limit_arg(args, "maxBytes")?;
    let request = file_request(state, &scripts::read(), path, StepStdin::default(), None)?;
    // A file past the bound (or without end: `/dev/zero`) ends its command once the bound
    // and one byte more came: cut, said, not an error.
    let (exit, out, err) = run(state, &e, request, limit, true).await?;
    if !out.truncated() {
        file_outcome(&exit, path, &err, false)?;
    }
    Ok(read_result(&out))
}

async fn write(state: &Arc<AppState>, owner: &Owner, args: &Value) -> Outcome {
    let e = session(state, owner, args)?;
    let path = required(args, "path")?;
    let bytes = take_bytes(args.get("content"), args.get("contentBase64")).map_err(bad)?;
    let size = bytes.len();
    let stdin = bounded_stdin(bytes)?;
    let request = file_request(state, &scripts::write(), path, stdin, None)?;
    let (exit, _, err) = run(state, &e, request, MAX_OUTPUT, false).await?;
    file_outcome(&exit, path, &err, false)?;
    Ok(result(
        format!("wrote {size} bytes to {}", smithers_terminal::line(path)),
        json!({ "path": path, "sizeBytes": size }),
        false,
    ))
}

async fn list_dir(state: &Arc<AppState>, owner: &Owner, args: &Value) -> Outcome {
    let e = session(state, owner, args)?;
    let path = str_arg(args, "path")?.unwrap_or(".");
    let request = file_request(
        state,
        &scripts::list_dir(),
        path,
        StepStdin::default(),
        Some(LIST_TIMEOUT_MS),
    )?;
    let (exit, out, err) = run(state, &e, request, MAX_OUTPUT, false).await?;
    file_outcome(&exit, path, &err, true)?;
    Ok(listing_result(path, &out))
}

async fn checkpoint(state: &Arc<AppState>, owner: &Owner, args: &Value) -> Outcome {
    let e = session(state, owner, args)?;
    let made = session::checkpoint_entry(state, &e).await?;
    Ok(result(
        format!(
            "checkpoint {} of session {} (its processes held still {} µs)",
            made.checkpoint,
            e.id,
            made.held_us.unwrap_or_default()
        ),
        json!({ "checkpoint": made.checkpoint, "heldUs": made.held_us }),
        false,
    ))
}

async fn restore(state: &Arc<AppState>, owner: &Owner, args: &Value) -> Outcome {
    let e = session(state, owner, args)?;
    let name = required(args, "checkpoint")?;
    session::restore_entry(state, &e, name).await?;
    Ok(result(
        format!(
            "session {} restored to {}",
            e.id,
            smithers_terminal::line(name)
        ),
        json!({ "sessionId": e.id, "checkpoint": name }),
        false,
    ))
}

async fn fork(state: &Arc<AppState>, owner: &Owner, args: &Value) -> Outcome {
    let parent = session(state, owner, args)?;
    let name = str_arg(args, "checkpoint")?;
    let (child, checkpoint) = crate::fork::fork_entry(state, owner, &parent, name).await?;
    Ok(result(
        format!(
            "session {} forked from {} of session {}",
            child.id, checkpoint, parent.id
        ),
        json!({
            "sessionId": child.id,
            "checkpoint": checkpoint,
            "sandbox": child.info(state.runtime.kind()),
        }),
        false,
    ))
}

async fn stop(state: &Arc<AppState>, owner: &Owner, args: &Value) -> Outcome {
    let e = session(state, owner, args)?;
    session::stop_and_collect(state, &e).await?;
    Ok(result(
        format!(
            "session {} stopped: its change is collected into a bundle (GET /v1/sandboxes/{}/bundle) that waits for your client's review",
            e.id, e.id
        ),
        json!({ "sessionId": e.id, "sandbox": e.info(state.runtime.kind()) }),
        false,
    ))
}

/// Runs one command in the live session `e`, its streams kept up to `limit` each (the rest
/// counted). With `cut`, a stdout past the bound ends the command (a read needs no more).
/// A client that goes away (this future dropped) cancels the command: its group is killed.
async fn run(
    state: &Arc<AppState>,
    e: &Arc<Entry>,
    request: ExecRequest,
    limit: usize,
    cut: bool,
) -> Result<(ExecExit, Captured, Captured), ApiError> {
    let engine = session::engine(state)?;
    session::live_or_conflict(e, "exec")?;
    let cancel = CancellationToken::new();
    let guard = cancel.clone().drop_guard();
    let sink = Arc::new(CaptureSink {
        streams: Mutex::new(Default::default()),
        limit,
        cut: cut.then(|| cancel.clone()),
    });
    let (handle, task_sink) = (e.handle.clone(), sink.clone());
    let task = state.tasks.spawn(async move {
        engine
            .exec(&handle, request, cancel, task_sink.as_ref())
            .await
    });
    let ran = task.await;
    guard.disarm();
    e.touch();
    let exit = ran
        .map_err(|_| ApiError::internal("the command's task ended without an answer"))?
        .map_err(|err| ApiError::runtime(&err))?;
    let (out, err) = std::mem::take(&mut *lock(&sink.streams));
    Ok((exit, out, err))
}

/// The two streams of a command, each kept up to its bound.
struct CaptureSink {
    streams: Mutex<(Captured, Captured)>,
    limit: usize,
    /// Cancelled once stdout carried more than the bound (a read's file is cut there).
    cut: Option<CancellationToken>,
}

impl OutputSink for CaptureSink {
    fn event(&self, event: OutputEvent) {
        let OutputEvent::Output { stream, bytes, .. } = event else {
            return;
        };
        let mut streams = lock(&self.streams);
        let kept = match stream {
            OutputStream::Stdout => &mut streams.0,
            OutputStream::Stderr => &mut streams.1,
        };
        kept.take(&bytes, self.limit);
        if stream == OutputStream::Stdout && kept.truncated() {
            if let Some(cut) = &self.cut {
                cut.cancel();
            }
        }
    }
}

/// A command of `script` with `path` as its `$1`, under the host's ceilings.
fn file_request(
    state: &AppState,
    script: &str,
    path: &str,
    stdin: StepStdin,
    timeout_ms: Option<u64>,
) -> Result<ExecRequest, ApiError> {
    let body = ExecBody {
        argv: scripts::argv(script, path),
        cwd: None,
        env: Vec::new(),
        timeout_ms,
        stdin_base64: None,
    };
    let mut request = session::exec_request(state, body)?;
    request.stdin = stdin;
    Ok(request)
}

/// At most [`MAX_OUTPUT`] bytes go to a command's stdin through a call.
fn bounded_stdin(bytes: Vec<u8>) -> Result<StepStdin, ApiError> {
    if bytes.len() > MAX_OUTPUT {
        return Err(ApiError::too_large("stdin", MAX_OUTPUT as u64));
    }
    Ok(StepStdin::from_reader(std::io::Cursor::new(bytes)))
}

/// What a file command's end says: done, or why not (no such file, a directory where a
/// file was meant or the reverse, or how it failed), as the HTTP API would answer it.
fn file_outcome(
    exit: &ExecExit,
    path: &str,
    err: &Captured,
    listing: bool,
) -> Result<(), ApiError> {
    let exited = match exit.termination {
        Termination::Exited => exit.exit_code.map(i64::from),
        _ => None,
    };
    let Some((code, message)) =
        scripts::failure(path, exited, exit.termination.as_str(), &err.bytes, listing)
    else {
        return Ok(());
    };
    let (status, code) = match code {
        "NOT_FOUND" => (StatusCode::NOT_FOUND, ErrorCode::NotFound),
        "INVALID_INPUT" => (StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::InvalidInput),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::SandboxExecutionFailed,
        ),
    };
    Err(ApiError::new(status, code, message))
}

fn exit_json(exit: &ExecExit) -> Value {
    serde_json::to_value(exit).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reads_stdout_past_its_bound_ends_the_command_and_stderr_never_does() {
        let cancel = CancellationToken::new();
        let sink = CaptureSink {
            streams: Mutex::new(Default::default()),
            limit: 4,
            cut: Some(cancel.clone()),
        };
        let output = |stream, bytes: &[u8]| OutputEvent::Output {
            stream,
            bytes: bytes.to_vec(),
            timestamp_ms: 0,
        };
        sink.event(output(OutputStream::Stderr, b"0123456789"));
        assert!(!cancel.is_cancelled());
        sink.event(output(OutputStream::Stdout, b"0123"));
        assert!(!cancel.is_cancelled());
        sink.event(output(OutputStream::Stdout, b"4"));
        assert!(cancel.is_cancelled());
        let streams = lock(&sink.streams);
        assert_eq!(
            (streams.0.bytes.as_slice(), streams.0.total),
            (&b"0123"[..], 5)
        );
        assert_eq!((streams.1.bytes.len(), streams.1.total), (4, 10));
    }
}
