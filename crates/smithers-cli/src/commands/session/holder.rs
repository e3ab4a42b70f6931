//! The holder: the detached process that owns a session's sandbox (its init's control
//! socket and exec channel are this process's) and serves the session's socket until the
//! session ends: stopped, idle past its timeout, past its time bound, or SIGTERM. The session
//! runs as one step of the orchestrator's ([`super::runtime::SessionRuntime`]), so its rows,
//! events, bundle and review are a run's; each command is a `SessionExec` event besides.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{json, Value};
use smithers_orchestrator::{Orchestrator, SandboxOutcome, SandboxRequest, StepContext};
use smithers_runtime::{
    CancellationToken, Engine, ExecExit, ExecRequest, OutputSink, Runtime, StepStdin,
};

use super::fd_sink::FdSink;
use super::runtime::{SessionRuntime, Started};
use super::wire::{self, error_json, Request, SessionInfo};
use super::StartArgs;
use crate::commands::{backend, context, run};
use crate::output::Coded;

/// What every connection's thread shares.
pub(super) struct Holder {
    started: Started,
    info: Mutex<SessionInfo>,
    orchestrator: Arc<Orchestrator>,
    rt: tokio::runtime::Handle,
    /// When a request last came or a command last ended.
    last_activity: Mutex<Instant>,
    running: AtomicU64,
    /// Connections waiting for the session's outcome (`session stop`).
    stoppers: Mutex<Vec<UnixStream>>,
    diffs: super::diff::Diffs,
    checkpoints: smithers_runtime::Checkpoints,
    /// Held by a diff, a checkpoint, a restore and a fork's checkpoint: a flip between a
    /// diff's pause and its read would let the sandbox's processes run under the read.
    still: Mutex<()>,
}

