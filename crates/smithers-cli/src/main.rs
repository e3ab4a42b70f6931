//! `smithers-sandbox`: the command line of smithers-sandbox.
//!
//! Each command group is one module under `commands/`; adding a group (`run`, `doctor`,
//! `review`, ...) means a new module, one variant in [`Command`] and one arm in [`run`].
//! Errors are rendered in one place ([`output::report_error`]): `{code, message, details}` as
//! JSON on stdout under `--json`, human text on stderr otherwise.
#![forbid(unsafe_code)]

mod commands;
mod output;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

const EXIT_CODES: &str = "\
Exit codes:
  0  success (for `validate`: the bundle is valid)
  1  rejected input or failed operation; the error is printed with its stable code
     (INVALID_INPUT, TOOL_PATH_ESCAPE, ...), as {\"code\",\"message\",\"details\"} under --json
  2  usage error (unknown command, missing argument)";

/// Run workflow steps in real sandboxes, and inspect their result bundles.
#[derive(Debug, Parser)]
#[command(name = "smithers-sandbox", version, about, after_help = EXIT_CODES, propagate_version = true)]
struct Cli {
    /// Machine-readable output: results and errors as JSON on stdout.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Result bundles: validate, write, show.
    #[command(after_help = EXIT_CODES)]
    Bundle(commands::bundle::BundleArgs),
    /// Run one step in a sandbox through the orchestrator (rows/events in SQLite, review).
    #[command(after_help = commands::run::OUTPUT_HELP)]
    Run(Box<commands::run::RunArgs>),
    /// Show a sandbox's change as a unified diff with per-file stats.
    Review(commands::review::ReviewArgs),
    /// Apply a sandbox's reviewed change to the project (atomic, conflict-checked).
    Accept(commands::review::AcceptArgs),
    /// Reject a sandbox's change (nothing is applied).
    Reject(commands::review::RejectArgs),
    /// Hold a result bundle a caller collected (the Smithers provider) for review here;
    /// the caller applies it once accepted.
    Hold(commands::review::HoldArgs),
    /// List sandboxes.
    Ls(commands::inspect::LsArgs),
    /// Show one sandbox: row, review, patches, events.
    Show(commands::inspect::ShowArgs),
    /// Print a run's events (replay from a seq, or follow).
    Events(commands::inspect::EventsArgs),
    /// Print a sandbox's output (its stdout and stderr, from its bundle's log).
    Logs(commands::inspect::LogsArgs),
    /// Remove ended sandboxes: their rows and their directory in the project.
    Rm(commands::remove::RmArgs),
    /// Remove every ended sandbox (or those ended before --older-than).
    Prune(commands::remove::PruneArgs),
    /// The sandbox metrics (Prometheus text), derived from the database.
    Metrics(commands::inspect::MetricsArgs),
    /// Show which protections the native runtime can enforce on this host.
    Doctor(commands::doctor::DoctorArgs),
    /// Egress policies: what one decides for a destination (`egress check`).
    Egress(commands::egress::EgressArgs),
    /// The resident service: keeps projects open and sandboxes prepared so that `run` is
    /// a thin client (start, serve, stop, status).
    Daemon(commands::daemon::DaemonArgs),
    /// Serve sandboxes to remote clients over HTTP (the codeplane runtime's server).
    // Boxed: its many operator flags would make every other variant as large.
    Serve(Box<commands::serve::ServeArgs>),
    /// Sessions: a sandbox held across many commands (start, exec, read, write, stop, ls).
    Session(commands::session::SessionArgs),
    /// An MCP server (stdio) whose tools drive sessions over one project.
    Mcp(commands::mcp::McpArgs),
    /// The persistent homes `--home NAME` gives a step (ls, rm).
    Home(commands::home::HomeArgs),
}

/// Rust ignores SIGPIPE, so printing into a pipe whose reader is gone is an EPIPE error, which
/// `println!` turns into a panic (a backtrace after `ls | head`). This hook turns exactly that
/// panic into a quiet exit with 141 (128 + SIGPIPE, what a shell reports for `cat` there);
/// every other panic is reported as before. (Restoring SIGPIPE's default would need unsafe
/// code, which this crate forbids.)
fn quiet_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("os error 32") {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn run(cli: &Cli) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Command::Bundle(args) => commands::bundle::run(args, cli.json),
        Command::Run(args) => commands::run::run(args, cli.json),
        Command::Review(args) => commands::review::review(args, cli.json),
        Command::Accept(args) => commands::review::accept(args, cli.json),
        Command::Reject(args) => commands::review::reject(args, cli.json),
        Command::Hold(args) => commands::review::hold(args, cli.json),
        Command::Ls(args) => commands::inspect::ls(args, cli.json),
        Command::Show(args) => commands::inspect::show(args, cli.json),
        Command::Events(args) => commands::inspect::events(args, cli.json),
        Command::Logs(args) => commands::inspect::logs(args, cli.json),
        Command::Rm(args) => commands::remove::rm(args, cli.json),
        Command::Prune(args) => commands::remove::prune(args, cli.json),
        Command::Metrics(args) => commands::inspect::metrics(args, cli.json),
        Command::Doctor(args) => commands::doctor::run(args, cli.json),
        Command::Egress(args) => commands::egress::run(args, cli.json),
        Command::Serve(args) => commands::serve::run(args),
        Command::Session(args) => commands::session::run(args, cli.json),
        Command::Mcp(args) => commands::mcp::run(args),
        Command::Home(args) => commands::home::run(args, cli.json),
        Command::Daemon(args) => commands::daemon::run(args, cli.json, parse_run),
    }
}

