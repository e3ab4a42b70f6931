//! The JSON documents of the sandbox host API (`openapi/smithers-sandbox.yaml`), shared by the
//! server and the client so the two cannot drift apart.

use serde::{Deserialize, Serialize};
use smithers_errors::ErrorReport;
use smithers_runtime::{Controls, ExecOutcome, OutputStream, RuntimeKind};

/// Header carrying the idempotency key of `POST /v1/sandboxes/{id}/execute`.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// Maximum length of an idempotency key.
pub const IDEMPOTENCY_KEY_MAX_LENGTH: usize = 128;

/// `POST /v1/sandboxes`: a [`smithers_runtime::SandboxConfig`] without `rootDir` and `runtime`,
/// which the host chooses (the workspace lives where the host decides; the runtime is the one
/// the host runs). Unknown fields are refused so a client sending `rootDir` learns it is not
/// honoured instead of having it silently dropped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateSandbox {
    pub run_id: String,
    pub sandbox_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default)]
    pub controls: Controls,
    /// What to do when this token already holds a sandbox named `runId:sandboxId` (a run
    /// resumed after its client died before cleanup): refuse (409, the default) or replace it
    /// (the old one is cancelled and removed first; its bundle was never applied).
    #[serde(default, skip_serializing_if = "IfExists::is_refuse")]
    pub if_exists: IfExists,
    /// The values of `controls.secrets`, read by the client on its own machine (a binding
    /// sent here names no file: the host's files are not a client's to read).
    #[serde(default, skip_serializing_if = "SecretValues::is_empty")]
    pub secret_values: SecretValues,
}

/// Secrets' values a client sends with its create: each secret's name and its value in
/// standard base64. The host keeps them in memory only, never echoes, logs or stores them;
/// `Debug` shows the names alone.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretValues(pub std::collections::BTreeMap<String, String>);

impl SecretValues {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for SecretValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

/// [`CreateSandbox::if_exists`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IfExists {
    /// 409 Conflict naming the existing sandbox's id.
    #[default]
    Refuse,
    /// Cancel and remove the existing sandbox, then create a new one.
    Replace,
}

impl IfExists {
    fn is_refuse(&self) -> bool {
        *self == IfExists::Refuse
    }
}

/// Where a hosted sandbox stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    /// Created; the workspace may be uploaded.
    Created,
    /// The request was shipped; ready to execute. The workspace can no longer change.
    Shipped,
    /// The step is running.
    Running,
    /// Started as a session (`POST …/start`): it takes commands (`POST …/exec`) until
    /// `POST …/stop` collects its bundle.
    Live,
    /// The step ended (any exit code, timeout, limit or cancellation while running) and the
    /// result bundle was collected.
    Completed,
    /// The runtime itself failed (an error, not an outcome).
    Failed,
    /// Cancelled before it ran: there is no bundle.
    Cancelled,
}

impl SandboxState {
    /// True when nothing more will happen to the sandbox but cleanup.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            SandboxState::Completed | SandboxState::Failed | SandboxState::Cancelled
        )
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            SandboxState::Created => "created",
            SandboxState::Shipped => "shipped",
            SandboxState::Running => "running",
            SandboxState::Live => "live",
            SandboxState::Completed => "completed",
            SandboxState::Failed => "failed",
            SandboxState::Cancelled => "cancelled",
        }
    }
}

/// What `collect` found, once the step completed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResultInfo {
    pub patch_count: usize,
    #[serde(default)]
    pub ignored_paths: Vec<String>,
    /// Total bytes of regular files in the bundle.
    pub bundle_size_bytes: u64,
}

/// A hosted sandbox as the API shows it (`GET /v1/sandboxes/{id}`, list items, create reply).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxInfo {
    /// The host's handle id, used in every URL.
    pub id: String,
    pub run_id: String,
    pub sandbox_id: String,
    /// The runtime the host runs the step in.
    pub runtime: RuntimeKind,
    pub state: SandboxState,
    pub created_at_ms: u64,
    /// Seq of the last event so far (`null` before the first).
    #[serde(default)]
    pub last_seq: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ResultInfo>,
}

