//! The service itself: [`SandboxServer`] built on a runtime, its routes, serving with
//! graceful shutdown (drain, then cancel, then remove what is left), and the exposure check.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::routing::{get, post, put};
use axum::Router;
use smithers_runtime::{CancellationToken, Runtime};
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

use crate::config::{ServerConfig, MIN_TOKEN_LENGTH};
use crate::error::ServerError;
use crate::metrics::Metrics;
use crate::recovery::Recovered;
use crate::{conn, policy, recovery, review, routes, state};

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
    ///
    /// [`Limits`]: crate::config::Limits
    /// [`Limits::header_read_timeout`]: crate::config::Limits::header_read_timeout
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
