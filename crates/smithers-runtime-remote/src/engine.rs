//! [`smithers_runtime::Engine`] for the codeplane runtime: a sandbox created and shipped as a
//! step's is, then started as a session on the host (`POST …/start`), sent commands
//! (`POST …/exec`, whose answer streams the command's output in frames and then its end:
//! `smithers_wire::session`), and stopped (`POST …/stop`, which collects its bundle there;
//! `Runtime::collect` then downloads it). A command's stdin travels in its request, at most
//! 16 MiB. Cancelling a command closes its stream: the host then kills it.

use std::io::Read;
use std::time::Instant;

use async_trait::async_trait;
use base64::Engine as _;
use futures_util::StreamExt;
use reqwest::Method;
use smithers_errors::ErrorReport;
use smithers_runtime::{
    BackendName, CancellationToken, EnforcementReport, Engine, EngineCapabilities, ExecExit,
    ExecRequest, OutputEvent, OutputSink, OutputStream, RequestBundle, Runtime, RuntimeError,
    SandboxConfig, SandboxHandle, ShipReport, Snapshot, Termination,
};
use smithers_wire::session::{self as frames, CheckpointBody, ExecBody, MAX_STDIN_BYTES};

use crate::client::RemoteRuntime;

#[async_trait]
impl Engine for RemoteRuntime {
    fn backend(&self) -> BackendName {
        BackendName::CODEPLANE
    }

    fn capabilities(&self) -> EngineCapabilities {
        EngineCapabilities {
            concurrent_execs: true,
            exec_stdin: true,
            pause: false,
            // Checkpoints are the host's (named there); a sandbox started from one is not.
            snapshot: true,
            fork: false,
            terminal: false,
        }
    }

    async fn probe(&self) -> EnforcementReport {
        Runtime::probe(self).await
    }

    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
        Runtime::create(self, config).await
    }

    async fn ship(
        &self,
        handle: &SandboxHandle,
        request: &RequestBundle,
    ) -> Result<ShipReport, RuntimeError> {
        Runtime::ship(self, handle, request).await
    }

    async fn start(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        self.session_call(handle, "start", "start the session")
            .await
    }

    async fn exec(
        &self,
        handle: &SandboxHandle,
        request: ExecRequest,
        cancel: CancellationToken,
        output: &dyn OutputSink,
    ) -> Result<ExecExit, RuntimeError> {
        smithers_runtime::refuse_terminal(&Engine::backend(self), &request)?;
        let began = Instant::now();
        let b = self.backend(handle)?;
        let body = exec_body(request).await?;
        let url = self.url(&b.base_url, &format!("/v1/sandboxes/{}/exec", b.host_id));
        // Not retried: a command the host may have started must not run twice.
        let resp = self
            .send(&b.base_url, "run a command", false, || {
                self.request(Method::POST, &url).json(&body)
            })
            .await
            .map_err(|e| out_of_order("exec", e))?;
        let mut stream = resp.bytes_stream();
        let mut decoder = frames::Decoder::default();
        loop {
            let chunk = tokio::select! {
                c = stream.next() => c,
                _ = cancel.cancelled() => {
                    // Dropping the stream closes the connection: the host kills the command.
                    return Ok(cancelled(began));
                }
            };
            let Some(chunk) = chunk else {
                return Err(cut("the host's answer ended before the command's end"));
            };
            let chunk = chunk.map_err(|e| cut(&format!("reading the host's answer: {e}")))?;
            decoder.push(&chunk);
            while let Some((kind, payload)) = decoder.next_frame().map_err(|e| cut(&e))? {
                if let Some(end) = relay(kind, payload, output)? {
                    return Ok(end);
                }
            }
            output.room().await;
        }
    }

    /// `POST …/checkpoint`: the host freezes the session's workspace and names the
    /// checkpoint; that name is this snapshot's one layer.
    async fn snapshot(&self, handle: &SandboxHandle) -> Result<Snapshot, RuntimeError> {
        let b = self.backend(handle)?;
        let url = self.url(
            &b.base_url,
            &format!("/v1/sandboxes/{}/checkpoint", b.host_id),
        );
        let made: CheckpointBody = self
            .json_call(&b.base_url, "checkpoint the session", false, || {
                self.request(Method::POST, &url)
            })
            .await
            .map_err(|e| out_of_order("checkpoint", e))?;
        Ok(Snapshot {
            layers: vec![made.checkpoint],
            held_us: made.held_us.unwrap_or(0),
        })
    }

    /// `POST …/restore` with the checkpoint's name.
    async fn restore(
        &self,
        handle: &SandboxHandle,
        snapshot: &Snapshot,
    ) -> Result<(), RuntimeError> {
        let [name] = snapshot.layers.as_slice() else {
            return Err(RuntimeError::InvalidControl {
                control: "checkpoint",
                reason: "not a checkpoint of a session on a sandbox host".into(),
            });
        };
        let b = self.backend(handle)?;
        let url = self.url(&b.base_url, &format!("/v1/sandboxes/{}/restore", b.host_id));
        let body = serde_json::to_vec(&CheckpointBody {
            checkpoint: name.clone(),
            held_us: None,
        })
        .unwrap_or_default();
        let _: CheckpointBody = self
            .json_call(&b.base_url, "restore the session", false, || {
                self.request(Method::POST, &url)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone())
            })
            .await
            .map_err(|e| out_of_order("restore", e))?;
        Ok(())
    }

    async fn stop(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        self.session_call(handle, "stop", "stop the session").await
    }

    async fn destroy(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        Runtime::cleanup(self, handle).await
    }
}