/// Reply of `POST /v1/sandboxes/{id}/execute`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecuteAccepted {
    pub id: String,
    pub state: SandboxState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// True when this request started the step; false when it was a retry of the one that did.
    pub started: bool,
}

/// Reply of `PUT /v1/sandboxes/{id}/workspace`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceUploaded {
    pub entries: u64,
    /// Uncompressed bytes of regular files written.
    pub bytes: u64,
    /// Bytes received on the wire (compressed).
    pub received_bytes: u64,
}

/// Reply of `PUT /v1/sandboxes/{id}/request`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Shipped {
    pub bundle_size_bytes: u64,
}

/// One event of a hosted sandbox, as sent on `GET /v1/sandboxes/{id}/events` (SSE `data:`;
/// the SSE `event:` is the `type`, the SSE `id:` is the seq).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum WireEvent {
    /// The sandbox changed state.
    State { state: SandboxState },
    Stdout {
        line: String,
        #[serde(rename = "timestampMs")]
        timestamp_ms: u64,
    },
    Stderr {
        line: String,
        #[serde(rename = "timestampMs")]
        timestamp_ms: u64,
    },
    /// Bytes of the step's output, exactly as written and all of them, whatever the caps
    /// (the `stdout`/`stderr` events are the lines the log keeps): `text` when they are UTF-8
    /// (and not mostly escapes), else `b64` (standard base64). `offset` counts the bytes of
    /// the stream before these, so a follower can tell a gap. At most [`MAX_OUTPUT_EVENT_BYTES`].
    Output {
        stream: OutputStream,
        offset: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        b64: Option<String>,
        #[serde(rename = "timestampMs")]
        timestamp_ms: u64,
    },
    /// `bytes` of output at `offset` that the host no longer held when this follower reached
    /// them (it keeps a window of what every follower was sent, and holds the step back while
    /// its followers are behind; a follower that starts late, or resumes from further back,
    /// can find a gap).
    OutputLost {
        stream: OutputStream,
        offset: u64,
        bytes: u64,
        #[serde(rename = "timestampMs")]
        timestamp_ms: u64,
    },
    Heartbeat {
        progress: Option<f64>,
        #[serde(rename = "timestampMs")]
        timestamp_ms: u64,
    },
    /// An egress decision (the record of the bundle's log, live).
    Egress {
        record: serde_json::Value,
        #[serde(rename = "timestampMs")]
        timestamp_ms: u64,
    },
    /// Terminal: the step ended and its bundle is ready for download.
    Completed {
        outcome: Box<ExecOutcome>,
        result: ResultInfo,
    },
    /// Terminal: the runtime failed.
    Failed { error: ErrorReport },
    /// Terminal: cancelled before it ran.
    Cancelled,
}

