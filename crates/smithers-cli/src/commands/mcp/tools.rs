//! The tools, and the sessions this server started (the only ones its client reaches).
//!
//! Each tool checks its arguments itself (types, sizes, names) before anything is done with
//! them; a failure of the tool (a command that cannot run, a file that is not there) is a
//! result with `isError`, a malformed call a JSON-RPC error.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

mod checkpoints;

use smithers_mcp::args::{
    argv_arg, bad, env_arg, failed, limit_arg, required, result, stdin_arg, str_arg, str_list,
    u64_arg, CallResult, MAX_OUTPUT,
};
use smithers_mcp::bytes::take_bytes;
use smithers_mcp::results::{exec_result, listing_result, read_result};

use super::capture::spawn_reader;
use crate::commands::session::{socket_of, wire};

pub struct Server {
    root: PathBuf,
    allow_accept: bool,
    sessions: BTreeSet<String>,
    /// Every session this server started, stopped ones too: only those may be accepted.
    started: BTreeSet<String>,
    /// The hosts the operator lets an agent's session reach (`mcp --allow-host`).
    hosts: BTreeSet<String>,
}

impl Server {
    pub fn new(root: PathBuf, allow_accept: bool) -> Server {
        Server {
            root,
            allow_accept,
            sessions: BTreeSet::new(),
            started: BTreeSet::new(),
            hosts: BTreeSet::new(),
        }
    }

    /// The hosts an agent may ask for (`mcp --allow-host`).
    pub fn with_hosts(mut self, hosts: Vec<String>) -> Server {
        self.hosts = hosts.into_iter().collect();
        self
    }

    pub fn list(&self) -> Vec<Value> {
        let mut tools = smithers_mcp::schema::all();
        if !self.allow_accept {
            tools.retain(|t| t["name"] != "session_accept");
        }
        tools
    }

    pub fn call(&mut self, name: &str, args: &Value) -> CallResult {
        match name {
            "session_start" => self.start(args),
            "session_list" => Ok(self.list_sessions()),
            "session_exec" => self.exec(args),
            "session_read" => self.read(args),
            "session_write" => self.write(args),
            "session_list_dir" => self.list_dir(args),
            "session_diff" => self.diff(args),
            "session_checkpoint" => self.checkpoint(args),
            "session_restore" => self.restore(args),
            "session_fork" => self.fork(args),
            "session_stop" => self.stop(args),
            "session_accept" if self.allow_accept => self.accept(args),
            other => Err(bad(format!("no tool {}", crate::output::inert(other)))),
        }
    }

    /// Stops every session this server started (its client is gone): their changes wait
    /// for review.
    pub fn stop_all(&mut self) {
        for id in std::mem::take(&mut self.sessions) {
            if let Ok(socket) = socket_of(&id) {
                let _ = ask(&socket, &wire::Request::Stop, &[]);
            }
        }
    }

    /// The session the call names, if this server started it.
    fn session(&self, args: &Value) -> Result<(String, PathBuf), (i64, String)> {
        let id = required(args, "sessionId")?;
        if !self.sessions.contains(id) {
            return Err(bad(format!(
                "no session {} was started here",
                crate::output::inert(id)
            )));
        }
        let socket = socket_of(id).map_err(|e| bad(e.to_string()))?;
        Ok((id.to_string(), socket))
    }

