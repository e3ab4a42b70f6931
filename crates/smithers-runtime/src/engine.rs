//! The engine contract: a sandbox's own life, apart from any step's.
//!
//! A step is one use of a sandbox; a session is many. An [`Engine`] makes a sandbox
//! (`create`, `ship`), brings it up (`start`: namespaces or container up, workspace mounted,
//! ready for commands), runs commands in it (`exec`, any number of times, concurrently where
//! [`EngineCapabilities::concurrent_execs`]), ends its processes (`stop`) and removes it
//! (`destroy`). The step pipeline is ship → start → exec → stop → collect over it; sessions
//! hold a started sandbox across many execs.
//!
//! # Semantics every engine guarantees
//!
//! * **create** validates the config and refuses, up front, any control it cannot enforce,
//!   as [`crate::Runtime::create`] does; nothing runs yet. The handle is plain data.
//! * **start** returns once a command can be exec'd: isolation in place (namespaces or
//!   container, Landlock, seccomp, limits), the workspace mounted at `/workspace`. Starting a
//!   started sandbox, or exec in one not started, is [`RuntimeError::OutOfOrder`].
//! * **exec** runs one command in the started sandbox: its stdout and stderr go to `output`
//!   byte for byte as written ([`crate::OutputEvent::Output`]; an engine keeps no copy and
//!   caps nothing: caps are the caller's), its stdin is the request's stream or `/dev/null`.
//!   It returns when the command's main process has ended and its output has been relayed;
//!   what is left of its process group is killed then. A non-zero exit, a signal, the
//!   request's timeout and `cancel` are [`ExecExit`]s, not errors; on a timeout or a cancel
//!   the command's group is killed and the sandbox stays usable for the next exec. Each exec's
//!   environment and working directory are its own; the workspace and the sandbox's processes
//!   started outside their group are shared.
//! * **pause** / **resume** (where [`EngineCapabilities::pause`]) hold every process of the
//!   sandbox still and let it go again: the workspace can then be read without a process
//!   changing it meanwhile (swapping a directory for a link to a host path, say).
//! * **stop** kills every process of the sandbox and returns when all are gone; the
//!   workspace stays (to be collected). Idempotent; a stopped sandbox cannot exec.
//! * **destroy** removes every host resource of the sandbox but a collected bundle.
//!   Idempotent, in any state, and from another process with a handle read back from the
//!   database: a handle is never trusted for paths (see [`SandboxHandle::project_root`]).
//! * An engine that cannot do a verb says so in [`EngineCapabilities`]; the caller never
//!   finds out by a failure.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::{
    EnforcementReport, OutputSink, RequestBundle, RuntimeError, RuntimeKind, SandboxConfig,
    SandboxHandle, ShipReport, StepStdin, Termination,
};

/// A backend's name: an open set (a new backend needs no change to this contract), with the
/// known ones as constants. Serialised as its string, the `runtime` column's contract.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BackendName(Cow<'static, str>);

impl BackendName {
    /// Local Linux namespaces (named after the original's use of bubblewrap).
    pub const NATIVE: BackendName = BackendName(Cow::Borrowed("bubblewrap"));
    /// A container engine through its API socket.
    pub const DOCKER: BackendName = BackendName(Cow::Borrowed("docker"));
    /// A remote sandbox host over HTTP.
    pub const CODEPLANE: BackendName = BackendName(Cow::Borrowed("codeplane"));
    /// A Ray fleet.
    pub const RAY: BackendName = BackendName(Cow::Borrowed("ray"));

