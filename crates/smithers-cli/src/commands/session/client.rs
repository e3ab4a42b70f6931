//! The verbs a user runs: each a client of the session's holder, but `start`, which starts
//! one.

use std::io::IsTerminal;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{json, Value};
use smithers_errors::ErrorCode;

use super::holder::socket_of;
use super::wire::{self, Request};
use super::{ExecArgs, IdArgs, PathArgs, StartArgs};
use crate::output::{coded_error, inert, say};

/// How long `start` waits for the sandbox to be up (an image may have to be prepared).
const START_WAIT: Duration = Duration::from_secs(120);

pub fn start(args: &StartArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    if !args.run.command.is_empty() {
        return Err(invalid(
            "a session takes its commands one by one: `session exec ID -- CMD…` once it has started"
                .into(),
        ));
    }
    if args.run.tty || args.run.interactive {
        return Err(invalid(
            "-t and -i are a command's, not a session's: a session's commands get no terminal yet"
                .into(),
        ));
    }
    super::parse_duration("--idle-timeout", &args.idle_timeout)?;
    // Run's checks before anything is made (the holder makes them again): a refused option
    // is said here, with its code, not as a holder that ended.
    crate::commands::run::check_before_creating(&args.run)?;
    let run_id = args
        .run
        .run_id
        .clone()
        .unwrap_or_else(|| crate::commands::run::new_id("run"));
    let sandbox_id = args
        .run
        .sandbox_id
        .clone()
        .unwrap_or_else(|| crate::commands::run::new_id("ses"));
    smithers_runtime::config::validate_id("sandboxId", &sandbox_id)
        .map_err(|e| invalid(e.to_string()))?;
    let mut options = Vec::new();
    if args.run.run_id.is_none() {
        options.extend(["--run-id".into(), run_id.clone().into()]);
    }
    if args.run.sandbox_id.is_none() {
        options.extend(["--sandbox-id".into(), sandbox_id.clone().into()]);
    }
    options.extend(start_options());
    launch(&options, &run_id, &sandbox_id, None, json_out)
}

