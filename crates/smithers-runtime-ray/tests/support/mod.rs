//! A fake Ray head on loopback, for the placement tests: the part of the Jobs API a lease
//! uses (submit, read, log, stop, delete, list) and the node's `serve` (its sandbox create),
//! both on one port, with failures scripted per route.
//!
//! Every answer closes its connection, so a stopped fake refuses the next connection at once
//! (no pooled connection outlives it).

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The routes a failure can be scripted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    Submit,
    Get,
    Logs,
    Stop,
    Delete,
    List,
    /// The node's `POST /v1/sandboxes`.
    CreateSandbox,
}

/// A scripted failure.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answers this status with this body (Ray's errors are tracebacks ending in the message).
    Status(u16, String),
    /// Submit only: takes the job, then answers 500 (a reply lost after Ray took it).
    TakeThen500,
    /// Reads the request and closes the connection without an answer.
    Close,
}

#[derive(Debug, Default)]
pub struct State {
    /// Per route, the next calls' failures (one each, front first).
    pub script: HashMap<Route, VecDeque<Fault>>,
    /// Per route, a failure every call meets (after the script).
    pub always: HashMap<Route, Fault>,
    /// Submitted jobs by submission id: their submit body and status.
    pub jobs: HashMap<String, (Value, String)>,
    /// Every call: its route and the status answered (0: closed without one).
    pub calls: Vec<(Route, u16)>,
}

/// A running fake. Dropping it stops it.
pub struct Fake {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<State>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Fake {
    pub async fn start() -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let task = Some(tokio::spawn(serve(listener, state.clone())));
        Fake { addr, state, task }
    }

    /// The Jobs API's URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops listening: connections are refused until [`Fake::resume`].
    pub fn stop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }

    /// Listens again on the same port, with the same state.
    pub async fn resume(&mut self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.task = Some(tokio::spawn(serve(listener, self.state.clone())));
    }

    pub fn script(&self, route: Route, faults: impl IntoIterator<Item = Fault>) {
        self.state
            .lock()
            .unwrap()
            .script
            .entry(route)
            .or_default()
            .extend(faults);
    }

    pub fn always(&self, route: Route, fault: Fault) {
        self.state.lock().unwrap().always.insert(route, fault);
    }

    /// The statuses answered on `route`, in order (0: closed without an answer).
    pub fn calls(&self, route: Route) -> Vec<u16> {
        self.state
            .lock()
            .unwrap()
            .calls
            .iter()
            .filter(|(r, _)| *r == route)
            .map(|(_, s)| *s)
            .collect()
    }

    pub fn job_count(&self) -> usize {
        self.state.lock().unwrap().jobs.len()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Ray's answer while a fresh node's agent is not up yet (a traceback, its last line the
/// message).
pub fn agent_not_ready() -> Fault {
    Fault::Status(
        500,
        "Traceback (most recent call last):\n  File \"job_head.py\"\nRuntimeError: Failed to get the agent of node 3f2a: not ready yet\n".into(),
    )
}

async fn serve(listener: TcpListener, state: Arc<Mutex<State>>) {
    let port = listener.local_addr().unwrap().port();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _ = answer(stream, state, port).await;
        });
    }
}

struct Request {
    method: String,
    path: String,
    body: Vec<u8>,
}

async fn read_request(stream: &mut TcpStream) -> std::io::Result<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.lines();
    let mut first = lines.next().unwrap_or("").split(' ');
    let method = first.next().unwrap_or("").to_string();
    let path = first.next().unwrap_or("").to_string();
    let length: usize = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Ok(Request { method, path, body })
}

fn route_of(method: &str, path: &str) -> Option<(Route, Option<String>)> {
    let path = path.split('?').next().unwrap_or("");
    if method == "POST" && path == "/v1/sandboxes" {
        return Some((Route::CreateSandbox, None));
    }
    let rest = path.strip_prefix("/api/jobs/")?;
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    match (method, parts.as_slice()) {
        ("POST", []) => Some((Route::Submit, None)),
        ("GET", []) => Some((Route::List, None)),
        ("GET", [id]) => Some((Route::Get, Some(id.to_string()))),
        ("GET", [id, "logs"]) => Some((Route::Logs, Some(id.to_string()))),
        ("POST", [id, "stop"]) => Some((Route::Stop, Some(id.to_string()))),
        ("DELETE", [id]) => Some((Route::Delete, Some(id.to_string()))),
        _ => None,
    }
}

