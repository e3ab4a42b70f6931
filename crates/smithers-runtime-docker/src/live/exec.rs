//! `exec`: one command in a started sandbox, as a `docker exec` of this build's binary in its
//! `--container-exec` mode, which runs the command in a process group of its own and kills
//! what is left of that group when the command ends. Its stdout and stderr are relayed byte
//! for byte as the engine hands them over; its stdin is the request's stream (attached, and
//! half-closed at the stream's end, which the engine passes on as the command's EOF) or
//! `/dev/null`. The Engine API has no call to kill an exec: a timeout or a cancel runs the
//! binary again in its `--container-kill` mode, which SIGKILLs the command's group inside the
//! container.
//!
//! The wrapper's exit code is the command's, or 128 + the signal that ended it; a code in
//! 129..=192, which could be either, is told apart by one more exec (`--container-status`),
//! only then.

use std::io::Read as _;
use std::path::{Component, Path};
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::ExecConfig;
use bollard::Docker;
use futures_util::StreamExt;
use smithers_runtime::types::StdinReader;
use smithers_runtime::{
    CancellationToken, ExecExit, ExecRequest, OutputEvent, OutputSink, OutputStream, RuntimeError,
    Termination,
};
use smithers_sandbox_init::container as init;
use tokio::io::AsyncWriteExt;

use crate::engine::{describe, spawn_err};
use crate::plan::WORKSPACE;
use crate::pump::now_ms;
use crate::started::Started;

/// How long a killed command's output may take to end before the exec fails.
const KILL_GRACE: Duration = Duration::from_secs(10);

/// One exec, checked: what the wrapper is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExecSpec {
    pub argv: Vec<String>,
    /// Absolute: the request's, or under `/workspace`.
    pub cwd: String,
    /// `KEY=value`, over the container's environment (the engine puts them there).
    pub env: Vec<String>,
}

/// Checks a request the way the native engine does: a command, no NUL in any argument,
/// variables that can be set as given; a relative directory is under `/workspace` and may not
/// climb out of it.
pub(crate) fn spec_of(request: &ExecRequest) -> Result<ExecSpec, RuntimeError> {
    let invalid =
        |control: &'static str, reason: String| RuntimeError::InvalidControl { control, reason };
    if request.argv.first().is_none_or(|a| a.is_empty()) {
        return Err(invalid("command", "the command is empty".into()));
    }
    if let Some(i) = request.argv.iter().position(|a| a.contains('\0')) {
        return Err(invalid(
            "command",
            format!("argument {i} contains a NUL byte, which a command line cannot carry"),
        ));
    }
    if let Some((k, _)) = request
        .env
        .iter()
        .find(|(k, v)| k.is_empty() || k.contains('\0') || k.contains('=') || v.contains('\0'))
    {
        return Err(invalid(
            "env",
            format!(
                "variable {:?} is empty, has a NUL byte or '=' in its name, or a NUL byte in its value",
                k.replace('\0', "\\0")
            ),
        ));
    }
    let cwd = match request.cwd.as_deref() {
        None => WORKSPACE.to_string(),
        Some(c) if c.contains('\0') => return Err(invalid("cwd", "contains a NUL byte".into())),
        Some(c) if c.starts_with('/') => c.to_string(),
        Some(c) if Path::new(c).components().any(|p| p == Component::ParentDir) => {
            return Err(invalid(
                "cwd",
                format!("{c:?} climbs out of /workspace ('..')"),
            ))
        }
        Some(c) => Path::new(WORKSPACE).join(c).to_string_lossy().into_owned(),
    };
    Ok(ExecSpec {
        argv: request.argv.clone(),
        cwd,
        env: request
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect(),
    })
}

/// The wrapper's command line: `PREFIX --container-exec TOKEN --cwd DIR [--null-stdin] --
/// ARGV...`.
pub(crate) fn wrapper_argv(
    prefix: &[String],
    token: &str,
    spec: &ExecSpec,
    null_stdin: bool,
) -> Vec<String> {
    let mut argv = prefix.to_vec();
    argv.extend([
        init::EXEC.to_string(),
        token.to_string(),
        "--cwd".to_string(),
        spec.cwd.clone(),
    ]);
    if null_stdin {
        argv.push("--null-stdin".to_string());
    }
    argv.push("--".to_string());
    argv.extend(spec.argv.iter().cloned());
    argv
}

