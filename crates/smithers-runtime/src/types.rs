//! The data that flows through the five verbs. All plain, serialisable data: a handle is
//! stored in the database so a new process can find and clean up what a dead one left.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::RuntimeKind;
use crate::error::RuntimeError;

/// What `create` returns and every later verb takes. Local layout:
/// `<rootDir>/.smithers/sandboxes/<runId>/<sandboxId>/{request,result}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxHandle {
    pub runtime: RuntimeKind,
    pub run_id: String,
    pub sandbox_id: String,
    /// Host directory owned by this sandbox (state, request, result).
    pub sandbox_root: PathBuf,
    /// Host path of the request directory (holds the request JSON).
    pub request_path: PathBuf,
    /// Host path where `collect` writes the result bundle.
    pub result_path: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
    /// Backend-specific state needed to clean up from another process (cgroup paths, upper
    /// layer location, remote ids). Opaque to everyone but the backend.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub backend: Value,
}

impl SandboxHandle {
    /// The project root this handle's directories belong to, checked, for cleaning up from a
    /// handle read back from the database (which lives in the project tree, so a cloned
    /// repository can ship a crafted one): the ids are valid ids, `sandbox_root` is exactly
    /// `<root>/.smithers/sandboxes/<runId>/<sandboxId>` and `request_path` / `result_path`
    /// are its `request` / `result`. Anything else names a host directory no runtime made for
    /// these ids, and is refused before anything is removed.
    pub fn project_root(&self) -> Result<PathBuf, RuntimeError> {
        crate::config::validate_id("runId", &self.run_id).map_err(untrusted_handle)?;
        crate::config::validate_id("sandboxId", &self.sandbox_id).map_err(untrusted_handle)?;
        let refuse = |what: &str| {
            untrusted_handle(RuntimeError::InvalidControl {
                control: "handle",
                reason: format!(
                    "its {what} is not the directory this runtime derives for {}/{}",
                    self.run_id, self.sandbox_id
                ),
            })
        };
        let root = self
            .sandbox_root
            .ancestors()
            .nth(4)
            .filter(|r| r.is_absolute())
            .ok_or_else(|| refuse("sandboxRoot"))?
            .to_path_buf();
        if self.sandbox_root != Self::derived_sandbox_root(&root, &self.run_id, &self.sandbox_id) {
            return Err(refuse("sandboxRoot"));
        }
        if self.request_path != self.sandbox_root.join("request") {
            return Err(refuse("requestPath"));
        }
        if self.result_path != self.sandbox_root.join("result") {
            return Err(refuse("resultPath"));
        }
        Ok(root)
    }

    /// `<root>/.smithers/sandboxes/<runId>/<sandboxId>`: where every local runtime keeps a
    /// sandbox's request and result.
    pub fn derived_sandbox_root(root: &Path, run_id: &str, sandbox_id: &str) -> PathBuf {
        root.join(".smithers")
            .join("sandboxes")
            .join(run_id)
            .join(sandbox_id)
    }

    /// Refuses when any directory from `<root>/.smithers` down to the sandbox root is a
    /// symlink (or not a directory): removing "the request directory" through a planted
    /// `.smithers -> /home/user` link would remove a directory elsewhere. A missing one is
    /// fine (nothing left to remove there).
    pub fn check_project_dirs_real(&self, root: &Path) -> Result<(), RuntimeError> {
        let mut dir = root.to_path_buf();
        for part in [".smithers", "sandboxes", &self.run_id, &self.sandbox_id] {
            dir.push(part);
            match std::fs::symlink_metadata(&dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(RuntimeError::InvalidControl {
                        control: "handle",
                        reason: format!(
                            "{} is not a directory (a link?); the sandbox's project directories are left alone",
                            dir.display()
                        ),
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(RuntimeError::io("inspect", &dir, e)),
            }
        }
        Ok(())
    }
}

fn untrusted_handle(e: RuntimeError) -> RuntimeError {
    RuntimeError::InvalidControl {
        control: "handle",
        reason: format!("the stored handle is not trusted to name host objects: {e}"),
    }
}

/// What `ship` makes available inside the sandbox: the request JSON at
/// `$SMITHERS_SANDBOX_REQUEST_PATH` (and the workspace, which the backend maps from `rootDir`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestBundle {
    /// The request document: `{status:"pending", sandboxId, runtime, input}`.
    pub request: Value,
}

/// What `ship` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShipReport {
    /// Bytes actually transferred or written for the request (not the size of the project when
    /// the workspace is a copy-on-write view).
    pub bundle_size_bytes: u64,
}

