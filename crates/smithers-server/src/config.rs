//! What the server is told: the API document it serves, the token environment, the size and
//! time bounds of the API ([`Limits`]) and how the server runs ([`ServerConfig`]).

use std::path::PathBuf;
use std::time::Duration;

use crate::error::ServerError;
use crate::policy::{parse_tokens, Ceilings, ClientToken, DEFAULT_TOKEN_NAME};

/// The OpenAPI 3 document of this API, as checked in at `openapi/smithers-sandbox.yaml`.
pub const OPENAPI_YAML: &str = include_str!("../../../openapi/smithers-sandbox.yaml");

/// Environment variable holding the bearer token clients must present (named
/// [`DEFAULT_TOKEN_NAME`]).
pub const ENV_TOKEN: &str = "SMITHERS_SANDBOX_TOKEN";

/// Environment variable holding several client tokens as `name:token` pairs (separated by
/// commas or whitespace); each client sees only the sandboxes its token created.
pub const ENV_TOKENS: &str = "SMITHERS_SANDBOX_TOKENS";

/// Minimum token length: a short token is guessable over the network.
pub const MIN_TOKEN_LENGTH: usize = 16;

/// Size and time bounds of the API.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest JSON body (create, request, execute).
    pub max_json_bytes: usize,
    /// Largest workspace upload as received (compressed).
    pub max_upload_bytes: u64,
    /// Largest unpacked workspace (bytes of regular files).
    pub max_workspace_bytes: u64,
    /// Most entries in a workspace archive.
    pub max_workspace_entries: u64,
    /// Longest entry path in a workspace archive, in bytes.
    pub max_path_bytes: usize,
    /// Deadline to produce a response (not to stream it).
    pub request_timeout: Duration,
    /// Deadline of a workspace upload, body included.
    pub upload_timeout: Duration,
    /// Interval of SSE keep-alive comments on an idle event stream.
    pub sse_keepalive: Duration,
    /// Bytes of a step's relayed output (`output` events) a sandbox holds in memory: at most
    /// this much its slowest follower has yet to be sent (the step is held back past it, as a
    /// full pipe would hold it), and this much more already sent, for a follower that
    /// resumes.
    pub output_window_bytes: u64,
    /// A running step nobody follows (no open event stream) for this long is cancelled: its
    /// client is gone (killed, crashed, partitioned), and a local step would have died with
    /// its orchestrator. Clients reconnect well within it. `None` lets such steps run to their
    /// own timeout.
    pub orphan_timeout: Option<Duration>,
    /// Longest a connection may go without a request in progress: the time a client has to
    /// send a complete HTTP/1 request head (slowloris), to send its first bytes at all, and
    /// the idle time of a keep-alive (HTTP/1) or h2c connection between requests. Such a
    /// connection is closed. A request is in progress from its complete head until its
    /// response is finished, so slow bodies and open event streams are not cut by it.
    pub header_read_timeout: Duration,
    /// Most connections served at once. Further connections wait in the kernel's accept
    /// backlog (not refused, not answered 503) until a served one ends; with the header
    /// timeout, stalled connections free their slot within that time.
    pub max_connections: usize,
    /// The operator's ceilings on every sandbox's controls (network, resources, timeout,
    /// output).
    pub ceilings: Ceilings,
    /// Most sandboxes held at once (any state, until deleted or expired), over all tokens.
    pub max_sandboxes: usize,
    /// Most sandboxes one token holds at once.
    pub max_sandboxes_per_token: usize,
    /// A sandbox that is not running and that no request touched for this long (created and
    /// never executed, or finished and never downloaded or deleted) is cleaned up. `None`
    /// keeps such sandboxes until deleted.
    pub idle_expiry: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_json_bytes: 1024 * 1024,
            max_upload_bytes: 1024 * 1024 * 1024,
            max_workspace_bytes: 1024 * 1024 * 1024,
            max_workspace_entries: 100_000,
            max_path_bytes: 4096,
            request_timeout: Duration::from_secs(60),
            upload_timeout: Duration::from_secs(30 * 60),
            sse_keepalive: Duration::from_secs(15),
            output_window_bytes: 16 << 20,
            orphan_timeout: Some(Duration::from_secs(120)),
            header_read_timeout: Duration::from_secs(10),
            max_connections: 1024,
            ceilings: Ceilings::default(),
            max_sandboxes: 256,
            max_sandboxes_per_token: 32,
            idle_expiry: Some(Duration::from_secs(3600)),
        }
    }
}

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Bearer token (named [`DEFAULT_TOKEN_NAME`]); with no token at all (this nor
    /// `tokens`) the server only listens on a loopback address.
    pub token: Option<String>,
    /// More client tokens, each named; a sandbox belongs to the token that created it and is
    /// invisible (404) to the others.
    pub tokens: Vec<ClientToken>,
    /// Where workspaces and runtime state live (`<data_dir>/sandboxes/<id>/workspace`).
    pub data_dir: PathBuf,
    pub limits: Limits,
    /// How long running steps may go on after shutdown began before they are cancelled.
    pub shutdown_grace: Duration,
}

impl ServerConfig {
    /// Tokens from `SMITHERS_SANDBOX_TOKEN` (unset or empty → none) and
    /// `SMITHERS_SANDBOX_TOKENS`, default limits, 30 s grace.
    pub fn from_env(data_dir: impl Into<PathBuf>) -> Result<Self, ServerError> {
        let tokens = match std::env::var(ENV_TOKENS) {
            Ok(text) => parse_tokens(&text).map_err(|reason| ServerError::InvalidToken {
                reason: format!("{ENV_TOKENS}: {reason}"),
            })?,
            Err(_) => Vec::new(),
        };
        Ok(ServerConfig {
            token: std::env::var(ENV_TOKEN).ok().filter(|t| !t.is_empty()),
            tokens,
            data_dir: data_dir.into(),
            limits: Limits::default(),
            shutdown_grace: Duration::from_secs(30),
        })
    }

    /// Every configured token, the single one first under [`DEFAULT_TOKEN_NAME`].
    pub(crate) fn all_tokens(&self) -> Vec<ClientToken> {
        let single = self
            .token
            .iter()
            .map(|t| ClientToken::new(DEFAULT_TOKEN_NAME, t.clone()));
        single.chain(self.tokens.iter().cloned()).collect()
    }
}
