//! [`RemoteRuntime`]: the five verbs over the sandbox host API.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::{StreamExt, TryStreamExt};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde_json::Value;
use smithers_errors::{error_chain, ErrorCode, ErrorReport};
use smithers_runtime::{
    CancellationToken, CollectReport, EnforcementReport, ExecOutcome, OutputEvent, OutputSink,
    Protection, ProtectionStatus, RequestBundle, Runtime, RuntimeError, RuntimeKind, SandboxConfig,
    SandboxHandle, ShipReport, StepCommand,
};

use smithers_wire::archive::{self, ArchiveError, ChannelWriter, PackOptions, UnpackLimits};
use smithers_wire::wire::{
    CreateSandbox, ExecuteAccepted, SandboxInfo, SandboxState, WireEvent, IDEMPOTENCY_KEY_HEADER,
};
use smithers_wire::SseParser;

/// Environment variable holding the host's base URL (`http://127.0.0.1:7420`).
pub const ENV_API_URL: &str = "CODEPLANE_API_URL";
/// Environment variable holding the bearer token the host expects.
pub const ENV_API_KEY: &str = "CODEPLANE_API_KEY";

const RUNTIME: &str = "codeplane";

/// How often and how patiently safe requests are retried.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Attempts in total (1 = no retry).
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(16)).unwrap_or(u32::MAX);
        self.initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }
}

/// How to reach the sandbox host.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// Base URL of the host, e.g. `http://127.0.0.1:7420` (no trailing `/v1`).
    pub base_url: String,
    /// Bearer token (the host's `SMITHERS_SANDBOX_TOKEN`).
    pub token: String,
    pub connect_timeout: Duration,
    /// Timeout of one JSON call (not of uploads, downloads or the event stream).
    pub request_timeout: Duration,
    /// The event stream is reconnected (from the last seq) when nothing, not even a
    /// keep-alive, arrived for this long.
    pub event_idle_timeout: Duration,
    pub retry: RetryPolicy,
    /// Upload `.git/` with the workspace (default true: steps need it).
    pub include_git: bool,
    /// zstd level of the workspace upload.
    pub compression_level: i32,
}

impl RemoteOptions {
    pub fn new(base_url: impl Into<String>, token: impl Into<String>) -> Self {
        RemoteOptions {
            base_url: base_url.into().trim_end_matches('/').to_string(),
            token: token.into(),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            event_idle_timeout: Duration::from_secs(60),
            retry: RetryPolicy::default(),
            include_git: true,
            compression_level: 3,
        }
    }

    /// From `CODEPLANE_API_URL` and `CODEPLANE_API_KEY`; either missing is
    /// [`RuntimeError::Unavailable`] naming it.
    pub fn from_env() -> Result<Self, RuntimeError> {
        let get = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        match (get(ENV_API_URL), get(ENV_API_KEY)) {
            (Some(url), Some(key)) => Ok(RemoteOptions::new(url, key)),
            (url, _) => Err(RuntimeError::Unavailable {
                runtime: RUNTIME,
                reason: format!(
                    "{} is not set",
                    if url.is_none() {
                        ENV_API_URL
                    } else {
                        ENV_API_KEY
                    }
                ),
                fix: Some(format!(
                    "set {ENV_API_URL} to the sandbox host's URL and {ENV_API_KEY} to its token"
                )),
            }),
        }
    }
}

/// The `codeplane` runtime. Cheap to clone (shares one connection pool).
#[derive(Debug, Clone)]
pub struct RemoteRuntime {
    options: Arc<RemoteOptions>,
    http: reqwest::Client,
}

/// What the handle's `backend` field holds, enough to clean up from another process.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Backend {
    pub(crate) base_url: String,
    pub(crate) host_id: String,
    root_dir: PathBuf,
}

/// How long an idle connection stays in the client's pool: well under the host's default
/// idle timeout (`serve --header-timeout-ms`, 10 s).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

