//! `smithers-sandbox daemon`: the resident service of one user.
//!
//! It keeps each project it has served open (its store, async runtime and native runtime)
//! with a warm pool that prepares the next step's sandbox, and arms it once a configuration
//! repeats (`crate::commands::context::ContextCache`). `run` hands it its command line, its
//! environment and its stdio ([`smithers_resident`]) and waits; a request it cannot serve as
//! the client would have run it (another user, namespace, build or environment; busy with
//! another step) is declined, and `run` runs the step itself. `SMITHERS_RESIDENT=off` never
//! uses it; `=require` fails with the reason when it does not serve.
//!
//! Nothing about a step differs when it is served: the same code runs it, with the client's
//! stdio, working directory and umask, and the same environment, user, groups, capabilities
//! and (no) confinement (a client also proves it may inspect the service, which a Landlock
//! domain of its own forbids: `smithers_resident::peer::Challenge`). What does differ: the
//! step's sandbox is made in the service's cgroup and with its resource limits (rlimits),
//! nice value and CPU affinity, not the shell's (a restriction attached to the client's
//! cgroup does not hold for it); the answer comes before the sandbox's cleanup ends; Ctrl-Z
//! stops the client only. `doctor` describes the user who runs it, and so holds for both.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use smithers_errors::ErrorCode;
use smithers_resident::peer::Identity;
use smithers_resident::place::Place;
use smithers_resident::server::{BindError, Incoming, Listener, Session};
use smithers_resident::wire::{self, Ask, Frame};

use super::context::ContextCache;
use crate::output::{coded_error, inert, say};

/// Arguments of `daemon`.
#[derive(Debug, Args)]
pub struct DaemonArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Start the service in the background (it ends by itself after --idle without a step).
    Start(ServeOptions),
    /// Run the service in the foreground (under a service manager, or to watch it).
    Serve(ServeOptions),
    /// Stop the service (its prepared sandboxes are removed).
    Stop,
    /// Whether the service runs, and what it holds.
    Status,
}

#[derive(Debug, Args, Clone)]
struct ServeOptions {
    /// End after this long without a request: 30s, 15m, 2h; 0 never ends.
    #[arg(long, value_name = "DURATION", default_value = "15m")]
    idle: String,
    /// Sandboxes each project keeps prepared for its next step.
    #[arg(long, value_name = "N", default_value_t = 1)]
    warm: usize,
}

/// The exit status of a step whose serving panicked (as Rust's own for a panic).
const PANICKED: u8 = 101;

/// The service's answer to a command line that does not parse as a `run` (a usage error,
/// `run --help`): the client parses it itself, which says what clap has to say.
pub const NOT_A_RUN: &str = "not a `run` command line";

fn invalid(message: String) -> anyhow::Error {
    coded_error(ErrorCode::InvalidInput, message, Value::Null)
}

/// How the service reads a client's command line as a `run` (`None` for any other): the
/// binary's own parser, handed in by the top level that defines the command tree.
pub type ParseRun = fn(&[std::ffi::OsString]) -> Option<(super::run::RunArgs, bool)>;

/// Runs `daemon`.
pub fn run(args: &DaemonArgs, json_out: bool, parse_run: ParseRun) -> anyhow::Result<ExitCode> {
    match &args.action {
        Action::Start(options) => start(options, json_out),
        Action::Serve(options) => serve(options, parse_run),
        Action::Stop => stop(json_out),
        Action::Status => status(json_out),
    }
}

fn idle_limit(options: &ServeOptions) -> anyhow::Result<Option<Duration>> {
    if options.idle.trim() == "0" {
        return Ok(None);
    }
    super::flags::parse_duration_ms(&options.idle)
        .map(|ms| Some(Duration::from_millis(ms)))
        .ok_or_else(|| {
            invalid(format!(
                "--idle {:?} is not a duration (30s, 15m, 2h, 0)",
                options.idle
            ))
        })
}

/// Asks the running service for `kind` (`status`, `stop`); `None` when none answers.
fn ask(place: &Place, kind: &str) -> Option<Value> {
    let sock = std::os::unix::net::UnixStream::connect(&place.socket).ok()?;
    // Only a service of ours is asked (as `run`'s client checks it).
    let me = Identity::of_self().ok()?;
    let service = Identity::of_peer(&sock).ok()?;
    if me.differences(&service).is_some() {
        return None;
    }
    sock.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    Frame::control(&place.build, kind).send(&sock, &[]).ok()?;
    // A control request answers the service's challenge too: a client confined where the
    // service is not (see `smithers_resident::peer::Challenge`) may not stop it either.
    if smithers_resident::client::prove(&sock, service.pid)
        .ok()?
        .is_some()
    {
        return None;
    }
    let line = wire::read_line(&sock).ok()??;
    Some(match line.strip_prefix("status ") {
        Some(doc) => serde_json::from_str(doc).unwrap_or(Value::Null),
        None => json!(line),
    })
}

