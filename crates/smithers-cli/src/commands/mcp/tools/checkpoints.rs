//! `session_checkpoint`, `session_restore` and `session_fork`: the session's holder does the
//! work (see the CLI's `session checkpoint`); a fork is started as `session start` starts
//! one, by this program, and becomes a session of this server's (its client may drive it,
//! stop it and, when the operator allows, accept it).

use serde_json::{json, Value};

use super::{answer_error, ask, bad, failed, result, str_arg, CallResult, Server};
use crate::commands::session::wire;
use crate::output::inert;

/// A checkpoint's name as the holder makes them (`cp-` and a number): checked before it is
/// passed on, so an argument is never read as an option.
fn checkpoint_arg(args: &Value, required: bool) -> Result<Option<String>, (i64, String)> {
    match str_arg(args, "checkpoint")? {
        Some(c) if smithers_runtime::Checkpoints::index_of(c).is_some() => Ok(Some(c.to_string())),
        Some(c) => Err(bad(format!(
            "{} is not a checkpoint's name (cp-N)",
            inert(c)
        ))),
        None if required => Err(bad("checkpoint is required")),
        None => Ok(None),
    }
}

impl Server {
    pub(super) fn checkpoint(&self, args: &Value) -> CallResult {
        let (id, socket) = self.session(args)?;
        let answer = ask(&socket, &wire::Request::Checkpoint, &[]);
        if let Some(e) = answer_error(&answer) {
            return Ok(e);
        }
        let doc = answer.unwrap_or_default();
        let name = doc["checkpoint"].as_str().unwrap_or_default();
        Ok(result(
            format!("session {id}: checkpoint {name}"),
            json!({ "sessionId": id, "checkpoint": name }),
            false,
        ))
    }

    pub(super) fn restore(&self, args: &Value) -> CallResult {
        let (id, socket) = self.session(args)?;
        let Some(checkpoint) = checkpoint_arg(args, true)? else {
            return Err(bad("checkpoint is required"));
        };
        let request = wire::Request::Restore {
            checkpoint: checkpoint.clone(),
        };
        if let Some(e) = answer_error(&ask(&socket, &request, &[])) {
            return Ok(e);
        }
        Ok(result(
            format!("session {id} is back at {checkpoint}"),
            json!({ "sessionId": id, "checkpoint": checkpoint }),
            false,
        ))
    }

    pub(super) fn fork(&mut self, args: &Value) -> CallResult {
        let (id, _) = self.session(args)?;
        let checkpoint = checkpoint_arg(args, false)?;
        let out = std::process::Command::new(
            std::env::current_exe().map_err(|e| (-32603, e.to_string()))?,
        )
        .args(["--json", "session", "fork", &id])
        .args(checkpoint.iter())
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| (-32603, e.to_string()))?;
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let Some(fork) = doc["sessionId"].as_str().filter(|_| out.status.success()) else {
            let code = doc["code"].as_str().unwrap_or("SANDBOX_EXECUTION_FAILED");
            let message = doc["message"].as_str().unwrap_or("the fork did not start");
            return Ok(failed(code, message));
        };
        self.sessions.insert(fork.to_string());
        self.started.insert(fork.to_string());
        Ok(result(
            format!("session {fork} forked from {id}"),
            json!({ "sessionId": fork, "from": id, "checkpoint": checkpoint }),
            false,
        ))
    }
}