/// `session __hold`: the holder's whole life. Its stdout and stderr are the session's log.
pub fn hold(args: &StartArgs) -> anyhow::Result<ExitCode> {
    let run::Checked {
        controls,
        root,
        input,
    } = run::check_before_creating(&args.run)?;
    let (Some(run_id), Some(sandbox_id)) = (&args.run.run_id, &args.run.sandbox_id) else {
        anyhow::bail!("the holder is started with its ids");
    };
    let idle = super::parse_duration("--idle-timeout", &args.idle_timeout)?;
    let sessions = wire::sessions_dir(true)?;
    let socket = sessions.join(format!("{sandbox_id}.sock"));
    let admitted = super::admission::admit(&sessions, sandbox_id)?;
    let owner = match args.owner_pid {
        Some(pid) => Some(
            OwnerProcess::of(pid)
                .ok_or_else(|| anyhow::anyhow!("the session's owner (pid {pid}) is not running"))?,
        ),
        None => None,
    };
    let native = Arc::new(backend::native_runtime_with(args.run.workspace.mode())?);
    let (to_holder, started) = tokio::sync::oneshot::channel();
    let (runtime, engine): (Arc<dyn Runtime>, Arc<dyn Engine>) = match args.run.runtime {
        backend::RuntimeChoice::Docker => {
            let docker = Arc::new(backend::docker_runtime());
            (docker.clone(), docker)
        }
        backend::RuntimeChoice::Bubblewrap => (native.clone(), native.clone()),
        // Held on a sandbox host (`serve`): this holder is its client for the session's life.
        backend::RuntimeChoice::Codeplane => {
            let remote = Arc::new(smithers_runtime_remote::RemoteRuntime::from_env().coded()?);
            (remote.clone(), remote)
        }
        // Held on a lease of a Ray fleet, for the session's life.
        backend::RuntimeChoice::Ray => {
            let ray = Arc::new(smithers_runtime_ray::RayRuntime::from_env().coded()?);
            (ray.clone(), ray)
        }
    };
    let layers = from_layers(args, engine.as_ref())?;
    let session_runtime = SessionRuntime {
        runtime,
        engine,
        started: Mutex::new(Some(to_holder)),
        layers,
    };
    let db_path = args.run.store.db_path()?;
    let orchestrator = Arc::new(
        backend::orchestrator_over(&db_path, native)?.with_runtime(Arc::new(session_runtime)),
    );
    let ctx = context::open_over(orchestrator.clone(), db_path, true)?;
    run::refuse_reused_ids(&ctx, &root, run_id, sandbox_id, args.run.replace)?;
    let mut req = run::step_request(&args.run, true, &root, run_id, sandbox_id, controls, input);
    req.config = session_config(&req, idle);

    let end = CancellationToken::new();
    let step_ctx = StepContext {
        heartbeat: None,
        cancel: end.clone(),
        output: None,
    };
    let lifecycle = {
        let (orchestrator, req) = (orchestrator.clone(), req.clone());
        ctx.rt()
            .spawn(async move { orchestrator.execute(&req, &step_ctx).await })
    };
    let rt = ctx.rt().handle().clone();
    let Ok(started) = rt.block_on(started) else {
        // The lifecycle ended before the sandbox was up: its error is the answer.
        let result = rt.block_on(lifecycle).context("the session's lifecycle")?;
        let doc = outcome_json(&req, result);
        eprintln!("{doc}");
        return Ok(ExitCode::from(1));
    };
    let info = SessionInfo {
        session_id: sandbox_id.clone(),
        run_id: run_id.clone(),
        root_dir: root.clone(),
        runtime: args.run.runtime.kind().as_str().to_string(),
        pid: std::process::id(),
        started_ms: crate::commands::run_row::now_ms(),
        execs: 0,
        running: 0,
        idle_timeout_ms: idle.as_millis() as u64,
    };
    let holder = Arc::new(Holder {
        started,
        info: Mutex::new(info),
        orchestrator,
        rt: rt.clone(),
        last_activity: Mutex::new(Instant::now()),
        running: AtomicU64::new(0),
        stoppers: Mutex::new(Vec::new()),
        diffs: Default::default(),
        checkpoints: Default::default(),
        still: Mutex::new(()),
    });
    let listener = bind(&socket)?;
    drop(admitted);
    spawn_acceptor(listener, holder.clone());
    let bound = life_bound(&req);
    rt.spawn(watch_idle(holder.clone(), idle, bound, owner));
    rt.spawn(on_sigterm(end.clone()));
    let result = rt.block_on(lifecycle).context("the session's lifecycle")?;
    let _ = std::fs::remove_file(&socket);
    if let Some(sessions) = socket.parent() {
        super::diff::remove_all(sessions, sandbox_id, &holder.diffs);
    }
    let doc = outcome_json(&req, result);
    for stopper in holder
        .stoppers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain(..)
    {
        let _ = wire::answer(&stopper, &doc);
    }
    // The log is what the holder said; a session that ended well has said it all in its
    // rows and events (a failure's log stays, for whoever looks into it).
    if doc["ok"] == json!(true) {
        let _ = std::fs::remove_file(socket.with_extension("log"));
    } else {
        println!("{doc}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The layers a fork starts from (`--from-layers`, given by `session fork`), refused for an
/// engine that cannot start a sandbox from them.
fn from_layers(args: &StartArgs, engine: &dyn Engine) -> anyhow::Result<Vec<String>> {
    let Some(list) = &args.from_layers else {
        return Ok(Vec::new());
    };
    if !engine.capabilities().fork {
        return Err(crate::output::coded_error(
            smithers_errors::ErrorCode::TaskRuntimeUnavailable,
            format!(
                "the {} engine cannot start a session from a checkpoint",
                engine.backend()
            ),
            Value::Null,
        ));
    }
    Ok(list
        .split(',')
        .filter(|id| !id.is_empty())
        .map(str::to_string)
        .collect())
}

/// The config recorded for the session: its controls, and that it is a session.
fn session_config(req: &SandboxRequest, idle: Duration) -> Value {
    let mut config = serde_json::to_value(&req.controls).unwrap_or_else(|_| json!({}));
    config["session"] = json!({ "idleTimeoutMs": idle.as_millis() as u64 });
    config
}

/// The session's time bound: `--timeout`, if given.
fn life_bound(req: &SandboxRequest) -> Option<Duration> {
    req.controls.timeout_ms.map(Duration::from_millis)
}

/// The socket, bound where no live session's is: a leftover of a holder that died is
/// replaced, a live one refused.
fn bind(socket: &Path) -> anyhow::Result<UnixListener> {
    if socket.exists() {
        if UnixStream::connect(socket).is_ok() {
            anyhow::bail!("a session is already held at {}", socket.display());
        }
        std::fs::remove_file(socket)
            .with_context(|| format!("removing the stale {}", socket.display()))?;
    }
    UnixListener::bind(socket).with_context(|| format!("binding {}", socket.display()))
}

/// Connections served at once (each a thread; a command runs for as long as it runs): the
/// init's own bound on a sandbox's commands at once.
const MAX_CONNECTIONS: u64 = 1024;
/// How long a client has to send its request once connected.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

fn spawn_acceptor(listener: UnixListener, holder: Arc<Holder>) {
    let open = Arc::new(AtomicU64::new(0));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            if open.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                let message = format!("the session serves {MAX_CONNECTIONS} requests at once");
                let _ = wire::answer(&conn, &error_json("INVALID_INPUT", &message, json!({})));
                continue;
            }
            open.fetch_add(1, Ordering::SeqCst);
            let (holder, open) = (holder.clone(), open.clone());
            std::thread::spawn(move || {
                serve(&holder, conn);
                open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
}

/// A process that owns the session (`--owner-pid`): known by its pid and its start time, so
/// that another process given the same pid later is not taken for it.
struct OwnerProcess {
    pid: u32,
    started: String,
}

impl OwnerProcess {
    fn of(pid: u32) -> Option<OwnerProcess> {
        Some(OwnerProcess {
            pid,
            started: start_time(pid)?,
        })
    }

    fn alive(&self) -> bool {
        start_time(self.pid).is_some_and(|t| t == self.started)
    }
}

/// Field 22 of `/proc/<pid>/stat` (after the command's closing parenthesis, which may hold
/// any byte), a zombie's included (then it is gone).
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|b| *b == b')')?;
    let rest = String::from_utf8_lossy(&stat[close + 1..]).into_owned();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is the state (field 3); the start time is field 22.
    match fields.first() {
        Some(&"Z") | Some(&"X") => None,
        _ => fields.get(19).map(|s| s.to_string()),
    }
}

/// Ends the session once no command has run for `idle`, at its time bound, or once its owner
/// process is gone.
async fn watch_idle(
    holder: Arc<Holder>,
    idle: Duration,
    bound: Option<Duration>,
    owner: Option<OwnerProcess>,
) {
    let began = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let quiet_for = holder
            .last_activity
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed();
        let idle_over = holder.running.load(Ordering::SeqCst) == 0 && quiet_for >= idle;
        let orphaned = owner.as_ref().is_some_and(|o| !o.alive());
        if idle_over || orphaned || bound.is_some_and(|b| began.elapsed() >= b) {
            holder.started.done.cancel();
            return;
        }
    }
}

async fn on_sigterm(end: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    if let Ok(mut term) = signal(SignalKind::terminate()) {
        term.recv().await;
        end.cancel();
    }
}

impl Holder {
    fn checkpoint_ctx(&self) -> super::checkpoints::Ctx<'_> {
        super::checkpoints::Ctx {
            started: &self.started,
            rt: &self.rt,
            checkpoints: &self.checkpoints,
            record: Box::new(move |event: &str, payload| self.record(event, payload)),
        }
    }

    /// Records an event of the session (its commands', checkpoints').
    fn record(&self, event: &str, payload: Value) {
        let info = self.info.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let key = match event {
            "SessionExec" => "command",
            _ => "session",
        };
        let _ = self.orchestrator.record_event(
            event,
            &info.run_id,
            &info.session_id,
            vec![(key, payload)],
        );
    }

    fn touch(&self) {
        *self.last_activity.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }
}

