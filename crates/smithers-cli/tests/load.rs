//! Load test of the sandbox host (issue 6): 200 steps from 20 concurrent `codeplane` clients
//! against a real `smithers-sandbox serve` child process on 127.0.0.1 (the product binary, its
//! native namespace runtime), bounded in count, loopback only.
//!
//! Each client is its own `RemoteRuntime` (its own connection pool) with its own project, and
//! runs its steps one after the other through the whole client path: create → ship (streamed
//! workspace upload + request) → execute (follows the events) → collect (bundle download,
//! validation) → cleanup. Every step carries a unique token; it prints it, appends it to two
//! project files and creates a third, and writes it as its result. Checked:
//!
//! * **exactly once**: every token comes back in its own bundle (result + exactly 3 patched
//!   lines) and its own output (each line once), and nowhere else; the server counted exactly
//!   as many executions (`smithers_sandbox_duration_ms_count`), creations and `finished`
//!   completions as steps were run, no other completion status, no 5xx response, and lists
//!   no sandbox at the end;
//! * **events**: besides the client's own follower, a second raw SSE follower per step reads
//!   the stream from seq 0: seqs contiguous, no duplicate, the terminal `completed` event last;
//!   one step in five is cut after its first output line and resumed (by `?since=` or by
//!   `Last-Event-ID`, alternately); the live record equals a full replay of the closed log and
//!   the host's `lastSeq`;
//! * **nothing leaks** (memory and counts, never timing): the server's RSS after a 20-step
//!   warm-up, after the load and after a short idle (growth bounded), its open fds, threads,
//!   mounts, child processes, its data and state directories and the sandbox cgroups.
//!
//! `SMITHERS_LOAD_WRITE_RESULTS=1` also writes the figures into `bench/RESULTS.md`.
//!
//! `health_answers_while_cleanups_are_stuck` (issue 13): `/health` is polled while the 20
//! clients run steps and sandboxes are stuck in cleanup for 12 s (held there by the debug
//! build's `SMITHERS_SANDBOX_TEST_CLEANUP_STALL`, see the native runtime); every answer must
//! come within 2 s, and the maximum latency is printed.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};
use smithers_runtime::{
    CancellationToken, Controls, OutputEvent, OutputSink, RequestBundle, Runtime, RuntimeError,
    RuntimeKind, SandboxConfig, StepCommand,
};
use smithers_runtime_remote::{RemoteOptions, RemoteRuntime, SseParser};
// `say`: past libtest's capture, the figures belong in the log of a passing run too.
use smithers_test_support::{say, skip_or_fail};
use support::serve::{ServeChild, ServeOptions};

const CLIENTS: usize = 20;
const STEPS_PER_CLIENT: usize = 10;
const TOKEN: &str = "load-test-token-0123456789abcdef";
/// Lines each step prints (each carries the token).
const LINES: usize = 5;
/// Patched lines carrying the token in each bundle: two appends and one new file.
const TOKEN_PATCH_LINES: usize = 3;
/// Bound on the server's RSS growth from after the warm-up to after the load and the idle.
const RSS_GROWTH_BOUND: u64 = 64 << 20;
/// Open fds of the server may differ from the baseline by this much (a listener accepting,
/// a log file reopened): not by a step's worth each.
const FD_SLACK: usize = 4;
/// Upper bound of any wait in this test: a hang fails, it does not block CI.
const DEADLINE: Duration = Duration::from_secs(600);

#[derive(Default)]
struct Lines(Mutex<Vec<String>>);

impl OutputSink for Lines {
    fn event(&self, event: OutputEvent) {
        if let OutputEvent::Stdout { line, .. } = event {
            self.0.lock().unwrap().push(line);
        }
    }
}

/// One SSE frame as received.
#[derive(Debug, Clone, PartialEq)]
struct Frame {
    seq: u64,
    event: String,
    data: String,
}

/// How the raw follower of a step reads its stream.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Follow {
    /// From seq 0 to the terminal event on one connection.
    Straight,
    /// Cut after the first output line, then resumed with `?since=<next>`.
    ResumeSince,
    /// Cut after the first output line, then resumed with `Last-Event-ID: <last>`.
    ResumeLastEventId,
}

/// What one step produced, for the checks after the load.
#[derive(Debug)]
struct StepRecord {
    client: usize,
    token: String,
    latency: Duration,
    /// Frames seen live by the raw follower, in order (with the resume, if any).
    frames: Vec<Frame>,
    /// The same stream replayed from seq 0 once closed.
    replay: Vec<Frame>,
    /// The host's `lastSeq` once the step completed.
    host_last_seq: Option<u64>,
    follow: Follow,
    resumed_at: Option<u64>,
    stdout: Vec<String>,
    /// The result's `outputs.token`, the bundle manifest's, and the patch lines with a token.
    result_token: Option<String>,
    manifest_token: Option<String>,
    patched_tokens: Vec<String>,
    patch_files: usize,
}

struct Server {
    child: ServeChild,
    data: tempfile::TempDir,
    /// The server's `$TMPDIR`: workspace layers (overlay upper/work) live below it.
    tmp: tempfile::TempDir,
    /// The server's `$XDG_RUNTIME_DIR` (a tmpfs): per-sandbox state lives below it.
    runtime: tempfile::TempDir,
}

fn project(client: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    std::fs::create_dir_all(p.join("src")).unwrap();
    std::fs::create_dir_all(p.join("data")).unwrap();
    let body: String = (0..200)
        .map(|i| format!("client {client} line {i} of the project\n"))
        .collect();
    std::fs::write(p.join("src/lib.txt"), body).unwrap();
    std::fs::write(p.join("data/runs.log"), "").unwrap();
    std::fs::write(p.join("README.md"), format!("project of client {client}\n")).unwrap();
    dir
}