/// The exec's body: the wrapper, the request's variables, stdin attached only with a stream.
/// User and working directory are the container's (the wrapper changes directory itself, so a
/// missing one is the command's failure, not the engine's).
pub(crate) fn exec_config(cmd: Vec<String>, env: Vec<String>, stdin: bool) -> ExecConfig {
    ExecConfig {
        attach_stdin: Some(stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        env: Some(env),
        cmd: Some(cmd),
        privileged: Some(false),
        ..Default::default()
    }
}

pub(super) async fn exec(
    docker: &Docker,
    started: &Started,
    request: ExecRequest,
    cancel: CancellationToken,
    sink: &dyn OutputSink,
) -> Result<ExecExit, RuntimeError> {
    let spec = spec_of(&request)?;
    let stdin = request.stdin.take();
    // An exec asked for while the sandbox is paused starts at the resume.
    started.unpaused().await;
    let token = started.next_token();
    let argv = wrapper_argv(&started.prefix, &token, &spec, stdin.is_none());
    let began = Instant::now();
    let (exec_id, output) = run(
        docker,
        &started.id,
        exec_config(argv, spec.env, stdin.is_some()),
        stdin,
    )
    .await?;
    let relayed = relay(
        docker,
        started,
        &token,
        output,
        request.timeout,
        &cancel,
        sink,
    )
    .await;
    let (ended_by, stdout_bytes, stderr_bytes) = relayed?;
    let code = exit_code_of(docker, &exec_id).await?;
    let (termination, exit_code, signal) = match (ended_by, split(code)) {
        (Some(by), (code, signal)) => (by, code, signal),
        (None, (Some(code), None)) => (Termination::Exited, Some(code), None),
        (None, (_, Some(signal))) => match status_of(docker, started, &token).await {
            Some(s) if s == format!("exit {code}") => {
                (Termination::Exited, Some(code as i32), None)
            }
            _ => (Termination::Signaled, None, Some(signal)),
        },
        (None, (None, None)) => unreachable!("split gives a code or a signal"),
    };
    Ok(ExecExit {
        termination,
        exit_code,
        signal,
        duration: began.elapsed(),
        stdout_bytes,
        stderr_bytes,
    })
}

/// The wrapper's code read as the command's: 129..=192 as 128 + a signal (until its status
/// says otherwise), anything else as an exit code.
pub(crate) fn split(code: i64) -> (Option<i32>, Option<i32>) {
    match code {
        129..=192 => (None, Some((code - 128) as i32)),
        c => (Some(c as i32), None),
    }
}

type Output = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
>;

/// Creates and starts an exec in the container; feeds `stdin` to it when given. Returns the
/// exec's id and its output.
async fn run(
    docker: &Docker,
    container: &str,
    config: ExecConfig,
    stdin: Option<StdinReader>,
) -> Result<(String, Output), RuntimeError> {
    let created = docker.create_exec(container, config).await.map_err(|e| {
        match crate::engine::status(&e) {
            // The container is not running: stopped (or killed) under us.
            Some(409) => RuntimeError::OutOfOrder {
                verb: "exec",
                reason: format!("the sandbox is not running: {}", describe(&e)),
            },
            _ => spawn_err("create the exec", &e),
        }
    })?;
    let started = docker
        .start_exec(
            &created.id,
            Some(StartExecOptions {
                detach: false,
                tty: false,
                output_capacity: None,
            }),
        )
        .await
        .map_err(|e| spawn_err("start the exec", &e))?;
    let StartExecResults::Attached { output, input } = started else {
        return Err(RuntimeError::spawn(
            "start the exec",
            "the engine did not attach to it",
        ));
    };
    match stdin {
        Some(reader) => feed(reader, input),
        // Not attached: nothing goes this way.
        None => drop(input),
    }
    Ok((created.id, output))
}

/// Copies the caller's stream into the exec's stdin, then half-closes the connection: the
/// engine closes the command's stdin then, which is its EOF. The stream is a blocking reader,
/// read on a thread of its own; the writes are async, on a task.
fn feed(mut reader: StdinReader, mut input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    });
    tokio::spawn(async move {
        while let Some(chunk) = rx.recv().await {
            // A command that stopped reading (or ended) refuses the rest: dropped.
            if input.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = input.flush().await;
        let _ = input.shutdown().await;
    });
}

