//! The hosted sandboxes: one [`Entry`] each, with its state machine and its event log.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use smithers_runtime::{CancellationToken, OutputEvent, OutputSink, Runtime, SandboxHandle};
use smithers_wire::wire::{ResultInfo, SandboxInfo, SandboxState, SeqEvent, WireEvent};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;
use crate::ServerConfig;

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind; keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Shared by every handler.
#[derive(Debug)]
pub(crate) struct AppState {
    pub runtime: Arc<dyn Runtime>,
    /// Serves the review endpoints when attached.
    pub orchestrator: Option<Arc<smithers_orchestrator::Orchestrator>>,
    pub config: ServerConfig,
    /// The client tokens (digests), compared in constant time.
    pub tokens: crate::policy::TokenSet,
    pub sandboxes: Mutex<HashMap<String, Arc<Entry>>>,
    pub metrics: Metrics,
    /// Set once shutdown began: no new sandboxes or executions.
    pub draining: AtomicBool,
    /// Fired at the very end of shutdown: ends event streams still open.
    pub streams_end: CancellationToken,
    /// The running executions, drained on shutdown.
    pub tasks: TaskTracker,
}

impl AppState {
    /// The sandbox `id` if `owner` created it: another token's sandbox is as absent as one
    /// that never existed.
    pub fn get(&self, id: &str, owner: &Owner) -> Option<Arc<Entry>> {
        lock(&self.sandboxes)
            .get(id)
            .filter(|e| e.owner == owner.0)
            .cloned()
    }
}

/// The name of the token a request authenticated with (empty on a server without tokens),
/// put in the request's extensions by the auth middleware.
#[derive(Debug, Clone)]
pub(crate) struct Owner(pub String);

/// Mutable part of an entry.
#[derive(Debug)]
pub(crate) struct Inner {
    pub state: SandboxState,
    pub exec_key: Option<String>,
    pub cancel: CancellationToken,
    /// The request JSON shipped (to answer a retried identical PUT).
    pub request: Option<serde_json::Value>,
    pub result: Option<ResultInfo>,
    pub bundle_path: Option<PathBuf>,
}

/// One hosted sandbox.
#[derive(Debug)]
pub(crate) struct Entry {
    pub id: String,
    pub run_id: String,
    pub sandbox_id: String,
    pub created_at_ms: u64,
    /// The name of the token that created it (never the secret): only that token sees it.
    pub owner: String,
    /// When a request last touched it (or its step ended): the idle expiry counts from here.
    pub last_active_ms: AtomicU64,
    /// `<data>/sandboxes/<id>`: everything the host keeps for it.
    pub dir: PathBuf,
    /// `<dir>/workspace`: the runtime's rootDir.
    pub workspace: PathBuf,
    pub handle: SandboxHandle,
    /// Serialises the verbs that change the sandbox (upload, ship, delete).
    pub op: tokio::sync::Mutex<()>,
    /// Serialises the final swap of an uploaded workspace into place.
    pub swap: Mutex<()>,
    pub inner: Mutex<Inner>,
    pub events: EventLog,
    /// Open event streams, and when the last one closed (or the step started): the orphan
    /// watchdog cancels a running step nobody follows.
    pub followers: AtomicUsize,
    pub unfollowed_since_ms: AtomicU64,
}

impl Entry {
    pub fn info(&self, runtime: smithers_runtime::RuntimeKind) -> SandboxInfo {
        let inner = lock(&self.inner);
        SandboxInfo {
            id: self.id.clone(),
            run_id: self.run_id.clone(),
            sandbox_id: self.sandbox_id.clone(),
            runtime,
            state: inner.state,
            created_at_ms: self.created_at_ms,
            last_seq: self.events.last_seq(),
            result: inner.result.clone(),
        }
    }

    pub fn state(&self) -> SandboxState {
        lock(&self.inner).state
    }

    /// Records activity: the idle expiry starts again.
    pub fn touch(&self) {
        self.last_active_ms
            .store(now_ms(), std::sync::atomic::Ordering::SeqCst);
    }
}

#[derive(Debug, Default)]
struct LogInner {
    events: Vec<Arc<SeqEvent>>,
    closed: bool,
}

/// Append-only, gap-free event log of one sandbox, with a watch channel announcing appends.
/// Bounded by what the runtime lets through: output is capped per stream by
/// `maxOutputBytes`, and state events are a handful.
#[derive(Debug)]
pub(crate) struct EventLog {
    inner: Mutex<LogInner>,
    tx: watch::Sender<u64>,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog {
            inner: Mutex::new(LogInner::default()),
            tx: watch::channel(0).0,
        }
    }
}

impl EventLog {
    /// Appends an event; a terminal one closes the log. Appends to a closed log are dropped
    /// (output racing the end of a run).
    pub fn push(&self, event: WireEvent) {
        let mut inner = lock(&self.inner);
        if inner.closed {
            return;
        }
        let seq = inner.events.len() as u64;
        let terminal = event.is_terminal();
        inner.events.push(Arc::new(SeqEvent { seq, event }));
        if terminal {
            inner.closed = true;
        }
        drop(inner);
        self.tx.send_replace(seq + 1);
    }

    /// Events with `seq >= from`, and whether the log is closed.
    pub fn read_from(&self, from: u64) -> (Vec<Arc<SeqEvent>>, bool) {
        let inner = lock(&self.inner);
        let start = (from as usize).min(inner.events.len());
        (inner.events[start..].to_vec(), inner.closed)
    }

    pub fn is_closed(&self) -> bool {
        lock(&self.inner).closed
    }

    pub fn last_seq(&self) -> Option<u64> {
        (lock(&self.inner).events.len() as u64).checked_sub(1)
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
}

/// Forwards the runtime's live output into the event log.
pub(crate) struct LogSink(pub Arc<Entry>);

impl OutputSink for LogSink {
    fn event(&self, event: OutputEvent) {
        let wire = match event {
            OutputEvent::Stdout { line, timestamp_ms } => WireEvent::Stdout { line, timestamp_ms },
            OutputEvent::Stderr { line, timestamp_ms } => WireEvent::Stderr { line, timestamp_ms },
            OutputEvent::Heartbeat {
                progress,
                timestamp_ms,
            } => WireEvent::Heartbeat {
                progress,
                timestamp_ms,
            },
            OutputEvent::Egress {
                record,
                timestamp_ms,
            } => WireEvent::Egress {
                record,
                timestamp_ms,
            },
        };
        self.0.events.push(wire);
    }
}
