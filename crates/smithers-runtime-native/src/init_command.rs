//! How the init is started: a dedicated binary, or this executable with a hidden subcommand,
//! and where it is found.

use std::path::{Path, PathBuf};

use smithers_sandbox_init::INIT_ENV;

/// File name of the init executable looked up next to the current executable.
pub const INIT_BIN: &str = "smithers-sandbox-init";

/// Hidden first argument with which `smithers-sandbox` runs as the init.
pub const INIT_SUBCOMMAND: &str = "__sandbox-init";

/// How to start the init: a program and the arguments before the init's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl InitCommand {
    /// A dedicated `smithers-sandbox-init` binary.
    pub fn binary(program: impl Into<PathBuf>) -> InitCommand {
        InitCommand {
            program: program.into(),
            args: vec![],
        }
    }

    /// The current executable run with [`INIT_SUBCOMMAND`] (for a CLI that dispatches to
    /// [`smithers_sandbox_init::run`]).
    pub fn current_exe_subcommand() -> std::io::Result<InitCommand> {
        Ok(InitCommand {
            program: std::env::current_exe()?,
            args: vec![INIT_SUBCOMMAND.to_string()],
        })
    }

    /// Whether this is [`InitCommand::current_exe_subcommand`]: the init is the code linked in
    /// this very process, which may then fork one itself (see [`crate::NativeRuntime::prestart`]).
    pub fn is_current_exe_subcommand(&self) -> bool {
        self.args.len() == 1
            && self.args[0] == INIT_SUBCOMMAND
            && std::env::current_exe().is_ok_and(|exe| exe == self.program)
    }

    /// Finds the init: `$SMITHERS_SANDBOX_INIT`, then `smithers-sandbox-init` next to the
    /// current executable or in its parent directory (test binaries live in `target/*/deps`).
    pub fn locate() -> Result<InitCommand, String> {
        if let Some(path) = std::env::var_os(INIT_ENV) {
            let path = PathBuf::from(path);
            return if path.is_file() {
                Ok(InitCommand::binary(path))
            } else {
                Err(format!(
                    "${INIT_ENV} names {} which is not a file",
                    path.display()
                ))
            };
        }
        let exe = std::env::current_exe().map_err(|e| format!("current executable: {e}"))?;
        let mut tried = Vec::new();
        for dir in exe
            .parent()
            .into_iter()
            .chain(exe.parent().and_then(Path::parent))
        {
            let candidate = dir.join(INIT_BIN);
            if candidate.is_file() {
                return Ok(InitCommand::binary(candidate));
            }
            tried.push(candidate.display().to_string());
        }
        Err(format!(
            "no {INIT_BIN} found (tried {}); set ${INIT_ENV}",
            tried.join(", ")
        ))
    }
}