fn step_command(token: &str) -> StepCommand {
    let script = format!(
        "set -eu\n\
         T={token}\n\
         i=1; while [ $i -le {LINES} ]; do echo \"line $i $T\"; i=$((i+1)); sleep 0.02; done\n\
         echo \"$T\" >> /workspace/data/runs.log\n\
         echo \"$T\" >> /workspace/src/lib.txt\n\
         mkdir -p /workspace/out; echo \"$T\" > /workspace/out/$T.txt\n\
         printf '{{\"status\":\"finished\",\"outputs\":{{\"token\":\"%s\"}}}}' \"$T\" \
           > \"$SMITHERS_SANDBOX_RESULT_PATH\"\n"
    );
    StepCommand {
        argv: vec!["sh".into(), "-c".into(), script],
        cwd: None,
        stdin: Default::default(),
    }
}

/// Half of the steps also carry limits: cgroups (memory, pids) and a size-capped tmpfs for
/// the upper layer (a host mount of the server's), so those are exercised for leaks too.
fn controls(step: usize) -> Controls {
    let mut c = Controls {
        timeout_ms: Some(120_000),
        ..Controls::default()
    };
    if step % 2 == 1 {
        c.memory_limit_bytes = Some(256 << 20);
        c.pids_limit = Some(128);
        c.disk_limit_bytes = Some(64 << 20);
    }
    c
}

fn frame_of(f: smithers_runtime_remote::SseFrame) -> Result<Frame, String> {
    let seq =
        f.id.as_deref()
            .and_then(|i| i.parse().ok())
            .ok_or_else(|| format!("an event without a numeric id: {f:?}"))?;
    Ok(Frame {
        seq,
        event: f.event.unwrap_or_default(),
        data: f.data,
    })
}

fn is_terminal(event: &str) -> bool {
    matches!(event, "completed" | "failed" | "cancelled")
}

/// Reads `/events` from seq 0 to the terminal event; with a resume mode, drops the connection
/// after the first output line and reconnects from where it stopped. Returns every frame
/// received (a duplicate or a gap shows in the seqs) and where it resumed.
async fn follow(
    http: &reqwest::Client,
    base: &str,
    host_id: &str,
    mode: Follow,
) -> Result<(Vec<Frame>, Option<u64>), String> {
    let mut frames: Vec<Frame> = Vec::new();
    let mut resumed_at = None;
    let mut cut = mode != Follow::Straight;
    let mut connections = 0;
    loop {
        connections += 1;
        // One connection, or two with the deliberate cut: more means the host ended a stream
        // before its terminal event.
        let allowed = if mode == Follow::Straight { 1 } else { 2 };
        if connections > allowed {
            return Err(format!(
                "the event stream of {host_id} ended before its terminal event: {frames:?}"
            ));
        }
        let mut req = http
            .get(format!("{base}/v1/sandboxes/{host_id}/events"))
            .bearer_auth(TOKEN);
        match (frames.last(), mode) {
            (None, _) => req = req.query(&[("since", "0")]),
            (Some(last), Follow::ResumeLastEventId) => {
                req = req.header("Last-Event-ID", last.seq.to_string())
            }
            (Some(last), _) => req = req.query(&[("since", (last.seq + 1).to_string())]),
        }
        if let Some(last) = frames.last() {
            resumed_at = Some(last.seq + 1);
        }
        let resp = req.send().await.map_err(|e| format!("events: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("events: HTTP {}", resp.status()));
        }
        let mut stream = resp.bytes_stream();
        let mut parser = SseParser::new();
        'read: while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| format!("events body: {e}"))?;
            for f in parser.push(&chunk) {
                let frame = frame_of(f)?;
                let terminal = is_terminal(&frame.event);
                let stdout = frame.event == "stdout";
                frames.push(frame);
                if terminal {
                    return Ok((frames, resumed_at));
                }
                if cut && stdout {
                    // Drop this connection mid-stream (the step is still printing).
                    cut = false;
                    break 'read;
                }
            }
        }
    }
}