impl WireEvent {
    /// The SSE `event:` name.
    pub const fn name(&self) -> &'static str {
        match self {
            WireEvent::State { .. } => "state",
            WireEvent::Stdout { .. } => "stdout",
            WireEvent::Stderr { .. } => "stderr",
            WireEvent::Output { .. } => "output",
            WireEvent::OutputLost { .. } => "outputLost",
            WireEvent::Heartbeat { .. } => "heartbeat",
            WireEvent::Egress { .. } => "egress",
            WireEvent::Completed { .. } => "completed",
            WireEvent::Failed { .. } => "failed",
            WireEvent::Cancelled => "cancelled",
        }
    }

    /// An [`WireEvent::Output`] of `bytes` (at most [`MAX_OUTPUT_EVENT_BYTES`]: the sender
    /// splits), as text when that is no larger than base64 would be.
    pub fn output(stream: OutputStream, offset: u64, bytes: &[u8], timestamp_ms: u64) -> Self {
        let (text, b64) = match std::str::from_utf8(bytes) {
            // JSON shows a control character as `\u00XX`: past a quarter of them, base64's
            // third more is smaller.
            Ok(t)
                if bytes
                    .iter()
                    .filter(|b| **b < 0x20 && !matches!(b, b'\n' | b'\t' | b'\r'))
                    .count()
                    * 4
                    <= bytes.len() =>
            {
                (Some(t.to_string()), None)
            }
            _ => (None, Some(smithers_runtime::output::base64_encode(bytes))),
        };
        WireEvent::Output {
            stream,
            offset,
            text,
            b64,
            timestamp_ms,
        }
    }

    /// The bytes of an [`WireEvent::Output`]; `None` for another event, or one whose bytes
    /// are not well formed (both or neither of `text` and `b64`, bad base64, too many).
    pub fn output_bytes(&self) -> Option<Vec<u8>> {
        let WireEvent::Output { text, b64, .. } = self else {
            return None;
        };
        let bytes = match (text, b64) {
            (Some(t), None) => t.as_bytes().to_vec(),
            (None, Some(b)) => smithers_runtime::output::base64_decode(b, MAX_OUTPUT_EVENT_BYTES)?,
            _ => return None,
        };
        (bytes.len() <= MAX_OUTPUT_EVENT_BYTES).then_some(bytes)
    }

    /// The stream ends after a terminal event.
    pub const fn is_terminal(&self) -> bool {
        matches!(
            self,
            WireEvent::Completed { .. } | WireEvent::Failed { .. } | WireEvent::Cancelled
        )
    }
}

/// Most bytes of output one [`WireEvent::Output`] carries.
pub const MAX_OUTPUT_EVENT_BYTES: usize = 64 * 1024;

/// An event with its sequence number (0, 1, 2, ... per sandbox, no gaps).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeqEvent {
    pub seq: u64,
    pub event: WireEvent,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_refuses_root_dir() {
        let err = serde_json::from_str::<CreateSandbox>(
            r#"{"runId":"r","sandboxId":"s","rootDir":"/etc"}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("rootDir"), "{err}");
        let ok: CreateSandbox = serde_json::from_str(r#"{"runId":"r","sandboxId":"s"}"#).unwrap();
        assert_eq!(ok.run_id, "r");
    }

    #[test]
    fn event_tags() {
        let e = WireEvent::Stdout {
            line: "hi".into(),
            timestamp_ms: 5,
        };
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"type":"stdout","line":"hi","timestampMs":5})
        );
        assert_eq!(e.name(), "stdout");
        let back: WireEvent = serde_json::from_value(json).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn output_events_carry_bytes_exactly() {
        for bytes in [
            &b"plain text\n"[..],
            b"\xff\xfe not utf-8",
            b"\x00\x01\x02\x03 mostly controls",
            b"",
        ] {
            let e = WireEvent::output(OutputStream::Stderr, 7, bytes, 1);
            let json = serde_json::to_string(&e).unwrap();
            let back: WireEvent = serde_json::from_str(&json).unwrap();
            assert_eq!(back.output_bytes().unwrap(), bytes, "{json}");
            assert_eq!(back.name(), "output");
        }
        let text = WireEvent::output(OutputStream::Stdout, 0, b"hi", 5);
        assert_eq!(
            serde_json::to_value(&text).unwrap(),
            serde_json::json!({"type":"output","stream":"stdout","offset":0,"text":"hi","timestampMs":5})
        );
        let both: WireEvent = serde_json::from_value(serde_json::json!(
            {"type":"output","stream":"stdout","offset":0,"text":"a","b64":"YQ==","timestampMs":5}
        ))
        .unwrap();
        assert!(both.output_bytes().is_none());
        let big = WireEvent::output(
            OutputStream::Stdout,
            0,
            &vec![0xff; MAX_OUTPUT_EVENT_BYTES + 1],
            0,
        );
        assert!(big.output_bytes().is_none());
    }
}