impl RemoteRuntime {
    pub fn new(options: RemoteOptions) -> Result<Self, RuntimeError> {
        let url =
            reqwest::Url::parse(&options.base_url).map_err(|e| RuntimeError::Unavailable {
                runtime: RUNTIME,
                reason: format!("invalid host URL {:?}: {e}", options.base_url),
                fix: Some(format!("set {ENV_API_URL} to e.g. http://127.0.0.1:7420")),
            })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(RuntimeError::Unavailable {
                runtime: RUNTIME,
                reason: format!("unsupported URL scheme {:?}", url.scheme()),
                fix: Some("use an http:// or https:// URL".into()),
            });
        }
        let http = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            // Drop idle pooled connections before the host does (it closes a connection idle
            // for its header timeout, 10 s by default): reusing one the host is closing at that
            // moment fails a request that may not be safe to retry (create, execute).
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .build()
            .map_err(|e| RuntimeError::Unavailable {
                runtime: RUNTIME,
                reason: format!("cannot build the HTTP client: {e}"),
                fix: None,
            })?;
        Ok(RemoteRuntime {
            options: Arc::new(options),
            http,
        })
    }

    /// [`RemoteOptions::from_env`] then [`RemoteRuntime::new`].
    pub fn from_env() -> Result<Self, RuntimeError> {
        RemoteRuntime::new(RemoteOptions::from_env()?)
    }

    pub fn options(&self) -> &RemoteOptions {
        &self.options
    }

    pub(crate) fn url(&self, base: &str, path: &str) -> String {
        format!("{base}{path}")
    }

    pub(crate) fn request(&self, method: Method, url: &str) -> RequestBuilder {
        self.http
            .request(method, url)
            .bearer_auth(&self.options.token)
    }

    fn unreachable(&self, base: &str, err: &reqwest::Error) -> RuntimeError {
        RuntimeError::Unavailable {
            runtime: RUNTIME,
            reason: format!(
                "cannot reach the sandbox host at {base}: {}",
                error_chain(err)
            ),
            fix: Some(format!(
                "check {ENV_API_URL} and that the sandbox host (smithers-sandbox serve) is running"
            )),
        }
    }

    /// Sends a request built by `build`, retrying what is safe (see the crate docs). `safe`
    /// says whether repeating a request the host may have received is harmless.
    pub(crate) async fn send(
        &self,
        base: &str,
        what: &'static str,
        safe: bool,
        build: impl Fn() -> RequestBuilder,
    ) -> Result<Response, RuntimeError> {
        let policy = &self.options.retry;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt >= policy.max_attempts.max(1);
            match build().send().await {
                Ok(resp) => {
                    if is_transient(resp.status()) && safe && !last {
                        tokio::time::sleep(policy.backoff(attempt)).await;
                        continue;
                    }
                    return check(resp, what).await;
                }
                Err(e) => {
                    // A connect failure means the host never saw the request.
                    let retry = (e.is_connect() || safe) && !last;
                    if retry {
                        tokio::time::sleep(policy.backoff(attempt)).await;
                        continue;
                    }
                    if e.is_connect() || e.is_timeout() || safe {
                        return Err(self.unreachable(base, &e));
                    }
                    return Err(RuntimeError::Spawn {
                        operation: format!("{what} on the sandbox host"),
                        reason: format!(
                            "the connection failed after the request was sent, and it is not \
                             safe to repeat, so it was not retried: {}",
                            error_chain(&e)
                        ),
                    });
                }
            }
        }
    }

    pub(crate) async fn json_call<T: serde::de::DeserializeOwned>(
        &self,
        base: &str,
        what: &'static str,
        safe: bool,
        build: impl Fn() -> RequestBuilder,
    ) -> Result<T, RuntimeError> {
        let timeout = self.options.request_timeout;
        let resp = self
            .send(base, what, safe, || build().timeout(timeout))
            .await?;
        resp.json::<T>().await.map_err(|e| RuntimeError::Spawn {
            operation: format!("{what} on the sandbox host"),
            reason: format!("unreadable reply: {e}"),
        })
    }

    async fn info(&self, b: &Backend) -> Result<SandboxInfo, RuntimeError> {
        let url = self.url(&b.base_url, &format!("/v1/sandboxes/{}", b.host_id));
        self.json_call(&b.base_url, "read sandbox", true, || {
            self.request(Method::GET, &url)
        })
        .await
    }

    async fn upload_workspace(&self, b: &Backend) -> Result<u64, RuntimeError> {
        let url = self.url(
            &b.base_url,
            &format!("/v1/sandboxes/{}/workspace", b.host_id),
        );
        let policy = &self.options.retry;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt >= policy.max_attempts.max(1);
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, io::Error>>(8);
            let root = b.root_dir.clone();
            // `.smithers` (a runtime's state, at any depth) is left out by pack_compressed.
            let mut skip_top = Vec::new();
            if !self.options.include_git {
                skip_top.push(".git".to_string());
            }
            let level = self.options.compression_level;
            let fail_tx = tx.clone();
            let packer = tokio::task::spawn_blocking(move || -> Result<u64, ArchiveError> {
                let result = pack_compressed(&root, ChannelWriter::new(tx), skip_top, level);
                if let Err(e) = &result {
                    // Abort the body so the host sees a failed upload, not a truncated archive.
                    let _ = fail_tx.blocking_send(Err(io::Error::other(e.to_string())));
                }
                result
            });
            let body_stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|item| (item, rx))
            });
            let sent = self
                .request(Method::PUT, &url)
                .header("content-type", "application/zstd")
                .body(reqwest::Body::wrap_stream(body_stream))
                .send()
                .await;
            let packed = packer
                .await
                .map_err(|e| RuntimeError::spawn("pack the workspace", e))?;
            if let Err(e) = &packed {
                if !is_broken_pipe(e) {
                    return Err(RuntimeError::inner("pack the workspace", e));
                }
            }
            match sent {
                Ok(resp) if resp.status().is_success() => {
                    return packed.map_err(|e| RuntimeError::inner("pack the workspace", &e));
                }
                Ok(resp) => {
                    if is_transient(resp.status()) && !last {
                        tokio::time::sleep(policy.backoff(attempt)).await;
                        continue;
                    }
                    check(resp, "upload the workspace").await?;
                    return Err(RuntimeError::spawn(
                        "upload the workspace",
                        "the host answered without accepting the archive",
                    ));
                }
                Err(e) => {
                    if last {
                        return Err(self.unreachable(&b.base_url, &e));
                    }
                    tokio::time::sleep(policy.backoff(attempt)).await;
                }
            }
        }
    }
}