/// The whole closed log, replayed from seq 0.
async fn replay(http: &reqwest::Client, base: &str, host_id: &str) -> Result<Vec<Frame>, String> {
    let resp = http
        .get(format!("{base}/v1/sandboxes/{host_id}/events?since=0"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .map_err(|e| format!("replay: {e}"))?;
    let body = resp
        .bytes()
        .await
        .map_err(|e| format!("replay body: {e}"))?;
    SseParser::new()
        .push(&body)
        .into_iter()
        .map(frame_of)
        .collect()
}

async fn host_info(http: &reqwest::Client, base: &str, host_id: &str) -> Result<Value, String> {
    let resp = http
        .get(format!("{base}/v1/sandboxes/{host_id}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .map_err(|e| format!("info: {e}"))?;
    resp.json().await.map_err(|e| format!("info body: {e}"))
}

#[derive(Debug)]
enum StepError {
    /// The server cannot run steps here (native runtime unusable).
    Unavailable(String),
    Failed(String),
}

fn fail(what: &str) -> impl Fn(RuntimeError) -> StepError + '_ {
    move |e| match e {
        RuntimeError::Unavailable { .. } if what == "create" => {
            StepError::Unavailable(e.to_string())
        }
        other => StepError::Failed(format!("{what}: {other}")),
    }
}

struct Client {
    index: usize,
    runtime: RemoteRuntime,
    http: reqwest::Client,
    base: String,
    project: tempfile::TempDir,
}

impl Client {
    fn new(index: usize, base: &str) -> Client {
        Client {
            index,
            runtime: RemoteRuntime::new(RemoteOptions::new(base, TOKEN)).expect("client"),
            http: reqwest::Client::new(),
            base: base.to_string(),
            project: project(index),
        }
    }

    async fn step(&self, phase: &str, step: usize) -> Result<StepRecord, StepError> {
        let token = format!("tok-{phase}-c{}-s{step}-{}", self.index, std::process::id());
        let mode = match step % 5 {
            0 if self.index % 2 == 0 => Follow::ResumeSince,
            0 => Follow::ResumeLastEventId,
            _ => Follow::Straight,
        };
        let started = Instant::now();
        let config = SandboxConfig {
            run_id: format!("load-{phase}-c{}", self.index),
            sandbox_id: format!("step-{step}"),
            runtime: RuntimeKind::Codeplane,
            root_dir: self.project.path().to_path_buf(),
            image: None,
            controls: controls(step),
            workspace_layers: Vec::new(),
        };
        let rt = &self.runtime;
        let handle = rt.create(&config).await.map_err(fail("create"))?;
        let host_id = handle.workspace_id.clone().expect("host id in the handle");
        // The raw follower reads from seq 0 while the step goes on.
        let follower = {
            let http = self.http.clone();
            let base = self.base.clone();
            let id = host_id.clone();
            tokio::spawn(async move { follow(&http, &base, &id, mode).await })
        };
        let request = RequestBundle {
            request: json!({"status": "pending", "sandboxId": config.sandbox_id,
                            "runtime": "codeplane", "input": {"token": token}}),
        };
        rt.ship(&handle, &request).await.map_err(fail("ship"))?;
        let sink = Lines::default();
        let outcome = rt
            .execute(
                &handle,
                &step_command(&token),
                CancellationToken::new(),
                &sink,
            )
            .await
            .map_err(fail("execute"))?;
        if !outcome.succeeded() {
            return Err(StepError::Failed(format!("{token}: {outcome:?}")));
        }
        let report = rt.collect(&handle).await.map_err(fail("collect"))?;
        let (frames, resumed_at) = follower
            .await
            .map_err(|e| StepError::Failed(format!("follower task: {e}")))?
            .map_err(StepError::Failed)?;
        let replayed = replay(&self.http, &self.base, &host_id)
            .await
            .map_err(StepError::Failed)?;
        let info = host_info(&self.http, &self.base, &host_id)
            .await
            .map_err(StepError::Failed)?;
        let bundle = smithers_bundle::validate_bundle(&report.bundle_path)
            .map_err(|e| StepError::Failed(format!("{token}: invalid bundle: {e}")))?;
        let manifest = serde_json::to_value(&bundle.manifest).unwrap_or(Value::Null);
        let mut patched_tokens = Vec::new();
        for rel in &bundle.patch_files {
            let text = std::fs::read_to_string(report.bundle_path.join(rel)).unwrap_or_default();
            for line in text.lines() {
                if let Some(added) = line.strip_prefix('+') {
                    if added.starts_with("tok-") {
                        patched_tokens.push(added.to_string());
                    }
                }
            }
        }
        rt.cleanup(&handle).await.map_err(fail("cleanup"))?;
        let latency = started.elapsed();
        // After cleanup the host forgets the sandbox.
        let gone = self
            .http
            .get(format!("{}/v1/sandboxes/{host_id}", self.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .map_err(|e| StepError::Failed(e.to_string()))?;
        if gone.status() != reqwest::StatusCode::NOT_FOUND {
            return Err(StepError::Failed(format!(
                "{host_id} still known after cleanup: HTTP {}",
                gone.status()
            )));
        }
        let stdout = sink.0.lock().unwrap().clone();
        Ok(StepRecord {
            client: self.index,
            token,
            latency,
            frames,
            replay: replayed,
            host_last_seq: info["lastSeq"].as_u64(),
            follow: mode,
            resumed_at,
            stdout,
            result_token: outcome
                .result
                .as_ref()
                .and_then(|r| r["outputs"]["token"].as_str())
                .map(str::to_string),
            manifest_token: manifest["outputs"]["token"].as_str().map(str::to_string),
            patched_tokens,
            patch_files: bundle.patch_files.len(),
        })
    }
}

/// Runs `steps` steps on each client, all clients at once; the records in completion order.
async fn phase(
    clients: &[Arc<Client>],
    name: &'static str,
    steps: std::ops::Range<usize>,
) -> Result<Vec<StepRecord>, StepError> {
    let mut tasks = Vec::new();
    for c in clients {
        let c = c.clone();
        let steps = steps.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for s in steps {
                out.push(c.step(name, s).await?);
            }
            Ok::<_, StepError>(out)
        }));
    }
    let mut all = Vec::new();
    let mut first_error = None;
    for t in tasks {
        match t.await {
            Ok(Ok(records)) => all.extend(records),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(StepError::Failed(format!("client task: {e}")));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(all),
    }
}

// ---------------------------------------------------------------------------------------------
// The server process, from /proc

#[derive(Debug, Clone, Default)]
struct Snapshot {
    rss_bytes: u64,
    fds: usize,
    threads: u64,
    mounts: usize,
    children: usize,
}

fn status_field(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .map(|v| v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0))
        .unwrap_or(0)
}

fn count_dir(path: impl AsRef<Path>) -> usize {
    std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0)
}

/// Processes whose parent is `pid` (the sandboxes' inits, while they run).
/// The sandboxes' top processes (their inits): the server's children, and the children of
/// the native runtime's zygote, a long-lived child of the server that forks each sandbox's
/// init and is the server's own, not a sandbox's.
fn children(pid: u32) -> usize {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    // (pid, parent, is a zygote) of every process.
    let table: Vec<(u32, u32, bool)> = procs
        .flatten()
        .filter_map(|e| {
            let me = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid ...: comm may hold spaces, split after the ')'.
            let rest = stat.rsplit_once(')')?.1.to_string();
            let parent = rest.split_whitespace().nth(1)?.parse::<u32>().ok()?;
            let zygote = std::fs::read(e.path().join("cmdline"))
                .unwrap_or_default()
                .split(|b| *b == 0)
                .any(|arg| arg == b"--zygote");
            Some((me, parent, zygote))
        })
        .collect();
    let zygotes: Vec<u32> = table
        .iter()
        .filter(|(_, parent, zygote)| *parent == pid && *zygote)
        .map(|(me, _, _)| *me)
        .collect();
    table
        .iter()
        .filter(|(_, parent, zygote)| (*parent == pid && !zygote) || zygotes.contains(parent))
        .count()
}

/// The server's directories (its `$TMPDIR` and data dir): mounts below them are its own
/// sandboxes' (the size-capped tmpfs of a disk-limited upper layer). Other mounts of the host
/// namespace come and go with whatever else runs on this machine.
static SERVER_ROOTS: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();

/// Mount points below the server's directories, from the server's mount table.
fn server_mounts(pid: u32) -> usize {
    let roots = SERVER_ROOTS.get().map(Vec::as_slice).unwrap_or_default();
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|mount_point| roots.iter().any(|r| Path::new(mount_point).starts_with(r)))
        .count()
}

