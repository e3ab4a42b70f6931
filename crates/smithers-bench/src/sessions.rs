//! Scenario 11 (its exec half): one command in a live session against a sandbox per command.
//!
//! A session is started once (`smithers-sandbox session start`, untimed); then, interleaved
//! round by round: `true` spawned on the host; `true` exec'd in the session through its socket
//! (the API the MCP server uses: one connection, one request, stdout and stderr passed as
//! descriptors, one answer); the same through the CLI (`session exec`, a whole process); a
//! bare bwrap sandbox per command; and `smithers-sandbox run -- true` (a sandbox of ours per
//! command, whole process). Peers' per-command sandboxes (firejail, `runsc do`, Codex's and
//! srt: [`peers`]) are measured when installed, and named as absent otherwise.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::Context as _;
use smithers_resident::session::{self, Request};

use crate::measure::{fmt_ms, interleaved, median_ratio, run_quiet, Contender, Series};
use crate::report::{machine_line, Table};
use crate::whole_cli::cli_binary;

/// Peers with a per-command sandbox, when installed: the program and its arguments.
/// Codex's and srt come from npm (`npm install @openai/codex @anthropic-ai/sandbox-runtime`,
/// their `.bin` on PATH; srt needs ripgrep and socat); `$SMITHERS_BENCH_CODEX` may name
/// Codex's native binary, measured without its Node.js wrapper.
fn peers() -> Vec<(String, Vec<String>)> {
    let owned = |p: &str, a: &[&str]| (p.to_string(), a.iter().map(|s| s.to_string()).collect());
    let mut peers = vec![
        owned(
            "firejail",
            &["--quiet", "--noprofile", "--net=none", "true"],
        ),
        owned("runsc", &["--network=none", "do", "true"]),
        owned("codex", &["sandbox", "--", "true"]),
        owned("srt", &["true"]),
    ];
    if let Some(native) = std::env::var_os("SMITHERS_BENCH_CODEX") {
        peers.push(owned(&native.to_string_lossy(), &["sandbox", "--", "true"]));
    }
    peers
}