fn pack_compressed(
    root: &Path,
    writer: ChannelWriter,
    skip_top: Vec<String>,
    level: i32,
) -> Result<u64, ArchiveError> {
    let io_err = |operation: &'static str, e: io::Error| ArchiveError::Io {
        operation,
        path: root.display().to_string(),
        source: e,
    };
    let encoder = zstd::stream::write::Encoder::new(writer, level)
        .map_err(|e| io_err("start compressor", e))?;
    let options = PackOptions {
        skip_top,
        // The host refuses `.smithers` at any depth (it is state, and a planted database
        // there would be trusted by whatever recovers it).
        skip_anywhere: vec![".smithers".to_string()],
        refuse_symlinks: false,
        max_total_bytes: None,
    };
    let (encoder, _stats) = archive::pack(root, encoder, &options)?;
    let mut writer = encoder
        .finish()
        .map_err(|e| io_err("finish compressor", e))?;
    io::Write::flush(&mut writer).map_err(|e| io_err("send archive", e))?;
    Ok(writer.sent)
}

fn is_broken_pipe(e: &ArchiveError) -> bool {
    match e {
        ArchiveError::Stream { .. } => true,
        ArchiveError::Io { source, .. } => source.kind() == io::ErrorKind::BrokenPipe,
        _ => false,
    }
}

fn is_transient(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

/// Turns a non-success reply into the error it describes: 401 is the host refusing our key
/// (Unavailable, with the fix), 503 the host's runtime being unusable, anything else the
/// host's `{code, message, details}` kept as is.
async fn check(resp: Response, what: &'static str) -> Result<Response, RuntimeError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let body = resp.text().await.unwrap_or_default();
    let report = serde_json::from_str::<ErrorReport>(&body).unwrap_or_else(|_| {
        ErrorReport::new(
            ErrorCode::SandboxExecutionFailed,
            format!(
                "HTTP {status}: {}",
                body.chars().take(500).collect::<String>()
            ),
        )
    });
    match status {
        StatusCode::UNAUTHORIZED => Err(RuntimeError::Unavailable {
            runtime: RUNTIME,
            reason: format!("the sandbox host refused the API key: {}", report.message),
            fix: Some(format!(
                "set {ENV_API_KEY} to the token the host was started with (SMITHERS_SANDBOX_TOKEN)"
            )),
        }),
        StatusCode::SERVICE_UNAVAILABLE => Err(RuntimeError::Unavailable {
            runtime: RUNTIME,
            reason: format!("the sandbox host cannot run steps: {}", report.message),
            fix: report
                .details
                .get("fix")
                .and_then(|f| f.as_str())
                .map(str::to_string),
        }),
        _ => Err(RuntimeError::inner(
            format!("{what} on the sandbox host (HTTP {})", status.as_u16()),
            &report,
        )),
    }
}

fn backend(handle: &SandboxHandle) -> Result<Backend, RuntimeError> {
    serde_json::from_value(handle.backend.clone()).map_err(|e| RuntimeError::OutOfOrder {
        verb: "handle",
        reason: format!("not a codeplane handle: {e}"),
    })
}

impl RemoteRuntime {
    /// The handle's remote state, only when it names this runtime's own host and a plain
    /// sandbox id: a handle read back from a crafted database must not send our token to
    /// another server, nor splice a path (`../`) into the request URL.
    pub(crate) fn backend(&self, handle: &SandboxHandle) -> Result<Backend, RuntimeError> {
        let b = backend(handle)?;
        if b.base_url != self.options.base_url {
            return Err(RuntimeError::InvalidControl {
                control: "handle",
                reason: format!(
                    "the handle names host {:?}, not this runtime's {:?}: not contacted",
                    b.base_url, self.options.base_url
                ),
            });
        }
        smithers_runtime::config::validate_id("hostId", &b.host_id)?;
        Ok(b)
    }
}

fn local_io<'a>(
    operation: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> RuntimeError + 'a {
    move |e| RuntimeError::io(operation, path, e)
}