/// A `run` command line's arguments (and `--json`), as the resident service parses a
/// client's; `None` for any other command line (or one that does not parse).
pub(crate) fn parse_run(argv: &[std::ffi::OsString]) -> Option<(commands::run::RunArgs, bool)> {
    // The command tree is built once per service, not per request (building it is most of a
    // parse: ~0.2 ms of each served step). clap parses again and again with a built one. It
    // reads the defaults of arguments taken from the environment (`SMITHERS_DB`, the
    // workspace mode) when it is built: right for every request only because a client is
    // served only with the service's own environment (see `smithers_resident::IGNORED_ENV`).
    static COMMAND: std::sync::OnceLock<std::sync::Mutex<clap::Command>> =
        std::sync::OnceLock::new();
    let matches = COMMAND
        .get_or_init(|| std::sync::Mutex::new(<Cli as clap::CommandFactory>::command()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .try_get_matches_from_mut(argv)
        .ok()?;
    let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).ok()?;
    let json = cli.json;
    match cli.command {
        Command::Run(args) => Some((*args, json)),
        _ => None,
    }
}

/// Whether `argv` is a `run` (`run ...` or `--json run ...`), and whether `--json` is among
/// its options: `None` for any other command.
fn run_command_line(argv: &[std::ffi::OsString]) -> Option<bool> {
    let rest = match argv.get(1).and_then(|a| a.to_str()) {
        Some("run") => &argv[2..],
        Some("--json") if argv.get(2).and_then(|a| a.to_str()) == Some("run") => return Some(true),
        _ => return None,
    };
    Some(
        rest.iter()
            .take_while(|a| a.as_os_str() != "--")
            .any(|a| a.as_os_str() == "--json"),
    )
}

/// The hint for `run echo hi`: a word clap does not know, in a `run` command line, is most
/// likely the step's command written without the `--` before it.
fn run_without_dashes_hint(argv: &[std::ffi::OsString], e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument || run_command_line(argv).is_none() {
        return None;
    }
    let Some(ContextValue::String(word)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    if word.starts_with('-') {
        return None;
    }
    let at = argv
        .iter()
        .position(|a| a.to_str() == Some(word.as_str()))?;
    let command: Vec<String> = argv[at..]
        .iter()
        .map(|a| smithers_terminal::escape(&a.to_string_lossy(), smithers_terminal::Inert::LINE))
        .collect();
    Some(format!(
        "tip: the step's command goes after `--`: smithers-sandbox run [OPTIONS] -- {}",
        command.join(" ")
    ))
}

/// Hands a `run` to the resident service when one of this build runs and admits it:
/// `Some(exit status)` when it ran the step, `None` when this process should run it.
fn through_resident_service(argv: &[std::ffi::OsString], json: bool) -> Option<ExitCode> {
    use smithers_resident::{client, Mode};
    let mode = match Mode::from_env() {
        Ok(Mode::Off) => return None,
        Ok(mode) => mode,
        Err(why) => {
            let err = output::coded_error(
                smithers_errors::ErrorCode::InvalidInput,
                why,
                serde_json::Value::Null,
            );
            return Some(output::report_error(&err, json));
        }
    };
    match client::run(argv) {
        client::Served::Exit(code) => Some(ExitCode::from(code)),
        // Parsed here, where clap says what is wrong with it (or prints the help asked for).
        client::Served::NotServed(why) if why == commands::daemon::NOT_A_RUN => None,
        // Not served: this process runs it (and parses it, once, in `main`).
        client::Served::NotServed(_) if mode != Mode::Require => None,
        // Under `require` too, help or a usage error is this process's to print.
        client::Served::NotServed(_) if Cli::try_parse_from(argv).is_err() => None,
        client::Served::NotServed(why) => {
            let err = output::coded_error(
                smithers_errors::ErrorCode::InvalidInput,
                format!(
                    "the resident service did not serve this run ({}=require): {}",
                    smithers_resident::MODE_ENV,
                    output::inert(&why)
                ),
                serde_json::Value::Null,
            );
            Some(output::report_error(&err, json))
        }
    }
}

fn main() -> ExitCode {
    // The sandbox's init is this same binary run with a hidden first argument: it must be
    // dispatched before anything else (no argument parsing, no async runtime).
    if std::env::args_os().nth(1).as_deref()
        == Some(std::ffi::OsStr::new(
            smithers_runtime_native::INIT_SUBCOMMAND,
        ))
    {
        let args: Vec<String> = std::env::args().skip(2).collect();
        return ExitCode::from(smithers_sandbox_init::run(&args).clamp(0, 255) as u8);
    }
    // A `run` goes to the resident service first, before this process parses its arguments
    // (the service parses them; one it cannot is declined and parsed here, to say why).
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(json) = run_command_line(&argv) {
        if let Some(code) = through_resident_service(&argv, json) {
            return code;
        }
    }
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => {
            let hint = run_without_dashes_hint(&argv, &e);
            let _ = e.print();
            if let Some(hint) = hint {
                eprintln!("{hint}");
            }
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    // Commands that only print (`ls | head`, `review | less`) end quietly when their reader
    // goes away, as `cat` does. `run`, `accept`, `reject`, `serve` and `bundle` are left out:
    // they have work to finish (run's step, an apply) whatever the reader does.
    if matches!(
        cli.command,
        Command::Ls(_)
            | Command::Show(_)
            | Command::Events(_)
            | Command::Logs(_)
            | Command::Metrics(_)
            | Command::Doctor(_)
            | Command::Egress(_)
            | Command::Review(_)
    ) {
        quiet_on_broken_pipe();
    }
    match run(&cli) {
        Ok(code) => code,
        Err(err) => output::report_error(&err, cli.json),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