/// Where a fleet placed a sandbox (what [`crate::Runtime::place`] reports).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// The node's address, as the engine reported it.
    pub node: String,
    /// The engine's id of the node.
    pub node_id: String,
    /// The engine's id of the lease (a Ray job's submission id).
    pub lease: String,
    /// How long the lease waited for a free slot, in milliseconds.
    pub queued_ms: u64,
    /// Whether an idle lease of a warm pool was claimed instead of a new one started.
    pub warm: bool,
}

/// Told while a sandbox waits for its place: the orchestrator turns each call into a
/// `SandboxQueued` event.
pub trait PlacementSink: Send + Sync {
    /// The lease is waiting, for the engine's `reason` (its own words).
    fn queued(&self, reason: &str);
}

/// A [`PlacementSink`] that tells nobody (tests, callers without events).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPlacementEvents;

impl PlacementSink for NoPlacementEvents {
    fn queued(&self, _reason: &str) {}
}

/// The command `execute` runs inside the sandbox, with `/workspace` as its working directory
/// unless `cwd` says otherwise (a path inside the sandbox).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepCommand {
    pub argv: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// What the command reads on its stdin: nothing (`/dev/null`) unless the caller hands a
    /// reader in. Never serialised (it is a live stream, and may carry secrets).
    #[serde(skip)]
    pub stdin: StepStdin,
}

/// The command's stdin: `/dev/null`, or a reader the runtime copies into the command's
/// stdin as the command reads it (the CLI's own stdin, for `echo x | run -- wc`). Taken once:
/// the first `execute` of the command gets it, a second one `/dev/null`. A runtime that cannot
/// pass a stream refuses a command that has one ([`StepStdin::is_given`]).
#[derive(Clone, Default)]
pub struct StepStdin(Option<std::sync::Arc<std::sync::Mutex<Option<StdinReader>>>>);

/// The reader behind a [`StepStdin`].
pub type StdinReader = Box<dyn std::io::Read + Send>;

impl StepStdin {
    /// A stdin read from `reader`.
    pub fn from_reader(reader: impl std::io::Read + Send + 'static) -> StepStdin {
        StepStdin(Some(std::sync::Arc::new(std::sync::Mutex::new(Some(
            Box::new(reader),
        )))))
    }

    /// Whether a reader was given (taken or not).
    pub fn is_given(&self) -> bool {
        self.0.is_some()
    }

    /// The reader, once.
    pub fn take(&self) -> Option<StdinReader> {
        let slot = self.0.as_ref()?;
        slot.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl std::fmt::Debug for StepStdin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_given() {
            "StepStdin(reader)"
        } else {
            "StepStdin(/dev/null)"
        })
    }
}

/// Two stdins are equal when both are `/dev/null` or both are the same reader.
impl PartialEq for StepStdin {
    fn eq(&self, other: &StepStdin) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for StepStdin {}

/// Why a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Termination {
    /// Exited on its own (any exit code).
    Exited,
    /// Killed by a signal it did not get from us.
    Signaled,
    /// Wall-clock timeout: every process of the sandbox was killed.
    Timeout,
    /// Cancelled by the caller: every process of the sandbox was killed.
    Cancelled,
    /// Killed by the memory limit (OOM in its cgroup).
    Memory,
    /// The pids limit was hit (forks failed); the command may still have exited.
    Pids,
    /// The output cap was hit (output truncated, command killed when configured to).
    Output,
    /// The disk limit of the writable layer was hit.
    Disk,
}

impl Termination {
    /// The `reason` string recorded for a limit hit (`timeout`, `memory`, `pids`, `output`, `disk`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Termination::Exited => "exited",
            Termination::Signaled => "signaled",
            Termination::Timeout => "timeout",
            Termination::Cancelled => "cancelled",
            Termination::Memory => "memory",
            Termination::Pids => "pids",
            Termination::Output => "output",
            Termination::Disk => "disk",
        }
    }
}

/// Resources the sandbox used, as measured by the backend (cgroup counters where available).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceUsage {
    pub cpu_time_ms: Option<u64>,
    pub peak_memory_bytes: Option<u64>,
    pub max_pids: Option<u64>,
    pub disk_bytes: Option<u64>,
}

/// How a protection stands on this sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProtectionStatus {
    /// In force.
    Enforced,
    /// Partly in force, or replaced by a weaker mechanism; `detail` says how.
    Degraded,
    /// Not in force on this host; `fix` says what would enable it.
    Unavailable,
    /// Deliberately off because the caller asked (e.g. network with allowNetwork).
    Disabled,
}

