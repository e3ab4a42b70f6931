//! The connection layer: an accept loop on hyper-util in place of `axum::serve`, so that a
//! connection cannot hold the server's resources without making progress.
//!
//! * **Connection cap** ([`crate::config::Limits::max_connections`]): the loop takes a permit before it
//!   accepts. At the cap it stops accepting, and new connections wait in the kernel's accept
//!   backlog (their TCP handshake completes, their request waits) until a connection ends.
//!   Accepting them only to answer 503 would spend a descriptor and a task on each, which is
//!   exactly what runs out under a flood; waiting costs nothing here and the client sees a slow
//!   answer (or its own connect/request timeout) instead of an error it must retry.
//! * **Header deadline** ([`crate::config::Limits::header_read_timeout`]): hyper's HTTP/1 header read timeout
//!   closes a connection whose request head is not complete in time. Its timer starts whenever
//!   the connection waits for a request head, so it is also the HTTP/1 keep-alive idle
//!   timeout: an idle keep-alive connection is closed that long after its last response.
//! * **Idle watchdog** (same duration): hyper's timer does not cover what comes before the
//!   protocol is known (the auto builder reads up to 24 bytes to tell HTTP/1 from the h2c
//!   preface, so a client that sends nothing, or a prefix of the preface, would wait there
//!   forever) nor an h2c connection with no stream open. A connection with no request in
//!   progress for that long is shut down gracefully (h2c: GOAWAY), and dropped if it has
//!   not closed after one more period. A request is in progress from the moment its head is
//!   parsed until its response body is finished or dropped, so an open event stream or a
//!   long upload keeps its connection (their own deadlines are the routes' business).
//! * **Graceful shutdown** keeps the semantics of `axum::serve(..).with_graceful_shutdown`:
//!   on the signal the loop stops accepting and closes the listener, every connection is told
//!   to shut down gracefully (HTTP/1 finishes the response in progress, then closes; h2c sends
//!   GOAWAY and finishes its open streams), and [`serve`] returns once all connections ended.
//!
//! `TCP_NODELAY` is set on every accepted socket: responses and SSE events are written as
//! they are produced, and Nagle's algorithm would hold small writes back for an ACK.
//! (`axum::serve` of axum 0.8 does not set it; axum 0.7 did.) No route uses `ConnectInfo`
//! or protocol upgrades, so the service is the bare router.

use std::convert::Infallible;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::Router;
use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use smithers_runtime::CancellationToken;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::state::AppState;

/// Accepts connections on `listener` and serves `router` on them until `shutdown` is
/// cancelled, then waits for every connection to end.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    state: Arc<AppState>,
    shutdown: CancellationToken,
) {
    let limits = &state.config.limits;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let builder = Arc::new(builder);
    let idle = limits.header_read_timeout;
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let connections = TaskTracker::new();
    loop {
        // At the cap, wait for a slot before accepting: the connection waits in the backlog.
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break, // never closed
            },
            _ = shutdown.cancelled() => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    if !is_connection_error(&e) {
                        // Out of descriptors (EMFILE/ENFILE) or memory: accepting again at once
                        // would spin; give open connections time to end (as hyper 0.14 and
                        // axum::serve do).
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                            _ = shutdown.cancelled() => break,
                        }
                    }
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        // Best effort: a socket that refuses the option still works, only with Nagle's delays.
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        let router = router.clone();
        let shutdown = shutdown.clone();
        let state = state.clone();
        connections.spawn(async move {
            // Held for the connection's life, released even if a handler panics: its slot
            // and its place in the open-connections gauge.
            let _slot = (permit, OpenConnection::new(state));
            serve_connection(&builder, stream, router, idle, &shutdown).await;
        });
    }
    // Stop listening before waiting: new clients are refused instead of left in the backlog.
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// Counts a connection in the metrics while it is open.
struct OpenConnection(Arc<AppState>);

impl OpenConnection {
    fn new(state: Arc<AppState>) -> Self {
        state.metrics.connection_opened();
        OpenConnection(state)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.metrics.connection_closed();
    }
}

fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// Serves one connection until it ends, the watchdog closes it, or shutdown drained it.
async fn serve_connection(
    builder: &auto::Builder<TokioExecutor>,
    stream: TcpStream,
    router: Router,
    idle: Duration,
    shutdown: &CancellationToken,
) {
    let activity = Activity::new();
    let tracker = activity.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let guard = InProgress::start(&tracker);
        let fut = tower_service::Service::call(&mut router.clone(), req);
        async move {
            let resp = fut.await.unwrap_or_else(|never: Infallible| match never {});
            Ok::<_, Infallible>(resp.map(|body| TrackedBody {
                inner: body,
                _guard: guard,
            }))
        }
    });
    let mut conn = pin!(builder.serve_connection(TokioIo::new(stream), service));
    let mut shutting_down = false;
    // Set once the watchdog asked the connection to close: when it may be dropped.
    let mut hard_close: Option<Instant> = None;
    loop {
        let wake = match hard_close {
            Some(at) => at,
            None => activity.idle_deadline(idle),
        };
        tokio::select! {
            // A connection error (reset, header timeout, protocol error) only ends it.
            _ = conn.as_mut() => break,
            _ = shutdown.cancelled(), if !shutting_down => {
                shutting_down = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tokio::time::sleep_until(wake) => {
                if hard_close.is_some() {
                    break; // it did not close in time: dropping it closes the socket
                }
                if activity.idle_for(idle) {
                    if !shutting_down {
                        conn.as_mut().graceful_shutdown();
                    }
                    hard_close = Some(Instant::now() + idle);
                }
            }
        }
    }
}

/// Whether a connection has a request in progress, and since when it has none.
#[derive(Debug)]
struct Activity {
    in_progress: AtomicUsize,
    idle_since: Mutex<Instant>,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Activity {
            in_progress: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        })
    }

    fn idle_since(&self) -> Instant {
        *self.idle_since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When the watchdog should look next: `idle` after the connection went idle, or one
    /// period from now while a request is in progress.
    fn idle_deadline(&self, idle: Duration) -> Instant {
        if self.in_progress.load(Ordering::Acquire) > 0 {
            Instant::now() + idle
        } else {
            self.idle_since() + idle
        }
    }

    /// True if no request is in progress and none was for `idle`.
    fn idle_for(&self, idle: Duration) -> bool {
        self.in_progress.load(Ordering::Acquire) == 0 && self.idle_since().elapsed() >= idle
    }
}

/// A request in progress on a connection: from its head until its response body is done.
#[derive(Debug)]
struct InProgress(Arc<Activity>);

impl InProgress {
    fn start(activity: &Arc<Activity>) -> Self {
        activity.in_progress.fetch_add(1, Ordering::AcqRel);
        InProgress(activity.clone())
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        // Stamp the time before the count drops, so the watchdog never sees an idle
        // connection with a stale `idle_since`.
        *self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.in_progress.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted as in progress until it is finished or
/// dropped (hyper drops it once the last frame is written or the connection ends).
struct TrackedBody {
    inner: Body,
    _guard: InProgress,
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    // Forwarded so that hyper still sends Content-Length (not chunked) for sized bodies.
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