    /// A backend by name: lower-case ASCII letters, digits and `-`, 1 to 32 bytes (it is
    /// stored, shown and used in paths).
    pub fn new(name: impl Into<String>) -> Result<BackendName, RuntimeError> {
        let name = name.into();
        let valid = (1..=32).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !valid {
            return Err(RuntimeError::InvalidControl {
                control: "runtime",
                reason: format!("{name:?} is not a backend name (a-z, 0-9 and '-', 1 to 32 bytes)"),
            });
        }
        Ok(BackendName(Cow::Owned(name)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BackendName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for BackendName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BackendName({})", self.0)
    }
}

impl From<RuntimeKind> for BackendName {
    fn from(kind: RuntimeKind) -> BackendName {
        BackendName(Cow::Borrowed(kind.as_str()))
    }
}

/// What an engine can do beyond the verbs every engine has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineCapabilities {
    /// Several execs may run in one sandbox at once.
    pub concurrent_execs: bool,
    /// An exec's stdin may be a stream (else only `/dev/null`).
    pub exec_stdin: bool,
    /// `pause` and `resume` hold the sandbox's processes still (else they are refused).
    #[serde(default)]
    pub pause: bool,
    /// `snapshot` and `restore` work (else they are refused).
    #[serde(default)]
    pub snapshot: bool,
    /// A config's `workspace_layers` starts a sandbox from a snapshot (else refused).
    #[serde(default)]
    pub fork: bool,
    /// An exec may have a terminal ([`ExecRequest::terminal`]; else refused).
    #[serde(default)]
    pub terminal: bool,
}

/// For an engine that gives no terminal and keeps no record of its own of a sandbox's life:
/// refuses an exec that asks for either, rather than running it without.
pub fn refuse_terminal(backend: &BackendName, request: &ExecRequest) -> Result<(), RuntimeError> {
    if request.terminal.is_some() {
        return Err(RuntimeError::InvalidControl {
            control: "terminal",
            reason: format!(
                "the {backend} engine cannot give a command a terminal (the native one can)"
            ),
        });
    }
    if request.is_step {
        return Err(RuntimeError::InvalidControl {
            control: "exec",
            reason: format!("the {backend} engine cannot record a command as the sandbox's step"),
        });
    }
    Ok(())
}

/// A frozen state of a sandbox's workspace (its files, never its processes): what `snapshot`
/// made, to `restore` the sandbox to or to start another from
/// ([`crate::SandboxConfig::workspace_layers`]). Plain data, meaningful to the engine that
/// made it, which checks it again wherever it is given back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// The engine's frozen layers, top first (empty: the project as it is).
    pub layers: Vec<String>,
    /// How long the sandbox's processes were held still to make it, in microseconds (0:
    /// not at all, nothing had been written since the last).
    #[serde(default)]
    pub held_us: u64,
}

/// One command for a started sandbox.
#[derive(Debug, Clone, Default)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    /// The working directory: absolute inside the sandbox, or relative to `/workspace`
    /// (confined to it); `None`: `/workspace`.
    pub cwd: Option<String>,
    /// Variables set for this command only, over the sandbox's own environment (the
    /// config's `env`, `HOME`, `PATH`, the proxy variables of an egress policy).
    pub env: Vec<(String, String)>,
    /// Its stdin: `/dev/null` unless a stream is given (taken once).
    pub stdin: StepStdin,
    /// Killed (its group) after this long; `None`: no bound of its own.
    pub timeout: Option<Duration>,
    /// A pseudo-terminal of the sandbox's own as the command's stdin, stdout, stderr and
    /// controlling terminal (where [`EngineCapabilities::terminal`]; else refused): its output
    /// comes as [`crate::OutputStream::Stdout`], exactly as the terminal gives it; `stdin` is
    /// typed into it.
    pub terminal: Option<TerminalRequest>,
    /// This command is the sandbox's step (`run -t`): how it ends is how the sandbox's life
    /// ended, recorded at `stop` for `collect` as a one-shot step's is (else a stopped
    /// sandbox ended well, whatever its commands did).
    pub is_step: bool,
}

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalSize {
    pub rows: u16,
    pub cols: u16,
}

impl Default for TerminalSize {
    /// The size a terminal has when nobody says (VT100's).
    fn default() -> Self {
        TerminalSize { rows: 24, cols: 80 }
    }
}