/// The sink events of an `output` or `outputLost` event (`None` for any other event): the
/// host's bytes, in order, checked against what was relayed of the stream so far
/// (`relayed`): a gap is said as [`OutputEvent::OutputLost`], never papered over.
fn relay_output(
    event: &WireEvent,
    relayed: &mut [u64; 2],
) -> Result<Option<Vec<OutputEvent>>, RuntimeError> {
    let (stream, offset, timestamp_ms) = match event {
        WireEvent::Output {
            stream,
            offset,
            timestamp_ms,
            ..
        }
        | WireEvent::OutputLost {
            stream,
            offset,
            timestamp_ms,
            ..
        } => (*stream, *offset, *timestamp_ms),
        _ => return Ok(None),
    };
    let at = &mut relayed[stream as usize];
    let mut out = Vec::new();
    if offset != *at {
        // The host's offsets only go forward; one behind ours would repeat bytes.
        if offset < *at {
            return Err(RuntimeError::spawn(
                "follow events",
                format!(
                    "the host sent {} output at offset {offset} after {} bytes of it",
                    stream.as_str(),
                    *at
                ),
            ));
        }
        out.push(OutputEvent::OutputLost {
            stream,
            bytes: offset - *at,
            timestamp_ms,
        });
        *at = offset;
    }
    match event {
        WireEvent::OutputLost { bytes, .. } => {
            out.push(OutputEvent::OutputLost {
                stream,
                bytes: *bytes,
                timestamp_ms,
            });
            *at += bytes;
        }
        _ => {
            let bytes = event.output_bytes().ok_or_else(|| {
                RuntimeError::spawn("follow events", "an output event without well-formed bytes")
            })?;
            *at += bytes.len() as u64;
            out.push(OutputEvent::Output {
                stream,
                bytes,
                timestamp_ms,
            });
        }
    }
    Ok(Some(out))
}

/// How following the event stream ended.
enum Followed {
    Outcome(Box<ExecOutcome>),
}