/// Relays the exec's output to the sink until it ends (the engine ends it once the wrapper has
/// exited and its pipes are closed, or at most a couple of seconds after it exited when a
/// process that left the group still holds them), killing the command's group on the timeout
/// or a cancel. Returns what ended it early, and the bytes relayed per stream.
async fn relay(
    docker: &Docker,
    started: &Started,
    token: &str,
    mut output: Output,
    timeout: Option<Duration>,
    cancel: &CancellationToken,
    sink: &dyn OutputSink,
) -> Result<(Option<Termination>, u64, u64), RuntimeError> {
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut ended_by = None;
    let mut grace: Option<tokio::time::Instant> = None;
    let (mut out, mut err) = (0u64, 0u64);
    loop {
        let item = tokio::select! {
            item = output.next() => item,
            _ = sleep_until(deadline), if ended_by.is_none() => {
                ended_by = Some(Termination::Timeout);
                grace = Some(tokio::time::Instant::now() + KILL_GRACE);
                kill(docker, started, token).await;
                continue;
            }
            _ = cancel.cancelled(), if ended_by.is_none() => {
                ended_by = Some(Termination::Cancelled);
                grace = Some(tokio::time::Instant::now() + KILL_GRACE);
                kill(docker, started, token).await;
                continue;
            }
            _ = sleep_until(grace), if grace.is_some() => {
                return Err(RuntimeError::spawn(
                    "end the command",
                    format!("its output did not end {} s after it was killed", KILL_GRACE.as_secs()),
                ));
            }
        };
        let (stream, bytes) = match item {
            None => break,
            Some(Ok(LogOutput::StdOut { message } | LogOutput::Console { message })) => {
                (OutputStream::Stdout, message)
            }
            Some(Ok(LogOutput::StdErr { message })) => (OutputStream::Stderr, message),
            Some(Ok(LogOutput::StdIn { .. })) => continue,
            // The engine's connection broke: the command's end is still asked of the engine.
            Some(Err(_)) => break,
        };
        match stream {
            OutputStream::Stdout => out += bytes.len() as u64,
            OutputStream::Stderr => err += bytes.len() as u64,
        }
        sink.event(OutputEvent::Output {
            stream,
            bytes: bytes.to_vec(),
            timestamp_ms: now_ms(),
        });
        // A follower behind holds the command back (as a full pipe would), until its end is
        // asked for: then its output is read as fast as it comes.
        if ended_by.is_none() {
            tokio::select! {
                _ = sink.room() => {}
                _ = cancel.cancelled() => {}
                _ = sleep_until(deadline) => {}
            }
        }
    }
    Ok((ended_by, out, err))
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Runs the bound binary in the container with `args` and waits for its end; returns its
/// stdout (small: a kill says nothing there, a status a few bytes).
async fn helper(docker: &Docker, started: &Started, args: [&str; 2]) -> Option<String> {
    // A kill or a status read during a pause is made at the resume.
    started.unpaused().await;
    let mut cmd = started.prefix.clone();
    cmd.extend(args.iter().map(|a| a.to_string()));
    let (_, mut output) = run(docker, &started.id, exec_config(cmd, vec![], false), None)
        .await
        .ok()?;
    let mut text = Vec::new();
    while let Some(Ok(item)) = output.next().await {
        if let LogOutput::StdOut { message } = item {
            if text.len() < 256 {
                text.extend_from_slice(&message);
            }
        }
    }
    Some(String::from_utf8_lossy(&text).trim().to_string())
}

/// Kills the exec's group (a failure leaves the command running: the grace then ends the
/// exec with an error, and `stop` still ends everything).
async fn kill(docker: &Docker, started: &Started, token: &str) {
    let _ = helper(docker, started, [init::KILL, token]).await;
}

/// The wrapper's status line (`exit N` or `signal N`).
async fn status_of(docker: &Docker, started: &Started, token: &str) -> Option<String> {
    helper(docker, started, [init::STATUS, token]).await
}

/// The wrapper's exit code, once the engine reports it ended (its output ends a moment before
/// the engine has noted the exit).
async fn exit_code_of(docker: &Docker, exec_id: &str) -> Result<i64, RuntimeError> {
    let deadline = Instant::now() + KILL_GRACE;
    loop {
        let info = docker
            .inspect_exec(exec_id)
            .await
            .map_err(|e| spawn_err("inspect the exec", &e))?;
        match (info.running, info.exit_code) {
            (Some(true), _) => {}
            (_, Some(code)) => return Ok(code),
            // The engine notes an exec's end and its code at once: ended without one, it was
            // ended with its container (a stop, or the container's init killed).
            (_, None) => {
                return Err(RuntimeError::spawn(
                    "run the command",
                    "the sandbox ended while it ran",
                ))
            }
        }
        if Instant::now() > deadline {
            return Err(RuntimeError::spawn(
                "end the command",
                "the engine still reports it running after its output ended",
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(argv: &[&str], cwd: Option<&str>) -> ExecRequest {
        ExecRequest {
            argv: argv.iter().map(|a| a.to_string()).collect(),
            cwd: cwd.map(str::to_string),
            env: vec![("A".into(), "1 2".into())],
            ..ExecRequest::default()
        }
    }

    #[test]
    fn the_wrapper_gets_the_command_whole_after_its_own_arguments() {
        let spec = spec_of(&request(&["sh", "-c", "echo --cwd -- x"], Some("sub"))).unwrap();
        assert_eq!(spec.cwd, "/workspace/sub");
        assert_eq!(spec.env, vec!["A=1 2".to_string()]);
        let prefix = vec![
            "/smithers-host/smithers-sandbox".to_string(),
            "__sandbox-init".into(),
        ];
        let argv = wrapper_argv(&prefix, "tok-1", &spec, true);
        assert_eq!(
            argv,
            [
                "/smithers-host/smithers-sandbox",
                "__sandbox-init",
                "--container-exec",
                "tok-1",
                "--cwd",
                "/workspace/sub",
                "--null-stdin",
                "--",
                "sh",
                "-c",
                "echo --cwd -- x"
            ]
        );
        let argv = wrapper_argv(&prefix, "tok-1", &spec, false);
        assert!(!argv.contains(&"--null-stdin".to_string()));
    }

    #[test]
    fn requests_are_checked_as_the_native_engine_checks_them() {
        assert_eq!(spec_of(&request(&["pwd"], None)).unwrap().cwd, "/workspace");
        assert_eq!(
            spec_of(&request(&["pwd"], Some("/tmp"))).unwrap().cwd,
            "/tmp"
        );
        for bad in [
            request(&[], None),
            request(&[""], None),
            request(&["a\0b"], None),
            request(&["pwd"], Some("../etc")),
            request(&["pwd"], Some("a/../../b")),
            request(&["pwd"], Some("a\0")),
            ExecRequest {
                env: vec![("A=B".into(), "x".into())],
                ..request(&["pwd"], None)
            },
        ] {
            assert!(spec_of(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_exec_body_attaches_stdin_only_with_a_stream() {
        let c = exec_config(vec!["x".into()], vec!["A=1".into()], false);
        assert_eq!(
            (c.attach_stdin, c.attach_stdout, c.attach_stderr, c.tty),
            (Some(false), Some(true), Some(true), Some(false))
        );
        assert_eq!(c.privileged, Some(false));
        assert_eq!(c.user, None, "the container's user, as every command");
        assert_eq!(c.env, Some(vec!["A=1".to_string()]));
        assert_eq!(exec_config(vec![], vec![], true).attach_stdin, Some(true));
    }

    #[test]
    fn a_code_is_an_exit_unless_it_may_be_a_signal() {
        assert_eq!(split(0), (Some(0), None));
        assert_eq!(split(127), (Some(127), None));
        assert_eq!(split(128), (Some(128), None));
        assert_eq!(split(137), (None, Some(9)));
        assert_eq!(split(192), (None, Some(64)));
        assert_eq!(split(193), (Some(193), None));
    }
}