pub fn run(scratch: &Path, rounds: usize, bwrap_args: &[&str]) -> anyhow::Result<String> {
    let bin = cli_binary()?;
    let (project, sessions) = fresh_project(scratch, "sessions")?;
    let cli = || {
        let mut c = Command::new(&bin);
        c.env("SMITHERS_RESIDENT_DIR", &sessions)
            .env("SMITHERS_RESIDENT", "off")
            .current_dir(&project);
        c
    };
    let out = cli()
        .args(["--json", "session", "start", "--idle-timeout", "1h"])
        .stdin(Stdio::null())
        .output()?;
    anyhow::ensure!(out.status.success(), "session start: {out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let id = doc["sessionId"]
        .as_str()
        .context("no session id")?
        .to_string();
    let socket = Path::new(doc["socket"].as_str().context("no socket")?).to_path_buf();
    let devnull = File::options().write(true).open("/dev/null")?;
    let quiet = |mut c: Command, args: &[&str]| -> anyhow::Result<()> {
        let status = c
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        anyhow::ensure!(status.success(), "{args:?}: {status}");
        Ok(())
    };
    let sandboxes = project.join(".smithers/sandboxes");
    // Declared before the contenders, which borrow them.
    let peers = peers();
    let mut contenders = vec![
        Contender::new("spawn `true` on the host", || run_quiet("true", &[])),
        Contender::new(
            "exec `true` in a live session (its socket: the MCP server's API)",
            || exec_over_socket(&socket, &devnull),
        ),
        Contender::new(
            "smithers-sandbox session exec ID -- true (whole process)",
            || quiet(cli(), &["session", "exec", &id, "-n", "--", "true"]),
        ),
        Contender::new(
            "bare bwrap --unshare-all ... true (a sandbox per command)",
            || run_quiet("bwrap", bwrap_args),
        ),
        Contender::new(
            "smithers-sandbox run -- true (a sandbox of ours per command)",
            || quiet(cli(), &["run", "--", "true"]),
        )
        .with_after(|| {
            let _ = std::fs::remove_dir_all(&sandboxes);
        }),
    ];
    let mut absent = Vec::new();
    for (program, args) in &peers {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        if crate::measure::have(program) && run_quiet(program, &args).is_ok() {
            let name = format!("{program} {}", args.join(" "));
            contenders.push(Contender::new(name, move || run_quiet(program, &args)));
        } else {
            absent.push(program.as_str());
        }
    }
    let series: Vec<Series> = interleaved(&mut contenders, 5, rounds)?;
    drop(contenders);
    let _ = cli().args(["session", "stop", &id]).output();
    Ok(report(&series, rounds, &absent))
}

/// A fresh tiny project `<scratch>/<name>-project` and a private sessions directory
/// `<scratch>/<name>-sessions` (what a session's scenario starts from).
pub(crate) fn fresh_project(
    scratch: &Path,
    name: &str,
) -> anyhow::Result<(std::path::PathBuf, std::path::PathBuf)> {
    let project = scratch.join(format!("{name}-project"));
    let _ = std::fs::remove_dir_all(&project);
    std::fs::create_dir_all(&project)?;
    std::fs::write(project.join("README"), "a tiny project\n")?;
    let sessions = scratch.join(format!("{name}-sessions"));
    let _ = std::fs::remove_dir_all(&sessions);
    std::fs::create_dir_all(&sessions)?;
    std::fs::set_permissions(
        &sessions,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )?;
    Ok((project, sessions))
}

/// One `true` through the session's socket, its output to /dev/null.
fn exec_over_socket(socket: &Path, devnull: &File) -> anyhow::Result<()> {
    let request = Request::Exec {
        argv: vec!["true".into()],
        cwd: None,
        env: Vec::new(),
        timeout_ms: None,
        stdin: false,
        terminal: None,
    };
    let stream = session::send(socket, &request, &[devnull.as_fd(), devnull.as_fd()])?;
    let answer = session::read_answer(&stream)?;
    anyhow::ensure!(answer["exit"]["exitCode"] == 0, "exec: {answer}");
    Ok(())
}

fn report(series: &[Series], rounds: usize, absent: &[&str]) -> String {
    let host = &series[0];
    let bwrap = &series[3];
    let mut table = Table::new(&[
        "contender",
        "p50",
        "p95",
        "minus host spawn (p50)",
        "ratio to bare bwrap",
    ]);
    for s in series {
        let more = s.median().saturating_sub(host.median());
        table.row(vec![
            s.name.clone(),
            fmt_ms(s.median()),
            fmt_ms(s.p95()),
            format!("+{}", fmt_ms(more)),
            format!("{:.2}×", median_ratio(s, bwrap)),
        ]);
    }
    let absent = match absent {
        [] => String::new(),
        names => format!(
            " Not installed here, so not measured: {} (the design notes measured 36–306 ms per command for the peers on this kind of machine).",
            names.join(", ")
        ),
    };
    format!(
        "Machine: {}. {rounds} interleaved rounds after 5 warm-up rounds. The session is \
         started once, untimed; each exec is a new connection to its holder, a request, the \
         command run in the sandbox's namespaces and limits, and the answer.{absent}\n\n{}\n\
         An exec through the session's socket is **+{}** over spawning `true` on the host \
         (p50); through the CLI it is **{:.2}×** a bare bwrap sandbox per command. \
         Command: `cargo build --release -p smithers-cli -p smithers-bench && \
         cargo run --release -p smithers-bench -- sessions`\n",
        machine_line(),
        table.to_markdown(),
        fmt_ms(series[1].median().saturating_sub(host.median())),
        median_ratio(&series[2], bwrap),
    )
}
