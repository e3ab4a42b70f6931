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
}

fn run(cli: &Cli) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Command::Bundle(args) => commands::bundle::run(args, cli.json),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
