//! The sandbox host: an HTTP service that runs workflow steps sent from other machines in a
//! runtime of this host (the CLI injects the native namespace runtime), so that a step behaves
//! the same whether it runs here or across the network. The client is the `codeplane` runtime
//! of `smithers-runtime-remote`; the API is `openapi/smithers-sandbox.yaml`, served at
//! `GET /v1/openapi.yaml`.
//!
//! # Lifecycle of a hosted sandbox
//!
//! `POST /v1/sandboxes` (create; the host chooses where the workspace lives) →
//! `PUT …/workspace` (streamed compressed tar, unpacked confined into a staging directory and
//! swapped in whole; repeatable until shipped) → `PUT …/request` (ship) →
//! `POST …/execute` (once; `Idempotency-Key` makes a retried request report the run it already
//! started instead of starting another) → `GET …/events` (SSE, resumable, gap-free) →
//! `GET …/bundle` (tar of the collected bundle) → `DELETE …` (idempotent cleanup).
//!
//! # Safety and robustness
//!
//! * Bearer tokens on `/v1/*` but the OpenAPI document (`SMITHERS_SANDBOX_TOKEN`, and named
//!   ones in `SMITHERS_SANDBOX_TOKENS` or [`ServerConfig::tokens`]), compared in constant time;
//!   without a token the server refuses to listen anywhere but loopback. A sandbox belongs to
//!   the token that created it: to any other token it does not exist (404).
//! * The operator's ceilings ([`Ceilings`]): network only when allowed, resource limits,
//!   timeout and output cap at most the ceiling (an unasked timeout or output cap gets it),
//!   a cap on sandboxes held in all and per token, and idle sandboxes expiring
//!   ([`Limits::idle_expiry`]).
//! * Connection limits (`conn`): a cap on connections served at once (the rest wait in the
//!   accept backlog), a deadline for a request head and for an idle connection (slowloris),
//!   `TCP_NODELAY`.
//! * Body limits (JSON, upload on the wire, unpacked bytes, decoded bytes, entries, path
//!   length), checked while the upload streams in, a deadline
//!   per request, archive rules of [`smithers_wire::archive`]; every refusal is a
//!   documented status with a `{code, message, details}` body.
//! * Graceful shutdown: stop accepting, let running steps finish for a grace period, then
//!   cancel them (the runtime kills every process) and let their bundles be collected; then
//!   every sandbox still held is removed (nobody can reach it once the server is gone).
//! * State is in memory: a restarted host forgets its sandboxes, and cleans up at start what a
//!   previous one left ([`SandboxServer::recover`]: each sandbox's directory holds its runtime
//!   handle).
#![forbid(unsafe_code)]

mod conn;
mod error;
mod metrics;
mod policy;
mod recovery;
mod review;
mod routes;
mod state;
#[cfg(feature = "test-runtime")]
pub mod testing;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::{get, post, put};
use axum::Router;
use smithers_runtime::{CancellationToken, Runtime};
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

pub use error::{ApiError, ServerError};
pub use metrics::Metrics;
pub use policy::{parse_tokens, Ceilings, ClientToken, DEFAULT_TOKEN_NAME};
pub use recovery::Recovered;

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
    fn all_tokens(&self) -> Vec<ClientToken> {
        let single = self
            .token
            .iter()
            .map(|t| ClientToken::new(DEFAULT_TOKEN_NAME, t.clone()));
        single.chain(self.tokens.iter().cloned()).collect()
    }
}

/// The service: build it with a runtime, then [`SandboxServer::serve`] it.
#[derive(Debug, Clone)]
pub struct SandboxServer {
    state: Arc<state::AppState>,
}

impl SandboxServer {
    /// Prepares the data directory and checks the token.
    pub fn new(config: ServerConfig, runtime: Arc<dyn Runtime>) -> Result<Self, ServerError> {
        let tokens = policy::TokenSet::new(&config.all_tokens(), MIN_TOKEN_LENGTH)
            .map_err(|reason| ServerError::InvalidToken { reason })?;
        let sandboxes = config.data_dir.join("sandboxes");
        std::fs::create_dir_all(&sandboxes).map_err(|source| ServerError::DataDir {
            operation: "create",
            path: sandboxes.display().to_string(),
            source,
        })?;
        Ok(SandboxServer {
            state: Arc::new(state::AppState {
                runtime,
                orchestrator: None,
                config,
                tokens,
                sandboxes: Mutex::new(HashMap::new()),
                metrics: Metrics::default(),
                draining: AtomicBool::new(false),
                streams_end: CancellationToken::new(),
                tasks: TaskTracker::new(),
            }),
        })
    }

    /// How many sandboxes this server holds now (any state, any token).
    pub fn held(&self) -> usize {
        state::lock(&self.state.sandboxes).len()
    }

    /// Cleans up the hosted sandboxes a previous server on this data directory left behind
    /// (it died without deleting them: see `recovery`). Call before serving.
    pub async fn recover(&self) -> Vec<Recovered> {
        recovery::recover(&self.state.config.data_dir, self.state.runtime.as_ref()).await
    }