/// Starts a holder with `options` (its ids among them) in `cwd` (ours when `None`) and waits
/// until it answers; prints the session's id.
pub(super) fn launch(
    options: &[std::ffi::OsString],
    run_id: &str,
    sandbox_id: &str,
    cwd: Option<&Path>,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let dir = wire::sessions_dir(true).context("the sessions directory")?;
    let socket = dir.join(format!("{sandbox_id}.sock"));
    // Said before anything is made: a socket path the kernel cannot bind (108 bytes with its
    // end), or a session of that id held already (its holder answers there).
    if socket.as_os_str().len() >= 108 {
        return Err(invalid(format!(
            "the session's socket {} would be longer than a socket path may be: a shorter --sandbox-id, or a shorter $SMITHERS_RESIDENT_DIR",
            inert(&socket.display().to_string())
        )));
    }
    if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
        return Err(invalid(format!(
            "a session {} is held already (session stop it first, or choose another --sandbox-id)",
            inert(sandbox_id)
        )));
    }
    let log_path = dir.join(format!("{sandbox_id}.log"));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let mut command = std::process::Command::new(
        std::env::current_exe().context("locating the current executable")?,
    );
    // `--json`: an error of the holder is one line of its log, which `holder_failed` reads.
    command.args(["--json", "session", "__hold"]);
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    command
        .args(options)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    smithers_resident::detach(&mut command);
    let mut holder = command.spawn().context("starting the session's holder")?;
    let began = Instant::now();
    loop {
        if let Ok(info) = ask(&socket, &Request::Ping) {
            // Ours: the holder we started answers, no other.
            if info["ok"] == json!(true) && info["session"]["pid"] == json!(holder.id()) {
                break;
            }
        }
        if let Some(status) = holder.try_wait()? {
            return Err(holder_failed(&log_path, status));
        }
        if began.elapsed() > START_WAIT {
            let _ = holder.kill();
            return Err(invalid(format!(
                "the session was not up after {}s (its log: {})",
                START_WAIT.as_secs(),
                inert(&log_path.display().to_string())
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    if json_out {
        println!(
            "{}",
            json!({ "sessionId": sandbox_id, "runId": run_id, "socket": socket, "log": log_path })
        );
    } else {
        println!("{sandbox_id}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The options `session start` was given, for its holder (everything after `start`).
fn start_options() -> Vec<std::ffi::OsString> {
    let argv: Vec<_> = std::env::args_os().collect();
    // The `start` that follows `session` (an option's value before them may be either word).
    let at = argv
        .iter()
        .position(|a| a == "session")
        .and_then(|s| {
            argv[s..]
                .iter()
                .position(|a| a == "start")
                .map(|i| s + i + 1)
        })
        .unwrap_or(argv.len());
    argv[at..].to_vec()
}

/// What a holder that ended before its sandbox was up said (the last line of its log, a
/// JSON error, when it is one), as the error.
/// The last `bytes` of the file at `path` (empty when it cannot be read).
fn read_tail(path: &Path, bytes: u64) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let mut tail = Vec::new();
    if file
        .seek(SeekFrom::Start(len.saturating_sub(bytes)))
        .is_ok()
    {
        let _ = file.take(bytes).read_to_end(&mut tail);
    }
    tail
}

fn holder_failed(log: &Path, status: std::process::ExitStatus) -> anyhow::Error {
    // Only its last 16 KiB are read: the log is the holder's, but its size is not ours.
    let tail = read_tail(log, 16 << 10);
    let tail = String::from_utf8_lossy(&tail);
    let last = tail
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    if let Ok(doc) = serde_json::from_str::<Value>(last) {
        if let Some(err) = doc
            .get("error")
            .or(Some(&doc))
            .filter(|e| e.get("code").is_some())
        {
            return answered_error(err);
        }
    }
    coded_error(
        ErrorCode::SandboxExecutionFailed,
        format!(
            "the session's holder ended ({status}) before its sandbox was up: {}",
            inert(last)
        ),
        json!({ "log": log }),
    )
}

pub fn exec(args: &ExecArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let socket = socket_of(&args.id)?;
    let mut env = Vec::new();
    for kv in &args.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| invalid(format!("--env {kv:?} is not KEY=VALUE")))?;
        env.push((k.to_string(), v.to_string()));
    }
    let timeout_ms = match &args.timeout {
        Some(t) => Some(super::parse_duration("--timeout", t)?.as_millis() as u64),
        None => None,
    };
    if args.tty {
        if json_out || !std::io::stdin().is_terminal() || !std::io::stdout().is_terminal() {
            return Err(invalid(
                "-t shows the command's terminal on yours: stdin and stdout must be a terminal (and no --json)"
                    .into(),
            ));
        }
        let request = Request::Exec {
            argv: args.command.clone(),
            cwd: args.cwd.clone(),
            env,
            timeout_ms,
            stdin: false,
            terminal: Some(super::terminal::our_size()),
        };
        let answer = super::terminal::on_our_terminal(|fds, hang_up_on_escape| {
            let stream = wire::send(&socket, &request, fds)
                .map_err(|e| unreachable_session(&args.id, &e))?;
            hang_up_on_escape(stream.try_clone()?);
            let answer =
                wire::read_answer(&stream).map_err(|e| unreachable_session(&args.id, &e))?;
            match answer["ok"] == json!(true) {
                true => Ok(answer),
                false => Err(answered_error(&answer["error"])),
            }
        })?;
        let Some(answer) = answer else {
            // `~.`: the connection hung up, which ends the command (the holder kills it).
            say!("ended with ~.: the command was killed");
            return Ok(ExitCode::from(130));
        };
        return Ok(ExitCode::from(exit_status(&answer["exit"])));
    }
    // A terminal is not passed: the holder would go on reading it after the command ended
    // (a terminal of the command's own is `-t`).
    let stdin = !args.no_stdin && !std::io::stdin().is_terminal();
    let request = Request::Exec {
        argv: args.command.clone(),
        cwd: args.cwd.clone(),
        env,
        timeout_ms,
        stdin,
        terminal: None,
    };
    let stdio = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    // A terminal gets the command's output made inert, as `run` shows a step's: the command
    // writes into a socket we read, never into the terminal itself.
    let out = Shown::new(
        stdio.1.as_fd(),
        std::io::stdout().is_terminal(),
        Terminal::Stdout,
    )?;
    let err = Shown::new(
        stdio.2.as_fd(),
        std::io::stderr().is_terminal(),
        Terminal::Stderr,
    )?;
    let (i, o, e) = (stdio.0.as_fd(), out.fd(), err.fd());
    let fds: Vec<_> = if stdin { vec![i, o, e] } else { vec![o, e] };
    let answer = ask_with(&args.id, &socket, &request, &fds);
    let (_, _) = (out.finish(), err.finish());
    let answer = answer?;
    let exit = &answer["exit"];
    if json_out {
        eprintln!("{exit}");
    }
    Ok(ExitCode::from(exit_status(exit)))
}

/// A command's end as a shell says it: its code, 128 + a signal, 124 for a timeout (as
/// `timeout` does), 130 when cancelled.
fn exit_status(exit: &Value) -> u8 {
    match exit["termination"].as_str() {
        Some("exited") => exit["exitCode"].as_i64().unwrap_or(1) as u8,
        Some("signaled") => 128u8.wrapping_add(exit["signal"].as_i64().unwrap_or(0) as u8),
        Some("timeout") => 124,
        Some("cancelled") => 130,
        _ => 1,
    }
}

pub fn read(args: &PathArgs) -> anyhow::Result<ExitCode> {
    let socket = socket_of(&args.id)?;
    let request = Request::Read {
        path: args.path.clone(),
    };
    let stdout = std::io::stdout();
    let shown = Shown::new(stdout.as_fd(), stdout.is_terminal(), Terminal::Stdout)?;
    let answer = ask_with(&args.id, &socket, &request, &[shown.fd()]);
    shown.finish();
    answer?;
    Ok(ExitCode::SUCCESS)
}

pub fn write(args: &PathArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let socket = socket_of(&args.id)?;
    let request = Request::Write {
        path: args.path.clone(),
    };
    let answer = ask_with(&args.id, &socket, &request, &[std::io::stdin().as_fd()])?;
    if json_out {
        println!("{answer}");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn diff(args: &IdArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let socket = socket_of(&args.id)?;
    let answer = ask_with(&args.id, &socket, &Request::Diff, &[])?;
    let bundle = Path::new(answer["bundlePath"].as_str().unwrap_or_default()).to_path_buf();
    let root = Path::new(answer["rootDir"].as_str().unwrap_or_default()).to_path_buf();
    let mut doc = super::diff_json(&bundle, &root)?;
    if json_out {
        let text = doc.as_object_mut().and_then(|d| d.remove("text"));
        drop(text);
        doc["sessionId"] = json!(args.id);
        doc["rootDir"] = json!(root);
        println!("{doc}");
    } else {
        print!("{}", doc["text"].as_str().unwrap_or_default());
    }
    Ok(ExitCode::SUCCESS)
}

pub fn stop(args: &IdArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let socket = socket_of(&args.id)?;
    let doc = ask_with(&args.id, &socket, &Request::Stop, &[])?;
    if json_out {
        println!("{doc}");
        return Ok(ExitCode::SUCCESS);
    }
    let id = inert(&args.id);
    match doc["status"].as_str() {
        Some("review") => say!(
            "session {id} stopped: {} patch(es), {} changed line(s) await review\n  review   smithers-sandbox review {id}\n  accept   smithers-sandbox accept {id}\n  reject   smithers-sandbox reject {id}",
            doc["patchCount"],
            doc["totalDiffLines"]
        ),
        Some(status) => say!("session {id} stopped: {}", inert(status)),
        None => say!("session {id} stopped"),
    }
    Ok(ExitCode::SUCCESS)
}

pub fn ls(json_out: bool) -> anyhow::Result<ExitCode> {
    let dir = match wire::sessions_dir(false) {
        Ok(dir) => dir,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if json_out {
                println!("[]");
            }
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e).context("the sessions directory"),
    };
    let mut sessions = Vec::new();
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(id) = name.strip_suffix(".sock") else {
            continue;
        };
        match ask(&entry.path(), &Request::Ping) {
            Ok(answer) if answer["ok"] == json!(true) => sessions.push(answer["session"].clone()),
            _ => sessions.push(json!({ "sessionId": id, "held": false })),
        }
    }
    sessions.sort_by_key(|s| s["startedMs"].as_i64().unwrap_or(0));
    if json_out {
        println!("{}", Value::Array(sessions));
        return Ok(ExitCode::SUCCESS);
    }
    for s in &sessions {
        match s["held"].as_bool() {
            Some(false) => say!(
                "{}  not held (its holder is gone)",
                inert(s["sessionId"].as_str().unwrap_or(""))
            ),
            _ => say!(
                "{}  {} execs ({} running)  {}  {}",
                inert(s["sessionId"].as_str().unwrap_or("")),
                s["execs"],
                s["running"],
                inert(s["runtime"].as_str().unwrap_or("")),
                inert(s["rootDir"].as_str().unwrap_or(""))
            ),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Which of our streams a relay writes to.
#[derive(Clone, Copy)]
enum Terminal {
    Stdout,
    Stderr,
}

/// A descriptor for a command's stream: ours as it is, or, for a terminal, a socket whose
/// bytes a thread shows on the terminal made inert.
enum Shown<'a> {
    Direct(BorrowedFd<'a>),
    Inert {
        ours: std::os::unix::net::UnixStream,
        relay: std::thread::JoinHandle<()>,
    },
}

impl<'a> Shown<'a> {
    fn new(fd: BorrowedFd<'a>, terminal: bool, which: Terminal) -> anyhow::Result<Shown<'a>> {
        if !terminal {
            return Ok(Shown::Direct(fd));
        }
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let relay = std::thread::spawn(move || match which {
            Terminal::Stdout => crate::commands::progress::inert_copy(theirs, std::io::stdout()),
            Terminal::Stderr => crate::commands::progress::inert_copy(theirs, std::io::stderr()),
        });
        Ok(Shown::Inert { ours, relay })
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Shown::Direct(fd) => *fd,
            Shown::Inert { ours, .. } => ours.as_fd(),
        }
    }

    /// Our end closes (the holder's copy went with the command), and what is left is shown.
    fn finish(self) {
        if let Shown::Inert { ours, relay } = self {
            drop(ours);
            let _ = relay.join();
        }
    }
}

/// How long a look at a session (a ping) waits for its answer: a holder that is stopped
/// (SIGSTOP) or a socket nobody serves is then "not held", not a hang.
const PING_WAIT: Duration = Duration::from_secs(2);

/// One request without descriptors (a ping) and its answer, bounded in time.
fn ask(socket: &Path, request: &Request) -> std::io::Result<Value> {
    let stream = wire::send(socket, request, &[])?;
    stream.set_read_timeout(Some(PING_WAIT))?;
    wire::read_answer(&stream)
}

/// One request to session `id` with `fds`; the answer when it is `ok`, else its error.
pub(super) fn ask_with(
    id: &str,
    socket: &Path,
    request: &Request,
    fds: &[BorrowedFd<'_>],
) -> anyhow::Result<Value> {
    let stream = wire::send(socket, request, fds).map_err(|e| unreachable_session(id, &e))?;
    let answer = wire::read_answer(&stream).map_err(|e| unreachable_session(id, &e))?;
    if answer["ok"] == json!(true) {
        return Ok(answer);
    }
    Err(answered_error(&answer["error"]))
}

fn unreachable_session(id: &str, e: &std::io::Error) -> anyhow::Error {
    let why = match e.kind() {
        std::io::ErrorKind::NotFound => {
            "there is no such session (never started, or ended)".to_string()
        }
        std::io::ErrorKind::ConnectionRefused => {
            "its holder is gone (killed?): the next command in its project recovers it".to_string()
        }
        _ => e.to_string(),
    };
    coded_error(
        ErrorCode::NotFound,
        format!("session {}: {why}", inert(id)),
        json!({ "sessionId": id }),
    )
}

/// An error the holder answered, as this command's.
fn answered_error(err: &Value) -> anyhow::Error {
    let code = serde_json::from_value(err["code"].clone()).unwrap_or(ErrorCode::Internal);
    let message = err["message"].as_str().unwrap_or("the session failed");
    coded_error(code, inert(message), err["details"].clone())
}

pub(super) fn invalid(message: String) -> anyhow::Error {
    coded_error(ErrorCode::InvalidInput, message, Value::Null)
}