fn start(options: &ServeOptions, json_out: bool) -> anyhow::Result<ExitCode> {
    idle_limit(options)?;
    let place = Place::of_this_build(true).context("the service's directory")?;
    if let Some(doc) = ask(&place, "status") {
        if json_out {
            println!("{}", json!({ "started": false, "status": doc }));
        } else {
            say!(
                "the resident service is already running (pid {})",
                doc["pid"]
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&place.log)
        .with_context(|| format!("opening {}", place.log.display()))?;
    let exe = std::env::current_exe().context("locating the current executable")?;
    let mut command = std::process::Command::new(exe);
    command
        .args(["daemon", "serve", "--idle", &options.idle, "--warm"])
        .arg(options.warm.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    smithers_resident::detach(&mut command);
    let mut child = command.spawn().context("starting the service")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(doc) = ask(&place, "status") {
            if json_out {
                println!("{}", json!({ "started": true, "status": doc }));
            } else {
                say!(
                    "resident service started (pid {}); `run` uses it from shells with this environment\n  socket {}\n  log    {}",
                    doc["pid"],
                    inert(&place.socket.display().to_string()),
                    inert(&place.log.display().to_string())
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(anyhow::anyhow!(
                "the service exited at once ({status}); see {}",
                place.log.display()
            ));
        }
        if Instant::now() > deadline {
            return Err(anyhow::anyhow!(
                "the service did not answer within 10 s; see {}",
                place.log.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn stop(json_out: bool) -> anyhow::Result<ExitCode> {
    // No directory (or not a private one of ours): no service of ours can be behind it.
    let place = Place::of_this_build(false).ok();
    let pid = place
        .as_ref()
        .and_then(|p| ask(p, "status"))
        .and_then(|doc| doc["pid"].as_u64());
    let stopped = place.as_ref().is_some_and(|p| ask(p, "stop").is_some());
    if let (true, Some(pid)) = (stopped, pid) {
        // It answers, then finishes the step it serves and closes its projects: wait for
        // the process to end (a new service could otherwise start beside it).
        let deadline = Instant::now() + Duration::from_secs(60);
        while running(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    if json_out {
        println!("{}", json!({ "stopped": stopped }));
    } else if stopped {
        say!("resident service stopped");
    } else {
        say!("no resident service of this build is running");
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether process `pid` still runs (a zombie waiting for its parent does not).
fn running(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rfind(')')
            .and_then(|at| stat[at + 1..].split_whitespace().next());
        !matches!(state, Some("Z") | Some("X") | None)
    })
}

fn status(json_out: bool) -> anyhow::Result<ExitCode> {
    let place = Place::of_this_build(false).ok();
    let doc = place.as_ref().and_then(|p| ask(p, "status"));
    if json_out {
        println!("{}", json!({ "running": doc.is_some(), "status": doc }));
    } else {
        match &doc {
            None => say!(
                "no resident service of this build is running (`smithers-sandbox daemon start`)"
            ),
            Some(doc) => {
                say!(
                    "running  pid {}, for {} s",
                    doc["pid"],
                    doc["uptimeSeconds"]
                );
                say!(
                    "served   {} step(s), declined {}",
                    doc["served"],
                    doc["declined"]
                );
                if let Some(why) = doc["lastDeclined"].as_str() {
                    say!("         last declined: {}", inert(why));
                }
                for p in doc["projects"].as_array().into_iter().flatten() {
                    say!(
                        "project  {} (warm: {} ready, {} armed)",
                        inert(p["db"].as_str().unwrap_or("")),
                        p["warm"]["ready"],
                        p["warm"]["armed"]
                    );
                }
            }
        }
    }
    Ok(if doc.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::output::EXIT_REJECTED)
    })
}

/// What the service has done, for `status`.
#[derive(Default)]
struct Counters {
    served: AtomicU64,
    declined: AtomicU64,
    last_declined: Mutex<Option<String>>,
}

impl Counters {
    fn declined(&self, why: &str) {
        self.declined.fetch_add(1, Ordering::Relaxed);
        *self.last_declined.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.to_string());
    }
}

/// The most connections handled at once.
const MAX_CONNECTIONS: usize = 64;

struct Service {
    /// Connections being handled now.
    connections: std::sync::atomic::AtomicUsize,
    /// The projects kept open; locked by the one request being served.
    projects: Mutex<ContextCache>,
    counters: Counters,
    started: Instant,
    last_request: Mutex<Instant>,
    stopping: AtomicBool,
    /// Reads a client's command line (see [`ParseRun`]).
    parse_run: ParseRun,
}

fn serve(options: &ServeOptions, parse_run: ParseRun) -> anyhow::Result<ExitCode> {
    let idle = idle_limit(options)?;
    let place = Place::of_this_build(true).context("the service's directory")?;
    let listener = match Listener::bind(&place) {
        Ok(l) => l,
        Err(BindError::AlreadyRunning) => {
            say!("a resident service of this build is already running");
            return Ok(ExitCode::from(crate::output::EXIT_REJECTED));
        }
        Err(BindError::Io(e)) => {
            return Err(
                anyhow::anyhow!(e).context(format!("listening on {}", place.socket.display()))
            )
        }
    };
    say!(
        "resident service {} listening on {}",
        std::process::id(),
        inert(&place.socket.display().to_string())
    );
    let service = Arc::new(Service {
        connections: Default::default(),
        projects: Mutex::new(ContextCache::new(options.warm)),
        counters: Counters::default(),
        started: Instant::now(),
        last_request: Mutex::new(Instant::now()),
        stopping: AtomicBool::new(false),
        parse_run,
    });
    let handlers = Handlers::new();
    handlers.add_spare(&service);
    loop {
        if service.stopping.load(Ordering::SeqCst) {
            break;
        }
        match listener.next(Duration::from_millis(500)) {
            Ok(Some(incoming)) => {
                *service
                    .last_request
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Instant::now();
                // A bounded number of connections at once (each may hold a request of up to
                // 4 MiB while it is read); one over it is closed, and its client runs its step
                // itself.
                if service.connections.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                    service.connections.fetch_sub(1, Ordering::SeqCst);
                    service.counters.declined("too many connections at once");
                    continue;
                }
                handlers.dispatch(incoming, &service);
            }
            Ok(None) => {
                let quiet_for = service
                    .last_request
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .elapsed();
                let busy = service.projects.try_lock().is_err();
                if idle.is_some_and(|limit| quiet_for > limit) && !busy {
                    say!("no request for {} s: exiting", quiet_for.as_secs());
                    service.stopping.store(true, Ordering::SeqCst);
                    break;
                }
            }
            // Out of descriptors, a connection reset before it was accepted...: the service
            // goes on (a step being served must not lose its service).
            Err(e) => {
                say!("accepting a client: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    // No new client from here; the step being served (if any) finishes first.
    drop(listener);
    service
        .projects
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
    Ok(ExitCode::SUCCESS)
}

/// The threads that handle connections, started ahead of them: a thread's start is not on
/// a served step's path (it was ~0.1 ms of it). Every connection is given to a thread that is
/// waiting for one, never queued behind a step; a thread is started when none waits. There
/// are never more than [`MAX_CONNECTIONS`] busy threads, and the ones started stay, waiting.
struct Handlers {
    give: std::sync::mpsc::Sender<Incoming>,
    take: Arc<Mutex<std::sync::mpsc::Receiver<Incoming>>>,
    /// Threads waiting for a connection that no connection has been given for yet.
    waiting: Arc<std::sync::atomic::AtomicUsize>,
}

impl Handlers {
    fn new() -> Handlers {
        let (give, take) = std::sync::mpsc::channel();
        Handlers {
            give,
            take: Arc::new(Mutex::new(take)),
            waiting: Default::default(),
        }
    }

    /// Gives the connection to a waiting thread (started now if none waits), then makes sure
    /// one waits for the next.
    fn dispatch(&self, incoming: Incoming, service: &Arc<Service>) {
        // A waiting thread is claimed before the connection is sent: each connection sent
        // has a thread of its own, whichever takes it.
        let claimed = self
            .waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if !claimed && !self.add(service, false) {
            service.connections.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        if self.give.send(incoming).is_err() {
            service.connections.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        if self.waiting.load(Ordering::SeqCst) == 0 {
            self.add_spare(service);
        }
    }

    fn add_spare(&self, service: &Arc<Service>) {
        self.add(service, true);
    }

    /// Starts a handler thread; `spare`: counted as waiting (else it is the one claimed for
    /// the connection about to be sent).
    fn add(&self, service: &Arc<Service>, spare: bool) -> bool {
        if spare {
            self.waiting.fetch_add(1, Ordering::SeqCst);
        }
        let (take, waiting, service) = (self.take.clone(), self.waiting.clone(), service.clone());
        let started = std::thread::Builder::new()
            .name("resident-request".into())
            .spawn(move || loop {
                let next = take.lock().unwrap_or_else(|p| p.into_inner()).recv();
                let Ok(incoming) = next else { return };
                handle(incoming, &service);
                // Waiting again before the connection is counted gone: a connection accepted
                // in between finds this thread instead of starting another.
                waiting.fetch_add(1, Ordering::SeqCst);
                service.connections.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = started {
            if spare {
                self.waiting.fetch_sub(1, Ordering::SeqCst);
            }
            say!("starting a request's thread: {e}");
            return false;
        }
        true
    }
}

fn handle(incoming: Incoming, service: &Service) {
    let (ask, connection) = match incoming.read() {
        Ok(x) => x,
        Err(why) => return service.counters.declined(&why),
    };
    match ask {
        Ask::Status => connection.answer(&format!("status {}", status_doc(service))),
        Ask::Stop => {
            service.stopping.store(true, Ordering::SeqCst);
            connection.answer("ok");
        }
        Ask::Run(request) => {
            if let Err(why) = connection.admit(&request) {
                service.counters.declined(&why);
                return connection.decline(&why);
            }
            let Some((args, json_out)) = (service.parse_run)(&request.argv) else {
                service.counters.declined(NOT_A_RUN);
                return connection.decline(NOT_A_RUN);
            };
            if args.tty || args.interactive || !args.secret.is_empty() {
                // The terminal and the environment (a secret's value) are the client's: its
                // own process runs such a step.
                let why = "a step with -t, -i or --secret runs in its caller's own process";
                service.counters.declined(why);
                return connection.decline(why);
            }
            let mut projects = match service.projects.try_lock() {
                Ok(p) => p,
                Err(std::sync::TryLockError::WouldBlock) => {
                    let why = "busy with another step";
                    service.counters.declined(why);
                    return connection.decline(why);
                }
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            };
            if service.stopping.load(Ordering::SeqCst) {
                return connection.decline("stopping");
            }
            let Ok(session) = connection.start(request) else {
                return;
            };
            service.counters.served.fetch_add(1, Ordering::Relaxed);
            let code = serve_run(&session, &args, json_out, &mut projects);
            if code == PANICKED {
                // Its sandbox is recovered once this process is gone (the recovery pass
                // acts on the leases of dead owners): the service ends after this answer.
                service.stopping.store(true, Ordering::SeqCst);
            }
            *service
                .last_request
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Instant::now();
            session.finish(code);
            // Only now, with the client answered, is the next sandbox prepared.
            projects.step_over();
        }
    }
}

/// Runs the client's step with its stdio and working directory in place of ours.
fn serve_run(
    session: &Session,
    args: &super::run::RunArgs,
    json_out: bool,
    projects: &mut ContextCache,
) -> u8 {
    let guard = match session.redirect() {
        Ok(g) => g,
        Err(e) => {
            session.tell_client(&format!(
                "error: the resident service could not take this command's stdio and working directory: {e}\n"
            ));
            return crate::output::EXIT_REJECTED;
        }
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        super::run::run_served(args, json_out, session.interrupts(), projects)
    }));
    let code = match outcome {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => crate::output::report_error_code(&e, json_out),
        Err(_) => {
            // A bug: the projects' state is not trusted any more; closing them removes
            // their prepared sandboxes, and the service ends (see `handle`).
            projects.clear();
            say!("error: the resident service failed while running this step (a bug); it ends now, and the next run recovers the step's sandbox");
            PANICKED
        }
    };
    guard.flush_stdout();
    drop(guard);
    code
}

fn status_doc(service: &Service) -> Value {
    let projects: Vec<Value> = match service.projects.try_lock() {
        Ok(p) => p
            .warm_status()
            .into_iter()
            .map(|(db, warm)| {
                json!({
                    "db": db,
                    "warm": warm.map(|w| json!({
                        "ready": w.ready,
                        "armed": w.armed,
                        "servedArmed": w.served_armed,
                        "lastError": w.last_error,
                        "lastArmError": w.last_arm_error,
                    })),
                })
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    json!({
        "pid": std::process::id(),
        "uptimeSeconds": service.started.elapsed().as_secs(),
        "served": service.counters.served.load(Ordering::Relaxed),
        "declined": service.counters.declined.load(Ordering::Relaxed),
        "lastDeclined": *service.counters.last_declined.lock().unwrap_or_else(|p| p.into_inner()),
        "busy": service.projects.try_lock().is_err(),
        "projects": projects,
    })
}