/// A command's terminal: its size now, and each change the caller's terminal makes (a
/// window resized), passed on to the command as it happens.
#[derive(Debug, Clone)]
pub struct TerminalRequest {
    pub size: tokio::sync::watch::Receiver<TerminalSize>,
}

/// How one exec ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecExit {
    /// `Exited`, `Signaled`, `Timeout` or `Cancelled`.
    pub termination: Termination,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    #[serde(with = "crate::types::duration_ms")]
    pub duration: Duration,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
}

/// A sandbox's life. Object safe: callers hold `Arc<dyn Engine>`.
#[async_trait]
pub trait Engine: Send + Sync + fmt::Debug {
    /// Which backend this is.
    fn backend(&self) -> BackendName;

    /// What this engine can do beyond the common verbs.
    fn capabilities(&self) -> EngineCapabilities;

    /// What this host can enforce for this engine.
    async fn probe(&self) -> EnforcementReport;

    /// Validates the config, refuses what cannot be enforced, prepares host state.
    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError>;

    /// Makes the request and the workspace view ready for `start`.
    async fn ship(
        &self,
        handle: &SandboxHandle,
        request: &RequestBundle,
    ) -> Result<ShipReport, RuntimeError>;

    /// Brings the sandbox up, ready for `exec`.
    async fn start(&self, handle: &SandboxHandle) -> Result<(), RuntimeError>;

    /// Runs one command in the started sandbox (see the module docs).
    async fn exec(
        &self,
        handle: &SandboxHandle,
        request: ExecRequest,
        cancel: CancellationToken,
        output: &dyn OutputSink,
    ) -> Result<ExecExit, RuntimeError>;

    /// Holds every process of the started sandbox still (none runs, none writes) until
    /// `resume`, so that its workspace can be read as it is (a session's change so far);
    /// commands exec'd meanwhile start at the resume. Refused by an engine that cannot
    /// ([`EngineCapabilities::pause`] false): the caller must not read a running sandbox's
    /// workspace, whose processes can swap a path for a link while it is read.
    async fn pause(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        let _ = handle;
        Err(RuntimeError::ControlUnsupported {
            runtime: "engine",
            control: "pause",
            reason: format!("the {} engine cannot hold a sandbox still", self.backend()),
        })
    }

    /// Lets the paused sandbox's processes run again. Idempotent.
    async fn resume(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        let _ = handle;
        Err(RuntimeError::ControlUnsupported {
            runtime: "engine",
            control: "pause",
            reason: format!("the {} engine cannot hold a sandbox still", self.backend()),
        })
    }

    /// Freezes the started sandbox's workspace as it is now, without stopping it: its
    /// processes go on over the same files, and its later writes are not the snapshot's.
    /// Refused ([`RuntimeError::Busy`]) while a process holds a file or a working directory
    /// in the workspace, and by an engine that cannot ([`EngineCapabilities::snapshot`]).
    async fn snapshot(&self, handle: &SandboxHandle) -> Result<Snapshot, RuntimeError> {
        let _ = handle;
        Err(no_snapshot(self.backend()))
    }

    /// Puts the started sandbox's workspace back to `snapshot` (one this sandbox made or
    /// started from); what was written since is dropped. Refused as `snapshot` is.
    async fn restore(
        &self,
        handle: &SandboxHandle,
        snapshot: &Snapshot,
    ) -> Result<(), RuntimeError> {
        let _ = (handle, snapshot);
        Err(no_snapshot(self.backend()))
    }

    /// Kills every process of the sandbox; the workspace stays. Idempotent.
    async fn stop(&self, handle: &SandboxHandle) -> Result<(), RuntimeError>;

    /// Removes every host resource of the sandbox but its bundle. Idempotent.
    async fn destroy(&self, handle: &SandboxHandle) -> Result<(), RuntimeError>;
}