    fn start(&mut self, args: &Value) -> CallResult {
        let mut command = std::process::Command::new(
            std::env::current_exe().map_err(|e| (-32603, e.to_string()))?,
        );
        command
            .args(["--json", "session", "start", "--root"])
            .arg(&self.root)
            // Ended with this server, however it ends (killed too): its change then waits
            // for review instead of an idle timeout.
            .arg(format!("--owner-pid={}", std::process::id()));
        // Each option as one `--flag=value` word: a value is never read as another option.
        for (key, flag) in [
            ("idleTimeout", "--idle-timeout"),
            ("timeout", "--timeout"),
            ("memory", "--memory"),
            ("cpus", "--cpus"),
        ] {
            if let Some(v) = str_arg(args, key)? {
                command.arg(format!("{flag}={v}"));
            }
        }
        for host in str_list(args, "allowHosts", 64)? {
            // The operator's list bounds the agent's: a host not on it is refused, never
            // dropped (the session would then not be what the agent thinks it is).
            if !self.hosts.contains(&host) {
                return Ok(failed(
                    "INVALID_INPUT",
                    &format!(
                        "{} is not among the hosts this server may give a session (smithers-sandbox mcp --allow-host)",
                        crate::output::inert(&host)
                    ),
                ));
            }
            command.arg(format!("--allow-host={host}"));
        }
        let out = command
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| (-32603, e.to_string()))?;
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let Some(id) = doc["sessionId"].as_str().filter(|_| out.status.success()) else {
            let code = doc["code"].as_str().unwrap_or("SANDBOX_EXECUTION_FAILED");
            let message = doc["message"]
                .as_str()
                .unwrap_or("the session did not start");
            return Ok(failed(code, message));
        };
        self.sessions.insert(id.to_string());
        self.started.insert(id.to_string());
        Ok(result(
            format!("session {id} started over {}", self.root.display()),
            json!({ "sessionId": id, "rootDir": self.root }),
            false,
        ))
    }

    fn list_sessions(&self) -> Value {
        let mut list = Vec::new();
        for id in &self.sessions {
            let info = socket_of(id)
                .ok()
                .and_then(|s| ping(&s).ok())
                .map_or(json!({ "sessionId": id, "held": false }), |a| {
                    a["session"].clone()
                });
            list.push(info);
        }
        let text = format!("{} session(s)", list.len());
        result(text, json!({ "sessions": list }), false)
    }

    fn exec(&self, args: &Value) -> CallResult {
        let (_, socket) = self.session(args)?;
        let argv = argv_arg(args)?;
        let env = env_arg(args)?;
        let stdin = stdin_arg(args)?;
        let limit = limit_arg(args, "maxOutputBytes")?;
        let request = wire::Request::Exec {
            argv,
            cwd: str_arg(args, "cwd")?.map(str::to_string),
            env,
            timeout_ms: u64_arg(args, "timeoutMs")?,
            stdin: stdin.is_some(),
            terminal: None,
        };
        let ran = run_with_pipes(&socket, &request, stdin, limit)?;
        let (answer, out, err) = match ran {
            Ok(r) => r,
            Err(e) => return Ok(e),
        };
        Ok(exec_result(answer["exit"].clone(), &out, &err, limit))
    }

    fn read(&self, args: &Value) -> CallResult {
        let (_, socket) = self.session(args)?;
        let path = required(args, "path")?;
        let limit = limit_arg(args, "maxBytes")?;
        let (r, w) = std::os::unix::net::UnixStream::pair().map_err(|e| (-32603, e.to_string()))?;
        // Read to the bound and one byte more, then the pipe closes: a file without end
        // (`/dev/zero`) ends its `cat` (its reader gone) instead of holding this server.
        let reader = super::capture::spawn_bounded_reader(r, limit);
        let request = wire::Request::Read { path: path.into() };
        let answer = ask(&socket, &request, &[w.as_fd()]);
        drop(w);
        let got = reader.join().map_err(|_| (-32603, "reader".to_string()))?;
        // Cut at the bound, the read's command was ended (its reader gone): not an error.
        let truncated = got.truncated();
        if let Some(e) = answer_error(&answer).filter(|_| !truncated) {
            return Ok(e);
        }
        Ok(read_result(&got))
    }

    fn write(&self, args: &Value) -> CallResult {
        let (_, socket) = self.session(args)?;
        let path = required(args, "path")?;
        let bytes = take_bytes(args.get("content"), args.get("contentBase64")).map_err(bad)?;
        let (r, mut w) =
            std::os::unix::net::UnixStream::pair().map_err(|e| (-32603, e.to_string()))?;
        let size = bytes.len();
        let feeder = std::thread::spawn(move || {
            let _ = w.write_all(&bytes);
        });
        let request = wire::Request::Write { path: path.into() };
        let answer = ask(&socket, &request, &[r.as_fd()]);
        drop(r);
        let _ = feeder.join();
        if let Some(e) = answer_error(&answer) {
            return Ok(e);
        }
        Ok(result(
            format!("wrote {size} bytes to {path}"),
            json!({ "path": path, "sizeBytes": size }),
            false,
        ))
    }

    fn list_dir(&self, args: &Value) -> CallResult {
        let (_, socket) = self.session(args)?;
        let path = str_arg(args, "path")?.unwrap_or(".");
        let request = wire::Request::Exec {
            argv: smithers_mcp::scripts::argv(&smithers_mcp::scripts::list_dir(), path),
            cwd: None,
            env: Vec::new(),
            timeout_ms: Some(30_000),
            stdin: false,
            terminal: None,
        };
        let (answer, out, err) = match run_with_pipes(&socket, &request, None, MAX_OUTPUT)? {
            Ok(r) => r,
            Err(e) => return Ok(e),
        };
        let exit = &answer["exit"];
        let exited = match exit["termination"].as_str() {
            Some("exited") => exit["exitCode"].as_i64(),
            _ => None,
        };
        let ended = exit["termination"].as_str().unwrap_or("ended");
        if let Some((code, message)) =
            smithers_mcp::scripts::failure(path, exited, ended, &err.bytes, true)
        {
            return Ok(failed(code, &message));
        }
        Ok(listing_result(path, &out))
    }

    fn diff(&self, args: &Value) -> CallResult {
        let (_, socket) = self.session(args)?;
        let answer = match ask(&socket, &wire::Request::Diff, &[]) {
            Ok(a) if a["ok"] == json!(true) => a,
            other => {
                return Ok(answer_error(&other).unwrap_or_else(|| failed("INTERNAL", "no answer")))
            }
        };
        let bundle = PathBuf::from(answer["bundlePath"].as_str().unwrap_or_default());
        let mut doc = crate::commands::session::diff_json(&bundle, &self.root)
            .map_err(|e| (-32603, e.to_string()))?;
        let text = doc
            .as_object_mut()
            .and_then(|d| d.remove("text"))
            .unwrap_or_default();
        let mut text = text.as_str().unwrap_or_default().to_string();
        if text.len() > MAX_OUTPUT {
            let mut cut = MAX_OUTPUT;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str("\n[diff cut: the rest is in structuredContent.diff]");
        }
        Ok(result(text, doc, false))
    }

    fn stop(&mut self, args: &Value) -> CallResult {
        let (id, socket) = self.session(args)?;
        let answer = ask(&socket, &wire::Request::Stop, &[]);
        self.sessions.remove(&id);
        if let Some(e) = answer_error(&answer) {
            return Ok(e);
        }
        let doc = answer.unwrap_or_default();
        let text = match doc["status"].as_str() {
            Some("review") => format!(
                "session {id} stopped: {} patch(es) wait for a person's review (smithers-sandbox review {id})",
                doc["patchCount"]
            ),
            Some(s) => format!("session {id} stopped: {s}"),
            None => format!("session {id} stopped"),
        };
        Ok(result(text, doc, false))
    }

    fn accept(&self, args: &Value) -> CallResult {
        let id = required(args, "sessionId")?;
        // Only a session this server started: never a person's run or another agent's work.
        if !self.started.contains(id) {
            return Err(bad(format!(
                "no session {} was started here",
                crate::output::inert(id)
            )));
        }
        let out = std::process::Command::new(
            std::env::current_exe().map_err(|e| (-32603, e.to_string()))?,
        )
        .args(["--json", "accept", "--root"])
        .arg(&self.root)
        .arg(id)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| (-32603, e.to_string()))?;
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if !out.status.success() {
            let code = doc["code"].as_str().unwrap_or("INTERNAL");
            return Ok(failed(
                code,
                doc["message"].as_str().unwrap_or("accept failed"),
            ));
        }
        Ok(result(format!("accepted {id}"), doc, false))
    }
}