/// One row of the enforcement report (`network`, `seccomp`, `landlock`, `memory`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Protection {
    pub name: String,
    pub status: ProtectionStatus,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// Which protections were (or can be) in force. Returned by `probe` for the host, and in every
/// [`ExecOutcome`] for the sandbox that actually ran.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnforcementReport {
    pub runtime: Option<RuntimeKind>,
    pub protections: Vec<Protection>,
}

impl EnforcementReport {
    pub fn get(&self, name: &str) -> Option<&Protection> {
        self.protections.iter().find(|p| p.name == name)
    }

    pub fn is_enforced(&self, name: &str) -> bool {
        self.get(name)
            .is_some_and(|p| p.status == ProtectionStatus::Enforced)
    }
}

/// What `execute` returns when the runtime worked, whatever the command did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecOutcome {
    pub termination: Termination,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    #[serde(with = "duration_ms")]
    pub duration: Duration,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub usage: ResourceUsage,
    pub enforcement: EnforcementReport,
    /// The result JSON the step wrote at `$SMITHERS_SANDBOX_RESULT_PATH`, or printed as its
    /// stdout, when it was valid JSON (`{status?, outputs?}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// What the egress engine decided (its summary: policy, mode, counts, destinations),
    /// for a step that ran with an egress policy; each decision is also a record of the log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Value>,
    /// Microseconds from `execute` being called to the command's exec (its program loaded,
    /// about to run), where the runtime can tell (the native runtime); what a step waits
    /// before its own code runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_started_after_us: Option<u64>,
}

impl ExecOutcome {
    /// The end of a sandbox's life that ran no command of its own (a session's: each of its
    /// commands had its own end): no output, no usage, no result, a default report.
    pub fn of_life(termination: Termination, exit_code: Option<i32>, duration: Duration) -> Self {
        ExecOutcome {
            termination,
            exit_code,
            signal: None,
            duration,
            stdout_bytes: 0,
            stderr_bytes: 0,
            stdout_truncated: false,
            stderr_truncated: false,
            usage: ResourceUsage::default(),
            enforcement: EnforcementReport::default(),
            result: None,
            egress: None,
            command_started_after_us: None,
        }
    }

    /// True when the command ran to completion and exited 0.
    pub fn succeeded(&self) -> bool {
        self.termination == Termination::Exited && self.exit_code == Some(0)
    }
}

/// What `collect` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CollectReport {
    /// Host directory of the result bundle (README.md written last).
    pub bundle_path: PathBuf,
    pub patch_count: usize,
    /// Changed paths left out of the patches because the project's .gitignore ignores them.
    #[serde(default)]
    pub ignored_paths: Vec<String>,
}

/// Output or a progress note from inside the sandbox, streamed while it runs.
///
/// A step's output comes twice: as [`OutputEvent::Output`], every byte exactly as written and
/// whatever the caps (what a relay writes to its own stdout and stderr), and as the lines the
/// log keeps ([`OutputEvent::Stdout`] / [`OutputEvent::Stderr`], bounded by
/// `maxOutputBytes` and `maxOutputLines`, as text with U+FFFD for bytes that are not UTF-8),
/// for observers that read lines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum OutputEvent {
    /// A line of stdout the log keeps (without its newline).
    Stdout { line: String, timestamp_ms: u64 },
    /// A line of stderr the log keeps (without its newline).
    Stderr { line: String, timestamp_ms: u64 },
    /// Bytes the step wrote to `stream`, exactly and in order, all of them.
    Output {
        stream: crate::output::OutputStream,
        bytes: Vec<u8>,
        timestamp_ms: u64,
    },
    /// Bytes of `stream` a relay could not deliver (a remote host no longer held them when
    /// its follower reached them): the relayed stream has a gap of `bytes` there.
    OutputLost {
        stream: crate::output::OutputStream,
        bytes: u64,
        timestamp_ms: u64,
    },
    /// The step reported progress (heartbeat).
    Heartbeat {
        progress: Option<f64>,
        timestamp_ms: u64,
    },
    /// The egress engine decided a connection (a `smithers_egress::EgressRecord`, as JSON).
    Egress { record: Value, timestamp_ms: u64 },
}

/// What [`OutputSink::room`] returns: resolves once the sink can take more output.
pub type Room<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;

/// Receives live output. Must not block for long: it is called from the output pump.
pub trait OutputSink: Send + Sync {
    fn event(&self, event: OutputEvent);