    /// Attaches the orchestrator whose durable reviews the review endpoints serve. Call
    /// before serving (the server must not have been cloned yet).
    pub fn with_orchestrator(
        mut self,
        orchestrator: Arc<smithers_orchestrator::Orchestrator>,
    ) -> Result<Self, ServerError> {
        match Arc::get_mut(&mut self.state) {
            Some(state) => {
                state.orchestrator = Some(orchestrator);
                Ok(self)
            }
            None => Err(ServerError::Serve {
                source: std::io::Error::other("with_orchestrator called on a shared server"),
            }),
        }
    }

    /// The routes. Exposed for tests and for embedding behind another listener.
    pub fn router(&self) -> Router {
        let v1 = Router::new()
            .route("/sandboxes", post(routes::create).get(routes::list))
            .route(
                "/sandboxes/{id}",
                get(routes::get_one).delete(routes::delete),
            )
            .route("/sandboxes/{id}/workspace", put(routes::upload_workspace))
            .route("/sandboxes/{id}/request", put(routes::put_request))
            .route("/sandboxes/{id}/execute", post(routes::execute))
            .route("/sandboxes/{id}/events", get(routes::events))
            .route("/sandboxes/{id}/cancel", post(routes::cancel))
            .route("/sandboxes/{id}/bundle", get(routes::bundle))
            .route("/probe", get(routes::probe))
            .route("/reviews", get(review::list))
            .route(
                "/runs/{run_id}/sandboxes/{sandbox_id}/review",
                get(review::get_one),
            )
            .route(
                "/runs/{run_id}/sandboxes/{sandbox_id}/review/accept",
                post(review::accept),
            )
            .route(
                "/runs/{run_id}/sandboxes/{sandbox_id}/review/reject",
                post(review::reject),
            )
            .route_layer(axum::middleware::from_fn_with_state(
                self.state.clone(),
                routes::auth,
            ));
        Router::new()
            .route("/health", get(routes::health))
            .route("/metrics", get(routes::metrics))
            .route("/v1/openapi.yaml", get(routes::openapi))
            .nest("/v1", v1)
            .fallback(routes::fallback)
            .layer(axum::middleware::from_fn_with_state(
                self.state.clone(),
                routes::deadline,
            ))
            .with_state(self.state.clone())
    }

    /// Serves on `listener` until `shutdown` resolves, then drains: no new connections or
    /// executions, running steps get `shutdown_grace` to finish and are then cancelled (their
    /// bundles are still collected), and open event streams end once their step did. Returns
    /// once every connection ended (a connection still sending a request head is closed by
    /// [`Limits::header_read_timeout`] at the latest; one that sent nothing at once).
    ///
    /// Connections are served by hyper-util with the bounds of [`Limits`]
    /// (`max_connections`, `header_read_timeout`); see the `conn` module.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let addr = listener
            .local_addr()
            .map_err(|source| ServerError::Serve { source })?;
        check_exposure(!self.state.tokens.is_empty(), addr)?;
        let trigger = CancellationToken::new();
        let fire = trigger.clone();
        let watcher = tokio::spawn(async move {
            shutdown.await;
            fire.cancel();
        });
        let drainer = tokio::spawn(drain(self.state.clone(), trigger.clone()));
        let reaper = self
            .state
            .config
            .limits
            .idle_expiry
            .map(|expiry| tokio::spawn(routes::expire_idle(self.state.clone(), expiry)));
        let app = self.router();
        conn::serve(listener, app, self.state.clone(), trigger.clone()).await;
        // Serving returns once shutdown was triggered and every connection ended; the
        // drainer may still be finishing (it ended the streams those connections served).
        trigger.cancel();
        let _ = drainer.await;
        routes::remove_all(&self.state).await;
        watcher.abort();
        if let Some(reaper) = reaper {
            reaper.abort();
        }
        Ok(())
    }

    /// True once shutdown began.
    pub fn is_draining(&self) -> bool {
        self.state.draining.load(Ordering::Relaxed)
    }
}

/// Refuses an open API on a reachable address.
pub fn check_exposure(has_token: bool, addr: SocketAddr) -> Result<(), ServerError> {
    if !has_token && !addr.ip().is_loopback() {
        return Err(ServerError::NoTokenOnPublicAddress {
            addr: addr.to_string(),
        });
    }
    Ok(())
}

async fn drain(state: Arc<state::AppState>, trigger: CancellationToken) {
    trigger.cancelled().await;
    state.draining.store(true, Ordering::Relaxed);
    state.tasks.close();
    if tokio::time::timeout(state.config.shutdown_grace, state.tasks.wait())
        .await
        .is_err()
    {
        // Grace is over: cancel what still runs. The runtime kills every process of the
        // sandbox and execute returns; collect then writes the bundle of the cancelled run.
        let entries: Vec<_> = state::lock(&state.sandboxes).values().cloned().collect();
        for e in entries {
            state::lock(&e.inner).cancel.cancel();
        }
        state.tasks.wait().await;
    }
    state.streams_end.cancel();
}

/// Resolves on SIGTERM or SIGINT (for [`SandboxServer::serve`]).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        // Without signal handlers we cannot be stopped gracefully; wait for Ctrl-C instead.
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