impl RemoteRuntime {
    /// Follows `/events` from seq 0 until a terminal event, reconnecting from the next seq
    /// after a dropped connection, forwarding output to `sink`, and asking the host to cancel
    /// once `cancel` fires.
    async fn follow(
        &self,
        b: &Backend,
        cancel: &CancellationToken,
        sink: &dyn OutputSink,
    ) -> Result<Followed, RuntimeError> {
        let policy = &self.options.retry;
        let mut next: u64 = 0;
        let mut failures = 0u32;
        let mut cancel_sent = false;
        // Bytes of stdout and stderr relayed so far: an `output` event must go on from there.
        let mut relayed = [0u64; 2];
        loop {
            let url = self.url(
                &b.base_url,
                &format!("/v1/sandboxes/{}/events?since={next}", b.host_id),
            );
            let resp = self
                .send(&b.base_url, "follow events", true, || {
                    self.request(Method::GET, &url)
                        .header("accept", "text/event-stream")
                })
                .await?;
            let mut stream = resp.bytes_stream();
            let mut parser = SseParser::new();
            loop {
                let chunk = tokio::select! {
                    _ = cancel.cancelled(), if !cancel_sent => {
                        cancel_sent = true;
                        self.request_cancel(b).await?;
                        continue;
                    }
                    c = tokio::time::timeout(self.options.event_idle_timeout, stream.next()) => c,
                };
                let chunk = match chunk {
                    Ok(Some(Ok(bytes))) => bytes,
                    // Idle, dropped or ended without a terminal event: reconnect from `next`.
                    Ok(Some(Err(_))) | Ok(None) | Err(_) => break,
                };
                for frame in parser.push(&chunk) {
                    let seq: u64 = frame
                        .id
                        .as_deref()
                        .and_then(|i| i.parse().ok())
                        .ok_or_else(|| {
                            RuntimeError::spawn("follow events", "an event without a numeric id")
                        })?;
                    if seq != next {
                        return Err(RuntimeError::spawn(
                            "follow events",
                            format!("the host skipped events: expected seq {next}, got {seq}"),
                        ));
                    }
                    let event: WireEvent = serde_json::from_str(&frame.data).map_err(|e| {
                        RuntimeError::spawn("follow events", format!("unreadable event {seq}: {e}"))
                    })?;
                    next += 1;
                    failures = 0;
                    if let Some(relay) = relay_output(&event, &mut relayed)? {
                        for e in relay {
                            sink.event(e);
                        }
                        continue;
                    }
                    match event {
                        WireEvent::Output { .. } | WireEvent::OutputLost { .. } => {}
                        WireEvent::Stdout { line, timestamp_ms } => {
                            sink.event(OutputEvent::Stdout { line, timestamp_ms })
                        }
                        WireEvent::Stderr { line, timestamp_ms } => {
                            sink.event(OutputEvent::Stderr { line, timestamp_ms })
                        }
                        WireEvent::Heartbeat {
                            progress,
                            timestamp_ms,
                        } => sink.event(OutputEvent::Heartbeat {
                            progress,
                            timestamp_ms,
                        }),
                        WireEvent::Egress {
                            record,
                            timestamp_ms,
                        } => sink.event(OutputEvent::Egress {
                            record,
                            timestamp_ms,
                        }),
                        WireEvent::State { .. } => {}
                        WireEvent::Completed { outcome, .. } => {
                            return Ok(Followed::Outcome(outcome))
                        }
                        WireEvent::Failed { error } => {
                            return Err(RuntimeError::inner("execute on the sandbox host", &error))
                        }
                        WireEvent::Cancelled => {
                            return Err(RuntimeError::OutOfOrder {
                                verb: "execute",
                                reason: "the sandbox was cancelled on the host before it ran"
                                    .into(),
                            })
                        }
                    }
                }
            }
            failures += 1;
            if failures >= policy.max_attempts.max(1) {
                return Err(RuntimeError::Unavailable {
                    runtime: RUNTIME,
                    reason: format!(
                        "lost the event stream of sandbox {} {failures} times in a row",
                        b.host_id
                    ),
                    fix: Some(format!("check the network path to {}", b.base_url)),
                });
            }
            tokio::time::sleep(policy.backoff(failures)).await;
        }
    }

    async fn request_cancel(&self, b: &Backend) -> Result<(), RuntimeError> {
        let url = self.url(&b.base_url, &format!("/v1/sandboxes/{}/cancel", b.host_id));
        let timeout = self.options.request_timeout;
        // Cancelling twice is harmless: safe to retry.
        self.send(&b.base_url, "cancel", true, || {
            self.request(Method::POST, &url).timeout(timeout)
        })
        .await
        .map(|_| ())
    }

    async fn download_bundle(
        &self,
        b: &Backend,
        handle: &SandboxHandle,
    ) -> Result<(), RuntimeError> {
        let url = self.url(&b.base_url, &format!("/v1/sandboxes/{}/bundle", b.host_id));
        let policy = &self.options.retry;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt >= policy.max_attempts.max(1);
            let resp = self
                .send(&b.base_url, "download the bundle", true, || {
                    self.request(Method::GET, &url)
                })
                .await?;
            let staging = handle
                .sandbox_root
                .join(format!(".result-partial-{}", uuid::Uuid::new_v4().simple()));
            tokio::fs::create_dir_all(&staging)
                .await
                .map_err(local_io("create", &staging))?;
            let reader =
                tokio_util::io::StreamReader::new(resp.bytes_stream().map_err(io::Error::other));
            let bridge = tokio_util::io::SyncIoBridge::new(reader);
            let dest = staging.clone();
            let unpacked = tokio::task::spawn_blocking(move || {
                archive::unpack(bridge, &dest, &UnpackLimits::bundle(), &|| false)
            })
            .await
            .map_err(|e| RuntimeError::spawn("unpack the bundle", e))?;
            match unpacked {
                Ok(_) => {
                    if tokio::fs::symlink_metadata(&handle.result_path)
                        .await
                        .is_ok()
                    {
                        tokio::fs::remove_dir_all(&handle.result_path)
                            .await
                            .map_err(local_io("replace", &handle.result_path))?;
                    }
                    tokio::fs::rename(&staging, &handle.result_path)
                        .await
                        .map_err(local_io("move bundle into", &handle.result_path))?;
                    return Ok(());
                }
                Err(e) => {
                    let _ = tokio::fs::remove_dir_all(&staging).await;
                    if matches!(e, ArchiveError::Stream { .. }) && !last {
                        tokio::time::sleep(policy.backoff(attempt)).await;
                        continue;
                    }
                    return Err(RuntimeError::inner(
                        "unpack the bundle from the sandbox host",
                        &e,
                    ));
                }
            }
        }
    }
}