/// One connection: its request, answered.
fn serve(holder: &Holder, conn: UnixStream) {
    // A client that connects and says nothing holds no thread for long.
    let _ = conn.set_read_timeout(Some(REQUEST_DEADLINE));
    let received = wire::receive(&conn);
    let _ = conn.set_read_timeout(None);
    let (request, fds) = match received {
        Ok(r) => r,
        Err(message) => {
            let _ = wire::answer(&conn, &error_json("INVALID_INPUT", &message, json!({})));
            return;
        }
    };
    // Looking at a session (`session ls`) is not using it: only commands keep it from idling.
    if !matches!(request, Request::Ping) {
        holder.touch();
    }
    let answer = match request {
        Request::Ping => {
            let mut info = holder
                .info
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            info.running = holder.running.load(Ordering::SeqCst);
            json!({ "ok": true, "session": info })
        }
        Request::Stop => {
            holder
                .stoppers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(conn);
            holder.started.done.cancel();
            return;
        }
        Request::Exec {
            argv,
            cwd,
            env,
            timeout_ms,
            stdin,
            terminal,
        } => {
            let request = ExecRequest {
                argv,
                cwd,
                env,
                stdin: StepStdin::default(),
                timeout: timeout_ms.map(Duration::from_millis),
                ..ExecRequest::default()
            };
            match terminal {
                Some(size) => super::terminal::exec_answer(holder, &conn, request, fds, size),
                None => exec_answer(holder, &conn, request, fds, stdin),
            }
        }
        Request::Diff => {
            let info = holder
                .info
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let _still = holder.still.lock().unwrap_or_else(|p| p.into_inner());
            super::diff::diff(&holder.started, &holder.rt, &info, &holder.diffs)
        }
        Request::Checkpoint => {
            let _still = holder.still.lock().unwrap_or_else(|p| p.into_inner());
            super::checkpoints::checkpoint(&holder.checkpoint_ctx())
        }
        Request::Restore { checkpoint } => {
            let _still = holder.still.lock().unwrap_or_else(|p| p.into_inner());
            super::checkpoints::restore(&holder.checkpoint_ctx(), &checkpoint)
        }
        Request::Fork { checkpoint } => {
            let _still = holder.still.lock().unwrap_or_else(|p| p.into_inner());
            super::checkpoints::fork(&holder.checkpoint_ctx(), checkpoint.as_deref())
        }
        Request::Read { path } => {
            let cancel = holder.started.done.child_token();
            let run = |request, sink: &dyn OutputSink| {
                run_exec(holder, &conn, request, sink, cancel.clone())
            };
            super::files::read(&run, cancel.clone(), &path, fds)
        }
        Request::Write { path } => {
            let cancel = holder.started.done.child_token();
            let run = |request, sink: &dyn OutputSink| {
                run_exec(holder, &conn, request, sink, cancel.clone())
            };
            super::files::write(&run, cancel.clone(), &path, fds)
        }
    };
    let _ = wire::answer(&conn, &answer);
    let _ = conn.shutdown(std::net::Shutdown::Both);
}