/// A session's checkpoints by name (`cp-1`, `cp-2`, … in the order made), what the CLI's
/// holder and `serve` both keep for a live session: the snapshots themselves never leave the
/// process that holds the session, only their names.
#[derive(Debug, Default)]
pub struct Checkpoints {
    made: std::sync::Mutex<Vec<Snapshot>>,
}

impl Checkpoints {
    /// How many names a session keeps.
    pub const MAX: usize = 1000;

    /// The index a checkpoint's name stands for (`cp-N`, N from 1, at most 9 digits).
    pub fn index_of(name: &str) -> Option<usize> {
        let digits = name.strip_prefix("cp-")?;
        if digits.is_empty() || digits.len() > 9 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse::<usize>().ok()?.checked_sub(1)
    }

    fn made(&self) -> std::sync::MutexGuard<'_, Vec<Snapshot>> {
        self.made.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refuses when no more names may be made (said before a snapshot is taken, so that a
    /// refused name leaves no layer behind).
    pub fn room(&self) -> Result<(), RuntimeError> {
        match self.made().len() >= Self::MAX {
            true => Err(RuntimeError::InvalidControl {
                control: "checkpoint",
                reason: format!("a session keeps {} checkpoints at most", Self::MAX),
            }),
            false => Ok(()),
        }
    }

    /// Names `snapshot`: nothing written since the last gives the last's name.
    pub fn add(&self, snapshot: Snapshot) -> Result<String, RuntimeError> {
        let mut made = self.made();
        if made
            .last()
            .is_none_or(|last| last.layers != snapshot.layers)
        {
            if made.len() >= Self::MAX {
                drop(made);
                return self.room().map(|()| String::new());
            }
            made.push(snapshot);
        }
        Ok(format!("cp-{}", made.len()))
    }

    /// The snapshot named `name`, if this session made it.
    pub fn named(&self, name: &str) -> Option<Snapshot> {
        self.made().get(Self::index_of(name)?).cloned()
    }
}

fn no_snapshot(backend: BackendName) -> RuntimeError {
    RuntimeError::ControlUnsupported {
        runtime: "engine",
        control: "checkpoint",
        reason: format!("the {backend} engine cannot freeze a sandbox's workspace"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_names_are_cp_and_a_number_and_repeat_for_nothing_new() {
        let c = Checkpoints::default();
        let snap = |l: &str| Snapshot {
            layers: vec![l.to_string()],
            held_us: 0,
        };
        assert_eq!(c.add(snap("a")).unwrap(), "cp-1");
        assert_eq!(c.add(snap("a")).unwrap(), "cp-1");
        assert_eq!(c.add(snap("b")).unwrap(), "cp-2");
        assert_eq!(c.named("cp-2").unwrap().layers, ["b"]);
        for bad in [
            "cp-0",
            "cp-3",
            "cp-",
            "cp-+1",
            "cp-1 ",
            "--root=/",
            "cp-99999999999",
        ] {
            assert!(c.named(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn known_backends_keep_their_stored_names() {
        for kind in [
            RuntimeKind::Bubblewrap,
            RuntimeKind::Docker,
            RuntimeKind::Codeplane,
            RuntimeKind::Ray,
        ] {
            let name = BackendName::from(kind);
            assert_eq!(name.as_str(), kind.as_str());
            assert_eq!(serde_json::to_string(&name).unwrap(), format!("\"{kind}\""));
        }
        assert_eq!(
            BackendName::NATIVE,
            BackendName::from(RuntimeKind::Bubblewrap)
        );
    }

    #[test]
    fn a_new_backend_needs_no_change_here_but_its_name_is_checked() {
        assert_eq!(
            BackendName::new("firecracker").unwrap().as_str(),
            "firecracker"
        );
        for bad in ["", "Docker", "a/b", "../x", "x y", &"a".repeat(33)] {
            assert!(BackendName::new(bad).is_err(), "{bad:?}");
        }
    }
}
