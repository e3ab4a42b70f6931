//! Serving around the routes: the exposure check before listening, the drain once shutdown
//! began (grace, then cancel), and the shutdown signal.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use smithers_runtime::CancellationToken;

use crate::error::ServerError;
use crate::state;

/// Refuses an open API on a reachable address.
pub fn check_exposure(has_token: bool, addr: SocketAddr) -> Result<(), ServerError> {
    if !has_token && !addr.ip().is_loopback() {
        return Err(ServerError::NoTokenOnPublicAddress {
            addr: addr.to_string(),
        });
    }
    Ok(())
}

pub(crate) async fn drain(state: Arc<state::AppState>, trigger: CancellationToken) {
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
///
/// [`SandboxServer::serve`]: crate::SandboxServer::serve
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