fn exec_answer(
    holder: &Holder,
    conn: &UnixStream,
    mut request: ExecRequest,
    fds: Vec<OwnedFd>,
    with_stdin: bool,
) -> Value {
    let mut fds = fds.into_iter();
    if with_stdin {
        match fds.next() {
            Some(fd) => request.stdin = StepStdin::from_reader(File::from(fd)),
            None => {
                return error_json("INVALID_INPUT", "no stdin came with the request", json!({}))
            }
        }
    }
    let (Some(out), Some(err)) = (fds.next(), fds.next()) else {
        return error_json(
            "INVALID_INPUT",
            "an exec needs its stdout and stderr",
            json!({}),
        );
    };
    let cancel = holder.started.done.child_token();
    let sink = FdSink::new(File::from(out), File::from(err), cancel.clone());
    let ran = run_exec(holder, conn, request, &sink, cancel);
    // Every byte written before the answer: the client's next output comes after it.
    sink.finish();
    match ran {
        Ok(exit) => json!({ "ok": true, "exit": exit }),
        Err(message) => error_json("SANDBOX_EXECUTION_FAILED", &message, json!({})),
    }
}

impl Holder {
    /// A command's cancellation: fired at its end, or with the session's.
    pub(super) fn exec_token(&self) -> CancellationToken {
        self.started.done.child_token()
    }
}

