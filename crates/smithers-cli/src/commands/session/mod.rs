//! `smithers-sandbox session …`: a sandbox held across many commands.
//!
//! `session start` starts a detached holder (`holder`) that brings the sandbox up and serves
//! its socket (`wire`); every other verb is a client of that socket. A session is one step of
//! the orchestrator's, so its rows, events, bundle and review are a run's: `session stop`
//! collects its change and opens the same review as `run` (`review`, `accept`, `reject`
//! take the session's id); each command is a `SessionExec` event of it.

mod admission;
mod checkpoints;
mod client;
mod diff;
mod fd_sink;
mod files;
mod fork;
mod holder;
mod runtime;
mod terminal;
pub(crate) mod wire;

pub(crate) use holder::socket_of;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::run::RunArgs;

/// `session`'s verbs.
#[derive(Debug, Args)]
pub struct SessionArgs {
    #[command(subcommand)]
    pub command: SessionCommand,
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Start a session (run's options); prints its id once commands can be sent.
    #[command(mut_arg("command", |a| a.required(false).hide(true)))]
    Start(Box<StartArgs>),
    /// Run a command in the session: its stdin (unless a terminal, or -n), stdout, stderr
    /// and exit status are this command's own.
    Exec(ExecArgs),
    /// A shell in the session on a terminal of its own, shown on yours (`exec -t ID -- sh`,
    /// bash where the sandbox has it).
    Attach(IdArgs),
    /// Print a file of the session's workspace (bytes, to stdout).
    Read(PathArgs),
    /// Write stdin into a file of the session's workspace (parent directories made).
    Write(PathArgs),
    /// The change so far, as `review` shows a stopped session's.
    Diff(IdArgs),
    /// Freeze the workspace as it is now; prints the checkpoint's name (cp-1, cp-2, …).
    /// No file is copied; refused (BUSY) while a command runs.
    Checkpoint(IdArgs),
    /// Put the workspace back to a checkpoint (what was written since is dropped).
    Restore(RestoreArgs),
    /// Start another session from this one's workspace (now, or a checkpoint), with its
    /// options; prints the new session's id. Processes are not carried.
    Fork(ForkArgs),
    /// End the session: its change is collected and opens a review, as a run's does.
    Stop(IdArgs),
    /// List the sessions of this user that are held.
    Ls,
    /// The holder of a session (started by `session start`).
    #[command(name = "__hold", hide = true)]
    #[command(mut_arg("command", |a| a.required(false).hide(true)))]
    Hold(Box<StartArgs>),
}

#[derive(Debug, Args)]
pub struct StartArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// End the session once no command has run for this long (30s, 10m, 1h).
    #[arg(long, value_name = "DURATION", default_value = "30m")]
    pub idle_timeout: String,
    /// The frozen layers a fork starts from (set by `session fork`).
    #[arg(long, hide = true, value_name = "IDS")]
    pub from_layers: Option<String>,
    /// End the session (its change opens a review) when this process ends: the MCP server
    /// that started it, killed or not.
    #[arg(long, hide = true, value_name = "PID")]
    pub owner_pid: Option<u32>,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The session's id.
    pub id: String,
    /// The checkpoint (as `session checkpoint` named it).
    pub checkpoint: String,
}

#[derive(Debug, Args)]
pub struct ForkArgs {
    /// The session's id.
    pub id: String,
    /// Start from this checkpoint (default: the workspace as it is now).
    pub checkpoint: Option<String>,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The session's id.
    pub id: String,
    /// Working directory: absolute in the sandbox, or relative to /workspace.
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// A variable for this command only (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Kill the command (its process group) after this long.
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// The command's stdin is /dev/null.
    #[arg(short = 'n', long)]
    pub no_stdin: bool,
    /// The command on a terminal of its own in the sandbox, shown on yours (which must be a
    /// terminal, put in raw mode: every key is the command's but `~.` at the start of a line,
    /// which ends it, and `~~`, which types a `~`); what reaches your terminal is filtered as
    /// `run -t`'s.
    #[arg(short = 't', long = "tty", conflicts_with = "no_stdin")]
    pub tty: bool,
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct PathArgs {
    /// The session's id.
    pub id: String,
    /// The file: absolute in the sandbox, or relative to /workspace.
    pub path: String,
}

#[derive(Debug, Args)]
pub struct IdArgs {
    /// The session's id.
    pub id: String,
}

/// The change a session's diff bundle holds, as `review --json` shows one: its files, the
/// diff, the findings.
pub(crate) fn diff_json(
    bundle: &std::path::Path,
    root: &std::path::Path,
) -> anyhow::Result<serde_json::Value> {
    use crate::commands::changes;
    let (patches, notes) = changes::bundle_contents(bundle)?;
    let shown = smithers_patch::PatchReview::new(&patches, Some(root));
    let files = changes::changes_from(&patches, shown.stats());
    let mut findings = shown.findings(&smithers_patch::host_hooks_dirs(root));
    changes::add_change_notes(&mut findings, &notes);
    Ok(serde_json::json!({
        "patches": files.iter().map(changes::FileChange::to_json).collect::<Vec<_>>(),
        "diff": smithers_patch::render_patches(&patches),
        "findings": findings,
        "text": shown.render(&smithers_patch::ReviewOptions { color: false }, &findings),
    }))
}

pub fn run(args: &SessionArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    match &args.command {
        SessionCommand::Start(a) => client::start(a, json_out),
        SessionCommand::Exec(a) => client::exec(a, json_out),
        SessionCommand::Attach(a) => client::exec(
            &ExecArgs {
                id: a.id.clone(),
                cwd: None,
                env: Vec::new(),
                timeout: None,
                no_stdin: false,
                tty: true,
                // The sandbox sees the host's /usr: bash where it is, else sh.
                command: if std::path::Path::new("/bin/bash").exists() {
                    vec!["bash".into(), "-i".into()]
                } else {
                    vec!["sh".into(), "-i".into()]
                },
            },
            json_out,
        ),
        SessionCommand::Read(a) => client::read(a),
        SessionCommand::Write(a) => client::write(a, json_out),
        SessionCommand::Diff(a) => client::diff(a, json_out),
        SessionCommand::Checkpoint(a) => fork::checkpoint(a, json_out),
        SessionCommand::Restore(a) => fork::restore(a, json_out),
        SessionCommand::Fork(a) => fork::fork(a, json_out),
        SessionCommand::Stop(a) => client::stop(a, json_out),
        SessionCommand::Ls => client::ls(json_out),
        SessionCommand::Hold(a) => holder::hold(a),
    }
}

/// A duration option (`30s`, `10m`, `1h`, `500ms`; a bare number is seconds).
fn parse_duration(flag: &str, text: &str) -> anyhow::Result<Duration> {
    super::flags::parse_duration_ms(text)
        .map(Duration::from_millis)
        .ok_or_else(|| {
            crate::output::coded_error(
                smithers_errors::ErrorCode::InvalidInput,
                format!("invalid {flag} {text:?} (e.g. 30s, 10m, 1h)"),
                serde_json::Value::Null,
            )
        })
}
