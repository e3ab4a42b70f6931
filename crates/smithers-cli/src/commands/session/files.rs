//! `session read` and `session write`: a file of the session's own view, moved as bytes.
//!
//! Both run as commands inside the sandbox (a shell and `cat`), so a path means what it
//! means to the session's commands (relative to `/workspace`; symlinks, mounts and the
//! read-only parts of the sandbox as they are there) and nothing outside the sandbox is ever
//! opened for it. The bytes go straight between the client's descriptor and the command's
//! pipe: never decoded, never held whole.

use std::fs::File;
use std::os::fd::OwnedFd;

use serde_json::{json, Value};
use smithers_runtime::{CancellationToken, ExecRequest, StepStdin, Termination};

use super::fd_sink::Capture;
use super::wire::error_json;

/// Runs one command in the session with its output to the sink (the holder's, for this
/// connection: cancelled if the client goes away, recorded as the session's).
pub(super) type RunCommand<'a> = dyn Fn(ExecRequest, &dyn smithers_runtime::OutputSink) -> Result<smithers_runtime::ExecExit, String>
    + 'a;

/// Sends the file at `path` to the client's stdout (the one descriptor sent).
pub(super) fn read(
    run: &RunCommand<'_>,
    cancel: CancellationToken,
    path: &str,
    fds: Vec<OwnedFd>,
) -> Value {
    let Some(out) = fds.into_iter().next() else {
        return error_json(
            "INVALID_INPUT",
            "a read needs the client's stdout",
            json!({}),
        );
    };
    let script = smithers_mcp::scripts::read();
    let mut capture = Capture::new(Some(File::from(out)), cancel);
    let ran = run(shell(&script, path, StepStdin::default()), &capture);
    // Every byte written before the answer.
    capture.finish();
    finish(ran, path, &capture)
}

/// Writes the client's stdin (the one descriptor sent) into the file at `path`, its parent
/// directories made.
pub(super) fn write(
    run: &RunCommand<'_>,
    cancel: CancellationToken,
    path: &str,
    fds: Vec<OwnedFd>,
) -> Value {
    let Some(input) = fds.into_iter().next() else {
        return error_json(
            "INVALID_INPUT",
            "a write needs the client's stdin",
            json!({}),
        );
    };
    let script = smithers_mcp::scripts::write();
    let capture = Capture::new(None, cancel);
    let stdin = StepStdin::from_reader(File::from(input));
    finish(run(shell(&script, path, stdin), &capture), path, &capture)
}

fn shell(script: &str, path: &str, stdin: StepStdin) -> ExecRequest {
    ExecRequest {
        argv: smithers_mcp::scripts::argv(script, path),
        stdin,
        ..ExecRequest::default()
    }
}

fn finish(ran: Result<smithers_runtime::ExecExit, String>, path: &str, capture: &Capture) -> Value {
    let details = json!({ "path": path });
    let exit = match ran {
        Err(message) => return error_json("SANDBOX_EXECUTION_FAILED", &message, details),
        Ok(exit) => exit,
    };
    let exited = match exit.termination {
        Termination::Exited => exit.exit_code.map(i64::from),
        _ => None,
    };
    let stderr = capture.stderr_text();
    match smithers_mcp::scripts::failure(
        path,
        exited,
        exit.termination.as_str(),
        stderr.as_bytes(),
        false,
    ) {
        None => json!({ "ok": true, "path": path }),
        Some((code, message)) => error_json(code, &message, details),
    }
}