pub(super) fn run_exec(
    holder: &Holder,
    conn: &UnixStream,
    request: ExecRequest,
    sink: &dyn OutputSink,
    cancel: CancellationToken,
) -> Result<ExecExit, String> {
    watch_hangup(conn, cancel.clone());
    let argv = request.argv.clone();
    let cwd = request.cwd.clone();
    holder.running.fetch_add(1, Ordering::SeqCst);
    let started = &holder.started;
    let result = holder.rt.block_on(started.engine.exec(
        &started.handle,
        request,
        cancel.clone(),
        sink,
    ));
    holder.running.fetch_sub(1, Ordering::SeqCst);
    holder.touch();
    cancel.cancel();
    holder.info.lock().unwrap_or_else(|p| p.into_inner()).execs += 1;
    let recorded = match &result {
        Ok(exit) => json!({ "argv": argv, "cwd": cwd, "exit": exit }),
        Err(e) => json!({ "argv": argv, "cwd": cwd, "error": e.to_string() }),
    };
    holder.record("SessionExec", recorded);
    result.map_err(|e| e.to_string())
}

/// Cancels `cancel` when the client's end of `conn` closes before it is answered (the
/// client was interrupted or died): the command is killed rather than left running for
/// nobody. Ends once `cancel` is (the answer shuts the socket down, which wakes the read).
fn watch_hangup(conn: &UnixStream, cancel: CancellationToken) {
    let Ok(mut watched) = conn.try_clone() else {
        return;
    };
    std::thread::spawn(move || {
        use std::io::Read;
        let mut byte = [0u8; 1];
        while !cancel.is_cancelled() {
            match watched.read(&mut byte) {
                Ok(0) | Err(_) => break,
                Ok(_) => continue,
            }
        }
        cancel.cancel();
    });
}

/// What the session's end is, for `session stop` and the log: the step's outcome as the
/// orchestrator recorded it.
fn outcome_json(
    req: &SandboxRequest,
    result: Result<SandboxOutcome, smithers_orchestrator::OrchestratorError>,
) -> Value {
    let base = json!({ "ok": true, "sessionId": req.sandbox_id, "runId": req.run_id, "rootDir": req.root_dir });
    let mut doc = base;
    match result {
        Err(e) => {
            return error_json(
                "SANDBOX_EXECUTION_FAILED",
                &e.to_string(),
                json!({ "sessionId": req.sandbox_id, "runId": req.run_id }),
            )
        }
        Ok(SandboxOutcome::Cancelled { bundle_path }) => {
            doc["status"] = json!("cancelled");
            doc["bundlePath"] = json!(bundle_path);
        }
        Ok(SandboxOutcome::Completed(done)) => {
            doc["status"] = json!(done.status);
            doc["bundlePath"] = json!(done.bundle_path);
            doc["patchesApplied"] = json!(done.applied_patches);
        }
        Ok(SandboxOutcome::AwaitingReview(pending)) => {
            doc["status"] = json!("review");
            doc["bundlePath"] = json!(pending.bundle_path);
            doc["patchCount"] = json!(pending.patch_count);
            doc["totalDiffLines"] = json!(pending.total_diff_lines);
        }
    }
    doc
}

/// The socket of session `id` (checked to be a plain name: it becomes a path).
pub fn socket_of(id: &str) -> anyhow::Result<PathBuf> {
    use crate::output::Coded;
    smithers_runtime::config::validate_id("sessionId", id).coded()?;
    Ok(wire::sessions_dir(false)
        .context("the sessions directory")?
        .join(format!("{id}.sock")))
}