/// Removes what a remote sandbox leaves on this machine but its bundle: the request directory
/// and the staging directory of a download that was cut off. The caller has checked the
/// handle's directories (`project_root`, `check_project_dirs_real`).
pub async fn remove_local_leftovers(handle: &SandboxHandle) -> Result<(), RuntimeError> {
    let mut local_error = None;
    match tokio::fs::remove_dir_all(&handle.request_path).await {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => local_error = Some(RuntimeError::io("remove", &handle.request_path, e)),
    }
    if let Ok(mut dir) = tokio::fs::read_dir(&handle.sandbox_root).await {
        while let Ok(Some(entry)) = dir.next_entry().await {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(".result-partial-")
            {
                let _ = tokio::fs::remove_dir_all(entry.path()).await;
            }
        }
    }
    local_error.map_or(Ok(()), Err)
}

/// The downloaded bundle must be valid by the bundle format's own rules (manifest, no
/// symlinks, sizes, patch paths), exactly as a locally collected one.
async fn validate_downloaded(
    path: &Path,
) -> Result<smithers_bundle::ValidatedBundle, RuntimeError> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || smithers_bundle::validate_bundle(&path))
        .await
        .map_err(|e| RuntimeError::spawn("validate the bundle", e))?
        .map_err(|e| RuntimeError::inner("validate the bundle from the sandbox host", &e))
}