/// Sends `request` with stdout and stderr pipes (and stdin's, fed with `stdin`), reading both
/// up to `limit`: the answer and the two streams, or the tool's error result.
#[allow(clippy::type_complexity)]
fn run_with_pipes(
    socket: &std::path::Path,
    request: &wire::Request,
    stdin: Option<Vec<u8>>,
    limit: usize,
) -> Result<Result<(Value, super::capture::Captured, super::capture::Captured), Value>, (i64, String)>
{
    let pipe = || std::os::unix::net::UnixStream::pair().map_err(|e| (-32603, e.to_string()));
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let out = spawn_reader(out_r, limit);
    let err = spawn_reader(err_r, limit);
    let mut fds = Vec::new();
    let mut feeder = None;
    let stdin_r = match stdin {
        Some(bytes) => {
            let (r, mut w) = pipe()?;
            feeder = Some(std::thread::spawn(move || {
                let _ = w.write_all(&bytes);
            }));
            Some(r)
        }
        None => None,
    };
    if let Some(r) = &stdin_r {
        fds.push(r.as_fd());
    }
    fds.extend([out_w.as_fd(), err_w.as_fd()]);
    let answer = ask(socket, request, &fds);
    drop((out_w, err_w, stdin_r));
    if let Some(f) = feeder {
        let _ = f.join();
    }
    let join = |h: std::thread::JoinHandle<super::capture::Captured>| {
        h.join().map_err(|_| (-32603, "output reader".to_string()))
    };
    let (out, err) = (join(out)?, join(err)?);
    Ok(match answer_error(&answer) {
        Some(e) => Err(e),
        None => Ok((answer.unwrap_or_default(), out, err)),
    })
}