    /// Resolves when the sink can take more of the step's output. A pump awaits it before
    /// reading on, so a sink whose reader falls behind (a remote follower) slows the step
    /// down as a full pipe would, instead of buffering without bound. A pump stops waiting
    /// once the step is being ended (timeout, cancel) or has exited. Ready by default.
    fn room(&self) -> Room<'_> {
        Box::pin(std::future::ready(()))
    }
}

/// A sink that drops everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullSink;

impl OutputSink for NullSink {
    fn event(&self, _event: OutputEvent) {}
}

pub(crate) mod duration_ms {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

/// The fields of a step's result JSON that the JavaScript provider kit's runners report but
/// that a sandbox never takes from its step: the changes come from the step's `/workspace`
/// (collected into the bundle's patches) and the bundle is the runtime's own. A result that
/// carries one is refused, naming it, rather than silently ignored.
pub const REFUSED_RESULT_FIELDS: &[&str] = &["patches", "diffBundle", "bundlePath"];

/// Why a step's result JSON is refused for a field of [`REFUSED_RESULT_FIELDS`], or `None`.
pub fn refused_result_field(result: &serde_json::Value) -> Option<String> {
    let field = REFUSED_RESULT_FIELDS
        .iter()
        .find(|f| result.get(**f).is_some())?;
    Some(format!(
        "the result JSON's `{field}` is not taken from a step: its changes come from the files it writes in /workspace (collected as the bundle's patches), and the bundle is the runtime's; write the files instead, and leave `{field}` out"
    ))
}

/// A step's (result, why it was refused) with [`refused_result_field`] applied.
pub fn check_result_fields(
    parsed: (Option<serde_json::Value>, Option<String>),
) -> (Option<serde_json::Value>, Option<String>) {
    match &parsed.0 {
        Some(v) => match refused_result_field(v) {
            Some(why) => (None, Some(why)),
            None => parsed,
        },
        None => parsed,
    }
}

#[cfg(test)]
mod handle_tests {
    use super::*;

    fn handle(root: &str, run: &str, sandbox: &str) -> SandboxHandle {
        let sandbox_root = SandboxHandle::derived_sandbox_root(Path::new(root), run, sandbox);
        SandboxHandle {
            runtime: RuntimeKind::Bubblewrap,
            run_id: run.into(),
            sandbox_id: sandbox.into(),
            request_path: sandbox_root.join("request"),
            result_path: sandbox_root.join("result"),
            sandbox_root,
            container_id: None,
            workspace_id: None,
            backend: Value::Null,
        }
    }

    #[test]
    fn project_root_is_derived_and_crafted_layouts_are_refused() {
        let h = handle("/p/proj", "r1", "s1");
        assert_eq!(h.project_root().unwrap(), PathBuf::from("/p/proj"));

        let mut outside = h.clone();
        outside.request_path = PathBuf::from("/home/someone/important");
        assert!(outside.project_root().is_err(), "request path elsewhere");

        let mut other_root = h.clone();
        other_root.sandbox_root = PathBuf::from("/home/someone/x/y/z/w");
        assert!(other_root.project_root().is_err(), "not under .smithers");

        let mut ids = h.clone();
        ids.run_id = "..".into();
        assert!(ids.project_root().is_err(), "invalid id");

        let dots = handle("/p/proj", "r1", "s1");
        let mut dots = dots;
        dots.sandbox_root = PathBuf::from("/p/proj/.smithers/sandboxes/r1/../s1");
        assert!(dots.project_root().is_err(), "a .. in the stored path");

        assert!(handle("relative", "r1", "s1").project_root().is_err());
    }

    #[test]
    fn a_linked_smithers_dir_is_refused() {
        let tmp = std::env::temp_dir().join(format!("smithers-handle-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let proj = tmp.join("proj");
        let elsewhere = tmp.join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("sandboxes/r1/s1/request")).unwrap();
        std::fs::create_dir_all(&proj).unwrap();
        let h = handle(proj.to_str().unwrap(), "r1", "s1");
        assert!(
            h.check_project_dirs_real(&proj).is_ok(),
            "nothing there yet"
        );
        std::os::unix::fs::symlink(&elsewhere, proj.join(".smithers")).unwrap();
        assert!(h.check_project_dirs_real(&proj).is_err());
        std::fs::remove_file(proj.join(".smithers")).unwrap();
        std::fs::create_dir_all(proj.join(".smithers/sandboxes/r1/s1")).unwrap();
        assert!(h.check_project_dirs_real(&proj).is_ok());
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