#[async_trait]
impl Runtime for RemoteRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Codeplane
    }

    async fn probe(&self) -> EnforcementReport {
        let base = self.options.base_url.clone();
        let url = self.url(&base, "/v1/probe");
        let timeout = self.options.request_timeout;
        match self
            .json_call::<EnforcementReport>(&base, "probe", true, || {
                self.request(Method::GET, &url).timeout(timeout)
            })
            .await
        {
            Ok(mut report) => {
                report.protections.insert(
                    0,
                    Protection {
                        name: "remote-host".into(),
                        status: ProtectionStatus::Enforced,
                        detail: format!(
                            "steps run on {base} in its {} runtime",
                            report.runtime.map(|r| r.as_str()).unwrap_or("unknown")
                        ),
                        fix: None,
                    },
                );
                report.runtime = Some(RuntimeKind::Codeplane);
                report
            }
            Err(e) => EnforcementReport {
                runtime: Some(RuntimeKind::Codeplane),
                protections: vec![Protection {
                    name: "remote-host".into(),
                    status: ProtectionStatus::Unavailable,
                    detail: e.to_string(),
                    fix: match e {
                        RuntimeError::Unavailable { fix, .. } => fix,
                        _ => None,
                    },
                }],
            },
        }
    }

    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
        config.refuse_layers("codeplane")?;
        config.refuse_home("codeplane")?;
        config.validate()?;
        if config.runtime != RuntimeKind::Codeplane {
            return Err(RuntimeError::InvalidControl {
                control: "runtime",
                reason: format!(
                    "the codeplane runtime was given a {} config",
                    config.runtime
                ),
            });
        }
        if !config.controls.volumes.is_empty() {
            return Err(RuntimeError::ControlUnsupported {
                runtime: RUNTIME,
                control: "volumes",
                reason: "host paths of this machine do not exist on the remote sandbox host".into(),
            });
        }
        let meta = tokio::fs::metadata(&config.root_dir)
            .await
            .map_err(local_io("read rootDir", &config.root_dir))?;
        if !meta.is_dir() {
            return Err(RuntimeError::InvalidControl {
                control: "rootDir",
                reason: format!("{} is not a directory", config.root_dir.display()),
            });
        }
        let base = self.options.base_url.clone();
        let (controls, secret_values) = secrets_sent(&config.controls)?;
        if !secret_values.is_empty() && !carries_secrets_safely(&self.options.base_url) {
            return Err(RuntimeError::InvalidControl {
                control: "secrets",
                reason: format!(
                    "{} is plain http to another machine: a secret's value is sent only over https, or to this machine's loopback",
                    self.options.base_url
                ),
            });
        }
        let body = CreateSandbox {
            run_id: config.run_id.clone(),
            sandbox_id: config.sandbox_id.clone(),
            image: config.image.clone(),
            controls,
            if_exists: Default::default(),
            secret_values,
        };
        let url = self.url(&base, "/v1/sandboxes");
        // Not safe to repeat once sent: only connect failures are retried (inside `send`).
        let info: SandboxInfo = self
            .json_call(&base, "create a sandbox", false, || {
                self.request(Method::POST, &url).json(&body)
            })
            .await?;
        let sandbox_root = config
            .root_dir
            .join(".smithers/sandboxes")
            .join(&config.run_id)
            .join(&config.sandbox_id);
        let request_path = sandbox_root.join("request");
        let result_path = sandbox_root.join("result");
        tokio::fs::create_dir_all(&request_path)
            .await
            .map_err(local_io("create", &request_path))?;
        Ok(SandboxHandle {
            runtime: RuntimeKind::Codeplane,
            run_id: config.run_id.clone(),
            sandbox_id: config.sandbox_id.clone(),
            sandbox_root,
            request_path,
            result_path,
            container_id: None,
            workspace_id: Some(info.id.clone()),
            backend: serde_json::to_value(Backend {
                base_url: base,
                host_id: info.id,
                root_dir: config.root_dir.clone(),
            })
            .unwrap_or(Value::Null),
        })
    }

    async fn ship(
        &self,
        handle: &SandboxHandle,
        request: &RequestBundle,
    ) -> Result<ShipReport, RuntimeError> {
        let b = self.backend(handle)?;
        let request_json = serde_json::to_vec_pretty(&request.request)
            .map_err(|e| RuntimeError::spawn("serialise the request", e))?;
        // A local copy, as every runtime keeps one under request/.
        let local = handle.request_path.join("request.json");
        tokio::fs::write(&local, &request_json)
            .await
            .map_err(local_io("write", &local))?;
        let uploaded = self.upload_workspace(&b).await?;
        let url = self.url(&b.base_url, &format!("/v1/sandboxes/{}/request", b.host_id));
        let timeout = self.options.request_timeout;
        self.send(&b.base_url, "ship the request", true, || {
            self.request(Method::PUT, &url)
                .header("content-type", "application/json")
                .body(request_json.clone())
                .timeout(timeout)
        })
        .await?;
        Ok(ShipReport {
            bundle_size_bytes: uploaded + request_json.len() as u64,
        })
    }

    async fn execute(
        &self,
        handle: &SandboxHandle,
        command: &StepCommand,
        cancel: CancellationToken,
        output: &dyn OutputSink,
    ) -> Result<ExecOutcome, RuntimeError> {
        // The remote API carries no stdin stream: refused, never dropped.
        if command.stdin.is_given() {
            return Err(RuntimeError::InvalidControl {
                control: "stdin",
                reason: "the codeplane runtime does not pass a stdin stream to the command".into(),
            });
        }
        let b = self.backend(handle)?;
        // One key per execute call: every retry of this call carries it, so the host starts
        // the step once whatever the network does.
        let key = uuid::Uuid::new_v4().to_string();
        let url = self.url(&b.base_url, &format!("/v1/sandboxes/{}/execute", b.host_id));
        let timeout = self.options.request_timeout;
        let _accepted: ExecuteAccepted = self
            .json_call(&b.base_url, "execute", true, || {
                self.request(Method::POST, &url)
                    .header(IDEMPOTENCY_KEY_HEADER, &key)
                    .json(command)
                    .timeout(timeout)
            })
            .await?;
        match self.follow(&b, &cancel, output).await? {
            Followed::Outcome(outcome) => Ok(*outcome),
        }
    }

    async fn collect(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError> {
        let b = self.backend(handle)?;
        let info = self.info(&b).await?;
        let result = match (info.state, info.result) {
            (SandboxState::Completed, Some(result)) => result,
            (state, _) => {
                return Err(RuntimeError::OutOfOrder {
                    verb: "collect",
                    reason: format!(
                        "the sandbox is {} on the host, not completed",
                        state.as_str()
                    ),
                })
            }
        };
        self.download_bundle(&b, handle).await?;
        let validated = validate_downloaded(&handle.result_path).await?;
        // The bundle itself is the truth; the host's count is only informative.
        Ok(CollectReport {
            bundle_path: handle.result_path.clone(),
            patch_count: validated.patch_files.len(),
            ignored_paths: result.ignored_paths,
        })
    }

    async fn cleanup(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        // The handle may come from a crafted database in the project tree: its directories
        // must be the ones derived for its ids, through no link, before any is removed.
        let root = handle.project_root()?;
        handle.check_project_dirs_real(&root)?;
        // Local leftovers first: they must go even when the host is unreachable.
        let local_error = remove_local_leftovers(handle).await.err();
        let b = match self.backend(handle) {
            Ok(b) => b,
            // A handle from a create that never reached the host: nothing remote to remove.
            Err(_) if handle.backend.is_null() => return local_error.map_or(Ok(()), Err),
            Err(e) => return Err(e),
        };
        let url = self.url(&b.base_url, &format!("/v1/sandboxes/{}", b.host_id));
        let timeout = self.options.request_timeout;
        self.send(&b.base_url, "clean up", true, || {
            self.request(Method::DELETE, &url).timeout(timeout)
        })
        .await?;
        local_error.map_or(Ok(()), Err)
    }
}