impl RemoteRuntime {
    /// `POST /v1/sandboxes/{id}/{verb}` with no body.
    async fn session_call(
        &self,
        handle: &SandboxHandle,
        verb: &str,
        what: &'static str,
    ) -> Result<(), RuntimeError> {
        let b = self.backend(handle)?;
        let url = self.url(&b.base_url, &format!("/v1/sandboxes/{}/{verb}", b.host_id));
        let timeout = self.options().request_timeout;
        self.send(&b.base_url, what, false, || {
            self.request(Method::POST, &url).timeout(timeout)
        })
        .await
        .map(drop)
        .map_err(|e| out_of_order(verb, e))
    }
}

/// One frame of the host's answer: output to `output`, or the command's end.
fn relay(
    kind: u8,
    payload: Vec<u8>,
    output: &dyn OutputSink,
) -> Result<Option<ExecExit>, RuntimeError> {
    let stream = match kind {
        frames::STDOUT => OutputStream::Stdout,
        frames::STDERR => OutputStream::Stderr,
        frames::EXIT => {
            return serde_json::from_slice(&payload)
                .map(Some)
                .map_err(|e| cut(&format!("the command's end is unreadable: {e}")));
        }
        _ => {
            let report: ErrorReport = serde_json::from_slice(&payload)
                .map_err(|e| cut(&format!("the host's error is unreadable: {e}")))?;
            return Err(RuntimeError::inner(
                "run a command on the sandbox host",
                &report,
            ));
        }
    };
    output.event(OutputEvent::Output {
        stream,
        bytes: payload,
        timestamp_ms: now_ms(),
    });
    Ok(None)
}

/// The request's body: its stdin read whole (at most [`MAX_STDIN_BYTES`]) and encoded.
async fn exec_body(request: ExecRequest) -> Result<ExecBody, RuntimeError> {
    let stdin_base64 = match request.stdin.take() {
        None => None,
        Some(mut reader) => {
            let bytes = tokio::task::spawn_blocking(move || {
                let mut bytes = Vec::new();
                (&mut reader)
                    .take(MAX_STDIN_BYTES as u64 + 1)
                    .read_to_end(&mut bytes)
                    .map(|_| bytes)
            })
            .await
            .map_err(|e| RuntimeError::spawn("read the command's stdin", e))?
            .map_err(|e| RuntimeError::spawn("read the command's stdin", e))?;
            if bytes.len() > MAX_STDIN_BYTES {
                return Err(RuntimeError::InvalidControl {
                    control: "stdin",
                    reason: format!(
                        "a command on a sandbox host takes at most {MAX_STDIN_BYTES} bytes of stdin"
                    ),
                });
            }
            Some(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    };
    Ok(ExecBody {
        argv: request.argv,
        cwd: request.cwd,
        env: request.env,
        timeout_ms: request.timeout.map(|t| t.as_millis() as u64),
        stdin_base64,
    })
}

/// The host's conflict (the session not in the state the verb needs: its `details.state`)
/// is the contract's out-of-order error; anything else stays as it is.
fn out_of_order(verb: &str, e: RuntimeError) -> RuntimeError {
    match e {
        RuntimeError::Inner { inner, .. } if inner.details.get("state").is_some() => {
            RuntimeError::OutOfOrder {
                verb: match verb {
                    "start" => "start",
                    "stop" => "stop",
                    "checkpoint" => "checkpoint",
                    "restore" => "restore",
                    _ => "exec",
                },
                reason: inner.message,
            }
        }
        other => other,
    }
}

fn cancelled(began: Instant) -> ExecExit {
    ExecExit {
        termination: Termination::Cancelled,
        exit_code: None,
        signal: None,
        duration: began.elapsed(),
        stdout_bytes: 0,
        stderr_bytes: 0,
    }
}

fn cut(reason: &str) -> RuntimeError {
    RuntimeError::spawn("run a command on the sandbox host", reason)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
