//! What a caller asks for (one sandboxed step) and what it provides around it (heartbeats,
//! cancellation, live output).

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use smithers_runtime::{CancellationToken, Controls, OutputSink, RuntimeKind, StepCommand};

/// What a shipped step runs when no command is given (the JavaScript default).
pub const DEFAULT_SANDBOX_COMMAND: &str = "smithers up bundle.tsx";

/// One sandboxed step to run.
#[derive(Debug, Clone)]
pub struct SandboxRequest {
    pub run_id: String,
    pub sandbox_id: String,
    /// The requested runtime; `None` means bubblewrap (recorded as requested in config_json).
    pub runtime: Option<RuntimeKind>,
    /// The project; becomes `/workspace` inside, and where accepted patches are applied.
    pub root_dir: PathBuf,
    /// `None`: [`DEFAULT_SANDBOX_COMMAND`].
    pub command: Option<StepCommand>,
    /// The step's input (`{}` by default), shipped in the request document.
    pub input: Value,
    pub image: Option<String>,
    pub controls: Controls,
    /// Default true.
    pub review_diffs: bool,
    /// Default false.
    pub auto_accept_diffs: bool,
    /// The step's config as written (for `config_json`; redacted before it is stored). When
    /// null, the controls are recorded instead.
    pub config: Value,
}

impl SandboxRequest {
    /// A request with the documented defaults.
    pub fn new(
        run_id: impl Into<String>,
        sandbox_id: impl Into<String>,
        root_dir: impl Into<PathBuf>,
    ) -> Self {
        SandboxRequest {
            run_id: run_id.into(),
            sandbox_id: sandbox_id.into(),
            runtime: None,
            root_dir: root_dir.into(),
            command: None,
            input: json!({}),
            image: None,
            controls: Controls::default(),
            review_diffs: true,
            auto_accept_diffs: false,
            config: Value::Null,
        }
    }

    pub(crate) fn selected_runtime(&self) -> RuntimeKind {
        self.runtime.unwrap_or(RuntimeKind::Bubblewrap)
    }

    pub(crate) fn step_command(&self) -> StepCommand {
        self.command.clone().unwrap_or_else(|| StepCommand {
            argv: DEFAULT_SANDBOX_COMMAND
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            cwd: None,
            stdin: Default::default(),
        })
    }

    /// The JavaScript `configJson` shape (before redaction): the execution options, then the
    /// step's own config spread over them.
    pub(crate) fn config_value(&self) -> Value {
        let selected = self.selected_runtime();
        let mut m = Map::new();
        m.insert(
            "runtime".into(),
            json!(self.runtime.unwrap_or(selected).as_str()),
        );
        m.insert("selectedRuntime".into(), json!(selected.as_str()));
        m.insert("allowNetwork".into(), json!(self.controls.allow_network));
        m.insert(
            "maxOutputBytes".into(),
            json!(self.controls.max_output_bytes),
        );
        // The other output caps, so that the row says what the step ran under.
        m.insert(
            "maxOutputLines".into(),
            json!(self.controls.max_output_lines),
        );
        m.insert(
            "failOnOutputCap".into(),
            json!(self.controls.fail_on_output_cap),
        );
        if let Some(t) = self.controls.timeout_ms {
            m.insert("toolTimeoutMs".into(), json!(t));
        }
        m.insert("reviewDiffs".into(), json!(self.review_diffs));
        m.insert("autoAcceptDiffs".into(), json!(self.auto_accept_diffs));
        let own = match &self.config {
            Value::Null => serde_json::to_value(&self.controls).unwrap_or(Value::Null),
            other => other.clone(),
        };
        if let Value::Object(own) = own {
            m.extend(own);
        }
        Value::Object(m)
    }
}

/// A progress report (`runtime.heartbeat` in the JavaScript package).
#[derive(Debug, Clone, PartialEq)]
pub struct Heartbeat {
    pub sandbox_id: String,
    /// initializing, created, shipped, executing, child-finished, bundle-collected, review,
    /// completed, cancelled, failed.
    pub stage: &'static str,
    /// 0..=100.
    pub progress: u8,
    /// Extra fields (status, patchCount, error, ...).
    pub data: Map<String, Value>,
}

/// Receives heartbeats. Called inline: keep it quick (send to a channel).
pub type HeartbeatFn = Arc<dyn Fn(&Heartbeat) + Send + Sync>;

/// What the surrounding run provides: heartbeats, cancellation and live output.
#[derive(Clone, Default)]
pub struct StepContext {
    pub heartbeat: Option<HeartbeatFn>,
    /// Cancelling kills every process of the sandbox; the sandbox ends as `cancelled`.
    pub cancel: CancellationToken,
    pub output: Option<Arc<dyn OutputSink>>,
}

impl std::fmt::Debug for StepContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepContext")
            .field("heartbeat", &self.heartbeat.is_some())
            .field("cancel", &self.cancel)
            .field("output", &self.output.is_some())
            .finish()
    }
}