fn snapshot(pid: u32) -> Snapshot {
    Snapshot {
        rss_bytes: status_field(pid, "VmRSS:") * 1024,
        fds: count_dir(format!("/proc/{pid}/fd")),
        threads: status_field(pid, "Threads:"),
        mounts: server_mounts(pid),
        children: children(pid),
    }
}

/// Waits (bounded) until the server has closed the connections of clients that are gone and
/// reaped what it started, then takes the snapshot. Waiting is not what is checked: the
/// counts are.
async fn settled(pid: u32, fds_target: Option<usize>) -> Snapshot {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = snapshot(pid);
        let fds_ok = fds_target.is_none_or(|t| s.fds <= t + FD_SLACK);
        if (s.children == 0 && fds_ok) || Instant::now() > deadline {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Maxima sampled while the load runs.
#[derive(Debug, Clone, Default)]
struct Peak {
    fds: usize,
    children: usize,
    mounts: usize,
    threads: u64,
    cgroups: usize,
    state_dirs: usize,
}

/// The native runtime's per-sandbox directories under the server's `$TMPDIR` (layers:
/// `<TMPDIR>/smithers-sandbox-<uid>/<runId>/<sandboxId>`) and runtime directory (state:
/// `<XDG_RUNTIME_DIR>/smithers-sandbox/<runId>/<sandboxId>`).
fn state_dirs(server: &Server) -> Vec<PathBuf> {
    let mut found = state_dirs_below(server.tmp.path());
    found.extend(state_dirs_below(server.runtime.path()));
    found
}

fn state_dirs_below(tmp: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for root in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
        for run in std::fs::read_dir(root.path())
            .into_iter()
            .flatten()
            .flatten()
            // The prepared roots (`.root-*`), shared by sandboxes, stay.
            .filter(|run| !run.file_name().to_string_lossy().starts_with('.'))
        {
            for sb in std::fs::read_dir(run.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                found.push(sb.path());
            }
        }
    }
    found
}

/// The baseline: once the server has reaped every sandbox and closed the connections of the
/// clients just dropped (two equal readings in a row; bounded).
async fn steady(pid: u32) -> Snapshot {
    let mut last = settled(pid, None).await;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = settled(pid, None).await;
        if now.fds == last.fds && now.children == 0 {
            return now;
        }
        last = now;
    }
    last
}

/// `smithers-*` cgroup directories next to the sandboxes' (the native runtime creates them
/// under the cgroup of the server, which is the test's).
fn sandbox_cgroups() -> BTreeSet<PathBuf> {
    let host = smithers_runtime_native::cgroup::CgroupHost::detect();
    let parents: BTreeSet<PathBuf> = host.v1.values().cloned().chain(host.v2.clone()).collect();
    let mut found = BTreeSet::new();
    for parent in parents {
        if let Ok(entries) = std::fs::read_dir(&parent) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                // `smithers-docker` is the docker runtime's shared parent (dockerd makes it
                // for any docker sandbox, `doctor`'s probe included, and keeps it); a
                // sandbox's own cgroup is one of ours named after it.
                if name.starts_with("smithers-") && name != "smithers-docker" {
                    found.insert(e.path());
                }
            }
        }
    }
    found
}

/// Sum of a Prometheus series over its labels, filtered by a label substring.
fn metric(text: &str, name: &str, label_filter: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let series = key.split('{').next()?;
            (series == name && key.contains(label_filter)).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn start_server() -> Result<Server, String> {
    let server = start_server_with(Vec::new())?;
    // This server's directories are the ones whose mounts count (the first set wins: the
    // health test's server does not set them).
    let roots = [server.data.path(), server.tmp.path(), server.runtime.path()]
        .iter()
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()))
        .collect();
    let _ = SERVER_ROOTS.set(roots);
    Ok(server)
}

/// [`start_server`] with more environment for the server.
fn start_server_with(extra_env: Vec<(String, String)>) -> Result<Server, String> {
    let data = tempfile::tempdir().map_err(|e| e.to_string())?;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    // The native runtime keeps per-sandbox state in a tmpfs runtime directory and workspace
    // layers under $TMPDIR: both ours, to inspect. /dev/shm is the tmpfs at hand (a runtime
    // directory that is not a tmpfs is not used, and the state would land in TMPDIR).
    let runtime = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .map_err(|e| e.to_string())?;
    let child = ServeChild::start(&ServeOptions {
        token: TOKEN.into(),
        data_dir: data.path().to_path_buf(),
        args: Vec::new(),
        env: [
            ("TMPDIR".into(), tmp.path().display().to_string()),
            (
                "XDG_RUNTIME_DIR".into(),
                runtime.path().display().to_string(),
            ),
        ]
        .into_iter()
        .chain(extra_env)
        .collect(),
        wrapper: Vec::new(),
    })?;
    Ok(Server {
        child,
        data,
        tmp,
        runtime,
    })
}

