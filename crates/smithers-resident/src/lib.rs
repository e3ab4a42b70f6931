//! The resident service's plumbing (`smithers-sandbox daemon`).
//!
//! A `run` as its own process pays, every time, for what does not depend on its step: the
//! exec of a large binary (its relocations and page faults), the store's open and recovery
//! pass, and the sandbox's namespaces and mounts. A resident service of the same user keeps
//! all of that ready: its stores open and its warm pool armed, so that `run` is a thin client
//! that hands the service its request and its stdio, and waits.
//!
//! This crate is the part of it that knows nothing of steps:
//!
//! - [`place`]: where the service listens. A directory only this user can enter, checked
//!   (owner, mode, not a symlink) before it is used, and a socket named after the build of
//!   the executable, so that a client only ever reaches a service of its own build.
//! - [`wire`]: the request. The client's argv, environment and umask, with its stdin, stdout,
//!   stderr and working directory passed as file descriptors (`SCM_RIGHTS`), so the service
//!   reads and writes exactly where the client would have.
//! - [`server`]: who is served. The peer must be the same user and group (`SO_PEERCRED`),
//!   in the same mount, network, user, pid, IPC, UTS and cgroup namespaces and root, and have
//!   the same environment (but for a few variables a shell changes as it goes), and must
//!   answer a challenge only a process that may inspect the service can (so no Landlock
//!   domain narrower than the service's confines it: [`peer::Challenge`]); anything else is
//!   declined with the reason, and the client runs the step itself. A served request's
//!   stdio and working directory replace the service's for its duration.
//! - [`client`]: the other end. It forwards the first Ctrl-C as a cancellation and exits at
//!   the second, as `run` does; a client that dies makes the service cancel its step.
//!
//! - [`session`]: the protocol of a held session's socket (`smithers-sandbox session`), whose
//!   holder is a process of its own, not this service.
//!
//! Requests are served one at a time: a client that finds the service busy runs its step
//! itself, as it does when no service is running.

pub mod client;
pub mod peer;
pub mod place;
pub mod server;
pub mod session;
mod vars;
pub mod wire;

pub use vars::{IGNORED_ENV, MODE_ENV};

/// [`MODE_ENV`]'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Auto,
    Off,
    Require,
}

impl Mode {
    /// The mode `$SMITHERS_RESIDENT` names; an unknown value is an error (a typo in `off`
    /// must not silently leave the service in use).
    pub fn from_env() -> Result<Mode, String> {
        match std::env::var(MODE_ENV).as_deref() {
            Err(_) | Ok("") | Ok("auto") => Ok(Mode::Auto),
            Ok("off") => Ok(Mode::Off),
            Ok("require") => Ok(Mode::Require),
            Ok(other) => Err(format!(
                "${MODE_ENV} must be auto, off or require, not {other:?}"
            )),
        }
    }
}

/// Makes `command` start in a session of its own (`setsid`): a detached service gets no
/// SIGINT or SIGHUP meant for the terminal it was started from.
pub fn detach(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: setsid is one, and nothing is allocated.
    unsafe {
        command.pre_exec(|| {
            rustix::process::setsid()
                .map(|_| ())
                .map_err(std::io::Error::from)
        });
    }
}