async fn answer(mut stream: TcpStream, state: Arc<Mutex<State>>, port: u16) -> std::io::Result<()> {
    let req = read_request(&mut stream).await?;
    let Some((route, id)) = route_of(&req.method, &req.path) else {
        return reply(&mut stream, 404, "not found").await;
    };
    let fault = {
        let mut s = state.lock().unwrap();
        s.script
            .get_mut(&route)
            .and_then(VecDeque::pop_front)
            .or_else(|| s.always.get(&route).cloned())
    };
    let (status, body) = match fault {
        Some(Fault::Close) => {
            state.lock().unwrap().calls.push((route, 0));
            return Ok(());
        }
        Some(Fault::Status(status, body)) => (status, body),
        Some(Fault::TakeThen500) => {
            let _ = handle(route, id, &req.body, &state, port);
            (500, "Internal Server Error".into())
        }
        None => handle(route, id, &req.body, &state, port),
    };
    state.lock().unwrap().calls.push((route, status));
    reply(&mut stream, status, &body).await
}

/// The answer of a healthy head (and node).
fn handle(
    route: Route,
    id: Option<String>,
    body: &[u8],
    state: &Mutex<State>,
    port: u16,
) -> (u16, String) {
    let mut s = state.lock().unwrap();
    match route {
        Route::Submit => {
            let job: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            let Some(sid) = job["submission_id"].as_str().map(str::to_string) else {
                return (400, "no submission_id".into());
            };
            if s.jobs.contains_key(&sid) {
                return (
                    500,
                    format!("Traceback (most recent call last):\nValueError: Job with submission_id {sid} already exists. Please use a different submission_id.\n"),
                );
            }
            s.jobs.insert(sid.clone(), (job, "RUNNING".into()));
            (200, json!({ "submission_id": sid }).to_string())
        }
        Route::Get => match s.jobs.get(id.as_deref().unwrap_or("")) {
            Some((job, status)) => (
                200,
                json!({
                    "type": "SUBMISSION",
                    "submission_id": job["submission_id"],
                    "status": status,
                    "message": "Job is currently running.",
                    "driver_agent_http_address": format!("http://127.0.0.1:{port}"),
                    "driver_node_id": "fake-node",
                    "runtime_env": job["runtime_env"],
                    "metadata": job["metadata"],
                    "start_time": 1,
                })
                .to_string(),
            ),
            None => (404, "Job does not exist".into()),
        },
        Route::Logs => match s.jobs.get(id.as_deref().unwrap_or("")) {
            Some((job, _)) => {
                let nonce = job["runtime_env"]["env_vars"]["SMITHERS_LEASE_NONCE"]
                    .as_str()
                    .unwrap_or("");
                let logs = format!(
                    "smithers-lease {nonce}\nsmithers-sandbox serving on http://0.0.0.0:{port} (data in /tmp/x)\n"
                );
                (200, json!({ "logs": logs }).to_string())
            }
            None => (404, "Job does not exist".into()),
        },
        Route::Stop => {
            if let Some((_, status)) = s.jobs.get_mut(id.as_deref().unwrap_or("")) {
                *status = "STOPPED".into();
            }
            (200, json!({ "stopped": true }).to_string())
        }
        Route::Delete => {
            s.jobs.remove(id.as_deref().unwrap_or(""));
            (200, json!({ "deleted": true }).to_string())
        }
        Route::List => (200, "[]".into()),
        Route::CreateSandbox => {
            let req: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            (
                201,
                json!({
                    "id": "fake-sandbox",
                    "runId": req["runId"],
                    "sandboxId": req["sandboxId"],
                    "runtime": "codeplane",
                    "state": "created",
                    "createdAtMs": 0,
                })
                .to_string(),
            )
        }
    }
}

async fn reply(stream: &mut TcpStream, status: u16, body: &str) -> std::io::Result<()> {
    let text = match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let head = format!(
        "HTTP/1.1 {status} {text}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// A project directory for a sandbox config, removed when dropped.
pub struct Project(pub PathBuf);

impl Project {
    pub fn new(name: &str) -> Project {
        let dir =
            std::env::temp_dir().join(format!("smithers-ray-fake-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Project(dir)
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Placement's `SandboxQueued` reasons, as told.
#[derive(Debug, Default)]
pub struct Reasons(pub Mutex<Vec<String>>);

impl smithers_runtime::PlacementSink for Reasons {
    fn queued(&self, reason: &str) {
        self.0.lock().unwrap().push(reason.to_string());
    }
}

impl Reasons {
    pub fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}