/// Whether secrets' values may be sent to the host at `base_url`: over https, or over plain
/// http to this machine's own loopback only (never across a network in the clear).
fn carries_secrets_safely(base_url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(base_url) else {
        return false;
    };
    let host = url.host_str().unwrap_or("");
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback());
    match url.scheme() {
        "https" => true,
        "http" => loopback,
        _ => false,
    }
}

/// The controls as the host is sent them, and the secrets' values: each read here, on this
/// machine (from this process's `$NAME` or the binding's file), sent in base64 beside the
/// bindings, whose files (paths of this machine) are not sent.
fn secrets_sent(
    controls: &smithers_runtime::Controls,
) -> Result<
    (
        smithers_runtime::Controls,
        smithers_wire::wire::SecretValues,
    ),
    RuntimeError,
> {
    use base64::Engine as _;
    let mut sent = controls.clone();
    let mut values = smithers_wire::wire::SecretValues::default();
    for s in controls.secret_values()? {
        let encoded = base64::engine::general_purpose::STANDARD.encode(s.value);
        values.0.insert(s.name, encoded);
    }
    for binding in &mut sent.secrets {
        binding.file = None;
    }
    Ok((sent, values))
}

#[cfg(test)]
mod secrets_tests {
    #[test]
    fn values_go_over_https_or_to_this_machines_loopback_only() {
        for ok in [
            "https://host.example:7420",
            "http://127.0.0.1:7420",
            "http://localhost:7420",
            "http://[::1]:7420",
        ] {
            assert!(super::carries_secrets_safely(ok), "{ok}");
        }
        for no in ["http://10.0.0.5:7420", "http://host.example", "not a url"] {
            assert!(!super::carries_secrets_safely(no), "{no}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smithers_runtime::OutputStream;

    fn bytes_of(events: &[OutputEvent]) -> (Vec<u8>, u64) {
        let (mut bytes, mut lost) = (Vec::new(), 0);
        for e in events {
            match e {
                OutputEvent::Output { bytes: b, .. } => bytes.extend_from_slice(b),
                OutputEvent::OutputLost { bytes: n, .. } => lost += n,
                _ => {}
            }
        }
        (bytes, lost)
    }

    /// The host's output events become the sink's bytes in order; a gap in the offsets, or
    /// an `outputLost`, is said as lost bytes; an offset going back is refused.
    #[test]
    fn output_is_relayed_in_order_and_a_gap_is_said() {
        let mut relayed = [0u64; 2];
        let mut events = Vec::new();
        let mut relay = |e: WireEvent| relay_output(&e, &mut relayed).map(Option::unwrap);
        events.extend(relay(WireEvent::output(OutputStream::Stdout, 0, b"ab\xff", 1)).unwrap());
        events.extend(relay(WireEvent::output(OutputStream::Stderr, 0, b"err", 1)).unwrap());
        events.extend(
            relay(WireEvent::OutputLost {
                stream: OutputStream::Stdout,
                offset: 3,
                bytes: 10,
                timestamp_ms: 1,
            })
            .unwrap(),
        );
        // 13 bytes relayed or lost so far; this one starts at 20: 7 more lost.
        events.extend(relay(WireEvent::output(OutputStream::Stdout, 20, b"z", 1)).unwrap());
        let stdout: Vec<OutputEvent> = events
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    OutputEvent::Output {
                        stream: OutputStream::Stdout,
                        ..
                    } | OutputEvent::OutputLost {
                        stream: OutputStream::Stdout,
                        ..
                    }
                )
            })
            .cloned()
            .collect();
        assert_eq!(bytes_of(&stdout), (b"ab\xffz".to_vec(), 17));
        assert!(relay(WireEvent::output(OutputStream::Stdout, 5, b"x", 1)).is_err());
        assert_eq!(relayed, [21, 3]);
        assert!(relay_output(&WireEvent::Cancelled, &mut [0, 0])
            .unwrap()
            .is_none());
    }
}
