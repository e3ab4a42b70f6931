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

mod config;
mod conn;
mod error;
mod fork;
mod json;
mod lifecycle;
mod mcp;
mod metrics;
mod policy;
mod recovery;
mod review;
mod routes;
mod secrets;
mod session;
mod state;
#[cfg(feature = "test-runtime")]
pub mod testing;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::routing::{get, post, put};
use axum::Router;
use smithers_runtime::{CancellationToken, Runtime};
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

use lifecycle::drain;

pub use config::{Limits, ServerConfig, ENV_TOKEN, ENV_TOKENS, MIN_TOKEN_LENGTH, OPENAPI_YAML};
pub use error::{ApiError, ServerError};
pub use lifecycle::{check_exposure, shutdown_signal};
pub use metrics::Metrics;
pub use policy::{parse_tokens, Ceilings, ClientToken, DEFAULT_TOKEN_NAME};
pub use recovery::Recovered;

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
                engine: None,
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

    /// Attaches the engine of the same backend as the runtime: sandboxes can then be
    /// started as sessions (`POST …/start`, `…/exec`, `…/stop`). Call before serving.
    pub fn with_engine(
        mut self,
        engine: Arc<dyn smithers_runtime::Engine>,
    ) -> Result<Self, ServerError> {
        match Arc::get_mut(&mut self.state) {
            Some(state) => {
                state.engine = Some(engine);
                Ok(self)
            }
            None => Err(ServerError::Serve {
                source: std::io::Error::other("with_engine called on a shared server"),
            }),
        }
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
            .route("/sandboxes/{id}/start", post(session::start))
            .route("/sandboxes/{id}/exec", post(session::exec))
            .route("/sandboxes/{id}/stop", post(session::stop))
            .route("/sandboxes/{id}/checkpoint", post(session::checkpoint))
            .route("/sandboxes/{id}/restore", post(session::restore))
            .route("/sandboxes/{id}/fork", post(fork::fork))
            .route("/sandboxes/{id}/bundle", get(routes::bundle))
            .route("/mcp", post(mcp::post))
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