fn ask(
    socket: &std::path::Path,
    request: &wire::Request,
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<Value> {
    let stream = wire::send(socket, request, fds)?;
    stream.set_read_timeout(Some(Duration::from_secs(24 * 3600)))?;
    wire::read_answer(&stream)
}

/// A ping, bounded in time (a stopped holder is "not held", not a hang).
fn ping(socket: &std::path::Path) -> std::io::Result<Value> {
    let stream = wire::send(socket, &wire::Request::Ping, &[])?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    wire::read_answer(&stream)
}

/// The tool error an answer is, if it is one.
fn answer_error(answer: &std::io::Result<Value>) -> Option<Value> {
    match answer {
        Err(e) => Some(failed(
            "NOT_FOUND",
            &format!("the session is not held: {e}"),
        )),
        Ok(a) if a["ok"] == json!(true) => None,
        Ok(a) => Some(failed(
            a["error"]["code"].as_str().unwrap_or("INTERNAL"),
            a["error"]["message"].as_str().unwrap_or("failed"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_reaches_only_sessions_this_server_started() {
        let mut server = Server::new(PathBuf::from("/nonexistent-project"), true);
        assert!(server.list().iter().any(|t| t["name"] == "session_accept"));
        let refused = server.call("session_accept", &json!({"sessionId": "person-run-1"}));
        let (code, message) = refused.expect_err("a person's run was accepted");
        assert_eq!(code, -32602);
        assert!(message.contains("was started here"), "{message}");
        let hidden = Server::new(PathBuf::from("/x"), false);
        assert!(!hidden.list().iter().any(|t| t["name"] == "session_accept"));
    }

    #[test]
    fn an_agent_gets_only_the_hosts_the_operator_allows() {
        let mut server = Server::new(PathBuf::from("/nonexistent-project"), false)
            .with_hosts(vec!["api.example.com:443".into()]);
        let refused = server
            .call(
                "session_start",
                &json!({"allowHosts": ["evil.example.org"]}),
            )
            .unwrap();
        assert_eq!(refused["isError"], true, "{refused}");
        assert!(refused.to_string().contains("--allow-host"), "{refused}");
    }
}