/// The tests of this file one at a time: each reads host-wide state (sandbox cgroups) that
/// the other's server would change, and each loads the machine on its own.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn two_hundred_steps_from_twenty_clients() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = match start_server() {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    let outcome = rt.block_on(async {
        tokio::time::timeout(DEADLINE, run(&server))
            .await
            .unwrap_or_else(|_| Err(StepError::Failed(format!("not done within {DEADLINE:?}"))))
    });
    match outcome {
        Ok(()) => {}
        Err(StepError::Unavailable(reason)) => {
            skip_or_fail(&reason);
        }
        Err(StepError::Failed(msg)) => {
            panic!(
                "load test failed: {msg}\n--- server stderr ---\n{}",
                server.child.stderr()
            )
        }
    }
    let mut server = server;
    let status = server.child.stop();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "the server did not drain and exit cleanly: {}",
        server.child.stderr()
    );
}

async fn run(server: &Server) -> Result<(), StepError> {
    let pid = server.child.pid;
    let base = server.child.url();
    let http = reqwest::Client::new();
    let cgroups_before = sandbox_cgroups();

    // Warm-up: one step per client, through clients dropped afterwards (their connections
    // close), so the baseline holds what a server keeps after having served: allocator arenas,
    // the blocking pool, lazily built state.
    let warmup = {
        let clients: Vec<Arc<Client>> = (0..CLIENTS)
            .map(|i| Arc::new(Client::new(i, &base)))
            .collect();
        phase(&clients, "warmup", 0..1).await?
    };
    let baseline = steady(pid).await;

    let clients: Vec<Arc<Client>> = (0..CLIENTS)
        .map(|i| Arc::new(Client::new(i, &base)))
        .collect();
    // Samples what the server holds while the load runs: the leak checks below look at
    // things that really come and go (else they would check nothing).
    let peak = Arc::new(Mutex::new(Peak::default()));
    let sampling = CancellationToken::new();
    let sampler = {
        let (peak, stop, before) = (peak.clone(), sampling.clone(), cgroups_before.clone());
        let roots = [
            server.tmp.path().to_path_buf(),
            server.runtime.path().to_path_buf(),
        ];
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let s = snapshot(pid);
                let cgroups = sandbox_cgroups().difference(&before).count();
                let states: usize = roots.iter().map(|r| state_dirs_below(r).len()).sum();
                {
                    let mut p = peak.lock().unwrap();
                    p.fds = p.fds.max(s.fds);
                    p.children = p.children.max(s.children);
                    p.mounts = p.mounts.max(s.mounts);
                    p.threads = p.threads.max(s.threads);
                    p.cgroups = p.cgroups.max(cgroups);
                    p.state_dirs = p.state_dirs.max(states);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let started = Instant::now();
    // In two halves, to read the memory in between: growth that goes on with the number of
    // steps is a leak, a step up once the server is busy is not.
    let half = STEPS_PER_CLIENT / 2;
    let mut loaded = phase(&clients, "load", 0..half).await;
    let middle = snapshot(pid);
    if let Ok(first) = &mut loaded {
        match phase(&clients, "load", half..STEPS_PER_CLIENT).await {
            Ok(second) => first.extend(second),
            Err(e) => loaded = Err(e),
        }
    }
    let wall = started.elapsed();
    sampling.cancel();
    let _ = sampler.await;
    let records = loaded?;
    let peak_during = peak.lock().unwrap().clone();
    drop(clients);
    let after = settled(pid, Some(baseline.fds)).await;
    // A short idle: whatever the server releases lazily (idle blocking threads, buffers) may go.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = settled(pid, Some(baseline.fds)).await;
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .map_err(|e| StepError::Failed(format!("metrics: {e}")))?
        .text()
        .await
        .map_err(|e| StepError::Failed(format!("metrics body: {e}")))?;

    // ---- exactly once ----------------------------------------------------------------------
    let all: Vec<&StepRecord> = warmup.iter().chain(records.iter()).collect();
    let expected = CLIENTS * (1 + STEPS_PER_CLIENT);
    let mut problems: Vec<String> = Vec::new();
    if records.len() != CLIENTS * STEPS_PER_CLIENT || all.len() != expected {
        problems.push(format!(
            "{} load steps and {} in all came back, expected {} and {expected}",
            records.len(),
            all.len(),
            CLIENTS * STEPS_PER_CLIENT
        ));
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for r in &all {
        *seen.entry(r.token.as_str()).or_default() += 1;
    }
    let duplicated_tokens = seen.values().filter(|n| **n > 1).count();
    // Every token that appears anywhere (outputs, results, patches) must belong to its step.
    let mut lost = 0;
    let mut duplicated = duplicated_tokens;
    let mut gaps = 0;
    let mut dup_events = 0;
    let mut incomplete = 0;
    let mut resumed = 0;
    let mut by_client: BTreeMap<usize, usize> = BTreeMap::new();
    for r in &all {
        *by_client.entry(r.client).or_default() += 1;
        let t = r.token.as_str();
        let expected_lines: Vec<String> = (1..=LINES).map(|i| format!("line {i} {t}")).collect();
        if r.stdout != expected_lines {
            problems.push(format!("{t}: client output {:?}", r.stdout));
            if r.stdout.len() > LINES {
                duplicated += 1;
            } else {
                lost += 1;
            }
        }
        if r.result_token.as_deref() != Some(t) || r.manifest_token.as_deref() != Some(t) {
            problems.push(format!(
                "{t}: result {:?}, manifest {:?}",
                r.result_token, r.manifest_token
            ));
            lost += 1;
        }
        let own = r.patched_tokens.iter().filter(|p| *p == t).count();
        if own != TOKEN_PATCH_LINES || r.patched_tokens.len() != own || r.patch_files != 3 {
            problems.push(format!(
                "{t}: patch lines {:?} in {} patch files",
                r.patched_tokens, r.patch_files
            ));
            if own > TOKEN_PATCH_LINES {
                duplicated += 1;
            } else {
                lost += 1;
            }
        }
        // ---- events ----
        let mut next = 0u64;
        for f in &r.frames {
            match f.seq.cmp(&next) {
                std::cmp::Ordering::Equal => next += 1,
                std::cmp::Ordering::Less => dup_events += 1,
                std::cmp::Ordering::Greater => {
                    gaps += 1;
                    next = f.seq + 1;
                }
            }
        }
        let last = r.frames.last();
        if last.map(|f| f.event.as_str()) != Some("completed") {
            incomplete += 1;
            problems.push(format!("{t}: stream ended with {last:?}"));
        }
        if r.frames != r.replay {
            problems.push(format!(
                "{t}: live stream differs from the replay\nlive: {:?}\nreplay: {:?}",
                r.frames, r.replay
            ));
        }
        if last.map(|f| f.seq) != r.host_last_seq {
            problems.push(format!(
                "{t}: last seq {:?}, host says {:?}",
                last.map(|f| f.seq),
                r.host_last_seq
            ));
        }
        let live_lines: Vec<String> = r
            .frames
            .iter()
            .filter(|f| f.event == "stdout")
            .filter_map(|f| serde_json::from_str::<Value>(&f.data).ok())
            .filter_map(|v| v["line"].as_str().map(str::to_string))
            .collect();
        if live_lines != expected_lines {
            problems.push(format!("{t}: stdout events {live_lines:?}"));
        }
        if r.follow != Follow::Straight {
            match r.resumed_at {
                Some(_) => resumed += 1,
                None => problems.push(format!("{t}: {:?} never resumed", r.follow)),
            }
        }
    }
    if by_client.values().any(|n| *n != 1 + STEPS_PER_CLIENT) {
        problems.push(format!("steps per client: {by_client:?}"));
    }
    if gaps + dup_events + incomplete > 0 {
        problems.push(format!(
            "events: {gaps} gaps, {dup_events} duplicates, {incomplete} streams without their terminal event"
        ));
    }
    // Server side: one execution, one creation, one `finished` per step, nothing else.
    let executions = metric(&text, "smithers_sandbox_duration_ms_count", "") as usize;
    let created = metric(&text, "smithers_sandbox_created_total", "") as usize;
    let finished = metric(
        &text,
        "smithers_sandbox_completed_total",
        "status=\"finished\"",
    ) as usize;
    let completed = metric(&text, "smithers_sandbox_completed_total", "") as usize;
    let active = metric(&text, "smithers_sandbox_active", "") as i64;
    let server_errors = metric(&text, "smithers_server_http_responses_total", "status=\"5");
    for (what, got) in [
        ("executions", executions),
        ("creations", created),
        ("finished", finished),
        ("terminal statuses", completed),
    ] {
        if got != expected {
            problems.push(format!("server counted {got} {what}, expected {expected}"));
        }
    }
    if active != 0 || server_errors != 0.0 {
        problems.push(format!(
            "server: {active} sandboxes still active, {server_errors} 5xx responses"
        ));
    }
    let listed: Vec<Value> = http
        .get(format!("{base}/v1/sandboxes"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .map_err(|e| StepError::Failed(e.to_string()))?
        .json()
        .await
        .map_err(|e| StepError::Failed(e.to_string()))?;
    if !listed.is_empty() {
        problems.push(format!("the server still lists {} sandboxes", listed.len()));
    }

    // ---- nothing leaked --------------------------------------------------------------------
    let sandbox_dirs = count_dir(server.data.path().join("sandboxes"));
    let state_left = state_dirs(server);
    // Another user's sandboxes on this machine may come and go under the same parent: wait
    // (bounded) for transient ones, and count only names that were not there before.
    let mut cgroups_left = Vec::new();
    for _ in 0..50 {
        cgroups_left = sandbox_cgroups()
            .difference(&cgroups_before)
            .cloned()
            .collect();
        if cgroups_left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if sandbox_dirs != 0 || !state_left.is_empty() || !cgroups_left.is_empty() {
        problems.push(format!(
            "leftovers: {sandbox_dirs} sandbox dirs in the data dir, state dirs {state_left:?}, \
             cgroups {cgroups_left:?} (a cgroup is attributed by appearing during this test \
             and staying: another user's sandbox leaking one at the same time would show here)"
        ));
    }
    // The checks saw sandboxes while they existed: each of these came and went.
    if peak_during.children == 0
        || peak_during.state_dirs == 0
        || peak_during.cgroups == 0
        || peak_during.mounts == 0
    {
        problems.push(format!(
            "the sampler never saw a running sandbox's process, state dir, cgroup and layer \
             mount: {peak_during:?} (baseline {baseline:?}): the leak checks would check nothing"
        ));
    }
    if idle.children != 0 || idle.mounts != 0 || baseline.mounts != 0 {
        problems.push(format!(
            "server after idle: {} child processes, {} sandbox mounts (after the warm-up: {})",
            idle.children, idle.mounts, baseline.mounts
        ));
    }
    if idle.fds > baseline.fds + FD_SLACK || after.fds > baseline.fds + FD_SLACK {
        problems.push(format!(
            "server fds: baseline {}, after {}, idle {}",
            baseline.fds, after.fds, idle.fds
        ));
    }
    let growth_after = after.rss_bytes.saturating_sub(baseline.rss_bytes);
    let growth_idle = idle.rss_bytes.saturating_sub(baseline.rss_bytes);
    if growth_after >= RSS_GROWTH_BOUND || growth_idle >= RSS_GROWTH_BOUND {
        problems.push(format!(
            "server RSS grew: baseline {}, after {}, idle {}",
            mib(baseline.rss_bytes),
            mib(after.rss_bytes),
            mib(idle.rss_bytes)
        ));
    }

    // ---- figures ---------------------------------------------------------------------------
    let mut latencies: Vec<Duration> = records.iter().map(|r| r.latency).collect();
    latencies.sort();
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    let steps = records.len();
    let rows =
        vec![
        ("steps (load phase; + warm-up)", format!("{steps} (+{})", warmup.len())),
        ("concurrent clients", CLIENTS.to_string()),
        ("wall time of the load phase", format!("{:.1} s", wall.as_secs_f64())),
        ("throughput", format!("{:.2} steps/s", steps as f64 / wall.as_secs_f64())),
        ("step latency p50 (create → cleanup)", ms(percentile(&latencies, 50.0))),
        ("step latency p95", ms(percentile(&latencies, 95.0))),
        ("step latency max", ms(percentile(&latencies, 100.0))),
        (
            "server executions / creations / finished (metrics)",
            format!("{executions} / {created} / {finished}"),
        ),
        ("lost steps", lost.to_string()),
        ("duplicated steps", duplicated.to_string()),
        (
            "event streams complete / gaps / duplicate events",
            format!("{} / {gaps} / {dup_events}", all.len() - incomplete),
        ),
        ("streams cut mid-step and resumed", resumed.to_string()),
        (
            "server RSS: after warm-up / half the load / all of it / idle",
            format!(
                "{} / {} / {} / {} (VmHWM {})",
                mib(baseline.rss_bytes),
                mib(middle.rss_bytes),
                mib(after.rss_bytes),
                mib(idle.rss_bytes),
                mib(status_field(pid, "VmHWM:") * 1024)
            ),
        ),
        (
            "server open fds: after warm-up / during / after / idle",
            format!(
                "{} / {} / {} / {}",
                baseline.fds, peak_during.fds, after.fds, idle.fds
            ),
        ),
        (
            "server threads: after warm-up / peak / after / idle",
            format!(
                "{} / {} / {} / {}",
                baseline.threads, peak_during.threads, after.threads, idle.threads
            ),
        ),
        (
            "sandboxes seen at once while loaded: processes / state dirs / cgroups / layer mounts",
            format!(
                "{} / {} / {} / {}",
                peak_during.children,
                peak_during.state_dirs,
                peak_during.cgroups,
                peak_during.mounts
            ),
        ),
        (
            "leftovers after cleanup: sandbox dirs / state dirs / cgroups / mounts / processes",
            format!(
                "{sandbox_dirs} / {} / {} / {} / {}",
                state_left.len(),
                cgroups_left.len(),
                idle.mounts,
                idle.children
            ),
        ),
    ];
    let mut table = String::from("| figure | value |\n|---|---|\n");
    for (k, v) in &rows {
        table.push_str(&format!("| {k} | {v} |\n"));
    }
    say(&format!("\nload test of smithers-sandbox serve:\n{table}"));
    if std::env::var("SMITHERS_LOAD_WRITE_RESULTS").is_ok_and(|v| v == "1") {
        write_results(&table);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(StepError::Failed(problems.join("\n")))
    }
}

/// Replaces (or adds) the issue 6 section of `bench/RESULTS.md`.
fn write_results(table: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/RESULTS.md");
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let heading = "## Issue 6: load test of the sandbox host";
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let when = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%MZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let section = format!(
        "{heading}\n\n\
         {CLIENTS} concurrent `codeplane` clients (each its own `RemoteRuntime` and project) run \
         {STEPS_PER_CLIENT} steps each against one `smithers-sandbox serve` child process on \
         127.0.0.1 (debug build, native runtime), after a warm-up of one step per client. A step \
         is the whole client path: create → ship (streamed zstd tar upload + request) → execute \
         (prints {LINES} lines, appends to two files, creates one, writes its result) → collect \
         (bundle download + validation) → cleanup; half of the steps carry memory/pids/disk \
         limits. A second, raw SSE follower reads every step's events from seq 0; one in five is \
         cut after the first output line and resumed. Memory and counts are read from \
         `/proc/<server pid>`; the load runs in two halves (all clients wait for each other in \
         between) to read the memory at half way. Machine: 2 cores, shared; load average at the \
         end {}. Measured {when}.\n\n\
         Command: `SMITHERS_LOAD_WRITE_RESULTS=1 cargo test -p smithers-cli --test load -- --nocapture`\n\n\
         {table}",
        load.join(" ")
    );
    let new = match old.find(heading) {
        Some(start) => {
            let rest = &old[start + heading.len()..];
            let end = rest
                .find("\n## ")
                .map(|i| start + heading.len() + i + 1)
                .unwrap_or(old.len());
            format!("{}{section}\n{}", &old[..start], &old[end..])
        }
        None => match old.find("\n## ") {
            Some(i) => format!("{}\n{section}{}", &old[..i + 1], &old[i..]),
            None => format!("{old}\n{section}"),
        },
    };
    let _ = std::fs::write(&path, new);
}

/// How long each stuck cleanup is held (in the server's blocking part of the native
/// runtime's cleanup).
const STALL: Duration = Duration::from_secs(12);
/// Sandboxes stuck in cleanup at once: as many as `serve` has async workers (2, see
/// `context::async_runtime`), so that a cleanup run on the workers (as before issue 13)
/// holds all of them and `/health` stalls for the whole stuck period; with one, the other
/// worker would still answer and this test would check nothing.
const STUCK: usize = 2;
/// Loose bound on each `/health` answer while cleanups are stuck: it takes milliseconds;
/// stalled, it took the whole stuck period.
const HEALTH_BOUND: Duration = Duration::from_secs(2);
/// Steps per client while the cleanups are stuck.
const STEPS_WHILE_STUCK: usize = 3;

#[test]
fn health_answers_while_cleanups_are_stuck() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stall = format!("stuck-:{}", STALL.as_millis());
    let server =
        match start_server_with(vec![("SMITHERS_SANDBOX_TEST_CLEANUP_STALL".into(), stall)]) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
    let outcome = rt.block_on(async {
        tokio::time::timeout(DEADLINE, health_while_stuck(&server))
            .await
            .unwrap_or_else(|_| Err(StepError::Failed(format!("not done within {DEADLINE:?}"))))
    });
    match outcome {
        Ok(()) => {}
        Err(StepError::Unavailable(reason)) => {
            skip_or_fail(&reason);
        }
        Err(StepError::Failed(msg)) => {
            panic!(
                "health test failed: {msg}\n--- server stderr ---\n{}",
                server.child.stderr()
            )
        }
    }
    let mut server = server;
    let status = server.child.stop();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "the server did not drain and exit cleanly: {}",
        server.child.stderr()
    );
}

/// A sandbox created on the host and then cleaned up, its cleanup held for [`STALL`] by the
/// server's stall hook (its id starts with `stuck-`). Returns how long the cleanup took.
async fn stuck_cleanup(base: String, index: usize) -> Result<Duration, StepError> {
    let runtime = RemoteRuntime::new(RemoteOptions::new(&base, TOKEN)).expect("client");
    let project = project(100 + index);
    let config = SandboxConfig {
        run_id: "health-stuck".into(),
        sandbox_id: format!("stuck-{index}"),
        runtime: RuntimeKind::Codeplane,
        root_dir: project.path().to_path_buf(),
        image: None,
        controls: controls(0),
        workspace_layers: Vec::new(),
    };
    let handle = runtime.create(&config).await.map_err(fail("create"))?;
    let started = Instant::now();
    runtime.cleanup(&handle).await.map_err(fail("cleanup"))?;
    Ok(started.elapsed())
}

async fn health_while_stuck(server: &Server) -> Result<(), StepError> {
    let base = server.child.url();
    let http = reqwest::Client::new();
    let clients: Vec<Arc<Client>> = (0..CLIENTS)
        .map(|i| Arc::new(Client::new(i, &base)))
        .collect();
    let stuck: Vec<_> = (0..STUCK)
        .map(|i| tokio::spawn(stuck_cleanup(base.clone(), i)))
        .collect();
    let steps = {
        let clients = clients.clone();
        tokio::spawn(async move { phase(&clients, "health", 0..STEPS_WHILE_STUCK).await })
    };
    // Polled until the stuck cleanups and the steps are all done; the samples taken while a
    // stuck cleanup is still going are the ones that count.
    let mut while_stuck: Vec<Duration> = Vec::new();
    let mut all: Vec<Duration> = Vec::new();
    let polling_started = Instant::now();
    loop {
        let stuck_now = stuck.iter().any(|t| !t.is_finished());
        if !stuck_now && steps.is_finished() {
            break;
        }
        let asked = Instant::now();
        let answer = http
            .get(format!("{base}/health"))
            .timeout(STALL * 2)
            .send()
            .await
            .map_err(|e| StepError::Failed(format!("/health: {e}")))?;
        let took = asked.elapsed();
        if answer.status() != reqwest::StatusCode::OK {
            return Err(StepError::Failed(format!(
                "/health answered HTTP {}",
                answer.status()
            )));
        }
        all.push(took);
        if stuck_now && stuck.iter().any(|t| !t.is_finished()) {
            while_stuck.push(took);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut cleanup_took = Vec::new();
    for t in stuck {
        cleanup_took.push(
            t.await
                .map_err(|e| StepError::Failed(format!("stuck cleanup task: {e}")))??,
        );
    }
    let records = steps
        .await
        .map_err(|e| StepError::Failed(format!("steps task: {e}")))??;
    let max = |v: &[Duration]| v.iter().max().copied().unwrap_or_default();
    say(&format!(
        "health while stuck: {} steps from {CLIENTS} clients and {STUCK} cleanups held {:?} \
         (took {:?}); /health polled {} times ({} while a cleanup was stuck): max latency \
         {:?} while stuck, {:?} overall, over {:?}",
        records.len(),
        STALL,
        cleanup_took,
        all.len(),
        while_stuck.len(),
        max(&while_stuck),
        max(&all),
        polling_started.elapsed()
    ));
    if records.len() != CLIENTS * STEPS_WHILE_STUCK {
        return Err(StepError::Failed(format!(
            "{} steps came back, {} were run",
            records.len(),
            CLIENTS * STEPS_WHILE_STUCK
        )));
    }
    // The hook really held the cleanups (else this would check nothing) ...
    if let Some(short) = cleanup_took.iter().find(|t| **t < STALL) {
        return Err(StepError::Failed(format!(
            "a stuck cleanup took only {short:?}: the stall hook did not hold it (a release build?)"
        )));
    }
    // ... /health was asked meanwhile (a stalled server answers once, at the end) ...
    if while_stuck.len() < 5 {
        return Err(StepError::Failed(format!(
            "/health was answered only {} times while cleanups were stuck for {STALL:?}",
            while_stuck.len()
        )));
    }
    // ... and answered promptly every time.
    if let Some(slow) = all.iter().find(|t| **t > HEALTH_BOUND) {
        return Err(StepError::Failed(format!(
            "/health took {slow:?} (bound {HEALTH_BOUND:?}) while cleanups were stuck"
        )));
    }
    // Nothing is left on the host.
    let listed: Vec<Value> = http
        .get(format!("{base}/v1/sandboxes"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .map_err(|e| StepError::Failed(e.to_string()))?
        .json()
        .await
        .map_err(|e| StepError::Failed(e.to_string()))?;
    if !listed.is_empty() {
        return Err(StepError::Failed(format!(
            "the server still lists {} sandboxes",
            listed.len()
        )));
    }
    Ok(())
}
